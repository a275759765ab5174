//! The cluster as a deployment: sales spread over the masters, each sale in
//! one slot, all of them sold out at once and every order persisted once.

use std::collections::HashSet;

use reqwest::StatusCode;
use serde_json::json;
use tokio::task::JoinSet;

use crate::helpers::{Backend, spawn_app_on};

/// The master (host:port) serving `key`'s slot.
async fn master_of(conn: &mut flashsale::sale::Conn, key: &str) -> String {
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .unwrap();
    for range in slots {
        let redis::Value::Array(parts) = range else {
            continue;
        };
        let num = |v: &redis::Value| match v {
            redis::Value::Int(n) => *n,
            _ => -1,
        };
        if num(&parts[0]) <= slot
            && slot <= num(&parts[1])
            && let redis::Value::Array(node) = &parts[2]
        {
            let host: String = redis::FromRedisValue::from_redis_value(node[0].clone()).unwrap();
            return format!("{host}:{}", num(&node[1]));
        }
    }
    panic!("no master serves slot {slot}");
}

#[tokio::test]
async fn many_sales_on_all_masters_sold_out_at_once_persist_every_order_once() {
    let app = spawn_app_on(Backend::Cluster, |_| {}).await;
    let mut conn = app.redis.clone();
    // Open sales until all three masters hold some (ids hash at random).
    let mut skus = Vec::new();
    let mut masters = HashSet::new();
    while skus.len() < 6 || masters.len() < 3 {
        assert!(skus.len() < 60, "sales never spread over 3 masters");
        let sku = app.new_sale(40, 1).await;
        masters.insert(master_of(&mut conn, &app.key(&sku, "orders")).await);
        skus.push(sku);
    }
    let mut set = JoinSet::new();
    for (s, sku) in skus.iter().enumerate() {
        for user in 1..=100u64 {
            let (client, url, sku) = (app.client.clone(), app.url("/api/orders"), sku.clone());
            set.spawn(async move {
                let body =
                    json!({"user_id": user + 1000 * s as u64, "product_id": sku, "quantity": 1});
                client
                    .post(url)
                    .json(&body)
                    .send()
                    .await
                    .expect("answered")
                    .status()
            });
        }
    }
    let mut accepted = 0;
    while let Some(status) = set.join_next().await {
        match status.expect("task") {
            StatusCode::ACCEPTED => accepted += 1,
            StatusCode::CONFLICT => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(accepted, 40 * skus.len());
    for sku in &skus {
        app.drained(sku, 40).await;
        assert_eq!(app.persisted(sku).await, (40, 40, 40));
        assert_eq!(app.stock(sku).await, Some(0));
        assert_eq!(app.available_qty(sku).await, 0);
    }
}
