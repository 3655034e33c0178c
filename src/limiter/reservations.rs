//! Reservations of future slots: kept per identity (or per pool of interchangeable
//! requests), claimed by the retry they were made for, moved back behind a late retry,
//! given back when a hold is abandoned. Pure, like the rest of the limiter.

use super::{Ask, BucketKey, Identity, Limiter, Millis, Outcome};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub(super) struct Reservation {
    pub(super) slot: Millis,
    pub(super) cost: u32,
    pub(super) namespace: Arc<str>,
    pub(super) buckets: Vec<BucketKey>,
}

/// Where a reservation lives: an exact identity's key, or a pool's key and position.
pub(super) enum Place {
    Exact((Arc<str>, String)),
    Pool((Arc<str>, String), usize),
}

/// A reservation after a late retry's, taken out and placed again behind it.
pub(super) struct Later {
    /// Its slot before it moves.
    pub(super) slot: Millis,
    pub(super) cost: u32,
    pub(super) buckets: Vec<BucketKey>,
    pub(super) place: Place,
}
impl Limiter {
    /// Stores a reservation for the ask's identity and counts it in its namespace's share.
    pub(super) fn keep(&mut self, ask: &Ask<'_>, reservation: Reservation) {
        for key in &reservation.buckets {
            if let Some(bucket) = self.buckets.get_mut(key) {
                bucket
                    .reserved_by_namespace
                    .entry(reservation.namespace.clone())
                    .or_default()
                    .add(reservation.slot);
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

    /// A request whose reservation exists: due ones are used up, early ones wait, late
    /// ones are placed again from `now`. `None`: no reservation to use, decide afresh.
    pub(super) fn claim(&mut self, rule: &Arc<str>, ask: &Ask<'_>, now: Millis) -> Option<Outcome> {
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
    pub(super) fn take_reservation(
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
    pub(super) fn reclaim_late(
        &mut self,
        ask: &Ask<'_>,
        late: Reservation,
        now: Millis,
    ) -> Outcome {
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
            self.move_share(&r.place, &r.buckets, r.slot, slot);
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
    pub(super) fn reservations_after(&self, buckets: &[BucketKey], now: Millis) -> Vec<Later> {
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

    pub(super) fn reservation_mut(&mut self, place: &Place) -> &mut Reservation {
        match place {
            Place::Exact(key) => self.exact.get_mut(key).expect("listed reservation"),
            Place::Pool(key, index) => &mut self.pools.get_mut(key).expect("listed pool")[*index],
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

    pub(super) fn release_share(&mut self, reservation: &Reservation) {
        self.reservation_count = self.reservation_count.saturating_sub(1);
        for key in &reservation.buckets {
            if let Some(bucket) = self.buckets.get_mut(key) {
                let held = bucket.reserved_by_namespace.get_mut(&reservation.namespace);
                if held.is_some_and(|held| held.remove(reservation.slot)) {
                    bucket.reserved_by_namespace.remove(&reservation.namespace);
                }
            }
        }
    }

    /// The earliest slot `namespace` holds in `key`'s bucket, from the bucket's index of
    /// them: no scan of the reservation table.
    pub(super) fn earliest_reservation_of(
        &self,
        namespace: &str,
        key: &BucketKey,
    ) -> Option<Millis> {
        self.buckets
            .get(key)?
            .reserved_by_namespace
            .get(namespace)?
            .earliest()
    }

    /// A reservation moved from `from` to `to`: its buckets' index of slots follows.
    fn move_share(&mut self, place: &Place, buckets: &[BucketKey], from: Millis, to: Millis) {
        let reservation = self.reservation_mut(place);
        reservation.slot = to;
        let namespace = reservation.namespace.clone();
        for key in buckets {
            let held = self
                .buckets
                .get_mut(key)
                .and_then(|b| b.reserved_by_namespace.get_mut(&namespace));
            if let Some(held) = held {
                held.remove(from);
                held.add(to);
            }
        }
    }

    /// Removes the ask's reservation at `slot` and gives its charges back.
    pub(super) fn cancel_reservation(&mut self, ask: &Ask<'_>, slot: Millis) {
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
