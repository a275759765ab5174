//! The workers' periodic tasks, one loop for all: a step every so often
//! until shutdown, its failures logged and retried at the next step; and a
//! supervisor that keeps a task running (a panic is logged and the task
//! started again, never a silent end until the next restart).

use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::domain::Chain;

/// How long a task that panicked waits before it is started again.
const RESTART_AFTER: Duration = Duration::from_secs(1);

/// Runs `step` every `every` until `shutdown` (zero: never); a step's
/// failure is logged (as `what`) and the next step is the retry.
pub async fn every<F, Fut, E>(
    what: &'static str,
    every: Duration,
    shutdown: CancellationToken,
    mut step: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
{
    if every.is_zero() {
        return;
    }
    loop {
        if let Err(e) = step().await {
            tracing::warn!(task = what, error = %Chain(&e), "failed; the next pass retries");
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Spawns the task `start` makes, and keeps it running until it returns:
/// after a panic (logged with `what`) a new one is started, a second
/// later, unless `shutdown` came meanwhile.
pub fn supervised<F, Fut>(
    what: &'static str,
    (shutdown, panics): (CancellationToken, IntCounterVec),
    start: F,
) -> JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match tokio::spawn(start()).await {
                Ok(()) => return,
                Err(e) if e.is_panic() => {
                    panics.with_label_values(&[what]).inc();
                    tracing::error!(task = what, "panicked; started again in a second");
                }
                Err(_) => return,
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(RESTART_AFTER) => {}
            }
        }
    })
}

/// A number in [0, 1), different at each call: for spreading waits.
pub fn unit_random() -> f64 {
    let mut r = [0u8; 8];
    match getrandom::fill(&mut r) {
        Ok(()) => (u64::from_le_bytes(r) >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 0.5,
    }
}

/// Waits for a spawned task and says how it ended, when it ended badly: a
/// panic is logged and counted in `panics` (`flashsale_task_panics_total`),
/// never dropped unseen.
pub async fn report_exit(what: &'static str, task: JoinHandle<()>, panics: &IntCounterVec) {
    if let Err(e) = task.await {
        match e.is_panic() {
            true => {
                panics.with_label_values(&[what]).inc();
                tracing::error!(task = what, "panicked");
            }
            false => tracing::warn!(task = what, "cancelled"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_task_that_panics_is_started_again() {
        let starts = Arc::new(AtomicU32::new(0));
        let stop = CancellationToken::new();
        let counted = starts.clone();
        let panics = crate::metrics::Metrics::new().task_panics;
        let task = supervised("test", (stop.clone(), panics.clone()), move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(n >= 2, "the first two runs panic");
            }
        });
        task.await.unwrap();
        assert_eq!(starts.load(Ordering::SeqCst), 3);
        assert_eq!(
            panics.with_label_values(&["test"]).get(),
            2,
            "each panic counted"
        );
    }

    #[tokio::test]
    async fn a_task_awaited_after_a_panic_is_logged_and_counted() {
        let panics = crate::metrics::Metrics::new().task_panics;
        let task = tokio::spawn(async { panic!("stopping went wrong") });
        report_exit("drain", task, &panics).await;
        report_exit("drain", tokio::spawn(async {}), &panics).await;
        assert_eq!(panics.with_label_values(&["drain"]).get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_step_is_retried_at_the_next_pass_until_shutdown() {
        let stop = CancellationToken::new();
        let mut steps = 0;
        let stopping = stop.clone();
        every("test", Duration::from_secs(5), stop, || {
            steps += 1;
            if steps == 3 {
                stopping.cancel();
            }
            std::future::ready(Err::<(), _>(std::fmt::Error))
        })
        .await;
        assert_eq!(steps, 3, "three passes, each after the failed one");
    }
}
