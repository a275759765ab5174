//! The HTTP/1.1 server: accepts connections, answers the requests a sale's
//! crowd sends by the thousand straight from the connection ([`Direct`]:
//! the buyers' side says which, `POST /api/orders` and a waiting room's
//! poll) and everything else through the router.
//!
//! The order path is nearly all the traffic of a sale, and most of it is
//! answered from memory in a few microseconds, so what the HTTP stack costs
//! around it is most of its cost: through axum's router and a middleware
//! stack, a sold-out answer took several times the instructions of a bare
//! hyper server's (BENCHMARKS.md, "What does a refusal cost?"). Both fast
//! paths keep every guard (`limits::guarded`, `limits::admit_order`, the
//! poll rate limit) without the layers.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower_service::Service as _;

use super::conn::{Busy, ClientConn, Connections};
use crate::domain::Chain;

/// The requests a service answers straight from the connection, before
/// the router: the order path and the waiting room's polls, nearly all
/// the traffic of a sale.
pub trait Direct: Clone + Send + Sync + 'static {
    /// Which of the direct requests one is.
    type Which: Send + 'static;

    /// Which direct request `req` is, if it is one (else the router's).
    fn which(&self, req: &Request<Incoming>) -> Option<Self::Which>;

    /// The answer to a direct request, holding `busy` until it is given.
    /// Its future is made inside its box, not moved into it: it is large,
    /// and a move copies all of it (a future made first and boxed after
    /// cost ~10,800 instructions an order, BENCHMARKS.md, "The HTTP wing by
    /// audience").
    fn answer(
        &self,
        which: Self::Which,
        connection: (SocketAddr, Busy),
        req: Request<Incoming>,
    ) -> Answering;
}

/// Serves `router` and `direct` on `listener` until `shutdown` completes,
/// then lets the requests in flight finish (idle connections are closed at
/// once). Every connection is bounded by `connections` (see [`super::conn`]).
pub async fn serve<D: Direct>(
    listener: TcpListener,
    (router, direct): (Router, D),
    connections: Arc<Connections>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    accept_loop(listener, &connections, shutdown, |peer, conn| Front {
        direct: direct.clone(),
        router: router.clone(),
        peer,
        conn,
    })
    .await
}

/// Serves `router` alone (the worker process's metrics) on `listener`,
/// with the same bounds on its connections.
pub async fn serve_router(
    listener: TcpListener,
    router: Router,
    connections: Arc<Connections>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    accept_loop(listener, &connections, shutdown, |peer, conn| Plain {
        router: router.clone(),
        peer,
        conn,
    })
    .await
}

/// Accepts connections until `shutdown`, each admitted by `connections`
/// (or answered 503 and closed) and served by the service `serve_with`
/// makes for it; then waits for the requests in flight.
async fn accept_loop<S>(
    listener: TcpListener,
    connections: &Arc<Connections>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    serve_with: impl Fn(SocketAddr, Arc<ClientConn>) -> S,
) -> std::io::Result<()>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        connections.room().await;
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let admitted = match connections.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(why) => {
                tracing::debug!(%peer, reason = why.label(), "connection refused");
                connections.refuse(stream, why);
                continue;
            }
        };
        // Answers are written whole: do not hold the last segment back.
        let _ = stream.set_nodelay(true);
        let service = serve_with(peer, admitted.conn().clone());
        let io = TokioIo::new(admitted.stream(stream));
        let connection = http1::Builder::new().serve_connection(io, service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::trace!(error = %Chain(&e), %peer, "connection ended with an error");
            }
            drop(admitted);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A refused or failed accept: the peer's own failures are skipped; any
/// other (out of file descriptors) is logged and waited out briefly.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    // Out of descriptors despite the cap (something else holds them): a
    // short pause, not axum's second, which would stall every newcomer.
    tracing::error!(error = %Chain(&e), "accepting a connection failed; retrying in 50 ms");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// One connection's service: the direct requests, or the router.
struct Front<D> {
    direct: D,
    router: Router,
    peer: SocketAddr,
    conn: Arc<ClientConn>,
}

/// One connection's service when there is only a router.
struct Plain {
    router: Router,
    peer: SocketAddr,
    conn: Arc<ClientConn>,
}

impl hyper::service::Service<Request<Incoming>> for Plain {
    type Response = Response;
    type Error = Infallible;
    type Future = Answering;

    fn call(&self, mut req: Request<Incoming>) -> Answering {
        let busy = self.conn.busy();
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let mut router = self.router.clone();
        Box::pin(async move {
            let _busy = busy;
            router.call(req).await
        })
    }
}

/// A request's answer, to come.
pub type Answering = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl<D: Direct> hyper::service::Service<Request<Incoming>> for Front<D> {
    type Response = Response;
    type Error = Infallible;
    type Future = Answering;

    fn call(&self, mut req: Request<Incoming>) -> Answering {
        // The connection waits on the service, not the client, until answered.
        let busy = self.conn.busy();
        if let Some(which) = self.direct.which(&req) {
            return self.direct.answer(which, (self.peer, busy), req);
        }
        // The router's routes read the peer's address here (the
        // per-address limits, trusted proxies).
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let mut router = self.router.clone();
        Box::pin(async move {
            let _busy = busy;
            router.call(req).await
        })
    }
}
