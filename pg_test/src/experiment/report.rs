//! What the experiment prints and writes: a line per run with the per-consumer skip counts
//! (the guide's diagnostic hook), the table of measured numbers beside the guide's, the
//! runs as JSON, and an SVG chart of duplicates and missing jobs per strategy.
use super::run::RunResult;
use super::strategy::{self, Strategy};
use super::Config;
use anyhow::Result;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use serde::Serialize;
use std::path::Path;

/// Everything one invocation measured, as written to `runs.json`.
#[derive(Serialize)]
pub struct Report {
    /// `git describe --always --dirty` of the checkout it ran from.
    pub commit: String,
    /// Unix time the matrix started.
    pub started_unix: u64,
    pub cpus: usize,
    /// `extversion` of the dedup extension the runs used (the one installed on the machine).
    pub extension_version: String,
    /// Whether the installed `dedup.so` was replaced while the runs went on (a reinstall;
    /// backends started after it load the new library).
    pub library_replaced: bool,
    pub config: Config,
    pub runs: Vec<RunResult>,
}

/// 3000 -> "3,000".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn mode(crash: bool) -> &'static str {
    if crash {
        "crash"
    } else {
        "no crash"
    }
}

/// The lines printed after each run: the count, then one line per consumer.
pub fn run_summary(r: &RunResult) -> String {
    let mut s = format!(
        "{} | {} | run {}: {} effect rows, {} jobs done: {} duplicates, {} missing; ",
        r.strategy,
        mode(r.crash),
        r.run,
        thousands(r.effect_rows),
        thousands(r.jobs_done),
        thousands(r.duplicates),
        thousands(r.missing)
    );
    if r.drained {
        s += &format!("drained in {:.1} s", r.seconds);
    } else {
        s += &format!(
            "DID NOT DRAIN within {:.0} s ({} acked, {} pending)",
            r.seconds, r.acked, r.pending
        );
    }
    match (&r.kill, r.crash) {
        (Some(k), _) => {
            s += &format!(
                "; {} killed at {:.2} s, after {} acks, with {} messages pending",
                k.consumer,
                k.at_s,
                thousands(k.acked_before),
                k.pending
            )
        }
        (None, true) => s += "; NO CRASH: the run drained before the crash time",
        (None, false) => {}
    }
    for c in &r.consumers {
        let st = &c.stats;
        s += &format!(
            "\n    {}{}: skipped {} (done or claimed, acked), busy {} (lease held, not acked), \
             effects {}, delivered {}, reclaimed {}, errors {}",
            c.name,
            if c.killed { " (killed)" } else { "" },
            st.skipped,
            st.busy,
            st.effects,
            st.delivered,
            st.reclaimed,
            st.errors
        );
    }
    s
}

/// "a" when every value is a, "a-b" for a range; "" when there are none.
fn range(values: &[u64]) -> String {
    match (values.iter().min(), values.iter().max()) {
        (Some(lo), Some(hi)) if lo == hi => thousands(*lo),
        (Some(lo), Some(hi)) => format!("{}-{}", thousands(*lo), thousands(*hi)),
        _ => String::new(),
    }
}

struct Cell<'a> {
    runs: Vec<&'a RunResult>,
}

impl Cell<'_> {
    /// The range of `f` over the runs, marked `!` if one did not drain and `?` if a crash
    /// run had no crash.
    fn show(&self, f: impl Fn(&RunResult) -> u64) -> String {
        let values: Vec<u64> = self.runs.iter().map(|r| f(r)).collect();
        let mut s = range(&values);
        if self.runs.iter().any(|r| !r.drained) {
            s.push_str(" !");
        }
        if self.runs.iter().any(|r| r.crash && !r.crashed()) {
            s.push_str(" ?");
        }
        s
    }
    fn seconds(&self) -> String {
        if self.runs.is_empty() {
            return "-".into();
        }
        let mean = self.runs.iter().map(|r| r.seconds).sum::<f64>() / self.runs.len() as f64;
        format!("{mean:.1}")
    }
}

fn cell<'a>(runs: &'a [RunResult], key: &str, crash: bool) -> Cell<'a> {
    Cell {
        runs: runs
            .iter()
            .filter(|r| r.strategy == key && r.crash == crash)
            .collect(),
    }
}

fn strategies_in(runs: &[RunResult]) -> Vec<&'static Strategy> {
    let mut out: Vec<&'static Strategy> = Vec::new();
    for r in runs {
        if let Some(s) = strategy::by_key(&r.strategy) {
            if !out.iter().any(|o| o.key == s.key) {
                out.push(s);
            }
        }
    }
    out
}

/// The table, as aligned Markdown, with its footnotes.
pub fn table(runs: &[RunResult], cfg: &Config) -> String {
    let header = [
        "strategy",
        "duplicates",
        "guide",
        "missing after a crash",
        "guide",
        "duplicates after a crash",
        "guide",
        "missing, no crash",
        "s per run (no crash / crash)",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for s in strategies_in(runs) {
        let (calm, crash) = (cell(runs, s.key, false), cell(runs, s.key, true));
        rows.push(vec![
            s.title.to_string(),
            calm.show(|r| r.duplicates),
            s.guide.duplicates.to_string(),
            crash.show(|r| r.missing),
            s.guide.missing_after_crash.to_string(),
            crash.show(|r| r.duplicates),
            s.guide.duplicates_after_crash.to_string(),
            calm.show(|r| r.missing),
            format!("{} / {}", calm.seconds(), crash.seconds()),
        ]);
    }
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("| {} |\n", padded.join(" | "))
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out += &line(widths.iter().map(|w| "-".repeat(*w)).collect());
    for row in rows {
        out += &line(row);
    }
    let runs_per = cfg.runs;
    out += &format!(
        "\n{} jobs, each published {} times {} messages apart; {} consumers x {} handlers; \
         {} ms of work per effect; XAUTOCLAIM after {} ms idle; crash = SIGKILL of one \
         consumer {} ms in. {} run{} per cell; a range is min-max over the runs. \
         \"guide\": the guide's numbers, for 3,000 jobs (blank: it gives none).\n",
        thousands(cfg.jobs as u64),
        cfg.copies,
        cfg.gap,
        cfg.consumers,
        cfg.concurrency,
        cfg.work.as_millis(),
        cfg.reclaim_idle.as_millis(),
        cfg.crash_after.as_millis(),
        runs_per,
        if runs_per == 1 { "" } else { "s" },
    );
    if runs.iter().any(|r| !r.drained) {
        out += &format!(
            "! a run did not drain within {} s: messages were still unacknowledged or pending.\n",
            cfg.timeout.as_secs()
        );
    }
    if runs.iter().any(|r| r.crash && !r.crashed()) {
        out += "? a crash run drained before the crash time, so no consumer was killed in it.\n";
    }
    out
}

/// Write `runs.json`.
pub fn write_json(path: &Path, report: &Report) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(report)? + "\n")?;
    Ok(())
}

/// The chart's caption: the setup, the commit and the extension's version.
pub fn caption(cfg: &Config, commit: &str, version: &str) -> String {
    format!(
        "{} jobs x {} copies, {} consumers x {} handlers, {} ms work, {} run(s) each; \
         commit {commit}, dedup {version}",
        thousands(cfg.jobs as u64),
        cfg.copies,
        cfg.consumers,
        cfg.concurrency,
        cfg.work.as_millis(),
        cfg.runs
    )
}

/// `experiment chart RUNS.json OUT.svg`: draw the chart again from a `runs.json`.
pub fn chart_from_json(json: &Path, svg: &Path) -> Result<()> {
    let text = std::fs::read_to_string(json)?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let runs: Vec<RunResult> = serde_json::from_value(v["runs"].clone())?;
    let c = &v["config"];
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    let cfg = Config {
        jobs: n("jobs") as u32,
        copies: n("copies") as u32,
        consumers: n("consumers") as u32,
        concurrency: n("concurrency") as u32,
        work: std::time::Duration::from_millis(n("work")),
        runs: n("runs") as u32,
        ..Config::default()
    };
    write_chart(
        svg,
        &runs,
        &caption(
            &cfg,
            v["commit"].as_str().unwrap_or("unknown"),
            v["extension_version"].as_str().unwrap_or("?"),
        ),
    )
}

/// The chart: three panels of horizontal bars (duplicates without a crash, duplicates
/// after a crash, missing after a crash), one bar per strategy at the mean over the runs,
/// labelled with the range.
pub fn write_chart(path: &Path, runs: &[RunResult], caption: &str) -> Result<()> {
    let strategies = strategies_in(runs);
    let n = strategies.len();
    let titles: Vec<&str> = strategies.iter().map(|s| s.title).collect();
    type Metric = (&'static str, bool, fn(&RunResult) -> u64, RGBColor);
    let metrics: [Metric; 3] = [
        (
            "duplicates, no crash",
            false,
            |r| r.duplicates,
            RGBColor(214, 96, 77),
        ),
        (
            "duplicates, one consumer killed",
            true,
            |r| r.duplicates,
            RGBColor(244, 165, 130),
        ),
        (
            "missing jobs, one consumer killed",
            true,
            |r| r.missing,
            RGBColor(67, 147, 195),
        ),
    ];
    let label_w = 330u32;
    let panel_w = 270u32;
    let height = 110 + 42 * n as u32;
    let root = SVGBackend::new(path, (label_w + 3 * panel_w, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(34);
    top.draw(&Text::new(
        caption.to_string(),
        (10, 10),
        ("sans-serif", 15).into_font().color(&BLACK),
    ))?;
    let (first, rest) = body.split_horizontally(label_w + panel_w);
    let others = rest.split_evenly((1, 2));
    let areas = [&first, &others[0], &others[1]];
    for (i, ((title, crash, value, color), area)) in metrics.iter().zip(areas).enumerate() {
        let per: Vec<Vec<u64>> = strategies
            .iter()
            .map(|s| {
                runs.iter()
                    .filter(|r| r.strategy == s.key && r.crash == *crash)
                    .map(value)
                    .collect()
            })
            .collect();
        let max = per.iter().flatten().copied().max().unwrap_or(0).max(1) as f64;
        let mut chart = ChartBuilder::on(area)
            .caption(*title, ("sans-serif", 14))
            .margin(6)
            .margin_right(18)
            .x_label_area_size(28)
            .y_label_area_size(if i == 0 { label_w } else { 0 })
            .build_cartesian_2d(0f64..max * 1.3, (0..n.saturating_sub(1)).into_segmented())?;
        let titles = titles.clone();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(TRANSPARENT)
            .x_labels(4)
            .x_label_formatter(&|v| thousands(v.round() as u64))
            .y_labels(n)
            .y_label_style(("sans-serif", 13))
            .y_label_formatter(&move |v| match v {
                SegmentValue::CenterOf(k) | SegmentValue::Exact(k) => (n - 1)
                    .checked_sub(*k)
                    .and_then(|i| titles.get(i))
                    .map(|t| t.to_string())
                    .unwrap_or_default(),
                SegmentValue::Last => String::new(),
            })
            .draw()?;
        for (k, values) in per.iter().enumerate() {
            // The first strategy on top.
            let row = n - 1 - k;
            if values.is_empty() {
                continue;
            }
            let mean = values.iter().sum::<u64>() as f64 / values.len() as f64;
            let mut bar = Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(row)),
                    (mean, SegmentValue::Exact(row + 1)),
                ],
                color.filled(),
            );
            bar.set_margin(7, 7, 0, 0);
            chart.draw_series(std::iter::once(bar))?;
            chart.draw_series(std::iter::once(Text::new(
                range(values),
                (mean + max * 0.02, SegmentValue::CenterOf(row)),
                ("sans-serif", 13).into_font().color(&BLACK),
            )))?;
        }
    }
    root.present()?;
    Ok(())
}
