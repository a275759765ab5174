//! `spawn_app()`: a real `flashsale serve` on port 0, against the real Redis and
//! MariaDB, isolated per test: its own database (`fs_test_<uuid>`, migrated by
//! the service's own startup code) and its own Redis key prefix. Both are
//! removed when the `TestApp` is dropped. Logs are silent unless `TEST_LOG` is set.
//!
//! `spawn_app_on(Backend::Cluster, ..)` runs the same service against a
//! 3-master Redis Cluster on ports 7000-7005 (`scripts/redis-cluster.sh`,
//! started here on first use when `.ci/run` has not started it).

use std::sync::Once;
use std::time::Duration;

use clap::Parser;
use flashsale::app::App;
use flashsale::config::Limits;
use flashsale::config::WorkerConfig;
use flashsale::config::{Cli, Command, Settings};
use flashsale::sale::{Conn, Sales};
use flashsale::store::Db;
use tokio::sync::oneshot;

use super::stores::{cluster_nodes, masters};
use super::{ADMIN_TOKEN, Backend, MYSQL_SERVER, REDIS_URL, unique};

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    /// The library's view of the sales, for checks below the HTTP layer.
    pub sales: Sales,
    pub db: Db,
    /// A direct connection to the test's database (not through any proxy the app uses).
    pub mysql: sqlx::MySqlPool,
    /// The settings the service was started with.
    pub settings: Settings,
    /// A direct Redis connection (cluster-aware on the cluster backend).
    pub redis: Conn,
    pub prefix: String,
    pub backend: Backend,
    db_name: String,
    _shutdown: oneshot::Sender<()>,
}

fn init_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // TEST_LOG=1 logs everything at debug; TEST_LOG=<filter> (e.g. `warn`) what it selects.
        if let Ok(filter) = std::env::var("TEST_LOG") {
            let filter = if filter == "1" {
                "debug".into()
            } else {
                filter
            };
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .init();
        }
    });
}

/// Worker settings for tests: short waits, so drains and reclaims happen quickly.
pub fn fast_workers(consumer: &str) -> WorkerConfig {
    WorkerConfig {
        consumer: consumer.into(),
        block: Duration::from_millis(200),
        registry_refresh: Duration::from_millis(100),
        backoff_max: Duration::from_millis(500),
        ..WorkerConfig::default()
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Spawns the service after `tweak` adjusted its settings.
pub async fn spawn_app_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_on(Backend::Single, tweak).await
}

/// The settings a test's service starts with: `flashsale serve`'s own, as its
/// command line makes them (`AUTH=none`: identity has tests of its own, the
/// others use the body's user_id), with the test's key prefix and database,
/// no limits (tests of other things send many orders from one user and
/// address) and quick workers.
pub fn settings_for(backend: Backend, prefix: &str, db_name: &str) -> Settings {
    let mut settings = settings_from_cli(backend, prefix, db_name, &["--auth=none"]);
    settings.http.limits = Limits::unlimited();
    settings
}

/// The settings of `flashsale serve` with the test's prefix, database and
/// quick workers, and `args` (flags parsed by its real command line) in
/// place of `--auth=none`; its limits are the command line's.
pub fn settings_from_cli(backend: Backend, prefix: &str, db_name: &str, args: &[&str]) -> Settings {
    let redis = match backend {
        Backend::Single => format!("--redis-url={REDIS_URL}"),
        Backend::Cluster => format!("--redis-cluster-nodes={}", cluster_nodes()),
        Backend::OwnCluster(base) => format!("--redis-cluster-nodes={}", masters(base)),
    };
    let cli = Cli::parse_from(
        [
            "flashsale".to_owned(),
            "serve".to_owned(),
            redis,
            format!("--key-prefix={prefix}"),
            "--redis-timeout-ms=2000".to_owned(),
            "--redis-pool-size=4".to_owned(),
            format!("--database-url={MYSQL_SERVER}/{db_name}"),
            "--db-timeout-ms=5000".to_owned(),
            "--db-max-connections=4".to_owned(),
            "--listen-addr=127.0.0.1:0".to_owned(),
            format!("--admin-token={ADMIN_TOKEN}"),
        ]
        .into_iter()
        .chain(args.iter().map(|a| (*a).to_owned())),
    );
    let Command::Serve(args) = cli.command else {
        unreachable!("parsed as serve")
    };
    let mut settings = Settings::from(*args);
    // Quick workers, with what the command line said of event delivery.
    let events = settings
        .workers
        .take()
        .map(|w| w.events)
        .unwrap_or_default();
    settings.workers = Some(WorkerConfig {
        events,
        ..fast_workers("w")
    });
    settings
}

/// Spawns the service on `backend` after `tweak` adjusted its settings, and
/// waits until its database is ready.
pub async fn spawn_app_on(backend: Backend, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let app = spawn_unready(backend, tweak).await;
    // The service creates and migrates its database in the background.
    tokio::time::timeout(Duration::from_secs(30), app.db.wait_ready())
        .await
        .expect("the service's database is ready");
    app
}

/// Spawns the service without waiting for anything but its bound port (as
/// `flashsale serve` starts, whatever Redis and MySQL are doing).
pub async fn spawn_unready(backend: Backend, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_unready_cli(backend, &["--auth=none"], tweak).await
}

/// Spawns the service with `args` on its command line (in place of
/// `--auth=none`), after `tweak`, and waits until its database is ready.
pub async fn spawn_app_cli(args: &[&str], tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let app = spawn_unready_cli(Backend::Single, args, tweak).await;
    tokio::time::timeout(Duration::from_secs(30), app.db.wait_ready())
        .await
        .expect("the service's database is ready");
    app
}

async fn spawn_unready_cli(
    backend: Backend,
    args: &[&str],
    tweak: impl FnOnce(&mut Settings),
) -> TestApp {
    init_logs();
    let prefix = unique("t");
    let db_name = unique("fs_test_");
    let mut settings = if args == ["--auth=none"] {
        settings_for(backend, &prefix, &db_name)
    } else {
        settings_from_cli(backend, &prefix, &db_name, args)
    };
    tweak(&mut settings);
    let app = tokio::time::timeout(Duration::from_secs(5), App::build(&settings))
        .await
        .expect("the service starts without waiting for its dependencies")
        .expect("app builds");
    let mut settings = settings;
    settings.http.listen_addr = app.local_addr().expect("bound");
    let addr = app.local_addr().expect("bound");
    let sales = app.sales().clone();
    let db = app.db().clone();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(app.run(async {
        let _ = rx.await;
    }));
    let redis = backend.connect().await;
    // Lazy: the database may not exist yet.
    let mysql =
        sqlx::MySqlPool::connect_lazy(&format!("{MYSQL_SERVER}/{db_name}")).expect("mysql url");
    TestApp {
        mysql,
        settings,
        base: format!("http://{addr}"),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client"),
        sales,
        db,
        redis,
        prefix,
        backend,
        db_name,
        _shutdown: tx,
    }
}

/// Another `serve` over the same sales and database (as a load balancer's
/// other instance); it runs until dropped.
pub struct Beside {
    pub base: String,
    pub db: Db,
    /// Its own view of the sales (its own memory, its own call counts).
    pub sales: Sales,
    _stop: oneshot::Sender<()>,
}

impl TestApp {
    /// Starts another `serve` with this one's settings (no workers) after
    /// `tweak`, waiting for nothing but its port, as `flashsale serve` starts.
    pub async fn serve_beside(&self, tweak: impl FnOnce(&mut Settings)) -> Beside {
        let mut settings = Settings {
            workers: None,
            ..self.settings.clone()
        };
        settings.http.listen_addr = "127.0.0.1:0".parse().expect("literal address");
        tweak(&mut settings);
        let app = tokio::time::timeout(Duration::from_secs(2), App::build(&settings))
            .await
            .expect("start-up waits for no dependency")
            .expect("builds");
        let base = format!("http://{}", app.local_addr().expect("bound"));
        let db = app.db().clone();
        let sales = app.sales().clone();
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(app.run(async {
            let _ = rx.await;
        }));
        Beside {
            base,
            db,
            sales,
            _stop: tx,
        }
    }
}

impl TestApp {
    /// Another instance with workers of its own (consumer `consumer`),
    /// after `tweak`; once its database is ready.
    pub async fn workers_beside(
        &self,
        consumer: impl Into<String>,
        tweak: impl FnOnce(&mut Settings),
    ) -> Beside {
        let mut w = self.settings.workers.clone().expect("workers");
        w.consumer = consumer.into();
        self.serve_beside(|s| {
            s.workers = Some(w);
            tweak(s);
        })
        .await
        .ready()
        .await
    }
}

impl Beside {
    /// Once its database is ready.
    pub async fn ready(self) -> Self {
        tokio::time::timeout(Duration::from_secs(30), self.db.wait_ready())
            .await
            .expect("its database is ready");
        self
    }
}

impl Drop for TestApp {
    /// Removes the test's database and Redis keys, on a thread of its own
    /// since Drop cannot await, and never for long: a lock held by a
    /// connection of this (now blocked) runtime must not hang the test. A
    /// failed test keeps its data for inspection; `.ci/run` sweeps leftovers.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "kept for inspection: database {}, redis keys {}:*",
                self.db_name, self.prefix
            );
            return;
        }
        let (db, prefix) = (self.db_name.clone(), self.prefix.clone());
        let servers = self.backend.servers();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // The database first: quick, where the keys of a cluster test
            // (thousands, one DEL each on six servers) may outlast the
            // 10 s this waits, and the process exit the thread (issue 68
            // found such databases left behind).
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    use sqlx::Connection;
                    if let Ok(mut c) = sqlx::MySqlConnection::connect(MYSQL_SERVER).await {
                        let _ = sqlx::query("SET SESSION lock_wait_timeout = 5")
                            .execute(&mut c)
                            .await;
                        // The service is still running (this thread blocks
                        // its runtime), and a transaction of its holds its
                        // tables' metadata locks: the DROP would wait them
                        // out and give up, the database left behind (issue
                        // 68 counted 5 after a run). Its connections go first.
                        let ids: Vec<i64> = sqlx::query_scalar(
                            "SELECT ID FROM information_schema.PROCESSLIST \
                             WHERE DB = ? AND ID <> CONNECTION_ID()",
                        )
                        .bind(&db)
                        .fetch_all(&mut c)
                        .await
                        .unwrap_or_default();
                        for id in ids {
                            let _ = sqlx::query(&format!("KILL CONNECTION {id}"))
                                .execute(&mut c)
                                .await;
                        }
                        let dropped = sqlx::query(&format!("DROP DATABASE IF EXISTS `{db}`"))
                            .execute(&mut c)
                            .await;
                        if let Err(e) = dropped {
                            eprintln!("database {db} not dropped: {e}");
                        }
                    }
                });
            }
            // Key by key: on a cluster each key is deleted on its own master
            // (replicas refuse, harmlessly).
            for server in servers {
                if let Ok(client) = redis::Client::open(server)
                    && let Ok(mut conn) = client.get_connection()
                {
                    let keys: Vec<String> = redis::cmd("KEYS")
                        .arg(format!("{prefix}:*"))
                        .query(&mut conn)
                        .unwrap_or_default();
                    for key in keys {
                        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(key).query(&mut conn);
                    }
                }
            }
            let _ = done.send(());
        });
        let _ = finished.recv_timeout(Duration::from_secs(10));
    }
}

impl TestApp {
    /// The test's database (on the shared server, unless re-pointed).
    pub fn db_name(&self) -> &str {
        &self.db_name
    }

    /// Workers (named `consumer`) that retire an ended sale as soon as it
    /// settled, and delete its keys `grace` after.
    pub fn retiring_workers(&self, consumer: &str, grace: Duration) -> flashsale::worker::Workers {
        let mut cfg = fast_workers(consumer);
        cfg.retire = flashsale::config::RetireSettings {
            after: Duration::ZERO,
            grace,
            batch: 500,
            pace: Duration::ZERO,
        };
        flashsale::worker::Workers::new(&self.sales, &self.db, cfg)
    }
}
