//! What a simulation runs: the workload, the controllers' knobs, the limit, and the
//! policy each compared action stands for. Presets, YAML scenario files and CLI overrides.

use crate::limiter::Millis;
use crate::policy::{format_duration, parse_duration, Policy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// The ways of pacing that the simulator compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SimAction {
    /// No webhook at all: the baseline churn.
    None,
    Deny,
    RetryAfter,
    Hold,
    Gate,
    Partition,
}

impl SimAction {
    pub const ALL: [SimAction; 6] = [
        SimAction::None,
        SimAction::Deny,
        SimAction::RetryAfter,
        SimAction::Hold,
        SimAction::Gate,
        SimAction::Partition,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SimAction::None => "none",
            SimAction::Deny => "deny",
            SimAction::RetryAfter => "retry-after",
            SimAction::Hold => "hold",
            SimAction::Gate => "gate",
            SimAction::Partition => "partition",
        }
    }

    pub fn parse(text: &str) -> Result<SimAction, String> {
        SimAction::ALL
            .into_iter()
            .find(|a| a.as_str() == text.trim())
            .ok_or_else(|| {
                format!(
                    "unknown action {text:?}; use none, deny, retry-after, hold, gate or partition"
                )
            })
    }

    /// Which pod event the action's rule charges, for "peak paced events".
    pub fn paced_event(self) -> &'static str {
        match self {
            SimAction::None | SimAction::Deny | SimAction::RetryAfter | SimAction::Hold => {
                "deletion"
            }
            SimAction::Gate => "start",
            SimAction::Partition => "partition step",
        }
    }
}

/// A delay drawn per pod: `10s`, `uniform(15s, 25s)` or `lognormal(20s, 0.25)`
/// (median and sigma of the underlying normal).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dist {
    Fixed(Millis),
    Uniform(Millis, Millis),
    LogNormal { median: Millis, sigma: f64 },
}

impl Dist {
    /// `u` and `z`: a uniform draw in [0, 1) and a standard normal draw.
    pub fn sample(&self, u: f64, z: f64) -> Millis {
        match *self {
            Dist::Fixed(v) => v,
            Dist::Uniform(lo, hi) => lo + ((hi - lo) as f64 * u) as Millis,
            Dist::LogNormal { median, sigma } => {
                ((median as f64) * (sigma * z).exp()).round().max(0.0) as Millis
            }
        }
    }

    pub fn parse(text: &str) -> Result<Dist, String> {
        let text = text.trim();
        let ms = |t: &str| parse_duration(t.trim()).map(|d| d.as_millis() as Millis);
        let args = |prefix: &str| -> Option<Vec<&str>> {
            text.strip_prefix(prefix)?
                .strip_suffix(')')
                .map(|inner| inner.split(',').collect())
        };
        if let Some(a) = args("uniform(") {
            if a.len() != 2 {
                return Err(format!("{text:?}: uniform takes (min, max)"));
            }
            let (lo, hi) = (ms(a[0])?, ms(a[1])?);
            if hi < lo {
                return Err(format!("{text:?}: max is below min"));
            }
            return Ok(Dist::Uniform(lo, hi));
        }
        if let Some(a) = args("lognormal(") {
            if a.len() != 2 {
                return Err(format!("{text:?}: lognormal takes (median, sigma)"));
            }
            let sigma: f64 = a[1]
                .trim()
                .parse()
                .map_err(|_| format!("{text:?}: sigma is not a number"))?;
            if !(0.0..=3.0).contains(&sigma) {
                return Err(format!("{text:?}: sigma must be between 0 and 3"));
            }
            return Ok(Dist::LogNormal {
                median: ms(a[0])?,
                sigma,
            });
        }
        ms(text).map(Dist::Fixed).map_err(|e| {
            format!("{e}; a delay is a duration, uniform(min, max) or lognormal(median, sigma)")
        })
    }
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = |ms: Millis| format_duration(Duration::from_millis(ms));
        match *self {
            Dist::Fixed(v) => write!(f, "{}", d(v)),
            Dist::Uniform(lo, hi) => write!(f, "uniform({}, {})", d(lo), d(hi)),
            Dist::LogNormal { median, sigma } => write!(f, "lognormal({}, {sigma})", d(median)),
        }
    }
}

/// A scenario as written in YAML; every field has the mysql-300 default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ScenarioFile {
    pub name: String,
    pub seed: u64,
    /// Throttled StatefulSets (in opted-in namespaces), all updated at t = 0.
    pub statefulsets: u32,
    pub replicas: u32,
    /// The throttled StatefulSets are spread round-robin over this many namespaces.
    pub namespaces: u32,
    /// Throttled Deployments (rolling update, maxSurge/maxUnavailable), updated at t = 0.
    pub deployments: u32,
    pub deployment_replicas: u32,
    pub max_surge: u32,
    pub max_unavailable: u32,
    /// Old pod's termination (deletion to gone).
    pub terminate: String,
    /// New pod's start (scheduled to Ready).
    pub start: String,
    /// "20/10s": events per window, global scope; "20/10s,burst=20" sets the burst
    /// (default: the policy's, 1).
    pub limit: String,
    pub max_hold: String,
    pub max_retry_after: String,
    /// Released pods not yet Ready, for gate and partition; 0 for no cap.
    pub max_not_ready: u32,
    /// deny, retry-after and hold also pace pod creations (a second rule, same limit,
    /// same action); otherwise they pace deletions only.
    pub pace_creates: bool,
    /// deny, retry-after and hold pace the deletions, and pod creations start behind the
    /// gate (a gate rule, same limit), as the built-in policy and tests/e2e/run.sh do.
    pub gate_creates: bool,
    /// StatefulSet controller workers (kube-controller-manager --concurrent-statefulset-syncs).
    pub workers: u32,
    /// ReplicaSet/Deployment controller workers.
    pub deployment_workers: u32,
    /// client-go retries on 429 with Retry-After.
    pub max_retries: u32,
    /// One API round trip (webhook included), for every request.
    pub api_latency: String,
    /// The controller client's token bucket (kube-controller-manager --kube-api-qps/-burst); 0 = off.
    pub client_qps: f64,
    pub client_burst: u32,
    /// The work queue's overall bucket (client-go default 10 qps, burst 100); 0 = off.
    pub queue_qps: f64,
    pub queue_burst: u32,
    /// Work-queue per-item backoff: base doubling up to max.
    pub backoff_base: String,
    pub backoff_max: String,
    /// An unthrottled StatefulSet (unlabelled namespace) rolling at the same time.
    pub collateral: bool,
    pub collateral_replicas: u32,
    /// When the unthrottled StatefulSet is updated (it queues behind the operator's burst).
    pub collateral_at: String,
    pub actions: Vec<String>,
    /// "model": the simulator's incremental releasers (fast at any scale); "real": each
    /// round calls the releaser's own pure plans, `pacing::gate::plan` and
    /// `pacing::partition::plan_steps` (cost grows with queue × rounds).
    pub releasers: String,
    /// Simulated time after which a run stops unconverged; 0 = 100 × ideal + 1h.
    pub horizon: String,
    /// Policy YAML per action name, replacing the generated one.
    pub policies: BTreeMap<String, String>,
    /// The network: one FIFO CNI wiring bound pods one after another at this many pods
    /// per second, "0.5/s", or changing over time, "10/s,1/s@60s"; empty: no network
    /// model (a pod's `start` runs from its binding).
    pub cni_rate: String,
    /// With `cniRate`: from wired to network-ready (then `start` runs to Ready).
    pub cni_base: String,
    /// The gate and partition rules are adaptive: they share the network window fed by
    /// the pods' network-ready times (needs `cniRate` and `maxNotReady`).
    pub adaptive: bool,
}

impl Default for ScenarioFile {
    fn default() -> Self {
        ScenarioFile {
            name: "mysql-300".into(),
            seed: 1,
            statefulsets: 300,
            replicas: 3,
            namespaces: 300,
            deployments: 0,
            deployment_replicas: 10,
            max_surge: 1,
            max_unavailable: 0,
            terminate: "10s".into(),
            start: "lognormal(20s, 0.2)".into(),
            limit: "20/10s".into(),
            max_hold: "5s".into(),
            max_retry_after: "30s".into(),
            max_not_ready: 200,
            pace_creates: false,
            gate_creates: false,
            workers: 5,
            deployment_workers: 5,
            max_retries: 10,
            api_latency: "10ms".into(),
            client_qps: 20.0,
            client_burst: 30,
            queue_qps: 10.0,
            queue_burst: 100,
            backoff_base: "5ms".into(),
            backoff_max: "1000s".into(),
            collateral: true,
            collateral_replicas: 3,
            collateral_at: "0s".into(),
            actions: SimAction::ALL
                .iter()
                .map(|a| a.as_str().to_string())
                .collect(),
            releasers: "model".into(),
            horizon: "0s".into(),
            policies: BTreeMap::new(),
            cni_rate: String::new(),
            cni_base: "2s".into(),
            adaptive: false,
        }
    }
}

pub const PRESETS: [&str; 3] = ["mysql-300", "huge-10k", "e2e"];

impl ScenarioFile {
    pub fn preset(name: &str) -> Result<ScenarioFile, String> {
        let base = ScenarioFile::default();
        match name {
            // The case the project exists for: an operator upgrade re-creates 300 MySQL
            // StatefulSets × 3 at once; pods terminate in 10 s and are Ready in about 20 s.
            "mysql-300" => Ok(base),
            "huge-10k" => Ok(ScenarioFile {
                name: "huge-10k".into(),
                statefulsets: 10_000,
                namespaces: 10_000,
                ..base
            }),
            // tests/e2e/run.sh's mass rollout with its CI defaults (E2E_STS=100 in
            // E2E_NAMESPACES=10, E2E_LIMIT_EVENTS=50 per 10 s, maxNotReady = the limit,
            // deletions paced by deny/retry-after/hold and creations by the gate, kube-controller-manager
            // --kube-api-qps 200 --kube-api-burst 400); kwok makes pods Ready within about
            // a second and finishes deletions almost at once.
            "e2e" => Ok(ScenarioFile {
                name: "e2e".into(),
                statefulsets: 100,
                namespaces: 10,
                terminate: "uniform(100ms, 500ms)".into(),
                start: "uniform(500ms, 1500ms)".into(),
                limit: "50/10s".into(),
                max_not_ready: 50,
                max_retry_after: "60s".into(),
                gate_creates: true,
                client_qps: 200.0,
                client_burst: 400,
                ..base
            }),
            other => Err(format!(
                "unknown preset {other:?}; presets: {}",
                PRESETS.join(", ")
            )),
        }
    }

    pub fn from_yaml(text: &str) -> Result<ScenarioFile, String> {
        serde_yaml::from_str(text).map_err(|e| e.to_string())
    }

    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).unwrap_or_default()
    }

    /// Checks and converts into what the model runs.
    pub fn build(&self) -> Result<Scenario, String> {
        let ms = |field: &str, text: &str| {
            parse_duration(text)
                .map(|d| d.as_millis() as Millis)
                .map_err(|e| format!("{field}: {e}"))
        };
        let (limit, burst) = match self.limit.split_once(',') {
            Some((limit, burst)) => {
                let n = burst
                    .trim()
                    .strip_prefix("burst=")
                    .and_then(|n| n.parse::<u32>().ok())
                    .ok_or_else(|| {
                        format!("limit {:?}: write events/window,burst=N", self.limit)
                    })?;
                (limit, Some(n))
            }
            None => (self.limit.as_str(), None),
        };
        let (events, window) = parse_limit(limit)?;
        if burst.is_some_and(|b| b == 0 || b > events) {
            return Err(format!("limit {:?}: burst must be 1 to events", self.limit));
        }
        if self.replicas == 0 || self.replicas > 1000 {
            return Err("replicas must be 1 to 1000".into());
        }
        if self.statefulsets + self.deployments == 0 {
            return Err("nothing to roll: statefulsets and deployments are both 0".into());
        }
        if self.workers == 0 || self.deployment_workers == 0 {
            return Err("workers must be at least 1".into());
        }
        if self.deployments > 0 && self.max_surge == 0 && self.max_unavailable == 0 {
            return Err("maxSurge and maxUnavailable cannot both be 0".into());
        }
        let mut actions = Vec::new();
        for a in &self.actions {
            let action = SimAction::parse(a)?;
            if !actions.contains(&action) {
                actions.push(action);
            }
        }
        if actions.is_empty() {
            return Err("no actions to compare".into());
        }
        if self.pace_creates && self.gate_creates {
            return Err("paceCreates and gateCreates: choose one way to pace creations".into());
        }
        let real_releasers = match self.releasers.as_str() {
            "model" => false,
            "real" => true,
            other => return Err(format!("releasers {other:?}: use model or real")),
        };
        for key in self.policies.keys() {
            SimAction::parse(key).map_err(|e| format!("policies: {e}"))?;
        }
        let cni = if self.cni_rate.trim().is_empty() {
            if self.adaptive {
                return Err("adaptive needs a network model: give cniRate".into());
            }
            None
        } else {
            Some(Cni {
                rates: parse_cni_rate(&self.cni_rate)?,
                base: ms("cniBase", &self.cni_base)?,
            })
        };
        if self.adaptive && self.max_not_ready == 0 {
            return Err("adaptive needs maxNotReady (the outer cap on pods not Ready)".into());
        }
        let sc = Scenario {
            file: self.clone(),
            statefulsets: self.statefulsets,
            replicas: self.replicas,
            namespaces: self
                .namespaces
                .clamp(1, self.statefulsets.max(self.deployments).max(1)),
            deployments: self.deployments,
            deployment_replicas: self.deployment_replicas.max(1),
            max_surge: self.max_surge,
            max_unavailable: self.max_unavailable,
            terminate: Dist::parse(&self.terminate).map_err(|e| format!("terminate: {e}"))?,
            start: Dist::parse(&self.start).map_err(|e| format!("start: {e}"))?,
            events,
            window,
            burst,
            max_hold: ms("maxHold", &self.max_hold)?,
            max_retry_after: ms("maxRetryAfter", &self.max_retry_after)?,
            max_not_ready: self.max_not_ready,
            workers: self.workers,
            deployment_workers: self.deployment_workers,
            max_retries: self.max_retries,
            api_latency: ms("apiLatency", &self.api_latency)?,
            client_qps: self.client_qps.max(0.0),
            client_burst: self.client_burst.max(1),
            queue_qps: self.queue_qps.max(0.0),
            queue_burst: self.queue_burst.max(1),
            backoff_base: ms("backoffBase", &self.backoff_base)?.max(1),
            backoff_max: ms("backoffMax", &self.backoff_max)?.max(1),
            collateral: self.collateral,
            collateral_replicas: self.collateral_replicas.max(1),
            collateral_at: ms("collateralAt", &self.collateral_at)?,
            actions,
            real_releasers,
            cni,
            adaptive: self.adaptive,
            horizon: ms("horizon", &self.horizon)?,
            seed: self.seed,
            schedules: None,
        };
        // Every generated policy must pass the real validation.
        for action in &sc.actions {
            sc.policy(*action)?;
        }
        Ok(sc)
    }
}

/// "20/10s" -> (20, 10 000 ms).
pub fn parse_limit(text: &str) -> Result<(u32, Millis), String> {
    let (events, window) = text
        .split_once('/')
        .ok_or_else(|| format!("limit {text:?}: write events/window, e.g. 20/10s"))?;
    let events: u32 = events
        .trim()
        .parse()
        .map_err(|_| format!("limit {text:?}: events is not a number"))?;
    let window = parse_duration(window)
        .map_err(|e| format!("limit {text:?}: {e}"))?
        .as_millis() as Millis;
    if events == 0 || window == 0 {
        return Err(format!(
            "limit {text:?}: events and window must be positive"
        ));
    }
    Ok((events, window))
}

/// "10/s,1/s@60s" -> [(0, 10.0), (60 000, 1.0)]: pods per second from each time on.
pub fn parse_cni_rate(text: &str) -> Result<Vec<(Millis, f64)>, String> {
    let mut rates: Vec<(Millis, f64)> = Vec::new();
    for part in text.split(',') {
        let (rate, from) = match part.split_once('@') {
            Some((rate, at)) => (
                rate,
                parse_duration(at.trim())
                    .map_err(|e| format!("cniRate {text:?}: {e}"))?
                    .as_millis() as Millis,
            ),
            None => (part, 0),
        };
        let per_s: f64 = rate
            .trim()
            .strip_suffix("/s")
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| format!("cniRate {text:?}: write pods/s, e.g. 0.5/s or 10/s,1/s@60s"))?;
        if !(per_s > 0.0 && per_s <= 100_000.0) {
            return Err(format!(
                "cniRate {text:?}: a rate is above 0 and at most 100000/s"
            ));
        }
        if rates.last().is_some_and(|&(t, _)| t >= from) || (rates.is_empty() && from != 0) {
            return Err(format!(
                "cniRate {text:?}: the first rate holds from 0, each later one from a later @time"
            ));
        }
        rates.push((from, per_s));
    }
    Ok(rates)
}

/// The modelled network: one FIFO CNI.
#[derive(Debug, Clone, PartialEq)]
pub struct Cni {
    /// Pods wired per second, from each time on (the first from 0).
    pub rates: Vec<(Millis, f64)>,
    /// From wired to network-ready.
    pub base: Millis,
}

impl Cni {
    /// Pods per second at `at`.
    pub fn rate_at(&self, at: Millis) -> f64 {
        self.rates
            .iter()
            .rev()
            .find(|&&(from, _)| from <= at)
            .map_or(1.0, |&(_, r)| r)
    }

    /// When a pod whose wiring begins at `at` is wired (the rate when it begins).
    pub fn wired(&self, at: Millis) -> Millis {
        at + (1000.0 / self.rate_at(at)).round().max(1.0) as Millis
    }
}

/// A checked scenario, times in milliseconds.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub file: ScenarioFile,
    pub statefulsets: u32,
    pub replicas: u32,
    pub namespaces: u32,
    pub deployments: u32,
    pub deployment_replicas: u32,
    pub max_surge: u32,
    pub max_unavailable: u32,
    pub terminate: Dist,
    pub start: Dist,
    pub events: u32,
    pub window: Millis,
    /// The limit's burst; None: the policy's default.
    pub burst: Option<u32>,
    pub max_hold: Millis,
    pub max_retry_after: Millis,
    pub max_not_ready: u32,
    pub workers: u32,
    pub deployment_workers: u32,
    pub max_retries: u32,
    pub api_latency: Millis,
    pub client_qps: f64,
    pub client_burst: u32,
    pub queue_qps: f64,
    pub queue_burst: u32,
    pub backoff_base: Millis,
    pub backoff_max: Millis,
    pub collateral: bool,
    pub collateral_replicas: u32,
    pub collateral_at: Millis,
    pub actions: Vec<SimAction>,
    pub real_releasers: bool,
    /// None: no network model.
    pub cni: Option<Cni>,
    pub adaptive: bool,
    pub horizon: Millis,
    pub seed: u64,
    /// `--policy FILE --start-time TIME`: the file's schedule windows, laid on the
    /// generated rules, and the wall time of the simulated clock's zero (epoch ms).
    pub schedules: Option<Schedules>,
}

/// Schedule windows for the simulated rules: each generated rule takes those of the
/// file's first rule with the same action.
#[derive(Debug, Clone)]
pub struct Schedules {
    pub policy: Policy,
    pub start: Millis,
}

pub const STATEFULSET_CONTROLLER: &str = "system:serviceaccount:kube-system:statefulset-controller";
pub const REPLICASET_CONTROLLER: &str = "system:serviceaccount:kube-system:replicaset-controller";
pub const OPERATOR: &str = "system:serviceaccount:operator-system:operator";
pub const RELEASER: &str = "system:serviceaccount:churn-throttler:churn-throttler";

impl Scenario {
    /// Pods re-created by the throttled workloads: one paced event each.
    pub fn paced_pods(&self) -> u64 {
        self.statefulsets as u64 * self.replicas as u64
            + self.deployments as u64 * self.deployment_replicas as u64
    }

    /// events / rate: the least time the limit allows for all re-creations.
    pub fn ideal_ms(&self) -> Millis {
        self.paced_pods() * self.window / self.events as u64
    }

    pub fn horizon_ms(&self) -> Millis {
        if self.horizon > 0 {
            self.horizon
        } else {
            self.ideal_ms().saturating_mul(100) + 3_600_000
        }
    }

    /// The policy an action stands for: the built-in policy's shape with this limit.
    pub fn policy(&self, action: SimAction) -> Result<Policy, String> {
        let mut policy = self.generated_policy(action)?;
        if let Some(schedules) = &self.schedules {
            for rule in &mut policy.rules {
                if let Some(from) = schedules
                    .policy
                    .rules
                    .iter()
                    .find(|r| r.action == rule.action && !r.schedules.is_empty())
                {
                    rule.schedules = from.schedules.clone();
                }
            }
        }
        Ok(policy)
    }

    fn generated_policy(&self, action: SimAction) -> Result<Policy, String> {
        let yaml = match self.file.policies.get(action.as_str()) {
            Some(text) => text.clone(),
            None => self.policy_yaml(action),
        };
        Policy::from_yaml(&yaml, &format!("<policy for {}>", action.as_str()))
            .map_err(|e| e.to_string())
    }

    pub fn policy_yaml(&self, action: SimAction) -> String {
        let limit = format!(
            "{{ events: {}, window: {}, scope: global{} }}",
            self.events,
            format_duration(Duration::from_millis(self.window)),
            self.burst
                .map(|b| format!(", burst: {b}"))
                .unwrap_or_default()
        );
        let mut max_not_ready = if self.max_not_ready > 0 {
            format!("\n    maxNotReady: {}", self.max_not_ready)
        } else {
            String::new()
        };
        if self.adaptive {
            max_not_ready += "\n    adaptive: true";
        }
        let deletes = |action: &str, extra: &str| {
            format!(
                "  - name: controller-deletes\n    match:\n      resources: [pods]\n      operations: [DELETE]\n      \
                 users: [{STATEFULSET_CONTROLLER}, {REPLICASET_CONTROLLER}]\n    limit: {limit}\n    action: {action}{extra}\n"
            )
        };
        let creates = |name: &str, kinds: &str| {
            format!(
                "  - name: {name}\n    match:\n      resources: [pods]\n      operations: [CREATE]\n      \
                 controllerKinds: [{kinds}]\n    limit: {limit}\n    action: gate{max_not_ready}\n"
            )
        };
        let d = |ms: Millis| format_duration(Duration::from_millis(ms));
        let deletes = |action: &str, extra: &str| {
            let mut rules = deletes(action, extra);
            if self.file.gate_creates {
                rules += &creates("paced-creates", "StatefulSet, ReplicaSet");
            } else if self.file.pace_creates {
                rules += &format!(
                    "  - name: paced-creates\n    match:\n      resources: [pods]\n      operations: [CREATE]\n      \
                     controllerKinds: [StatefulSet, ReplicaSet]\n    limit: {limit}\n    action: {action}{extra}\n"
                );
            }
            rules
        };
        let rules = match action {
            SimAction::None => String::new(),
            SimAction::Deny => deletes("deny", ""),
            SimAction::RetryAfter => deletes(
                "retry-after",
                &format!("\n    maxRetryAfter: {}", d(self.max_retry_after)),
            ),
            SimAction::Hold => deletes(
                "hold",
                &format!(
                    "\n    maxHold: {}\n    maxRetryAfter: {}",
                    d(self.max_hold),
                    d(self.max_retry_after)
                ),
            ),
            // With the network modelled, the built-in policy's two gate rules, which
            // share the one network window when adaptive.
            SimAction::Gate if self.cni.is_some() => format!(
                "{}{}",
                creates("statefulset-creates", "StatefulSet"),
                creates("controller-creates", "ReplicaSet")
            ),
            SimAction::Gate => creates("controller-creates", "StatefulSet, ReplicaSet"),
            // The built-in policy's shapes: steps paced by the partition rule, the
            // replacements' starts by a gate rule of their own.
            SimAction::Partition => format!(
                "  - name: statefulset-rollouts\n    match:\n      resources: [statefulsets]\n      operations: [UPDATE]\n    \
                 limit: {limit}\n    action: partition{max_not_ready}\n{}{}",
                creates("statefulset-creates", "StatefulSet"),
                creates("controller-creates", "ReplicaSet")
            ),
        };
        let rules = if rules.is_empty() {
            "rules: []\n".to_string()
        } else {
            format!("rules:\n{rules}")
        };
        format!(
            "timeoutSeconds: 10\n{rules}exempt:\n  namespaces: [kube-system]\n  users: [{RELEASER}]\n"
        )
    }
}
