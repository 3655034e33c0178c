use super::*;
use crate::policy::{Limit, Scope};
use proptest::prelude::*;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// A plain sliding window (a window's worth at once), as before spacing.
fn limit(events: u32, window_ms: u64, scope: Scope) -> Limit {
    spaced(events, window_ms, scope, events)
}

fn spaced(events: u32, window_ms: u64, scope: Scope, burst: u32) -> Limit {
    Limit {
        events,
        window: Duration::from_millis(window_ms),
        scope,
        burst,
    }
}

fn ask<'a>(
    rule: &'a Arc<str>,
    limits: &'a [Limit],
    namespace: &'a str,
    identity: &'a Identity,
) -> Ask<'a> {
    Ask {
        rule,
        limits,
        namespace,
        owner: None,
        identity,
        cost: 1,
        reserve: true,
        dry_run: false,
        max_reserved_per_namespace: 1_000,
        align_beyond: None,
    }
}

fn exact(id: &str) -> Identity {
    Identity::Exact(id.to_string())
}

#[test]
fn table_of_single_decisions() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(2, 10_000, Scope::Global)];
    // (case, prior admissions at these times, now, expected outcome)
    let cases: &[(&str, &[u64], u64, Outcome)] = &[
        ("empty bucket admits", &[], 100, Outcome::Admitted),
        ("one free slot admits", &[50], 100, Outcome::Admitted),
        (
            "full window reserves at oldest+window",
            &[0, 50],
            100,
            Outcome::Reserved { slot: 10_000 },
        ),
        (
            "charge leaving exactly now frees a slot",
            &[0, 50],
            10_000,
            Outcome::Admitted,
        ),
        (
            "one ms before the edge is still full",
            &[0, 50],
            9_999,
            Outcome::Reserved { slot: 10_000 },
        ),
    ];
    for (case, prior, now, want) in cases {
        let mut limiter = Limiter::new(100);
        for (i, at) in prior.iter().enumerate() {
            let id = exact(&format!("prior-{i}"));
            assert_eq!(
                limiter.acquire(&ask(&rule, &limits, "ns", &id), *at),
                Outcome::Admitted,
                "{case}"
            );
        }
        let id = exact("subject");
        assert_eq!(
            limiter.acquire(&ask(&rule, &limits, "ns", &id), *now),
            *want,
            "{case}"
        );
    }
}

#[test]
fn retry_claims_its_own_slot_and_pays_once() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(1, 1_000, Scope::Global)];
    let mut limiter = Limiter::new(100);
    let a = exact("a");
    let b = exact("b");
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &a), 0),
        Outcome::Admitted
    );
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &b), 10),
        Outcome::Reserved { slot: 1_000 }
    );
    // An early retry is told the same slot, and nothing more is charged.
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &b), 500),
        Outcome::Reserved { slot: 1_000 }
    );
    assert_eq!(limiter.reservation_count(), 1);
    // At its slot it is admitted without a new charge.
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &b), 1_000),
        Outcome::Claimed { slot: 1_000 }
    );
    assert_eq!(limiter.reservation_count(), 0);
    let key = BucketKey {
        rule: rule.clone(),
        limit: 0,
        scope: ScopeKey::Global,
    };
    assert_eq!(limiter.used(&key, 1_000), 1);
    // The next newcomer goes after it.
    let c = exact("c");
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &c), 1_001),
        Outcome::Reserved { slot: 2_000 }
    );
}

#[test]
fn pool_members_share_due_slots() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(1, 1_000, Scope::Global)];
    let mut limiter = Limiter::new(100);
    let pool = Identity::Pool("rs-uid/web-".into());
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &pool), 0),
        Outcome::Admitted
    );
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &pool), 0),
        Outcome::Reserved { slot: 1_000 }
    );
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &pool), 0),
        Outcome::Reserved { slot: 2_000 }
    );
    // Whichever member comes back first takes the earliest due slot.
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &pool), 1_000),
        Outcome::Claimed { slot: 1_000 }
    );
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &pool), 2_000),
        Outcome::Claimed { slot: 2_000 }
    );
    assert_eq!(limiter.reservation_count(), 0);
}

#[test]
fn dry_run_decides_without_charging() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(1, 1_000, Scope::Global)];
    let mut limiter = Limiter::new(100);
    let id = exact("a");
    let mut dry = ask(&rule, &limits, "ns", &id);
    dry.dry_run = true;
    assert_eq!(limiter.acquire(&dry, 0), Outcome::Admitted);
    assert_eq!(limiter.acquire(&dry, 0), Outcome::Admitted);
    assert_eq!(limiter.bucket_count(), 0);
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &id), 0),
        Outcome::Admitted
    );
    assert_eq!(
        limiter.acquire(&dry, 0),
        Outcome::Refused {
            retry_at: 1_000,
            why: RefusedWhy::NotReserving
        }
    );
    assert_eq!(limiter.reservation_count(), 0);
}

#[test]
fn every_bucket_of_a_rule_must_fit() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [
        limit(10, 1_000, Scope::Global),
        limit(1, 1_000, Scope::Namespace),
    ];
    let mut limiter = Limiter::new(100);
    let (a1, a2, b1) = (exact("a1"), exact("a2"), exact("b1"));
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "a", &a1), 0),
        Outcome::Admitted
    );
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "a", &a2), 0),
        Outcome::Reserved { slot: 1_000 }
    );
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "b", &b1), 0),
        Outcome::Admitted
    );
}

#[test]
fn namespace_share_stops_one_namespace_from_taking_the_future() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(1, 1_000, Scope::Global)];
    let mut limiter = Limiter::new(100);
    let ids: Vec<Identity> = (0..5).map(|i| exact(&format!("a{i}"))).collect();
    let mut outcomes = Vec::new();
    for id in &ids {
        let mut a = ask(&rule, &limits, "a", id);
        a.max_reserved_per_namespace = 2;
        outcomes.push(limiter.acquire(&a, 0));
    }
    assert_eq!(outcomes[0], Outcome::Admitted);
    assert_eq!(outcomes[1], Outcome::Reserved { slot: 1_000 });
    assert_eq!(outcomes[2], Outcome::Reserved { slot: 2_000 });
    assert_eq!(
        outcomes[3],
        Outcome::Refused {
            retry_at: 1_000,
            why: RefusedWhy::NamespaceShare
        }
    );
    // Another namespace still gets the next slot, not one behind all of a's backlog.
    let b = exact("b0");
    let mut bask = ask(&rule, &limits, "b", &b);
    bask.max_reserved_per_namespace = 2;
    assert_eq!(limiter.acquire(&bask, 0), Outcome::Reserved { slot: 3_000 });
}

#[test]
fn sweep_expires_unclaimed_reservations_and_idle_buckets() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(1, 1_000, Scope::Namespace)];
    let mut limiter = Limiter::new(100);
    let (a, b) = (exact("a"), exact("b"));
    limiter.acquire(&ask(&rule, &limits, "ns", &a), 0);
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &b), 0),
        Outcome::Reserved { slot: 1_000 }
    );
    let usage = limiter.sweep(1_000 + RESERVATION_GRACE_MS - 1);
    assert_eq!(usage.reservations, 1);
    let usage = limiter.sweep(1_000 + RESERVATION_GRACE_MS);
    assert_eq!((usage.buckets, usage.reservations), (0, 0));
}

/// The usage a sweep reports is that of the rule's first limit, the one the
/// window_limit gauge shows: a per-namespace first limit is not compared with the
/// global second limit's count.
#[test]
fn sweep_reports_the_fullest_bucket_of_the_first_limit() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [
        limit(2, 10_000, Scope::Namespace),
        limit(10, 10_000, Scope::Global),
    ];
    let mut limiter = Limiter::new(100);
    for (ns, n) in [("a", 2), ("b", 1)] {
        for _ in 0..n {
            limiter.record(&rule, &limits, ns, None, 1_000, 1);
        }
    }
    let usage = limiter.sweep(2_000);
    assert_eq!(
        usage.per_rule.get(&rule),
        Some(&2),
        "namespace a's 2, not the global 3"
    );
}

#[test]
fn bucket_table_is_capped_by_an_overflow_bucket() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(5, 60_000, Scope::Namespace)];
    let mut limiter = Limiter::new(16);
    for i in 0..1_000 {
        let ns = format!("ns-{i}");
        let id = exact(&ns);
        limiter.acquire(&ask(&rule, &limits, &ns, &id), i);
    }
    assert!(limiter.bucket_count() <= 17, "{}", limiter.bucket_count());
    let overflow = BucketKey {
        rule: rule.clone(),
        limit: 0,
        scope: ScopeKey::Overflow,
    };
    // The shared bucket is stricter, never looser: it is full.
    assert_eq!(limiter.used(&overflow, 1_000), 5);
}

#[derive(Debug, Clone)]
struct Arrival {
    gap_ms: u64,
    namespace: u8,
    pool: bool,
    early_retry: bool,
    /// How far from its slot this client's retries arrive: negative is early (within the
    /// arrival margin, so it is held), positive late (slow client or API server).
    retry_offset_ms: i64,
}

fn arrivals() -> impl Strategy<Value = Vec<Arrival>> {
    let offset = prop_oneof![
        Just(0i64),
        -(RETRY_ARRIVAL_MARGIN_MS as i64)..0,
        1i64..1_500,
    ];
    prop::collection::vec(
        (
            0u64..400,
            0u8..4,
            any::<bool>(),
            prop::bool::weighted(0.2),
            offset,
        )
            .prop_map(
                |(gap_ms, namespace, pool, early_retry, retry_offset_ms)| Arrival {
                    gap_ms,
                    namespace,
                    pool,
                    early_retry,
                    retry_offset_ms,
                },
            ),
        1..200,
    )
}

/// Drives arrivals through the limiter as the server does (a slot within the hold reach
/// is held until; farther ones are told to come back), with clients that come back
/// early, on time or late, and records when each request really got in.
struct Run {
    /// (time admitted, namespace) for every logical request: `now` when admitted or
    /// claimed, the slot when held until it.
    charges: Vec<(u64, u8)>,
    /// Reserved slots in the order they were handed out to requests that came on time.
    reserved_order: Vec<u64>,
    admitted_requests: usize,
    limiter: Limiter,
}

/// `hold`: decide as hold and retry-after rules do (slots within the arrival margin are
/// held, farther ones aligned to whole seconds), with clients early, on time or late;
/// otherwise plain reservations and clients on time.
/// The identity and namespace of each generated arrival, from its (namespace, pool):
/// a ReplicaSet pool's or one pod's.
fn identities(arrivals: impl Iterator<Item = (u8, bool)>) -> Vec<(Identity, String)> {
    arrivals
        .enumerate()
        .map(|(i, (namespace, pool))| {
            let ns = format!("ns-{namespace}");
            let id = if pool {
                Identity::Pool(format!("{ns}/rs-"))
            } else {
                Identity::Exact(format!("{ns}/pod-{i}"))
            };
            (id, ns)
        })
        .collect()
}

fn drive(limit: Limit, share: u32, input: &[Arrival], hold: bool) -> Run {
    let rule: Arc<str> = Arc::from("rule");
    let limits = [limit];
    let mut limiter = Limiter::new(64);
    let reach = if hold { RETRY_ARRIVAL_MARGIN_MS } else { 0 };
    // (time, sequence, request index, is early retry)
    let mut queue: BinaryHeap<Reverse<(u64, usize, usize, bool)>> = BinaryHeap::new();
    let mut now = 0;
    let identities = identities(input.iter().map(|a| (a.namespace, a.pool)));
    let mut seq = 0;
    let mut first_arrival = vec![0; input.len()];
    for (i, a) in input.iter().enumerate() {
        now += a.gap_ms;
        first_arrival[i] = now;
        queue.push(Reverse((now, seq, i, false)));
        seq += 1;
    }
    let mut run = Run {
        charges: vec![],
        reserved_order: vec![],
        admitted_requests: 0,
        limiter: Limiter::new(1),
    };
    let mut steps = 0;
    while let Some(Reverse((at, _, i, early))) = queue.pop() {
        steps += 1;
        assert!(steps < 100_000, "simulation did not settle");
        let (identity, ns) = &identities[i];
        let mut request = ask(&rule, &limits, ns, identity);
        request.max_reserved_per_namespace = share;
        request.align_beyond = hold.then_some(reach);
        let namespace = input[i].namespace;
        match limiter.acquire(&request, at) {
            Outcome::Admitted => {
                run.charges.push((at, namespace));
                run.admitted_requests += 1;
            }
            Outcome::Claimed { slot } => {
                assert_eq!(slot, at, "a late claim is charged when it comes");
                run.charges.push((at, namespace));
                run.admitted_requests += 1;
            }
            Outcome::Held { slot } => {
                assert!(slot > at && slot <= at + reach);
                run.charges.push((slot, namespace));
                run.admitted_requests += 1;
            }
            Outcome::Reserved { slot } if slot - at <= reach => {
                // The server holds it until the slot, which it uses up.
                limiter.consume(&rule, identity, slot);
                run.charges.push((slot, namespace));
                run.admitted_requests += 1;
            }
            Outcome::Reserved { slot } => {
                // A late retry keeps its place ahead of newer reservations, so FIFO is
                // checked on first arrivals.
                if at == first_arrival[i] && !matches!(identity, Identity::Pool(_)) {
                    run.reserved_order.push(slot);
                }
                // Pool members are told their whole wait (less the arrival margin), so
                // only exact ones come back far too early.
                let retry_at = if input[i].early_retry && !early && !input[i].pool {
                    at + (slot - at) / 2
                } else {
                    // Without holds, clients come back on time: a late one moves the
                    // slots after it, which is checked with holds.
                    slot.saturating_add_signed(if hold { input[i].retry_offset_ms } else { 0 })
                };
                queue.push(Reverse((retry_at, seq, i, retry_at + reach < slot)));
                seq += 1;
            }
            Outcome::Refused { retry_at, .. } => {
                assert!(retry_at > at);
                queue.push(Reverse((retry_at, seq, i, false)));
                seq += 1;
            }
        }
    }
    run.limiter = limiter;
    run
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn no_window_ever_holds_more_than_the_limit(
        events in 1u32..6, window_ms in 100u64..3_000, share in 1u32..8, burst in 1u32..6,
        input in arrivals()
    ) {
        let burst = burst.min(events);
        let run = drive(spaced(events, window_ms, Scope::Global, burst), share, &input, true);
        let mut times: Vec<u64> = run.charges.iter().map(|c| c.0).collect();
        times.sort_unstable();
        for (i, &start) in times.iter().enumerate() {
            let inside = times[i..].iter().take_while(|&&t| t < start + window_ms).count();
            prop_assert!(inside as u32 <= events, "{} charges in [{start}, {})", inside, start + window_ms);
        }
    }

    #[test]
    fn charges_are_spaced_after_the_burst(
        events in 2u32..8, window_ms in 100u64..3_000, share in 1u32..8, burst in 1u32..8,
        hold in any::<bool>(), input in arrivals()
    ) {
        let burst = burst.min(events - 1);
        let limit = spaced(events, window_ms, Scope::Global, burst);
        let interval = limit.spacing_ms().expect("a burst below events spaces");
        let run = drive(limit, share, &input, hold);
        let mut times: Vec<u64> = run.charges.iter().map(|c| c.0).collect();
        times.sort_unstable();
        // Any k charges within a window span at least (k - burst) intervals: at most
        // `burst` together, then one per interval (GCRA's bound; a window's span farther
        // is the window's business).
        for (i, &first) in times.iter().enumerate() {
            for (k, &last) in times[i..].iter().enumerate().take_while(|(_, &t)| t < first + window_ms) {
                let count = k as u64 + 1;
                let need = count.saturating_sub(u64::from(burst)) * interval;
                prop_assert!(
                    last - first >= need,
                    "{count} charges in [{first}, {last}]: closer than {need} ms (burst {burst}, spacing {interval} ms)"
                );
            }
        }
        // And in any second, at most burst + 1 s / spacing (the e2e's 5 + burst at 50/10 s).
        for (i, &start) in times.iter().enumerate() {
            let inside = times[i..].iter().take_while(|&&t| t < start + 1_000).count() as u64;
            prop_assert!(inside <= u64::from(burst) + 999 / interval + 1);
        }
    }

    #[test]
    fn every_request_is_admitted_once_and_reservations_are_fifo(
        events in 1u32..6, window_ms in 100u64..3_000, share in 1u32..8, burst in 1u32..6,
        input in arrivals()
    ) {
        // Aligning slots to whole seconds may hand a later request an earlier gap, so
        // FIFO is checked on plain reservations.
        let burst = burst.min(events);
        let run = drive(spaced(events, window_ms, Scope::Global, burst), share, &input, false);
        // Every logical request got in exactly once: retries were not charged twice.
        prop_assert_eq!(run.admitted_requests, input.len());
        prop_assert_eq!(run.charges.len(), input.len());
        // One global bucket: slots were handed out in non-decreasing order.
        for pair in run.reserved_order.windows(2) {
            prop_assert!(pair[0] <= pair[1], "reservation order {:?}", pair);
        }
    }

    #[test]
    fn every_request_gets_in_once_with_early_and_late_clients(
        events in 1u32..6, window_ms in 100u64..3_000, share in 1u32..8, burst in 1u32..6,
        input in arrivals()
    ) {
        let burst = burst.min(events);
        let run = drive(spaced(events, window_ms, Scope::Global, burst), share, &input, true);
        prop_assert_eq!(run.admitted_requests, input.len());
        prop_assert_eq!(run.charges.len(), input.len());
    }

    #[test]
    fn a_burst_of_events_is_the_plain_window(
        events in 1u32..6, window_ms in 100u64..3_000, share in 1u32..8, hold in any::<bool>(),
        input in arrivals()
    ) {
        // burst = events: no spacing; the same run as a limit that never had one.
        let limit = spaced(events, window_ms, Scope::Global, events);
        prop_assert_eq!(limit.spacing_ms(), None);
        let run = drive(limit, share, &input, hold);
        let mut times: Vec<u64> = run.charges.iter().map(|c| c.0).collect();
        times.sort_unstable();
        let first = times.first().copied().unwrap_or(0);
        // A window's worth at once is allowed again: the first `events` arrivals within a
        // window of a quiet start all get in at their arrival.
        let quiet: Vec<u64> = input.iter().scan(0, |t, a| { *t += a.gap_ms; Some(*t) })
            .take_while(|&t| t < first + window_ms).take(events as usize).collect();
        prop_assert_eq!(&times[..quiet.len()], &quiet[..]);
    }

    #[test]
    fn namespaced_buckets_never_exceed_the_cap(names in prop::collection::vec("[a-z]{1,12}", 1..400)) {
        let rule: Arc<str> = Arc::from("r");
        let limits = [limit(3, 10_000, Scope::Namespace), limit(2, 10_000, Scope::Owner)];
        let mut limiter = Limiter::new(32);
        for (i, name) in names.iter().enumerate() {
            let id = exact(name);
            let mut a = ask(&rule, &limits, name, &id);
            a.owner = Some(name.as_str());
            limiter.acquire(&a, i as u64);
            // Two scoped limits may each add one overflow bucket beyond the cap.
            prop_assert!(limiter.bucket_count() <= 32 + 2);
            prop_assert!(limiter.reservation_count() <= 32);
        }
    }
}

#[test]
fn retry_after_slots_are_aligned_to_whole_seconds_from_now() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(1, 1_000, Scope::Global)];
    let mut limiter = Limiter::new(100);
    let (a, b) = (exact("a"), exact("b"));
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &a), 0),
        Outcome::Admitted
    );
    let mut late = ask(&rule, &limits, "ns", &b);
    late.align_beyond = Some(0);
    // Free at 1,000 ms; the client told "retry after 1 s" at 300 ms comes back at 1,300 ms
    // and a little more; its slot lies the arrival margin after that, so it comes early.
    let slot = 1_300 + RETRY_ARRIVAL_MARGIN_MS;
    assert_eq!(limiter.acquire(&late, 300), Outcome::Reserved { slot });
    assert_eq!(limiter.acquire(&late, 1_340), Outcome::Reserved { slot });
    assert_eq!(limiter.acquire(&late, slot), Outcome::Claimed { slot });
}

#[test]
fn pool_slots_are_aligned_and_an_early_member_is_held_for_the_earliest() {
    // Pool members are told to come back the arrival margin early too: one that comes
    // within the hold reach of the pool's earliest slot takes it and is held until then.
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(1, 1_000, Scope::Global)];
    let mut limiter = Limiter::new(100);
    let first = exact("a");
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &first), 0),
        Outcome::Admitted
    );
    let pool = Identity::Pool("pod-create:ns/web-".into());
    let mut member = ask(&rule, &limits, "ns", &pool);
    member.align_beyond = Some(RETRY_ARRIVAL_MARGIN_MS);
    let slot = 1_300 + RETRY_ARRIVAL_MARGIN_MS;
    assert_eq!(limiter.acquire(&member, 300), Outcome::Reserved { slot });
    assert_eq!(limiter.acquire(&member, 1_350), Outcome::Held { slot });
    assert_eq!(limiter.reservation_count(), 0);
    // Nothing more was charged: the next member goes a window after the held one.
    assert_eq!(
        limiter.acquire(&member, 1_400),
        Outcome::Reserved {
            slot: 2_400 + RETRY_ARRIVAL_MARGIN_MS
        }
    );
}

#[test]
fn reserved_slots_after_now_count_in_every_window_holding_now() {
    // Nothing was charged in the window before 1,100 ms, but a slot is reserved at
    // 1,800 ms: admitting at 1,100 would put two events in (800, 1,800].
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(1, 1_000, Scope::Global)];
    let mut limiter = Limiter::new(100);
    let (a, b, c) = (exact("a"), exact("b"), exact("c"));
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &a), 0),
        Outcome::Admitted
    );
    let mut aligned = ask(&rule, &limits, "ns", &b);
    aligned.align_beyond = Some(0);
    assert_eq!(
        limiter.acquire(&aligned, 300),
        Outcome::Reserved { slot: 1_800 }
    );
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &c), 1_100),
        Outcome::Reserved { slot: 2_800 }
    );
}

#[test]
fn a_late_retry_is_admitted_when_it_comes_and_later_slots_move_back() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(1, 1_000, Scope::Global)];
    let mut limiter = Limiter::new(100);
    let (a, b, c) = (exact("a"), exact("b"), exact("c"));
    let key = BucketKey {
        rule: rule.clone(),
        limit: 0,
        scope: ScopeKey::Global,
    };
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &a), 0),
        Outcome::Admitted
    );
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &b), 100),
        Outcome::Reserved { slot: 1_000 }
    );
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &c), 200),
        Outcome::Reserved { slot: 2_000 }
    );
    // b comes 300 ms after its slot: the event happens now, so it is charged now (its
    // slot, given back, makes the room) and c's slot moves a window after it.
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &b), 1_300),
        Outcome::Claimed { slot: 1_300 }
    );
    assert_eq!(limiter.used(&key, 1_000), 0, "the old slot is given back");
    assert_eq!(limiter.used(&key, 1_300), 1);
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &c), 2_000),
        Outcome::Reserved { slot: 2_300 }
    );
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &c), 2_300),
        Outcome::Claimed { slot: 2_300 }
    );
    assert_eq!(limiter.reservation_count(), 0);
}

#[test]
fn spaced_limits_admit_the_burst_then_one_per_spacing() {
    let rule: Arc<str> = Arc::from("r");
    // (case, burst, the slots six requests at t = 0 get): 5 per 10 s spaces by
    // (10 s + 500 ms) / 5 = 2100 ms, and keeps its window over 10.5 s.
    let cases: &[(&str, u32, [u64; 6])] = &[
        ("burst 1", 1, [0, 2_100, 4_200, 6_300, 8_400, 10_500]),
        ("burst 2", 2, [0, 0, 2_100, 4_200, 6_300, 10_500]),
        ("burst = events", 5, [0, 0, 0, 0, 0, 10_000]),
    ];
    for (case, burst, want) in cases {
        let limits = [spaced(5, 10_000, Scope::Global, *burst)];
        let mut limiter = Limiter::new(16);
        let got: Vec<u64> = (0..6)
            .map(|i| {
                let id = exact(&format!("p{i}"));
                match limiter.acquire(&ask(&rule, &limits, "ns", &id), 0) {
                    Outcome::Admitted => 0,
                    Outcome::Reserved { slot } => slot,
                    other => panic!("{case}: {other:?}"),
                }
            })
            .collect();
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn a_gap_before_a_reserved_slot_is_used_only_when_both_sides_stay_spaced() {
    let rule: Arc<str> = Arc::from("r");
    // 10 per 10 s, burst 1: spacing 1050 ms.
    let limits = [spaced(10, 10_000, Scope::Global, 1)];
    let mut limiter = Limiter::new(16);
    let key = BucketKey {
        rule: rule.clone(),
        limit: 0,
        scope: ScopeKey::Global,
    };
    // Charges at 0 and a reservation far ahead at 5000.
    limiter.record(&rule, &limits, "ns", None, 0, 1);
    limiter.record(&rule, &limits, "ns", None, 5_000, 1);
    assert_eq!(limiter.used(&key, 5_000), 2);
    // From 500: 1050 after 0 is free and 1050 before 5000 too.
    assert_eq!(limiter.earliest(&rule, &limits, "ns", None, 1, 500), 1_050);
    assert_eq!(
        limiter.earliest(&rule, &limits, "ns", None, 1, 2_000),
        2_000
    );
    // 3950 is the last time 1050 before 5000; after it, the next room is 5000 + 1050.
    assert_eq!(
        limiter.earliest(&rule, &limits, "ns", None, 1, 3_950),
        3_950
    );
    assert_eq!(
        limiter.earliest(&rule, &limits, "ns", None, 1, 3_951),
        6_050
    );
}

#[test]
fn no_reservation_beyond_the_reach_and_a_flood_of_namespaces_keeps_a_bucket_bounded() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(20, 10_000, Scope::Global)];
    let mut limiter = Limiter::new(1_000);
    let reach = 30_500;
    let mut refused = 0;
    for i in 0..50_000 {
        let id = exact(&format!("pod-{i}"));
        let namespace = format!("ns-{i}");
        match limiter.acquire_within(&ask(&rule, &limits, &namespace, &id), 1_000, reach) {
            Outcome::Reserved { slot } => assert!(slot <= 1_000 + reach, "slot {slot}"),
            Outcome::Refused { retry_at, why } => {
                assert_eq!(why, RefusedWhy::BeyondReach);
                assert_eq!(retry_at, 1_000 + reach);
                refused += 1;
            }
            Outcome::Admitted => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    // 20 now and 20 per window up to 30.5 s ahead: 20 admitted, 60 reserved.
    assert_eq!(limiter.reservation_count(), 60);
    assert_eq!(refused, 50_000 - 80);
    // Refusals left nothing behind: the next slot is the same for a newcomer.
    let id = exact("late");
    assert_eq!(
        limiter.acquire_within(&ask(&rule, &limits, "prod", &id), 1_000, 40_500),
        Outcome::Reserved { slot: 41_000 }
    );
}

#[test]
fn a_cancelled_hold_gives_its_slot_to_the_next_request() {
    let rule: Arc<str> = Arc::from("r");
    let limits = [limit(1, 4_000, Scope::Global)];
    let mut limiter = Limiter::new(100);
    let (a, b, c) = (exact("a"), exact("b"), exact("c"));
    let mut hold = ask(&rule, &limits, "ns", &b);
    hold.align_beyond = Some(5_000);
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &a), 0),
        Outcome::Admitted
    );
    // b is reserved at 4 s; the server holds it (consume) and its client goes away.
    assert_eq!(
        limiter.acquire(&hold, 100),
        Outcome::Reserved { slot: 4_000 }
    );
    limiter.consume(&rule, &b, 4_000);
    limiter.cancel_hold(&hold, 4_000);
    assert_eq!(limiter.reservation_count(), 0);
    assert_eq!(
        limiter.acquire(&ask(&rule, &limits, "ns", &c), 1_500),
        Outcome::Reserved { slot: 4_000 },
        "the next request gets the abandoned slot, not the one a window later"
    );
}

// Generated policies: several rules, each with one limit of any scope or two (global +
// namespace), costs above 1, more namespaces and owners than the bucket table holds (so
// the overflow bucket is used), the clock jumping forward past windows and the sweep
// running between requests, as the server's does every second.

/// The bucket table of the generated runs: the smallest the limiter allows, so 40
/// namespaces and owners overflow it.
const GENERATED_MAX_BUCKETS: usize = 16;

fn generated_limit(scope: Scope) -> impl Strategy<Value = Limit> {
    (1u32..6, 100u64..3_000, 1u32..6).prop_map(move |(events, window_ms, burst)| {
        spaced(events, window_ms, scope, burst.min(events))
    })
}

/// One rule's limits: a single limit of each scope, or a global and a namespace limit.
fn generated_rule() -> impl Strategy<Value = Vec<Limit>> {
    prop_oneof![
        generated_limit(Scope::Global).prop_map(|l| vec![l]),
        generated_limit(Scope::Namespace).prop_map(|l| vec![l]),
        generated_limit(Scope::Owner).prop_map(|l| vec![l]),
        (
            generated_limit(Scope::Global),
            generated_limit(Scope::Namespace)
        )
            .prop_map(|(g, n)| vec![g, n]),
    ]
}

#[derive(Debug, Clone)]
struct PolicyArrival {
    /// Milliseconds since the previous arrival: mostly close, sometimes a clock step
    /// past every window and the reservation grace.
    gap_ms: u64,
    rule: usize,
    namespace: u8,
    owner: Option<u8>,
    /// A pool member (interchangeable pods of one owner, cost 1) or an exact identity.
    pool: bool,
    /// For exact identities: a StatefulSet step of several pods costs that many.
    cost: u32,
    retry_offset_ms: i64,
    /// The background sweep runs just before this arrival.
    sweep: bool,
}

fn policy_arrivals() -> impl Strategy<Value = Vec<PolicyArrival>> {
    let gap = prop_oneof![8 => 0u64..300, 1 => 3_000u64..45_000];
    let offset = prop_oneof![
        Just(0i64),
        -(RETRY_ARRIVAL_MARGIN_MS as i64)..0,
        1i64..1_500,
    ];
    prop::collection::vec(
        (
            gap,
            0usize..3,
            0u8..40,
            prop::option::weighted(0.7, 0u8..8),
            prop::bool::weighted(0.3),
            1u32..4,
            offset,
            prop::bool::weighted(0.2),
        )
            .prop_map(
                |(gap_ms, rule, namespace, owner, pool, cost, retry_offset_ms, sweep)| {
                    PolicyArrival {
                        gap_ms,
                        rule,
                        namespace,
                        owner,
                        pool,
                        cost: if pool { 1 } else { cost },
                        retry_offset_ms,
                        sweep,
                    }
                },
            ),
        1..200,
    )
}

/// A request of a generated run, as the limiter sees it.
struct PolicyRequest {
    rule: usize,
    namespace: String,
    owner: Option<String>,
    identity: Identity,
    cost: u32,
}

impl PolicyRequest {
    /// The bucket key of the request's `limit`th limit before any overflow: what its
    /// scope alone says.
    fn own_key(&self, rules: &[Arc<str>], policy: &[Vec<Limit>], limit: usize) -> BucketKey {
        let owner = match (&self.owner, &self.identity) {
            (Some(owner), _) => owner.as_str(),
            (None, Identity::Exact(id) | Identity::Pool(id)) => id.as_str(),
        };
        BucketKey {
            rule: rules[self.rule].clone(),
            limit: limit as u8,
            scope: match policy[self.rule][limit].scope {
                Scope::Global => ScopeKey::Global,
                Scope::Namespace => ScopeKey::Namespace(Arc::from(self.namespace.as_str())),
                Scope::Owner => ScopeKey::Owner(Arc::from(owner)),
            },
        }
    }
}

/// What a generated run left: when each request got in, and what the memory checks at
/// every sweep found wrong (empty when nothing).
struct PolicyRun {
    requests: Vec<PolicyRequest>,
    /// (time charged, request index), one per logical request that got in.
    charges: Vec<(u64, usize)>,
    memory_faults: Vec<String>,
    overflowed: bool,
    /// The most buckets alive at once.
    max_buckets: usize,
    limiter: Limiter,
}

/// Drives generated arrivals through one limiter as the server does (held within the
/// arrival margin, else told to come back at a whole number of seconds; clients early,
/// on time or late), sweeping where the arrivals say and checking the memory bound after
/// each sweep.
fn drive_policy(policy: &[Vec<Limit>], input: &[PolicyArrival]) -> PolicyRun {
    let rules: Vec<Arc<str>> = (0..policy.len())
        .map(|r| Arc::from(format!("rule-{r}").as_str()))
        .collect();
    let reach = RETRY_ARRIVAL_MARGIN_MS;
    let requests: Vec<PolicyRequest> = input
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let namespace = format!("ns-{}", a.namespace);
            let owner = a.owner.map(|o| format!("owner-{o}"));
            let identity = if a.pool {
                let of = owner.as_deref().unwrap_or("none");
                Identity::Pool(format!("{namespace}/{of}/rs-"))
            } else {
                Identity::Exact(format!("{namespace}/pod-{i}"))
            };
            PolicyRequest {
                rule: a.rule % policy.len(),
                namespace,
                owner,
                identity,
                cost: a.cost,
            }
        })
        .collect();
    let mut limiter = Limiter::new(GENERATED_MAX_BUCKETS);
    // (time, sequence, request index, sweep first)
    let mut queue: BinaryHeap<Reverse<(u64, usize, usize, bool)>> = BinaryHeap::new();
    let mut now = 0;
    for (i, a) in input.iter().enumerate() {
        now += a.gap_ms;
        queue.push(Reverse((now, i, i, a.sweep)));
    }
    let mut seq = input.len();
    let mut run = PolicyRun {
        requests,
        charges: vec![],
        memory_faults: vec![],
        overflowed: false,
        max_buckets: 0,
        limiter: Limiter::new(1),
    };
    let mut steps = 0;
    while let Some(Reverse((at, _, i, sweep))) = queue.pop() {
        steps += 1;
        assert!(steps < 100_000, "simulation did not settle");
        if sweep {
            limiter.sweep(at);
            let faults = check_memory(&limiter, policy, &rules, &run, at);
            run.memory_faults.extend(faults);
        }
        let r = &run.requests[i];
        let rule = &rules[r.rule];
        let mut request = ask(rule, &policy[r.rule], &r.namespace, &r.identity);
        request.owner = r.owner.as_deref();
        request.cost = r.cost;
        request.max_reserved_per_namespace = 4;
        request.align_beyond = Some(reach);
        match limiter.acquire(&request, at) {
            Outcome::Admitted | Outcome::Claimed { .. } => {
                run.charges.push((at, i));
            }
            Outcome::Held { slot } => {
                assert!(slot > at && slot <= at + reach);
                run.charges.push((slot, i));
            }
            Outcome::Reserved { slot } if slot - at <= reach => {
                limiter.consume(rule, &r.identity, slot);
                run.charges.push((slot, i));
            }
            Outcome::Reserved { slot } => {
                let retry_at = slot.saturating_add_signed(input[i].retry_offset_ms);
                queue.push(Reverse((retry_at, seq, i, false)));
                seq += 1;
            }
            Outcome::Refused { retry_at, .. } => {
                assert!(retry_at > at);
                queue.push(Reverse((retry_at, seq, i, false)));
                seq += 1;
            }
        }
        run.max_buckets = run.max_buckets.max(limiter.bucket_count());
        run.overflowed |= limiter
            .buckets
            .keys()
            .any(|k| k.scope == ScopeKey::Overflow);
    }
    run.limiter = limiter;
    run
}

/// The memory bound after a sweep at `now`: a bucket is alive only for what a window
/// holding `now` or a later time still sees. It holds no charge older than its window,
/// and at most what is paid in it: by the requests charged in such a window whose key it
/// is (any of the limit's, for the overflow bucket), and by the open reservations in it.
/// The reservations are read from the limiter's table (a pool member whose slot moved
/// back may take a new one and leave the old to another member), which is bounded too.
fn check_memory(
    limiter: &Limiter,
    policy: &[Vec<Limit>],
    rules: &[Arc<str>],
    run: &PolicyRun,
    now: u64,
) -> Vec<String> {
    let mut faults = Vec::new();
    if limiter.reservation_count() > GENERATED_MAX_BUCKETS {
        faults.push(format!(
            "at {now}: {} reservations",
            limiter.reservation_count()
        ));
    }
    // Charged in a window holding now or a later time.
    let live = |i: usize, limit: usize| {
        let r = &run.requests[i];
        let kept = policy[r.rule][limit].kept_window_ms();
        run.charges.iter().any(|&(t, j)| j == i && t + kept > now)
    };
    let reservations: Vec<&Reservation> = limiter
        .exact
        .values()
        .chain(limiter.pools.values().flatten())
        .collect();
    for (key, bucket) in &limiter.buckets {
        let limit = usize::from(key.limit);
        let rule = rules
            .iter()
            .position(|r| *r == key.rule)
            .expect("a generated rule");
        let events = policy[rule][limit].events;
        let paying: u32 = (0..run.requests.len())
            .filter(|&i| {
                let r = &run.requests[i];
                r.rule == rule
                    && (key.scope == ScopeKey::Overflow || r.own_key(rules, policy, limit) == *key)
                    && live(i, limit)
            })
            .map(|i| run.requests[i].cost.min(events))
            .sum::<u32>()
            + reservations
                .iter()
                .filter(|r| r.buckets.contains(key))
                .map(|r| r.cost.min(events))
                .sum::<u32>();
        if paying == 0 {
            faults.push(format!(
                "at {now}: {key:?} is alive but nothing in its windows"
            ));
        }
        if bucket.charges.len() as u32 > paying {
            faults.push(format!(
                "at {now}: {key:?} keeps {} charges, its live requests pay {paying}",
                bucket.charges.len()
            ));
        }
        if let Some(&old) = bucket.charges.front() {
            if old + bucket.window <= now {
                faults.push(format!(
                    "at {now}: {key:?} keeps a charge at {old}, out of every window"
                ));
            }
        }
    }
    faults
}

/// Every window of each limit's length, for every bucket the limit's scope makes (the
/// rule's union for a global limit), holds at most its events, each request counting
/// its cost (capped at the events, as the bucket charges it).
fn window_faults(policy: &[Vec<Limit>], run: &PolicyRun) -> Vec<String> {
    let rules: Vec<Arc<str>> = (0..policy.len())
        .map(|r| Arc::from(format!("rule-{r}").as_str()))
        .collect();
    let mut faults = Vec::new();
    for (rule, limits) in policy.iter().enumerate() {
        for (index, limit) in limits.iter().enumerate() {
            let window = limit.window.as_millis() as u64;
            let mut by_key: HashMap<BucketKey, Vec<(u64, u32)>> = HashMap::new();
            for &(t, i) in &run.charges {
                let r = &run.requests[i];
                if r.rule == rule {
                    by_key
                        .entry(r.own_key(&rules, policy, index))
                        .or_default()
                        .push((t, r.cost.min(limit.events)));
                }
            }
            for (key, mut charges) in by_key {
                charges.sort_unstable();
                for (k, &(start, _)) in charges.iter().enumerate() {
                    let inside: u32 = charges[k..]
                        .iter()
                        .take_while(|(t, _)| *t < start + window)
                        .map(|(_, c)| c)
                        .sum();
                    if inside > limit.events {
                        faults.push(format!(
                            "{key:?}: {inside} in [{start}, {}) over {limit}",
                            start + window
                        ));
                    }
                }
            }
        }
    }
    faults
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn generated_policies_keep_every_window_and_bucket_bound(
        policy in prop::collection::vec(generated_rule(), 1..4),
        input in policy_arrivals(),
    ) {
        let mut run = drive_policy(&policy, &input);
        // Every request got in once: retries were not charged twice, none was lost.
        prop_assert_eq!(run.charges.len(), input.len());
        let windows = window_faults(&policy, &run);
        prop_assert!(windows.is_empty(), "{:#?}", windows);
        prop_assert!(run.memory_faults.is_empty(), "{:#?}", run.memory_faults);
        // The table never grows past its cap, plus one bucket per limit: a global limit's
        // own (never sent to the overflow bucket), a scoped limit's overflow bucket.
        let limits = policy.iter().flatten().count();
        prop_assert!(run.max_buckets <= GENERATED_MAX_BUCKETS + limits, "{} buckets", run.max_buckets);
        // And everything goes once every window and reservation is past.
        let usage = run.limiter.sweep(u64::MAX / 4);
        prop_assert_eq!((usage.buckets, usage.reservations), (0, 0));
    }
}

/// The generated runs do reach what they are for: more keys than the table holds, so
/// the overflow bucket takes some of them, in a run whose windows are all kept.
#[test]
fn generated_runs_reach_the_overflow_bucket() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = (
        prop::collection::vec(generated_rule(), 1..4),
        policy_arrivals(),
    );
    let mut overflowed = 0;
    for _ in 0..100 {
        let (policy, input) = strategy
            .new_tree(&mut runner)
            .expect("a generated case")
            .current();
        let run = drive_policy(&policy, &input);
        let faults = window_faults(&policy, &run);
        assert!(faults.is_empty(), "{faults:#?}\n{policy:#?}");
        overflowed += usize::from(run.overflowed);
    }
    assert!(overflowed >= 10, "only {overflowed} of 100 runs overflowed");
}

// The fast path of `acquire` (room now, then the namespace's share, before any search
// for a later slot; the share's earliest reservation from the bucket's index) answers
// exactly what the full search answered before it. That full search is kept here as the
// reference.

/// `acquire` as it was: the slot searched (and aligned) first, then the namespace's
/// share, its earliest reservation found by a scan of every reservation.
fn acquire_by_full_search(limiter: &mut Limiter, ask: &Ask<'_>, now: Millis) -> Outcome {
    let rule = ask.rule.clone();
    if let Some(outcome) = limiter.claim(&rule, ask, now) {
        return outcome;
    }
    let keys = limiter.bucket_keys(ask);
    let slot = limiter.earliest_common(&keys, now, |bucket, index, t| {
        bucket.earliest(&ask.limits[index], ask.cost, t)
    });
    let slot = match ask.align_beyond {
        Some(threshold) if slot > now + threshold => limiter.aligned(&keys, ask, now, slot),
        _ => slot,
    };
    if slot <= now {
        if !ask.dry_run {
            limiter.charge_all(&keys, ask.limits, slot, ask.cost, now);
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
    for key in &keys {
        if let Some(bucket) = limiter.buckets.get(key) {
            let held = bucket
                .reserved_by_namespace
                .get(&namespace)
                .map_or(0, |held| held.count);
            if held >= ask.max_reserved_per_namespace {
                let retry_at =
                    earliest_reservation_by_scan(limiter, &namespace, key).unwrap_or(slot);
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
    if limiter.reservation_count >= limiter.max_reservations {
        return Outcome::Refused {
            retry_at: slot,
            why: RefusedWhy::TableFull,
        };
    }
    limiter.charge_all(&keys, ask.limits, slot, ask.cost, now);
    limiter.keep(
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

/// The scan `earliest_reservation_of` was: every reservation of every identity.
fn earliest_reservation_by_scan(
    limiter: &Limiter,
    namespace: &str,
    key: &BucketKey,
) -> Option<Millis> {
    let exact = limiter.exact.values();
    let pooled = limiter.pools.values().flatten();
    exact
        .chain(pooled)
        .filter(|r| &*r.namespace == namespace && r.buckets.contains(key))
        .map(|r| r.slot)
        .min()
}

/// Every bucket's index of reserved slots per namespace says what a scan of the
/// reservations says: how many, and the earliest.
fn share_index_faults(limiter: &Limiter) -> Vec<String> {
    let mut scanned: HashMap<(BucketKey, Arc<str>), (u32, Millis)> = HashMap::new();
    for r in limiter
        .exact
        .values()
        .chain(limiter.pools.values().flatten())
    {
        for key in &r.buckets {
            let entry = scanned
                .entry((key.clone(), r.namespace.clone()))
                .or_insert((0, Millis::MAX));
            entry.0 += 1;
            entry.1 = entry.1.min(r.slot);
        }
    }
    let mut faults = Vec::new();
    let mut indexed = 0;
    for (key, bucket) in &limiter.buckets {
        for (namespace, held) in &bucket.reserved_by_namespace {
            indexed += 1;
            let scan = scanned.get(&(key.clone(), namespace.clone()));
            if scan != Some(&(held.count, held.earliest().unwrap_or(Millis::MAX))) {
                faults.push(format!(
                    "{key:?} {namespace}: index {held:?}, scan {scan:?}"
                ));
            }
        }
    }
    if indexed != scanned.len() {
        faults.push(format!("{indexed} indexed, {} scanned", scanned.len()));
    }
    faults
}

#[derive(Debug, Clone)]
struct TwinArrival {
    gap_ms: u64,
    namespace: u8,
    pool: bool,
    cost: u32,
    /// 0: a dry run, 1: an ask that does not reserve (deny, warn), else a reserving one.
    mode: u8,
    /// Asked through `acquire_within` (a retry-after rule's reach) rather than `acquire`.
    within: bool,
    retry_offset_ms: i64,
    sweep: bool,
}

fn twin_arrivals() -> impl Strategy<Value = Vec<TwinArrival>> {
    let gap = prop_oneof![8 => 0u64..300, 1 => 3_000u64..45_000];
    let offset = prop_oneof![
        Just(0i64),
        -(RETRY_ARRIVAL_MARGIN_MS as i64)..0,
        1i64..1_500
    ];
    prop::collection::vec(
        (
            gap,
            0u8..4,
            any::<bool>(),
            1u32..4,
            0u8..8,
            any::<bool>(),
            offset,
            prop::bool::weighted(0.05),
        )
            .prop_map(
                |(gap_ms, namespace, pool, cost, mode, within, retry_offset_ms, sweep)| {
                    TwinArrival {
                        gap_ms,
                        namespace,
                        pool,
                        cost: if pool { 1 } else { cost },
                        mode,
                        within,
                        retry_offset_ms,
                        sweep,
                    }
                },
            ),
        1..120,
    )
}

/// Runs the arrivals (and their retries, each request at most 12 times) through two
/// limiters, one deciding with `acquire`, the other with the full search; returns the
/// refusals seen, or the first step where their answers, or the new limiter's share
/// index, differ.
fn twin_run(
    limits: &[Limit],
    share: u32,
    hold: bool,
    input: &[TwinArrival],
) -> Result<Vec<RefusedWhy>, String> {
    const REACH: Millis = 2_000;
    let rule: Arc<str> = Arc::from("rule");
    let mut fast = Limiter::new(GENERATED_MAX_BUCKETS);
    let mut full = Limiter::new(GENERATED_MAX_BUCKETS);
    let identities = identities(input.iter().map(|a| (a.namespace, a.pool)));
    // (time, sequence, request index, attempt)
    let mut queue: BinaryHeap<Reverse<(u64, usize, usize, u32)>> = BinaryHeap::new();
    let mut now = 0;
    for (i, a) in input.iter().enumerate() {
        now += a.gap_ms;
        queue.push(Reverse((now, i, i, 0)));
    }
    let mut seq = input.len();
    let mut steps = 0;
    let mut seen = Vec::new();
    while let Some(Reverse((at, _, i, attempt))) = queue.pop() {
        steps += 1;
        let a = &input[i];
        let (identity, ns) = &identities[i];
        if a.sweep && attempt == 0 {
            let (f, s) = (fast.sweep(at), full.sweep(at));
            if (f.buckets, f.reservations) != (s.buckets, s.reservations) {
                return Err(format!("step {steps}: sweeps differ, {f:?} against {s:?}"));
            }
        }
        let mut request = ask(&rule, limits, ns, identity);
        request.cost = a.cost;
        request.max_reserved_per_namespace = share;
        request.align_beyond = hold.then_some(RETRY_ARRIVAL_MARGIN_MS);
        request.dry_run = a.mode == 0;
        request.reserve = a.mode != 1;
        let (got, want) = if a.within {
            let got = fast.acquire_within(&request, at, REACH);
            let want = match acquire_by_full_search(&mut full, &request, at) {
                Outcome::Reserved { slot } if slot > at + REACH => {
                    full.cancel_reservation(&request, slot);
                    Outcome::Refused {
                        retry_at: at + REACH,
                        why: RefusedWhy::BeyondReach,
                    }
                }
                other => other,
            };
            (got, want)
        } else {
            (
                fast.acquire(&request, at),
                acquire_by_full_search(&mut full, &request, at),
            )
        };
        if got != want {
            return Err(format!(
                "step {steps} at {at}, request {i} {a:?}: fast path {got:?}, full search {want:?}"
            ));
        }
        if let Outcome::Refused { why, .. } = got {
            if !seen.contains(&why) {
                seen.push(why);
            }
        }
        let faults = share_index_faults(&fast);
        if !faults.is_empty() {
            return Err(format!("step {steps} at {at}: share index: {faults:?}"));
        }
        let retry_at = match got {
            Outcome::Reserved { slot } if hold && slot - at <= RETRY_ARRIVAL_MARGIN_MS => {
                fast.consume(&rule, identity, slot);
                full.consume(&rule, identity, slot);
                None
            }
            Outcome::Reserved { slot } => {
                Some(slot.saturating_add_signed(a.retry_offset_ms).max(at + 1))
            }
            Outcome::Refused { retry_at, .. } => Some(retry_at.max(at + 1)),
            Outcome::Admitted | Outcome::Claimed { .. } | Outcome::Held { .. } => None,
        };
        if let Some(retry_at) = retry_at.filter(|_| attempt < 12) {
            queue.push(Reverse((retry_at, seq, i, attempt + 1)));
            seq += 1;
        }
    }
    for (key, bucket) in &fast.buckets {
        let other = full.buckets.get(key).map(|b| &b.charges);
        if other != Some(&bucket.charges) {
            return Err(format!(
                "{key:?}: charges {:?} against {other:?}",
                bucket.charges
            ));
        }
    }
    if fast.buckets.len() != full.buckets.len() || fast.reservation_count != full.reservation_count
    {
        return Err("the limiters' tables differ at the end".to_string());
    }
    Ok(seen)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn fits_at_is_the_earliest_answering_the_time_asked(
        mut charges in prop::collection::vec(0u64..10_000, 0..40),
        limit in generated_limit(Scope::Global),
        cost in 1u32..4,
        t in 0u64..12_000,
    ) {
        charges.sort_unstable();
        let bucket = Bucket { charges: charges.into(), ..Bucket::default() };
        prop_assert_eq!(bucket.fits_at(&limit, cost, t), bucket.earliest(&limit, cost, t) == t);
    }

    #[test]
    fn the_fast_path_answers_what_the_full_search_answered(
        limits in generated_rule(), share in 1u32..4, hold in any::<bool>(), input in twin_arrivals()
    ) {
        if let Err(fault) = twin_run(&limits, share, hold, &input) {
            prop_assert!(false, "{}", fault);
        }
    }
}

/// A run that reaches every refusal the fast path answers before the search (a
/// namespace's share) or after it (the table full, beyond the reach), and the twin
/// comparison holds through it.
#[test]
fn twin_runs_reach_every_refusal() {
    let input: Vec<TwinArrival> = (0..80u8)
        .map(|i| TwinArrival {
            gap_ms: 5,
            namespace: if i % 2 == 0 { 0 } else { 1 + (i / 2) % 7 },
            pool: false,
            cost: 1,
            mode: 2,
            within: i % 3 == 0,
            retry_offset_ms: 0,
            sweep: false,
        })
        .collect();
    let seen = twin_run(&[limit(2, 1_000, Scope::Global)], 3, true, &input).expect("twin run");
    for why in [
        RefusedWhy::NamespaceShare,
        RefusedWhy::TableFull,
        RefusedWhy::BeyondReach,
    ] {
        assert!(seen.contains(&why), "{why:?} not reached: {seen:?}");
    }
}
