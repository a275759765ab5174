//! The layout's rule (`src/lib.rs`): imports go one way, down the graph.
//! Reads the sources; no service needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module's level: a module may use only modules of a lower
/// one. Every module `lib.rs` declares must be here.
const LEVELS: [(&str, u8); 11] = [
    ("domain", 0),
    ("metrics", 0),
    ("config", 1),
    ("sale", 2),
    ("store", 2),
    ("books", 3),
    ("http", 4),
    ("worker", 4),
    ("app", 5),
    ("cli", 5),
    ("bench_support", 6),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules `lib.rs` declares (`pub mod name;`).
fn declared_modules() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .filter_map(|l| l.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

/// The code of a file, comments and string literals left out (a doc
/// comment may name any module).
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let line = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let mut in_str = false;
        let mut prev = ' ';
        for c in line.chars() {
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            } else if !in_str {
                out.push(c);
            }
            prev = c;
        }
        out.push('\n');
    }
    out
}

/// Every top-level module a piece of code names through `crate::`: as a
/// path (`crate::sale::Sales`) or in a group (`use crate::{sale, store::Db}`,
/// over several lines too).
fn crate_uses(code: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = code[i + "crate::".len()..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // The names at the group's top level.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if c.is_whitespace() => {}
                    _ if start && depth == 0 => {
                        used.insert(ident(&group[j..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            used.insert(ident(rest));
        }
    }
    used.remove("");
    used
}

#[test]
fn every_module_has_a_level_and_a_place_on_the_map() {
    let levels: BTreeMap<&str, u8> = LEVELS.into_iter().collect();
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    for module in declared_modules() {
        assert!(
            levels.contains_key(module.as_str()),
            "lib.rs declares `{module}`, which has no level here"
        );
        assert!(
            lib.contains(&format!("[`{module}`]")),
            "lib.rs's map does not name `{module}`"
        );
    }
}

#[test]
fn no_module_imports_one_above_it() {
    let levels: BTreeMap<&str, u8> = LEVELS.into_iter().collect();
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let mut upward = Vec::new();
    let mut seen = 0;
    for file in files {
        let relative = file.strip_prefix(src()).expect("under src");
        let first = relative.components().next().expect("a path");
        let module = first
            .as_os_str()
            .to_str()
            .expect("utf-8")
            .trim_end_matches(".rs");
        if module == "lib" || module == "main" {
            continue;
        }
        let level = *levels
            .get(module)
            .unwrap_or_else(|| panic!("{} is in no module with a level", relative.display()));
        let text = std::fs::read_to_string(&file).expect("a source file");
        for used in crate_uses(&code(&text)) {
            seen += 1;
            let used_level = *levels
                .get(used.as_str())
                .unwrap_or_else(|| panic!("{}: crate::{used} is no module", relative.display()));
            if used != module && used_level >= level {
                upward.push(format!("{}: {module} uses {used}", relative.display()));
            }
        }
    }
    assert!(
        seen > 50,
        "the check found only {seen} imports: it reads nothing"
    );
    assert!(
        upward.is_empty(),
        "imports against the layout:\n{}",
        upward.join("\n")
    );
}

#[test]
fn grouped_and_spread_imports_are_read() {
    let text = "use crate::{\n    sale::{self, Sales},\n    store,\n};\nlet x = crate::books::f(\"crate::app\"); // crate::cli\n";
    let used = crate_uses(&code(text));
    let expected: BTreeSet<String> = ["books", "sale", "store"].map(String::from).into();
    assert_eq!(used, expected);
}
