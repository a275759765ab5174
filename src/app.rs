//! Startup: turns validated settings into the running service. The HTTP
//! server and the stream workers are siblings under one shutdown token.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::bookkeeping::{Audit, Catalog, OrderLife, Outbox, Recorder, Reports};
use crate::config::{MemorySettings, Settings, WorkerSettings, weak_admin_token};
use crate::domain::Chain;
use crate::http::auth::Auth;
use crate::http::buyers::{BuyerParts, Buyers};
use crate::http::operators::watched::Watched;
use crate::http::operators::{OperatorParts, Operators, SaleDesk};
use crate::http::transport::conn::Connections;
use crate::http::transport::limits::{Guards, sweep_buckets};
use crate::http::{self, Wings};
use crate::metrics::Metrics;
use crate::sale::{SaleError, Sales, fleet};
use crate::store::{Db, StoreError};
use crate::worker::{Workers, every};

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("redis")]
    Redis(#[from] SaleError),
    #[error("mysql")]
    Store(#[from] StoreError),
    #[error("cannot listen")]
    Bind(#[from] std::io::Error),
    #[error(
        "{0}: the admin routes create and open sales; set ADMIN_TOKEN to a long random secret (e.g. `openssl rand -hex 24`), or turn them off with ADMIN_ROUTES=false"
    )]
    AdminToken(&'static str),
    #[error("buyer identity")]
    Auth(#[from] crate::http::auth::AuthError),
    #[error(
        "CLIENT_IP_HEADER is believed only from the proxies that set it: set CLIENT_IP_TRUSTED_PROXIES (or AUTH_TRUSTED_PROXIES) to their addresses"
    )]
    ClientIpWithoutProxies,
}

/// A built service, bound to its port, not yet serving: the one place
/// that holds the stores whole and gives each part its handles.
pub struct App {
    listener: TcpListener,
    wings: Wings,
    workers: Option<Workers>,
    sales: Sales,
    db: Db,
}

/// The listen backlog: connections the kernel holds for a listener before
/// it accepts them (capped at `net.core.somaxconn`). A crowd reconnecting
/// as the service closes it must not overflow it, where a health check's
/// SYN would be dropped and retried a second later.
const LISTEN_BACKLOG: u32 = 4096;

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The background work both `serve` and `worker` start with, until `token`
/// is cancelled: creating and migrating the database as soon as MySQL
/// answers, and checking Redis's persistence as soon as Redis answers.
fn start_dependencies(sales: &Sales, db: &Db, token: &CancellationToken) {
    let (db, stop) = (db.clone(), token.clone());
    tokio::spawn(async move {
        db.migrate_until_ready(stop.clone()).await;
        db.follow_server(stop).await;
    });
    let (sales, stop) = (sales.clone(), token.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = sales.check_persistence_when_up() => {}
        }
    });
}

impl App {
    /// Builds everything and binds the listener, without waiting for Redis
    /// or MySQL. Port 0 in `listen_addr` picks a free port (tests use this).
    pub async fn build(settings: &Settings) -> Result<Self, StartupError> {
        let http = &settings.http;
        let auth = Self::check(settings)?;
        let sales = Sales::from_settings(&settings.redis, http.memory.clone())?;
        let db = Db::from_settings(&settings.db)?;
        let listener = listen(http.listen_addr)?;
        let metrics = Arc::new(Metrics::new());
        let workers = settings
            .workers
            .clone()
            .map(|cfg| Workers::new(&sales, &db, cfg).with_metrics(metrics.clone()));
        let guards = Arc::new(Guards::new(http.limits.clone()));
        let admin = Arc::new(http::operators::admin_log::AdminDoor::new(
            db.admin_log(),
            guards.clone(),
            metrics.admin_auth_failures.clone(),
        ));
        let desk = operators_desk(&sales, &db);
        let dashboard = dashboard(settings, Watched::of(&sales, &db), &metrics, &admin, &desk);
        let connections = Connections::new(http.connections.clone());
        let buyers = Buyers::new(BuyerParts {
            orders: sales.orders().clone(),
            room: sales.room().clone(),
            order_life: OrderLife::new(
                (sales.accepted().clone(), sales.ledger().clone()),
                (db.orders(), db.payments()),
            ),
            catalog: desk.catalog.clone(),
            auth: auth.map(Arc::new),
            payments: http.payments.clone(),
            guards,
            metrics: metrics.clone(),
        });
        let operators = Operators::new(OperatorParts {
            desk,
            admin_token: http.admin_token.clone(),
            door: admin,
            watched: Watched::of(&sales, &db),
            metrics,
            connections: connections.clone(),
            dashboard,
        });
        let wings = Wings {
            buyers,
            operators,
            admin_routes: http.admin_routes,
            connections,
        };
        Ok(Self {
            listener,
            wings,
            workers,
            sales,
            db,
        })
    }

    /// What `serve` refuses to start with, checked without connecting or
    /// binding anything (also `serve --dry-run`): a weak admin token, an
    /// identity configuration that cannot work. The buyers' verifier.
    pub fn check(settings: &Settings) -> Result<Option<Auth>, StartupError> {
        let http = &settings.http;
        if http.admin_routes
            && let Some(why) = weak_admin_token(http.admin_token.as_deref())
        {
            return Err(StartupError::AdminToken(why));
        }
        if http.limits.client_ip_header.is_some() && http.limits.client_ip_proxies.is_empty() {
            return Err(StartupError::ClientIpWithoutProxies);
        }
        let auth = Auth::new(&http.auth)?;
        match (&auth, &http.payments) {
            (None, None) => tracing::warn!(
                "AUTH=none: buyers are not verified; anyone may order, read and cancel as anyone, and mark any order paid without paying (POST /api/orders/{{id}}/pay): for local trials only"
            ),
            (None, Some(_)) => tracing::warn!(
                "AUTH=none: buyers are not verified; anyone may order, read and cancel as anyone (for local trials only)"
            ),
            (Some(_), None) => tracing::warn!(
                "PAYMENT_WEBHOOK_SECRETS is not set: no order can become paid (payments are heard only as signed notifications from the payment side)"
            ),
            (Some(_), Some(_)) => {}
        }
        Ok(auth)
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn wings(&self) -> &Wings {
        &self.wings
    }

    pub fn workers(&self) -> Option<&Workers> {
        self.workers.as_ref()
    }

    /// The sales in Redis, whole (for tests and operators' tools).
    pub fn sales(&self) -> &Sales {
        &self.sales
    }

    /// The books in MySQL, whole (for tests and operators' tools).
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Serves until `shutdown` completes: the server stops taking requests
    /// and finishes those in flight; the workers finish the batch in hand.
    /// Answers at once; `/readyz` says when MySQL's database is ready.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let token = CancellationToken::new();
        start_dependencies(&self.sales, &self.db, &token);
        let role = match self.workers {
            Some(_) => fleet::Role::ApiAndWorkers,
            None => fleet::Role::Api,
        };
        let roll = tokio::spawn(
            self.sales
                .fleet()
                .clone()
                .attend(fleet::Member::this_process(role), token.clone()),
        );
        let workers = self.workers.map(|w| tokio::spawn(w.run(token.clone())));
        let metrics = self.wings.operators.metrics.clone();
        let recorder = Recorder {
            metrics: metrics.clone(),
            seconds: self.db.seconds(),
            room: Some(self.sales.room().clone()),
            source: Recorder::source_name(),
        };
        // The recorder stops after the workers: the rows of their last
        // batch are counted in the timeline's last second.
        let recorder_stop = CancellationToken::new();
        let recorded = tokio::spawn(recorder.run(recorder_stop.clone()));
        tokio::spawn(sweep_buckets(
            self.wings.buyers.guards.clone(),
            Duration::from_secs(10),
            token.clone(),
        ));
        tracing::info!(addr = %self.listener.local_addr()?, "serving");
        let stop = token.clone();
        let served = http::serve(self.listener, self.wings, async move {
            tokio::select! {
                _ = shutdown => {}
                _ = stop.cancelled() => {}
            }
        })
        .await;
        token.cancel();
        let panics = &metrics.task_panics;
        if let Some(w) = workers {
            every::report_exit("stream workers", w, panics).await;
        }
        // The timeline's last seconds written (bounded by the books' timeout).
        recorder_stop.cancel();
        every::report_exit("timeline recorder", recorded, panics).await;
        // Off the fleet's roll (bounded by the Redis timeout).
        every::report_exit("fleet roll", roll, panics).await;
        served
    }
}

/// What the operators' side runs on, across both stores: a sale's admin,
/// its audit, its report, its events.
fn operators_desk(sales: &Sales, db: &Db) -> SaleDesk {
    let catalog = Catalog::new(
        (
            sales.lifecycle().clone(),
            sales.ledger().clone(),
            sales.room().clone(),
        ),
        (db.products(), db.audits()),
    );
    let audit = || {
        Audit::new(
            sales.ledger().clone(),
            (db.products(), db.orders(), db.audits()),
        )
    };
    let reports = Reports::new(
        audit(),
        sales.room().clone(),
        (db.seconds(), db.products(), db.orders(), db.payments()),
    );
    SaleDesk {
        catalog,
        audit: audit(),
        reports,
        outbox: Outbox::new(db.events(), db.deliveries()),
    }
}

/// The operator's page, when the admin routes are on with a token.
fn dashboard(
    settings: &Settings,
    watched: Watched,
    metrics: &Arc<Metrics>,
    admin: &Arc<http::operators::admin_log::AdminDoor>,
    desk: &SaleDesk,
) -> Option<Arc<http::operators::dashboard::Dashboard>> {
    let http = &settings.http;
    let token = http.admin_token.clone().filter(|_| http.admin_routes)?;
    let workers = match &settings.workers {
        Some(w) => http::operators::dashboard::board::WorkerSite::Here {
            delivering: !w.events.is_empty(),
        },
        None => http::operators::dashboard::board::WorkerSite::Elsewhere,
    };
    Some(Arc::new(http::operators::dashboard::Dashboard {
        sessions: http::operators::dashboard::session::Sessions::new(
            &token,
            http.dashboard_session,
        ),
        board: http::operators::dashboard::Board::new(watched, metrics.clone(), workers),
        admin_token: token,
        admin: admin.clone(),
        metrics: metrics.clone(),
        desk: desk.clone(),
        ended: Default::default(),
    }))
}

/// `flashsale worker`: only the stream workers, until `shutdown`; with
/// `metrics_addr`, their metrics at `http://<metrics_addr>/metrics`.
pub async fn run_workers(
    settings: &WorkerSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartupError> {
    let (sales, db) = (
        Sales::from_settings(&settings.redis, MemorySettings::default())?,
        Db::from_settings(&settings.db)?,
    );
    let cfg = settings.worker.clone();
    let token = CancellationToken::new();
    start_dependencies(&sales, &db, &token);
    let stop = token.clone();
    tokio::spawn(async move {
        shutdown.await;
        stop.cancel();
    });
    let metrics = Arc::new(Metrics::new());
    if let Some(addr) = settings.metrics_addr {
        let listener = listen(addr)?;
        tracing::info!(addr = %listener.local_addr()?, "serving worker metrics");
        let router =
            http::operators::metrics::worker_router(metrics.clone(), Watched::of(&sales, &db));
        let connections = Connections::new(settings.connections.clone());
        let stop = token.clone();
        tokio::spawn(async move {
            let served = http::serve_router(listener, router, connections, async move {
                stop.cancelled().await
            })
            .await;
            if let Err(e) = served {
                tracing::error!(error = %Chain(&e), "worker metrics listener failed");
            }
        });
    }
    let recorder = Recorder {
        metrics: metrics.clone(),
        seconds: db.seconds(),
        room: None,
        source: Recorder::source_name(),
    };
    // Stopped after the workers, so that their last batch is counted.
    let recorder_stop = CancellationToken::new();
    let recorded = tokio::spawn(recorder.run(recorder_stop.clone()));
    let roll = tokio::spawn(sales.fleet().clone().attend(
        fleet::Member::this_process(fleet::Role::Worker),
        token.clone(),
    ));
    Workers::new(&sales, &db, cfg)
        .with_metrics(metrics.clone())
        .run(token)
        .await;
    recorder_stop.cancel();
    every::report_exit("timeline recorder", recorded, &metrics.task_panics).await;
    every::report_exit("fleet roll", roll, &metrics.task_panics).await;
    Ok(())
}
