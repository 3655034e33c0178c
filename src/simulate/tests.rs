//! Tests of the simulator's model pieces, one named case per row, and a small scenario
//! whose invariants hold for every action. No test looks at the wall clock.

use super::client::{item_backoff, FairQueue, TokenBucket, WorkQueue};
use super::report::{self, peak_in_window, per_window, percentile};
use super::requests::Phase;
use super::requests::{
    pod_create_request, pod_delete_request, statefulset_next, statefulset_update_request,
    StsUpdate, StsWrite,
};
use super::scenario::{Dist, ScenarioFile, SimAction};
use super::{simulate, RunResult};
use crate::admission::{classify, Classified};
use kube::core::admission::AdmissionReview;
use kube::core::DynamicObject;
use serde_json::{json, Value};

const R: Phase = Phase::Ready;
const T: Phase = Phase::Terminating;
const A: Phase = Phase::Absent;
const S: Phase = Phase::Starting;
const G: Phase = Phase::Gated;

/// (name, pods as (phase, updated) by ordinal, partition, expected write)
type OrderCase = (
    &'static str,
    &'static [(Phase, bool)],
    u32,
    Option<StsWrite>,
);

#[test]
fn statefulset_controller_order() {
    let cases: &[OrderCase] = &[
        (
            "highest out-of-date first",
            &[(R, false), (R, false), (R, false)],
            0,
            Some(StsWrite::Delete(2)),
        ),
        (
            "then the next one down",
            &[(R, false), (R, false), (R, true)],
            0,
            Some(StsWrite::Delete(1)),
        ),
        (
            "wait for the terminating pod",
            &[(R, false), (R, false), (T, false)],
            0,
            None,
        ),
        (
            "re-create once it is gone",
            &[(R, false), (R, false), (A, false)],
            0,
            Some(StsWrite::Create(2)),
        ),
        (
            "wait for the new pod to be Ready",
            &[(R, false), (R, false), (S, true)],
            0,
            None,
        ),
        (
            "a gated pod is not Ready either",
            &[(R, false), (R, false), (G, true)],
            0,
            None,
        ),
        (
            "lowest missing ordinal first",
            &[(A, false), (R, false), (A, true)],
            0,
            Some(StsWrite::Create(0)),
        ),
        (
            "partition at replicas holds everything",
            &[(R, false), (R, false), (R, false)],
            3,
            None,
        ),
        (
            "partition 2 releases only ordinal 2",
            &[(R, false), (R, false), (R, false)],
            2,
            Some(StsWrite::Delete(2)),
        ),
        (
            "partition 2, ordinal 2 done: nothing below it",
            &[(R, false), (R, false), (R, true)],
            2,
            None,
        ),
        ("all updated", &[(R, true), (R, true), (R, true)], 0, None),
    ];
    for (name, pods, partition, want) in cases {
        let got = statefulset_next(pods.len() as u32, *partition, |o| pods[o as usize]);
        assert_eq!(got, *want, "{name}");
    }
}

#[test]
fn work_queue_backoff_doubles_from_5ms_to_1000s() {
    let cases = [
        (0, 5),
        (1, 10),
        (2, 20),
        (10, 5_120),
        (17, 655_360),
        (18, 1_000_000),
        (40, 1_000_000),
        (80, 1_000_000),
    ];
    for (failures, want) in cases {
        assert_eq!(
            item_backoff(5, 1_000_000, failures),
            want,
            "failures {failures}"
        );
    }
    let mut q = WorkQueue::new(2, 5, 1_000_000, 0.0, 1);
    assert_eq!(q.add_rate_limited(0, 100), Some(105), "first failure: 5 ms");
    assert!(q.fire(0, 105));
    assert_eq!(
        q.add_rate_limited(0, 200),
        Some(210),
        "second failure: 10 ms"
    );
    assert!(q.fire(0, 210));
    assert_eq!(q.failures(0), 2);
    q.forget(0);
    assert_eq!(
        q.add_rate_limited(0, 300),
        Some(305),
        "forget resets the count"
    );
    assert_eq!(q.add_rate_limited(0, 300), None, "an earlier AddAfter wins");
    assert!(!q.fire(0, 310), "a superseded timer does nothing");
}

#[test]
fn work_queue_overall_bucket_paces_requeues() {
    // client-go's default: 10 qps, burst 100 -> the 101st requeue at once waits 100 ms.
    let mut q = WorkQueue::new(200, 5, 1_000_000, 10.0, 100);
    let delays: Vec<u64> = (0..102)
        .map(|i| q.add_rate_limited(i, 0).unwrap_or(0))
        .collect();
    assert_eq!(delays[0], 5);
    assert_eq!(delays[99], 5);
    assert_eq!(delays[100], 100);
    assert_eq!(delays[101], 200);
}

#[test]
fn work_queue_dedups_like_client_go() {
    let mut q = WorkQueue::new(3, 5, 1000, 0.0, 1);
    q.add(1);
    q.add(1);
    assert_eq!(
        q.len(),
        1,
        "an item waiting in the queue is not added twice"
    );
    assert_eq!(q.get(), Some(1));
    q.add(1);
    assert_eq!(q.len(), 0, "an item being processed is only marked dirty");
    q.done(1);
    assert_eq!(q.get(), Some(1), "and comes back when done");
    q.done(1);
    assert!(q.is_empty());
}

#[test]
fn token_bucket_reserves_into_the_future() {
    let mut b = TokenBucket::new(20.0, 30);
    let waits: Vec<u64> = (0..32).map(|_| b.reserve(0)).collect();
    assert_eq!(&waits[..30], &[0; 30]);
    assert_eq!(waits[30], 50);
    assert_eq!(waits[31], 100);
    assert_eq!(b.reserve(1000), 0, "refilled after a second");
    assert_eq!(TokenBucket::new(0.0, 1).reserve(0), 0, "qps 0 is off");
}

#[test]
fn fair_queue_round_robin_oldest_first() {
    let mut q = FairQueue::default();
    for (ns, item) in [(0, 1), (0, 2), (0, 3), (0, 4), (1, 10), (2, 20), (2, 21)] {
        q.push(ns, item);
    }
    let mut order = Vec::new();
    while let Some((_, item)) = q.pop() {
        order.push(item);
    }
    assert_eq!(order, [1, 10, 20, 2, 21, 3, 4]);

    // A namespace whose head does not fit is passed over, not dropped.
    let mut q = FairQueue::default();
    q.push(0, 1);
    q.push(1, 10);
    q.skip();
    assert_eq!(q.pop(), Some((1, 10)));
    assert_eq!(q.pop(), Some((0, 1)));
    assert!(q.is_empty());
}

#[test]
fn distributions_parse_and_sample() {
    let cases = [
        ("10s", Dist::Fixed(10_000), 0.5, 0.0, 10_000),
        (
            "uniform(1s, 3s)",
            Dist::Uniform(1_000, 3_000),
            0.5,
            0.0,
            2_000,
        ),
        (
            "lognormal(20s, 0.25)",
            Dist::LogNormal {
                median: 20_000,
                sigma: 0.25,
            },
            0.5,
            0.0,
            20_000,
        ),
    ];
    for (text, want, u, z, sample) in cases {
        let d = Dist::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(d, want, "{text}");
        assert_eq!(d.sample(u, z), sample, "{text}");
        assert_eq!(Dist::parse(&d.to_string()), Ok(d), "{text} round trip");
    }
    for bad in [
        "",
        "uniform(3s, 1s)",
        "lognormal(20s)",
        "normal(1s, 2s)",
        "10",
    ] {
        assert!(Dist::parse(bad).is_err(), "{bad:?} should not parse");
    }
}

#[test]
fn window_peak_and_percentiles() {
    assert_eq!(peak_in_window(&[], 10), 0);
    assert_eq!(peak_in_window(&[0, 9, 10, 19, 20], 10), 2);
    assert_eq!(peak_in_window(&[5, 5, 5, 14], 10), 4);
    assert_eq!(per_window(&[0, 9, 10, 25], 10, 30), vec![2, 1, 1, 0]);
    assert_eq!(percentile(&[3, 1, 2, 4], 50.0), Some(2));
    assert_eq!(percentile(&[3, 1, 2, 4], 99.0), Some(4));
    assert_eq!(percentile(&[], 50.0), None);
}

// --- requests are built the way classify() builds them ----------------------------------

fn classified(request: Value) -> crate::admission::ChurnRequest {
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": request,
    }))
    .expect("review");
    let req = review.request.expect("request");
    match classify(&req) {
        Classified::Churn(churn) => *churn,
        Classified::Pass(reason) => panic!("not churn: {reason:?}"),
    }
}

#[allow(clippy::too_many_arguments)]
fn request(
    kind: &str,
    group: &str,
    resource: &str,
    op: &str,
    name: &str,
    user: &str,
    object: Value,
    old: Value,
) -> Value {
    let version = "v1";
    json!({
        "uid": "00000000-0000-0000-0000-000000000001",
        "kind": { "group": group, "version": version, "kind": kind },
        "resource": { "group": group, "version": version, "resource": resource },
        "name": name,
        "namespace": "tenant-00001",
        "operation": op,
        "userInfo": { "username": user },
        "object": object,
        "oldObject": old,
        "dryRun": false,
    })
}

fn owner(kind: &str, uid: &str) -> Value {
    json!([{ "apiVersion": "apps/v1", "kind": kind, "name": "x", "uid": uid, "controller": true }])
}

#[test]
fn requests_match_classify() {
    use super::scenario::{OPERATOR, RELEASER, REPLICASET_CONTROLLER, STATEFULSET_CONTROLLER};
    let ns = "tenant-00001";
    let pod = |name: Option<&str>, generate: Option<&str>, kind: &str, uid: &str, node: bool| {
        let mut meta = json!({ "namespace": ns, "ownerReferences": owner(kind, uid) });
        if let Some(n) = name {
            meta["name"] = json!(n);
        }
        if let Some(g) = generate {
            meta["generateName"] = json!(g);
        }
        let mut spec = json!({ "containers": [{ "name": "c", "image": "i" }] });
        if node {
            spec["nodeName"] = json!("kwok-node-0");
        }
        json!({ "apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
                "status": { "phase": "Running" } })
    };
    let sts = |partition: Option<u32>, image: &str, annotations: Option<Value>, current: &str| {
        let mut meta = json!({ "namespace": ns, "name": "mysql-1", "uid": "uid-sts-1" });
        if let Some(a) = annotations {
            meta["annotations"] = a;
        }
        let mut strategy = json!({ "type": "RollingUpdate" });
        if let Some(p) = partition {
            strategy["rollingUpdate"] = json!({ "partition": p });
        }
        json!({ "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
                "spec": { "replicas": 3, "updateStrategy": strategy,
                          "template": { "spec": { "containers": [{ "name": "c", "image": image }] } } },
                "status": { "currentRevision": current, "updateRevision": "r2" } })
    };
    let cases: Vec<(&str, Value, crate::admission::ChurnRequest)> = vec![
        (
            "statefulset pod delete",
            request(
                "Pod",
                "",
                "pods",
                "DELETE",
                "mysql-1-2",
                STATEFULSET_CONTROLLER,
                Value::Null,
                pod(Some("mysql-1-2"), None, "StatefulSet", "uid-sts-1", true),
            ),
            pod_delete_request(
                ns,
                "mysql-1-2",
                STATEFULSET_CONTROLLER,
                "StatefulSet",
                "uid-sts-1",
            ),
        ),
        (
            "statefulset pod create",
            request(
                "Pod",
                "",
                "pods",
                "CREATE",
                "mysql-1-2",
                STATEFULSET_CONTROLLER,
                pod(Some("mysql-1-2"), None, "StatefulSet", "uid-sts-1", false),
                Value::Null,
            ),
            pod_create_request(
                ns,
                "mysql-1-2",
                "",
                STATEFULSET_CONTROLLER,
                "StatefulSet",
                "uid-sts-1",
            ),
        ),
        (
            "replicaset pod create as the mutating webhook sees it",
            request(
                "Pod",
                "",
                "pods",
                "CREATE",
                "",
                REPLICASET_CONTROLLER,
                pod(
                    None,
                    Some("web-0-new-"),
                    "ReplicaSet",
                    "uid-rs-new-0",
                    false,
                ),
                Value::Null,
            ),
            pod_create_request(
                ns,
                "",
                "web-0-new-",
                REPLICASET_CONTROLLER,
                "ReplicaSet",
                "uid-rs-new-0",
            ),
        ),
        (
            "operator changes the template",
            request(
                "StatefulSet",
                "apps",
                "statefulsets",
                "UPDATE",
                "mysql-1",
                OPERATOR,
                sts(None, "v2", None, "r2"),
                sts(None, "v1", None, "r2"),
            ),
            statefulset_update_request(&StsUpdate {
                namespace: ns,
                name: "mysql-1",
                uid: "uid-sts-1",
                user: OPERATOR,
                replicas: 3,
                template_changed: true,
                old_partition: None,
                new_partition: None,
                update_pending: false,
                old_target: None,
                new_target: None,
                new_held: None,
            }),
        ),
        (
            "the releaser steps the partition from 3 to 2",
            request(
                "StatefulSet",
                "apps",
                "statefulsets",
                "UPDATE",
                "mysql-1",
                RELEASER,
                sts(
                    Some(2),
                    "v2",
                    Some(json!({ "churn-throttler.io/partition-target": "0",
                                 "churn-throttler.io/partition-held": "2" })),
                    "r1",
                ),
                sts(
                    Some(3),
                    "v2",
                    Some(json!({ "churn-throttler.io/partition-target": "0",
                                 "churn-throttler.io/partition-held": "3" })),
                    "r1",
                ),
            ),
            statefulset_update_request(&StsUpdate {
                namespace: ns,
                name: "mysql-1",
                uid: "uid-sts-1",
                user: RELEASER,
                replicas: 3,
                template_changed: false,
                old_partition: Some(3),
                new_partition: Some(2),
                update_pending: true,
                old_target: Some(0),
                new_target: Some(0),
                new_held: Some(2),
            }),
        ),
    ];
    for (name, req, built) in cases {
        let mut want = classified(req);
        // Labels are not modelled (no rule of the simulated policies looks at them).
        want.labels.clear();
        assert_eq!(built, want, "{name}");
    }
}

// --- whole runs ---------------------------------------------------------------------------

fn small(actions: &[&str]) -> ScenarioFile {
    ScenarioFile {
        name: "small".into(),
        statefulsets: 40,
        replicas: 3,
        namespaces: 7,
        deployments: 4,
        deployment_replicas: 4,
        terminate: "uniform(1s, 3s)".into(),
        start: "lognormal(4s, 0.3)".into(),
        limit: "10/5s".into(),
        max_not_ready: 15,
        actions: actions.iter().map(|a| a.to_string()).collect(),
        ..ScenarioFile::default()
    }
}

fn run(file: &ScenarioFile) -> Vec<RunResult> {
    let sc = file.build().expect("scenario");
    simulate(&sc).expect("runs")
}

#[test]
fn small_scenario_invariants() {
    check_invariants("model");
}

#[test]
fn small_scenario_invariants_with_the_real_releaser_plans() {
    check_invariants("real");
}

#[test]
fn model_releasers_match_the_real_plans() {
    let model = run(&small(&["gate", "partition"]));
    let real = run(&ScenarioFile {
        releasers: "real".into(),
        ..small(&["gate", "partition"])
    });
    for (m, r) in model.iter().zip(&real) {
        let action = m.action;
        let (m, r) = (
            m.makespan.expect("model converges") as f64,
            r.makespan.expect("real converges") as f64,
        );
        assert!(
            (m - r).abs() / r < 0.1,
            "{action:?}: model {m} ms, real {r} ms"
        );
    }
}

fn check_invariants(releasers: &str) {
    let all = ["none", "deny", "retry-after", "hold", "gate", "partition"];
    let file = ScenarioFile {
        releasers: releasers.into(),
        ..small(&all)
    };
    let sc = file.build().expect("scenario");
    let runs = run(&file);
    assert_eq!(runs.len(), all.len());
    for r in &runs {
        let action = r.action.expect("action");
        let name = action.as_str();
        assert_eq!(r.converged, r.workloads, "{name}: every workload converges");
        assert!(r.makespan.is_some(), "{name}: has a makespan");
        assert!(
            r.collateral.is_some(),
            "{name}: the unthrottled set converges"
        );
        assert_eq!(
            r.deletions.len() as u64,
            sc.paced_pods(),
            "{name}: one deletion per pod"
        );
        assert_eq!(
            r.starts.len() as u64,
            sc.paced_pods(),
            "{name}: one start per pod"
        );
        if action == SimAction::None {
            assert!(r.charges.is_empty());
            assert_eq!(r.refused, 0);
            continue;
        }
        // What the limiter charged never exceeds the limit in any window, per rule.
        assert!(!r.charges.is_empty(), "{name}: something was charged");
        for (rule, times) in &r.charges {
            let peak = peak_in_window(times, sc.window);
            assert!(
                peak <= sc.events as usize,
                "{name}/{rule}: {peak} charges in a window"
            );
        }
        // And where the paced event happens at its charge (plus a constant latency),
        // the cluster sees no more than the limit either.
        let paced = match action {
            SimAction::Deny => Some(&r.deletions),
            SimAction::Gate => Some(&r.starts),
            SimAction::Partition => Some(&r.steps),
            _ => None,
        };
        if let Some(times) = paced {
            let peak = peak_in_window(times, sc.window);
            assert!(
                peak <= sc.events as usize,
                "{name}: {peak} paced events in a window"
            );
        }
    }
    let by = |a: SimAction| runs.iter().find(|r| r.action == Some(a)).expect("run");
    let partition = by(SimAction::Partition);
    assert_eq!(partition.refused, 0, "partition refuses nothing");
    assert_eq!(partition.errors, 0);
    assert_eq!(partition.retries, 0);
    assert_eq!(partition.worker_blocked, 0, "partition blocks no worker");
    assert_eq!(
        partition.steps.len() as u32,
        file.statefulsets * file.replicas
    );
    let gate = by(SimAction::Gate);
    assert_eq!(gate.refused, 0, "gate refuses nothing");
    assert!(gate.gated > 0);
    assert!(
        by(SimAction::Deny).errors > 0,
        "deny sends controllers into backoff"
    );
    assert!(
        by(SimAction::RetryAfter).retries > 0,
        "retry-after makes client-go retry"
    );
    assert!(by(SimAction::Hold).holds > 0, "hold holds");
}

/// A blocking action on the deletions with the creations behind the gate (the built-in
/// policy's shape and the e2e's): the starts keep the limit, the gate holds the created
/// pods rather than the workers, and the rollout ends sooner than with the same blocking
/// action on both, where each worker waits twice per pod.
#[test]
fn blocking_actions_with_gated_creations() {
    let actions = ["deny", "retry-after", "hold"];
    let gated = run(&ScenarioFile {
        gate_creates: true,
        ..small(&actions)
    });
    let both = run(&ScenarioFile {
        pace_creates: true,
        ..small(&actions)
    });
    let sc = small(&actions).build().expect("scenario");
    for (g, b) in gated.iter().zip(&both) {
        let name = g.action.expect("action").as_str();
        assert_eq!(g.converged, g.workloads, "{name}: every workload converges");
        assert!(g.gated > 0, "{name}: creations went behind the gate");
        assert_eq!(
            b.gated, 0,
            "{name}: nothing gated when the action paces both"
        );
        let peak = peak_in_window(&g.starts, sc.window);
        assert!(
            peak <= sc.events as usize,
            "{name}: {peak} starts in a window"
        );
        // deny frees the worker at once either way (its cost is the backoff), so only the
        // actions that keep a worker waiting gain from taking the creations off them.
        if g.action != Some(SimAction::Deny) {
            let (g_ms, b_ms) = (g.makespan.expect("gated"), b.makespan.expect("both"));
            assert!(
                g_ms < b_ms,
                "{name}: {g_ms} ms with gated creations, {b_ms} ms with both paced"
            );
        }
    }
}

/// The partition path with slow pods: a step counts until its old pod is deleted, the
/// replacements pass the StatefulSet gate rule, so deletions and starts both keep the rate
/// and terminations overlap; the makespan stays near the ideal plus one pod's own restart.
#[test]
fn partition_keeps_the_rate_whatever_pods_take_to_stop() {
    for terminate_s in [1, 10, 30] {
        let file = ScenarioFile {
            releasers: "real".into(),
            deployments: 0,
            terminate: format!("{terminate_s}s"),
            start: "lognormal(4s, 0.2)".into(),
            statefulsets: 100,
            max_not_ready: 0,
            ..small(&["partition"])
        };
        let sc = file.build().expect("scenario");
        let r = &run(&file)[0];
        let case = format!("terminate {terminate_s} s");
        assert_eq!(r.converged, r.workloads, "{case}: converged");
        assert_eq!((r.refused, r.errors, r.worker_blocked), (0, 0, 0), "{case}");
        for (what, times) in [("deletions", &r.deletions), ("starts", &r.starts)] {
            let peak = peak_in_window(times, sc.window);
            assert!(
                peak <= sc.events as usize,
                "{case}: {peak} {what} in a window"
            );
        }
        // 300 pods at 10 per 5 s: 150 s (more than one set's 3 pods one after the
        // other take); plus one pod's stop and start (median 4 s).
        let ideal = 150_000 + terminate_s * 1_000 + 4_000;
        let makespan = r.makespan.expect("makespan");
        assert!(
            makespan as f64 <= 1.10 * ideal as f64,
            "{case}: makespan {makespan} ms against {ideal} ms"
        );
        let p50 = percentile(&r.outages, 0.5).expect("outages");
        assert!(
            p50 <= terminate_s * 1_000 + 4_000 + sc.window,
            "{case}: outage p50 {p50} ms"
        );
    }
}

#[test]
fn runs_are_deterministic() {
    let file = small(&["retry-after", "gate"]);
    let a = run(&file);
    let b = run(&file);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.makespan, y.makespan);
        assert_eq!(x.deletions, y.deletions);
        assert_eq!(x.outages, y.outages);
        assert_eq!(x.events, y.events);
    }
}

#[test]
fn client_go_gives_up_after_ten_retries_then_backs_off() {
    // Two single-pod StatefulSets, room for one deletion an hour, Retry-After capped at
    // 1 s: the second deletion is retried 10 times, 1 s apart, then fails back to the
    // controller, which requeues it after 5 ms, 10 ms, ...
    let file = ScenarioFile {
        statefulsets: 2,
        replicas: 1,
        namespaces: 1,
        limit: "1/1h".into(),
        max_retry_after: "1s".into(),
        api_latency: "0ms".into(),
        terminate: "0ms".into(),
        start: "1ms".into(),
        client_qps: 0.0,
        queue_qps: 0.0,
        collateral: false,
        actions: vec!["retry-after".into()],
        ..ScenarioFile::default()
    };
    // (horizon, client-go retries so far, errors back to the controller)
    let cases = [
        ("9900ms", 10, 0),
        ("10s", 10, 1),
        ("20s", 20, 1),
        ("20005ms", 20, 2),
        ("30015ms", 30, 3),
    ];
    for (horizon, retries, errors) in cases {
        let f = ScenarioFile {
            horizon: horizon.into(),
            ..file.clone()
        };
        let r = run(&f).remove(0);
        assert_eq!((r.retries, r.errors), (retries, errors), "at {horizon}");
        assert_eq!(r.converged, 1, "at {horizon}: the first set went through");
    }
}

#[test]
fn scenario_files_and_presets() {
    for name in super::PRESETS {
        let f = ScenarioFile::preset(name).expect("preset");
        f.build().unwrap_or_else(|e| panic!("{name}: {e}"));
        let back = ScenarioFile::from_yaml(&f.to_yaml()).expect("round trip");
        assert_eq!(back, f, "{name}");
    }
    let f = ScenarioFile::from_yaml("statefulsets: 5\nlimit: 3/1s\n").expect("partial file");
    assert_eq!(f.statefulsets, 5);
    assert_eq!(f.replicas, 3, "defaults fill the rest");
    assert!(
        ScenarioFile::from_yaml("statefulset: 5\n").is_err(),
        "typos are errors"
    );
    let bad = [
        (
            "limit",
            ScenarioFile {
                limit: "20 per 10s".into(),
                ..ScenarioFile::default()
            },
        ),
        (
            "actions",
            ScenarioFile {
                actions: vec!["throttle".into()],
                ..ScenarioFile::default()
            },
        ),
        (
            "maxHold",
            ScenarioFile {
                max_hold: "8s".into(),
                ..ScenarioFile::default()
            },
        ),
        (
            "start",
            ScenarioFile {
                start: "soon".into(),
                ..ScenarioFile::default()
            },
        ),
        (
            "paceCreates with gateCreates",
            ScenarioFile {
                pace_creates: true,
                gate_creates: true,
                ..ScenarioFile::default()
            },
        ),
    ];
    for (what, f) in bad {
        assert!(f.build().is_err(), "{what} should be rejected");
    }
}

/// The network scenario of docs/adaptive.md, smaller: StatefulSets behind
/// statefulset-creates and Deployments behind controller-creates, one CNI of C pods/s.
fn network(actions: &[&str], cni_rate: &str, adaptive: bool) -> ScenarioFile {
    ScenarioFile {
        name: "network".into(),
        statefulsets: 40,
        replicas: 2,
        namespaces: 40,
        deployments: 8,
        deployment_replicas: 5,
        max_surge: 5,
        terminate: "10s".into(),
        start: "0s".into(),
        limit: "20/10s".into(),
        max_not_ready: 200,
        collateral: false,
        cni_rate: cni_rate.into(),
        cni_base: "2s".into(),
        adaptive,
        actions: actions.iter().map(|a| a.to_string()).collect(),
        ..ScenarioFile::default()
    }
}

fn queue_max(sc: &ScenarioFile, r: &RunResult) -> u32 {
    let sc = sc.build().expect("scenario");
    report::row(&sc, r).cni_queue_max.expect("network modelled")
}

#[test]
fn adaptive_window_keeps_the_cni_queue_short_where_the_fixed_one_does_not() {
    // 2 Deployments x 50 behind controller-creates at 2 pods/s, a CNI of 0.5 pods/s:
    // with maxNotReady alone the CNI's queue grows to tens; the window holds it within
    // max(5, 2 s x C) = 5. (Few workloads: each keeps its own floor, see docs/adaptive.md
    // on many small workloads.)
    for releasers in ["model", "real"] {
        for adaptive in [false, true] {
            let file = ScenarioFile {
                releasers: releasers.into(),
                statefulsets: 0,
                deployments: 2,
                deployment_replicas: 50,
                max_surge: 50,
                namespaces: 2,
                ..network(&["gate"], "0.5/s", adaptive)
            };
            for r in run(&file) {
                let q = queue_max(&file, &r);
                let action = r.action;
                assert_eq!(r.converged, r.workloads, "{releasers} {action:?} converges");
                if adaptive {
                    assert!(q <= 5, "{releasers} {action:?} adaptive: CNI queue {q}");
                } else {
                    assert!(q > 20, "{releasers} {action:?} fixed: CNI queue only {q}");
                }
            }
        }
    }
}

#[test]
fn network_runs_are_deterministic_and_flags_off_change_nothing() {
    let file = network(&["gate", "partition"], "10/s,1/s@60s", true);
    let a = run(&file);
    let b = run(&file);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.makespan, y.makespan);
        assert_eq!(x.start_latency, y.start_latency);
        assert_eq!(x.cni_spans, y.cni_spans);
        assert_eq!(x.window, y.window);
        assert_eq!(x.events, y.events);
        assert!(!x.window.is_empty(), "the window moved");
    }
    // Without a network model the same scenario runs as before: no CNI, start from
    // the binding.
    let plain = run(&ScenarioFile {
        cni_rate: String::new(),
        adaptive: false,
        ..file
    });
    for r in &plain {
        assert!(r.cni_spans.is_empty() && r.window.is_empty());
        assert_eq!(r.converged, r.workloads);
    }
}

#[test]
fn adaptive_needs_a_network_and_max_not_ready() {
    let no_cni = ScenarioFile {
        cni_rate: String::new(),
        ..network(&["gate"], "1/s", true)
    };
    assert!(no_cni.build().is_err());
    let no_cap = ScenarioFile {
        max_not_ready: 0,
        ..network(&["gate"], "1/s", true)
    };
    assert!(no_cap.build().is_err());
}

#[test]
fn model_partition_steps_are_spaced_as_the_real_plan_spaces_them() {
    // 20 per 10 s with the policy's burst of 1: a step every 0.5 s, never 20 in a second.
    for releasers in ["model", "real"] {
        let file = ScenarioFile {
            releasers: releasers.into(),
            limit: "20/10s".into(),
            ..small(&["partition"])
        };
        let sc = file.build().expect("scenario");
        let r = &run(&file)[0];
        let row = report::row(&sc, r);
        assert!(
            row.peak_paced_1s <= 3,
            "{releasers}: {} steps in one second",
            row.peak_paced_1s
        );
        assert!(
            row.peak_paced <= 20,
            "{releasers}: {} in 10 s",
            row.peak_paced
        );
    }
}

/// `--policy FILE --start-time TIME`: a schedule window of `events: 0` stops the releases
/// and steps for its whole length (no charge of a paced rule inside it), then the rollout
/// finishes; the same run without the window ends before the window would have opened.
#[test]
fn a_pause_window_stops_releases_in_the_simulation() {
    let pause = "rules:\n  - name: g\n    match: { resources: [pods], operations: [CREATE] }\n    \
                 limit: { events: 1, window: 1s }\n    action: gate\n    schedules:\n      \
                 - { schedule: \"0 1 * * *\", duration: 10m, limit: { events: 0 } }\n  \
                 - name: p\n    match: { resources: [statefulsets], operations: [UPDATE] }\n    \
                 limit: { events: 1, window: 1s }\n    action: partition\n    schedules:\n      \
                 - { schedule: \"0 1 * * *\", duration: 10m, limit: { events: 0 } }\n";
    let policy = crate::policy::Policy::from_yaml(pause, "p").unwrap_or_else(|e| panic!("{e}"));
    // The simulated clock's zero is 00:59:40Z: the window is open from 20 s to 620 s.
    let start = crate::names::parse_time("2026-12-07T00:59:40Z").unwrap_or_else(|| panic!("time"));
    let (opens, closes) = (20_000, 620_000);
    for releasers in ["model", "real"] {
        let file = ScenarioFile {
            releasers: releasers.into(),
            horizon: "30m".into(),
            ..small(&["gate", "partition"])
        };
        let plain = run(&file);
        let mut sc = file.build().expect("scenario");
        sc.schedules = Some(super::scenario::Schedules {
            policy: policy.clone(),
            start,
        });
        let paused = simulate(&sc).expect("runs");
        for (plain, paused) in plain.iter().zip(&paused) {
            let action = paused.action;
            let ends = plain
                .makespan
                .unwrap_or_else(|| panic!("{action:?} {releasers}: converges"));
            assert!(
                ends > opens,
                "{action:?} {releasers}: still running when the window opens"
            );
            assert!(
                ends < closes,
                "{action:?} {releasers}: would end inside the window"
            );
            for (rule, times) in &paused.charges {
                let inside: Vec<_> = times
                    .iter()
                    .filter(|&&t| t >= opens && t < closes)
                    .collect();
                assert!(
                    inside.is_empty(),
                    "{action:?} {releasers}: {rule} charged at {inside:?}"
                );
            }
            let inside_steps = paused
                .steps
                .iter()
                .filter(|&&t| t >= opens && t < closes)
                .count();
            assert_eq!(
                inside_steps, 0,
                "{action:?} {releasers}: partition steps in the pause"
            );
            assert_eq!(
                paused.converged, paused.workloads,
                "{action:?} {releasers}: finishes"
            );
            assert!(
                paused.makespan.is_some_and(|m| m > closes),
                "{action:?} {releasers}: ends after the window ({:?})",
                paused.makespan
            );
        }
    }
}
