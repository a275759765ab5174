//! The repairer: watches the server behind the books and, when it changes
//! (a failover promoted a replica), puts back what the new primary lacks
//! and the sales' streams still hold.
//!
//! An asynchronous replica promoted by a failover lacks the commits it had
//! not received: orders the workers had persisted and acked. Their stream
//! entries stay in the stream until it is trimmed (`STREAM_RETENTION_SECS`
//! after they were acked), so the repair reads every open sale's retained
//! entries again and persists them as a drain would (claimed first, so a
//! voided order stays out; persisting is idempotent by order id: what the
//! new primary has is left alone). The event ids skip ahead
//! (`Events::skip_ahead`): an id the old primary gave a lost event is never
//! given to another.
//!
//! The books' server is remembered in Redis (`<prefix>:books:server`), so
//! a failover while no worker ran is found at the next start. The first
//! server ever seen is only remembered.
//!
//! After the orders, what Redis keeps of their lives after the 202: the
//! cancels whose units it has back, the payments it keeps
//! (`bookkeeping::put_back`). Everything put back is listed for the operator
//! (`tb_put_back`, shown with the sale's audit).
//!
//! And the orders that reached the dead letters (MySQL refused their rows
//! `MAX_DELIVERIES` times): tried again at every repair, and every 30
//! checks for the sales with orders since the last try (a quiet sale's
//! every 30 minutes: the cost follows orders, not the number of open
//! sales), taken home once the books take them (listed as `dead_letter`).

use crate::bookkeeping::OrderLife;
use crate::domain::{Chain, ProductId};
use crate::sale::{Lifecycle, Streams};
use crate::store::{self, PutBack};

use std::time::Duration;

use super::activity::{Activity, Looks};
use super::error::WorkerError;

/// Entries read per call of a repair.
const PAGE: usize = 500;

/// What one repair did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Repaired {
    /// Retained entries read again.
    pub read: u64,
    /// Orders put back into the books.
    pub orders: u64,
    /// Cancels (a buyer's, a payment timeout's, a refund's) made again.
    pub cancels: u64,
    /// Dead-lettered orders the books took once their cause was gone.
    pub dead_letters: u64,
    /// Payments recorded again.
    pub payments: u64,
}

/// Watches the books' server; repairs after it changes.
pub struct Repairer {
    lifecycle: Lifecycle,
    streams: Streams,
    order_life: OrderLife,
    orders: store::Orders,
    events: store::Events,
    /// Where what is put back is listed.
    audits: store::Audits,
    /// The server this process last found (asked of MySQL each check).
    seen: Option<String>,
    /// When the dead letters were last tried, and how often they are.
    dead_tried: Option<tokio::time::Instant>,
    dead_every: Duration,
    /// Which sales' dead letters are due a try: an active sale's at every
    /// pass, a quiet one's every `QUIET_PASSES` (the cost follows orders,
    /// not the number of open sales).
    dead_looks: Looks,
    activity: Activity,
}

/// The dead letters are tried again every this many checks (every 30 s for
/// a check every second).
const DEAD_LETTER_CHECKS: u32 = 30;

impl Repairer {
    /// A repairer whose [`Self::check`] runs every `every`.
    pub fn new(
        (lifecycle, streams): (Lifecycle, Streams),
        order_life: OrderLife,
        (orders, events, audits): (store::Orders, store::Events, store::Audits),
        (activity, every): (Activity, Duration),
    ) -> Self {
        let dead_every = every * DEAD_LETTER_CHECKS;
        Self {
            dead_every,
            dead_looks: Looks::new(dead_every),
            activity,
            lifecycle,
            streams,
            order_life,
            orders,
            events,
            audits,
            seen: None,
            dead_tried: None,
        }
    }

    /// One check: a repair when the books' server is not the one Redis
    /// remembers; and every [`DEAD_LETTER_CHECKS`] checks, the dead letters
    /// of the sales due a look tried again; `None` when there was nothing
    /// to repair.
    pub async fn check(&mut self) -> Result<Option<Repaired>, WorkerError> {
        let now = self.orders.server_identity().await?;
        let repaired = match self.seen.as_deref() == Some(now.as_str()) {
            true => None,
            false => self.after_a_change(now).await?,
        };
        let due = self
            .dead_tried
            .is_none_or(|t| t.elapsed() >= self.dead_every);
        if repaired.is_some() || !due {
            return Ok(repaired);
        }
        self.dead_tried = Some(tokio::time::Instant::now());
        let open = self.lifecycle.open_sales().await?;
        let mut taken = 0;
        for product in self.dead_looks.due(&self.activity, &open) {
            taken += self.put_back_dead_letters(&product).await?;
        }
        Ok((taken > 0).then_some(Repaired {
            dead_letters: taken,
            ..Repaired::default()
        }))
    }

    /// The books' server found `now`: a repair when Redis remembers another.
    async fn after_a_change(&mut self, now: String) -> Result<Option<Repaired>, WorkerError> {
        let before = self.streams.books_server().await?;
        let repaired = match &before {
            Some(before) if *before != now => {
                tracing::warn!(before = %before, now = %now,
                    "the books' server changed (a failover?): putting back what the streams hold and the books lack");
                let next = self.events.skip_ahead().await?;
                tracing::info!(
                    next_row = next,
                    "event ids skip ahead of any the old server gave"
                );
                Some(self.repair().await?)
            }
            _ => None,
        };
        self.streams.set_books_server(&now).await?;
        self.seen = Some(now);
        Ok(repaired)
    }

    /// A sale's dead-lettered orders persisted, where MySQL takes them now
    /// (the cause fixed: a schema, a grant, a server that refused them), each
    /// listed as put back (`dead_letter`) and removed from the dead letters.
    /// What still does not parse, or that MySQL still refuses, stays.
    async fn put_back_dead_letters(&self, product: &ProductId) -> Result<u64, WorkerError> {
        let stream = self.streams.stream(product, "repair");
        let (mut after, mut taken) = ("0-0".to_owned(), 0);
        loop {
            let dead = stream.dead_letters(&after, PAGE).await?;
            let Some(last) = dead.last() else {
                return Ok(taken);
            };
            after = last.id.clone();
            for entry in &dead {
                // One at a time: one that MySQL refuses keeps its place.
                let Ok(order) = entry.order(product) else {
                    continue;
                };
                let held = self.orders.statuses(&[order.order_id.as_str()]).await?;
                match self
                    .orders
                    .persist_orders(product, std::slice::from_ref(&order))
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.is_unavailable() => return Err(e.into()),
                    Err(e) => {
                        tracing::warn!(product_id = %product, entry = %entry.id, error = %Chain(&e),
                            "a dead letter the books still refuse");
                        continue;
                    }
                }
                if !held.contains_key(order.order_id.as_str()) {
                    let put_back = PutBack::order("dead_letter", order.order_id.as_str());
                    self.audits.note_put_back(product, &[put_back]).await?;
                    taken += 1;
                    tracing::warn!(product_id = %product, order_id = %order.order_id,
                        "a dead-lettered order put back into the books");
                }
                stream.forget_dead_letters(&[entry.id.as_str()]).await?;
            }
        }
    }

    /// Every open sale's retained entries persisted again (what is in the
    /// books already is left as it is).
    async fn repair(&self) -> Result<Repaired, WorkerError> {
        let mut total = Repaired::default();
        for product in self.lifecycle.open_sales().await? {
            let mut r = self.repair_orders(&product).await?;
            if r.orders > 0 {
                tracing::warn!(product_id = %product, orders = r.orders, read = r.read,
                    "orders the books had lost put back from the stream");
            }
            let cancels = self.order_life.put_back_cancels(&product).await?;
            self.audits.note_put_back(&product, &cancels).await?;
            let payments = self.order_life.put_back_payments(&product).await?;
            self.audits.note_put_back(&product, &payments).await?;
            r.cancels = cancels.len() as u64;
            r.dead_letters = self.put_back_dead_letters(&product).await?;
            r.payments = payments.len() as u64;
            total.read += r.read;
            total.orders += r.orders;
            total.cancels += r.cancels;
            total.payments += r.payments;
            total.dead_letters += r.dead_letters;
        }
        tracing::info!(
            read = total.read,
            orders = total.orders,
            cancels = total.cancels,
            payments = total.payments,
            "repair after the books' failover done"
        );
        Ok(total)
    }

    /// A sale's retained entries persisted again; the orders the books
    /// lacked are listed.
    async fn repair_orders(&self, product: &ProductId) -> Result<Repaired, WorkerError> {
        let stream = self.streams.stream(product, "repair");
        let mut done = Repaired::default();
        let mut after = "0-0".to_owned();
        loop {
            let entries = stream.range(&after, PAGE).await?;
            let Some(last) = entries.last() else {
                return Ok(done);
            };
            after = last.id.clone();
            done.read += entries.len() as u64;
            let mut orders = Vec::with_capacity(entries.len());
            for e in &entries {
                match e.order(product) {
                    Ok(o) => orders.push(o),
                    // The drain dead-letters what does not parse.
                    Err(why) => tracing::debug!(entry = %e.id, why, "left for the drain"),
                }
            }
            stream.confirm_replicated().await?;
            let ids: Vec<&str> = orders.iter().map(|o| o.order_id.as_str()).collect();
            let voided = stream.claim(&after, &ids).await?;
            orders.retain(|o| !voided.iter().any(|v| v == o.order_id.as_str()));
            let ids: Vec<&str> = orders.iter().map(|o| o.order_id.as_str()).collect();
            let held = self.orders.statuses(&ids).await?;
            match self.orders.persist_orders(product, &orders).await {
                Ok(p) => done.orders += p.inserted,
                Err(e) => {
                    tracing::warn!(product_id = %product, error = %Chain(&e), "repair stopped; tried again at the next check");
                    return Err(e.into());
                }
            }
            let put_back: Vec<PutBack> = ids
                .iter()
                .filter(|id| !held.contains_key(**id))
                .map(|id| PutBack::order("order", id))
                .collect();
            self.audits.note_put_back(product, &put_back).await?;
        }
    }
}
