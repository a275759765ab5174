//! `flashsale-bench auth`: what identifying buyers costs on the order path.
//!
//! Whole rehearsals (`flashsale-bench rehearse --local`, books checked) side by side,
//! alternated `--rounds` times, one per way of identifying buyers:
//!
//! - `none`: `AUTH=none`, the body's `user_id` is believed (the floor);
//! - `hs256`: HMAC-signed tokens, the token cache on;
//! - `es256`, `rs256`: tokens signed with an EC / RSA private key, verified
//!   with the public half, the cache on;
//! - `es256-nocache`, `rs256-nocache`: the same, every request verified.
//!
//! The bench mints each buyer's token once, before the burst, and sends it
//! with every request of that buyer (as a client keeps its token). Each run
//! records orders/s and the CPU time of this process during the burst, per
//! request: the load generator runs in this process too, identically in
//! every variant, so the differences between variants are the server's.
//!
//! Beside them, on one thread in a tight loop: CPU ns per
//! [`Auth::identify_bearer`] for each key type, verified and cached (CPU
//! time from `/proc/thread-self/schedstat`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use super::rehearsal::{BenchArgs, Report, median, run};
use super::tokens::Tokens;
use flashsale::config::AuthSettings;
use flashsale::domain::UserId;
use flashsale::http::auth::Auth;

#[derive(Debug, Clone, Args)]
#[command(
    mut_arg("requests", |a| a.default_value("30000")),
    mut_arg("users", |a| a.default_value("6000"))
)]
pub struct BenchAuthArgs {
    /// The rehearsal (`--local` is implied; of its key options only
    /// `--jwt-secret`, for `hs256`, and `--token-cache`, for the cached
    /// variants, are used). Here 30,000 requests from 6,000 buyers by
    /// default: about five requests per buyer, as in `bench`'s default mix.
    #[command(flatten)]
    pub bench: BenchArgs,
    /// Rounds, each running every variant once.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// The EC (P-256) private key the `es256` tokens are signed with.
    #[arg(long, default_value = "tests/fixtures/jwt/ec-private.pem")]
    pub ec_private_key: PathBuf,
    /// Its public half, which the server verifies with.
    #[arg(long, default_value = "tests/fixtures/jwt/ec-public.pem")]
    pub ec_public_key: PathBuf,
    /// The RSA private key the `rs256` tokens are signed with.
    #[arg(long, default_value = "tests/fixtures/jwt/rsa-private.pem")]
    pub rsa_private_key: PathBuf,
    /// Its public half, which the server verifies with.
    #[arg(long, default_value = "tests/fixtures/jwt/rsa-public.pem")]
    pub rsa_public_key: PathBuf,
    /// Calls at least in the single-thread loop for HMAC and for cache hits
    /// (a tenth of it for public-key verifications); each loop also runs
    /// for at least 300 ms.
    #[arg(long, default_value_t = 20_000)]
    pub micro_iterations: u64,
}

/// One variant's figures over the rounds.
#[derive(Debug, Serialize)]
pub struct VariantFigures {
    pub variant: &'static str,
    /// Orders/s (requests answered per second) of each round.
    pub orders_per_s: Vec<f64>,
    pub median_orders_per_s: f64,
    /// CPU µs of this process per request, each round.
    pub cpu_us_per_request: Vec<f64>,
    pub median_cpu_us_per_request: f64,
    /// Median orders/s ÷ `none`'s.
    pub orders_over_none: f64,
    /// Median CPU per request − `none`'s, in µs.
    pub cpu_us_over_none: f64,
}

/// One key type on one thread: CPU ns per identification.
#[derive(Debug, Serialize)]
pub struct MicroFigures {
    pub algorithm: String,
    /// Every call verifies the signature (cache off): CPU ns per call.
    pub verify_ns: f64,
    /// The same in wall-clock time.
    pub verify_wall_ns: f64,
    pub verify_iterations: u64,
    /// Every call finds the token in the cache (SHA-256 and a lookup).
    pub cached_ns: f64,
    pub cached_wall_ns: f64,
    pub cached_iterations: u64,
}

/// `flashsale-bench auth --json`.
#[derive(Debug, Serialize)]
pub struct AuthReport {
    pub requests: u64,
    pub users: u64,
    pub stock: u64,
    pub concurrency: u64,
    pub token_cache: usize,
    pub variants: Vec<VariantFigures>,
    pub micro: Vec<MicroFigures>,
    pub books_ok: bool,
}

/// How a variant's server verifies, and the tokens its buyers send.
#[derive(Clone)]
enum Key {
    None,
    Hmac(String),
    Pair { private: PathBuf, public: PathBuf },
}

struct Variant {
    name: &'static str,
    key: Key,
    tokens: Option<Arc<Tokens>>,
    cache: bool,
}

/// 32 random bytes, hex.
fn random_secret() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("getrandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn variants(args: &BenchAuthArgs, secret: &str) -> anyhow::Result<Vec<Variant>> {
    let hs = Arc::new(Tokens::hmac(secret, None)?);
    let ec = Arc::new(Tokens::from_pem(&args.ec_private_key, None)?);
    let rsa = Arc::new(Tokens::from_pem(&args.rsa_private_key, None)?);
    let pair = |private: &Path, public: &Path| Key::Pair {
        private: private.to_owned(),
        public: public.to_owned(),
    };
    let ec_pair = pair(&args.ec_private_key, &args.ec_public_key);
    let rsa_pair = pair(&args.rsa_private_key, &args.rsa_public_key);
    let v = |name, key: &Key, tokens: &Arc<Tokens>, cache| Variant {
        name,
        key: key.clone(),
        tokens: Some(tokens.clone()),
        cache,
    };
    Ok(vec![
        Variant {
            name: "none",
            key: Key::None,
            tokens: None,
            cache: false,
        },
        v("hs256", &Key::Hmac(secret.to_owned()), &hs, true),
        v("es256", &ec_pair, &ec, true),
        v("es256-nocache", &ec_pair, &ec, false),
        v("rs256", &rsa_pair, &rsa, true),
        v("rs256-nocache", &rsa_pair, &rsa, false),
    ])
}

/// The rehearsal of one variant: local, books checked, quiet, nothing beside.
fn rehearsal_args(base: &BenchArgs, v: &Variant) -> BenchArgs {
    let mut a = base.side_by_side();
    a.limits = None;
    a.jwt_secret = None;
    a.jwt_private_key = None;
    a.jwt_public_key = None;
    a.jwt_algorithm = None;
    a.tokens = v.tokens.clone();
    a.token_cache = if v.cache { base.token_cache } else { 0 };
    match &v.key {
        Key::None => {}
        Key::Hmac(secret) => a.jwt_secret = Some(secret.clone()),
        Key::Pair { private, public } => {
            a.jwt_private_key = Some(private.clone());
            a.jwt_public_key = Some(public.clone());
        }
    }
    a
}

pub async fn run_auth_bench(args: BenchAuthArgs) -> anyhow::Result<()> {
    let secret = match &args.bench.jwt_secret {
        Some(s) => s.clone(),
        None => random_secret()?,
    };
    let variants = variants(&args, &secret)?;

    let mut micro = Vec::new();
    for v in &variants {
        let (Some(tokens), true) = (&v.tokens, v.cache) else {
            continue;
        };
        let settings = server_auth(&v.key, args.bench.token_cache);
        let cheap = matches!(v.key, Key::Hmac(_));
        let n = args.micro_iterations.max(10);
        let figures = micro_bench(settings, tokens.clone(), if cheap { n } else { n / 10 }, n)
            .await
            .with_context(|| format!("timing {}", v.name))?;
        eprintln!(
            "{}: {:.0} ns to verify, {:.0} ns from the cache",
            figures.algorithm, figures.verify_ns, figures.cached_ns
        );
        micro.push(figures);
    }

    let mut books_ok = true;
    let mut per_s = vec![Vec::new(); variants.len()];
    let mut cpu_us = vec![Vec::new(); variants.len()];
    for round in 0..args.rounds.max(1) {
        for (i, v) in variants.iter().enumerate() {
            let r = run(rehearsal_args(&args.bench, v)).await?;
            books_ok &= r.ok();
            for c in r.checks.iter().filter(|c| !c.ok) {
                eprintln!("{}: check failed: {}: {}", v.name, c.name, c.detail);
            }
            let cpu = r.http_cpu_us_per_request.unwrap_or(f64::NAN);
            eprintln!(
                "round {round} {}: {:.0} orders/s, {cpu:.1} µs CPU per request{}",
                v.name,
                r.http.requests_per_s,
                outcomes(&r)
            );
            per_s[i].push(r.http.requests_per_s);
            cpu_us[i].push(cpu);
        }
    }
    let (none_per_s, none_cpu) = (median(&per_s[0]), median(&cpu_us[0]));
    let figures = variants
        .iter()
        .zip(per_s.into_iter().zip(cpu_us))
        .map(|(v, (per_s, cpu))| VariantFigures {
            variant: v.name,
            median_orders_per_s: median(&per_s),
            median_cpu_us_per_request: median(&cpu),
            orders_over_none: median(&per_s) / none_per_s.max(f64::MIN_POSITIVE),
            cpu_us_over_none: median(&cpu) - none_cpu,
            orders_per_s: per_s,
            cpu_us_per_request: cpu,
        })
        .collect();
    let report = AuthReport {
        requests: args.bench.requests,
        users: args.bench.users,
        stock: args.bench.stock,
        concurrency: args.bench.concurrency,
        token_cache: args.bench.token_cache,
        variants: figures,
        micro,
        books_ok,
    };
    super::show(args.bench.json, &report, print)?;
    anyhow::ensure!(report.books_ok, "a rehearsal's books did not balance");
    Ok(())
}

/// `, accepted 1000, sold_out 28000, ...`: a refused token would show here.
fn outcomes(r: &Report) -> String {
    r.http
        .outcomes
        .iter()
        .map(|(k, v)| format!(", {k} {v}"))
        .collect()
}

/// The server's settings for `key` (as `--local` builds them).
fn server_auth(key: &Key, cache: usize) -> AuthSettings {
    let s = match key {
        Key::None => AuthSettings::off(),
        Key::Hmac(secret) => AuthSettings::hmac(secret),
        Key::Pair { public, .. } => AuthSettings {
            jwt_public_key_file: Some(public.clone()),
            ..AuthSettings::default()
        },
    };
    AuthSettings {
        token_cache_entries: cache,
        ..s
    }
}

/// CPU ns per [`Auth::identify_bearer`] on one thread: `verify_n` calls
/// with the cache off (each verifies), `cached_n` with it on (after one
/// call that verifies and fills it).
async fn micro_bench(
    settings: AuthSettings,
    tokens: Arc<Tokens>,
    verify_n: u64,
    cached_n: u64,
) -> anyhow::Result<MicroFigures> {
    tokio::task::spawn_blocking(move || {
        let token = tokens.mint(1)?;
        let auth = |entries| {
            Auth::new(&AuthSettings {
                token_cache_entries: entries,
                ..settings.clone()
            })?
            .ok_or_else(|| anyhow::anyhow!("no JWT key configured"))
        };
        let (uncached, cached) = (auth(0)?, auth(16)?);
        anyhow::ensure!(
            flashsale::bench_support::identify_bearer(&cached, &token)
                .ok()
                .map(UserId::get)
                == Some(1),
            "the server refuses the bench's token"
        );
        let verify = per_call(verify_n, || {
            flashsale::bench_support::identify_bearer(&uncached, &token).map(UserId::get)
        })?;
        let cached = per_call(cached_n, || {
            flashsale::bench_support::identify_bearer(&cached, &token).map(UserId::get)
        })?;
        Ok(MicroFigures {
            algorithm: format!("{:?}", tokens.algorithm()),
            verify_ns: verify.cpu_ns,
            verify_wall_ns: verify.wall_ns,
            verify_iterations: verify.calls,
            cached_ns: cached.cpu_ns,
            cached_wall_ns: cached.wall_ns,
            cached_iterations: cached.calls,
        })
    })
    .await?
}

/// What one call costs on average.
struct PerCall {
    /// CPU time of the calling thread (wall-clock time where it cannot be read).
    cpu_ns: f64,
    wall_ns: f64,
    calls: u64,
}

/// The kernel brings a running thread's CPU time in `/proc` up to date only
/// at its scheduler ticks (1-10 ms apart): a loop shorter than ~100 ticks
/// would be measured in ticks.
const MIN_LOOP: Duration = Duration::from_millis(300);

/// Calls `f` at least `n` times, and on until [`MIN_LOOP`] has passed, on
/// this thread; every call must name user 1.
fn per_call<E>(n: u64, mut f: impl FnMut() -> Result<u64, E>) -> anyhow::Result<PerCall> {
    let batch = (n / 10).max(1);
    let (cpu0, wall0) = (super::cpu::thread(), Instant::now());
    let (mut calls, mut wrong) = (0u64, 0u64);
    while calls < n || wall0.elapsed() < MIN_LOOP {
        for _ in 0..batch {
            if !matches!(std::hint::black_box(f()), Ok(1)) {
                wrong += 1;
            }
        }
        calls += batch;
    }
    let wall = wall0.elapsed();
    let cpu = match (cpu0, super::cpu::thread()) {
        (Some(before), Some(after)) => after.saturating_sub(before),
        _ => wall,
    };
    anyhow::ensure!(wrong == 0, "{wrong} of {calls} calls refused the token");
    Ok(PerCall {
        cpu_ns: cpu.as_nanos() as f64 / calls as f64,
        wall_ns: wall.as_nanos() as f64 / calls as f64,
        calls,
    })
}

fn print(r: &AuthReport) {
    println!(
        "{} requests from {} buyers for {} units, {} connections; token cache {} entries (on)",
        r.requests, r.users, r.stock, r.concurrency, r.token_cache
    );
    println!(
        "{:<14} {:<26} {:>8} {:>12} {:>8} {:>12}",
        "variant", "orders/s by round", "median", "CPU µs/req", "÷ none", "CPU − none"
    );
    for v in &r.variants {
        let rounds = v
            .orders_per_s
            .iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "{:<14} {:<26} {:>8.0} {:>12.1} {:>8.3} {:>+12.1}",
            v.variant,
            rounds,
            v.median_orders_per_s,
            v.median_cpu_us_per_request,
            v.orders_over_none,
            v.cpu_us_over_none
        );
    }
    println!();
    println!(
        "{:<8} {:>14} {:>14} {:>16}",
        "key", "verify ns", "cached ns", "verify / cached"
    );
    for m in &r.micro {
        println!(
            "{:<8} {:>14.0} {:>14.0} {:>16.1}",
            m.algorithm,
            m.verify_ns,
            m.cached_ns,
            m.verify_ns / m.cached_ns.max(f64::MIN_POSITIVE)
        );
    }
    println!(
        "books: {}",
        if r.books_ok {
            "balance"
        } else {
            "DO NOT balance"
        }
    );
}
