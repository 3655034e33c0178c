//! The replay's report: what was read (every line accounted for), recorded vs paced per
//! kind, delays per namespace, rules fired, workloads re-simulated or shifted; CSV, SVG.

use super::attribute::{Controller, Kind};
use super::Replay;
use crate::limiter::Millis;
use crate::simulate::report::{peak_in_window, percentile, series};
use plotters::prelude::*;
use std::fmt::Write as _;

/// One row per kind, recorded vs paced.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub kind: Kind,
    /// A row of one controller's pods (`kind:Controller` in the CSV); None: all of them.
    pub controller: Option<Controller>,
    pub events: usize,
    pub paced_events: usize,
    pub recorded_peak: usize,
    pub paced_peak: usize,
    pub recorded_makespan_s: Option<f64>,
    pub paced_makespan_s: Option<f64>,
}

/// The recorded event times of one kind, sorted.
pub fn recorded(replay: &Replay, kind: Kind) -> Vec<Millis> {
    let mut v: Vec<Millis> = replay
        .attributed
        .events
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.at)
        .collect();
    if kind == Kind::PartitionSteps {
        v.extend(&replay.paced.inferred_steps);
    }
    v.sort_unstable();
    v
}

/// The first disruptive request of the replay: where makespans start.
pub fn origin(replay: &Replay) -> Millis {
    replay
        .attributed
        .events
        .iter()
        .map(|e| e.at)
        .min()
        .unwrap_or(0)
}

pub fn rows(replay: &Replay) -> Vec<Row> {
    let t0 = origin(replay);
    let span = |v: &[Millis]| v.last().map(|&l| l.saturating_sub(t0) as f64 / 1000.0);
    Kind::ALL
        .iter()
        .map(|&kind| {
            let rec = recorded(replay, kind);
            let paced = replay.paced.times.get(&kind).cloned().unwrap_or_default();
            Row {
                kind,
                controller: None,
                events: rec.len(),
                paced_events: paced.len(),
                recorded_peak: peak_in_window(&rec, replay.window),
                paced_peak: peak_in_window(&paced, replay.window),
                recorded_makespan_s: span(&rec),
                paced_makespan_s: span(&paced),
            }
        })
        .collect()
}

/// Per kind and controller of the pods, for the kinds and controllers with events: each
/// rule matches its own controllers, so these are what one rule's limit bounds (the
/// built-in policy paces StatefulSet and ReplicaSet pods by separate rules).
pub fn rows_by_controller(replay: &Replay) -> Vec<Row> {
    let t0 = origin(replay);
    let span = |v: &[Millis]| v.last().map(|&l| l.saturating_sub(t0) as f64 / 1000.0);
    let mut recorded: std::collections::BTreeMap<(Kind, Controller), Vec<Millis>> =
        Default::default();
    // A binding is the scheduler's: its pod's controller is its creation's.
    let created: std::collections::HashMap<(&str, &str), Controller> = replay
        .attributed
        .events
        .iter()
        .filter(|e| e.kind == Kind::Creations && !e.name.is_empty())
        .map(|e| ((e.namespace.as_str(), e.name.as_str()), e.controller))
        .collect();
    for e in &replay.attributed.events {
        let controller = match e.kind {
            Kind::PartitionSteps => continue,
            Kind::Starts => created
                .get(&(e.namespace.as_str(), e.name.as_str()))
                .copied()
                .unwrap_or(e.controller),
            _ => e.controller,
        };
        recorded.entry((e.kind, controller)).or_default().push(e.at);
    }
    let mut keys: Vec<(Kind, Controller)> = recorded.keys().copied().collect();
    keys.extend(
        replay
            .paced
            .by_controller
            .keys()
            .filter(|(k, _)| *k != Kind::PartitionSteps),
    );
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .map(|(kind, controller)| {
            let mut rec = recorded.remove(&(kind, controller)).unwrap_or_default();
            rec.sort_unstable();
            let paced = replay
                .paced
                .by_controller
                .get(&(kind, controller))
                .cloned()
                .unwrap_or_default();
            Row {
                kind,
                controller: Some(controller),
                events: rec.len(),
                paced_events: paced.len(),
                recorded_peak: peak_in_window(&rec, replay.window),
                paced_peak: peak_in_window(&paced, replay.window),
                recorded_makespan_s: span(&rec),
                paced_makespan_s: span(&paced),
            }
        })
        .collect()
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{s:.1}"))
}

/// The summary and the tables, as printed.
pub fn text(replay: &Replay) -> String {
    let c = &replay.counts;
    let a = &replay.attributed;
    let mut s = String::new();
    let dropped: u64 = a.dropped.values().sum();
    let replayed = a.replayed;
    let _ = writeln!(
        s,
        "read {} lines: {} disruptive requests ({} replayed as events, {} set aside), \
         {} not disruptive, {} skipped, {} outside --since/--until",
        c.lines,
        c.requests,
        replayed,
        dropped,
        c.not_disruptive_total(),
        c.skipped_total(),
        c.out_of_range
    );
    for (why, n) in &a.dropped {
        let _ = writeln!(s, "  set aside {n}: {}", why.as_str());
    }
    for (why, n) in &c.not_disruptive {
        let _ = writeln!(s, "  not disruptive {n}: {}", why.as_str());
    }
    for (why, n) in &c.skipped {
        let first = c
            .first_skipped
            .get(why)
            .map(|v| v.join(", "))
            .unwrap_or_default();
        let _ = writeln!(s, "  skipped {n}: {} (first: {first})", why.as_str());
    }
    for t in &c.truncated {
        let _ = writeln!(s, "  {t}; what came before it is replayed");
    }
    if c.reordered_late > 0 {
        let _ = writeln!(
            s,
            "  {} requests arrived later than the reorder buffer waits (replayed at their time)",
            c.reordered_late
        );
    }
    for (why, n) in &a.unattributed {
        let _ = writeln!(s, "  unattributed pods {n}: {}", why.as_str());
    }
    let levels: Vec<String> = a.levels.iter().map(|(l, n)| format!("{l:?} {n}")).collect();
    let _ = writeln!(
        s,
        "audit levels of the disruptive requests: {}",
        levels.join(", ")
    );
    let _ = writeln!(
        s,
        "assumed (not in a Metadata-level log): no pod is exempt by priority class or \
         labels, no pod has nodeName set, labels match no excludeLabels; a StatefulSet's \
         replicas = its highest ordinal seen + 1, maxUnavailable 1; a pod with no recorded \
         binding is Ready when released; ReplicaSet pods are Ready at their binding; a \
         pod's network is up at its binding and the adaptive rules' network window grows \
         from its start (4 pods) by slow start, every binding a sample at its floor (no \
         network times in the log); a held set's step is acted on after \
         the fastest reaction measured (write -> first DELETE)"
    );
    let _ = writeln!(
        s,
        "\n{:<16} {:>8} {:>8} {:>9} {:>9} {:>11} {:>11}",
        "kind", "events", "paced", "peak rec", "peak paced", "makespan rec", "makespan paced"
    );
    let _ = writeln!(
        s,
        "{:<16} {:>8} {:>8} {:>9} {:>9} {:>11} {:>11}",
        "",
        "",
        "",
        format!("/{} s", replay.window / 1000),
        "",
        "s",
        "s"
    );
    for r in rows(replay) {
        let _ = writeln!(
            s,
            "{:<16} {:>8} {:>8} {:>9} {:>9} {:>11} {:>11}",
            r.kind.as_str(),
            r.events,
            r.paced_events,
            r.recorded_peak,
            r.paced_peak,
            secs(r.recorded_makespan_s),
            secs(r.paced_makespan_s)
        );
    }
    let p = &replay.paced;
    let mut ns: Vec<(&String, &Vec<Millis>)> = p.delays.iter().collect();
    ns.sort_by_key(|(n, d)| (std::cmp::Reverse(percentile(d, 99.0)), (*n).clone()));
    let _ = writeln!(
        s,
        "\ndelay paced - recorded per namespace (s), longest first:\n{:<32} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "namespace", "events", "p50", "p90", "p99", "max"
    );
    let f = |v: Option<Millis>| v.map_or("-".into(), |m| format!("{:.1}", m as f64 / 1000.0));
    for (n, d) in ns.iter().take(20) {
        let _ = writeln!(
            s,
            "{:<32} {:>7} {:>7} {:>7} {:>7} {:>7}",
            n,
            d.len(),
            f(percentile(d, 50.0)),
            f(percentile(d, 90.0)),
            f(percentile(d, 99.0)),
            f(percentile(d, 100.0))
        );
    }
    if ns.len() > 20 {
        let _ = writeln!(s, "({} more namespaces)", ns.len() - 20);
    }
    let _ = writeln!(s, "\nrules fired (rule, verdict: count):");
    for ((rule, what), n) in &p.rules {
        let _ = writeln!(s, "  {rule:<28} {what:<12} {n}");
    }
    if p.gave_up > 0 {
        let _ = writeln!(
            s,
            "  {} requests still refused after the retries (left out)",
            p.gave_up
        );
    }
    let _ = writeln!(s, "\nworkloads:");
    for (t, names) in &p.workloads {
        let shown: Vec<&str> = names.iter().take(10).map(String::as_str).collect();
        let more = names.len().saturating_sub(10);
        let _ = writeln!(
            s,
            "  {} {}: {}{}",
            names.len(),
            t.as_str(),
            shown.join(", "),
            if more > 0 {
                format!(" (+{more})")
            } else {
                String::new()
            }
        );
    }
    for (name, d) in p.set_delays.iter().take(10) {
        let _ = writeln!(
            s,
            "  measured {name}: reaction {} ms, terminate {} ms, schedule {} ms, ready {} ms",
            d.reaction, d.terminate, d.schedule, d.ready
        );
    }
    s
}

pub fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "kind,events,paced_events,recorded_peak,paced_peak,recorded_makespan_s,paced_makespan_s\n",
    );
    let o = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{}",
            match r.controller {
                None => r.kind.as_str().to_string(),
                Some(c) => format!("{}:{}", r.kind.as_str(), c.kind_name().unwrap_or("none")),
            },
            r.events,
            r.paced_events,
            r.recorded_peak,
            r.paced_peak,
            o(r.recorded_makespan_s),
            o(r.paced_makespan_s)
        );
    }
    s
}

/// Recorded vs paced events per window of starts and deletions over time, one SVG.
pub fn plot(replay: &Replay, path: &std::path::Path) -> Result<(), String> {
    let t0 = origin(replay);
    let shift = |v: Vec<Millis>| -> Vec<Millis> { v.into_iter().map(|t| t - t0.min(t)).collect() };
    let w = replay.window;
    let kinds = [Kind::Starts, Kind::Deletions];
    let mut lines = Vec::new();
    for kind in kinds {
        lines.push((kind, false, shift(recorded(replay, kind))));
        lines.push((
            kind,
            true,
            shift(replay.paced.times.get(&kind).cloned().unwrap_or_default()),
        ));
    }
    let end = lines
        .iter()
        .filter_map(|(_, _, v)| v.iter().max().copied())
        .max()
        .unwrap_or(0)
        .max(w);
    let y_max = lines
        .iter()
        .map(|(_, _, v)| peak_in_window(v, w))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "replay: events per {} s window, recorded vs paced",
                w / 1000
            ),
            ("sans-serif", 16),
        )
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..end as f64 / 60_000.0, 0f64..y_max * 1.1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("minutes since the first disruptive request")
        .y_desc("events")
        .draw()
        .map_err(|e| e.to_string())?;
    for (kind, paced, times) in &lines {
        let c = match kind {
            Kind::Starts => RGBColor(31, 119, 180),
            _ => RGBColor(214, 39, 40),
        };
        let style = if *paced {
            c.stroke_width(2)
        } else {
            c.mix(0.4).stroke_width(1)
        };
        let label = format!(
            "{} {}",
            kind.as_str(),
            if *paced { "paced" } else { "recorded" }
        );
        chart
            .draw_series(LineSeries::new(series(times, w, end), style))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
