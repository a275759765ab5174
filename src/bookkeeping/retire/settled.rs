//! Whether an ended sale is settled ([`assess`]), and every opened sale with
//! its lifecycle state ([`list`], for `flashsale sales`). Read-only.

use std::time::Duration;

use serde::Serialize;

use crate::bookkeeping::audit::{Audit, SaleAudit};
use crate::bookkeeping::error::BookkeepingError;
use crate::domain::{ProductId, SaleState, now_ms};
use crate::sale::{Lifecycle, Watch};
use crate::store::{self, Product};

/// Why an ended sale is not retired yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Blocker {
    /// Its end (plus `RETIRE_AFTER_SECS`) has not passed by Redis's clock.
    NotEnded { ends_ms: i64 },
    /// Redis does not have the sale: `flashsale recover` it first.
    MissingInRedis,
    /// Stream entries undelivered or delivered and not acknowledged
    /// (`None`: Redis cannot count the undelivered ones).
    Pending { entries: Option<u64> },
    /// Cancels asked while their orders were pending, not applied yet.
    CancelRequests { count: u64 },
    /// Cancelled orders whose units are not back in Redis yet.
    UnreturnedCancels { units: i64 },
    /// Orders `confirmed` and not paid: their payment window (or the
    /// sweeper's cancel after it) is still to come.
    Unpaid { orders: i64, oldest_ms: i64 },
    /// Orders answered 202 that never reached the books: an operator must
    /// deal with them (`flashsale streams`, the runbook) before it retires.
    DeadLetters { count: u64 },
    /// The audit does not balance (the failed checks).
    BooksOff { detail: String },
}

/// How long after a sale's orders last changed its timelines are written
/// whole: each process writes a second once it is over (about a second
/// later), within the books' timeout; three seconds leave room for both.
pub const TIMELINE_SETTLE: Duration = Duration::from_secs(3);

impl Blocker {
    /// The reason's code, as the metrics and the dashboard show it.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotEnded { .. } => "not_ended",
            Self::MissingInRedis => "missing_in_redis",
            Self::Pending { .. } => "pending",
            Self::CancelRequests { .. } => "cancel_requests",
            Self::UnreturnedCancels { .. } => "unreturned_cancels",
            Self::Unpaid { .. } => "unpaid",
            Self::DeadLetters { .. } => "dead_letters",
            Self::BooksOff { .. } => "books_off",
        }
    }

    /// For people: the reason and its figure.
    pub fn describe(&self) -> String {
        match self {
            Self::NotEnded { ends_ms } => {
                format!("within RETIRE_AFTER_SECS of its end (until {ends_ms})")
            }
            Self::MissingInRedis => "missing in Redis (flashsale recover)".into(),
            Self::Pending { entries: Some(n) } => format!("{n} stream entries not persisted"),
            Self::Pending { entries: None } => "stream entries not persisted".into(),
            Self::CancelRequests { count } => format!("{count} cancel requests waiting"),
            Self::UnreturnedCancels { units } => {
                format!("{units} cancelled units not back in Redis")
            }
            Self::Unpaid { orders, .. } => format!("{orders} orders unpaid"),
            Self::DeadLetters { count } => format!("{count} dead letters (operator)"),
            Self::BooksOff { detail } => format!("books do not balance: {detail}"),
        }
    }
}

/// What an ended, unretired sale needs before it can retire.
#[derive(Debug, Clone)]
pub struct Assessment {
    /// Empty: settled.
    pub blockers: Vec<Blocker>,
    /// The full audit, when everything else was settled.
    pub audit: Option<SaleAudit>,
}

impl Assessment {
    fn blocked(blockers: Vec<Blocker>) -> Self {
        Self {
            blockers,
            audit: None,
        }
    }
}

/// A product's lifecycle state, from its row alone (never `Unsettled`:
/// that takes [`assess`]).
pub fn state_of(product: &Product, now_ms: i64) -> SaleState {
    if product.retired.is_some() {
        SaleState::Retired
    } else if product.opened.is_none() {
        if product.closed.is_some() {
            SaleState::Closed
        } else {
            SaleState::Created
        }
    } else if now_ms >= product.end_time {
        // Before its start too, for a sale closed before it opened to
        // buyers (its planned start is kept).
        SaleState::Ended
    } else if now_ms < product.start_time {
        SaleState::Upcoming
    } else {
        SaleState::Live
    }
}

/// One opened sale as `flashsale sales` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    pub product_id: String,
    /// `ended`: settled, it retires at the next pass, or once
    /// RETIRE_AFTER_SECS has passed when `blockers` is that wait alone;
    /// `unsettled`: every reason is in `blockers`.
    pub state: SaleState,
    pub start_time: i64,
    pub end_time: i64,
    /// Closed early by an admin at (epoch ms).
    pub closed: Option<i64>,
    pub retired: Option<i64>,
    /// A retired sale's Redis keys are deleted.
    pub purged: bool,
    /// Why an ended sale is not retired.
    pub blockers: Vec<Blocker>,
}

/// What a settlement's assessment reads: the sale's clock and stream in
/// Redis, its orders in MySQL, its full audit.
#[derive(Clone)]
pub struct Settlement {
    lifecycle: Lifecycle,
    watch: Watch,
    products: store::Products,
    orders: store::Orders,
    audit: Audit,
}

impl Settlement {
    pub fn new(
        (lifecycle, watch): (Lifecycle, Watch),
        (products, orders): (store::Products, store::Orders),
        audit: Audit,
    ) -> Self {
        Self {
            lifecycle,
            watch,
            products,
            orders,
            audit,
        }
    }

    /// Whether `product` (opened, not retired) is settled; cheap checks first,
    /// the full audit (every order) only when they all pass.
    pub async fn assess(
        &self,
        product: &Product,
        after: Duration,
    ) -> Result<Assessment, BookkeepingError> {
        let id = product_id(product)?;
        let (redis_now, window) = self.lifecycle.clock(&id).await?;
        let Some((_, end_ms)) = window else {
            return Ok(Assessment::blocked(vec![Blocker::MissingInRedis]));
        };
        // Every reason is named from the sale's first ended moment: the wait
        // for RETIRE_AFTER_SECS is one of them, not a reason to look no further.
        let ends_ms = end_ms.max(product.end_time) + after.as_millis() as i64;
        let mut blockers = Vec::new();
        if redis_now < ends_ms || now_ms() < ends_ms {
            blockers.push(Blocker::NotEnded { ends_ms });
        }
        blockers.extend(self.unsettled_work(&id).await?);
        if !blockers.is_empty() {
            return Ok(Assessment::blocked(blockers));
        }
        let audit = self.audit.sale(product).await?;
        if audit.pending > 0 {
            blockers.push(Blocker::Pending { entries: None });
        }
        if !audit.ok() {
            let failed: Vec<String> = audit
                .checks
                .iter()
                .filter(|c| !c.ok)
                .map(|c| format!("{}: {}", c.name, c.detail))
                .collect();
            blockers.push(Blocker::BooksOff {
                detail: failed.join("; "),
            });
        }
        Ok(Assessment {
            blockers,
            audit: Some(audit),
        })
    }

    /// What is still to happen to an ended sale's orders: stream entries,
    /// cancels, unpaid orders, dead letters (the cheap checks, before the audit).
    async fn unsettled_work(&self, id: &ProductId) -> Result<Vec<Blocker>, BookkeepingError> {
        let mut blockers = Vec::new();
        let watch = self.watch.view(id).await?;
        match watch.undelivered() {
            Some(0) if watch.pending == 0 => {}
            undelivered => blockers.push(Blocker::Pending {
                entries: undelivered.map(|u| u + watch.pending),
            }),
        }
        if watch.cancel_requests > 0 {
            blockers.push(Blocker::CancelRequests {
                count: watch.cancel_requests,
            });
        }
        let (unreturned, _) = self.orders.unreturned_units(id).await?;
        if unreturned > 0 {
            blockers.push(Blocker::UnreturnedCancels { units: unreturned });
        }
        let (unpaid, oldest) = self.orders.unpaid_orders(id).await?;
        if unpaid > 0 {
            blockers.push(Blocker::Unpaid {
                orders: unpaid,
                oldest_ms: oldest.unwrap_or(0),
            });
        }
        if watch.dead_letters > 0 {
            blockers.push(Blocker::DeadLetters {
                count: watch.dead_letters,
            });
        }
        Ok(blockers)
    }

    /// Waits until the sale's orders last changed [`TIMELINE_SETTLE`] ago
    /// (at most that long): then every process's timeline holds the
    /// changes, a payment timeout or a cancel of the last moment included.
    pub async fn timelines_settled(&self, id: &ProductId) -> Result<(), BookkeepingError> {
        if let Some(changed_ms) = self.orders.last_change(id).await? {
            let left = TIMELINE_SETTLE.as_millis() as i64 - (now_ms() - changed_ms);
            if left > 0 {
                tokio::time::sleep(Duration::from_millis(left.unsigned_abs())).await;
            }
        }
        Ok(())
    }

    /// Every opened sale, oldest first, with its state; ended ones assessed as
    /// the workers would (`after`: `RETIRE_AFTER_SECS`). Read-only.
    pub async fn list(&self, after: Duration) -> Result<Vec<Listed>, BookkeepingError> {
        let now = now_ms();
        let mut out = Vec::new();
        for product in self.products.opened_products().await? {
            let mut blockers = Vec::new();
            let state = match state_of(&product, now) {
                SaleState::Ended => {
                    let assessed = self.assess(&product, after).await?;
                    blockers = assessed.blockers;
                    match blockers[..] {
                        // Settled (the wait for RETIRE_AFTER_SECS is kept, for when).
                        [] | [Blocker::NotEnded { .. }] => SaleState::Ended,
                        _ => SaleState::Unsettled,
                    }
                }
                state => state,
            };
            out.push(Listed {
                product_id: product.product_id.clone(),
                state,
                start_time: product.start_time,
                end_time: product.end_time,
                closed: product.closed,
                retired: product.retired,
                purged: product.purged.is_some(),
                blockers,
            });
        }
        Ok(out)
    }
}

/// Each product with its id (a row whose id does not parse is skipped: no
/// sale of this service could have it).
pub(super) fn with_ids(products: &[Product]) -> Vec<(&Product, ProductId)> {
    products
        .iter()
        .filter_map(|p| product_id(p).ok().map(|id| (p, id)))
        .collect()
}

pub(super) fn product_id(product: &Product) -> Result<ProductId, BookkeepingError> {
    ProductId::parse(&product.product_id)
        .map_err(|e| BookkeepingError::Corrupt(format!("product id in tb_product: {e}")))
}
