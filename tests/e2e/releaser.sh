#!/usr/bin/env bash
# End-to-end test of the gate releaser against a real kube-apiserver (tests/e2e/cluster.sh):
#   - the releaser runs as ServiceAccount churn-throttler/churn-throttler with only the
#     rights of manifests/base/rbac-releaser.yaml (a token from `kubectl create token`);
#   - 45 pods in 3 namespaces are created already gated (as the webhook would leave
#     them), under a rule of 5 per 10 s; 3 of them carry a second, foreign gate;
#   - two replicas run; the leader is killed (SIGKILL) mid-queue and the handover time
#     is measured; later the new leader is killed and restarted at once (same identity),
#     which must not open a burst (windows seeded from released-at);
#   - one pod is un-gated by hand (docs/releaser.md): it must be marked released;
#   - then the API server is frozen (SIGSTOP) for 12 s: the leader must stop, and the
#     releasers must recover by themselves once it answers again;
#   - finally the leader is stopped cleanly (SIGTERM): it gives the lease up at once;
#   - asserts, from the API server's audit log (a release is an accepted pod patch that
#     removes a scheduling gate, at its answer): every pod released exactly once (one
#     such patch per pod), never more than 5 in any 10 s window, exact, across the
#     failover, the restart and the freeze (the seconds after `kill -CONT` included),
#     releases of different processes never interleave (each process has its own token,
#     told apart by the audit log's credential ID); and foreign gates kept, the leader
#     gauges never sum above 1, handover within 15 s, Events aggregated.
# Prints the release times. Everything listens on 127.0.0.1; every wait is bounded.
#
# Environment: CHURN_THROTTLER_BIN (skip `cargo build`), E2E_BIN (cluster binaries),
# RELEASER_E2E_KEEP=1 (keep the work dir), RELEASER_E2E_TIMEOUT (s per wait, default 240).
# shellcheck disable=SC2015  # `check && ok || bad`: ok() never fails
# shellcheck source-path=SCRIPTDIR  # lib.sh and cluster.sh, from any working directory
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"
e2e_suite releaser-e2e RELEASER_E2E_KEEP

timeout="${RELEASER_E2E_TIMEOUT:-240}"
RULE_EVENTS=5
RULE_WINDOW_MS=10000
NAMESPACES=(team-a team-b team-c)
PER_NS=15
TOTAL=$(( ${#NAMESPACES[@]} * PER_NS ))

e2e_die_logs() { e2e_tail_logs 20 'releaser-*.log'; }
# On exit, before the replicas: the API server resumed if frozen, the monitor stopped.
MONITOR_PID=""
OUTAGE=0
e2e_before_cleanup() {
  if [[ "$OUTAGE" == 1 ]]; then kill -CONT "$APISERVER_PID" 2>/dev/null; fi
  if [[ -n "$MONITOR_PID" ]]; then stop_proc "$MONITOR_PID"; fi
}

e2e_build
e2e_workdir   # W; PROC's processes stopped on exit

# ---- cluster with an audit log, namespace, ServiceAccount, RBAC ---------------------
# Every pod patch with its body: which ones remove a gate (releases), whose token sent it.
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
kubectl create namespace churn-throttler >/dev/null
kubectl -n churn-throttler create serviceaccount churn-throttler >/dev/null
kubectl apply -f "$root/manifests/base/rbac-releaser.yaml" >/dev/null
for ns in "${NAMESPACES[@]}"; do kubectl create namespace "$ns" >/dev/null; done
wait_for "ServiceAccounts in the test namespaces" kubectl -n team-c get serviceaccount default
# releaser_kubeconfig NAME: a kubeconfig with a token of its own for process NAME, whose
# ID (jti) goes to $W/token-NAME.jti: the audit log names it in every request it sends.
releaser_kubeconfig() {
  e2e_kubeconfig churn-throttler churn-throttler "$W/releaser-$1.kubeconfig"
  awk '$1 == "token:" { print $2 }' "$W/releaser-$1.kubeconfig" | python3 -c 'import base64, json, sys; p = sys.stdin.read().split(".")[1]; print(json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))["jti"])' \
    >"$W/token-$1.jti"
}
releaser_kubeconfig check
can() { kubectl --kubeconfig "$W/releaser-check.kubeconfig" auth can-i "$@" 2>/dev/null; }
[[ "$(can patch pods -A)" == yes && "$(can delete pods -A)" == no && "$(can create leases -n churn-throttler)" == yes \
   && "$(can update leases -n default)" == no && "$(can get secrets -n churn-throttler)" == no ]] \
  && ok "ServiceAccount token has the releaser's rights and no more (patch pods: yes, delete pods: no, leases elsewhere: no, secrets: no)" \
  || bad "RBAC of the ServiceAccount is not what manifests/base/rbac-releaser.yaml says"

cluster_issue_serving_cert "$W" webhook >/dev/null
cat >"$W/policy.yaml" <<EOF
timeoutSeconds: 10
rules:
  - name: paced
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: $RULE_EVENTS, window: $((RULE_WINDOW_MS / 1000))s, scope: global }
    maxNotReady: 10
    action: gate
EOF

# start_releaser PROCNAME IDENTITY: one `serve` process running the releaser.
start_releaser() {
  local name="$1" identity="$2"
  releaser_kubeconfig "$name"
  KUBECONFIG="$W/releaser-$name.kubeconfig" RUST_LOG="info,churn_throttler::releaser=debug" \
    "$CHURN_THROTTLER_BIN" serve --config "$W/policy.yaml" \
      --tls-cert "$W/pki/webhook.crt" --tls-key "$W/pki/webhook.key" \
      --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
      --releaser=true --lease-namespace churn-throttler --identity "$identity" \
      --shutdown-delay 0s --log-format json >"$W/releaser-$name.log" 2>&1 &
  PROC[$name]=$!
  wait_for "$name serving" grep -q '"churn-throttler serving"' "$W/releaser-$name.log"
  e2e_metrics_addr "$W/releaser-$name.log" >"$W/metrics-$name.addr"
}
# Lease reads must not block through the API server's freeze.
E2E_LEASE_TIMEOUT=2s
released_count() {
  kubectl --request-timeout=5s get pods -A -l e2e=releaser -o json | python3 -c '
import json, sys
print(sum(1 for p in json.load(sys.stdin)["items"]
          if "churn-throttler.io/released-at" in (p["metadata"].get("annotations") or {})))'
}
at_least_released() { (( $(released_count) >= $1 )); }

# A monitor samples the lease holder and every live replica's leader gauge (0.25 s).
monitor() {
  while true; do
    local t; t=$(now_ms)
    local sum=0 who=""
    for f in "$W"/metrics-*.addr; do
      local name; name=$(basename "$f" .addr); name=${name#metrics-}
      local v
      v=$(curl -s --max-time 0.5 "http://$(cat "$f")/metrics" 2>/dev/null \
          | awk '$1=="churn_throttler_releaser_leader" {print $2}') || true
      if [[ "$v" == 1 ]]; then sum=$((sum + 1)); who="$who $name"; fi
    done
    local holder; holder=$(lease_holder) || true
    echo "$t ${holder:--} $sum$who" >>"$W/monitor.log"
    sleep 0.25
  done
}

# ---- phase 1: two replicas, the first leads ------------------------------------
start_releaser a1 releaser-a
wait_for "releaser-a holds the lease" holder_is releaser-a
start_releaser b1 releaser-b
ok "releaser-a leads, releaser-b follows"
monitor &
MONITOR_PID=$!

# ---- the queue: pods created as the webhook leaves them ------------------------
{
  for ns in "${NAMESPACES[@]}"; do
    for i in $(seq -w 0 $((PER_NS - 1))); do
      gates='[{"name":"churn-throttler.io/paced"}]'
      # Three pods carry a foreign gate ahead of ours: it must stay.
      [[ "$i" == 03 ]] && gates='[{"name":"e2e.example/other"},{"name":"churn-throttler.io/paced"}]'
      cat <<EOF
---
apiVersion: v1
kind: Pod
metadata:
  name: web-$i
  namespace: $ns
  labels: { e2e: releaser, churn-throttler.io/gated: "true" }
  annotations: { churn-throttler.io/gated-by: paced }
spec:
  schedulingGates: $gates
  containers: [{ name: app, image: "e2e.invalid/app:1" }]
EOF
    done
  done
  # Deleted while gated: must simply leave the queue.
  cat <<EOF
---
apiVersion: v1
kind: Pod
metadata:
  name: doomed
  namespace: team-c
  labels: { churn-throttler.io/gated: "true" }
  annotations: { churn-throttler.io/gated-by: paced }
spec:
  schedulingGates: [{ name: churn-throttler.io/paced }]
  containers: [{ name: app, image: "e2e.invalid/app:1" }]
EOF
} >"$W/pods.yaml"
t_created=$(now_ms)
kubectl apply -f "$W/pods.yaml" >/dev/null
kubectl -n team-c delete pod doomed --wait=false >/dev/null
# The emergency un-gate of docs/releaser.md, on the youngest pod: the releaser must count it.
kubectl -n team-c patch pod web-14 --type=json -p '[
  {"op":"test","path":"/spec/schedulingGates/0/name","value":"churn-throttler.io/paced"},
  {"op":"remove","path":"/spec/schedulingGates/0"}]' >/dev/null
say "created $TOTAL gated pods in ${#NAMESPACES[@]} namespaces in $(( $(now_ms) - t_created )) ms (deleted one while gated, un-gated team-c/web-14 by hand)"

# ---- phase 2: kill the leader mid-queue ----------------------------------------
wait_for "10 pods released" at_least_released 10
t_kill=$(now_ms)
kill -KILL "${PROC[a1]}"; wait "${PROC[a1]}" 2>/dev/null || true; unset 'PROC[a1]'
rm -f "$W/metrics-a1.addr"
wait_for "releaser-b takes the lease" holder_is releaser-b
handover_ms=$(( $(now_ms) - t_kill ))
say "handover: leader killed (SIGKILL) -> releaser-b holds the lease after $(printf '%d.%03d' $((handover_ms / 1000)) $((handover_ms % 1000))) s"
(( handover_ms <= 15000 )) && ok "handover within 15 s ($handover_ms ms)" || bad "handover took $handover_ms ms (> 15 s)"
start_releaser a2 releaser-a   # the killed replica comes back, and follows

# ---- phase 3: restart the leader mid-queue (same identity, no wait for expiry) --
wait_for "25 pods released" at_least_released 25
t_restart=$(now_ms)
kill -KILL "${PROC[b1]}"; wait "${PROC[b1]}" 2>/dev/null || true; unset 'PROC[b1]'
rm -f "$W/metrics-b1.addr"
start_releaser b2 releaser-b
say "releaser-b killed and restarted in $(( $(now_ms) - t_restart )) ms"

# ---- phase 4: the API server stops answering (SIGSTOP) for 12 s ---------------------
wait_for "35 pods released" at_least_released 35
t_outage=$(now_ms)
kill -STOP "$APISERVER_PID"
OUTAGE=1
sleep 12
kill -CONT "$APISERVER_PID"
OUTAGE=0
t_back=$(now_ms)
say "API server frozen (SIGSTOP) for $(( (t_back - t_outage) / 1000 )) s, then resumed"

wait_for "all $TOTAL pods released" at_least_released "$TOTAL"
t_done=$(now_ms)
say "all $TOTAL released $(( (t_done - t_created) / 1000 )) s after creation"

# ---- phase 5: a clean shutdown (SIGTERM) of the leader gives the lease up ----------
# After the outage either replica may lead: the lease expired on both sides, and the
# first to reach the API server again takes it (both are correct). Stop that one.
leader="$(lease_holder)"
case "$leader" in
  releaser-b) leader_proc=b2; other=releaser-a ;;
  releaser-a) leader_proc=a2; other=releaser-b ;;
  *) die "after the outage the lease is held by '$leader', not by releaser-a or releaser-b" ;;
esac
t_term=$(now_ms)
stop_proc "${PROC[$leader_proc]}" TERM; unset "PROC[$leader_proc]"
rm -f "$W/metrics-$leader_proc.addr"
wait_for "$other takes the lease after a clean shutdown of $leader" holder_is "$other"
graceful_ms=$(( $(now_ms) - t_term ))
say "handover after SIGTERM of the leader $leader (lease given up) to $other: $graceful_ms ms"
(( graceful_ms <= 5000 )) && ok "a clean shutdown hands over in $graceful_ms ms" || bad "clean handover took $graceful_ms ms"
sleep 1
stop_proc "$MONITOR_PID"; MONITOR_PID=""

# ---- checks --------------------------------------------------------------------
kubectl get pods -A -l e2e=releaser -o json >"$W/pods.json"
kubectl get events.events.k8s.io -A -o json >"$W/events.json"
kubectl -n team-c get pod doomed >/dev/null 2>&1 && bad "the pod deleted while gated still exists" \
  || ok "the pod deleted while gated left the queue"

python3 - "$W" "$RULE_EVENTS" "$RULE_WINDOW_MS" "$t_kill" "$t_restart" "$TOTAL" "$t_outage" "$t_back" "$here" "$t_created" "$t_done" <<'PY' >"$W/checks.out"
import json, sys, glob, os, datetime
w, events_max, window, t_kill, t_restart, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
t_outage, t_back, here, t_created, t_done = int(sys.argv[7]), int(sys.argv[8]), sys.argv[9], int(sys.argv[10]), int(sys.argv[11])
sys.path.insert(0, here)
from e2e import audit_requests, is_gate_lift, max_in_window, worst_window_at
SA = "system:serviceaccount:churn-throttler:churn-throttler"
def ms(text):
    return int(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
pods = json.load(open(f"{w}/pods.json"))["items"]
# The process behind each token (its ID, as the audit log names it).
proc_of = {}
for path in glob.glob(f"{w}/token-*.jti"):
    proc_of["JTI=" + open(path).read().strip()] = os.path.basename(path)[len("token-"):-len(".jti")]
# The releases as the API server saw them: accepted patches that remove a gate, at their
# answers, by whom. The releaser's own log lines and released-at stamps are not used here.
reqs = audit_requests(f"{w}/logs/audit.log", t_created, t_done, "team-")
lifts = [r for r in reqs if is_gate_lift(r)]
ours = [r for r in lifts if r["user"] == SA]
by_hand = sorted(f'{r["ns"]}/{r["name"]}' for r in lifts if r["user"] != SA)
for r in ours:
    r["proc"] = proc_of.get(r["credential"], "?")
lifts_per_pod = {}
for r in lifts:
    key = f'{r["ns"]}/{r["name"]}'
    lifts_per_pod[key] = lifts_per_pod.get(key, 0) + 1
stamp = {}
rows = {}
for p in pods:
    m = p["metadata"]; ann = m.get("annotations") or {}
    key = f'{m["namespace"]}/{m["name"]}'
    gates = [g["name"] for g in (p["spec"].get("schedulingGates") or [])]
    stamp[key] = ms(ann["churn-throttler.io/released-at"]) if "churn-throttler.io/released-at" in ann else None
    rows[key] = (ms(m["creationTimestamp"]), gates, (m.get("labels") or {}).get("churn-throttler.io/gated", "-"))
t0 = min(c for c, _, _ in rows.values())
print(f"{'answered (s)':>12}  {'pod':<16} {'by':<4} {'waited (s)':>10} {'stamp-answer (ms)':>17}  label     gates left")
for r in ours:
    key = f'{r["ns"]}/{r["name"]}'
    created, gates, label = rows.get(key, (r["done"], [], "?"))
    lag = r["done"] - stamp[key] if stamp.get(key) is not None else None
    print(f"{(r['done'] - t0) / 1000:12.3f}  {key:<16} {r['proc']:<4} {(r['done'] - created) / 1000:10.1f} {lag if lag is not None else '-':>17}  {label:<9} {','.join(gates) or '-'}")
times = [r["done"] for r in ours]
res = {}
res["released"] = len(lifts)
res["by_hand"] = by_hand
res["all_released"] = sorted(lifts_per_pod) == sorted(rows)
res["released_twice"] = sorted(k for k, n in lifts_per_pod.items() if n > 1)
res["worst_window"], at = worst_window_at(times, window)
res["worst_window_at_s"] = (at - t0) / 1000 if at else None
# Around each disruption: the worst window among those that start up to a window before
# it and up to two windows after (the backlog after a failover, the retries after the
# API server resumes), and what was answered in the first window after it.
def around(t):
    near = [x for x in times if t - window <= x <= t + 3 * window]
    return max_in_window(near, window)
for name, t in (("kill", t_kill), ("restart", t_restart), ("resume", t_back)):
    res[f"worst_around_{name}"] = around(t)
    res[f"in_first_window_after_{name}"] = sum(1 for x in times if t <= x < t + window)
res["resume_first_s"] = [round((x - t_back) / 1000, 3) for x in times if t_back <= x < t_back + window]
res["unattributed"] = [f'{r["ns"]}/{r["name"]}' for r in ours if r["proc"] == "?"]
res["our_gate_left"] = [k for k, (_, gates, _) in rows.items() if "churn-throttler.io/paced" in gates]
res["foreign_kept"] = sorted(k for k, (_, gates, _) in rows.items() if gates == ["e2e.example/other"])
# Terms: the processes in the order of their releases' answers; each may appear in one
# run only (a process that releases again after another one did interleaves with it).
runs = []
for r in ours:
    if not runs or runs[-1][0] != r["proc"]:
        runs.append([r["proc"], r["done"], r["done"], 0])
    runs[-1][2] = r["done"]; runs[-1][3] += 1
res["runs"] = [[p, round((a - t0) / 1000, 3), round((b - t0) / 1000, 3), n] for p, a, b, n in runs]
res["interleaved"] = len(runs) != len({p for p, _, _, _ in runs})
after = lambda t: min((x for x in times if x > t), default=None)
res["first_after_kill_s"] = (after(t_kill) - t_kill) / 1000 if after(t_kill) else None
res["first_after_restart_s"] = (after(t_restart) - t_restart) / 1000 if after(t_restart) else None
res["in_window_before_restart"] = sum(1 for x in times if t_restart - window < x <= t_restart)
res["released_during_outage"] = sum(1 for x in times if t_outage < x < t_back)
res["first_after_outage_s"] = (after(t_back) - t_back) / 1000 if after(t_back) else None
# The hand-ungated pod counted by the releaser: its patch that marks it and lifts nothing.
res["by_hand_marked"] = sorted(f'{r["ns"]}/{r["name"]}' for r in reqs
    if r["user"] == SA and r["verb"] == "patch" and r["code"] == 200 and not is_gate_lift(r)
    and f'{r["ns"]}/{r["name"]}' in by_hand
    and any("released-at" in str(op.get("path", "")) for op in (r["ops"] or [])))
# Cross-check, not a judgement: the stamps the releaser wrote against the answers.
lags = sorted(r["done"] - stamp[f'{r["ns"]}/{r["name"]}'] for r in ours if stamp.get(f'{r["ns"]}/{r["name"]}') is not None)
res["stamp_to_answer_ms"] = {"min": lags[0], "median": lags[len(lags) // 2], "max": lags[-1]} if lags else None
res["worst_window_by_stamps"] = max_in_window([v for k, v in stamp.items() if v is not None and k not in by_hand], window)
# Leader gauges and lease, sampled every 0.25 s.
samples = [l.split() for l in open(f"{w}/monitor.log")]
res["samples"] = len(samples)
res["max_leaders"] = max(int(s[2]) for s in samples if len(s) >= 3)
# Events: aggregated per namespace and rule.
evs = [e for e in json.load(open(f"{w}/events.json"))["items"] if e.get("reportingController") == "churn-throttler.io/releaser"]
res["events"] = len(evs)
res["events_by_ns"] = {}
for e in evs:
    res["events_by_ns"][e["metadata"]["namespace"]] = res["events_by_ns"].get(e["metadata"]["namespace"], 0) + 1
res["event_example"] = evs[0]["note"] if evs else None
# The restarted leader's seeding: its start-up line says how many releases it charged
# into its windows (`seeded`), which it reads from the pods' released-at stamps; those
# stamps (of releases by the other processes) say how many there were in the window
# before that moment. The releaser takes `now` just before it logs (its first releases
# carry the line's own millisecond), so at most SLACK_MS before the line: the count lies
# between the releases in the window ending at the line and those in the window ending
# SLACK_MS earlier.
SLACK_MS = 200
lead = None
for line in open(f"{w}/releaser-b2.log"):
    try: e = json.loads(line)
    except ValueError: continue
    if e.get("fields", {}).get("message", "").startswith("releaser: leading; queue rebuilt"):
        lead = e; break
if lead is None:
    res["seeded"] = None; res["seed_expected"] = None
else:
    t_lead = ms(lead["timestamp"])
    # Not its own: the first round's releases are stamped with the round's time, before
    # the line is written.
    mine = {f'{r["ns"]}/{r["name"]}' for r in ours if r["proc"] == "b2"}
    stamps = [v for k, v in stamp.items() if v is not None and k not in mine and k not in by_hand]
    res["seeded"] = lead["fields"].get("seeded")
    res["seed_gated"] = lead["fields"].get("gated")
    res["seed_expected"] = [sum(1 for x in stamps if t_lead - window < x <= t_lead),
                            sum(1 for x in stamps if t_lead - SLACK_MS - window < x <= t_lead)]
    res["seed_after_restart_ms"] = t_lead - t_restart
print("RESULT " + json.dumps(res))
PY
sed '/^RESULT /d' "$W/checks.out"
result="$(sed -n 's/^RESULT //p' "$W/checks.out")"
get() { python3 -c 'import json,sys; v=json.loads(sys.argv[1])[sys.argv[2]]; print(json.dumps(v) if not isinstance(v,(int,float,str)) or isinstance(v,bool) else v)' "$result" "$1"; }
say "releases by process, in the order of their answers [process, first s, last s, count]: $(get runs)"
say "first release after the leader was killed: $(get first_after_kill_s) s; after the restart: $(get first_after_restart_s) s"
say "releases in the window before the restart: $(get in_window_before_restart); in the first window after the kill, the restart, kill -CONT: $(get in_first_window_after_kill), $(get in_first_window_after_restart), $(get in_first_window_after_resume) (answered at $(get resume_first_s) s after kill -CONT)"
say "API server outage: $(get released_during_outage) released while it was frozen; first release answered $(get first_after_outage_s) s after it came back"
say "cross-check: released-at stamp -> the patch's answer $(get stamp_to_answer_ms) ms; most in a window by the stamps $(get worst_window_by_stamps)"
say "Events written: $(get events) $(get events_by_ns); e.g.: $(get event_example)"

[[ "$(get all_released)" == true ]] && ok "all $TOTAL pods released (audit log: a gate-removing patch for each), none lost across the failover and the restart" \
  || bad "released $(get released) of $TOTAL (audit log)"
numeric "$(get worst_window) <= RULE_EVENTS" && ok "at most $RULE_EVENTS releases in any ${RULE_WINDOW_MS} ms window at the patches' answers (audit log; worst: $(get worst_window)), across the failover and the restart" \
  || bad "$(get worst_window) releases answered in one window from $(get worst_window_at_s) s (limit $RULE_EVENTS)"
numeric "$(get worst_around_kill) <= RULE_EVENTS && $(get worst_around_restart) <= RULE_EVENTS && $(get worst_around_resume) <= RULE_EVENTS" \
  && ok "around the failover, the restart and the freeze (a window before to three after; the seconds after kill -CONT included) at most $(get worst_around_kill), $(get worst_around_restart), $(get worst_around_resume) in a window" \
  || bad "a burst around a disruption: kill $(get worst_around_kill), restart $(get worst_around_restart), kill -CONT $(get worst_around_resume) in one window"
[[ "$(get by_hand)" == '["team-c/web-14"]' && "$(get by_hand_marked)" == '["team-c/web-14"]' ]] \
  && ok "the pod un-gated by hand (audit log: the only gate removed by another user) was marked released by the releaser" \
  || bad "un-gated by hand: $(get by_hand); marked by the releaser: $(get by_hand_marked)"
[[ "$(get released_twice)" == "[]" && "$(get unattributed)" == "[]" ]] && ok "each pod released once (one gate-removing patch per pod), each by a known process's token" \
  || bad "more than one gate-removing patch: $(get released_twice); from no known token: $(get unattributed)"
[[ "$(get interleaved)" == false ]] && ok "releases of different processes never interleave (audit log, by token)" || bad "releases interleave: $(get runs)"
numeric "$(get released_during_outage) == 0" && ok "nothing released while the API server was frozen" \
  || bad "$(get released_during_outage) released during the outage"
numeric "$(get max_leaders) <= 1" && ok "leader gauges never summed above 1 ($(get samples) samples)" || bad "two leaders at once in the samples"
[[ "$(get our_gate_left)" == "[]" ]] && ok "our gate removed from every pod" || bad "gate still on: $(get our_gate_left)"
[[ "$(get foreign_kept)" == '["team-a/web-03", "team-b/web-03", "team-c/web-03"]' ]] \
  && ok "foreign gates kept (3 pods still gated by e2e.example/other)" || bad "foreign gates: $(get foreign_kept)"
ev=$(get events)
numeric "ev >= 1 && ev <= 3 * ${#NAMESPACES[@]} * ( (t_done - t_created) / 30000 + 2 )" \
  && ok "Events on waiting pods, aggregated per namespace and rule ($ev for $TOTAL pods)" || bad "$ev Events"
# The count, not the word: `seeded` in the restarted leader's start-up line against the
# released-at stamps in the window before it (at least one: it restarted mid-queue).
python3 -c 'import json,sys; r=json.loads(sys.argv[1]); s, e = r["seeded"], r["seed_expected"]
sys.exit(0 if isinstance(s, int) and e and 1 <= e[0] and e[0] <= s <= e[1] and (r.get("seed_gated") or 0) >= 1 else 1)' "$result" \
  && ok "the restarted leader rebuilt its queue ($(get seed_gated) gated) and seeded its windows with $(get seeded) releases, as many as the released-at stamps in the window before it ($(get seed_expected), logged $(get seed_after_restart_ms) ms after the restart)" \
  || bad "the restarted leader seeded $(get seeded) releases; the released-at stamps in the window before its start-up line: $(get seed_expected) (gated: $(get seed_gated))"
say "logs: $W/releaser-*.log, samples: $W/monitor.log"
e2e_finish
