//! `flashsale-bench guards`: what the guards in front of the order path cost,
//! and how they answer an overload. Three parts, each a whole rehearsal
//! (`flashsale-bench rehearse --local`, books checked) on an in-process server:
//!
//! 1. cost: the same sale with the limits off and on, alternated `--rounds`
//!    times. "On" runs every guard on every order (in-flight permit, address
//!    bucket, user bucket) with bounds the load never reaches, so it measures
//!    the checks, not their refusals. Timeouts and header limits are always on.
//! 2. the concurrency sweep behind the default `MAX_IN_FLIGHT`: throughput and
//!    p99 per offered concurrency, limits off.
//! 3. overload: `--overload-factor` times `--overload-in-flight` clients
//!    against a server bounded at `--overload-in-flight`: latency of the
//!    503 `overloaded` answers and of the decided ones.

use std::collections::BTreeMap;

use clap::Args;
use serde::Serialize;

use super::rehearsal::{BenchArgs, Report, RunFigures, median, run};
use flashsale::config::{Limits, RateLimit};

#[derive(Debug, Clone, Args)]
pub struct BenchGuardsArgs {
    #[command(flatten)]
    pub bench: BenchArgs,
    /// Off/on pairs in the cost comparison.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Offered concurrencies of the sweep (empty: no sweep).
    #[arg(long, value_delimiter = ',', default_value = "16,64,256,1024")]
    pub sweep: Vec<u64>,
    /// The in-flight bound of the overload run.
    #[arg(long, default_value_t = 32)]
    pub overload_in_flight: usize,
    /// Clients per permit in the overload run.
    #[arg(long, default_value_t = 20)]
    pub overload_factor: u64,
}

#[derive(Debug, Serialize)]
pub struct GuardsReport {
    pub off_per_s: Vec<f64>,
    pub on_per_s: Vec<f64>,
    /// Median of on / median of off.
    pub on_over_off: f64,
    pub sweep: BTreeMap<u64, RunFigures>,
    pub overload: RunFigures,
    pub overload_in_flight: usize,
    pub overload_clients: u64,
    pub books_ok: bool,
}

/// Every guard on, with bounds the benchmark never reaches.
fn guards_on() -> Limits {
    let never = RateLimit::new(u32::MAX / 2, u32::MAX / 2);
    Limits {
        max_in_flight: 1 << 20,
        user_rate: never,
        ip_rate: never,
        ..Limits::default()
    }
}

async fn rehearse(args: &BenchArgs, limits: Limits, concurrency: u64) -> anyhow::Result<Report> {
    let mut a = args.side_by_side();
    a.concurrency = concurrency;
    a.limits = Some(limits);
    run(a).await
}

pub async fn run_guards_bench(args: BenchGuardsArgs) -> anyhow::Result<()> {
    let mut books_ok = true;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..args.rounds.max(1) {
        for (label, limits, into) in [
            ("off", Limits::unlimited(), &mut off),
            ("on", guards_on(), &mut on),
        ] {
            let r = rehearse(&args.bench, limits, args.bench.concurrency).await?;
            books_ok &= r.ok();
            eprintln!(
                "round {round} limits {label}: {:.0} orders/s",
                r.http.requests_per_s
            );
            into.push(r.http.requests_per_s);
        }
    }
    let mut sweep = BTreeMap::new();
    for &c in &args.sweep {
        let r = rehearse(&args.bench, Limits::unlimited(), c).await?;
        books_ok &= r.ok();
        eprintln!(
            "sweep {c} clients: {:.0} orders/s, p99 {:.1} ms",
            r.http.requests_per_s, r.http.latency_ms["p99"]
        );
        sweep.insert(c, r.http);
    }
    let clients = args.overload_factor * args.overload_in_flight as u64;
    let bounded = Limits {
        max_in_flight: args.overload_in_flight,
        ..Limits::unlimited()
    };
    let r = rehearse(&args.bench, bounded, clients).await?;
    books_ok &= r.ok();
    for c in r.checks.iter().filter(|c| !c.ok) {
        eprintln!("check failed: {}: {}", c.name, c.detail);
    }
    let report = GuardsReport {
        on_over_off: median(&on) / median(&off).max(f64::MIN_POSITIVE),
        off_per_s: off,
        on_per_s: on,
        sweep,
        overload: r.http,
        overload_in_flight: args.overload_in_flight,
        overload_clients: clients,
        books_ok,
    };
    super::show(args.bench.json, &report, print)?;
    anyhow::ensure!(report.books_ok, "a rehearsal's books did not balance");
    Ok(())
}

fn print(r: &GuardsReport) {
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("limits off: {} orders/s", list(&r.off_per_s));
    println!("limits on:  {} orders/s", list(&r.on_per_s));
    println!("on / off (medians): {:.3}", r.on_over_off);
    println!();
    println!("clients  orders/s  p50 ms  p99 ms");
    for (c, f) in &r.sweep {
        println!(
            "{c:>7}  {:>8.0}  {:>6.1}  {:>6.1}",
            f.requests_per_s, f.latency_ms["p50"], f.latency_ms["p99"]
        );
    }
    println!();
    println!(
        "overload: {} clients on {} permits, {:.0} answers/s",
        r.overload_clients, r.overload_in_flight, r.overload.requests_per_s
    );
    println!("outcome              count    p50 ms   p99 ms");
    for (outcome, [p50, p99]) in &r.overload.latency_by_outcome_ms {
        let n = r
            .overload
            .outcomes
            .get(outcome)
            .copied()
            .unwrap_or_else(|| {
                // `accepted` also counts replays in the outcome table.
                r.overload.outcomes.get("accepted").copied().unwrap_or(0)
            });
        println!("{outcome:<18} {n:>7}  {p50:>8.2}  {p99:>7.2}");
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
