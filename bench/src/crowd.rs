//! The crowd around a sale, for `flashsale-bench rehearse`: the storm before
//! the start (`--pre-start-secs`), the crowd still asking once it sold out,
//! and what all of it cost Redis: the order path's Redis calls, read from
//! every instance's `/metrics` between the phases.

use std::time::Instant;

use hyper::Method;
use serde::Serialize;

use super::load::{Answer, Conn};
use super::plan::{Mix, Planned, plan};
use flashsale::bookkeeping::audit::Check;

/// What the instances' counters said at one moment (summed over them).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counts {
    /// `place_order.lua` calls.
    pub scripts: u64,
    /// Background reads for the memory (a sale's window and clock, the registry).
    pub memory_reads: u64,
    /// Order answers given from memory.
    pub by_memory: u64,
    /// Order answers given by Redis.
    pub by_redis: u64,
    /// The instances' `process_cpu_seconds_total`, summed.
    pub cpu_seconds: f64,
}

impl Counts {
    fn since(self, before: Counts) -> Counts {
        Counts {
            scripts: self.scripts.saturating_sub(before.scripts),
            memory_reads: self.memory_reads.saturating_sub(before.memory_reads),
            by_memory: self.by_memory.saturating_sub(before.by_memory),
            by_redis: self.by_redis.saturating_sub(before.by_redis),
            cpu_seconds: (self.cpu_seconds - before.cpu_seconds).max(0.0),
        }
    }

    /// Every Redis call of the order path.
    pub fn redis_calls(&self) -> u64 {
        self.scripts + self.memory_reads
    }

    /// Adds one instance's `/metrics` text.
    fn add_metrics(&mut self, text: &str) {
        for line in text.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            if series == "process_cpu_seconds_total" {
                self.cpu_seconds += value;
                continue;
            }
            let value = value as u64;
            if series == r#"flashsale_order_path_redis_calls_total{call="place_order"}"# {
                self.scripts += value;
            } else if series == r#"flashsale_order_path_redis_calls_total{call="memory_read"}"# {
                self.memory_reads += value;
            } else if series.starts_with(r#"flashsale_order_requests_total{answered_by="memory""#) {
                self.by_memory += value;
            } else if series.starts_with(r#"flashsale_order_requests_total{answered_by="redis""#) {
                self.by_redis += value;
            }
        }
    }
}

/// The counters of every instance now (`None` if one did not answer).
pub async fn scrape(authorities: &[String]) -> Option<Counts> {
    let mut counts = Counts::default();
    for authority in authorities {
        let mut conn = Conn::open(authority).await.ok()?;
        let (status, body) = conn.send(Method::GET, "/metrics", &[], None).await.ok()?;
        if !status.is_success() {
            return None;
        }
        counts.add_metrics(std::str::from_utf8(&body).ok()?);
    }
    Some(counts)
}

/// The Redis work of each phase of a rehearsal.
#[derive(Debug, Clone, Serialize)]
pub struct RedisCalls {
    pub pre_start: Option<Counts>,
    pub burst: Counts,
    pub sold_out: Option<Counts>,
    /// Redis calls of the order path (scripts and memory reads) per request,
    /// over the pre-start storm and the burst.
    pub per_request: f64,
    /// ... per accepted order.
    pub per_accepted_order: f64,
    /// Requests with an Idempotency-Key: they always reach Redis (a retry
    /// must get its order back, and only Redis has it).
    pub keyed_requests: u64,
    /// Redis calls per request without an Idempotency-Key (keyed requests
    /// and their calls left out).
    pub per_unkeyed_request: f64,
}

/// Counter readings: before the pre-start storm, before the burst, after
/// it, after the sold-out phase.
#[derive(Debug, Clone, Copy)]
pub struct Readings {
    pub start: Counts,
    pub burst: Counts,
    pub burst_end: Counts,
    pub end: Counts,
}

impl RedisCalls {
    pub fn new(
        r: Readings,
        pre_start: bool,
        sold_out: bool,
        requests: u64,
        accepted: u64,
        keyed: u64,
    ) -> Self {
        let pre = pre_start.then(|| r.burst.since(r.start));
        let burst = r.burst_end.since(r.burst);
        let calls = pre.map_or(0, |p| p.redis_calls()) + burst.redis_calls();
        Self {
            pre_start: pre,
            burst,
            sold_out: sold_out.then(|| r.end.since(r.burst_end)),
            per_request: calls as f64 / requests.max(1) as f64,
            per_accepted_order: calls as f64 / accepted.max(1) as f64,
            keyed_requests: keyed,
            per_unkeyed_request: calls.saturating_sub(keyed) as f64
                / requests.saturating_sub(keyed).max(1) as f64,
        }
    }
}

/// Requests for a phase of about `secs` seconds (more than can be sent):
/// the burst's buyers and made-up ids, without Idempotency-Keys.
pub fn side_plan(mix: Mix, seed: u64, secs: u64) -> Vec<Planned> {
    plan(Mix {
        requests: secs.max(1) * 150_000,
        retry_share: 0.0,
        seed,
        ..mix
    })
}

/// A phase where every request for the sale gets one of `codes` (and every
/// made-up id `product_not_found`): nothing accepted.
pub fn phase_check(
    name: &'static str,
    plan: &[Planned],
    answers: &[Answer],
    codes: &[&str],
) -> Check {
    let wrong: Vec<String> = plan
        .iter()
        .zip(answers)
        .filter_map(|(p, a)| {
            let want: &[&str] = if p.unknown {
                &["product_not_found"]
            } else {
                codes
            };
            match a {
                Answer::Refused(c) if want.contains(&c.as_str()) => None,
                Answer::Refused(c) => Some(c.clone()),
                Answer::Accepted(id) => Some(format!("accepted {id}")),
            }
        })
        .collect();
    Check {
        name,
        ok: wrong.is_empty(),
        detail: format!(
            "{} of {} requests answered otherwise{}",
            wrong.len(),
            answers.len(),
            wrong
                .first()
                .map(|w| format!(", e.g. {w}"))
                .unwrap_or_default()
        ),
    }
}

/// Sleeps until `epoch_ms` by this machine's clock.
pub async fn sleep_until_ms(epoch_ms: i64) {
    let left = epoch_ms - flashsale::domain::now_ms();
    if left > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(left as u64)).await;
    }
}

/// The instant `epoch_ms` by this machine's clock will be.
pub fn instant_at_ms(epoch_ms: i64) -> Instant {
    let left = epoch_ms - flashsale::domain::now_ms();
    Instant::now() + std::time::Duration::from_millis(left.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counters_of_a_metrics_page_are_summed() {
        let page = "\
# HELP flashsale_order_path_redis_calls_total ...
flashsale_order_path_redis_calls_total{call=\"memory_read\"} 3
flashsale_order_path_redis_calls_total{call=\"place_order\"} 1004
flashsale_order_requests_total{answered_by=\"memory\",outcome=\"sale_not_started\"} 5000
flashsale_order_requests_total{answered_by=\"memory\",outcome=\"sold_out\"} 20
flashsale_order_requests_total{answered_by=\"redis\",outcome=\"accepted\"} 1000
flashsale_order_requests_total{answered_by=\"service\",outcome=\"invalid_request\"} 7
process_cpu_seconds_total 1.5
";
        let mut c = Counts::default();
        c.add_metrics(page);
        c.add_metrics(page);
        assert_eq!(
            (c.scripts, c.memory_reads, c.by_memory, c.by_redis),
            (2008, 6, 10_040, 2000)
        );
        assert!((c.cpu_seconds - 3.0).abs() < 1e-9);
    }

    #[test]
    fn calls_per_request_cover_the_pre_start_storm_and_the_burst() {
        let at = |scripts, memory_reads| Counts {
            scripts,
            memory_reads,
            ..Counts::default()
        };
        let r = Readings {
            start: at(0, 0),
            burst: at(3, 5),
            burst_end: at(1_003, 9),
            end: at(1_006, 12),
        };
        let calls = RedisCalls::new(r, true, true, 101_000, 1_000, 1_000);
        assert_eq!(calls.burst.redis_calls(), 1_004);
        assert!((calls.per_request - 1_012.0 / 101_000.0).abs() < 1e-9);
        assert!((calls.per_accepted_order - 1.012).abs() < 1e-9);
        assert_eq!(calls.sold_out.map(|c| c.redis_calls()), Some(6));
        assert!((calls.per_unkeyed_request - 12.0 / 100_000.0).abs() < 1e-9);
    }

    #[test]
    fn a_phase_check_fails_on_any_other_answer() {
        let p = |unknown| Planned {
            sale: 0,
            user: 1,
            key: None,
            retry_of: None,
            unknown,
        };
        let plan = [p(false), p(true)];
        let good = [
            Answer::Refused("sale_not_started".into()),
            Answer::Refused("product_not_found".into()),
        ];
        assert!(phase_check("x", &plan, &good, &["sale_not_started"]).ok);
        let bad = [
            Answer::Accepted("o".into()),
            Answer::Refused("product_not_found".into()),
        ];
        assert!(!phase_check("x", &plan, &bad, &["sale_not_started"]).ok);
    }
}
