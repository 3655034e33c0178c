use super::model::{build, cursor_of};
use super::release::{pod_patch, statefulset_patch, NotReleased};
use super::render::{human, in_words};
use super::report::StepPod;
use super::report::{Cluster, Report};
use super::sets::{estimate_ends, read_sets, rollout_state, Rollout};
use super::{parse_seconds, statefulset_name};
use crate::limiter::Millis;
use crate::names::parse_time;
use crate::objects::statefulsets::PodProgress;
use crate::policy::Policy;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

const POLICY: &str = r#"
rules:
  - name: sts-rollouts
    match: { resources: [statefulsets], operations: [UPDATE] }
    limit: { events: 5, window: 10s, scope: global }
    maxNotReady: 5
    action: partition
  - name: deploy-creates
    match: { resources: [pods], operations: [CREATE], controllerKinds: [ReplicaSet] }
    limit: { events: 5, window: 10s, scope: global }
    maxNotReady: 10
    action: gate
"#;

fn policy() -> Policy {
    Policy::from_yaml(POLICY, "test").unwrap_or_else(|e| panic!("{e}"))
}

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/status/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn items<T: serde::de::DeserializeOwned>(name: &str) -> Vec<T> {
    serde_json::from_value(fixture(name)["items"].clone()).unwrap_or_else(|e| panic!("{e}"))
}

fn at(text: &str) -> Millis {
    parse_time(text).unwrap_or_else(|| panic!("{text}: not a time"))
}

/// The fixtures' moment: the gated pods wait, shop/db took one step 6 s ago.
const NOW: &str = "2026-12-06T10:00:00.000Z";

fn report(namespace: Option<&str>) -> Report {
    report_with(&policy(), namespace)
}

fn report_with(policy: &Policy, namespace: Option<&str>) -> Report {
    report_with_overrides(policy, namespace, &[])
}

fn report_with_overrides(
    policy: &Policy,
    namespace: Option<&str>,
    overrides: &[kube::api::DynamicObject],
) -> Report {
    let pods: Vec<Pod> = items("pods");
    let sets: Vec<StatefulSet> = items("statefulsets");
    let lease: Lease = serde_json::from_value(fixture("lease")).unwrap_or_else(|e| panic!("{e}"));
    let now = at(NOW);
    // shop/db's last step released db-2: re-created from the update revision and Ready;
    // its old pod was seen deleted 6 s ago.
    let steps = HashMap::from([(
        "uid-shop-db".to_string(),
        StepPod {
            progress: PodProgress::Ready,
            deleted_by: now - 6_000,
        },
    )]);
    build(&Cluster {
        policy,
        policy_source: "ConfigMap churn-throttler/churn-throttler-policy",
        pods: &pods,
        sets: &sets,
        steps: &steps,
        lease: Some(&lease),
        lease_name: "churn-throttler/churn-throttler-releaser",
        namespace,
        overrides,
        now,
    })
}

fn pacing_object(name: &str, created: &str, spec: Value) -> kube::api::DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "churn-throttler.io/v1alpha1",
        "kind": "PacingOverride",
        "metadata": { "name": name, "namespace": "churn-throttler", "creationTimestamp": created },
        "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A pause made 10 minutes ago for 30 minutes: listed with who, why and the time left, the
/// rule it names shown paused by it (the estimates count from its end); an override of
/// the other rule puts its figures in force; a malformed object is noted; an expired one
/// is not listed.
#[test]
fn status_shows_pauses_and_overrides_with_who_why_and_time_left() {
    let objects = vec![
        pacing_object(
            "pause-a",
            "2026-12-06T09:50:00Z",
            json!({"rules": ["deploy-creates"], "pause": true, "duration": "30m", "author": "alice", "reason": "INC-1"}),
        ),
        pacing_object(
            "override-b",
            "2026-12-06T09:59:00Z",
            json!({"rules": ["sts-rollouts"], "override": {"events": 50}, "duration": "2h", "author": "bob"}),
        ),
        pacing_object(
            "old",
            "2026-12-06T08:00:00Z",
            json!({"all": true, "pause": true, "duration": "1h"}),
        ),
        pacing_object(
            "broken",
            "2026-12-06T09:00:00Z",
            json!({"all": true, "pause": true}),
        ),
    ];
    let report = report_with_overrides(&policy(), None, &objects);
    let names: Vec<&str> = report
        .pacing_overrides
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, vec!["pause-a", "override-b"]);
    let pause = &report.pacing_overrides[0];
    assert_eq!(
        (pause.kind, pause.author.as_str(), pause.reason.as_str()),
        ("pause", "alice", "INC-1")
    );
    assert_eq!(pause.seconds_left, Some(1200.0));
    assert_eq!(pause.until.as_deref(), Some("2026-12-06T10:20:00.000Z"));
    let rule = |name: &str| {
        report
            .rules
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("{name}"))
            .clone()
    };
    let gate = rule("deploy-creates")
        .schedule
        .unwrap_or_else(|| panic!("paused"));
    assert!(gate.paused);
    assert_eq!(gate.source, "a pause");
    let sts = rule("sts-rollouts")
        .schedule
        .unwrap_or_else(|| panic!("overridden"));
    assert!(!sts.paused);
    assert_eq!(sts.source, "an override");
    assert!(sts.in_force.starts_with("50 per 10s"), "{}", sts.in_force);
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("PacingOverride broken is ignored")),
        "{:?}",
        report.notes
    );
    let text = human(&report);
    assert!(text.contains("pauses and overrides: 2"), "{text}");
    assert!(
        text.contains("alice") && text.contains("INC-1") && text.contains("20m"),
        "{text}"
    );
}

/// A schedule window of `events: 0` open now shows as a pause with its end; one with
/// other figures puts them in the rule's line; a rule without schedules has none.
#[test]
fn status_shows_the_schedule_window_in_force_and_the_next_change() {
    // NOW is Sunday 6 December 2026, 10:00Z.
    let paused = POLICY.replace(
        "    maxNotReady: 10\n    action: gate\n",
        "    maxNotReady: 10\n    action: gate\n    schedules:\n      - { schedule: \"0 9 * * *\", duration: 2h, limit: { events: 0 } }\n",
    );
    let policy = Policy::from_yaml(&paused, "test").unwrap_or_else(|e| panic!("{e}"));
    let report = report_with(&policy, None);
    let rule = |name: &str| {
        report
            .rules
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("{name}"))
            .clone()
    };
    let gate = rule("deploy-creates");
    // The estimates count from the pause's end (unpaused: the last of the 5 pods in
    // 10.5 s): at 11:00 the windows are empty, so 2 go at once and 3 more 2.1 s apart.
    assert_eq!(gate.last_estimated_in_seconds, Some(3606.3));
    let schedule = gate.schedule.unwrap_or_else(|| panic!("a schedule"));
    assert!(schedule.paused);
    assert_eq!(
        schedule.paused_until.as_deref(),
        Some("2026-12-06T11:00:00.000Z")
    );
    assert_eq!(schedule.in_force, "paused until 2026-12-06T11:00:00.000Z");
    assert_eq!(schedule.source, "schedules[0] \"0 9 * * *\" UTC");
    assert_eq!(
        schedule.next_change.as_deref(),
        Some("2026-12-06T11:00:00.000Z")
    );
    assert_eq!(schedule.next_change_in_seconds, Some(3600.0));
    assert_eq!(
        schedule.next_in_force.as_deref(),
        Some("5 per 10s (global), burst 2, maxNotReady 10")
    );
    assert_eq!(rule("sts-rollouts").schedule, None);
    let text = human(&report);
    assert!(
        text.contains(
            "schedules:\n  deploy-creates: PAUSED: paused until 2026-12-06T11:00:00.000Z"
        ),
        "{text}"
    );
    // A window of 2 events: the rule's window figures follow it.
    let slower = paused.replace("events: 0", "events: 2");
    let policy = Policy::from_yaml(&slower, "test").unwrap_or_else(|e| panic!("{e}"));
    let report = report_with(&policy, None);
    let gate = report
        .rules
        .iter()
        .find(|r| r.name == "deploy-creates")
        .unwrap_or_else(|| panic!("gate rule"));
    assert_eq!(gate.window_limit, 2);
    assert_eq!(gate.limit, "2 per 10s (global)");
    assert!(gate.schedule.as_ref().is_some_and(|s| !s.paused));
}

#[test]
fn the_gate_rule_from_the_fixtures() {
    let report = report(None);
    let rule = report
        .rules
        .iter()
        .find(|r| r.name == "deploy-creates")
        .expect("the gate rule");
    // Released 5 s and 2.9 s ago (the releaser), 2 s ago (admitted at once), and the pod
    // whose gate someone else removed, counted now: 4 of 5 in the window.
    assert_eq!((rule.window_events, rule.window_limit), (4, 5));
    assert_eq!(rule.spacing_seconds, Some(2.1));
    // The window has room; the spacing (2.1 s, burst 2) after those four gives +1.3 s.
    assert_eq!(rule.next_free_slot, "2026-12-06T10:00:01.300Z");
    assert_eq!(rule.waiting, 5);
    assert_eq!(rule.released_not_ready, 1, "web-r2 is not Ready");
    assert_eq!(rule.max_not_ready, Some(10));
    assert_eq!(rule.last_estimated_in_seconds, Some(10.5));
}

#[test]
fn table_of_gated_pods_from_the_fixtures() {
    let report = report(None);
    // The releaser served shop last (web-r2, its latest release; api-a1 was admitted at
    // once and does not move its turn): blog, cart, shop in turn, oldest first.
    let want = [
        ("blog", "api-g1", 1, "2026-12-06T10:00:01.300Z"),
        ("cart", "cart-g1", 2, "2026-12-06T10:00:05.500Z"),
        ("shop", "web-g1", 3, "2026-12-06T10:00:07.600Z"),
        ("cart", "cart-g2", 4, "2026-12-06T10:00:08.500Z"),
        ("shop", "web-g2", 5, "2026-12-06T10:00:10.500Z"),
    ];
    let got: Vec<(&str, &str, usize, &str)> = report
        .gated_pods
        .iter()
        .map(|p| {
            (
                p.namespace.as_str(),
                p.name.as_str(),
                p.position,
                p.estimated_release.as_deref().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(got, want);
    // -n lists one namespace; the places still count every namespace.
    let shop = self::report(Some("shop"));
    let got: Vec<(&str, usize)> = shop
        .gated_pods
        .iter()
        .map(|p| (p.name.as_str(), p.position))
        .collect();
    assert_eq!(got, [("web-g1", 3), ("web-g2", 5)]);
    assert_eq!(shop.held_stateful_sets.len(), 1, "shop/db only");
}

#[test]
fn held_statefulsets_and_the_leader_from_the_fixtures() {
    let report = report(None);
    let rule = report
        .rules
        .iter()
        .find(|r| r.name == "sts-rollouts")
        .expect("the partition rule");
    // db-2 seen deleted 6 s ago, the record of cart/old 2 s and 1 s ago.
    assert_eq!((rule.window_events, rule.window_limit), (3, 5));
    assert_eq!(rule.waiting, 2);
    assert_eq!(rule.pods_to_step, Some(5), "shop/db 2, blog/cache 3");
    assert_eq!(rule.released_not_ready, 0);
    /// (name, partition, target, updated, ready, steps left)
    type Row<'a> = (&'a str, u32, Option<u32>, u32, u32, u32);
    let sets: Vec<Row> = report
        .held_stateful_sets
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                s.partition,
                s.target,
                s.updated_replicas,
                s.ready_replicas,
                s.steps_left,
            )
        })
        .collect();
    assert_eq!(
        sets,
        [("cache", 3, Some(0), 0, 3, 3), ("db", 2, Some(0), 1, 3, 2)]
    );
    for set in &report.held_stateful_sets {
        let end = set.estimated_in_seconds.expect("an estimated end");
        // Five steps at 5 per 10 s behind three in the window: none before the window
        // frees, all within two windows.
        assert!((0.0..=20.0).contains(&end), "{}: {end}", set.name);
    }
    let last = report
        .held_stateful_sets
        .iter()
        .filter_map(|s| s.estimated_in_seconds)
        .fold(0.0, f64::max);
    assert_eq!(rule.last_estimated_in_seconds, Some(last));
    let leader = report.leader.as_ref().expect("a leader");
    assert_eq!(leader.holder.as_deref(), Some("releaser-a"));
    assert_eq!(leader.renewed_seconds_ago, Some(1.2));
    assert!(!leader.expired);
    // The documented schema's top level.
    let json = serde_json::to_value(&report).unwrap_or_default();
    for key in [
        "apiVersion",
        "kind",
        "time",
        "namespace",
        "policy",
        "leader",
        "rules",
        "gatedPods",
        "heldStatefulSets",
        "notes",
    ] {
        assert!(json.get(key).is_some(), "{key} in {json}");
    }
    assert_eq!(json["gatedPods"][0]["estimatedInSeconds"], json!(1.3));
}

#[test]
fn the_table_shows_every_section() {
    let text = human(&report(None));
    for needle in [
        "leader: releaser-a (Lease churn-throttler/churn-throttler-releaser, renewed 1.2s ago)",
        "deploy-creates  gate",
        "4/5",
        "5 pods",
        "2 sets (5 pods)",
        "gated pods: 5",
        "blog       api-g1   deploy-creates  1         1.3s        10:00:01.3",
        "held StatefulSets: 2",
    ] {
        assert!(text.contains(needle), "{needle:?} in\n{text}");
    }
}

#[test]
fn the_set_estimate_paces_steps_by_the_rule() {
    let policy = policy();
    let now = at(NOW);
    let sets: Vec<StatefulSet> = (0..4)
        .map(|i| {
            let mut sts = items::<StatefulSet>("statefulsets")[1].clone();
            sts.metadata.name = Some(format!("cache-{i}"));
            sts.metadata.uid = Some(format!("uid-{i}"));
            sts
        })
        .collect();
    let (held, _, records) = read_sets(&sets, &HashMap::new());
    let mut ends: Vec<Millis> = estimate_ends(&held, &records, &policy, now)
        .into_iter()
        .map(|e| e.expect("an end") - now)
        .collect();
    ends.sort_unstable();
    // 12 steps at 5 per 10 s (spacing 2.1 s, burst 2): the last at 2 windows and a bit;
    // namespaces (one here) and sets take turns, so the ends are close together.
    assert_eq!(ends.len(), 4);
    assert!(ends[3] >= 20_000 && ends[3] <= 25_000, "{ends:?}");
    assert!(ends[3] - ends[0] <= 3 * 2_100, "{ends:?}");
}

#[test]
fn the_cursor_is_the_namespace_of_the_last_release() {
    use crate::pacing::gate::ReleasedPod;
    let policy = policy();
    let released = |ns: &str, at: Millis, by: Option<&str>| ReleasedPod {
        namespace: ns.into(),
        name: format!("{ns}-{at}"),
        uid: format!("{ns}-{at}"),
        rule: "deploy-creates".into(),
        owner: None,
        released_at: Some(at),
        settled: false,
        held_elsewhere: false,
        admitted_by: by.map(str::to_string),
    };
    // (case, releases, namespace served last)
    let cases: Vec<(&str, Vec<ReleasedPod>, Option<&str>)> = vec![
        ("nothing released", vec![], None),
        (
            "the latest release",
            vec![
                released("a", 5, None),
                released("c", 9, None),
                released("b", 7, None),
            ],
            Some("c"),
        ),
        (
            "a pod admitted at once does not take a turn",
            vec![released("a", 5, None), released("z", 9, Some("webhook/1"))],
            Some("a"),
        ),
    ];
    for (case, pods, want) in cases {
        assert_eq!(
            cursor_of(&policy, &pods).last("deploy-creates"),
            want,
            "{case}"
        );
    }
}

fn statefulset(edit: impl Fn(&mut Value)) -> StatefulSet {
    let mut sts = fixture("statefulsets")["items"][0].clone();
    edit(&mut sts);
    serde_json::from_value(sts).unwrap_or_else(|e| panic!("{e}"))
}

fn set_annotations(sts: &mut Value, annotations: Value) {
    sts["metadata"]["annotations"] = annotations;
}

/// The predicate `status sts/NAME --wait` waits on.
type Edit = Box<dyn Fn(&mut Value)>;

/// (case, edit of shop/db held at 2 (target 0), target seen while held, state)
fn rollout_cases() -> Vec<(&'static str, Edit, Option<u32>, Rollout)> {
    fn done(sts: &mut Value) {
        sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(0);
        sts["status"]["updatedReplicas"] = json!(3);
        sts["status"]["readyReplicas"] = json!(3);
        sts["status"]["currentRevision"] = json!("db-new");
    }
    vec![
        (
            "held: the annotation is there",
            Box::new(|_| {}),
            None,
            Rollout::Held {
                partition: 2,
                target: Some(0),
            },
        ),
        (
            "held with every pod updated and Ready still waits for the hold to end",
            Box::new(|s| {
                done(s);
                s["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(0);
            }),
            None,
            Rollout::Held {
                partition: 0,
                target: Some(0),
            },
        ),
        (
            "the hold ended at its target, the last pod not Ready yet",
            Box::new(|s| {
                done(s);
                set_annotations(s, json!({}));
                s["status"]["readyReplicas"] = json!(2);
            }),
            Some(0),
            Rollout::Rolling("2 of 3 pods Ready (3 exist)".into()),
        ),
        (
            "the hold ended, the controller has not seen the last generation",
            Box::new(|s| {
                done(s);
                set_annotations(s, json!({}));
                s["metadata"]["generation"] = json!(3);
            }),
            Some(0),
            Rollout::Rolling("the controller has not seen generation 3 yet (observed 2)".into()),
        ),
        (
            "complete: updated == ready == replicas, revisions equal",
            Box::new(|s| {
                done(s);
                set_annotations(s, json!({}));
            }),
            Some(0),
            Rollout::Complete,
        ),
        (
            "complete with the revisions not yet equal but every replica updated",
            Box::new(|s| {
                done(s);
                set_annotations(s, json!({}));
                s["status"]["currentRevision"] = json!("db-old");
            }),
            Some(0),
            Rollout::Complete,
        ),
    ]
}

/// Ends of a hold that are not complete rollouts, and what still counts as one.
fn let_go_cases() -> Vec<(&'static str, Edit, Option<u32>, Rollout)> {
    fn done(sts: &mut Value) {
        sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(0);
        sts["status"]["updatedReplicas"] = json!(3);
        sts["status"]["readyReplicas"] = json!(3);
        sts["status"]["currentRevision"] = json!("db-new");
    }
    vec![
        (
            "let go: the hold ended with the partition above its target",
            Box::new(|s| {
                set_annotations(s, json!({"churn-throttler.io/partition-held": "2"}));
            }),
            Some(0),
            Rollout::LetGo {
                partition: 2,
                target: Some(0),
            },
        ),
        (
            "let go before the wait began: partition-held left without a target",
            Box::new(|s| {
                set_annotations(s, json!({"churn-throttler.io/partition-held": "2"}));
            }),
            None,
            Rollout::LetGo {
                partition: 2,
                target: None,
            },
        ),
        (
            "released by hand to its target: not let go, complete once rolled",
            Box::new(|s| {
                done(s);
                set_annotations(
                    s,
                    json!({"churn-throttler.io/partition-held": "0",
                           "churn-throttler.io/released-by": "alice at 2026-12-06T10:00:00.000Z"}),
                );
            }),
            None,
            Rollout::Complete,
        ),
        (
            "switched to OnDelete while held: let go",
            Box::new(|s| {
                set_annotations(s, json!({}));
                s["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
            }),
            Some(0),
            Rollout::LetGo {
                partition: 0,
                target: Some(0),
            },
        ),
        (
            "a canary target: complete once the pods above it are updated",
            Box::new(|s| {
                set_annotations(s, json!({}));
                s["status"]["updatedReplicas"] = json!(1);
            }),
            Some(2),
            Rollout::Complete,
        ),
    ]
}

#[test]
fn table_of_rollout_states() {
    for (case, edit, seen, want) in rollout_cases().into_iter().chain(let_go_cases()) {
        let sts = statefulset(edit);
        assert_eq!(rollout_state(&sts, seen), want, "{case}");
    }
}

fn gated_pod(edit: impl Fn(&mut Value)) -> Pod {
    let mut pod = fixture("pods")["items"][5].clone();
    edit(&mut pod);
    serde_json::from_value(pod).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_pod_release_patch_applied_to_a_gated_pod() {
    let now = at(NOW);
    let pod = gated_pod(|_| {});
    assert_eq!(pod.metadata.name.as_deref(), Some("api-g1"));
    let patch = pod_patch(&pod, "alice", now).expect("a patch");
    let mut value = serde_json::to_value(&pod).unwrap_or_default();
    json_patch::patch(&mut value, &patch).unwrap_or_else(|e| panic!("{e}"));
    // Only our gate goes; the other component's stays.
    assert_eq!(
        value["spec"]["schedulingGates"],
        json!([{"name": "example.com/other"}])
    );
    let meta = &value["metadata"];
    assert_eq!(
        meta["labels"]["churn-throttler.io/gated"],
        json!("released")
    );
    assert_eq!(
        meta["annotations"]["churn-throttler.io/released-at"],
        json!(NOW)
    );
    assert_eq!(
        meta["annotations"]["churn-throttler.io/released-by"],
        json!(format!("alice at {NOW}"))
    );
    assert_eq!(
        meta["annotations"]["churn-throttler.io/gated-by"],
        json!("deploy-creates")
    );
    // Changed since it was read: the resourceVersion test refuses the patch.
    let mut changed = serde_json::to_value(&pod).unwrap_or_default();
    changed["metadata"]["resourceVersion"] = json!("101");
    assert!(json_patch::patch(&mut changed, &patch).is_err());
    // Nothing to release.
    let ungated = gated_pod(|p| p["spec"]["schedulingGates"] = json!([]));
    assert_eq!(
        pod_patch(&ungated, "alice", now),
        Err(NotReleased::NotGated)
    );
    let released =
        gated_pod(|p| p["metadata"]["labels"]["churn-throttler.io/gated"] = json!("released"));
    assert_eq!(
        pod_patch(&released, "alice", now),
        Err(NotReleased::NotGated)
    );
}

#[test]
fn the_statefulset_release_patch_applied_to_a_held_set() {
    let now = at(NOW);
    let sts = statefulset(|s| {
        s["metadata"]["annotations"]["churn-throttler.io/partition-stepped-at"] =
            json!("2026-12-06T09:59:54.000Z");
    });
    let (patch, target) = statefulset_patch(&sts, "alice", now).expect("a patch");
    assert_eq!(target, 0);
    let mut value = serde_json::to_value(&sts).unwrap_or_default();
    json_patch::patch(&mut value, &patch).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        value["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
        json!(0)
    );
    let annotations = &value["metadata"]["annotations"];
    assert_eq!(
        annotations,
        &json!({
            // The webhook takes partition == partition-held for a releaser step.
            "churn-throttler.io/partition-held": "0",
            // The step record stays for the windows; the releaser cleans it up.
            "churn-throttler.io/paced-by": "sts-rollouts",
            "churn-throttler.io/partition-stepped-at": "2026-12-06T09:59:54.000Z",
            "churn-throttler.io/released-by": format!("alice at {NOW}"),
        })
    );
    // What --wait then sees: not let go, complete once the controller has rolled.
    assert!(matches!(
        rollout_state(
            &serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}")),
            None
        ),
        Rollout::Rolling(_)
    ));
    let mut changed = serde_json::to_value(&sts).unwrap_or_default();
    changed["metadata"]["resourceVersion"] = json!("201");
    assert!(json_patch::patch(&mut changed, &patch).is_err());
    let free = statefulset(|s| set_annotations(s, json!({})));
    assert_eq!(
        statefulset_patch(&free, "alice", now).map(|(_, t)| t),
        Err(NotReleased::NotHeld)
    );
}

#[test]
fn table_of_small_parsers() {
    let names = [
        ("sts/db", Some("db")),
        ("statefulset/db", Some("db")),
        ("StatefulSets.apps/db", Some("db")),
        ("deploy/db", None),
        ("sts/", None),
        ("db", None),
    ];
    for (text, want) in names {
        assert_eq!(statefulset_name(text), want, "{text}");
    }
    assert_eq!(parse_seconds("5"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_seconds("500ms"), Ok(Duration::from_millis(500)));
    assert!(parse_seconds("0").is_err());
    let words = [
        (0.0, "now"),
        (1.26, "1.3s"),
        (65.0, "1m05s"),
        (7_300.0, "2h01m"),
    ];
    for (seconds, want) in words {
        assert_eq!(in_words(seconds), want);
    }
}

#[test]
fn the_network_window_reads_in_words() {
    use super::render::network_line;
    assert_eq!(
        network_line("12 floor=2.0s p90=3.1s change=queue").as_deref(),
        Some("network window 12 (floor 2.0 s, p90 3.1 s, shrinking: a queue showed)")
    );
    assert_eq!(
        network_line("4 floor=- p90=- change=start").as_deref(),
        Some("network window 4 (floor - s, p90 - s, nothing measured yet)")
    );
    assert_eq!(network_line("").as_deref(), None);
}
