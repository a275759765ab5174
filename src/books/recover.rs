//! `flashsale recover --product ID`: rebuilds a sale in Redis from MySQL after
//! Redis lost it (a restart without persistence, a flushed database).
//!
//! From `tb_order`: the stock is `initial − confirmed − paid` (cancelled units
//! are back on sale), each buyer's count is the units of their confirmed and
//! paid orders (so the per-user limit still holds), and the released set
//! holds every cancelled order (so none is given back twice). The sale hash,
//! which lets orders in, is written last.
//!
//! It refuses when Redis still has the sale, or when the sale's stream holds
//! orders MySQL does not have yet (recovering then would forget them), unless
//! forced.

use std::collections::{BTreeMap, HashSet};

use redis::AsyncCommands;
use serde::Serialize;

use super::BooksError;
use crate::domain::ProductId;
use crate::sale::{SaleError, SaleSpec, Sales};
use crate::store::{CANCELLED, CONFIRMED, Db, PAID};

#[derive(Debug, Clone, Serialize)]
pub struct Recovered {
    pub product_id: String,
    pub stock: i64,
    pub buyers: usize,
    pub released: usize,
}

/// Writes per Redis command while restoring (bounded request sizes).
const CHUNK: usize = 500;

pub async fn recover(
    sales: &Sales,
    db: &Db,
    product_id: &ProductId,
    force: bool,
) -> Result<Recovered, BooksError> {
    let product = db.product(product_id).await?.ok_or(BooksError::NotFound)?;
    let rows = db.orders_of_product(product_id).await?;
    let keys = sales.keys(product_id);
    let redis = sales.redis();
    let mut conn = redis.shared().await?;

    let has_sale: bool = redis.bounded(conn.exists(&keys.sale)).await?;
    if has_sale && !force {
        return Err(BooksError::Refused("Redis still has this sale".into()));
    }
    let persisted: HashSet<&str> = rows.iter().map(|r| r.order_id.as_str()).collect();
    let stream: redis::Value = redis.bounded(conn.xrange_all(&keys.orders)).await?;
    let unpersisted = crate::worker::Entry::decode_list(stream)
        .map_err(|e| SaleError::from(redis::RedisError::from(e)))?
        .iter()
        .filter(|e| {
            e.fields
                .iter()
                .any(|(k, v)| k == "order_id" && !persisted.contains(v.as_str()))
        })
        .count();
    if unpersisted > 0 && !force {
        return Err(BooksError::Refused(format!(
            "the sale's stream holds {unpersisted} orders not yet in MySQL; let the workers drain it first"
        )));
    }

    let mut bought: BTreeMap<i64, i64> = BTreeMap::new();
    let mut sold = 0;
    let mut released = Vec::new();
    for r in &rows {
        if r.status == CONFIRMED || r.status == PAID {
            *bought.entry(r.user_id).or_default() += r.quantity;
            sold += r.quantity;
        } else if r.status == CANCELLED {
            released.push(r.order_id.as_str());
        }
    }
    let stock = (product.initial_qty - sold).max(0);

    // Closed while it is rebuilt: without the sale hash every order is refused.
    redis
        .bounded(conn.del::<_, ()>(&[&keys.sale, &keys.stock, &keys.bought, &keys.released]))
        .await?;
    let pairs: Vec<(i64, i64)> = bought.iter().map(|(u, q)| (*u, *q)).collect();
    for chunk in pairs.chunks(CHUNK) {
        redis
            .bounded(conn.hset_multiple::<_, _, _, ()>(&keys.bought, chunk))
            .await?;
    }
    for chunk in released.chunks(CHUNK) {
        redis
            .bounded(conn.sadd::<_, _, ()>(&keys.released, chunk))
            .await?;
    }
    let spec = SaleSpec {
        stock: stock as u64,
        start_ms: product.start_time,
        end_ms: product.end_time,
        limit_per_user: product.limit_per_user.max(1) as u64,
        price: product.price,
    };
    let (opened, _) = sales.open(product_id, &spec).await?;
    if !opened {
        return Err(
            SaleError::Corrupt("the sale reappeared while it was being recovered".into()).into(),
        );
    }
    db.mark_all_released(product_id).await?;
    tracing::info!(product_id = %product_id, stock, buyers = bought.len(), "sale recovered from MySQL");
    Ok(Recovered {
        product_id: product_id.to_string(),
        stock,
        buyers: bought.len(),
        released: released.len(),
    })
}
