//! The buyers. Every order attempt carries its own `Idempotency-Key`; an
//! answer that does not say what happened (a transport error, a timeout, a
//! 503) is ambiguous, and the same request is sent again under the same key,
//! to any API, until the answer is definitive: 202 (the order, possibly
//! replayed) or a 409 refusal. The ledger records every status seen and every
//! order id each key was given: it is what the clients were told, which the
//! books must match exactly.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::rng::Rng;

/// The APIs the clients send to, as a load balancer keeps them: one taken
/// out of service (before an upgrade's SIGTERM, back once it is ready
/// again) gets no new request; a request already sent is answered by it.
#[derive(Clone)]
pub struct Apis {
    urls: Arc<Vec<String>>,
    serving: Arc<Vec<AtomicBool>>,
}

impl Apis {
    pub fn new(urls: Vec<String>) -> Self {
        let serving = urls.iter().map(|_| AtomicBool::new(true)).collect();
        Self {
            urls: Arc::new(urls),
            serving: Arc::new(serving),
        }
    }

    pub fn url(&self, i: usize) -> &str {
        &self.urls[i]
    }

    /// Takes API `i` out of service, or puts it back.
    pub fn set_serving(&self, i: usize, serving: bool) {
        self.serving[i].store(serving, Ordering::SeqCst);
    }

    /// The APIs in service (every one, should none be).
    fn in_service(&self) -> Vec<&str> {
        let serving: Vec<&str> = (0..self.urls.len())
            .filter(|&i| self.serving[i].load(Ordering::SeqCst))
            .map(|i| self.urls[i].as_str())
            .collect();
        if serving.is_empty() {
            self.urls.iter().map(String::as_str).collect()
        } else {
            serving
        }
    }

    /// `api` while it is in service, else one that is: where a client's
    /// next request goes after a wait (the balancer's rotation now).
    pub fn still<'a>(&'a self, api: &'a str) -> &'a str {
        let serving = self.in_service();
        if serving.contains(&api) {
            api
        } else {
            serving[0]
        }
    }

    /// One API in service, at random.
    pub fn pick(&self, rng: &mut Rng) -> &str {
        let serving = self.in_service();
        serving[rng.index(serving.len())]
    }

    /// The first and the last API in service (the same when one is).
    fn two(&self) -> (&str, &str) {
        let serving = self.in_service();
        (serving[0], serving[serving.len() - 1])
    }
}

/// One sale of the run.
#[derive(Debug, Clone)]
pub struct Sale {
    pub id: String,
    pub stock: u64,
    /// Its stock shards (1: one, as most sales).
    pub shards: u16,
    /// With a waiting room: a buyer joins, polls until admitted, and orders
    /// with the admission (`Admission-Token`).
    pub room: bool,
}

/// One order attempt: a key and the request it stands for.
#[derive(Debug, Clone)]
pub struct Order {
    pub key: String,
    pub user: u64,
    pub sale: usize,
    pub qty: u64,
}

/// The refusals that are definitive answers in this scenario.
const REFUSALS: [&str; 3] = ["sold_out", "insufficient_stock", "limit_exceeded"];
/// Bounds on the retries of one attempt (the settle phase retries again).
const MAX_TRIES: usize = 40;
const PLACE_LIMIT: Duration = Duration::from_secs(20);
/// How often the first try is sent to both APIs at once.
const DOUBLE_SEND_PERCENT: u64 = 5;
/// How often an accepted order is asked for again under its key.
const REPLAY_PERCENT: u64 = 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Accepted(String),
    Refused(String),
    Ambiguous,
}

/// `attempts` orders from users `1..=users`, on random sales, for 1 unit (70%)
/// or 2 (the per-user limit, so some users hit it).
pub fn plan(rng: &mut Rng, sales: usize, attempts: usize, users: u64) -> Vec<Order> {
    (0..attempts)
        .map(|i| Order {
            key: format!("k{i:05}-{:08x}", rng.next_u64() as u32),
            user: 1 + rng.below(users),
            sale: rng.index(sales),
            qty: if rng.chance(30) { 2 } else { 1 },
        })
        .collect()
}

/// Units the plan would buy from each sale if stock were unlimited (the
/// per-user limit still applying, attempts in plan order).
pub fn demand(plan: &[Order], sales: usize, limit: u64) -> Vec<u64> {
    let mut bought: HashMap<(u64, usize), u64> = HashMap::new();
    let mut demand = vec![0; sales];
    for o in plan {
        let units = bought.entry((o.user, o.sale)).or_default();
        if *units + o.qty <= limit {
            *units += o.qty;
            demand[o.sale] += o.qty;
        }
    }
    demand
}

/// What one key was told.
#[derive(Debug, Clone)]
pub struct KeyRecord {
    pub order: Order,
    /// Every order id a 202 gave this key (one, or the replays disagree).
    pub order_ids: BTreeSet<String>,
    /// The definitive refusal, if that is how it ended.
    pub refusal: Option<String>,
}

impl KeyRecord {
    pub fn settled(&self) -> bool {
        !self.order_ids.is_empty() || self.refusal.is_some()
    }
}

#[derive(Debug, Default, Clone)]
pub struct Book {
    /// Answers by status and error code (`202`, `409 sold_out`, `503
    /// unavailable`, `transport connect`, ...).
    pub statuses: BTreeMap<String, u64>,
    pub keys: BTreeMap<String, KeyRecord>,
    /// Answers that must never happen (a 500, an unexpected refusal, a 202
    /// that does not match its request).
    pub failures: Vec<String>,
    /// Every order id answered 202, in the order they were first told (the
    /// payer takes them in this order).
    pub told: Vec<Told>,
}

/// An order a client was told about (202), as the payer needs it.
#[derive(Debug, Clone)]
pub struct Told {
    pub order_id: String,
    pub qty: u64,
}

#[derive(Debug, Default)]
pub struct Ledger(Mutex<Book>);

impl Ledger {
    pub fn book(&self) -> MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn begin(&self, order: &Order) {
        self.book()
            .keys
            .entry(order.key.clone())
            .or_insert_with(|| KeyRecord {
                order: order.clone(),
                order_ids: BTreeSet::new(),
                refusal: None,
            });
    }

    fn status(&self, label: String) {
        *self.book().statuses.entry(label).or_default() += 1;
    }

    fn failure(&self, what: String) {
        self.book().failures.push(what);
    }

    fn settle(&self, order: &Order, answer: &Answer) {
        let mut guard = self.book();
        let book = &mut *guard;
        let record = book.keys.get_mut(&order.key).expect("begun");
        match answer {
            Answer::Accepted(id) => {
                if record.order_ids.insert(id.clone()) {
                    let told = Told {
                        order_id: id.clone(),
                        qty: order.qty,
                    };
                    book.told.push(told);
                }
            }
            Answer::Refused(code) => record.refusal = Some(code.clone()),
            Answer::Ambiguous => {}
        }
    }

    /// The attempts still waiting for a definitive answer.
    pub fn unsettled(&self) -> Vec<Order> {
        self.book()
            .keys
            .values()
            .filter(|r| !r.settled())
            .map(|r| r.order.clone())
            .collect()
    }
}

/// The buyers' side: the APIs, the sales and the ledger.
#[derive(Clone)]
pub struct Shop {
    http: reqwest::Client,
    pub apis: Apis,
    sales: Arc<Vec<Sale>>,
    pub ledger: Arc<Ledger>,
    /// The admissions the buyers hold, by (user, sale).
    admissions: Arc<Mutex<HashMap<(u64, usize), String>>>,
}

/// How long a buyer polls its place in a waiting room before the attempt
/// counts as unanswered (retried).
const ADMISSION_LIMIT: Duration = Duration::from_secs(10);
const POLL_EVERY: Duration = Duration::from_millis(250);

impl Shop {
    pub fn new(apis: Apis, sales: Vec<Sale>) -> Self {
        Self {
            // Above the service's REQUEST_TIMEOUT_MS: a slow answer is its
            // 503, a client timeout means the process is gone or stuck.
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .connect_timeout(Duration::from_millis(500))
                .build()
                .expect("http client"),
            apis,
            sales: Arc::new(sales),
            ledger: Arc::default(),
            admissions: Arc::default(),
        }
    }

    /// Sends `order` until its answer is definitive, `stop` is set, or the
    /// bounds run out (then it stays unsettled, for `settle`). Now and then
    /// the first try goes to two APIs at once, and an accepted order is asked
    /// for again: both must answer the one order of the key.
    pub async fn place(&self, order: &Order, rng: &mut Rng, stop: Option<&AtomicBool>) -> Answer {
        self.ledger.begin(order);
        let deadline = Instant::now() + PLACE_LIMIT;
        let mut pause = Duration::from_millis(100);
        for attempt in 0..MAX_TRIES {
            let answer = if attempt == 0 && rng.chance(DOUBLE_SEND_PERCENT) {
                self.try_twice(order).await
            } else {
                self.try_once(self.api(rng), order).await
            };
            if answer != Answer::Ambiguous {
                self.ledger.settle(order, &answer);
                if matches!(answer, Answer::Accepted(_)) && rng.chance(REPLAY_PERCENT) {
                    self.replay(order, rng).await;
                }
                return answer;
            }
            let stopped = stop.is_some_and(|s| s.load(Ordering::Relaxed));
            if stopped || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(pause + rng.millis(0, 100)).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
        Answer::Ambiguous
    }

    fn api(&self, rng: &mut Rng) -> &str {
        self.apis.pick(rng)
    }

    /// The same request to every API at once (a client's duplicate send):
    /// each definitive answer is recorded.
    async fn try_twice(&self, order: &Order) -> Answer {
        let (first, last) = self.apis.two();
        // Behind a waiting room the buyer is admitted first, once: the
        // two sends carry the same admission.
        if self.sales[order.sale].room
            && let Err(answer) = self.admission(first, order).await
        {
            self.ledger.settle(order, &answer);
            return answer;
        }
        let (a, b) = tokio::join!(self.try_once(first, order), self.try_once(last, order));
        for answer in [&a, &b] {
            self.ledger.settle(order, answer);
        }
        match (a, b) {
            (accepted @ Answer::Accepted(_), _) | (_, accepted @ Answer::Accepted(_)) => accepted,
            (Answer::Ambiguous, other) | (other, _) => other,
        }
    }

    /// Asks for an accepted order again under its key: the answer must be
    /// that order (recorded: a second id fails check 1), never a refusal.
    async fn replay(&self, order: &Order, rng: &mut Rng) {
        match self.try_once(self.api(rng), order).await {
            Answer::Refused(code) => self.ledger.failure(format!(
                "a replay of accepted key {} was refused: {code}",
                order.key
            )),
            answer => self.ledger.settle(order, &answer),
        }
    }

    /// Sends `order` to API `api` only (a few tries, about a second): the
    /// probe of a process restarted while MySQL is down.
    pub async fn probe(&self, api: usize, order: &Order) -> Answer {
        self.ledger.begin(order);
        for _ in 0..5 {
            let answer = self.try_once(self.apis.url(api), order).await;
            if answer != Answer::Ambiguous {
                self.ledger.settle(order, &answer);
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Answer::Ambiguous
    }

    pub fn sale_count(&self) -> usize {
        self.sales.len()
    }

    /// The buyer's admission to the sale's waiting room: held from before,
    /// or joined (the same ticket on every join) and polled on `api` until
    /// admitted. Err: the answer the attempt gets instead (the room says
    /// the sale is sold out, or no answer yet: retried).
    async fn admission(&self, api: &str, order: &Order) -> Result<String, Answer> {
        let held = self
            .lock_admissions()
            .get(&(order.user, order.sale))
            .cloned();
        if let Some(admission) = held {
            return Ok(admission);
        }
        let sale = &self.sales[order.sale].id;
        let joined = self
            .room_call(
                self.http
                    .post(format!("{}/api/sales/{sale}/queue", self.apis.still(api)))
                    .json(&json!({"user_id": order.user})),
                order,
                "join",
            )
            .await?;
        let Some(ticket) = joined["ticket"].as_str() else {
            self.ledger
                .failure(format!("{api}: a join without a ticket: {joined}"));
            return Err(Answer::Ambiguous);
        };
        let deadline = Instant::now() + ADMISSION_LIMIT;
        while Instant::now() < deadline {
            let standing = self
                .room_call(
                    self.http.get(format!(
                        "{}/api/sales/{sale}/queue/{ticket}",
                        self.apis.still(api)
                    )),
                    order,
                    "poll",
                )
                .await?;
            match standing["status"].as_str() {
                Some("admitted") => {
                    let Some(admission) = standing["admission"].as_str() else {
                        self.ledger
                            .failure(format!("{api}: admitted without an admission: {standing}"));
                        return Err(Answer::Ambiguous);
                    };
                    self.lock_admissions()
                        .insert((order.user, order.sale), admission.to_owned());
                    return Ok(admission.to_owned());
                }
                Some("waiting") => tokio::time::sleep(POLL_EVERY).await,
                Some("sold_out") => {
                    self.ledger.status("room sold_out".into());
                    return Err(Answer::Refused("sold_out".into()));
                }
                _ => {
                    // `expired` or `ended`: neither can happen in this run
                    // (admissions last longer than it, the sale too).
                    self.ledger
                        .failure(format!("{api}: a buyer's place in the room: {standing}"));
                    return Err(Answer::Ambiguous);
                }
            }
        }
        self.ledger.status("room not admitted in time".into());
        Err(Answer::Ambiguous)
    }

    fn lock_admissions(&self) -> MutexGuard<'_, HashMap<(u64, usize), String>> {
        self.admissions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A join or a poll of the room, as the buyer: its JSON on a 200; a
    /// `sold_out` refusal as the order's; anything else unanswered (a 503
    /// with its `Retry-After`; other answers are wrong).
    async fn room_call(
        &self,
        req: reqwest::RequestBuilder,
        order: &Order,
        what: &str,
    ) -> Result<Value, Answer> {
        let resp = match req.bearer_auth(buyer_token(order.user)).send().await {
            Ok(resp) => resp,
            Err(e) => {
                self.ledger.status(transport_label(&e));
                return Err(Answer::Ambiguous);
            }
        };
        let status = resp.status().as_u16();
        let retry_after = resp.headers().contains_key("retry-after");
        let Ok(body) = resp.json::<Value>().await else {
            self.ledger
                .status(format!("room {what} {status} (body lost)"));
            return Err(Answer::Ambiguous);
        };
        let code = body["error"].as_str().unwrap_or_default();
        match status {
            200 => Ok(body),
            409 if code == "sold_out" => {
                self.ledger.status(format!("room {what} 409 sold_out"));
                Err(Answer::Refused("sold_out".into()))
            }
            503 => {
                self.ledger.status(format!("room {what} 503 {code}"));
                if !retry_after {
                    self.ledger
                        .failure(format!("room {what}: 503 {code} without Retry-After"));
                }
                Err(Answer::Ambiguous)
            }
            _ => {
                self.ledger.status(format!("room {what} {status} {code}"));
                self.ledger.failure(format!(
                    "room {what} answered {status} {body} for {order:?}"
                ));
                Err(Answer::Ambiguous)
            }
        }
    }

    /// One request to one API, as its buyer, classified.
    async fn try_once(&self, api: &str, order: &Order) -> Answer {
        let sale = &self.sales[order.sale].id;
        let admission = match self.sales[order.sale].room {
            true => match self.admission(api, order).await {
                Ok(admission) => Some(admission),
                Err(answer) => return answer,
            },
            false => None,
        };
        // (Polling for an admission takes a while: the order goes where
        // the balancer sends it now.)
        let api = self.apis.still(api);
        let body = json!({"user_id": order.user, "product_id": sale, "quantity": order.qty});
        let mut req = self
            .http
            .post(format!("{api}/api/orders"))
            .bearer_auth(buyer_token(order.user))
            .header("Idempotency-Key", &order.key);
        if let Some(admission) = &admission {
            req = req.header("Admission-Token", admission);
        }
        let sent = req.json(&body).send().await;
        let resp = match sent {
            Ok(resp) => resp,
            Err(e) => {
                self.ledger.status(transport_label(&e));
                return Answer::Ambiguous;
            }
        };
        let status = resp.status().as_u16();
        let replayed = resp.headers().contains_key("idempotent-replayed");
        let retry_after = resp.headers().contains_key("retry-after");
        let Ok(body) = resp.json::<Value>().await else {
            self.ledger.status(format!("{status} (body lost)"));
            return Answer::Ambiguous;
        };
        let code = body["error"].as_str().unwrap_or_default().to_owned();
        match status {
            202 => {
                let label = if replayed { "202 replayed" } else { "202" };
                self.ledger.status(label.into());
                self.accepted(order, &body)
            }
            409 if REFUSALS.contains(&code.as_str()) => {
                self.ledger.status(format!("409 {code}"));
                Answer::Refused(code)
            }
            503 => {
                self.ledger.status(format!("503 {code}"));
                // A 503 says when to come back: a client of a swap or of a
                // fault is never left to guess.
                if !retry_after {
                    self.ledger
                        .failure(format!("{api} answered 503 {code} without Retry-After"));
                }
                Answer::Ambiguous
            }
            _ => {
                self.ledger.status(format!("{status} {code}"));
                self.ledger
                    .failure(format!("{api} answered {status} {body} to {order:?}"));
                // A 5xx says nothing about the order: retry it. Any other
                // answer is definitive, and wrong.
                if status >= 500 {
                    Answer::Ambiguous
                } else {
                    Answer::Refused(format!("{status} {code}"))
                }
            }
        }
    }

    /// A 202's order must be the one asked for.
    fn accepted(&self, order: &Order, body: &Value) -> Answer {
        let sale = &self.sales[order.sale].id;
        let id = body["order_id"].as_str().unwrap_or_default().to_owned();
        // (A sale's stock shard k names its orders `<sale>~<k>...:`.)
        let of = flashsale::domain::OrderId::parse(&id).map(|(_, of)| of.sale());
        let matches = of.is_some_and(|of| of.as_str() == sale.as_str())
            && body["user_id"] == order.user
            && body["product_id"] == sale.as_str()
            && body["quantity"] == order.qty;
        if !matches {
            self.ledger
                .failure(format!("202 {body} does not match {order:?}"));
        }
        Answer::Accepted(id)
    }

    /// Replays every unsettled key until it is settled (a few rounds).
    pub async fn settle(&self, rng: &mut Rng) {
        for _ in 0..3 {
            let open = self.ledger.unsettled();
            if open.is_empty() {
                return;
            }
            for chunk in open.chunks(32) {
                let tasks: Vec<_> = chunk
                    .iter()
                    .map(|order| {
                        let (shop, order, mut rng) = (self.clone(), order.clone(), rng.fork());
                        tokio::spawn(async move { shop.place(&order, &mut rng, None).await })
                    })
                    .collect();
                for t in tasks {
                    let _ = t.await;
                }
            }
        }
    }

    /// New buyers take a sale's last units, one each, until it answers
    /// `sold_out` (bounded): the sale must end sold out however the plan's
    /// demand fell and whatever the payment timeouts gave back. `round`
    /// (below 10) picks buyers no earlier round used. Returns the units
    /// they bought.
    pub async fn sell_out(&self, sale: usize, round: u64, rng: &mut Rng) -> u64 {
        assert!(
            round < 10,
            "sell_out round {round}: the buyers' ids would overlap"
        );
        let mut units = 0;
        let first_user = 1_000_000 + 100_000 * sale as u64 + 10_000 * round;
        for n in 0..self.sales[sale].stock + 50 {
            let order = Order {
                key: format!("mop{sale}-r{round}-{n:05}-{:08x}", rng.next_u64() as u32),
                user: first_user + n,
                sale,
                qty: 1,
            };
            match self.place(&order, rng, None).await {
                Answer::Accepted(_) => units += 1,
                Answer::Refused(code) if code == "sold_out" => break,
                _ => {}
            }
        }
        units
    }
}

/// Runs the plan from `tasks` concurrent buyers, paced evenly over `window`,
/// until the plan is done or `stop` is set. Returns how many attempts began.
pub async fn run(
    shop: Shop,
    plan: Vec<Order>,
    tasks: usize,
    window: Duration,
    stop: Arc<AtomicBool>,
    mut rng: Rng,
) -> usize {
    let plan = Arc::new(plan);
    let (next, begun) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let pace = window / plan.len() as u32;
    let t0 = Instant::now();
    let buyers: Vec<_> = (0..tasks)
        .map(|_| {
            let (shop, plan, stop) = (shop.clone(), plan.clone(), stop.clone());
            let (next, begun) = (next.clone(), begun.clone());
            let mut rng = rng.fork();
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= plan.len() {
                        break;
                    }
                    tokio::time::sleep_until(t0 + pace * i as u32).await;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    begun.fetch_add(1, Ordering::Relaxed);
                    shop.place(&plan[i], &mut rng, Some(&stop)).await;
                }
            })
        })
        .collect();
    for b in buyers {
        b.await.expect("a buyer task panicked");
    }
    begun.load(Ordering::Relaxed)
}

fn transport_label(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "other"
    };
    format!("transport {kind}")
}

/// A buyer's bearer token (HS256, the services' `JWT_SECRET`, an hour left).
pub fn buyer_token(user: u64) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 3600;
    let key = jsonwebtoken::EncodingKey::from_secret(crate::world::JWT_SECRET.as_bytes())
        .expect("an HMAC key");
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &json!({"sub": user.to_string(), "exp": exp}),
        &key,
    )
    .expect("a token")
}
