//! Stream entries back into orders. An entry that does not parse is poison:
//! it is never persisted, and after `MAX_DELIVERIES` it goes to dead letters.

use std::collections::HashMap;

use redis::{FromRedisValue, Value};

use crate::domain::{OrderId, ProductId};
use crate::sale::PendingOrder;

/// One stream entry as read from Redis.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: String,
    pub fields: HashMap<String, Value>,
}

impl From<redis::streams::StreamId> for Entry {
    fn from(s: redis::streams::StreamId) -> Self {
        Self {
            id: s.id,
            fields: s.map,
        }
    }
}

impl Entry {
    fn text(&self, name: &str) -> Result<String, String> {
        let v = self
            .fields
            .get(name)
            .ok_or(format!("missing field {name}"))?;
        String::from_redis_value(v.clone()).map_err(|e| format!("field {name}: {e}"))
    }

    fn number<T: std::str::FromStr>(&self, name: &str) -> Result<T, String> {
        let text = self.text(name)?;
        text.parse()
            .map_err(|_| format!("field {name}: {text:?} is not a valid number"))
    }

    /// The order this entry carries, checked against the stream it came from.
    pub fn order(&self, product: &ProductId) -> Result<PendingOrder, String> {
        let raw_id = self.text("order_id")?;
        let (order_id, of) =
            OrderId::parse(&raw_id).ok_or(format!("order_id {raw_id:?} is malformed"))?;
        let product_id = self.text("product_id")?;
        if of != *product || product_id != product.as_str() {
            return Err(format!(
                "order {raw_id} of product {product_id:?} found in the stream of {product}"
            ));
        }
        let order = PendingOrder {
            order_id,
            user_id: self.number("user_id")?,
            product_id: product.clone(),
            quantity: self.number("quantity")?,
            price: self.number("price")?,
            created_ms: self.number("created_ms")?,
        };
        if order.user_id == 0 || order.user_id > i64::MAX as u64 || order.quantity == 0 {
            return Err(format!("order {raw_id} has a zero or out-of-range number"));
        }
        Ok(order)
    }

    /// The entry's fields as text pairs (for copying into a dead letter).
    pub fn text_fields(&self) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = self
            .fields
            .iter()
            .map(|(k, v)| {
                let text = String::from_redis_value(v.clone()).unwrap_or_else(|_| format!("{v:?}"));
                (k.clone(), text)
            })
            .collect();
        pairs.sort();
        pairs
    }
}
