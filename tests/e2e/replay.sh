#!/usr/bin/env bash
# `churn-throttler simulate --replay` checked against a real paced run on the real control
# plane (tests/e2e/cluster.sh):
#   - the API server records a Metadata-level audit log (the lines of docs/simulator.md's
#     "replay your audit log", nothing more);
#   - `serve` runs the SHIPPED default policy (no --config) with the webhook of
#     manifests/overlays/e2e-local and the releaser;
#   - the same workload in two namespaces, created Ready first: SETS StatefulSets x
#     REPLICAS (OrderedReady) and a Deployment of DEPLOY pods. One `kubectl apply` changes
#     every template of the unlabelled namespace rp-free: the mass re-creation runs
#     unpaced. Then the same apply in rp-paced, labelled churn-throttler.io/enabled: paced;
#   - the replay of the unpaced part only (--since/--until around it, --opt-in rp-free)
#     predicts the paced run, compared with the paced run's own audit entries (bindings,
#     and each pod's first DELETE not by a node, at their received times as the replay
#     reads them; e2e.py's audit parsing): per kind and per controller of the pods (each
#     rule paces its own: StatefulSet and ReplicaSet pods go through one rule each, the
#     replay's CSV rows `starts:StatefulSet`, ...), the peak per 10 s window within the
#     rule's limit (20) and within one event of the real paced peak, and the real one
#     within 20 too; per kind, the peak within the two rules' 40 (the kind's peak is
#     printed beside the real one, not compared: it depends on how the two rules' tails
#     overlap, which moves by a few events from run to run) and the makespan (first pod
#     event -> the kind's last) within 15 % of the real one.
# Last line: "replay: N passed, M failed".
#
# Environment: CHURN_THROTTLER_BIN (skip `cargo build`), E2E_BIN, REPLAY_E2E_KEEP=1,
# REPLAY_E2E_TIMEOUT (s per wait, default 300), REPLAY_E2E_SETS / _REPLICAS / _DEPLOY
# (sizes, default 24 x 5 and 60), REPLAY_E2E_MUTATE=unlimited (replay with a policy
# whose limits never bind: the prediction checks must fail; proves they can).
# shellcheck disable=SC2015  # `check && ok || bad`: ok() never fails
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"
e2e_suite replay REPLAY_E2E_KEEP --quiet-down

timeout="${REPLAY_E2E_TIMEOUT:-300}"
SETS="${REPLAY_E2E_SETS:-24}"
REPLICAS="${REPLAY_E2E_REPLICAS:-5}"
DEPLOY="${REPLAY_E2E_DEPLOY:-60}"
MUTATE="${REPLAY_E2E_MUTATE:-}"
# The built-in policy: 20 per 10 s per rule; each kind here goes through two rules.
LIMIT=20 RULES_PER_KIND=2 WINDOW_MS=10000
FREE=rp-free PACED=rp-paced

e2e_die_logs() { e2e_tail_log 20 serve.log; }

e2e_build
e2e_workdir
t_script=$(date +%s)

# ---- cluster: a Metadata-level audit log of what the replay reads --------------------------
mkdir -p "$W/logs"
cat >"$W/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    resources:
      - group: ""
        resources: ["pods", "pods/binding", "pods/eviction"]
      - group: "apps"
        resources: ["statefulsets"]
    verbs: ["create", "delete", "update", "patch"]
  - level: None
EOF
CLUSTER_KUBE_ARGS_APISERVER="${CLUSTER_KUBE_ARGS_APISERVER:-} $(e2e_audit_args)" \
  cluster_up "$W" 3 || die "cluster up failed"
# shellcheck disable=SC1091
source "$W/env"
k() { kubectl --request-timeout=30s "$@"; }
e2e_install_webhook replay-e2e

KUBECONFIG="$W/releaser.kubeconfig" RUST_LOG=info \
  "$CHURN_THROTTLER_BIN" serve \
    --tls-cert "$W/pki/webhook.crt" --tls-key "$W/pki/webhook.key" \
    --listen "127.0.0.1:$WH_PORT" --metrics-listen 127.0.0.1:0 \
    --releaser=true --lease-namespace churn-throttler --identity replay-e2e \
    --shutdown-delay 0s --drain-timeout 3s --log-format json >>"$W/serve.log" 2>&1 &
PROC[serve]=$!
wait_for "serve serving" grep -q '"churn-throttler serving"' "$W/serve.log"
wait_for "serve holds the lease" holder_is replay-e2e

# ---- the workload, Ready in both namespaces before anything changes ------------------------
workload() { # workload NS REVISION
  local i
  for i in $(seq 0 $((SETS - 1))); do
    cat <<EOF
---
apiVersion: apps/v1
kind: StatefulSet
metadata: { name: db-$i, namespace: $1 }
spec:
  replicas: $REPLICAS
  serviceName: db-$i
  podManagementPolicy: OrderedReady
  updateStrategy: { type: RollingUpdate }
  selector: { matchLabels: { app: db-$i } }
  template:
    metadata: { labels: { app: db-$i }, annotations: { e2e-revision: "$2" } }
    spec: { terminationGracePeriodSeconds: 1, containers: [{ name: app, image: e2e.invalid/app:1 }] }
EOF
  done
  cat <<EOF
---
apiVersion: apps/v1
kind: Deployment
metadata: { name: web, namespace: $1 }
spec:
  replicas: $DEPLOY
  selector: { matchLabels: { app: web } }
  template:
    metadata: { labels: { app: web }, annotations: { e2e-revision: "$2" } }
    spec: { terminationGracePeriodSeconds: 1, containers: [{ name: app, image: e2e.invalid/app:1 }] }
EOF
}
# rolled NS: every StatefulSet and the Deployment at their latest template, all Ready,
# no old pod left.
rolled() {
  k -n "$1" get statefulsets,deployments,pods -o json | python3 -c '
import json, sys
sys.path.insert(0, sys.argv[1])
from e2e import sts_converged
items = json.load(sys.stdin)["items"]
sts = [i for i in items if i["kind"] == "StatefulSet"]
deps = [i for i in items if i["kind"] == "Deployment"]
pods = [i for i in items if i["kind"] == "Pod"]
def dep_done(d):
    st, want = d.get("status", {}), d["spec"]["replicas"]
    return (st.get("observedGeneration") == d["metadata"]["generation"]
            and st.get("updatedReplicas", 0) == want and st.get("availableReplicas", 0) == want
            and st.get("replicas", 0) == want)
want = int(sys.argv[2]) * int(sys.argv[3]) + int(sys.argv[4])
ok = (len(sts) == int(sys.argv[2]) and all(sts_converged(s) for s in sts)
      and len(deps) == 1 and dep_done(deps[0]) and len(pods) == want)
sys.exit(0 if ok else 1)' "$here" "$SETS" "$REPLICAS" "$DEPLOY"
}
for ns in "$FREE" "$PACED"; do
  k create namespace "$ns" >/dev/null
  wait_for "ServiceAccount default in $ns" k -n "$ns" get serviceaccount default
  workload "$ns" 1 | k apply -f - >/dev/null
done
for ns in "$FREE" "$PACED"; do wait_for "$ns: the first revision Ready" rolled "$ns"; done
k label namespace "$PACED" churn-throttler.io/enabled=true >/dev/null
ok "$((SETS * REPLICAS + DEPLOY)) pods Ready in each of $FREE and $PACED ($SETS StatefulSets x $REPLICAS, a Deployment of $DEPLOY)"

# ---- the mass re-creation: unpaced, then paced ---------------------------------------------
recreate() { # recreate NS: T0, the apply's time (ms), T1, when all was rolled out
  workload "$1" 2 >"$W/$1-2.yaml"
  T0=$(now_ms)
  k apply -f "$W/$1-2.yaml" >/dev/null
  wait_for "$1: the second revision rolled out" rolled "$1"
  T1=$(now_ms)
}
recreate "$FREE"
FREE_T0=$T0 FREE_T1=$T1
say "$FREE (unpaced): rolled out in $(secs $((FREE_T1 - FREE_T0))) s"
recreate "$PACED"
PACED_T0=$T0 PACED_T1=$T1
say "$PACED (paced): rolled out in $(secs $((PACED_T1 - PACED_T0))) s"
sleep 2   # the audit log's last entries

# ---- the replay of the unpaced part --------------------------------------------------------
iso() { python3 -c 'import datetime, sys; print(datetime.datetime.fromtimestamp(int(sys.argv[1]) / 1000, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))' "$1"; }
policy_args=()
if [[ "$MUTATE" == unlimited ]]; then
  # Deliberate mutation: a replay that ignores the policy (limits that never bind).
  sed -e 's/events: 20, window: 10s/events: 1000000, window: 10s/' \
    "$E2E_ROOT/src/policy/default-policy.yaml" >"$W/unlimited.yaml"
  policy_args=(--policy "$W/unlimited.yaml")
  say "MUTATION: replaying with $W/unlimited.yaml (limits of 1000000 per 10 s)"
fi
"$CHURN_THROTTLER_BIN" simulate --replay "$W/logs/audit.log" \
  --since "$(iso $((FREE_T0 - 1000)))" --until "$(iso $((FREE_T1 + 1000)))" \
  --opt-in "$FREE" --csv "$W/replay.csv" "${policy_args[@]}" >"$W/replay.txt" 2>&1 \
  || { cat "$W/replay.txt" >&2; die "simulate --replay failed"; }
sed 's/^/  /' "$W/replay.txt"

# ---- the real paced run, from the same audit log -------------------------------------------
python3 - "$here" "$W/logs/audit.log" "$PACED" "$PACED_T0" "$PACED_T1" "$WINDOW_MS" >"$W/real.json" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from e2e import audit_requests, max_in_window
path, ns, t0, t1, window = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
reqs = [r for r in audit_requests(path, t0, t1, ns) if r["ns"] == ns and r["resource"] == "pods"
        and r["code"] is not None and 200 <= r["code"] < 300 and t0 - 1000 <= r["recv"] <= t1 + 1000]
reqs.sort(key=lambda r: r["recv"])
binds = [r for r in reqs if r["verb"] == "create" and r["sub"] == "binding"]
# A pod's first DELETE not by a node (the replay's rule: later ones are final deletions).
dels, seen = [], set()
for r in reqs:
    if r["verb"] == "delete" and not r["sub"] and not r["user"].startswith("system:node:"):
        if (r["name"]) not in seen:
            seen.add(r["name"])
            dels.append(r)
events = [r for r in reqs if (r["verb"] == "create" and r["sub"] in (None, "binding", "eviction"))
          or (r["verb"] == "delete" and not r["sub"])]
origin = min(r["recv"] for r in events)
def sts_pod(r):
    return r["name"] and r["name"].startswith("db-")
out = {}
for kind, rs in (("starts", binds), ("deletions", dels)):
    times = [r["recv"] for r in rs]
    out[kind] = {
        "events": len(rs),
        "peak": max_in_window(times, window),
        "peak_sts": max_in_window([r["recv"] for r in rs if sts_pod(r)], window),
        "peak_rs": max_in_window([r["recv"] for r in rs if not sts_pod(r)], window),
        "makespan_s": round((max(times) - origin) / 1000, 3),
    }
print(json.dumps(out))
PY

# ---- checks ----------------------------------------------------------------------------
field() { # field KIND COLUMN: from the replay's CSV
  python3 -c '
import csv, sys
for row in csv.DictReader(open(sys.argv[1])):
    if row["kind"] == sys.argv[2]:
        print(row[sys.argv[3]])' "$W/replay.csv" "$1" "$2"
}
real() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]][sys.argv[3]])' "$W/real.json" "$1" "$2"; }
fcheck() { awk "BEGIN { exit !($1) }"; }
max_kind=$((LIMIT * RULES_PER_KIND))
ROWS=()
for kind in starts deletions; do
  p_peak=$(field "$kind" paced_peak) p_mk=$(field "$kind" paced_makespan_s)
  r_peak=$(field "$kind" recorded_peak) n=$(field "$kind" events)
  a_peak=$(real "$kind" peak) a_mk=$(real "$kind" makespan_s) a_n=$(real "$kind" events)
  # The same workload (a controller may re-create a pod once more: one run had db-13-0
  # bound twice, 181 bindings).
  numeric "a_n - n <= 2 && n - a_n <= 2" \
    && ok "$kind: the unpaced run recorded $n, the paced run $a_n (the same workload, within 2)" \
    || bad "$kind: the unpaced run recorded $n, the paced run $a_n"
  numeric "p_peak <= max_kind" \
    && ok "replayed $kind: peak $p_peak per 10 s within the two rules' limits ($max_kind; real $a_peak)" \
    || bad "replayed $kind: peak $p_peak per 10 s over the two rules' limits ($max_kind; recorded $r_peak)"
  fcheck "$p_mk >= 0.85 * $a_mk && $p_mk <= 1.15 * $a_mk" \
    && ok "replayed $kind: makespan $p_mk s within 15 % of the real paced $a_mk s" \
    || bad "replayed $kind: makespan $p_mk s, real paced $a_mk s (more than 15 % apart)"
  per=()
  for c in StatefulSet ReplicaSet; do
    [[ $c == StatefulSet ]] && col=peak_sts || col=peak_rs
    cp=$(field "$kind:$c" paced_peak) ca=$(real "$kind" "$col") cr=$(field "$kind:$c" recorded_peak)
    per+=("$cr / $cp / $ca")
    numeric "ca <= LIMIT" \
      && ok "real paced $kind of $c pods: at most $LIMIT per 10 s ($ca)" \
      || bad "real paced $kind of $c pods: $ca in a 10 s window (limit $LIMIT)"
    numeric "cp <= LIMIT" \
      && ok "replayed $kind of $c pods: peak $cp per 10 s within the limit $LIMIT (recorded $cr)" \
      || bad "replayed $kind of $c pods: peak $cp per 10 s over the limit $LIMIT (recorded $cr)"
    numeric "cp - ca <= 1 && ca - cp <= 1" \
      && ok "replayed $kind of $c pods: peak $cp within one event of the real paced peak $ca" \
      || bad "replayed $kind of $c pods: peak $cp, real paced peak $ca (more than one event apart)"
  done
  ROWS+=("| $kind | $n | $r_peak / $p_peak / $a_peak | ${per[0]} | ${per[1]} | $p_mk | $a_mk |")
done
say "| kind | events | peak / 10 s: recorded / replayed / real paced | StatefulSet pods | ReplicaSet pods | replayed makespan s | real paced makespan s |"
say "| --- | --- | --- | --- | --- | --- | --- |"
for row in "${ROWS[@]}"; do say "$row"; done
say "script time $(( $(date +%s) - t_script )) s"
e2e_finish
