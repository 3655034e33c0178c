//! Turns runs into numbers a person compares: a table per action, a CSV, and an SVG
//! plot of events per window over time, one line per action.

use super::model::RunResult;
use super::scenario::{Scenario, SimAction};
use crate::limiter::Millis;
use plotters::prelude::*;
use std::fmt::Write as _;

const SECOND: Millis = 1_000;

/// Most events in any interval `(t - window, t]`; `times` need not be sorted.
pub fn peak_in_window(times: &[Millis], window: Millis) -> usize {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    let mut peak = 0;
    let mut lo = 0;
    for hi in 0..sorted.len() {
        while sorted[lo] + window <= sorted[hi] {
            lo += 1;
        }
        peak = peak.max(hi - lo + 1);
    }
    peak
}

/// The p-th percentile (nearest rank) of `values`, p in 0..=100.
pub fn percentile(values: &[Millis], p: f64) -> Option<Millis> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// One row of the comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub action: SimAction,
    pub makespan_s: Option<f64>,
    pub vs_ideal: Option<f64>,
    pub peak_paced: usize,
    /// Most charges the limiter recorded in any window, over the action's rules.
    pub peak_charged: usize,
    pub peak_deletions: usize,
    pub peak_starts: usize,
    /// The same three peaks in any 1 s: what a CNI feels (a window's worth at once, or
    /// the spacing).
    pub peak_paced_1s: usize,
    pub peak_deletions_1s: usize,
    pub peak_starts_1s: usize,
    pub outage_p50_s: Option<f64>,
    pub outage_p99_s: Option<f64>,
    pub collateral_s: Option<f64>,
    pub refused: u64,
    pub retries: u64,
    pub errors: u64,
    pub worker_blocked_s: f64,
    pub holds: u64,
    pub gated: u64,
    pub converged: u64,
    pub workloads: u64,
    pub events: u64,
    /// Throttled pods, release (or ungated start) to Ready.
    pub start_p50_s: Option<f64>,
    pub start_p99_s: Option<f64>,
    /// The deepest CNI queue (bound, not yet wired; None without the network model).
    pub cni_queue_max: Option<u32>,
    /// With a CNI rate that changes: the deepest queue from 30 s after the last change on.
    pub cni_queue_max_after_step: Option<u32>,
}

/// How long after a change of the CNI's rate the queue may take to settle.
pub const SETTLE_AFTER_STEP: Millis = 30_000;

pub fn row(sc: &Scenario, r: &RunResult) -> Row {
    let action = r.action.unwrap_or(SimAction::None);
    let secs = |ms: Millis| ms as f64 / 1000.0;
    let paced = match action {
        SimAction::Partition => &r.steps,
        SimAction::Gate => &r.starts,
        _ => &r.deletions,
    };
    Row {
        action,
        makespan_s: r.makespan.map(secs),
        vs_ideal: r.makespan.map(|m| m as f64 / sc.ideal_ms().max(1) as f64),
        peak_paced: peak_in_window(paced, sc.window),
        peak_charged: r
            .charges
            .values()
            .map(|t| peak_in_window(t, sc.window))
            .max()
            .unwrap_or(0),
        peak_deletions: peak_in_window(&r.deletions, sc.window),
        peak_starts: peak_in_window(&r.starts, sc.window),
        peak_paced_1s: peak_in_window(paced, SECOND),
        peak_deletions_1s: peak_in_window(&r.deletions, SECOND),
        peak_starts_1s: peak_in_window(&r.starts, SECOND),
        outage_p50_s: percentile(&r.outages, 50.0).map(secs),
        outage_p99_s: percentile(&r.outages, 99.0).map(secs),
        collateral_s: r.collateral.map(secs),
        refused: r.refused,
        retries: r.retries,
        errors: r.errors,
        worker_blocked_s: secs(r.worker_blocked),
        holds: r.holds,
        gated: r.gated,
        converged: r.converged,
        workloads: r.workloads,
        events: r.events,
        start_p50_s: percentile(&r.start_latency, 50.0).map(secs),
        start_p99_s: percentile(&r.start_latency, 99.0).map(secs),
        cni_queue_max: sc
            .cni
            .is_some()
            .then(|| crate::simulate::model::queue_max_from(&r.cni_spans, 0)),
        cni_queue_max_after_step: sc
            .cni
            .as_ref()
            .and_then(|c| c.rates.last().filter(|_| c.rates.len() > 1))
            .map(|&(step, _)| {
                crate::simulate::model::queue_max_from(&r.cni_spans, step + SETTLE_AFTER_STEP)
            }),
    }
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(v) => format!("{v:.decimals$}"),
        None => "n/c".into(),
    }
}

pub fn table(sc: &Scenario, rows: &[Row]) -> String {
    let w = format!("{}s", sc.window / 1000);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| action | makespan s | × ideal | peak paced/{w} | peak paced/1s | peak charged/{w} | peak deletions/{w} (/1s) | peak starts/{w} (/1s) | outage p50 s | outage p99 s | collateral s | refused | retries | errors | worker-blocked s | converged | start p50 s | start p99 s | CNI queue max |"
    );
    let _ = writeln!(
        out,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} ({}) | {} | {} | {} ({}) | {} ({}) | {} | {} | {} | {} | {} | {} | {:.0} | {}/{} | {} | {} | {} |",
            r.action.as_str(),
            opt(r.makespan_s, 0),
            opt(r.vs_ideal, 2),
            r.peak_paced,
            r.action.paced_event(),
            r.peak_paced_1s,
            r.peak_charged,
            r.peak_deletions,
            r.peak_deletions_1s,
            r.peak_starts,
            r.peak_starts_1s,
            opt(r.outage_p50_s, 1),
            opt(r.outage_p99_s, 1),
            if sc.collateral {
                opt(r.collateral_s, 0)
            } else {
                "-".into()
            },
            r.refused,
            r.retries,
            r.errors,
            r.worker_blocked_s,
            r.converged,
            r.workloads,
            opt(r.start_p50_s, 1),
            opt(r.start_p99_s, 1),
            r.cni_queue_max.map_or("-".into(), |q| q.to_string())
        );
    }
    out
}

pub fn csv(sc: &Scenario, rows: &[Row]) -> String {
    let mut out = String::from(
        "scenario,action,makespan_s,ideal_s,vs_ideal,peak_paced,paced_event,peak_charged,peak_deletions,peak_starts,window_s,\
         outage_p50_s,outage_p99_s,collateral_s,refused,retries,errors,worker_blocked_s,holds,gated,converged,workloads,events,\
         peak_paced_1s,peak_deletions_1s,peak_starts_1s,start_p50_s,start_p99_s,cni_queue_max,cni_queue_max_after_step\n",
    );
    let o = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_default();
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{:.3},{},{},{},{},{},{},{:.3},{},{},{},{},{},{},{:.3},{},{},{},{},{},{},{},{},{},{},{},{}",
            sc.file.name,
            r.action.as_str(),
            o(r.makespan_s),
            sc.ideal_ms() as f64 / 1000.0,
            o(r.vs_ideal),
            r.peak_paced,
            r.action.paced_event(),
            r.peak_charged,
            r.peak_deletions,
            r.peak_starts,
            sc.window as f64 / 1000.0,
            o(r.outage_p50_s),
            o(r.outage_p99_s),
            o(r.collateral_s),
            r.refused,
            r.retries,
            r.errors,
            r.worker_blocked_s,
            r.holds,
            r.gated,
            r.converged,
            r.workloads,
            r.events,
            r.peak_paced_1s,
            r.peak_deletions_1s,
            r.peak_starts_1s,
            o(r.start_p50_s),
            o(r.start_p99_s),
            r.cni_queue_max.map(|q| q.to_string()).unwrap_or_default(),
            r.cni_queue_max_after_step
                .map(|q| q.to_string())
                .unwrap_or_default()
        );
    }
    out
}

/// Counts per consecutive window of length `window`, from 0 to `end`.
pub fn per_window(times: &[Millis], window: Millis, end: Millis) -> Vec<u32> {
    let bins = (end / window + 1) as usize;
    let mut counts = vec![0u32; bins];
    for &t in times {
        let b = (t / window) as usize;
        if b < bins {
            counts[b] += 1;
        }
    }
    counts
}

/// Most points per line: keeps the SVG small whatever the length of the run.
const MAX_POINTS: usize = 600;

/// Series for one panel: (x in minutes, the largest per-window count in each x step).
pub fn series(times: &[Millis], window: Millis, end: Millis) -> Vec<(f64, f64)> {
    let counts = per_window(times, window, end);
    let group = counts.len().div_ceil(MAX_POINTS).max(1);
    counts
        .chunks(group)
        .enumerate()
        .map(|(i, chunk)| {
            let x = (i * group) as f64 * window as f64 / 60_000.0;
            let y = chunk.iter().copied().max().unwrap_or(0);
            (x, (y as f64).max(1.0))
        })
        .collect()
}

fn color(action: SimAction) -> RGBColor {
    match action {
        SimAction::None => RGBColor(120, 120, 120),
        SimAction::Deny => RGBColor(214, 39, 40),
        SimAction::RetryAfter => RGBColor(255, 127, 14),
        SimAction::Hold => RGBColor(148, 103, 189),
        SimAction::Gate => RGBColor(31, 119, 180),
        SimAction::Partition => RGBColor(44, 160, 44),
    }
}

/// Two panels (pod deletions, pod starts) of events per window over time, log scale.
pub fn plot(sc: &Scenario, runs: &[RunResult], path: &std::path::Path) -> Result<(), String> {
    let end = runs.iter().map(|r| r.end).max().unwrap_or(0).max(sc.window);
    let x_max = end as f64 / 60_000.0;
    let mut y_max = sc.events as f64;
    for r in runs {
        for t in [&r.deletions, &r.starts] {
            let peak = per_window(t, sc.window, end).into_iter().max().unwrap_or(0);
            y_max = y_max.max(peak as f64);
        }
    }
    let root = SVGBackend::new(path, (960, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (top, bottom) = root.split_vertically(360);
    let w = sc.window / 1000;
    let panels = [
        (
            top,
            format!("{}: pod deletions per {w} s window", sc.file.name),
            true,
        ),
        (
            bottom,
            format!(
                "pod starts (scheduled) per {w} s window; log scale, 0 drawn as 1, \
                 each point the fullest window of its x step"
            ),
            false,
        ),
    ];
    for (area, title, deletions) in panels {
        let mut chart = ChartBuilder::on(&area)
            .caption(title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(32)
            .y_label_area_size(48)
            .build_cartesian_2d(0f64..x_max, (1f64..y_max * 1.5).log_scale())
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("minutes since the update")
            .y_desc("events")
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| e.to_string())?;
        let limit = sc.events as f64;
        chart
            .draw_series(LineSeries::new(
                [(0.0, limit), (x_max, limit)],
                BLACK.mix(0.4).stroke_width(1),
            ))
            .map_err(|e| e.to_string())?
            .label(format!("limit {} per {w} s", sc.events))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.4)));
        for r in runs {
            let action = r.action.unwrap_or(SimAction::None);
            let times = if deletions { &r.deletions } else { &r.starts };
            let c = color(action);
            chart
                .draw_series(LineSeries::new(
                    series(times, sc.window, end),
                    c.stroke_width(2),
                ))
                .map_err(|e| e.to_string())?
                .label(action.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], c.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
