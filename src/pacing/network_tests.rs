use super::*;
use proptest::prelude::*;

fn config() -> NetworkConfig {
    NetworkConfig {
        min_window: 2,
        max_window: 200,
        bound_ms: 60_000,
        floor_period_ms: 600_000,
    }
}

fn sample(workload: &str, started: Millis, latency: Millis) -> Sample {
    Sample {
        workload: workload.into(),
        started,
        ready: started + latency,
        censored: false,
    }
}

/// A FIFO CNI wiring one pod at a time at `per_s` pods per second, then `base_ms` until
/// the network is up; releases as many as the window has room for, every 100 ms, for
/// `secs` seconds. Returns the window and the deepest queue (bound, not yet wired) seen
/// after `settle_s`, and the window's range after it.
struct Cni {
    per_s: f64,
    base_ms: Millis,
}

struct Run {
    windows: Vec<(Millis, u32)>,
    queue_max_after_settle: usize,
    latency_max_after_settle: Millis,
}

fn run(window: &mut NetworkWindow, cni: &Cni, secs: u64, settle_s: u64, pending: usize) -> Run {
    run_from(window, cni, 0, secs, settle_s, pending)
}

/// `run` on a clock that starts at `from_ms` (a second network after a first one).
fn run_from(
    window: &mut NetworkWindow,
    cni: &Cni,
    from_ms: Millis,
    secs: u64,
    settle_s: u64,
    pending: usize,
) -> Run {
    let step: Millis = 10;
    let service = (1000.0 / cni.per_s) as Millis;
    let mut queue: VecDeque<Millis> = VecDeque::new(); // bound times, FIFO
    let mut wiring: Option<(Millis, Millis)> = None; // (bound, wired at)
    let mut based: Vec<(Millis, Millis)> = Vec::new(); // (bound, network up at)
    let mut left = pending;
    let mut out = Run {
        windows: Vec::new(),
        queue_max_after_settle: 0,
        latency_max_after_settle: 0,
    };
    let mut now: Millis = from_ms;
    let (end, settle) = (from_ms + secs * 1000, from_ms + settle_s * 1000);
    while now <= end {
        // the CNI
        if let Some((bound, done)) = wiring {
            if done <= now {
                based.push((bound, done + cni.base_ms));
                wiring = None;
            }
        }
        if wiring.is_none() {
            if let Some(bound) = queue.pop_front() {
                wiring = Some((bound, now + service));
            }
        }
        based.sort_by_key(|&(_, up)| up);
        while based.first().is_some_and(|&(_, up)| up <= now) {
            let (bound, up) = based.remove(0);
            window.observe(&sample("app", bound, up - bound));
            if now >= settle {
                out.latency_max_after_settle = out.latency_max_after_settle.max(up - bound);
            }
        }
        // releases (bound at once)
        let in_flight = (queue.len() + usize::from(wiring.is_some()) + based.len()) as u32;
        let room = window.room(in_flight) as usize;
        for _ in 0..room.min(left) {
            queue.push_back(now);
            left -= 1;
        }
        if now >= settle {
            out.queue_max_after_settle = out
                .queue_max_after_settle
                .max(queue.len() + usize::from(wiring.is_some()));
        }
        out.windows.push((now, window.window()));
        now += step;
    }
    out
}

#[test]
fn table_of_constant_networks_the_window_settles_near_the_product() {
    // (case, pods/s, base ms): the window after 60 s stays within +/-25 % of the
    // bandwidth-delay product plus the headroom, and the CNI queue within max(5, 2 s x C).
    let cases: &[(&str, f64, Millis)] = &[
        ("0.5 pods/s", 0.5, 2_000),
        ("1 pod/s", 1.0, 2_000),
        ("2 pods/s", 2.0, 2_000),
        ("5 pods/s", 5.0, 2_000),
        ("20 pods/s", 20.0, 2_000),
    ];
    for (name, per_s, base_ms) in cases {
        let cni = Cni {
            per_s: *per_s,
            base_ms: *base_ms,
        };
        let mut w = NetworkWindow::new(config(), None);
        let out = run(&mut w, &cni, 240, 60, 100_000);
        let floor_s = 1.0 / per_s + *base_ms as f64 / 1000.0;
        let target = per_s * floor_s + HEADROOM;
        let after: Vec<u32> = out
            .windows
            .iter()
            .filter(|(t, _)| *t >= 60_000)
            .map(|&(_, w)| w)
            .collect();
        let (lo, hi) = (
            *after.iter().min().unwrap_or(&0),
            *after.iter().max().unwrap_or(&0),
        );
        assert!(
            f64::from(lo) >= (0.75 * target).floor() && f64::from(hi) <= (1.25 * target).ceil(),
            "{name}: window {lo}..{hi} after 60 s, product + headroom {target:.1}"
        );
        let queue_bound = (2.0 * per_s).max(5.0) as usize;
        assert!(
            out.queue_max_after_settle <= queue_bound,
            "{name}: CNI queue {} over {queue_bound}",
            out.queue_max_after_settle
        );
        let latency_bound = (3.0 * floor_s * 1000.0) as Millis;
        assert!(
            out.latency_max_after_settle <= latency_bound,
            "{name}: network time {} ms over 3 x the unloaded {floor_s:.2} s",
            out.latency_max_after_settle
        );
    }
}

#[test]
fn a_step_down_of_the_network_shrinks_the_window_within_30_s() {
    let mut w = NetworkWindow::new(config(), None);
    let fast = Cni {
        per_s: 10.0,
        base_ms: 2_000,
    };
    run(&mut w, &fast, 60, 60, 100_000);
    let before = w.window();
    let slow = Cni {
        per_s: 1.0,
        base_ms: 2_000,
    };
    // Continue on the slow network (the pods in flight at the step are forgotten by this
    // small model; the simulator keeps them).
    let out = run_from(&mut w, &slow, 60_000, 60, 30, 100_000);
    assert!(
        out.queue_max_after_settle <= 5,
        "queue {} 30 s after the step (window before {before}, after {})",
        out.queue_max_after_settle,
        w.window()
    );
}

#[test]
fn many_small_workloads_cannot_hide_a_queue() {
    // Each workload's single pod comes through a congested network (8 s where the
    // network's floor is 2 s): judged against itself none would show the queue.
    let mut w = NetworkWindow::new(config(), Some(40));
    w.observe(&sample("first", 0, 2_000));
    for i in 0..20u64 {
        w.observe(&sample(&format!("w{i}"), 1_000 + i * 100, 8_000));
    }
    assert_eq!(w.status().last_change, Change::Queue);
    assert!(w.window() < 40, "window {}", w.window());
}

#[test]
fn a_censored_sample_cuts_and_never_grows() {
    let mut w = NetworkWindow::new(config(), Some(50));
    for i in 0..10 {
        w.observe(&sample("app", i * 1000, 2_000));
    }
    let before = w.window();
    w.observe(&censored("app", 20_000, 60_000));
    assert!(w.window() <= before, "{} > {before}", w.window());
    assert_eq!(w.status().last_change, Change::Queue);
}

#[test]
fn a_new_leader_starts_from_the_recorded_window_within_the_bounds() {
    assert_eq!(NetworkWindow::new(config(), Some(17)).window(), 17);
    assert_eq!(NetworkWindow::new(config(), Some(1)).window(), 2);
    assert_eq!(NetworkWindow::new(config(), Some(999)).window(), 200);
    // Nothing recorded: the initial window, within the bounds.
    assert_eq!(NetworkWindow::new(config(), None).window(), INITIAL_WINDOW);
    let narrow = NetworkConfig {
        max_window: 3,
        ..config()
    };
    assert_eq!(NetworkWindow::new(narrow, None).window(), 3);
    let high_floor = NetworkConfig {
        min_window: 6,
        ..config()
    };
    assert_eq!(NetworkWindow::new(high_floor, None).window(), 6);
}

#[test]
fn floors_are_kept_per_workload_and_bounded() {
    let mut w = NetworkWindow::new(config(), None);
    // A workload with a slower network of its own, once its floor is established, does
    // not look congested; before that it is judged against the least floor anyone shows.
    w.observe(&sample("web", 0, 2_000));
    w.observe(&sample("db", 0, 8_000));
    assert_eq!(
        w.status().last_change,
        Change::Queue,
        "judged against web's 2 s"
    );
    for i in 1..FLOOR_SAMPLES as u64 {
        w.observe(&sample("db", i * 1_000, 8_000 + i));
    }
    w.observe(&sample("db", 10_000, 8_100));
    assert_eq!(w.status().floor_ms, Some(8_000));
    assert_ne!(
        w.status().last_change,
        Change::Queue,
        "db's own floor is established"
    );
    for i in 0..(MAX_WORKLOADS as u64 + 10) {
        w.observe(&sample(&format!("w{i}"), 10_000 + i, 2_000));
    }
    assert!(w.workloads() <= MAX_WORKLOADS);
}

fn pod(uid: &str) -> PodNetwork {
    PodNetwork {
        uid: uid.into(),
        workload: "ns/Deployment/web".into(),
        released_at: Some(1_000),
        bound: false,
        node: None,
        network_ready: false,
        has_network_condition: false,
        ready: false,
        deleting: false,
    }
}

#[test]
fn table_of_tracked_pods() {
    // (case, rounds of (now, the pod as seen), samples expected (started, ready, censored),
    //  in flight after the last round, (deleted first, on a node not Ready)); the node
    //  "sick" is not Ready, every other is.
    type Round = (Millis, PodNetwork);
    type Case<'a> = (
        &'a str,
        Vec<Round>,
        Vec<(Millis, Millis, bool)>,
        u32,
        (u32, u32),
    );
    let bound = |p: PodNetwork| PodNetwork {
        bound: true,
        node: Some("n1".into()),
        ..p
    };
    let on_sick = |p: PodNetwork| PodNetwork {
        bound: true,
        node: Some("sick".into()),
        ..p
    };
    let up = |p: PodNetwork| PodNetwork {
        network_ready: true,
        has_network_condition: true,
        ..p
    };
    let ready = |p: PodNetwork| PodNetwork { ready: true, ..p };
    let cases: Vec<Case> = vec![
        (
            "bound then network up: from the binding seen",
            vec![
                (1_100, pod("a")),
                (1_300, bound(pod("a"))),
                (3_300, up(bound(pod("a")))),
            ],
            vec![(1_300, 3_300, false)],
            0,
            (0, 0),
        ),
        (
            "no condition from this kubelet: release -> Ready",
            vec![(1_100, bound(pod("a"))), (4_000, ready(bound(pod("a"))))],
            vec![(1_000, 4_000, false)],
            0,
            (0, 0),
        ),
        (
            "with the condition, Ready alone is no sample",
            vec![
                (1_100, bound(pod("a"))),
                (
                    2_000,
                    PodNetwork {
                        has_network_condition: true,
                        ..ready(bound(pod("a")))
                    },
                ),
            ],
            vec![],
            1,
            (0, 0),
        ),
        (
            "never up: one sample at the bound, still in flight",
            vec![
                (1_100, bound(pod("a"))),
                (70_000, bound(pod("a"))),
                (80_000, bound(pod("a"))),
            ],
            vec![(1_100, 61_100, true)],
            1,
            (0, 0),
        ),
        (
            "deleted before its network came: left out, counted",
            vec![
                (1_100, bound(pod("a"))),
                (
                    1_500,
                    PodNetwork {
                        deleting: true,
                        ..bound(pod("a"))
                    },
                ),
            ],
            vec![],
            0,
            (1, 0),
        ),
        (
            "first seen already up (a new leader): no sample",
            vec![(5_000, up(bound(pod("a"))))],
            vec![],
            0,
            (0, 0),
        ),
        (
            "bound to a node that is not Ready: left out, counted, not in flight",
            vec![(1_100, on_sick(pod("a"))), (70_000, on_sick(pod("a")))],
            vec![],
            0,
            (0, 1),
        ),
        (
            "its node goes NotReady before the network comes: left out from then on",
            vec![
                (1_100, bound(pod("a"))),
                (1_500, on_sick(pod("a"))),
                (2_500, up(bound(pod("a")))),
            ],
            vec![],
            0,
            (0, 1),
        ),
        (
            "network up before its node went NotReady: the sample stands",
            vec![(1_100, bound(pod("a"))), (3_100, up(on_sick(pod("a"))))],
            vec![(1_100, 3_100, false)],
            0,
            (0, 0),
        ),
    ];
    for (name, rounds, want, in_flight, left_out) in cases {
        let mut tracker = Tracker::default();
        let mut samples = Vec::new();
        let mut last = Observed::default();
        let (mut deleted_first, mut node_not_ready) = (0, 0);
        for (now, p) in rounds {
            last = tracker.observe(now, &[p], 60_000, |n| n != "sick");
            deleted_first += last.deleted_first;
            node_not_ready += last.node_not_ready;
            samples.extend(
                last.samples
                    .iter()
                    .map(|s| (s.started, s.ready, s.censored)),
            );
        }
        assert_eq!(samples, want, "{name}");
        assert_eq!(last.in_flight, in_flight, "{name}");
        assert_eq!((deleted_first, node_not_ready), left_out, "{name}");
    }
    // A pod gone from the list is forgotten.
    let mut tracker = Tracker::default();
    tracker.observe(1_100, &[pod("a"), pod("b")], 60_000, |_| true);
    tracker.observe(1_200, &[pod("b")], 60_000, |_| true);
    assert_eq!(tracker.len(), 1);
}

fn arb_sample() -> impl Strategy<Value = (u8, u64, u64, bool)> {
    // (workload, clock step ms, latency ms, censored)
    (0u8..4, 0u64..20_000, 0u64..90_000, any::<bool>())
}

proptest! {
    #[test]
    fn the_window_stays_in_its_bounds_and_never_grows_on_a_queue(
        min in 1u32..10,
        extra in 0u32..100,
        start in proptest::option::of(0u32..300),
        samples in proptest::collection::vec(arb_sample(), 0..200),
    ) {
        let config = NetworkConfig { min_window: min, max_window: min + extra, ..config() };
        let mut w = NetworkWindow::new(config, start);
        let mut clock: Millis = 0;
        for (workload, step, latency, is_censored) in samples {
            clock += step;
            let before = w.window();
            let s = if is_censored {
                censored(&format!("w{workload}"), clock, config.bound_ms)
            } else {
                sample(&format!("w{workload}"), clock, latency)
            };
            // Reading the window changes nothing: only a sample moves it.
            let _ = (w.room(3), w.status());
            prop_assert_eq!(w.window(), before);
            w.observe(&s);
            prop_assert!(w.window() >= min && w.window() <= min + extra);
            if is_censored {
                prop_assert!(w.window() <= before, "censored: {} > {}", w.window(), before);
            }
        }
    }
}

#[test]
fn partition_steps_get_room_for_step_room_gain_windows_of_released_and_gated_pods() {
    let room = |window, in_flight, gated| NetworkRoom { in_flight, window }.for_steps(gated);
    // (window, in flight, gated) -> room for steps
    let table = [
        ((4, 0, 0), 16),
        ((4, 4, 0), 12),
        ((4, 4, 11), 1),
        ((4, 4, 12), 0),
        // A window shrunk below what is out: no step, never a wrap-around.
        ((2, 6, 9), 0),
        ((2, 0, 0), 2 * STEP_ROOM_GAIN),
        ((u32::MAX, 0, 0), u32::MAX),
    ];
    for ((window, in_flight, gated), want) in table {
        assert_eq!(
            room(window, in_flight, gated),
            want,
            "window {window}, in flight {in_flight}, gated {gated}"
        );
    }
}

#[test]
fn slow_start_ends_at_an_eighth_above_the_floor_steady_state_at_a_quarter() {
    // (latency of the fifth sample after four at the 2 s floor, slow start goes on)
    let table = [
        (2_200, true),  // 10 %: under the 250 ms minimum
        (2_240, true),  // 12 %
        (2_300, false), // 15 %: above 1/8 of the floor and 250 ms
        (2_600, false), // 30 %: a queue in any phase
    ];
    for (latency, goes_on) in table {
        let mut w = NetworkWindow::new(config(), None);
        for i in 0..4 {
            w.observe(&sample("app", i * 500, 2_000));
        }
        assert_eq!(w.status().last_change, Change::SlowStart);
        let before = w.window();
        w.observe(&sample("app", 2_000, latency));
        if goes_on {
            assert_eq!(w.status().last_change, Change::SlowStart, "{latency}");
            assert_eq!(w.window(), before + 1, "{latency}");
        } else {
            assert_eq!(w.status().last_change, Change::Queue, "{latency}");
            assert!(w.window() <= before, "{latency}: {} > {before}", w.window());
        }
    }
    // Out of slow start, a rise of 15 % is no queue: the window probes on.
    let mut w = NetworkWindow::new(config(), None);
    for i in 0..4 {
        w.observe(&sample("app", i * 500, 2_000));
    }
    w.observe(&sample("app", 2_000, 2_600));
    w.observe(&sample("app", 2_500, 2_300));
    assert_eq!(w.status().last_change, Change::Probe);
}
