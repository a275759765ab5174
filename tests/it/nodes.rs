//! The Redis servers behind a test's cluster: who serves a sale, its
//! replica, their processes, and signals to pause or kill them.

use std::time::Duration;

/// The master (host:port) serving `key`'s slot.
pub async fn master_of(redis: &flashsale::sale::Redis, key: &str) -> String {
    flashsale::bench_support::node_of(redis, key)
        .await
        .expect("CLUSTER SLOTS")
}

/// The port of a `host:port` address.
pub fn port_of(node: &str) -> u16 {
    node.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("host:port")
}

/// `INFO <section>` of the Redis server on `port`.
async fn info(port: u16, section: &str) -> String {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut c)
        .await
        .unwrap()
}

/// The port of the (first) replica of the Redis server on `port`.
pub async fn replica_of(port: u16) -> u16 {
    info(port, "replication")
        .await
        .lines()
        .find_map(|l| l.strip_prefix("slave0:"))
        .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("port=")))
        .and_then(|p| p.parse().ok())
        .expect("a replica in INFO replication")
}

/// The pid of the replica of the master serving `sku`'s sale.
pub async fn replica_pid(app: &crate::helpers::TestApp, sku: &str) -> i32 {
    let master = master_of(&app.redis_below(), &app.key(sku, "orders")).await;
    server_pid(replica_of(port_of(&master)).await).await
}

pub fn signal(pid: i32, signal: &str) {
    let sent = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// The pid of the Redis server on `port`.
pub async fn server_pid(port: u16) -> i32 {
    info(port, "server")
        .await
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("process_id in INFO")
}

/// Waits (20 s at most) until the cluster on `base..` is ok again and `key`'s
/// slot is served by a master other than `victim` (its replica took over).
pub async fn await_failover(base: u16, victim: &str, key: &str) {
    let port = port_of(victim);
    let survivor = format!(
        "redis://127.0.0.1:{}",
        if port == base { base + 1 } else { base }
    );
    let probe = flashsale::sale::Redis::new(
        &flashsale::config::RedisTarget::Cluster(vec![survivor.clone()]),
        Duration::from_millis(500),
        1,
    )
    .unwrap();
    let direct = redis::Client::open(survivor)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    crate::helpers::eventually("failover", Duration::from_secs(20), || {
        let (probe, mut direct) = (probe.clone(), direct.clone());
        async move {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut direct)
                .await
                .unwrap_or_default();
            let moved = matches!(flashsale::bench_support::node_of(&probe, key).await, Ok(node) if node != victim);
            info.contains("cluster_state:ok") && moved
        }
    })
    .await;
}

/// Starts a killed node of the cluster on `base..` again, from its folder:
/// it rejoins as a replica. Only after the failover: back any sooner, with
/// its empty memory, it would still be the master, and its replica would
/// copy the emptiness.
pub fn restart_node(base: u16, port: u16) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/redis-cluster.sh");
    let restarted = std::process::Command::new("bash")
        .args([script, "restart-node", &port.to_string()])
        .env("FLASHSALE_CLUSTER_BASE_PORT", base.to_string())
        .status()
        .unwrap();
    assert!(restarted.success());
}
