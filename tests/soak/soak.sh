#!/usr/bin/env bash
# Soak test of `churn-throttler serve`: mixed AdmissionReviews at a fixed rate for a fixed
# time (examples/review_load.rs, open loop, every request distinct, spread over 500
# namespaces), against the built-in policy over HTTPS on 127.0.0.1. Samples the server's
# RSS (and its open reservations) every 2 s and checks that memory stays flat once warm
# (tests/soak/rss_report.py: the slope of RSS over the whole run after the warm-up, which
# ends once the open reservations have filled, and not before SOAK_WARMUP_S, default 30 s),
# that no request failed, that each load client's exit code agrees with its summary, and
# that the server counted (its /metrics) an HTTP 200 answer for every request each client
# sent, and nothing else. See docs/soak.md.
#
#   SOAK_PROFILE=release tests/soak/soak.sh 600 2000   # the full soak: 10 min at 2000 req/s
#   tests/soak/soak.sh 180 500          # CI: 3 min at 500 req/s (debug build, which cannot
#                                       # serve 2000 req/s on 2 cores next to its client);
#                                       # memory judged after the reservations filled
#
# Mix: 4/5 of RATE to /validate (pod deletions by the ReplicaSet
# controller, evictions, final deletes of terminating pods, StatefulSet partition
# decreases, ConfigMaps), 1/5 to /mutate (ReplicaSet and StatefulSet pod creations,
# StatefulSet template changes). Last line: `soak: N passed, M failed`.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
run_s="${1:-${SOAK_SECONDS:-180}}"
warmup_s="${SOAK_WARMUP_S:-30}"
profile="${SOAK_PROFILE:-debug}"
default_rate=500; [[ "$profile" == release ]] && default_rate=2000
rate="${2:-${SOAK_RATE:-$default_rate}}"
passed=0
failed=0
say() { echo "soak: $*"; }
ok() { passed=$((passed + 1)); say "ok: $*"; }
bad() { failed=$((failed + 1)); echo "soak: FAIL: $*" >&2; }
finish() { echo "soak: $passed passed, $failed failed"; (( failed == 0 )); exit $?; }

target_dir="${CARGO_TARGET_DIR:-$root/target}"
flag=""; [[ "$profile" == release ]] && flag="--release"
(cd "$root" && cargo build --quiet $flag --bin churn-throttler --example review_load) || { bad "cargo build failed"; finish; }
bin="$target_dir/$profile/churn-throttler"
load="$target_dir/$profile/examples/review_load"

W="$(mktemp -d /tmp/soak.XXXXXX)"
SERVER=""; SAMPLER=""
cleanup() {
  [[ -n "$SAMPLER" ]] && kill "$SAMPLER" 2>/dev/null
  if [[ -n "$SERVER" ]]; then
    kill -TERM "$SERVER" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER" 2>/dev/null
  fi
  if [[ "${SOAK_KEEP:-0}" == 1 ]]; then echo "soak: work dir kept: $W" >&2; else rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

RUST_LOG=warn "$bin" serve --dev --pod-cache=false --dev-dir "$W/dev" --listen 127.0.0.1:0 \
  --metrics-listen 127.0.0.1:0 --shutdown-delay 0s >"$W/serve.log" 2>&1 &
SERVER=$!
# Port 0: --dev prints the bound addresses (its curl line and the metrics line).
for _ in $(seq 1 100); do grep -q '^Metrics: curl' "$W/serve.log" 2>/dev/null && break; sleep 0.1; done
port="$(grep -o 'https://localhost:[0-9]*' "$W/serve.log" | head -n1 | sed 's/.*://')"
mport="$(grep -o 'Metrics: curl http://127.0.0.1:[0-9]*' "$W/serve.log" | head -n1 | sed 's/.*://')"
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$mport/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$mport/readyz" >/dev/null || { cat "$W/serve.log" >&2; bad "serve did not become ready"; finish; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$SERVER/status" 2>/dev/null; }
start_ms=$(date +%s%3N)
reservations() { curl -s --max-time 2 "http://127.0.0.1:$mport/metrics" | awk '$1 == "churn_throttler_reservations_open" {print int($2); exit}'; }
( while kill -0 "$SERVER" 2>/dev/null; do
    echo "$(( $(date +%s%3N) - start_ms )) $(rss_kb) $(reservations)" >>"$W/rss"
    sleep 2
  done ) &
SAMPLER=$!
rss_start=$(rss_kb)
say "serve ($profile) ready, RSS $rss_start kB; ${run_s} s at ${rate} req/s; memory judged from the warm-up's end (reservations filled, at least ${warmup_s} s)"
(( run_s >= warmup_s + 30 )) || { bad "a run of ${run_s} s leaves no steady span after the ${warmup_s} s warm-up (need 30 s; SOAK_WARMUP_S)"; finish; }

f="$root/tests/fixtures"
validate_rate=$(( rate * 4 / 5 )); mutate_rate=$(( rate - validate_rate ))
"$load" --ca "$W/dev/ca.crt" --target "https://127.0.0.1:$port/validate" \
  --fixture "$f/pod-delete-running.json" --fixture "$f/pod-eviction.json" \
  --fixture "$f/pod-delete-terminating.json" --fixture "$f/statefulset-partition-lower.json" \
  --fixture "$f/configmap-create.json" --fixture "$f/pod-delete-running.json" \
  --rate "$validate_rate" --seconds "$run_s" --namespaces 500 --max-in-flight 8192 \
  --timeout-seconds 12 --prefix v 2>"$W/load-validate.log" &
l1=$!
"$load" --ca "$W/dev/ca.crt" --target "https://127.0.0.1:$port/mutate" \
  --fixture "$f/pod-create-replicaset.json" --fixture "$f/pod-create-statefulset.json" \
  --fixture "$f/statefulset-template-change.json" --fixture "$f/pod-create-replicaset.json" \
  --rate "$mutate_rate" --seconds "$run_s" --namespaces 500 --max-in-flight 4096 \
  --timeout-seconds 12 --prefix m 2>"$W/load-mutate.log" &
l2=$!
wait "$l1"; rc1=$?
wait "$l2"; rc2=$?
sleep 2
rss_end=$(rss_kb)
kill "$SAMPLER" 2>/dev/null; SAMPLER=""
cat "$W/load-validate.log" "$W/load-mutate.log"
# The server's own count of its answers, from one scrape after both clients ended.
metrics="$(curl -s --max-time 5 "http://127.0.0.1:$mport/metrics")"
grep -q '^churn_throttler_http_requests_total' <<<"$metrics" \
  || bad "the scrape after the run has no churn_throttler_http_requests_total (${#metrics} bytes): nothing below about the server's answers can be judged"
server_answers() { # server_answers ENDPOINT [CODE]: answers the server counted, of CODE or any
  awk -v e="endpoint=\"$1\"" -v c="code=\"${2:-}\"" \
    '$1 ~ /^churn_throttler_http_requests_total\{/ && index($1, e) && (c == "code=\"\"" || index($1, c)) {s += $2} END {print s + 0}' <<<"$metrics"
}
# Each client's summary: "N sent in Ts (R/s), D dropped (...), E errors (...)". Its exit
# code: 0, or 2 when a request failed or was dropped; anything else is a crash (no summary
# to trust), and a code that disagrees with the summary is a failure too.
check_load() { # check_load NAME LOG RC EXPECTED: EXPECTED = rate x seconds, what it should send
  local line sent dropped errors rc="$3" expected="$4" counted all
  line="$(grep -m1 '^review_load: [0-9]* sent' "$2")"
  sent="$(sed -n 's/^review_load: \([0-9]*\) sent.*/\1/p' <<<"$line")"
  dropped="$(sed -n 's/.*, \([0-9]*\) dropped.*/\1/p' <<<"$line")"
  errors="$(sed -n 's/.*, \([0-9]*\) errors.*/\1/p' <<<"$line")"
  if [[ "$rc" != 0 && "$rc" != 2 ]]; then bad "$1: the load client exited $rc: $(tail -n 2 "$2")"; return; fi
  if [[ -z "$sent" || -z "$dropped" || "$errors" != 0 ]]; then bad "$1 (exit $rc): ${line:-no summary}"; return; fi
  if { [[ "$rc" == 0 ]] && (( dropped > 0 )); } || { [[ "$rc" == 2 ]] && (( dropped == 0 )); }; then
    bad "$1: exit code $rc disagrees with its summary ($line)"; return
  fi
  if (( (sent + dropped) * 100 < expected * 99 )); then bad "$1: $((sent + dropped)) requests of the $expected due"; return; fi
  ok "$1: $sent answered of $expected due, 0 errors"
  # What the client saw against what the server counted: every request the client sent
  # answered once with HTTP 200, and no answer the client did not see.
  counted="$(server_answers "${1#/}" 200)" all="$(server_answers "${1#/}")"
  if (( sent > 0 && counted == sent && all == sent )); then ok "$1: the server counted $counted answers, all HTTP 200, as many as the client sent"
  else bad "$1: the client sent $sent and saw 200 for each; the server counted $all answers, $counted of them HTTP 200"; fi
  # Dropped: the client had too many requests in flight (the server fell behind).
  if (( dropped * 100 <= (sent + dropped) )); then ok "$1: $dropped dropped by the client (<= 1 %)"; else bad "$1: $dropped of $((sent + dropped)) dropped by the client (> 1 %)"; fi
}
check_load /validate "$W/load-validate.log" "$rc1" $((validate_rate * run_s))
check_load /mutate "$W/load-mutate.log" "$rc2" $((mutate_rate * run_s))

non200=$(awk '/^churn_throttler_http_requests_total/ && $0 !~ /code="200"/ {s += $2} END {print s + 0}' <<<"$metrics")
answered=$(awk '/^churn_throttler_http_requests_total/ {s += $2} END {print s + 0}' <<<"$metrics")
decisions=$(awk '/^churn_throttler_decisions_total/ {split($1, a, "action=\""); split(a[2], b, "\""); s[b[1]] += $2} END {for (k in s) printf "%s=%d ", k, s[k]}' <<<"$metrics")
(( answered > 0 && non200 == 0 )) && ok "server: $answered answers, none other than HTTP 200" || bad "server: $non200 of $answered answers were not HTTP 200"
say "decisions: $decisions"
say "limiter: $(awk '/^churn_throttler_(buckets|reservations_open|held_requests) / {printf "%s=%s ", $1, $2}' <<<"$metrics")"

# Memory over the whole run after the warm-up in which docs/soak.md shows it growing.
say "RSS at the end: $rss_end kB"
if python3 "$here/rss_report.py" "$W/rss" "$run_s" "$warmup_s" >"$W/rss-report" 2>&1; then
  head -n1 "$W/rss-report" | sed 's/^/soak: /'
  case "$(tail -n1 "$W/rss-report")" in
    FLAT) ok "memory flat after the warm-up (growth by the fitted slope over the span, and its largest RSS, <= 1.05 x the span's first + 2 MiB)" ;;
    NOT-STEADY) bad "the reservations were still filling in the run's last third: no steady span to judge memory by ($(head -n1 "$W/rss-report"))" ;;
    *) bad "memory grows: $(head -n1 "$W/rss-report")" ;;
  esac
else
  bad "rss_report.py: $(tail -n1 "$W/rss-report")"
fi
kill -0 "$SERVER" 2>/dev/null && ok "server still running" || bad "server died"
finish
