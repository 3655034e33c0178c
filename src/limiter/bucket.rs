//! One bucket's charges: the exact sliding window over them, and the GCRA spacing of a
//! limit whose burst is below its events. Pure, like the rest of the limiter.

use super::{Millis, MAX_GAP_CANDIDATES};
use crate::policy::Limit;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

/// The spacing constraint of a limit whose burst is below its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Spacing {
    pub(super) burst: Millis,
    pub(super) interval: Millis,
}

impl Spacing {
    pub(super) fn of(limit: &Limit) -> Option<Spacing> {
        limit.spacing_ms().map(|interval| Spacing {
            burst: Millis::from(limit.burst.max(1)),
            interval,
        })
    }

    /// How far before the theoretical arrival time a charge may come: the burst.
    pub(super) fn tolerance(self) -> Millis {
        (self.burst - 1) * self.interval
    }

    /// The earliest time `cost` charges (at most the burst) conform after a history
    /// whose theoretical arrival time is `tat`.
    pub(super) fn earliest_after(self, tat: Millis, cost: Millis) -> Millis {
        (tat + (cost.min(self.burst) - 1) * self.interval).saturating_sub(self.tolerance())
    }

    /// The theoretical arrival time after `at`.
    pub(super) fn next_tat(self, tat: Millis, at: Millis) -> Millis {
        tat.max(at) + self.interval
    }
}

/// The earliest time from `from` at which one more event keeps `limit`'s spacing after
/// `times` (sorted, none after `from`); `from` when the limit has no spacing. For pacers
/// that keep their own record of events (the partition steps).
pub fn spaced_after(limit: &Limit, times: &[Millis], from: Millis) -> Millis {
    match Spacing::of(limit) {
        Some(spacing) => {
            let tat = times.iter().fold(0, |tat, &t| spacing.next_tat(tat, t));
            from.max(spacing.earliest_after(tat, 1))
        }
        None => from,
    }
}

/// One namespace's reservations in a bucket: how many, and their slots, so a namespace
/// refused for its share is told its earliest one without a scan of every reservation.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) count: u32,
    /// Slot -> reservations at it.
    slots: BTreeMap<Millis, u32>,
}

impl Held {
    pub(super) fn add(&mut self, slot: Millis) {
        self.count += 1;
        *self.slots.entry(slot).or_insert(0) += 1;
    }

    /// Forgets one reservation at `slot`; true when none is left.
    pub(super) fn remove(&mut self, slot: Millis) -> bool {
        self.count = self.count.saturating_sub(1);
        if let Some(at) = self.slots.get_mut(&slot) {
            *at -= 1;
            if *at == 0 {
                self.slots.remove(&slot);
            }
        }
        self.count == 0
    }

    pub(super) fn earliest(&self) -> Option<Millis> {
        self.slots.keys().next().copied()
    }
}

#[derive(Debug, Default, Clone)]
pub(super) struct Bucket {
    /// Charge times, non-decreasing; may extend into the future (reserved slots).
    pub(super) charges: VecDeque<Millis>,
    /// Future slots held per namespace, for the fair share.
    pub(super) reserved_by_namespace: HashMap<Arc<str>, Held>,
    pub(super) window: Millis,
    pub(super) events: u32,
    pub(super) spacing: Option<Spacing>,
}

impl Bucket {
    pub(super) fn last(&self) -> Millis {
        self.charges.back().copied().unwrap_or(0)
    }

    /// Earliest `t >= now` where `cost` more charges fit in every window holding `t`.
    pub(super) fn earliest(&self, limit: &Limit, cost: u32, now: Millis) -> Millis {
        let window = limit.kept_window_ms();
        self.earliest_for(limit.events, window, Spacing::of(limit), cost, now)
    }

    /// Whether `cost` charges fit at `t` itself: exactly when [`Bucket::earliest`] from
    /// `t` answers `t`, but without searching a fully booked future for a later gap, so a
    /// request that is refused anyway (its namespace holds its share) costs no search.
    pub(super) fn fits_at(&self, limit: &Limit, cost: u32, t: Millis) -> bool {
        let events = limit.events;
        if !self.window_fits_at(events, limit.kept_window_ms(), cost, t) {
            return false;
        }
        let Some(spacing) = Spacing::of(limit) else {
            return true;
        };
        // `earliest_for`'s first round, from `t`: any other answer lies after `t`.
        let cost = Millis::from(cost.clamp(1, events.max(1)));
        if t >= self.last() {
            spacing.earliest_after(self.tat(spacing, t), cost) <= t
        } else {
            self.spacing_conflict(spacing, cost, t).is_none()
        }
    }

    /// Whether [`Bucket::window_earliest`] from `t` answers `t`: every one of its later
    /// candidates lies after `t`.
    fn window_fits_at(&self, events: u32, window: Millis, cost: u32, t: Millis) -> bool {
        let events = (events as usize).max(1);
        let cost = (cost as usize).clamp(1, events);
        if t >= self.last() {
            self.earliest_after_all(events, cost, window, t) == t
        } else {
            self.fits(t, events, cost, window)
        }
    }

    /// [`Bucket::earliest`] for the limit this bucket was last charged under.
    pub(super) fn earliest_own(&self, cost: u32, now: Millis) -> Millis {
        self.earliest_for(self.events, self.window, self.spacing, cost, now)
    }

    /// Earliest `t >= now` that keeps both the window and the spacing: each is asked in
    /// turn from the other's answer until they agree (a bounded number of times, then
    /// after every charge, where both answers are exact and only grow).
    pub(super) fn earliest_for(
        &self,
        events: u32,
        window: Millis,
        spacing: Option<Spacing>,
        cost: u32,
        now: Millis,
    ) -> Millis {
        let Some(spacing) = spacing else {
            return self.window_earliest(events, window, cost, now);
        };
        let cost = Millis::from(cost.clamp(1, events.max(1)));
        let mut t = now;
        for _ in 0..MAX_GAP_CANDIDATES {
            t = self.window_earliest(events, window, cost as u32, t);
            if t >= self.last() {
                return t.max(spacing.earliest_after(self.tat(spacing, t), cost));
            }
            match self.spacing_conflict(spacing, cost, t) {
                None => return t,
                Some(next) => t = next,
            }
        }
        let t = self.window_earliest(events, window, cost as u32, now.max(self.last()));
        t.max(spacing.earliest_after(self.tat(spacing, t), cost))
    }

    /// The theoretical arrival time after every charge at or before `t`.
    pub(super) fn tat(&self, spacing: Spacing, t: Millis) -> Millis {
        let upto = self.charges.partition_point(|&c| c <= t);
        self.charges
            .range(..upto)
            .fold(0, |tat, &c| spacing.next_tat(tat, c))
    }

    /// None when `cost` charges at `t` keep the spacing of every charge from `t` on;
    /// else a later time to try: where the charges before `t` allow it, or past the next
    /// charge after `t` when that one would be pushed too close.
    pub(super) fn spacing_conflict(
        &self,
        spacing: Spacing,
        cost: Millis,
        t: Millis,
    ) -> Option<Millis> {
        let split = self.charges.partition_point(|&c| c <= t);
        let mut tat = self.tat(spacing, t);
        let need = spacing.earliest_after(tat, cost);
        if need > t {
            return Some(need);
        }
        // `cost` charges at `t`: each after the one before.
        tat = spacing.next_tat(tat, t) + (cost - 1) * spacing.interval;
        for &c in self.charges.range(split..) {
            if tat.saturating_sub(spacing.tolerance()) > c {
                return self.charges.get(split).copied();
            }
            tat = spacing.next_tat(tat, c);
        }
        None
    }

    /// The earliest time for the window alone.
    pub(super) fn window_earliest(
        &self,
        events: u32,
        window: Millis,
        cost: u32,
        now: Millis,
    ) -> Millis {
        let events = (events as usize).max(1);
        let cost = (cost as usize).clamp(1, events);
        if now >= self.last() {
            return self.earliest_after_all(events, cost, window, now);
        }
        // `now` lies before reserved slots: a gap may fit. The first time a window stops
        // being too full is when some charge leaves it, so only `now` and `charge + window`
        // can be the answer. `now` is checked exactly; later gaps with a bounded number of
        // cheap conservative checks, so a congested bucket never costs a long scan.
        if self.fits(now, events, cost, window) {
            return now;
        }
        let first = self.charges.partition_point(|&c| c + window <= now);
        for &charge in self.charges.range(first..).take(MAX_GAP_CANDIDATES) {
            let candidate = charge + window;
            if candidate >= self.last() {
                return self.earliest_after_all(events, cost, window, candidate);
            }
            if self.span_has_room(candidate, events, cost, window) {
                return candidate;
            }
        }
        self.earliest_after_all(events, cost, window, now.max(self.last()))
    }

    /// Conservative: room in `(t - window, t + window)`, which holds every window with t.
    pub(super) fn span_has_room(
        &self,
        t: Millis,
        events: usize,
        cost: usize,
        window: Millis,
    ) -> bool {
        let lo = self.charges.partition_point(|&c| c + window <= t);
        let hi = self.charges.partition_point(|&c| c < t + window);
        hi - lo + cost <= events
    }

    /// With every charge at or before `t`, only `(t - window, t]` matters.
    pub(super) fn earliest_after_all(
        &self,
        events: usize,
        cost: usize,
        window: Millis,
        t: Millis,
    ) -> Millis {
        let n = self.charges.len();
        let free = events - cost;
        let by_window = if n > free {
            self.charges[n - 1 - free] + window
        } else {
            0
        };
        t.max(by_window)
    }

    /// Whether `cost` charges at `t` keep every window of length `window` at or under `events`.
    pub(super) fn fits(&self, t: Millis, events: usize, cost: usize, window: Millis) -> bool {
        if self.span_has_room(t, events, cost, window) {
            return true;
        }
        // A window's count only grows when its end passes a charge, so the fullest window
        // holding t ends at t or at one of the charges in (t, t + window): reserved slots
        // after t count as much as charges before it.
        let ending_at = |end: Millis| {
            let lo = self.charges.partition_point(|&c| c + window <= end);
            let hi = self.charges.partition_point(|&c| c <= end);
            hi - lo
        };
        let after = self.charges.partition_point(|&c| c <= t);
        let until = self.charges.partition_point(|&c| c < t + window);
        let fullest = (after..until)
            .map(|i| ending_at(self.charges[i]))
            .fold(ending_at(t), usize::max);
        fullest + cost <= events
    }

    pub(super) fn charge(&mut self, at: Millis, cost: u32, limit: &Limit) {
        self.window = limit.kept_window_ms();
        self.events = limit.events;
        self.spacing = Spacing::of(limit);
        self.charge_own(at, cost);
    }

    pub(super) fn charge_own(&mut self, at: Millis, cost: u32) {
        let cost = cost.clamp(1, self.events.max(1));
        let index = self.charges.partition_point(|&c| c <= at);
        for _ in 0..cost {
            self.charges.insert(index, at);
        }
    }

    /// Removes `cost` charges made at `at` (a slot given back); charges already trimmed
    /// are gone anyway.
    pub(super) fn uncharge(&mut self, at: Millis, cost: u32) {
        let cost = (cost as usize).clamp(1, (self.events as usize).max(1));
        let from = self.charges.partition_point(|&c| c < at);
        let to = self.charges.partition_point(|&c| c <= at);
        let n = (to - from).min(cost);
        self.charges.drain(from..from + n);
    }

    /// Drops charges that no window holding `now` or a later time can see.
    pub(super) fn trim(&mut self, now: Millis) {
        while let Some(&first) = self.charges.front() {
            if first + self.window <= now {
                self.charges.pop_front();
            } else {
                break;
            }
        }
    }

    pub(super) fn in_window(&self, now: Millis) -> u32 {
        self.charges
            .iter()
            .filter(|&&c| c + self.window > now && c <= now)
            .count() as u32
    }

    pub(super) fn is_idle(&self, now: Millis) -> bool {
        self.reserved_by_namespace.is_empty()
            && self.charges.back().is_none_or(|&c| c + self.window <= now)
    }
}
