//! The HTTP side as startup builds it: a state for each audience, and the
//! bounds of the connections they share.

use std::sync::Arc;

use super::buyers::Buyers;
use super::operators::Operators;
use super::transport::conn::Connections;

pub struct Wings {
    /// The buyers' and the payment side's API.
    pub buyers: Buyers,
    /// The operators' side (`/metrics` always; the rest with the admin
    /// routes).
    pub operators: Operators,
    /// Serve the admin routes and the dashboard at all.
    pub admin_routes: bool,
    /// The open connections and their bounds.
    pub connections: Arc<Connections>,
}
