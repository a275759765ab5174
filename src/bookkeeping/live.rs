//! The books, watched: every open sale checked every few seconds, cheaply,
//! and the verdict exported (`flashsale_sale_books_balanced`), so that a
//! sale whose units stop adding up is an alert, not a report someone might
//! run.
//!
//! The full audit ([`super::audit`]) reads every order of the sale; this
//! check reads a handful of figures. From the audit's two equations
//! (Redis: `initial == stock + pending + confirmed + paid + dead letters +
//! cancelled not yet returned`; MySQL: `available_qty == initial −
//! confirmed − paid`) follows one that needs no order rows:
//!
//! `available_qty − stock == pending + dead letters + cancelled not yet returned`
//!
//! A lost order (acked, never inserted), an order inserted twice, a stock
//! changed by hand: each leaves a difference.
//!
//! A live sale disagrees for an instant in three legitimate ways: an order
//! committed to MySQL and not yet acknowledged in the stream (counted on
//! both sides), a cancel whose units are back in Redis and not yet marked
//! returned in MySQL, and anything that happens between the reads of the
//! two stores. So a sale is judged only when quiet: nothing undelivered or
//! pending in its stream and the same stock before and after the MySQL
//! reads, and no cancel younger than the reconciler's grace still
//! unreturned (pending units are then 0). Otherwise it is *settling* and
//! keeps its last verdict. A mismatch must also be seen twice in a row,
//! with the same difference, before the sale is called unbalanced; one
//! balanced judgement calls it balanced again.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::error::BookkeepingError;
use crate::domain::{ProductId, now_ms};
use crate::sale::watch::Backlog;
use crate::sale::{Ledger, Watch};
use crate::store;

/// What one check saw of a sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// Entries undelivered + delivered and not acknowledged, before and
    /// after the MySQL reads (`None`: Redis could not say).
    pub backlog: (Option<u64>, Option<u64>),
    /// Redis stock before and after (`None`: the sale is not in Redis).
    pub stock: (Option<i64>, Option<i64>),
    pub available_qty: i64,
    pub dead_letter_units: i64,
    pub unreturned_units: i64,
    /// When the newest unreturned cancel happened (epoch ms, 0: none).
    pub newest_unreturned_ms: i64,
}

/// One check's judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    Balanced,
    /// `available_qty − stock − (dead letters + unreturned)`, in units.
    Unbalanced {
        difference: i64,
    },
    /// Orders in flight: no verdict now.
    Settling,
}

impl Look {
    /// The judgement, `now_ms` being the time of the check and `grace` the
    /// reconciler's for a cancel's Redis half.
    pub fn judge(&self, now_ms: i64, grace: Duration) -> Judged {
        let quiet_stream = self.backlog == (Some(0), Some(0));
        let recent_cancel = self.unreturned_units > 0
            && self.newest_unreturned_ms > now_ms - grace.as_millis() as i64;
        if !quiet_stream || self.stock.0 != self.stock.1 || recent_cancel {
            return Judged::Settling;
        }
        let Some(stock) = self.stock.1 else {
            // Registered as open, and gone from Redis: see `flashsale recover`.
            return Judged::Unbalanced {
                difference: self.available_qty,
            };
        };
        let difference =
            self.available_qty - stock - (self.dead_letter_units + self.unreturned_units);
        if difference == 0 && self.available_qty >= 0 {
            Judged::Balanced
        } else {
            Judged::Unbalanced { difference }
        }
    }
}

/// What is exported for a sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub balanced: bool,
    /// The difference last judged (0 when balanced).
    pub difference: i64,
}

/// The verdicts of the open sales, from their judgements over time.
#[derive(Debug, Default)]
pub struct Verdicts {
    sales: HashMap<ProductId, State>,
}

#[derive(Debug, Default, Clone, Copy)]
struct State {
    verdict: Option<Verdict>,
    /// A mismatch seen once, waiting to be seen again.
    suspect: Option<i64>,
}

impl Verdicts {
    /// Records a judgement; returns the sale's verdict (`None` until the
    /// sale was first judged).
    pub fn record(&mut self, product: &ProductId, judged: Judged) -> Option<Verdict> {
        let state = self.sales.entry(product.clone()).or_default();
        match judged {
            Judged::Settling => {}
            Judged::Balanced => {
                state.suspect = None;
                state.verdict = Some(Verdict {
                    balanced: true,
                    difference: 0,
                });
            }
            Judged::Unbalanced { difference } if state.suspect == Some(difference) => {
                state.verdict = Some(Verdict {
                    balanced: false,
                    difference,
                });
            }
            Judged::Unbalanced { difference } => state.suspect = Some(difference),
        }
        state.verdict
    }

    /// Forgets the sales not in `open`; returns those forgotten.
    pub fn retain(&mut self, open: &[ProductId]) -> Vec<ProductId> {
        let open: HashSet<&ProductId> = open.iter().collect();
        let gone: Vec<ProductId> = self
            .sales
            .keys()
            .filter(|p| !open.contains(p))
            .cloned()
            .collect();
        for p in &gone {
            self.sales.remove(p);
        }
        gone
    }
}

/// What the live check reads: the stream, the dead letters, the books'
/// figures.
#[derive(Clone)]
pub struct LiveCheck {
    watch: Watch,
    ledger: Ledger,
    orders: store::Orders,
}

impl LiveCheck {
    pub fn new((watch, ledger): (Watch, Ledger), orders: store::Orders) -> Self {
        Self {
            watch,
            ledger,
            orders,
        }
    }

    /// Looks at one sale: Redis, then MySQL, then Redis again.
    pub async fn look(&self, product: &ProductId) -> Result<Look, BookkeepingError> {
        let stock = |v: &Backlog| v.stock.map(|s| s.max(0));
        let before = self.watch.backlog(product).await?;
        let (available_qty, (unreturned_units, newest_unreturned_ms)) =
            self.orders.books_figures(product).await?.ok_or_else(|| {
                BookkeepingError::Corrupt(format!("open sale {product} is not in tb_product"))
            })?;
        let dead_letter_units = match before.dead_letters {
            0 => 0,
            _ => self
                .ledger
                .dead_letters(product)
                .await?
                .iter()
                .map(|d| d.quantity)
                .sum(),
        };
        let after = self.watch.backlog(product).await?;
        Ok(Look {
            backlog: (before.unsettled, after.unsettled),
            stock: (stock(&before), stock(&after)),
            available_qty,
            dead_letter_units,
            unreturned_units,
            newest_unreturned_ms,
        })
    }

    /// Checks `product` now and records the judgement.
    pub async fn check(
        &self,
        product: &ProductId,
        grace: Duration,
        verdicts: &mut Verdicts,
    ) -> Result<Option<Verdict>, BookkeepingError> {
        let judged = self.look(product).await?.judge(now_ms(), grace);
        if let Judged::Unbalanced { difference } = judged {
            tracing::debug!(%product, difference, "the books do not balance (yet)");
        }
        Ok(verdicts.record(product, judged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(10);
    const NOW: i64 = 1_000_000;

    fn quiet(stock: i64, available_qty: i64) -> Look {
        Look {
            backlog: (Some(0), Some(0)),
            stock: (Some(stock), Some(stock)),
            available_qty,
            dead_letter_units: 0,
            unreturned_units: 0,
            newest_unreturned_ms: 0,
        }
    }

    #[test]
    fn a_quiet_sale_is_judged_by_the_equation() {
        // 100 units: 60 persisted, 40 left.
        assert_eq!(quiet(40, 40).judge(NOW, GRACE), Judged::Balanced);
        // A dead letter (2 units) and an old unreturned cancel (3 units)
        // are units taken from the stock and not persisted.
        let look = Look {
            dead_letter_units: 2,
            unreturned_units: 3,
            newest_unreturned_ms: NOW - 60_000,
            ..quiet(35, 40)
        };
        assert_eq!(look.judge(NOW, GRACE), Judged::Balanced);
        // A lost order (acked, never inserted) leaves MySQL's figure high.
        assert_eq!(
            quiet(39, 40).judge(NOW, GRACE),
            Judged::Unbalanced { difference: 1 }
        );
        // A stock raised by hand.
        assert_eq!(
            quiet(45, 40).judge(NOW, GRACE),
            Judged::Unbalanced { difference: -5 }
        );
        // The sale gone from Redis.
        let gone = Look {
            stock: (None, None),
            ..quiet(0, 40)
        };
        assert_eq!(
            gone.judge(NOW, GRACE),
            Judged::Unbalanced { difference: 40 }
        );
    }

    #[test]
    fn orders_in_flight_are_not_judged() {
        let pending = Look {
            backlog: (Some(0), Some(3)),
            ..quiet(39, 40)
        };
        assert_eq!(pending.judge(NOW, GRACE), Judged::Settling);
        let unknown = Look {
            backlog: (None, Some(0)),
            ..quiet(39, 40)
        };
        assert_eq!(unknown.judge(NOW, GRACE), Judged::Settling);
        let moved = Look {
            stock: (Some(40), Some(39)),
            ..quiet(39, 40)
        };
        assert_eq!(moved.judge(NOW, GRACE), Judged::Settling);
        // A cancel's units back in Redis, not yet marked returned in MySQL.
        let cancelling = Look {
            unreturned_units: 1,
            newest_unreturned_ms: NOW - 500,
            ..quiet(41, 40)
        };
        assert_eq!(cancelling.judge(NOW, GRACE), Judged::Settling);
    }

    #[test]
    fn a_mismatch_counts_when_seen_twice_and_balance_restores_at_once() {
        let sku = ProductId::parse("sku-1").unwrap();
        let mut v = Verdicts::default();
        assert_eq!(v.record(&sku, Judged::Settling), None);
        let ok = Some(Verdict {
            balanced: true,
            difference: 0,
        });
        assert_eq!(v.record(&sku, Judged::Balanced), ok);
        // Once: still balanced; a different difference: still suspect.
        assert_eq!(v.record(&sku, Judged::Unbalanced { difference: 2 }), ok);
        assert_eq!(v.record(&sku, Judged::Unbalanced { difference: 3 }), ok);
        assert_eq!(v.record(&sku, Judged::Settling), ok);
        let off = Some(Verdict {
            balanced: false,
            difference: 3,
        });
        assert_eq!(v.record(&sku, Judged::Unbalanced { difference: 3 }), off);
        assert_eq!(v.record(&sku, Judged::Settling), off);
        assert_eq!(v.record(&sku, Judged::Balanced), ok);
        // A balanced judgement between two mismatches resets the suspicion.
        assert_eq!(v.record(&sku, Judged::Unbalanced { difference: 3 }), ok);
        assert_eq!(v.record(&sku, Judged::Balanced), ok);
        assert_eq!(v.record(&sku, Judged::Unbalanced { difference: 3 }), ok);
        assert_eq!(v.retain(&[]), vec![sku.clone()]);
        assert_eq!(v.record(&sku, Judged::Settling), None);
    }
}
