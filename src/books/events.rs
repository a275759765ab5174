//! An event as the shop's systems get it, pulled (`GET /api/admin/events`)
//! or pushed (the workers' delivery): one shape for both.

use rust_decimal::Decimal;
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::OrderStatus;
use crate::store::{EventKind, EventRow};

/// One change of an order, or of a sale.
#[derive(Serialize, ToSchema)]
pub struct EventMessage {
    /// Increasing; also the cursor (and the `webhook-id` of its delivery:
    /// `evt_<id>`).
    pub id: i64,
    #[serde(rename = "type")]
    kind: EventKind,
    /// When the books recorded it (epoch ms, MySQL's clock).
    created: i64,
    data: EventData,
}

/// What changed: an order (`order.*`), or a sale (`sale.*`: its id only).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum EventData {
    Order(EventOrder),
    Sale(EventSale),
}

/// The order, as the change left it.
#[derive(Serialize, ToSchema)]
pub struct EventOrder {
    order_id: String,
    /// What the change made it (`confirmed`, `paid`, `cancelled`; a
    /// `refund_due` leaves the order as it was, `paid` or `cancelled`, and
    /// says so only by its type).
    status: Option<OrderStatus>,
    user_id: i64,
    product_id: String,
    quantity: i64,
    price: Decimal,
}

/// The sale a `sale.*` event is about.
#[derive(Serialize, ToSchema)]
pub struct EventSale {
    product_id: String,
}

impl From<EventRow> for EventMessage {
    fn from(e: EventRow) -> Self {
        let status = match e.kind {
            EventKind::Confirmed => Some(OrderStatus::Confirmed),
            EventKind::Paid => Some(OrderStatus::Paid),
            EventKind::Cancelled => Some(OrderStatus::Cancelled),
            _ => None,
        };
        let data = match (e.order_id, e.user_id, e.quantity, e.price) {
            (Some(order_id), Some(user_id), Some(quantity), Some(price)) => {
                EventData::Order(EventOrder {
                    order_id,
                    status,
                    user_id,
                    product_id: e.product_id,
                    quantity,
                    price: price.normalize(),
                })
            }
            _ => EventData::Sale(EventSale {
                product_id: e.product_id,
            }),
        };
        Self {
            id: e.id,
            kind: e.kind,
            created: e.created,
            data,
        }
    }
}
