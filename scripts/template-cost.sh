#!/usr/bin/env bash
# What a page template costs (BENCHMARKS.md, "Pages from templates"): the
# report page's head, figures and refusals made three ways, hand-written
# with an escape function (as before), maud and askama, each a crate of its
# own in a temporary directory: a clean release build and a rebuild after a
# page change (time), and the instructions per render (callgrind, the
# difference between 1,000 and 11,000 renders: repeatable on a shared
# machine). Needs valgrind (Debian's package).
set -euo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
mkdir -p hand/src maud/src askama/src askama/templates
cat > common.rs <<'RS'
pub struct Page {
    pub id: String,
    pub title: String,
    pub kept: bool,
    pub rows: Vec<(&'static str, String)>,
    pub refused: Vec<(String, u64)>,
}

pub fn sample() -> Page {
    Page {
        id: "sku-<1>".into(),
        title: "Phone & \"case\"".into(),
        kept: true,
        rows: (0..12).map(|i| ("Figure <x>", format!("{} of {} & more", i * 7, 1000))).collect(),
        refused: (0..5).map(|i| (format!("code_{i}"), i * 100)).collect(),
    }
}

pub fn bench(render: impl Fn(&Page) -> String) {
    let page = sample();
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let out = render(&page);
    if std::env::args().nth(2).as_deref() == Some("show") { println!("{out}"); return; }
    let t = std::time::Instant::now();
    let mut bytes = 0;
    for _ in 0..n { bytes += render(&page).len(); }
    let e = t.elapsed();
    println!("{} renders, {} bytes each, {:.2} µs per render", n, bytes / n, e.as_secs_f64() * 1e6 / n as f64);
}
RS
cat > hand/Cargo.toml <<'TOML'
[package]
name = "tpl-hand"
version = "0.1.0"
edition = "2024"
[dependencies]
[profile.release]
debug = "line-tables-only"
TOML
cat > hand/src/main.rs <<'RS'
#[path = "../../common.rs"]
mod common;
use common::*;
use std::fmt::Write;

fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn render(p: &Page) -> String {
    let mut out = String::new();
    let _ = write!(out, "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Report: {id}</title><link rel=\"stylesheet\" href=\"/admin/assets/dashboard.css\"></head><body class=\"report\"><header><h1>Report: {id}</h1><p>{title} · {state} · <a href=\"/admin/dashboard\">back to the dashboard</a> · <a href=\"/api/admin/products/{id}/report/csv\">timeline as CSV</a></p></header><main>", id = esc(&p.id), title = esc(&p.title), state = if p.kept { "kept at its retirement" } else { "live: as it stands now" });
    out.push_str("<section class=\"figures\"><h2>How it went</h2><dl id=\"figures\">");
    for (k, v) in &p.rows { let _ = write!(out, "<dt>{}</dt><dd>{}</dd>", esc(k), esc(v)); }
    out.push_str("</dl></section><section><h2>Refusals</h2><table id=\"refusals\"><tr><th>why</th><th>answers</th></tr>");
    for (code, n) in &p.refused { let _ = write!(out, "<tr><td>{}</td><td>{n}</td></tr>", esc(code)); }
    out.push_str("</table></section></main></body></html>");
    out
}

fn main() { bench(render) }
RS
cat > maud/Cargo.toml <<'TOML'
[package]
name = "tpl-maud"
version = "0.1.0"
edition = "2024"
[dependencies]
maud = "0.27"
[profile.release]
debug = "line-tables-only"
TOML
cat > maud/src/main.rs <<'RS'
#[path = "../../common.rs"]
mod common;
use common::*;
use maud::{DOCTYPE, html};

fn render(p: &Page) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "Report: " (p.id) } link rel="stylesheet" href="/admin/assets/dashboard.css"; }
            body.report {
                header { h1 { "Report: " (p.id) } p { (p.title) " · " (if p.kept { "kept at its retirement" } else { "live: as it stands now" }) " · " a href="/admin/dashboard" { "back to the dashboard" } " · " a href={ "/api/admin/products/" (p.id) "/report/csv" } { "timeline as CSV" } } }
                main {
                    section.figures { h2 { "How it went" } dl #figures { @for (k, v) in &p.rows { dt { (k) } dd { (v) } } } }
                    section { h2 { "Refusals" } table #refusals { tr { th { "why" } th { "answers" } } @for (code, n) in &p.refused { tr { td { (code) } td { (n) } } } } }
                }
            }
        }
    }
    .into_string()
}

fn main() { bench(render) }
RS
cat > askama/Cargo.toml <<'TOML'
[package]
name = "tpl-askama"
version = "0.1.0"
edition = "2024"
[dependencies]
askama = "0.16"
[profile.release]
debug = "line-tables-only"
TOML
cat > askama/src/main.rs <<'RS'
#[path = "../../common.rs"]
mod common;
use askama::Template;
use common::*;

#[derive(Template)]
#[template(path = "report.html")]
struct Report<'a> { p: &'a Page }

fn render(p: &Page) -> String { Report { p }.render().unwrap_or_default() }

fn main() { bench(render) }
RS
cat > askama/templates/report.html <<'HTML'
<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Report: {{ p.id }}</title><link rel="stylesheet" href="/admin/assets/dashboard.css"></head><body class="report"><header><h1>Report: {{ p.id }}</h1><p>{{ p.title }} · {% if p.kept %}kept at its retirement{% else %}live: as it stands now{% endif %} · <a href="/admin/dashboard">back to the dashboard</a> · <a href="/api/admin/products/{{ p.id }}/report/csv">timeline as CSV</a></p></header><main><section class="figures"><h2>How it went</h2><dl id="figures">{% for (k, v) in p.rows %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl></section><section><h2>Refusals</h2><table id="refusals"><tr><th>why</th><th>answers</th></tr>{% for (code, n) in p.refused %}<tr><td>{{ code }}</td><td>{{ n }}</td></tr>{% endfor %}</table></section></main></body></html>
HTML
for k in hand maud askama; do
  (cd $k && cargo fetch -q)
  (cd $k && /usr/bin/time -f "$k: clean release build %e s wall, %U s user" cargo build --release -q)
  touch $k/src/main.rs
  if [ -f $k/templates/report.html ]; then touch $k/templates/report.html; fi
  (cd $k && /usr/bin/time -f "$k: rebuild after a page change %e s wall, %U s user" cargo build --release -q)
done
for k in hand maud askama; do
  bin=$(ls $k/target/release/tpl-* | grep -v '\.d$' | head -1)
  for n in 1000 11000; do
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg.$k.$n" "$bin" $n >/dev/null 2>"$dir/vg.$k.$n"
  done
  a=$(grep -o 'Collected : [0-9]*' "$dir/vg.$k.1000" | grep -o '[0-9]*')
  b=$(grep -o 'Collected : [0-9]*' "$dir/vg.$k.11000" | grep -o '[0-9]*')
  echo "$k: $(( (b - a) / 10000 )) instructions per render, $("$bin" 1 show | wc -c) bytes"
done
