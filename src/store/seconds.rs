//! `tb_sale_second` ([`Seconds`]): each sale's timeline, a row per second
//! and process (see `metrics::timeline`); `tb_sale_report`: the report
//! made when the sale retired.

use std::collections::BTreeMap;

use super::db::Db;
use super::error::StoreError;
use crate::domain::ProductId;
use crate::metrics::timeline::Second;

/// Rows written at once.
const CHUNK: usize = 200;

/// One process's second of one sale, as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SecondRow {
    pub second: i64,
    pub source: String,
    /// JSON: name -> count.
    pub counts: String,
    /// JSON: name -> the highest reading.
    pub gauges: String,
    /// JSON: latency bucket -> answers.
    pub latency: String,
    /// JSON: distinct-buyers register -> the rank it was raised to.
    pub buyers: String,
}

/// A row's figures as JSON (maps of names and numbers: they always are).
fn json(figures: &impl serde::Serialize) -> String {
    serde_json::to_string(figures).unwrap_or_default()
}

/// The timelines' handle.
#[derive(Clone)]
pub struct Seconds {
    db: Db,
}

impl Seconds {
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }

    /// Writes `seconds` as `source` counted them, each with its values
    /// (written again: the same row, nothing counted twice).
    pub async fn write(
        &self,
        source: &str,
        seconds: &[(String, Second)],
    ) -> Result<(), StoreError> {
        for chunk in seconds.chunks(CHUNK) {
            let rows: Vec<(&str, i64, [String; 4])> = chunk
                .iter()
                .map(|(product, s)| {
                    let mut counts: BTreeMap<&str, u64> =
                        s.counts.iter().map(|(c, n)| (c.name(), *n)).collect();
                    for (outcome, n) in &s.answers {
                        *counts.entry(outcome.timeline_name()).or_default() += n;
                    }
                    let gauges: BTreeMap<&str, i64> =
                        s.gauges.iter().map(|(g, v)| (g.name(), *v)).collect();
                    let latency: BTreeMap<String, u32> = s
                        .latency
                        .iter()
                        .enumerate()
                        .filter(|(_, n)| **n > 0)
                        .map(|(b, n)| (b.to_string(), *n))
                        .collect();
                    let mut buyers: BTreeMap<String, u8> = BTreeMap::new();
                    for (register, rank) in &s.buyers {
                        let kept = buyers.entry(register.to_string()).or_default();
                        *kept = (*kept).max(*rank);
                    }
                    (
                        product.as_str(),
                        s.second,
                        [json(&counts), json(&gauges), json(&latency), json(&buyers)],
                    )
                })
                .collect();
            self.db
                .call(|pool| {
                    let rows = &rows;
                    async move {
                        // A runtime query: its text grows with the rows.
                        let mut insert = sqlx::QueryBuilder::<sqlx::MySql>::new(
                            "INSERT INTO tb_sale_second \
                             (product_id, second, source, counts, gauges, latency, buyers) ",
                        );
                        insert.push_values(rows, |mut row, (product, second, figures)| {
                            row.push_bind(*product).push_bind(*second).push_bind(source);
                            for f in figures {
                                row.push_bind(f);
                            }
                        });
                        insert.push(
                            " ON DUPLICATE KEY UPDATE counts = VALUES(counts), \
                             gauges = VALUES(gauges), latency = VALUES(latency), \
                             buyers = VALUES(buyers)",
                        );
                        insert.build().execute(pool).await.map(|_| ())
                    }
                })
                .await?;
        }
        Ok(())
    }

    /// A sale's rows, by second.
    pub async fn of(&self, product: &ProductId) -> Result<Vec<SecondRow>, StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query_as!(
                    SecondRow,
                    "SELECT second, source, counts, gauges, latency, buyers FROM tb_sale_second \
                     WHERE product_id = ? ORDER BY second, source",
                    product.as_str(),
                )
                .fetch_all(pool)
                .await
            })
            .await
    }

    /// Deletes a sale's rows (its report kept holds them), a chunk at a
    /// time so that no statement holds many locks; the rows deleted.
    pub async fn forget(&self, product: &ProductId) -> Result<u64, StoreError> {
        let mut deleted = 0;
        loop {
            let n = self
                .db
                .call(|pool| async move {
                    sqlx::query!(
                        "DELETE FROM tb_sale_second WHERE product_id = ? LIMIT 5000",
                        product.as_str()
                    )
                    .execute(pool)
                    .await
                    .map(|r| r.rows_affected())
                })
                .await?;
            deleted += n;
            if n < 5000 {
                return Ok(deleted);
            }
        }
    }

    /// The report made when the sale retired (JSON), if it is.
    pub async fn report(&self, product: &ProductId) -> Result<Option<String>, StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query_scalar!(
                    "SELECT report FROM tb_sale_report WHERE product_id = ?",
                    product.as_str()
                )
                .fetch_optional(pool)
                .await
            })
            .await
    }

    /// Keeps the report made at retirement, and its figures without the
    /// timeline (`summary`: the index's row); the first one stands.
    pub async fn keep_report(
        &self,
        product: &ProductId,
        (report, summary): (&str, &str),
        made: i64,
    ) -> Result<(), StoreError> {
        self.db
            .call(|pool| async move {
                sqlx::query!(
                    "INSERT IGNORE INTO tb_sale_report (product_id, report, summary, made) \
                     VALUES (?, ?, ?, ?)",
                    product.as_str(),
                    report,
                    summary,
                    made,
                )
                .execute(pool)
                .await
                .map(|_| ())
            })
            .await
    }

    /// The kept reports, newest first: `(product_id, made, summary)`, at
    /// most `limit`, those kept before `before` (epoch ms) when given. A
    /// report kept before summaries were has none (`None`).
    pub async fn kept_reports(
        &self,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<(String, i64, Option<String>)>, StoreError> {
        self.db
            .call(|pool| async move {
                let before = before.unwrap_or(i64::MAX);
                let rows = sqlx::query!(
                    "SELECT product_id, made, summary FROM tb_sale_report \
                     WHERE made < ? ORDER BY made DESC, product_id LIMIT ?",
                    before,
                    limit,
                )
                .fetch_all(pool)
                .await?;
                Ok(rows
                    .into_iter()
                    .map(|r| (r.product_id, r.made, r.summary))
                    .collect())
            })
            .await
    }
}
