//! The report page's drawings, as SVG made here (no script: the pages'
//! CSP holds): charts of the timeline, and the funnel.
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
    /// A sample (a latency): no value; the series joins its neighbours.
    Skip,
}

/// One series of a chart.
pub(super) struct Series<'a> {
    pub label: &'a str,
    pub color: &'a str,
    /// A value per second of the chart's `t` (`None`: none that second).
    pub values: Vec<Option<f64>>,
    pub gaps: Gaps,
    /// Drawn dashed (a bound, or a series another may cover).
    pub dashed: bool,
}

impl<'a> Series<'a> {
    pub fn new(label: &'a str, color: &'a str, gaps: Gaps, values: Vec<Option<f64>>) -> Self {
        Self {
            label,
            color,
            values,
            gaps,
            dashed: false,
        }
    }

    /// The same, drawn dashed.
    pub fn dashed(self) -> Self {
        Self {
            dashed: true,
            ..self
        }
    }

    /// The segments to draw, each `(second, value)` points: the values at
    /// `t`, and where seconds are missing between two, what they mean
    /// (`gaps`): a sample's series breaks there (nothing to join).
    fn segments(&self, t: &[i64]) -> Vec<Vec<(i64, f64)>> {
        let mut out: Vec<Vec<(i64, f64)>> = Vec::new();
        let mut segment = Vec::with_capacity(t.len());
        let mut last: Option<(i64, f64)> = None;
        for (&s, v) in t.iter().zip(&self.values) {
            let Some(v) = *v else {
                if self.gaps == Gaps::Skip && !segment.is_empty() {
                    out.push(std::mem::take(&mut segment));
                }
                continue;
            };
            if let Some((at, held)) = last {
                let missing = s - at - 1;
                match self.gaps {
                    Gaps::Zero if missing >= 1 => {
                        segment.push((at + 1, 0.0));
                        if missing >= 2 {
                            segment.push((s - 1, 0.0));
                        }
                    }
                    Gaps::Hold if missing >= 1 => segment.push((s - 1, held)),
                    Gaps::Skip if missing >= 1 && !segment.is_empty() => {
                        out.push(std::mem::take(&mut segment))
                    }
                    _ => {}
                }
            }
            segment.push((s, v));
            last = Some((s, v));
        }
        if !segment.is_empty() {
            out.push(segment);
        }
        out
    }
}

/// A moment marked across a chart: a second from the start, and its name.
pub(super) struct Mark {
    pub at: i64,
    pub label: String,
}

/// What every chart of a page shares: its seconds (from the start), the
/// start's clock time (epoch s) and the marks.
pub(super) struct Axis<'a> {
    pub t: &'a [i64],
    pub start_s: i64,
    pub marks: &'a [Mark],
}

const W: f64 = 640.0;
const H: f64 = 200.0;
const PAD_L: f64 = 48.0;
const PAD_T: f64 = 22.0;
/// Room for the last tick's label.
const PAD_R: f64 = 28.0;
const PAD_B: f64 = 34.0;

/// A chart of `series` over the axis's seconds (the timeline's
/// seconds with something counted), as SVG (maud escapes every text and
/// attribute).
pub(super) fn chart(id: &str, title: &str, axis: &Axis, series: &[Series]) -> Markup {
    let height = H + 20.0 * legend_rows(series) as f64 + 4.0;
    html! {
        figure {
            figcaption { (title) }
            svg id={ "chart-" (id) } role="img" aria-label=(title)
                viewBox={ "0 0 " (W) " " (height) } width=(W) height=(height)
                xmlns="http://www.w3.org/2000/svg" {
                @match (axis.t.first(), axis.t.last()) {
                    (Some(&t0), Some(&t1)) => (plot(range(t0, t1), axis, series)),
                    _ => text x="60" y="90" fill="#666" { "nothing counted yet" },
                }
            }
        }
    }
}

/// The seconds drawn: those counted, from the start when it comes
/// shortly before the first (so the start's mark shows) but not from an
/// hour before (the seconds counted would shrink to a sliver).
/// The seconds a chart spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    from: i64,
    to: i64,
}

fn range(t0: i64, t1: i64) -> Span {
    match t0 > 0 && t0 <= (t1 - t0).max(5) {
        true => Span { from: 0, to: t1 },
        false => Span { from: t0, to: t1 },
    }
}

/// Legends a row holds.
const LEGENDS_PER_ROW: usize = 3;

fn legend_rows(series: &[Series]) -> usize {
    series.len().div_ceil(LEGENDS_PER_ROW).max(1)
}

/// The axes with their ticks (seconds from the start and clock time, UTC),
/// the marks, each series' segments and its legend.
fn plot(span: Span, axis: &Axis, series: &[Series]) -> Markup {
    let Span { from: t0, to: t1 } = span;
    let span = ((t1 - t0) as f64).max(1.0);
    let top = nice_top(
        series
            .iter()
            .flat_map(|s| s.values.iter().flatten())
            .fold(0.0f64, |a, b| a.max(*b)),
    );
    let x = |s: i64| PAD_L + (s - t0) as f64 / span * (W - PAD_L - PAD_R);
    let y = |v: f64| PAD_T + (1.0 - v / top) * (H - PAD_B - PAD_T);
    let (b, r, l) = (H - PAD_B, W - PAD_R, PAD_L - 4.0);
    let step = tick_step(t1 - t0);
    let ticks: Vec<i64> = (t0.div_euclid(step)..=t1.div_euclid(step))
        .map(|k| k * step)
        .filter(|s| (t0..=t1).contains(s))
        .collect();
    let mut marks: Vec<&Mark> = axis
        .marks
        .iter()
        .filter(|m| (t0..=t1).contains(&m.at))
        .collect();
    marks.sort_by_key(|m| m.at);
    html! {
        @for v in [0.0, top / 2.0, top] {
            line x1=(PAD_L) y1=(fmt1(y(v))) x2=(r) y2=(fmt1(y(v))) stroke="#eee" {}
            text x=(l) y=(fmt1(y(v) + 4.0)) font-size="11" text-anchor="end" fill="#444" { (fmt_top(v)) }
        }
        line x1=(PAD_L) y1=(b) x2=(r) y2=(b) stroke="#bbb" {}
        line x1=(PAD_L) y1=(PAD_T) x2=(PAD_L) y2=(b) stroke="#bbb" {}
        @for s in &ticks {
            line x1=(fmt1(x(*s))) y1=(b) x2=(fmt1(x(*s))) y2=(b + 4.0) stroke="#bbb" {}
            text.tick x=(fmt1(x(*s))) y=(b + 15.0) font-size="10" text-anchor="middle" fill="#444" {
                (signed(*s)) " s"
            }
            text.clock x=(fmt1(x(*s))) y=(b + 27.0) font-size="10" text-anchor="middle" fill="#777" {
                (clock(axis.start_s + s))
            }
        }
        @for (i, m) in marks.iter().enumerate() {
            // A label close after another's goes a row up, so neither hides.
            @let crowded = i.checked_sub(1).is_some_and(|p| x(m.at) - x(marks[p].at) < 70.0);
            @let ty = if crowded && i % 2 == 1 { PAD_T - 18.0 } else { PAD_T - 8.0 };
            line.mark data-mark=(m.label) x1=(fmt1(x(m.at))) y1=(ty + 4.0) x2=(fmt1(x(m.at))) y2=(b)
                stroke="#555" stroke-dasharray="2 3" {}
            text x=(fmt1(x(m.at) + 2.0)) y=(ty) font-size="10" fill="#333" { (m.label) }
        }
        @for s in series {
            @for seg in s.segments(axis.t) {
                @let points: Vec<String> = seg
                    .iter()
                    .map(|(s, v)| format!("{:.1},{:.1}", x(*s), y(*v)))
                    .collect();
                @if seg.len() == 1 {
                    circle data-series=(s.label) cx=(fmt1(x(seg[0].0))) cy=(fmt1(y(seg[0].1)))
                        r="2.5" fill=(s.color) {}
                } @else {
                    polyline data-series=(s.label) fill="none" stroke=(s.color) stroke-width="2"
                        stroke-dasharray=[s.dashed.then_some("6 4")]
                        points=(points.join(" ")) {}
                }
            }
        }
        @for (i, s) in series.iter().enumerate() {
            @let (row, col) = (i / LEGENDS_PER_ROW, i % LEGENDS_PER_ROW);
            @let (lx, ly) = (PAD_L + 200.0 * col as f64, H + 4.0 + 20.0 * row as f64);
            line x1=(lx) y1=(ly + 5.0) x2=(lx + 16.0) y2=(ly + 5.0) stroke=(s.color) stroke-width="3"
                stroke-dasharray=[s.dashed.then_some("4 3")] {}
            text x=(lx + 20.0) y=(ly + 9.0) font-size="12" fill="#222" { (s.label) }
        }
    }
}

fn fmt1(v: f64) -> String {
    format!("{v:.1}")
}

/// A second from the start, signed (before the start: joins).
fn signed(s: i64) -> String {
    if s > 0 {
        format!("+{s}")
    } else {
        s.to_string()
    }
}

/// Epoch seconds as a clock time, UTC (`HH:MM:SS`).
fn clock(epoch_s: i64) -> String {
    let d = epoch_s.rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", d / 3600, d / 60 % 60, d % 60)
}

/// Epoch ms as a date and a time, UTC (`2026-12-06 11:19 UTC`).
pub(super) fn when(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (y, m, d) = civil(secs.div_euclid(86_400));
    let clock = clock(secs);
    format!("{y:04}-{m:02}-{d:02} {} UTC", &clock[..5])
}

/// Days since 1970-01-01 as a date (year, month, day): the proleptic
/// Gregorian calendar (H. Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Ticks every so many seconds: at most about six on the axis.
fn tick_step(span: i64) -> i64 {
    const STEPS: [i64; 14] = [
        1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
    ];
    STEPS
        .into_iter()
        .find(|s| span / s <= 6)
        .unwrap_or_else(|| (span / 6).max(1))
}

/// The y axis's top: the highest value rounded up to 1, 2 or 5 times a
/// power of ten (1 at least), so its half is a round number too.
fn nice_top(v: f64) -> f64 {
    if v <= 1.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|t| *t >= v)
        .unwrap_or(10.0 * p)
}

fn fmt_top(v: f64) -> String {
    if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The funnel: a bar a step, as wide as its share of the first, with the
/// share of the step before it (the steps are nested: each is some of the
/// one before).
pub(super) fn funnel(steps: &[(&str, Option<u64>)]) -> Markup {
    let shown: Vec<(&str, u64)> = steps
        .iter()
        .filter_map(|(k, n)| n.map(|n| (*k, n)))
        .collect();
    let first = shown.first().map_or(1, |(_, n)| *n).max(1) as f64;
    let h = 28.0 * shown.len() as f64 + 8.0;
    html! {
        section {
            h2 { "The funnel" }
            p.note { "Each step is some of the one before; in brackets, its share of it." }
            svg id="funnel" role="img" aria-label="the funnel" viewBox={ "0 0 " (W) " " (h) }
                width=(W) height=(h) xmlns="http://www.w3.org/2000/svg" {
                @for (i, (label, n)) in shown.iter().enumerate() {
                    @let y = 4.0 + 28.0 * i as f64;
                    @let w = (*n as f64 / first * (W - 300.0)).clamp(1.0, W - 300.0);
                    @let share = i.checked_sub(1).map(|p| shown[p].1).filter(|p| *p > 0)
                        .map(|p| format!(" ({:.0}%)", *n as f64 * 100.0 / p as f64));
                    text x="150" y=(y + 15.0) font-size="13" text-anchor="end" fill="#222" { (label) }
                    rect data-step=(label) x="160" y=(y) width=(format!("{w:.1}")) height="20" fill="#1565c0" {}
                    text x=(format!("{:.1}", 166.0 + w)) y=(y + 15.0) font-size="13" fill="#222" {
                        (n) (share.unwrap_or_default())
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_second_is_zero_for_a_count_the_last_level_for_a_level_and_a_break_for_a_sample() {
        let t = [10, 11, 15, 17, 18];
        let v = vec![Some(3.0), Some(4.0), Some(5.0), Some(6.0), Some(7.0)];
        let count = Series::new("n", "#000", Gaps::Zero, v.clone());
        assert_eq!(
            count.segments(&t),
            [vec![
                (10, 3.0),
                (11, 4.0),
                (12, 0.0),
                (14, 0.0),
                (15, 5.0),
                (16, 0.0),
                (17, 6.0),
                (18, 7.0)
            ]]
        );
        let level = Series::new("l", "#000", Gaps::Hold, v.clone());
        assert_eq!(
            level.segments(&t),
            [vec![
                (10, 3.0),
                (11, 4.0),
                (14, 4.0),
                (15, 5.0),
                (16, 5.0),
                (17, 6.0),
                (18, 7.0)
            ]]
        );
        // A latency has no value in a quiet second: no segment across it.
        let sample = Series::new(
            "s",
            "#000",
            Gaps::Skip,
            vec![Some(1.0), Some(1.5), None, Some(3.0), Some(4.0)],
        );
        assert_eq!(
            sample.segments(&t),
            [vec![(10, 1.0), (11, 1.5)], vec![(17, 3.0), (18, 4.0)]]
        );
    }

    #[test]
    fn the_start_is_drawn_when_it_comes_shortly_before_the_first_second() {
        assert_eq!(range(2, 30), Span { from: 0, to: 30 });
        assert_eq!(range(-5, 30), Span { from: -5, to: 30 });
        assert_eq!(
            range(3600, 3604),
            Span {
                from: 3600,
                to: 3604
            }
        );
    }

    #[test]
    fn ticks_are_round_and_few_and_read_as_clock_time() {
        assert_eq!(tick_step(5), 1);
        assert_eq!(tick_step(40), 10);
        assert_eq!(tick_step(600), 120);
        assert_eq!(clock(1_700_000_000), "22:13:20");
        assert_eq!(nice_top(0.0), 1.0);
        assert_eq!(nice_top(152.0), 200.0);
        assert_eq!(nice_top(120.0), 200.0);
        assert_eq!(nice_top(100.0), 100.0);
        assert_eq!(nice_top(3.2), 5.0);
    }

    #[test]
    fn a_moment_reads_as_its_utc_date_and_time() {
        assert_eq!(when(0), "1970-01-01 00:00 UTC");
        assert_eq!(when(1_700_000_000_000), "2023-11-14 22:13 UTC");
        assert_eq!(when(951_782_400_000), "2000-02-29 00:00 UTC");
        assert_eq!(when(1_796_515_199_000), "2026-12-05 23:59 UTC");
    }
}
