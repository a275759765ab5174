//! What every handler can reach: the service's parts, built once at
//! start and shared by every request.

use std::sync::Arc;

use axum::extract::FromRef;

use super::admin_log::AdminDoor;
use super::dashboard::board::Dashboard;
use super::extract::{AdminToken, Identity};
use super::{auth, conn, limits};
use crate::books::{Audit, Books, Catalog, Outbox, Reports};
use crate::sale::{Orders, Room};

/// What every handler can reach. Cloned for every request (axum's `State`),
/// so it is one `Arc`: cloning the parts (connection handles, pools, the key
/// prefix) each time had a measurable cost on the sold-out path (BENCHMARKS.md, "What does a
/// refusal cost?").
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    /// The order path (Redis alone: where stock is deducted).
    pub orders: Orders,
    /// The waiting rooms (Redis alone).
    pub room: Room,
    /// Orders after their 202, across both stores.
    pub books: Books,
    /// Sales as an admin runs them, across both stores.
    pub catalog: Catalog,
    /// Each sale's books, checked.
    pub audit: Audit,
    /// How each sale went (its timeline and its books).
    pub reports: Reports,
    /// The events, pulled in order, and their dead letters.
    pub outbox: Outbox,
    /// What `/metrics` reads of the sales.
    pub watched: super::watched::Watched,
    /// `None`: the admin routes answer 401.
    pub admin_token: Option<Arc<str>>,
    /// Serve the admin routes at all.
    pub admin_routes: bool,
    /// The operator's page (`None`: no admin routes or no ADMIN_TOKEN).
    pub dashboard: Option<Arc<Dashboard>>,
    /// `None`: `AUTH=none`, the body's `user_id` is believed.
    pub auth: Option<Arc<auth::Auth>>,
    /// Where payment notifications are heard (`None`: the route is not
    /// served).
    pub payments: Option<crate::config::PaymentSettings>,
    pub guards: Arc<limits::Guards>,
    /// The admin log, as the admin routes and the dashboard write it.
    pub admin: Arc<AdminDoor>,
    /// The open connections and their bounds.
    pub connections: Arc<conn::Connections>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl AppState {
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What the admin extractor checks against.
impl FromRef<AppState> for AdminToken {
    fn from_ref(state: &AppState) -> Self {
        AdminToken(state.admin_token.clone())
    }
}

/// How the buyer is told.
impl FromRef<AppState> for Identity {
    fn from_ref(state: &AppState) -> Self {
        Identity(state.auth.clone())
    }
}

/// The admin log's door, for its routes.
impl FromRef<AppState> for Arc<AdminDoor> {
    fn from_ref(state: &AppState) -> Self {
        state.admin.clone()
    }
}
