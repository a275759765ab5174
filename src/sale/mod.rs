//! The Redis side of a flash sale: where stock is deducted.
//!
//! A sale lives in Redis under keys that share the product id as hash tag
//! ([`keys`]). The Lua scripts in `lua/` change it ([`scripts`]): opening a
//! sale, placing an order (check, deduct and enqueue in one atomic step),
//! taking back an order its replicas did not confirm, claiming a batch for
//! the books, releasing an order's units, dead-lettering an entry, restoring
//! what the books hold; [`SaleStream`] is the consumer group's side of a
//! sale's stream; [`inspect`] reads it for operators and the audit;
//! [`memory`] answers the orders that cannot change the books (outside the
//! window, sold out, at the limit, unknown product) from Redis's earlier
//! answers, without a round trip. This
//! module is the only code that reads or writes a sale's keys (`Sales`
//! keeps its Redis handle to itself); it never talks to MySQL.

mod conn;
pub mod durability;
mod entry;
pub mod inspect;
pub mod keys;
pub mod memory;
pub mod retire;
pub mod room;
mod scripts;
mod stream;
pub mod watch;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use rust_decimal::Decimal;
use serde::Deserialize;

pub use conn::{Conn, Pool, Redis, RedisTarget, Wait};
pub use entry::Entry;
pub use inspect::{DeadLetter, SaleSnapshot};
pub use keys::SaleKeys;
pub use memory::{Memory, MemorySettings};
pub use scripts::{OrderCall, PlaceReply, place_order as place_order_on};
pub use stream::{Claimed, SaleStream};

use crate::domain::{OrderId, PendingOrder, ProductId};

/// A failure to get an answer from Redis.
#[derive(Debug, thiserror::Error)]
pub enum SaleError {
    /// The order was refused by the sale's rules; nothing changed.
    #[error("order refused: {0:?}")]
    Rejected(Rejection),
    /// The order was refused from this process's memory of Redis's answers
    /// (see [`memory`]), without asking Redis; nothing changed.
    #[error("order refused from memory: {0:?}")]
    Remembered(Rejection),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis pool: {0}")]
    Pool(#[from] bb8::RunError<redis::RedisError>),
    /// The order was accepted, but fewer replicas than asked confirmed it
    /// within the WAIT timeout: it could be lost in a failover.
    #[error("order not confirmed by {wanted} replicas ({acked} did)")]
    NotReplicated { acked: u32, wanted: u32 },
    /// A script or key held something this code did not write: a bug or a
    /// foreign writer, never the caller's fault.
    #[error("unexpected data in redis: {0}")]
    Corrupt(String),
}

impl SaleError {
    /// True when Redis is down, slow or refusing service (a 503, not a bug).
    pub fn is_unavailable(&self) -> bool {
        use redis::{ErrorKind, ServerErrorKind};
        match self {
            Self::Timeout(_) | Self::Pool(_) | Self::NotReplicated { .. } => true,
            Self::Redis(e) => match e.kind() {
                ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::AuthenticationFailed
                | ErrorKind::Extension => true,
                // Moved/Ask surface only when the client's own retries ran out
                // (a slot whose master is gone, mid-failover).
                ErrorKind::Server(kind) => matches!(
                    kind,
                    ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::NoPerm
                ),
                _ => e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout(),
            },
            Self::Rejected(_) | Self::Remembered(_) | Self::Corrupt(_) => false,
        }
    }
}

/// Why the order script refused an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The sale is not open in Redis (unknown product, or created but not opened).
    NoSale,
    /// The sale opens at `starts_at_ms` (epoch ms), in about `in_ms` by Redis's clock.
    NotStarted {
        starts_at_ms: i64,
        in_ms: u64,
    },
    Ended,
    SoldOut,
    /// Some stock is left, but less than the order asks for.
    InsufficientStock {
        left: u64,
    },
    /// The order would take the buyer over the per-user limit.
    LimitExceeded {
        allowance: u64,
    },
    /// The sale has a waiting room, and the buyer brought no valid admission.
    AdmissionRequired,
}

/// The settings a sale is opened with (from its `tb_product` row).
#[derive(Debug, Clone)]
pub struct SaleSpec {
    pub stock: u64,
    pub start_ms: i64,
    pub end_ms: i64,
    pub limit_per_user: u64,
    pub price: Decimal,
    pub waiting_room: Option<crate::domain::WaitingRoom>,
}

/// How far an accepted order got, as far as Redis knows (`order_state.lua`).
/// MySQL knows more (paid, cancelled before the units came back): this is
/// for answering while it is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// In the stream, not yet persisted.
    Queued,
    /// Persisted (acked by a worker): `confirmed` or later in MySQL.
    Persisted,
    /// A cancel waits for the order to be persisted.
    CancelRequested,
    /// Cancelled, and its units are back on sale.
    Released,
    /// In dead letters: never persisted, waiting for an operator.
    DeadLettered,
}

/// What `place_order` did with an order it did not refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub order: PendingOrder,
    /// True when the idempotency key had been seen: this is the first order, and
    /// nothing was deducted this time.
    pub replayed: bool,
}

/// An order as the books (MySQL) hold it, for [`Sales::restore_booked`].
#[derive(Debug, Clone)]
pub struct Booked {
    pub order: PendingOrder,
    pub state: BookedState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BookedState {
    /// Confirmed or paid: its units are sold.
    Sold,
    /// Cancelled; its units are not yet back in Redis.
    Cancelled,
    /// Cancelled, and its units were given back to Redis.
    Returned,
}

/// What [`Sales::restore_booked`] put back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Restored {
    /// Orders Redis did not know.
    pub orders: u64,
    /// Units taken off the stock for them.
    pub units: u64,
    /// Releases Redis had lost, done again.
    pub releases: u64,
    /// Idempotency records restored.
    pub idempotency_records: u64,
    /// The sale's stock after the last chunk (negative: oversold by that much).
    pub stock: i64,
}

impl Restored {
    fn add(self, o: Restored) -> Restored {
        Restored {
            orders: self.orders + o.orders,
            units: self.units + o.units,
            releases: self.releases + o.releases,
            idempotency_records: self.idempotency_records + o.idempotency_records,
            stock: o.stock,
        }
    }

    /// True when Redis had lost nothing.
    pub fn is_empty(&self) -> bool {
        self.orders == 0 && self.releases == 0 && self.idempotency_records == 0
    }
}

/// What reconciliation restored in a sale over its life (its `repaired` hash).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Repairs {
    pub orders: u64,
    pub units: u64,
    pub releases: u64,
    pub idempotency_records: u64,
    /// When the last repair was made (Redis time, epoch ms).
    pub last_ms: Option<i64>,
}

/// The `accepted` record of an order restored from the books: no stream
/// entry (it is persisted), marked `booked`.
fn booked_record(o: &PendingOrder) -> String {
    serde_json::json!({
        "user_id": o.user_id,
        "quantity": o.quantity,
        "price": o.price.to_string(),
        "created_ms": o.created_ms,
        "booked": true,
    })
    .to_string()
}

/// Orders per `restore_booked.lua` call (bounded script run time).
const RESTORE_CHUNK: usize = 200;

/// An order's record in the `accepted` hash, as `place_order.lua` writes it.
#[derive(Debug, Deserialize)]
struct AcceptedRecord {
    #[serde(default)]
    idempotency_key: Option<String>,
    user_id: u64,
    quantity: u64,
    price: Decimal,
    created_ms: i64,
}

impl AcceptedRecord {
    fn parse(
        json: &str,
        order_id: OrderId,
        product_id: ProductId,
    ) -> Result<PendingOrder, SaleError> {
        let r: Self = serde_json::from_str(json)
            .map_err(|e| SaleError::Corrupt(format!("order record {order_id}: {e}")))?;
        Ok(PendingOrder {
            order_id,
            user_id: r.user_id,
            product_id,
            quantity: r.quantity,
            price: r.price,
            created_ms: r.created_ms,
            idempotency_key: r.idempotency_key,
        })
    }
}

/// The sales of this deployment, as seen in Redis.
#[derive(Clone)]
pub struct Sales {
    redis: Redis,
    prefix: String,
    memory: Arc<Memory>,
    calls: Arc<Calls>,
    wait: Option<Wait>,
    rooms: Arc<room::Rooms>,
}

/// The Redis calls the order path made (the savings of [`memory`] show here).
#[derive(Debug, Default)]
struct Calls {
    /// `place_order.lua`.
    orders: AtomicU64,
    /// `sale_clock.lua` and registry reads, in the background.
    memory_reads: AtomicU64,
    /// `room_tick.lua` and `room_join.lua`.
    rooms: AtomicU64,
}

impl Sales {
    pub fn new(redis: Redis, prefix: impl Into<String>) -> Self {
        Self {
            redis,
            prefix: prefix.into(),
            memory: Arc::new(Memory::new(MemorySettings::default())),
            calls: Arc::default(),
            wait: None,
            rooms: Arc::default(),
        }
    }

    /// Answer orders from memory as `settings` say ([`MemorySettings::off`]:
    /// every order goes to Redis).
    pub fn with_memory(mut self, settings: MemorySettings) -> Self {
        self.memory = Arc::new(Memory::new(settings));
        self
    }

    /// Confirm each accepted order on `wait.replicas` replicas before answering.
    pub fn with_wait(mut self, wait: Option<Wait>) -> Self {
        self.wait = wait.filter(|w| w.replicas > 0);
        self
    }

    /// `place_order.lua` calls this process has sent.
    pub fn script_calls(&self) -> u64 {
        self.calls.orders.load(Ordering::Relaxed)
    }

    /// Background reads that keep the memory fresh (a sale's window and
    /// clock, the registry), sent by this process.
    pub fn memory_reads(&self) -> u64 {
        self.calls.memory_reads.load(Ordering::Relaxed)
    }

    /// Waiting-room scripts (`room_tick.lua`, `room_join.lua`) this
    /// process has sent.
    pub fn room_calls(&self) -> u64 {
        self.calls.rooms.load(Ordering::Relaxed)
    }

    /// One sale's stream, for consumer `consumer` of its group.
    pub fn stream(&self, product: &ProductId, consumer: &str) -> SaleStream {
        SaleStream::new(self.redis.clone(), self.keys(product), consumer)
    }

    /// The Redis below: for this module's parts and the service's own
    /// health checks, never for reading or writing a sale's keys elsewhere.
    pub(crate) fn redis(&self) -> &Redis {
        &self.redis
    }

    pub fn keys(&self, product: &ProductId) -> SaleKeys {
        SaleKeys::new(&self.prefix, product)
    }

    /// Loads a sale into Redis unless it is open already, and lists it in the
    /// registry the workers drain; returns `(opened_now, stock_left)`.
    pub async fn open(
        &self,
        product: &ProductId,
        spec: &SaleSpec,
    ) -> Result<(bool, u64), SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        let opened = self
            .redis
            .bounded(scripts::open_sale(&mut conn, &keys, spec))
            .await?;
        // A command of its own: the registry lives in another slot than the
        // sale. Repeated on every open, so opening again repairs a crash
        // between the two.
        let registry = keys::registry(&self.prefix);
        self.redis
            .bounded(conn.sadd::<_, _, ()>(&registry, product.as_str()))
            .await?;
        if opened.0 {
            // Whatever was remembered of an earlier sale of this id is void.
            self.memory.forget(product);
            self.forget_room(product);
        }
        self.memory.opened(product);
        Ok(opened)
    }

    /// Deletes every key of a sale and drops it from the registry: the sale
    /// is gone from Redis (its orders must be in the books first).
    pub async fn remove(&self, product: &ProductId) -> Result<(), SaleError> {
        self.unlink(product).await?;
        self.forget(product).await
    }

    /// Drops a sale from the registry (its keys stay).
    pub async fn forget(&self, product: &ProductId) -> Result<(), SaleError> {
        self.forget_all(std::slice::from_ref(product)).await
    }

    /// The sales listed in the registry.
    pub async fn open_sales(&self) -> Result<Vec<ProductId>, SaleError> {
        let mut conn = self.redis.shared().await?;
        let ids: Vec<String> = self
            .redis
            .bounded(conn.smembers(keys::registry(&self.prefix)))
            .await?;
        Ok(ids
            .iter()
            .filter_map(|id| ProductId::parse(id).ok())
            .collect())
    }

    /// Decides one order atomically; see `lua/place_order.lua`. `admitted`:
    /// the caller checked the buyer's admission from the sale's waiting room
    /// (a sale with a room refuses every other order).
    #[tracing::instrument(level = "debug", skip(self), fields(product_id = %product))]
    pub async fn place_order(
        &self,
        product: &ProductId,
        user_id: u64,
        quantity: u64,
        idempotency_key: Option<&str>,
        admitted: bool,
    ) -> Result<Placed, SaleError> {
        let recall = self
            .memory
            .recall(product, user_id, quantity, idempotency_key.is_some());
        if recall.refresh_known {
            self.refresh_known_sales();
        }
        if recall.refresh_sale {
            self.refresh_sale_clock(product);
        }
        if recall.renew_sold_out {
            self.renew_sold_out(product);
        }
        if let Some(answer) = recall.answer {
            return Err(SaleError::Remembered(answer));
        }
        // A keyed order may be the retry of an accepted one: only the script
        // can answer it.
        if !admitted
            && idempotency_key.is_none()
            && let Some(refusal) = self.refusal_without_admission(product)
        {
            return Err(SaleError::Remembered(refusal));
        }
        // Boxed: the Redis call's future is most of this one's size (5 KB),
        // which every caller's future would otherwise carry and copy, for
        // the answers from memory above too (BENCHMARKS.md, "The order
        // path against the floor").
        Box::pin(self.place_in_redis(product, user_id, quantity, idempotency_key, admitted)).await
    }

    async fn place_in_redis(
        &self,
        product: &ProductId,
        user_id: u64,
        quantity: u64,
        idempotency_key: Option<&str>,
        admitted: bool,
    ) -> Result<Placed, SaleError> {
        let keys = self.keys(product);
        let order_id = OrderId::generate(product);
        let idem = idempotency_key.map(|k| format!("{user_id}:{k}"));
        let call = scripts::OrderCall {
            order_id: &order_id,
            user_id,
            product,
            quantity,
            idempotency_field: idem.as_deref(),
            idempotency_key,
            admitted,
        };
        self.calls.orders.fetch_add(1, Ordering::Relaxed);
        let sent = self.memory.now();
        let reply = match self.wait {
            None => {
                let mut conn = self.redis.shared().await?;
                self.redis
                    .bounded(scripts::place_order(&mut conn, &keys, &call))
                    .await?
            }
            Some(wait) => self.place_and_wait(&keys, &call, wait).await?,
        };
        let received = self.memory.now();
        let learn = |heard| {
            self.memory.learn(product, user_id, heard, sent, received);
        };
        match reply {
            scripts::PlaceReply::Accepted {
                price,
                created_ms,
                allowance_left,
            } => {
                learn(memory::Heard::Accepted {
                    now_ms: created_ms,
                    allowance_left,
                });
                Ok(Placed {
                    order: PendingOrder {
                        order_id,
                        user_id,
                        product_id: product.clone(),
                        quantity,
                        price,
                        created_ms,
                        idempotency_key: idempotency_key.map(str::to_owned),
                    },
                    replayed: false,
                })
            }
            scripts::PlaceReply::Replayed { order_id, record } => {
                learn(memory::Heard::Other);
                Ok(Placed {
                    order: AcceptedRecord::parse(&record, order_id, product.clone())?,
                    replayed: true,
                })
            }
            scripts::PlaceReply::OutsideWindow {
                start_ms,
                end_ms,
                now_ms,
            } => {
                learn(memory::Heard::OutsideWindow {
                    start_ms,
                    end_ms,
                    now_ms,
                });
                Err(SaleError::Rejected(if now_ms < start_ms {
                    Rejection::NotStarted {
                        starts_at_ms: start_ms,
                        in_ms: (start_ms - now_ms) as u64,
                    }
                } else {
                    Rejection::Ended
                }))
            }
            scripts::PlaceReply::Rejected(r) => {
                if r == Rejection::AdmissionRequired {
                    // The next orders without an admission are refused here.
                    self.renew_room(product);
                }
                learn(match r {
                    Rejection::NoSale => memory::Heard::NoSale,
                    Rejection::SoldOut => memory::Heard::SoldOut,
                    Rejection::LimitExceeded { allowance } => memory::Heard::Limit { allowance },
                    _ => memory::Heard::Other,
                });
                Err(SaleError::Rejected(r))
            }
        }
    }

    /// Runs `read`, a read that keeps [`memory`] fresh, in the background
    /// (no order waits for it), counted in [`Sales::memory_reads`].
    fn read_in_background<F>(&self, read: impl FnOnce(Sales) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.calls.memory_reads.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(read(self.clone()));
    }

    /// Whether no sale has this id, by this process's last read of the
    /// registry (no Redis call; the read is renewed in the background when
    /// due). False when memory cannot say: then Redis is asked.
    pub fn is_no_sale(&self, product: &ProductId) -> bool {
        let known = self.memory.known();
        if known.claim_refresh() {
            self.refresh_known_sales();
        }
        known.lookup(product) == memory::Known::Unknown
    }

    /// Reads the registry, for [`memory`] to know which sales exist.
    fn refresh_known_sales(&self) {
        self.read_in_background(|sales| async move {
            let sent = Instant::now();
            match sales.open_sales().await {
                Ok(ids) => sales.memory.registry_read(ids, sent),
                Err(e) => {
                    tracing::debug!(error = %e, "registry read for memory failed");
                    sales.memory.known().refresh_failed();
                }
            }
        });
    }

    /// Reads a sale's stock, to renew its sold-out mark.
    fn renew_sold_out(&self, product: &ProductId) {
        let product = product.clone();
        self.read_in_background(|sales| async move {
            let keys = sales.keys(&product);
            let sent = Instant::now();
            let read = async {
                let mut conn = sales.redis.shared().await?;
                sales
                    .redis
                    .bounded(conn.get::<_, Option<i64>>(&keys.stock))
                    .await
            };
            let stock = match read.await {
                Ok(stock) => Some(stock),
                Err(e) => {
                    tracing::debug!(product_id = %product, error = %e, "stock read for the sold-out mark failed");
                    None
                }
            };
            sales.memory.stock_read(&product, sent, stock);
        });
    }

    /// Reads a sale's window and its Redis node's clock.
    fn refresh_sale_clock(&self, product: &ProductId) {
        let product = product.clone();
        self.read_in_background(|sales| async move {
            let keys = sales.keys(&product);
            let sent = sales.memory.now();
            let read = async {
                let mut conn = sales.redis.shared().await?;
                sales
                    .redis
                    .bounded(scripts::sale_clock(&mut conn, &keys))
                    .await
            };
            match read.await {
                Ok((redis_ms, window)) => {
                    let received = sales.memory.now();
                    sales
                        .memory
                        .refreshed(&product, window, redis_ms, sent, received);
                }
                Err(e) => {
                    tracing::debug!(product_id = %product, error = %e, "sale clock read failed");
                    sales.memory.refresh_failed(&product);
                }
            }
        });
    }

    /// The order script and its WAIT on a connection to themselves (WAIT
    /// blocks it, and counts that connection's own writes). A 202, first
    /// answer or replay, only once the replicas have the order: a failover
    /// must not lose an acknowledged one.
    async fn place_and_wait(
        &self,
        keys: &SaleKeys,
        call: &scripts::OrderCall<'_>,
        wait: Wait,
    ) -> Result<scripts::PlaceReply, SaleError> {
        let mut pooled = self.redis.exclusive().get().await?;
        let (reply, acked) = self
            .redis
            .bounded(scripts::place_order_and_wait(&mut pooled, keys, call, wait))
            .await?;
        match (&reply, wait.confirmed(acked)) {
            (scripts::PlaceReply::Rejected(_) | scripts::PlaceReply::OutsideWindow { .. }, _)
            | (_, Ok(())) => Ok(reply),
            (scripts::PlaceReply::Replayed { .. }, Err(e)) => Err(e),
            // A 503 for a new order: take it back, so that it never reaches
            // the books unless a later answer is a 202. (Unless a worker
            // claimed it meanwhile, after its own WAIT: then the replicas
            // have it after all.)
            (scripts::PlaceReply::Accepted { .. }, Err(e)) => {
                let voided = self
                    .void(
                        &mut pooled,
                        keys,
                        call.order_id,
                        call.idempotency_field,
                        call.product,
                        call.user_id,
                    )
                    .await;
                match voided {
                    Some(scripts::Voided::Claimed) => Ok(reply),
                    _ => Err(e),
                }
            }
        }
    }

    /// Takes back an order whose WAIT failed (see `lua/void_order.lua`), on
    /// the connection that placed it; `None` when Redis did not answer (the
    /// order then stands, like one a keyed retry answered: see the README).
    async fn void(
        &self,
        conn: &mut Conn,
        keys: &SaleKeys,
        order_id: &OrderId,
        idempotency_field: Option<&str>,
        product: &ProductId,
        user_id: u64,
    ) -> Option<scripts::Voided> {
        let voided = self
            .redis
            .bounded(scripts::void_order(conn, keys, order_id, idempotency_field))
            .await;
        match voided {
            Ok(scripts::Voided::Void) => {
                self.memory.released(product, Some(user_id));
                tracing::info!(order_id = %order_id, "order not confirmed by the replicas: voided");
            }
            Ok(scripts::Voided::Claimed) => {}
            Ok(other) => {
                tracing::warn!(order_id = %order_id, outcome = ?other, "unconfirmed order not voided; it stands");
            }
            Err(ref e) => {
                tracing::warn!(order_id = %order_id, error = %e, "unconfirmed order not voided; it stands");
            }
        }
        voided.ok()
    }

    /// Before a worker persists a batch: raises the sale's claimed mark to
    /// `last_entry` (no order up to it can be voided from now on) and
    /// returns the batch's orders that were voided, to be acked without a
    /// row. Call it after [`Sales::confirm_replicated`].
    pub async fn claim(
        &self,
        product: &ProductId,
        last_entry: &str,
        order_ids: &[&str],
    ) -> Result<Vec<String>, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        self.redis
            .bounded(scripts::claim_batch(
                &mut conn, &keys, last_entry, order_ids,
            ))
            .await
    }

    /// With WAIT configured: returns once the replicas hold everything
    /// written to the sale so far (its stream entries included), else
    /// `NotReplicated`. A write to the sale's slot and a WAIT behind it, on
    /// a connection of their own. The workers call it before persisting a
    /// batch: MySQL must never hold an order that a promoted replica would
    /// not know (it would sell the units again).
    pub async fn confirm_replicated(&self, product: &ProductId) -> Result<(), SaleError> {
        let Some(wait) = self.wait else {
            return Ok(());
        };
        let keys = self.keys(product);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&keys.replicated)
            .arg(now_ms)
            .arg("PX")
            .arg(60_000);
        let mut pooled = self.redis.exclusive().get().await?;
        let (_, acked) = self
            .redis
            .bounded(conn::then_wait(&mut pooled, &keys.orders, pipe, wait))
            .await?;
        wait.confirmed(acked)
    }

    /// Brings the sale's Redis state in line with orders the books hold (see
    /// `lua/restore_booked.lua`): orders Redis lost come back with their
    /// units, buyer counts and idempotency records; releases it lost are
    /// done again. Idempotent, chunk by chunk atomic, safe while the sale
    /// takes orders. `count_as_repair` records it in the sale's repaired hash.
    pub async fn restore_booked(
        &self,
        product: &ProductId,
        booked: &[Booked],
        count_as_repair: bool,
    ) -> Result<Restored, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        let mut total = Restored::default();
        for chunk in booked.chunks(RESTORE_CHUNK) {
            let done = self
                .redis
                .bounded(scripts::restore_booked(
                    &mut conn,
                    &keys,
                    chunk,
                    count_as_repair,
                ))
                .await?;
            total = total.add(done);
        }
        if !total.is_empty() {
            self.memory.released(product, None);
        }
        Ok(total)
    }

    /// Before `flashsale recover` rebuilds a sale from the books: drops what
    /// Redis has left of its state and sets the stock to `initial` (the
    /// sale hash stays away, so every order is refused until it is open).
    pub async fn reset(&self, product: &ProductId, initial: u64) -> Result<(), SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        let mut pipe = redis::pipe();
        pipe.atomic()
            .del(&[
                &keys.sale,
                &keys.stock,
                &keys.bought,
                &keys.released,
                &keys.accepted,
                &keys.idem,
                &keys.void,
            ])
            .ignore()
            .set(&keys.stock, initial)
            .ignore();
        self.redis
            .bounded(pipe.query_async::<()>(&mut conn))
            .await?;
        self.memory.forget(product);
        Ok(())
    }

    /// For each sale: an id of the Redis master serving it, which changes
    /// when its data may have changed under us (a failover, a restart); see
    /// [`Redis::master_epochs`].
    pub async fn master_epochs(&self, products: &[ProductId]) -> Result<Vec<String>, SaleError> {
        let tags: Vec<&str> = products.iter().map(ProductId::as_str).collect();
        self.redis.master_epochs(&tags).await
    }

    /// What reconciliation has restored in this sale so far (zeros: nothing).
    pub async fn repairs(&self, product: &ProductId) -> Result<Repairs, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        let h: std::collections::HashMap<String, i64> =
            self.redis.bounded(conn.hgetall(&keys.repaired)).await?;
        let get = |k: &str| h.get(k).copied().unwrap_or(0).max(0) as u64;
        Ok(Repairs {
            orders: get("orders"),
            units: get("units"),
            releases: get("releases"),
            idempotency_records: get("idempotency_records"),
            last_ms: h.get("last_ms").copied(),
        })
    }

    /// Units left, or `None` when the sale is not open in Redis.
    pub async fn stock(&self, product: &ProductId) -> Result<Option<u64>, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        let stock: Option<i64> = self.redis.bounded(conn.get(&keys.stock)).await?;
        Ok(stock.map(|s| s.max(0) as u64))
    }

    /// An accepted order's record, if the sale still holds it.
    pub async fn find_order(
        &self,
        order_id: &OrderId,
        product: &ProductId,
    ) -> Result<Option<PendingOrder>, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        let record: Option<String> = self
            .redis
            .bounded(conn.hget(&keys.accepted, order_id.as_str()))
            .await?;
        record
            .map(|r| AcceptedRecord::parse(&r, order_id.clone(), product.clone()))
            .transpose()
    }

    /// An accepted order's record and how far it got, if the sale still holds it.
    pub async fn order_progress(
        &self,
        order_id: &OrderId,
        product: &ProductId,
    ) -> Result<Option<(PendingOrder, Progress)>, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        let found = self
            .redis
            .bounded(scripts::order_state(&mut conn, &keys, order_id))
            .await?;
        found
            .map(|(record, progress)| {
                let order = AcceptedRecord::parse(&record, order_id.clone(), product.clone())?;
                Ok((order, progress))
            })
            .transpose()
    }

    /// Remembers a cancel asked while the order is still pending (in the
    /// stream, not yet in MySQL); it is applied once the order is persisted.
    pub async fn request_cancel(&self, order: &PendingOrder) -> Result<(), SaleError> {
        let keys = self.keys(&order.product_id);
        let mut conn = self.redis.shared().await?;
        self.redis
            .bounded(conn.hset::<_, _, _, ()>(
                &keys.cancels,
                order.order_id.as_str(),
                order.user_id,
            ))
            .await
    }

    /// The cancels asked for `product`'s pending orders: (order id, user id).
    pub async fn cancel_requests(
        &self,
        product: &ProductId,
    ) -> Result<Vec<(String, u64)>, SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        self.redis.bounded(conn.hgetall(&keys.cancels)).await
    }

    /// A cancel request was applied (or is moot).
    pub async fn drop_cancel_request(
        &self,
        product: &ProductId,
        order_id: &str,
    ) -> Result<(), SaleError> {
        let keys = self.keys(product);
        let mut conn = self.redis.shared().await?;
        self.redis
            .bounded(conn.hdel::<_, _, ()>(&keys.cancels, order_id))
            .await
    }

    /// Returns an order's units to the sale, at most once per order; returns
    /// `(released_now, stock_left)`. See `lua/release_stock.lua`.
    ///
    /// With WAIT configured, only once the replicas have the release (else
    /// `NotReplicated`): the caller marks the order released after this, and
    /// a release a failover lost must stay unmarked, for the sweeper to redo.
    pub async fn release(&self, order: &PendingOrder) -> Result<(bool, u64), SaleError> {
        let keys = self.keys(&order.product_id);
        let (released, replicated) = match self.wait {
            None => {
                let mut conn = self.redis.shared().await?;
                let released = self
                    .redis
                    .bounded(scripts::release_stock(&mut conn, &keys, order))
                    .await?;
                (released, Ok(()))
            }
            Some(wait) => {
                let mut pooled = self.redis.exclusive().get().await?;
                let (released, acked) = self
                    .redis
                    .bounded(scripts::release_stock_and_wait(
                        &mut pooled,
                        &keys,
                        order,
                        wait,
                    ))
                    .await?;
                (released, wait.confirmed(acked))
            }
        };
        // The units are back on the master either way.
        self.memory.released(&order.product_id, Some(order.user_id));
        replicated?;
        Ok(released)
    }
}
