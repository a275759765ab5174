//! `flashsale-bench deliver`: how many events one worker process pushes
//! per second to a local receiver, and what each costs. Persists N orders
//! (N `order.confirmed` events in the outbox), then runs the workers'
//! deliverer against an HTTP receiver in this process (it counts and
//! answers 204, or fails `--fail-percent` of the requests) until every
//! event is acknowledged, driven as the workers drive it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use clap::Args;

use super::bench_product;
use flashsale::config::DbArgs;
use flashsale::config::{DeliverySettings, WorkerConfig};
use flashsale::domain::webhook::Secret;
use flashsale::domain::{OrderId, PendingOrder, Quantity, UserId, now_ms};
use flashsale::metrics::Metrics;
use flashsale::store::{Db, NewProduct};
use flashsale::worker::deliver::Deliverer;

#[derive(Debug, Clone, Args)]
pub struct BenchDeliverArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Events to deliver.
    #[arg(long, default_value_t = 20_000)]
    pub events: u64,
    /// The receiver fails this share of the requests (%, spread evenly):
    /// what a flaky endpoint costs in-order delivery.
    #[arg(long, default_value_t = 0)]
    pub fail_percent: u64,
    /// The first back-off after a failure (ms; the service's default).
    #[arg(long, default_value_t = flashsale::config::worker_defaults::EVENT_WEBHOOK_BACKOFF_MIN_MS)]
    pub backoff_min_ms: u64,
}

const SECRET: &str = "whsec_ZGVsaXZlcnktYmVuY2htYXJrLXNlY3JldC0wMDAw";

pub async fn run_deliver_bench(args: BenchDeliverArgs) -> anyhow::Result<()> {
    let url = &args.db.database_url;
    // A short bound: events are read once DB_TIMEOUT_MS + 1 s old.
    let db = Db::connect_lazy(url, Duration::from_secs(1), args.db.db_max_connections)?;
    db.create_and_migrate().await?;
    let mysql = super::cost::local_mysql_pid(url);

    let acked = Arc::new(AtomicU64::new(0));
    let counter = acked.clone();
    let seen = Arc::new(AtomicU64::new(0));
    let fail_percent = args.fail_percent.min(100);
    let receiver = Router::new().route(
        "/hook",
        post(move || {
            let (counter, seen) = (counter.clone(), seen.clone());
            async move {
                // Fails `fail_percent` of every 100 requests, spread evenly.
                let n = seen.fetch_add(1, Ordering::Relaxed);
                if (n * fail_percent) % 100 + fail_percent >= 100 {
                    return axum::http::StatusCode::INTERNAL_SERVER_ERROR;
                }
                counter.fetch_add(1, Ordering::Relaxed);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, receiver).await });

    let settings = DeliverySettings {
        url: format!("http://{addr}/hook").parse()?,
        secret: Secret::parse(SECRET)?,
        max_attempts: 100,
        timeout: Duration::from_secs(5),
        backoff_min: Duration::from_millis(args.backoff_min_ms),
        backoff_max: Duration::from_millis(
            flashsale::config::worker_defaults::EVENT_WEBHOOK_BACKOFF_MAX_MS,
        ),
        ca: None,
    };
    let endpoint = settings.url.to_string();
    let owner = format!("bench-{}", std::process::id());
    // Deliver only this run's events: the cursor starts at the newest.
    let now = now_ms();
    db.deliveries()
        .lease_delivery(&endpoint, &owner, now, now + 60_000)
        .await?;
    db.deliveries()
        .delivered(&endpoint, &owner, db.events().last_event_id().await?)
        .await?;
    persist(&db, args.events).await?;
    tokio::time::sleep(db.events().event_settle()).await;

    let stores = (db.events(), db.deliveries());
    let deliverer = Deliverer::new(stores, settings, owner, Arc::new(Metrics::new()))?;
    let (cpu0, mysql0) = (
        super::cpu::process(),
        mysql.as_deref().and_then(super::cpu::of),
    );
    let started = Instant::now();
    // Driven as the workers drive it: passes back to back while events
    // wait, at the retry's time after a failure, every 200 ms when idle.
    let stop = tokio_util::sync::CancellationToken::new();
    let running = {
        let stop = stop.clone();
        tokio::spawn(async move {
            deliverer
                .run(WorkerConfig::default().deliver_every, stop)
                .await
        })
    };
    while acked.load(Ordering::Relaxed) < args.events {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if started.elapsed() > Duration::from_secs(600) {
            stop.cancel();
            anyhow::bail!("not delivered within 10 minutes");
        }
    }
    stop.cancel();
    running.await?;
    let secs = started.elapsed().as_secs_f64();
    let per = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.1}", (b - a).as_secs_f64() * 1e6 / args.events as f64),
        _ => "-".into(),
    };
    println!(
        "{} events delivered in {secs:.2} s: {:.0} events/s; CPU µs per event: this process (deliverer and receiver) {}, MySQL {}",
        args.events,
        args.events as f64 / secs,
        per(cpu0, super::cpu::process()),
        per(mysql0, mysql.as_deref().and_then(super::cpu::of)),
    );
    Ok(())
}

/// `n` one-unit orders of a new product persisted as the workers do
/// (500 a transaction): `n` events.
async fn persist(db: &Db, n: u64) -> anyhow::Result<()> {
    let product = bench_product("deliver");
    let spec = super::bench_spec(n);
    db.products()
        .create(&NewProduct {
            product_id: product.clone(),
            title: "deliver benchmark".into(),
            price: spec.price,
            available_qty: n,
            start_time: spec.start_ms,
            end_time: spec.end_ms,
            limit_per_user: 1,
            waiting_room: None,
            stock_shards: 1,
        })
        .await?;
    let orders: Vec<PendingOrder> = (1..=n)
        .map(|user| PendingOrder {
            order_id: OrderId::generate(&product),
            user_id: UserId::new(user).unwrap_or_else(|_| unreachable!("1..=n")),
            product_id: product.clone(),
            quantity: Quantity::new(1).unwrap_or_else(|_| unreachable!("one unit")),
            price: spec.price,
            created_ms: now_ms(),
            idempotency_key: None,
        })
        .collect();
    for batch in orders.chunks(500) {
        db.orders().persist_orders(&product, batch).await?;
    }
    Ok(())
}
