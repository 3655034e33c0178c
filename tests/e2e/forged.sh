#!/usr/bin/env bash
# Forged reviews on the real control plane (tests/e2e/cluster.sh): anyone who reaches the
# admission port without --client-ca can POST AdmissionReviews. For each stage, a fresh
# `churn-throttler serve` (the built-in policy with plain windows, burst = events:
# controller-deletes allows 20 per 10 s window, retry-after up to 30 s) is registered as the cluster's validating webhook for pod DELETEs
# and evictions in namespaces labelled churn-throttler.io/enabled=true; 2,000 forged
# deletion reviews of pods that do not exist, one namespace each, go straight to its port
# (tests/e2e/forged.py); then a real pod in `prod` is deleted through the API server as the
# ReplicaSet controller (kubectl --as its ServiceAccount; client-go honours the 429's
# Retry-After) and the deletion's wait is printed.
#   stage off: --pod-cache=false. The forgeries are charged, so the real deletion must wait
#              longer than a window: this shows the measurement can see the attack.
#              Plain windows, because under the default spacing one serial forger only
#              takes the rate (each forgery held one spacing, 2,000 of them 1,050 s) and
#              the real deletion then waits one spacing: whether forgeries are charged
#              is what this stage measures, and a full window shows it in one number.
#   stage on:  the default (the pod cache, fed with the ServiceAccount of
#              manifests/base/rbac-releaser.yaml). The real deletion must wait at most one
#              window (10 s), the forgeries are counted as unverified, the real one charged.
# Environment: E2E_BIN, CHURN_THROTTLER_BIN, FORGED_COUNT (2000), FORGED_KEEP=1 (keep the
# work dir). Last line: `forged: N passed, M failed`.
# shellcheck source-path=SCRIPTDIR  # lib.sh and cluster.sh, from any working directory
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"
e2e_suite forged FORGED_KEEP

COUNT="${FORGED_COUNT:-2000}"
WINDOW_S=10
CONTROLLER=system:serviceaccount:kube-system:replicaset-controller
timeout=180

e2e_die_logs() { e2e_tail_logs 20 'serve-*.log'; }

E2E_CARGO_ARGS=(--bin churn-throttler)   # the server alone
e2e_build

# Each stage's `serve`: TERM, up to 10 s, KILL, reaped; also on exit, before the cluster.
SERVE_PID=""
stop_serve() {
  [[ -n "$SERVE_PID" ]] || return 0
  kill -TERM "$SERVE_PID" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$SERVE_PID" 2>/dev/null || true
  wait "$SERVE_PID" 2>/dev/null || true
  SERVE_PID=""
}
e2e_before_cleanup() { stop_serve; }
e2e_workdir

# The built-in policy with plain windows (burst = events); see stage off above.
"$CHURN_THROTTLER_BIN" default-policy \
  | sed -E 's/events: ([0-9]+), window: ([0-9a-z]+), scope: global \}/events: \1, window: \2, scope: global, burst: \1 }/' \
  >"$W/policy.yaml"
grep -q 'burst: 20 }' "$W/policy.yaml" || die "could not give the policy plain windows"

cluster_up "$W" 2 || die "cluster up failed"
# shellcheck disable=SC1091
source "$W/env"
k() { kubectl --request-timeout=20s "$@"; }

# The webhook's own identity: the releaser's ServiceAccount and RBAC, nothing more.
k create namespace churn-throttler >/dev/null
k -n churn-throttler create serviceaccount churn-throttler >/dev/null
k apply -f "$root/manifests/base/rbac-releaser.yaml" >/dev/null
e2e_kubeconfig churn-throttler churn-throttler "$W/webhook.kubeconfig"
k create namespace prod >/dev/null
k label namespace prod churn-throttler.io/enabled=true >/dev/null
wait_for "ServiceAccount prod/default" k -n prod get serviceaccount default

cluster_issue_serving_cert "$W" webhook >/dev/null
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
metrics_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
ca_bundle="$(base64 -w0 <"$CLUSTER_CA_FILE")"
k apply -f - >/dev/null <<EOF || die "register the webhook"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: churn-throttler-forged-e2e
webhooks:
  - name: validate.churn-throttler.io
    admissionReviewVersions: [v1]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 10
    clientConfig:
      url: https://127.0.0.1:$port/validate
      caBundle: $ca_bundle
    namespaceSelector:
      matchLabels: { churn-throttler.io/enabled: "true" }
    rules:
      - apiGroups: [""]
        apiVersions: [v1]
        operations: [DELETE]
        resources: [pods]
      - apiGroups: [""]
        apiVersions: [v1]
        operations: [CREATE]
        resources: [pods/eviction]
EOF

metric() { # metric SERIES: its value on the metrics port, 0 when absent
  curl -sf "http://127.0.0.1:$metrics_port/metrics" \
    | awk -v s="$1" 'index($0, s" ") == 1 { print $2; found=1 } END { if (!found) print 0 }'
}

cache_synced() { [[ "$(metric churn_throttler_pod_cache_synced)" == 1 ]]; }
pod_running() { [[ "$(k -n prod get pod "$1" -o jsonpath='{.status.phase}')" == Running ]]; }

# stage NAME SERVE_FLAGS...: prints the real deletion's wait in ms on fd 3.
stage() {
  local name="$1"; shift
  KUBECONFIG="$W/webhook.kubeconfig" RUST_LOG=info NO_COLOR=1 "$CHURN_THROTTLER_BIN" serve \
    --tls-cert "$W/pki/webhook.crt" --tls-key "$W/pki/webhook.key" \
    --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$metrics_port" \
    --config "$W/policy.yaml" --releaser=false --replica-budget=false --shutdown-delay 0s "$@" \
    >"$W/serve-$name.log" 2>&1 &
  SERVE_PID=$!
  wait_for "serve ($name) ready" curl -sf "http://127.0.0.1:$metrics_port/readyz"
  if [[ "$name" == on ]]; then
    wait_for "the pod cache synced" cache_synced
  fi
  local pod="real-$name"
  k -n prod apply -f - >/dev/null <<EOF || die "create pod prod/$pod"
apiVersion: v1
kind: Pod
metadata: { name: $pod }
spec:
  terminationGracePeriodSeconds: 1
  containers: [{ name: pause, image: registry.k8s.io/pause:3.10 }]
EOF
  wait_for "pod prod/$pod Running" pod_running "$pod"
  python3 "$here/forged.py" "https://localhost:$port/validate" "$CLUSTER_CA_FILE" "$COUNT" \
    "$root/tests/fixtures/pod-delete-running.json" | sed "s/^forged:/forged: [$name]/" \
    || die "[$name] the forged reviews could not be sent"
  local t0 t1
  t0=$(now_ms)
  k --request-timeout=120s -n prod delete pod "$pod" --as="$CONTROLLER" --wait=false >/dev/null \
    || die "[$name] the real deletion of prod/$pod failed"
  t1=$(now_ms)
  local charged unverified
  charged="$(metric 'churn_throttler_decisions_total{action="allow",operation="DELETE",rule="controller-deletes"}')"
  unverified="$(metric 'churn_throttler_unverified_requests_total{reason="no-such-pod"}')"
  say "[$name] real deletion of prod/$pod by $CONTROLLER waited $(( (t1 - t0) / 1000 )).$(printf '%03d' $(( (t1 - t0) % 1000 ))) s (window ${WINDOW_S} s); allowed deletions charged by controller-deletes: $charged; unverified (no-such-pod): $unverified"
  echo "$(( t1 - t0 )) $charged $unverified" >&3
  stop_serve
}

exec 3>"$W/off"
stage off --pod-cache=false
exec 3>"$W/on"
stage on
exec 3>&-
read -r off_ms _ _ <"$W/off"
read -r on_ms on_charged on_unverified <"$W/on"

if (( off_ms > WINDOW_S * 1000 )); then
  ok "without the pod cache the forged reviews delay the real deletion past a window (${off_ms} ms > ${WINDOW_S} s)"
else
  bad "without the pod cache the real deletion waited ${off_ms} ms, not more than a window: this run cannot tell the cache's effect"
fi
if (( on_ms <= WINDOW_S * 1000 )); then
  ok "with the pod cache the real deletion waits at most one window (${on_ms} ms <= ${WINDOW_S} s)"
else
  bad "with the pod cache the real deletion waited ${on_ms} ms, more than one window (${WINDOW_S} s)"
fi
if [[ "$on_unverified" == "$COUNT" ]]; then
  ok "every forged review ($COUNT) was counted unverified and left uncharged"
else
  bad "unverified (no-such-pod) is $on_unverified, want $COUNT"
fi
if [[ "$on_charged" == 1 ]]; then
  ok "exactly one deletion was charged by controller-deletes: the real one, through the API server"
else
  bad "controller-deletes charged $on_charged allowed deletions, want 1 (the real one only)"
fi
e2e_finish
