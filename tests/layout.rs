//! The layout's rule (`src/lib.rs`): imports go one way, down the graph.
//! Reads the sources; no service needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module's level: a module may use only modules of a lower
/// one. Every module `lib.rs` declares must be here.
const LEVELS: [(&str, u8); 11] = [
    ("domain", 0),
    ("metrics", 1),
    ("config", 1),
    ("sale", 2),
    ("store", 2),
    ("bookkeeping", 3),
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
    names_after(code, "crate::")
}

/// Every name a piece of code reaches through `prefix` (`crate::`,
/// `super::`, `crate::store::`): as a path or in a group.
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices(prefix) {
        // `super::x` inside `super::super::x` is not this prefix's.
        if i >= 2 && prefix.starts_with("super") && &code[i - 2..i] == "::" {
            continue;
        }
        let rest = code[i + prefix.len()..].trim_start();
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
    // `super::super::` is a longer path, `self` the module itself.
    for not_a_name in ["", "super", "self"] {
        used.remove(not_a_name);
    }
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
    let text = "use crate::{\n    sale::{self, Sales},\n    store,\n};\nlet x = crate::bookkeeping::f(\"crate::app\"); // crate::cli\n";
    let used = crate_uses(&code(text));
    let expected: BTreeSet<String> = ["bookkeeping", "sale", "store"].map(String::from).into();
    assert_eq!(used, expected);
}

/// The modules a folder of `src` declares, a file or a folder each.
fn children(folder: &Path) -> BTreeSet<String> {
    std::fs::read_dir(folder)
        .expect("a folder of src")
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = path.file_stem()?.to_str()?.to_owned();
            let source = path.is_dir() || path.extension().is_some_and(|x| x == "rs");
            (source && name != "mod").then_some(name)
        })
        .collect()
}

/// What each module of `folder` names through `super::` (as deep as it
/// stands) or through `crate::<folder>::`: its siblings, and what the
/// folder's `mod.rs` (the folder's face, which declares them all and is
/// no sibling) holds or passes on.
fn names_used(folder: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let inner = folder
        .strip_prefix(src())
        .expect("under src")
        .components()
        .map(|c| c.as_os_str().to_str().expect("utf-8"))
        .collect::<Vec<_>>()
        .join("::");
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for child in children(folder) {
        let path = folder.join(&child);
        let mut files = Vec::new();
        if path.is_dir() {
            sources(&path, &mut files);
        } else {
            files.push(path.with_extension("rs"));
        }
        let used = uses.entry(child.clone()).or_default();
        for file in files {
            let inside = file
                .strip_prefix(folder)
                .expect("inside")
                .components()
                .count();
            // A folder's mod.rs stands where its folder does.
            let depth = match file.file_name().and_then(|n| n.to_str()) {
                Some("mod.rs") => inside - 1,
                _ => inside,
            };
            let text = std::fs::read_to_string(&file).expect("a source file");
            // A file's unit tests (at its end) may reach anything.
            let text = code(text.split("#[cfg(test)]").next().unwrap_or_default());
            let up = "super::".repeat(depth);
            used.extend(names_after(&text, &up));
            // `crate::<folder>::` names the folder from the crate's root:
            // the whole path for a nested folder (`crate::store::orders::`).
            used.extend(names_after(&text, &format!("crate::{inner}::")));
            used.remove(&child);
        }
    }
    uses
}

/// Which of its siblings each module of `folder` uses.
fn sibling_uses(folder: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let siblings = children(folder);
    names_used(folder)
        .into_iter()
        .map(|(child, used)| {
            let used = used.into_iter().filter(|n| siblings.contains(n)).collect();
            (child, used)
        })
        .collect()
}

/// A circle among `uses`, if there is one (its modules in order).
fn circle(uses: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        uses: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == at) {
            return Some(path[i..].to_vec());
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_owned());
        for next in uses.get(at).into_iter().flatten() {
            if let Some(c) = visit(next, uses, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(at.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    uses.keys()
        .find_map(|m| visit(m, uses, &mut Vec::new(), &mut done))
}

/// Inside each folder of `src`, its modules stand on levels too: none uses
/// a sibling that uses it back, however far round (the folder's `mod.rs`
/// declares them, and is no sibling).
#[test]
fn no_folder_holds_a_circle() {
    let mut checked = 0;
    for folder in &folders() {
        let uses = sibling_uses(folder);
        checked += uses.values().map(BTreeSet::len).sum::<usize>();
        if let Some(c) = circle(&uses) {
            panic!(
                "{}: a circle: {}",
                folder.strip_prefix(src()).expect("under src").display(),
                c.join(" -> ")
            );
        }
    }
    assert!(
        checked > 40,
        "only {checked} uses between siblings: it reads nothing"
    );
}

#[test]
fn a_circle_between_siblings_is_found() {
    let uses: BTreeMap<String, BTreeSet<String>> = [
        ("db", vec!["error", "topology"]),
        ("topology", vec!["db"]),
        ("error", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        circle(&uses),
        Some(vec!["db".to_owned(), "topology".to_owned()])
    );
    let text = "use super::{db::Db, error};\nuse super::super::books;\nlet t = crate::store::topology::X;\n";
    let one_up: BTreeSet<String> = ["db", "error"].map(String::from).into();
    assert_eq!(names_after(&code(text), "super::"), one_up);
    assert!(names_after(&code(text), "super::super::").contains("books"));
    assert!(names_after(&code(text), "crate::store::").contains("topology"));
}

/// The folders of `src` (their assets left out).
fn folders() -> Vec<PathBuf> {
    let mut folders = Vec::new();
    let mut stack = vec![src()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() && path.file_name().is_some_and(|n| n != "assets") {
                folders.push(path.clone());
                stack.push(path);
            }
        }
    }
    folders
}

/// Inside each folder, no arrow runs back up: a module takes what it uses
/// from its siblings, never from the folder's `mod.rs`, which declares
/// them (and may pass on what they hold to the rest of the crate): a type
/// kept in `mod.rs` and used by a child would make the face and the child
/// each other's dependency.
#[test]
fn no_module_uses_its_folders_face() {
    let mut upward = Vec::new();
    let mut checked = 0;
    for folder in folders() {
        let siblings = children(&folder);
        for (child, used) in names_used(&folder) {
            checked += used.len();
            for name in used.iter().filter(|n| !siblings.contains(*n)) {
                upward.push(format!(
                    "{}/{child} uses {name} from its folder's mod.rs",
                    folder.strip_prefix(src()).expect("under src").display()
                ));
            }
        }
    }
    assert!(checked > 40, "only {checked} names read: it reads nothing");
    assert!(upward.is_empty(), "arrows back up:\n{}", upward.join("\n"));
}

/// The HTTP wing's floors: what the wings share at the bottom, then the
/// transport, the buyers' side, the operators' side (which shows the
/// buyers' product view), and what assembles them on top. A module uses
/// only siblings on a lower floor.
const HTTP_LEVELS: [(&str, u8); 10] = [
    ("error", 0),
    ("pages", 0),
    ("auth", 1),
    ("extract", 2),
    ("transport", 3),
    ("buyers", 4),
    ("operators", 5),
    ("openapi", 6),
    ("state", 6),
    ("router", 7),
];

#[test]
fn the_http_wings_stand_on_their_floors() {
    let levels: BTreeMap<&str, u8> = HTTP_LEVELS.into_iter().collect();
    let folder = src().join("http");
    let mut against = Vec::new();
    for (child, used) in sibling_uses(&folder) {
        let level = *levels
            .get(child.as_str())
            .unwrap_or_else(|| panic!("http/{child} has no floor in HTTP_LEVELS"));
        for u in used {
            if levels[u.as_str()] >= level {
                against.push(format!("http/{child} uses http/{u}"));
            }
        }
    }
    assert!(
        against.is_empty(),
        "uses against the wings' floors:\n{}",
        against.join("\n")
    );
}

/// The calls that run SQL unchecked at build time (issue 70: every static
/// query is a `query!`/`query_as!`/`query_scalar!` macro, checked against
/// the migrated schema by `scripts/check-queries.sh`).
const RUNTIME_CALLS: [&str; 7] = [
    "sqlx::query(",
    "sqlx::query_as(",
    "sqlx::query_scalar(",
    "sqlx::query_with(",
    "QueryBuilder::",
    "query_as::<",
    "query_scalar::<",
];

/// Modules whose every query is a runtime one, and say why in their doc.
const RUNTIME_MODULES: [&str; 2] = ["store/server.rs", "store/migrate.rs"];

/// The runtime queries of `text` (a file of `src/` at `rel`) that do not
/// say why they are built at run time: a `// A runtime query: <why>`
/// comment within the three lines above the call.
fn unexplained_runtime_queries(rel: &str, text: &str) -> Vec<String> {
    if RUNTIME_MODULES.contains(&rel) {
        return Vec::new();
    }
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if !RUNTIME_CALLS.iter().any(|c| code.contains(c)) {
            continue;
        }
        let said = lines[n.saturating_sub(3)..n]
            .iter()
            .any(|l| l.trim_start().starts_with("// A runtime query: "));
        if !said {
            found.push(format!("src/{rel}:{}: {}", n + 1, line.trim()));
        }
    }
    found
}

#[test]
fn every_runtime_query_says_why_it_is_not_checked_at_build_time() {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let mut found = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(src())
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&path).expect("a source file");
        found.extend(unexplained_runtime_queries(&rel, &text));
    }
    assert!(
        found.is_empty(),
        "queries unchecked at build time: make each a sqlx::query! macro (its text \
         static), or say on the line above why its text is built at run time \
         (`// A runtime query: ...`):\n{}",
        found.join("\n")
    );
    let server = std::fs::read_to_string(src().join("store/server.rs")).expect("server.rs");
    assert!(server.contains("runtime queries"), "server.rs says why");
}

#[test]
fn a_static_query_left_at_run_time_is_found() {
    let unexplained = "let n = sqlx::query_scalar(\"SELECT COUNT(*) FROM tb_order\")";
    assert_eq!(
        unexplained_runtime_queries("store/x.rs", unexplained).len(),
        1
    );
    let explained =
        "// A runtime query: its `IN` list grows.\nlet mut q = QueryBuilder::<MySql>::new(\"\");";
    assert!(unexplained_runtime_queries("store/x.rs", explained).is_empty());
    let checked = "sqlx::query_scalar!(\"SELECT COUNT(*) FROM tb_order\")";
    assert!(unexplained_runtime_queries("store/x.rs", checked).is_empty());
}
