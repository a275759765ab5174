//! Migrations that do not stop a sale (issue "Upgrade during a live sale"):
//! a release is deployed while a sale runs, and `serve` applies its
//! migrations at start, so a migration that locks a hot table stops the
//! workers' writes (and `DB_TIMEOUT_MS` turns the wait into errors).
//!
//! Every `ALTER TABLE`, `CREATE INDEX` or `DROP INDEX` on a hot table in a
//! migration newer than the ones measured below must say how MariaDB runs it
//! without blocking writes: `ALGORITHM=INSTANT`, or `ALGORITHM=INPLACE` (or
//! `NOCOPY`) with `LOCK=NONE`. MariaDB refuses the statement when that form
//! is impossible, so the migration fails at once instead of locking the
//! table; check it with `scripts/migration-locks.sh` (BENCHMARKS.md "What
//! does an upgrade cost?"). A `MODIFY`, `CHANGE` or `RENAME COLUMN` of a
//! column of a hot table is refused outright: a stricter type or a new name
//! breaks the release before, still running beside the new one; add a
//! column, write both, and drop the old one a release later (expand/contract,
//! docs/operations.md "Upgrading"). A new migration that alters a hot table
//! is one statement: one that gives way to an open transaction on its table
//! (it waits `TABLE_LOCK_WAIT_SECS` for the table's lock) is then tried again
//! from the start (src/store/migrate.rs).
//!
//! Reads `migrations/`; no database needed.

use std::path::{Path, PathBuf};

/// The tables written during a sale.
const HOT: [&str; 5] = [
    "tb_order",
    "tb_event",
    "tb_payment",
    "tb_sale_second",
    "tb_delivery",
];

/// The migrations applied before this rule that alter a hot table, by file
/// name: history (editing one changes its checksum and breaks the books it
/// was applied to), measured at 5,000,000 `tb_order` and 10,000,000
/// `tb_event` rows by `scripts/migration-locks.sh` (BENCHMARKS.md "What does
/// an upgrade cost?"): the migration's duration, and the longest a write
/// to the table waited while it ran.
const GRANDFATHERED: [&str; 7] = [
    // ADD COLUMN + 2 × ADD KEY on tb_order, one statement: a rebuild
    // (INPLACE, LOCK=NONE by default): 26.7 s, longest write stall 0.31 s
    "20261130000002_order_lifecycle.sql",
    // ADD COLUMN on tb_order (INSTANT): 0.02 s, stall 0.003 s
    "20261130000003_idempotency_key.sql",
    // 2 × DROP KEY + ADD KEY on tb_order (INPLACE, LOCK=NONE): 5.5 s, stall 0.03 s
    "20261201000001_order_status_index.sql",
    // MODIFY order_id NULL (a rebuild of tb_event; INPLACE, LOCK=NONE)
    // + 3 × ADD COLUMN: 4.7 s, stall 0.18 s
    "20261205000001_sale_events.sql",
    // MODIFY idempotency_key VARCHAR(64) -> (128) on tb_order (INSTANT):
    // 0.07 s, stall 0.008 s
    "20261207000001_idempotency_key_length.sql",
    // ADD COLUMN on tb_sale_second (INSTANT): 0.02 s, stall 0.002 s (500,000 rows)
    "20261210000003_sale_buyers.sql",
    // ADD INDEX on tb_event (INPLACE, LOCK=NONE): 7.1 s, stall 0.02 s
    "20261211000001_report_index.sql",
];

const EXPAND_CONTRACT: &str = "a stricter type or a new name breaks the release before, which \
     runs beside this one: add a new column, write both, read the new, and drop the old one a \
     release later (expand/contract, docs/operations.md \"Upgrading\")";

fn migrations_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations")
}

/// The statements of a migration: comments (`-- `, `#`, `/* */`) dropped,
/// split at `;` outside quotes, whitespace collapsed.
fn statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' | '`' => {
                cur.push(c);
                while let Some(d) = chars.next() {
                    cur.push(d);
                    if d == '\\' {
                        if let Some(e) = chars.next() {
                            cur.push(e);
                        }
                    } else if d == c {
                        // A doubled quote is one quote inside the string.
                        if chars.peek() == Some(&c) {
                            cur.push(chars.next().unwrap());
                        } else {
                            break;
                        }
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
                cur.push(' ');
            }
            '#' => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
                cur.push(' ');
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for d in chars.by_ref() {
                    if last == '*' && d == '/' {
                        break;
                    }
                    last = d;
                }
                cur.push(' ');
            }
            ';' => {
                out.push(std::mem::take(&mut cur));
            }
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .collect()
}

/// The words of a statement, quotes kept whole, `(`, `)`, `,` and `=` each
/// a word of their own.
fn words(stmt: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = stmt.chars().peekable();
    let flush = |cur: &mut String, out: &mut Vec<String>| {
        if !cur.is_empty() {
            out.push(std::mem::take(cur));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' | '`' => {
                cur.push(c);
                while let Some(d) = chars.next() {
                    cur.push(d);
                    if d == '\\' {
                        if let Some(e) = chars.next() {
                            cur.push(e);
                        }
                    } else if d == c {
                        if chars.peek() == Some(&c) {
                            cur.push(chars.next().unwrap());
                        } else {
                            break;
                        }
                    }
                }
            }
            '(' | ')' | ',' | '=' => {
                flush(&mut cur, &mut out);
                out.push(c.to_string());
            }
            c if c.is_whitespace() => flush(&mut cur, &mut out),
            _ => cur.push(c),
        }
    }
    flush(&mut cur, &mut out);
    out
}

fn is(word: &str, keyword: &str) -> bool {
    word.eq_ignore_ascii_case(keyword)
}

/// A table's name without quotes or its database (`flashsale`.`tb_order`).
fn table_name(word: &str) -> String {
    let last = word.rsplit('.').next().unwrap_or(word);
    last.trim_matches('`').to_ascii_lowercase()
}

/// One DDL statement on a table: which, and its top-level clauses (for
/// ALTER TABLE, split at commas outside parentheses; for CREATE/DROP INDEX,
/// the options after the index's definition, each its own clause).
struct Ddl {
    table: String,
    clauses: Vec<Vec<String>>,
}

fn ddl(stmt: &str) -> Option<Ddl> {
    let w = words(stmt);
    let at = |i: usize, k: &str| w.get(i).is_some_and(|x| is(x, k));
    if at(0, "ALTER") {
        let mut i = 1;
        while at(i, "ONLINE") || at(i, "IGNORE") {
            i += 1;
        }
        if !at(i, "TABLE") {
            return None;
        }
        i += 1;
        if at(i, "IF") && at(i + 1, "EXISTS") {
            i += 2;
        }
        let table = table_name(w.get(i)?);
        let mut clauses = vec![Vec::new()];
        let mut depth = 0usize;
        for x in &w[i + 1..] {
            match x.as_str() {
                "(" => depth += 1,
                ")" => depth = depth.saturating_sub(1),
                "," if depth == 0 => {
                    clauses.push(Vec::new());
                    continue;
                }
                _ => {}
            }
            clauses.last_mut().unwrap().push(x.clone());
        }
        return Some(Ddl { table, clauses });
    }
    // CREATE [OR REPLACE] [UNIQUE|FULLTEXT|SPATIAL] INDEX [IF NOT EXISTS] i
    // [USING t] ON tbl (...) [options]; DROP INDEX [IF EXISTS] i ON tbl [options]
    let create = at(0, "CREATE");
    if !create && !at(0, "DROP") {
        return None;
    }
    let mut i = 1;
    while at(i, "OR")
        || at(i, "REPLACE")
        || at(i, "UNIQUE")
        || at(i, "FULLTEXT")
        || at(i, "SPATIAL")
    {
        i += 1;
    }
    if !at(i, "INDEX") && !at(i, "KEY") {
        return None;
    }
    let on = (i..w.len()).find(|&j| is(&w[j], "ON"))?;
    let table = table_name(w.get(on + 1)?);
    let mut rest = on + 2;
    if create {
        // Past the parenthesised key parts.
        let mut depth = 0usize;
        while rest < w.len() {
            match w[rest].as_str() {
                "(" => depth += 1,
                ")" => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        rest += 1;
                        break;
                    }
                }
                _ => {}
            }
            rest += 1;
        }
    }
    let mut clauses: Vec<Vec<String>> = Vec::new();
    for x in &w[rest.min(w.len())..] {
        if is(x, "ALGORITHM") || is(x, "LOCK") || clauses.is_empty() {
            clauses.push(Vec::new());
        }
        clauses.last_mut().unwrap().push(x.clone());
    }
    Some(Ddl { table, clauses })
}

/// The value of an option clause (`ALGORITHM = INPLACE`, `LOCK NONE`).
fn option(clauses: &[Vec<String>], name: &str) -> Option<String> {
    clauses
        .iter()
        .filter(|c| c.first().is_some_and(|x| is(x, name)))
        .filter_map(|c| c.iter().skip(1).find(|x| *x != "="))
        .map(|v| v.to_ascii_uppercase())
        .next_back()
}

/// What is wrong with one statement of a migration that is held to the
/// rule (nothing: an empty list).
fn violations(stmt: &str) -> Vec<String> {
    let Some(d) = ddl(stmt) else {
        return Vec::new();
    };
    if !HOT.contains(&d.table.as_str()) {
        return Vec::new();
    }
    let mut found = Vec::new();
    for c in &d.clauses {
        let first = c.first().map(|x| x.to_ascii_uppercase());
        let second = c.get(1).map(|x| x.to_ascii_uppercase());
        let changes_column = matches!(
            (first.as_deref(), second.as_deref()),
            (Some("MODIFY" | "CHANGE"), _) | (Some("RENAME"), Some("COLUMN"))
        );
        if changes_column {
            found.push(format!(
                "`{}` on hot table {}: refused, {EXPAND_CONTRACT}",
                c.join(" "),
                d.table
            ));
        }
    }
    let algorithm = option(&d.clauses, "ALGORITHM");
    let lock = option(&d.clauses, "LOCK");
    let online = match algorithm.as_deref() {
        Some("INSTANT") => true,
        Some("INPLACE" | "NOCOPY") => lock.as_deref() == Some("NONE"),
        _ => false,
    };
    if !online {
        found.push(format!(
            "`{stmt}` on hot table {} (ALGORITHM={}, LOCK={}): say ALGORITHM=INSTANT, or \
             ALGORITHM=INPLACE, LOCK=NONE, so that MariaDB refuses it rather than block the \
             sale's writes (measure it with scripts/migration-locks.sh)",
            d.table,
            algorithm.as_deref().unwrap_or("default"),
            lock.as_deref().unwrap_or("default"),
        ));
    }
    found
}

/// What is wrong with a migration file (its name and its text).
fn check_file(name: &str, sql: &str) -> Vec<String> {
    if GRANDFATHERED.contains(&name) {
        return Vec::new();
    }
    let stmts = statements(sql);
    let mut found: Vec<String> = stmts
        .iter()
        .flat_map(|s| violations(s))
        .map(|v| format!("{name}: {v}"))
        .collect();
    let alters_hot = stmts
        .iter()
        .any(|s| ddl(s).is_some_and(|d| HOT.contains(&d.table.as_str())));
    if alters_hot && stmts.len() > 1 {
        found.push(format!(
            "{name}: {} statements, one of which alters a hot table: such a migration is one \
             statement, so that when it gives way to an open transaction on its table it is \
             tried again from the start (src/store/migrate.rs); put the others in a \
             migration of their own",
            stmts.len()
        ));
    }
    found
}

fn migration_files(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .expect("the migrations directory is readable")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let sql = std::fs::read_to_string(&p).expect("a migration is readable");
            (name, sql)
        })
        .collect();
    files.sort();
    files
}

fn check_dir(dir: &Path) -> Vec<String> {
    migration_files(dir)
        .iter()
        .flat_map(|(name, sql)| check_file(name, sql))
        .collect()
}

#[test]
fn every_migration_after_the_measured_ones_leaves_the_hot_tables_writable() {
    let found = check_dir(&migrations_dir());
    assert!(
        found.is_empty(),
        "migrations that would stop a sale's writes:\n{}",
        found.join("\n")
    );
}

/// The list names history: files that exist, each of which does alter a hot
/// table (and so needs the exemption), and every existing migration that
/// would fail the rule is on it (none was left out by mistake; and a new
/// file cannot be added to it without this test being edited).
#[test]
fn the_grandfathered_migrations_are_the_measured_ones() {
    let files = migration_files(&migrations_dir());
    for g in GRANDFATHERED {
        let (_, sql) = files
            .iter()
            .find(|(n, _)| n == g)
            .unwrap_or_else(|| panic!("{g} is grandfathered but not in migrations/"));
        let breaks: Vec<String> = statements(sql).iter().flat_map(|s| violations(s)).collect();
        assert!(
            !breaks.is_empty(),
            "{g} needs no exemption: take it off the list"
        );
    }
    let newest = GRANDFATHERED.iter().max().unwrap();
    assert_eq!(
        *newest, "20261211000001_report_index.sql",
        "the list is history: a new migration is held to the rule, not added here"
    );
}

// The parser and the rule, on crafted migrations.

#[test]
fn an_index_added_to_a_hot_table_without_an_online_form_is_refused() {
    for bad in [
        "ALTER TABLE tb_order ADD KEY idx_x (status, created);",
        "alter table `flashsale`.`tb_event` add index idx_x (type)",
        "ALTER TABLE tb_order ADD KEY idx_x (status), ALGORITHM=INPLACE;",
        "ALTER TABLE tb_order ADD KEY idx_x (status), ALGORITHM=INPLACE, LOCK=SHARED;",
        "ALTER TABLE tb_order ADD KEY idx_x (status), LOCK=NONE;",
        "ALTER TABLE tb_payment ADD COLUMN x INT NULL, ALGORITHM=COPY, LOCK=NONE;",
        "ALTER TABLE tb_sale_second ENGINE=InnoDB;",
        "CREATE INDEX idx_x ON tb_order (status);",
        "CREATE UNIQUE INDEX IF NOT EXISTS idx_x ON tb_delivery (a, b) LOCK=NONE;",
        "DROP INDEX idx_product ON tb_event;",
    ] {
        let found = check_file("20991231000001_new.sql", bad);
        assert_eq!(found.len(), 1, "{bad:?}: {found:?}");
        assert!(found[0].contains("ALGORITHM=INSTANT"), "{found:?}");
    }
}

#[test]
fn a_hot_table_altered_in_an_online_form_passes() {
    for good in [
        "ALTER TABLE tb_order ADD KEY idx_x (status, created), ALGORITHM=INPLACE, LOCK=NONE;",
        "ALTER TABLE tb_order ADD KEY idx_x (status), LOCK = NONE, ALGORITHM = INPLACE;",
        "ALTER TABLE tb_event ADD COLUMN x INT NULL, ALGORITHM=INSTANT;",
        "ALTER TABLE tb_sale_second ADD COLUMN IF NOT EXISTS y TEXT NOT NULL DEFAULT '{}', algorithm=instant;",
        "ALTER TABLE tb_order DROP KEY idx_x, ALGORITHM=NOCOPY, LOCK=NONE;",
        "CREATE INDEX idx_x ON tb_order (status, created) ALGORITHM=INPLACE LOCK=NONE;",
        "DROP INDEX idx_x ON tb_order ALGORITHM = INPLACE LOCK = NONE;",
        // Not a hot table, not a schema change.
        "ALTER TABLE tb_product ADD COLUMN z INT NULL;",
        "CREATE TABLE tb_new (id BIGINT PRIMARY KEY); INSERT INTO tb_new VALUES (1);",
        "UPDATE tb_order SET status = 'paid' WHERE id = 0;",
    ] {
        assert_eq!(
            check_file("20991231000001_new.sql", good),
            Vec::<String>::new(),
            "{good:?}"
        );
    }
}

#[test]
fn a_column_modified_changed_or_renamed_on_a_hot_table_is_refused_even_online() {
    for bad in [
        "ALTER TABLE tb_order MODIFY COLUMN idempotency_key VARCHAR(255) NULL, ALGORITHM=INSTANT;",
        "ALTER TABLE tb_order MODIFY status VARCHAR(8) NOT NULL, ALGORITHM=INPLACE, LOCK=NONE;",
        "ALTER TABLE tb_event CHANGE type kind VARCHAR(32) NOT NULL, ALGORITHM=INSTANT;",
        "ALTER TABLE tb_payment RENAME COLUMN result TO outcome, ALGORITHM=INSTANT;",
    ] {
        let found = check_file("20991231000001_new.sql", bad);
        assert_eq!(found.len(), 1, "{bad:?}: {found:?}");
        assert!(found[0].contains("expand/contract"), "{found:?}");
        assert!(found[0].contains("docs/operations.md"), "{found:?}");
    }
    // Without an online form, both complaints.
    let found = check_file(
        "20991231000001_new.sql",
        "ALTER TABLE tb_order MODIFY price DECIMAL(19,4) NOT NULL",
    );
    assert_eq!(found.len(), 2, "{found:?}");
    // Not a hot table: not this rule's business.
    assert!(
        check_file(
            "20991231000001_new.sql",
            "ALTER TABLE tb_product MODIFY title TEXT"
        )
        .is_empty()
    );
}

#[test]
fn a_grandfathered_file_passes_and_the_same_text_under_a_new_name_does_not() {
    let name = "20261130000002_order_lifecycle.sql";
    let sql = std::fs::read_to_string(migrations_dir().join(name)).expect("the migration");
    assert!(check_file(name, &sql).is_empty());
    let found = check_file("20991231000001_order_lifecycle_again.sql", &sql);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("tb_order") && found[0].contains("ALGORITHM"),
        "{found:?}"
    );
    assert!(found[1].contains("3 statements"), "{found:?}");
    let name = "20261207000001_idempotency_key_length.sql";
    let sql = std::fs::read_to_string(migrations_dir().join(name)).expect("the migration");
    assert!(check_file(name, &sql).is_empty());
    let found = check_file("20991231000001_again.sql", &sql);
    assert!(
        found.iter().any(|f| f.contains("expand/contract")),
        "{found:?}"
    );
}

#[test]
fn comments_and_strings_do_not_fool_the_parser() {
    let sql = "-- ALTER TABLE tb_order ADD KEY a (status);\n\
               # ALTER TABLE tb_order ADD KEY b (status);\n\
               /* ALTER TABLE tb_order ADD KEY c (status); */\n\
               ALTER TABLE tb_sale_second ADD COLUMN d TEXT NOT NULL DEFAULT 'x; ALTER TABLE tb_order ADD KEY e (f)', \
               ALGORITHM=INSTANT;\n\
               ALTER TABLE tb_event ADD COLUMN `lock` INT NULL, ALGORITHM=INSTANT;";
    assert_eq!(statements(sql).len(), 2, "{:?}", statements(sql));
    assert!(statements(sql).iter().all(|s| violations(s).is_empty()));
    // Two statements on hot tables: online each, but not one migration.
    let found = check_file("20991231000001_new.sql", sql);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("2 statements"), "{found:?}");
    for one in statements(sql) {
        assert!(check_file("20991231000001_new.sql", &one).is_empty());
    }
    // A column named like an option is not the option.
    let found = check_file(
        "20991231000001_new.sql",
        "ALTER TABLE tb_event ADD COLUMN algorithm VARCHAR(8) NULL",
    );
    assert_eq!(found.len(), 1, "{found:?}");
}

/// The check the real test runs, on a directory with a crafted migration
/// beside a copy of the real ones: it fails, naming the new file only.
#[test]
fn a_crafted_blocking_migration_fails_the_directory_check() {
    let dir = std::env::temp_dir().join(format!(
        "flashsale-migrations-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    for (name, sql) in migration_files(&migrations_dir()) {
        std::fs::write(dir.join(name), sql).expect("a copy");
    }
    std::fs::write(
        dir.join("20991231000001_status_by_user.sql"),
        "-- Orders by user and status.\nALTER TABLE tb_order ADD KEY idx_user_status (user_id, status);\n",
    )
    .expect("the crafted migration");
    let found = check_dir(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("20991231000001_status_by_user.sql: "),
        "{found:?}"
    );
}

/// The service counts a migration's statements to know whether one that
/// gave way to an open transaction can be tried again from the start
/// (src/store/migrate.rs): it counts as this test's parser does.
#[test]
fn the_service_counts_statements_as_this_parser_does() {
    let mut texts: Vec<String> = migration_files(&migrations_dir())
        .into_iter()
        .map(|(_, sql)| sql)
        .collect();
    texts.push(
        "-- a; b\nALTER TABLE t ADD COLUMN c TEXT DEFAULT 'x;y''z;', ALGORITHM=INSTANT;".into(),
    );
    texts.push("/* ; */ SELECT \"a;\"; # ;\n SELECT `b;`".into());
    for sql in texts {
        assert_eq!(
            flashsale::store::count_statements(&sql),
            statements(&sql).len(),
            "{sql}"
        );
    }
}
