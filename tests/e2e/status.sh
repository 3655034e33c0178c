#!/usr/bin/env bash
# End-to-end test of `churn-throttler status` and `churn-throttler release` against a real
# control plane (tests/e2e/cluster.sh):
#   - the webhook configurations of manifests/overlays/e2e-local (placeholders filled), the
#     policy in the install's ConfigMap, `churn-throttler serve` on 127.0.0.1 with the
#     releaser, as ServiceAccount churn-throttler/churn-throttler with the RBAC of
#     manifests/base; `status` and `release` as a ServiceAccount bound to the roles of
#     manifests/rbac/churn-throttler-operator.yaml, nothing more;
#   - 3 Deployments x 10 pods created at once in 3 labelled namespaces under a gate rule of
#     5 per 10 s, and 5 StatefulSets x 3 changed at once under a partition rule of 5 per 10 s;
#   - `status -A -o json` while they wait lists every gated pod and every held set; the
#     places are the order the releaser then releases in, and each estimate is within one
#     spacing + 1 s of the real release (errors printed): the answer of the pod's
#     gate-removing patch in the API server's audit log;
#   - `status sts/X --wait` returns 0 once X's last pod is Ready (a pod watch) and not
#     before; on a held set it times out (exit 3); on a set let go by an exempt writer it
#     exits 4; `kubectl rollout status` on a held set, for comparison;
#   - `release pods -n NS` lifts that namespace's gates (its pods bound at once, released-by,
#     Events); `release sts/X` lets a held set go to its target (rolled, waited for);
#   - `kubectl churn-throttler status` through kubectl's plugin lookup (a symlink on PATH);
#   - `status` as a ServiceAccount without rights, and against a namespace where nothing is
#     installed: one line each, non-zero.
# Everything listens on 127.0.0.1; every wait is bounded; everything stops on exit.
# Last line: "status: N passed, M failed".
#
# Environment: CHURN_THROTTLER_BIN (skip `cargo build`), E2E_BIN (cluster binaries),
# STATUS_E2E_KEEP=1 (keep the work dir), STATUS_E2E_TIMEOUT (s per wait, default 180).
# shellcheck disable=SC2015  # `check && ok || bad`: ok() never fails
# shellcheck source-path=SCRIPTDIR  # lib.sh and cluster.sh, from any working directory
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"
e2e_suite status STATUS_E2E_KEEP

timeout="${STATUS_E2E_TIMEOUT:-180}"
LIMIT=5
WINDOW_S=10
DEPLOY_NS=(st-a st-b st-c)
PER_NS=10
STS_NS="st-sts"
SETS=5
REPLICAS=3
OPTIN=churn-throttler.io/enabled
SA_USER=system:serviceaccount:churn-throttler:churn-throttler

e2e_die_logs() { e2e_tail_log 20 serve.log; }
py() { python3 "$here/status_report.py" "$@"; }

e2e_build
e2e_workdir   # W; PROC's processes stopped on exit

# ---- cluster (with an audit log of pod patches), install, identities ---------------------
# The releases are the accepted pod patches that remove a gate, at their answers.
mkdir -p "$W/logs"
cat >"$W/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    resources: [{ group: "", resources: [pods] }]
    verbs: [patch]
  - level: None
EOF
CLUSTER_KUBE_ARGS_APISERVER="${CLUSTER_KUBE_ARGS_APISERVER:-} $(e2e_audit_args)" \
  cluster_up "$W" 3 || die "cluster up failed"
# shellcheck disable=SC1091
source "$W/env"
k() { kubectl --request-timeout=20s "$@"; }

# Nothing installed yet: status says so (as the cluster's admin).
set +e
out="$("$CHURN_THROTTLER_BIN" status -A 2>&1)"; rc=$?
set -e
(( rc == 1 )) && [[ "$(wc -l <<<"$out")" == 1 && "$out" == *"churn-throttler is not installed in this cluster"* ]] \
  && ok "status on a cluster without churn-throttler (no ConfigMap, no Lease): one line, exit $rc: $out" \
  || bad "not installed: rc=$rc: $out"

read -r WH_PORT < <(_cl_free_ports 1)
cluster_issue_serving_cert "$W" webhook >/dev/null
k kustomize "$root/manifests/overlays/e2e-local" \
  | sed -e "s#__WEBHOOK_URL__#https://127.0.0.1:${WH_PORT}#g" \
        -e "s#__CA_BUNDLE__#$(base64 -w0 <"$CLUSTER_CA_FILE")#g" >"$W/e2e-local.yaml"
! grep -q '__' "$W/e2e-local.yaml" || die "a placeholder is left in the rendered overlay"
k apply --server-side --field-manager=status-e2e -f "$W/e2e-local.yaml" >/dev/null \
  || die "server-side apply of manifests/overlays/e2e-local failed"
k apply --server-side --field-manager=status-e2e -f "$root/manifests/rbac/churn-throttler-operator.yaml" >/dev/null \
  || die "apply of manifests/rbac/churn-throttler-operator.yaml failed"

cat >"$W/policy.yaml" <<EOF
timeoutSeconds: 10
rules:
  - name: sts-rollouts
    match: { resources: [statefulsets], operations: [UPDATE] }
    limit: { events: $LIMIT, window: ${WINDOW_S}s, scope: global }
    action: partition
  - name: deploy-creates
    match: { resources: [pods], operations: [CREATE], controllerKinds: [ReplicaSet] }
    limit: { events: $LIMIT, window: ${WINDOW_S}s, scope: global }
    action: gate
exempt:
  namespaces: [kube-system, kube-public, kube-node-lease, churn-throttler]
  users: [system:serviceaccount:kube-system:namespace-controller, $SA_USER]
EOF
"$CHURN_THROTTLER_BIN" check-config "$W/policy.yaml" >/dev/null || die "the policy does not pass check-config"
# The install's ConfigMap holds the policy `serve` runs with, as in a cluster.
k -n churn-throttler create configmap churn-throttler-policy --from-file=policy.yaml="$W/policy.yaml" \
  --dry-run=client -o yaml | k apply --server-side --force-conflicts --field-manager=status-e2e -f - >/dev/null \
  || die "could not put the policy into the ConfigMap"

# kubeconfig_for NAME SA-NAMESPACE SA: a kubeconfig with that ServiceAccount's token.
kubeconfig_for() {
  k -n "$2" get serviceaccount "$3" >/dev/null 2>&1 || k -n "$2" create serviceaccount "$3" >/dev/null
  e2e_kubeconfig "$2" "$3" "$W/$1.kubeconfig"
}
k create namespace e2e-ops >/dev/null
wait_for "ServiceAccount churn-throttler" k -n churn-throttler get serviceaccount churn-throttler
kubeconfig_for releaser churn-throttler churn-throttler
kubeconfig_for operator e2e-ops operator
kubeconfig_for nobody e2e-ops nobody
OPERATOR=system:serviceaccount:e2e-ops:operator
k create clusterrolebinding e2e-operator-status --clusterrole=churn-throttler-status --serviceaccount=e2e-ops:operator >/dev/null
k -n churn-throttler create rolebinding e2e-operator-status --role=churn-throttler-status --serviceaccount=e2e-ops:operator >/dev/null
k create clusterrolebinding e2e-operator-release --clusterrole=churn-throttler-release --serviceaccount=e2e-ops:operator >/dev/null
can() { kubectl --kubeconfig "$W/$1.kubeconfig" auth can-i "${@:2}" 2>/dev/null || true; }
rbac="list pods: $(can operator list pods -A), watch sts: $(can operator watch statefulsets.apps -A), patch pods: $(can operator patch pods -A), delete pods: $(can operator delete pods -A), update sts: $(can operator update statefulsets.apps -A), get lease: $(can operator -n churn-throttler get leases.coordination.k8s.io/churn-throttler-releaser), get other lease: $(can operator -n churn-throttler get leases.coordination.k8s.io/other)"
[[ "$rbac" == "list pods: yes, watch sts: yes, patch pods: yes, delete pods: no, update sts: no, get lease: yes, get other lease: no" ]] \
  && ok "the operator's token has the rights of manifests/rbac/churn-throttler-operator.yaml, nothing more ($rbac)" || bad "operator RBAC: $rbac"
op() { "$CHURN_THROTTLER_BIN" "$@" --kubeconfig "$W/operator.kubeconfig"; }

# ---- a ServiceAccount without rights -------------------------------------------------------
set +e
out="$("$CHURN_THROTTLER_BIN" status -A --kubeconfig "$W/nobody.kubeconfig" 2>&1)"; rc=$?
set -e
(( rc == 1 )) && [[ "$(wc -l <<<"$out")" == 1 && "$out" == *"forbidden"* ]] \
  && ok "status as a ServiceAccount without rights: one line, exit $rc: $out" \
  || bad "no rights: rc=$rc: $out"

# ---- serve ---------------------------------------------------------------------------
# The admission's messages (debug) show what the webhook tells a pod it gates.
KUBECONFIG="$W/releaser.kubeconfig" RUST_LOG="info,churn_throttler::releaser=debug,churn_throttler::server::admission=debug" \
  "$CHURN_THROTTLER_BIN" serve --config "$W/policy.yaml" \
    --tls-cert "$W/pki/webhook.crt" --tls-key "$W/pki/webhook.key" \
    --listen "127.0.0.1:$WH_PORT" --metrics-listen 127.0.0.1:0 \
    --releaser=true --lease-namespace churn-throttler --identity releaser-a \
    --shutdown-delay 0s --drain-timeout 2s --log-format json >>"$W/serve.log" 2>&1 &
PROC[serve]=$!
wait_for "serving" grep -q '"churn-throttler serving"' "$W/serve.log"
wait_for "releaser-a holds the lease" holder_is releaser-a

# ---- workloads -----------------------------------------------------------------------
for ns in "${DEPLOY_NS[@]}" "$STS_NS"; do k create namespace "$ns" >/dev/null; done
for ns in "${DEPLOY_NS[@]}" "$STS_NS"; do wait_for "ServiceAccount $ns/default" k -n "$ns" get serviceaccount default; done
POD_SPEC='{ "terminationGracePeriodSeconds": 1, "containers": [ { "name": "app", "image": "e2e.invalid/app:1" } ] }'
sts_yaml() { # sts_yaml NAME REVISION
  cat <<EOF
---
apiVersion: apps/v1
kind: StatefulSet
metadata: { name: $1, namespace: $STS_NS }
spec:
  replicas: $REPLICAS
  serviceName: $1
  podManagementPolicy: OrderedReady
  updateStrategy: { type: RollingUpdate }
  selector: { matchLabels: { app: $1 } }
  template:
    metadata: { labels: { app: $1 }, annotations: { e2e-revision: "$2" } }
    spec: $POD_SPEC
EOF
}
sets_yaml() { for i in $(seq 0 $((SETS - 1))); do sts_yaml "sts-$i" "$1"; done; }
sets_yaml 1 | k apply -f - >/dev/null
sets_ready() {
  k -n "$STS_NS" get sts -o json | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
sys.exit(0 if len(items) == int(sys.argv[1]) and all(s.get("status", {}).get("readyReplicas", 0) == 3 and s["status"].get("updatedReplicas", 0) == 3 for s in items) else 1)' "$SETS"
}
wait_for "$SETS StatefulSets x $REPLICAS Ready" sets_ready
for ns in "${DEPLOY_NS[@]}" "$STS_NS"; do k label namespace "$ns" "$OPTIN=true" >/dev/null; done

# A watch of sts-0's pods (name, revision, Ready), each line stamped as it arrives.
mkfifo "$W/pods.fifo"
py record "$W/sts-0-pods.log" <"$W/pods.fifo" &
PROC[recorder]=$!
kubectl get pods -n "$STS_NS" -l app=sts-0 --watch \
  -o go-template='{{.metadata.name}} {{index .metadata.labels "controller-revision-hash"}} {{range .status.conditions}}{{if eq .type "Ready"}}{{.status}}{{end}}{{end}}{{"\n"}}' \
  >"$W/pods.fifo" 2>"$W/watch.err" &
PROC[watch]=$!
wait_for "the pod watch" test -s "$W/sts-0-pods.log"

deploy_yaml() { # deploy_yaml NAMESPACE REPLICAS
  cat <<EOF
---
apiVersion: apps/v1
kind: Deployment
metadata: { name: web, namespace: $1 }
spec:
  replicas: $2
  selector: { matchLabels: { app: web } }
  template:
    metadata: { labels: { app: web } }
    spec: $POD_SPEC
EOF
}

# ---- phase 1: a queue and held rollouts, then what the releaser does with them ----------
t_change=$(now_ms)
{ for ns in "${DEPLOY_NS[@]}"; do deploy_yaml "$ns" "$PER_NS"; done; sets_yaml 2; } | k apply -f - >/dev/null
say "created 3 Deployments x $PER_NS and changed $SETS StatefulSet templates with one kubectl apply"
# sts-0 is waited for from the change on; sts-4 is let go mid-way (below).
# (errexit is inherited by the subshells: the exit code is taken with ||.)
( rc=0; op status sts/sts-0 -n "$STS_NS" --wait --timeout 170s >"$W/wait-0.out" 2>&1 || rc=$?; echo "$rc $(now_ms)" >"$W/wait-0.rc" ) &
PROC[wait0]=$!
( rc=0; op status sts/sts-4 -n "$STS_NS" --wait --timeout 170s >"$W/wait-4.out" 2>&1 || rc=$?; echo "$rc $(now_ms)" >"$W/wait-4.rc" ) &
PROC[wait4]=$!
all_created() { (( $(k get pods -A -l app=web --no-headers 2>/dev/null | wc -l) == ${#DEPLOY_NS[@]} * PER_NS )); }
wait_for "all $((${#DEPLOY_NS[@]} * PER_NS)) Deployment pods created" all_created
gated_names() { k get pods -A -l churn-throttler.io/gated=true -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}' | sort; }
gated_names >"$W/gated-before.txt"
op status -A -o json >"$W/status.json" || die "status -A -o json failed"
gated_names >"$W/gated-after.txt"
op status -A >"$W/status.txt" || die "status -A failed"
say "status -A, as the operator, while the pods wait and the rollouts are held:"
sed 's/^/    /' "$W/status.txt"
listed="$(python3 -c 'import json,sys; print("\n".join(sorted(p["namespace"]+"/"+p["name"] for p in json.load(open(sys.argv[1]))["gatedPods"])))' "$W/status.json")"
extra="$(comm -13 "$W/gated-before.txt" <(echo "$listed") | grep -c . || true)"
lost="$(comm -23 "$W/gated-after.txt" <(echo "$listed") | grep -c . || true)"
n_listed="$(grep -c . <<<"$listed" || true)"
numeric "n_listed >= 10 && extra == 0 && lost == 0" \
  && ok "status -A -o json lists every gated pod: $n_listed (gated before it: $(wc -l <"$W/gated-before.txt"), after: $(wc -l <"$W/gated-after.txt"); none missing, none extra)" \
  || bad "gated pods listed $n_listed, not gated before $extra, gated after but missing $lost"
held_listed="$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["heldStatefulSets"]))' "$W/status.json")"
numeric "held_listed == SETS" && ok "status -A -o json lists the $SETS held StatefulSets" || bad "held sets listed: $held_listed"
python3 - "$W/status.json" <<'PY' && ok "the JSON has the documented top level, rules and leader" || bad "JSON schema: $(head -c 300 "$W/status.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["apiVersion"] == "churn-throttler.io/v1" and r["kind"] == "Status"
assert r["leader"]["holder"] == "releaser-a" and not r["leader"]["expired"]
rules = {x["name"]: x for x in r["rules"]}
assert rules["deploy-creates"]["action"] == "gate" and rules["deploy-creates"]["windowLimit"] == 5
assert rules["sts-rollouts"]["action"] == "partition" and rules["sts-rollouts"]["podsToStep"] >= 1
PY

# kubectl's own rollout status on a held set, and ours with a short timeout.
set +e
rollout_out="$(k -n "$STS_NS" rollout status sts/sts-1 --timeout=3s 2>&1)"; rollout_rc=$?
out="$(op status sts/sts-1 -n "$STS_NS" --wait --timeout 2s 2>&1)"; rc=$?
set -e
say "kubectl rollout status sts/sts-1 while held: exit $rollout_rc, \"$(tail -n1 <<<"$rollout_out")\""
(( rc == 3 )) && ok "status sts/sts-1 --wait --timeout 2s on a held rollout: exit 3 ($(tail -n1 <<<"$out"))" || bad "timeout: rc=$rc: $out"

# sts-4 let go: an exempt writer (the releaser's own identity) sets its partition.
# Any value but the one churn-throttler holds, above the target 0.
p4="$(k -n "$STS_NS" get sts sts-4 -o jsonpath='{.spec.updateStrategy.rollingUpdate.partition}')"
to4=$(( p4 == 1 ? 2 : p4 - 1 ))
KUBECONFIG="$W/releaser.kubeconfig" kubectl -n "$STS_NS" patch sts sts-4 --type=json \
  -p "[{\"op\":\"replace\",\"path\":\"/spec/updateStrategy/rollingUpdate/partition\",\"value\":$to4}]" >/dev/null
say "sts-4: partition set from $p4 to $to4 by an exempt writer"
wait_for "the wait on sts-4 to end" test -s "$W/wait-4.rc"
read -r rc4 _ <"$W/wait-4.rc"
(( rc4 == 4 )) && ok "status sts/sts-4 --wait on a rollout let go (partition set by an exempt writer): exit 4 ($(tail -n1 "$W/wait-4.out"))" \
  || bad "let go: rc=$rc4: $(cat "$W/wait-4.out")"

# The queue drains; the StatefulSets converge.
none_gated() { [[ -z "$(k get pods -A -l churn-throttler.io/gated=true -o name)" ]]; }
wait_for "every Deployment pod released" none_gated
wait_for "the wait on sts-0 to end" test -s "$W/wait-0.rc"
read -r rc0 t_wait0 <"$W/wait-0.rc"
k get pods -A -l app=web -o json >"$W/pods-final.json"
# What the estimate may be off by: it runs the releaser's own order on the windows the
# status saw, with the same spacing (burst 2: one release per (10 s + 0.5 s) / 5 = 2.1 s
# after the first two), so it misses only (a) how long after its slot a release is
# answered (the releaser's round, then the patch: well under a second) and (b) a release
# in flight while the status read the cluster, which it does not see: every later pod
# then goes one spacing later than estimated. So the tolerance is one spacing + 1 s,
# 3.1 s: an estimate a whole window (10 s) off fails.
SPACING_MS=$(( (WINDOW_S * 1000 + WINDOW_S * 1000 / 20) / LIMIT ))
TOLERANCE_MS=$(( SPACING_MS + 1000 ))
py compare "$W/status.json" "$W/pods-final.json" "$TOLERANCE_MS" "$W/logs/audit.log" "$SA_USER" >"$W/compare.json"
get() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print(json.dumps(v) if not isinstance(v,(int,float,str)) or isinstance(v,bool) else v)' "$W/compare.json" "$1"; }
say "estimates against the releases in the audit log: $(cat "$W/compare.json")"
numeric "$(get compared) == n_listed && $(get inversion_count) == 0" \
  && ok "the places are the releaser's order: $(get compared) pods released in the order of their positions (0 inversions)" \
  || bad "order: $(get compared) of $n_listed compared, $(get inversion_count) inversions: $(get inversions)"
numeric "$(get within_window) == $(get compared)" \
  && ok "every estimate within one spacing + 1 s ($(secs "$TOLERANCE_MS") s) of the real release (its gate-removing patch's answer, audit log): max error $(get max_error_s) s, median $(get median_error_s) s, mean lateness $(get mean_late_s) s; last release $(get last_release_after_status_s) s after status, estimated $(get last_estimated_after_status_s) s" \
  || bad "estimates: $(get within_window) of $(get compared) within $(secs "$TOLERANCE_MS") s; max error $(get max_error_s) s at $(get worst)"

# sts-0: the wait returned once its last pod was Ready, not before.
rev0="$(k -n "$STS_NS" get sts sts-0 -o jsonpath='{.status.updateRevision}')"
t_ready0="$(py ready-at "$W/sts-0-pods.log" "$rev0" sts-0-0 sts-0-1 sts-0-2)"
anno0="$(k -n "$STS_NS" get sts sts-0 -o jsonpath='{.metadata.annotations.churn-throttler\.io/partition-target}')"
if (( rc0 == 0 && t_ready0 > 0 && t_wait0 >= t_ready0 && t_wait0 - t_ready0 <= 5000 )) && [[ -z "$anno0" ]]; then
  ok "status sts/sts-0 --wait: exit 0, $(secs $((t_wait0 - t_ready0))) s after the pod watch saw its last pod Ready at the new revision ($(secs $((t_ready0 - t_change))) s after the change); no hold left"
else
  bad "wait on sts-0: rc=$rc0, returned at $t_wait0, last pod Ready at $t_ready0 (watch), target annotation '$anno0': $(tail -n3 "$W/wait-0.out")"
fi
say "status sts/sts-0 --wait printed: $(tr '\n' '|' <"$W/wait-0.out")"
# What the webhook told the gated pods: the queue ahead of each (the leader's releaser
# shares it with the webhook in its process), and a Paced Event of the releaser.
warned="$(python3 - "$W/serve.log" <<'PY'
import json, re, sys
ahead = []
for line in open(sys.argv[1]):
    try: e = json.loads(line)
    except ValueError: continue
    m = re.search(r"\(about (\S+) now, behind (\d+) pod\(s\) of this rule already waiting\)", e.get("fields", {}).get("message", ""))
    if m: ahead.append((int(m.group(2)), m.group(1)))
print(len(ahead), *max(ahead, default=(0, "-")))
PY
)"
read -r n_warned max_ahead max_wait <<<"$warned"
numeric "n_warned >= 20 && max_ahead >= 15" \
  && ok "the webhook's warning on gated pods counts the queue ahead: $n_warned gated with a warning, up to $max_ahead pods ahead (told about $max_wait)" \
  || bad "admission warnings: $n_warned, most pods ahead $max_ahead"
paced="$(k get events.events.k8s.io -A -o json | python3 -c '
import json, sys
notes = [e["note"] for e in json.load(sys.stdin)["items"] if e.get("reason") == "Paced" and e.get("reportingController") == "churn-throttler.io/releaser"]
print(len(notes), notes[0] if notes else "")')"
say "releaser Events: $paced"

# The held sets' estimated ends against the releaser's last step of each (its log), for
# the record: the estimate assumes every re-created pod Ready at once.
python3 - "$W/status.json" "$W/serve.log" <<'PY' | sed 's/^/status: /'
import json, sys
from datetime import datetime
ms = lambda t: int(datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() * 1000)
report = json.load(open(sys.argv[1]))
last = {}
for line in open(sys.argv[2]):
    try: e = json.loads(line)
    except ValueError: continue
    f = e.get("fields", {})
    if f.get("message") == "releaser: partition stepped" and f.get("to") == 0:
        last[f["statefulset"]] = ms(e["timestamp"])
rows = []
for s in report["heldStatefulSets"]:
    key = s["namespace"] + "/" + s["name"]
    if key in last and s.get("estimatedEnd"):
        rows.append((key, (last[key] - ms(s["estimatedEnd"])) / 1000))
print("held sets, last step taken minus estimated (s): " + ", ".join(f"{k} {d:+.1f}" for k, d in rows))
PY
converged() { k -n "$STS_NS" get sts -o json | python3 -c '
import json, sys
items = [s for s in json.load(sys.stdin)["items"] if s["metadata"]["name"] != "sts-4"]
sys.exit(0 if all(s["status"].get("updatedReplicas") == 3 and s["status"].get("readyReplicas") == 3 and "churn-throttler.io/partition-target" not in (s["metadata"].get("annotations") or {}) for s in items) else 1)'; }
wait_for "the other StatefulSets converged" converged

# ---- phase 2: the emergency path ---------------------------------------------------------
deploy_yaml st-c $((PER_NS * 2)) | k apply -f - >/dev/null
c_gated() { (( $(k -n st-c get pods -l churn-throttler.io/gated=true --no-headers 2>/dev/null | wc -l) >= 5 )); }
wait_for "new pods gated in st-c" c_gated
t_release=$(now_ms)
op release pods -n st-c >"$W/release-pods.out" 2>&1 || bad "release pods -n st-c failed: $(cat "$W/release-pods.out")"
t_released=$(now_ms)
# The pods it lifted (the releaser may have taken some in between): one line each.
sed -n 's#^pod st-c/\(.*\): gate lifted.*#\1#p' "$W/release-pods.out" >"$W/c-gated.txt"
bound() { k -n st-c get pods -o json | python3 -c '
import json, sys
want = set(open(sys.argv[1]).read().split())
pods = {p["metadata"]["name"]: p for p in json.load(sys.stdin)["items"]}
sys.exit(0 if want and all(pods.get(n, {}).get("spec", {}).get("nodeName") for n in want) else 1)' "$W/c-gated.txt"; }
wait_for "the released pods bound" bound
t_bound=$(now_ms)
n_c="$(wc -l <"$W/c-gated.txt")"
marks="$(k -n st-c get pods -o json | python3 -c '
import json, sys
want = set(open(sys.argv[1]).read().split())
ok = 0
for p in json.load(sys.stdin)["items"]:
    a = p["metadata"].get("annotations") or {}
    if p["metadata"]["name"] in want and a.get("churn-throttler.io/released-by", "").startswith(sys.argv[2] + " at ") and p["metadata"]["labels"].get("churn-throttler.io/gated") in ("released", None):
        ok += 1
print(ok)' "$W/c-gated.txt" "$OPERATOR")"
events_c="$(k -n st-c get events.events.k8s.io -o json | python3 -c '
import json, sys
print(sum(1 for e in json.load(sys.stdin)["items"] if e.get("reason") == "ReleasedByHand" and e.get("reportingController") == "churn-throttler.io/cli"))')"
numeric "n_c >= 3 && marks == n_c && events_c == n_c" && numeric "t_bound - t_released <= 5000" \
  && ok "release pods -n st-c: $n_c gated pods lifted in $(secs $((t_released - t_release))) s, all bound $(secs $((t_bound - t_released))) s later; released-by names $OPERATOR on each, $events_c ReleasedByHand Events" \
  || bad "release pods: $n_c gated, $marks marked, $events_c Events, bound after $((t_bound - t_released)) ms: $(tail -3 "$W/release-pods.out")"
say "release pods -n st-c printed: $(tail -n1 "$W/release-pods.out")"

sts_yaml sts-2 3 | k apply -f - >/dev/null
held2() { [[ -n "$(k -n "$STS_NS" get sts sts-2 -o jsonpath='{.metadata.annotations.churn-throttler\.io/partition-target}')" ]]; }
wait_for "sts-2 held again" held2
( rc=0; op status sts/sts-2 -n "$STS_NS" --wait --timeout 120s >"$W/wait-2.out" 2>&1 || rc=$?; echo "$rc $(now_ms)" >"$W/wait-2.rc" ) &
PROC[wait2]=$!
t_rel2=$(now_ms)
op release sts/sts-2 -n "$STS_NS" >"$W/release-sts.out" 2>&1 || bad "release sts/sts-2 failed: $(cat "$W/release-sts.out")"
wait_for "the wait on sts-2 to end" test -s "$W/wait-2.rc"
read -r rc2 t_wait2 <"$W/wait-2.rc"
state2="$(k -n "$STS_NS" get sts sts-2 -o json | python3 -c '
import json, sys
s = json.load(sys.stdin); a = s["metadata"].get("annotations") or {}
print(s["spec"]["updateStrategy"]["rollingUpdate"]["partition"], "partition-target" in str(a), a.get("churn-throttler.io/released-by", "-").split(" at ")[0], s["status"].get("updatedReplicas"))')"
(( rc2 == 0 )) && [[ "$state2" == "0 False $OPERATOR 3" ]] \
  && ok "release sts/sts-2: partition 0 at once, hold annotations gone, released-by $OPERATOR; status sts/sts-2 --wait returned 0 $(secs $((t_wait2 - t_rel2))) s after the release (3 pods rolled at the controller's pace)" \
  || bad "release sts: wait rc=$rc2, state '$state2': $(cat "$W/release-sts.out") | $(tail -n2 "$W/wait-2.out")"

# ---- the kubectl plugin -----------------------------------------------------------------
mkdir -p "$W/plugins"
ln -s "$CHURN_THROTTLER_BIN" "$W/plugins/kubectl-churn_throttler"
set +e
plugin_out="$(PATH="$W/plugins:$PATH" kubectl churn-throttler status -A --kubeconfig "$W/operator.kubeconfig" 2>&1)"; rc=$?
set -e
(( rc == 0 )) && grep -q "^churn-throttler status at" <<<"$plugin_out" && grep -q "^leader: releaser-a" <<<"$plugin_out" \
  && ok "kubectl churn-throttler status -A through kubectl's plugin lookup (a symlink kubectl-churn_throttler on PATH)" \
  || bad "plugin: rc=$rc: $(head -3 <<<"$plugin_out")"
say "kubectl plugin list: $(PATH="$W/plugins:$PATH" kubectl plugin list 2>/dev/null | grep churn || true)"

# --watch prints again until Ctrl-C (SIGINT here), which ends it with 130.
set +e
timeout --preserve-status -s INT 4.5 "$CHURN_THROTTLER_BIN" status -A --watch=1 --kubeconfig "$W/operator.kubeconfig" >"$W/watch.out" 2>&1; rc=$?
set -e
prints="$(grep -c '^churn-throttler status at' "$W/watch.out" || true)"
(( rc == 130 && prints >= 3 )) && ok "status -A --watch=1: printed $prints times in 4.5 s, ended by SIGINT with exit $rc" \
  || bad "--watch: rc=$rc, $prints prints: $(tail -2 "$W/watch.out")"

say "logs: $W (kept with STATUS_E2E_KEEP=1)"
e2e_finish
