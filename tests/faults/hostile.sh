#!/usr/bin/env bash
# Hostile and broken clients against real `churn-throttler serve` processes on 127.0.0.1
# (debug build unless CHURN_THROTTLER_BIN is given), each case with its figures printed by
# tests/faults/hostile.py: slowloris, idle TLS, idle HTTP/2, partial and missing bodies,
# the metrics port mid-header, a full admission port under `ulimit -n 256`, SIGHUP during
# holds, an abandoned hold, a forged uid in the debug log, a 50,000-namespace flood, a
# too-short drain, unsupported review versions, the --dev key's mode; then idle-connection
# floods on both ports against the default and small caps (eviction at the caps), an idle
# HTTP/2 connection evicted with a GOAWAY, and an HTTP/2 rapid reset against the default
# log filter.
# The servers run with short timeouts (3 s head and body, 4 s idle) so the suite is quick;
# the defaults are in docs/operations.md. Last line: `hostile: N passed, M failed`.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "hostile: FAIL: $*" >&2; }

target_dir="${CARGO_TARGET_DIR:-$root/target}"
if [[ -z "${CHURN_THROTTLER_BIN:-}" ]]; then
  (cd "$root" && cargo build --quiet --bin churn-throttler) || { echo "hostile: cargo build failed"; echo "hostile: 0 passed, 1 failed"; exit 1; }
  CHURN_THROTTLER_BIN="$target_dir/debug/churn-throttler"
fi
# The client side opens 300+ sockets at once (the full-port case).
ulimit -n 4096 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
W="$(mktemp -d /tmp/hostile.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  [[ -n "${KEEP:-}" ]] || rm -rf "$W"
}
trap cleanup EXIT

# The built-in policy with three test rules in front: a hold rule (5 per second, held up
# to 3 s), one slot per 4 s held up to 5 s, for the abandoned hold, and one event per
# 10 s answered with 429 and Retry-After, for the throttled review whose uid is logged.
"$CHURN_THROTTLER_BIN" default-policy | python3 -c '
import sys
text = sys.stdin.read()
rules = """rules:
  - name: test-holds
    match: { resources: [pods], operations: [DELETE], users: [system:serviceaccount:test:holder] }
    limit: { events: 5, window: 1s, scope: global }
    action: hold
    maxHold: 3s
  - name: test-abandon
    match: { resources: [pods], operations: [DELETE], users: [system:serviceaccount:test:abandon] }
    limit: { events: 1, window: 4s, scope: global }
    action: hold
    maxHold: 5s
  - name: test-logs
    match: { resources: [pods], operations: [DELETE], users: [system:serviceaccount:test:logs] }
    limit: { events: 1, window: 10s, scope: global }
    action: retry-after
"""
print(text.replace("rules:\n", rules, 1), end="")' >"$W/policy.yaml"

EXTRA=()
SHORT=(--tls-handshake-timeout 3s --header-read-timeout 3s --body-read-timeout 3s --idle-timeout 4s --http2-ping-interval 2s)
# start NAME ARGS...: a --dev server; sets PORT, MPORT, PID, CA.
start() {
  local name="$1"; shift
  # LOG_LEVEL=default: RUST_LOG unset, the filter a default install has.
  local envs=(env NO_COLOR=1 RUST_LOG="${LOG_LEVEL:-info}")
  [[ "${LOG_LEVEL:-}" == default ]] && envs=(env -u RUST_LOG NO_COLOR=1)
  "${envs[@]}" "$@" serve --dev --pod-cache=false --dev-dir "$W/$name" --config "$W/policy.yaml" \
    --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --shutdown-delay 0s "${SHORT[@]}" "${EXTRA[@]}" >"$W/$name.log" 2>&1 &
  PID=$!
  PIDS+=("$PID")
  for _ in $(seq 1 150); do grep -q '^Metrics: curl' "$W/$name.log" 2>/dev/null && break; sleep 0.1; done
  PORT="$(grep -o 'https://localhost:[0-9]*' "$W/$name.log" | head -n1 | sed 's/.*://')"
  MPORT="$(grep -o 'Metrics: curl http://127.0.0.1:[0-9]*' "$W/$name.log" | head -n1 | sed 's/.*://')"
  CA="$W/$name/ca.crt"
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$MPORT/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
}
# case CASE ARGS...: one hostile.py case against the last server started.
case_() {
  if python3 "$here/hostile.py" "$1" --port "$PORT" --mport "$MPORT" --ca "$CA" --pid "$PID" "${@:2}"; then ok; else bad "$1"; fi
}

# HOSTILE_ONLY=flood runs the connection floods alone (while working on them).
if [[ "${HOSTILE_ONLY:-}" != flood ]]; then
echo "=== server 1: $CHURN_THROTTLER_BIN, timeouts ${SHORT[*]}, RUST_LOG=churn_throttler=debug"
# One address may hold every slot here, so that the 500 slow connections below meet the
# timeouts and not the per-source eviction (the floods further down show that one).
EXTRA=(--max-connections-per-source 1000)
LOG_LEVEL=churn_throttler=debug start s1 "$CHURN_THROTTLER_BIN"
EXTRA=()
echo "hostile: admission port $PORT, metrics port $MPORT, pid $PID"
mode="$(stat -c %a "$W/s1/tls.key")"
echo "serve --dev wrote tls.key with mode $mode"
if [[ "$mode" == 600 ]]; then ok; else bad "tls.key mode $mode, expected 600"; fi
for version in admission.k8s.io/v2 foo/v9; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); r['apiVersion']=sys.argv[2]; print(json.dumps(r))" \
    "$root/tests/fixtures/pod-eviction.json" "$version" >"$W/review.json"
  out="$(curl -sS --cacert "$CA" -H 'Content-Type: application/json' --data-binary @"$W/review.json" -w ' HTTP %{http_code}' "https://localhost:$PORT/validate")"
  echo "apiVersion $version: $out"
  if [[ "$out" == *"HTTP 400" && "$out" == *"expected an AdmissionReview of apiVersion"* ]]; then ok; else bad "apiVersion $version accepted"; fi
done

case_ slowloris --count 500 --timeout 3
case_ idle-tls --timeout 3
case_ idle-h2 --idle 4
case_ partial-body --timeout 3
case_ missing-body
case_ metrics-mid-header --timeout 3
case_ sighup --count 10 --user system:serviceaccount:test:holder
hups="$(grep -c 'SIGHUP: re-reading the certificate and policy files' "$W/s1.log")"
echo "log lines of SIGHUP handled: $hups"
if (( hups == 1 )); then ok; else bad "SIGHUP not handled ($hups log lines)"; fi
case_ abandoned-hold --timeout 4 --user system:serviceaccount:test:abandon
case_ log-uid --count 5 --user system:serviceaccount:test:logs
# The forged uid as the log shows it: escaped, and no line of its own.
sleep 0.5
# NO_COLOR: the log has no escape sequence of its own, so any raw ESC came from a request.
escaped='evil\nlevel=ERROR forged\u{1b}[31m\0end'
lines="$(grep -cF "$escaped" "$W/s1.log")"
forged="$(grep -c '^level=ERROR forged' "$W/s1.log")"
raw="$(grep -caP '\x1b|\x00' "$W/s1.log")"
echo "debug log: $lines lines hold the uid escaped ($escaped); $forged forged lines; $raw lines with a raw ESC or NUL"
if (( lines > 0 && forged == 0 && raw == 0 )); then ok; else bad "the forged uid reached the log unescaped"; fi
# 20 per 10 s, reach maxRetryAfter 30 s + 0.5 s, unclaimed ones kept 30 s past their
# slot: at most 20 x (ceil(60.5 / 10) + 1) = 160 open (docs/operations.md).
case_ flood --count "${FLOOD:-50000}" --reservations 160 --rss 150 --timeout 31
kill -0 "$PID" 2>/dev/null && ok || bad "server 1 died"

echo "=== server 2: open files limited to 256, 300 idle connections"
start s2 bash -c 'ulimit -n 256 && exec "$0" "$@"' "$CHURN_THROTTLER_BIN"
grep -o 'admission connections capped at [0-9]*' "$W/s2.log" | head -n1
case_ full-port --count 300 --timeout 4

echo "=== a drain shorter than the longest hold"
start_out="$(timeout 20 "$CHURN_THROTTLER_BIN" serve --dev --pod-cache=false --dev-dir "$W/s3" --listen 127.0.0.1:0 \
  --metrics-listen 127.0.0.1:0 --drain-timeout 1s 2>&1)"
rc=$?
echo "serve --drain-timeout 1s (built-in policy, maxHold 2s): exit $rc: $(echo "$start_out" | tail -n1)"
if (( rc != 0 && rc != 124 )) && [[ "$start_out" == *"--drain-timeout 1s is too short"* ]]; then ok; else bad "a 1 s drain was not refused"; fi

fi

# Idle-connection floods (issue 32): 2,000 idle TLS connections and 1,000 idle metrics
# connections, reopened as the server closes them, from 127.0.0.1 alone and from 8
# loopback addresses (127.0.0.2-9), against the default caps (1000 and 64, a quarter
# per source) and small ones (200 and 16); the servers run the default timeouts and the
# default log filter (RUST_LOG unset).
SHORT=()
for caps in default small; do
  if [[ "$caps" == small ]]; then
    EXTRA=(--max-connections 200 --max-metrics-connections 16); fds=$((200 + 16 + 100))
  else
    EXTRA=(); fds=$((1000 + 64 + 100))
  fi
  echo "=== connection floods, $caps caps ${EXTRA[*]}"
  LOG_LEVEL=default start "flood-$caps" "$CHURN_THROTTLER_BIN"
  grep -o 'open connections capped per port.*' "$W/flood-$caps.log" | head -n1
  # Small caps: 50 per source; the 50th newer connection evicts the idle HTTP/2 one.
  [[ "$caps" == small ]] && case_ evict-h2 --count 50
  if [[ "$caps" == default ]]; then
    # The usual latency: the same fresh client and probes, no flood.
    case_ conn-flood --count 0 --mcount 0 --duration 2.5 --holds 10 --latency "${FLOOD_P99_MS:-250}" \
      --rss 200 --fds "$fds" --user system:serviceaccount:test:holder
  fi
  for sources in 1 8; do
    case_ conn-flood --count 2000 --mcount 1000 --sources "$sources" --duration "${FLOOD_SECONDS:-4}" \
      --holds 10 --latency "${FLOOD_P99_MS:-250}" --rss 200 --fds "$fds" --user system:serviceaccount:test:holder
  done
  summaries="$(grep -c 'at its connection caps' "$W/flood-$caps.log")"
  echo "log: $(wc -l <"$W/flood-$caps.log") lines in all, $summaries eviction summary lines"
  if kill -0 "$PID" 2>/dev/null; then ok; else bad "the $caps-caps flood server died"; fi
done
EXTRA=()

# HTTP/2 rapid reset against a default install's log filter: at most a few lines a second.
echo "=== HTTP/2 rapid reset, default log filter"
before="$(wc -l <"$W/flood-small.log")"
case_ rapid-reset --duration 4
sleep 0.5
after="$(wc -l <"$W/flood-small.log")"
h2w="$(python3 -c "import sys; sys.path.insert(0, '$here'); import hostile, argparse; a=argparse.Namespace(mport=$MPORT); print(int(hostile.metric(a, 'churn_throttler_h2_warnings_total')))")"
echo "rapid reset: $((after - before)) log lines in 4 s; churn_throttler_h2_warnings_total $h2w"
if (( after - before <= 12 && h2w > 0 )); then ok; else bad "rapid reset wrote $((after - before)) log lines (bound 12 in 4 s), h2 warnings counted: $h2w"; fi

echo "hostile: $passed passed, $failed failed"
(( failed == 0 ))
