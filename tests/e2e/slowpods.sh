#!/usr/bin/env bash
# End-to-end test: StatefulSet rollouts of SLOW pods under the `partition` action, with
# every replacement's start paced by the gate rule, on a real control plane
# (tests/e2e/cluster.sh: kube-apiserver, controller-manager, scheduler v1.36.5, kwok).
#
#   - slow pods: kwok gets the extra Stages of tests/e2e/kwok-stages/slow
#     (CLUSTER_KWOK_STAGES_EXTRA): a pod labelled e2e.churn-throttler.io/slow=true is
#     deleted 9-11 s after its deletion request (terminationGracePeriodSeconds 30, so its
#     deletionTimestamp lies beyond that) and becomes Ready 18-22 s after its binding;
#     weight 1 beats the fast set's weight 0, so the fast Stages never act on slow pods.
#     Checked on every pod from the API server's audit log (deletion >= 9 s, Ready >= 18 s
#     after binding), and the fast Stages still act on pods without the label (scale row);
#   - the webhook configurations of manifests/overlays/e2e-local, two `serve` replicas as
#     the ServiceAccount churn-throttler/churn-throttler: releaser-b leads (webhook on a
#     port nobody calls), releaser-a follows and serves the webhook. The leader is killed
#     (SIGKILL) a third into the rollout (a third of the chain bound below, during the
#     second wave of steps) and releaser-a must take over: its lease, steps, lifts. (The
#     killed leader is not the webhook: with one URL-registered webhook a dead webhook
#     means failurePolicy Ignore, pods created ungated, which a Service in front of two
#     replicas would not do; partition.sh covers the webhook's restart);
#   - the rollout row: SLOWPODS_E2E_STS StatefulSets x 3 slow pods (OrderedReady) in
#     SLOWPODS_E2E_NAMESPACES namespaces, labelled once Ready, every template changed with
#     one `kubectl apply`, under sts-rollouts (partition) and sts-creates (gate), both 50
#     per 10 s, maxNotReady 200 (the built-in policy's two StatefulSet rules); one
#     StatefulSet x 3 slow pods in an unlabelled namespace changes at the same moment
#     (collateral; its time alone measured first);
#   - checks: at the answers (audit log stageTimestamp) at most 50 StatefulSet-controller
#     pod deletions, 50 gate lifts, 50 bindings (and 50 steps) in any 10 s window, all 300
#     of each found; makespan; `kubectl rollout status` on held and on converged sets;
#     no request of the StatefulSet controller refused, no deny/retry-after decision;
#     collateral at most 1.5 x its idle time; nothing stranded after the failover and no
#     window over 50 around it;
#   - the scale row: the replicas restarted with the built-in policy (no --config: 20 per
#     10 s), a Parallel StatefulSet of 3 fast pods scaled to 60: at most 20 bindings and
#     gate lifts in any 10 s window, all 60 Ready; scaled back to 3: the deletions'
#     duration and fullest window printed (not paced by the built-in policy, by design).
#
# The makespan. With 100 sets x 3 OrderedReady pods the ideal the rate alone gives is
# 60 s of steps + 30 s for the last pod (10 s to stop, 20 s to start): 90 s. But each
# set rolls its 3 pods one after the other, each about 30 s (the releaser steps a set
# again once its previous pod is updated and Ready), and the first steps of the 100
# sets take (100 - 1) / 5 = 19.8 s at 50 per 10 s: with the Stages' mean delays no
# schedule ends before 19.8 + 3 x 30 = 109.8 s (the chain bound), with their shortest
# (9 + 18 s) not before 19.8 + 3 x 27 = 100.8 s (the floor). So 1.15 x 90 s = 103.5 s
# cannot be met, failover or not. The check: floor <= makespan <= 1.15 x the chain
# bound + the measured handover (the lease expiry, while nothing is stepped or
# released); the ratios to 90 s and to the chain bound are printed. See
# docs/partition.md ("Slow pods").
#
# Everything listens on 127.0.0.1; every wait is bounded; everything started is stopped
# on exit; the work dir is kept on failure. Last line: "slowpods: N passed, M failed".
#
# Environment: CHURN_THROTTLER_BIN (skip `cargo build`), E2E_BIN (cluster binaries),
# SLOWPODS_E2E_KEEP=1 (keep the work dir), SLOWPODS_E2E_TIMEOUT (s per ordinary wait, 240),
# SLOWPODS_E2E_ROLLOUT_TIMEOUT (s for the mass rollout, 600), SLOWPODS_E2E_STS (100),
# SLOWPODS_E2E_NAMESPACES (10), SLOWPODS_E2E_LIMIT (50), SLOWPODS_E2E_SCALE_TO (60),
# SLOWPODS_E2E_KILL (1; 0: no failover, for the makespan without it: the failover's
# checks are then skipped), SLOWPODS_E2E_KCM_QPS (200: kube-controller-manager --kube-api-qps, burst twice that; at
# the default 20 the StatefulSet controller's own client limits a 100-set rollout, see
# run.sh's E2E_KCM_QPS).
# shellcheck disable=SC2015  # `check && ok || bad`: ok() never fails
# shellcheck source-path=SCRIPTDIR  # lib.sh and cluster.sh, from any working directory
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"
e2e_suite slowpods SLOWPODS_E2E_KEEP --poll 0.5

timeout="${SLOWPODS_E2E_TIMEOUT:-240}"
ROLLOUT_TIMEOUT="${SLOWPODS_E2E_ROLLOUT_TIMEOUT:-600}"
STS="${SLOWPODS_E2E_STS:-100}"
NAMESPACES="${SLOWPODS_E2E_NAMESPACES:-10}"
LIMIT="${SLOWPODS_E2E_LIMIT:-50}"
SCALE_TO="${SLOWPODS_E2E_SCALE_TO:-60}"
KCM_QPS="${SLOWPODS_E2E_KCM_QPS:-200}"
KILL="${SLOWPODS_E2E_KILL:-1}"
BUILTIN_LIMIT=20          # the built-in policy's statefulset-creates: 20 per 10 s
WINDOW_S=10
REPLICAS=3
STEPS=$((STS * REPLICAS))
STOP_S=10 START_S=20      # the slow Stages' mean delays (kwok-stages/slow)...
STOP_MIN_S=9 START_MIN_S=18  # ...and their shortest
OPTIN=churn-throttler.io/enabled
SA_USER=system:serviceaccount:churn-throttler:churn-throttler
FREE=slow-free            # the unlabelled namespace (collateral)
SCALE_NS=slow-scale
t_script=$(date +%s)

section() { say "==== $* ($(( $(date +%s) - t_script )) s)"; }
e2e_die_logs() { e2e_tail_logs 15 'replica-*.log'; }
py() { python3 "$here/slowpods_report.py" "$@"; }
# awk arithmetic on figures (floats): fcheck 'EXPR' exits 0 when EXPR holds.
fcheck() { awk "BEGIN { exit !($1) }"; }

e2e_build
e2e_workdir   # W; PROC's processes stopped on exit

# ---- cluster: slow Stages, an audit log ------------------------------------------------
section "cluster"
mkdir -p "$W/logs"
cat >"$W/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  # The releaser's patches with their body: partition steps and hold ends on
  # StatefulSets; gate lifts (the gate removed) apart from label drops on pods.
  - level: Request
    users: ["system:serviceaccount:churn-throttler:churn-throttler"]
    resources: [{ group: apps, resources: [statefulsets] }, { group: "", resources: [pods] }]
    verbs: [patch]
  - level: Metadata
    resources: [{ group: "", resources: [pods] }]
    verbs: [create, delete]
  - level: Metadata
    resources: [{ group: "", resources: [pods/binding] }]
    verbs: [create]
  # kwok's status writes: when a pod became Ready.
  - level: Metadata
    users: [kwok-controller]
    resources: [{ group: "", resources: [pods/status] }]
    verbs: [patch, update]
  - level: Metadata
    resources: [{ group: apps, resources: [statefulsets, statefulsets/status, statefulsets/scale] }]
    verbs: [update, patch]
  - level: None
EOF
CLUSTER_KWOK_STAGES_EXTRA="$here/kwok-stages/slow" \
CLUSTER_KUBE_ARGS_KCM="${CLUSTER_KUBE_ARGS_KCM:-} --kube-api-qps=$KCM_QPS --kube-api-burst=$((2 * KCM_QPS))" \
CLUSTER_KUBE_ARGS_APISERVER="${CLUSTER_KUBE_ARGS_APISERVER:-} $(e2e_audit_args)" \
  cluster_up "$W" 3 || die "cluster up failed"
# shellcheck disable=SC1091
source "$W/env"
k() { kubectl --request-timeout=30s "$@"; }
grep -q 'e2e.churn-throttler.io/slow' "$W/kwok-stages.yaml" || die "kwok did not get the slow Stages"

e2e_install_webhook slowpods-e2e

cat >"$W/policy.yaml" <<EOF
# The built-in policy's two StatefulSet rules (statefulset-rollouts, statefulset-creates)
# at $LIMIT per ${WINDOW_S} s.
timeoutSeconds: 10
rules:
  - name: sts-rollouts
    match: { resources: [statefulsets], operations: [UPDATE] }
    limit: { events: $LIMIT, window: ${WINDOW_S}s, scope: global }
    maxNotReady: 200
    action: partition
  - name: sts-creates
    match: { resources: [pods], operations: [CREATE], controllerKinds: [StatefulSet] }
    limit: { events: $LIMIT, window: ${WINDOW_S}s, scope: global }
    maxNotReady: 200
    action: gate
exempt:
  namespaces: [kube-system, kube-public, kube-node-lease, churn-throttler]
  users: [system:serviceaccount:kube-system:namespace-controller, $SA_USER]
EOF
"$CHURN_THROTTLER_BIN" check-config "$W/policy.yaml" >"$W/check-config.out" 2>&1 \
  && ok "the policy passes check-config ($(tr '\n' ' ' <"$W/check-config.out" | cut -c1-120))" \
  || die "the policy does not pass check-config: $(cat "$W/check-config.out")"

# start_replica NAME IDENTITY LISTEN [serve args...]: one `serve` process (webhook + releaser).
start_replica() {
  local name="$1" identity="$2" listen="$3"; shift 3
  KUBECONFIG="$W/releaser.kubeconfig" RUST_LOG="info,churn_throttler::releaser=debug" \
    "$CHURN_THROTTLER_BIN" serve "$@" \
      --tls-cert "$W/pki/webhook.crt" --tls-key "$W/pki/webhook.key" \
      --listen "$listen" --metrics-listen 127.0.0.1:0 \
      --releaser=true --lease-namespace churn-throttler --identity "$identity" \
      --shutdown-delay 0s --drain-timeout 3s --log-format json >>"$W/replica-$name.log" 2>&1 &
  PROC[$name]=$!
  local start=$SECONDS
  until grep -q '"churn-throttler serving"' "$W/replica-$name.log" 2>/dev/null; do
    kill -0 "${PROC[$name]}" 2>/dev/null || die "replica $name exited at start: $(tail -n 3 "$W/replica-$name.log")"
    (( SECONDS - start < timeout )) || die "timed out after ${timeout}s waiting for replica $name to serve"
    sleep 0.2
  done
  e2e_metrics_addr "$W/replica-$name.log" >"$W/metrics-$name.addr"
}
# decisions ACTION NAME...: decisions with this action in these replicas' last /metrics.
decisions() {
  local action="$1" name; shift
  for name in "$@"; do cat "$W/metrics-$name.last" 2>/dev/null; done \
    | awk -v a="action=\"$action\"" '$1 ~ /^churn_throttler_decisions_total/ && index($1, a) {s += $2} END {print s + 0}'
}

start_replica b releaser-b "127.0.0.1:0" --config "$W/policy.yaml"
wait_for "releaser-b holds the lease" holder_is releaser-b
start_replica a releaser-a "127.0.0.1:$WH_PORT" --config "$W/policy.yaml"
ok "releaser-b leads; releaser-a follows and serves the webhook on 127.0.0.1:$WH_PORT"

# ---- workloads ------------------------------------------------------------------------
section "workloads"
sts_yaml() { # sts_yaml NAMESPACE NAME REVISION
  cat <<EOF
---
apiVersion: apps/v1
kind: StatefulSet
metadata: { name: $2, namespace: $1, labels: { e2e: slowpods } }
spec:
  replicas: $REPLICAS
  serviceName: $2
  podManagementPolicy: OrderedReady
  updateStrategy: { type: RollingUpdate }
  selector: { matchLabels: { app: $2 } }
  template:
    metadata:
      labels: { app: $2, e2e: slowpods, e2e.churn-throttler.io/slow: "true" }
      annotations: { e2e-revision: "$3" }
    spec:
      terminationGracePeriodSeconds: 30
      containers: [{ name: app, image: e2e.invalid/app:1 }]
EOF
}
PACED=()
for n in $(seq 0 $((NAMESPACES - 1))); do PACED+=("$(printf 'slow-%02d' "$n")"); done
PER_NS=$(( (STS + NAMESPACES - 1) / NAMESPACES ))
all_yaml() { # all_yaml REVISION: the collateral set first, so its clock starts with the change
  local i n=0 ns
  sts_yaml "$FREE" db-0 "$1"
  for i in $(seq 0 $((PER_NS - 1))); do
    for ns in "${PACED[@]}"; do
      (( n < STS )) || break
      sts_yaml "$ns" "db-$i" "$1"; n=$((n + 1))
    done
  done
}
for ns in "${PACED[@]}" "$FREE" "$SCALE_NS"; do k create namespace "$ns" >/dev/null; done
for ns in "${PACED[@]}" "$FREE" "$SCALE_NS"; do wait_for "ServiceAccount $ns/default" k -n "$ns" get serviceaccount default; done
all_yaml 1 >"$W/sts-1.yaml"
cat >"$W/scale.yaml" <<EOF
apiVersion: apps/v1
kind: StatefulSet
metadata: { name: scale, namespace: $SCALE_NS, labels: { e2e: scale } }
spec:
  replicas: $REPLICAS
  serviceName: scale
  podManagementPolicy: Parallel
  selector: { matchLabels: { app: scale } }
  template:
    metadata: { labels: { app: scale, e2e: scale } }
    spec:
      terminationGracePeriodSeconds: 30
      containers: [{ name: app, image: e2e.invalid/app:1 }]
EOF
t0=$(now_ms)
k apply -f "$W/sts-1.yaml" >/dev/null
k apply -f "$W/scale.yaml" >/dev/null
sts_json() { k get sts -A -l e2e=slowpods -o json; }
all_ready() {
  sts_json | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
sys.exit(0 if len(items) == int(sys.argv[1]) and all(s.get("status", {}).get("readyReplicas", 0) == 3 for s in items) else 1)' "$((STS + 1))"
}
timeout_saved=$timeout; timeout=$(( timeout > 300 ? timeout : 300 ))
wait_for "$((STS + 1)) StatefulSets x $REPLICAS slow pods Ready (OrderedReady: about 3 x ${START_S} s)" all_ready
timeout=$timeout_saved
say "$((STS + 1)) StatefulSets x $REPLICAS slow pods Ready after $(secs $(( $(now_ms) - t0 ))) s (not paced: no namespace is labelled yet)"

# ---- the collateral set alone: its idle time, and the slow Stages at work ------------------
section "baseline: the unlabelled StatefulSet alone"
state() { sts_json | py status --free-namespace "$FREE"; }
free_converged() { [[ "$(state)" == *" free=1 "* ]]; }
sts_yaml "$FREE" db-0 1b >"$W/free-1b.yaml"
t_base=$(now_ms)
k apply -f "$W/free-1b.yaml" >/dev/null
sleep 1
wait_for "the unlabelled StatefulSet rolled out alone" free_converged
baseline_ms=$(( $(now_ms) - t_base ))
say "baseline: the unlabelled StatefulSet (3 slow pods) rolls out alone in $(secs "$baseline_ms") s"
py audit --audit "$W/logs/audit.log" --namespaces "$FREE" --since "$t_base" --releaser-user "$SA_USER" >"$W/baseline.out"
base="$(sed -n 's/^RESULT //p' "$W/baseline.out")"
bget() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]); [v := (v or {}).get(k) for k in sys.argv[2].split(".")]; print(json.dumps(v) if isinstance(v,(dict,list)) else v)' "$base" "$1"; }
say "slow Stages, the unlabelled set alone: deletion (controller's DELETE -> kwok's final DELETE) $(bget deletion_ms) ms; Ready after binding $(bget ready_after_bind_ms) ms"
[[ "$(bget deletion_ms.n)" == 3 ]] && fcheck "$(bget deletion_ms.min) >= 9000 && $(bget deletion_ms.max) <= 14000" \
  && ok "slow Stage: each of the 3 old pods took $(bget deletion_ms.min)..$(bget deletion_ms.max) ms to be deleted (9-11 s + kwok's lag, at most 14 s)" \
  || bad "slow deletion: $(bget deletion_ms)"
[[ "$(bget ready_after_bind_ms.n)" == 3 ]] && fcheck "$(bget ready_after_bind_ms.min) >= 18000 && $(bget ready_after_bind_ms.max) <= 25000" \
  && ok "slow Stage: each of the 3 new pods became Ready $(bget ready_after_bind_ms.min)..$(bget ready_after_bind_ms.max) ms after its binding (18-22 s + kwok's lag, at most 25 s)" \
  || bad "slow Ready: $(bget ready_after_bind_ms)"

for ns in "${PACED[@]}" "$SCALE_NS"; do k label namespace "$ns" "$OPTIN=true" >/dev/null; done

# ---- every template at once ------------------------------------------------------------
section "the slow rollout: $STS x $REPLICAS pods, $LIMIT per ${WINDOW_S} s"
# The StatefulSets as the API server stores them (a watch, from their current state on):
# each one's generation and partition, to see every labelled rollout held.
mkfifo "$W/sts.fifo"
python3 "$here/status_report.py" record "$W/sts-watch.log" <"$W/sts.fifo" &
PROC[sts_recorder]=$!
kubectl get sts -A -l e2e=slowpods --watch --output-watch-events \
  -o go-template='{{.type}} {{.object.metadata.namespace}} {{.object.metadata.name}} {{.object.metadata.generation}} {{with .object.spec.updateStrategy.rollingUpdate}}{{if .partition}}{{.partition}}{{else}}0{{end}}{{else}}0{{end}} {{.object.spec.replicas}}{{"\n"}}' \
  >"$W/sts.fifo" 2>"$W/logs/sts-watch.err" &
PROC[sts_watch]=$!
sts_watch_has() { (( $(grep -c " $FREE " "$W/sts-watch.log" 2>/dev/null || true) >= 1 && $(wc -l <"$W/sts-watch.log") >= STS + 1 )); }
wait_for "the StatefulSet watch listed the sets" sts_watch_has
all_yaml 2 >"$W/sts-2.yaml"
t_change=$(now_ms)
k apply -f "$W/sts-2.yaml" >/dev/null 2>"$W/apply-2.err"
say "changed $((STS + 1)) templates with one kubectl apply in $(( $(now_ms) - t_change )) ms; kubectl printed (once: it folds repeated warnings): $(grep -m1 '^Warning' "$W/apply-2.err" || true)"
keep_scrape a
# Judged after the rollout from the StatefulSet watch; the metrics are the cross-check.
partition_decisions="$(decisions partition a)"

# kubectl rollout status on a sample of held sets (docs/partition.md: it does not wait).
SAMPLE=()
for ns in "${PACED[@]:0:5}"; do SAMPLE+=("$ns/db-$((PER_NS - 1))"); done
sts_json | python3 -c '
import json, sys
for s in json.load(sys.stdin)["items"]:
    ru = (s["spec"].get("updateStrategy") or {}).get("rollingUpdate") or {}
    print(s["metadata"]["namespace"] + "/" + s["metadata"]["name"], ru.get("partition", 0))' >"$W/rollout-held.partitions"
sample_pids=()
for s in "${SAMPLE[@]}"; do
  ( rc=0; kubectl -n "${s%/*}" rollout status "sts/${s#*/}" --timeout=5s >"$W/rollout-held-${s/\//_}.out" 2>&1 || rc=$?
    echo "$rc" >"$W/rollout-held-${s/\//_}.rc" ) &
  sample_pids+=($!)
done
wait "${sample_pids[@]}"
sts_json | py held "${SAMPLE[@]}" >"$W/rollout-held.state"
said_complete=0
for s in "${SAMPLE[@]}"; do
  f="$W/rollout-held-${s/\//_}"
  say "kubectl rollout status sts/${s#*/} -n ${s%/*} --timeout=5s while held (partition $(awk -v k="$s" '$1 == k {print $2}' "$W/rollout-held.partitions") before it, hold still on after it: $(awk -v k="$s" '$1 == k {print $2}' "$W/rollout-held.state")): exit $(cat "$f.rc"), \"$(paste -sd'|' "$f.out")\""
  grep -q 'complete' "$f.out" && said_complete=$((said_complete + 1))
done
say "kubectl rollout status said complete for $said_complete of ${#SAMPLE[@]} sets still held (a figure: it counts a partitioned rollout done once the pods above the partition are updated)"

steps_done() { cat "$W"/replica-*.log | grep -c '"releaser: partition stepped"' || true; }
# The slowest set rolls its 3 pods one after the other, each at least STOP_S + START_S,
# after the first steps of all sets at the rate: no schedule ends before this (see the header).
chain_ms=$(( (STS - 1) * WINDOW_S * 1000 / LIMIT + REPLICAS * (STOP_S + START_S) * 1000 ))
kill_at_ms=$(( chain_ms / 3 ))
t_kill=0 handover_ms=0 collateral_ms=0 t_done=0 last_state=""
deadline=$(( $(now_ms) + ROLLOUT_TIMEOUT * 1000 ))
while true; do
  now=$(now_ms)
  (( now < deadline )) || die "the rollout did not converge within ${ROLLOUT_TIMEOUT}s (last: $last_state)"
  last_state="$(state || true)"
  if (( collateral_ms == 0 )) && [[ "$last_state" == *" free=1 "* ]]; then
    collateral_ms=$(( now - t_change ))
    say "collateral: the unlabelled StatefulSet rolled out $(secs "$collateral_ms") s after the change"
  fi
  if (( KILL == 1 && t_kill == 0 && now - t_change >= kill_at_ms )); then
    keep_scrape b
    t_kill=$(now_ms)
    # shellcheck disable=SC2031  # "b" is a key of the associative array PROC, not cluster.sh's loop variable
    lead_pid="${PROC[b]}"
    kill -KILL "$lead_pid"; wait "$lead_pid" 2>/dev/null || true; unset 'PROC[b]'
    say "killed the leader releaser-b (SIGKILL) $(secs $(( t_kill - t_change ))) s after the change (a third of the chain bound), after $(steps_done) of $STEPS steps: $last_state"
    wait_for "releaser-a takes the lease" holder_is releaser-a
    handover_ms=$(( $(now_ms) - t_kill ))
    say "failover: releaser-a holds the lease $(secs "$handover_ms") s after the SIGKILL"
    continue
  fi
  if [[ "$last_state" == "converged=$STS held=0 free=1 sets=$STS" ]] && (( t_kill > 0 || KILL == 0 )); then
    t_done=$now
    break
  fi
  sleep 1
done
makespan_ms=$(( t_done - t_change ))
say "every StatefulSet converged $(secs "$makespan_ms") s after the change (polled every second)"
if (( KILL == 1 )); then
  numeric "handover_ms > 0 && handover_ms <= 15000" && ok "failover: releaser-a took the lease within 15 s ($(secs "$handover_ms") s)" \
    || bad "handover: $handover_ms ms"
  a_steps=$(grep -c '"releaser: partition stepped"' "$W/replica-a.log" || true)
  a_lifts=$(grep -c '"releaser: released"' "$W/replica-a.log" || true)
  numeric "a_steps >= 1 && a_lifts >= 1" \
    && ok "releaser-a took over the work: $a_steps partition steps and $a_lifts gate lifts after the failover (its log)" \
    || bad "releaser-a after the failover: $a_steps steps, $a_lifts lifts"
else
  say "SLOWPODS_E2E_KILL=0: no failover"
  keep_scrape b
fi
records_gone() { sts_json | py records-gone; }
t_rec=$(now_ms)
wait_for "the step records gone too (a window after the last step)" records_gone
say "step records (paced-by, partition-stepped-at) gone $(secs $(( $(now_ms) - t_rec ))) s after convergence"

# after convergence: kubectl rollout status returns 0 for every set
sts_json | python3 -c 'import json,sys; [print(s["metadata"]["namespace"], s["metadata"]["name"]) for s in json.load(sys.stdin)["items"]]' >"$W/sets.txt"
rs_fail=0
while read -r ns name; do
  kubectl -n "$ns" rollout status "sts/$name" --timeout=5s >>"$W/rollout-final.out" 2>&1 || { rs_fail=$((rs_fail + 1)); echo "FAILED $ns/$name" >>"$W/rollout-final.out"; }
done <"$W/sets.txt"
n_sets=$(wc -l <"$W/sets.txt")
numeric "n_sets == STS + 1 && rs_fail == 0" \
  && ok "after convergence kubectl rollout status --timeout=5s returns 0 for all $n_sets sets (\"$(grep -m1 . "$W/rollout-final.out")\")" \
  || bad "kubectl rollout status after convergence: $rs_fail of $n_sets failed ($(grep -m1 FAILED "$W/rollout-final.out" || true))"

# nothing stranded: no pod left behind churn-throttler's gate
k get pods -A -l e2e=slowpods -o json >"$W/pods-final.json"
py pods --namespaces "$(IFS=,; echo "${PACED[*]}")" <"$W/pods-final.json" >"$W/pods-final.summary"
pods_summary="$(cat "$W/pods-final.summary")"
pget() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$pods_summary" "$1"; }
numeric "$(pget pods) == STEPS && $(pget gated) == 0 && $(pget labelled_gated) == 0" \
  && ok "nothing stranded at the end (after the failover, if any): $(pget pods) pods, none gated, every set converged" \
  || bad "stranded: $pods_summary"
keep_scrape a

# ---- checks from the audit log and the StatefulSet watch ---------------------------------
section "the rollout's audit log"
stop_proc "${PROC[sts_watch]}"; unset 'PROC[sts_watch]'
sleep 0.5
stop_proc "${PROC[sts_recorder]}"; unset 'PROC[sts_recorder]'
held="$(python3 "$here/partition_report.py" held-history "$W/sts-watch.log" --t-change "$t_change" \
  --held-namespaces "$(IFS=,; echo "${PACED[*]}")" --free-namespace "$FREE")"
hget() { python3 -c 'import json,sys; v=json.loads(sys.argv[1])[sys.argv[2]]; print(json.dumps(v) if isinstance(v,(dict,list)) else v)' "$held" "$1"; }
numeric "$(hget held_by_watch) == STS && partition_decisions == STS" && [[ "$(hget not_held_by_watch)" == "[]" && "$(hget partition_rises)" == "[]" && "$(hget free_first_new)" == "[\"$FREE/db-0 partition=0\"]" ]] \
  && ok "every labelled rollout held (StatefulSet watch: the new template of each of the $STS sets stored with partition = replicas, then never raised; $FREE's stored with 0), as many as the webhook's partition decisions ($partition_decisions)" \
  || bad "held by the watch: $(hget held_by_watch) of $STS, not held: $(hget not_held_by_watch), raised: $(hget partition_rises), $FREE: $(hget free_first_new); partition decisions in the metrics: $partition_decisions"
t_end_rollout=$(now_ms)
py audit --audit "$W/logs/audit.log" --namespaces "$(IFS=,; echo "${PACED[*]}")" --since "$t_change" --until "$t_end_rollout" \
  --t-kill "$t_kill" --window-ms $((WINDOW_S * 1000)) --releaser-user "$SA_USER" >"$W/rollout.out"
result="$(sed -n 's/^RESULT //p' "$W/rollout.out")"
get() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]); [v := (v or {}).get(k) for k in sys.argv[2].split(".")]; print(json.dumps(v) if isinstance(v,(dict,list)) else v)' "$result" "$1"; }
say "steps per ${WINDOW_S} s window from the change: $(get steps_per_window); deletions: $(get deletes_per_window); lifts: $(get lifts_per_window); bindings: $(get binds_per_window)"
say "StatefulSet patches of the releaser by HTTP code: $(get releaser_sts_patch_codes); holds ended (target removed): $(get hold_ends), the last $(get last_hold_end_s) s after the change; last pod Ready $(get last_ready_s) s"
say "creation -> binding (gate wait): $(get create_to_bind_ms) ms"
for what in deletes lifts binds steps; do
  n=$(get "$what"); worst=$(get "worst_$what"); lo=$STEPS hi=$STEPS
  case $what in
    deletes) desc="pod deletions by the StatefulSet controller, one per pod" ;;
    # the rest were admitted at once by the leader's webhook (counted below)
    lifts) desc="gate lifts (the releaser's pod patches removing the gate)"; lo=1 ;;
    binds) desc="bindings (pods/binding by the scheduler), one per pod" ;;
    steps) desc="partition steps (the releaser's StatefulSet patches), one per pod" ;;
  esac
  numeric "n >= lo && n <= hi && worst <= LIMIT" \
    && ok "audit log, at the answers: $n $desc, at most $LIMIT in any ${WINDOW_S} s window: worst $worst at $(get "worst_${what}_at_s") s (per 1 s: $(get "worst_${what}_1s"))" \
    || bad "audit log: $n $desc (want $lo..$hi), worst ${WINDOW_S} s window $worst at $(get "worst_${what}_at_s") s"
done
numeric "$(pget released_at) == STEPS && $(get lifts) + $(pget admitted_by) == STEPS" \
  && ok "every start went through the gate rule: $(pget released_at) pods with released-at = $(get lifts) lifted + $(pget admitted_by) admitted at once by the leader's webhook" \
  || bad "starts: released-at on $(pget released_at) pods, $(get lifts) lifts + $(pget admitted_by) admitted at once, for $STEPS"
say "kwok's slow Stages over the rollout: deletion $(get deletion_ms) ms; Ready after binding $(get ready_after_bind_ms) ms"
[[ "$(get deletion_ms.n)" == "$STEPS" ]] && fcheck "$(get deletion_ms.min) >= 9000 && $(get deletion_ms.max) <= 20000" \
  && ok "every old pod took $(get deletion_ms.min)..$(get deletion_ms.max) ms to be deleted (>= 9 s: no fast Stage acted on a slow pod)" \
  || bad "deletions: $(get deletion_ms)"
[[ "$(get ready_after_bind_ms.n)" == "$STEPS" ]] && fcheck "$(get ready_after_bind_ms.min) >= 18000 && $(get ready_after_bind_ms.max) <= 30000" \
  && ok "every new pod became Ready $(get ready_after_bind_ms.min)..$(get ready_after_bind_ms.max) ms after its binding (>= 18 s)" \
  || bad "Ready after binding: $(get ready_after_bind_ms)"
[[ "$(get refused)" == "[]" ]] && ok "no request of the StatefulSet controller refused (no 4xx but 404/409 in the audit log)" \
  || bad "refused: $(get refused)"
n_429="$(python3 -c 'import json, sys; print(len(json.loads(sys.argv[1])))' "$(get answers_429)")"
numeric "n_429 == 0 && $(decisions deny a b) == 0 && $(decisions retry-after a b) == 0" \
  && ok "no deny or retry-after: no request in the labelled namespaces answered 429 (audit log), and none decided in either replica's /metrics (partition $(decisions partition a b), gate $(decisions gate a b), allow $(decisions allow a b))" \
  || bad "answered 429 (audit log): $n_429 $(get answers_429); decisions: deny $(decisions deny a b), retry-after $(decisions retry-after a b)"
if (( KILL == 1 )); then
  around="$(get worst_deletes_around_kill) $(get worst_lifts_around_kill) $(get worst_binds_around_kill) $(get worst_steps_around_kill)"
  say "around the kill ($(secs $(( t_kill - t_change ))) s): first step $(get first_steps_after_kill_s) s after it, first lift $(get first_lifts_after_kill_s) s, first binding $(get first_binds_after_kill_s) s"
  read -r a1 a2 a3 a4 <<<"$around"
  numeric "a1 <= LIMIT && a2 <= LIMIT && a3 <= LIMIT && a4 <= LIMIT" \
    && ok "no ${WINDOW_S} s window over $LIMIT within 30 s of the kill (deletions $a1, lifts $a2, bindings $a3, steps $a4)" \
    || bad "around the kill: deletions $a1, lifts $a2, bindings $a3, steps $a4"
fi

# collateral
numeric "collateral_ms > 0" && fcheck "$collateral_ms <= 1.5 * $baseline_ms" \
  && ok "collateral: the unlabelled StatefulSet rolled out in $(secs "$collateral_ms") s during the mass rollout, $(awk "BEGIN{printf \"%.2f\", $collateral_ms / $baseline_ms}") x its $(secs "$baseline_ms") s alone (at most 1.5 x)" \
  || bad "collateral: $collateral_ms ms against $baseline_ms ms alone"

# makespan
ideal_rate_ms=$(( STEPS * WINDOW_S * 1000 / LIMIT + (STOP_S + START_S) * 1000 ))
bound_ms=$(( chain_ms * 115 / 100 + handover_ms ))
floor_ms=$(( (STS - 1) * WINDOW_S * 1000 / LIMIT + REPLICAS * (STOP_MIN_S + START_MIN_S) * 1000 ))
say "makespan $(secs "$makespan_ms") s: $(awk "BEGIN{printf \"%.3f\", $makespan_ms / $ideal_rate_ms}") x the rate's ideal $(secs "$ideal_rate_ms") s (1.15 x = $(secs $(( ideal_rate_ms * 115 / 100 ))) s, not reachable: see the header); $(awk "BEGIN{printf \"%.3f\", $makespan_ms / $chain_ms}") x the per-set chain bound $(secs "$chain_ms") s; handover $(secs "$handover_ms") s"
numeric "makespan_ms <= bound_ms && makespan_ms >= floor_ms" \
  && ok "makespan $(secs "$makespan_ms") s within [floor $(secs "$floor_ms") s, 1.15 x the chain bound + the handover = $(secs "$bound_ms") s]" \
  || bad "makespan $(secs "$makespan_ms") s outside [$(secs "$floor_ms"), $(secs "$bound_ms")] s"

# ---- the scale row: the built-in policy ----------------------------------------------
section "scale: the built-in policy, a Parallel StatefulSet 3 -> $SCALE_TO -> 3"
for name in a b; do
  if [[ -n "${PROC[$name]:-}" ]]; then stop_proc "${PROC[$name]}"; unset "PROC[$name]"; fi
done
start_replica c releaser-c "127.0.0.1:$WH_PORT"
wait_for "releaser-c holds the lease" holder_is releaser-c
"$CHURN_THROTTLER_BIN" default-policy | grep -q 'name: statefulset-creates' || die "the built-in policy has no statefulset-creates rule"
scale_json() { k -n "$SCALE_NS" get sts scale -o json; }
ready_n() { scale_json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s.get("status",{}).get("readyReplicas",0))'; }
pods_n() { k -n "$SCALE_NS" get pods -l app=scale -o name | wc -l; }
scaled_up() { [[ "$(ready_n)" == "$SCALE_TO" ]]; }
scaled_down() { [[ "$(pods_n)" == "$REPLICAS" && "$(ready_n)" == "$REPLICAS" ]]; }
t_up=$(now_ms)
k -n "$SCALE_NS" scale sts scale --replicas="$SCALE_TO" >/dev/null
wait_for "$SCALE_TO pods Ready" scaled_up
up_ms=$(( $(now_ms) - t_up ))
sleep 1
t_down=$(now_ms)
k -n "$SCALE_NS" scale sts scale --replicas="$REPLICAS" >/dev/null
wait_for "back to $REPLICAS pods" scaled_down
down_ms=$(( $(now_ms) - t_down ))
sleep 1
keep_scrape c
py audit --audit "$W/logs/audit.log" --namespaces "$SCALE_NS" --since "$t_up" --until "$t_down" \
  --window-ms $((WINDOW_S * 1000)) --releaser-user "$SA_USER" >"$W/scale-up.out"
up="$(sed -n 's/^RESULT //p' "$W/scale-up.out")"
py audit --audit "$W/logs/audit.log" --namespaces "$SCALE_NS" --since "$t_down" \
  --window-ms $((WINDOW_S * 1000)) --releaser-user "$SA_USER" >"$W/scale-down.out"
down="$(sed -n 's/^RESULT //p' "$W/scale-down.out")"
uget() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]); [v := (v or {}).get(k) for k in sys.argv[2].split(".")]; print(json.dumps(v) if isinstance(v,(dict,list)) else v)' "$up" "$1"; }
dget() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]); [v := (v or {}).get(k) for k in sys.argv[2].split(".")]; print(json.dumps(v) if isinstance(v,(dict,list)) else v)' "$down" "$1"; }
new=$(( SCALE_TO - REPLICAS ))
say "scale up: all $SCALE_TO Ready $(secs "$up_ms") s after kubectl scale; bindings per ${WINDOW_S} s window: $(uget binds_per_window), lifts: $(uget lifts_per_window)"
numeric "$(uget binds) == new && $(uget worst_binds) <= BUILTIN_LIMIT" \
  && ok "scale up: $(uget binds) bindings for $new new pods, at most $BUILTIN_LIMIT in any ${WINDOW_S} s window at their answers (worst $(uget worst_binds))" \
  || bad "scale up: $(uget binds) bindings for $new pods, worst window $(uget worst_binds)"
numeric "$(uget lifts) >= 1 && $(uget lifts) <= new && $(uget worst_lifts) <= BUILTIN_LIMIT" \
  && ok "scale up: $(uget lifts) gate lifts, at most $BUILTIN_LIMIT in any ${WINDOW_S} s window (worst $(uget worst_lifts))" \
  || bad "scale up: $(uget lifts) lifts, worst window $(uget worst_lifts)"
[[ "$(uget ready_after_bind_ms.n)" == "$new" ]] && fcheck "$(uget ready_after_bind_ms.max) <= 3000" \
  && ok "pods without the slow label keep kwok's fast Stages: Ready $(uget ready_after_bind_ms.min)..$(uget ready_after_bind_ms.max) ms after binding" \
  || bad "fast pods' Ready after binding: $(uget ready_after_bind_ms)"
numeric "$(decisions deny c) == 0 && $(decisions retry-after c) == 0" \
  && ok "scale: no deny or retry-after decision (gate $(decisions gate c), allow $(decisions allow c))" \
  || bad "scale decisions: deny $(decisions deny c), retry-after $(decisions retry-after c)"
say "scale down to $REPLICAS: done $(secs "$down_ms") s after kubectl scale; $(dget deletes) deletions by the StatefulSet controller between $(dget deletes_first_s) and $(dget deletes_last_s) s, at most $(dget worst_deletes) in a ${WINDOW_S} s window (not paced by the built-in policy, by design: a figure)"

say "script time $(( $(date +%s) - t_script )) s; logs and audit: $W (kept with SLOWPODS_E2E_KEEP=1)"
e2e_finish
