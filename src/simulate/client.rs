//! client-go as the modelled controllers use it: the client's token bucket, the work
//! queue (dedup, per-item exponential backoff, the overall bucket), and the releasers'
//! fair queue (round-robin across namespaces, oldest first).

use crate::limiter::Millis;
use std::collections::{HashMap, VecDeque};

/// golang.org/x/time/rate.Limiter as client-go uses it: reservations may go negative,
/// and the caller waits the returned delay.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Millis,
}

impl TokenBucket {
    /// qps 0 means unlimited.
    pub fn new(qps: f64, burst: u32) -> TokenBucket {
        TokenBucket {
            qps,
            burst: burst as f64,
            tokens: burst as f64,
            last: 0,
        }
    }

    /// Takes one token at `now`; returns how long the caller must wait for it.
    pub fn reserve(&mut self, now: Millis) -> Millis {
        if self.qps <= 0.0 {
            return 0;
        }
        if now > self.last {
            let refill = (now - self.last) as f64 * self.qps / 1000.0;
            self.tokens = (self.tokens + refill).min(self.burst);
            self.last = now;
        }
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            0
        } else {
            (-self.tokens * 1000.0 / self.qps).ceil() as Millis
        }
    }
}

/// client-go's per-item exponential failure backoff: base × 2^failures, capped.
pub fn item_backoff(base: Millis, max: Millis, failures: u32) -> Millis {
    if failures >= 63 {
        return max;
    }
    base.saturating_mul(1u64 << failures).min(max)
}

/// client-go's rate-limited work queue (dirty/processing sets, delaying queue, and the
/// default controller rate limiter: max of per-item exponential and an overall bucket).
#[derive(Debug)]
pub struct WorkQueue {
    queue: VecDeque<u32>,
    dirty: Vec<bool>,
    processing: Vec<bool>,
    failures: Vec<u32>,
    /// Earliest pending AddAfter per item.
    waiting: Vec<Option<Millis>>,
    bucket: TokenBucket,
    base: Millis,
    max: Millis,
}

impl WorkQueue {
    pub fn new(items: usize, base: Millis, max: Millis, qps: f64, burst: u32) -> WorkQueue {
        WorkQueue {
            queue: VecDeque::new(),
            dirty: vec![false; items],
            processing: vec![false; items],
            failures: vec![0; items],
            waiting: vec![None; items],
            bucket: TokenBucket::new(qps, burst),
            base,
            max,
        }
    }

    pub fn add(&mut self, item: u32) {
        let i = item as usize;
        if self.dirty[i] {
            return;
        }
        self.dirty[i] = true;
        if self.processing[i] {
            return;
        }
        self.queue.push_back(item);
    }

    pub fn get(&mut self) -> Option<u32> {
        let item = self.queue.pop_front()?;
        self.processing[item as usize] = true;
        self.dirty[item as usize] = false;
        Some(item)
    }

    pub fn done(&mut self, item: u32) {
        let i = item as usize;
        self.processing[i] = false;
        if self.dirty[i] {
            self.queue.push_back(item);
        }
    }

    pub fn forget(&mut self, item: u32) {
        self.failures[item as usize] = 0;
    }

    /// AddRateLimited: the delay after which the caller must `add` the item, or None when
    /// an earlier AddAfter of the same item is already pending.
    pub fn add_rate_limited(&mut self, item: u32, now: Millis) -> Option<Millis> {
        let i = item as usize;
        let exp = item_backoff(self.base, self.max, self.failures[i]);
        self.failures[i] = self.failures[i].saturating_add(1);
        let delay = exp.max(self.bucket.reserve(now));
        let at = now + delay;
        match self.waiting[i] {
            Some(pending) if pending <= at => None,
            _ => {
                self.waiting[i] = Some(at);
                Some(at)
            }
        }
    }

    /// The delaying queue fired for `item` at `at`; true when that is still current.
    pub fn fire(&mut self, item: u32, at: Millis) -> bool {
        let i = item as usize;
        if self.waiting[i] == Some(at) {
            self.waiting[i] = None;
            true
        } else {
            false
        }
    }

    #[cfg(test)]
    pub fn failures(&self, item: u32) -> u32 {
        self.failures[item as usize]
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[derive(Debug, Default)]
pub struct FairQueue {
    lanes: HashMap<u32, VecDeque<u32>>,
    ring: VecDeque<u32>,
    len: usize,
}

impl FairQueue {
    pub fn push(&mut self, namespace: u32, item: u32) {
        let lane = self.lanes.entry(namespace).or_default();
        if lane.is_empty() {
            self.ring.push_back(namespace);
        }
        lane.push_back(item);
        self.len += 1;
    }

    /// The next namespace's oldest item, without taking it.
    pub fn peek(&self) -> Option<(u32, u32)> {
        let ns = *self.ring.front()?;
        let item = *self.lanes.get(&ns)?.front()?;
        Some((ns, item))
    }

    /// Takes the front namespace's oldest item; its namespace goes to the back of the ring.
    pub fn pop(&mut self) -> Option<(u32, u32)> {
        let ns = self.ring.pop_front()?;
        let lane = self.lanes.get_mut(&ns)?;
        let item = lane.pop_front()?;
        if lane.is_empty() {
            self.lanes.remove(&ns);
        } else {
            self.ring.push_back(ns);
        }
        self.len -= 1;
        Some((ns, item))
    }

    /// Moves the front namespace to the back without serving it (its head does not fit).
    pub fn skip(&mut self) {
        if let Some(ns) = self.ring.pop_front() {
            self.ring.push_back(ns);
        }
    }

    pub fn namespaces(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }
}
