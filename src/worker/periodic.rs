//! The workers' periodic passes beside the drains, each supervised and run
//! every so often (see [`super::every`]): the books' sweeper (payment
//! timeouts, interrupted cancels), reconciliation (what a failover lost in
//! Redis), the live check of every open sale's books, and retirement.

use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::activity::Looks;
use super::deliver::{Deliverer, Lags};
use super::error::WorkerError;
use super::every::{every, supervised};
use super::parts::Workers;
use super::reconciler::Reconciler;
use super::repair::Repairer;
use crate::bookkeeping::{self, BookkeepingError};
use crate::domain::{Chain, now_ms};
use crate::metrics::timeline::Count;
use crate::sale::watch::BooksVerdict;

/// Starts the passes; they stop at `shutdown`.
pub(super) fn start(workers: &Workers, shutdown: &CancellationToken) -> Vec<JoinHandle<()>> {
    let pass = |what: &'static str, run: fn(Workers, CancellationToken) -> Pass| {
        let (workers, stop) = (workers.clone(), shutdown.clone());
        let panics = workers.metrics.task_panics.clone();
        supervised(what, (shutdown.clone(), panics), move || {
            run(workers.clone(), stop.clone())
        })
    };
    let mut passes = vec![
        pass("sweeper", |w, stop| Box::pin(sweeping(w, stop))),
        pass("reconciler", |w, stop| Box::pin(reconciling(w, stop))),
        pass("repairer", |w, stop| Box::pin(repairing(w, stop))),
        pass("books check", |w, stop| Box::pin(checking_books(w, stop))),
        pass("retirement", |w, stop| Box::pin(retiring(w, stop))),
    ];
    if !workers.cfg.events.is_empty() {
        passes.push(pass("event delivery", |w, stop| {
            Box::pin(delivering(w, stop))
        }));
    }
    passes
}

type Pass = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

async fn sweeping(workers: Workers, stop: CancellationToken) {
    let sweeper = workers.sweeper();
    let looks = Mutex::new(Looks::new(workers.cfg.sweep_every));
    every("sweeper", workers.cfg.sweep_every, stop, || async {
        let mut looks = looks.lock().await;
        sweeper
            .sweep_picking(|open| looks.due(&workers.activity, &open))
            .await
            .map(|swept| {
                for (sale, n) in &swept.expired_by_sale {
                    workers.metrics.timeline.count(sale, Count::TimedOut, *n);
                }
                for (sale, n) in &swept.cancelled_by_sale {
                    workers.metrics.timeline.count(sale, Count::Cancelled, *n);
                }
            })
    })
    .await;
}

/// The outbox pushed to the shop's endpoints (`super::deliver`): one loop
/// per endpoint, so a slow or failing one holds back only itself.
async fn delivering(workers: Workers, stop: CancellationToken) {
    let lags = std::sync::Arc::new(Lags::default());
    let mut loops = tokio::task::JoinSet::new();
    for settings in &workers.cfg.events {
        let parts = &workers.parts;
        let deliverer = match Deliverer::new(
            (parts.events.clone(), parts.deliveries.clone()),
            settings.clone(),
            workers.cfg.consumer.clone(),
            workers.metrics.clone(),
        ) {
            Ok(d) => d.sharing(lags.clone()),
            // The URL and the CA file were checked with the settings: this
            // is a TLS setup the client refuses.
            Err(e) => {
                tracing::error!(endpoint = %settings.url, error = %Chain(&e), "events are not pushed to this endpoint");
                continue;
            }
        };
        let (stop, period) = (stop.clone(), workers.cfg.deliver_every);
        loops.spawn(async move { deliverer.run(period, stop).await });
    }
    // A loop that ends early (it panicked) ends the pass, which is
    // supervised and started again; the others stop with it.
    if loops.join_next().await.is_some() {
        loops.shutdown().await;
    }
}

async fn reconciling(workers: Workers, stop: CancellationToken) {
    let parts = &workers.parts;
    let redis = (parts.lifecycle.clone(), parts.ledger.clone());
    let reconciler = Mutex::new(Reconciler::new(
        redis,
        (parts.orders.clone(), parts.products.clone()),
    ));
    every("reconciler", workers.cfg.reconcile_every, stop, || async {
        reconciler.lock().await.check().await.map(|_| ())
    })
    .await;
}

/// The books' server watched every `reconcile_every`; after a failover,
/// what the streams hold and the books lost is put back (`super::repair`).
async fn repairing(workers: Workers, stop: CancellationToken) {
    let parts = &workers.parts;
    let repairer = Mutex::new(Repairer::new(
        (parts.lifecycle.clone(), parts.streams.clone()),
        parts.order_life.clone(),
        (
            parts.orders.clone(),
            parts.events.clone(),
            parts.audits.clone(),
        ),
        (workers.activity.clone(), workers.cfg.reconcile_every),
    ));
    every("repairer", workers.cfg.reconcile_every, stop, || async {
        if let Some(r) = repairer.lock().await.check().await? {
            let put_back = &workers.metrics.put_back;
            put_back.with_label_values(&["order"]).inc_by(r.orders);
            put_back.with_label_values(&["cancel"]).inc_by(r.cancels);
            put_back.with_label_values(&["payment"]).inc_by(r.payments);
            put_back
                .with_label_values(&["dead_letter"])
                .inc_by(r.dead_letters);
        }
        Ok::<(), WorkerError>(())
    })
    .await;
}

/// Every open sale's books every `books_every` (a quiet sale's less often:
/// see `super::activity`), the verdicts exported
/// (`flashsale_sale_books_balanced`, `_difference`, and the sale's `books`
/// key for the dashboards); a sale that leaves the registry leaves them.
async fn checking_books(workers: Workers, stop: CancellationToken) {
    let looks = Looks::new(workers.cfg.books_every);
    // A verdict outlives three looks at a quiet sale: it never lapses
    // between them, and fades once nobody checks.
    let lasts = looks.quiet() * 3;
    let verdicts = Mutex::new((bookkeeping::live::Verdicts::default(), looks));
    every("books check", workers.cfg.books_every, stop, || async {
        let (verdicts, looks) = &mut *verdicts.lock().await;
        let open = workers.parts.lifecycle.open_sales().await?;
        for product in &looks.due(&workers.activity, &open) {
            let grace = workers.cfg.release_grace;
            let checked = workers.parts.live.check(product, grace, verdicts).await;
            match checked {
                Ok(Some(v)) => {
                    workers
                        .metrics
                        .books(product.as_str(), v.balanced, v.difference);
                    let recorded = BooksVerdict {
                        balanced: v.balanced,
                        difference: v.difference,
                        judged_ms: now_ms(),
                    };
                    if let Err(e) = workers.parts.watch.record_books(product, recorded, lasts).await {
                        tracing::warn!(%product, error = %Chain(&e), "cannot record the books verdict");
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(%product, error = %Chain(&e), "cannot check the books"),
            }
        }
        for gone in verdicts.retain(&open) {
            workers.metrics.forget_books(gone.as_str());
        }
        Ok::<_, BookkeepingError>(())
    })
    .await;
}

/// A retirement pass every `retire_every`, with the sales-by-state gauges
/// set from what it found.
async fn retiring(workers: Workers, stop: CancellationToken) {
    let retirer = workers.retirer();
    every("retirement", workers.cfg.retire_every, stop, || async {
        let pass = retirer.pass().await?;
        count_states(&workers, &pass).await;
        Ok::<_, BookkeepingError>(())
    })
    .await;
}

async fn count_states(workers: &Workers, pass: &bookkeeping::retire::Pass) {
    let m = &workers.metrics;
    m.sales_retired.inc_by(pass.retired.len() as u64);
    m.sales_purged.inc_by(pass.purged.len() as u64);
    m.sale_unsettled.reset();
    for (product, blockers) in &pass.unsettled {
        for b in blockers {
            m.sale_unsettled
                .with_label_values(&[product.as_str(), b.code()])
                .set(1);
        }
    }
    let unsettled = pass.unsettled.len() as i64;
    m.sales
        .with_label_values(&["ended_unsettled"])
        .set(unsettled);
    if let Ok(open) = workers.parts.lifecycle.open_sales().await {
        m.sales
            .with_label_values(&["open"])
            .set((open.len() as i64 - unsettled).max(0));
    }
    if let Ok(retired) = workers.parts.products.retired_count().await {
        m.sales.with_label_values(&["retired"]).set(retired);
    }
}
