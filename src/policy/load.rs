//! Reads a policy from YAML and validates it, with errors that name the file and line.
//! Unknown fields are errors, so a misspelt key never silently falls back to a default.

use super::cron::Cron;
use super::duration::{format_duration, serde_duration, serde_opt_duration};
use super::schedule::ScheduleWindow;
use super::{
    Action, ChurnKind, Exemptions, Limit, Match, NetworkConfig, Policy, Rule, Scope,
    PAUSED_BY_SCHEDULE,
};
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// The policy used when `serve` gets no `--config`; documented in the README.
pub const DEFAULT_POLICY_YAML: &str = include_str!("default-policy.yaml");

const MAX_EVENTS: u32 = 1_000_000;
const MIN_WINDOW: Duration = Duration::from_millis(100);
const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{file}:{line}: {message}")]
pub struct PolicyError {
    pub file: String,
    /// 1-based; 0 when the problem has no single place (an empty file).
    pub line: usize,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPolicy {
    #[serde(default = "default_timeout_seconds")]
    timeout_seconds: u64,
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default)]
    exempt: RawExempt,
    #[serde(default = "default_max_buckets")]
    max_buckets: usize,
    network: Option<RawNetwork>,
}

/// The shared network window's bounds (docs/adaptive.md).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawNetwork {
    min_window: Option<u32>,
    max_window: Option<u32>,
    #[serde(default, with = "serde_opt_duration")]
    bound: Option<Duration>,
    #[serde(default, with = "serde_opt_duration")]
    floor_period: Option<Duration>,
}

fn default_timeout_seconds() -> u64 {
    10
}

fn default_max_buckets() -> usize {
    100_000
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawExempt {
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    priority_classes: Vec<String>,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRule {
    name: String,
    #[serde(rename = "match")]
    matches: RawMatch,
    limit: Option<RawLimit>,
    #[serde(default)]
    limits: Vec<RawLimit>,
    action: String,
    #[serde(default, with = "serde_opt_duration")]
    max_hold: Option<Duration>,
    max_not_ready: Option<u32>,
    max_reserved_per_namespace: Option<u32>,
    #[serde(default, with = "serde_opt_duration")]
    max_retry_after: Option<Duration>,
    #[serde(default)]
    adaptive: bool,
    #[serde(default)]
    schedules: Vec<RawSchedule>,
}

/// One schedule window of a rule (docs/operations.md, "Schedules").
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSchedule {
    schedule: String,
    time_zone: Option<String>,
    /// Optional here so that a missing one is refused with its line and a sentence.
    #[serde(default, with = "serde_opt_duration")]
    duration: Option<Duration>,
    limit: RawScheduleLimit,
    max_not_ready: Option<u32>,
}

/// `window` and `scope` stay the rule's: a window sets how many, not over what.
#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawScheduleLimit {
    events: u32,
    burst: Option<u32>,
}

/// A schedule window lasts at most this long (a week: longer ones are a policy change).
const MAX_SCHEDULE_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawMatch {
    resources: Vec<String>,
    operations: Vec<String>,
    #[serde(default)]
    controller_kinds: Vec<String>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    exclude_users: Vec<String>,
    #[serde(default)]
    exclude_labels: BTreeMap<String, String>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawLimit {
    events: u32,
    #[serde(with = "serde_duration")]
    window: Duration,
    #[serde(default = "default_scope")]
    scope: RawScope,
    /// How many may go at once before the spacing applies (default [`DEFAULT_BURST`]).
    burst: Option<u32>,
}

/// Two: after a quiet spell two go at once, then one per (window + margin) / events, which
/// is what "20 per 10 s" means to a CNI (2 per second). One would be smoother still, but a
/// pacer that acts a little after its slot (a releaser round, a retry) then loses that
/// time for good: the e2e gate rollout ran at 1.28 x the ideal makespan with burst 1
/// (releases 226 ms apart at the median against a spacing of 206 ms, then), where a second
/// token absorbs a lateness up to one spacing (see docs/e2e-results.md).
pub const DEFAULT_BURST: u32 = 2;

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum RawScope {
    Global,
    Namespace,
    Owner,
}

fn default_scope() -> RawScope {
    RawScope::Global
}

impl Policy {
    /// Parses and validates a policy; `file` names it in errors.
    pub fn from_yaml(text: &str, file: &str) -> Result<Policy, PolicyError> {
        let error = |line: usize, message: String| PolicyError {
            file: file.to_string(),
            line,
            message,
        };
        if text.trim().is_empty() {
            return Err(error(0, "the policy file is empty".into()));
        }
        let raw: RawPolicy = serde_yaml::from_str(text).map_err(|e| {
            let line = e.location().map(|l| l.line()).unwrap_or(0);
            // serde_yaml appends "at line N column M"; the prefix already says where.
            let message = e.to_string();
            let message = match message.find(" at line ") {
                Some(i) => message[..i].to_string(),
                None => message,
            };
            error(line, message)
        })?;
        let locate = Locator { text };

        if !(1..=30).contains(&raw.timeout_seconds) {
            return Err(error(
                locate.key(0, "timeoutSeconds"),
                format!(
                    "timeoutSeconds is {}, but Kubernetes accepts 1 to 30",
                    raw.timeout_seconds
                ),
            ));
        }
        if raw.max_buckets < 16 {
            return Err(error(
                locate.key(0, "maxBuckets"),
                format!("maxBuckets is {}, it must be at least 16", raw.max_buckets),
            ));
        }
        let timeout = Duration::from_secs(raw.timeout_seconds);
        let mut names = HashSet::new();
        let mut rules = Vec::with_capacity(raw.rules.len());
        for raw_rule in raw.rules {
            let at = locate.rule(&raw_rule.name);
            let rule = build_rule(raw_rule, timeout, &locate, at)
                .map_err(|(line, message)| error(line, message))?;
            if !names.insert(rule.name.clone()) {
                return Err(error(
                    at,
                    format!("rule name {:?} is used twice", rule.name),
                ));
            }
            rules.push(rule);
        }
        let network = build_network(raw.network, &rules, &locate)
            .map_err(|(line, message)| error(line, message))?;
        Ok(Policy {
            timeout,
            rules,
            network,
            exempt: Exemptions {
                namespaces: raw.exempt.namespaces,
                priority_classes: raw.exempt.priority_classes,
                users: raw.exempt.users,
                groups: raw.exempt.groups,
            },
            max_buckets: raw.max_buckets,
        })
    }
}

/// A rule's errors point at the rule's line and name it.
struct RuleError<'l, 'n> {
    locate: &'l Locator<'l>,
    at: usize,
    name: &'n str,
}

impl RuleError<'_, '_> {
    fn fail(&self, key: &str, message: String) -> (usize, String) {
        (
            self.locate.key(self.at, key),
            format!("rule {:?}: {message}", self.name),
        )
    }
}

fn build_rule(
    raw: RawRule,
    timeout: Duration,
    locate: &Locator<'_>,
    at: usize,
) -> Result<Rule, (usize, String)> {
    let name = raw.name.clone();
    let err = RuleError {
        locate,
        at,
        name: &name,
    };
    check_name(&name, &err)?;
    let action = parse_action(&raw.action, &err)?;
    let kinds = resolve_kinds(&raw.matches.resources, &raw.matches.operations)
        .map_err(|m| err.fail("resources", m))?;
    if kinds.is_empty() {
        return Err(err.fail(
            "resources",
            "no intercepted request matches these resources and operations \
             (pods CREATE/DELETE, pods/eviction CREATE, statefulsets UPDATE)"
                .into(),
        ));
    }
    match action {
        Action::Gate if kinds != [ChurnKind::PodCreate] => {
            return Err(err.fail(
                "action",
                "gate applies only to pods CREATE; match resources: [pods], operations: [CREATE]"
                    .into(),
            ))
        }
        Action::Partition if kinds != [ChurnKind::StatefulSetUpdate] => {
            return Err(err.fail(
                "action",
                "partition applies only to statefulsets UPDATE".into(),
            ))
        }
        _ => {}
    }

    let limits = build_limits(raw.limit, raw.limits.clone(), action, &err)?;
    check_caps(&raw, action, timeout, &err)?;
    let first_events = limits.first().map(|l| l.events).unwrap_or(1);
    let max_reserved_per_namespace = raw.max_reserved_per_namespace.unwrap_or(first_events);
    if max_reserved_per_namespace == 0 {
        return Err(err.fail(
            "maxReservedPerNamespace",
            "maxReservedPerNamespace must be at least 1".into(),
        ));
    }
    let max_retry_after = raw.max_retry_after.unwrap_or(Duration::from_secs(60));
    let schedules = build_schedules(&raw.schedules, action, &err)?;
    Ok(Rule {
        name: Arc::from(name.as_str()),
        matches: Match {
            kinds,
            controller_kinds: raw.matches.controller_kinds,
            namespaces: raw.matches.namespaces,
            users: raw.matches.users,
            exclude_users: raw.matches.exclude_users,
            exclude_labels: raw.matches.exclude_labels,
        },
        limits,
        action,
        max_hold: raw.max_hold,
        max_not_ready: raw.max_not_ready,
        max_reserved_per_namespace,
        max_retry_after,
        adaptive: raw.adaptive,
        gate_only: false,
        schedules,
        paused_until: None,
        paused_by: PAUSED_BY_SCHEDULE,
    })
}

/// The rule's schedule windows, each checked; errors point at the window's line.
fn build_schedules(
    raw: &[RawSchedule],
    action: Action,
    err: &RuleError<'_, '_>,
) -> Result<Vec<ScheduleWindow>, (usize, String)> {
    let mut windows = Vec::with_capacity(raw.len());
    for (i, w) in raw.iter().enumerate() {
        let at = err.locate.item(err.at, "schedules", "schedule", i);
        let fail = |key: &str, message: String| {
            (
                err.locate.key(at, key),
                format!("rule {:?}: schedules[{i}]: {message}", err.name),
            )
        };
        let cron = Cron::parse(&w.schedule)
            .map_err(|e| fail("schedule", format!("schedule {:?}: {e}", w.schedule)))?;
        let zone_name = w.time_zone.clone().unwrap_or_else(|| "UTC".to_string());
        let zone = jiff::tz::TimeZone::get(&zone_name).map_err(|_| {
            fail(
                "timeZone",
                format!(
                    "unknown time zone {zone_name:?}: use an IANA name such as \"Europe/Berlin\" \
                     or \"UTC\" (the zone data is the system's tzdata)"
                ),
            )
        })?;
        let Some(duration) = w.duration else {
            return Err((
                at,
                format!(
                    "rule {:?}: schedules[{i}] has no duration: how long each window lasts \
                     from its start (e.g. duration: 8h)",
                    err.name
                ),
            ));
        };
        if duration < Duration::from_secs(60) || duration > MAX_SCHEDULE_DURATION {
            return Err(fail(
                "duration",
                format!(
                    "duration is {}, it must be between 1m and {}",
                    format_duration(duration),
                    format_duration(MAX_SCHEDULE_DURATION)
                ),
            ));
        }
        let events = w.limit.events;
        if events > MAX_EVENTS {
            return Err(fail(
                "events",
                format!("events is {events}, it must be 0 (a pause) to {MAX_EVENTS}"),
            ));
        }
        match w.limit.burst {
            Some(b) if events == 0 => {
                return Err(fail(
                    "burst",
                    format!("burst is {b}, but events: 0 is a pause and releases nothing"),
                ))
            }
            Some(b) if b == 0 || b > events => {
                return Err(fail(
                    "burst",
                    format!("burst is {b}, it must be 1 to events ({events})"),
                ))
            }
            _ => {}
        }
        if let Some(m) = w.max_not_ready {
            if !action.is_mutating() {
                return Err(fail(
                    "maxNotReady",
                    "maxNotReady applies to gate and partition, whose releases the releaser tracks"
                        .into(),
                ));
            }
            if m == 0 {
                return Err(fail(
                    "maxNotReady",
                    "maxNotReady must be at least 1 (events: 0 pauses the rule)".into(),
                ));
            }
        }
        windows.push(ScheduleWindow {
            schedule: w.schedule.clone(),
            cron,
            zone_name,
            zone,
            duration,
            events,
            burst: w.limit.burst,
            max_not_ready: w.max_not_ready,
        });
    }
    Ok(windows)
}

/// The network window: its bounds (defaults of `NetworkConfig`) when a rule is adaptive.
fn build_network(
    raw: Option<RawNetwork>,
    rules: &[Rule],
    locate: &Locator<'_>,
) -> Result<Option<NetworkConfig>, (usize, String)> {
    let defaults = NetworkConfig::default();
    let Some(raw) = raw else {
        return Ok(rules.iter().any(|r| r.adaptive).then_some(defaults));
    };
    let at = locate.key(0, "network");
    let config = NetworkConfig {
        min_window: raw.min_window.unwrap_or(defaults.min_window),
        max_window: raw.max_window.unwrap_or(defaults.max_window),
        bound_ms: raw
            .bound
            .map_or(defaults.bound_ms, |d| d.as_millis() as u64),
        floor_period_ms: raw
            .floor_period
            .map_or(defaults.floor_period_ms, |d| d.as_millis() as u64),
    };
    if config.min_window == 0 {
        return Err((
            locate.key(at, "minWindow"),
            "network: minWindow must be at least 1".into(),
        ));
    }
    if config.min_window > config.max_window {
        return Err((
            locate.key(at, "minWindow"),
            format!(
                "network: minWindow {} is above maxWindow {}",
                config.min_window, config.max_window
            ),
        ));
    }
    if config.bound_ms < 1_000 {
        return Err((
            locate.key(at, "bound"),
            "network: bound must be at least 1s".into(),
        ));
    }
    if config.floor_period_ms < config.bound_ms {
        return Err((
            locate.key(at, "floorPeriod"),
            "network: floorPeriod must be at least the bound".into(),
        ));
    }
    Ok(Some(config))
}

fn check_name(name: &str, err: &RuleError<'_, '_>) -> Result<(), (usize, String)> {
    if name.is_empty()
        || name.len() > 63
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(err.fail(
            "name",
            "the name must be 1 to 63 characters of a-z, 0-9 and '-' (it becomes a metric label)"
                .into(),
        ));
    }

    Ok(())
}

fn parse_action(action: &str, err: &RuleError<'_, '_>) -> Result<Action, (usize, String)> {
    Ok(match action {
        "gate" => Action::Gate,
        "partition" => Action::Partition,
        "hold" => Action::Hold,
        "retry-after" => Action::RetryAfter,
        "deny" => Action::Deny,
        "warn" => Action::Warn,
        other => {
            return Err(err.fail(
                "action",
                format!(
                    "unknown action {other:?}; use gate, partition, hold, retry-after, deny or warn"
                ),
            ))
        }
    })
}

/// The rule's limits (`limit` first, then `limits`), each checked.
fn build_limits(
    limit: Option<RawLimit>,
    mut raw_limits: Vec<RawLimit>,
    action: Action,
    err: &RuleError<'_, '_>,
) -> Result<Vec<Limit>, (usize, String)> {
    if let Some(limit) = limit {
        raw_limits.insert(0, limit);
    }
    if raw_limits.is_empty() {
        return Err(err.fail(
            "limit",
            "a rule needs a limit: { events, window, scope }".into(),
        ));
    }
    let mut limits = Vec::with_capacity(raw_limits.len());
    for l in raw_limits {
        if l.events == 0 || l.events > MAX_EVENTS {
            return Err(err.fail(
                "events",
                format!("events is {}, it must be 1 to {MAX_EVENTS}", l.events),
            ));
        }
        if l.window < MIN_WINDOW || l.window > MAX_WINDOW {
            return Err(err.fail(
                "window",
                format!(
                    "window is {}, it must be between {} and {}",
                    format_duration(l.window),
                    format_duration(MIN_WINDOW),
                    format_duration(MAX_WINDOW)
                ),
            ));
        }
        let burst = l.burst.unwrap_or(DEFAULT_BURST.min(l.events));
        if burst == 0 || burst > l.events {
            return Err(err.fail(
                "burst",
                format!(
                    "burst is {burst}, it must be 1 to events ({}): how many of them may go \
                     at once before the rest are spaced by window / events",
                    l.events
                ),
            ));
        }
        let scope = match l.scope {
            RawScope::Global => Scope::Global,
            RawScope::Namespace => Scope::Namespace,
            RawScope::Owner => Scope::Owner,
        };
        limits.push(Limit {
            events: l.events,
            window: l.window,
            scope,
            burst,
        });
    }
    if action == Action::Partition && limits.iter().any(|l| l.scope == Scope::Owner) {
        return Err(err.fail(
            "scope",
            "partition steps are paced per namespace or globally; owner scope does not apply"
                .into(),
        ));
    }

    Ok(limits)
}

/// maxHold, maxNotReady and maxRetryAfter against the action and the timeout.
fn check_caps(
    raw: &RawRule,
    action: Action,
    timeout: Duration,
    err: &RuleError<'_, '_>,
) -> Result<(), (usize, String)> {
    let max_hold_limit = timeout / 2;
    match (action, raw.max_hold) {
        (Action::Hold, None) => {
            return Err(err.fail("action", "hold needs maxHold (e.g. maxHold: 3s)".into()))
        }
        (Action::Hold | Action::RetryAfter, Some(h)) if h > max_hold_limit => {
            return Err(err.fail(
                "maxHold",
                format!(
                    "maxHold {} must be at most half of timeoutSeconds ({}), \
                     so a held request never meets the webhook timeout",
                    format_duration(h),
                    format_duration(max_hold_limit)
                ),
            ))
        }
        (Action::Gate | Action::Partition | Action::Deny | Action::Warn, Some(_)) => {
            return Err(err.fail(
                "maxHold",
                format!(
                    "maxHold applies to hold and retry-after, not {}",
                    action.as_str()
                ),
            ))
        }
        _ => {}
    }
    if raw.max_not_ready.is_some() && !action.is_mutating() {
        return Err(err.fail(
            "maxNotReady",
            "maxNotReady applies to gate and partition, whose releases the releaser tracks".into(),
        ));
    }
    if raw.adaptive && !action.is_mutating() {
        return Err(err.fail(
            "adaptive",
            format!(
                "adaptive applies to gate and partition (the pods they start), not {}",
                action.as_str()
            ),
        ));
    }
    if raw.adaptive && raw.max_not_ready.is_none() {
        return Err(err.fail(
            "adaptive",
            "adaptive needs maxNotReady: the network window bounds pods until their network is \
             up, maxNotReady stays the cap until they are Ready"
                .into(),
        ));
    }
    if raw.max_not_ready == Some(0) {
        return Err(err.fail("maxNotReady", "maxNotReady must be at least 1".into()));
    }
    if raw
        .max_retry_after
        .is_some_and(|r| r < Duration::from_secs(1))
    {
        return Err(err.fail(
            "maxRetryAfter",
            "maxRetryAfter must be at least 1s (Retry-After counts whole seconds)".into(),
        ));
    }
    Ok(())
}

fn resolve_kinds(resources: &[String], operations: &[String]) -> Result<Vec<ChurnKind>, String> {
    for op in operations {
        if !["CREATE", "DELETE", "UPDATE"].contains(&op.as_str()) {
            return Err(format!(
                "unknown operation {op:?}; use CREATE, DELETE or UPDATE"
            ));
        }
    }
    let has_op = |op: &str| operations.iter().any(|o| o == op);
    let mut kinds = Vec::new();
    for resource in resources {
        match resource.as_str() {
            "pods" => {
                if has_op("CREATE") {
                    kinds.push(ChurnKind::PodCreate);
                }
                if has_op("DELETE") {
                    kinds.push(ChurnKind::PodDelete);
                }
            }
            "pods/eviction" => {
                if has_op("CREATE") {
                    kinds.push(ChurnKind::Eviction);
                }
            }
            "statefulsets" => {
                if has_op("UPDATE") {
                    kinds.push(ChurnKind::StatefulSetUpdate);
                }
            }
            other => {
                return Err(format!(
                    "unknown resource {other:?}; use pods, pods/eviction or statefulsets"
                ))
            }
        }
    }
    kinds.sort();
    kinds.dedup();
    Ok(kinds)
}

/// Finds the line of a rule or key in the source, for errors found after parsing.
struct Locator<'a> {
    text: &'a str,
}

impl Locator<'_> {
    /// The 1-based line of `name: <rule name>`, or 0.
    fn rule(&self, name: &str) -> usize {
        self.text
            .lines()
            .position(|line| {
                let line = line.trim_start().trim_start_matches("- ").trim_start();
                line.strip_prefix("name:")
                    .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'') == name)
                    .unwrap_or(false)
            })
            .map(|i| i + 1)
            .unwrap_or(0)
    }

    /// The line of the `n`-th item (0-based) of the list under `list:` after `from`: the
    /// `n`-th line holding `item:` there (falling back to the list's line).
    fn item(&self, from: usize, list: &str, item: &str, n: usize) -> usize {
        let start = self.key(from, list);
        let needle = format!("{item}:");
        self.text
            .lines()
            .enumerate()
            .skip(start)
            .take_while(|(_, line)| !line.trim_start().starts_with("- name:"))
            .filter(|(_, line)| {
                let t = line.trim_start().trim_start_matches("- ").trim_start();
                t.starts_with(&needle)
                    || t.starts_with(&format!("{{ {needle}"))
                    || t.starts_with(&format!("{{{needle}"))
            })
            .nth(n)
            .map(|(i, _)| i + 1)
            .unwrap_or(start)
    }

    /// The first line at or after `from` (1-based; 0 = file start) that holds `key:`,
    /// falling back to `from` itself.
    fn key(&self, from: usize, key: &str) -> usize {
        let start = from.saturating_sub(1);
        let needle = format!("{key}:");
        let flow_needle = format!(" {key}:");
        self.text
            .lines()
            .enumerate()
            .skip(start)
            .take_while(|(i, line)| *i == start || !line.trim_start().starts_with("- name:"))
            .find(|(_, line)| {
                let t = line.trim_start().trim_start_matches("- ");
                t.starts_with(&needle)
                    || line.contains(&flow_needle)
                    || line.contains(&format!("{{{key}:"))
            })
            .map(|(i, _)| i + 1)
            .unwrap_or(from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_policy_is_valid() {
        let policy = Policy::from_yaml(DEFAULT_POLICY_YAML, "default-policy.yaml")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(policy.rules.len() >= 3);
        assert!(policy.exempt.namespaces.iter().any(|n| n == "kube-system"));
    }

    const BASE: &str = "rules:\n  - name: r1\n    match: { resources: [pods], operations: [DELETE] }\n    limit: { events: 5, window: 10s }\n    action: retry-after\n";

    /// A gate rule, for the network window's cases.
    const GATE: &str = "rules:\n  - name: g\n    match: { resources: [pods], operations: [CREATE] }\n    limit: { events: 5, window: 10s }\n    action: gate\n";

    #[test]
    fn the_network_window_is_there_when_a_rule_is_adaptive() {
        let plain = Policy::from_yaml(GATE, "p").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plain.network, None);
        let yaml = format!("{GATE}    maxNotReady: 5\n    adaptive: true\n");
        let adaptive = Policy::from_yaml(&yaml, "p").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(adaptive.network, Some(NetworkConfig::default()));
        assert!(adaptive.rules[0].adaptive);
        let builtin = Policy::builtin();
        assert!(builtin
            .network
            .is_some_and(|n| n.min_window == 2 && n.max_window == 200));
    }

    #[test]
    fn errors_name_line_and_problem() {
        // (case, yaml, expected line, text the message must contain)
        let cases: &[(&str, String, usize, &str)] = &[
            ("empty", "".into(), 0, "empty"),
            (
                "syntax",
                "rules: [\n  - name: x\n".into(),
                2,
                "did not find expected",
            ),
            (
                "unknown top-level key",
                format!("{BASE}limits: 3\n"),
                6,
                "unknown field `limits`",
            ),
            (
                "typo in rule",
                BASE.replace("action: retry-after", "actoin: retry-after"),
                5,
                "unknown field `actoin`",
            ),
            (
                "bad action",
                BASE.replace("retry-after", "slow-down"),
                5,
                "unknown action",
            ),
            ("bad window", BASE.replace("10s", "10"), 4, "no unit"),
            (
                "zero events",
                BASE.replace("events: 5", "events: 0"),
                4,
                "events is 0",
            ),
            (
                "zero burst",
                BASE.replace("events: 5", "events: 5, burst: 0"),
                4,
                "burst is 0, it must be 1 to events (5)",
            ),
            (
                "burst over events",
                BASE.replace("events: 5", "events: 5, burst: 6"),
                4,
                "burst is 6, it must be 1 to events (5)",
            ),
            (
                "gate on delete",
                BASE.replace("retry-after", "gate"),
                5,
                "gate applies only to pods CREATE",
            ),
            (
                "hold without maxHold",
                BASE.replace("retry-after", "hold"),
                5,
                "hold needs maxHold",
            ),
            (
                "maxHold too long",
                format!("{BASE}    maxHold: 6s\n"),
                6,
                "at most half of timeoutSeconds",
            ),
            (
                "unknown resource",
                BASE.replace("[pods]", "[deployments]"),
                3,
                "unknown resource",
            ),
            (
                "duplicate name",
                format!("{BASE}{}", BASE.replace("rules:\n", "")),
                2,
                "used twice",
            ),
            (
                "timeout",
                format!("timeoutSeconds: 31\n{BASE}"),
                1,
                "1 to 30",
            ),
            (
                "maxNotReady on retry-after",
                format!("{BASE}    maxNotReady: 3\n"),
                6,
                "maxNotReady applies",
            ),
            (
                "adaptive on retry-after",
                format!("{BASE}    adaptive: true\n"),
                6,
                "adaptive applies to gate and partition",
            ),
            (
                "adaptive without maxNotReady",
                format!("{GATE}    adaptive: true\n"),
                6,
                "adaptive needs maxNotReady",
            ),
            (
                "minWindow above maxWindow",
                format!("network:\n  minWindow: 10\n  maxWindow: 5\n{GATE}    maxNotReady: 5\n    adaptive: true\n"),
                2,
                "minWindow 10 is above maxWindow 5",
            ),
            (
                "minWindow zero",
                format!("network: {{ minWindow: 0 }}\n{GATE}"),
                1,
                "minWindow must be at least 1",
            ),
            (
                "malformed cron expression",
                format!("{BASE}    schedules:\n      - schedule: \"0 9 * *\"\n        duration: 8h\n        limit: {{ events: 0 }}\n"),
                7,
                "schedules[0]: schedule \"0 9 * *\": \"0 9 * *\" has 4 fields",
            ),
            (
                "second window's cron out of range",
                format!("{BASE}    schedules:\n      - schedule: \"0 9 * * 1-5\"\n        duration: 8h\n        limit: {{ events: 0 }}\n      - schedule: \"0 25 * * *\"\n        duration: 1h\n        limit: {{ events: 9 }}\n"),
                10,
                "schedules[1]: schedule \"0 25 * * *\": hour field: 25 is out of range 0-23",
            ),
            (
                "unknown time zone",
                format!("{BASE}    schedules:\n      - schedule: \"0 9 * * 1-5\"\n        timeZone: Europe/Berlinn\n        duration: 8h\n        limit: {{ events: 0 }}\n"),
                8,
                "unknown time zone \"Europe/Berlinn\"",
            ),
            (
                "window without a duration",
                format!("{BASE}    schedules:\n      - schedule: \"0 9 * * 1-5\"\n        limit: {{ events: 0 }}\n"),
                7,
                "schedules[0] has no duration",
            ),
            (
                "burst in a pause",
                format!("{BASE}    schedules:\n      - schedule: \"0 9 * * 1-5\"\n        duration: 8h\n        limit: {{ events: 0, burst: 1 }}\n"),
                9,
                "events: 0 is a pause",
            ),
            (
                "window and scope stay the rule's",
                format!("{BASE}    schedules:\n      - schedule: \"0 9 * * 1-5\"\n        duration: 8h\n        limit: {{ events: 3, window: 1m }}\n"),
                9,
                "unknown field `window`",
            ),
            (
                "maxNotReady in a window of a retry-after rule",
                format!("{BASE}    schedules:\n      - schedule: \"0 9 * * 1-5\"\n        duration: 8h\n        limit: {{ events: 3 }}\n        maxNotReady: 4\n"),
                10,
                "maxNotReady applies to gate and partition",
            ),
            (
                "unknown key under network",
                format!("network:\n  window: 5\n{GATE}"),
                2,
                "unknown field `window`",
            ),
        ];
        for (case, yaml, line, needle) in cases {
            match Policy::from_yaml(yaml, "policy.yaml") {
                Ok(_) => panic!("case {case}: expected an error"),
                Err(e) => {
                    assert_eq!(e.file, "policy.yaml", "case {case}");
                    assert_eq!(e.line, *line, "case {case}: {e}");
                    assert!(e.message.contains(needle), "case {case}: {e}");
                }
            }
        }
    }

    #[test]
    fn schedules_load_with_their_defaults() {
        let yaml = format!(
            "{BASE}    schedules:\n      - schedule: \"0 9 * * 1-5\"\n        timeZone: Europe/Berlin\n        \
             duration: 8h\n        limit: {{ events: 0 }}\n      - schedule: \"0 1 * * *\"\n        \
             duration: 3h\n        limit: {{ events: 50, burst: 5 }}\n"
        );
        let policy = Policy::from_yaml(&yaml, "p").unwrap_or_else(|e| panic!("{e}"));
        let windows = &policy.rules[0].schedules;
        assert_eq!(windows.len(), 2);
        assert_eq!(windows[0].zone_name, "Europe/Berlin");
        assert_eq!((windows[0].events, windows[0].burst), (0, None));
        assert_eq!(windows[1].zone_name, "UTC");
        assert_eq!(windows[1].duration, Duration::from_secs(3 * 3600));
        assert_eq!((windows[1].events, windows[1].burst), (50, Some(5)));
        // The built-in policy has none.
        assert!(Policy::builtin()
            .rules
            .iter()
            .all(|r| r.schedules.is_empty()));
    }

    #[test]
    fn limit_and_limits_combine() {
        let yaml =
            format!("{BASE}    limits:\n      - {{ events: 2, window: 1s, scope: namespace }}\n");
        let policy = Policy::from_yaml(&yaml, "p").unwrap_or_else(|e| panic!("{e}"));
        let rule = &policy.rules[0];
        assert_eq!(rule.limits.len(), 2);
        assert_eq!(rule.limits[0].scope, Scope::Global);
        assert_eq!(rule.limits[1].scope, Scope::Namespace);
        assert_eq!(rule.max_reserved_per_namespace, 5);
    }

    #[test]
    fn burst_defaults_to_two_and_events_means_a_plain_window() {
        let policy = Policy::from_yaml(BASE, "p").unwrap_or_else(|e| panic!("{e}"));
        let limit = policy.rules[0].limits[0];
        assert_eq!(limit.burst, DEFAULT_BURST);
        // 5 per 10 s: (10 s + 500 ms) / 5, the window kept with the margin.
        assert_eq!(limit.spacing_ms(), Some(2_100));
        assert_eq!(limit.kept_window_ms(), 10_500);
        let yaml = BASE.replace("events: 5", "events: 5, burst: 5");
        let policy = Policy::from_yaml(&yaml, "p").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy.rules[0].limits[0].burst, 5);
        assert_eq!(policy.rules[0].limits[0].spacing_ms(), None);
        // Faster than one per millisecond: not spaced (1 ms would cap it at 1,000 per
        // second), the plain window kept.
        let fast = Limit {
            events: 1_000_000,
            window: Duration::from_secs(10),
            scope: Scope::Global,
            burst: 2,
        };
        assert_eq!(fast.spacing_ms(), None);
        assert_eq!(fast.kept_window_ms(), 10_000);
        assert_eq!(policy.rules[0].limits[0].kept_window_ms(), 10_000);
    }
}
