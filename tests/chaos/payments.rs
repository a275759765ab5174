//! The payment side. Each order a client was told about (202) is paid once,
//! as a payment provider does it: a signed `payment.succeeded` (Standard
//! Webhooks, `PAYMENT_WEBHOOK_SECRETS`) for price × quantity, under the
//! payment id `pay-<order id>`, sent after a random delay of up to twice the
//! payment timeout (so many come after their order was cancelled: late
//! payments) to a random API, and sent again, under the same payment id and
//! a new `webhook-id`, after anything but a 200 (409 `order_pending`, 503,
//! a transport error) until one comes, within a bound. The first 200 is the
//! payment's answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rust_decimal::Decimal;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::load::{Apis, Ledger, Told};
use crate::rng::Rng;

/// The secret the payment side signs with (`PAYMENT_WEBHOOK_SECRETS`).
pub const PAYMENT_SECRET: &str = "whsec_Y2hhb3MtcGF5bWVudC1wcm92aWRlci1zZWNyZXQtMDE=";
/// `SALE_CURRENCY`'s default, which the services run with.
const CURRENCY: &str = "CNY";
/// Bound on the sends of one payment (the end of the run sends the
/// unanswered ones again).
const PAY_LIMIT: Duration = Duration::from_secs(60);
/// Payments sent at once.
const IN_FLIGHT: usize = 16;

/// The payment id of an order's one payment.
pub fn payment_id(order_id: &str) -> String {
    format!("pay-{order_id}")
}

/// The 200 a payment ended with.
#[derive(Debug, Clone)]
pub struct PaidAnswer {
    /// `paid`, `paid_again` or `refund_due`.
    pub result: String,
    pub order_status: String,
    /// The answer of a send the books had recorded before (an earlier
    /// send's answer was lost).
    pub replayed: bool,
    pub tries: u32,
}

#[derive(Debug, Default)]
pub struct PayBook {
    /// Orders whose payment is on its way (or done).
    scheduled: BTreeSet<String>,
    /// Each order's payment's answer, by order id.
    pub answers: BTreeMap<String, PaidAnswer>,
    /// Answers by status and code (`200 paid`, `409 order_pending`, ...).
    pub statuses: BTreeMap<String, u64>,
    /// Answers that must never happen (any 4xx but 409 `order_pending`, a
    /// 5xx but 503, a 200 that does not match its payment).
    pub failures: Vec<String>,
}

/// How one send went.
enum Sent {
    Answered(PaidAnswer),
    /// Send it again.
    Again,
    /// A definitive wrong answer (recorded as a failure): stop.
    Wrong,
}

#[derive(Clone)]
pub struct Payer {
    http: reqwest::Client,
    apis: Apis,
    secret: Arc<flashsale::domain::webhook::Secret>,
    price: Decimal,
    /// The longest delay before a payment is sent.
    max_delay: Duration,
    /// Set at the end of the run: every waiting payment is sent at once.
    hurry: Arc<watch::Sender<bool>>,
    in_flight: Arc<Semaphore>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    book: Arc<Mutex<PayBook>>,
}

impl Payer {
    pub fn new(apis: Apis, price: &str, max_delay: Duration) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .connect_timeout(Duration::from_millis(500))
                .build()
                .expect("http client"),
            apis,
            secret: Arc::new(
                flashsale::domain::webhook::Secret::parse(PAYMENT_SECRET).expect("a secret"),
            ),
            price: price.parse().expect("a decimal price"),
            max_delay,
            hurry: Arc::new(watch::channel(false).0),
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
            tasks: Arc::default(),
            book: Arc::default(),
        }
    }

    pub fn book(&self) -> MutexGuard<'_, PayBook> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pays each order as it is told, after its random delay, until `stop`
    /// (then [`Payer::pay_now`] takes over).
    pub async fn follow(self, ledger: Arc<Ledger>, mut rng: Rng, stop: Arc<AtomicBool>) {
        let mut seen = 0;
        loop {
            let new: Vec<Told> = ledger.book().told[seen..].to_vec();
            seen += new.len();
            for told in new {
                let max = self.max_delay.as_millis() as u64;
                let delay = rng.millis(0, max);
                self.schedule(told, delay, rng.fork());
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The end of the run: every payment still waiting is sent now, and
    /// every told order not paid yet is paid now, each until it is
    /// answered (a few rounds of [`PAY_LIMIT`] at most). Returns the told
    /// orders still unanswered (none, unless the services stopped
    /// answering).
    pub async fn pay_now(&self, ledger: &Ledger, rng: &mut Rng) -> Vec<String> {
        self.hurry.send_replace(true);
        for _ in 0..3 {
            let told = ledger.book().told.clone();
            for t in told {
                if !self.book().answers.contains_key(&t.order_id) {
                    self.schedule(t, Duration::ZERO, rng.fork());
                }
            }
            self.join().await;
            let open = self.unanswered(ledger);
            if open.is_empty() {
                return open;
            }
            // Those whose sends ran out of time: again, from scratch.
            let mut book = self.book();
            for id in &open {
                book.scheduled.remove(id);
            }
        }
        self.unanswered(ledger)
    }

    fn unanswered(&self, ledger: &Ledger) -> Vec<String> {
        let book = self.book();
        ledger
            .book()
            .told
            .iter()
            .filter(|t| !book.answers.contains_key(&t.order_id))
            .map(|t| t.order_id.clone())
            .collect()
    }

    /// Waits for every payment task (including those started meanwhile).
    async fn join(&self) {
        loop {
            let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
            if tasks.is_empty() {
                return;
            }
            for t in tasks {
                if let Err(e) = t.await {
                    self.book()
                        .failures
                        .push(format!("a payment task failed: {e}"));
                }
            }
        }
    }

    /// Starts `told`'s payment after `delay` (or at once in a hurry),
    /// unless it is on its way already.
    fn schedule(&self, told: Told, delay: Duration, rng: Rng) {
        if !self.book().scheduled.insert(told.order_id.clone()) {
            return;
        }
        let payer = self.clone();
        let task = tokio::spawn(async move {
            let mut hurry = payer.hurry.subscribe();
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = hurry.wait_for(|h| *h) => {}
            }
            payer.pay(&told, rng).await;
        });
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
    }

    /// Sends the order's payment until it is answered 200 (recorded),
    /// answered wrong, or [`PAY_LIMIT`] passes.
    async fn pay(&self, told: &Told, mut rng: Rng) {
        let _permit = self.in_flight.acquire().await.expect("never closed");
        let amount = self.price * Decimal::from(told.qty);
        let deadline = Instant::now() + PAY_LIMIT;
        let mut pause = Duration::from_millis(200);
        let mut tries = 0;
        loop {
            tries += 1;
            let api = self.apis.pick(&mut rng).to_owned();
            match self.send(&api, &told.order_id, amount, tries).await {
                Sent::Answered(answer) => {
                    self.book().answers.insert(told.order_id.clone(), answer);
                    return;
                }
                Sent::Wrong => return,
                Sent::Again if Instant::now() >= deadline => return,
                Sent::Again => {}
            }
            tokio::time::sleep(pause + rng.millis(0, 100)).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// One signed send to one API, classified.
    async fn send(&self, api: &str, order_id: &str, amount: Decimal, tries: u32) -> Sent {
        let payment_id = payment_id(order_id);
        let body = json!({"type": "payment.succeeded", "data": {
            "order_id": order_id, "payment_id": payment_id,
            "amount": amount.to_string(), "currency": CURRENCY}})
        .to_string();
        // A new message id per send, as a provider's retry may have.
        let id = format!("msg_{}", uuid::Uuid::now_v7().simple());
        let ts = flashsale::domain::now_ms() / 1000;
        let sent = self
            .http
            .post(format!("{api}/api/payments/notifications"))
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", ts.to_string())
            .header(
                "webhook-signature",
                self.secret.sign(&id, ts, body.as_bytes()),
            )
            .body(body)
            .send()
            .await;
        let resp = match sent {
            Ok(resp) => resp,
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timeout"
                } else if e.is_connect() {
                    "connect"
                } else {
                    "other"
                };
                self.status(format!("transport {kind}"));
                return Sent::Again;
            }
        };
        let status = resp.status().as_u16();
        let retry_after = resp.headers().contains_key("retry-after");
        let Ok(answer) = resp.json::<Value>().await else {
            self.status(format!("{status} (body lost)"));
            return Sent::Again;
        };
        let code = answer["error"].as_str().unwrap_or_default().to_owned();
        match status {
            200 => self.answered(order_id, &payment_id, &answer, tries),
            409 if code == "order_pending" => {
                self.status("409 order_pending".into());
                Sent::Again
            }
            503 => {
                self.status(format!("503 {code}"));
                if !retry_after {
                    self.failure(format!(
                        "{api} answered 503 {code} without Retry-After to the payment of {order_id}"
                    ));
                }
                Sent::Again
            }
            _ => {
                self.status(format!("{status} {code}"));
                self.failure(format!(
                    "{api} answered {status} {answer} to the payment of {order_id}"
                ));
                // A 5xx says nothing, nor does a 404 for an order a client
                // was told about (its store may be down): a provider sends
                // again. Any other answer is definitive, and wrong.
                if status >= 500 || status == 404 {
                    Sent::Again
                } else {
                    Sent::Wrong
                }
            }
        }
    }

    /// A 200: it must be this payment's, with a result a `payment.succeeded`
    /// can have and the order's status that goes with it.
    fn answered(&self, order_id: &str, payment_id: &str, answer: &Value, tries: u32) -> Sent {
        let text = |k: &str| answer[k].as_str().unwrap_or_default().to_owned();
        let (result, order_status) = (text("result"), text("order_status"));
        let replayed = answer["replayed"].as_bool().unwrap_or(false);
        self.status(format!(
            "200 {result}{}",
            if replayed { " replayed" } else { "" }
        ));
        let status_for = match result.as_str() {
            "paid" | "paid_again" => "paid",
            "refund_due" => "cancelled",
            _ => "",
        };
        let matches = text("order_id") == order_id
            && text("payment_id") == payment_id
            && !status_for.is_empty()
            && order_status == status_for;
        if !matches {
            self.failure(format!(
                "the payment of {order_id} was answered {answer}: not a payment.succeeded's answer"
            ));
        }
        Sent::Answered(PaidAnswer {
            result,
            order_status,
            replayed,
            tries,
        })
    }

    fn status(&self, label: String) {
        *self.book().statuses.entry(label).or_default() += 1;
    }

    fn failure(&self, what: String) {
        self.book().failures.push(what);
    }
}
