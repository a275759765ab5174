//! `flashsale audit` and `GET /api/admin/products/{id}/audit`: for each
//! opened sale, where every unit is, side by side in Redis and MySQL, and the
//! two equations that must hold:
//!
//! - Redis: `initial == redis stock + pending + confirmed + paid + dead letters
//!   + cancelled-not-yet-returned` (a cancelled unit is back in the stock);
//! - MySQL: `available_qty == initial − confirmed − paid`.
//!
//! Dead letters are reported as a failure of their own: each is an order that
//! was answered 202 and is not in the books. Figures are read from two stores
//! one after the other, so a sale taking orders right now can show a
//! transient difference; audit a quiet sale, or run it again.

use std::collections::HashSet;

use serde::Serialize;

use super::error::BookkeepingError;
use crate::domain::OrderStatus;
use crate::domain::ProductId;
use crate::sale::{self, SaleSnapshot};
use crate::store::{self, FinalAudit, OrderRow, Product, PutBack};

/// At most this many things put back are listed with a sale's audit.
const PUT_BACK_LISTED: u32 = 10_000;

/// One invariant, checked (the audit's, and the bench rehearsal's).
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// One sale's books.
#[derive(Debug, Clone, Serialize)]
pub struct SaleAudit {
    pub product_id: String,
    pub initial: i64,
    /// `None`: Redis does not have the sale (see `flashsale recover`).
    pub redis_stock: Option<i64>,
    /// Accepted in Redis, not yet in MySQL (nor dead-lettered).
    pub pending: i64,
    pub confirmed: i64,
    pub paid: i64,
    pub cancelled: i64,
    /// Cancelled in MySQL, not yet given back to the Redis stock.
    pub cancelled_unreturned: i64,
    pub dead_letters: i64,
    pub available_qty: i64,
    /// Orders in the books (any status).
    pub orders: i64,
    /// When the sale was retired (epoch ms): the figures are the ones
    /// recorded then, Redis's part included (its keys are gone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retired: Option<i64>,
    /// What reconciliation restored in Redis from the books, after Redis
    /// lost writes (a failover, a restart); zeros when it never had to.
    pub repaired: crate::sale::Repairs,
    /// What the repair after a failover of the books put back into them
    /// (orders, cancels, payments the new primary lacked), oldest first.
    pub put_back: Vec<PutBack>,
    /// Units restocks added (taken away: negative), in `initial` already.
    pub restocked: i64,
    pub checks: Vec<Check>,
}

impl SaleAudit {
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

/// The audit's handle: what it reads of each store.
#[derive(Clone)]
pub struct Audit {
    ledger: sale::Ledger,
    products: store::Products,
    orders: store::Orders,
    audits: store::Audits,
}

impl Audit {
    pub fn new(
        ledger: sale::Ledger,
        (products, orders, audits): (store::Products, store::Orders, store::Audits),
    ) -> Self {
        Self {
            ledger,
            products,
            orders,
            audits,
        }
    }

    /// Audits every opened sale, or the one named.
    pub async fn audit(
        &self,
        only: Option<&ProductId>,
    ) -> Result<Vec<SaleAudit>, BookkeepingError> {
        let products = match only {
            Some(id) => vec![
                self.products
                    .product(id)
                    .await?
                    .ok_or(BookkeepingError::NoProduct)?,
            ],
            None => self.products.opened_products().await?,
        };
        let mut out = Vec::with_capacity(products.len());
        for p in &products {
            out.push(self.sale(p).await?);
        }
        Ok(out)
    }

    /// One sale's audit: for a retired one, Redis's part as recorded.
    pub async fn sale(&self, product: &Product) -> Result<SaleAudit, BookkeepingError> {
        let id = ProductId::parse(&product.product_id)
            .map_err(|e| BookkeepingError::Corrupt(format!("product id in tb_product: {e}")))?;
        let rows = self.orders.orders_of_product(&id).await?;
        let put_back = self.audits.put_back(&id, PUT_BACK_LISTED).await?;
        let restocked = self.products.restocked(&id).await?;
        if product.retired.is_some()
            && let Some(recorded) = self.audits.final_audit(&id).await?
        {
            return Ok(SaleAudit {
                put_back,
                restocked,
                ..retired_figures(product, &rows, &recorded)
            });
        }
        let redis = self.ledger.snapshot(&id).await?;
        Ok(SaleAudit {
            put_back,
            restocked,
            ..figures(product, &rows, &redis)
        })
    }
}

/// A retired sale's audit: Redis's part as recorded at its retirement,
/// MySQL's as it is now, checked with the same equations (so a hand edit
/// of its orders since still shows).
pub fn retired_figures(product: &Product, rows: &[OrderRow], recorded: &FinalAudit) -> SaleAudit {
    let redis = SaleSnapshot {
        stock: Some(recorded.redis_stock),
        accepted: rows
            .iter()
            .map(|r| (r.order_id.clone(), r.quantity))
            .collect(),
        dead_letters: Vec::new(),
        repairs: crate::sale::Repairs {
            orders: recorded.repaired_orders.max(0) as u64,
            units: recorded.repaired_units.max(0) as u64,
            releases: recorded.repaired_releases.max(0) as u64,
            idempotency_records: recorded.repaired_idem.max(0) as u64,
            restocks: recorded.repaired_restocks.max(0) as u64,
            restock_units: recorded.repaired_restock_units,
            last_ms: None,
        },
    };
    SaleAudit {
        retired: Some(recorded.retired),
        ..figures(product, rows, &redis)
    }
}

/// The audit's arithmetic, from what MySQL and Redis hold of one sale.
pub fn figures(product: &Product, rows: &[OrderRow], redis: &SaleSnapshot) -> SaleAudit {
    let units = |status: OrderStatus| {
        rows.iter()
            .filter(|r| r.status == status)
            .map(|r| r.quantity)
            .sum::<i64>()
    };
    let (confirmed, paid, cancelled) = (
        units(OrderStatus::Confirmed),
        units(OrderStatus::Paid),
        units(OrderStatus::Cancelled),
    );
    let cancelled_unreturned: i64 = rows
        .iter()
        .filter(|r| r.status == OrderStatus::Cancelled && !r.released)
        .map(|r| r.quantity)
        .sum();
    let dead_letters: i64 = redis.dead_letters.iter().map(|d| d.quantity).sum();
    let pending = on_its_way(rows, redis);

    let mut audit = SaleAudit {
        product_id: product.product_id.clone(),
        repaired: redis.repairs,
        initial: product.initial_qty,
        redis_stock: redis.stock,
        pending,
        confirmed,
        paid,
        cancelled,
        cancelled_unreturned,
        dead_letters,
        available_qty: product.available_qty,
        orders: rows.len() as i64,
        retired: None,
        put_back: Vec::new(),
        restocked: 0,
        checks: Vec::new(),
    };
    audit.checks = checks(&audit, redis.dead_letters.len());
    audit
}

/// Units accepted by Redis and neither in the books nor dead-lettered:
/// still on their way to MySQL.
fn on_its_way(rows: &[OrderRow], redis: &SaleSnapshot) -> i64 {
    let persisted: HashSet<&str> = rows.iter().map(|r| r.order_id.as_str()).collect();
    let dead_ids: HashSet<&str> = redis
        .dead_letters
        .iter()
        .filter_map(|d| d.order_id.as_deref())
        .collect();
    redis
        .accepted
        .iter()
        .filter(|(id, _)| !persisted.contains(id.as_str()) && !dead_ids.contains(id.as_str()))
        .map(|(_, units)| units)
        .sum()
}

/// The audit's checks, from its figures.
fn checks(a: &SaleAudit, dead_letter_count: usize) -> Vec<Check> {
    let initial = a.initial;
    let (confirmed, paid) = (a.confirmed, a.paid);
    let in_redis = a
        .redis_stock
        .map(|s| s + a.pending + confirmed + paid + a.dead_letters + a.cancelled_unreturned);
    vec![
        Check {
            name: "redis: initial == stock + pending + confirmed + paid + dead letters + cancelled not yet returned",
            ok: in_redis == Some(initial),
            detail: match in_redis {
                Some(total) => format!("{initial} vs {total}"),
                None => "the sale is missing in Redis (see `flashsale recover`)".into(),
            },
        },
        Check {
            name: "mysql: available_qty == initial - confirmed - paid",
            ok: a.available_qty == initial - confirmed - paid,
            detail: format!("{} vs {}", a.available_qty, initial - confirmed - paid),
        },
        Check {
            name: "not oversold: confirmed + paid <= initial",
            ok: confirmed + paid <= initial,
            detail: format!("{} vs {initial}", confirmed + paid),
        },
        Check {
            name: "no dead letters (orders answered 202 that are not in the books)",
            ok: dead_letter_count == 0,
            detail: format!("{dead_letter_count} dead letters, {} units", a.dead_letters),
        },
    ]
}

/// The audit as a table: a row per sale, then what it should be told of
/// (repairs, restocks, what was put back, the checks that failed).
pub fn render(audits: &[SaleAudit]) -> String {
    let mut out = columns([
        "product",
        "initial",
        "redis",
        "pending",
        "confirmed",
        "paid",
        "cancelled",
        "unreturned",
        "dead",
        "available",
        "books",
    ]);
    for a in audits {
        out.push_str(&row(a));
        out.push_str(&notes(a));
    }
    out
}

/// One line of the table, each cell in its column.
fn columns(c: [&str; 11]) -> String {
    format!(
        "{:<40} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>10} {:>6} {:>9}  {}\n",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10]
    )
}

fn row(a: &SaleAudit) -> String {
    let verdict = match (a.ok(), a.retired) {
        (true, None) => "ok",
        (true, Some(_)) => "ok (retired)",
        (false, _) => "MISMATCH",
    };
    let n = |v: i64| v.to_string();
    let cells = [
        a.product_id.clone(),
        n(a.initial),
        a.redis_stock.map_or("-".to_owned(), n),
        n(a.pending),
        n(a.confirmed),
        n(a.paid),
        n(a.cancelled),
        n(a.cancelled_unreturned),
        n(a.dead_letters),
        n(a.available_qty),
        verdict.to_owned(),
    ];
    columns(cells.each_ref().map(String::as_str))
}

/// What a sale's row should be told with, a line each.
fn notes(a: &SaleAudit) -> String {
    let mut out = String::new();
    let r = &a.repaired;
    if r.orders + r.releases + r.idempotency_records + r.restocks > 0 {
        out.push_str(&format!(
            "    repaired after lost writes: {} orders ({} units), {} releases, {} idempotency records, {} restocks ({:+} units) restored\n",
            r.orders, r.units, r.releases, r.idempotency_records, r.restocks, r.restock_units
        ));
    }
    if a.restocked != 0 {
        out.push_str(&format!(
            "    restocked: {:+} units (in initial: {} created with {})\n",
            a.restocked,
            a.initial,
            a.initial - a.restocked
        ));
    }
    if !a.put_back.is_empty() {
        let count = |what: &str| a.put_back.iter().filter(|p| p.what == what).count();
        out.push_str(&format!(
            "    put back after a failover of the books: {} orders, {} cancels, {} payments; dead letters taken home: {}\n",
            count("order"),
            count("cancel"),
            count("payment"),
            count("dead_letter")
        ));
        for p in &a.put_back {
            let result = p.result.as_deref().unwrap_or("");
            out.push_str(&format!(
                "      {:<11} {} {} {}\n",
                p.what, p.order_id, p.item, result
            ));
        }
    }
    for c in a.checks.iter().filter(|c| !c.ok) {
        out.push_str(&format!("    FAIL {}: {}\n", c.name, c.detail));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sale::DeadLetter;

    #[test]
    fn the_table_has_a_row_per_sale_and_says_what_went_wrong() {
        let (product, rows, redis) = mid_sale();
        let mut a = figures(&product, &rows, &redis);
        a.restocked = 2;
        a.put_back = vec![PutBack {
            what: "dead_letter".into(),
            order_id: "o7".into(),
            item: String::new(),
            result: None,
            put_back: 0,
        }];
        let table = render(&[a]);
        assert_eq!(table, TABLE, "{table}");
    }

    const TABLE: &str = "\
product                                   initial    redis  pending confirmed     paid cancelled unreturned   dead available  books
sku-1                                          10        4        1         2        1         2          1      1         7  MISMATCH
    restocked: +2 units (in initial: 10 created with 8)
    put back after a failover of the books: 0 orders, 0 cancels, 0 payments; dead letters taken home: 1
      dead_letter o7  
    FAIL no dead letters (orders answered 202 that are not in the books): 1 dead letters, 1 units
";

    fn product_of(initial: i64, available: i64) -> Product {
        Product {
            product_id: "sku-1".into(),
            title: "Phone".into(),
            price: rust_decimal::Decimal::ONE,
            available_qty: available,
            initial_qty: initial,
            start_time: 0,
            end_time: 1,
            limit_per_user: 5,
            created: 0,
            updated: 0,
            opened: Some(0),
            room_ceiling_per_sec: None,
            room_admission_secs: None,
            room_join_early_secs: None,
            room_admit_floor_per_sec: None,
            room_active_cap: None,
            room_join_difficulty: None,
            closed: None,
            retired: None,
            purged: None,
            paused: None,
            stock_shards: 1,
        }
    }

    fn row(id: &str, quantity: i64, status: OrderStatus, released: bool) -> OrderRow {
        OrderRow {
            order_id: id.into(),
            user_id: 1,
            product_id: "sku-1".into(),
            quantity,
            price: rust_decimal::Decimal::ONE,
            status,
            created: 0,
            updated: 0,
            released,
            idempotency_key: None,
        }
    }

    /// Ten units: 2 confirmed, 1 paid, 1 cancelled and back, 1 cancelled not
    /// yet back, 1 accepted on its way, 1 in dead letters, 4 in stock.
    fn mid_sale() -> (Product, Vec<OrderRow>, SaleSnapshot) {
        let rows = vec![
            row("o1", 2, OrderStatus::Confirmed, false),
            row("o2", 1, OrderStatus::Paid, false),
            row("o3", 1, OrderStatus::Cancelled, true),
            row("o4", 1, OrderStatus::Cancelled, false),
        ];
        let redis = SaleSnapshot {
            stock: Some(4),
            accepted: [("o1", 2), ("o2", 1), ("o5", 1), ("o6", 1)]
                .into_iter()
                .map(|(id, q)| (id.to_owned(), q))
                .collect(),
            dead_letters: vec![DeadLetter {
                order_id: Some("o6".into()),
                quantity: 1,
            }],
            repairs: Default::default(),
        };
        (product_of(10, 7), rows, redis)
    }

    /// The same sale once its dead letter was dealt with: the order dropped,
    /// its unit back in stock.
    fn settled(redis: &SaleSnapshot) -> SaleSnapshot {
        let mut quiet = redis.clone();
        quiet.accepted.remove("o6");
        quiet.dead_letters.clear();
        quiet.stock = Some(5);
        quiet
    }

    fn failed(a: &SaleAudit) -> Vec<&'static str> {
        a.checks.iter().filter(|c| !c.ok).map(|c| c.name).collect()
    }

    #[test]
    fn every_unit_is_counted_once_and_dead_letters_fail_the_audit() {
        let (product, rows, redis) = mid_sale();
        let a = figures(&product, &rows, &redis);
        assert_eq!(
            (
                a.pending,
                a.confirmed,
                a.paid,
                a.cancelled,
                a.cancelled_unreturned,
                a.dead_letters
            ),
            (1, 2, 1, 2, 1, 1)
        );
        assert_eq!(
            failed(&a),
            ["no dead letters (orders answered 202 that are not in the books)"]
        );
        assert!(figures(&product, &rows, &settled(&redis)).ok());
    }

    #[test]
    fn a_unit_too_many_or_too_few_anywhere_is_a_mismatch() {
        let (product, rows, redis) = mid_sale();
        let redis = settled(&redis);
        for stock in [4, 6] {
            let a = figures(
                &product,
                &rows,
                &SaleSnapshot {
                    stock: Some(stock),
                    ..redis.clone()
                },
            );
            assert_eq!(failed(&a).len(), 1, "stock {stock}");
            assert!(failed(&a)[0].starts_with("redis:"));
        }
        let a = figures(&product_of(10, 6), &rows, &redis);
        assert_eq!(
            failed(&a),
            ["mysql: available_qty == initial - confirmed - paid"]
        );
        let missing = figures(
            &product,
            &rows,
            &SaleSnapshot {
                stock: None,
                ..redis.clone()
            },
        );
        assert!(missing.checks[0].detail.contains("flashsale recover"));
    }

    #[test]
    fn more_sold_than_the_stock_is_an_oversell() {
        let rows = vec![
            row("o1", 8, OrderStatus::Confirmed, false),
            row("o2", 3, OrderStatus::Paid, false),
        ];
        let redis = SaleSnapshot {
            stock: Some(-1),
            ..Default::default()
        };
        let a = figures(&product_of(10, -1), &rows, &redis);
        assert_eq!(failed(&a), ["not oversold: confirmed + paid <= initial"]);
    }
}
