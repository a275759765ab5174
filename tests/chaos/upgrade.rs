//! A rolling upgrade during the live sale, and a rollback (docs/operations.md
//! "Upgrading"): the fleet starts on the previous release (N−1); one
//! process at a time is replaced by this tree's (N) as the runbook says
//! (out of the load balancer's rotation, SIGTERM, its exit awaited, N
//! started, `/readyz` awaited, back in rotation); then an API and a worker
//! are rolled back to N−1, and the fleet finishes on N. The load, the
//! payments and the events run throughout; the checks afterwards are the
//! chaos test's, with no fault but the swaps.

use std::ffi::OsStr;
use std::time::Duration;

use tokio::time::Instant;

use crate::load::Apis;
use crate::world::{Role, World};

/// What the swaps did: each step's line, at its time from the start.
#[derive(Debug, Default)]
pub struct UpgradeReport {
    pub steps: Vec<(Duration, String)>,
    pub failures: Vec<String>,
}

/// Runs the swaps, spread over the window until `until`.
pub async fn run(
    world: &mut World,
    apis: &Apis,
    (previous, current): (&OsStr, &OsStr),
    until: Instant,
) -> UpgradeReport {
    use Role::{Api, Worker};
    let plan = [
        // The upgrade, one process at a time.
        (Api, 0, current),
        (Worker, 0, current),
        (Api, 1, current),
        (Worker, 1, current),
        // A rollback of one of each.
        (Api, 0, previous),
        (Worker, 1, previous),
        // And forward again: the fleet finishes on N.
        (Api, 0, current),
        (Worker, 1, current),
    ];
    let t0 = Instant::now();
    let gap = until.saturating_duration_since(t0) / (plan.len() as u32 + 1);
    let mut report = UpgradeReport::default();
    for (k, &(role, i, program)) in plan.iter().enumerate() {
        tokio::time::sleep_until(t0 + gap * (k as u32 + 1)).await;
        let at = t0.elapsed();
        match world.replace(role, i, program, apis).await {
            Ok(step) => {
                println!("upgrade +{:>5.1}s {step}", at.as_secs_f64());
                report.steps.push((at, step));
            }
            Err(e) => {
                println!("upgrade +{:>5.1}s FAILED: {e}", at.as_secs_f64());
                report.failures.push(e);
            }
        }
    }
    tokio::time::sleep_until(until).await;
    report
}
