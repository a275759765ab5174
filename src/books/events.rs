//! An event as the shop's systems get it, pulled (`GET /api/admin/events`)
//! or pushed (the workers' delivery): one shape for both.

use rust_decimal::Decimal;
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::OrderStatus;
use crate::store::{EventKind, EventRow};

/// One change of an order.
#[derive(Serialize, ToSchema)]
pub struct EventMessage {
    /// Increasing; also the cursor (and the `webhook-id` of its delivery:
    /// `evt_<id>`).
    pub id: i64,
    #[serde(rename = "type")]
    kind: EventKind,
    /// When the books recorded it (epoch ms, MySQL's clock).
    created: i64,
    data: EventOrder,
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

impl From<EventRow> for EventMessage {
    fn from(e: EventRow) -> Self {
        let status = match e.kind {
            EventKind::Confirmed => Some(OrderStatus::Confirmed),
            EventKind::Paid => Some(OrderStatus::Paid),
            EventKind::Cancelled => Some(OrderStatus::Cancelled),
            EventKind::RefundDue => None,
        };
        Self {
            id: e.id,
            kind: e.kind,
            created: e.created,
            data: EventOrder {
                order_id: e.order_id,
                status,
                user_id: e.user_id,
                product_id: e.product_id,
                quantity: e.quantity,
                price: e.price.normalize(),
            },
        }
    }
}
