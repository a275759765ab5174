//! The stores read and written directly, below the service: the Redis a
//! test runs against (a server, the shared test cluster, or a cluster of its
//! own), the sale's keys, `tb_order`, and the library's handles over them
//! (the books, as the service and its commands build them).

use std::sync::OnceLock;
use std::time::Duration;

use flashsale::config::RedisTarget;
use flashsale::sale::Conn;
use redis::AsyncCommands;

use super::{REDIS_URL, TestApp, eventually};

/// Which Redis a test's service runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Single,
    /// The shared test cluster on ports 7000-7005.
    Cluster,
    /// A cluster of the test's own, on ports BASE..BASE+5 (for tests that
    /// break it); see `own_cluster`.
    OwnCluster(u16),
}

const SHARED_CLUSTER: u16 = 7000;

fn cluster_script(base: u16, action: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/redis-cluster.sh");
    let ok = std::process::Command::new("bash")
        .arg(script)
        .arg(action)
        .env("FLASHSALE_CLUSTER_BASE_PORT", base.to_string())
        .status()
        .expect("run scripts/redis-cluster.sh")
        .success();
    assert!(
        ok,
        "scripts/redis-cluster.sh {action} failed for port {base}"
    );
}

pub(super) fn masters(base: u16) -> String {
    (base..base + 3)
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The shared test cluster's masters, starting the cluster on first use.
pub fn cluster_nodes() -> &'static str {
    static NODES: OnceLock<String> = OnceLock::new();
    NODES.get_or_init(|| {
        cluster_script(SHARED_CLUSTER, "start");
        masters(SHARED_CLUSTER)
    })
}

/// A cluster for one test, stopped (and its data removed) when dropped.
pub struct OwnCluster(pub u16);

impl OwnCluster {
    pub fn start(base: u16) -> Self {
        cluster_script(base, "start");
        Self(base)
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        cluster_script(self.0, "stop");
    }
}

impl Backend {
    pub fn target(self) -> RedisTarget {
        match self {
            Self::Single => RedisTarget::Single(REDIS_URL.into()),
            Self::Cluster => RedisTarget::new(REDIS_URL, Some(cluster_nodes())),
            Self::OwnCluster(base) => RedisTarget::new(REDIS_URL, Some(&masters(base))),
        }
    }

    /// Every server (for cleanup).
    pub(super) fn servers(self) -> Vec<String> {
        let base = match self {
            Self::Single => return vec![REDIS_URL.into()],
            Self::Cluster => SHARED_CLUSTER,
            Self::OwnCluster(base) => base,
        };
        (base..base + 6)
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// A direct connection for the test's own checks.
    pub async fn connect(self) -> Conn {
        match self.target() {
            RedisTarget::Single(url) => Conn::Direct(
                redis::Client::open(url)
                    .expect("redis url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("redis answers"),
            ),
            RedisTarget::Cluster(nodes) => Conn::Cluster(
                redis::cluster::ClusterClient::new(nodes)
                    .expect("cluster nodes")
                    .get_async_connection()
                    .await
                    .expect("cluster answers"),
            ),
        }
    }
}

/// What Redis holds for one sale.
impl TestApp {
    /// A handle to the service's Redis itself (its nodes, its slots).
    pub fn redis_below(&self) -> flashsale::sale::Redis {
        flashsale::sale::Redis::from_settings(&self.settings.redis).expect("redis handle")
    }

    pub fn key(&self, product_id: &str, name: &str) -> String {
        format!("{}:{{{product_id}}}:{name}", self.prefix)
    }

    /// The sale's stock as Redis holds it.
    pub async fn stock(&self, product_id: &str) -> Option<i64> {
        let mut r = self.redis.clone();
        r.get(self.key(product_id, "stock"))
            .await
            .expect("redis GET")
    }

    /// Entries in the sale's stream.
    pub async fn stream_len(&self, product_id: &str) -> u64 {
        let mut r = self.redis.clone();
        r.xlen(self.key(product_id, "orders"))
            .await
            .expect("redis XLEN")
    }

    /// Units Redis has recorded for one user.
    pub async fn bought(&self, product_id: &str, user_id: u64) -> i64 {
        let mut r = self.redis.clone();
        let v: Option<i64> = r
            .hget(self.key(product_id, "bought"), user_id)
            .await
            .expect("redis HGET");
        v.unwrap_or(0)
    }

    /// Entries pending in the sale's consumer group.
    pub async fn pending(&self, product_id: &str) -> u64 {
        let mut r = self.redis.clone();
        let reply: redis::streams::StreamPendingReply = r
            .xpending(self.key(product_id, "orders"), flashsale::sale::keys::GROUP)
            .await
            .expect("XPENDING");
        reply.count() as u64
    }

    /// The entries of the sale's dead letters: (id, fields).
    pub async fn dead_letters(&self, product_id: &str) -> Vec<(String, Vec<(String, String)>)> {
        redis::cmd("XRANGE")
            .arg(self.key(product_id, "dead"))
            .arg("-")
            .arg("+")
            .query_async(&mut self.redis.clone())
            .await
            .expect("XRANGE")
    }

    /// Appends to the sale's stream, by hand, an entry no worker can
    /// persist (its quantity is not a number); returns its id.
    pub async fn add_poison_entry(&self, product_id: &str) -> String {
        let order_id = format!("{product_id}:0123456789abcdef0123456789abcdef");
        self.add_entry_of_fields(product_id, &order_id, 2, "lots")
            .await
    }

    /// Appends to the sale's stream, by hand, an order in the entries' shape
    /// before one JSON field (`order_id`, `user_id`, `product_id`, ... each a
    /// field, as a deployment's streams hold them when it upgrades); returns
    /// the entry's id.
    pub async fn add_entry_of_fields(
        &self,
        product_id: &str,
        order_id: &str,
        user_id: u64,
        quantity: &str,
    ) -> String {
        let mut r = self.redis.clone();
        r.xadd(
            self.key(product_id, "orders"),
            "*",
            &[
                ("order_id", order_id.to_owned()),
                ("user_id", user_id.to_string()),
                ("product_id", product_id.to_owned()),
                ("quantity", quantity.to_owned()),
                ("price", "1".into()),
                ("created_ms", "1".into()),
                ("idempotency_key", "old-key".into()),
            ],
        )
        .await
        .expect("XADD")
    }
}

/// What MySQL holds for one sale.
impl TestApp {
    /// (rows, distinct order ids, units) in `tb_order` for a product.
    pub async fn persisted(&self, product_id: &str) -> (i64, i64, i64) {
        sqlx::query_as(
            "SELECT COUNT(*), COUNT(DISTINCT order_id), CAST(COALESCE(SUM(quantity), 0) AS SIGNED) \
             FROM tb_order WHERE product_id = ?",
        )
        .bind(product_id)
        .fetch_one(&self.mysql)
        .await
        .expect("count orders")
    }

    /// (order id, user id, quantity) of each row of a product in `tb_order`.
    pub async fn order_rows(&self, product_id: &str) -> Vec<(String, i64, i64)> {
        sqlx::query_as("SELECT order_id, user_id, quantity FROM tb_order WHERE product_id = ?")
            .bind(product_id)
            .fetch_all(&self.mysql)
            .await
            .expect("rows of tb_order")
    }

    pub async fn available_qty(&self, product_id: &str) -> i64 {
        sqlx::query_scalar("SELECT available_qty FROM tb_product WHERE product_id = ?")
            .bind(product_id)
            .fetch_one(&self.mysql)
            .await
            .expect("product row")
    }

    /// Waits until `units` units of the sale are in `tb_order` and nothing is pending.
    pub async fn drained(&self, product_id: &str, units: i64) {
        eventually(
            "the stream drained into MySQL",
            Duration::from_secs(30),
            || async {
                self.persisted(product_id).await.2 == units && self.pending(product_id).await == 0
            },
        )
        .await;
    }
}

/// The library's handles over this app's stores.
impl TestApp {
    /// The workers' sweeper with the payment timeout at zero: every
    /// confirmed order is overdue at its next sweep.
    pub fn overdue_sweeper(&self) -> flashsale::bookkeeping::Sweeper {
        flashsale::bookkeeping::Sweeper::new(
            self.books(),
            self.sales.lifecycle().clone(),
            Duration::ZERO,
            Duration::from_secs(5),
        )
    }

    /// The books over this app's stores, as the service builds them.
    pub fn books(&self) -> flashsale::bookkeeping::OrderLife {
        flashsale::bookkeeping::OrderLife::new(
            (self.sales.accepted().clone(), self.sales.ledger().clone()),
            (self.db.orders(), self.db.payments()),
        )
    }

    /// The recovery of a sale from the books, as `flashsale recover` runs it.
    pub fn recovery(&self) -> flashsale::bookkeeping::Recovery {
        flashsale::bookkeeping::Recovery::new(
            (self.sales.ledger().clone(), self.sales.lifecycle().clone()),
            (self.db.products(), self.db.orders()),
        )
    }

    /// The audit over this app's stores, as `flashsale audit` runs it.
    pub fn audit_of(&self) -> flashsale::bookkeeping::Audit {
        flashsale::bookkeeping::Audit::new(
            self.sales.ledger().clone(),
            (self.db.products(), self.db.orders(), self.db.audits()),
        )
    }

    /// Every opened sale's state, as `flashsale sales` lists them.
    pub fn settlement(&self) -> flashsale::bookkeeping::Settlement {
        flashsale::bookkeeping::Settlement::new(
            (self.sales.lifecycle().clone(), self.sales.watch().clone()),
            (self.db.products(), self.db.orders()),
            self.audit_of(),
        )
    }
}
