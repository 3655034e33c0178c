#!/usr/bin/env bash
# End-to-end test of the `partition` action with rollingUpdate.maxUnavailable > 1 on a real
# control plane (tests/e2e/cluster.sh with the feature gate MaxUnavailableStatefulSet on
# the API server and the controller manager; beta and off by default in v1.36):
#   - the webhook configurations of manifests/overlays/e2e-local, one `churn-throttler
#     serve` as ServiceAccount churn-throttler/churn-throttler (webhook and releaser);
#   - 3 StatefulSets x 6 (Parallel, maxUnavailable 3) in one labelled namespace, Ready,
#     then every template changed at once, under a partition rule of 10 steps per 10 s;
#     their replacements start behind the scheduling gate at 5 per 10 s (a gate rule, as
#     the built-in policy's statefulset-creates but slower), so released pods stay not
#     Ready long enough for a set to have several in flight;
#   - asserts from the API server's audit log: some set had 2 or 3 pods deleted and not
#     Ready again at once, none more than 3; no 10 s window holds more than 10 releaser
#     steps or pod deletions by the StatefulSet controller, nor more than 5 gate lifts;
#     one step per pod; every set converges (partition 0, annotations gone).
# Everything listens on 127.0.0.1; every wait is bounded; the cluster goes down on exit.
# Last line: "maxunavailable: N passed, M failed". About a minute.
#
# Environment: CHURN_THROTTLER_BIN (skip `cargo build`), E2E_BIN (cluster binaries),
# MAXU_E2E_KEEP=1 (keep the work dir), MAXU_E2E_TIMEOUT (s per wait, default 180).
# shellcheck disable=SC2015  # `check && ok || bad`: ok() never fails
# shellcheck source-path=SCRIPTDIR  # lib.sh and cluster.sh, from any working directory
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"
e2e_suite maxunavailable MAXU_E2E_KEEP

timeout="${MAXU_E2E_TIMEOUT:-180}"
LIMIT=10        # partition steps per 10 s
GATE_LIMIT=5    # gate lifts per 10 s
WINDOW_S=10
SETS=3
REPLICAS=6
MAX_UNAVAILABLE=3
STEPS=$((SETS * REPLICAS))
NS=mu
OPTIN=churn-throttler.io/enabled
SA_USER=system:serviceaccount:churn-throttler:churn-throttler
GATES="--feature-gates=MaxUnavailableStatefulSet=true"

e2e_die_logs() { e2e_tail_log 15 serve.log; }
# The one `serve` is stopped with TERM and waited for (no KILL), before the cluster.
SERVE_PID=""
e2e_before_cleanup() {
  if [[ -n "$SERVE_PID" ]]; then
    kill "$SERVE_PID" 2>/dev/null || true
    wait "$SERVE_PID" 2>/dev/null || true
  fi
}

e2e_build
e2e_workdir

# ---- cluster with the feature gate and an audit log -------------------------------
mkdir -p "$W/logs"
cat >"$W/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  # The releaser's patches with their body: which ones set the partition, to what, and
  # which ones lift the gate.
  - level: Request
    users: ["system:serviceaccount:churn-throttler:churn-throttler"]
    resources: [{ group: apps, resources: [statefulsets] }, { group: "", resources: [pods] }]
    verbs: [patch]
  - level: Metadata
    resources: [{ group: "", resources: [pods] }]
    verbs: [create, delete, patch]
  # The scheduler's bindings, and kwok's status writes (a bound pod goes Ready with them).
  - level: Metadata
    resources: [{ group: "", resources: [pods/binding, pods/status] }]
    verbs: [create, patch, update]
  - level: None
EOF
CLUSTER_KUBE_ARGS_APISERVER="${CLUSTER_KUBE_ARGS_APISERVER:-} $GATES $(e2e_audit_args)" \
CLUSTER_KUBE_ARGS_KCM="${CLUSTER_KUBE_ARGS_KCM:-} $GATES" \
  cluster_up "$W" 3 || die "cluster up failed"
# shellcheck disable=SC1091
source "$W/env"
k() { kubectl --request-timeout=20s "$@"; }

e2e_install_webhook maxunavailable-e2e

cat >"$W/policy.yaml" <<EOF
timeoutSeconds: 10
rules:
  - name: sts-rollouts
    match: { resources: [statefulsets], operations: [UPDATE] }
    limit: { events: $LIMIT, window: ${WINDOW_S}s, scope: global }
    maxNotReady: $LIMIT
    action: partition
  - name: sts-creates
    match: { resources: [pods], operations: [CREATE], controllerKinds: [StatefulSet] }
    limit: { events: $GATE_LIMIT, window: ${WINDOW_S}s, scope: global }
    maxNotReady: 20
    action: gate
exempt:
  namespaces: [kube-system, kube-public, kube-node-lease, churn-throttler]
  users: [system:serviceaccount:kube-system:namespace-controller, $SA_USER]
EOF
"$CHURN_THROTTLER_BIN" check-config "$W/policy.yaml" >/dev/null || die "the policy does not pass check-config"

KUBECONFIG="$W/releaser.kubeconfig" RUST_LOG="info,churn_throttler::releaser=debug" \
  "$CHURN_THROTTLER_BIN" serve --config "$W/policy.yaml" \
    --tls-cert "$W/pki/webhook.crt" --tls-key "$W/pki/webhook.key" \
    --listen "127.0.0.1:$WH_PORT" --metrics-listen 127.0.0.1:0 \
    --releaser=true --lease-namespace churn-throttler --identity releaser-a \
    --shutdown-delay 0s --drain-timeout 2s --log-format json >>"$W/serve.log" 2>&1 &
SERVE_PID=$!
wait_for "serve up" grep -q '"churn-throttler serving"' "$W/serve.log"
wait_for "releaser-a holds the lease" holder_is releaser-a
ok "serve runs the webhook and leads the releaser"

# ---- workloads ----------------------------------------------------------------
all_yaml() { # all_yaml REVISION
  local i
  for i in $(seq 0 $((SETS - 1))); do
    cat <<EOF
---
apiVersion: apps/v1
kind: StatefulSet
metadata: { name: s$i, namespace: $NS, labels: { e2e: maxunavailable } }
spec:
  replicas: $REPLICAS
  serviceName: s$i
  podManagementPolicy: Parallel
  updateStrategy: { type: RollingUpdate, rollingUpdate: { maxUnavailable: $MAX_UNAVAILABLE } }
  selector: { matchLabels: { app: s$i } }
  template:
    metadata: { labels: { app: s$i, e2e: maxunavailable }, annotations: { e2e-revision: "$1" } }
    spec: { terminationGracePeriodSeconds: 1, containers: [ { name: app, image: "e2e.invalid/app:1" } ] }
EOF
  done
}
k create namespace "$NS" >/dev/null
wait_for "ServiceAccount $NS/default" k -n "$NS" get serviceaccount default
all_yaml 1 >"$W/sts-1.yaml"
k apply -f "$W/sts-1.yaml" >/dev/null
kept="$(k -n "$NS" get sts s0 -o jsonpath='{.spec.updateStrategy.rollingUpdate.maxUnavailable}')"
[[ "$kept" == "$MAX_UNAVAILABLE" ]] && ok "the API server keeps rollingUpdate.maxUnavailable: $kept (feature gate on)" \
  || die "rollingUpdate.maxUnavailable is '$kept' after apply: is the feature gate MaxUnavailableStatefulSet on?"
sts_json() { k -n "$NS" get sts -l e2e=maxunavailable -o json; }
all_ready() { sts_json | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
sys.exit(0 if len(items) == int(sys.argv[1]) and all(s.get("status", {}).get("readyReplicas", 0) == int(sys.argv[2]) for s in items) else 1)' "$SETS" "$REPLICAS"; }
wait_for "$SETS StatefulSets x $REPLICAS Ready" all_ready
# The namespace opts in once the first pods are Ready: the setup's creations are not measured.
k label namespace "$NS" "$OPTIN=true" >/dev/null

# ---- every template at once ----------------------------------------------------------
all_yaml 2 >"$W/sts-2.yaml"
t_change=$(now_ms)
k apply -f "$W/sts-2.yaml" >/dev/null
say "changed $SETS templates with one kubectl apply in $(( $(now_ms) - t_change )) ms"
converged() { sts_json | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
def done(s):
    m, spec, st = s["metadata"], s["spec"], s.get("status") or {}
    part = ((spec.get("updateStrategy") or {}).get("rollingUpdate") or {}).get("partition", 0)
    held = any(k.startswith("churn-throttler.io/partition-") and k != "churn-throttler.io/partition-stepped-at" for k in (m.get("annotations") or {}))
    return (st.get("observedGeneration", 0) >= m.get("generation", 0) and part == 0 and not held
            and st.get("updatedReplicas") == st.get("readyReplicas") == spec.get("replicas"))
sys.exit(0 if len(items) == int(sys.argv[1]) and all(done(s) for s in items) else 1)' "$SETS"; }
wait_for "every StatefulSet converged, partition 0, hold annotations gone" converged
makespan_ms=$(( $(now_ms) - t_change ))
ok "all $SETS StatefulSets converged (updated == ready == $REPLICAS, partition 0, hold annotations gone) $(secs "$makespan_ms") s after the change"
sleep 1

# ---- checks from the audit log -----------------------------------------------------
python3 - "$W/logs/audit.log" "$NS" "$SA_USER" "$t_change" "$((WINDOW_S * 1000))" >"$W/analysis.json" <<'PY'
import datetime, json, sys
path, ns, releaser, t_change, window = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
STS_CONTROLLER = "system:serviceaccount:kube-system:statefulset-controller"
def ms(text):
    return int(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
def worst(times):
    times, best, j = sorted(times), 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best
steps, deletes, lifts, refused = [], {}, {}, []
binds, status = {}, {}  # pod -> [answer times]
for line in open(path):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    ref = e.get("objectRef") or {}
    if e.get("stage") != "ResponseComplete" or ref.get("namespace") != ns:
        continue
    t, done = ms(e["requestReceivedTimestamp"]), ms(e["stageTimestamp"])
    if t < t_change:
        continue
    user = (e.get("user") or {}).get("username", "")
    code = (e.get("responseStatus") or {}).get("code", 0)
    verb, res, sub, name = e.get("verb"), ref.get("resource"), ref.get("subresource"), ref.get("name")
    if user == STS_CONTROLLER and code >= 400 and code not in (404, 409):
        refused.append([verb, res, name, code])
    if res == "statefulsets" and user == releaser and 200 <= code < 300:
        for op in e.get("requestObject") or []:
            if op.get("path") == "/spec/updateStrategy/rollingUpdate/partition":
                steps.append((t, name, op.get("value")))
    if res != "pods" or not 200 <= code < 300:
        continue
    if not sub and verb == "delete" and user == STS_CONTROLLER:
        deletes.setdefault(name, done)  # each pod rolls once: its first deletion
    elif not sub and verb == "patch" and user == releaser:
        ops = e.get("requestObject") or []
        if any(op.get("op") == "remove" and op.get("path", "").startswith("/spec/schedulingGates/") for op in ops):
            lifts.setdefault(name, done)
    elif sub == "binding":
        binds.setdefault(name, []).append(done)
    elif sub == "status":
        status.setdefault(name, []).append(done)
# A pod is out from its old pod's deletion until its replacement is Ready: the first
# status write after the replacement's binding (kwok marks a bound pod Ready in it);
# the binding itself when no such write is logged.
out, proxies = {}, 0
for pod, d in deletes.items():
    b = next((x for x in sorted(binds.get(pod, [])) if x >= d), None)
    r = next((x for x in sorted(status.get(pod, [])) if b is not None and x >= b), None)
    proxies += r is None
    out[pod] = (d, r if r is not None else b)
most = {}
for pod, (d, r) in out.items():
    sts = pod.rsplit("-", 1)[0]
    ends = [(dd, rr) for p, (dd, rr) in out.items() if p.rsplit("-", 1)[0] == sts]
    at_once = sum(1 for dd, rr in ends if dd <= d and (rr is None or d < rr))
    most[sts] = max(most.get(sts, 0), at_once)
print(json.dumps({
    "steps": len(steps), "worst_steps": worst([s[0] for s in steps]),
    "deletes": len(deletes), "worst_deletes": worst(deletes.values()),
    "lifts": len(lifts), "worst_lifts": worst(lifts.values()),
    "most_out_per_set": most, "ready_by_binding": proxies, "never_ready": sum(1 for d, r in out.values() if r is None),
    "refused": refused,
}))
PY
get() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(v if isinstance(v,(int,str)) else json.dumps(v))' "$W/analysis.json" "$1"; }
most_any=$(python3 -c 'import json,sys; print(max(json.load(open(sys.argv[1]))["most_out_per_set"].values() or [0]))' "$W/analysis.json")
say "pods of one set deleted and not Ready again at once, most per set: $(get most_out_per_set) (maxUnavailable $MAX_UNAVAILABLE; $(get ready_by_binding) pods dated Ready by their binding)"
(( $(get steps) == STEPS )) && ok "one step per pod: $(get steps) partition patches for $STEPS pods (audit log)" || bad "$(get steps) steps for $STEPS pods"
(( most_any >= 2 && most_any <= MAX_UNAVAILABLE )) \
  && ok "a set had $most_any pods deleted and not Ready at once (2 to $MAX_UNAVAILABLE expected): steps in flight overlap within a set" \
  || bad "most pods of one set out at once: $(get most_out_per_set)"
(( $(get worst_steps) <= LIMIT )) && ok "at most $LIMIT releaser steps in any ${WINDOW_S} s window (worst $(get worst_steps))" \
  || bad "$(get worst_steps) steps in one ${WINDOW_S} s window"
(( $(get deletes) == STEPS && $(get worst_deletes) <= LIMIT )) \
  && ok "audit log: $(get deletes) pod deletions by the StatefulSet controller, at most $LIMIT in any ${WINDOW_S} s window (worst $(get worst_deletes))" \
  || bad "audit log: $(get deletes) deletions, worst ${WINDOW_S} s window $(get worst_deletes)"
(( $(get worst_lifts) <= GATE_LIMIT )) \
  && ok "gate lifts: at most $GATE_LIMIT in any ${WINDOW_S} s window (worst $(get worst_lifts), $(get lifts) pods released from the gate)" \
  || bad "gate lifts: worst ${WINDOW_S} s window $(get worst_lifts)"
(( $(get never_ready) == 0 )) && ok "every replacement bound and Ready" || bad "$(get never_ready) replacements never seen Ready"
[[ "$(get refused)" == "[]" ]] && ok "no request of the StatefulSet controller refused (audit log)" || bad "refused: $(get refused)"
ideal_ms=$(( ( (STEPS + GATE_LIMIT - 1) / GATE_LIMIT - 1 ) * WINDOW_S * 1000 ))
say "makespan: $(secs "$makespan_ms") s for $STEPS pods; the gate's $GATE_LIMIT per ${WINDOW_S} s alone (first window at once) $(secs "$ideal_ms") s"
say "logs and audit: $W (kept with MAXU_E2E_KEEP=1)"
e2e_finish
