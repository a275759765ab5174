//! Bells: how a sleeping drain learns that its sale has a new order, so that
//! a quiet sale costs nothing and an order on it is persisted at once.
//!
//! A drain that finds its sale's stream empty asks to sleep
//! (`drain_sleep.lua`: nothing pending, nothing undelivered, then the sale's
//! `awake` mark is removed, atomically). The next order (`place_order.lua`)
//! finds the mark missing, sets it and `PUBLISH`es the sale's id on the
//! deployment's one channel, `<prefix>:bell`: one extra command for the
//! first order after a quiet spell, none for the others. On a Redis Cluster
//! the channel is not a key (the script's keys stay in the sale's slot) and
//! every node delivers a `PUBLISH`, so one subscription on any node hears
//! every sale.
//!
//! Each worker process holds one subscription ([`Bells::listen`]); a bell
//! wakes the drains of that sale ([`Bells::waiter`]). A subscription can
//! miss what is published while it is down, so whenever it (re)starts or
//! stops, every drain is woken to look once; while there is none, drains
//! poll as they did before bells ([`Bells::listening`]). A drain asleep also
//! looks on its own now and then, however quiet (see `worker::drain`).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::domain::{Chain, ProductId};
use crate::sale::conn::Redis;
use crate::sale::keys;

/// How often a quiet subscription is pinged (a half-open connection is
/// found within this plus the Redis timeout).
const PING_EVERY: Duration = Duration::from_secs(5);
/// How long a failed subscription waits before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The bells of this process's drains. Cheap to clone.
#[derive(Clone)]
pub struct Bells {
    inner: Arc<Inner>,
}

struct Inner {
    redis: Redis,
    channel: String,
    waiters: Mutex<HashMap<ProductId, Arc<Notify>>>,
    listening: AtomicBool,
    heard: AtomicU64,
}

impl Bells {
    pub(crate) fn new(redis: Redis, prefix: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                redis,
                channel: keys::bell_channel(prefix),
                waiters: Mutex::default(),
                listening: AtomicBool::new(false),
                heard: AtomicU64::new(0),
            }),
        }
    }

    /// The channel the order script publishes on.
    pub fn channel(&self) -> &str {
        &self.inner.channel
    }

    /// What a drain of `product` waits on: notified when the sale's bell
    /// rings, and whenever the subscription starts or stops (a permit is
    /// kept when nobody waits, so a bell between asking to sleep and
    /// waiting is not missed).
    pub fn waiter(&self, product: &ProductId) -> Arc<Notify> {
        self.waiters()
            .entry(product.clone())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone()
    }

    /// The drain of `product` stopped.
    pub fn forget(&self, product: &ProductId) {
        self.waiters().remove(product);
    }

    /// Whether a subscription is up: a drain may sleep on its bell only then.
    pub fn listening(&self) -> bool {
        self.inner.listening.load(Ordering::Acquire)
    }

    /// Bells heard by this process.
    pub fn heard(&self) -> u64 {
        self.inner.heard.load(Ordering::Relaxed)
    }

    fn waiters(&self) -> std::sync::MutexGuard<'_, HashMap<ProductId, Arc<Notify>>> {
        self.inner
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn ring(&self, payload: &[u8]) {
        self.inner.heard.fetch_add(1, Ordering::Relaxed);
        let Some(product) = std::str::from_utf8(payload)
            .ok()
            // A sale, or one of its stock shards (`<pid>~<k>`).
            .and_then(ProductId::parse_sale_or_shard)
        else {
            return;
        };
        if let Some(waiter) = self.waiters().get(&product) {
            waiter.notify_one();
        }
    }

    fn wake_all(&self) {
        for waiter in self.waiters().values() {
            waiter.notify_one();
        }
    }

    fn set_listening(&self, on: bool) {
        self.inner.listening.store(on, Ordering::Release);
        self.wake_all();
    }

    /// Holds the subscription until `shutdown`: subscribes (again after a
    /// failure, every second), rings the drains of each sale whose bell is
    /// heard, pings a quiet subscription to find a dead one.
    pub async fn listen(&self, shutdown: CancellationToken) {
        let redis = &self.inner.redis;
        let mut failing = false;
        loop {
            match redis.subscriber(self.channel()).await {
                Ok(pubsub) => {
                    if failing {
                        tracing::info!(channel = %self.channel(), "listening for bells again");
                    }
                    failing = false;
                    let lost = self.hear(pubsub, redis, &shutdown).await;
                    self.set_listening(false);
                    match lost {
                        None => return,
                        Some(why) => {
                            tracing::warn!(channel = %self.channel(), %why, "bell subscription lost; drains poll until it is back");
                        }
                    }
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(channel = %self.channel(), error = %Chain(&e), "cannot subscribe to bells; drains poll until it can");
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(RETRY_AFTER) => {}
            }
        }
    }

    /// Hears bells until the subscription fails (why) or `shutdown` (None).
    async fn hear(
        &self,
        pubsub: redis::aio::PubSub,
        redis: &Redis,
        shutdown: &CancellationToken,
    ) -> Option<String> {
        let (mut sink, mut stream) = pubsub.split();
        // Anything published before the subscription was heard by nobody:
        // every drain looks once.
        self.set_listening(true);
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                msg = next_message(&mut stream) => match msg {
                    Some(msg) => self.ring(msg.get_payload_bytes()),
                    None => return Some("the connection closed".into()),
                },
                _ = ping.tick() => {
                    if let Err(e) = redis.bounded(sink.ping::<redis::Value>()).await {
                        return Some(format!("ping failed: {}", Chain(&e)));
                    }
                }
            }
        }
    }
}

/// The subscription's next message; `None` once its connection is gone.
async fn next_message(stream: &mut redis::aio::PubSubStream) -> Option<redis::Msg> {
    std::future::poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
}
