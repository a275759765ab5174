//! The end of the run: wait until the workers have moved every stream into
//! MySQL, then compare the books (read straight from the private MariaDB and
//! Redis) with what the clients were told.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use redis::AsyncCommands;
use tokio::time::Instant;

use crate::load::{Book, Sale};
use crate::world::World;

/// The keys of each of the sale's stock shards, shard 0 (the sale) first.
pub fn shard_keys(sale: &Sale) -> Vec<flashsale::sale::SaleKeys> {
    let product = flashsale::domain::ProductId::parse(&sale.id).expect("a valid product id");
    (0..sale.shards.max(1))
        .map(|k| flashsale::sale::SaleKeys::new("fs", &product.shard(k, sale.shards)))
        .collect()
}

/// The sale's units in Redis: every shard's stock and the moves between
/// them still in flight (None: the sale has no stock key).
async fn units_left(r: &mut redis::aio::MultiplexedConnection, sale: &Sale) -> Option<i64> {
    let mut total = None;
    for keys in shard_keys(sale) {
        let stock: Option<i64> = r.get(&keys.stock).await.expect("GET stock");
        let moving: HashMap<String, String> = r.hgetall(&keys.moves).await.expect("moves");
        let moving: i64 = moving
            .values()
            .filter_map(|m| m.split_once(':')?.1.parse::<i64>().ok())
            .sum();
        if let Some(s) = stock {
            total = Some(total.unwrap_or(0) + s + moving);
        }
    }
    total
}

pub async fn redis(world: &World) -> redis::aio::MultiplexedConnection {
    redis::Client::open(world.redis_url.as_str())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("the test's redis answers")
}

/// Entries the workers gave up on (each shard's dead letters), by sale:
/// none in these runs. Looked at as soon as the window closes: with some,
/// the run stops there (what follows would wait minutes for orders that
/// never reach the books: a release that cannot read another's entries).
pub async fn dead_letters(world: &World, sales: &[Sale]) -> Vec<String> {
    let mut r = redis(world).await;
    let mut found = Vec::new();
    for sale in sales {
        let mut n = 0u64;
        for keys in shard_keys(sale) {
            n += r.xlen::<_, u64>(&keys.dead).await.unwrap_or(0);
        }
        if n > 0 {
            found.push(format!("{}: {n} entries dead-lettered", sale.id));
        }
    }
    found
}

pub async fn mysql(world: &World) -> sqlx::MySqlPool {
    sqlx::MySqlPool::connect(&world.database_url)
        .await
        .expect("the test's mariadb answers")
}

/// Orders the clients were told about (202), per sale id.
pub fn told_per_sale(book: &Book, sales: &[Sale]) -> BTreeMap<String, usize> {
    let mut told: BTreeMap<String, usize> = sales.iter().map(|s| (s.id.clone(), 0)).collect();
    for r in book.keys.values() {
        *told.entry(sales[r.order.sale].id.clone()).or_default() += r.order_ids.len();
    }
    told
}

/// How long the streams must be quiet (nothing pending or undelivered, row
/// counts unchanged) before the wait stops waiting for rows that are not coming.
const QUIET_FOR: Duration = Duration::from_secs(5);

/// One sale's stream and books, as the drain wait sees them.
#[derive(Debug, PartialEq, Eq)]
struct Progress {
    pending: usize,
    /// Entries not yet delivered to any worker (None: Redis cannot tell).
    lag: Option<usize>,
    rows: i64,
}

/// Waits (bounded) until every sale has nothing pending in its group and as
/// many rows in `tb_order` as orders the clients were told about. Err(the
/// last state seen) on timeout, or once the streams are quiet with the rows
/// still short or over: the checks then say which orders differ.
pub async fn wait_drained(
    world: &World,
    sales: &[Sale],
    told: &BTreeMap<String, usize>,
    limit: Duration,
) -> Result<Duration, String> {
    let (mut r, db) = (redis(world).await, mysql(world).await);
    let t0 = Instant::now();
    let mut last: Vec<Progress> = Vec::new();
    let mut quiet_since = Instant::now();
    loop {
        let mut now = Vec::new();
        for sale in sales {
            now.push(progress(&mut r, &db, sale).await);
        }
        let done = sales
            .iter()
            .zip(&now)
            .all(|(s, p)| p.pending == 0 && p.rows == told[&s.id] as i64);
        if done {
            return Ok(t0.elapsed());
        }
        let quiet = now.iter().all(|p| p.pending == 0 && p.lag == Some(0));
        if !quiet || now != last {
            quiet_since = Instant::now();
        }
        if quiet_since.elapsed() >= QUIET_FOR || t0.elapsed() >= limit {
            let state: Vec<String> = sales
                .iter()
                .zip(&now)
                .map(|(s, p)| format!("{}: {p:?}, {} told", s.id, told[&s.id]))
                .collect();
            let why = if quiet { "streams quiet" } else { "timed out" };
            return Err(format!(
                "not drained ({why} after {:.1?}): {}",
                t0.elapsed(),
                state.join("; ")
            ));
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn progress(
    r: &mut redis::aio::MultiplexedConnection,
    db: &sqlx::MySqlPool,
    sale: &Sale,
) -> Progress {
    // Every stock shard's stream.
    let (mut pending_count, mut lag) = (0, Some(0));
    for keys in shard_keys(sale) {
        let stream = keys.orders;
        let pending: redis::streams::StreamPendingReply = r
            .xpending(&stream, flashsale::sale::keys::GROUP)
            .await
            .expect("XPENDING");
        let groups: redis::streams::StreamInfoGroupsReply =
            r.xinfo_groups(&stream).await.expect("XINFO GROUPS");
        let shard_lag = groups
            .groups
            .iter()
            .find(|g| g.name == flashsale::sale::keys::GROUP)
            .and_then(|g| g.lag);
        pending_count += pending.count();
        lag = lag.zip(shard_lag).map(|(a, b)| a + b);
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tb_order WHERE product_id = ?")
        .bind(&sale.id)
        .fetch_one(db)
        .await
        .expect("count rows");
    Progress {
        pending: pending_count,
        lag,
        rows,
    }
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    order_id: String,
    user_id: i64,
    product_id: String,
    quantity: i64,
    status: String,
}

/// Every invariant; returns the violations (empty: the books balance).
pub async fn verify(
    world: &World,
    sales: &[Sale],
    book: &Book,
    limit_per_user: u64,
) -> Vec<String> {
    let mut problems = Vec::new();
    let db = mysql(world).await;
    let rows: Vec<Row> =
        sqlx::query_as("SELECT order_id, user_id, product_id, quantity, status FROM tb_order")
            .fetch_all(&db)
            .await
            .expect("read tb_order");
    let mut by_id: HashMap<&str, Vec<&Row>> = HashMap::new();
    for row in &rows {
        by_id.entry(row.order_id.as_str()).or_default().push(row);
    }

    // 1. Each key got one order id, and each 202'd order is in tb_order
    //    exactly once, as it was asked for.
    let mut told = HashMap::new();
    for (key, record) in &book.keys {
        if record.order_ids.len() > 1 {
            problems.push(format!(
                "key {key} was given {} order ids: {:?}",
                record.order_ids.len(),
                record.order_ids
            ));
        }
        if let (Some(refusal), false) = (&record.refusal, record.order_ids.is_empty()) {
            // Refusals change nothing, so no later answer may accept.
            problems.push(format!(
                "key {key} was both accepted ({:?}) and refused ({refusal})",
                record.order_ids
            ));
        }
        if !record.settled() {
            problems.push(format!(
                "key {key} never got a definitive answer: {:?}",
                record.order
            ));
        }
        for id in &record.order_ids {
            told.insert(id.as_str(), record);
            match by_id.get(id.as_str()).map(Vec::as_slice) {
                None | Some([]) => problems.push(format!(
                    "order {id} (key {key}) was answered 202 but is not in tb_order"
                )),
                Some([row]) => {
                    let o = &record.order;
                    let same = row.user_id as u64 == o.user
                        && row.product_id == sales[o.sale].id
                        && row.quantity as u64 == o.qty;
                    if !same {
                        problems.push(format!("row {row:?} does not match key {key}: {o:?}"));
                    }
                    // Every order was paid at the end: none is left
                    // confirmed (nor pending, nor cancelling: nobody cancels).
                    if !matches!(row.status.as_str(), "paid" | "cancelled") {
                        problems.push(format!(
                            "row {row:?}: status is not paid or cancelled after every order was paid"
                        ));
                    }
                }
                Some(many) => {
                    problems.push(format!("order {id} is in tb_order {} times", many.len()))
                }
            }
        }
    }
    // 2. No row that no client was told about.
    for row in &rows {
        if !told.contains_key(row.order_id.as_str()) {
            problems.push(format!("row {row:?} was never answered 202 to any client"));
        }
    }
    // 3. Each sale sold exactly its stock (demand exceeded it, and the
    //    last units, given back by payment timeouts, were sold after): no
    //    oversell, no undersell, in MySQL and in Redis. Cancelled orders
    //    hold no units.
    let mut r = redis(world).await;
    let holds = |row: &Row| row.status != "cancelled";
    for (i, sale) in sales.iter().enumerate() {
        let sold: u64 = rows
            .iter()
            .filter(|row| row.product_id == sale.id && holds(row))
            .map(|row| row.quantity as u64)
            .sum();
        let told_units: u64 = book
            .keys
            .values()
            .filter(|k| k.order.sale == i)
            .flat_map(|k| k.order_ids.iter().map(move |id| (k, id)))
            .filter(|(_, id)| {
                by_id
                    .get(id.as_str())
                    .is_some_and(|r| r.iter().any(|r| holds(r)))
            })
            .map(|(k, _)| k.order.qty)
            .sum();
        let left = units_left(&mut r, sale).await;
        if sold > sale.stock {
            problems.push(format!(
                "{}: OVERSOLD, {sold} units in orders not cancelled in tb_order of {}",
                sale.id, sale.stock
            ));
        }
        if sold < sale.stock || left != Some(0) {
            problems.push(format!(
                "{}: undersold: {sold} units in orders not cancelled in tb_order of {}, \
                 redis stock {left:?}",
                sale.id, sale.stock
            ));
        }
        if told_units != sale.stock {
            problems.push(format!(
                "{}: clients were told of {told_units} units in orders not cancelled, of {}",
                sale.id, sale.stock
            ));
        }
        // 3b. Every move between the sale's stock shards finished: none
        //     left in flight (the units above count a move in flight, and
        //     one applied whose record was not dropped counts twice), and
        //     each given once and applied once where it went.
        if sale.shards > 1 {
            match crate::moves::unfinished(&mut r, sale).await {
                Ok(unfinished) => problems.extend(unfinished),
                Err(e) => problems.push(format!("{}: moves unread: {e}", sale.id)),
            }
        }
    }
    // 4. No user over the per-user limit (a cancelled order's units are
    //    no longer theirs).
    let mut per_user: BTreeMap<(&str, i64), i64> = BTreeMap::new();
    for row in rows.iter().filter(|r| holds(r)) {
        *per_user.entry((&row.product_id, row.user_id)).or_default() += row.quantity;
    }
    for ((sale, user), units) in per_user {
        if units as u64 > limit_per_user {
            problems.push(format!(
                "{sale}: user {user} has {units} units, over the limit {limit_per_user}"
            ));
        }
    }
    // 6 (the clients' half). No 5xx but 503, nothing unexpected.
    problems.extend(book.failures.iter().cloned());
    problems
}

/// Each sale's stock in Redis (None: no stock key).
pub async fn stock_left(world: &World, sales: &[Sale]) -> Vec<Option<i64>> {
    let mut r = redis(world).await;
    let mut left = Vec::new();
    for sale in sales {
        left.push(units_left(&mut r, sale).await);
    }
    left
}

/// Orders in MySQL that are neither paid nor cancelled with their units
/// back in Redis (a cancel's Redis half that failed is finished later, by
/// the sweeper: those units are not for sale yet).
pub async fn unsettled_rows(world: &World) -> i64 {
    let db = mysql(world).await;
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM tb_order \
         WHERE status NOT IN ('paid', 'cancelled') OR (status = 'cancelled' AND released = 0)",
    )
    .fetch_one(&db)
    .await
    .expect("count unsettled orders")
}

/// The payments, as the books recorded them and the payment side was told.
#[derive(Debug, Default)]
pub struct Payments {
    /// tb_payment's rows by result.
    pub results: BTreeMap<String, u64>,
    /// Answers the payment side got from a replay (an earlier send's
    /// answer was lost on its way).
    pub replayed: usize,
    /// The most sends one payment took.
    pub most_tries: u32,
}

impl Payments {
    /// Payments that came after their order's payment timeout.
    pub fn late(&self) -> u64 {
        ["paid_again", "refund_due"]
            .iter()
            .map(|r| self.results.get(*r).copied().unwrap_or(0))
            .sum()
    }
}

#[derive(Debug, sqlx::FromRow)]
struct PaymentRow {
    payment_id: String,
    kind: String,
    order_id: String,
    result: String,
}

/// Check 7: every order a client was told about has exactly one payment
/// in `tb_payment`, its own (`pay-<order id>`, `payment.succeeded`),
/// recorded with the result its payment side was answered: `paid` or
/// `paid_again` and the order `paid`, or `refund_due` and the order
/// `cancelled`; no payment of any other order.
pub async fn payments(
    world: &World,
    book: &Book,
    answers: &BTreeMap<String, crate::payments::PaidAnswer>,
) -> (Payments, Vec<String>) {
    let mut problems = Vec::new();
    let db = mysql(world).await;
    let rows: Vec<PaymentRow> =
        sqlx::query_as("SELECT payment_id, kind, order_id, result FROM tb_payment")
            .fetch_all(&db)
            .await
            .expect("read tb_payment");
    let statuses: HashMap<String, String> =
        sqlx::query_as::<_, (String, String)>("SELECT order_id, status FROM tb_order")
            .fetch_all(&db)
            .await
            .expect("read tb_order")
            .into_iter()
            .collect();
    let mut summary = Payments::default();
    let mut by_order: HashMap<&str, Vec<&PaymentRow>> = HashMap::new();
    for row in &rows {
        *summary.results.entry(row.result.clone()).or_default() += 1;
        by_order.entry(row.order_id.as_str()).or_default().push(row);
    }
    let told: std::collections::BTreeSet<&str> =
        book.told.iter().map(|t| t.order_id.as_str()).collect();
    for id in &told {
        let answer = answers.get(*id);
        if let Some(a) = answer {
            summary.replayed += usize::from(a.replayed);
            summary.most_tries = summary.most_tries.max(a.tries);
        } else {
            problems.push(format!("the payment of order {id} was never answered 200"));
        }
        let row = match by_order.get(id).map(Vec::as_slice) {
            Some([row]) => *row,
            None | Some([]) => {
                problems.push(format!("order {id} has no payment in tb_payment"));
                continue;
            }
            Some(many) => {
                problems.push(format!("order {id} has {} payments: {many:?}", many.len()));
                continue;
            }
        };
        if row.payment_id != crate::payments::payment_id(id) || row.kind != "payment.succeeded" {
            problems.push(format!("order {id}: a payment it was not sent: {row:?}"));
        }
        let status = statuses.get(*id).map_or("(no row)", String::as_str);
        let consistent = match row.result.as_str() {
            "paid" | "paid_again" => status == "paid",
            "refund_due" => status == "cancelled",
            _ => false,
        };
        if !consistent {
            problems.push(format!(
                "order {id} is {status} with its payment recorded {}",
                row.result
            ));
        }
        // Nothing changes an order after its payment: the answer's status
        // is its status at the end.
        if let Some(a) = answer
            && (a.result != row.result || a.order_status != status)
        {
            problems.push(format!(
                "the payment of order {id} was answered {} (order {}) but recorded {} (order {status})",
                a.result, a.order_status, row.result
            ));
        }
    }
    for row in &rows {
        if !told.contains(row.order_id.as_str()) {
            problems.push(format!(
                "a payment of an order no client was told about: {row:?}"
            ));
        }
    }
    (summary, problems)
}

/// Check 5: `flashsale audit --product <id>` exits 0 for every sale.
/// Returns its tables (for the report) and the failures.
pub async fn audit(world: &World, sales: &[Sale]) -> (String, Vec<String>) {
    let (mut tables, mut problems) = (String::new(), Vec::new());
    for sale in sales {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
            .args(["audit", "--product", &sale.id])
            .env("REDIS_URL", &world.redis_url)
            .env("DATABASE_URL", &world.database_url)
            .env("RUST_LOG", "warn")
            .env("RUST_BACKTRACE", "0")
            .output()
            .await
            .expect("flashsale audit runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        tables.push_str(&stdout);
        if !out.status.success() {
            problems.push(format!(
                "flashsale audit --product {} exited {}:\n{stdout}{}",
                sale.id,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    (tables, problems)
}

/// Check 6, the processes' half: no flashsale process panicked.
pub fn panics_in_logs(world: &World) -> Vec<String> {
    world
        .flashsale_logs()
        .into_iter()
        .filter_map(|log| {
            let text = std::fs::read(log).unwrap_or_default();
            let text = String::from_utf8_lossy(&text);
            let lines: Vec<&str> = text.lines().filter(|l| l.contains("panicked")).collect();
            (!lines.is_empty()).then(|| {
                format!(
                    "{} has {} panic line(s), first: {}",
                    log.display(),
                    lines.len(),
                    lines[0]
                )
            })
        })
        .collect()
}

/// ERROR lines per flashsale log (reported, not failed: some are expected
/// while a store is down).
pub fn error_lines(world: &World) -> Vec<(String, usize)> {
    lines_per_log(world, |l| l.contains("\"level\":\"ERROR\""))
}

/// Lines saying a worker could not read an entry (it leaves it pending for
/// another delivery, and after the last one moves it to the dead letters),
/// per flashsale log: never, unless a release cannot read what another
/// wrote.
pub fn unreadable_entries(world: &World) -> Vec<(String, usize)> {
    lines_per_log(world, |l| {
        l.contains("entry cannot be persisted") || l.contains("entry moved to dead letters")
    })
}

fn lines_per_log(world: &World, wanted: impl Fn(&str) -> bool) -> Vec<(String, usize)> {
    world
        .flashsale_logs()
        .into_iter()
        .map(|log| {
            let text = std::fs::read(log).unwrap_or_default();
            let n = String::from_utf8_lossy(&text)
                .lines()
                .filter(|l| wanted(l))
                .count();
            let name = log
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (name, n)
        })
        .collect()
}

/// How long the report may take to count what the processes did: each
/// writes its timeline a second after each second (later on a loaded machine).
const REPORT_LIMIT: Duration = Duration::from_secs(30);

/// The sale's report, as the operators read it (`GET
/// /api/admin/products/{id}/report`), equals the books: orders accepted
/// (the timeline every process of either release wrote) and persisted,
/// orders and units sold (`tb_order`), and the books balanced. Only where
/// no process was killed: a kill -9 loses its last second of counts, by
/// design. `persisted` may fall short by at most `short` (what clean stops
/// of a release that lost its workers' last batch may have left out).
pub async fn report_equals_books(
    world: &World,
    sales: &[Sale],
    told: &BTreeMap<String, usize>,
    short: u64,
) -> Vec<String> {
    let db = mysql(world).await;
    let mut problems = Vec::new();
    for sale in sales {
        let (orders, units_paid): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), CAST(COALESCE(SUM(IF(status = 'paid', quantity, 0)), 0) AS SIGNED) \
             FROM tb_order WHERE product_id = ?",
        )
        .bind(&sale.id)
        .fetch_one(&db)
        .await
        .expect("count the books");
        let told = told.get(&sale.id).copied().unwrap_or(0) as i64;
        let expected = serde_json::json!({
            "accepted": told,
            "orders": orders,
            "persisted": orders,
            "units_sold": units_paid,
            "books_ok": true,
        });
        let deadline = Instant::now() + REPORT_LIMIT;
        loop {
            let url = format!(
                "{}/api/admin/products/{}/report",
                world.api_urls[0], sale.id
            );
            let got = match world.admin_get(&url).await {
                Ok(report) => {
                    let s = &report["summary"];
                    serde_json::json!({
                        "accepted": s["accepted"],
                        "orders": s["orders"],
                        "persisted": s["persisted"],
                        "units_sold": s["units_sold"],
                        "books_ok": s["books_ok"],
                    })
                }
                Err(e) => serde_json::json!({ "error": e }),
            };
            let persisted = got["persisted"].as_i64().unwrap_or(-1);
            let close_enough = {
                let mut g = got.clone();
                g["persisted"] = expected["persisted"].clone();
                g == expected && persisted <= orders && persisted + short as i64 >= orders
            };
            if got == expected || (close_enough && Instant::now() >= deadline) {
                if got != expected {
                    println!(
                        "{}: the report's persisted {persisted} of {orders} rows (N−1's stops)",
                        sale.id
                    );
                }
                break;
            }
            if Instant::now() >= deadline {
                problems.push(format!(
                    "{}: the report says {got}, the books and the clients {expected}",
                    sale.id
                ));
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    problems
}
