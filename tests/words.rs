//! One word per idea (`src/lib.rs`, "Words"): the retired uses of
//! "queue", "line", "rate" and "slot" are refused in the code, the docs,
//! the scripts, the alerts and the pages. Reads the files; no service needed.
//!
//! History is left as written: `CHANGELOG.md`, `BENCHMARKS.md`,
//! `docs/benchmark-history.md`, and the migrations (sqlx checksums them).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What is read: folders (walked) and files, from the repository's root.
const READ: [&str; 8] = [
    "src",
    "lua",
    "docs",
    "tests",
    "bench/src",
    "deploy",
    "README.md",
    "Cargo.toml",
];

/// Left as written: history, and this file (it names what it refuses).
const HISTORY: [&str; 4] = [
    "CHANGELOG.md",
    "BENCHMARKS.md",
    "docs/benchmark-history.md",
    "tests/words.rs",
];

const KINDS: [&str; 10] = [
    "rs", "md", "lua", "js", "html", "css", "yml", "yaml", "json", "toml",
];

/// Where "queue" is still the word, kept for clients or a proper noun:
/// removed from a line before it is read.
const QUEUE_KEPT: [&str; 11] = [
    "/queue",
    "queue/",
    "queue_not_open",
    "queuenotopen",
    "join_queue",
    "queue_standing",
    "queue-it",
    "wsrep_local_recv_queue",
    // The glossary's own words for it.
    "**queue**",
    "\"queue\"",
    // The retired alert, kept one release (deploy/prometheus, docs/operations.md).
    "flashsalequeuegrowing",
];

/// Phrases that exist only in a retired sense: the places admitted or a
/// chart's series called a line; the pace or the ceiling called a rate; a
/// shard or a permit called a slot.
const RETIRED: [(&str, &str); 27] = [
    ("\"now serving\" line", "the places admitted (`served`)"),
    ("the line reached", "the places admitted"),
    ("line reaches", "the places admitted"),
    ("line stood at", "the places admitted"),
    ("line stands at", "the places admitted"),
    ("where the line stood", "what was admitted"),
    ("the line admits", "the room admits"),
    ("moves the line", "admits places"),
    ("line may go", "the places admitted"),
    ("(the line)", "the places admitted"),
    ("places the line", "the places admitted"),
    ("gauge::line", "Gauge::Admitted"),
    ("struct lines", "a chart's series"),
    ("one line of a chart", "a chart's series"),
    ("line chart", "a chart of series"),
    ("holding the line", "under a spike"),
    ("admission rate", "the pace, the ceiling or the floor"),
    ("room_rate", "the pace"),
    ("in-flight slot", "a permit"),
    ("free slot", "a permit"),
    ("slot among", "a permit"),
    ("holding a slot", "a permit"),
    ("redis slots", "shards, each in its own hash slot"),
    ("different slots", "each in its own hash slot"),
    ("slots its stock", "shards"),
    ("struct slot", "a name of what it keeps"),
    ("::slots", "EVENTS_PER_ROW"),
];

/// The input aliases of the ceiling and the floor: deprecated, accepted
/// through 0.2.x where they were (removed in 0.3.0), nowhere new.
const ALIASES: [&str; 2] = [
    "alias = \"admit_per_sec\"",
    "alias = \"admit_floor_per_sec\"",
];
const ALIASES_KEPT_IN: [&str; 2] = ["src/domain/room.rs", "src/http/operators/room_pace.rs"];

fn files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).expect("a readable folder") {
            files(&entry.expect("an entry").path(), out);
        }
    } else if path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| KINDS.contains(&e))
    {
        out.push(path.to_path_buf());
    }
}

/// The retired uses in `text` (the file at `rel`), as `rel:line: why`.
fn retired_uses(rel: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, original) in text.lines().enumerate() {
        let mut line = original.to_lowercase();
        for kept in QUEUE_KEPT {
            line = line.replace(kept, " ");
        }
        let mut say =
            |why: String| found.push(format!("{rel}:{}: {why}: {}", n + 1, original.trim()));
        let queue = line
            .split(|c: char| !c.is_alphanumeric())
            .any(|w| w.starts_with("queu") || w.starts_with("enqueu"));
        if queue {
            say("\"queue\" is only the room's routes' word: the stream, shed (nothing waits), the listen backlog".into());
        }
        for (phrase, instead) in RETIRED {
            if line.contains(phrase) {
                say(format!("{phrase:?} is retired: {instead}"));
            }
        }
        if !ALIASES_KEPT_IN.contains(&rel) && ALIASES.iter().any(|a| line.contains(a)) {
            say("the ceiling's and floor's old names are not taken anywhere new".into());
        }
    }
    found
}

#[test]
fn the_retired_words_are_used_nowhere() {
    let root = root();
    let mut paths = Vec::new();
    for read in READ {
        files(&root.join(read), &mut paths);
    }
    let mut found = Vec::new();
    for path in paths {
        let rel = path
            .strip_prefix(&root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        if HISTORY.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a text file");
        found.extend(retired_uses(&rel, &text));
    }
    assert!(
        found.is_empty(),
        "retired words (src/lib.rs, \"Words\"):\n{}",
        found.join("\n")
    );
}

#[test]
fn each_retired_use_is_found() {
    let refused = [
        "Redis Streams as the queue",
        "the order is enqueued at once",
        "Progress::Queued",
        "moves the \"now serving\" line on",
        "where the line stood when",
        "Holding the line: load shedding",
        "The waiting room's admission rate now",
        "No free slot means 503",
        "the stock split over that many Redis slots",
        "#[serde(alias = \"admit_per_sec\")]",
    ];
    for text in refused {
        assert_eq!(retired_uses("src/x.rs", text).len(), 1, "{text}");
    }
    let kept = [
        "POST /api/sales/{id}/queue: join the line",
        "409 `queue_not_open`",
        "Queue-it asks a proof of work",
        "each shard in its own hash slot",
        "buyers wait in line",
        "429 `rate_limited` past the rate limit",
    ];
    for text in kept {
        assert!(retired_uses("src/x.rs", text).is_empty(), "{text}");
    }
    let alias = "#[serde(alias = \"admit_per_sec\")]";
    assert!(retired_uses("src/domain/room.rs", alias).is_empty());
}
