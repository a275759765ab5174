//! What the operators' handlers reach: the sales as an admin runs them,
//! the admin log's door, what `/metrics` reads.

use std::sync::Arc;

use axum::extract::FromRef;

use super::admin_log::AdminDoor;
use super::dashboard::board::Dashboard;
use super::desk::SaleDesk;
use super::watched::Watched;
use crate::http::extract::AdminToken;
use crate::http::transport::conn::Connections;
use crate::metrics::Metrics;

/// The operators' side, one `Arc` cloned per request.
#[derive(Clone)]
pub struct Operators(Arc<OperatorParts>);

pub struct OperatorParts {
    pub desk: SaleDesk,
    /// `None`: the admin routes answer 401.
    pub admin_token: Option<Arc<str>>,
    /// The admin log, as the admin routes and the dashboard write it.
    pub door: Arc<AdminDoor>,
    /// What `/metrics` reads of the sales.
    pub watched: Watched,
    pub metrics: Arc<Metrics>,
    /// The open connections (`/metrics` counts them).
    pub connections: Arc<Connections>,
    /// The operator's page (`None`: no admin routes or no ADMIN_TOKEN).
    pub dashboard: Option<Arc<Dashboard>>,
}

impl Operators {
    pub fn new(parts: OperatorParts) -> Self {
        Self(Arc::new(parts))
    }
}

impl std::ops::Deref for Operators {
    type Target = OperatorParts;

    fn deref(&self) -> &OperatorParts {
        &self.0
    }
}

/// What the admin extractor checks against.
impl FromRef<Operators> for AdminToken {
    fn from_ref(state: &Operators) -> Self {
        AdminToken(state.admin_token.clone())
    }
}

/// The admin log's door, for its routes.
impl FromRef<Operators> for Arc<AdminDoor> {
    fn from_ref(state: &Operators) -> Self {
        state.door.clone()
    }
}
