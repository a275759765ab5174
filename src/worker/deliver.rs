//! The outbox pushed to the shop: each event of `tb_event`, in id order,
//! POSTed to each endpoint of `EVENT_WEBHOOK_URL` (each on its own: its
//! cursor, lease, back-off and dead letters) as a Standard Webhooks message (signed
//! with `EVENT_WEBHOOK_SECRET`; `webhook-id: evt_<id>`, the same on every
//! retry, so a receiver deduplicates by it).
//!
//! Delivery is at least once and in order (overall, so per order too): one
//! process at a time delivers to an endpoint (a lease in
//! `tb_event_delivery`, renewed each pass), the next event only after the
//! one before was acknowledged (a 2xx). A failure is retried after an
//! exponential back-off with jitter; after `EVENT_WEBHOOK_MAX_ATTEMPTS` the
//! event goes to the dead letters (`tb_event_dead`) and delivery moves on.
//! An operator replays dead letters (`POST /api/admin/events/dead/replay`).

use std::time::Duration;

use axum::http::header;
use reqwest::{Client, Url, redirect};
use tokio_util::sync::CancellationToken;

use crate::bookkeeping::EventMessage;
use crate::config::DeliverySettings;
use crate::domain::backoff;
use crate::domain::{Chain, now_ms};
use crate::metrics::Metrics;
use crate::metrics::timeline::Count;
use crate::store::{Deliveries, Delivery, EventRow, Events, StoreError};

/// Why a deliverer's HTTP client cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the endpoint {0} is not a URL the client takes")]
    Url(String, #[source] url::ParseError),
    #[error("cannot build the HTTP client (its TLS settings)")]
    Build(#[from] reqwest::Error),
}

/// The deliverer's HTTP client (reqwest over rustls with ring): HTTP/1.1,
/// the public web PKI's roots (webpki-roots, built in: the same on every
/// machine) and `settings.ca`, a bound on connecting, no redirects followed
/// (a 3xx is a failed attempt, as any other non-2xx), no proxy from the
/// environment.
fn client(settings: &DeliverySettings) -> Result<Client, reqwest::Error> {
    let mut builder = Client::builder()
        .http1_only()
        .connect_timeout(settings.timeout)
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(30))
        .redirect(redirect::Policy::none())
        .no_proxy();
    for cert in settings.ca.iter().flat_map(|ca| ca.certs()) {
        builder = builder.add_root_certificate(reqwest::Certificate::from_der(cert)?);
    }
    builder.build()
}

/// Events read per pass.
const BATCH: u32 = 500;

/// When the next pass should come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// At once: a full page was sent, more may wait.
    Now,
    /// At this time (epoch ms): a retry after a failure.
    At(i64),
    /// Caught up, or another process delivers.
    Idle,
}
/// Dead letters replayed per pass.
const REPLAYS: u32 = 10;
/// Longest answer body read (then dropped) from the receiver.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// One process's deliverer to one endpoint.
pub struct Deliverer {
    events: Events,
    deliveries: Deliveries,
    settings: DeliverySettings,
    endpoint: String,
    url: Url,
    owner: String,
    client: Client,
    metrics: std::sync::Arc<Metrics>,
    lags: std::sync::Arc<Lags>,
}

/// The lag of each endpoint this process delivers to; the gauge
/// `event_delivery_lag` shows the largest.
#[derive(Default)]
pub struct Lags(std::sync::Mutex<std::collections::BTreeMap<String, i64>>);

impl Lags {
    fn update(&self, endpoint: &str, metrics: &Metrics, change: impl FnOnce(&mut i64)) {
        let mut lags = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(lags.entry(endpoint.to_owned()).or_default());
        let worst = lags.values().copied().max().unwrap_or(0);
        metrics.event_delivery_lag.set(worst.max(0));
    }
}

impl Deliverer {
    pub fn new(
        (events, deliveries): (Events, Deliveries),
        settings: DeliverySettings,
        owner: String,
        metrics: std::sync::Arc<Metrics>,
    ) -> Result<Self, ClientError> {
        let endpoint = settings.url.to_string();
        let url = Url::parse(&endpoint).map_err(|e| ClientError::Url(endpoint.clone(), e))?;
        Ok(Self {
            events,
            deliveries,
            client: client(&settings)?,
            endpoint,
            url,
            settings,
            owner,
            metrics,
            lags: Default::default(),
        })
    }

    /// Shares the lag gauge with the process's other deliverers.
    pub fn sharing(mut self, lags: std::sync::Arc<Lags>) -> Self {
        self.lags = lags;
        self
    }

    /// The lease's length: a pass fits in it (it stops sending at half).
    fn lease(&self) -> Duration {
        (self.settings.timeout * 4).max(Duration::from_secs(10))
    }

    /// Passes until `shutdown`: the next one at once while events wait
    /// (a pass sends at most [`BATCH`]), at the retry's time after a
    /// failure, and `idle` later once caught up (or while another process
    /// holds the lease, or after an error, which is logged).
    pub async fn run(&self, idle: Duration, shutdown: CancellationToken) {
        // Zero: delivery off (as for the workers' other passes).
        if idle.is_zero() {
            return;
        }
        loop {
            let wait = match self.pass().await {
                Ok(Next::Now) => Duration::ZERO,
                Ok(Next::At(ms)) => {
                    Duration::from_millis(u64::try_from(ms - now_ms()).unwrap_or(0)).min(idle)
                }
                Ok(Next::Idle) => idle,
                Err(e) => {
                    tracing::warn!(endpoint = %self.endpoint, error = %Chain(&e), "event delivery failed; the next pass retries");
                    idle
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One pass: takes the lease (or finds another process holds it),
    /// replays what an operator asked for, then delivers in order until
    /// a failure, the end of the settled events, or half the lease.
    pub async fn pass(&self) -> Result<Next, StoreError> {
        let started = tokio::time::Instant::now();
        let now = now_ms();
        let lease = self.lease();
        let until = now + lease.as_millis() as i64;
        let Some(at) = self
            .deliveries
            .lease_delivery(&self.endpoint, &self.owner, now, until)
            .await?
        else {
            return Ok(Next::Idle);
        };
        self.replay().await?;
        self.gauge(&at).await?;
        if at.next_attempt > now {
            return Ok(Next::At(at.next_attempt));
        }
        self.in_order(at, started, lease).await
    }

    /// The dead letters an operator asked to replay, each tried once.
    async fn replay(&self) -> Result<(), StoreError> {
        for e in self.deliveries.replays(&self.endpoint, REPLAYS).await? {
            let sent = self.send(&e).await;
            let why = sent.as_ref().err().map_or("", String::as_str);
            self.deliveries
                .replayed(&self.endpoint, e.id, sent.is_ok(), why)
                .await?;
            self.count(if sent.is_ok() { "replayed" } else { "failed" });
            if sent.is_ok() {
                self.metrics
                    .timeline
                    .count(&e.product_id, Count::EventsDelivered, 1);
            }
        }
        Ok(())
    }

    /// The dead letters and the lag, for the metrics and the dashboard.
    async fn gauge(&self, at: &Delivery) -> Result<(), StoreError> {
        let dead = self.deliveries.dead_event_count().await?;
        self.metrics.event_dead_letters.set(dead);
        let lag = self.events.events_behind(at.delivered_up_to).await?;
        self.lags
            .update(&self.endpoint, &self.metrics, |l| *l = lag.max(0));
        Ok(())
    }

    /// The next events after the cursor, in order, until a failure, the
    /// end of the settled ones, or half the lease since `started`.
    async fn in_order(
        &self,
        at: Delivery,
        started: tokio::time::Instant,
        lease: Duration,
    ) -> Result<Next, StoreError> {
        // The cursor is written once a pass (or at a failure), not per
        // event: a crash re-delivers this pass's events, under the same
        // webhook-ids (at least once), and MySQL does one commit a pass.
        let mut attempts = at.attempts;
        let mut acked = None;
        let events = self.events.events_after(at.delivered_up_to, BATCH).await?;
        // A full page: more may wait behind it.
        let mut next = match events.len() >= BATCH as usize {
            true => Next::Now,
            false => Next::Idle,
        };
        for e in events {
            // The lease outlives the pass: nobody else sends meanwhile.
            if started.elapsed() > lease / 2 {
                next = Next::Now;
                break;
            }
            match self.send(&e).await {
                Ok(()) => {
                    acked = Some(e.id);
                    attempts = 0;
                    self.delivered(&e);
                }
                Err(why) => {
                    attempts += 1;
                    if let Some(at) = self.failed(&e, acked, attempts, &why).await? {
                        return Ok(Next::At(at));
                    }
                    // Given up: a dead letter, and delivery moves on.
                    (acked, attempts) = (None, 0);
                }
            }
        }
        if let Some(id) = acked {
            self.deliveries
                .delivered(&self.endpoint, &self.owner, id)
                .await?;
        }
        Ok(next)
    }

    /// Counts a delivered event (a crash re-delivers: counted per delivery,
    /// as the receiver sees them, in the sale's timeline too).
    fn delivered(&self, e: &EventRow) {
        self.count("delivered");
        self.metrics
            .timeline
            .count(&e.product_id, Count::EventsDelivered, 1);
        self.lags.update(&self.endpoint, &self.metrics, |l| *l -= 1);
    }

    /// Event `e` failed its `attempts`th try: tried again at the time
    /// returned (the cursor moved up to `acked` meanwhile), or, out of
    /// attempts, moved to the dead letters (`None`: go on with the next).
    async fn failed(
        &self,
        e: &EventRow,
        acked: Option<i64>,
        attempts: u32,
        why: &str,
    ) -> Result<Option<i64>, StoreError> {
        self.count("failed");
        tracing::warn!(event_id = e.id, attempts, error = %why, "event delivery failed");
        if attempts < self.settings.max_attempts {
            let next = now_ms() + self.backoff(attempts).as_millis() as i64;
            self.deliveries
                .delivery_failed(&self.endpoint, &self.owner, acked, attempts, next, why)
                .await?;
            return Ok(Some(next));
        }
        tracing::error!(event_id = e.id, attempts, "event dead-lettered");
        self.deliveries
            .dead_letter_event(&self.endpoint, &self.owner, e.id, attempts, why, now_ms())
            .await?;
        self.count("dead_lettered");
        self.metrics
            .timeline
            .count(&e.product_id, Count::EventsDead, 1);
        self.metrics.event_dead_letters.inc();
        Ok(None)
    }

    fn count(&self, result: &str) {
        self.metrics
            .event_deliveries
            .with_label_values(&[result])
            .inc();
    }

    /// The wait after the `attempts`-th failure: doubling from
    /// `backoff_min` up to `backoff_max`, drawn from its upper half.
    fn backoff(&self, attempts: u32) -> Duration {
        let s = &self.settings;
        backoff::jittered_after(attempts, s.backoff_min, s.backoff_max)
    }

    /// One attempt: `Ok` on a 2xx within the timeout.
    #[tracing::instrument(level = "debug", skip_all, fields(endpoint = %self.endpoint, event_id = e.id, order_id = e.order_id.as_deref(), product_id = %e.product_id, user_id = e.user_id))]
    async fn send(&self, e: &EventRow) -> Result<(), String> {
        let body = serde_json::to_vec(&EventMessage::from(e.clone()))
            .map_err(|err| format!("cannot encode the event: {err}"))?;
        let id = format!("evt_{}", e.id);
        let ts = now_ms() / 1000;
        let signature = self.settings.secret.sign(&id, ts, &body);
        let req = self
            .client
            .post(self.url.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature)
            .body(body);
        let attempt = async {
            let mut resp = req
                .send()
                .await
                .map_err(|err| format!("cannot reach the endpoint: {}", Chain(&err)))?;
            let status = resp.status();
            // Read (a bounded part of) the answer, so the connection is reused.
            let mut read = 0;
            while read < MAX_ANSWER_BYTES {
                match resp.chunk().await {
                    Ok(Some(chunk)) => read += chunk.len(),
                    Ok(None) | Err(_) => break,
                }
            }
            match status.is_success() {
                true => Ok(()),
                false => Err(format!("the endpoint answered {status}")),
            }
        };
        tokio::time::timeout(self.settings.timeout, attempt)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.settings.timeout)))
    }
}
