#!/usr/bin/env bash
# End-to-end test of `churn-throttler pause` and `resume` (PacingOverride objects) on a real
# control plane (tests/e2e/cluster.sh):
#   - manifests/overlays/e2e-local (the PacingOverride CRD and its RBAC included), the
#     policy in the install's ConfigMap (a gate rule of 20 per 10 s on ReplicaSet pod
#     creates), `churn-throttler serve` on 127.0.0.1 with the releaser as ServiceAccount
#     churn-throttler/churn-throttler; `pause` and `resume` as a ServiceAccount bound to
#     churn-throttler-pacing-operator (and churn-throttler-status, to read the Lease);
#   - a Deployment of 60 pods in a labelled namespace; once 10 are released, `pause --all
#     --for 2m`: from the time `pause` printed (the leader took it up) until `resume`, no
#     gate is lifted (pod patches removing the gate, at the API server's audit log);
#     meanwhile `status` lists the pause (author, reason, time left) and the metrics say
#     paused / source pause;
#   - `resume --all`: the rest goes, every pod released, none left gated, at most 20 gate
#     lifts in any 10 s (audit log, the whole run: no window over the limit at resuming);
#   - `pause` by a ServiceAccount without the role: refused, the message names the role;
#     `pause` without --for: refused before anything is written;
#   - `override controller-creates --events 40 --for 15s`: in force (metrics, status), then
#     expired by itself (limit 20 again) and deleted by the leader;
#   - a pause of 5 s: expired, the leader deletes its object; Events on pause, resume,
#     override and expiry;
#   - the leader killed (SIGKILL) during an indefinite pause with 5 more pods gated: the
#     second replica takes the lease and lifts none of them until
#     `resume`, then releases them.
# Everything listens on 127.0.0.1; every wait is bounded; everything stops on exit.
# Last line: "pause: N passed, M failed".
#
# Environment: CHURN_THROTTLER_BIN (skip `cargo build`), E2E_BIN (cluster binaries),
# PAUSE_E2E_KEEP=1 (keep the work dir), PAUSE_E2E_TIMEOUT (s per wait, default 120),
# PAUSE_E2E_HOLD (s the pause is held before `resume`, default 25).
# shellcheck disable=SC2015  # `check && ok || bad`: ok() never fails
# shellcheck source-path=SCRIPTDIR  # lib.sh and cluster.sh, from any working directory
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"
e2e_suite pause PAUSE_E2E_KEEP

timeout="${PAUSE_E2E_TIMEOUT:-120}"
HOLD_S="${PAUSE_E2E_HOLD:-25}"
LIMIT=20
WINDOW_S=10
PODS=60
NS=pz-a
OPTIN=churn-throttler.io/enabled
SA_USER=system:serviceaccount:churn-throttler:churn-throttler

e2e_die_logs() { e2e_tail_log 20 serve.log; }
t0=$(now_ms)

e2e_build
e2e_workdir

# ---- cluster (audit log of pod patches), install, identities -------------------------------
mkdir -p "$W/logs"
cat >"$W/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    resources: [{ group: "", resources: [pods] }]
    verbs: [patch]
  - level: Metadata
    resources: [{ group: "churn-throttler.io", resources: [pacingoverrides] }]
  - level: None
EOF
CLUSTER_KUBE_ARGS_APISERVER="${CLUSTER_KUBE_ARGS_APISERVER:-} $(e2e_audit_args)" \
  cluster_up "$W" 3 || die "cluster up failed"
# shellcheck disable=SC1091
source "$W/env"
k() { kubectl --request-timeout=20s "$@"; }

e2e_install_webhook pause-e2e
wait_for "the PacingOverride CRD is established" \
  k wait --for=condition=Established --timeout=5s crd/pacingoverrides.churn-throttler.io

cat >"$W/policy.yaml" <<EOF
timeoutSeconds: 10
rules:
  - name: controller-creates
    match: { resources: [pods], operations: [CREATE], controllerKinds: [ReplicaSet] }
    limit: { events: $LIMIT, window: ${WINDOW_S}s, scope: global }
    action: gate
exempt:
  namespaces: [kube-system, kube-public, kube-node-lease, churn-throttler]
  users: [system:serviceaccount:kube-system:namespace-controller, $SA_USER]
EOF
"$CHURN_THROTTLER_BIN" check-config "$W/policy.yaml" >/dev/null || die "the policy does not pass check-config"
k -n churn-throttler create configmap churn-throttler-policy --from-file=policy.yaml="$W/policy.yaml" \
  --dry-run=client -o yaml | k apply --server-side --force-conflicts --field-manager=pause-e2e -f - >/dev/null \
  || die "could not put the policy into the ConfigMap"
k apply --server-side --field-manager=pause-e2e -f "$root/manifests/rbac/churn-throttler-operator.yaml" >/dev/null \
  || die "apply of manifests/rbac/churn-throttler-operator.yaml failed"

k create namespace e2e-ops >/dev/null
for sa in operator nobody; do
  k -n e2e-ops create serviceaccount "$sa" >/dev/null
  e2e_kubeconfig e2e-ops "$sa" "$W/$sa.kubeconfig"
done
k -n churn-throttler create rolebinding e2e-pacing --clusterrole=churn-throttler-pacing-operator \
  --serviceaccount=e2e-ops:operator >/dev/null
k -n churn-throttler create rolebinding e2e-status --role=churn-throttler-status --serviceaccount=e2e-ops:operator >/dev/null
k create clusterrolebinding e2e-status --clusterrole=churn-throttler-status --serviceaccount=e2e-ops:operator >/dev/null
OPERATOR=system:serviceaccount:e2e-ops:operator
op() { "$CHURN_THROTTLER_BIN" "$@" --kubeconfig "$W/operator.kubeconfig"; }

# ---- serve -----------------------------------------------------------------------------
KUBECONFIG="$W/releaser.kubeconfig" RUST_LOG="info" \
  "$CHURN_THROTTLER_BIN" serve --config "$W/policy.yaml" \
    --tls-cert "$W/pki/webhook.crt" --tls-key "$W/pki/webhook.key" \
    --listen "127.0.0.1:$WH_PORT" --metrics-listen 127.0.0.1:0 \
    --releaser=true --lease-namespace churn-throttler --identity releaser-a \
    --shutdown-delay 0s --drain-timeout 2s --log-format json >>"$W/serve.log" 2>&1 &
PROC[serve]=$!
wait_for "serving" grep -q '"churn-throttler serving"' "$W/serve.log"
e2e_metrics_addr "$W/serve.log" >"$W/metrics-a.addr"
wait_for "releaser-a holds the lease" holder_is releaser-a
wait_for "the PacingOverride watch" grep -q 'watching PacingOverride objects' "$W/serve.log"

# ---- refused before anything is written ---------------------------------------------------
set +e
out="$(op pause --all 2>&1)"; rc=$?
set -e
(( rc != 0 )) && [[ "$out" == *"--indefinitely"* ]] \
  && ok "pause without --for refused (exit $rc): $out" || bad "pause without --for: rc=$rc: $out"
set +e
out="$("$CHURN_THROTTLER_BIN" pause --all --for 1m --kubeconfig "$W/nobody.kubeconfig" 2>&1)"; rc=$?
set -e
(( rc == 1 )) && [[ "$out" == *"you need the churn-throttler-pacing-operator role"* ]] \
  && ok "pause by a ServiceAccount without the role refused (exit $rc): $out" || bad "pause without the role: rc=$rc: $out"
set +e
out="$(op pause no-such-rule --for 1m 2>&1)"; rc=$?
set -e
(( rc == 1 )) && [[ "$out" == *'rule "no-such-rule" is not in the policy'* ]] \
  && ok "pause of a rule the policy does not have refused (exit $rc): $out" || bad "pause of an unknown rule: rc=$rc: $out"
[[ "$(k -n churn-throttler get pacingoverrides -o name | wc -l)" == 0 ]] \
  && ok "no PacingOverride written by the refused commands" || bad "a refused pause left an object"

# ---- a gated mass creation, paused mid-way ---------------------------------------------
k create namespace "$NS" >/dev/null
wait_for "ServiceAccount $NS/default" k -n "$NS" get serviceaccount default
k label namespace "$NS" "$OPTIN=true" >/dev/null
cat <<EOF | k apply -f - >/dev/null
apiVersion: apps/v1
kind: Deployment
metadata: { name: web, namespace: $NS }
spec:
  replicas: $PODS
  selector: { matchLabels: { app: web } }
  template:
    metadata: { labels: { app: web } }
    spec: { terminationGracePeriodSeconds: 1, containers: [ { name: app, image: e2e.invalid/app:1 } ] }
EOF
t_create=$(now_ms)
# pods_gated: pods of $NS that still carry churn-throttler's gate.
pods_gated() {
  k -n "$NS" get pods -o json | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
print(sum(1 for p in items if any(g["name"] == "churn-throttler.io/paced" for g in p["spec"].get("schedulingGates") or [])), len(items))'
}
released_at_least() { read -r g n < <(pods_gated); (( n == PODS && n - g >= $1 )); }
wait_for "10 pods released" released_at_least 10
out="$(op pause --all --for 2m --reason "e2e incident" 2>&1)" || die "pause failed: $out"
t_paused=$(now_ms)
say "$out"
[[ "$out" == *"taken up by the leader releaser-a at "* ]] \
  && ok "pause returned once the leader took it up, after $(secs $((t_paused - t_create))) s of the creation" \
  || bad "pause did not say the leader took it up: $out"
read -r gated_at_pause n < <(pods_gated)
say "at the pause: $((n - gated_at_pause)) of $n released, $gated_at_pause gated"

op status -A -o json >"$W/status.json" || die "status failed"
python3 - "$OPERATOR" "$W/status.json" >"$W/status-check.txt" 2>&1 <<'EOF' && ok "status lists the pause: $(cat "$W/status-check.txt")" || bad "status: $(cat "$W/status-check.txt")"
import json, sys
s = json.load(open(sys.argv[2]))
p = s["pacingOverrides"]
assert len(p) == 1, p
p = p[0]
assert p["kind"] == "pause" and p["rules"] == [] and p["author"] == sys.argv[1] and p["reason"] == "e2e incident", p
assert 100 < p["secondsLeft"] <= 120, p
rule = [r for r in s["rules"] if r["name"] == "controller-creates"][0]
assert rule["schedule"]["paused"] and rule["schedule"]["source"] == "a pause", rule["schedule"]
print(f'{p["name"]} by {p["author"]}, {p["secondsLeft"]:.0f} s left; rule controller-creates: {rule["schedule"]["inForce"]}')
EOF
metrics="$(scrape a)"
grep -q '^churn_throttler_rule_paused{rule="controller-creates"} 1' <<<"$metrics" \
  && grep -q '^churn_throttler_limit_source{rule="controller-creates",source="pause"} 1' <<<"$metrics" \
  && grep -q '^churn_throttler_pacing_overrides{kind="pause"} 1' <<<"$metrics" \
  && ok "metrics: rule_paused 1, limit_source{source=pause} 1, pacing_overrides{kind=pause} 1" \
  || bad "metrics during the pause: $(grep -E 'rule_paused|limit_source|pacing_overrides' <<<"$metrics" | tr '\n' ' ')"

sleep "$HOLD_S"
read -r gated_before_resume n < <(pods_gated)
out="$(op resume --all 2>&1)" || die "resume failed: $out"
t_resumed=$(now_ms)
say "$out"
(( gated_before_resume == gated_at_pause )) \
  && ok "no pod released while paused ($HOLD_S s): $gated_at_pause gated at the pause and at resume" \
  || bad "pods released during the pause: $gated_at_pause gated at the pause, $gated_before_resume at resume"

all_released() { read -r g n < <(pods_gated); (( n == PODS && g == 0 )); }
wait_for "every pod released after resume" all_released
t_done=$(now_ms)
ok "all $PODS pods released $(secs $((t_done - t_resumed))) s after resume, none left gated"
labelled="$(k -n "$NS" get pods -l churn-throttler.io/gated=true -o name | wc -l)"
(( labelled == 0 )) && ok "no pod left labelled gated" || bad "$labelled pods still labelled gated"

# ---- the audit log: nothing lifted during the pause, no window over the limit ---------------
python3 - "$W/logs/audit.log" "$SA_USER" "$t_paused" "$t_resumed" "$LIMIT" "$WINDOW_S" "$OPERATOR" "$here" >"$W/audit-check.json" <<'EOF'
import json, os, sys
sys.path.insert(0, sys.argv[8])
from e2e import audit_requests, is_gate_lift, max_in_window
path, user, paused, resumed, limit, window, operator = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]) * 1000, sys.argv[7]
reqs = audit_requests(path, 0, 1 << 62, "pz-")
lifts = sorted(r["done"] for r in reqs if is_gate_lift(r) and r["user"] == user)
during = [r for r in reqs if is_gate_lift(r) and paused <= r["recv"] <= resumed]
worst = max_in_window(lifts, window)
made = []
for line in open(path):
    try:
        a = json.loads(line)
    except ValueError:
        continue
    ref = a.get("objectRef") or {}
    if ref.get("resource") == "pacingoverrides" and a.get("stage") == "ResponseComplete" and a.get("verb") in ("create", "delete"):
        made.append([a["verb"], (a.get("user") or {}).get("username"), (a.get("responseStatus") or {}).get("code")])
print(json.dumps({"lifts": len(lifts), "during_pause": len(during), "max_per_window": worst,
                  "before_pause": sum(1 for t in lifts if t < paused), "after_resume": sum(1 for t in lifts if t > resumed),
                  "pacingoverride_writes": made}))
EOF
say "audit log: $(cat "$W/audit-check.json")"
get() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$W/audit-check.json" "$1"; }
numeric "$(get during_pause) == 0" \
  && ok "audit log: no gate lifted between the time pause printed and resume ($(secs $((t_resumed - t_paused))) s); $(get before_pause) before, $(get after_resume) after" \
  || bad "audit log: $(get during_pause) gate lifts during the pause"
numeric "$(get max_per_window) <= LIMIT" \
  && ok "audit log: at most $(get max_per_window) gate lifts in any ${WINDOW_S} s (limit $LIMIT), across the resume" \
  || bad "audit log: $(get max_per_window) gate lifts in one ${WINDOW_S} s window (limit $LIMIT)"
python3 -c '
import json, sys
w = json.load(open(sys.argv[1]))["pacingoverride_writes"]
op, nobody = sys.argv[2], sys.argv[3]
assert ["create", op, 201] in w and ["delete", op, 200] in w and ["create", nobody, 403] in w, w' \
  "$W/audit-check.json" "$OPERATOR" "system:serviceaccount:e2e-ops:nobody" \
  && ok "audit log: the operator created and deleted the pause with its own credentials; the refused create answered 403" \
  || bad "audit log of PacingOverride writes: $(get pacingoverride_writes)"

# ---- an override to a higher limit, which expires by itself -------------------------------
limit_is() { scrape a | grep -q "^churn_throttler_limit_in_force{rule=\"controller-creates\"} $1\$"; }
source_is() { scrape a | grep -q "^churn_throttler_limit_source{rule=\"controller-creates\",source=\"$1\"} 1\$"; }
out="$(op override controller-creates --events 40 --for 15s --reason "e2e maintenance" 2>&1)" || die "override failed: $out"
say "$out"
oname="$(sed -n 's#.*PacingOverride churn-throttler/\([^ ]*\) .*#\1#p' <<<"$out" | head -n1)"
[[ "$out" == *"taken up by the leader releaser-a"* ]] && ok "override taken up by the leader" || bad "override: $out"
wait_for "the override's limit in force (40)" limit_is 40
source_is override && ok "override to 40 events per window in force: limit_in_force 40, limit_source override" \
  || bad "override not the source: $(scrape a | grep -E 'limit_in_force|limit_source' | tr '\n' ' ')"
op status -A -o json >"$W/status-override.json" || die "status failed"
python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
p = s["pacingOverrides"]
assert len(p) == 1 and p[0]["kind"] == "override" and p[0]["figures"] == "40 events" and p[0]["rules"] == ["controller-creates"], p
r = [r for r in s["rules"] if r["name"] == "controller-creates"][0]["schedule"]
assert r["source"] == "an override" and r["inForce"].startswith("40 per 10s"), r' "$W/status-override.json" \
  && ok "status shows the override (40 events, rule controller-creates) in force" || bad "status during the override: $(cat "$W/status-override.json")"
wait_for "the override expired (limit 20 again)" limit_is 20
source_is rule && ok "the override expired by itself: limit_in_force 20, limit_source rule" || bad "after the override: $(scrape a | grep -E 'limit_source' | tr '\n' ' ')"
ogone() { ! k -n churn-throttler get pacingoverride "$oname" >/dev/null 2>&1; }
wait_for "the expired override $oname deleted" ogone

# ---- expiry: the leader deletes an expired object ----------------------------------------
out="$(op pause --all --for 5s --reason "short" --wait-timeout 0s 2>&1)" || die "short pause failed: $out"
name="$(sed -n 's#.*PacingOverride churn-throttler/\([^ ]*\) .*#\1#p' <<<"$out" | head -n1)"
[[ -n "$name" ]] || die "no object name in: $out"
gone() { ! k -n churn-throttler get pacingoverride "$name" >/dev/null 2>&1; }
wait_for "the expired $name deleted" gone
ok "an expired pause ($name, 5 s) deleted by the leader"
metrics="$(scrape a)"
grep -q '^churn_throttler_pacing_overrides_deleted_total 2' <<<"$metrics" \
  && grep -q '^churn_throttler_limit_source{rule="controller-creates",source="rule"} 1' <<<"$metrics" \
  && ok "metrics: pacing_overrides_deleted_total 2 (the override and this pause), limit source back to rule" \
  || bad "metrics after expiry: $(grep -E 'pacing_overrides_deleted|limit_source' <<<"$metrics" | tr '\n' ' ')"

reasons="$(k -n churn-throttler get events.events.k8s.io -o jsonpath='{range .items[*]}{.reason}{"\n"}{end}' | sort | uniq -c | tr -s ' \n' ' ')"
[[ "$reasons" == *" Paused"* && "$reasons" == *" Resumed"* && "$reasons" == *" PauseExpired"* \
   && "$reasons" == *" Overridden"* && "$reasons" == *" OverrideExpired"* ]] \
  && ok "Events on the PacingOverrides (reason count):$reasons" || bad "Events on the PacingOverrides:$reasons"

# ---- the leader killed during a pause: the new leader keeps it ----------------------------
read -r WH_PORT_B < <(_cl_free_ports 1)
KUBECONFIG="$W/releaser.kubeconfig" RUST_LOG="info" \
  "$CHURN_THROTTLER_BIN" serve --config "$W/policy.yaml" \
    --tls-cert "$W/pki/webhook.crt" --tls-key "$W/pki/webhook.key" \
    --listen "127.0.0.1:$WH_PORT_B" --metrics-listen 127.0.0.1:0 \
    --releaser=true --lease-namespace churn-throttler --identity releaser-b \
    --shutdown-delay 0s --drain-timeout 2s --log-format json >>"$W/serve-b.log" 2>&1 &
PROC[serve_b]=$!
wait_for "replica b serving" grep -q '"churn-throttler serving"' "$W/serve-b.log"
e2e_metrics_addr "$W/serve-b.log" >"$W/metrics-b.addr"
out="$(op pause --all --indefinitely --reason "leader handover" 2>&1)" || die "pause --indefinitely failed: $out"
pname="$(sed -n 's#.*PacingOverride churn-throttler/\([^ ]*\) .*#\1#p' <<<"$out" | head -n1)"
[[ -n "$pname" ]] || die "no object name in: $out"
k -n "$NS" scale deployment web --replicas=$((PODS + 5)) >/dev/null
five_gated() { read -r g n < <(pods_gated); (( n == PODS + 5 && g == 5 )); }
wait_for "5 more pods, gated under the pause" five_gated
kill -KILL "${PROC[serve]}"; wait "${PROC[serve]}" 2>/dev/null || true; unset 'PROC[serve]'
t_kill=$(now_ms)
wait_for "releaser-b holds the lease" holder_is releaser-b
t_b=$(now_ms)
sleep 5
read -r g_after n < <(pods_gated)
metrics_b="$(scrape b)"
(( g_after == 5 )) && grep -q '^churn_throttler_rule_paused{rule="controller-creates"} 1' <<<"$metrics_b" \
  && ok "leader killed during the pause: releaser-b took the lease $(secs $((t_b - t_kill))) s later and lifted none of the 5 gated pods in the next 5 s (its rule_paused 1)" \
  || bad "after the handover: $g_after gated (want 5); $(grep rule_paused <<<"$metrics_b" | tr '\n' ' ')"
out="$(op resume --all 2>&1)" || die "resume after the handover failed: $out"
all_65() { read -r g n < <(pods_gated); (( n == PODS + 5 && g == 0 )); }
wait_for "the 5 pods released by releaser-b after resume" all_65
ok "resume after the handover: the 5 pods released by the new leader"

say "suite time $(secs $(($(now_ms) - t0))) s"
e2e_finish
