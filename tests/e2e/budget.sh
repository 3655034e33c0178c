#!/usr/bin/env bash
# End-to-end test of the global budget across webhook replicas (docs/global-budget.md)
# against a real kube-apiserver (tests/e2e/cluster.sh):
#   - three `churn-throttler serve` processes on 127.0.0.1 (a, b, c), each with its own
#     replica Lease, running as ServiceAccount churn-throttler/churn-throttler with only the
#     rights of manifests/base/rbac-releaser.yaml (a token from `kubectl create token`);
#   - examples/review_load.rs sends evictions to /validate, skewed 8:1:1 over a, b, c, at
#     60/s, under a deny rule of 30 per 5 s (so each replica's share is 10, or 15 of two);
#     and ReplicaSet pod creations to /mutate at 10/s (gate rule of 20 per 5 s);
#   - phases: warm-up, three replicas, c leaves (SIGTERM), two replicas, the API server
#     frozen (SIGSTOP) for 25 s (the last count holds, then the fallback), back, c rejoins,
#     three again, and finally every eviction to a alone (the cost of skew);
#   - asserts: evictions admitted in any 5 s window, summed over the replicas, stay
#     within 30 (+1 per joining replica: the warm-up admits 1), and reach at least 80 % of
#     what the shares admit, in every phase; gate-rule pods are admitted ungated only by
#     the releaser's leader, at most 20 per window and at least 10; the load clients
#     end with no dropped request and no crash; the
#     shares switch as designed (fallback within 10-14 s of the freeze, etc.).
# Prints a table per phase: the largest window sum, per replica, and ε.
# Everything listens on 127.0.0.1; every wait is bounded; the API server is resumed and
# everything stopped on exit. Last line: `budget: N passed, M failed`.
#
# Environment: CHURN_THROTTLER_BIN and REVIEW_LOAD_BIN (skip `cargo build`), E2E_BIN
# (cluster binaries), BUDGET_E2E_KEEP=1 (keep the work dir).
# shellcheck disable=SC2015  # `check && ok || bad`: ok() never fails
# shellcheck source-path=SCRIPTDIR  # lib.sh and cluster.sh, from any working directory
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"
e2e_suite budget BUDGET_E2E_KEEP --quiet-down

timeout=120
EVENTS=30
GATE_EVENTS=20
WINDOW_S=5

e2e_die_logs() { e2e_tail_logs 15 'serve-*.log'; }

# ---- build: churn-throttler and the load client --------------------------------------
target_dir="${CARGO_TARGET_DIR:-$root/target}"
if [[ -z "${CHURN_THROTTLER_BIN:-}" || -z "${REVIEW_LOAD_BIN:-}" ]]; then
  (cd "$root" && cargo build --quiet --bin churn-throttler --example review_load) || die "cargo build failed"
  CHURN_THROTTLER_BIN="$target_dir/debug/churn-throttler"
  REVIEW_LOAD_BIN="$target_dir/debug/examples/review_load"
fi
[[ -x "$CHURN_THROTTLER_BIN" && -x "$REVIEW_LOAD_BIN" ]] || die "no binaries at $CHURN_THROTTLER_BIN / $REVIEW_LOAD_BIN"
e2e_cluster_bins

# On exit, before the replicas: the API server resumed if frozen, the monitor stopped.
MONITOR_PID=""
FROZEN=0
e2e_before_cleanup() {
  if [[ "$FROZEN" == 1 ]]; then kill -CONT "$APISERVER_PID" 2>/dev/null; fi
  if [[ -n "$MONITOR_PID" ]]; then stop_proc "$MONITOR_PID"; fi
}
e2e_workdir   # W; PROC's processes stopped on exit

# ---- cluster, namespace, ServiceAccount, RBAC ------------------------------------
cluster_up "$W" 1 >"$W/cluster-up.log" 2>&1 || { cat "$W/cluster-up.log" >&2; die "cluster up failed"; }
# shellcheck disable=SC1091
source "$W/env"
kubectl create namespace churn-throttler >/dev/null
kubectl -n churn-throttler create serviceaccount churn-throttler >/dev/null
kubectl apply -f "$root/manifests/base/rbac-releaser.yaml" >/dev/null
e2e_kubeconfig churn-throttler churn-throttler "$W/sa.kubeconfig"
can() { kubectl --kubeconfig "$W/sa.kubeconfig" auth can-i "$@" 2>/dev/null; }
[[ "$(can list leases -n churn-throttler)" == yes && "$(can update leases -n churn-throttler)" == yes \
   && "$(can delete leases -n churn-throttler)" == no && "$(can list leases -n default)" == no ]] \
  && ok "ServiceAccount may get/list/create/update Leases in churn-throttler only (delete: no, other namespaces: no)" \
  || bad "RBAC for replica Leases is not what manifests/base/rbac-releaser.yaml says"

cluster_issue_serving_cert "$W" webhook >/dev/null
cat >"$W/policy.yaml" <<EOF
timeoutSeconds: 10
rules:
  - name: creates
    match: { resources: [pods], operations: [CREATE], controllerKinds: [ReplicaSet] }
    limit: { events: $GATE_EVENTS, window: ${WINDOW_S}s }
    action: gate
  - name: evictions
    match: { resources: [pods/eviction], operations: [CREATE] }
    limit: { events: $EVENTS, window: ${WINDOW_S}s }
    action: deny
EOF

# start_replica NAME: one `serve` with the budget and the releaser on.
start_replica() {
  local name="$1"
  : >"$W/serve-$name.log"
  # --pod-cache=false: review_load's evictions name pods that do not exist, which the pod
  # cache would allow uncharged (tests/e2e/forged.sh); this suite measures the budget.
  KUBECONFIG="$W/sa.kubeconfig" RUST_LOG="info" \
    "$CHURN_THROTTLER_BIN" serve --config "$W/policy.yaml" --pod-cache=false \
      --tls-cert "$W/pki/webhook.crt" --tls-key "$W/pki/webhook.key" \
      --listen "127.0.0.1:${PORT[$name]}" --metrics-listen "127.0.0.1:${MPORT[$name]}" \
      --replica-budget=true --max-replicas 3 --releaser=true \
      --lease-namespace churn-throttler --identity "budget-$name" \
      --shutdown-delay 0s --log-format json >>"$W/serve-$name.log" 2>&1 &
  PROC[$name]=$!
  wait_for "$name serving" grep -q '"churn-throttler serving"' "$W/serve-$name.log"
}
metric() { # metric NAME SERIES: value or empty
  curl -s --max-time 1 "http://127.0.0.1:${MPORT[$1]}/metrics" 2>/dev/null | awk -v s="$2" '$1==s {print $2}'
}
divisor_is() { [[ "$(metric "$1" churn_throttler_budget_replicas)" == "$2" ]]; }

read -r pa pb pc ma mb mc < <(python3 -c '
import socket
s=[socket.socket() for _ in range(6)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
declare -A PORT=([a]=$pa [b]=$pb [c]=$pc) MPORT=([a]=$ma [b]=$mb [c]=$mc)

# The monitor samples each replica's divisor, fallback flag and releaser leadership (0.5 s).
monitor() {
  while true; do
    local line; line="$(now_ms)"
    for n in a b c; do
      line="$line $n=$(metric $n churn_throttler_budget_replicas || true)/$(metric $n churn_throttler_budget_fallback || true)/$(metric $n churn_throttler_releaser_leader || true)"
    done
    echo "$line" >>"$W/monitor.log"
    sleep 0.5
  done
}

phase() { echo "$1 $(now_ms)" >>"$W/phases"; say "phase $1"; }

# ---- run -----------------------------------------------------------------------
t0=$(now_ms)
for n in a b c; do start_replica $n; done
monitor &
MONITOR_PID=$!
ok "three replicas serving (started in $(( $(now_ms) - t0 )) ms)"
phase warm-up
"$REVIEW_LOAD_BIN" --ca "$CLUSTER_CA_FILE" \
  --target "https://127.0.0.1:$pa/validate=8" --target "https://127.0.0.1:$pb/validate=1" \
  --target "https://127.0.0.1:$pc/validate=1" \
  --fixture "$root/tests/fixtures/pod-eviction.json" --rate 60 --seconds 100 \
  --timeout-seconds 5 --prefix evict --out "$W/evictions.csv" 2>"$W/load-evictions.log" &
LOAD1=$!
"$REVIEW_LOAD_BIN" --ca "$CLUSTER_CA_FILE" \
  --target "https://127.0.0.1:$pa/mutate" --target "https://127.0.0.1:$pb/mutate" \
  --target "https://127.0.0.1:$pc/mutate" \
  --fixture "$root/tests/fixtures/pod-create-replicaset.json" --rate 10 --seconds 100 \
  --timeout-seconds 5 --prefix create --out "$W/creates.csv" 2>"$W/load-creates.log" &
LOAD2=$!
wait_for "a counts 3 replicas after its warm-up" divisor_is a 3
wait_for "b counts 3 replicas" divisor_is b 3
wait_for "c counts 3 replicas" divisor_is c 3
phase three-replicas
sleep 15

phase c-leaves
t_leave=$(now_ms)
stop_proc "${PROC[c]}"; unset 'PROC[c]'
wait_for "a grows to 1/2" divisor_is a 2
t_grow=$(now_ms)
phase two-replicas
sleep 6

phase api-frozen
kill -STOP "$APISERVER_PID"; FROZEN=1
t_freeze=$(now_ms)
wait_for "a falls back" divisor_is a 3
t_fallback=$(now_ms)
phase fallback
rest=$(( 25 - (t_fallback - t_freeze) / 1000 )); (( rest > 0 )) && sleep "$rest"
kill -CONT "$APISERVER_PID"; FROZEN=0
phase api-back
t_back=$(now_ms)
wait_for "a back to 1/2" divisor_is a 2
t_regrow=$(now_ms)
phase two-again
sleep 3

phase c-rejoins
start_replica c
t_join=$(now_ms)
wait_for "a counts c again" divisor_is a 3
t_shrink=$(now_ms)
phase three-again
wait_for "evictions load done" bash -c "! kill -0 $LOAD1 2>/dev/null"
# Requests to c fail while it is down, so the load clients exit 2 (a request failed); the
# report checks that no other request failed. Any other exit code (a crash, an unwritten
# CSV) or a dropped request (not in the CSV, so the report cannot see it) is a failure.
load_done() { # load_done NAME PID LOG
  local rc=0
  wait "$2" || rc=$?
  local summary; summary="$(grep -m1 '^review_load: .* sent in ' "$3" || true)"
  if [[ $rc != 0 && $rc != 2 ]]; then
    bad "$1 load client exited $rc: $(tail -n 3 "$3")"
  elif [[ ! "$summary" =~ \ 0\ dropped ]]; then
    bad "$1 load client dropped requests or printed no summary: ${summary:-$(tail -n 3 "$3")}"
  else
    ok "$1 load client done (exit $rc): ${summary#review_load: }"
  fi
}
load_done evictions "$LOAD1" "$W/load-evictions.log"
load_done creations "$LOAD2" "$W/load-creates.log"
phase all-to-a
sleep 5  # one window without load, so the windows of this phase hold its own admissions
"$REVIEW_LOAD_BIN" --ca "$CLUSTER_CA_FILE" --target "https://127.0.0.1:$pa/validate" \
  --fixture "$root/tests/fixtures/pod-eviction.json" --rate 60 --seconds 15 \
  --timeout-seconds 5 --prefix alone --out "$W/alone.csv" 2>"$W/load-alone.log" \
  && ok "all-to-a load: no request failed" || bad "all-to-a load had errors"
phase end
say "c left: a grew to 1/2 after $(( t_grow - t_leave )) ms (expected: longest window + 2 s = 7 s, + up to a renewal)"
say "API server frozen: a fell back to 1/3 after $(( t_fallback - t_freeze )) ms (expected 8-14 s: a lease period after the last contact, which is up to a renewal before the freeze)"
say "API server back: a returned to 1/2 after $(( t_regrow - t_back )) ms (expected ~7 s: the fallback is held one longest window)"
say "c rejoined: a shrank to 1/3 after $(( t_shrink - t_join )) ms (expected <= 2 s: one renewal)"
# A lease (10 s) after the last contact, which was up to a renewal (2 s) before the freeze.
(( t_fallback - t_freeze >= 7000 && t_fallback - t_freeze <= 16000 )) \
  && ok "fallback a lease period after the last contact" || bad "fallback after $(( t_fallback - t_freeze )) ms"
(( t_grow - t_leave >= 6000 )) && ok "shares grow only after the longest window" || bad "a grew after $(( t_grow - t_leave )) ms"
(( t_shrink - t_join <= 4000 )) && ok "a join shrinks the others' shares within a renewal" || bad "a shrank after $(( t_shrink - t_join )) ms"

# ---- analysis ------------------------------------------------------------------
report_rc=0
python3 "$here/budget_report.py" "$W" "$EVENTS" "$GATE_EVENTS" "$((WINDOW_S * 1000))" >"$W/report.txt" 2>"$W/report.err" || report_rc=$?
cat "$W/report.txt"
(( report_rc == 0 )) || bad "budget_report.py failed (exit $report_rc): $(tail -n 3 "$W/report.err")"
while read -r verdict what; do
  case "$verdict" in
    PASS) ok "$what" ;;
    FAIL) bad "$what" ;;
  esac
done < <(grep -E '^(PASS|FAIL) ' "$W/report.txt")
grep -q '^PASS ' "$W/report.txt" || bad "the report has no PASS verdict"
e2e_finish
