//! The windows of one partition rule: the steps they hold, per limit and scope key, and
//! whether one more fits now. Pure; used by the step plan (`partition.rs`).

use crate::limiter::{spaced_after, Millis};
use crate::policy::{Rule, Scope};
use std::collections::HashMap;

/// The steps a rule's windows hold, per limit and scope key: the times their old pods
/// were seen deleted, and how many are still in flight (they count as "now").
pub(super) struct Windows<'r> {
    pub(super) rule: &'r Rule,
    seen: Vec<HashMap<Option<String>, Vec<Millis>>>,
    in_flight: Vec<HashMap<Option<String>, u32>>,
    /// Decision times of steps taken, for the spacing.
    taken: Vec<HashMap<Option<String>, Vec<Millis>>>,
}

impl<'r> Windows<'r> {
    pub(super) fn new(rule: &'r Rule) -> Self {
        Windows {
            rule,
            seen: vec![HashMap::new(); rule.limits.len()],
            in_flight: vec![HashMap::new(); rule.limits.len()],
            taken: vec![HashMap::new(); rule.limits.len()],
        }
    }

    /// Counts a step of `namespace` decided at `at`, for the spacing.
    pub(super) fn take(&mut self, namespace: &str, at: Millis) {
        for (i, limit) in self.rule.limits.iter().enumerate() {
            let key = Self::key(limit.scope, namespace);
            self.taken[i].entry(key).or_default().push(at);
        }
    }

    fn key(scope: Scope, namespace: &str) -> Option<String> {
        match scope {
            Scope::Global => None,
            // Owner scope is refused for partition rules by the policy; a namespace is
            // the closest safe reading.
            Scope::Namespace | Scope::Owner => Some(namespace.to_string()),
        }
    }

    /// Counts a step of `namespace`: seen at `at`, or in flight (None).
    pub(super) fn add(&mut self, namespace: &str, at: Option<Millis>) {
        for (i, limit) in self.rule.limits.iter().enumerate() {
            let key = Self::key(limit.scope, namespace);
            match at {
                Some(t) => self.seen[i].entry(key).or_default().push(t),
                None => *self.in_flight[i].entry(key).or_insert(0) += 1,
            }
        }
    }

    /// Ok when one more step of `namespace` fits every limit now; else when it will
    /// (None: only once the old pod of a step in flight is seen deleted).
    pub(super) fn room(&self, namespace: &str, now: Millis) -> Result<(), Option<Millis>> {
        let mut wake: Option<Millis> = Some(now);
        let mut fits = true;
        for (i, limit) in self.rule.limits.iter().enumerate() {
            let key = Self::key(limit.scope, namespace);
            let window = limit.kept_window_ms();
            let events = limit.events as usize;
            let flying = self.in_flight[i].get(&key).copied().unwrap_or(0) as usize;
            let seen = in_window(self.seen[i].get(&key), window, now);
            let taken = in_window(self.taken[i].get(&key), window, now);
            let spaced = spaced_after(limit, &taken, now);
            // A spaced limit keeps at most `burst` steps whose old pod is not seen deleted
            // yet: the controller may delete late (measured: 2.2 to 3.0 s after steps
            // taken during a mass update, then 9 deletions in one second), and what it
            // deletes together must stay within the burst beyond the spacing.
            if limit.burst < limit.events && flying >= limit.burst as usize {
                fits = false;
                wake = None;
                continue;
            }
            if seen.len() + flying < events {
                if spaced > now {
                    fits = false;
                    wake = wake.map(|w| w.max(spaced));
                }
                continue;
            }
            fits = false;
            if flying >= events {
                wake = None;
                continue;
            }
            // The oldest seen steps must leave until one more fits.
            let leave = seen.len() + flying + 1 - events;
            let at = (seen[leave - 1] + window).max(spaced);
            wake = wake.map(|w| w.max(at));
        }
        if fits {
            Ok(())
        } else {
            Err(wake)
        }
    }

    /// Steps in the fullest window now, for metrics.
    pub(super) fn fullest(&self, now: Millis) -> u32 {
        let mut fullest = 0;
        for (i, limit) in self.rule.limits.iter().enumerate() {
            let window = limit.kept_window_ms();
            let keys = self.seen[i].keys().chain(self.in_flight[i].keys());
            for key in keys {
                let seen = self.seen[i].get(key).map_or(0, |times| {
                    times.iter().filter(|&&t| t.min(now) + window > now).count()
                });
                let flying = self.in_flight[i].get(key).copied().unwrap_or(0) as usize;
                fullest = fullest.max((seen + flying) as u32);
            }
        }
        fullest
    }
}

/// The times of one bucket still inside a window at `now` (a time recorded ahead of
/// `now`, from a clock that ran ahead, counts as now), earliest first.
fn in_window(times: Option<&Vec<Millis>>, window: Millis, now: Millis) -> Vec<Millis> {
    let mut recent: Vec<Millis> = times
        .map(|times| {
            times
                .iter()
                .map(|&t| t.min(now))
                .filter(|&t| t + window > now)
                .collect()
        })
        .unwrap_or_default();
    recent.sort_unstable();
    recent
}
