use super::*;
use crate::policy::Policy;
use proptest::prelude::*;

fn at(text: &str) -> Millis {
    let t: jiff::Timestamp = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
    t.as_millisecond() as Millis
}

/// A gate rule of 10 per 10 s (burst 2, maxNotReady 100) with these schedule windows.
fn rule_with(schedules: &str) -> Rule {
    let yaml = format!(
        "rules:\n  - name: r\n    match: {{ resources: [pods], operations: [CREATE] }}\n    \
         limit: {{ events: 10, window: 10s }}\n    action: gate\n    maxNotReady: 100\n    \
         schedules:\n{schedules}"
    );
    let policy = Policy::from_yaml(&yaml, "p").unwrap_or_else(|e| panic!("{e}"));
    policy.rules[0].clone()
}

/// The issue's example: weekdays 09:00-17:00 Berlin paused, nightly 01:00-04:00 UTC at 50.
const EXAMPLE: &str = "      - schedule: \"0 9 * * 1-5\"\n        timeZone: Europe/Berlin\n        duration: 8h\n        limit: { events: 0 }\n      - schedule: \"0 1 * * *\"\n        duration: 3h\n        limit: { events: 50 }\n        maxNotReady: 400\n";

/// (now, events in force, source, paused until, maxNotReady, next change)
type Expected = (
    &'static str,
    u32,
    Source,
    Option<&'static str>,
    Option<u32>,
    &'static str,
);

#[test]
fn the_issue_example_over_a_day() {
    let rule = rule_with(EXAMPLE);
    let cases: &[Expected] = &[
        // Monday 7 December 2026, 00:30Z: nothing open.
        (
            "2026-12-07T00:30:00Z",
            10,
            Source::Rule,
            None,
            Some(100),
            "2026-12-07T01:00:00Z",
        ),
        // 01:00Z to 04:00Z: the nightly window.
        (
            "2026-12-07T01:00:00Z",
            50,
            Source::Schedule { window: 1 },
            None,
            Some(400),
            "2026-12-07T04:00:00Z",
        ),
        (
            "2026-12-07T03:59:59Z",
            50,
            Source::Schedule { window: 1 },
            None,
            Some(400),
            "2026-12-07T04:00:00Z",
        ),
        (
            "2026-12-07T04:00:00Z",
            10,
            Source::Rule,
            None,
            Some(100),
            "2026-12-07T08:00:00Z",
        ),
        // 09:00 Berlin (CET) = 08:00Z: paused until 16:00Z.
        (
            "2026-12-07T08:00:00Z",
            0,
            Source::Schedule { window: 0 },
            Some("2026-12-07T16:00:00Z"),
            Some(100),
            "2026-12-07T16:00:00Z",
        ),
        (
            "2026-12-07T15:00:00Z",
            0,
            Source::Schedule { window: 0 },
            Some("2026-12-07T16:00:00Z"),
            Some(100),
            "2026-12-07T16:00:00Z",
        ),
        (
            "2026-12-07T16:00:00Z",
            10,
            Source::Rule,
            None,
            Some(100),
            "2026-12-08T01:00:00Z",
        ),
        // Saturday 12 December, noon: no business hours; next is the nightly window.
        (
            "2026-12-12T12:00:00Z",
            10,
            Source::Rule,
            None,
            Some(100),
            "2026-12-13T01:00:00Z",
        ),
        // Summer (CEST, UTC+2): 09:00 Berlin = 07:00Z.
        (
            "2026-07-06T07:00:00Z",
            0,
            Source::Schedule { window: 0 },
            Some("2026-07-06T15:00:00Z"),
            Some(100),
            "2026-07-06T15:00:00Z",
        ),
    ];
    for (now, events, source, paused, mnr, next) in cases {
        let f = limit_in_force(&rule, &[], at(now));
        assert_eq!(f.events(), *events, "{now}");
        assert_eq!(f.source, *source, "{now}");
        assert_eq!(f.paused_until, paused.map(at), "{now}");
        assert_eq!(f.max_not_ready, *mnr, "{now}");
        assert_eq!(f.next_change, Some(at(next)), "{now}");
        // window and scope stay the rule's.
        assert_eq!(f.limits[0].window, rule.limits[0].window, "{now}");
        assert_eq!(f.limits[0].scope, rule.limits[0].scope, "{now}");
    }
}

#[test]
fn overlapping_windows_the_most_restrictive_wins_field_by_field() {
    let rule = rule_with(
        "      - schedule: \"0 1 * * *\"\n        duration: 4h\n        limit: { events: 50, burst: 5 }\n        maxNotReady: 20\n\
         \x20     - schedule: \"0 2 * * *\"\n        duration: 1h\n        limit: { events: 30, burst: 10 }\n        maxNotReady: 400\n",
    );
    let f = limit_in_force(&rule, &[], at("2026-12-07T02:30:00Z"));
    assert_eq!(f.limits[0].events, 30);
    assert_eq!(f.limits[0].burst, 5);
    assert_eq!(f.max_not_ready, Some(20));
    assert_eq!(f.source, Source::Schedule { window: 1 });
    assert_eq!(f.next_change, Some(at("2026-12-07T03:00:00Z")));
    let f = limit_in_force(&rule, &[], at("2026-12-07T03:30:00Z"));
    assert_eq!((f.limits[0].events, f.limits[0].burst), (50, 5));
    assert_eq!(f.source, Source::Schedule { window: 0 });
    // A window that names no burst keeps the limit's own (2 here): one that names a
    // larger burst does not raise it.
    let rule = rule_with(
        "      - { schedule: \"0 1 * * *\", duration: 4h, limit: { events: 50, burst: 50 } }\n\
         \x20     - { schedule: \"0 2 * * *\", duration: 1h, limit: { events: 30 } }\n",
    );
    let f = limit_in_force(&rule, &[], at("2026-12-07T02:30:00Z"));
    assert_eq!((f.limits[0].events, f.limits[0].burst), (30, 2));
}

#[test]
fn a_window_longer_than_its_period_is_always_in_force() {
    let rule = rule_with(
        "      - schedule: \"0 * * * *\"\n        duration: 2h\n        limit: { events: 3 }\n",
    );
    for now in [
        "2026-12-07T00:00:00Z",
        "2026-12-07T13:17:00Z",
        "2027-03-28T01:59:59Z",
    ] {
        let f = limit_in_force(&rule, &[], at(now));
        assert_eq!(f.events(), 3, "{now}");
        assert_eq!(f.next_change, None, "{now}");
    }
    assert!(rule.schedules[0].always_open(at("2026-12-07T00:00:00Z")));
}

#[test]
fn dst_spring_forward_and_fall_back_in_berlin() {
    // 02:30 Berlin daily, 1 h, paused. 29 March 2026: 02:30 does not exist, the window
    // opens at 03:30 CEST (01:30Z) and lasts an hour of elapsed time.
    let rule = rule_with(
        "      - schedule: \"30 2 * * *\"\n        timeZone: Europe/Berlin\n        duration: 1h\n        limit: { events: 0 }\n",
    );
    let f = limit_in_force(&rule, &[], at("2026-03-29T01:00:00Z"));
    assert_eq!(f.events(), 10);
    assert_eq!(f.next_change, Some(at("2026-03-29T01:30:00Z")));
    let f = limit_in_force(&rule, &[], at("2026-03-29T01:30:00Z"));
    assert_eq!(f.paused_until, Some(at("2026-03-29T02:30:00Z")));
    // 25 October 2026: 02:30 happens twice; the window opens once, at the first
    // (00:30Z), and the second 02:30 (01:30Z) opens nothing.
    let f = limit_in_force(&rule, &[], at("2026-10-25T00:45:00Z"));
    assert_eq!(f.paused_until, Some(at("2026-10-25T01:30:00Z")));
    let f = limit_in_force(&rule, &[], at("2026-10-25T01:45:00Z"));
    assert_eq!(f.paused_until, None);
    assert_eq!(f.next_change, Some(at("2026-10-26T01:30:00Z")));
}

#[test]
fn adjustments_take_precedence_pause_then_the_newest_override() {
    let rule = rule_with(EXAMPLE);
    let night = at("2026-12-07T02:00:00Z");
    let over = |from: &str, until: &str, events| Adjustment::Override {
        from: at(from),
        until: at(until),
        events,
        burst: None,
        max_not_ready: None,
    };
    let older = over("2026-12-07T01:30:00Z", "2026-12-07T05:00:00Z", 5);
    let newer = over("2026-12-07T01:45:00Z", "2026-12-07T02:30:00Z", 80);
    let f = limit_in_force(&rule, &[older, newer], night);
    assert_eq!((f.events(), f.source), (80, Source::Override));
    assert_eq!(f.next_change, Some(at("2026-12-07T02:30:00Z")));
    let f = limit_in_force(&rule, &[newer, older], at("2026-12-07T02:45:00Z"));
    assert_eq!((f.events(), f.source), (5, Source::Override));
    let pause = Adjustment::Pause {
        from: at("2026-12-07T01:50:00Z"),
        until: None,
    };
    let f = limit_in_force(&rule, &[older, pause, newer], night);
    assert_eq!((f.events(), f.source), (0, Source::Pause));
    assert_eq!(f.paused_until, Some(Millis::MAX));
    // Expired or future ones are not in force; a future one is a change.
    let later = over("2026-12-07T02:10:00Z", "2026-12-07T02:20:00Z", 1);
    let f = limit_in_force(&rule, &[later], night);
    assert_eq!((f.events(), f.source), (50, Source::Schedule { window: 1 }));
    assert_eq!(f.next_change, Some(at("2026-12-07T02:10:00Z")));
}

#[test]
fn next_changes_of_a_policy() {
    let rule = rule_with(EXAMPLE);
    let policy = Policy {
        rules: vec![rule],
        ..Policy::builtin()
    };
    let changes = next_changes(&policy, at("2026-12-07T00:30:00Z"), 4);
    let got: Vec<(Millis, u32)> = changes
        .iter()
        .map(|c| (c.at, c.in_force.events()))
        .collect();
    assert_eq!(
        got,
        vec![
            (at("2026-12-07T01:00:00Z"), 50),
            (at("2026-12-07T04:00:00Z"), 10),
            (at("2026-12-07T08:00:00Z"), 0),
            (at("2026-12-07T16:00:00Z"), 10),
        ]
    );
    let (in_force, next) = policy_in_force(&policy, &[], at("2026-12-07T09:00:00Z"));
    assert_eq!(
        in_force.rules[0].paused_at(at("2026-12-07T09:00:00Z")),
        Some(at("2026-12-07T16:00:00Z"))
    );
    assert_eq!(
        in_force.rules[0].paused_by,
        crate::policy::PAUSED_BY_SCHEDULE
    );
    assert_eq!(next, Some(at("2026-12-07T16:00:00Z")));
    // The built-in policy has no schedules and comes back as it is.
    let builtin = Policy::builtin();
    assert!(!has_schedules(&builtin));
    assert_eq!(policy_in_force(&builtin, &[], 0), (builtin.clone(), None));
}

/// Windows drawn from a small grammar: a minute, an hour set, a weekday set, a zone.
fn arb_window() -> impl Strategy<Value = String> {
    (
        0u32..60,
        prop::sample::select(vec!["*", "1", "2", "1,13", "*/6", "9-17"]),
        prop::sample::select(vec!["*", "1-5", "0", "6,0"]),
        prop::sample::select(vec!["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
        1u64..(48 * 60),
        prop::sample::select(vec![0u32, 1, 5, 50]),
    )
        .prop_map(|(m, h, dow, zone, minutes, events)| {
            format!(
                "      - schedule: \"{m} {h} * * {dow}\"\n        timeZone: {zone}\n        duration: {minutes}m\n        limit: {{ events: {events} }}\n"
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The order of the windows does not matter, the figures in force are never above
    /// any open window's, and nothing changes before the next change.
    #[test]
    fn order_independent_most_restrictive_and_stable_until_the_next_change(
        windows in prop::collection::vec(arb_window(), 1..4),
        // 2026 and 2027, DST changes included.
        now in 1_767_225_600_000u64..1_830_297_600_000u64,
    ) {
        let forward = rule_with(&windows.concat());
        let mut reversed_windows = windows.clone();
        reversed_windows.reverse();
        let reversed = rule_with(&reversed_windows.concat());
        let a = limit_in_force(&forward, &[], now);
        let b = limit_in_force(&reversed, &[], now);
        prop_assert_eq!(&a.limits, &b.limits);
        prop_assert_eq!(a.max_not_ready, b.max_not_ready);
        prop_assert_eq!(a.paused_until, b.paused_until);
        prop_assert_eq!(a.next_change, b.next_change);
        for w in &forward.schedules {
            if w.open_since(now).is_some() {
                prop_assert!(a.events() <= w.events);
            }
        }
        if !forward.schedules.iter().any(|w| w.open_since(now).is_some()) {
            prop_assert_eq!(a.source, Source::Rule);
            prop_assert_eq!(&a.limits, &forward.limits);
        }
        if let Some(next) = a.next_change {
            prop_assert!(next > now);
            let before = limit_in_force(&forward, &[], next - 1);
            prop_assert_eq!(&before.limits, &a.limits);
            prop_assert_eq!(before.paused_until.is_some(), a.paused_until.is_some());
        }
        if let Some(until) = a.paused_until.filter(|&u| u != Millis::MAX) {
            prop_assert!(until > now);
            prop_assert!(limit_in_force(&forward, &[], until - 1).paused_until.is_some());
        }
    }

    /// A window's occurrence holds `now` exactly when a fire time lies within the
    /// duration before it (checked against a minute-by-minute scan of the wall clock).
    #[test]
    fn open_since_matches_a_brute_force_scan(
        window in arb_window(),
        now in 1_767_225_600_000u64..1_830_297_600_000u64,
    ) {
        let rule = rule_with(&window);
        let w = &rule.schedules[0];
        let span = w.duration.as_millis() as Millis;
        // Every minute boundary from now - duration to now, as a wall time in the zone;
        // a boundary is a fire time when it is the first instant of a matching wall time.
        let mut latest = None;
        let mut t = (now.saturating_sub(span)) / 60_000 * 60_000;
        while t <= now {
            if t + span > now && fires_at(w, t) {
                latest = Some(t);
            }
            t += 60_000;
        }
        // Skipped wall times fire off the minute grid only in zones with half-hour
        // shifts; the grid holds them here since every shift is a whole minute.
        prop_assert_eq!(w.open_since(now), latest);
    }
}

/// Whether the window fires at instant `t`: some wall time the cron matches maps to `t`.
fn fires_at(w: &ScheduleWindow, t: Millis) -> bool {
    let ts = jiff::Timestamp::from_millisecond(t as i64).unwrap_or_else(|e| panic!("{e}"));
    // The candidates: the wall time at `t`, and any skipped wall time that maps to `t`
    // (the wall time up to three hours before, read in the offset before the shift).
    let mut candidates = vec![ts.to_zoned(w.zone.clone()).datetime()];
    for back in 1..=180i64 {
        let dt = ts.to_zoned(w.zone.clone()).datetime() - jiff::SignedDuration::from_mins(back);
        candidates.push(dt);
    }
    candidates.into_iter().any(|dt| {
        w.cron.matches_wall(dt) && w.zone.to_ambiguous_timestamp(dt).compatible().ok() == Some(ts)
    })
}

/// The limiter keeps its charges when the events in force change: a higher limit counts
/// what was charged under the lower one, a lower one what was charged under the higher,
/// and a pause (nothing charged) earns no more than the burst after it.
#[test]
fn a_change_of_limit_keeps_the_charged_history_and_a_pause_earns_no_burst() {
    use crate::limiter::{Ask, Identity, Limiter, Outcome};
    let yaml = "rules:\n  - name: r\n    match: { resources: [pods], operations: [DELETE] }\n    \
                limit: { events: 10, burst: 10, window: 10s }\n    action: retry-after\n    schedules:\n\
                \x20     - { schedule: \"0 1 * * *\", duration: 1h, limit: { events: 50, burst: 50 } }\n\
                \x20     - { schedule: \"0 3 * * *\", duration: 1h, limit: { events: 0 } }\n\
                \x20     - { schedule: \"0 5 * * *\", duration: 1h, limit: { events: 2 } }\n";
    let policy = Policy::from_yaml(yaml, "p").unwrap_or_else(|e| panic!("{e}"));
    let mut limiter = Limiter::new(1_000);
    // How many of `tries` the limits in force at `now` admit at once, and the last answer.
    let mut admit = |now: Millis, tries: usize| -> (usize, Outcome) {
        let (in_force, _) = policy_in_force(&policy, &[], now);
        let rule = &in_force.rules[0];
        assert_eq!(rule.paused_at(now), None, "not paused at {now}");
        let mut admitted = 0;
        let mut last = Outcome::Admitted;
        for i in 0..tries {
            let identity = Identity::Exact(format!("{now}-{i}"));
            last = limiter.acquire(
                &Ask {
                    rule: &rule.name,
                    limits: &rule.limits,
                    namespace: "ns",
                    owner: None,
                    identity: &identity,
                    cost: 1,
                    reserve: false,
                    dry_run: false,
                    max_reserved_per_namespace: 1_000,
                    align_beyond: None,
                },
                now,
            );
            if last == Outcome::Admitted {
                admitted += 1;
            }
        }
        (admitted, last)
    };
    // 00:59:55, the rule's 10 per 10 s.
    assert_eq!(admit(at("2026-12-07T00:59:55Z"), 20).0, 10);
    // 01:00:00, the window's 50: the 10 charged five seconds ago still count.
    assert_eq!(admit(at("2026-12-07T01:00:00Z"), 100).0, 40);
    // 01:59:58: 50 at once, then back to 10 at 02:00:00: those 50 hold it until they
    // leave the window, at 02:00:08.
    assert_eq!(admit(at("2026-12-07T01:59:58Z"), 100).0, 50);
    let (admitted, last) = admit(at("2026-12-07T02:00:00Z"), 1);
    assert_eq!(admitted, 0);
    assert!(
        matches!(last, Outcome::Refused { retry_at, .. } if retry_at == at("2026-12-07T02:00:08Z")),
        "{last:?}"
    );
    // 03:00 to 04:00 paused: nothing is charged (the decisions answer before the limiter).
    let (paused, _) = policy_in_force(&policy, &[], at("2026-12-07T03:30:00Z"));
    assert_eq!(
        paused.rules[0].paused_at(at("2026-12-07T03:30:00Z")),
        Some(at("2026-12-07T04:00:00Z"))
    );
    // 05:00, 2 per 10 s (burst 2): after the pause and the quiet hours, 2 at once, no more.
    assert_eq!(admit(at("2026-12-07T05:00:00Z"), 20).0, 2);
    assert_eq!(admit(at("2026-12-07T05:00:01Z"), 20).0, 0);
}

/// A pause or override from a PacingOverride applies to the rules it names (or every
/// rule), on the built-in policy without schedules too, and ends by itself.
#[test]
fn scoped_adjustments_apply_to_their_rules_only() {
    let builtin = Policy::builtin();
    let first: String = builtin.rules[0].name.to_string();
    let second: String = builtin.rules[1].name.to_string();
    let pause_first = Scoped {
        rules: Some(vec![first.clone()]),
        adjustment: Adjustment::Pause {
            from: 1_000,
            until: Some(61_000),
        },
    };
    let (in_force, next) = policy_in_force(&builtin, std::slice::from_ref(&pause_first), 2_000);
    assert_eq!(in_force.rules[0].paused_at(2_000), Some(61_000));
    assert_eq!(in_force.rules[1].paused_at(2_000), None);
    assert_eq!(
        in_force.rules[0].paused_by,
        crate::policy::PAUSED_BY_COMMAND
    );
    assert_eq!(next, Some(61_000));
    // After its end, the policy's own again.
    let (after, _) = policy_in_force(&builtin, std::slice::from_ref(&pause_first), 61_000);
    assert_eq!(after.rules[0].paused_at(61_000), None);
    // Every rule, indefinitely: paused with no end in sight.
    let all = Scoped {
        rules: None,
        adjustment: Adjustment::Pause {
            from: 0,
            until: None,
        },
    };
    let (paused, _) = policy_in_force(&builtin, &[all], 5);
    assert!(paused
        .rules
        .iter()
        .all(|r| r.paused_at(5) == Some(Millis::MAX)));
    // An override of the second rule to 50 events per window.
    let over = Scoped {
        rules: Some(vec![second]),
        adjustment: Adjustment::Override {
            from: 0,
            until: 10_000,
            events: 50,
            burst: None,
            max_not_ready: Some(7),
        },
    };
    let (overridden, _) = policy_in_force(&builtin, &[over], 5);
    assert_eq!(overridden.rules[1].limits[0].events, 50);
    assert_eq!(overridden.rules[1].max_not_ready, Some(7));
    assert_eq!(overridden.rules[0], builtin.rules[0]);
}
