#!/usr/bin/env bash
# End-to-end smoke test of the real control plane used by the e2e tests:
#   build (or reuse) the binaries, bring a cluster up in a temp dir, then
#   1. a 3-replica OrderedReady StatefulSet becomes ready,
#   2. a template change rolls out (updatedReplicas==3, readyReplicas==3),
#   3. a pod with spec.schedulingGates stays Pending/SchedulingGated and runs
#      once the gate is removed with a JSON patch,
#   4. promtool/prometheus (Debian package) run.
# Tears the cluster down on exit, also on failure. Exits non-zero on any failure.
#
# Environment: E2E_BIN (skip the build step), SMOKE_KEEP_WORKDIR=1 (keep logs),
# SMOKE_TIMEOUT (seconds per wait, default 180), CLUSTER_* (see cluster.sh).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=cluster.sh
source "$here/cluster.sh"

timeout="${SMOKE_TIMEOUT:-180}"
passed=0
failed=0
timings=()

say() { echo "smoke: $*"; }
fail() {
  failed=$((failed + 1))
  echo "smoke: FAIL: $*" >&2
  if [[ -n "${W:-}" && -d "${W}/logs" ]]; then
    for c in kube-controller-manager kube-scheduler kwok; do _cl_tail "$W" "$c" 15; done
  fi
  echo "smoke: $passed passed, $failed failed"
  exit 1
}
ok() { passed=$((passed + 1)); say "ok: $*"; }
now_ms() { date +%s%3N; }
secs_since() { local d=$(( $(now_ms) - $1 )); printf '%d.%03ds' $((d / 1000)) $((d % 1000)); }
timing() { timings+=("$(printf '%-34s %s' "$1" "$2")"); say "time: $1: $2"; }

# wait_for DESC CMD...: poll CMD (every 0.2s) until it succeeds or $timeout passes.
wait_for() {
  local desc="$1"; shift
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS - start >= timeout )); then
      fail "timed out after ${timeout}s waiting for: $desc"
    fi
    sleep 0.2
  done
}

# ---- build ----------------------------------------------------------------
t=$(now_ms)
if [[ -z "${E2E_BIN:-}" ]]; then
  E2E_BIN="$("$here/build-binaries.sh" | tail -n1)" || fail "build-binaries.sh failed"
fi
export E2E_BIN
timing "build-binaries.sh" "$(secs_since "$t")"
say "binaries: $E2E_BIN"

# ---- tools ----------------------------------------------------------------
promtool --version 2>&1 | head -n1 | sed 's/^/smoke: /' || fail "promtool --version failed"
prometheus --version 2>&1 | head -n1 | sed 's/^/smoke: /' || fail "prometheus --version failed"
promtool --version >/dev/null 2>&1 && prometheus --version >/dev/null 2>&1 \
  || fail "promtool/prometheus do not run"
ok "promtool and prometheus run"

# ---- cluster up -----------------------------------------------------------
W="$(mktemp -d "${TMPDIR:-/tmp}/churn-e2e-smoke.XXXXXX")"
cleanup() {
  local rc=$?
  cluster_down "$W" || true
  if [[ "${SMOKE_KEEP_WORKDIR:-0}" == 1 || $rc -ne 0 ]]; then
    say "workdir kept: $W (logs in $W/logs)"
  else
    rm -rf "$W"
  fi
}
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM

t=$(now_ms)
cluster_up "$W" 3 || fail "cluster up failed (logs in $W/logs)"
timing "cluster up (3 nodes)" "$(secs_since "$t")"
# shellcheck disable=SC1091
source "$W/env"

k() { kubectl --request-timeout=20s "$@"; }

say "kubectl version:"
k version 2>&1 | sed 's/^/smoke:   /'
server_version="$(k version -o json | jq -r .serverVersion.gitVersion)"
client_version="$(k version -o json --client | jq -r .clientVersion.gitVersion)"
[[ "$server_version" == v1.36.* && "$client_version" == v1.36.* ]] \
  || fail "unexpected versions: server=$server_version client=$client_version"
ok "server $server_version, client $client_version"
k get nodes -o wide | sed 's/^/smoke:   /'

# ---- namespace ------------------------------------------------------------
ns=smoke
k create namespace "$ns" >/dev/null || fail "create namespace"
wait_for "ServiceAccount $ns/default" k -n "$ns" get serviceaccount default

# ---- StatefulSet: create and wait ready -----------------------------------
sts_ready_eq() { # sts_ready_eq N: readyReplicas == N
  [[ "$(k -n "$ns" get sts web -o jsonpath='{.status.readyReplicas}')" == "$1" ]]
}
sts_rolled_out() {
  local s
  s="$(k -n "$ns" get sts web -o jsonpath='{.metadata.generation} {.status.observedGeneration} {.status.updatedReplicas} {.status.readyReplicas} {.status.currentRevision} {.status.updateRevision}')" || return 1
  read -r gen obs upd rdy cur updrev <<<"$s"
  [[ "$obs" == "$gen" && "$upd" == 3 && "$rdy" == 3 && -n "$updrev" && "$cur" == "$updrev" ]]
}

t=$(now_ms)
k -n "$ns" apply -f - >/dev/null <<'EOF' || fail "create StatefulSet"
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: None
  selector:
    app: web
  ports:
  - name: http
    port: 80
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: web
  replicas: 3
  podManagementPolicy: OrderedReady
  updateStrategy:
    type: RollingUpdate
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: pause
        image: registry.k8s.io/pause:3.10
EOF
wait_for "StatefulSet $ns/web readyReplicas==3" sts_ready_eq 3
timing "StatefulSet 3 replicas ready" "$(secs_since "$t")"
k -n "$ns" get pods -o wide | sed 's/^/smoke:   /'
ok "StatefulSet web has readyReplicas=3"

# ---- StatefulSet: rolling update ------------------------------------------
old_rev="$(k -n "$ns" get sts web -o jsonpath='{.status.updateRevision}')"
t=$(now_ms)
k -n "$ns" patch sts web --type=merge \
  -p '{"spec":{"template":{"metadata":{"annotations":{"smoke.churn-throttler/rev":"2"}}}}}' >/dev/null \
  || fail "patch StatefulSet template"
wait_for "StatefulSet $ns/web rollout (updatedReplicas==3, readyReplicas==3)" sts_rolled_out
timing "StatefulSet rolling update (3 pods)" "$(secs_since "$t")"
new_rev="$(k -n "$ns" get sts web -o jsonpath='{.status.updateRevision}')"
[[ "$new_rev" != "$old_rev" ]] || fail "updateRevision did not change ($old_rev)"
for i in 0 1 2; do
  r="$(k -n "$ns" get pod "web-$i" -o jsonpath='{.metadata.labels.controller-revision-hash}')"
  [[ "$r" == "$new_rev" ]] || fail "pod web-$i has revision $r, want $new_rev"
done
k -n "$ns" rollout status sts/web --timeout=10s | sed 's/^/smoke:   /' || fail "kubectl rollout status"
ok "StatefulSet rolled out from $old_rev to $new_rev"

# ---- scheduling gates ---------------------------------------------------------
k -n "$ns" apply -f - >/dev/null <<'EOF' || fail "create gated pod"
apiVersion: v1
kind: Pod
metadata:
  name: gated
spec:
  schedulingGates:
  - name: smoke.churn-throttler/gate
  terminationGracePeriodSeconds: 1
  containers:
  - name: pause
    image: registry.k8s.io/pause:3.10
EOF
gated_reason() {
  [[ "$(k -n "$ns" get pod gated -o jsonpath='{.status.phase} {.status.conditions[?(@.type=="PodScheduled")].reason}')" == "Pending SchedulingGated" ]]
}
wait_for "pod gated Pending with reason SchedulingGated" gated_reason
sleep 3 # give scheduler and kwok a chance to (wrongly) act on it
state="$(k -n "$ns" get pod gated -o jsonpath='{.status.phase}/{.status.conditions[?(@.type=="PodScheduled")].reason}/node={.spec.nodeName}')"
say "gated pod after 3s: $state"
[[ "$state" == "Pending/SchedulingGated/node=" ]] || fail "gated pod is not held: $state"
ok "pod with spec.schedulingGates stays Pending (SchedulingGated)"

t=$(now_ms)
k -n "$ns" patch pod gated --type=json \
  -p '[{"op":"remove","path":"/spec/schedulingGates/0"}]' >/dev/null || fail "remove scheduling gate"
pod_running() { [[ "$(k -n "$ns" get pod gated -o jsonpath='{.status.phase}')" == Running ]]; }
wait_for "pod gated Running after removing its gate" pod_running
timing "ungated pod Running" "$(secs_since "$t")"
say "gated pod after removing the gate: $(k -n "$ns" get pod gated -o jsonpath='{.status.phase} on {.spec.nodeName}')"
ok "pod runs once its scheduling gate is removed"

# ---- done -------------------------------------------------------------------
say "timings:"
for l in "${timings[@]}"; do say "  $l"; done
say "all checks passed"
echo "smoke: $passed passed, $failed failed"
