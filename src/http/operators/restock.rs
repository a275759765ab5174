//! A restock's id in the books: the admin API's (by its `Idempotency-Key`)
//! and the dashboard's (by the key the page makes for each restock it
//! means).

use crate::domain::{OrderId, ProductId};
use crate::http::error::ApiError;

/// A restock's id in the books: by the client's key when it sent one (a
/// retry under the same key is the same restock, applied once), else new.
pub(crate) fn restock_id(id: &ProductId, key: Option<&str>) -> Result<String, ApiError> {
    match key {
        Some(key) if (1..=128).contains(&key.len()) => {
            // By its hash: the books' id stays short whatever the key.
            Ok(format!(
                "{id}:{}",
                super::admin_log::fingerprint(key.as_bytes())
            ))
        }
        Some(_) => Err(ApiError::InvalidRequest(
            "Idempotency-Key: 1-128 visible characters".into(),
        )),
        None => Ok(OrderId::generate(id).into_string()),
    }
}
