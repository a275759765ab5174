//! Each process's flush of its timelines (`metrics::timeline`) into the
//! books, once a second, with the room's readings it holds.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::domain::Chain;
use crate::metrics::Metrics;
use crate::metrics::timeline::Gauge;
use crate::sale::Room;
use crate::store;

/// How often a process writes its timeline.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// At a stop, the last seconds are tried this many times, this far apart
/// (each try bounded by `DB_TIMEOUT_MS`).
const FINAL_TRIES: u32 = 5;
const FINAL_PAUSE: Duration = Duration::from_millis(200);
/// Seconds a process keeps while the books do not take them (then the
/// oldest go, said in the log): ten minutes of a sale's.
const KEPT_WHILE_UNWRITTEN: usize = 600;

/// A process's flush of its timelines into the books, with the room's
/// readings it holds (each second).
pub struct Recorder {
    pub metrics: Arc<Metrics>,
    pub seconds: store::Seconds,
    pub room: Option<Room>,
    /// This process's name in the rows (drawn at start).
    pub source: String,
}

impl Recorder {
    pub fn source_name() -> String {
        let mut bytes = [0u8; 4];
        let _ = getrandom::fill(&mut bytes);
        format!("{}-{}", std::process::id(), crate::domain::hex(&bytes))
    }

    pub async fn run(self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => {
                    // What is counted so far, this second included; tried
                    // again for a while when the books are slow (a stop
                    // during their outage would lose the last seconds, and
                    // the report would miss the answers of a swapped
                    // process).
                    for _ in 0..FINAL_TRIES {
                        if self.flush(i64::MAX).await {
                            return;
                        }
                        tokio::time::sleep(FINAL_PAUSE).await;
                    }
                    tracing::warn!("the sales' last timeline seconds were not written before the stop");
                    return;
                }
            }
            self.sample_rooms();
            self.flush(self.metrics.timeline.now_s()).await;
        }
    }

    /// The room's places admitted, pace and ceiling as this process last
    /// read them, in the second it read them: a reading is sampled at every
    /// tick while it is fresh, and put in a later second it would say
    /// nothing was admitted until then (the report spreads the places
    /// admitted between two readings over the seconds between them:
    /// `report::room`), and bunch the places admitted meanwhile in the next reading's
    /// second (issue 68: admissions told to run out over 5 s all counted in
    /// one).
    fn sample_rooms(&self) {
        let Some(room) = &self.room else { return };
        let timeline = &self.metrics.timeline;
        for (product, read_at, r) in room.readings() {
            timeline.gauges_at(
                product.as_str(),
                read_at,
                &[
                    (Gauge::Admitted, r.admitted_places() as i64),
                    (Gauge::Pace, r.pace.round() as i64),
                    (Gauge::Ceiling, i64::from(r.ceiling)),
                    (Gauge::Joined, r.joined() as i64),
                ],
            );
        }
    }

    /// Writes the seconds over before `before`; false when the books did
    /// not take them (kept for the next try).
    async fn flush(&self, before: i64) -> bool {
        let timeline = &self.metrics.timeline;
        let mut taken = timeline.take_settled(before);
        if taken.is_empty() {
            return true;
        }
        let written = self.seconds.write(&self.source, &taken).await;
        if let Err(e) = &written {
            tracing::warn!(error = %Chain(e), seconds = taken.len(), "the sales' timelines not written yet; kept for the next try");
            if taken.len() > KEPT_WHILE_UNWRITTEN {
                let dropped = taken.len() - KEPT_WHILE_UNWRITTEN;
                taken.drain(..dropped);
                tracing::warn!(
                    dropped,
                    "the sales' oldest timeline seconds dropped while the books are away"
                );
            }
            timeline.put_back(taken);
        }
        written.is_ok()
    }
}
