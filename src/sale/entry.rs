//! Stream entries back into orders. An entry that does not parse is poison:
//! it is never persisted, and after `MAX_DELIVERIES` it goes to dead letters.

use redis::{FromRedisValue, ParsingError, Value};

use crate::domain::PendingOrder;
use crate::domain::{OrderId, ProductId, Quantity, UserId};

/// One stream entry as read from Redis: its id and its field/value pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: String,
    pub fields: Vec<(String, String)>,
}

impl Entry {
    /// The value of field `name`, if the entry has it.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn text(&self, name: &str) -> Result<&str, String> {
        self.field(name)
            .ok_or_else(|| format!("missing field {name}"))
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
            OrderId::parse(raw_id).ok_or_else(|| format!("order_id {raw_id:?} is malformed"))?;
        let product_id = self.text("product_id")?;
        if of != *product || product_id != product.as_str() {
            return Err(format!(
                "order {raw_id} of product {product_id:?} found in the stream of {product}"
            ));
        }
        let out_of_range = |_| format!("order {raw_id} has a zero or out-of-range number");
        Ok(PendingOrder {
            order_id,
            user_id: UserId::new(self.number("user_id")?).map_err(out_of_range)?,
            product_id: product.clone(),
            quantity: Quantity::new(self.number("quantity")?).map_err(out_of_range)?,
            price: self.number("price")?,
            created_ms: self.number("created_ms")?,
            idempotency_key: self.text("idempotency_key").ok().map(str::to_owned),
        })
    }

    /// Decodes `[id, [field, value, ...]]`; a deleted entry (`[id, nil]`) has no fields.
    fn decode(v: Value) -> Result<Self, ParsingError> {
        let Value::Array(parts) = v else {
            return Err(format!("stream entry is not an array: {v:?}").into());
        };
        let mut parts = parts.into_iter();
        let id = String::from_redis_value(parts.next().ok_or("entry without id")?)?;
        let fields = match parts.next() {
            Some(Value::Array(flat)) => {
                let mut fields = Vec::with_capacity(flat.len() / 2);
                let mut flat = flat.into_iter();
                while let (Some(k), Some(v)) = (flat.next(), flat.next()) {
                    fields.push((String::from_redis_value(k)?, String::from_redis_value(v)?));
                }
                fields
            }
            _ => Vec::new(),
        };
        Ok(Self { id, fields })
    }

    /// Decodes a list of entries (as XRANGE and XAUTOCLAIM return them).
    pub fn decode_list(v: Value) -> Result<Vec<Self>, ParsingError> {
        match v {
            Value::Nil => Ok(Vec::new()),
            Value::Array(items) => items.into_iter().map(Self::decode).collect(),
            other => Err(format!("entry list is not an array: {other:?}").into()),
        }
    }

    /// Decodes an XREADGROUP reply for one stream: `[[key, [entry, ...]]]` or nil.
    pub fn decode_read(v: Value) -> Result<Vec<Self>, ParsingError> {
        let streams = match v {
            Value::Nil => return Ok(Vec::new()),
            Value::Array(streams) => streams,
            // RESP3 answers a map of key -> entries.
            Value::Map(pairs) => pairs
                .into_iter()
                .map(|(k, v)| Value::Array(vec![k, v]))
                .collect(),
            other => return Err(format!("XREADGROUP reply: {other:?}").into()),
        };
        let mut entries = Vec::new();
        for stream in streams {
            let Value::Array(kv) = stream else {
                return Err("XREADGROUP stream is not an array".into());
            };
            if let Some(list) = kv.into_iter().nth(1) {
                entries.extend(Self::decode_list(list)?);
            }
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry(id: &str, fields: &[(&str, &str)]) -> Value {
        let flat = fields
            .iter()
            .flat_map(|(k, v)| [bulk(k), bulk(v)])
            .collect();
        Value::Array(vec![bulk(id), Value::Array(flat)])
    }

    fn order_fields(order_id: &str) -> Vec<(&str, &str)> {
        vec![
            ("order_id", order_id),
            ("user_id", "42"),
            ("product_id", "sku-1"),
            ("quantity", "2"),
            ("price", "4999.5"),
            ("created_ms", "1700000000000"),
        ]
    }

    #[test]
    fn an_entry_decodes_into_its_order_checked_against_its_stream() {
        let sku = ProductId::parse("sku-1").unwrap();
        let id = "sku-1:019acb2f3a1c8e0d4a7b2c9f51e6d03a8b47";
        let list = Value::Array(vec![entry("1-0", &order_fields(id))]);
        let entries = Entry::decode_list(list).unwrap();
        assert_eq!(entries[0].id, "1-0");
        assert_eq!(entries[0].field("quantity"), Some("2"));
        let order = entries[0].order(&sku).unwrap();
        assert_eq!((order.user_id.get(), order.quantity.get()), (42, 2));
        assert_eq!(order.price.to_string(), "4999.5");
        assert_eq!(order.idempotency_key, None);
        // Found in another sale's stream: poison, not an order of that sale.
        let other = ProductId::parse("sku-2").unwrap();
        assert!(entries[0].order(&other).is_err());
    }

    #[test]
    fn broken_entries_are_refused_with_the_reason() {
        let sku = ProductId::parse("sku-1").unwrap();
        let id = "sku-1:019acb2f3a1c8e0d4a7b2c9f51e6d03a8b47";
        let decode = |fields: Vec<(&str, &str)>| {
            Entry::decode_list(Value::Array(vec![entry("1-0", &fields)])).unwrap()[0].order(&sku)
        };
        let mut missing = order_fields(id);
        missing.retain(|(k, _)| *k != "user_id");
        assert_eq!(decode(missing).unwrap_err(), "missing field user_id");
        let mut zero = order_fields(id);
        zero[3] = ("quantity", "0");
        assert!(decode(zero).unwrap_err().contains("zero or out-of-range"));
        let mut bad_id = order_fields("sku-1:nothex");
        bad_id[0] = ("order_id", "sku-1:nothex");
        assert!(decode(bad_id).unwrap_err().contains("malformed"));
        // A deleted entry (`[id, nil]`) has no fields; nil is no entries.
        let deleted = Value::Array(vec![Value::Array(vec![bulk("2-0"), Value::Nil])]);
        assert!(Entry::decode_list(deleted).unwrap()[0].fields.is_empty());
        assert!(Entry::decode_list(Value::Nil).unwrap().is_empty());
    }

    #[test]
    fn a_read_reply_decodes_in_resp2_and_resp3() {
        let id = "sku-1:019acb2f3a1c8e0d4a7b2c9f51e6d03a8b47";
        let entries = Value::Array(vec![entry("1-0", &order_fields(id))]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            bulk("fs:{sku-1}:orders"),
            entries.clone(),
        ])]);
        let resp3 = Value::Map(vec![(bulk("fs:{sku-1}:orders"), entries)]);
        for reply in [resp2, resp3] {
            let read = Entry::decode_read(reply).unwrap();
            assert_eq!(read.len(), 1);
            assert_eq!(read[0].field("order_id"), Some(id));
        }
        assert!(Entry::decode_read(Value::Nil).unwrap().is_empty());
    }
}
