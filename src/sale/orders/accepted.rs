//! What Redis holds of the orders it accepted ([`Accepted`]): an order's
//! record and how far it got, the cancels asked while it is pending, and
//! giving its units back (or taking them again, for a late payment). The
//! books call these; the order path does not.

use std::sync::Arc;

use redis::AsyncCommands;

use super::record::{AcceptedRecord, Progress, order_state};
use super::release::{Retake, release_stock_call, retake_order_call};
use crate::domain::{OrderId, PendingOrder, ProductId};
use crate::sale::core::Core;
use crate::sale::error::SaleError;
use crate::sale::lua::script;

script!(NOTE_PAYMENT, "note_payment");

/// Elements asked for per `SSCAN`/`HSCAN` call.
const SCAN_PAGE: usize = 500;

/// The accepted orders' handle.
#[derive(Clone)]
pub struct Accepted {
    core: Arc<Core>,
}

impl Accepted {
    pub(in crate::sale) fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    /// Redis answers a `PING` (the service's readiness).
    pub async fn ping(&self) -> Result<(), SaleError> {
        self.core.redis.ping().await
    }

    /// An accepted order's record, if the sale still holds it.
    pub async fn find(
        &self,
        order_id: &OrderId,
        product: &ProductId,
    ) -> Result<Option<PendingOrder>, SaleError> {
        let accepted = self.core.keys(product).accepted;
        let record: Option<String> = self
            .core
            .call(|mut c| async move { c.hget(&accepted, order_id.as_str()).await })
            .await?;
        record
            .map(|r| AcceptedRecord::parse(&r, order_id.clone(), product.clone()))
            .transpose()
    }

    /// An accepted order's record and how far it got, if the sale still holds it.
    pub async fn progress(
        &self,
        order_id: &OrderId,
        product: &ProductId,
    ) -> Result<Option<(PendingOrder, Progress)>, SaleError> {
        let keys = self.core.keys(product);
        let found = self
            .core
            .call(|mut c| async move { order_state(&mut c, &keys, order_id).await })
            .await?;
        found
            .map(|(record, progress)| {
                let order = AcceptedRecord::parse(&record, order_id.clone(), product.clone())?;
                Ok((order, progress))
            })
            .transpose()
    }

    /// Remembers a cancel asked while the order is still pending (in the
    /// stream, not yet in MySQL); it is applied once the order is persisted.
    pub async fn request_cancel(&self, order: &PendingOrder) -> Result<(), SaleError> {
        let cancels = self.core.keys(&order.product_id).cancels;
        self.core
            .call(|mut c| async move {
                c.hset::<_, _, _, ()>(&cancels, order.order_id.as_str(), order.user_id)
                    .await
            })
            .await
    }

    /// The cancels asked for `product`'s pending orders: (order id, user id).
    pub async fn cancel_requests(
        &self,
        product: &ProductId,
    ) -> Result<Vec<(String, u64)>, SaleError> {
        let cancels = self.core.keys(product).cancels;
        self.core
            .call(|mut c| async move { c.hgetall(&cancels).await })
            .await
    }

    /// A cancel request was applied (or is moot).
    pub async fn drop_cancel_request(
        &self,
        product: &ProductId,
        order_id: &str,
    ) -> Result<(), SaleError> {
        let cancels = self.core.keys(product).cancels;
        self.core
            .call(|mut c| async move { c.hdel::<_, _, ()>(&cancels, order_id).await })
            .await
    }

    /// Keeps a payment notification the books recorded (`field`: its kind
    /// and id; `record`: what it said), beside the sale's orders, while
    /// the sale is in Redis (`note_payment.lua`); whether it was kept.
    pub async fn note_payment(
        &self,
        product: &ProductId,
        field: &str,
        record: &str,
    ) -> Result<bool, SaleError> {
        let keys = self.core.keys(product);
        let mut call = NOTE_PAYMENT.prepare_invoke();
        call.key(&keys.sale)
            .key(&keys.payments)
            .arg(field)
            .arg(record);
        self.core
            .call(|mut c| async move { call.invoke_async(&mut c).await })
            .await
    }

    /// The payment notifications kept for `product` (field, record).
    pub async fn noted_payments(
        &self,
        product: &ProductId,
    ) -> Result<Vec<(String, String)>, SaleError> {
        let key = self.core.keys(product).payments;
        self.scan("HSCAN", &key).await.map(|flat| {
            let mut pairs = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let (Some(field), Some(value)) = (it.next(), it.next()) {
                pairs.push((field, value));
            }
            pairs
        })
    }

    /// The orders whose units are given back to the sale now (released,
    /// not taken again since).
    pub async fn released_orders(&self, product: &ProductId) -> Result<Vec<String>, SaleError> {
        let key = self.core.keys(product).released;
        let mut ids = self.scan("SSCAN", &key).await?;
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// Every element of a set or hash (`SSCAN`, `HSCAN`: flat field, value),
    /// a page a call; an element may come twice.
    async fn scan(&self, command: &'static str, key: &str) -> Result<Vec<String>, SaleError> {
        let mut all = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, page): (u64, Vec<String>) = self
                .core
                .call(|mut c| async move {
                    redis::cmd(command)
                        .arg(key)
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(SCAN_PAGE)
                        .query_async(&mut c)
                        .await
                })
                .await?;
            all.extend(page);
            if next == 0 {
                return Ok(all);
            }
            cursor = next;
        }
    }

    /// Returns an order's units to the sale, at most once per order, and
    /// only if this Redis took them; returns `(released_now, stock_left)`.
    /// See `lua/release_stock.lua`.
    ///
    /// With WAIT configured, only once the replicas have the release (else
    /// `NotReplicated`): the caller marks the order released after this, and
    /// a release a failover lost must stay unmarked, for the sweeper to redo.
    #[tracing::instrument(level = "debug", skip_all, fields(product_id = %order.product_id, order_id = %order.order_id, user_id = %order.user_id))]
    pub async fn release(
        &self,
        order: &PendingOrder,
        cancelled_ms: i64,
    ) -> Result<(bool, u64), SaleError> {
        let keys = self.core.keys(&order.product_id);
        let call = release_stock_call(&keys, order, cancelled_ms);
        let (released, replicated) = self.write(&keys.stock, call).await?;
        // The units are back on the master either way.
        self.core
            .memory
            .released(&order.product_id.sale(), Some(order.user_id.get()));
        replicated?;
        Ok(released)
    }

    /// A late payment's order (cancelled, its units released) takes its
    /// units again if the sale can still sell them to its buyer
    /// (`retake_order.lua`; once per order). With `REDIS_WAIT_REPLICAS`,
    /// confirmed on the replicas before the books record the payment.
    pub async fn retake(
        &self,
        order: &PendingOrder,
        cancelled_ms: i64,
    ) -> Result<Retake, SaleError> {
        let keys = self.core.keys(&order.product_id);
        let call = retake_order_call(&keys, order, cancelled_ms);
        let (retake, replicated) = self.write(&keys.retaken, call).await?;
        replicated?;
        Ok(retake)
    }

    /// A script that writes, and with `REDIS_WAIT_REPLICAS` whether the
    /// replicas have it ([`Core::write`]).
    async fn write<T: redis::FromRedisValue>(
        &self,
        key: &str,
        call: redis::ScriptInvocation<'static>,
    ) -> Result<(T, Result<(), SaleError>), SaleError> {
        self.core.write(key, call).await
    }
}
