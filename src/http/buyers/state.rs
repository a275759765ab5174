//! What the buyers' and the payment side's handlers reach: built once at
//! start, one `Arc` cloned per request.

use std::sync::Arc;

use axum::extract::FromRef;

use crate::bookkeeping::{Catalog, OrderLife};
use crate::config::PaymentSettings;
use crate::http::auth::Auth;
use crate::http::extract::Verifier;
use crate::http::transport::limits::Guards;
use crate::metrics::Metrics;
use crate::sale::{OrderPath, Room};

/// The buyers' side. Cloned for every request (axum's `State`), so it is
/// one `Arc`: cloning the parts (connection handles, pools, the key
/// prefix) each time had a measurable cost on the sold-out path
/// (BENCHMARKS.md, "What does a refusal cost?").
#[derive(Clone)]
pub struct Buyers(Arc<BuyerParts>);

pub struct BuyerParts {
    /// The order path (Redis alone: where stock is deducted).
    pub orders: OrderPath,
    /// The waiting rooms (Redis alone).
    pub room: Room,
    /// Orders after their 202, across both stores.
    pub order_life: OrderLife,
    /// The sales, for the public product read.
    pub catalog: Catalog,
    /// `None`: `AUTH=none`, the body's `user_id` is believed.
    pub auth: Option<Arc<Auth>>,
    /// Where payment notifications are heard (`None`: the route is not
    /// served).
    pub payments: Option<PaymentSettings>,
    /// The guards in front of Redis.
    pub guards: Arc<Guards>,
    pub metrics: Arc<Metrics>,
}

impl Buyers {
    pub fn new(parts: BuyerParts) -> Self {
        Self(Arc::new(parts))
    }
}

impl std::ops::Deref for Buyers {
    type Target = BuyerParts;

    fn deref(&self) -> &BuyerParts {
        &self.0
    }
}

/// How the buyer is told.
impl FromRef<Buyers> for Verifier {
    fn from_ref(state: &Buyers) -> Self {
        Verifier(state.auth.clone())
    }
}
