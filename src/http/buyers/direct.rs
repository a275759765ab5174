//! The buyers' requests the server answers straight from the connection
//! (`transport::server::Direct`): `POST /api/orders`
//! ([`orders::place::endpoint`]) and a waiting room's poll, `GET
//! /api/sales/{id}/queue/{ticket}` ([`room::poll_endpoint`]). Both keep
//! every guard (`limits::guarded`, `limits::admit_order`, the poll rate
//! limit) without the router's layers.

use std::net::SocketAddr;

use axum::http::{Method, Request};
use hyper::body::Incoming;

use super::orders;
use super::room;
use super::state::Buyers;
use crate::http::transport::conn::Busy;
use crate::http::transport::server::{Answering, Direct};

/// A direct request.
pub enum Which {
    Order,
    /// The waiting room's polls: every waiting buyer's, every few seconds.
    Poll,
}

impl Direct for Buyers {
    type Which = Which;

    #[inline]
    fn which(&self, req: &Request<Incoming>) -> Option<Which> {
        if req.method() == Method::POST && req.uri().path() == "/api/orders" {
            return Some(Which::Order);
        }
        (req.method() == Method::GET && room::is_poll(req.uri().path())).then_some(Which::Poll)
    }

    fn answer(
        &self,
        which: Which,
        (peer, busy): (SocketAddr, Busy),
        req: Request<Incoming>,
    ) -> Answering {
        let buyers = self.clone();
        match which {
            Which::Order => Box::pin(async move {
                let _busy = busy;
                Ok(orders::place::endpoint(&buyers, Some(peer), req).await)
            }),
            Which::Poll => Box::pin(async move {
                let _busy = busy;
                Ok(room::poll_endpoint(&buyers, Some(peer), req).await)
            }),
        }
    }
}
