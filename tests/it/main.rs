//! Integration tests: the real service against the real Redis and MariaDB.

/// Runs each named `async fn(Backend)` as two tests, `single::<name>` (one
/// Redis server) and `cluster::<name>` (the 3-master test cluster).
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod single {
            $(#[tokio::test]
            async fn $name() {
                super::$name(crate::helpers::Backend::Single).await
            })*
        }
        mod cluster {
            $(#[tokio::test]
            async fn $name() {
                super::$name(crate::helpers::Backend::Cluster).await
            })*
        }
    };
}
pub(crate) use on_both_backends;

mod admin_log;
mod bells;
mod books_failover;
mod books_outage;
mod browser;
mod buyer_page;
mod cluster;
mod cluster_trial;
mod comeback;
mod connections;
mod dashboard;
mod delivery;
mod events;
mod failover;
mod helpers;
mod identity;
mod lifecycle;
mod limits;
mod memory;
mod nodes;
mod observe;
mod orders;
mod pause;
mod payments;
mod products;
mod proxy;
mod replicas;
mod report;
mod resilience;
mod restock;
mod retire;
mod room;
mod shards;
mod sharing;
mod slow_clients;
mod soldout;
mod upgrade;
mod validation;
mod workers;
