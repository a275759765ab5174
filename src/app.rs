//! Startup: turns validated settings into the running service.

use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::config::Settings;
use crate::http::{self, AppState};
use crate::sale::{Redis, SaleError, Sales};
use crate::store::{Db, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("redis: {0}")]
    Redis(#[from] SaleError),
    #[error("mysql: {0}")]
    Store(#[from] StoreError),
    #[error("cannot listen: {0}")]
    Bind(#[from] std::io::Error),
}

/// A built service, bound to its port, not yet serving.
pub struct App {
    listener: TcpListener,
    state: AppState,
}

impl App {
    /// Connects (lazily) to Redis, creates and migrates the database, binds the
    /// listener. Port 0 in `listen_addr` picks a free port (tests use this).
    pub async fn build(settings: &Settings) -> Result<Self, StartupError> {
        let redis = Redis::new(
            &settings.redis_url,
            settings.redis_timeout,
            settings.redis_pool_size,
        )?;
        let db = Db::connect_lazy(
            &settings.database_url,
            settings.db_timeout,
            settings.db_max_connections,
        )?;
        db.create_and_migrate(&settings.database_url).await?;
        let listener = TcpListener::bind(settings.listen_addr).await?;
        let state = AppState {
            sales: Sales::new(redis, settings.key_prefix.clone()),
            db,
            admin_token: settings.admin_token.clone(),
        };
        Ok(Self { listener, state })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` completes.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        if self.state.admin_token.is_none() {
            tracing::warn!("ADMIN_TOKEN is not set: admin routes will answer 401");
        }
        tracing::info!(addr = %self.local_addr()?, "serving");
        http::serve(self.listener, self.state, shutdown).await
    }
}
