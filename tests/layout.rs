//! The layout's rule (`src/lib.rs`): imports go one way, down the graph.
//! Reads the sources; no service needed.

use std::collections::BTreeMap;
use std::path::Path;

/// Each top-level module's level: a module may use only modules of a lower one.
const LEVELS: [(&str, u8); 10] = [
    ("domain", 0),
    ("metrics", 0),
    ("sale", 1),
    ("store", 1),
    ("books", 2),
    ("http", 3),
    ("worker", 3),
    ("config", 4),
    ("app", 5),
    ("cli", 5),
];

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_imports_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let levels: BTreeMap<&str, u8> = LEVELS.into_iter().collect();
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut upward = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src");
        let first = relative.components().next().expect("a path");
        let module = first
            .as_os_str()
            .to_str()
            .expect("utf-8")
            .trim_end_matches(".rs");
        let Some(&level) = levels.get(module) else {
            continue; // lib.rs, main.rs
        };
        let text = std::fs::read_to_string(&file).expect("a source file");
        for (n, line) in text.lines().enumerate() {
            for (used, &used_level) in &levels {
                let uses = line.contains(&format!("crate::{used}::"))
                    || line.contains(&format!("crate::{used};"))
                    || line.contains(&format!("crate::{used}}}"))
                    || line.contains(&format!("crate::{used},"));
                if *used != module && uses && used_level >= level {
                    upward.push(format!(
                        "{}:{}: {module} uses {used}",
                        relative.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layout:\n{}",
        upward.join("\n")
    );
}
