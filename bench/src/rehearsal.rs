//! `flashsale-bench rehearse`: rehearse a flash sale against a running `flashsale
//! serve` over real HTTP, then prove the books: every accepted unit is in
//! exactly one persisted order, none over a buyer's limit, stock balances in
//! Redis and MySQL. Any violated check makes the command exit non-zero.
//!
//! Beside it, the same request plan runs straight through the order script
//! (no HTTP, no sold-out marker) at the same concurrency: the Redis limit,
//! and the ratio of the two.
//!
//! Buyers are whoever the body's `user_id` says (`AUTH=none`), or, given a
//! JWT key (`--jwt-secret`, `--jwt-private-key`), each buyer's orders carry
//! a bearer token the bench mints for them before the burst
//! ([`super::tokens`]); `--local` then verifies with that key.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hyper::{Method, StatusCode};
use jsonwebtoken::Algorithm;
use serde::Serialize;
use serde_json::json;
use tokio::sync::{oneshot, watch};

use super::capacity::{Capacity, Demand};
use super::cost::{self, CpuPerRequest};
use super::cpu::ThreadGroup;
use super::crowd::{self, RedisCalls};
use super::floor::{Floor, Kind};
use super::load::{Answer, Conn, DirectCaller, HttpCaller, LoadRun, drive, drive_until};
use super::plan::{Mix, Planned, expected_units, plan};
use super::tokens::Tokens;
pub use flashsale::bookkeeping::audit::Check;
use flashsale::config::AuthSettings;
use flashsale::config::Limits;
use flashsale::config::MemorySettings;
use flashsale::config::{
    DbArgs, DbSettings, HttpSettings, RedisArgs, RedisSettings, Settings, WorkerSettings,
};
use flashsale::domain::ProductId;
use flashsale::sale::{Redis, SaleSpec, Sales};
use flashsale::store::Db;

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Redis of the service under test (read to verify the books).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// MySQL of the service under test (read to verify the books).
    #[command(flatten)]
    pub db: DbArgs,
    /// Base URL of a running `flashsale serve`; several (comma-separated or
    /// repeated) for several instances: the connections are spread over them.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:8080")]
    pub url: Vec<String>,
    /// Start a `serve` (with workers) in this process on a free port instead.
    #[arg(long)]
    pub local: bool,
    /// With `--local`: this many independent `serve` instances (each with
    /// its own memory, `WORKERS=false`; the workers run beside them),
    /// connections spread over them.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// With `--local`: what the instances answer from memory: `all` (the
    /// service's default), `sold-out` (only the sold-out marker, as before
    /// issue 17), `none` (every order asks Redis).
    #[arg(long, value_enum, default_value_t = MemoryMode::All)]
    pub memory: MemoryMode,
    /// Send traffic for this many seconds before the sale opens (all of it
    /// must be answered `sale_not_started`), and as long again once the
    /// burst sold the sale out (all `sold_out`), to compare the two.
    #[arg(long, default_value_t = 0)]
    pub pre_start_secs: u64,
    /// Share of requests from buyers who already bought (the sale's first
    /// `--stock` buyers), asking again and again.
    #[arg(long, default_value_t = 0.0)]
    pub limit_share: f64,
    /// Share of requests for made-up product ids (all must be answered
    /// `product_not_found`).
    #[arg(long, default_value_t = 0.0)]
    pub unknown_share: f64,
    /// Halfway through the burst, once its orders are persisted, cancel this
    /// many of them through the last instance: their units come back
    /// mid-sale, and must be sold again (the plan must ask for more units
    /// than the stock plus these).
    #[arg(long, default_value_t = 0)]
    pub cancel_mid_sale: u64,
    /// The service's admin token (to create and open the rehearsal sale).
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Units on sale (in each sale).
    #[arg(long, default_value_t = 1000)]
    pub stock: u64,
    /// Sales running at once; requests go to them round robin (on a Redis
    /// Cluster they spread over the masters).
    #[arg(long, default_value_t = 1)]
    pub sales: usize,
    /// Distinct buyers.
    #[arg(long, default_value_t = 20_000)]
    pub users: u64,
    /// Order requests in the burst.
    #[arg(long, default_value_t = 100_000)]
    pub requests: u64,
    /// Requests in flight (one keep-alive connection each).
    #[arg(long, default_value_t = 64)]
    pub concurrency: u64,
    #[arg(long, default_value_t = 1)]
    pub limit_per_user: u64,
    /// Stock shards of the rehearsed sale (the parts its stock is split
    /// across; the capacity plan's Redis ceiling grows with them).
    #[arg(long, default_value_t = 1)]
    pub shards: u16,
    /// Share of requests from a buyer who asked before.
    #[arg(long, default_value_t = 0.1)]
    pub repeat_share: f64,
    /// Share of requests that retry an earlier one under its Idempotency-Key.
    #[arg(long, default_value_t = 0.05)]
    pub retry_share: f64,
    /// Seed of the request mix.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Pace the burst at this many requests/s instead of as fast as answered.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Then run a second, identical sale paced at this fraction of the
    /// measured throughput, and report its latency (e.g. 0.8).
    #[arg(long)]
    pub then_at: Option<f64>,
    /// Skip the direct-Redis run.
    #[arg(long)]
    pub no_direct: bool,
    /// Also run the plan against the two HTTP floors: bare HTTP servers in
    /// this process, one answering every request with the sold-out refusal
    /// at once (what HTTP alone costs here), one calling the order script
    /// for each (the least any HTTP front for the script must do).
    #[arg(long)]
    pub floor: bool,
    /// Give up waiting for the workers after this long.
    #[arg(long, default_value_t = 120)]
    pub drain_timeout_secs: u64,
    /// Keep the rehearsal's product, orders and keys (they are removed after a clean run).
    #[arg(long)]
    pub keep: bool,
    /// The local server's guards (`--local`; none by default: the bench
    /// measures the order path itself).
    #[arg(skip)]
    pub limits: Option<Limits>,
    /// Send each buyer's orders with a bearer token signed with this HMAC
    /// secret (HS256 unless `--jwt-algorithm`); `--local` verifies with it.
    #[arg(
        long,
        env = "BENCH_JWT_SECRET",
        hide_env_values = true,
        conflicts_with = "jwt_private_key"
    )]
    pub jwt_secret: Option<String>,
    /// Send each buyer's orders with a bearer token signed with this PEM
    /// private key (EC: ES256, RSA: RS256, Ed25519: EdDSA, unless
    /// `--jwt-algorithm`).
    #[arg(long)]
    pub jwt_private_key: Option<PathBuf>,
    /// The tokens' algorithm when not the key's default (e.g. ES384, PS256).
    #[arg(long, value_parser = flashsale::config::parse_algorithm)]
    pub jwt_algorithm: Option<Algorithm>,
    /// With `--local`: the PEM public key the server verifies
    /// `--jwt-private-key`'s tokens with.
    #[arg(long, requires = "jwt_private_key")]
    pub jwt_public_key: Option<PathBuf>,
    /// With `--local` and a JWT key: verified tokens the server remembers
    /// (0: it verifies every request).
    #[arg(long, default_value_t = 100_000)]
    pub token_cache: usize,
    /// Tokens minted before, from the key options above (`flashsale-bench auth` shares
    /// them between rehearsals); by default minted from those options.
    #[arg(skip)]
    pub tokens: Option<Arc<Tokens>>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// No progress display.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub plan: PlanArgs,
}

/// What the printed capacity plan sizes for (with `--stock` per sale).
#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// Requests per second of this mix to size the sale for.
    #[arg(long, default_value_t = PlanArgs::RATE)]
    pub plan_rate: f64,
    /// Orders per second the workers and MySQL should persist.
    #[arg(long, default_value_t = PlanArgs::DRAIN)]
    pub plan_drain: f64,
    /// Share of each core to keep busy (0.7: 30% headroom).
    #[arg(long, default_value_t = PlanArgs::BUSY)]
    pub plan_busy: f64,
}

impl PlanArgs {
    const RATE: f64 = 100_000.0;
    const DRAIN: f64 = 2_000.0;
    const BUSY: f64 = 0.7;

    fn demand(&self, stock: u64, shards: u16) -> Demand {
        Demand {
            requests_per_s: self.plan_rate,
            stock,
            shards: shards.max(1),
            drain_orders_per_s: self.plan_drain,
            busy: self.plan_busy,
        }
    }
}

impl Default for PlanArgs {
    fn default() -> Self {
        Self {
            plan_rate: Self::RATE,
            plan_drain: Self::DRAIN,
            plan_busy: Self::BUSY,
        }
    }
}

/// What `--local` instances answer from memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MemoryMode {
    All,
    SoldOut,
    None,
}

impl MemoryMode {
    fn settings(self) -> MemorySettings {
        match self {
            Self::All => MemorySettings::default(),
            Self::SoldOut => MemorySettings {
                sold_out_ttl: MemorySettings::default().sold_out_ttl,
                ..MemorySettings::off()
            },
            Self::None => MemorySettings::off(),
        }
    }
}

impl BenchArgs {
    /// These settings for one of several rehearsals compared side by side:
    /// an in-process server, books checked, quiet, nothing run beside it.
    pub fn side_by_side(&self) -> Self {
        let mut a = self.clone();
        a.local = true;
        a.no_direct = true;
        a.floor = false;
        a.quiet = true;
        a.then_at = None;
        a
    }
}

/// The median of `v` (0 for none).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// Figures of one load run.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    pub requests: u64,
    pub elapsed_ms: u64,
    pub requests_per_s: f64,
    pub outcomes: BTreeMap<String, u64>,
    pub latency_ms: BTreeMap<String, f64>,
    /// p50 and p99 latency (ms) of the answers with each outcome.
    pub latency_by_outcome_ms: BTreeMap<String, [f64; 2]>,
    /// CPU time of the server per request, in µs, where it is measured
    /// apart (the floors; the service's is in [`Report::cpu`]).
    pub server_cpu_us_per_request: Option<f64>,
}

impl From<&LoadRun> for RunFigures {
    fn from(r: &LoadRun) -> Self {
        let q = |q: f64| r.latency.value_at_quantile(q) as f64 / 1000.0;
        Self {
            requests: r.answers.len() as u64,
            elapsed_ms: r.elapsed.as_millis() as u64,
            requests_per_s: r.per_second(),
            outcomes: r.outcomes(),
            latency_ms: BTreeMap::from([
                ("p50".to_owned(), q(0.5)),
                ("p90".to_owned(), q(0.9)),
                ("p99".to_owned(), q(0.99)),
                ("p99.9".to_owned(), q(0.999)),
                ("max".to_owned(), r.latency.max() as f64 / 1000.0),
            ]),
            latency_by_outcome_ms: r
                .latency_by_outcome(&[0.5, 0.99])
                .into_iter()
                .map(|(k, q)| (k, [q[0], q[1]]))
                .collect(),
            server_cpu_us_per_request: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub product_ids: Vec<String>,
    pub stock: u64,
    pub users: u64,
    pub requests: u64,
    pub concurrency: u64,
    pub limit_per_user: u64,
    pub http: RunFigures,
    /// HTTP requests/s by the Redis server holding their sale (`single`
    /// without a cluster).
    pub http_per_node: BTreeMap<String, f64>,
    pub direct: Option<RunFigures>,
    /// HTTP requests/s ÷ direct requests/s.
    pub http_over_direct: Option<f64>,
    /// The HTTP floor (`--floor`): a bare server answering at once.
    pub floor: Option<RunFigures>,
    /// The script floor (`--floor`): a bare server calling the order script.
    pub floor_script: Option<RunFigures>,
    /// HTTP requests/s ÷ floor requests/s: the share of this machine's HTTP
    /// capacity the service keeps.
    pub http_over_floor: Option<f64>,
    /// HTTP requests/s ÷ script floor requests/s.
    pub http_over_floor_script: Option<f64>,
    /// Floor requests/s ÷ direct requests/s: the most any HTTP service could
    /// reach here, against the Redis limit.
    pub floor_over_direct: Option<f64>,
    /// Script floor requests/s ÷ direct requests/s.
    pub floor_script_over_direct: Option<f64>,
    /// The second sale, paced at `then_at` × the HTTP throughput.
    pub paced: Option<RunFigures>,
    pub paced_rate: Option<f64>,
    pub units_accepted: u64,
    pub expected_units: u64,
    /// CPU time (user + system) of this whole process during the HTTP burst:
    /// the load generator, and with `--local` the server and its workers
    /// (Linux only; 10 ms steps).
    pub http_cpu_ms: Option<f64>,
    /// `http_cpu_ms` per request, in µs.
    pub http_cpu_us_per_request: Option<f64>,
    /// From the end of the burst until the last accepted order was in MySQL.
    pub persisted_after_burst_ms: Option<u64>,
    /// Accepted orders ÷ time from the first persisted to the last (the
    /// workers persist while the burst runs).
    pub drain_orders_per_s: Option<f64>,
    /// `serve` instances the requests were spread over.
    pub instances: usize,
    /// The storm before the start (`--pre-start-secs`).
    pub pre_start: Option<RunFigures>,
    /// The crowd once sold out, for as long (`--pre-start-secs`).
    pub sold_out_phase: Option<RunFigures>,
    /// Pre-start answers/s ÷ sold-out answers/s (both from memory).
    pub pre_start_over_sold_out: Option<f64>,
    /// CPU time of the API instances per request of the pre-start storm,
    /// in µs (`--local` only: their runtimes' threads; Linux only).
    pub pre_start_api_cpu_us_per_request: Option<f64>,
    /// ... of the sold-out phase.
    pub sold_out_api_cpu_us_per_request: Option<f64>,
    /// Orders cancelled mid-sale (`--cancel-mid-sale`).
    pub cancelled_mid_sale: u64,
    /// What the crowd cost Redis (`None`: an instance's `/metrics` did not answer).
    pub redis_calls: Option<RedisCalls>,
    /// CPU time per request (and per persisted order) of each part of the
    /// system during the burst.
    pub cpu: CpuPerRequest,
    /// The sizing of a sale of this mix, from `cpu` (`--plan-*`).
    pub capacity: Capacity,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

/// The service under test, and how to reach its stores.
struct Target {
    /// The instances, as `host:port`.
    authorities: Vec<String>,
    token: String,
    sales: Sales,
    /// The Redis below `sales` (the floors and the direct runs use it).
    redis: Redis,
    db: Db,
    /// The buyers' bearer tokens (a JWT key configured), else none.
    tokens: Option<Arc<Tokens>>,
    /// Where the CPU time of each part is read.
    meters: cost::Meters,
    /// Keeps the in-process servers alive (`--local`).
    _servers: Vec<oneshot::Sender<()>>,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<Report> {
    let target = connect(&args).await?;
    let mix = Mix {
        requests: args.requests,
        users: args.users,
        repeat_share: args.repeat_share,
        retry_share: args.retry_share,
        seed: args.seed,
        sales: args.sales.max(1),
        limit_share: args.limit_share,
        unknown_share: args.unknown_share,
        stock: args.stock,
    };
    let plan = Arc::new(plan(mix));
    let n = args.sales.max(1);
    let expected: Vec<u64> = (0..n)
        .map(|k| expected_units(&plan, k, args.stock, args.limit_per_user))
        .collect();
    mint_tokens(&target, &plan, args.quiet).await?;

    let direct = if args.no_direct {
        None
    } else {
        Some(direct_run(&args, &target, plan.clone()).await?)
    };
    let (floor, floor_script) = if args.floor {
        let (constant, script) = floor_runs(&args, &target, plan.clone()).await?;
        (Some(constant), Some(script))
    } else {
        (None, None)
    };

    // With a pre-start storm, the sale opens once the storm is over.
    let pre_start_ms = args.pre_start_secs as i64 * 1000;
    let start_ms = if pre_start_ms > 0 {
        flashsale::domain::now_ms() + SETUP_MS + pre_start_ms
    } else {
        flashsale::domain::now_ms() - 1000
    };
    let products = Arc::new(new_sales(&args, &target, "rehearsal", start_ms).await?);
    if target.authorities.len() > 1 {
        // The other instances find the sale within their registry read's
        // lifetime (UNKNOWN_PRODUCT_CACHE_MS): open sales before their start.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
    }
    let reading_start = crowd::scrape(&target.authorities).await;
    let pre_plan = Arc::new(crowd::side_plan(
        mix,
        args.seed ^ 0x5eed,
        args.pre_start_secs,
    ));
    let pre_start = if pre_start_ms > 0 {
        // Stops sending 100 ms before the start: every answer is certainly "not started".
        let until = crowd::instant_at_ms(start_ms - 100);
        let run = timed_run(
            &args,
            &target,
            &products,
            pre_plan.clone(),
            until,
            "pre-start",
        )
        .await?;
        crowd::sleep_until_ms(start_ms).await;
        Some(run)
    } else {
        None
    };
    let reading_burst = crowd::scrape(&target.authorities).await;
    let remote_cpu = |c: Option<crowd::Counts>| c.map(|c| c.cpu_seconds).filter(|_| !args.local);
    let cost_start = target.meters.read(remote_cpu(reading_burst)).await;
    let started = Instant::now();
    let persisted = watch_persisted(target.db.clone(), products.clone());
    let cpu_before = super::cpu::process();
    let (http, cancelled) = burst(&args, &target, &products, &plan, &persisted).await?;
    let burst_end = Instant::now();
    let http_cpu = cpu_before
        .zip(super::cpu::process())
        .map(|(before, after)| after.saturating_sub(before));
    let reading_burst_end = crowd::scrape(&target.authorities).await;
    let cost_burst_end = target.meters.read(remote_cpu(reading_burst_end)).await;
    let orders: std::collections::HashSet<&str> = http
        .answers
        .iter()
        .filter_map(|a| match a {
            Answer::Accepted(id) => Some(id.as_str()),
            Answer::Refused(_) => None,
        })
        .collect();
    let drained = wait_drained(persisted, orders.len() as i64, args.drain_timeout_secs).await;
    let cost_drained = match drained {
        Some(_) => Some(target.meters.read(None).await),
        None => None,
    };
    let cpu = CpuPerRequest::new(
        cost_start,
        cost_burst_end,
        cost_drained,
        http.answers.len() as u64,
        orders.len() as u64,
    );
    let mut sold_out = true;
    for p in products.iter() {
        sold_out &= target.sales.ledger().stock(p).await? == Some(0);
    }
    let sold_out_phase = if pre_start_ms > 0 && sold_out {
        let until = Instant::now() + Duration::from_millis(pre_start_ms as u64);
        let plan = Arc::new(crowd::side_plan(
            mix,
            args.seed ^ 0x0ff,
            args.pre_start_secs,
        ));
        let run = timed_run(&args, &target, &products, plan.clone(), until, "sold-out").await?;
        Some((plan, run))
    } else {
        None
    };
    let reading_end = crowd::scrape(&target.authorities).await;
    let (pre_start, pre_start_cpu) = pre_start.unzip();
    let (sold_out_phase, sold_out_cpu) = sold_out_phase
        .map(|(plan, (run, cpu))| ((plan, run), cpu))
        .unzip();
    let persisted_after = drained.map(|p| p.last.saturating_duration_since(burst_end));
    // Rows per second from the first persisted row to the last (25 ms resolution).
    let drain_rate = drained.map(|p| {
        let span = p.last - p.first.unwrap_or(started);
        orders.len() as f64 / span.as_secs_f64().max(0.025)
    });
    let http_per_node = per_node(&target, &products, &plan, &http).await?;

    let (paced, paced_rate) = match args.then_at {
        Some(f) => {
            let rate = f * http.per_second();
            (
                Some(paced_run(&args, &target, plan.clone(), rate).await?),
                Some(rate),
            )
        }
        None => (None, None),
    };

    let mut checks = check_sales(
        &args, &target, &products, &plan, &http, &expected, &cancelled,
    )
    .await?;
    checks.push(crowd::phase_check(
        "made-up product ids answered product_not_found",
        &plan
            .iter()
            .filter(|p| p.unknown)
            .cloned()
            .collect::<Vec<_>>(),
        &plan
            .iter()
            .zip(&http.answers)
            .filter(|(p, _)| p.unknown)
            .map(|(_, a)| a.clone())
            .collect::<Vec<_>>(),
        &["product_not_found"],
    ));
    if let Some(run) = &pre_start {
        checks.push(crowd::phase_check(
            "before the start: every order answered sale_not_started",
            &pre_plan,
            &run.answers,
            &["sale_not_started"],
        ));
    }
    if let Some((plan, run)) = &sold_out_phase {
        // A buyer at the limit may hear that instead (from memory, once the
        // sold-out mark expired): both are true; Redis says sold_out first.
        checks.push(crowd::phase_check(
            "once sold out: every order answered sold_out (or limit_exceeded to a buyer at the limit)",
            plan,
            &run.answers,
            &["sold_out", "limit_exceeded"],
        ));
    }
    let pre_requests = pre_start.as_ref().map_or(0, |r| r.answers.len() as u64);
    let redis_calls = match (reading_start, reading_burst, reading_burst_end, reading_end) {
        (Some(start), Some(burst), Some(burst_end), Some(end)) => Some(RedisCalls::new(
            crowd::Readings {
                start,
                burst,
                burst_end,
                end,
            },
            pre_start.is_some(),
            sold_out_phase.is_some(),
            pre_requests + http.answers.len() as u64,
            orders.len() as u64,
            plan.iter()
                .filter(|p| p.key.is_some() && !p.unknown)
                .count() as u64,
        )),
        _ => None,
    };
    let pre_start = pre_start.as_ref().map(RunFigures::from);
    let sold_out_phase = sold_out_phase.map(|(_, run)| RunFigures::from(&run));
    let http_figures = RunFigures::from(&http);
    let report = Report {
        product_ids: products.iter().map(|p| p.to_string()).collect(),
        stock: args.stock,
        users: args.users,
        requests: args.requests,
        concurrency: args.concurrency,
        limit_per_user: args.limit_per_user,
        http_over_direct: direct
            .as_ref()
            .map(|d| http_figures.requests_per_s / d.requests_per_s),
        http_over_floor: ratio(Some(&http_figures), floor.as_ref()),
        http_over_floor_script: ratio(Some(&http_figures), floor_script.as_ref()),
        floor_over_direct: ratio(floor.as_ref(), direct.as_ref()),
        floor_script_over_direct: ratio(floor_script.as_ref(), direct.as_ref()),
        http: http_figures,
        http_per_node,
        direct,
        floor,
        floor_script,
        paced,
        paced_rate,
        units_accepted: orders.len() as u64,
        expected_units: expected.iter().sum(),
        http_cpu_ms: http_cpu.map(|d| d.as_secs_f64() * 1e3),
        http_cpu_us_per_request: http_cpu
            .map(|d| d.as_secs_f64() * 1e6 / http.answers.len().max(1) as f64),
        persisted_after_burst_ms: persisted_after.map(|d| d.as_millis() as u64),
        drain_orders_per_s: drain_rate,
        instances: target.authorities.len(),
        pre_start_over_sold_out: ratio(pre_start.as_ref(), sold_out_phase.as_ref()),
        pre_start_api_cpu_us_per_request: pre_start_cpu.flatten(),
        sold_out_api_cpu_us_per_request: sold_out_cpu.flatten(),
        pre_start,
        sold_out_phase,
        cancelled_mid_sale: cancelled.len() as u64,
        redis_calls,
        capacity: Capacity::plan(&cpu, args.plan.demand(args.stock, args.shards)),
        cpu,
        checks,
    };
    if report.ok() && !args.keep {
        for p in products.iter() {
            cleanup(&target, p).await?;
        }
    }
    Ok(report)
}

/// Mints every planned buyer's token before the burst (signing is not timed).
async fn mint_tokens(target: &Target, plan: &[Planned], quiet: bool) -> anyhow::Result<()> {
    let Some(tokens) = &target.tokens else {
        return Ok(());
    };
    let t = Instant::now();
    let minted = tokens.mint_all(plan.iter().map(|p| p.user)).await?;
    if !quiet && minted > 0 {
        eprintln!(
            "minted {minted} {:?} tokens in {:.1} s (before the burst, untimed)",
            tokens.algorithm(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The same plan on fresh sales at `rate` requests/s, drained and removed.
async fn paced_run(
    args: &BenchArgs,
    target: &Target,
    plan: Arc<Vec<Planned>>,
    rate: f64,
) -> anyhow::Result<RunFigures> {
    let now = flashsale::domain::now_ms();
    let products = Arc::new(new_sales(args, target, "paced", now - 1000).await?);
    let run = http_run(args, target, &products, plan, Some(rate), "paced").await?;
    let accepted = run.outcomes().get("accepted").copied().unwrap_or(0);
    let persisted = watch_persisted(target.db.clone(), products.clone());
    wait_drained(persisted, accepted as i64, args.drain_timeout_secs).await;
    for p in products.iter() {
        cleanup(target, p).await?;
    }
    Ok(RunFigures::from(&run))
}

/// Each sale's books against what its buyers were told.
async fn check_sales(
    args: &BenchArgs,
    target: &Target,
    products: &[ProductId],
    plan: &[Planned],
    http: &LoadRun,
    expected: &[u64],
    cancelled: &[String],
) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    for (k, product) in products.iter().enumerate() {
        let (plan_k, answers_k): (Vec<Planned>, Vec<Answer>) = plan
            .iter()
            .zip(&http.answers)
            .filter(|(p, _)| p.sale == k && !p.unknown)
            .map(|(p, a)| (p.clone(), a.clone()))
            .unzip();
        let prefix = format!("{product}:");
        let cancelled_k = cancelled
            .iter()
            .filter(|id| id.starts_with(&prefix))
            .count() as u64;
        let mut sale_checks = verify(
            args,
            target,
            product,
            &plan_k,
            &answers_k,
            expected[k],
            cancelled_k,
        )
        .await?;
        if products.len() > 1 {
            for c in &mut sale_checks {
                c.detail = format!("{product}: {}", c.detail);
            }
        }
        checks.extend(sale_checks);
    }
    Ok(checks)
}

/// Creates and opens `--sales` sales, starting at `start_ms`.
async fn new_sales(
    args: &BenchArgs,
    t: &Target,
    tag: &str,
    start_ms: i64,
) -> anyhow::Result<Vec<ProductId>> {
    let mut products = Vec::new();
    for _ in 0..args.sales.max(1) {
        let p = new_product(tag);
        create_sale(args, t, &p, start_ms).await?;
        products.push(p);
    }
    Ok(products)
}

/// From creating the sales to the pre-start storm (the other instances
/// learn of the sale meanwhile).
const SETUP_MS: i64 = 1_500;

/// The burst; with `--cancel-mid-sale`, in two halves with cancellations
/// through the last instance between them. The run, and the ids cancelled.
async fn burst(
    args: &BenchArgs,
    t: &Target,
    products: &Arc<Vec<ProductId>>,
    plan: &Arc<Vec<Planned>>,
    persisted: &watch::Receiver<Persisted>,
) -> anyhow::Result<(LoadRun, Vec<String>)> {
    if args.cancel_mid_sale == 0 {
        let run = http_run(args, t, products, plan.clone(), args.rate, "http").await?;
        return Ok((run, Vec::new()));
    }
    let half = plan.len() / 2;
    let first = Arc::new(plan[..half].to_vec());
    let mut run = http_run(args, t, products, first, args.rate, "http 1/2").await?;
    // Persisted first, so that each cancel gives its units back at once.
    let accepted: Vec<(&str, u64)> = {
        let mut seen = std::collections::HashSet::new();
        plan.iter()
            .zip(&run.answers)
            .filter_map(|(p, a)| match a {
                Answer::Accepted(id) if seen.insert(id.as_str()) => Some((id.as_str(), p.user)),
                _ => None,
            })
            .collect()
    };
    let drained = wait_drained(
        persisted.clone(),
        accepted.len() as i64,
        args.drain_timeout_secs,
    )
    .await;
    anyhow::ensure!(
        drained.is_some(),
        "the first half was not persisted in time"
    );
    let last = t.authorities.last().map_or("", String::as_str);
    let mut conn = Conn::open(last).await?;
    let mut cancelled = Vec::new();
    for (id, user) in accepted.iter().take(args.cancel_mid_sale as usize) {
        let bearer = t.tokens.as_ref().map(|tk| tk.bearer(*user)).transpose()?;
        let headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("authorization", &**b)).collect();
        let path = format!("/api/orders/{id}/cancel");
        let body = json!({ "user_id": user }).to_string();
        let (status, reply) = conn.send(Method::POST, &path, &headers, Some(body)).await?;
        anyhow::ensure!(
            status == StatusCode::OK,
            "cancelling {id}: {status} {reply:?}"
        );
        cancelled.push((*id).to_owned());
    }
    let second = Arc::new(plan[half..].to_vec());
    let rest = http_run(args, t, products, second, args.rate, "http 2/2").await?;
    run.elapsed += rest.elapsed;
    let _ = run.latency.add(&rest.latency);
    run.answers.extend(rest.answers);
    run.latencies_us.extend(rest.latencies_us);
    Ok((run, cancelled))
}

/// `plan` over HTTP until `until`; the run, and the API instances' CPU time
/// per request (µs; `--local` only).
async fn timed_run(
    args: &BenchArgs,
    t: &Target,
    products: &Arc<Vec<ProductId>>,
    plan: Arc<Vec<Planned>>,
    until: Instant,
    label: &str,
) -> anyhow::Result<(LoadRun, Option<f64>)> {
    let callers = http_callers(args, &t.authorities, products, &t.tokens).await?;
    let before = t.meters.read(None).await.api;
    let label = (!args.quiet).then_some(label);
    let run = drive_until(plan, callers, None, Some(until), label).await;
    let per_request = |spent: Duration| spent.as_secs_f64() * 1e6 / run.answers.len().max(1) as f64;
    let after = t.meters.read(None).await.api;
    let cpu = before
        .zip(after)
        .map(|(b, a)| per_request(Duration::from_secs_f64((a - b).max(0.0))));
    Ok((run, cpu))
}

/// HTTP requests per second, by the Redis server holding each request's sale.
async fn per_node(
    t: &Target,
    products: &[ProductId],
    plan: &[Planned],
    run: &LoadRun,
) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut node_of_sale = Vec::new();
    for p in products {
        node_of_sale
            .push(flashsale::bench_support::node_of(&t.redis, &t.sales.keys(p).orders).await?);
    }
    let mut per_node: BTreeMap<String, f64> = BTreeMap::new();
    for p in plan.iter().take(run.answers.len()).filter(|p| !p.unknown) {
        *per_node.entry(node_of_sale[p.sale].clone()).or_default() += 1.0;
    }
    for v in per_node.values_mut() {
        *v /= run.elapsed.as_secs_f64();
    }
    Ok(per_node)
}

/// `flashsale-bench rehearse`: runs, prints, and fails on any violated check.
pub async fn run_cli(args: BenchArgs) -> anyhow::Result<()> {
    let json = args.json;
    let report = run(args).await?;
    super::show(json, &report, print_report)?;
    anyhow::ensure!(
        report.ok(),
        "the books do not balance: see the failed checks"
    );
    Ok(())
}

async fn connect(args: &BenchArgs) -> anyhow::Result<Target> {
    // The bench's own handles, beside the server's: patient, few connections.
    let redis = Redis::from_settings(&RedisSettings {
        timeout: Duration::from_secs(5),
        pool_size: 4,
        ..(&args.redis).into()
    })?;
    let sales = Sales::new(
        redis.clone(),
        args.redis.key_prefix.clone(),
        MemorySettings::default(),
        None,
    );
    let db = Db::from_settings(&DbSettings {
        timeout: Duration::from_secs(10),
        max_connections: 4,
        ..(&args.db).into()
    })?;
    db.create_and_migrate().await?;
    let tokens = match (&args.tokens, &args.jwt_secret, &args.jwt_private_key) {
        (Some(tokens), _, _) => Some(tokens.clone()),
        (None, Some(secret), _) => Some(Arc::new(Tokens::hmac(secret, args.jwt_algorithm)?)),
        (None, None, Some(pem)) => Some(Arc::new(Tokens::from_pem(pem, args.jwt_algorithm)?)),
        (None, None, None) => None,
    };
    let mut meters = cost::Meters {
        redis: args
            .redis
            .redis_cluster_nodes
            .is_none()
            .then(|| redis.clone()),
        mysql_pid: cost::local_mysql_pid(&args.db.database_url),
        ..cost::Meters::default()
    };
    let (authorities, token, servers) = if args.local {
        let local = serve_locally(args).await?;
        meters.api = Some(local.api);
        meters.workers = Some(local.workers);
        (local.authorities, local.token, local.stops)
    } else {
        let mut authorities = Vec::new();
        for url in &args.url {
            let url = url::Url::parse(url)?;
            authorities.push(format!(
                "{}:{}",
                url.host_str().unwrap_or("127.0.0.1"),
                url.port_or_known_default().unwrap_or(80)
            ));
        }
        anyhow::ensure!(!authorities.is_empty(), "--url: no instance to rehearse");
        let token = args.admin_token.clone().ok_or_else(|| {
            anyhow::anyhow!("ADMIN_TOKEN (or --admin-token) is needed to create the sale")
        })?;
        (authorities, token, Vec::new())
    };
    Ok(Target {
        authorities,
        token,
        sales,
        redis,
        db,
        tokens,
        meters,
        _servers: servers,
    })
}

/// The `--local` servers: their addresses, their admin token, what keeps
/// them running, and their threads (for their CPU time).
struct LocalServers {
    authorities: Vec<String>,
    token: String,
    stops: Vec<oneshot::Sender<()>>,
    api: ThreadGroup,
    workers: ThreadGroup,
}

/// `--local`: `--instances` independent `serve`s (`WORKERS=false`) and the
/// stream workers, in this process, each on a runtime of its own so that
/// their CPU time is measured apart from the load generator's.
async fn serve_locally(args: &BenchArgs) -> anyhow::Result<LocalServers> {
    let token = uuid::Uuid::now_v7().simple().to_string();
    let (api, workers) = (ThreadGroup::default(), ThreadGroup::default());
    let (mut authorities, mut stops) = (Vec::new(), Vec::new());
    for _ in 0..args.instances.max(1) {
        let settings = Settings {
            redis: (&args.redis).into(),
            db: (&args.db).into(),
            http: HttpSettings {
                listen_addr: "127.0.0.1:0".parse()?,
                admin_token: Some(token.as_str().into()),
                admin_routes: true,
                dashboard_session: Duration::from_secs(900),
                connections: flashsale::config::ConnectionArgs::settings(),
                auth: local_auth(args)?,
                limits: args.limits.clone().unwrap_or_else(Limits::unlimited),
                memory: args.memory.settings(),
                payments: None,
            },
            workers: None,
        };
        let (authority, stop) = serve_on_own_runtime(settings, api.clone()).await?;
        authorities.push(authority);
        stops.push(stop);
    }
    let settings = WorkerSettings {
        redis: (&args.redis).into(),
        db: (&args.db).into(),
        worker: Default::default(),
        metrics_addr: None,
        connections: flashsale::config::ConnectionArgs::settings(),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    on_own_runtime(workers.clone(), async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        if let Err(e) = flashsale::app::run_workers(&settings, shutdown).await {
            eprintln!("the bench's workers stopped: {e}");
        }
    })?;
    stops.push(stop);
    Ok(LocalServers {
        authorities,
        token,
        stops,
        api,
        workers,
    })
}

/// `serve` with `settings`, in this process on a runtime of its own whose
/// threads join `group`, once its database is ready: its address, and what
/// stops it.
pub(crate) async fn serve_on_own_runtime(
    settings: Settings,
    group: ThreadGroup,
) -> anyhow::Result<(String, oneshot::Sender<()>)> {
    let (ready, bound) = oneshot::channel();
    let (stop, stopped) = oneshot::channel::<()>();
    on_own_runtime(group, async move {
        let app = match flashsale::app::App::build(&settings).await {
            Ok(app) => app,
            Err(e) => {
                let _ = ready.send(Err(anyhow::Error::from(e)));
                return;
            }
        };
        let authority = app.local_addr().map(|a| a.to_string());
        let db = app.db().clone();
        let served = tokio::spawn(app.run(async {
            let _ = stopped.await;
        }));
        db.wait_ready().await;
        let _ = ready.send(authority.map_err(anyhow::Error::from));
        let _ = served.await;
    })?;
    Ok((bound.await??, stop))
}

/// Runs `work` on a runtime of its own, on a thread of its own, every thread
/// of which joins `group` (kept alive: an exited thread's time is lost).
fn on_own_runtime(
    group: ThreadGroup,
    work: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let on_start = group.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(Duration::from_secs(3600))
        .on_thread_start(move || on_start.register_current())
        .build()?;
    std::thread::Builder::new()
        .name("bench-server".into())
        .spawn(move || {
            group.register_current();
            runtime.block_on(work);
        })?;
    Ok(())
}

/// How the `--local` server identifies buyers: with the bench's JWT key
/// (its public half for a key pair), else not at all (`AUTH=none`).
fn local_auth(args: &BenchArgs) -> anyhow::Result<AuthSettings> {
    let verify = |s: AuthSettings| AuthSettings {
        jwt_algorithm: args.jwt_algorithm,
        token_cache_entries: args.token_cache,
        ..s
    };
    Ok(match (&args.jwt_secret, &args.jwt_private_key) {
        (Some(secret), _) => verify(AuthSettings::hmac(secret)),
        (None, Some(_)) => verify(AuthSettings {
            jwt_public_key_file: Some(args.jwt_public_key.clone().ok_or_else(|| {
                anyhow::anyhow!("--local with --jwt-private-key needs --jwt-public-key")
            })?),
            ..AuthSettings::default()
        }),
        (None, None) => AuthSettings::off(),
    })
}

fn new_product(tag: &str) -> ProductId {
    let id = format!("{tag}-{}", uuid::Uuid::now_v7().simple());
    ProductId::parse(&id).unwrap_or_else(|_| unreachable!("generated ids are valid"))
}

/// Creates and opens the sale through the admin API (of the first
/// instance), its window opening at `start_ms` for an hour.
async fn create_sale(
    args: &BenchArgs,
    t: &Target,
    product: &ProductId,
    start_ms: i64,
) -> anyhow::Result<()> {
    let body = json!({
        "product_id": product.as_str(), "title": "flashsale-bench rehearse rehearsal", "price": "1.00",
        "available_qty": args.stock, "start_time": start_ms, "end_time": start_ms + 3_600_000,
        "limit_per_user": args.limit_per_user, "stock_shards": args.shards,
    });
    let mut conn = Conn::open(&t.authorities[0]).await?;
    let auth = format!("Bearer {}", t.token);
    let headers = [("authorization", auth.as_str())];
    let (status, body) = conn
        .send(
            Method::POST,
            "/api/admin/products",
            &headers,
            Some(body.to_string()),
        )
        .await?;
    anyhow::ensure!(
        status == StatusCode::CREATED,
        "creating the product: {status} {body:?}"
    );
    let path = format!("/api/admin/products/{product}/open");
    let (status, body) = conn.send(Method::POST, &path, &headers, None).await?;
    anyhow::ensure!(
        status == StatusCode::OK,
        "opening the sale: {status} {body:?}"
    );
    Ok(())
}

async fn http_run(
    args: &BenchArgs,
    t: &Target,
    products: &Arc<Vec<ProductId>>,
    plan: Arc<Vec<Planned>>,
    rate: Option<f64>,
    label: &str,
) -> anyhow::Result<LoadRun> {
    let callers = http_callers(args, &t.authorities, products, &t.tokens).await?;
    Ok(drive(plan, callers, rate, (!args.quiet).then_some(label)).await)
}

/// One keep-alive connection per unit of `--concurrency`, spread over `authorities`.
async fn http_callers(
    args: &BenchArgs,
    authorities: &[String],
    products: &Arc<Vec<ProductId>>,
    tokens: &Option<Arc<Tokens>>,
) -> anyhow::Result<Vec<HttpCaller>> {
    let mut callers = Vec::new();
    for c in 0..args.concurrency.max(1) as usize {
        let authority = &authorities[c % authorities.len().max(1)];
        callers.push(HttpCaller {
            authority: authority.to_owned(),
            products: products.clone(),
            key_prefix: "bench-".into(),
            conn: Some(Conn::open(authority).await?),
            tokens: tokens.clone(),
        });
    }
    Ok(callers)
}

fn ratio(a: Option<&RunFigures>, b: Option<&RunFigures>) -> Option<f64> {
    Some(a?.requests_per_s / b?.requests_per_s)
}

/// The same plan against the two HTTP floors (see [`super::floor`]); the
/// script floor on sales of its own under the benchmark key prefix.
async fn floor_runs(
    args: &BenchArgs,
    t: &Target,
    plan: Arc<Vec<Planned>>,
) -> anyhow::Result<(RunFigures, RunFigures)> {
    let dummies = (0..args.sales.max(1))
        .map(|_| new_product("floor"))
        .collect();
    let constant = floor_run(
        args,
        t,
        Kind::Constant,
        Arc::new(dummies),
        plan.clone(),
        "floor",
    )
    .await?;
    let prefix = super::bench_prefix(&args.redis.key_prefix);
    let sales = Sales::new(
        t.redis.clone(),
        prefix.clone(),
        MemorySettings::default(),
        None,
    );
    let products = open_bench_sales(args, &sales, "floor").await?;
    let kind = Kind::Script {
        redis: args.redis.target(),
        prefix,
    };
    let script = floor_run(args, t, kind, products.clone(), plan, "script").await;
    for product in products.iter() {
        super::remove_sale_keys(&sales, product).await?;
    }
    Ok((constant, script?))
}

async fn floor_run(
    args: &BenchArgs,
    t: &Target,
    kind: Kind,
    products: Arc<Vec<ProductId>>,
    plan: Arc<Vec<Planned>>,
    label: &str,
) -> anyhow::Result<RunFigures> {
    let floor = Floor::start(kind)?;
    // The same requests, tokens included (the floors ignore them).
    let callers = http_callers(args, &[floor.authority().to_owned()], &products, &t.tokens).await?;
    let before = floor.cpu();
    let run = drive(plan, callers, args.rate, (!args.quiet).then_some(label)).await;
    let spent = before.zip(floor.cpu()).map(|(b, a)| a.saturating_sub(b));
    // Stopping joins its thread: not on this runtime's worker.
    tokio::task::spawn_blocking(move || drop(floor)).await?;
    let mut figures = RunFigures::from(&run);
    figures.server_cpu_us_per_request =
        spent.map(|d| d.as_secs_f64() * 1e6 / run.answers.len().max(1) as f64);
    Ok(figures)
}

/// Opens `--sales` sales straight in Redis (no product row), always in
/// their window, with the rehearsal's stock and limit.
async fn open_bench_sales(
    args: &BenchArgs,
    sales: &Sales,
    tag: &str,
) -> anyhow::Result<Arc<Vec<ProductId>>> {
    let spec = SaleSpec {
        stock: args.stock,
        start_ms: 0,
        end_ms: flashsale::domain::MAX_TIME_MS,
        limit_per_user: args.limit_per_user,
        price: rust_decimal::Decimal::ONE,
        waiting_room: None,
        paused_ms: None,
        shards: args.shards.max(1),
    };
    let products: Vec<ProductId> = (0..args.sales.max(1))
        .map(|_| super::bench_product(tag))
        .collect();
    for product in &products {
        sales.lifecycle().open(product, &spec).await?;
    }
    Ok(Arc::new(products))
}

/// The same plan through the order script, on a sale of its own under the
/// benchmark key prefix (so no worker drains it), without the sold-out marker.
async fn direct_run(
    args: &BenchArgs,
    t: &Target,
    plan: Arc<Vec<Planned>>,
) -> anyhow::Result<RunFigures> {
    let sales = Sales::new(
        t.redis.clone(),
        super::bench_prefix(&args.redis.key_prefix),
        MemorySettings::off(),
        None,
    );
    let products = open_bench_sales(args, &sales, "direct").await?;
    let callers = (0..args.concurrency.max(1))
        .map(|_| DirectCaller {
            sales: sales.clone(),
            products: products.clone(),
            key_prefix: "k".into(),
        })
        .collect();
    let run = drive(plan, callers, args.rate, (!args.quiet).then_some("direct")).await;
    for product in products.iter() {
        super::remove_sale_keys(&sales, product).await?;
    }
    Ok(RunFigures::from(&run))
}

/// What the MySQL poller saw: the row count, when the first row and when
/// the latest change were seen.
#[derive(Debug, Clone, Copy)]
struct Persisted {
    rows: i64,
    first: Option<Instant>,
    last: Instant,
}

/// Counts the sale's rows in MySQL every 25 ms, from before the burst (the
/// workers persist while it runs).
fn watch_persisted(db: Db, products: Arc<Vec<ProductId>>) -> watch::Receiver<Persisted> {
    let start = Persisted {
        rows: 0,
        first: None,
        last: Instant::now(),
    };
    let (tx, rx) = watch::channel(start);
    tokio::spawn(async move {
        while !tx.is_closed() {
            let mut query = sqlx::QueryBuilder::<sqlx::MySql>::new(
                "SELECT COUNT(*) FROM tb_order WHERE product_id IN (",
            );
            let mut ids = query.separated(", ");
            for p in products.iter() {
                ids.push_bind(p.as_str());
            }
            query.push(")");
            let count: Result<i64, _> = query
                .build_query_scalar()
                .fetch_one(flashsale::bench_support::pool(&db))
                .await;
            if let Ok(n) = count {
                tx.send_if_modified(|seen| {
                    let changed = seen.rows != n;
                    if changed {
                        let now = Instant::now();
                        *seen = Persisted {
                            rows: n,
                            first: seen.first.or(Some(now)),
                            last: now,
                        };
                    }
                    changed
                });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    });
    rx
}

/// Waits until `orders` rows are persisted.
async fn wait_drained(
    mut persisted: watch::Receiver<Persisted>,
    orders: i64,
    timeout_secs: u64,
) -> Option<Persisted> {
    let reached = persisted.wait_for(|p| p.rows >= orders);
    match tokio::time::timeout(Duration::from_secs(timeout_secs), reached).await {
        Ok(Ok(seen)) => Some(*seen),
        _ => None,
    }
}

/// One sale's checks: what its buyers were told, then its books.
async fn verify(
    args: &BenchArgs,
    t: &Target,
    product: &ProductId,
    plan: &[Planned],
    answers: &[Answer],
    expected: u64,
    cancelled: u64,
) -> anyhow::Result<Vec<Check>> {
    let mut checks = answer_checks(plan, answers, expected, cancelled);
    let accepted = accepted_ids(answers).len() as u64; // quantity 1 each
    checks.extend(books_checks(args, t, product, accepted, cancelled).await?);
    Ok(checks)
}

/// The order ids the buyers were told (202).
fn accepted_ids(answers: &[Answer]) -> std::collections::HashSet<&str> {
    answers
        .iter()
        .filter_map(|a| match a {
            Answer::Accepted(id) => Some(id.as_str()),
            Answer::Refused(_) => None,
        })
        .collect()
}

/// What the answers alone must show: the units the plan can buy were sold
/// (`cancelled` of them came back and were sold again), every request was
/// answered, and a retry under a key got its first order.
fn answer_checks(
    plan: &[Planned],
    answers: &[Answer],
    expected: u64,
    cancelled: u64,
) -> Vec<Check> {
    let sold = (accepted_ids(answers).len() as u64).saturating_sub(cancelled);
    // Requests shed or rate-limited were never decided: fewer units may sell.
    let undecided = answers
        .iter()
        .filter(|a| matches!(a, Answer::Refused(c) if c == "overloaded" || c == "rate_limited"))
        .count();
    let failures = answers
        .iter()
        .filter(|a| matches!(a, Answer::Refused(c) if c == "transport" || c == "unavailable" || c.starts_with("http_5")))
        .count();
    let mut by_key: HashMap<usize, Vec<&Answer>> = HashMap::new();
    for (p, a) in plan.iter().zip(answers) {
        if let Some(k) = p.key {
            by_key.entry(k).or_default().push(a);
        }
    }
    let split = by_key
        .values()
        .filter(|answers| {
            let ids: std::collections::HashSet<&str> = answers
                .iter()
                .filter_map(|a| match a {
                    Answer::Accepted(id) => Some(id.as_str()),
                    Answer::Refused(_) => None,
                })
                .collect();
            ids.len() > 1
        })
        .count();
    vec![
        Check {
            name: "units accepted == min(stock, demand within the per-user limit), <= if requests were shed",
            ok: if undecided == 0 {
                sold == expected
            } else {
                sold <= expected
            },
            detail: format!(
                "{sold} accepted and kept ({cancelled} more cancelled), {expected} expected, {undecided} shed or rate-limited"
            ),
        },
        Check {
            name: "every request answered",
            ok: failures == 0,
            detail: format!("{failures} without an answer or with a 5xx"),
        },
        Check {
            name: "idempotent retries got one order per key",
            ok: split == 0,
            detail: format!(
                "{split} keys with more than one order, {} keys",
                by_key.len()
            ),
        },
    ]
}

/// What MySQL and Redis must hold after `accepted` one-unit orders, of
/// which `cancelled` were cancelled.
async fn books_checks(
    args: &BenchArgs,
    t: &Target,
    product: &ProductId,
    accepted: u64,
    cancelled: u64,
) -> anyhow::Result<Vec<Check>> {
    let sold = accepted - cancelled.min(accepted);
    let mut checks = Vec::new();
    let mut check = |name, ok, detail: String| checks.push(Check { name, ok, detail });
    let (rows, distinct, units): (i64, i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(DISTINCT order_id), \
         CAST(COALESCE(SUM(CASE WHEN status = 'cancelled' THEN 0 ELSE quantity END), 0) AS SIGNED) \
         FROM tb_order WHERE product_id = ?",
    )
    .bind(product.as_str())
    .fetch_one(flashsale::bench_support::pool(&t.db))
    .await?;
    check(
        "tb_order rows == accepted orders",
        rows as u64 == accepted && units as u64 == sold,
        format!(
            "{rows} rows ({units} units not cancelled) for {accepted} accepted orders, {cancelled} cancelled"
        ),
    );
    check(
        "no duplicate order ids",
        distinct == rows,
        format!("{distinct} distinct of {rows}"),
    );
    let over: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT user_id FROM tb_order WHERE product_id = ? \
         AND status <> 'cancelled' GROUP BY user_id HAVING SUM(quantity) > ?) o",
    )
    .bind(product.as_str())
    .bind(args.limit_per_user as i64)
    .fetch_one(flashsale::bench_support::pool(&t.db))
    .await?;
    check(
        "no user over the limit",
        over == 0,
        format!("{over} users over {}", args.limit_per_user),
    );
    let stock = t.sales.ledger().stock(product).await?.unwrap_or(0);
    check(
        "redis stock + units sold == stock",
        stock + sold == args.stock,
        format!("{stock} + {sold} vs {}", args.stock),
    );
    let available: i64 =
        sqlx::query_scalar("SELECT available_qty FROM tb_product WHERE product_id = ?")
            .bind(product.as_str())
            .fetch_one(flashsale::bench_support::pool(&t.db))
            .await?;
    check(
        "tb_product.available_qty == stock - sold",
        available == args.stock as i64 - sold as i64,
        format!("{available} vs {}", args.stock as i64 - sold as i64),
    );
    Ok(checks)
}

/// Removes the rehearsal's rows, product, keys and registry entry.
async fn cleanup(t: &Target, product: &ProductId) -> anyhow::Result<()> {
    for sql in [
        "DELETE FROM tb_order WHERE product_id = ?",
        "DELETE FROM tb_product WHERE product_id = ?",
    ] {
        sqlx::query(sql)
            .bind(product.as_str())
            .execute(flashsale::bench_support::pool(&t.db))
            .await?;
    }
    super::remove_sale_keys(&t.sales, product).await?;
    Ok(())
}

fn print_report(r: &Report) {
    let run = |name: &str, f: &RunFigures| {
        let l = &f.latency_ms;
        println!(
            "{name:<8} {:>9.0} req/s  {:>7} requests in {:>6} ms  latency ms p50 {:.2} p90 {:.2} p99 {:.2} p99.9 {:.2} max {:.2}",
            f.requests_per_s,
            f.requests,
            f.elapsed_ms,
            l["p50"],
            l["p90"],
            l["p99"],
            l["p99.9"],
            l["max"]
        );
        let outcomes: Vec<String> = f.outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("{:<8} {}", "", outcomes.join(", "));
    };
    println!(
        "sales {}: stock {} each, {} users, {} requests, concurrency {}, limit {} per user",
        r.product_ids.join(", "),
        r.stock,
        r.users,
        r.requests,
        r.concurrency,
        r.limit_per_user
    );
    if r.instances > 1 {
        println!("over {} instances", r.instances);
    }
    if let Some(pre) = &r.pre_start {
        run("pre", pre);
    }
    run("http", &r.http);
    if let Some(after) = &r.sold_out_phase {
        run("soldout", after);
    }
    if let Some(ratio) = r.pre_start_over_sold_out {
        println!("pre-start answers/s ÷ sold-out answers/s: {ratio:.2}");
    }
    if let (Some(pre), Some(after)) = (
        r.pre_start_api_cpu_us_per_request,
        r.sold_out_api_cpu_us_per_request,
    ) {
        let floor = r
            .floor
            .as_ref()
            .and_then(|f| f.server_cpu_us_per_request)
            .map_or(String::new(), |f| format!("; constant floor {f:.1} µs"));
        println!("API CPU per request: pre-start {pre:.1} µs, sold-out {after:.1} µs{floor}");
    }
    if r.cancelled_mid_sale > 0 {
        println!(
            "{} orders cancelled mid-sale through the last instance",
            r.cancelled_mid_sale
        );
    }
    if let Some(c) = &r.redis_calls {
        let phase = |name: &str, p: &crowd::Counts| {
            println!(
                "{name:<8} redis: {} order scripts, {} memory reads; answered {} from memory, {} by redis",
                p.scripts, p.memory_reads, p.by_memory, p.by_redis
            );
        };
        if let Some(p) = &c.pre_start {
            phase("pre", p);
        }
        phase("http", &c.burst);
        if let Some(p) = &c.sold_out {
            phase("soldout", p);
        }
        println!(
            "redis calls of the order path: {:.4} per request, {:.2} per accepted order (pre-start and burst); {:.4} per request without an Idempotency-Key ({} keyed requests, which always reach Redis)",
            c.per_request, c.per_accepted_order, c.per_unkeyed_request, c.keyed_requests
        );
    }
    let us = |v: Option<f64>| v.map_or("not measured".to_owned(), |v| format!("{v:.1} µs"));
    println!(
        "CPU per request of the burst: API {}, Redis {}, load generator {}; per persisted order: workers {}, MySQL {}",
        us(r.cpu.api_us_per_request),
        us(r.cpu.redis_us_per_request),
        us(r.cpu.generator_us_per_request),
        us(r.cpu.workers_us_per_order),
        us(r.cpu.mysql_us_per_order),
    );
    println!(
        "CPU per accepted order (the mix's refusals included): API {}, Redis {}, workers {}, MySQL {}; the whole system {}",
        us(r.cpu.api_us_per_accepted_order),
        us(r.cpu.redis_us_per_accepted_order),
        us(r.cpu.workers_us_per_order),
        us(r.cpu.mysql_us_per_order),
        us(r.cpu.system_us_per_accepted_order),
    );
    if let (Some(ms), Some(us)) = (r.http_cpu_ms, r.http_cpu_us_per_request) {
        println!(
            "{:<8} CPU {ms:.0} ms during the burst, {us:.1} µs per request (this whole process)",
            ""
        );
    }
    if r.http_per_node.len() > 1 {
        let nodes: Vec<String> = r
            .http_per_node
            .iter()
            .map(|(n, v)| format!("{n} {v:.0}"))
            .collect();
        println!("{:<8} req/s by Redis master: {}", "", nodes.join(", "));
    }
    if let (Some(d), Some(ratio)) = (&r.direct, r.http_over_direct) {
        run("direct", d);
        println!("http / direct throughput: {ratio:.2}");
    }
    if let (Some(f), Some(s)) = (&r.floor, &r.floor_script) {
        run("floor", f);
        run("script", s);
        let cpu = |f: &RunFigures| f.server_cpu_us_per_request;
        if let (Some(api), Some(constant), Some(script)) =
            (r.cpu.api_us_per_request, cpu(f), cpu(s))
        {
            println!(
                "server CPU per request: service {api:.1} µs, constant floor {constant:.1} µs, script floor {script:.1} µs; service / floor {:.2}, service / script floor {:.2}",
                api / constant,
                api / script
            );
        }
        let ratios = [
            ("http / floor", r.http_over_floor),
            ("http / script", r.http_over_floor_script),
            ("floor / direct", r.floor_over_direct),
            ("script / direct", r.floor_script_over_direct),
        ];
        let ratios: Vec<String> = ratios
            .iter()
            .filter_map(|(name, v)| v.map(|v| format!("{name} {v:.2}")))
            .collect();
        println!("throughput ratios: {}", ratios.join(", "));
    }
    if let (Some(p), Some(rate)) = (&r.paced, r.paced_rate) {
        println!("paced at {rate:.0} req/s:");
        run("paced", p);
    }
    for line in r.capacity.lines(&r.cpu) {
        println!("{line}");
    }
    match (r.persisted_after_burst_ms, r.drain_orders_per_s) {
        (Some(ms), Some(rate)) => println!(
            "{} units accepted; last order persisted {ms} ms after the burst; drain {rate:.0} orders/s",
            r.units_accepted
        ),
        _ => println!(
            "{} units accepted; NOT all persisted before the timeout",
            r.units_accepted
        ),
    }
    for c in &r.checks {
        println!(
            "[{}] {}: {}",
            if c.ok { " ok " } else { "FAIL" },
            c.name,
            c.detail
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(user: u64, key: Option<usize>) -> Planned {
        Planned {
            sale: 0,
            user,
            key,
            retry_of: None,
            unknown: false,
        }
    }

    fn failed(checks: &[Check]) -> Vec<&'static str> {
        checks.iter().filter(|c| !c.ok).map(|c| c.name).collect()
    }

    #[test]
    fn the_answers_show_what_sold_what_failed_and_a_split_key() {
        let plan = [planned(1, Some(0)), planned(2, None), planned(1, Some(0))];
        let ok = [
            Answer::Accepted("a".into()),
            Answer::Refused("sold_out".into()),
            Answer::Accepted("a".into()),
        ];
        assert!(failed(&answer_checks(&plan, &ok, 1, 0)).is_empty());
        // A retry under the first one's key that got another order; a 5xx.
        let bad = [
            Answer::Accepted("a".into()),
            Answer::Refused("http_500".into()),
            Answer::Accepted("b".into()),
        ];
        assert_eq!(
            failed(&answer_checks(&plan, &bad, 2, 0)),
            [
                "every request answered",
                "idempotent retries got one order per key"
            ]
        );
        // Fewer units than the plan can buy, with nothing shed: an undersell.
        assert_eq!(failed(&answer_checks(&plan, &ok, 2, 0)).len(), 1);
        // Shed requests excuse selling fewer, never more.
        let shed = [
            Answer::Accepted("a".into()),
            Answer::Refused("overloaded".into()),
            Answer::Accepted("a".into()),
        ];
        assert!(failed(&answer_checks(&plan, &shed, 2, 0)).is_empty());
    }
}
