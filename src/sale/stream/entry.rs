//! Stream entries back into orders. An entry that does not parse is poison:
//! it is never persisted, and after `MAX_DELIVERIES` it goes to dead letters.

use redis::{FromRedisValue, ParsingError, Value};
use rust_decimal::Decimal;
use serde::Deserialize;

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
    /// `place_order.lua` writes the order as one JSON field, `order` (and the
    /// `idempotency_key`, when there is one); entries written before, one
    /// field per value, are read too.
    pub fn order(&self, product: &ProductId) -> Result<PendingOrder, String> {
        let Some(json) = self.field("order") else {
            return self.order_of_fields(product);
        };
        let r: Record<'_> = serde_json::from_str(json).map_err(|e| format!("field order: {e}"))?;
        checked(product, r, None, self.field("idempotency_key"))
    }

    /// The order id and units an entry names, whatever its shape, and
    /// even when it does not parse as a whole (a dead letter's books count
    /// its units): for reading the stream and the dead letters, not for
    /// persisting.
    pub fn names(&self) -> (Option<String>, Option<i64>) {
        match self
            .field("order")
            .map(serde_json::from_str::<serde_json::Value>)
        {
            Some(Ok(v)) => (
                v["order_id"].as_str().map(str::to_owned),
                v["quantity"].as_i64(),
            ),
            Some(Err(_)) => (None, None),
            None => (
                self.field("order_id").map(str::to_owned),
                self.field("quantity").and_then(|q| q.parse().ok()),
            ),
        }
    }

    /// An entry of the earlier shape: `order_id`, `user_id`, `product_id`,
    /// `quantity`, `price`, `created_ms` (and `idempotency_key`).
    fn order_of_fields(&self, product: &ProductId) -> Result<PendingOrder, String> {
        let record = Record {
            order_id: self.text("order_id")?,
            user_id: self.number("user_id")?,
            quantity: self.number("quantity")?,
            price: self.number("price")?,
            created_ms: self.number("created_ms")?,
        };
        let product_id = Some(self.text("product_id")?);
        checked(product, record, product_id, self.field("idempotency_key"))
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

/// An order as a stream entry holds it (`place_order.lua`'s JSON).
#[derive(Deserialize)]
struct Record<'a> {
    order_id: &'a str,
    user_id: u64,
    quantity: u64,
    price: Decimal,
    created_ms: i64,
}

/// `record` as an order of `product`'s stream: its id names that sale (and
/// so does `product_id`, in entries that carry one), its numbers are in
/// range.
fn checked(
    product: &ProductId,
    record: Record<'_>,
    product_id: Option<&str>,
    idempotency_key: Option<&str>,
) -> Result<PendingOrder, String> {
    let raw_id = record.order_id;
    let (order_id, of) =
        OrderId::parse(raw_id).ok_or_else(|| format!("order_id {raw_id:?} is malformed"))?;
    if of != *product || product_id.is_some_and(|p| p != product.as_str()) {
        let named = product_id.unwrap_or(of.as_str());
        return Err(format!(
            "order {raw_id} of product {named:?} found in the stream of {product}"
        ));
    }
    let out_of_range = |_| format!("order {raw_id} has a zero or out-of-range number");
    Ok(PendingOrder {
        order_id,
        user_id: UserId::new(record.user_id).map_err(out_of_range)?,
        // A stock shard's orders are its sale's.
        product_id: product.sale(),
        quantity: Quantity::new(record.quantity).map_err(out_of_range)?,
        price: record.price,
        created_ms: record.created_ms,
        idempotency_key: idempotency_key.map(str::to_owned),
    })
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

    /// An entry of the earlier shape, a field per value.
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

    /// An entry as `place_order.lua` writes it now.
    fn record(order_id: &str, quantity: &str) -> String {
        format!(
            r#"{{"order_id":"{order_id}","user_id":42,"quantity":{quantity},"price":"4999.5","created_ms":1700000000000}}"#
        )
    }

    #[test]
    fn an_entry_decodes_into_its_order_checked_against_its_stream() {
        let sku = ProductId::parse("sku-1").unwrap();
        let id = "sku-1:019acb2f3a1c8e0d4a7b2c9f51e6d03a8b47";
        let keyed = [
            ("order", record(id, "2")),
            ("idempotency_key", r#"k"\1"#.into()),
        ];
        let keyed: Vec<(&str, &str)> = keyed.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let list = Value::Array(vec![
            entry("1-0", &[("order", &record(id, "2"))]),
            entry("2-0", &keyed),
            entry("3-0", &order_fields(id)),
        ]);
        let entries = Entry::decode_list(list).unwrap();
        assert_eq!(entries[0].id, "1-0");
        // One JSON field, with the key in a field of its own, and the
        // earlier shape (a field per value): the same order.
        for (e, key) in entries.iter().zip([None, Some(r#"k"\1"#), None]) {
            let order = e.order(&sku).unwrap();
            assert_eq!(order.order_id.as_str(), id);
            assert_eq!((order.user_id.get(), order.quantity.get()), (42, 2));
            assert_eq!(order.price.to_string(), "4999.5");
            assert_eq!(order.created_ms, 1_700_000_000_000);
            assert_eq!(order.idempotency_key.as_deref(), key);
            // Found in another sale's stream: poison, not an order of that sale.
            let other = ProductId::parse("sku-2").unwrap();
            assert!(e.order(&other).is_err());
        }
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
        let zero = record(id, "0");
        assert!(
            decode(vec![("order", &zero)])
                .unwrap_err()
                .contains("zero or out-of-range")
        );
        let broken = record(id, "\"lots\"");
        assert!(
            decode(vec![("order", &broken)])
                .unwrap_err()
                .starts_with("field order:")
        );
        let half = &record(id, "1")[..30];
        assert!(
            decode(vec![("order", half)])
                .unwrap_err()
                .starts_with("field order:")
        );
        // A deleted entry (`[id, nil]`) has no fields; nil is no entries.
        let deleted = Value::Array(vec![Value::Array(vec![bulk("2-0"), Value::Nil])]);
        assert!(Entry::decode_list(deleted).unwrap()[0].fields.is_empty());
        assert!(Entry::decode_list(Value::Nil).unwrap().is_empty());
    }

    #[test]
    fn an_entry_names_its_order_and_units_in_either_shape_even_unparsed() {
        let id = "sku-1:019acb2f3a1c8e0d4a7b2c9f51e6d03a8b47";
        let decode = |fields: &[(&str, &str)]| {
            Entry::decode_list(Value::Array(vec![entry("1-0", fields)])).unwrap()[0].names()
        };
        let named = (Some(id.to_owned()), Some(2));
        assert_eq!(decode(&[("order", &record(id, "2"))]), named);
        assert_eq!(decode(&order_fields(id)), named);
        // Of another sale, or not an order id: not persisted, but its
        // units still count in the books (dead letters).
        let elsewhere = record("sku-9:019acb2f3a1c8e0d4a7b2c9f51e6d03a8b47", "3");
        assert_eq!(decode(&[("order", &elsewhere)]).1, Some(3));
        assert_eq!(decode(&[("order", "{not json")]), (None, None));
        assert_eq!(decode(&[]), (None, None));
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
