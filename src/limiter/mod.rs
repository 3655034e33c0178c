//! Exact sliding-window limiter with reservations of future slots.
//! Pure: time comes in as milliseconds, nothing here reads a clock or sleeps.
//!
//! Each bucket keeps its charges in time order. A request of cost `k` fits at time
//! `t` (not before the bucket's last charge, which keeps every bucket FIFO) when at
//! most `events - k` charges lie in `(t - window, t]`; so the earliest slot is
//! `charges[n - 1 - (events - k)] + window`. Slots are only ever appended, which
//! makes that formula exact for "at most `events` in ANY interval of length `window`".
//!
//! A limit with a `burst` below its events adds a spacing constraint on the same charges,
//! a GCRA (virtual scheduling) with tolerance `burst - 1` intervals: after at most `burst`
//! at once, consecutive charges lie `spacing` apart. Both must hold at every charge; a
//! spaced limit keeps its window with a margin ([`Limit::kept_window_ms`]).

use crate::policy::{Limit, Scope};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Milliseconds since the Unix epoch.
pub type Millis = u64;

/// Gaps between reserved slots examined per decision before queueing at the end.
const MAX_GAP_CANDIDATES: usize = 64;

/// Retry-After counts whole seconds, and a retry reaches the webhook a little after them
/// (client, API server). An aligned slot lies this far past the whole seconds the client
/// is told, so the retry comes early and is held until its slot: the charge then lies
/// inside the request it stands for, never before it. A retry later than its slot is
/// charged when it comes (see [`Limiter::acquire`]).
pub const RETRY_ARRIVAL_MARGIN_MS: Millis = 500;

/// How long past its slot an unclaimed reservation is kept for its retry.
pub const RESERVATION_GRACE_MS: Millis = 30_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ScopeKey {
    Global,
    Namespace(Arc<str>),
    Owner(Arc<str>),
    /// Shared by namespace/owner keys that arrive while the bucket table is full:
    /// stricter than their own buckets, never looser.
    Overflow,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketKey {
    pub rule: Arc<str>,
    /// Index of the limit within the rule.
    pub limit: u8,
    pub scope: ScopeKey,
}

/// The stable identity of a logical request, so its retry claims its own slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// One request: a named pod, an eviction, a StatefulSet by UID.
    Exact(String),
    /// Interchangeable requests (pods of one ReplicaSet by owner UID + generateName):
    /// any of them may claim any due reservation of the pool, one each.
    Pool(String),
}

/// One request for capacity.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    pub rule: &'a Arc<str>,
    pub limits: &'a [Limit],
    pub namespace: &'a str,
    /// Controller UID, for `owner` scope; requests without one use their identity.
    pub owner: Option<&'a str>,
    pub identity: &'a Identity,
    pub cost: u32,
    /// Reserve a future slot when there is no room now (false: just say when).
    pub reserve: bool,
    pub dry_run: bool,
    pub max_reserved_per_namespace: u32,
    /// A slot farther than this from now is answered with Retry-After, which counts whole
    /// seconds: the slot is moved to a whole number of seconds from now (when that is
    /// free), so the charge lands when the client's retry really comes; for an exact
    /// identity, [`RETRY_ARRIVAL_MARGIN_MS`] past them, so the retry comes just before.
    pub align_beyond: Option<Millis>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Fits now and was charged now (or would be, for a dry run).
    Admitted,
    /// The request's reservation is due and is now used.
    Claimed { slot: Millis },
    /// A slot is reserved for this identity at `slot` (> now); come back then.
    Reserved { slot: Millis },
    /// Hold this request until `slot`, where it is charged; nothing is left to claim. For
    /// a pool member within `align_beyond` of the pool's earliest slot, or a late retry
    /// whose earliest room is that near.
    Held { slot: Millis },
    /// No room now and nothing reserved; `retry_at` is the earliest sensible retry.
    Refused { retry_at: Millis, why: RefusedWhy },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedWhy {
    /// The caller asked not to reserve (deny, gate, dry run).
    NotReserving,
    /// This namespace already holds its share of future slots in a bucket.
    NamespaceShare,
    /// The reservation table is full.
    TableFull,
    /// The earliest slot lies further ahead than a client told to retry can keep
    /// ([`Limiter::acquire_within`]): nothing is reserved.
    BeyondReach,
}

#[derive(Debug, Clone)]
struct Reservation {
    slot: Millis,
    cost: u32,
    namespace: Arc<str>,
    buckets: Vec<BucketKey>,
}

/// Where a reservation lives: an exact identity's key, or a pool's key and position.
enum Place {
    Exact((Arc<str>, String)),
    Pool((Arc<str>, String), usize),
}

/// A reservation after a late retry's, taken out and placed again behind it.
struct Later {
    /// Its slot before it moves.
    slot: Millis,
    cost: u32,
    buckets: Vec<BucketKey>,
    place: Place,
}

/// The spacing constraint of a limit whose burst is below its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Spacing {
    burst: Millis,
    interval: Millis,
}

impl Spacing {
    fn of(limit: &Limit) -> Option<Spacing> {
        limit.spacing_ms().map(|interval| Spacing {
            burst: Millis::from(limit.burst.max(1)),
            interval,
        })
    }

    /// How far before the theoretical arrival time a charge may come: the burst.
    fn tolerance(self) -> Millis {
        (self.burst - 1) * self.interval
    }

    /// The earliest time `cost` charges (at most the burst) conform after a history
    /// whose theoretical arrival time is `tat`.
    fn earliest_after(self, tat: Millis, cost: Millis) -> Millis {
        (tat + (cost.min(self.burst) - 1) * self.interval).saturating_sub(self.tolerance())
    }

    /// The theoretical arrival time after `at`.
    fn next_tat(self, tat: Millis, at: Millis) -> Millis {
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

#[derive(Debug, Default, Clone)]
struct Bucket {
    /// Charge times, non-decreasing; may extend into the future (reserved slots).
    charges: VecDeque<Millis>,
    /// Future slots held per namespace, for the fair share.
    reserved_by_namespace: HashMap<Arc<str>, u32>,
    window: Millis,
    events: u32,
    spacing: Option<Spacing>,
}

impl Bucket {
    fn last(&self) -> Millis {
        self.charges.back().copied().unwrap_or(0)
    }

    /// Earliest `t >= now` where `cost` more charges fit in every window holding `t`.
    fn earliest(&self, limit: &Limit, cost: u32, now: Millis) -> Millis {
        let window = limit.kept_window_ms();
        self.earliest_for(limit.events, window, Spacing::of(limit), cost, now)
    }

    /// [`Bucket::earliest`] for the limit this bucket was last charged under.
    fn earliest_own(&self, cost: u32, now: Millis) -> Millis {
        self.earliest_for(self.events, self.window, self.spacing, cost, now)
    }

    /// Earliest `t >= now` that keeps both the window and the spacing: each is asked in
    /// turn from the other's answer until they agree (a bounded number of times, then
    /// after every charge, where both answers are exact and only grow).
    fn earliest_for(
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
    fn tat(&self, spacing: Spacing, t: Millis) -> Millis {
        let upto = self.charges.partition_point(|&c| c <= t);
        self.charges
            .range(..upto)
            .fold(0, |tat, &c| spacing.next_tat(tat, c))
    }

    /// None when `cost` charges at `t` keep the spacing of every charge from `t` on;
    /// else a later time to try: where the charges before `t` allow it, or past the next
    /// charge after `t` when that one would be pushed too close.
    fn spacing_conflict(&self, spacing: Spacing, cost: Millis, t: Millis) -> Option<Millis> {
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
    fn window_earliest(&self, events: u32, window: Millis, cost: u32, now: Millis) -> Millis {
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
    fn span_has_room(&self, t: Millis, events: usize, cost: usize, window: Millis) -> bool {
        let lo = self.charges.partition_point(|&c| c + window <= t);
        let hi = self.charges.partition_point(|&c| c < t + window);
        hi - lo + cost <= events
    }

    /// With every charge at or before `t`, only `(t - window, t]` matters.
    fn earliest_after_all(&self, events: usize, cost: usize, window: Millis, t: Millis) -> Millis {
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
    fn fits(&self, t: Millis, events: usize, cost: usize, window: Millis) -> bool {
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

    fn charge(&mut self, at: Millis, cost: u32, limit: &Limit) {
        self.window = limit.kept_window_ms();
        self.events = limit.events;
        self.spacing = Spacing::of(limit);
        self.charge_own(at, cost);
    }

    fn charge_own(&mut self, at: Millis, cost: u32) {
        let cost = cost.clamp(1, self.events.max(1));
        let index = self.charges.partition_point(|&c| c <= at);
        for _ in 0..cost {
            self.charges.insert(index, at);
        }
    }

    /// Removes `cost` charges made at `at` (a slot given back); charges already trimmed
    /// are gone anyway.
    fn uncharge(&mut self, at: Millis, cost: u32) {
        let cost = (cost as usize).clamp(1, (self.events as usize).max(1));
        let from = self.charges.partition_point(|&c| c < at);
        let to = self.charges.partition_point(|&c| c <= at);
        let n = (to - from).min(cost);
        self.charges.drain(from..from + n);
    }

    /// Drops charges that no window holding `now` or a later time can see.
    fn trim(&mut self, now: Millis) {
        while let Some(&first) = self.charges.front() {
            if first + self.window <= now {
                self.charges.pop_front();
            } else {
                break;
            }
        }
    }

    fn in_window(&self, now: Millis) -> u32 {
        self.charges
            .iter()
            .filter(|&&c| c + self.window > now && c <= now)
            .count() as u32
    }

    fn is_idle(&self, now: Millis) -> bool {
        self.reserved_by_namespace.is_empty()
            && self.charges.back().is_none_or(|&c| c + self.window <= now)
    }
}

/// What a sweep found, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub buckets: usize,
    pub reservations: usize,
    /// Per rule: the fullest bucket's charges in its current window, and that bucket's limit.
    pub per_rule: HashMap<Arc<str>, (u32, u32)>,
}

pub struct Limiter {
    buckets: HashMap<BucketKey, Bucket>,
    exact: HashMap<(Arc<str>, String), Reservation>,
    pools: HashMap<(Arc<str>, String), VecDeque<Reservation>>,
    reservation_count: usize,
    max_buckets: usize,
    max_reservations: usize,
}

impl Limiter {
    pub fn new(max_buckets: usize) -> Limiter {
        Limiter {
            buckets: HashMap::new(),
            exact: HashMap::new(),
            pools: HashMap::new(),
            reservation_count: 0,
            max_buckets: max_buckets.max(16),
            max_reservations: max_buckets.max(16),
        }
    }

    pub fn set_max_buckets(&mut self, max_buckets: usize) {
        self.max_buckets = max_buckets.max(16);
        self.max_reservations = self.max_buckets;
    }

    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    pub fn reservation_count(&self) -> usize {
        self.reservation_count
    }

    /// Decide, and unless `dry_run`, record.
    ///
    /// Every charge lies inside the request it stands for: at `now` when admitted, at the
    /// slot when held until it. A retry that comes after its slot cannot be charged there
    /// (the event happens now, not then): charging it at the old slot would let real
    /// events exceed the limit in windows the slot was not in. It is charged from `now`
    /// instead, ahead of the reservations after it ([`Limiter::reclaim_late`]).
    pub fn acquire(&mut self, ask: &Ask<'_>, now: Millis) -> Outcome {
        let rule = ask.rule.clone();
        if let Some(outcome) = self.claim(&rule, ask, now) {
            return outcome;
        }
        let keys = self.bucket_keys(ask);
        let slot = keys
            .iter()
            .zip(ask.limits)
            .map(|(key, limit)| match self.buckets.get(key) {
                Some(bucket) => bucket.earliest(limit, ask.cost, now),
                None => now,
            })
            .max()
            .unwrap_or(now);
        let slot = match ask.align_beyond {
            Some(threshold) if slot > now + threshold => self.aligned(&keys, ask, now, slot),
            _ => slot,
        };

        if slot <= now {
            if !ask.dry_run {
                self.charge_all(&keys, ask.limits, slot, ask.cost, now);
            }
            return Outcome::Admitted;
        }
        if !ask.reserve || ask.dry_run {
            return Outcome::Refused {
                retry_at: slot,
                why: RefusedWhy::NotReserving,
            };
        }
        let namespace: Arc<str> = Arc::from(ask.namespace);
        // Fair share: a namespace holding its share of future slots in any bucket waits
        // for its own earliest reservation instead of taking more.
        for key in &keys {
            if let Some(bucket) = self.buckets.get(key) {
                let held = bucket
                    .reserved_by_namespace
                    .get(&namespace)
                    .copied()
                    .unwrap_or(0);
                if held >= ask.max_reserved_per_namespace {
                    let retry_at = self
                        .earliest_reservation_of(&namespace, key)
                        .unwrap_or(slot);
                    // A reservation already due waits for its late client: ask again in a second.
                    let retry_at = if retry_at <= now {
                        now + 1_000
                    } else {
                        retry_at
                    };
                    return Outcome::Refused {
                        retry_at,
                        why: RefusedWhy::NamespaceShare,
                    };
                }
            }
        }
        if self.reservation_count >= self.max_reservations {
            return Outcome::Refused {
                retry_at: slot,
                why: RefusedWhy::TableFull,
            };
        }
        self.charge_all(&keys, ask.limits, slot, ask.cost, now);
        self.keep(
            ask,
            Reservation {
                slot,
                cost: ask.cost,
                namespace,
                buckets: keys,
            },
        );
        Outcome::Reserved { slot }
    }

    /// Stores a reservation for the ask's identity and counts it in its namespace's share.
    fn keep(&mut self, ask: &Ask<'_>, reservation: Reservation) {
        for key in &reservation.buckets {
            if let Some(bucket) = self.buckets.get_mut(key) {
                *bucket
                    .reserved_by_namespace
                    .entry(reservation.namespace.clone())
                    .or_insert(0) += 1;
            }
        }
        let rule = ask.rule.clone();
        match ask.identity {
            Identity::Exact(id) => {
                self.exact.insert((rule, id.clone()), reservation);
            }
            Identity::Pool(id) => {
                let pool = self.pools.entry((rule, id.clone())).or_default();
                // Kept in slot order: a late member's new slot may lie before others'.
                let index = pool.partition_point(|r| r.slot <= reservation.slot);
                pool.insert(index, reservation);
            }
        }
        self.reservation_count += 1;
    }

    /// `slot` moved up to a whole number of seconds after `now` plus the arrival margin,
    /// if every bucket has room there; otherwise `slot` itself.
    fn aligned(&self, keys: &[BucketKey], ask: &Ask<'_>, now: Millis, slot: Millis) -> Millis {
        let margin = RETRY_ARRIVAL_MARGIN_MS;
        let seconds = (slot - now).saturating_sub(margin).div_ceil(1000).max(1);
        let rounded = now + seconds * 1000 + margin;
        let fits = keys.iter().zip(ask.limits).all(|(key, limit)| {
            self.buckets
                .get(key)
                .is_none_or(|b| b.earliest(limit, ask.cost, rounded) == rounded)
        });
        if fits {
            rounded
        } else {
            slot
        }
    }

    /// A request whose reservation exists: due ones are used up, early ones wait, late
    /// ones are placed again from `now`. `None`: no reservation to use, decide afresh.
    fn claim(&mut self, rule: &Arc<str>, ask: &Ask<'_>, now: Millis) -> Option<Outcome> {
        let key = match ask.identity {
            Identity::Exact(id) | Identity::Pool(id) => (rule.clone(), id.clone()),
        };
        // Which reservation this request would use: an exact identity's own; for a pool,
        // the latest one already due (older ones are more likely left by members that
        // never came back, and keeping the latest would block the window it lies in),
        // else the earliest.
        let (index, slot) = match ask.identity {
            Identity::Exact(_) => (0, self.exact.get(&key)?.slot),
            Identity::Pool(_) => {
                let pool = self.pools.get(&key)?;
                match pool.iter().rposition(|r| r.slot <= now) {
                    Some(index) => (index, pool[index].slot),
                    None => (0, pool.front()?.slot),
                }
            }
        };
        if slot > now {
            return match ask.identity {
                Identity::Exact(_) => Some(Outcome::Reserved { slot }),
                // Pool members are interchangeable: one that comes within the hold reach
                // of the earliest slot takes it (a retry a little early, or a new pod).
                Identity::Pool(_) => {
                    let reach = ask.align_beyond.filter(|_| ask.reserve && !ask.dry_run)?;
                    if slot > now + reach {
                        // Not due: this may be a new pod of the pool, so it gets its own slot.
                        return None;
                    }
                    let reservation = self.take_reservation(&key, ask.identity, index)?;
                    self.release_share(&reservation);
                    Some(Outcome::Held { slot })
                }
            };
        }
        if ask.dry_run {
            return Some(Outcome::Claimed { slot });
        }
        let reservation = self.take_reservation(&key, ask.identity, index)?;
        self.release_share(&reservation);
        if slot == now {
            return Some(Outcome::Claimed { slot });
        }
        Some(self.reclaim_late(ask, reservation, now))
    }

    /// Removes the reservation a claim uses: an exact identity's own, a pool's `index`th.
    fn take_reservation(
        &mut self,
        key: &(Arc<str>, String),
        identity: &Identity,
        index: usize,
    ) -> Option<Reservation> {
        match identity {
            Identity::Exact(_) => self.exact.remove(key),
            Identity::Pool(_) => {
                let pool = self.pools.get_mut(key)?;
                let reservation = pool.remove(index);
                if pool.is_empty() {
                    self.pools.remove(key);
                }
                reservation
            }
        }
    }

    /// A retry that comes after its slot: the event happens now, not then. Its slot is
    /// given back, it is placed at the earliest time from `now` with room, ahead of every
    /// reservation still to come, and those move back as far as they must, in order. Its
    /// own slot, given back, is what makes room: a retry late by less than a window is
    /// admitted at once, so a slow client neither loses its place nor livelocks.
    fn reclaim_late(&mut self, ask: &Ask<'_>, late: Reservation, now: Millis) -> Outcome {
        let later = self.reservations_after(&late.buckets, now);
        self.uncharge(&late.buckets, late.slot, late.cost);
        for r in &later {
            self.uncharge(&r.buckets, r.slot, r.cost);
        }

        let earliest = self.earliest_in(&late.buckets, late.cost, now);
        let reach = ask.align_beyond.unwrap_or(0);
        let (outcome, kept) = if earliest <= now {
            self.charge_in(&late.buckets, now, late.cost);
            (Outcome::Claimed { slot: now }, None)
        } else if earliest - now <= reach {
            // The server holds it until then: charged there, nothing to claim later.
            self.charge_in(&late.buckets, earliest, late.cost);
            (Outcome::Held { slot: earliest }, None)
        } else {
            let slot = self.aligned(&late.buckets, ask, now, earliest);
            self.charge_in(&late.buckets, slot, late.cost);
            (
                Outcome::Reserved { slot },
                Some(Reservation { slot, ..late }),
            )
        };

        let mut moved_pools = Vec::new();
        for r in later {
            let slot = self.earliest_in(&r.buckets, r.cost, r.slot);
            self.charge_in(&r.buckets, slot, r.cost);
            self.reservation_mut(&r.place).slot = slot;
            if let Place::Pool(key, _) = r.place {
                moved_pools.push(key);
            }
        }
        for key in moved_pools {
            if let Some(pool) = self.pools.get_mut(&key) {
                pool.make_contiguous().sort_by_key(|r| r.slot);
            }
        }
        // Stored last: a pool's positions listed in `later` must not shift before.
        if let Some(reservation) = kept {
            self.keep(ask, reservation);
        }
        outcome
    }

    /// Reservations due after `now` that share a bucket with `buckets`, earliest first.
    fn reservations_after(&self, buckets: &[BucketKey], now: Millis) -> Vec<Later> {
        let shares =
            |r: &Reservation| r.slot > now && r.buckets.iter().any(|b| buckets.contains(b));
        let later = |r: &Reservation, place: Place| Later {
            slot: r.slot,
            cost: r.cost,
            buckets: r.buckets.clone(),
            place,
        };
        let exact = self
            .exact
            .iter()
            .filter(|(_, r)| shares(r))
            .map(|(key, r)| later(r, Place::Exact(key.clone())));
        let pooled = self.pools.iter().flat_map(|(key, pool)| {
            pool.iter()
                .enumerate()
                .filter(|(_, r)| shares(r))
                .map(|(index, r)| later(r, Place::Pool(key.clone(), index)))
        });
        let mut all: Vec<Later> = exact.chain(pooled).collect();
        // Ties in slot are ordered by identity, not by the tables' hash order: re-placed in
        // order on spaced slots, the order decides who gets which slot.
        let order = |r: &Later| -> (Millis, String, usize) {
            match &r.place {
                Place::Exact((_, id)) => (r.slot, id.clone(), 0),
                Place::Pool((_, id), index) => (r.slot, id.clone(), *index + 1),
            }
        };
        all.sort_by_cached_key(order);
        all
    }

    fn reservation_mut(&mut self, place: &Place) -> &mut Reservation {
        match place {
            Place::Exact(key) => self.exact.get_mut(key).expect("listed reservation"),
            Place::Pool(key, index) => &mut self.pools.get_mut(key).expect("listed pool")[*index],
        }
    }

    /// Earliest time from `from` with room in every bucket, each under its own limit.
    fn earliest_in(&self, buckets: &[BucketKey], cost: u32, from: Millis) -> Millis {
        buckets
            .iter()
            .filter_map(|key| self.buckets.get(key))
            .map(|bucket| bucket.earliest_own(cost, from))
            .max()
            .unwrap_or(from)
    }

    fn charge_in(&mut self, buckets: &[BucketKey], at: Millis, cost: u32) {
        for key in buckets {
            if let Some(bucket) = self.buckets.get_mut(key) {
                bucket.charge_own(at, cost);
            }
        }
    }

    fn uncharge(&mut self, buckets: &[BucketKey], at: Millis, cost: u32) {
        for key in buckets {
            if let Some(bucket) = self.buckets.get_mut(key) {
                bucket.uncharge(at, cost);
            }
        }
    }

    /// Marks the reservation at `slot` as used by a request that is being held until it.
    pub fn consume(&mut self, rule: &Arc<str>, identity: &Identity, slot: Millis) {
        let reservation = match identity {
            Identity::Exact(id) => self.exact.remove(&(rule.clone(), id.clone())),
            Identity::Pool(id) => {
                let key = (rule.clone(), id.clone());
                let pool = self.pools.get_mut(&key);
                let r = pool.and_then(|p| {
                    let index = p.iter().rposition(|r| r.slot == slot)?;
                    p.remove(index)
                });
                if self.pools.get(&key).is_some_and(|p| p.is_empty()) {
                    self.pools.remove(&key);
                }
                r
            }
        };
        if let Some(r) = reservation {
            self.release_share(&r);
        }
    }

    fn release_share(&mut self, reservation: &Reservation) {
        self.reservation_count = self.reservation_count.saturating_sub(1);
        for key in &reservation.buckets {
            if let Some(bucket) = self.buckets.get_mut(key) {
                if let Some(held) = bucket.reserved_by_namespace.get_mut(&reservation.namespace) {
                    *held -= 1;
                    if *held == 0 {
                        bucket.reserved_by_namespace.remove(&reservation.namespace);
                    }
                }
            }
        }
    }

    fn earliest_reservation_of(&self, namespace: &Arc<str>, key: &BucketKey) -> Option<Millis> {
        let exact = self.exact.values();
        let pooled = self.pools.values().flatten();
        exact
            .chain(pooled)
            .filter(|r| &r.namespace == namespace && r.buckets.contains(key))
            .map(|r| r.slot)
            .min()
    }

    /// Records charges without asking (the releaser's releases, window seeding).
    pub fn record(
        &mut self,
        rule: &Arc<str>,
        limits: &[Limit],
        namespace: &str,
        owner: Option<&str>,
        at: Millis,
        cost: u32,
    ) {
        let keys = self.keys_for(rule, limits, namespace, owner.unwrap_or(""));
        for (key, limit) in keys.iter().zip(limits) {
            let bucket = self.buckets.entry(key.clone()).or_default();
            bucket.trim(at.min(bucket.last()));
            // A forced charge into a full window adds nothing a decision could use,
            // and skipping it keeps a warn rule's bucket bounded under any load.
            if bucket.in_window(at) >= limit.events {
                continue;
            }
            bucket.charge(at, cost, limit);
        }
    }

    /// Earliest time the request would fit, without recording anything.
    pub fn earliest(
        &self,
        rule: &Arc<str>,
        limits: &[Limit],
        namespace: &str,
        owner: Option<&str>,
        cost: u32,
        now: Millis,
    ) -> Millis {
        self.keys_for(rule, limits, namespace, owner.unwrap_or(""))
            .iter()
            .zip(limits)
            .map(|(key, limit)| {
                self.buckets
                    .get(key)
                    .map_or(now, |b| b.earliest(limit, cost, now))
            })
            .max()
            .unwrap_or(now)
    }

    fn charge_all(
        &mut self,
        keys: &[BucketKey],
        limits: &[Limit],
        at: Millis,
        cost: u32,
        now: Millis,
    ) {
        for (key, limit) in keys.iter().zip(limits) {
            let bucket = self.buckets.entry(key.clone()).or_default();
            bucket.trim(now);
            bucket.charge(at, cost, limit);
        }
    }

    fn bucket_keys(&self, ask: &Ask<'_>) -> Vec<BucketKey> {
        // Without a controller, a request is its own owner.
        let owner = match (ask.owner, ask.identity) {
            (Some(uid), _) => uid,
            (None, Identity::Exact(id) | Identity::Pool(id)) => id.as_str(),
        };
        self.keys_for(ask.rule, ask.limits, ask.namespace, owner)
    }

    fn keys_for(
        &self,
        rule: &Arc<str>,
        limits: &[Limit],
        namespace: &str,
        owner: &str,
    ) -> Vec<BucketKey> {
        limits
            .iter()
            .enumerate()
            .map(|(index, limit)| {
                let scope = match limit.scope {
                    Scope::Global => ScopeKey::Global,
                    Scope::Namespace => ScopeKey::Namespace(Arc::from(namespace)),
                    Scope::Owner => ScopeKey::Owner(Arc::from(owner)),
                };
                let mut key = BucketKey {
                    rule: rule.clone(),
                    limit: index.min(u8::MAX as usize) as u8,
                    scope,
                };
                if key.scope != ScopeKey::Global
                    && self.buckets.len() >= self.max_buckets
                    && !self.buckets.contains_key(&key)
                {
                    key.scope = ScopeKey::Overflow;
                }
                key
            })
            .collect()
    }

    /// Drops expired reservations and idle buckets; returns usage for metrics.
    /// Call it every few seconds; cost is linear in live state.
    pub fn sweep(&mut self, now: Millis) -> Usage {
        let expired = |r: &Reservation| r.slot + RESERVATION_GRACE_MS <= now;
        let mut dropped = Vec::new();
        self.exact.retain(|_, r| {
            if expired(r) {
                dropped.push(r.clone());
                false
            } else {
                true
            }
        });
        for pool in self.pools.values_mut() {
            while pool.front().is_some_and(expired) {
                if let Some(r) = pool.pop_front() {
                    dropped.push(r);
                }
            }
        }
        self.pools.retain(|_, p| !p.is_empty());
        for r in &dropped {
            self.release_share(r);
        }
        let mut per_rule: HashMap<Arc<str>, (u32, u32)> = HashMap::new();
        self.buckets.retain(|key, bucket| {
            bucket.trim(now);
            let used = bucket.in_window(now);
            let entry = per_rule
                .entry(key.rule.clone())
                .or_insert((0, bucket.events));
            if used > entry.0 {
                *entry = (used, bucket.events);
            }
            !bucket.is_idle(now)
        });
        Usage {
            buckets: self.buckets.len(),
            reservations: self.reservation_count,
            per_rule,
        }
    }

    /// Charges in the bucket's window at `now` (tests and metrics).
    pub fn used(&self, key: &BucketKey, now: Millis) -> u32 {
        self.buckets.get(key).map_or(0, |b| b.in_window(now))
    }
}

/// Bounds against floods and clients that go away.
impl Limiter {
    /// [`Limiter::acquire`], but no slot is reserved further than `reach` after `now`: such
    /// an ask is refused with `retry_at` at the reach and leaves nothing behind. So a
    /// bucket holds at most the reservations that fit in `reach` (its limit times
    /// `reach / window`, rounded up, plus one window), whatever the number of namespaces.
    pub fn acquire_within(&mut self, ask: &Ask<'_>, now: Millis, reach: Millis) -> Outcome {
        match self.acquire(ask, now) {
            Outcome::Reserved { slot } if slot > now.saturating_add(reach) => {
                self.cancel_reservation(ask, slot);
                Outcome::Refused {
                    retry_at: now.saturating_add(reach),
                    why: RefusedWhy::BeyondReach,
                }
            }
            other => other,
        }
    }

    /// A request held until `slot` (charged there, nothing left to claim) whose client
    /// went away: the charge is given back, so the next request can have the slot.
    pub fn cancel_hold(&mut self, ask: &Ask<'_>, slot: Millis) {
        let keys = self.bucket_keys(ask);
        self.uncharge(&keys, slot, ask.cost);
    }

    /// Removes the ask's reservation at `slot` and gives its charges back.
    fn cancel_reservation(&mut self, ask: &Ask<'_>, slot: Millis) {
        let reservation = match ask.identity {
            Identity::Exact(id) => {
                let key = (ask.rule.clone(), id.clone());
                match self.exact.get(&key) {
                    Some(r) if r.slot == slot => self.exact.remove(&key),
                    _ => None,
                }
            }
            Identity::Pool(id) => {
                let key = (ask.rule.clone(), id.clone());
                let index = self
                    .pools
                    .get(&key)
                    .and_then(|pool| pool.iter().rposition(|r| r.slot == slot));
                match index {
                    Some(index) => self.take_reservation(&key, ask.identity, index),
                    None => None,
                }
            }
        };
        if let Some(r) = reservation {
            self.release_share(&r);
            self.uncharge(&r.buckets, r.slot, r.cost);
        }
    }
}

mod copy;

#[cfg(test)]
mod tests;
