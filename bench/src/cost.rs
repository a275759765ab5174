//! What a rehearsal's burst cost each part of the system, in CPU time: the
//! API instances and the workers (in this process, each on a runtime of its
//! own whose threads' CPU clocks are read: [`super::cpu::ThreadGroup`]; or,
//! against running services, their `process_cpu_seconds_total`), Redis
//! (`INFO cpu`), MySQL (its process, when it runs on this machine), and the
//! rest of this process (the load generator).

use std::time::Duration;

use serde::Serialize;

use super::cpu::ThreadGroup;
use flashsale::sale::Redis;

/// The parts' CPU clocks at one moment (seconds; `None`: not measurable).
#[derive(Debug, Clone, Copy, Default)]
pub struct Reading {
    pub process: Option<f64>,
    pub api: Option<f64>,
    pub workers: Option<f64>,
    pub redis: Option<f64>,
    pub mysql: Option<f64>,
}

/// Where the parts' clocks are read.
#[derive(Clone, Default)]
pub struct Meters {
    /// The in-process API instances' threads (`--local`).
    pub api: Option<ThreadGroup>,
    /// The in-process workers' threads (`--local`).
    pub workers: Option<ThreadGroup>,
    /// Redis, when it is one server (a cluster's nodes are not summed).
    pub redis: Option<Redis>,
    /// MySQL's process id, when it runs on this machine.
    pub mysql_pid: Option<String>,
}

fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

impl Meters {
    pub async fn read(&self, remote_api_cpu: Option<f64>) -> Reading {
        Reading {
            process: secs(super::cpu::process()),
            api: secs(self.api.as_ref().and_then(ThreadGroup::cpu)).or(remote_api_cpu),
            workers: secs(self.workers.as_ref().and_then(ThreadGroup::cpu)),
            redis: match &self.redis {
                Some(r) => redis_cpu(r).await,
                None => None,
            },
            mysql: secs(self.mysql_pid.as_deref().and_then(super::cpu::of)),
        }
    }
}

/// `used_cpu_sys + used_cpu_user` of `INFO cpu`.
async fn redis_cpu(redis: &Redis) -> Option<f64> {
    let mut conn = redis.shared().await.ok()?;
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut conn)
        .await
        .ok()?;
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
    };
    Some(field("used_cpu_sys")? + field("used_cpu_user")?)
}

/// The pid of the MySQL server, if `database_url` names this machine and a
/// `mariadbd` or `mysqld` process runs here listening on its port: the one
/// started with `--port=<that port>`, or without `--port` for 3306 (other
/// servers may run beside it, a test's own on ports of their own).
pub fn local_mysql_pid(database_url: &str) -> Option<String> {
    let url = url::Url::parse(database_url).ok()?;
    let host = url.host_str()?.to_owned();
    if !matches!(host.as_str(), "127.0.0.1" | "localhost" | "::1" | "[::1]") {
        return None;
    }
    let port = url.port().unwrap_or(3306);
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let entry = entry.ok()?;
        let pid = entry.file_name().to_str()?.to_owned();
        let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        if !matches!(comm.trim(), "mariadbd" | "mysqld") {
            return None;
        }
        // A zombie (a server that failed to start, not yet reaped) serves
        // nothing, and its empty command line would read as port 3306: its
        // state, the field after the command's closing parenthesis, is Z.
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        let state = stat.rsplit_once(')')?.1.trim_start().chars().next();
        if matches!(state, Some('Z' | 'X')) {
            return None;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let listens = cmdline
            .split(|b| *b == 0)
            .filter_map(|arg| std::str::from_utf8(arg).ok()?.strip_prefix("--port="))
            .filter_map(|p| p.parse::<u16>().ok())
            .next()
            .unwrap_or(3306);
        (listens == port).then_some(pid)
    })
}

/// CPU time per unit of work of each part, in µs (`None`: not measured).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuPerRequest {
    /// The API instances, per request of the burst.
    pub api_us_per_request: Option<f64>,
    /// Redis, per request of the burst.
    pub redis_us_per_request: Option<f64>,
    /// The rest of this process (the load generator), per request.
    pub generator_us_per_request: Option<f64>,
    /// The workers, per persisted order (from the burst's start until the
    /// last order was persisted).
    pub workers_us_per_order: Option<f64>,
    /// MySQL, per persisted order (same span; the bench's own polling of
    /// `tb_order` every 25 ms included).
    pub mysql_us_per_order: Option<f64>,
    /// The API instances, per accepted order (the mix's refusals included:
    /// on the accepting mix, where every request is an accepted order,
    /// this is what an order costs).
    pub api_us_per_accepted_order: Option<f64>,
    /// Redis, per accepted order (the same way).
    pub redis_us_per_accepted_order: Option<f64>,
    /// The whole system, per accepted order: API + Redis + workers + MySQL
    /// (the load generator apart).
    pub system_us_per_accepted_order: Option<f64>,
}

impl CpuPerRequest {
    /// From readings at the burst's start, its end, and when the last
    /// order was persisted (`None`: never), for `requests` and `orders`.
    pub fn new(
        start: Reading,
        burst_end: Reading,
        drained: Option<Reading>,
        requests: u64,
        orders: u64,
    ) -> Self {
        let per = |a: Option<f64>, b: Option<f64>, n: u64| -> Option<f64> {
            Some((b? - a?).max(0.0) * 1e6 / n.max(1) as f64)
        };
        let process = per(start.process, burst_end.process, requests);
        let in_process = |r: Reading| match (r.api, r.workers) {
            (Some(a), Some(w)) => Some(a + w),
            _ => None,
        };
        let rest = match (
            process,
            per(in_process(start), in_process(burst_end), requests),
        ) {
            (Some(p), Some(servers)) => Some((p - servers).max(0.0)),
            (Some(p), None) if start.api.is_none() => Some(p),
            _ => None,
        };
        let drained = drained.unwrap_or_default();
        let api = per(start.api, burst_end.api, orders);
        let redis = per(start.redis, burst_end.redis, orders);
        let workers = per(start.workers, drained.workers, orders);
        let mysql = per(start.mysql, drained.mysql, orders);
        Self {
            api_us_per_request: per(start.api, burst_end.api, requests),
            redis_us_per_request: per(start.redis, burst_end.redis, requests),
            generator_us_per_request: rest,
            workers_us_per_order: workers,
            mysql_us_per_order: mysql,
            api_us_per_accepted_order: api,
            redis_us_per_accepted_order: redis,
            system_us_per_accepted_order: (|| Some(api? + redis? + workers? + mysql?))(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_per_request_is_each_parts_delta_over_its_work() {
        let at = |process, api, workers, redis, mysql| Reading {
            process: Some(process),
            api: Some(api),
            workers: Some(workers),
            redis: Some(redis),
            mysql: Some(mysql),
        };
        let start = at(10.0, 1.0, 0.5, 100.0, 50.0);
        let end = at(16.0, 3.0, 1.5, 101.0, 51.0);
        let drained = at(17.0, 3.0, 2.0, 101.2, 52.0);
        let c = CpuPerRequest::new(start, end, Some(drained), 100_000, 1_000);
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-6;
        assert!(close(c.api_us_per_request, 20.0));
        assert!(close(c.redis_us_per_request, 10.0));
        // 6 s of this process, of which 3 s were the servers'.
        assert!(close(c.generator_us_per_request, 30.0));
        assert!(close(c.workers_us_per_order, 1_500.0));
        assert!(close(c.mysql_us_per_order, 2_000.0));
        // Per accepted order: 2 s of API and 1 s of Redis over 1,000
        // orders, plus the workers' and MySQL's.
        assert!(close(c.api_us_per_accepted_order, 2_000.0));
        assert!(close(c.redis_us_per_accepted_order, 1_000.0));
        assert!(close(c.system_us_per_accepted_order, 6_500.0));
        let never = CpuPerRequest::new(start, end, None, 100_000, 1_000);
        assert!(never.workers_us_per_order.is_none());
        assert!(never.system_us_per_accepted_order.is_none());
    }
}
