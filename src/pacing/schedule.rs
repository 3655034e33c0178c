//! The limit in force for a rule at `now`: its schedule windows (and, later, a pause or
//! a temporary override) over its own limits. Pure: the rule, the adjustments and `now` in.
//!
//! Precedence, highest first: a pause, the newest override, the most restrictive open
//! schedule window, the rule. Among open windows the most restrictive wins, field by
//! field (events, burst, maxNotReady), so the order in which windows are written does not
//! matter and two windows never add up to more than either allows. `window` and `scope`
//! stay the rule's. The limiter keeps its charges when the events change (its buckets are
//! keyed by rule and limit, not by the figures), so a lower limit still sees what was
//! charged under a higher one and a pause earns no burst: after it, the limiter allows
//! what it allows after any quiet spell, never more.

use crate::limiter::Millis;
use crate::names::{format_pause_end, format_time};
use crate::policy::{format_duration, Limit, Policy, Rule, ScheduleWindow};

/// Why the limits in force are what they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The rule's own limits.
    Rule,
    /// The schedule window at this index of the rule's `schedules` (the one that set the
    /// events, the lowest index among equals).
    Schedule { window: usize },
    /// A temporary override (`churn-throttler override`).
    Override,
    /// A pause; also a schedule window of `events: 0` (then `Schedule` says which).
    Pause,
}

impl Source {
    /// The bounded metric label.
    pub fn label(self) -> &'static str {
        match self {
            Source::Rule => "rule",
            Source::Schedule { .. } => "schedule",
            Source::Override => "override",
            Source::Pause => "pause",
        }
    }
}

/// A change made from outside the policy, in force from `from` until `until` (None: until
/// removed): a PacingOverride object made by `pause` or `override` (crate::objects::overrides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjustment {
    Pause {
        from: Millis,
        until: Option<Millis>,
    },
    Override {
        from: Millis,
        until: Millis,
        events: u32,
        burst: Option<u32>,
        max_not_ready: Option<u32>,
    },
}

/// An adjustment and the rules it applies to (None: every rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scoped {
    pub rules: Option<Vec<String>>,
    pub adjustment: Adjustment,
}

impl Scoped {
    pub fn applies_to(&self, rule: &str) -> bool {
        self.rules
            .as_ref()
            .is_none_or(|rules| rules.iter().any(|r| r == rule))
    }
}

/// The adjustments of `scoped` that apply to `rule`.
pub fn adjustments_for(scoped: &[Scoped], rule: &str) -> Vec<Adjustment> {
    scoped
        .iter()
        .filter(|s| s.applies_to(rule))
        .map(|s| s.adjustment)
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InForce {
    /// The rule's limits with the events (and burst) in force; the rule's own while a
    /// schedule window pauses it (nothing is charged then).
    pub limits: Vec<Limit>,
    pub max_not_ready: Option<u32>,
    /// Nothing goes until then (u64::MAX: no end within reach).
    pub paused_until: Option<Millis>,
    pub source: Source,
    /// The schedule window that is a pause, for `status` (a window of `events: 0`).
    pub paused_by_window: Option<usize>,
    /// The next time after `now` the limits in force may change (None: none within
    /// `policy::HORIZON_MS`).
    pub next_change: Option<Millis>,
}

impl InForce {
    /// The events of the first limit in force (0 while paused), for gauges and status.
    pub fn events(&self) -> u32 {
        if self.paused_until.is_some() {
            0
        } else {
            self.limits.first().map_or(0, |l| l.events)
        }
    }
}

/// Figures of one open window or override, before they are laid over the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Figures {
    events: u32,
    burst: Option<u32>,
    max_not_ready: Option<u32>,
}

/// `limits` with `figures` laid over them: every limit takes the events; the burst is the
/// one given, else the limit's own, at most the events.
fn lay_over(limits: &[Limit], figures: Figures) -> Vec<Limit> {
    limits
        .iter()
        .map(|l| {
            let events = figures.events.max(1);
            Limit {
                events,
                burst: figures.burst.unwrap_or(l.burst).clamp(1, events),
                ..*l
            }
        })
        .collect()
}

fn min_opt(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The limits of `rule` in force at `now`, given its schedule windows and `adjustments`.
pub fn limit_in_force(rule: &Rule, adjustments: &[Adjustment], now: Millis) -> InForce {
    let mut next_change: Option<Millis> = None;
    let mut note = |t: Option<Millis>| {
        if let Some(t) = t.filter(|&t| t > now) {
            next_change = Some(next_change.map_or(t, |n| n.min(t)));
        }
    };

    // Schedule windows: the most restrictive of those open, field by field.
    // (the window that set the events, the figures, the pause's end, the limits: each
    // window's laid over the rule's, then the least events and burst per limit, so a
    // window that leaves the burst to the limit is not outdone by one that names it).
    type Open = (usize, Figures, Option<Millis>, Vec<Limit>);
    let mut open: Option<Open> = None;
    for (index, window) in rule.schedules.iter().enumerate() {
        let is_open = window.open_since(now).is_some();
        let change = window.next_change(now);
        note(change);
        if !is_open {
            continue;
        }
        let figures = window_figures(rule, window);
        let laid = lay_over(&rule.limits, figures);
        open = Some(match open {
            None => (index, figures, change, laid),
            Some((best, acc, closes, limits)) => {
                let source = if figures.events < acc.events {
                    index
                } else {
                    best
                };
                let merged = Figures {
                    events: acc.events.min(figures.events),
                    burst: min_opt(acc.burst, figures.burst),
                    max_not_ready: min_opt(acc.max_not_ready, figures.max_not_ready),
                };
                // A pause lasts while any window of events 0 is open.
                let closes = if figures.events == 0 && acc.events == 0 {
                    max_end(closes, change)
                } else if figures.events == 0 {
                    change
                } else {
                    closes
                };
                let limits = limits
                    .iter()
                    .zip(&laid)
                    .map(|(a, b)| Limit {
                        events: a.events.min(b.events),
                        burst: a.burst.min(b.burst),
                        ..*a
                    })
                    .collect();
                (source, merged, closes, limits)
            }
        });
    }

    // Adjustments: a pause over the newest override over the windows.
    let live = |from: Millis, until: Option<Millis>| from <= now && until.is_none_or(|u| now < u);
    for a in adjustments {
        let (from, until) = match *a {
            Adjustment::Pause { from, until } => (from, until),
            Adjustment::Override { from, until, .. } => (from, Some(until)),
        };
        // A future one starts a change; a live one ends one (`note` keeps only times
        // after now).
        note(Some(from));
        if from <= now {
            note(until);
        }
    }
    let pause = adjustments
        .iter()
        .filter_map(|a| match *a {
            Adjustment::Pause { from, until } if live(from, until) => {
                Some(until.unwrap_or(Millis::MAX))
            }
            _ => None,
        })
        .max();
    let newest_override = adjustments
        .iter()
        .filter_map(|a| match *a {
            Adjustment::Override {
                from,
                until,
                events,
                burst,
                max_not_ready,
            } if live(from, Some(until)) => Some((
                from,
                Figures {
                    events,
                    burst,
                    max_not_ready,
                },
            )),
            _ => None,
        })
        .max_by_key(|(from, _)| *from);

    let base = InForce {
        limits: rule.limits.clone(),
        max_not_ready: rule.max_not_ready,
        paused_until: None,
        source: Source::Rule,
        paused_by_window: None,
        next_change,
    };
    if let Some(until) = pause {
        return InForce {
            paused_until: Some(until),
            source: Source::Pause,
            ..base
        };
    }
    if let Some((_, figures)) = newest_override {
        return InForce {
            limits: lay_over(&rule.limits, figures),
            max_not_ready: figures.max_not_ready.or(rule.max_not_ready),
            paused_until: (figures.events == 0).then_some(Millis::MAX),
            source: if figures.events == 0 {
                Source::Pause
            } else {
                Source::Override
            },
            ..base
        };
    }
    match open {
        None => base,
        Some((window, figures, _, limits)) if figures.events > 0 => InForce {
            limits,
            max_not_ready: figures.max_not_ready,
            source: Source::Schedule { window },
            ..base
        },
        Some((window, figures, closes, _)) => InForce {
            max_not_ready: figures.max_not_ready,
            paused_until: Some(closes.unwrap_or(Millis::MAX)),
            paused_by_window: Some(window),
            source: Source::Schedule { window },
            ..base
        },
    }
}

fn max_end(a: Option<Millis>, b: Option<Millis>) -> Option<Millis> {
    // None is "no end within reach": the later of the two.
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        _ => None,
    }
}

/// A window's figures with the rule's filled in: the burst stays per limit (None here),
/// maxNotReady falls back to the rule's.
fn window_figures(rule: &Rule, window: &ScheduleWindow) -> Figures {
    Figures {
        events: window.events,
        burst: window.burst,
        max_not_ready: window.max_not_ready.or(rule.max_not_ready),
    }
}

/// The policy in force at `now`: every rule with schedules or adjustments has its
/// limits, maxNotReady and pause set by [`limit_in_force`]; and the earliest next change
/// of any rule (until then the result stays valid). A policy without either comes back
/// as it is.
pub fn policy_in_force(
    policy: &Policy,
    scoped: &[Scoped],
    now: Millis,
) -> (Policy, Option<Millis>) {
    let mut out = policy.clone();
    let mut next: Option<Millis> = None;
    for rule in out.rules.iter_mut() {
        let adjustments = adjustments_for(scoped, &rule.name);
        if rule.schedules.is_empty() && adjustments.is_empty() {
            continue;
        }
        let in_force = limit_in_force(rule, &adjustments, now);
        rule.limits = in_force.limits;
        rule.max_not_ready = in_force.max_not_ready;
        rule.paused_until = in_force.paused_until;
        rule.paused_by = if in_force.source == Source::Pause {
            crate::policy::PAUSED_BY_COMMAND
        } else {
            crate::policy::PAUSED_BY_SCHEDULE
        };
        if let Some(t) = in_force.next_change {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
    }
    (out, next)
}

/// Whether any rule of the policy has schedule windows.
pub fn has_schedules(policy: &Policy) -> bool {
    policy.rules.iter().any(|r| !r.schedules.is_empty())
}

/// A change of the limits in force, for `check-config`: at `at`, rule `rule` goes to
/// `in_force`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub at: Millis,
    pub rule: String,
    pub in_force: InForce,
}

/// The next `count` changes of the limits in force after `now`, in time order.
pub fn next_changes(policy: &Policy, now: Millis, count: usize) -> Vec<Change> {
    let mut out = Vec::new();
    for rule in policy.rules.iter().filter(|r| !r.schedules.is_empty()) {
        let mut last = limit_in_force(rule, &[], now);
        // Bounded: each step moves past one change.
        for _ in 0..count {
            let Some(at) = last.next_change else { break };
            let in_force = limit_in_force(rule, &[], at);
            // Occurrences that join, or windows that swap with equal figures, are no change.
            if (
                &in_force.limits,
                in_force.max_not_ready,
                in_force.paused_until.is_some(),
            ) != (
                &last.limits,
                last.max_not_ready,
                last.paused_until.is_some(),
            ) {
                out.push(Change {
                    at,
                    rule: rule.name.to_string(),
                    in_force: in_force.clone(),
                });
            }
            last = in_force;
        }
    }
    out.sort_by(|a, b| (a.at, &a.rule).cmp(&(b.at, &b.rule)));
    out.truncate(count);
    out
}

/// What is in force, in words: "pause until T", or the limits (and maxNotReady).
pub fn describe_in_force(in_force: &InForce) -> String {
    if let Some(until) = in_force.paused_until {
        return format!("paused until {}", format_pause_end(until));
    }
    let limits: Vec<String> = in_force
        .limits
        .iter()
        .map(|l| format!("{l}, burst {}", l.burst))
        .collect();
    let mut text = limits.join(" and ");
    if let Some(m) = in_force.max_not_ready {
        text.push_str(&format!(", maxNotReady {m}"));
    }
    text
}

fn describe_window(window: &ScheduleWindow) -> String {
    let figures = if window.events == 0 {
        "pause".to_string()
    } else {
        let mut f = format!("{} events", window.events);
        if let Some(b) = window.burst {
            f.push_str(&format!(", burst {b}"));
        }
        if let Some(m) = window.max_not_ready {
            f.push_str(&format!(", maxNotReady {m}"));
        }
        f
    };
    format!(
        "{:?} {} for {}: {figures}",
        window.schedule,
        window.zone_name,
        format_duration(window.duration)
    )
}

/// For `check-config`: each rule's windows, what is in force at `now` and the next
/// `count` changes (lines to print); and the warnings (a window that never closes).
pub fn describe(policy: &Policy, now: Millis, count: usize) -> (Vec<String>, Vec<String>) {
    let mut lines = Vec::new();
    let mut warnings = Vec::new();
    if !has_schedules(policy) {
        return (lines, warnings);
    }
    lines.push(format!("schedules (at {}):", format_time(now)));
    for rule in policy.rules.iter().filter(|r| !r.schedules.is_empty()) {
        let in_force = limit_in_force(rule, &[], now);
        lines.push(format!(
            "  {}: in force now: {} ({})",
            rule.name,
            describe_in_force(&in_force),
            source_words(rule, in_force.source)
        ));
        for (i, window) in rule.schedules.iter().enumerate() {
            lines.push(format!("    schedules[{i}] {}", describe_window(window)));
            if window.always_open(now) {
                warnings.push(format!(
                    "rule {:?}: schedules[{i}] ({:?} for {}) lasts longer than the time between its \
                     starts: it is always open",
                    rule.name,
                    window.schedule,
                    format_duration(window.duration)
                ));
            }
        }
    }
    let changes = next_changes(policy, now, count);
    if changes.is_empty() {
        lines.push("next changes: none within 400 days".to_string());
    } else {
        lines.push("next changes:".to_string());
    }
    for change in changes {
        let rule = policy.rules.iter().find(|r| *r.name == *change.rule);
        let source = rule.map_or_else(String::new, |r| source_words(r, change.in_force.source));
        lines.push(format!(
            "  {}  {}: {} ({source})",
            format_time(change.at),
            change.rule,
            describe_in_force(&change.in_force)
        ));
    }
    (lines, warnings)
}

/// Where the limits in force come from, in words.
pub fn source_words(rule: &Rule, source: Source) -> String {
    match source {
        Source::Rule => "the rule's own".to_string(),
        Source::Schedule { window } => match rule.schedules.get(window) {
            Some(w) => format!("schedules[{window}] {:?} {}", w.schedule, w.zone_name),
            None => format!("schedules[{window}]"),
        },
        Source::Override => "an override".to_string(),
        Source::Pause => "a pause".to_string(),
    }
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
