//! The `flashsale` binary: parse the command line, run the library.

use anyhow::Context;
use clap::Parser;
use flashsale::config::{Cli, Command, Settings, WorkerSettings};
use tracing_subscriber::EnvFilter;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_logs();
    // Connections are capped below the open-file limit: let it be the most
    // the system allows this process.
    flashsale::config::raise_open_file_limit();
    match Cli::parse().command {
        Command::Serve(args) => {
            let (dry_run, secrets) = (args.dry_run, args.secrets());
            let settings = Settings::from(*args);
            if dry_run {
                flashsale::app::App::check(&settings).context("checking the settings")?;
                flashsale::cli::print_settings(&settings, &secrets);
                return Ok(());
            }
            let app = flashsale::app::App::build(&settings)
                .await
                .context("starting flashsale serve")?;
            app.run(shutdown_signal()).await.context("serving")?;
        }
        Command::Worker(args) => {
            let (dry_run, secrets) = (args.dry_run, args.secrets());
            let settings = WorkerSettings::from(*args);
            if dry_run {
                flashsale::cli::print_settings(&settings, &secrets);
                return Ok(());
            }
            flashsale::app::run_workers(&settings, shutdown_signal())
                .await
                .context("running flashsale worker")?;
        }
        Command::Audit(args) => flashsale::cli::audit(args).await?,
        Command::Recover(args) => flashsale::cli::recover(args).await?,
        Command::Report(args) => flashsale::cli::report(args).await?,
        Command::Streams(args) => flashsale::cli::streams(args).await?,
        Command::Sales(args) => flashsale::cli::sales(args).await?,
    }
    Ok(())
}

/// Logs on stderr, filtered by `RUST_LOG` (default `info`): for people on a
/// terminal, one JSON object per line with `LOG_FORMAT=json` (for log shippers).
fn init_logs() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match std::env::var("LOG_FORMAT").as_deref() {
        Ok("json") => logs.json().with_current_span(true).init(),
        _ => logs.init(),
    }
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}
