//! Exact sliding-window limiter with reservations of future slots.
//! Pure: time comes in as milliseconds, nothing here reads a clock or sleeps.
//!
//! Each bucket keeps its charges in time order, reserved future slots included. A
//! request of cost `k` fits at time `t` when every window of length `window` holding
//! `t` keeps at most `events` charges with it. After the last charge only `(t - window,
//! t]` matters, so the earliest slot there is `charges[n - 1 - (events - k)] + window`;
//! before reserved slots a gap may fit, and a bounded number of gaps is examined
//! (bucket.rs). Reservations (reservations.rs) are kept per identity or pool, claimed by
//! their retry, and moved back behind a late retry.
//!
//! A limit with a `burst` below its events adds a spacing constraint on the same charges,
//! a GCRA (virtual scheduling) with tolerance `burst - 1` intervals: after at most `burst`
//! at once, consecutive charges lie `spacing` apart. Both must hold at every charge; a
//! spaced limit keeps its window with a margin ([`Limit::kept_window_ms`]).

mod bucket;
mod reservations;

use crate::policy::{Limit, Scope};
pub use bucket::spaced_after;
use bucket::Bucket;
use reservations::Reservation;
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
    /// Shared by namespace/owner keys that arrive while the bucket table is full, and by
    /// any key without a bucket while it lives (sweeps drop it once idle): stricter than
    /// their own buckets, never looser.
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

/// What a sweep found, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub buckets: usize,
    pub reservations: usize,
    /// Per rule: the charges in the current window of the fullest bucket of its first
    /// limit (the limit `churn_throttler_window_limit` shows, so the two gauges pair up).
    pub per_rule: HashMap<Arc<str>, u32>,
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
        if let Some(outcome) = self.claim(ask.rule, ask, now) {
            return outcome;
        }
        let keys = self.bucket_keys(ask);
        // Room now in every bucket is the common allow, and needs no search for a later
        // gap: exactly when that search would answer `now` (`Bucket::fits_at`).
        let fits_now = keys.iter().zip(ask.limits).all(|(key, limit)| {
            self.buckets
                .get(key)
                .is_none_or(|bucket| bucket.fits_at(limit, ask.cost, now))
        });
        if fits_now {
            if !ask.dry_run {
                self.charge_all(&keys, ask.limits, now, ask.cost, now);
            }
            return Outcome::Admitted;
        }
        if !ask.reserve || ask.dry_run {
            return Outcome::Refused {
                retry_at: self.slot(&keys, ask, now),
                why: RefusedWhy::NotReserving,
            };
        }
        // Fair share: a namespace holding its share of future slots in any bucket waits
        // for its own earliest reservation instead of taking more. Checked before the
        // search for a slot, which it does not need: under a mass re-creation most asks
        // end here, and a fully booked future is the costly part to search.
        for key in &keys {
            let Some(bucket) = self.buckets.get(key) else {
                continue;
            };
            let held = bucket
                .reserved_by_namespace
                .get(ask.namespace)
                .map_or(0, |held| held.count);
            if held >= ask.max_reserved_per_namespace {
                let retry_at = match self.earliest_reservation_of(ask.namespace, key) {
                    Some(at) => at,
                    None => self.slot(&keys, ask, now),
                };
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
        let slot = self.slot(&keys, ask, now);
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
                namespace: Arc::from(ask.namespace),
                buckets: keys,
            },
        );
        Outcome::Reserved { slot }
    }

    /// The earliest slot with room in every bucket, aligned for Retry-After when it lies
    /// beyond the ask's hold (after `now`: the caller knows it does not fit now).
    fn slot(&self, keys: &[BucketKey], ask: &Ask<'_>, now: Millis) -> Millis {
        let slot = self.earliest_common(keys, now, |bucket, index, t| {
            bucket.earliest(&ask.limits[index], ask.cost, t)
        });
        match ask.align_beyond {
            Some(threshold) if slot > now + threshold => self.aligned(keys, ask, now, slot),
            _ => slot,
        }
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

    /// Earliest time from `from` with room in every bucket, each under its own limit.
    fn earliest_in(&self, buckets: &[BucketKey], cost: u32, from: Millis) -> Millis {
        self.earliest_common(buckets, from, |bucket, _, t| bucket.earliest_own(cost, t))
    }

    /// Earliest time from `now` with room in every one of `keys`' buckets, `earliest`
    /// giving one bucket's (by its index in `keys`) from a time. The latest of the
    /// buckets' answers from `now` is not enough: one bucket may fit at `now` in a gap
    /// before its reserved slots, and not at the later time another needs. So each is
    /// asked again from the latest answer until none moves it. Past every bucket's last
    /// charge a bucket's answer is the later of the time asked and a bound of its own,
    /// so after a bounded number of rounds, asking once from there is the answer.
    fn earliest_common(
        &self,
        keys: &[BucketKey],
        now: Millis,
        earliest: impl Fn(&Bucket, usize, Millis) -> Millis,
    ) -> Millis {
        let from = |t: Millis| {
            keys.iter()
                .enumerate()
                .filter_map(|(index, key)| Some(earliest(self.buckets.get(key)?, index, t)))
                .fold(t, Millis::max)
        };
        let mut t = now;
        for _ in 0..MAX_GAP_CANDIDATES {
            let next = from(t);
            if next == t {
                return t;
            }
            t = next;
        }
        let last = keys
            .iter()
            .filter_map(|key| self.buckets.get(key))
            .map(Bucket::last)
            .fold(t, Millis::max);
        from(last)
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
        let keys = self.keys_for(rule, limits, namespace, owner.unwrap_or(""));
        self.earliest_common(&keys, now, |bucket, index, t| {
            bucket.earliest(&limits[index], cost, t)
        })
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
                if key.scope != ScopeKey::Global && !self.buckets.contains_key(&key) {
                    // While the limit's overflow bucket lives, a key without a bucket goes
                    // there even when the table has room again: its earlier charges may be
                    // in it, and a fresh bucket of its own would not see them.
                    let overflow = BucketKey {
                        scope: ScopeKey::Overflow,
                        ..key.clone()
                    };
                    if self.buckets.len() >= self.max_buckets
                        || self.buckets.contains_key(&overflow)
                    {
                        key = overflow;
                    }
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
        let mut per_rule: HashMap<Arc<str>, u32> = HashMap::new();
        self.buckets.retain(|key, bucket| {
            bucket.trim(now);
            if key.limit == 0 {
                let used = per_rule.entry(key.rule.clone()).or_insert(0);
                *used = (*used).max(bucket.in_window(now));
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
}

mod copy;

#[cfg(test)]
mod tests;
