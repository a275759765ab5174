//! The values that cross every layer, validated once where they enter.
//!
//! A `ProductId` never contains braces, so it is safe as a Redis Cluster hash
//! tag; an `OrderId` carries its product id, so any instance can find an order's
//! sale (and so its cluster slot) from the id alone.

pub mod answer;
pub mod backoff;
mod chain;
mod hex;
mod ids;
mod payment;
pub mod release;
mod room;
mod status;
mod valid;
pub mod webhook;

pub use chain::Chain;
pub use hex::{hex, unhex};
pub use ids::{MAX_SHARDS, OrderId, ProductId, Quantity, UserId, key_slot};
pub use payment::{Currency, PaymentKind, PaymentResult};
pub use room::{
    BoundsChange, MAX_ACTIVE_CAP, MAX_JOIN_DIFFICULTY, MAX_PACE, RoomBounds, WaitingRoom,
};
pub use status::{OrderStatus, SaleState};
pub use valid::{
    Invalid, MAX_IDEMPOTENCY_KEY_LEN, MAX_PRODUCT_ID_LEN, MAX_QUANTITY, MAX_STOCK, MAX_TIME_MS,
    idempotency_key, now_ms, price, time_ms,
};

use rust_decimal::Decimal;

/// An accepted order, before the books hold it: what the order script put
/// in the sale's stream (and keeps in Redis until a worker persisted it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingOrder {
    pub order_id: OrderId,
    pub user_id: UserId,
    pub product_id: ProductId,
    pub quantity: Quantity,
    pub price: Decimal,
    pub created_ms: i64,
    /// The Idempotency-Key it was placed with, if any.
    pub idempotency_key: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn product_ids_that_would_break_the_hash_tag_are_refused() {
        assert!(ProductId::parse("sku-1.A_b").is_ok());
        for bad in ["", "a{b", "a}b", "a b", "a:b", "é", &"x".repeat(129)] {
            assert!(ProductId::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_user_id_in_text_is_its_canonical_digits_only() {
        assert_eq!(UserId::parse("4101").unwrap().get(), 4101);
        assert_eq!(
            UserId::parse("9223372036854775807").unwrap().get(),
            i64::MAX as u64
        );
        for bad in [
            "",
            "+4101",
            "04101",
            "0",
            " 4101",
            "4101 ",
            "-1",
            "4101.0",
            "4_101",
            "9223372036854775808",
            "99999999999999999999",
        ] {
            assert!(UserId::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// 10,000 ids of one process: beyond the product and the time, every
    /// id's 96 bits are its own, evenly spread, and unrelated to the id
    /// before it (no counter, no per-process constant).
    #[test]
    fn order_ids_share_no_guessable_structure() {
        let product = ProductId::parse("sku-1").unwrap();
        let ids: Vec<OrderId> = (0..10_000).map(|_| OrderId::generate(&product)).collect();
        let random: Vec<u128> = ids
            .iter()
            .map(|id| {
                let suffix = id.as_str().rsplit_once(':').unwrap().1;
                assert_eq!(suffix.len(), 36);
                u128::from_str_radix(&suffix[12..], 16).unwrap()
            })
            .collect();
        let distinct: std::collections::HashSet<_> = random.iter().collect();
        assert_eq!(distinct.len(), random.len(), "a random part repeats");
        // Every one of the 96 bits is set in about half the ids
        // (binomial: mean 5,000, sd 50; 4,700..5,300 is 6 sd).
        for bit in 0..96 {
            let ones = random.iter().filter(|r| (*r >> bit) & 1 == 1).count();
            assert!(
                (4_700..=5_300).contains(&ones),
                "bit {bit} set in {ones} of 10,000"
            );
        }
        // Consecutive ids differ in about half their bits (mean 48, sd ~4.9
        // per pair; the mean of 9,999 pairs has sd ~0.05), and never in few.
        let distances: Vec<u32> = random
            .windows(2)
            .map(|w| (w[0] ^ w[1]).count_ones())
            .collect();
        let mean = distances.iter().sum::<u32>() as f64 / distances.len() as f64;
        assert!((47.5..=48.5).contains(&mean), "mean distance {mean}");
        assert!(
            distances.iter().all(|d| *d >= 16),
            "two consecutive ids nearly equal"
        );
    }

    #[test]
    fn order_ids_round_trip_and_name_their_product() {
        let product = ProductId::parse("sku-1").unwrap();
        let id = OrderId::generate(&product);
        let (parsed, of) = OrderId::parse(id.as_str()).unwrap();
        assert_eq!(parsed, id);
        assert_eq!(of, product);
        // Its first 12 digits are the time it was made, in ms.
        let suffix = id.as_str().strip_prefix("sku-1:").unwrap();
        let made = i64::from_str_radix(&suffix[..12], 16).unwrap();
        assert!((now_ms() - made).abs() < 10_000, "{id}");
        assert!(OrderId::parse("sku-1:nothex").is_none());
        // Ids of the earlier format (32 digits) still name their product.
        let (_, of) = OrderId::parse("sku-1:01a22cea2b9fd1c4909e1c7500000000").unwrap();
        assert_eq!(of, product);
        assert!(OrderId::parse("sku-1:01a22cea2b9fd1c4909e1c75000000001").is_none());
        assert!(OrderId::parse("sku-1").is_none());
        assert!(OrderId::parse("a{b}:0123456789abcdef0123456789abcdef").is_none());
    }

    #[test]
    fn a_shards_order_id_names_the_shard_and_its_sale() {
        let sale = ProductId::parse("sku-1").unwrap();
        assert_eq!(sale.shard(0, 3), sale);
        assert_eq!(sale.shard(2, 1), sale);
        let third = sale.shard(2, 3);
        assert!(third.as_str().starts_with("sku-1~2"), "{third}");
        assert_eq!((third.sale(), third.shard_index()), (sale.clone(), 2));
        let id = OrderId::generate(&third);
        let (parsed, of) = OrderId::parse(id.as_str()).unwrap();
        assert_eq!((parsed, of.clone()), (id, third));
        assert_eq!(of.sale(), sale);
        assert_eq!(of.into_sale(), sale);
        assert_eq!(sale.clone().into_sale(), sale);
        // Only what `shard` writes: no shard 0, no leading zero, no tilde
        // in a product id a client sends.
        for bad in [
            "sku-1~0", "sku-1~02", "sku-1~x", "sku-1~64", "~1", "a~1~2", "a~1.0", "a~1.01", "a~1.",
        ] {
            assert!(
                OrderId::parse(&format!("{bad}:{}", "0".repeat(36))).is_none(),
                "{bad}"
            );
        }
        assert!(ProductId::parse("sku-1~2").is_err());
    }

    #[test]
    fn a_sales_shards_are_spread_evenly_over_the_slots() {
        // On the 3 equal slot ranges of a 3-master cluster, the 3 shards of
        // any sale land on 3 different masters, in the middle of each.
        for i in 0..200 {
            let sale = ProductId::parse(&format!("sale-{i}")).unwrap();
            let mut masters: Vec<u32> = (0..3)
                .map(|k| u32::from(key_slot(sale.shard(k, 3).as_str())) * 3 / 16_384)
                .collect();
            masters.sort();
            assert_eq!(masters, [0, 1, 2], "{sale}");
            for k in 1..3 {
                let shard = sale.shard(k, 3);
                assert_eq!((shard.sale(), shard.shard_index()), (sale.clone(), k));
                assert_eq!(ProductId::parse_sale_or_shard(shard.as_str()), Some(shard));
            }
        }
    }

    #[test]
    fn numbers_are_bounded() {
        assert!(UserId::new(0).is_err());
        assert!(UserId::new(u64::MAX).is_err());
        assert!(Quantity::new(0).is_err());
        assert!(Quantity::new(MAX_QUANTITY + 1).is_err());
        assert!(price("-0.01".parse().unwrap()).is_err());
        assert!(price("0".parse().unwrap()).is_ok());
        assert!(time_ms("start_time", -1).is_err());
    }
}
