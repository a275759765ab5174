//! Integration tests: the real service against the real Redis and MariaDB.

mod bench;
mod helpers;
mod orders;
mod products;
mod proxy;
mod resilience;
mod soldout;
mod validation;
mod workers;
