//! The report page's drawings, as SVG made here (no script: the pages'
//! CSP holds): line charts of the timeline, and the funnel.
//!
//! The timeline has a row only for the seconds with something counted, so
//! a chart says what a missing second means for each of its series: a
//! count per second was 0 then, a level (a running total, a reading of
//! the room) stood where it was, and a sampled figure (a latency) has no
//! value.

use std::fmt::Write;

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

/// Text for HTML (and SVG) content and attributes.
pub(super) fn esc(text: &str) -> String {
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

const W: f64 = 640.0;
const H: f64 = 180.0;
const PAD_L: f64 = 48.0;
const PAD_B: f64 = 24.0;

/// A line chart of `series` over `t` (seconds, ascending: the timeline's
/// seconds with something counted), as SVG.
pub(super) fn chart(id: &str, title: &str, t: &[i64], series: &[Series]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<figure><figcaption>{}</figcaption><svg id=\"chart-{id}\" role=\"img\" aria-label=\"{}\" \
         viewBox=\"0 0 {W} {}\" width=\"{W}\" height=\"{}\" xmlns=\"http://www.w3.org/2000/svg\">",
        esc(title),
        esc(title),
        H + 20.0,
        H + 20.0
    );
    let (Some(&t0), Some(&t1)) = (t.first(), t.last()) else {
        out.push_str(
            "<text x=\"60\" y=\"90\" fill=\"#666\">nothing counted yet</text></svg></figure>",
        );
        return out;
    };
    let span = ((t1 - t0) as f64).max(1.0);
    let top = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0f64, |a, b| a.max(*b))
        .max(1.0);
    let x = |s: i64| PAD_L + (s - t0) as f64 / span * (W - PAD_L - 8.0);
    let y = |v: f64| 8.0 + (1.0 - v / top) * (H - PAD_B - 8.0);
    // Axes, and their ends.
    let _ = write!(
        out,
        "<line x1=\"{PAD_L}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#bbb\"/>\
         <line x1=\"{PAD_L}\" y1=\"8\" x2=\"{PAD_L}\" y2=\"{b}\" stroke=\"#bbb\"/>\
         <text x=\"{l}\" y=\"14\" font-size=\"11\" text-anchor=\"end\" fill=\"#444\">{top}</text>\
         <text x=\"{l}\" y=\"{b}\" font-size=\"11\" text-anchor=\"end\" fill=\"#444\">0</text>\
         <text x=\"{PAD_L}\" y=\"{tb}\" font-size=\"11\" fill=\"#444\">{t0} s</text>\
         <text x=\"{r}\" y=\"{tb}\" font-size=\"11\" text-anchor=\"end\" fill=\"#444\">{t1} s</text>",
        b = H - PAD_B,
        r = W - 8.0,
        l = PAD_L - 4.0,
        tb = H - 6.0,
        top = fmt_top(top),
    );
    for (i, Series { label, color, .. }) in series.iter().enumerate() {
        let points: Vec<String> = series[i]
            .points(t)
            .into_iter()
            .map(|(s, v)| format!("{:.1},{:.1}", x(s), y(v)))
            .collect();
        if !points.is_empty() {
            let _ = write!(
                out,
                "<polyline data-series=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                esc(label),
                points.join(" ")
            );
        }
        let lx = PAD_L + 10.0 + 160.0 * i as f64;
        let _ = write!(
            out,
            "<rect x=\"{lx}\" y=\"{ly}\" width=\"10\" height=\"10\" fill=\"{color}\"/>\
             <text x=\"{tx}\" y=\"{ty}\" font-size=\"12\" fill=\"#222\">{}</text>",
            esc(label),
            ly = H + 8.0,
            tx = lx + 14.0,
            ty = H + 17.0,
        );
    }
    out.push_str("</svg></figure>");
    out
}

fn fmt_top(v: f64) -> String {
    if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The funnel: a bar a step, as wide as its share of the first.
pub(super) fn funnel(steps: &[(&str, Option<u64>)]) -> String {
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
    let mut out = format!(
        "<section><h2>The funnel</h2><svg id=\"funnel\" role=\"img\" aria-label=\"the funnel\" \
         viewBox=\"0 0 {W} {h}\" width=\"{W}\" height=\"{h}\" xmlns=\"http://www.w3.org/2000/svg\">"
    );
    for (i, (label, n)) in shown.iter().enumerate() {
        let y = 4.0 + 28.0 * i as f64;
        let w = (*n as f64 / first * (W - 260.0)).max(1.0);
        let _ = write!(
            out,
            "<text x=\"150\" y=\"{ty}\" font-size=\"13\" text-anchor=\"end\" fill=\"#222\">{}</text>\
             <rect data-step=\"{}\" x=\"160\" y=\"{y}\" width=\"{w:.1}\" height=\"20\" fill=\"#1565c0\"/>\
             <text x=\"{nx:.1}\" y=\"{ty}\" font-size=\"13\" fill=\"#222\">{n}</text>",
            esc(label),
            esc(label),
            ty = y + 15.0,
            nx = 166.0 + w,
        );
    }
    out.push_str("</svg></section>");
    out
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
