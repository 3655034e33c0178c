//! The network in the model: one FIFO CNI that wires bound pods one after another at the
//! scenario's rate, then the base network time, and the adaptive rules' shared window fed
//! by the network-ready times, as the releaser feeds it (crate::pacing::network).

use super::*;
use crate::pacing::network::{censored, Sample};
use crate::simulate::scenario::Cni;
use std::collections::VecDeque;

/// The CNI's queue: wired times of the pods bound and not yet wired, in order.
#[derive(Debug, Default, Clone)]
pub struct Fifo {
    /// When the CNI is done with every pod bound so far.
    free: Millis,
    wiring: VecDeque<Millis>,
}

impl Fifo {
    /// A pod bound at `now`: when it is wired, and the queue it joins (itself and the
    /// pod being wired included).
    pub fn bind(&mut self, cni: &Cni, now: Millis) -> (Millis, u32) {
        while self.wiring.front().is_some_and(|&w| w <= now) {
            self.wiring.pop_front();
        }
        let wired = cni.wired(self.free.max(now));
        self.free = wired;
        self.wiring.push_back(wired);
        (wired, self.wiring.len() as u32)
    }
}

/// The deepest CNI queue at any time from `from` on, from the (bound, wired) spans.
pub fn queue_max_from(spans: &[(Millis, Millis)], from: Millis) -> u32 {
    // The queue only grows at a binding, so its maximum from `from` on is at `from` or
    // at a binding after it.
    let at = |t: Millis| spans.iter().filter(|&&(b, w)| b <= t && t < w).count() as u32;
    let mut deepest = at(from);
    let mut open: VecDeque<Millis> = VecDeque::new();
    for &(bound, wired) in spans {
        while open.front().is_some_and(|&w| w <= bound) {
            open.pop_front();
        }
        open.push_back(wired);
        if bound >= from {
            deepest = deepest.max(open.len() as u32);
        }
    }
    deepest
}

impl<'a> Sim<'a> {
    /// The pod is bound: into the CNI's queue; network-ready after its wiring and the
    /// base network time.
    pub(super) fn bind(&mut self, p: u32) {
        let now = self.now;
        let Some(cni) = self.sc.cni.as_ref() else {
            return;
        };
        let (wired, _) = self.net.fifo.bind(cni, now);
        let up = wired + cni.base;
        self.out.cni_spans.push((now, wired));
        let pod = &mut self.pods[p as usize];
        pod.bound_at = now;
        pod.net_up = false;
        pod.sampled = false;
        let generation = pod.generation;
        let sampled = pod_sampled_by_window(pod);
        self.at(up, Ev::NetReady { pod: p, generation });
        let bound = self.net.window.as_ref().map(|w| w.config().bound_ms);
        if let (Some(bound), true) = (bound, sampled) {
            self.at(now + bound, Ev::NetBound { pod: p, generation });
        }
    }

    fn workload(&self, p: u32) -> String {
        match self.pods[p as usize].owner {
            Owner::Sts(s) => self.sets[s as usize].uid.clone(),
            Owner::Dep(d) => self.deps[d as usize].name.clone(),
        }
    }

    fn observe(&mut self, sample: Sample) {
        let Some(w) = self.net.window.as_mut() else {
            return;
        };
        let before = w.window();
        w.observe(&sample);
        let after = w.window();
        if after != before {
            self.out.window.push((self.now, after));
        }
    }

    pub(super) fn net_ready(&mut self, p: u32, generation: u32) {
        let now = self.now;
        let pod = &mut self.pods[p as usize];
        if pod.generation != generation || pod.phase != Phase::Starting || pod.net_up {
            return;
        }
        pod.net_up = true;
        let bound_at = pod.bound_at;
        let sample = pod_sampled_by_window(pod) && !std::mem::replace(&mut pod.sampled, true);
        if std::mem::take(&mut pod.net_pending) {
            self.net.in_flight = self.net.in_flight.saturating_sub(1);
        }
        if sample {
            let workload = self.workload(p);
            self.observe(Sample {
                workload,
                started: bound_at,
                ready: now,
                censored: false,
            });
        }
        let ready = now + self.delay(p, generation, 2, self.sc.start);
        self.at(ready, Ev::PodReady { pod: p, generation });
        self.wake_adaptive();
    }

    /// The bound after binding passed: a pod whose network is still not up is a sample at
    /// the bound (never left out).
    pub(super) fn net_bound(&mut self, p: u32, generation: u32) {
        let pod = &mut self.pods[p as usize];
        if pod.generation != generation || pod.phase != Phase::Starting || pod.net_up {
            return;
        }
        if std::mem::replace(&mut pod.sampled, true) {
            return;
        }
        let bound_at = pod.bound_at;
        let Some(bound) = self.net.window.as_ref().map(|w| w.config().bound_ms) else {
            return;
        };
        let workload = self.workload(p);
        self.observe(censored(&workload, bound_at, bound));
        self.wake_adaptive();
    }

    /// A gate released pod `p` under gate `g`: it waits for its network in the window
    /// when the rule is adaptive.
    pub(super) fn released(&mut self, p: u32, g: usize) {
        let now = self.now;
        let adaptive = self.net.window.is_some() && self.gate_adaptive(g);
        let pod = &mut self.pods[p as usize];
        pod.released_at = now;
        if adaptive {
            pod.net_pending = true;
            self.net.in_flight += 1;
        }
    }

    /// A pod the webhook admitted at once under an adaptive gate rule: a release, so it
    /// waits for its network in the window.
    pub(super) fn admitted_at_once(&mut self, p: u32) {
        if self.net.window.is_some() {
            self.pods[p as usize].net_pending = true;
            self.net.in_flight += 1;
        }
    }

    /// The window has no room for one more pod: released pods of adaptive rules whose
    /// network is not up, and the gated ones waiting before it.
    pub(super) fn network_full(&self) -> bool {
        let Some(w) = self.net.window.as_ref() else {
            return false;
        };
        let waiting: usize = (0..self.gates.len())
            .filter(|&g| self.gate_adaptive(g))
            .map(|g| self.gates[g].queue.len() + self.gates[g].real_queue.len())
            .sum();
        self.net.in_flight as u64 + waiting as u64 >= u64::from(w.window())
    }

    pub(super) fn gate_adaptive(&self, g: usize) -> bool {
        self.policy.rules[self.gates[g].rule].adaptive
    }

    /// The shared window as a round of an adaptive rule sees it (None: not adaptive).
    pub(super) fn network_room(&self) -> Option<NetworkRoom> {
        self.net.window.as_ref().map(|w| NetworkRoom {
            in_flight: self.net.in_flight,
            window: w.window(),
        })
    }

    /// Room for partition steps (`NetworkRoom::for_steps`): released pods of adaptive
    /// rules whose network is not up and the gated pods of adaptive rules still waiting,
    /// as the releaser counts them. Steps whose old pod is still terminating are not counted (the
    /// rate bounds them: about rate x termination time). None: the partition rule is not
    /// adaptive.
    pub(super) fn partition_room(&self) -> Option<u32> {
        let w = self.net.window.as_ref()?;
        let rule = self.partition.as_ref().map(|p| p.rule)?;
        if !self.policy.rules[rule].adaptive {
            return None;
        }
        let waiting: usize = (0..self.gates.len())
            .filter(|&g| self.gate_adaptive(g))
            .map(|g| self.gates[g].queue.len() + self.gates[g].real_queue.len())
            .sum();
        let room = NetworkRoom {
            in_flight: self.net.in_flight,
            window: w.window(),
        };
        Some(room.for_steps(u32::try_from(waiting).unwrap_or(u32::MAX)))
    }

    /// A pod's network came up or the window moved: the adaptive releasers look again.
    fn wake_adaptive(&mut self) {
        let now = self.now;
        for g in 0..self.gates.len() {
            if self.gate_adaptive(g) {
                self.wake_gate(g, now);
            }
        }
        if self.partition_room().is_some() {
            self.wake_partition(now);
        }
    }
}

/// Pods whose network time the window takes: those an adaptive rule released.
fn pod_sampled_by_window(pod: &Pod) -> bool {
    pod.net_pending
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::scenario::parse_cni_rate;

    fn cni(rate: &str, base: Millis) -> Cni {
        Cni {
            rates: parse_cni_rate(rate).expect("rate"),
            base,
        }
    }

    #[test]
    fn fifo_wires_one_after_another() {
        // (rate, binding times, wired times, queue joined)
        type Case<'a> = (&'a str, &'a [Millis], &'a [Millis], &'a [u32]);
        let cases: &[Case] = &[
            ("1/s", &[0, 0, 0], &[1000, 2000, 3000], &[1, 2, 3]),
            ("1/s", &[0, 500, 5000], &[1000, 2000, 6000], &[1, 2, 1]),
            ("2/s", &[0, 100, 1100], &[500, 1000, 1600], &[1, 2, 1]),
            ("0.25/s", &[0, 0], &[4000, 8000], &[1, 2]),
            // A step: the rate when a pod's wiring begins.
            (
                "10/s,1/s@1s",
                &[0, 0, 900, 900],
                &[100, 200, 1000, 2000],
                &[1, 2, 1, 2],
            ),
            ("1/s,10/s@2s", &[0, 0, 0], &[1000, 2000, 2100], &[1, 2, 3]),
        ];
        for (rate, bound, wired, queue) in cases {
            let c = cni(rate, 2000);
            let mut fifo = Fifo::default();
            let got: Vec<(Millis, u32)> = bound.iter().map(|&b| fifo.bind(&c, b)).collect();
            let want: Vec<(Millis, u32)> =
                wired.iter().copied().zip(queue.iter().copied()).collect();
            assert_eq!(got, want, "rate {rate}, bound {bound:?}");
            let spans: Vec<(Millis, Millis)> =
                bound.iter().copied().zip(wired.iter().copied()).collect();
            assert_eq!(
                queue_max_from(&spans, 0),
                queue.iter().copied().max().unwrap_or(0),
                "rate {rate}: the deepest queue from the spans"
            );
        }
    }

    #[test]
    fn queue_max_from_a_time_on() {
        // Three pods queued at 0 (wired at 1, 2, 3 s), one bound at 5 s.
        let spans = [(0, 1000), (0, 2000), (0, 3000), (5000, 6000)];
        let cases = [
            (0, 3),
            (1000, 2),
            (1500, 2),
            (2500, 1),
            (3000, 1),
            (7000, 0),
        ];
        for (from, want) in cases {
            assert_eq!(queue_max_from(&spans, from), want, "from {from}");
        }
    }

    #[test]
    fn cni_rates_parse_and_refuse() {
        assert_eq!(parse_cni_rate("0.5/s"), Ok(vec![(0, 0.5)]));
        assert_eq!(
            parse_cni_rate("10/s, 1/s@60s"),
            Ok(vec![(0, 10.0), (60_000, 1.0)])
        );
        for bad in [
            "",
            "5",
            "0/s",
            "-1/s",
            "1/s@5s",
            "10/s,1/s",
            "1/s,2/s@10s,3/s@5s",
        ] {
            assert!(parse_cni_rate(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
