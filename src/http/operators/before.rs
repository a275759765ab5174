//! What the admin log keeps as "before" for the actions that change a
//! sale's figures: the admin API's and the dashboard's entries alike.

use serde_json::{Value, json};

use crate::bookkeeping::Catalog;
use crate::domain::ProductId;

/// A restock's "before": the stock and the units on sale (`None`: the sale
/// cannot be read now; the action answers for itself).
pub(crate) async fn stock(catalog: &Catalog, id: &ProductId) -> Option<Value> {
    let status = catalog.status(id).await.ok()?;
    Some(json!({"stock": status.stock, "initial_qty": status.product.initial_qty}))
}

/// A change of the room's bounds' "before": the bounds as the books held
/// them.
pub(crate) async fn room_bounds(catalog: &Catalog, id: &ProductId) -> Option<Value> {
    let p = catalog.product(id).await.ok()?;
    Some(json!({
        "ceiling_per_sec": p.room_ceiling_per_sec,
        "floor_per_sec": p.room_admit_floor_per_sec,
        "active_cap": p.room_active_cap,
        "join_difficulty": p.room_join_difficulty,
    }))
}
