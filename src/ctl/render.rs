//! The report as people read it: a few aligned tables. Pure: a report in, text out.

use super::report::Report;

/// Columns padded to their widest cell, two spaces apart, as kubectl prints.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                out.push_str(&cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count()) + 2;
                out.push_str(&cell);
                out.push_str(&" ".repeat(pad));
            }
        }
        out.trim_end().to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.clone()));
        out.push('\n');
    }
    out
}

/// Seconds from now, as a person reads them: "now", "3.2s", "1m05s".
pub fn in_words(seconds: f64) -> String {
    if seconds < 0.05 {
        return "now".to_string();
    }
    if seconds < 60.0 {
        return format!("{seconds:.1}s");
    }
    let whole = seconds.round() as u64;
    if whole < 3600 {
        return format!("{}m{:02}s", whole / 60, whole % 60);
    }
    format!("{}h{:02}m", whole / 3600, (whole % 3600) / 60)
}

/// The clock time of an RFC 3339 time, to the tenth of a second ("14:03:05.1").
fn clock(time: &str) -> String {
    time.split('T')
        .nth(1)
        .map(|t| t.trim_end_matches('Z'))
        .map(|t| t.get(..10).unwrap_or(t).to_string())
        .unwrap_or_default()
}

fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_string())
}

pub fn human(report: &Report) -> String {
    let mut out = header(report);
    out.push_str(&rules(report));
    out.push_str(&schedules(report));
    out.push_str(&pacing(report));
    out.push_str(&gated_pods(report));
    out.push_str(&held_sets(report));
    if !report.notes.is_empty() {
        out.push('\n');
        for note in &report.notes {
            out.push_str(&format!("note: {note}\n"));
        }
    }
    out
}

/// When, where, which policy, who leads.
fn header(report: &Report) -> String {
    let mut out = String::new();
    let scope = match &report.namespace {
        Some(ns) => format!("namespace {ns}"),
        None => "all namespaces".to_string(),
    };
    out.push_str(&format!(
        "churn-throttler status at {} ({scope}); policy: {}\n",
        report.time, report.policy
    ));
    let leader = match &report.leader {
        None => "none: no releaser Lease (nothing releases gated pods or steps held rollouts)"
            .to_string(),
        Some(l) => {
            let holder = l.holder.clone().unwrap_or_else(|| "nobody".into());
            let renewed = l
                .renewed_seconds_ago
                .map(|s| format!(", renewed {} ago", in_words(s.max(0.0))))
                .unwrap_or_default();
            let expired = if l.expired {
                " (EXPIRED: no replica releases until one takes it over)"
            } else {
                ""
            };
            format!("{holder} (Lease {}{renewed}){expired}", l.lease)
        }
    };
    out.push_str(&format!("leader: {leader}\n"));
    if let Some(line) = report
        .leader
        .as_ref()
        .and_then(|l| l.network_window.as_deref())
        .and_then(network_line)
    {
        out.push_str(&format!("{line}\n"));
    }
    out.push('\n');
    out
}

/// The Lease's note in words: "12 floor=2.0s p90=3.1s change=queue" reads
/// "network window 12 (floor 2.0 s, p90 3.1 s, last change: a queue showed)".
pub(super) fn network_line(note: &str) -> Option<String> {
    let mut parts = note.split_whitespace();
    let window = parts.next()?;
    let mut fields = std::collections::HashMap::new();
    for part in parts {
        let (k, v) = part.split_once('=')?;
        fields.insert(k, v.trim_end_matches('s'));
    }
    let change = match fields.get("change").copied().unwrap_or("") {
        "start" => "nothing measured yet",
        "slow-start" => "growing, network at its floor",
        "queue" => "shrinking: a queue showed",
        "probe" => "following the rate, probing",
        "remeasure" => "re-measuring the floor",
        other => other,
    };
    let field = |k: &str| fields.get(k).copied().unwrap_or("-");
    Some(format!(
        "network window {window} (floor {} s, p90 {} s, {change})",
        field("floor"),
        field("p90")
    ))
}

fn rules(report: &Report) -> String {
    let rows: Vec<Vec<String>> = report
        .rules
        .iter()
        .map(|r| {
            let waiting = match r.pods_to_step {
                Some(pods) => format!("{} sets ({pods} pods)", r.waiting),
                None => format!("{} pods", r.waiting),
            };
            vec![
                r.name.clone(),
                r.action.to_string(),
                format!("{}/{}", r.window_events, r.window_limit),
                r.limit.clone(),
                r.spacing_seconds.map_or("-".into(), |s| format!("{s:.3}s")),
                in_words(r.next_free_in_seconds),
                waiting,
                format!(
                    "{}/{}",
                    r.released_not_ready,
                    r.max_not_ready.map_or("-".into(), |m| m.to_string())
                ),
                or_dash(r.last_estimated_in_seconds.map(in_words)),
            ]
        })
        .collect();
    table(
        &[
            "RULE",
            "ACTION",
            "WINDOW",
            "LIMIT",
            "SPACING",
            "NEXT SLOT",
            "WAITING",
            "NOT READY",
            "LAST IN",
        ],
        &rows,
    )
}

/// The schedule of each rule that has one: in force now, and the next change.
fn schedules(report: &Report) -> String {
    let mut out = String::new();
    for r in &report.rules {
        let Some(s) = &r.schedule else { continue };
        if out.is_empty() {
            out.push_str("\nschedules:\n");
        }
        let state = if s.paused { "PAUSED: " } else { "" };
        out.push_str(&format!(
            "  {}: {state}{} ({})",
            r.name, s.in_force, s.source
        ));
        match (&s.next_change, s.next_change_in_seconds, &s.next_in_force) {
            (Some(at), Some(secs), Some(next)) => out.push_str(&format!(
                "; next change in {} ({at}): {next}\n",
                in_words(secs)
            )),
            _ => out.push_str("; no change within 400 days\n"),
        }
    }
    out
}

/// The pauses and overrides in force: what, on which rules, who, why, time left.
fn pacing(report: &Report) -> String {
    if report.pacing_overrides.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = report
        .pacing_overrides
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                match &p.figures {
                    Some(f) => format!("{} ({f})", p.kind),
                    None => p.kind.to_string(),
                },
                if p.rules.is_empty() {
                    "(all)".to_string()
                } else {
                    p.rules.join(",")
                },
                p.author.clone(),
                or_dash(Some(p.reason.clone()).filter(|r| !r.is_empty())),
                clock(&p.since),
                p.seconds_left
                    .map_or("until resumed".to_string(), |s| in_words(s.max(0.0))),
            ]
        })
        .collect();
    let mut out = format!(
        "
pauses and overrides: {}
",
        report.pacing_overrides.len()
    );
    out.push_str(&table(
        &["NAME", "WHAT", "RULES", "BY", "REASON", "SINCE", "LEFT"],
        &rows,
    ));
    out
}

fn gated_pods(report: &Report) -> String {
    let mut out = format!(
        "\ngated pods: {} (POSITION: place in the rule's release order, every namespace counted)\n",
        report.gated_pods.len()
    );
    if !report.gated_pods.is_empty() {
        let rows: Vec<Vec<String>> = report
            .gated_pods
            .iter()
            .map(|p| {
                vec![
                    p.namespace.clone(),
                    p.name.clone(),
                    p.rule.clone(),
                    p.position.to_string(),
                    or_dash(p.estimated_in_seconds.map(in_words)),
                    or_dash(p.estimated_release.as_deref().map(clock)),
                ]
            })
            .collect();
        out.push_str(&table(
            &["NAMESPACE", "POD", "RULE", "POSITION", "RELEASE IN", "AT"],
            &rows,
        ));
    }
    out
}

fn held_sets(report: &Report) -> String {
    let mut out = format!("\nheld StatefulSets: {}\n", report.held_stateful_sets.len());
    if !report.held_stateful_sets.is_empty() {
        let rows: Vec<Vec<String>> = report
            .held_stateful_sets
            .iter()
            .map(|s| {
                vec![
                    s.namespace.clone(),
                    s.name.clone(),
                    s.rule.clone(),
                    s.partition.to_string(),
                    s.target.map_or("?".into(), |t| t.to_string()),
                    format!("{}/{}", s.updated_replicas, s.replicas),
                    format!("{}/{}", s.ready_replicas, s.replicas),
                    or_dash(s.estimated_in_seconds.map(in_words)),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "NAMESPACE",
                "STATEFULSET",
                "RULE",
                "PARTITION",
                "TARGET",
                "UPDATED",
                "READY",
                "LAST STEP IN",
            ],
            &rows,
        ));
    }
    out
}
