//! The global budget across webhook replicas: each replica enforces its share of every limit.
//! Pure: which replica Leases are live, the share that follows, the policy scaled by it.
//!
//! Every replica renews its own coordination.k8s.io Lease (`lease` is that shell) and
//! lists the others'; with N live, it enforces `events / N` (rounded down, at least 1)
//! of every limit. Gate rules are different: the releasing replica decides them, so it
//! keeps the whole limit and the other replicas gate every pod. When the API server is
//! out of reach for longer than a lease, a replica falls back to 1/max(--max-replicas,
//! the last N it saw). A share shrinks at once and grows only after the policy's longest
//! window, and a replica starts with 1 event per window for that long (`ShareHistory`).
//! Documentation and measurements: docs/global-budget.md.

pub mod lease;

use crate::limiter::Millis;
use crate::names::LEASE_PREFIX;
use crate::policy::{Action, Policy};
use std::collections::HashMap;

/// What part of each limit this replica enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Share {
    /// The budget is off: the limits as written.
    Whole,
    /// `replicas` live replica Leases were counted within the last lease period.
    Counted { replicas: u32 },
    /// The API server has been out of reach for longer than a lease period (or has not
    /// been reached yet): a share that is safe for up to `replicas` replicas.
    Fallback { replicas: u32 },
    /// The first window after start: what this replica's predecessor admitted is not
    /// known, so every limit allows 1 event per window.
    WarmingUp,
}

impl Share {
    /// The number every limit is divided by.
    pub fn divisor(self) -> u32 {
        match self {
            Share::Whole => 1,
            Share::Counted { replicas } | Share::Fallback { replicas } => replicas.max(1),
            Share::WarmingUp => u32::MAX,
        }
    }

    pub fn is_fallback(self) -> bool {
        matches!(self, Share::Fallback { .. })
    }
}

/// Who decides the gate rules on this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GateRole {
    /// This replica holds the releaser's lease: it admits at once and releases, against
    /// the whole limit, in one limiter.
    Leader,
    /// Another replica (or none, right now) leads: gate every pod, the leader releases.
    Follower,
    /// The releaser is off: nobody would lift a gate, so gate rules are shared like the rest.
    NoReleaser,
}

/// `events` split `divisor` ways: rounded down, at least 1 (a rule never stops entirely).
pub fn scale_events(events: u32, divisor: u32) -> u32 {
    (events / divisor.max(1)).max(1)
}

/// The policy this replica decides with. `partition` rules are untouched (the webhook
/// only holds the partition; the single releaser steps it at the rate).
pub fn scale_policy(policy: &Policy, share: Share, role: GateRole) -> Policy {
    let mut scaled = policy.clone();
    if share == Share::Whole {
        return scaled;
    }
    let divisor = share.divisor();
    for rule in &mut scaled.rules {
        match (rule.action, role) {
            (Action::Partition, _) | (Action::Gate, GateRole::Leader) => {}
            (Action::Gate, GateRole::Follower) => rule.gate_only = true,
            _ => {
                for limit in &mut rule.limits {
                    limit.events = scale_events(limit.events, divisor);
                }
                rule.max_reserved_per_namespace =
                    scale_events(rule.max_reserved_per_namespace, divisor);
            }
        }
    }
    scaled
}

/// The share in force at `now` (this replica's monotonic clock, in ms): the last count
/// while it is at most one lease period old, else the fallback, which never exceeds the
/// last count's share.
pub fn share_at(
    last_contact: Option<(Millis, u32)>,
    now: Millis,
    lease_ms: Millis,
    max_replicas: u32,
) -> Share {
    match last_contact {
        Some((at, replicas)) if now.saturating_sub(at) <= lease_ms => Share::Counted {
            replicas: replicas.max(1),
        },
        Some((_, replicas)) => Share::Fallback {
            replicas: max_replicas.max(replicas).max(1),
        },
        None => Share::Fallback {
            replicas: max_replicas.max(1),
        },
    }
}

/// The share in force is the smallest one of the last `hold` ms (the policy's longest
/// window plus a renewal): a share shrinks at once but grows only once every window that
/// could still hold admissions made under the smaller one has passed. That is what keeps
/// the sum within the limit when a replica leaves (its admissions are still in the
/// window, and the others must not take its share before they expire), and what makes
/// the warm-up last one window.
#[derive(Debug, Default)]
pub struct ShareHistory {
    /// Samples with strictly decreasing divisors and non-decreasing times (a sliding maximum).
    samples: std::collections::VecDeque<(Millis, Share)>,
    /// A replica count has been pushed since the start.
    counted: bool,
}

impl ShareHistory {
    /// Records the share computed at `at` and returns the one in force. Each sample's
    /// time is the last moment its share was computed, so it is held for `hold` after that.
    pub fn push(&mut self, at: Millis, share: Share, hold: Millis) -> Share {
        // The fallback computed before the first count is a guess made with no information,
        // not a share other replicas acted on: the warm-up (stricter) covers that time, so
        // the guess is not held beyond it. Held, it put a third of every limit in force for
        // as long as the first count took after the start, between the warm-up and the count.
        if !self.counted && matches!(share, Share::Fallback { .. }) {
            if let Some(&(began, Share::WarmingUp)) = self.samples.front() {
                if began.saturating_add(hold) >= at {
                    return Share::WarmingUp;
                }
                // No count during the whole warm-up: the fallback follows it.
                self.samples.pop_front();
            }
        }
        self.counted |= matches!(share, Share::Counted { .. });
        while self
            .samples
            .back()
            .is_some_and(|(_, s)| s.divisor() < share.divisor())
        {
            self.samples.pop_back();
        }
        match self.samples.back_mut() {
            Some(back) if back.1.divisor() == share.divisor() => *back = (at, share),
            Some(back) => {
                back.0 = at;
                self.samples.push_back((at, share));
            }
            None => self.samples.push_back((at, share)),
        }
        while self.samples.len() > 1
            && self
                .samples
                .front()
                .is_some_and(|(t, _)| t.saturating_add(hold) < at)
        {
            self.samples.pop_front();
        }
        self.samples.front().map_or(share, |(_, s)| *s)
    }
}

/// A replica Lease as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerLease {
    pub name: String,
    pub holder: Option<String>,
    pub resource_version: String,
    pub duration_seconds: Option<i32>,
}

#[derive(Debug, Clone)]
struct Seen {
    version: String,
    since: Millis,
    duration: Millis,
    held: bool,
}

/// Which replica Leases are live. A Lease is live while it has a holder and has changed
/// within its duration *as seen on this replica's clock*: no wall clocks are compared,
/// so clock skew between nodes cannot shrink or grow the count. A Lease seen for the
/// first time counts as live for one duration (a stale one then drops out): counting
/// too many replicas only makes the share smaller.
#[derive(Debug, Default)]
pub struct Peers {
    seen: HashMap<String, Seen>,
}

impl Peers {
    /// Records a listing taken at `at`; Leases missing from it are forgotten.
    pub fn observe(&mut self, listing: &[PeerLease], at: Millis) {
        let mut next = HashMap::with_capacity(listing.len());
        for lease in listing {
            let duration = lease.duration_seconds.unwrap_or(10).max(1) as Millis * 1000;
            let held = lease.holder.as_deref().is_some_and(|h| !h.is_empty());
            let since = match self.seen.get(&lease.name) {
                Some(seen) if seen.version == lease.resource_version => seen.since,
                _ => at,
            };
            next.insert(
                lease.name.clone(),
                Seen {
                    version: lease.resource_version.clone(),
                    since,
                    duration,
                    held,
                },
            );
        }
        self.seen = next;
    }

    /// Live replicas at `now`, this one (Lease `mine`) always included.
    pub fn live(&self, mine: &str, now: Millis) -> u32 {
        let others = self
            .seen
            .iter()
            .filter(|(name, seen)| {
                name.as_str() != mine && seen.held && now.saturating_sub(seen.since) < seen.duration
            })
            .count();
        u32::try_from(others).unwrap_or(u32::MAX - 1) + 1
    }
}

/// The Lease name for an identity: a DNS subdomain (lower case, a-z 0-9 '-' '.',
/// at most 253 characters, alphanumeric at both ends).
pub fn lease_name(identity: &str) -> String {
    let cleaned: String = identity
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut name = format!("{LEASE_PREFIX}{cleaned}");
    name.truncate(253);
    let trimmed = name.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.len() < LEASE_PREFIX.len() {
        return format!("{LEASE_PREFIX}unnamed");
    }
    trimmed.to_string()
}

#[cfg(test)]
mod tests;
