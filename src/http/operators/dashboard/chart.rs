//! The report page's drawings, as SVG made here (no script: the pages'
//! CSP holds): line charts of the timeline, and the funnel.
//!
//! The timeline has a row only for the seconds with something counted, so
//! a chart says what a missing second means for each of its series: a
//! count per second was 0 then, a level (a running total, a reading of
//! the room) stood where it was, and a sampled figure (a latency) has no
//! value.

use maud::{Markup, html};

/// What a second missing from the timeline means for a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gaps {
    /// A count per second: nothing was counted, 0.
    Zero,
    /// A level (a running total, a reading): it stood where it was.
    Hold,
    /// A sample (a latency): no value; the line joins its neighbours.
    Skip,
}

/// One line of a chart.
pub(super) struct Series<'a> {
    pub label: &'a str,
    pub color: &'a str,
    /// A value per second of the chart's `t` (`None`: none that second).
    pub values: Vec<Option<f64>>,
    pub gaps: Gaps,
}

impl<'a> Series<'a> {
    pub fn new(label: &'a str, color: &'a str, gaps: Gaps, values: Vec<Option<f64>>) -> Self {
        Self {
            label,
            color,
            values,
            gaps,
        }
    }

    /// The points to draw, `(second, value)`: the values at `t`, and
    /// where seconds are missing between two, what they mean (`gaps`).
    fn points(&self, t: &[i64]) -> Vec<(i64, f64)> {
        let mut out = Vec::with_capacity(t.len());
        let mut last: Option<(i64, f64)> = None;
        for (&s, v) in t.iter().zip(&self.values) {
            let Some(v) = *v else { continue };
            if let Some((at, held)) = last {
                let missing = s - at - 1;
                match self.gaps {
                    Gaps::Zero if missing >= 1 => {
                        out.push((at + 1, 0.0));
                        if missing >= 2 {
                            out.push((s - 1, 0.0));
                        }
                    }
                    Gaps::Hold if missing >= 1 => out.push((s - 1, held)),
                    _ => {}
                }
            }
            out.push((s, v));
            last = Some((s, v));
        }
        out
    }
}

const W: f64 = 640.0;
const H: f64 = 180.0;
const PAD_L: f64 = 48.0;
const PAD_B: f64 = 24.0;

/// A line chart of `series` over `t` (seconds, ascending: the timeline's
/// seconds with something counted), as SVG (maud escapes every text and
/// attribute).
pub(super) fn chart(id: &str, title: &str, t: &[i64], series: &[Series]) -> Markup {
    let height = H + 20.0;
    html! {
        figure {
            figcaption { (title) }
            svg id={ "chart-" (id) } role="img" aria-label=(title)
                viewBox={ "0 0 " (W) " " (height) } width=(W) height=(height)
                xmlns="http://www.w3.org/2000/svg" {
                @match (t.first(), t.last()) {
                    (Some(&t0), Some(&t1)) => (plot((t0, t1), t, series)),
                    _ => text x="60" y="90" fill="#666" { "nothing counted yet" },
                }
            }
        }
    }
}

/// The axes, their ends, each series' line and its legend.
fn plot((t0, t1): (i64, i64), t: &[i64], series: &[Series]) -> Markup {
    let span = ((t1 - t0) as f64).max(1.0);
    let top = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0f64, |a, b| a.max(*b))
        .max(1.0);
    let x = |s: i64| PAD_L + (s - t0) as f64 / span * (W - PAD_L - 8.0);
    let y = |v: f64| 8.0 + (1.0 - v / top) * (H - PAD_B - 8.0);
    let (b, r, l, tb) = (H - PAD_B, W - 8.0, PAD_L - 4.0, H - 6.0);
    html! {
        line x1=(PAD_L) y1=(b) x2=(r) y2=(b) stroke="#bbb" {}
        line x1=(PAD_L) y1="8" x2=(PAD_L) y2=(b) stroke="#bbb" {}
        text x=(l) y="14" font-size="11" text-anchor="end" fill="#444" { (fmt_top(top)) }
        text x=(l) y=(b) font-size="11" text-anchor="end" fill="#444" { "0" }
        text x=(PAD_L) y=(tb) font-size="11" fill="#444" { (t0) " s" }
        text x=(r) y=(tb) font-size="11" text-anchor="end" fill="#444" { (t1) " s" }
        @for (i, s) in series.iter().enumerate() {
            @let points: Vec<String> = s
                .points(t)
                .into_iter()
                .map(|(s, v)| format!("{:.1},{:.1}", x(s), y(v)))
                .collect();
            @if !points.is_empty() {
                polyline data-series=(s.label) fill="none" stroke=(s.color) stroke-width="2"
                    points=(points.join(" ")) {}
            }
            @let lx = PAD_L + 10.0 + 160.0 * i as f64;
            rect x=(lx) y=(H + 8.0) width="10" height="10" fill=(s.color) {}
            text x=(lx + 14.0) y=(H + 17.0) font-size="12" fill="#222" { (s.label) }
        }
    }
}

fn fmt_top(v: f64) -> String {
    if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The funnel: a bar a step, as wide as its share of the first.
pub(super) fn funnel(steps: &[(&str, Option<u64>)]) -> Markup {
    let first = steps
        .iter()
        .filter_map(|(_, n)| *n)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let shown: Vec<(&str, u64)> = steps
        .iter()
        .filter_map(|(k, n)| n.map(|n| (*k, n)))
        .collect();
    let h = 28.0 * shown.len() as f64 + 8.0;
    html! {
        section {
            h2 { "The funnel" }
            svg id="funnel" role="img" aria-label="the funnel" viewBox={ "0 0 " (W) " " (h) }
                width=(W) height=(h) xmlns="http://www.w3.org/2000/svg" {
                @for (i, (label, n)) in shown.iter().enumerate() {
                    @let y = 4.0 + 28.0 * i as f64;
                    @let w = (*n as f64 / first * (W - 260.0)).max(1.0);
                    text x="150" y=(y + 15.0) font-size="13" text-anchor="end" fill="#222" { (label) }
                    rect data-step=(label) x="160" y=(y) width=(format!("{w:.1}")) height="20" fill="#1565c0" {}
                    text x=(format!("{:.1}", 166.0 + w)) y=(y + 15.0) font-size="13" fill="#222" { (n) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_second_is_zero_for_a_count_and_the_last_level_for_a_level() {
        let t = [10, 11, 15, 17];
        let v = vec![Some(3.0), Some(4.0), Some(5.0), Some(6.0)];
        let count = Series::new("n", "#000", Gaps::Zero, v.clone());
        assert_eq!(
            count.points(&t),
            [
                (10, 3.0),
                (11, 4.0),
                (12, 0.0),
                (14, 0.0),
                (15, 5.0),
                (16, 0.0),
                (17, 6.0)
            ]
        );
        let level = Series::new("l", "#000", Gaps::Hold, v.clone());
        assert_eq!(
            level.points(&t),
            [
                (10, 3.0),
                (11, 4.0),
                (14, 4.0),
                (15, 5.0),
                (16, 5.0),
                (17, 6.0)
            ]
        );
        let sample = Series::new(
            "s",
            "#000",
            Gaps::Skip,
            vec![Some(1.0), None, Some(2.0), Some(3.0)],
        );
        assert_eq!(sample.points(&t), [(10, 1.0), (15, 2.0), (17, 3.0)]);
    }
}
