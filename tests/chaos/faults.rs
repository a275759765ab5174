//! The faults, one at a time, chosen by the seeded PRNG: every kind at least
//! once (a shuffled list of all of them), then random extras while the chaos
//! window lasts. Each fault undoes itself before the next one starts
//! (SIGCONT, restart), and after each the world is checked: a process that
//! died on its own is a failure, restarted so the run can go on.
//!
//! Every kill -9 of an API is followed at once (before its restart) by a
//! look at the sharded sale's moves in flight: a move the killed process
//! left between its take and its apply shows there until a search for
//! units or the reconciler finishes it. A move lasts about a millisecond
//! and the sale makes a few dozen, so a kill at a random moment all but
//! never lands in one: the mid-move kill waits for an API's take in
//! Redis's MONITOR feed and kills that API then. It comes once units have
//! begun to move (the sale selling its last units), and again among the
//! extras until one has caught a move between its take and its apply.

use std::time::Duration;

use tokio::time::Instant;

use crate::load::{Answer, Order, Sale, Shop};
use crate::moves::{self, Flying};
use crate::rng::Rng;
use crate::world::{API_START_LIMIT, CLAIM_IDLE_MS, World};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 an API, restart it on the same port.
    KillApi,
    /// kill -9 the API that has just taken units from a stock shard of the
    /// sharded sale (a take seen in Redis's MONITOR feed), before it
    /// applies them where they go; restart it on the same port.
    KillApiMidMove,
    /// kill -9 a worker, restart it under the same consumer name (it resumes
    /// its own pending entries at once).
    KillWorkerSameName,
    /// kill -9 a worker, restart it under a new name (its pending entries
    /// wait for another worker's XAUTOCLAIM).
    KillWorkerNewName,
    /// SIGSTOP a worker for longer than CLAIM_IDLE_MS: the others reclaim its
    /// entries while it may still hold them (and commit them) after SIGCONT.
    StopWorker,
    /// SIGSTOP MariaDB for a few seconds, and restart an API meanwhile.
    FreezeMysql,
    /// kill -9 MariaDB; restart a worker and an API while it is down; then
    /// restart it on the same data directory and port (crash recovery).
    KillMysql,
    /// kill -9 Redis, restart it from its append-only file on the same port.
    KillRedis,
}

impl Fault {
    pub const ALL: [Fault; 8] = [
        Fault::KillApi,
        Fault::KillApiMidMove,
        Fault::KillWorkerSameName,
        Fault::KillWorkerNewName,
        Fault::StopWorker,
        Fault::FreezeMysql,
        Fault::KillMysql,
        Fault::KillRedis,
    ];
}

/// What one fault did, when (since the start of the chaos).
#[derive(Debug)]
pub struct Injected {
    pub at: Duration,
    pub fault: Fault,
    pub what: String,
}

/// What the fault loop did and what went wrong on the way.
#[derive(Debug, Default)]
pub struct ChaosReport {
    pub injected: Vec<Injected>,
    pub failures: Vec<String>,
    /// Every kill -9 of an API, with the moves in flight right after it.
    pub api_kills: Vec<ApiKill>,
}

/// One kill -9 of an API and what the sharded sale had in flight then.
#[derive(Debug, Clone)]
pub struct ApiKill {
    /// Every shard's moves in flight, read right after the kill.
    pub in_flight: Vec<Flying>,
    /// The move the killed API had just taken (a mid-move kill), if any.
    pub aimed_at: Option<String>,
}

impl ApiKill {
    /// The move this API had just taken, if it was still in flight after
    /// its kill: the killed process left it between its take and its
    /// apply (or before it dropped the record), for another to finish.
    pub fn own_move(&self) -> Option<&Flying> {
        let id = self.aimed_at.as_ref()?;
        self.in_flight.iter().find(|m| &m.id == id)
    }

    pub fn left_its_move(&self) -> bool {
        self.own_move().is_some()
    }

    /// Its own move was left not applied: its units between two shards.
    pub fn left_it_in_transit(&self) -> bool {
        self.own_move().is_some_and(|m| !m.applied)
    }

    /// For the fault's line: the moves in flight, and whose.
    fn describe(&self) -> String {
        let units: i64 = self.in_flight.iter().map(|m| m.units).sum();
        let applied = self.in_flight.iter().filter(|m| m.applied).count();
        let mut line = format!(
            "{} move(s) in flight at the kill ({units} units, {applied} applied and not dropped)",
            self.in_flight.len()
        );
        if let Some(id) = &self.aimed_at {
            line += &match self.own_move() {
                Some(m) => format!(
                    ", its own among them: {id}, shard {}->{}, {} units, {}",
                    m.from,
                    m.to,
                    m.units,
                    if m.applied {
                        "applied, record not dropped"
                    } else {
                        "not applied"
                    }
                ),
                None => format!(", not its own {id} (done before the kill landed)"),
            };
        }
        line
    }
}

/// How long a mid-move kill waits for a take before it kills an API
/// anyway (as `KillApi`).
const AIM_LIMIT: Duration = Duration::from_secs(8);

/// Injects faults until every kind has run once and `until` has passed (or
/// `max` faults), with a random pause before each. `shop` sends the probe
/// orders to APIs restarted while MySQL is down.
pub async fn run(
    world: &mut World,
    shop: &Shop,
    sharded: Sale,
    mut rng: Rng,
    until: Instant,
    max: usize,
) -> ChaosReport {
    let t0 = Instant::now();
    let mut must: Vec<Fault> = Fault::ALL.to_vec();
    rng.shuffle(&mut must);
    let mut chaos = Chaos {
        world,
        shop,
        sharded,
        redis: None,
        probes: 0,
        rng,
        report: ChaosReport::default(),
    };
    for n in 0..max {
        let pause = chaos.rng.millis(1500, 4000);
        // The mid-move kill once units move (the sharded sale selling its
        // last units): until then, the next kind of the list goes first.
        let moving = chaos.moves_begun().await;
        if !moving && must.get(n) == Some(&Fault::KillApiMidMove) && n + 1 < must.len() {
            must.swap(n, n + 1);
        }
        // And among the extras until one caught a move between its take and
        // its apply (a kill that lands after the apply, before the record's
        // drop, leaves the move in flight too, its units already arrived).
        let in_transit = chaos
            .report
            .api_kills
            .iter()
            .any(ApiKill::left_it_in_transit);
        let fault = match must.get(n) {
            Some(&f) => f,
            None if Instant::now() + pause >= until => break,
            None if moving && !in_transit => Fault::KillApiMidMove,
            None => Fault::ALL[chaos.rng.index(Fault::ALL.len())],
        };
        tokio::time::sleep(pause).await;
        let at = t0.elapsed();
        let what = chaos.inject(fault).await;
        println!("chaos +{:>5.1}s {fault:?}: {what}", at.as_secs_f64());
        chaos.report.injected.push(Injected { at, fault, what });
        let failures = chaos.world.ensure_up().await;
        chaos.report.failures.extend(failures);
    }
    chaos.report
}

struct Chaos<'w> {
    world: &'w mut World,
    shop: &'w Shop,
    /// The sale of several stock shards.
    sharded: Sale,
    /// A connection to read its moves with at once after a kill.
    redis: Option<redis::aio::MultiplexedConnection>,
    probes: u64,
    rng: Rng,
    report: ChaosReport,
}

impl Chaos<'_> {
    async fn inject(&mut self, fault: Fault) -> String {
        match fault {
            Fault::KillApi => self.kill_api().await,
            Fault::KillApiMidMove => self.kill_api_mid_move().await,
            Fault::KillWorkerSameName => self.kill_worker(false).await,
            Fault::KillWorkerNewName => self.kill_worker(true).await,
            Fault::StopWorker => self.stop_worker().await,
            Fault::FreezeMysql => self.freeze_mysql().await,
            Fault::KillMysql => self.kill_mysql().await,
            Fault::KillRedis => self.kill_redis().await,
        }
    }

    /// Records a failure; returns the text for the fault's description.
    fn fail(&mut self, failure: String) -> String {
        let short = failure.lines().next().unwrap_or_default().to_owned();
        self.report.failures.push(failure);
        format!("FAILED: {short}")
    }

    async fn kill_api(&mut self) -> String {
        let i = self.rng.index(self.world.apis.len());
        self.world.apis[i].kill9();
        self.api_killed(i, None, String::new()).await
    }

    /// Waits (up to AIM_LIMIT) for an API to take units from a shard of
    /// the sharded sale, and kills it as the take goes by: before it
    /// applies them, or at least before it drops the move's record (the
    /// kill's line says which).
    async fn kill_api_mid_move(&mut self) -> String {
        let url = self.world.redis_url.clone();
        let sale = self.sharded.clone();
        let pids: Vec<Option<u32>> = self.world.apis.iter().map(|p| p.pid()).collect();
        let aimed = moves::kill_at_take(&url, &sale, &pids, AIM_LIMIT).await;
        match aimed {
            Ok(Some(a)) => {
                let i = a.process;
                // (Reaps it: SIGKILL is sent.)
                self.world.apis[i].kill9();
                let what = format!(
                    " as it took move {} from shard {} (waited {:.1?}, killed {} after the take)",
                    a.move_id,
                    a.from,
                    a.after,
                    a.after_take
                        .map_or("?".into(), |d| format!("{} µs", d.as_micros()))
                );
                self.api_killed(i, Some(a.move_id), what).await
            }
            Ok(None) => {
                let i = self.rng.index(self.world.apis.len());
                self.world.apis[i].kill9();
                let why = format!(" (no take of the sharded sale within {AIM_LIMIT:?})");
                self.api_killed(i, None, why).await
            }
            Err(e) => self.fail(format!("MONITOR of the test's redis: {e}")),
        }
    }

    /// API `i` was just killed: the moves in flight read at once, then its
    /// restart after a random time down.
    async fn api_killed(&mut self, i: usize, aimed_at: Option<String>, what: String) -> String {
        let in_flight = match self.in_flight().await {
            Some(flying) => flying,
            None => {
                let failure = format!("the moves in flight unread after the kill of api-{i}");
                self.fail(failure);
                Vec::new()
            }
        };
        let down = self.rng.millis(200, 1500);
        tokio::time::sleep(down).await;
        self.world.apis[i].start();
        let kill = ApiKill {
            in_flight,
            aimed_at,
        };
        let moves = kill.describe();
        self.report.api_kills.push(kill);
        match self.world.await_api(i, API_START_LIMIT).await {
            Ok(up) => {
                format!("kill -9 api-{i}{what}; {moves}; down {down:?}, /healthz after {up:.1?}")
            }
            Err(e) => self.fail(e),
        }
    }

    /// The sharded sale's moves in flight now (None: Redis did not answer).
    async fn in_flight(&mut self) -> Option<Vec<Flying>> {
        for _ in 0..2 {
            if self.redis.is_none() {
                let client = redis::Client::open(self.world.redis_url.as_str()).ok()?;
                self.redis = client.get_multiplexed_async_connection().await.ok();
            }
            let r = self.redis.as_mut()?;
            match moves::in_flight(r, &self.sharded).await {
                Ok(flying) => return Some(flying),
                // Redis was restarted since: once more on a new connection.
                Err(_) => self.redis = None,
            }
        }
        None
    }

    /// Whether the sharded sale has moved units between its shards yet.
    async fn moves_begun(&mut self) -> bool {
        if self.redis.is_none() {
            self.in_flight().await;
        }
        let Some(r) = self.redis.as_mut() else {
            return false;
        };
        match moves::given(r, &self.sharded).await {
            Ok(n) => n > 0,
            Err(_) => {
                self.redis = None;
                false
            }
        }
    }

    async fn kill_worker(&mut self, new_name: bool) -> String {
        let i = self.rng.index(self.world.workers.len());
        let old = self.world.consumer_name(i);
        self.world.workers[i].kill9();
        let down = self.rng.millis(100, 1000);
        tokio::time::sleep(down).await;
        let name = self.world.restart_worker(i, new_name);
        match self.world.await_worker(i).await {
            Ok(()) => format!("kill -9 worker-{i} ({old}), down {down:?}, restarted as {name}"),
            Err(e) => self.fail(e),
        }
    }

    async fn stop_worker(&mut self) -> String {
        let i = self.rng.index(self.world.workers.len());
        let hold = Duration::from_millis(CLAIM_IDLE_MS) + self.rng.millis(1000, 3000);
        self.world.workers[i].signal("STOP");
        tokio::time::sleep(hold).await;
        self.world.workers[i].signal("CONT");
        format!("SIGSTOP worker-{i} for {hold:?} (claim idle {CLAIM_IDLE_MS} ms), SIGCONT")
    }

    /// The API restart happens while MariaDB is frozen: a connection to it
    /// opens (the kernel accepts) and then hangs, the nastiest kind of down.
    async fn freeze_mysql(&mut self) -> String {
        let frozen_for = self.rng.millis(3000, 5000);
        let t = Instant::now();
        self.world.mysql.signal("STOP");
        tokio::time::sleep(self.rng.millis(300, 1000)).await;
        let api = self.restart_api_without_mysql("frozen").await;
        tokio::time::sleep_until(t + frozen_for).await;
        self.world.mysql.signal("CONT");
        let back = self.mysql_back().await;
        format!(
            "SIGSTOP mariadb for {:.1?}; {api}; SIGCONT{back}",
            t.elapsed()
        )
    }

    /// Restarts of a worker and an API while MariaDB is dead (connections
    /// refused): both must start anyway and wait for it.
    async fn kill_mysql(&mut self) -> String {
        let down_for = self.rng.millis(2500, 4000);
        let t = Instant::now();
        self.world.mysql.kill9();
        tokio::time::sleep(self.rng.millis(200, 600)).await;
        let j = self.rng.index(self.world.workers.len());
        let new_name = self.rng.chance(50);
        let name = self.world.restart_worker(j, new_name);
        let api = self.restart_api_without_mysql("down").await;
        let worker = match self.world.await_worker(j).await {
            Ok(()) => format!("worker-{j} restarted meanwhile as {name}"),
            Err(e) => self.fail(format!("while MariaDB was down: {e}")),
        };
        tokio::time::sleep_until(t + down_for).await;
        self.world.mysql.start();
        let back = self.mysql_back().await;
        format!(
            "kill -9 mariadb, down {:.1?}; {api}; {worker}; restarted{back}",
            t.elapsed()
        )
    }

    /// Restarts an API while MariaDB is `state` (down or frozen): it must
    /// answer `/healthz` and decide an order (the order path never needs
    /// MySQL) before MariaDB is back.
    async fn restart_api_without_mysql(&mut self, state: &str) -> String {
        let i = self.rng.index(self.world.apis.len());
        let up = match self.world.restart_api(i).await {
            Ok(up) => up,
            Err(e) => return self.fail(format!("while MariaDB was {state}: {e}")),
        };
        self.probes += 1;
        let order = Order {
            key: format!("probe{}-{:08x}", self.probes, self.rng.next_u64() as u32),
            user: 2_000_000 + self.probes,
            sale: self.rng.index(self.shop.sale_count()),
            qty: 1,
        };
        let answer = match self.shop.probe(i, &order).await {
            Answer::Accepted(_) => "accepted".to_owned(),
            Answer::Refused(code) => code,
            Answer::Ambiguous => {
                return self.fail(format!(
                    "api-{i}, restarted while MariaDB was {state}, answered /healthz but \
                     gave no definitive answer to an order (see the 503s in the answers)"
                ));
            }
        };
        format!("api-{i} restarted meanwhile, /healthz after {up:.1?}, a probe order {answer}")
    }

    async fn kill_redis(&mut self) -> String {
        self.world.redis.kill9();
        let down = self.rng.millis(500, 2000);
        tokio::time::sleep(down).await;
        self.world.redis.start();
        let t = Instant::now();
        if !self.world.redis_up(Duration::from_secs(10)).await {
            let tail = self.world.redis.log_tail(20);
            return self.fail(format!(
                "redis did not come back from its AOF within 10 s:\n{tail}"
            ));
        }
        format!(
            "kill -9 redis, down {down:?}, answering {:.1?} after restart",
            t.elapsed()
        )
    }

    async fn mysql_back(&mut self) -> String {
        let t = Instant::now();
        if self.world.mysql_up(Duration::from_secs(30)).await {
            format!(", answering after {:.1?}", t.elapsed())
        } else {
            let tail = self.world.mysql.log_tail(30);
            format!(
                ", {}",
                self.fail(format!("mariadb did not come back within 30 s:\n{tail}"))
            )
        }
    }
}
