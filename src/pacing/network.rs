//! The closed-loop network window: how many released pods may be waiting for their
//! network at once, sized from what the pods' network-readiness shows. Pure: samples and
//! their times in, a window out; nothing here reads a clock.
//!
//! The signal is a pod's network time: from its binding to its `PodReadyToStartContainers`
//! condition (the sandbox and its network are up), or release -> Ready where the condition
//! never comes. A pod still not there after `bound` is a sample *at the bound* (censored,
//! never dropped: leaving it out would hide the worst congestion).
//!
//! Sized like BBR (docs/adaptive.md): the window is the rate at which pods become
//! network-ready times the unloaded network time (the bandwidth-delay product), plus a
//! small headroom. Per top-level workload the unloaded time (the floor) is the least
//! network time seen over a sliding period. The window starts small and grows by one per
//! sample while the network time stays near its floor (doubling per round trip, as a slow
//! start does); once a queue shows, it is set to the bandwidth-delay product and from then
//! on follows it, probing 25 % above while no queue shows. It changes only when a sample
//! arrives: a missing signal (nothing starting, a watch down) never grows it. A floor
//! older than half its period is re-measured by halving the window for two floors (as
//! BBR's ProbeRTT drains its queue), so a standing queue cannot become the floor.

use crate::limiter::Millis;
pub use crate::policy::NetworkConfig;
use std::collections::{HashMap, VecDeque};

/// Pods above the bandwidth-delay product: one being wired and one waiting keep the
/// network busy without a queue that grows.
pub const HEADROOM: f64 = 1.0;

/// Partition steps may keep this many windows of replacement pods released or gated: a
/// step's replacement reaches the network only after its old pod has terminated and it
/// has waited behind the gate, a pipeline longer than the network's own by the
/// termination (10 s against a 2-4 s network time in the simulator's sweep). Steps that
/// counted the gated pods against one window could never keep the network busy: their
/// makespan was 1.1-1.3x the fixed window's at every C; with two windows 1.06-1.17x; with
/// four 1.00-1.07x (docs/adaptive.md). Four windows still bound the pods deleted and not
/// re-created by the window, not by the rollout's size (as BBR's congestion window is a
/// gain over its bandwidth-delay product).
pub const STEP_ROOM_GAIN: u32 = 4;

/// A window with nothing recorded starts here (within the bounds), not at `minWindow`: a
/// fresh start knows nothing of the network, and starting at the floor cost a small
/// rollout a whole round trip of slow start (30 pods at 2 pods/s on the real control
/// plane: 21.9 s against 19.0 s with the fixed window). Four is what the data plane's
/// own defaults take at once without a queue (Cilium's endpoint-create limiter: burst 4,
/// 4 in parallel), as TCP starts above one segment (RFC 6928).
pub const INITIAL_WINDOW: u32 = 4;

/// While no queue shows, the window probes this far above the bandwidth-delay product.
pub const PROBE_GAIN: f64 = 1.25;

/// A sample whose network time exceeds its floor by more than this share of the floor
/// (and by at least `QUEUE_MIN_MS`) shows a queue.
pub const QUEUE_SHARE: f64 = 0.25;
pub const QUEUE_MIN_MS: Millis = 500;

/// Slow start ends at a smaller rise than a queue in steady state: an eighth of the floor
/// (and at least `SLOW_START_EXIT_MIN_MS`, above the watch's jitter), as HyStart++ leaves
/// slow start on a round trip an eighth above the last (RFC 9406). The slow start's
/// signal comes a round trip late, while the window doubles per round trip: waiting for
/// the steady-state threshold let 9 pods queue at 2 pods/s in the simulator (target 5),
/// this exit 3.
pub const SLOW_START_EXIT_SHARE: f64 = 0.125;
pub const SLOW_START_EXIT_MIN_MS: Millis = 250;

/// The delivery rate is counted over at least this long (and over four floors).
pub const RATE_SPAN_MIN_MS: Millis = 10_000;

/// Samples the p90 is taken over.
const RECENT: usize = 32;

/// At most this many workloads keep a floor; the stalest go first.
const MAX_WORKLOADS: usize = 4_096;

/// A workload's own floor is trusted once it has this many samples in the period; until
/// then its samples are judged against the least floor any workload shows. A workload's
/// first pods may all come through a congested network: judged against themselves they
/// could never show the queue (many small workloads, each with a few pods, would let
/// the window grow while the queue grows).
pub const FLOOR_SAMPLES: u32 = 4;

/// One pod's network time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The top-level workload (the Deployment or StatefulSet, not the ReplicaSet).
    pub workload: String,
    /// When the pod was bound to its node (or released, in the fallback).
    pub started: Millis,
    /// When its network was seen up; for a censored sample, `started + bound`.
    pub ready: Millis,
    pub censored: bool,
}

impl Sample {
    pub fn latency(&self) -> Millis {
        self.ready.saturating_sub(self.started)
    }
}

/// Why the window last changed, for metrics, `status` and Events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// Nothing measured yet: the starting value.
    Start,
    /// Growing by one per sample, network time at its floor.
    SlowStart,
    /// A queue showed: set to the bandwidth-delay product.
    Queue,
    /// Following the bandwidth-delay product, probing above it.
    Probe,
    /// Halved for a while so that the floor is measured again.
    Remeasure,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Start => "start",
            Change::SlowStart => "slow-start",
            Change::Queue => "queue",
            Change::Probe => "probe",
            Change::Remeasure => "remeasure",
        }
    }

    pub const ALL: [Change; 5] = [
        Change::Start,
        Change::SlowStart,
        Change::Queue,
        Change::Probe,
        Change::Remeasure,
    ];
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    SlowStart,
    Steady,
    /// From `from` until `until` (sample times) the window is held at half the product, so
    /// that `workload`'s floor is measured again.
    Remeasure {
        workload: String,
        from: Millis,
        until: Millis,
    },
}

/// The least network time of one workload over the floor period: a monotonic deque of
/// (time, latency), increasing in latency, so the front is the minimum.
#[derive(Debug, Clone, Default)]
struct Floor {
    mins: VecDeque<(Millis, Millis)>,
    /// Samples seen (saturating): the floor is the workload's own from `FLOOR_SAMPLES` on.
    samples: u32,
}

impl Floor {
    fn push(&mut self, at: Millis, latency: Millis, period: Millis) {
        self.samples = self.samples.saturating_add(1);
        while self.mins.back().is_some_and(|&(_, l)| l >= latency) {
            self.mins.pop_back();
        }
        self.mins.push_back((at, latency));
        while self
            .mins
            .front()
            .is_some_and(|&(t, _)| t.saturating_add(period) < at)
        {
            self.mins.pop_front();
        }
    }

    fn value(&self) -> Option<(Millis, Millis)> {
        self.mins.front().copied()
    }

    /// After a re-measure: only what was seen since `from` counts; with nothing seen, the
    /// old floor stands, dated `from` (measured again, found no lower).
    fn restart_from(&mut self, from: Millis) {
        let old = self.value();
        self.mins.retain(|&(t, _)| t >= from);
        if let (true, Some((_, latency))) = (self.mins.is_empty(), old) {
            self.mins.push_back((from, latency));
        }
    }
}

/// What the window shows of itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetworkStatus {
    pub window: u32,
    /// The floor of the last sample's workload.
    pub floor_ms: Option<Millis>,
    /// The 90th percentile of the recent samples' network time.
    pub p90_ms: Option<Millis>,
    /// Pods becoming network-ready per second, lately.
    pub rate_per_s: f64,
    pub last_change: Change,
    /// The last change cut the window to half or less.
    pub cut_hard: bool,
}

#[derive(Debug, Clone)]
pub struct NetworkWindow {
    config: NetworkConfig,
    window: f64,
    phase: Phase,
    floors: HashMap<String, Floor>,
    /// Ready times of recent samples, for the delivery rate.
    delivered: VecDeque<Millis>,
    /// (latency, its workload's floor) of the last samples.
    recent: VecDeque<(Millis, Millis)>,
    last_floor: Option<Millis>,
    last_change: Change,
    cut_hard: bool,
    /// The latest sample time seen: samples are taken in any order, time never goes back.
    clock: Millis,
}

impl NetworkWindow {
    /// A window at `start` (the last leader's value, from the Lease), else at
    /// `INITIAL_WINDOW`, within the bounds.
    pub fn new(config: NetworkConfig, start: Option<u32>) -> NetworkWindow {
        let start = start
            .unwrap_or(INITIAL_WINDOW)
            .clamp(config.min_window, config.max_window.max(config.min_window));
        NetworkWindow {
            config,
            window: f64::from(start),
            phase: Phase::SlowStart,
            floors: HashMap::new(),
            delivered: VecDeque::new(),
            recent: VecDeque::new(),
            last_floor: None,
            last_change: Change::Start,
            cut_hard: false,
            clock: 0,
        }
    }

    pub fn config(&self) -> NetworkConfig {
        self.config
    }

    /// A changed policy: new bounds, the window kept within them.
    pub fn reconfigure(&mut self, config: NetworkConfig) {
        self.config = config;
        self.window = self.clamp(self.window);
    }

    /// Pods that may be released and not network-ready at once.
    pub fn window(&self) -> u32 {
        self.window.floor() as u32
    }

    /// How many more may go with `in_flight` released and not network-ready.
    pub fn room(&self, in_flight: u32) -> u32 {
        self.window().saturating_sub(in_flight)
    }

    fn clamp(&self, w: f64) -> f64 {
        let max = self.config.max_window.max(self.config.min_window);
        w.clamp(f64::from(self.config.min_window), f64::from(max))
    }

    /// Pods network-ready per second over the last span (at least `RATE_SPAN_MIN_MS`
    /// and four floors), ending at the latest sample: the intervals between the samples
    /// in it (n samples span n - 1 intervals; counting n would overstate a slow rate by
    /// half with three samples), one sample per floor while there is only one.
    fn rate_per_s(&self, floor: Millis) -> f64 {
        let span = RATE_SPAN_MIN_MS.max(floor.saturating_mul(4));
        let from = self.clock.saturating_sub(span);
        let mut inside = self.delivered.iter().filter(|&&t| t > from);
        let Some(&first) = inside.next() else {
            return 0.0;
        };
        let n = 1 + inside.count();
        if n == 1 {
            return 1000.0 / floor.max(1) as f64;
        }
        (n - 1) as f64 * 1000.0 / self.clock.saturating_sub(first).max(1) as f64
    }

    fn p90(&self) -> Option<Millis> {
        if self.recent.is_empty() {
            return None;
        }
        let mut l: Vec<Millis> = self.recent.iter().map(|&(l, _)| l).collect();
        l.sort_unstable();
        Some(l[(l.len() * 9).div_ceil(10).saturating_sub(1)])
    }

    fn queued(latency: Millis, floor: Millis) -> bool {
        let allowed = ((floor as f64 * QUEUE_SHARE) as Millis).max(QUEUE_MIN_MS);
        latency > floor.saturating_add(allowed)
    }

    fn leaves_slow_start(latency: Millis, floor: Millis) -> bool {
        let allowed =
            ((floor as f64 * SLOW_START_EXIT_SHARE) as Millis).max(SLOW_START_EXIT_MIN_MS);
        latency > floor.saturating_add(allowed)
    }

    /// One pod's network time (or its censored bound). The only place the window moves.
    pub fn observe(&mut self, sample: &Sample) {
        let at = sample.ready.max(self.clock);
        self.clock = at;
        let latency = sample.latency().min(self.config.bound_ms);
        let period = self.config.floor_period_ms;
        if !self.floors.contains_key(&sample.workload) && self.floors.len() >= MAX_WORKLOADS {
            self.forget_stalest();
        }
        // A censored sample of a workload never seen is judged against the least floor
        // anyone shows, or the bound itself.
        let fallback = self.any_floor();
        let floor_entry = self.floors.entry(sample.workload.clone()).or_default();
        if !sample.censored {
            floor_entry.push(at, latency, period);
        }
        let (floor_at, floor) = match floor_entry.value() {
            Some((t, own)) if floor_entry.samples >= FLOOR_SAMPLES => (t, own),
            // Not established yet: the least floor anyone shows (its own included).
            Some((t, own)) => (t, own.min(fallback)),
            None => (at, fallback),
        };
        self.last_floor = Some(floor);
        if !sample.censored {
            self.delivered.push_back(at);
        }
        let span = RATE_SPAN_MIN_MS.max(floor.saturating_mul(4));
        while self
            .delivered
            .front()
            .is_some_and(|&t| t.saturating_add(span) < at)
        {
            self.delivered.pop_front();
        }
        self.recent.push_back((latency, floor));
        if self.recent.len() > RECENT {
            self.recent.pop_front();
        }
        let queued = sample.censored
            || Self::queued(latency, floor)
            || (self.phase == Phase::SlowStart && Self::leaves_slow_start(latency, floor));
        let product = self.rate_per_s(floor) * floor as f64 / 1000.0;
        let before = self.window;
        if let Phase::Remeasure {
            workload,
            from,
            until,
        } = &self.phase
        {
            if at < *until {
                return;
            }
            if let Some(f) = self.floors.get_mut(workload) {
                f.restart_from(*from);
            }
            self.phase = Phase::Steady;
        }
        if self.phase == Phase::SlowStart && !queued {
            self.window += 1.0;
            self.last_change = Change::SlowStart;
        } else if queued {
            self.window = self.window.min(product + HEADROOM);
            self.phase = Phase::Steady;
            self.last_change = Change::Queue;
        } else if at.saturating_sub(floor_at) > period / 2 {
            self.window = self.window.min((product / 2.0).max(1.0));
            self.phase = Phase::Remeasure {
                workload: sample.workload.clone(),
                from: at,
                until: at.saturating_add(floor.saturating_mul(2)),
            };
            self.last_change = Change::Remeasure;
        } else {
            let target = PROBE_GAIN * product + HEADROOM;
            self.window = (self.window + 1.0).min(target.max(self.window));
            self.last_change = Change::Probe;
        }
        self.window = self.clamp(self.window);
        self.cut_hard = self.window <= before / 2.0 && self.window < before;
    }

    /// The least floor any workload shows, else the bound.
    fn any_floor(&self) -> Millis {
        self.floors
            .values()
            .filter_map(|f| f.value().map(|(_, l)| l))
            .min()
            .unwrap_or(self.config.bound_ms)
    }

    fn forget_stalest(&mut self) {
        let stalest = self
            .floors
            .iter()
            .min_by_key(|(_, f)| f.mins.back().map_or(0, |&(t, _)| t))
            .map(|(k, _)| k.clone());
        if let Some(k) = stalest {
            self.floors.remove(&k);
        }
    }

    pub fn status(&self) -> NetworkStatus {
        NetworkStatus {
            window: self.window(),
            floor_ms: self.last_floor,
            p90_ms: self.p90(),
            rate_per_s: self.last_floor.map_or(0.0, |f| self.rate_per_s(f)),
            last_change: self.last_change,
            cut_hard: self.cut_hard,
        }
    }

    /// Workloads with a floor (bounded by `MAX_WORKLOADS`).
    pub fn workloads(&self) -> usize {
        self.floors.len()
    }
}

/// The censored sample of a pod still not network-ready `bound` after it started.
pub fn censored(workload: &str, started: Millis, bound: Millis) -> Sample {
    Sample {
        workload: workload.to_string(),
        started,
        ready: started.saturating_add(bound),
        censored: true,
    }
}

/// The shared network window as a round sees it: released pods of adaptive rules not
/// network-ready yet, and the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkRoom {
    pub in_flight: u32,
    pub window: u32,
}

impl NetworkRoom {
    pub fn full(&self) -> bool {
        self.in_flight >= self.window
    }

    /// Room for partition steps with `gated` replacement pods of adaptive rules waiting
    /// behind the gate (see `STEP_ROOM_GAIN`).
    pub fn for_steps(&self, gated: u32) -> u32 {
        self.window
            .saturating_mul(STEP_ROOM_GAIN)
            .saturating_sub(self.in_flight.saturating_add(gated))
    }
}

/// What the releaser reads of one released pod of an adaptive rule, each round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetwork {
    pub uid: String,
    /// The top-level workload: namespace, kind and name of the Deployment (through the
    /// ReplicaSet's `pod-template-hash`) or StatefulSet, Job, ...
    pub workload: String,
    /// From the released-at annotation.
    pub released_at: Option<Millis>,
    /// spec.nodeName is set.
    pub bound: bool,
    /// spec.nodeName.
    pub node: Option<String>,
    /// `PodReadyToStartContainers` is True.
    pub network_ready: bool,
    /// `PodReadyToStartContainers` is there at all (kubelets that set it).
    pub has_network_condition: bool,
    /// Ready (or finished).
    pub ready: bool,
    pub deleting: bool,
}

/// What a round's look at the released pods gave.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub samples: Vec<Sample>,
    /// Released pods not network-ready yet (censored ones included until they are).
    pub in_flight: u32,
    /// Left out this round, and why: deleted before its network came up; on a node that
    /// is not Ready (its network time says nothing of the CNI's queue, and it would hold
    /// a slot of the window until the node comes back).
    pub deleted_first: u32,
    pub node_not_ready: u32,
}

#[derive(Debug, Clone)]
struct Tracked {
    workload: String,
    released_at: Millis,
    /// When this process first saw it bound (its own clock, ms: the condition's
    /// lastTransitionTime has 1 s resolution).
    bound_at: Option<Millis>,
    sampled: bool,
    done: bool,
}

/// The released pods' network times, from what each round sees: the shell hands it every
/// released pod of an adaptive rule with `now`, it hands back the samples that completed.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    pods: HashMap<String, Tracked>,
}

impl Tracker {
    /// `node_ready` says whether a node is Ready (true for a node nobody knows of: no
    /// word on the nodes never leaves a pod out).
    pub fn observe(
        &mut self,
        now: Millis,
        pods: &[PodNetwork],
        bound: Millis,
        node_ready: impl Fn(&str) -> bool,
    ) -> Observed {
        let mut out = Observed::default();
        let mut seen = std::collections::HashSet::with_capacity(pods.len());
        for pod in pods {
            seen.insert(pod.uid.as_str());
            let tracked = self.pods.entry(pod.uid.clone()).or_insert_with(|| Tracked {
                workload: pod.workload.clone(),
                released_at: pod.released_at.unwrap_or(now).min(now),
                bound_at: None,
                sampled: false,
                // First seen already up (a new leader, a restart): its time is unknown.
                done: pod.network_ready || pod.ready || pod.deleting,
            });
            if tracked.done {
                continue;
            }
            if !pod.network_ready && pod.node.as_deref().is_some_and(|n| !node_ready(n)) {
                out.node_not_ready += 1;
                tracked.done = true;
                continue;
            }
            if pod.bound && tracked.bound_at.is_none() {
                tracked.bound_at = Some(now);
            }
            let started = tracked.bound_at.unwrap_or(tracked.released_at);
            let sample = |ready: Millis, censored: bool| Sample {
                workload: tracked.workload.clone(),
                started,
                ready,
                censored,
            };
            if pod.network_ready {
                if !tracked.sampled {
                    out.samples.push(sample(now, false));
                }
                tracked.done = true;
            } else if pod.ready && !pod.has_network_condition {
                // No condition from this kubelet: release -> Ready stands in for it.
                if !tracked.sampled {
                    out.samples.push(Sample {
                        started: tracked.released_at,
                        ..sample(now, false)
                    });
                }
                tracked.done = true;
            } else if pod.deleting {
                out.deleted_first += 1;
                tracked.done = true;
            } else {
                if !tracked.sampled && now.saturating_sub(started) >= bound {
                    out.samples
                        .push(sample(started.saturating_add(bound), true));
                    tracked.sampled = true;
                }
                out.in_flight += 1;
            }
        }
        self.pods.retain(|uid, _| seen.contains(uid.as_str()));
        out
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

#[cfg(test)]
#[path = "network_tests.rs"]
mod tests;
