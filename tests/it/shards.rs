//! A sale opened with several stock shards (`stock_shards`): its stock in
//! as many parts, each in its own hash slot, each buyer decided by one, units moving to where the
//! buyers are; exactly its stock sold, every buyer's limit exact, no
//! `sold_out` while units remain, books that balance.

use std::collections::HashMap;
use std::sync::Arc;

use flashsale::bookkeeping::recover::Overwrite;
use flashsale::domain::{OrderId, ProductId};
use flashsale::sale::Route;
use redis::AsyncCommands;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::helpers::{
    Backend, TestApp, a_buyers_answer, draws, product_body, spawn_app_on, status_code, unique,
};

pub(crate) fn pid(sku: &str) -> ProductId {
    ProductId::parse(sku).expect("a product id")
}

/// A sale of `stock` units over `shards` stock shards, `limit` a buyer.
async fn sharded_sale(app: &TestApp, stock: u64, limit: u64, shards: u16) -> String {
    let mut body = product_body(&unique("hot-"), stock, limit);
    body["stock_shards"] = json!(shards);
    app.sale_from(body).await
}

/// One answer the burst got: when its request left and when the answer
/// came, its status, its error code or its order id.
#[derive(Debug, Clone)]
struct Answer {
    user: u64,
    quantity: u64,
    sent: Instant,
    received: Instant,
    status: StatusCode,
    code: String,
    order_id: Option<String>,
}

async fn order(app: &TestApp, user: u64, sku: &str, quantity: u64, key: Option<&str>) -> Answer {
    let body = json!({"user_id": user, "product_id": sku, "quantity": quantity});
    let sent = Instant::now();
    let resp = app.post_order(&body, key).await;
    let received = Instant::now();
    let status = resp.status();
    let v: Value = resp.json().await.expect("a JSON answer");
    Answer {
        user,
        quantity,
        sent,
        received,
        status,
        code: v["error"].as_str().unwrap_or_default().to_owned(),
        order_id: v["order_id"].as_str().map(str::to_owned),
    }
}

async fn a_burst_on_a_sharded_sale_sells_exactly_its_stock_with_exact_limits_and_no_phantom_sold_out(
    backend: Backend,
) {
    let app = Arc::new(spawn_app_on(backend, |_| {}).await);
    let (stock, shards) = (300u64, 3u16);
    let sku = sharded_sale(&app, stock, 2, shards).await;
    // 600 buyers, nine in ten of them at home on shard 0: that shard runs
    // out first and takes units from the others (whose 30 buyers each
    // cannot take their 100), again and again.
    let users: Vec<u64> = (0..600u64)
        .map(|i| match i % 10 {
            0..9 => 3 * (i + 1),
            _ => 3 * (i + 1) + 1 + (i / 10) % 2,
        })
        .collect();
    let mut set = JoinSet::new();
    for (i, user) in users.iter().copied().enumerate() {
        let (app, sku) = (app.clone(), sku.clone());
        set.spawn(async move {
            // Mixed quantities, a keyed order retried with its key, then
            // one more unit (over the limit for those who got 2).
            let quantity = 1 + (i as u64 % 2);
            let key = format!("k-{user}");
            let first = order(&app, user, &sku, quantity, Some(&key)).await;
            let retry = order(&app, user, &sku, quantity, Some(&key)).await;
            let more = order(&app, user, &sku, 1, None).await;
            (first, retry, more)
        });
    }
    let mut answers = Vec::new();
    while let Some(done) = set.join_next().await {
        let (first, retry, more) = done.expect("a buyer");
        // Every idempotent retry of an accepted order is answered with it.
        if first.status == StatusCode::ACCEPTED {
            assert_eq!(retry.status, StatusCode::ACCEPTED, "{retry:?}");
            assert_eq!(retry.order_id, first.order_id, "user {}", first.user);
            answers.extend([first, more]);
        } else {
            // A key whose order was refused is free: the retry is an order.
            answers.extend([first, retry, more]);
        }
    }
    for a in &answers {
        assert!(a_buyers_answer(a.status, &a.code), "{a:?}");
    }
    let accepted: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == StatusCode::ACCEPTED)
        .collect();
    let sold: u64 = accepted.iter().map(|a| a.quantity).sum();
    assert_eq!(sold, stock, "exactly the stock sold");
    // No phantom sold-out: no order sent after a `sold_out` was received
    // was accepted (nothing was given back meanwhile), so every `sold_out`
    // came when the whole sale had no unit left.
    let sold_outs: Vec<&Answer> = answers.iter().filter(|a| a.code == "sold_out").collect();
    assert!(!sold_outs.is_empty());
    for s in &sold_outs {
        let later: Vec<_> = accepted.iter().filter(|a| a.sent > s.received).collect();
        assert!(
            later.is_empty(),
            "user {} heard sold_out while units remained: {s:?} then {later:?}",
            s.user
        );
    }

    app.drained(&sku, stock as i64).await;
    let rows = app.order_rows(&sku).await;
    let mut by_user: HashMap<i64, i64> = HashMap::new();
    for (id, user, quantity) in &rows {
        *by_user.entry(*user).or_default() += quantity;
        // Each buyer's orders are decided by their home shard, and the
        // order's id says which.
        let (_, of) = OrderId::parse(id).expect("an order id");
        assert_eq!(of.sale(), pid(&sku));
        assert_eq!(
            u64::from(of.shard_index()),
            *user as u64 % u64::from(shards),
            "{id}"
        );
    }
    assert!(
        by_user.values().all(|units| *units <= 2),
        "a buyer over the limit"
    );
    assert_eq!(app.persisted(&sku).await.2, stock as i64);

    // Units moved, none is in flight, none is left.
    let looks = app.sales.shards().look(&pid(&sku)).await.expect("shards");
    assert_eq!(looks.len(), usize::from(shards));
    assert!(
        looks.iter().map(|l| l.moves_out).sum::<i64>() > 0,
        "no move made"
    );
    assert!(looks.iter().all(|l| l.in_flight.is_empty()), "{looks:?}");
    assert_eq!(looks.iter().filter_map(|l| l.stock).sum::<i64>(), 0);
    app.books_balance(&sku).await;
}

async fn a_move_left_half_done_arrives_once_and_no_unit_is_made_or_lost(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = sharded_sale(&app, 30, 1, 3).await;
    let shards = app.sales.shards();
    let product = pid(&sku);
    // A caller takes 5 units off shard 0 for shard 1 and dies before they
    // arrive.
    assert_eq!(
        shards
            .take_only(&product, Route { from: 0, to: 1 }, 5)
            .await
            .unwrap(),
        5
    );
    let looks = shards.look(&product).await.unwrap();
    let stocks: Vec<_> = looks.iter().map(|l| l.stock).collect();
    assert_eq!(stocks, [Some(5), Some(10), Some(10)]);
    assert_eq!(looks[0].in_flight.len(), 1);
    // The audit counts them where they are: moving.
    app.books_balance(&sku).await;
    assert_eq!(app.sales.ledger().stock(&product).await.unwrap(), Some(30));
    // Finished twice at once (the reconciler and a buyer's search for
    // units), they arrive once.
    let (a, b) = tokio::join!(shards.finish_moves(&product), shards.finish_moves(&product));
    assert!(a.unwrap() + b.unwrap() >= 1);
    let stocks: Vec<_> = shards
        .look(&product)
        .await
        .unwrap()
        .iter()
        .map(|l| l.stock)
        .collect();
    assert_eq!(stocks, [Some(5), Some(15), Some(10)]);
    assert_eq!(shards.finish_moves(&product).await.unwrap(), 0);
    // Every unit sells, and no more: 30 buyers of shard 2 (whose 10 run
    // out first) buy them all, then a 31st hears sold out.
    for user in 1..=30u64 {
        let a = order(&app, user * 3 + 2, &sku, 1, None).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
    }
    let (status, code) = status_code(app.place_order(31 * 3 + 2, &sku, 1).await).await;
    assert_eq!((status, code.as_str()), (StatusCode::CONFLICT, "sold_out"));
    app.drained(&sku, 30).await;
    app.books_balance(&sku).await;
}

/// What a failover of one shard's master can do to a move with WAIT 0 (the
/// new master lacks the last writes): lose the take (the units exist twice)
/// or lose the apply (they exist nowhere). The reconciler's repair mends
/// both from the other side's log.
async fn a_move_a_failover_cut_in_two_is_mended_from_the_other_side(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = sharded_sale(&app, 30, 1, 3).await;
    let product = pid(&sku);
    let shards = app.sales.shards();
    let mut r = app.redis.clone();
    let stocks = |looks: Vec<flashsale::sale::ShardLook>| -> Vec<Option<i64>> {
        looks.iter().map(|l| l.stock).collect()
    };
    // A move of 4 from shard 0 to 1, then shard 0's master "loses" the take.
    assert_eq!(
        shards
            .move_units(&product, Route { from: 0, to: 1 }, 4)
            .await
            .unwrap(),
        4
    );
    let gave: HashMap<String, String> = r.hgetall(app.key(&sku, "gave")).await.unwrap();
    let (id, _) = gave.iter().next().expect("the move's log entry");
    let _: () = r.hdel(app.key(&sku, "gave"), id).await.unwrap();
    let _: () = r.incr(app.key(&sku, "stock"), 4).await.unwrap();
    assert_eq!(
        stocks(shards.look(&product).await.unwrap()),
        [Some(10), Some(14), Some(10)]
    );
    assert_eq!(app.sales.ledger().stock(&product).await.unwrap(), Some(34));
    assert_eq!(shards.repair_moves(&product).await.unwrap(), 1);
    assert_eq!(
        stocks(shards.look(&product).await.unwrap()),
        [Some(6), Some(14), Some(10)]
    );
    // A move of 3 from shard 2 to 0, then shard 0's master "loses" the apply.
    assert_eq!(
        shards
            .move_units(&product, Route { from: 2, to: 0 }, 3)
            .await
            .unwrap(),
        3
    );
    let moved_in: HashMap<String, String> = r.hgetall(app.key(&sku, "moved_in")).await.unwrap();
    let (id, _) = moved_in.iter().next().expect("the move's arrival");
    let _: () = r.hdel(app.key(&sku, "moved_in"), id).await.unwrap();
    let _: () = r.decr(app.key(&sku, "stock"), 3).await.unwrap();
    assert_eq!(app.sales.ledger().stock(&product).await.unwrap(), Some(27));
    assert_eq!(shards.repair_moves(&product).await.unwrap(), 1);
    assert_eq!(
        stocks(shards.look(&product).await.unwrap()),
        [Some(9), Some(14), Some(7)]
    );
    assert_eq!(shards.repair_moves(&product).await.unwrap(), 0);
    app.books_balance(&sku).await;
}

async fn a_buyer_of_a_sharded_sale_cancels_and_the_units_go_back_to_their_shard(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = sharded_sale(&app, 9, 2, 3).await;
    let product = pid(&sku);
    // User 4's home is shard 1.
    let a = order(&app, 4, &sku, 2, None).await;
    let id = a.order_id.expect("accepted");
    let (_, of) = OrderId::parse(&id).expect("an order id");
    assert_eq!((of.sale(), of.shard_index()), (product.clone(), 1), "{id}");
    // The order reads as the sale's.
    app.drained(&sku, 2).await;
    let (status, view) = app.get_json(&format!("/api/orders/{id}")).await;
    assert_eq!(
        (status, view["product_id"].as_str()),
        (StatusCode::OK, Some(sku.as_str()))
    );
    let stocks = |looks: Vec<flashsale::sale::ShardLook>| -> Vec<Option<i64>> {
        looks.iter().map(|l| l.stock).collect()
    };
    let shards = app.sales.shards();
    assert_eq!(
        stocks(shards.look(&product).await.unwrap()),
        [Some(3), Some(1), Some(3)]
    );
    assert_eq!(app.cancel(&id, 4).await.status(), StatusCode::OK);
    assert_eq!(
        stocks(shards.look(&product).await.unwrap()),
        [Some(3), Some(3), Some(3)]
    );
    // The buyer may buy again (their units are back on their home shard).
    assert_eq!(
        order(&app, 4, &sku, 2, None).await.status,
        StatusCode::ACCEPTED
    );
    app.books_balance(&sku).await;
}

async fn a_sharded_sale_redis_lost_is_rebuilt_shard_by_shard_from_the_books(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = sharded_sale(&app, 12, 2, 3).await;
    let product = pid(&sku);
    // Buyers on every shard; one keyed.
    for user in [3u64, 4, 5] {
        assert_eq!(
            order(&app, user, &sku, 2, None).await.status,
            StatusCode::ACCEPTED
        );
    }
    let keyed = order(&app, 7, &sku, 1, Some("k7")).await;
    let keyed_id = keyed.order_id.expect("accepted");
    app.drained(&sku, 7).await;
    app.books_balance(&sku).await;

    // Redis loses every key of the sale, on every shard.
    let mut r = app.redis.clone();
    for k in 0..3 {
        let tag = product.shard(k, 3);
        for key in app.sales.keys(&tag).all() {
            let _: () = r.del(key).await.unwrap();
        }
    }
    let done = app
        .recovery()
        .recover(&product, Overwrite::Refuse)
        .await
        .unwrap();
    assert_eq!((done.stock, done.buyers), (5, 4));
    let looks = app.sales.shards().look(&product).await.unwrap();
    assert_eq!(looks.iter().filter_map(|l| l.stock).sum::<i64>(), 5);
    // Limits and idempotency records are back on each buyer's home shard.
    for user in [3u64, 4, 5] {
        let a = order(&app, user, &sku, 1, None).await;
        assert_eq!(a.code, "limit_exceeded", "{a:?}");
    }
    let replay = order(&app, 7, &sku, 1, Some("k7")).await;
    assert_eq!(replay.order_id.as_deref(), Some(keyed_id.as_str()));
    // The rest sells, exactly.
    let mut sold = 0;
    for user in 100..130u64 {
        if order(&app, user, &sku, 1, None).await.status == StatusCode::ACCEPTED {
            sold += 1;
        }
    }
    assert_eq!(sold, 5);
    app.drained(&sku, 12).await;
    app.books_balance(&sku).await;
}

/// Each buyer is decided by their home shard only, for as many shards as
/// the sale has: a call routed for another count (an instance that does not
/// know the sale's shards yet, or a call carrying orders routed before and
/// after it learnt them) is written nowhere, each of its orders answered
/// with the sale's count, to be routed again.
async fn a_call_routed_for_another_count_of_shards_is_written_nowhere(backend: Backend) {
    use flashsale::domain::{Quantity, UserId};
    use flashsale::sale::{OrderCall, PlaceReply, Vouched, place_orders_on};
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = sharded_sale(&app, 30, 5, 3).await;
    let product = pid(&sku);
    let redis = app.redis_below();
    let mut conn = redis.shared().await.expect("a connection");
    // Users 3 and 6 are at home on shard 0 (the sale's own keys).
    let call = |user, shards| OrderCall {
        order_id: OrderId::generate(&product),
        user_id: UserId::new(user).unwrap(),
        quantity: Quantity::new(2).unwrap(),
        idempotency_key: Some(format!("k-{user}")),
        vouched: Vouched::No,
        shards,
    };
    for (calls, what) in [
        (vec![call(3, 1), call(6, 1)], "routed for one shard"),
        (vec![call(3, 3), call(6, 1)], "routed for 3 and for 1"),
        (vec![call(3, 2)], "routed for two shards"),
    ] {
        let replies = place_orders_on(&mut conn, &app.prefix, &product, &calls)
            .await
            .expect("answered");
        assert_eq!(replies.len(), calls.len(), "{what}");
        for reply in &replies {
            assert!(matches!(reply, PlaceReply::Shards(3)), "{what}: {reply:?}");
        }
        assert_eq!(app.stock(&sku).await, Some(10), "{what}");
        assert_eq!(app.stream_len(&sku).await, 0, "{what}");
        assert_eq!(app.bought(&sku, 3).await, 0, "{what}");
    }
    // Routed for the sale's count, the same orders are decided.
    let calls = [call(3, 3), call(6, 3)];
    let replies = place_orders_on(&mut conn, &app.prefix, &product, &calls)
        .await
        .expect("answered");
    for reply in &replies {
        assert!(matches!(reply, PlaceReply::Accepted { .. }), "{reply:?}");
    }
    assert_eq!(app.stock(&sku).await, Some(6));
    assert_eq!(app.bought(&sku, 3).await, 2);
    app.drained(&sku, 4).await;
}

/// Taking units away from a sharded sale takes them wherever they are:
/// shard 0 (which decides a restock) gathers them from the others first.
async fn units_taken_away_from_a_sharded_sale_come_from_every_shard(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = sharded_sale(&app, 30, 1, 3).await;
    let restock = |units: i64, key: &'static str| {
        app.client
            .post(app.url(&format!("/api/admin/products/{sku}/restock")))
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .header("Idempotency-Key", key)
            .json(&json!({"units": units}))
            .send()
    };
    // Shard 0 holds 10 of the 30.
    let resp = restock(-25, "take-25").await.expect("answered");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(app.sales.ledger().stock(&pid(&sku)).await.unwrap(), Some(5));
    // More than are left: refused, nothing taken.
    let resp = restock(-6, "take-6").await.expect("answered");
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(app.sales.ledger().stock(&pid(&sku)).await.unwrap(), Some(5));
    // The five left sell, to buyers of every shard.
    let mut sold = 0;
    for user in 1..=12u64 {
        if order(&app, user, &sku, 1, None).await.status == StatusCode::ACCEPTED {
            sold += 1;
        }
    }
    assert_eq!(sold, 5);
    app.drained(&sku, 5).await;
    app.books_balance(&sku).await;
}

/// One answer of the paced crowd: its sale, when it left and came back,
/// what it was.
#[derive(Debug, Clone)]
struct Heard {
    sale: usize,
    user: u64,
    quantity: u64,
    sent: Instant,
    received: Instant,
    status: StatusCode,
    code: String,
}

/// Sharded sales sold out by a paced crowd (issue 68): 24 buyers' loops
/// over two instances, every order keyed, quantities 1-3, a pause of
/// 5-25 ms between a loop's orders; one sale at a time, until it is sold
/// out and heard so for 300 ms. The end of each sale is the moment its
/// last units are spread over shards and several shards' buyers search at
/// once, from both instances. Nothing is given back, so no answer sent
/// after a `sold_out` was received may be an order accepted, nor
/// `insufficient_stock` (units left): either is a `sold_out` given while
/// units remained. (Before the fix: a search whose looks kept finding
/// other buyers' moves gave up as "sold out", and a search that found its
/// units already home, fewer than asked, answered the shard's first
/// `sold_out`.)
async fn a_paced_crowd_sells_out_sharded_sales_with_no_phantom_sold_out(backend: Backend) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    let app = Arc::new(spawn_app_on(backend, |_| {}).await);
    let other = app.serve_beside(|_| {}).await;
    let bases = Arc::new([app.url(""), other.base.clone()]);
    let stock = 60u64;
    let mut skus = Vec::new();
    for i in 0..12u16 {
        skus.push(sharded_sale(&app, stock, 3, if i % 2 == 0 { 6 } else { 3 }).await);
    }
    let skus = Arc::new(skus);
    // The sale the crowd is on; past the last, the crowd stops.
    let on = Arc::new(AtomicUsize::new(0));
    let mut crowd = JoinSet::new();
    for task in 0..24u64 {
        let (app, skus, bases, on) = (app.clone(), skus.clone(), bases.clone(), on.clone());
        crowd.spawn(async move {
            let mut next = draws(task);
            let mut heard = Vec::new();
            let mut n = 0u64;
            loop {
                let sale = on.load(Ordering::Relaxed);
                let Some(sku) = skus.get(sale) else { break };
                n += 1;
                let user = 1 + next(1000);
                let quantity = 1 + next(3);
                let body = json!({"user_id": user, "product_id": sku, "quantity": quantity});
                let url = format!("{}/api/orders", bases[next(2) as usize]);
                let sent = Instant::now();
                let resp = app
                    .client
                    .post(url)
                    .header("Idempotency-Key", format!("t{task}-{n}"))
                    .json(&body)
                    .send()
                    .await
                    .expect("answered");
                let received = Instant::now();
                let status = resp.status();
                let v: Value = resp.json().await.expect("a JSON answer");
                heard.push(Heard {
                    sale,
                    user,
                    quantity,
                    sent,
                    received,
                    status,
                    code: v["error"].as_str().unwrap_or_default().to_owned(),
                });
                tokio::time::sleep(Duration::from_millis(5 + next(20))).await;
            }
            heard
        });
    }
    // Each sale until it is sold out (its units all taken), then 300 ms
    // more of the crowd hearing it; 30 s at most a sale.
    for (i, sku) in skus.iter().enumerate() {
        let started = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let left = app.sales.ledger().stock(&pid(sku)).await.ok().flatten();
            if left == Some(0) || started.elapsed() > Duration::from_secs(30) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        on.store(i + 1, Ordering::Relaxed);
    }
    let mut heard: Vec<Heard> = Vec::new();
    while let Some(task) = crowd.join_next().await {
        heard.extend(task.expect("a buyer's loop"));
    }
    for h in &heard {
        assert!(a_buyers_answer(h.status, &h.code), "{h:?}");
    }
    let mut phantoms = Vec::new();
    for (sale, sku) in skus.iter().enumerate() {
        let of: Vec<&Heard> = heard.iter().filter(|h| h.sale == sale).collect();
        let sold: u64 = of
            .iter()
            .filter(|h| h.status == StatusCode::ACCEPTED)
            .map(|h| h.quantity)
            .sum();
        assert_eq!(sold, stock, "{sku}: exactly the stock sold");
        let first_sold_out = of
            .iter()
            .filter(|h| h.code == "sold_out")
            .min_by_key(|h| h.received);
        let Some(s) = first_sold_out else {
            panic!("{sku}: nobody heard sold_out");
        };
        let later: Vec<&&Heard> = of
            .iter()
            .filter(|h| h.sent > s.received)
            .filter(|h| h.status == StatusCode::ACCEPTED || h.code == "insufficient_stock")
            .collect();
        if !later.is_empty() {
            phantoms.push(format!(
                "{sku}: user {} (quantity {}) heard sold_out, then {} answers sent later \
                 found units: {:?}",
                s.user,
                s.quantity,
                later.len(),
                later.first()
            ));
        }
    }
    assert!(phantoms.is_empty(), "phantom sold-outs: {phantoms:#?}");
    for sku in skus.iter() {
        app.drained(sku, stock as i64).await;
        app.books_balance(sku).await;
        let looks = app.sales.shards().look(&pid(sku)).await.expect("shards");
        assert!(looks.iter().all(|l| l.in_flight.is_empty()), "{looks:?}");
        assert_eq!(looks.iter().filter_map(|l| l.stock).sum::<i64>(), 0);
    }
}

/// An order whose search can never settle is answered 503 `unavailable`
/// after its 16 searches, and takes nothing: never a `sold_out` it cannot
/// prove. Here every look finds a move in flight that no one can finish
/// (its taking shard's hash is gone), a stand-in for other buyers moving
/// units under the search look after look (issue 68: that 503 had never
/// been seen).
async fn an_order_whose_search_never_settles_is_answered_503_and_takes_nothing(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    // One unit a shard; the buyer (3: home shard 0) asks for two.
    let sku = sharded_sale(&app, 3, 2, 3).await;
    let shards = app.sales.shards();
    let product = pid(&sku);
    assert_eq!(
        shards
            .take_only(&product, Route { from: 1, to: 2 }, 1)
            .await
            .unwrap(),
        1
    );
    let sale_2 = app.sales.keys(&product.shard(2, 3)).sale;
    let mut r = app.redis.clone();
    let kept: Vec<(String, String)> = r.hgetall(&sale_2).await.unwrap();
    let _: () = r.del(&sale_2).await.unwrap();

    let a = order(&app, 3, &sku, 2, None).await;
    assert_eq!(
        (a.status, a.code.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        "{a:?}"
    );
    let looks = shards.look(&product).await.unwrap();
    assert_eq!(looks[0].stock, Some(1), "nothing taken: {looks:?}");
    assert_eq!(looks[1].in_flight.len(), 1, "{looks:?}");

    // The move can finish again: the same buyer's two units (their limit
    // untouched by the 503), and the books balance.
    let _: () = r.hset_multiple(&sale_2, &kept).await.unwrap();
    let a = order(&app, 3, &sku, 2, None).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
    app.drained(&sku, 2).await;
    app.books_balance(&sku).await;
}

/// The same keyed order sent twice at once (a client's retry racing its
/// first try) when its units are on another shard and the sale has no
/// more: one searches, brings them home and is accepted; the other's
/// search then finds the sale empty. Both answers are the one order: the
/// refusal a search settles on is given only after the home shard's script
/// has looked at the key (the chaos test saw a key both accepted and told
/// `sold_out`).
async fn the_same_keyed_order_sent_twice_at_once_is_one_order_at_the_sell_out(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    for round in 0..5u64 {
        // Two units, one a shard; the buyer's (home: shard 0) moved away.
        let sku = sharded_sale(&app, 2, 2, 2).await;
        let product = pid(&sku);
        let moved = app
            .sales
            .shards()
            .move_units(&product, Route { from: 0, to: 1 }, 1)
            .await;
        assert_eq!(moved.unwrap(), 1);
        let (user, key) = (2 * (round + 1), format!("twice-{round}"));
        let (a, b) = tokio::join!(
            order(&app, user, &sku, 2, Some(&key)),
            order(&app, user, &sku, 2, Some(&key))
        );
        assert_eq!(
            (a.status, b.status),
            (StatusCode::ACCEPTED, StatusCode::ACCEPTED),
            "round {round}: {a:?} {b:?}"
        );
        assert_eq!(a.order_id, b.order_id, "round {round}");
    }
}

crate::on_both_backends!(
    the_same_keyed_order_sent_twice_at_once_is_one_order_at_the_sell_out,
    an_order_whose_search_never_settles_is_answered_503_and_takes_nothing,
    units_taken_away_from_a_sharded_sale_come_from_every_shard,
    a_call_routed_for_another_count_of_shards_is_written_nowhere,
    a_burst_on_a_sharded_sale_sells_exactly_its_stock_with_exact_limits_and_no_phantom_sold_out,
    a_move_left_half_done_arrives_once_and_no_unit_is_made_or_lost,
    a_move_a_failover_cut_in_two_is_mended_from_the_other_side,
    a_buyer_of_a_sharded_sale_cancels_and_the_units_go_back_to_their_shard,
    a_sharded_sale_redis_lost_is_rebuilt_shard_by_shard_from_the_books,
    a_sharded_sales_room_counts_every_shards_units,
    a_quiet_shards_drain_is_rung_awake_by_its_next_order,
    a_paced_crowd_sells_out_sharded_sales_with_no_phantom_sold_out,
);

#[tokio::test]
async fn a_sale_asks_for_one_to_64_shards() {
    let app = spawn_app_on(Backend::Single, |_| {}).await;
    for bad in [0, 65] {
        let mut body = product_body(&unique("hot-"), 10, 1);
        body["stock_shards"] = json!(bad);
        let (status, code) = status_code(app.create_product(&body).await).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::BAD_REQUEST, "invalid_request")
        );
    }
    // A waiting room with an active cap too (see room.rs).
    let mut body = product_body(&unique("hot-"), 10, 1);
    body["stock_shards"] = json!(64);
    body["waiting_room"] = json!({"ceiling_per_sec": 10, "admission_secs": 60, "join_early_secs": 60, "active_cap": 5});
    let (status, _) = status_code(app.create_product(&body).await).await;
    assert_eq!(status, StatusCode::CREATED);
}

/// A sharded sale's waiting room counts the whole sale's units: with shard
/// 0 (which holds the room) emptied by a move, buyers still join, are
/// admitted, and buy the units on the other shards.
async fn a_sharded_sales_room_counts_every_shards_units(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let mut body = product_body(&unique("hot-"), 6, 1);
    body["stock_shards"] = json!(3);
    body["waiting_room"] =
        json!({"ceiling_per_sec": 50, "admission_secs": 60, "join_early_secs": 60});
    let sku = app.sale_from(body).await;
    let product = pid(&sku);
    assert_eq!(
        app.sales
            .shards()
            .move_units(&product, Route { from: 0, to: 1 }, 2)
            .await
            .unwrap(),
        2
    );
    // User 3's home is shard 0, now empty.
    let resp = app
        .client
        .post(app.url(&format!("/api/sales/{sku}/queue")))
        .json(&json!({"user_id": 3}))
        .send()
        .await
        .expect("answered");
    let (status, joined): (StatusCode, Value) = (resp.status(), resp.json().await.unwrap());
    assert_eq!(status, StatusCode::OK, "{joined}");
    let ticket = joined["ticket"].as_str().expect("a ticket").to_owned();
    let admission =
        crate::helpers::eventually_some("admitted", std::time::Duration::from_secs(10), || async {
            let (_, s) = app
                .get_json(&format!("/api/sales/{sku}/queue/{ticket}"))
                .await;
            (s["status"] == "admitted").then(|| s["admission"].as_str().unwrap().to_owned())
        })
        .await;
    let resp = app
        .client
        .post(app.url("/api/orders"))
        .header("Admission-Token", admission)
        .json(&json!({"user_id": 3, "product_id": sku, "quantity": 1}))
        .send()
        .await
        .expect("answered");
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
}

/// A stock shard's drain sleeps when its stream is quiet, and an order its
/// shard decides rings it awake (the bell names the shard, `<pid>~<k>`).
async fn a_quiet_shards_drain_is_rung_awake_by_its_next_order(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let sku = sharded_sale(&app, 9, 3, 3).await;
    let asleep = || crate::helpers::metric(&app, &app.base, "flashsale_drains_asleep");
    // Every shard's drain sleeps (three streams, nothing in them).
    crate::helpers::eventually(
        "the drains sleep",
        std::time::Duration::from_secs(10),
        || async { asleep().await >= 3.0 },
    )
    .await;
    // User 5's home is shard 2.
    let ordered = Instant::now();
    assert_eq!(
        order(&app, 5, &sku, 1, None).await.status,
        StatusCode::ACCEPTED
    );
    app.drained(&sku, 1).await;
    // A drain's own look comes minutes later: this is the bell.
    assert!(
        ordered.elapsed() < std::time::Duration::from_secs(5),
        "persisted {:?} after the order",
        ordered.elapsed()
    );
}

/// Shard 1's master is killed while units move to and from shard 1 and
/// buyers order: after the failover and the reconciler, no unit is made or
/// lost (the sale's units in Redis and in the books add up to its stock)
/// and the books balance. With WAIT 0 the replication link is cut first,
/// so the new master lacks the last moves' halves and orders: the
/// reconciler mends the moves from the other side and restores the orders.
async fn a_master_dies_mid_moves(base: u16, replicas: u32) {
    use crate::nodes::{await_failover, master_of, port_of, restart_node, server_pid, signal};
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::time::Duration;
    let _cluster = crate::helpers::OwnCluster::start(base);
    let app = spawn_app_on(Backend::OwnCluster(base), |s| {
        s.redis.wait = Some(flashsale::config::ReplicaWait {
            replicas,
            timeout: Duration::from_millis(500),
        });
        s.redis.timeout = Duration::from_millis(1000);
    })
    .await;
    let app = Arc::new(app);
    let stock = 600u64;
    let sku = sharded_sale(&app, stock, 1, 3).await;
    let product = pid(&sku);
    let one = product.shard(1, 3);
    let victim = master_of(&app.redis_below(), &app.key(one.as_str(), "stock")).await;
    let port = port_of(&victim);
    let zero = master_of(&app.redis_below(), &app.key(&sku, "stock")).await;
    assert_ne!(zero, victim, "shards 0 and 1 on one master");

    let stop = Arc::new(AtomicBool::new(false));
    let moved = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    // Units back and forth between shard 1 and the others, all along.
    for (a, b) in [(1u16, 0u16), (0, 1), (1, 2), (2, 1)] {
        let (app, product, stop, moved) =
            (app.clone(), product.clone(), stop.clone(), moved.clone());
        tasks.spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(1) = app
                    .sales
                    .shards()
                    .move_units(&product, Route { from: a, to: b }, 1)
                    .await
                {
                    moved.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    // Buyers on every shard, slowly.
    for buyer in 0..3u64 {
        let (app, sku, stop) = (app.clone(), sku.clone(), stop.clone());
        tasks.spawn(async move {
            let mut user = buyer;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                user += 3;
                let _ = app.place_order(user + 1, &sku, 1).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    if replicas == 0 {
        crate::failover::cut_replication(port).await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    let before_kill = moved.load(std::sync::atomic::Ordering::Relaxed);
    signal(server_pid(port).await, "-9");
    await_failover(base, &victim, &app.key(one.as_str(), "stock")).await;
    restart_node(base, port);
    let at_failover = moved.load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let after = moved.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "WAIT {replicas}: {before_kill} moves before the kill, {} after the failover",
        after - at_failover
    );
    assert!(
        before_kill > 0 && after > at_failover,
        "moves on both sides of the kill"
    );

    // The reconciler mends the moves and restores the orders; then every
    // unit is either left in Redis (moves in flight counted) or held by
    // an order in the books.
    crate::helpers::eventually("no unit made or lost", Duration::from_secs(60), || async {
        let left = app.sales.ledger().stock(&product).await.ok().flatten();
        let held: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(quantity), 0) AS SIGNED) FROM tb_order \
             WHERE product_id = ? AND status <> 'cancelled'",
        )
        .bind(&sku)
        .fetch_one(&app.mysql)
        .await
        .unwrap();
        left.is_some_and(|l| l as i64 + held == stock as i64) && app.pending(&sku).await == 0
    })
    .await;
    app.books_balance(&sku).await;
}

#[tokio::test]
async fn a_master_killed_mid_moves_with_wait_loses_no_unit() {
    a_master_dies_mid_moves(7300, 1).await;
}

#[tokio::test]
async fn a_master_killed_mid_moves_without_wait_loses_no_unit_after_the_reconciler() {
    a_master_dies_mid_moves(7800, 0).await;
}
