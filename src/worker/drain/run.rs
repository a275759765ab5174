//! The drain's loop around its steps.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::consumer::{IDLE_POLL, SaleWorker};
use crate::domain::{Chain, backoff};

/// Drains one sale until `shutdown`: steps, with a reclaim pass every half
/// claim-idle time and a trim every `trim_every`; a step that finds nothing
/// sleeps on the sale's bell ([`SaleWorker::sleep`]), and a drain woken
/// without finding anything sleeps again at once (nothing is pending then:
/// no reclaim; a trim only while entries may still age out). Errors back
/// off (capped); nothing is dropped mid-batch: shutdown is checked between
/// steps, and a step is bounded by the block time.
pub async fn run_sale(mut w: SaleWorker, shutdown: CancellationToken) {
    let cfg = w.cfg.clone();
    // Set at a failure, cleared at a success: the waits start over.
    let mut backoff = None;
    let reclaim_every = (cfg.claim_idle / 2).max(Duration::from_millis(50));
    let mut next_reclaim = Instant::now() + reclaim_every;
    let mut next_trim = Instant::now() + cfg.trim_every;
    let mut slept = false;
    while !shutdown.is_cancelled() {
        let mut result = w.step().await.map(|o| o.read);
        let quiet = slept && matches!(result, Ok(0));
        if quiet {
            if w.may_trim() {
                result = w.trim().await.map(|_| 0);
            }
        } else {
            if result.is_ok() && Instant::now() >= next_reclaim {
                result = w.reclaim().await.map(|o| o.read);
                next_reclaim = Instant::now() + reclaim_every;
            }
            if result.is_ok() && Instant::now() >= next_trim {
                result = w.trim().await.map(|_| 0);
                next_trim = Instant::now() + cfg.trim_every;
            }
        }
        slept = false;
        let wait = match result {
            Ok(read) => {
                backoff = None;
                if read > 0 {
                    continue;
                }
                match idle(&mut w, &shutdown).await {
                    Some(s) => slept = s,
                    None => break,
                }
                continue;
            }
            Err(e) => {
                let wait = backoff
                    .get_or_insert_with(|| backoff::doubling(cfg.backoff_min, cfg.backoff_max))
                    .next()
                    .unwrap_or(cfg.backoff_max);
                tracing::warn!(product_id = %w.product, error = %Chain(&e), retry_in = ?wait, "drain failed; backing off");
                wait
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    if let Err(e) = w.finish().await {
        tracing::warn!(product_id = %w.product, error = %Chain(&e), "batch read ahead left pending");
    }
    tracing::debug!(product_id = %w.product, "drain stopped");
}

/// A step found nothing: sleeps on the sale's bell, or polls when something
/// waits that this drain cannot read (another consumer's pending entries).
/// Whether it slept on the bell; `None` at shutdown.
async fn idle(w: &mut SaleWorker, shutdown: &CancellationToken) -> Option<bool> {
    let slept = match w.sleep(shutdown).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(product_id = %w.product, error = %Chain(&e), "cannot sleep on the bell; polling");
            false
        }
    };
    if !slept && w.bells.listening() {
        // As without bells.
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(IDLE_POLL) => {}
        }
    }
    Some(slept)
}
