use super::classify::StatefulSetChange;
use super::gate::mark_admission;
use super::*;
use crate::limiter::Limiter;
use crate::names::{ADMITTED_BY_ANNOTATION, GATED_BY_ANNOTATION, GATED_LABEL};
use crate::policy::Policy;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use kube::core::DynamicObject;
use serde_json::{json, Value};

const POLICY: &str = r#"
timeoutSeconds: 10
rules:
  - name: sts-rollouts
    match: { resources: [statefulsets], operations: [UPDATE], excludeUsers: [self-paced] }
    limit: { events: 2, burst: 2, window: 10s }
    action: partition
  - name: creates
    match: { resources: [pods], operations: [CREATE], controllerKinds: [ReplicaSet, StatefulSet] }
    limit: { events: 2, burst: 2, window: 10s }
    action: gate
  - name: deletes
    match:
      resources: [pods]
      operations: [DELETE]
      users: [system:serviceaccount:kube-system:replicaset-controller]
    limit: { events: 1, burst: 1, window: 10s }
    action: retry-after
    maxHold: 3s
    maxReservedPerNamespace: 5
  - name: evictions
    match: { resources: [pods/eviction], operations: [CREATE] }
    limit: { events: 1, burst: 1, window: 10s }
    action: deny
  - name: partition-steps
    match: { resources: [statefulsets], operations: [UPDATE] }
    limit: { events: 2, burst: 2, window: 10s }
    action: retry-after
exempt:
  namespaces: [kube-system]
  users: [system:serviceaccount:kube-system:namespace-controller]
"#;

fn policy() -> Policy {
    Policy::from_yaml(POLICY, "test").unwrap_or_else(|e| panic!("{e}"))
}

fn fixture(name: &str) -> AdmissionRequest<DynamicObject> {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    review
        .try_into()
        .unwrap_or_else(|_| panic!("{path}: no request"))
}

fn verdicts(name: &str, endpoint: Endpoint, times: &[u64]) -> Vec<Verdict> {
    let policy = policy();
    let mut limiter = Limiter::new(1_000);
    let req = fixture(name);
    times
        .iter()
        .map(|&now| decide(&req, endpoint, &policy, &mut limiter, now).verdict)
        .collect()
}

fn labels(verdicts: &[Verdict]) -> Vec<&'static str> {
    verdicts.iter().map(Verdict::label).collect()
}

#[test]
fn each_fixture_gets_the_expected_sequence_of_actions() {
    use Endpoint::{Mutate, Validate};
    // (fixture, endpoint, request times in ms, expected action per request)
    let cases: &[(&str, Endpoint, &[u64], &[&str])] = &[
        (
            "pod-create-statefulset",
            Mutate,
            &[0, 1, 2],
            &["allow", "allow", "gate"],
        ),
        (
            "pod-create-statefulset",
            Validate,
            &[0, 1, 2],
            &["no-rule", "no-rule", "no-rule"],
        ),
        (
            "pod-create-replicaset",
            Mutate,
            &[0, 1, 2, 3],
            &["allow", "allow", "gate", "gate"],
        ),
        (
            "pod-create-bound",
            Mutate,
            &[0, 1, 2],
            &["allow", "allow", "allow"],
        ),
        (
            "pod-create-dry-run",
            Mutate,
            &[0, 1, 2, 3],
            &["allow", "allow", "allow", "allow"],
        ),
        // The same logical delete: first fits, its retry while the window is full has
        // no new slot to wait for... each call is a retry of the same pod, so it is allowed
        // once and then re-charged only after the window moves on.
        ("pod-delete-running", Validate, &[0], &["allow"]),
        (
            "pod-delete-terminating",
            Validate,
            &[0, 1, 2, 3],
            &["pass", "pass", "pass", "pass"],
        ),
        (
            "pod-delete-namespace-teardown",
            Validate,
            &[0, 1, 2],
            &["exempt", "exempt", "exempt"],
        ),
        (
            "pod-eviction",
            Validate,
            &[0, 1, 10_000],
            &["allow", "deny", "allow"],
        ),
        (
            "statefulset-partition-lower",
            Validate,
            &[0, 1],
            &["allow", "retry-after"],
        ),
        ("statefulset-template-change", Mutate, &[0], &["partition"]),
        ("statefulset-reapply-unchanged", Mutate, &[0], &["pass"]),
        ("statefulset-reapply-unchanged", Validate, &[0], &["pass"]),
        ("configmap-create", Validate, &[0], &["pass"]),
        ("pod-status-update", Validate, &[0], &["pass"]),
    ];
    for (name, endpoint, times, want) in cases {
        let got = verdicts(name, *endpoint, times);
        assert_eq!(&labels(&got), want, "{name} on {endpoint:?}");
    }
}

#[test]
fn distinct_deletes_hold_then_retry_after_and_the_retry_claims_its_slot() {
    let policy = policy();
    let mut limiter = Limiter::new(1_000);
    let request = |pod: &str| {
        let mut req = fixture("pod-delete-running");
        req.name = pod.to_string();
        req
    };
    let (a, b, c) = (request("a"), request("b"), request("c"));
    let decide_at = |limiter: &mut Limiter, req: &AdmissionRequest<DynamicObject>, now| {
        decide(req, Endpoint::Validate, &policy, limiter, now).verdict
    };
    assert_eq!(decide_at(&mut limiter, &a, 0), Verdict::Admitted);
    // 1 per 10s: b's slot is at 10 s, beyond maxHold 3 s, so retry-after 10 s, with the
    // slot the arrival margin after it: the retry comes back a little late, still early.
    assert_eq!(
        decide_at(&mut limiter, &b, 0),
        Verdict::RetryAfter {
            seconds: 10,
            slot: 10_500
        }
    );
    // c queues behind b: free at 20.5 s, moved to 20.6 s, the margin after the 20 s that
    // "retry after 20 s" given at 0.1 s brings it back.
    assert_eq!(
        decide_at(&mut limiter, &c, 100),
        Verdict::RetryAfter {
            seconds: 20,
            slot: 20_600
        }
    );
    // b comes back 2.5 s early: within maxHold, so it is held until its slot.
    assert_eq!(
        decide_at(&mut limiter, &b, 8_000),
        Verdict::Hold { until: 10_500 }
    );
    // c comes back as told, 40 ms late: held the rest of the margin, so it is admitted
    // at its slot, inside its own request, and not charged again.
    assert_eq!(
        decide_at(&mut limiter, &c, 20_140),
        Verdict::Hold { until: 20_600 }
    );
    assert_eq!(limiter.reservation_count(), 0);
}

#[test]
fn gate_patch_adds_gate_label_and_annotation_and_keeps_other_gates() {
    let policy = policy();
    for (name, want_gates) in [
        ("pod-create-replicaset", vec!["churn-throttler.io/paced"]),
        (
            "pod-create-replicaset-gated-elsewhere",
            vec!["example.com/quota", "churn-throttler.io/paced"],
        ),
    ] {
        let mut limiter = Limiter::new(1_000);
        let req = fixture(name);
        let mut last = Verdict::NoRule;
        for now in 0..3 {
            last = decide(&req, Endpoint::Mutate, &policy, &mut limiter, now).verdict;
        }
        let Verdict::Gate { patch } = last else {
            panic!("{name}: expected a gate, got {last:?}")
        };
        let mut pod = serde_json::to_value(req.object.clone()).unwrap_or(Value::Null);
        json_patch::patch(&mut pod, &patch).unwrap_or_else(|e| panic!("{name}: {e}"));
        let gates: Vec<&str> = pod["spec"]["schedulingGates"]
            .as_array()
            .map(|a| a.iter().filter_map(|g| g["name"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(gates, want_gates, "{name}");
        assert_eq!(
            pod["metadata"]["labels"][GATED_LABEL],
            json!("true"),
            "{name}"
        );
        assert_eq!(
            pod["metadata"]["annotations"][GATED_BY_ANNOTATION],
            json!("creates"),
            "{name}"
        );
        let original = &req.object.as_ref().and_then(|o| o.metadata.labels.clone());
        let app = original.as_ref().and_then(|l| l.get("app").cloned());
        assert_eq!(
            pod["metadata"]["labels"]["app"]
                .as_str()
                .map(str::to_string),
            app,
            "{name}: labels kept"
        );
    }
}

#[test]
fn replicaset_pods_without_a_name_share_a_pool_identity() {
    let req = fixture("pod-create-replicaset");
    assert_eq!(req.name, "");
    let Classified::Churn(churn) = classify(&req) else {
        panic!("not churn")
    };
    assert_eq!(
        churn.identity,
        crate::limiter::Identity::Pool(
            "pod-create:shop/3a9e5f2d-64b1-4d0c-8c5b-77e1a2f3b4c5/web-5d9c7b8f6d-".into()
        )
    );
    let Classified::Churn(sts) = classify(&fixture("pod-create-statefulset")) else {
        panic!("not churn")
    };
    assert_eq!(
        sts.identity,
        crate::limiter::Identity::Exact("pod-create:shop/db-2".into())
    );
}

#[test]
fn delete_collection_reviews_name_each_pod_from_its_old_object() {
    // kube-apiserver reviews a DeleteCollection pod by pod with no request.name (seen in
    // tests/e2e/run.sh's capture of the namespace controller's teardown).
    let mut first = fixture("pod-delete-running");
    first.name = String::new();
    let mut second = first.clone();
    if let Some(old) = second.old_object.as_mut() {
        old.metadata.name = Some("web-5d9c7b8f6d-9wq2m".into());
    }
    let (Classified::Churn(a), Classified::Churn(b)) = (classify(&first), classify(&second)) else {
        panic!("not churn")
    };
    assert_eq!(a.name, "web-5d9c7b8f6d-x7k2p");
    assert_eq!(
        a.identity,
        crate::limiter::Identity::Exact("pod-delete:shop/web-5d9c7b8f6d-x7k2p".into())
    );
    assert_ne!(a.identity, b.identity);
}

#[test]
fn dry_run_is_never_charged() {
    let policy = policy();
    let mut limiter = Limiter::new(1_000);
    let dry = fixture("pod-create-dry-run");
    for now in 0..10 {
        decide(&dry, Endpoint::Mutate, &policy, &mut limiter, now);
    }
    assert_eq!(limiter.bucket_count(), 0);
    assert_eq!(limiter.reservation_count(), 0);
}

#[test]
fn partition_lowering_is_charged_by_the_pods_it_releases() {
    let Classified::Churn(churn) = classify(&fixture("statefulset-partition-lower")) else {
        panic!("not churn")
    };
    // partition 3 -> 1 of 3 replicas with an update pending releases ordinals 1 and 2.
    assert_eq!(churn.cost, 2);
}

#[test]
fn retry_after_answer_is_the_exact_json_kube_apiserver_needs() {
    let policy = policy();
    let mut limiter = Limiter::new(1_000);
    let req = fixture("statefulset-partition-lower");
    decide(&req, Endpoint::Validate, &policy, &mut limiter, 0);
    let decision = decide(&req, Endpoint::Validate, &policy, &mut limiter, 1_500);
    let review =
        serde_json::to_value(respond(&req, &decision).into_review()).unwrap_or(Value::Null);
    let expected = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": "7f1c3c52-0b6e-4d0a-9f5b-1c2d3e4f5a09",
            "allowed": false,
            "status": {
                "status": "Failure",
                "code": 429,
                "reason": "TooManyRequests",
                "message": "churn-throttler: rule \"partition-steps\" allows 2 per 10s (global); this StatefulSet update of shop/db has to wait 8.5s, retry after 8s (the request keeps its place)",
                "details": { "retryAfterSeconds": 8 }
            },
            "auditAnnotations": { "rule": "partition-steps", "action": "retry-after" }
        }
    });
    assert_eq!(review, expected);
}

fn change(
    template_changed: bool,
    replicas: u32,
    old: u32,
    written: Option<u32>,
) -> StatefulSetChange {
    StatefulSetChange {
        rolling_update: true,
        template_changed,
        replicas,
        old_partition: old,
        new_partition: written.unwrap_or(0).min(replicas),
        written_partition: written,
        has_rolling_update_block: true,
        max_unavailable: 1,
        old_target: None,
        new_target_annotation: None,
        new_held_annotation: None,
        new_paced_by: None,
        has_held_since: false,
        has_annotations: true,
        update_pending: true,
    }
}

#[test]
fn partition_plan_table() {
    let plan = |held, target| Some(PartitionPlan { held, target });
    let paced = |mut c: StatefulSetChange, target: u32| {
        c.old_target = Some(target);
        c.new_target_annotation = Some(target.to_string());
        c.new_held_annotation = Some(c.old_partition);
        c
    };
    // (case, change, expected plan)
    let cases: Vec<(&str, StatefulSetChange, Option<PartitionPlan>)> = vec![
        (
            "template change holds at replicas, target 0",
            change(true, 3, 0, Some(0)),
            plan(3, 0),
        ),
        (
            "template change without a partition field",
            change(true, 3, 0, None),
            plan(3, 0),
        ),
        (
            "template change with a writer's partition 1",
            change(true, 3, 0, Some(1)),
            plan(3, 1),
        ),
        (
            "re-apply with no change is not paced",
            change(false, 3, 0, Some(0)),
            None,
        ),
        (
            "writer's partition at replicas needs no pacing",
            change(true, 3, 0, Some(3)),
            None,
        ),
        (
            "writer lowers the target mid-rollout: held stays",
            paced(change(false, 3, 2, Some(0)), 1),
            plan(2, 0),
        ),
        (
            "writer touches nothing mid-rollout: allowed as it is",
            paced(change(false, 3, 2, Some(2)), 0),
            None,
        ),
        (
            "second template change restarts from replicas",
            paced(change(true, 3, 1, Some(1)), 0),
            plan(3, 0),
        ),
        (
            "scale up while held: allowed, the held partition stays",
            paced(change(false, 5, 2, Some(2)), 0),
            None,
        ),
        (
            "scale up while held by a writer that dropped our annotations",
            {
                let mut c = paced(change(false, 5, 2, Some(0)), 0);
                c.new_held_annotation = None;
                c.new_target_annotation = None;
                c
            },
            plan(2, 0),
        ),
        (
            "scale down while held keeps the held partition",
            paced(change(false, 1, 1, Some(2)), 0),
            None,
        ),
        (
            "writer raises the partition: pacing ends",
            paced(change(false, 3, 1, Some(3)), 0),
            None,
        ),
    ];
    for (case, c, want) in cases {
        assert_eq!(plan_partition(&c), want, "{case}");
    }
    // The releaser's own step writes the partition and the held annotation together.
    let mut step = change(false, 3, 2, Some(1));
    step.old_target = Some(0);
    step.new_held_annotation = Some(1);
    assert_eq!(plan_partition(&step), None, "releaser step passes through");
}

#[test]
fn partition_action_skips_on_delete_and_excluded_writers() {
    let policy = policy();
    let mut limiter = Limiter::new(1_000);
    let mut on_delete = fixture("statefulset-template-change");
    for object in [on_delete.object.as_mut(), on_delete.old_object.as_mut()]
        .into_iter()
        .flatten()
    {
        object.data["spec"]["updateStrategy"] = json!({ "type": "OnDelete" });
    }
    let decision = decide(&on_delete, Endpoint::Mutate, &policy, &mut limiter, 0);
    assert_eq!(decision.verdict.label(), "pass", "OnDelete is not touched");

    let mut self_paced = fixture("statefulset-template-change");
    self_paced.user_info.username = Some("self-paced".into());
    let decision = decide(&self_paced, Endpoint::Mutate, &policy, &mut limiter, 0);
    assert_eq!(
        decision.verdict.label(),
        "no-rule",
        "excluded writer is not held"
    );
    // ...and its rollout is charged on /validate like any partition decrease.
    let decision = decide(&self_paced, Endpoint::Validate, &policy, &mut limiter, 0);
    assert_eq!(decision.rule.as_deref(), Some("partition-steps"));
}

#[test]
fn partition_patch_applies_to_the_statefulset() {
    let policy = policy();
    let mut limiter = Limiter::new(1_000);
    let req = fixture("statefulset-template-change");
    let Verdict::HoldPartition { patch, .. } =
        decide(&req, Endpoint::Mutate, &policy, &mut limiter, 0).verdict
    else {
        panic!("expected a held partition")
    };
    let mut sts = serde_json::to_value(req.object.clone()).unwrap_or(Value::Null);
    json_patch::patch(&mut sts, &patch).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
        json!(3)
    );
    assert_eq!(
        sts["metadata"]["annotations"]["churn-throttler.io/partition-target"],
        json!("0")
    );
    assert_eq!(
        sts["metadata"]["annotations"]["churn-throttler.io/partition-held"],
        json!("3")
    );
    assert_eq!(
        sts["metadata"]["annotations"]["churn-throttler.io/paced-by"],
        json!("sts-rollouts")
    );
    assert_eq!(
        sts["metadata"]["annotations"]["churn-throttler.io/partition-held-since"],
        json!("1970-01-01T00:00:00.000Z")
    );
}

#[test]
fn partition_warning_says_how_many_pods_go_at_once() {
    let policy = policy();
    // The fixture's set has 3 replicas; percentages round down, as the controller does.
    let cases = [
        (None, "one pod at a time"),
        (Some(json!(2)), "up to 2 pods at a time"),
        (Some(json!("34%")), "one pod at a time"),
        (Some(json!("67%")), "up to 2 pods at a time"),
    ];
    for (max_unavailable, want) in cases {
        let mut req = fixture("statefulset-template-change");
        if let (Some(value), Some(object)) = (&max_unavailable, req.object.as_mut()) {
            object.data["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] =
                value.clone();
        }
        let decision = decide(&req, Endpoint::Mutate, &policy, &mut Limiter::new(1_000), 0);
        assert_eq!(decision.verdict.label(), "partition", "{max_unavailable:?}");
        let message = decision.message.unwrap_or_default();
        assert!(message.contains(want), "{max_unavailable:?}: {message}");
    }
}

/// Runs /mutate on `req`, applies the patch (if any) to its object, returns the result.
fn mutated(req: &AdmissionRequest<DynamicObject>, now: u64) -> (&'static str, Value) {
    let policy = policy();
    let mut limiter = Limiter::new(1_000);
    let decision = decide(req, Endpoint::Mutate, &policy, &mut limiter, now);
    let mut sts = serde_json::to_value(req.object.clone()).unwrap_or(Value::Null);
    if let Verdict::HoldPartition { patch, .. } = &decision.verdict {
        json_patch::patch(&mut sts, patch).unwrap_or_else(|e| panic!("{e}"));
    }
    (decision.verdict.label(), sts)
}

/// The held object of the template-change fixture, as the API server stores it, as the
/// old object of a next request whose new object the closure edits.
fn next_request(edit: impl Fn(&mut Value)) -> AdmissionRequest<DynamicObject> {
    let first = fixture("statefulset-template-change");
    let (_, held) = mutated(&first, 5_000);
    let mut req = first;
    let mut new = held.clone();
    edit(&mut new);
    req.old_object = Some(serde_json::from_value(held).unwrap_or_else(|e| panic!("{e}")));
    req.object = Some(serde_json::from_value(new).unwrap_or_else(|e| panic!("{e}")));
    req
}

#[test]
fn table_of_updates_to_a_held_statefulset() {
    let annotation = |sts: &Value, key: &str| sts["metadata"]["annotations"][key].clone();
    // (case, edit of the new object, expected action, partition, target, held-since)
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit, &str, u64, &str, &str)> = vec![
        (
            "a re-apply that round-trips everything is allowed as it is",
            Box::new(|_| {}),
            "pass",
            3,
            "0",
            "1970-01-01T00:00:05.000Z",
        ),
        (
            "the releaser's step (partition and held together) passes",
            Box::new(|s| {
                s["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(2);
                s["metadata"]["annotations"]["churn-throttler.io/partition-held"] = json!("2");
            }),
            "pass",
            2,
            "0",
            "1970-01-01T00:00:05.000Z",
        ),
        (
            "a second template change holds again and keeps the start of the hold",
            Box::new(|s| {
                s["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(0);
                s["spec"]["template"]["metadata"]["labels"]["rev"] = json!("3");
            }),
            "partition",
            3,
            "0",
            "1970-01-01T00:00:05.000Z",
        ),
        (
            "a writer that drops every annotation is held again from now",
            Box::new(|s| {
                s["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(0);
                s["metadata"]["annotations"] = json!({});
            }),
            "partition",
            3,
            "0",
            "1970-01-01T00:00:09.000Z",
        ),
    ];
    for (case, edit, action, partition, target, since) in cases {
        let req = next_request(edit);
        let (label, sts) = mutated(&req, 9_000);
        assert_eq!(label, action, "{case}");
        assert_eq!(
            sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
            json!(partition),
            "{case}"
        );
        assert_eq!(
            annotation(&sts, "churn-throttler.io/partition-target"),
            json!(target),
            "{case}"
        );
        assert_eq!(
            annotation(&sts, "churn-throttler.io/paced-by"),
            json!("sts-rollouts"),
            "{case}"
        );
        assert_eq!(
            annotation(&sts, "churn-throttler.io/partition-held-since"),
            json!(since),
            "{case}"
        );
    }
}

#[test]
fn the_releasers_final_patch_passes_once_the_target_is_reached() {
    // Partition at the target (0): removing the hold's annotations is not a new hold.
    let req = next_request(|s| {
        s["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(0);
        s["metadata"]["annotations"]["churn-throttler.io/partition-held"] = json!("0");
    });
    let (_, at_target) = mutated(&req, 9_000);
    let mut req = req;
    let mut done = at_target.clone();
    for key in [
        "churn-throttler.io/partition-target",
        "churn-throttler.io/partition-held",
        "churn-throttler.io/partition-held-since",
    ] {
        done["metadata"]["annotations"]
            .as_object_mut()
            .map(|a| a.remove(key));
    }
    req.old_object = Some(serde_json::from_value(at_target).unwrap_or_else(|e| panic!("{e}")));
    req.object = Some(serde_json::from_value(done).unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(mutated(&req, 10_000).0, "pass");

    // Letting go above the target (someone else raised the partition): the releaser
    // writes the held annotation equal to the partition in the same patch, so it passes.
    let req = next_request(|s| {
        s["metadata"]["annotations"]
            .as_object_mut()
            .map(|a| a.remove("churn-throttler.io/partition-target"));
    });
    assert_eq!(mutated(&req, 10_000).0, "pass");
}

#[test]
fn pods_admitted_at_once_by_a_gate_rule_are_marked_for_seeding() {
    // Marked as the releaser marks a release, so a releaser leading after a restart of
    // every replica seeds its windows with the webhook's own admissions too.
    let policy = policy();
    let mut limiter = Limiter::new(1_000);
    let req = fixture("pod-create-statefulset");
    let mut at = |now: u64| {
        let decision = decide(&req, Endpoint::Mutate, &policy, &mut limiter, now);
        mark_admission(
            &super::churn_of(&req),
            decision,
            &policy,
            now,
            "replica-a/1",
        )
    };
    let first = at(1_767_225_600_000);
    let Verdict::AdmitMarked { patch } = &first.verdict else {
        panic!("not marked: {:?}", first.verdict)
    };
    assert_eq!(first.verdict.label(), "allow");
    let mut pod = req
        .object
        .clone()
        .map(|o| serde_json::to_value(o).unwrap_or(Value::Null));
    let pod = pod.as_mut().unwrap_or_else(|| panic!("no object"));
    json_patch::patch(pod, patch).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pod["metadata"]["labels"][GATED_LABEL], json!("released"));
    assert_eq!(
        pod["metadata"]["annotations"][GATED_BY_ANNOTATION],
        json!("creates")
    );
    assert_eq!(
        pod["metadata"]["annotations"]["churn-throttler.io/released-at"],
        json!("2026-01-01T00:00:00.000Z")
    );
    assert_eq!(
        pod["metadata"]["annotations"][ADMITTED_BY_ANNOTATION],
        json!("replica-a/1")
    );
    // What the releaser reads back is checked in objects/pods.rs, above this module.
    // Gated pods are not marked this way, nor dry runs.
    at(1_767_225_600_001);
    assert!(matches!(
        at(1_767_225_600_002).verdict,
        Verdict::Gate { .. }
    ));
    let dry = fixture("pod-create-dry-run");
    let decision = decide(&dry, Endpoint::Mutate, &policy, &mut Limiter::new(10), 0);
    assert_eq!(
        mark_admission(&super::churn_of(&dry), decision, &policy, 0, "replica-a/1").verdict,
        Verdict::Admitted
    );
}

#[test]
fn no_slot_is_reserved_beyond_max_retry_after_and_the_answer_says_so() {
    let policy = policy();
    let mut limiter = Limiter::new(1_000);
    // Distinct namespaces, so the per-namespace share never applies. 1 per 10 s with
    // maxRetryAfter 60 s (the default): slots up to 60.5 s are reserved, later ones not.
    let mut slots = Vec::new();
    let mut refused = None;
    for i in 0..20 {
        let mut req = fixture("pod-delete-running");
        req.name = format!("p{i}");
        req.namespace = Some(format!("ns{i}"));
        let decision = decide(&req, Endpoint::Validate, &policy, &mut limiter, 0);
        let message = decision.message.unwrap_or_default();
        match decision.verdict {
            Verdict::Admitted => {}
            Verdict::RetryAfter { seconds, slot } if message.contains("not queued") => {
                refused = Some((seconds, slot, message));
                break;
            }
            Verdict::RetryAfter { slot, .. } => slots.push(slot),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(slots, [10_500, 20_500, 30_500, 40_500, 50_500, 60_500]);
    assert_eq!(
        limiter.reservation_count(),
        6,
        "the refusal reserved nothing"
    );
    let (seconds, slot, message) = refused.unwrap_or_else(|| panic!("never refused"));
    assert_eq!(
        (seconds, slot),
        (60, 60_500),
        "told to come back at the reach"
    );
    assert!(
        message.contains("every slot up to 60s ahead is taken"),
        "{message}"
    );
}

/// The warning on a gated pod counts the pods already gated ahead of it when the queue is
/// known (the leading releaser runs in this process), in the releaser's order; without it
/// the limiter's windows alone, which do not hold pods not yet released, and says so.
#[test]
fn table_of_gate_warnings() {
    use crate::queue::{Cursor, QueuedPod, Snapshot};
    let policy = policy();
    let req = fixture("pod-create-replicaset");
    let now = 1_000_000;
    let waiting = |namespaces: usize| {
        let pods = (0..namespaces)
            .map(|i| QueuedPod {
                namespace: format!("other-{i:02}"),
                name: format!("web-{i}"),
                uid: format!("u{i}"),
                resource_version: "1".into(),
                rule: "creates".into(),
                owner: None,
                created: 1_000,
            })
            .collect();
        Snapshot::new(pods, Cursor::default())
    };
    // (case, queue, text expected in the warning)
    let cases: Vec<(&str, Option<Snapshot>, &str)> = vec![
        (
            "30 pods in 30 other namespaces ahead: 15 more windows of 2",
            Some(waiting(30)),
            "(about 159s now, behind 30 pod(s) of this rule already waiting)",
        ),
        (
            "an empty queue: when the window frees",
            Some(waiting(0)),
            "(about 9s now, behind 0 pod(s) of this rule already waiting)",
        ),
        (
            "no queue known: the windows alone, and why it can be longer",
            None,
            "(about 9s now by the rule's windows; pods already waiting are not known to this \
             replica and can make it longer)",
        ),
    ];
    for (case, queue, want) in cases {
        let mut limiter = Limiter::new(1_000);
        let rule = policy.rules.iter().find(|r| &*r.name == "creates");
        let rule = rule.unwrap_or_else(|| panic!("{case}: no rule"));
        for _ in 0..2 {
            limiter.record(&rule.name, &rule.limits, "x", None, now - 1_000, 1);
        }
        let decision = decide_classified(
            &classify(&req),
            Endpoint::Mutate,
            &policy,
            &mut limiter,
            queue.as_ref(),
            now,
        );
        assert_eq!(decision.verdict.label(), "gate", "{case}");
        let message = decision.message.unwrap_or_default();
        assert!(message.contains(want), "{case}: {message}");
    }
}

/// An adaptive gate rule's pod that fits the rate is admitted at once only while the
/// leading releaser's network window has room; full, or no word from a leader: gated.
#[test]
fn table_of_adaptive_admissions() {
    use crate::pacing::network::NetworkRoom;
    use crate::queue::{Cursor, Snapshot};
    let policy = Policy::builtin();
    let req = fixture("pod-create-replicaset");
    let snapshot =
        |room: Option<NetworkRoom>| Snapshot::new(Vec::new(), Cursor::default()).with_network(room);
    let room = |in_flight, window| Some(NetworkRoom { in_flight, window });
    // (case, queue snapshot, verdict, text in the message)
    let cases: Vec<(&str, Option<Snapshot>, &str, &str)> = vec![
        (
            "room in the window: at once",
            Some(snapshot(room(2, 4))),
            "allow",
            "",
        ),
        (
            "window full: gated",
            Some(snapshot(room(4, 4))),
            "gate",
            "the network window is full: 4 released pods wait for their network, window 4",
        ),
        (
            "no leader's word: gated",
            None,
            "gate",
            "the releaser sizes the network window",
        ),
        (
            "a snapshot without a window: gated",
            Some(snapshot(None)),
            "gate",
            "the releaser sizes the network window",
        ),
    ];
    for (case, queue, verdict, want) in cases {
        let mut limiter = Limiter::new(1_000);
        let decision = decide_classified(
            &classify(&req),
            Endpoint::Mutate,
            &policy,
            &mut limiter,
            queue.as_ref(),
            1_000_000,
        );
        assert_eq!(decision.verdict.label(), verdict, "{case}");
        let message = decision.message.unwrap_or_default();
        assert!(message.contains(want), "{case}: {message}");
    }
}

/// A rule paused by a schedule window (`paused_until`, set by the policy in force):
/// hold/retry-after answer 429 with Retry-After min(time left, maxRetryAfter) and reserve
/// nothing, deny names the end, gate gates every pod, partition holds; what the policy
/// never paces stays untouched.
#[test]
fn a_paused_rule_answers_every_action_without_charging() {
    use crate::names::format_time;
    let now = 5_000;
    // (case, pause length, fixture, endpoint, expected verdict, text the message holds)
    let long = 3_600_000;
    let cases: &[(&str, u64, &str, Endpoint, Verdict, &str)] = &[
        (
            "retry-after, an hour left: maxRetryAfter",
            long,
            "pod-delete-running",
            Endpoint::Validate,
            Verdict::RetryAfter {
                seconds: 60,
                slot: now + 60_000,
            },
            "paused by its schedule until",
        ),
        (
            "retry-after, 20.5 s left",
            20_500,
            "pod-delete-running",
            Endpoint::Validate,
            Verdict::RetryAfter {
                seconds: 21,
                slot: now + 20_500,
            },
            "retry after 21s",
        ),
        (
            "deny names the end",
            long,
            "pod-eviction",
            Endpoint::Validate,
            Verdict::Deny { wait_ms: long },
            "try again after",
        ),
    ];
    for (case, left, name, endpoint, expected, needle) in cases {
        let mut policy = policy();
        for rule in &mut policy.rules {
            rule.paused_until = Some(now + left);
        }
        let mut limiter = Limiter::new(1_000);
        let decision = decide(&fixture(name), *endpoint, &policy, &mut limiter, now);
        assert_eq!(&decision.verdict, expected, "{case}");
        let message = decision.message.unwrap_or_default();
        assert!(message.contains(needle), "{case}: {message}");
        if matches!(expected, Verdict::Deny { .. }) {
            assert!(
                message.contains(&format_time(now + left)),
                "{case}: {message}"
            );
        }
        assert_eq!(limiter.reservation_count(), 0, "{case}: nothing reserved");
        // Nothing charged: once the pause is over the first request fits at once.
        let mut resumed = policy.clone();
        for rule in &mut resumed.rules {
            rule.paused_until = None;
        }
        let after = decide(
            &fixture(name),
            *endpoint,
            &resumed,
            &mut limiter,
            now + left,
        );
        assert_eq!(after.verdict, Verdict::Admitted, "{case}: after the pause");
    }
    // Gate: every pod gated, even with room; a bound pod and what is never paced pass.
    let mut policy = policy();
    for rule in &mut policy.rules {
        rule.paused_until = Some(now + long);
    }
    let mut limiter = Limiter::new(1_000);
    let gated = decide(
        &fixture("pod-create-replicaset"),
        Endpoint::Mutate,
        &policy,
        &mut limiter,
        now,
    );
    assert_eq!(gated.verdict.label(), "gate");
    assert!(gated
        .message
        .unwrap_or_default()
        .contains("paused by its schedule until"));
    // A pause made with `churn-throttler pause` says so (the policy in force sets it).
    for rule in &mut policy.rules {
        rule.paused_by = crate::policy::PAUSED_BY_COMMAND;
    }
    let by_hand = decide(
        &fixture("pod-eviction"),
        Endpoint::Validate,
        &policy,
        &mut limiter,
        now,
    );
    assert!(
        by_hand
            .message
            .unwrap_or_default()
            .contains("paused by `churn-throttler pause` until"),
        "a pause by hand names the command"
    );
    for (name, endpoint, label) in [
        ("pod-create-bound", Endpoint::Mutate, "allow"),
        ("pod-delete-terminating", Endpoint::Validate, "pass"),
        (
            "pod-delete-namespace-teardown",
            Endpoint::Validate,
            "exempt",
        ),
        ("statefulset-template-change", Endpoint::Mutate, "partition"),
    ] {
        let d = decide(&fixture(name), endpoint, &policy, &mut limiter, now);
        assert_eq!(d.verdict.label(), label, "{name}");
    }
    // A pause that has ended is no pause.
    let d = decide(
        &fixture("pod-eviction"),
        Endpoint::Validate,
        &policy,
        &mut limiter,
        now + long,
    );
    assert_eq!(d.verdict, Verdict::Admitted);
}
