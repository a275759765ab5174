//! The outbox as the shop's systems see it ([`Outbox`]): an event as they
//! get it, pulled (`GET /api/admin/events`) or pushed (the workers'
//! delivery), one shape for both; and the dead letters an operator replays.

use rust_decimal::Decimal;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::BookkeepingError;
use crate::domain::OrderStatus;
use crate::store::{DeadEvent, Deliveries, EventKind, EventRow, Events};

/// The outbox, read in order, and its dead letters.
#[derive(Clone)]
pub struct Outbox {
    events: Events,
    deliveries: Deliveries,
}

impl Outbox {
    pub fn new(events: Events, deliveries: Deliveries) -> Self {
        Self { events, deliveries }
    }

    /// Up to `limit` events after the cursor `after`, in order.
    pub async fn after(
        &self,
        after: i64,
        limit: u32,
    ) -> Result<Vec<EventMessage>, BookkeepingError> {
        let rows = self.events.events_after(after, limit).await?;
        Ok(rows.into_iter().map(EventMessage::from).collect())
    }

    /// The events whose delivery gave up (at most 1,000, oldest first).
    pub async fn dead(&self) -> Result<Vec<DeadEvent>, BookkeepingError> {
        Ok(self.deliveries.dead_events().await?)
    }

    /// Marks dead letters (one, or all) to be delivered again; how many.
    pub async fn replay(&self, event_id: Option<i64>) -> Result<u64, BookkeepingError> {
        Ok(self.deliveries.replay_dead_events(event_id).await?)
    }
}

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
