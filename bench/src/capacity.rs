//! The sizing of a sale, from a rehearsal's CPU per request: how many cores
//! of API, Redis, workers and MySQL a sale needs to answer `R` requests/s of
//! the rehearsed mix with `S` units on sale, persisted at `D` orders/s.
//!
//! The arithmetic is plain: cores = rate × CPU per unit of work ÷ the share
//! of a core one is willing to keep busy. What it assumes is printed with it.

use serde::Serialize;

use super::cost::CpuPerRequest;

/// What the operator plans for (`--plan-rate`, `--plan-drain`, `--plan-busy`,
/// and the rehearsal's `--stock`).
#[derive(Debug, Clone, Copy)]
pub struct Demand {
    /// Requests per second of the rehearsed mix, at the peak.
    pub requests_per_s: f64,
    /// Units on sale (each becomes one persisted order).
    pub stock: u64,
    /// Stock shards of the sale (`--shards`): Redis cores it can use.
    pub shards: u16,
    /// Orders per second the workers and MySQL should persist.
    pub drain_orders_per_s: f64,
    /// The share of each core kept busy: 0.7 keeps 30% for the bursts
    /// within the peak second and for everything else the host runs.
    pub busy: f64,
}

/// The plan. A part whose cost was not measured has `None`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Capacity {
    pub requests_per_s: f64,
    pub stock: u64,
    pub shards: u16,
    pub drain_orders_per_s: f64,
    pub busy: f64,
    /// API cores, over as many instances as one likes.
    pub api_cores: Option<f64>,
    /// Redis cores for this sale. One stock shard is one Redis core (its
    /// keys share one hash tag, so one hash slot, and Redis runs commands on one
    /// thread); a sale of N shards spreads over N.
    pub redis_cores: Option<f64>,
    /// The most requests/s of this mix one sale's Redis core answers at
    /// `busy`: beyond it, the crowd must be answered from memory or made to wait.
    pub redis_ceiling_requests_per_s: Option<f64>,
    /// Worker cores, to persist at `drain_orders_per_s`.
    pub workers_cores: Option<f64>,
    /// MySQL cores, at the same rate.
    pub mysql_cores: Option<f64>,
    /// The most accepted orders/s one sale's Redis core takes at `busy`
    /// (from Redis's CPU per accepted order: exact on the accepting mix).
    pub redis_ceiling_orders_per_s: Option<f64>,
    /// Cores of the whole system (API, Redis, workers, MySQL) per 10,000
    /// accepted orders/s, at `busy`.
    pub system_cores_per_10k_orders: Option<f64>,
    /// Seconds from the sell-out until the last unit is in MySQL, at the
    /// drain rate (the workers persist while the sale runs, so this is the
    /// bound, not the usual wait).
    pub persist_secs: f64,
}

impl Capacity {
    pub fn plan(cpu: &CpuPerRequest, demand: Demand) -> Self {
        let busy = demand.busy.clamp(0.05, 1.0);
        let cores = |rate: f64, us: Option<f64>| us.map(|us| rate * us / 1e6 / busy);
        // Each shard takes its buyers' share on a core of its own.
        let shards = f64::from(demand.shards.max(1));
        Self {
            requests_per_s: demand.requests_per_s,
            stock: demand.stock,
            shards: demand.shards.max(1),
            drain_orders_per_s: demand.drain_orders_per_s,
            busy,
            api_cores: cores(demand.requests_per_s, cpu.api_us_per_request),
            redis_cores: cores(demand.requests_per_s, cpu.redis_us_per_request),
            redis_ceiling_requests_per_s: cpu
                .redis_us_per_request
                .filter(|us| *us > 0.0)
                .map(|us| shards * busy * 1e6 / us),
            workers_cores: cores(demand.drain_orders_per_s, cpu.workers_us_per_order),
            mysql_cores: cores(demand.drain_orders_per_s, cpu.mysql_us_per_order),
            redis_ceiling_orders_per_s: cpu
                .redis_us_per_accepted_order
                .filter(|us| *us > 0.0)
                .map(|us| shards * busy * 1e6 / us),
            system_cores_per_10k_orders: cores(10_000.0, cpu.system_us_per_accepted_order),
            persist_secs: demand.stock as f64 / demand.drain_orders_per_s.max(1.0),
        }
    }

    /// The plan as printed by `rehearse`.
    pub fn lines(&self, cpu: &CpuPerRequest) -> Vec<String> {
        let cores =
            |c: Option<f64>| c.map_or("not measured".to_owned(), |c| format!("{c:.2} cores"));
        let us = |v: Option<f64>| v.map_or(String::new(), |v| format!(" ({v:.1} µs of CPU each)"));
        let mut lines = vec![
            format!(
                "capacity plan: {:.0} requests/s of this mix, {} units on sale, persisted at {:.0} orders/s, cores kept {:.0}% busy:",
                self.requests_per_s,
                self.stock,
                self.drain_orders_per_s,
                self.busy * 100.0
            ),
            format!(
                "  API      {} for the requests{}, over any number of instances",
                cores(self.api_cores),
                us(cpu.api_us_per_request)
            ),
        ];
        let ceiling = self.redis_ceiling_requests_per_s.map_or(String::new(), |c| {
            let verdict = if c >= self.requests_per_s {
                "enough"
            } else {
                "NOT enough: open the sale with more stock shards, or lower the rate"
            };
            match self.shards {
                1 => format!("; one sale is one Redis core, which takes at most {c:.0} requests/s of this mix: {verdict}"),
                n => format!("; a sale of {n} stock shards is {n} Redis cores (on {n} masters), which take at most {c:.0} requests/s of this mix: {verdict}"),
            }
        });
        lines.push(format!(
            "  Redis    {} for this sale{}{ceiling}",
            cores(self.redis_cores),
            us(cpu.redis_us_per_request)
        ));
        lines.push(format!(
            "  workers  {} to persist {:.0} orders/s{}",
            cores(self.workers_cores),
            self.drain_orders_per_s,
            us(cpu.workers_us_per_order)
        ));
        lines.push(format!(
            "  MySQL    {} at that rate{}; all {} units in MySQL within {:.1} s of the sell-out",
            cores(self.mysql_cores),
            us(cpu.mysql_us_per_order),
            self.stock,
            self.persist_secs
        ));
        if let (Some(total), Some(system), Some(ceiling)) = (
            cpu.system_us_per_accepted_order,
            self.system_cores_per_10k_orders,
            self.redis_ceiling_orders_per_s,
        ) {
            let part = |v: Option<f64>| v.map_or("?".to_owned(), |v| format!("{v:.1}"));
            lines.push(format!(
                "  per accepted order: API {} + Redis {} + workers {} + MySQL {} = {total:.1} µs of CPU (this mix's refusals included): {system:.2} cores per 10,000 accepted orders/s; one sale's Redis core accepts at most {ceiling:.0} orders/s",
                part(cpu.api_us_per_accepted_order),
                part(cpu.redis_us_per_accepted_order),
                part(cpu.workers_us_per_order),
                part(cpu.mysql_us_per_order),
            ));
        }
        lines.push(
            "  assumes: this run's CPU per request and per order, on cores like this machine's; the same mix (shares of sold-out, refused and accepted requests) at the planned rate; keep-alive clients; per-order costs include this run's fixed costs (a small run overstates them)".to_owned(),
        );
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured() -> CpuPerRequest {
        CpuPerRequest {
            api_us_per_request: Some(35.0),
            redis_us_per_request: Some(5.0),
            generator_us_per_request: Some(25.0),
            workers_us_per_order: Some(20.0),
            mysql_us_per_order: Some(100.0),
            api_us_per_accepted_order: Some(70.0),
            redis_us_per_accepted_order: Some(10.0),
            system_us_per_accepted_order: Some(200.0),
        }
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn cores_are_rate_times_cost_over_the_busy_share() {
        let demand = Demand {
            requests_per_s: 100_000.0,
            stock: 1_000,
            shards: 1,
            drain_orders_per_s: 2_000.0,
            busy: 0.5,
        };
        let plan = Capacity::plan(&measured(), demand);
        // 100k/s × 35 µs = 3.5 cores of work, kept half busy: 7.
        assert!(close(plan.api_cores, 7.0));
        // 100k/s × 5 µs = 0.5 core, half busy: 1 core.
        assert!(close(plan.redis_cores, 1.0));
        // One core half busy at 5 µs a request: 100k/s.
        assert!(close(plan.redis_ceiling_requests_per_s, 100_000.0));
        // 2,000 orders/s × 20 µs = 0.04, half busy: 0.08; MySQL 0.2 → 0.4.
        assert!(close(plan.workers_cores, 0.08));
        assert!(close(plan.mysql_cores, 0.4));
        assert!((plan.persist_secs - 0.5).abs() < 1e-9);
        // One core half busy at 10 µs an accepted order: 50k orders/s;
        // 10k orders/s × 200 µs = 2 cores of work, half busy: 4.
        assert!(close(plan.redis_ceiling_orders_per_s, 50_000.0));
        assert!(close(plan.system_cores_per_10k_orders, 4.0));
        let text = plan.lines(&measured()).join("\n");
        assert!(text.contains("7.00 cores"), "{text}");
        assert!(
            text.contains("= 200.0 µs of CPU") && text.contains("4.00 cores per 10,000"),
            "{text}"
        );
        assert!(text.contains("at most 100000 requests/s of this mix: enough"));
    }

    #[test]
    fn a_sale_beyond_one_redis_core_is_called_out() {
        let demand = Demand {
            requests_per_s: 300_000.0,
            stock: 10_000,
            shards: 1,
            drain_orders_per_s: 1_000.0,
            busy: 0.7,
        };
        let plan = Capacity::plan(&measured(), demand);
        // 0.7 × 1e6 / 5 µs = 140k/s < 300k/s.
        assert!(close(plan.redis_ceiling_requests_per_s, 140_000.0));
        assert!(plan.redis_cores.is_some_and(|c| c > 1.0));
        assert!(plan.lines(&measured()).join("\n").contains("NOT enough"));
        assert!((plan.persist_secs - 10.0).abs() < 1e-9);
        // Opened with 3 stock shards, on 3 masters: 420k/s, enough.
        let plan = Capacity::plan(
            &measured(),
            Demand {
                shards: 3,
                ..demand
            },
        );
        assert!(close(plan.redis_ceiling_requests_per_s, 420_000.0));
        let text = plan.lines(&measured()).join("\n");
        assert!(
            text.contains("3 stock shards is 3 Redis cores") && text.contains(": enough"),
            "{text}"
        );
    }

    #[test]
    fn what_was_not_measured_is_said() {
        let cpu = CpuPerRequest {
            mysql_us_per_order: None,
            redis_us_per_request: None,
            ..measured()
        };
        let demand = Demand {
            requests_per_s: 10_000.0,
            stock: 100,
            shards: 1,
            drain_orders_per_s: 100.0,
            busy: 0.7,
        };
        let plan = Capacity::plan(&cpu, demand);
        assert!(plan.mysql_cores.is_none() && plan.redis_ceiling_requests_per_s.is_none());
        let text = plan.lines(&cpu).join("\n");
        assert!(text.contains("MySQL    not measured"), "{text}");
        assert!(text.contains("Redis    not measured"), "{text}");
    }
}
