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

use std::collections::{BTreeMap, HashSet};

use redis::AsyncCommands;
use serde::Serialize;

use super::BooksError;
use crate::domain::ProductId;
use crate::sale::{SaleError, Sales};
use crate::store::{CANCELLED, CONFIRMED, Db, PAID, Product};

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
    /// What reconciliation restored in Redis from the books, after Redis
    /// lost writes (a failover, a restart); zeros when it never had to.
    pub repaired: crate::sale::Repairs,
    pub checks: Vec<Check>,
}

impl SaleAudit {
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

/// Audits every opened sale, or the one named.
pub async fn audit(
    sales: &Sales,
    db: &Db,
    only: Option<&ProductId>,
) -> Result<Vec<SaleAudit>, BooksError> {
    let products = match only {
        Some(id) => vec![db.product(id).await?.ok_or(BooksError::NotFound)?],
        None => db.opened_products().await?,
    };
    let mut out = Vec::with_capacity(products.len());
    for p in &products {
        out.push(audit_sale(sales, db, p).await?);
    }
    Ok(out)
}

pub async fn audit_sale(
    sales: &Sales,
    db: &Db,
    product: &Product,
) -> Result<SaleAudit, BooksError> {
    let id = ProductId::parse(&product.product_id)
        .map_err(|e| crate::sale::SaleError::Corrupt(format!("product id in tb_product: {e}")))?;
    let rows = db.orders_of_product(&id).await?;
    let units = |status: &str| {
        rows.iter()
            .filter(|r| r.status == status)
            .map(|r| r.quantity)
            .sum::<i64>()
    };
    let (confirmed, paid, cancelled) = (units(CONFIRMED), units(PAID), units(CANCELLED));
    let cancelled_unreturned: i64 = rows
        .iter()
        .filter(|r| r.status == CANCELLED && !r.released)
        .map(|r| r.quantity)
        .sum();
    let persisted: HashSet<&str> = rows.iter().map(|r| r.order_id.as_str()).collect();

    let keys = sales.keys(&id);
    let redis = sales.redis();
    let mut conn = redis.shared().await?;
    let redis_stock: Option<i64> = redis.bounded(conn.get(&keys.stock)).await?;
    let accepted: BTreeMap<String, String> = redis.bounded(conn.hgetall(&keys.accepted)).await?;
    let dead_reply: redis::Value = redis.bounded(conn.xrange_all(&keys.dead)).await?;
    let dead_entries = crate::worker::Entry::decode_list(dead_reply)
        .map_err(|e| SaleError::from(redis::RedisError::from(e)))?;
    let field = |e: &crate::worker::Entry, name: &str| {
        e.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let dead_ids: HashSet<String> = dead_entries
        .iter()
        .filter_map(|e| field(e, "order_id"))
        .collect();
    let dead_letters: i64 = dead_entries
        .iter()
        .filter_map(|e| field(e, "quantity")?.parse::<i64>().ok())
        .sum();
    let pending: i64 = accepted
        .iter()
        .filter(|(id, _)| !persisted.contains(id.as_str()) && !dead_ids.contains(id.as_str()))
        .map(|(_, record)| record_quantity(record))
        .sum();

    let initial = product.initial_qty;
    let mut checks = Vec::new();
    let in_redis =
        redis_stock.map(|s| s + pending + confirmed + paid + dead_letters + cancelled_unreturned);
    checks.push(Check {
        name: "redis: initial == stock + pending + confirmed + paid + dead letters + cancelled not yet returned",
        ok: in_redis == Some(initial),
        detail: match in_redis {
            Some(total) => format!("{initial} vs {total}"),
            None => "the sale is missing in Redis (see `flashsale recover`)".into(),
        },
    });
    checks.push(Check {
        name: "mysql: available_qty == initial - confirmed - paid",
        ok: product.available_qty == initial - confirmed - paid,
        detail: format!(
            "{} vs {}",
            product.available_qty,
            initial - confirmed - paid
        ),
    });
    checks.push(Check {
        name: "not oversold: confirmed + paid <= initial",
        ok: confirmed + paid <= initial,
        detail: format!("{} vs {initial}", confirmed + paid),
    });
    checks.push(Check {
        name: "no dead letters (orders answered 202 that are not in the books)",
        ok: dead_entries.is_empty(),
        detail: format!("{} dead letters, {dead_letters} units", dead_entries.len()),
    });
    let repaired = sales.repairs(&id).await?;
    Ok(SaleAudit {
        product_id: product.product_id.clone(),
        repaired,
        initial,
        redis_stock,
        pending,
        confirmed,
        paid,
        cancelled,
        cancelled_unreturned,
        dead_letters,
        available_qty: product.available_qty,
        checks,
    })
}

/// The quantity in an `accepted` record (see `place_order.lua`).
fn record_quantity(record: &str) -> i64 {
    serde_json::from_str::<serde_json::Value>(record)
        .ok()
        .and_then(|v| v["quantity"].as_i64())
        .unwrap_or(0)
}

/// The audit as a table.
pub fn render(audits: &[SaleAudit]) -> String {
    let mut out = format!(
        "{:<40} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>10} {:>6} {:>9}  {}\n",
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
        "books"
    );
    for a in audits {
        let redis = a.redis_stock.map_or("-".to_owned(), |s| s.to_string());
        out.push_str(&format!(
            "{:<40} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>10} {:>6} {:>9}  {}\n",
            a.product_id,
            a.initial,
            redis,
            a.pending,
            a.confirmed,
            a.paid,
            a.cancelled,
            a.cancelled_unreturned,
            a.dead_letters,
            a.available_qty,
            if a.ok() { "ok" } else { "MISMATCH" }
        ));
        let r = &a.repaired;
        if r.orders + r.releases + r.idempotency_records > 0 {
            out.push_str(&format!(
                "    repaired after lost writes: {} orders ({} units), {} releases, {} idempotency records restored\n",
                r.orders, r.units, r.releases, r.idempotency_records
            ));
        }
        for c in a.checks.iter().filter(|c| !c.ok) {
            out.push_str(&format!("    FAIL {}: {}\n", c.name, c.detail));
        }
    }
    out
}
