//! The operator commands that are not servers: `audit`, `recover`,
//! `streams` and `sales`. They
//! print for people (or JSON for scripts) and turn a failed check into a
//! non-zero exit.

use std::time::Duration;

use anyhow::Context;

use crate::bookkeeping::{Audit, Recovery, Reports, Settlement, audit, recover, retire};
use crate::config::{
    AuditArgs, DbArgs, DbSettings, MemorySettings, RecoverArgs, RedisArgs, RedisSettings,
    ReportArgs, SalesArgs, StreamsArgs,
};
use crate::domain::{ProductId, SaleState};
use crate::sale::Sales;
use crate::sale::keys::GROUP;
use crate::sale::watch::{PendingEntry, StreamView};
use crate::store::{AdminEntry, Db};

/// Redis for an operator command: one request at a time, patient.
fn redis_of(args: &RedisArgs) -> anyhow::Result<Sales> {
    let settings = RedisSettings::from(args);
    let redis = RedisSettings {
        timeout: settings.timeout.max(Duration::from_secs(5)),
        pool_size: 2,
        ..settings
    };
    Ok(Sales::from_settings(&redis, MemorySettings::default())?)
}

/// Redis and the books' database for an operator command.
async fn connect(redis: &RedisArgs, db: &DbArgs) -> anyhow::Result<(Sales, Db)> {
    let settings = DbSettings::from(db);
    let db = Db::from_settings(&DbSettings {
        timeout: settings.timeout.max(Duration::from_secs(10)),
        max_connections: 2,
        ..settings
    })?;
    db.create_and_migrate().await?;
    Ok((redis_of(redis)?, db))
}

/// The audit over both stores.
fn audit_of(sales: &Sales, db: &Db) -> Audit {
    Audit::new(
        sales.ledger().clone(),
        (db.products(), db.orders(), db.audits()),
    )
}

/// `serve --dry-run` / `worker --dry-run`: the settings as the process
/// would run with them (Rust's debug notation), every secret among them
/// shown as a fingerprint (`<secret sha256:…>`, the first 8 hex digits of
/// its SHA-256), so two printouts tell whether a secret changed without
/// showing it.
pub fn print_settings(settings: &impl std::fmt::Debug, secrets: &[String]) {
    println!("{}", hide(&format!("{settings:#?}"), secrets));
    tracing::info!("the settings are valid");
}

/// `text` with every occurrence of each secret replaced by its
/// fingerprint, in one pass (longest secret first where they overlap).
fn hide(text: &str, secrets: &[String]) -> String {
    let mut secrets: Vec<&str> = secrets
        .iter()
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        match secrets.iter().find(|s| rest.starts_with(**s)) {
            Some(secret) => {
                out.push_str(&fingerprint(secret));
                rest = &rest[secret.len()..];
            }
            None => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

fn fingerprint(secret: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(secret.as_bytes());
    format!("<secret sha256:{}>", crate::domain::hex(&digest[..4]))
}

/// `flashsale audit`
pub async fn audit(args: AuditArgs) -> anyhow::Result<()> {
    let (sales, db) = connect(&args.redis, &args.db).await?;
    let only = args
        .product()
        .map(ProductId::parse)
        .transpose()
        .context("--product")?;
    let audits = audit_of(&sales, &db).audit(only.as_ref()).await?;
    let ok = audits.iter().all(|a| a.ok());
    if args.json {
        println!("{}", serde_json::json!({"ok": ok, "sales": audits}));
    } else {
        print!("{}", audit::render(&audits));
    }
    anyhow::ensure!(ok, "the books do not balance");
    Ok(())
}

/// `flashsale report <product_id>`
pub async fn report(args: ReportArgs) -> anyhow::Result<()> {
    let (sales, db) = connect(&args.redis, &args.db).await?;
    let id = ProductId::parse(&args.product).context("the product id")?;
    let reports = Reports::new(
        audit_of(&sales, &db),
        sales.room().clone(),
        (db.seconds(), db.products(), db.orders(), db.payments()),
    );
    let report = reports.report(&id).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else if args.csv {
        print!("{}", report.csv());
    } else {
        print!("{}", report.text());
    }
    Ok(())
}

/// `flashsale recover`
pub async fn recover(args: RecoverArgs) -> anyhow::Result<()> {
    let (sales, db) = connect(&args.redis, &args.db).await?;
    let product = ProductId::parse(args.product()).context("the product id")?;
    let overwrite = match args.force {
        true => recover::Overwrite::Force,
        false => recover::Overwrite::Refuse,
    };
    let recovery = Recovery::new(
        (sales.ledger().clone(), sales.lifecycle().clone()),
        (db.products(), db.orders()),
    );
    let done = recovery.recover(&product, overwrite).await?;
    println!(
        "recovered {}: stock {}, {} buyers' counts, {} cancelled orders marked released",
        done.product_id, done.stock, done.buyers, done.released
    );
    let entry = AdminEntry {
        product_id: Some(product.to_string()),
        asked: Some(serde_json::json!({"force": args.force}).to_string()),
        after: serde_json::to_string(&done).ok(),
        ..AdminEntry::new("sale.recover", cli_actor(), 0)
    };
    if let Err(e) = db.admin_log().record(&entry).await {
        tracing::error!(error = %crate::domain::Chain(&e), ?entry, "the recovery is done but not written to the admin log");
    }
    Ok(())
}

/// Who runs a command, for the admin log: `cli:<user>@<host>`.
fn cli_actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into());
    format!("cli:{user}@{host}")
}

/// `flashsale sales`: every opened sale by state; ended ones that cannot
/// retire with the reasons.
pub async fn sales(args: SalesArgs) -> anyhow::Result<()> {
    let (sales, db) = connect(&args.redis, &args.db).await?;
    let after = Duration::from_secs(args.retire_after_secs);
    let settlement = Settlement::new(
        (sales.lifecycle().clone(), sales.watch().clone()),
        (db.products(), db.orders()),
        audit_of(&sales, &db),
    );
    let listed = settlement.list(after).await?;
    if args.json {
        println!("{}", serde_json::to_string(&listed)?);
    } else {
        print!("{}", render_sales(&listed));
    }
    Ok(())
}

/// The sales as a table, a line per sale (and one per reason it waits).
pub fn render_sales(listed: &[retire::Listed]) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "{:<40} {:<10} {:>15} {:>15} {:>15}  {}\n",
        "product", "state", "ends", "closed", "retired", "detail"
    );
    let ms = |t: Option<i64>| t.map_or("-".to_owned(), |t| t.to_string());
    for s in listed {
        let waits_until = s.blockers.iter().find_map(|b| match b {
            retire::Blocker::NotEnded { ends_ms } => Some(*ends_ms),
            _ => None,
        });
        let detail = match (s.state, s.purged) {
            (SaleState::Retired, true) => "keys deleted".to_owned(),
            (SaleState::Retired, false) => "keys kept for the grace".to_owned(),
            (SaleState::Ended, _) => match waits_until {
                Some(t) => format!("settled: retires at the first pass after {t}"),
                None => "settled: retires at the next pass".to_owned(),
            },
            (SaleState::Unsettled, _) => "waits for:".to_owned(),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<40} {:<10} {:>15} {:>15} {:>15}  {detail}",
            s.product_id,
            s.state,
            s.end_time,
            ms(s.closed),
            ms(s.retired)
        );
        if s.state == SaleState::Unsettled {
            for b in &s.blockers {
                let _ = writeln!(out, "    {:<20} {}", b.code(), b.describe());
            }
        }
    }
    out
}

/// `flashsale streams`: each open sale's stream, group, consumers, pending
/// entries and dead letters (Redis only).
pub async fn streams(args: StreamsArgs) -> anyhow::Result<()> {
    let sales = redis_of(&args.redis)?;
    let products = match args.product() {
        Some(p) => vec![ProductId::parse(p).context("the product id")?],
        None => {
            let mut all = sales.lifecycle().open_sales().await?;
            all.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            all
        }
    };
    let mut reports = Vec::with_capacity(products.len());
    for product in products {
        let view = sales.watch().view(&product).await?;
        let pending_entries = match (view.has_group, args.pending) {
            (true, limit) if limit > 0 => sales.watch().pending(&product, limit).await?,
            _ => Vec::new(),
        };
        reports.push(StreamReport {
            product_id: product.to_string(),
            view,
            pending_entries,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string(&reports)?);
    } else {
        print!("{}", render_streams(&reports));
    }
    Ok(())
}

/// One sale's stream as `flashsale streams` shows it.
#[derive(Debug, serde::Serialize)]
pub struct StreamReport {
    pub product_id: String,
    #[serde(flatten)]
    pub view: StreamView,
    /// The oldest pending entries (at most `--pending`).
    pub pending_entries: Vec<PendingEntry>,
}

/// The reports as a table per sale.
pub fn render_streams(reports: &[StreamReport]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if reports.is_empty() {
        out.push_str("no open sales\n");
    }
    for r in reports {
        let v = &r.view;
        let stock = v.stock.map_or("-".to_owned(), |s| s.to_string());
        let _ = writeln!(out, "sale {}  stock {stock}", r.product_id);
        let _ = writeln!(out, "  stream {}  length {}", v.stream_key, v.stream_length);
        match &v.last_delivered_id {
            Some(last) if v.has_group => {
                let lag = v.lag.map_or("?".to_owned(), |l| l.to_string());
                let _ = writeln!(
                    out,
                    "  group {GROUP}  consumers {}  pending {}  lag {lag}  last delivered {last}",
                    v.consumers.len(),
                    v.pending,
                );
            }
            _ => out.push_str("  no consumer group\n"),
        }
        if !v.consumers.is_empty() {
            let _ = writeln!(
                out,
                "  {:<32} {:>8} {:>10}",
                "consumer", "pending", "idle ms"
            );
            for c in &v.consumers {
                let _ = writeln!(out, "  {:<32} {:>8} {:>10}", c.name, c.pending, c.idle_ms);
            }
        }
        if !r.pending_entries.is_empty() {
            let _ = writeln!(
                out,
                "  {:<24} {:<32} {:>10} {:>10}",
                "pending entry", "consumer", "idle ms", "deliveries"
            );
            for p in &r.pending_entries {
                let _ = writeln!(
                    out,
                    "  {:<24} {:<32} {:>10} {:>10}",
                    p.id, p.consumer, p.idle_ms, p.deliveries
                );
            }
        }
        let _ = writeln!(
            out,
            "  dead letters {}  ({})",
            v.dead_letters, v.dead_letter_key
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_are_hidden_in_one_pass_whatever_they_contain() {
        let secrets = ["sec".to_owned(), "pa%40ss".to_owned(), "pa@ss".to_owned()];
        let shown = super::hide("redis://:sec@h mysql://u:pa%40ss@h pa@ss secret", &secrets);
        assert!(!shown.contains(":sec@") && !shown.contains("pa%40ss") && !shown.contains("pa@ss"));
        assert_eq!(shown.matches("<secret sha256:").count(), 4, "{shown}");
    }
}
