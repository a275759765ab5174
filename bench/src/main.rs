//! The `flashsale-bench` binary: parse the command line, run one benchmark.

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "flashsale-bench",
    version,
    about = "The benchmarks behind flashsale's BENCHMARKS.md: each compares its variants side by side in one run."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Rehearse a flash sale over HTTP and check that the books balance.
    Rehearse(flashsale_bench::BenchArgs),
    /// Measure the order script straight against Redis, per connection strategy.
    Redis(flashsale_bench::BenchRedisArgs),
    /// Measure the workers' drain rate into MySQL beside a raw multi-row INSERT.
    Drain(flashsale_bench::BenchDrainArgs),
    /// Measure the order path with its limits off and on, and under overload.
    Guards(flashsale_bench::BenchGuardsArgs),
    /// Measure what verifying buyers' tokens costs: none, HMAC, ES256, RS256,
    /// with the token cache on and off.
    Auth(flashsale_bench::BenchAuthArgs),
    /// Serve the constant HTTP floor alone, for a profiler (`valgrind
    /// --tool=callgrind`) to compare with `flashsale serve`.
    Floor(flashsale_bench::floor::FloorArgs),
    /// Rehearse a sale with its waiting room on: fairness of the draw, the
    /// pace, admissions, and what a poll costs against the sold-out path.
    Room(flashsale_bench::room::BenchRoomArgs),
    /// Measure well-behaved buyers beside a crowd of slow connections (real
    /// `serve` processes, several binaries side by side), and what polls
    /// and joins for made-up sale ids cost Redis.
    SlowClients(flashsale_bench::slow::BenchSlowArgs),
    /// Measure how many events one worker process pushes per second to a
    /// local receiver (the outbox's delivery), and their CPU.
    Deliver(flashsale_bench::deliver::BenchDeliverArgs),
    /// Measure what one hot sale costs each Redis master with its stock in
    /// one shard and split over several, side by side, and how long a
    /// move of units between shards takes.
    HotSale(flashsale_bench::hot::BenchHotArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Rehearse(args) => flashsale_bench::rehearsal::run_cli(args).await,
        Command::Redis(args) => flashsale_bench::run_redis_bench(args).await,
        Command::Drain(args) => flashsale_bench::run_drain_bench(args).await,
        Command::Guards(args) => flashsale_bench::run_guards_bench(args).await,
        Command::Auth(args) => flashsale_bench::run_auth_bench(args).await,
        Command::Floor(args) => flashsale_bench::floor::serve_alone(args).await,
        Command::Room(args) => flashsale_bench::room::run_room_bench(args).await,
        Command::SlowClients(args) => flashsale_bench::slow::run_slow_bench(args).await,
        Command::Deliver(args) => flashsale_bench::deliver::run_deliver_bench(args).await,
        Command::HotSale(args) => flashsale_bench::hot::run_hot_bench(args).await,
    }
}
