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

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::load::Apis;
use crate::world::{Role, World};

/// How long the dashboard may take to show a swap on the fleet's roll (a
/// tick of its reads, and a beat).
const ROLL_LIMIT: Duration = Duration::from_secs(8);

/// What the swaps did: each step's line, at its time from the start.
#[derive(Debug, Default)]
pub struct UpgradeReport {
    pub steps: Vec<(Duration, String)>,
    pub failures: Vec<String>,
    /// Clean stops of an N−1 worker: each may leave its last batch out of
    /// the report's `persisted` (0.1.0 stopped its timeline before its
    /// workers' last batch; fixed in 0.2.0).
    pub previous_worker_stops: u64,
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
    // An operator signs in to the dashboard on the fleet as it starts (N−1)
    // and keeps that session and its anti-CSRF token through every swap.
    let operator = match Operator::sign_in(world, 0).await {
        Ok(operator) => Some(operator),
        Err(e) => {
            report
                .failures
                .push(format!("the operator's sign-in on N−1: {e}"));
            None
        }
    };
    for (k, &(role, i, program)) in plan.iter().enumerate() {
        tokio::time::sleep_until(t0 + gap * (k as u32 + 1)).await;
        let at = t0.elapsed();
        if role == Worker && world.workers[i].spec.program == previous {
            report.previous_worker_stops += 1;
        }
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
        if let Some(operator) = &operator {
            for e in operator.look_and_act(world, current).await {
                println!("upgrade +{:>5.1}s FAILED: {e}", t0.elapsed().as_secs_f64());
                report.failures.push(e);
            }
        }
    }
    tokio::time::sleep_until(until).await;
    report
}

/// A dashboard session made on one release, used on every API whatever it
/// runs: the session cookie, the page's anti-CSRF token and the admin
/// actions are shared between releases (docs/operations.md "Upgrading").
struct Operator {
    cookie: String,
    csrf: String,
    http: reqwest::Client,
}

impl Operator {
    async fn sign_in(world: &World, api: usize) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(3))
            .build()
            .map_err(|e| e.to_string())?;
        let base = &world.api_urls[api];
        let resp = http
            .post(format!("{base}/admin/login"))
            .form(&[("token", world.admin_token.as_str())])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let cookie = resp
            .headers()
            .get("set-cookie")
            .and_then(|c| c.to_str().ok())
            .and_then(|c| c.split(';').next())
            .ok_or(format!("no session cookie: {}", resp.status()))?
            .to_owned();
        let page = http
            .get(format!("{base}/admin/dashboard"))
            .header("cookie", &cookie)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        let marker = "name=\"csrf-token\" content=\"";
        let at = page.find(marker).ok_or("no anti-CSRF token in the page")? + marker.len();
        let csrf = page[at..].split('"').next().unwrap_or_default().to_owned();
        Ok(Self { cookie, csrf, http })
    }

    /// On every API: the session still opens the dashboard's data, an
    /// action with the page's token is taken (the events' dead letters
    /// replayed: none are expected), and on those of this release
    /// (`current`) the fleet's roll lists as many processes of it as run
    /// it. Problems found.
    async fn look_and_act(&self, world: &World, current: &OsStr) -> Vec<String> {
        let mut problems = Vec::new();
        let running_n = world
            .apis
            .iter()
            .chain(&world.workers)
            .filter(|p| p.spec.program == current)
            .count();
        for (base, api) in world.api_urls.iter().zip(&world.apis) {
            // (N−1's dashboard has no fleet: its session is all it is asked.)
            let runs_n = api.spec.program == current;
            let deadline = Instant::now() + ROLL_LIMIT;
            loop {
                match self.data(base).await {
                    Ok(data) => {
                        let on_roll = on_the_roll(&data);
                        if !runs_n || on_roll == running_n {
                            break;
                        }
                        if Instant::now() >= deadline {
                            problems.push(format!(
                                "{base}'s dashboard lists {on_roll} process(es) of this release, \
                                 {running_n} run it: {}",
                                data["fleet"]
                            ));
                            break;
                        }
                    }
                    Err(e) => {
                        problems.push(format!(
                            "{base}: the dashboard's data with a session of N−1: {e}"
                        ));
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            match self
                .http
                .post(format!("{base}/admin/dashboard/action"))
                .header("cookie", &self.cookie)
                .header("x-csrf-token", &self.csrf)
                .header("origin", base)
                .json(&json!({"product_id": "chaos-a", "action": "replay"}))
                .send()
                .await
            {
                Ok(r) if r.status() == 200 => {}
                Ok(r) => problems.push(format!(
                    "{base}: a dashboard action with N−1's session and token answered {}: {}",
                    r.status(),
                    r.text().await.unwrap_or_default()
                )),
                Err(e) => problems.push(format!("{base}: a dashboard action: {e}")),
            }
        }
        problems
    }

    async fn data(&self, base: &str) -> Result<Value, String> {
        let r = self
            .http
            .get(format!("{base}/admin/dashboard/data"))
            .header("cookie", &self.cookie)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if r.status() != 200 {
            return Err(format!("{}", r.status()));
        }
        r.json().await.map_err(|e| e.to_string())
    }
}

/// The processes of this build's release the roll shows as running.
fn on_the_roll(data: &Value) -> usize {
    data["fleet"].as_array().map_or(0, |fleet| {
        fleet
            .iter()
            .filter(|m| {
                m["gone"] == false
                    && m["version"] == flashsale::domain::release::VERSION
                    && m["commit"] == flashsale::domain::release::COMMIT
            })
            .count()
    })
}
