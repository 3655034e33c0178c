#!/usr/bin/env bash
# Bad input and faults against a real `churn-throttler serve` process over HTTPS (curl),
# with figures: for each case the HTTP status, the first words of the answer and the
# time to answer; then a broken policy and a mismatched key pair written while it runs
# (hot reload), and the server's own counters. Complements tests/server.rs (which asserts
# the same cases through the router) with what an operator sees from outside.
# Last line: `faults: N passed, M failed`. See docs/faults.md.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
f="$root/tests/fixtures"
passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "faults: FAIL: $*" >&2; }

target_dir="${CARGO_TARGET_DIR:-$root/target}"
if [[ -z "${CHURN_THROTTLER_BIN:-}" ]]; then
  (cd "$root" && cargo build --quiet --bin churn-throttler) || { echo "faults: cargo build failed"; echo "faults: 0 passed, 1 failed"; exit 1; }
  CHURN_THROTTLER_BIN="$target_dir/debug/churn-throttler"
fi
W="$(mktemp -d /tmp/faults.XXXXXX)"
SERVER=""
cleanup() {
  if [[ -n "$SERVER" ]]; then
    kill -TERM "$SERVER" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER" 2>/dev/null
  fi
  rm -rf "$W"
}
trap cleanup EXIT

# The built-in policy with plain windows (burst = events): the paced cases below send
# distinct copies back to back and count how many fit before the 429, which a spaced
# limit would hold one spacing each instead (the spacing has its own tests).
"$CHURN_THROTTLER_BIN" default-policy | sed -E 's/events: ([0-9]+), window: ([0-9a-z]+), scope: global \}/events: \1, window: \2, scope: global, burst: \1 }/' >"$W/policy.yaml"
grep -q 'burst: 20 }' "$W/policy.yaml" || { echo "faults: could not give the policy plain windows" >&2; exit 1; }
"$CHURN_THROTTLER_BIN" serve --dev --pod-cache=false --dev-dir "$W/dev" --config "$W/policy.yaml" \
  --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --reload-interval 200ms \
  --max-body-bytes 1048576 --shutdown-delay 0s >"$W/serve.log" 2>&1 &
SERVER=$!
# Port 0: --dev prints the bound addresses (its curl line and the metrics line).
for _ in $(seq 1 100); do grep -q '^Metrics: curl' "$W/serve.log" 2>/dev/null && break; sleep 0.1; done
port="$(grep -o 'https://localhost:[0-9]*' "$W/serve.log" | head -n1 | sed 's/.*://')"
mport="$(grep -o 'Metrics: curl http://127.0.0.1:[0-9]*' "$W/serve.log" | head -n1 | sed 's/.*://')"
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$mport/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
ca="$W/dev/ca.crt"
url="https://localhost:$port"

# edit FIXTURE PYTHON-EXPR: the fixture with `r` (the review) changed by the expression.
edit() {
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); $2; print(json.dumps(r))" "$f/$1.json"
}
printf 'x%.0s' $(seq 1 2000000) | sed 's/^/{"pad":"/; s/$/"}/' >"$W/big.json"
printf '%s' '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":' >"$W/truncated.json"
edit pod-delete-running 'r["request"]["kind"]["version"]="v2"; r["request"]["resource"]["version"]="v2"' >"$W/pod-v2.json"
edit statefulset-partition-lower 'r["request"]["kind"]["version"]="v1beta1"; r["request"]["resource"]["version"]="v1beta1"; r["request"]["object"]["apiVersion"]="apps/v1beta1"; r["request"]["oldObject"]["apiVersion"]="apps/v1beta1"' >"$W/sts-v1beta1.json"
edit configmap-create 'r["request"]["kind"]={"group":"batch","version":"v1","kind":"CronJob"}; r["request"]["resource"]={"group":"batch","version":"v1","resource":"cronjobs"}' >"$W/cronjob.json"
edit pod-eviction 'r["request"]["object"]="a string"' >"$W/eviction-bad-object.json"
edit pod-eviction 'r["apiVersion"]="admission.k8s.io/v1beta1"' >"$W/review-v1beta1.json"

printf '%-44s %-6s %-8s %s\n' "case" "status" "ms" "answer"
# case NAME WANT-STATUS CURL-ARGS...: one request, its figures, and the check.
case_() {
  local name="$1" want="$2"; shift 2
  local out status ms try
  for (( try = 1; try <= ${TRIES:-1}; try++ )); do
  out="$(curl -sS --cacert "$ca" -o "$W/body" -w '%{http_code} %{time_total}' "$@" 2>"$W/curl.err")"; [[ -s "$W/curl.err" ]] && echo "faults: curl: $(cat "$W/curl.err")" >&2
  status="${out% *}"; ms="$(python3 -c "print(round(${out#* } * 1000, 1))")"
  [[ "$status" != 000 && "$status" != 100 ]] && break
  done
  printf '%-44s %-6s %-8s %s\n' "$name" "$status" "$ms" "$(head -c 110 "$W/body" | tr '\n' ' ')"
  if [[ "$status" == "$want" ]]; then ok; else bad "$name: HTTP $status, expected $want"; fi
}
j=(-H 'Content-Type: application/json')
metric() { curl -s "http://127.0.0.1:$mport/metrics" | awk -v s="$1" '$1==s {print $2}'; }
# metric_sum NAME [LABEL="VALUE"]: the sum over the series of NAME (with that label).
metric_sum() {
  curl -s "http://127.0.0.1:$mport/metrics" \
    | awk -v n="$1" -v l="${2:-}" '($1 == n || index($1, n "{") == 1) && index($1, l) > 0 {s += $2} END {print s + 0}'
}
# answer_is NAME REVIEW APIVERSION ALLOWED: the last answer ($W/body) is an AdmissionReview
# of that version, for that review's uid, allowed or not.
answer_is() {
  local why
  if why="$(python3 -c 'import json,sys
a, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
got = (a.get("apiVersion"), a.get("kind"), a.get("response", {}).get("uid"), a.get("response", {}).get("allowed"))
want = (sys.argv[3], "AdmissionReview", r["request"]["uid"], sys.argv[4] == "true")
sys.exit(0 if got == want else "answer %s, expected %s" % (got, want))' "$W/body" "$2" "$3" "$4" 2>&1)"; then ok; else bad "$1: $why"; fi
}
# paced_case NAME RULE REVIEW PATH [COST]: answered 200 and allowed, decided by RULE (its
# decisions counter grows by one, the unhandled counter does not), and charged: paced, not
# waved through. COST: events per request (a partition lowered by 2 releases 2 pods).
paced_case() {
  local name="$1" rule="$2" review="$3" path="$4" d0 u0 d1 u1
  d0=$(metric_sum churn_throttler_decisions_total "rule=\"$rule\"") u0=$(metric_sum churn_throttler_unhandled_requests_total)
  case_ "$name" 200 "${j[@]}" --data-binary @"$review" "$url/$path"
  answer_is "$name" "$review" admission.k8s.io/v1 true
  d1=$(metric_sum churn_throttler_decisions_total "rule=\"$rule\"") u1=$(metric_sum churn_throttler_unhandled_requests_total)
  if (( d1 == d0 + 1 && u1 == u0 )); then ok; else bad "$name: decisions of rule $rule $d0 -> $d1, unhandled $u0 -> $u1 (expected +1, +0)"; fi
  # Charged like v1: distinct copies (own uid, name and object uid), sent back to back by
  # one process (well inside the 10 s window: slower, the window would slide or the
  # 2 s maxHold would hold them) are allowed until the rule's window holds the default
  # policy's limit of 20 events, then refused with 429 (retry-after).
  local copies
  copies="$(python3 - "$review" "$url/$path" "$ca" "$(metric_sum churn_throttler_decisions_total "rule=\"$rule\"")" <<'PY'
import json, ssl, sys, urllib.request
review, url, ca, before = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ctx = ssl.create_default_context(cafile=ca)
base = json.load(open(review))
answers = []
for n in range(1, 31):
    r = json.loads(json.dumps(base))
    q = r["request"]
    q["uid"] = "00000000-0000-4000-9000-%012d" % n
    q["name"] = "copy-%d" % n
    for o in (q.get("object"), q.get("oldObject")):
        if isinstance(o, dict):
            o.setdefault("metadata", {}).update(name=q["name"], uid="00000000-0000-4000-8000-%012d" % n)
    req = urllib.request.Request(url, data=json.dumps(r).encode(), headers={"Content-Type": "application/json"})
    a = json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["response"]
    answers.append("A" if a["allowed"] else str(a.get("status", {}).get("code")))
    if not a["allowed"]:
        break
print(before, "".join(x if x == "A" else "R" for x in answers), answers[-1])
PY
)" || copies="error"
  local before pattern last
  read -r before pattern last <<<"$copies"
  printf '%-44s %-6s %-8s %s\n' "  ...then distinct copies" "-" "-" "${pattern:-$copies} (A allowed, R refused) after $before decided: last answer $last"
  # The case's own request is charged: 1 + the allowed copies, times the cost, is the limit.
  local allowed_copies="${pattern//R/}"
  if [[ "$last" == 429 ]] && (( (1 + ${#allowed_copies}) * ${5:-1} == 20 )); then ok; else
    bad "$name: the copies were not charged like v1 (limit 20, cost ${5:-1} each): $copies"; fi
}
case_ "malformed JSON (tests/fixtures/malformed)" 400 "${j[@]}" --data-binary @"$f/malformed.json" "$url/validate"
case_ "truncated JSON" 400 "${j[@]}" --data-binary @"$W/truncated.json" "$url/validate"
case_ "empty body" 400 "${j[@]}" --data-binary '' "$url/validate"
case_ "wrong content type (text/plain)" 415 -H 'Content-Type: text/plain' --data-binary @"$f/pod-eviction.json" "$url/validate"
case_ "no content type" 415 -H 'Content-Type:' --data-binary @"$f/pod-eviction.json" "$url/mutate"
# The server answers 413 and closes while curl may still be sending the 2 MB: curl may
# then report a broken pipe instead of the answer, so this case gets up to 3 tries.
TRIES=3 case_ "oversized body (2 MB, limit 1 MiB)" 413 --http1.1 "${j[@]}" --data-binary @"$W/big.json" "$url/mutate"
case_ "review without request" 400 "${j[@]}" --data-binary @"$f/review-without-request.json" "$url/validate"
case_ "review without uid" 400 "${j[@]}" --data-binary @"$f/review-without-uid.json" "$url/validate"
case_ "request.object a string, not an object" 400 "${j[@]}" --data-binary @"$W/eviction-bad-object.json" "$url/validate"
paced_case "pods review of version v2 (allowed, paced)" controller-deletes "$W/pod-v2.json" validate
paced_case "apps/v1beta1 StatefulSet (allowed, paced)" partition-steps "$W/sts-v1beta1.json" validate 2
case_ "unknown kind: batch/v1 CronJob (allowed)" 200 "${j[@]}" --data-binary @"$W/cronjob.json" "$url/mutate"
answer_is "unknown kind: batch/v1 CronJob" "$W/cronjob.json" admission.k8s.io/v1 true
case_ "AdmissionReview admission.k8s.io/v1beta1" 200 "${j[@]}" --data-binary @"$W/review-v1beta1.json" "$url/validate"
answer_is "AdmissionReview admission.k8s.io/v1beta1" "$W/review-v1beta1.json" admission.k8s.io/v1beta1 true
case_ "GET /validate" 405 "$url/validate"
case_ "unknown path" 404 "$url/nope"
wait_metric() { # wait_metric SERIES VALUE
  for _ in $(seq 1 50); do [[ "$(metric "$1")" == "$2" ]] && return 0; sleep 0.1; done
  return 1
}
# Plain HTTP to the TLS port: the handshake fails, nothing is served in clear text.
# Counted as the one failed handshake so far (the TLS 1.1 case below counts the next).
if curl -s --max-time 3 -o /dev/null "http://localhost:$port/validate"; then bad "plain HTTP was answered"
elif wait_metric 'churn_throttler_bad_requests_total{reason="tls-handshake"}' 1; then ok
else bad "plain HTTP: not counted as a failed handshake ($(metric 'churn_throttler_bad_requests_total{reason="tls-handshake"}'))"; fi
printf '%-44s %-6s %-8s %s\n' "plain HTTP to the TLS port" "-" "-" "refused (TLS handshake error)"
# TLS 1.1: curl's OpenSSL refuses TLS 1.1 itself at its default security level, so a
# failure proves nothing until the same client has spoken TLS 1.1 to a server that accepts
# it: openssl s_server with the server's own certificate, TLS 1.1 only, security level 0.
# Then the refusal must be the server's: an alert it sent (rustls answers a TLS 1.1 hello
# with handshake_failure), counted as a failed handshake on its side.
tls11=(--tlsv1.1 --tls-max 1.1 --ciphers 'DEFAULT@SECLEVEL=0' --cacert "$ca")
openssl s_server -accept 127.0.0.1:0 -tls1_1 -cipher 'DEFAULT@SECLEVEL=0' -www \
  -cert "$W/dev/tls.crt" -key "$W/dev/tls.key" >"$W/s_server.log" 2>&1 &
control=$!
for _ in $(seq 1 50); do grep -q '^ACCEPT' "$W/s_server.log" && break; sleep 0.1; done
cport="$(sed -n 's/^ACCEPT 127.0.0.1://p' "$W/s_server.log")"
if curl -sS --max-time 3 "${tls11[@]}" -o /dev/null "https://localhost:${cport:-1}/" 2>"$W/tls11-control.err"; then ok
else bad "the TLS 1.1 client could not speak TLS 1.1 to a server that accepts it, so its refusal below would prove nothing: $(cat "$W/tls11-control.err")"; fi
kill -TERM "$control" 2>/dev/null; wait "$control" 2>/dev/null
printf '%-44s %-6s %-8s %s\n' "TLS 1.1 client, control server (openssl)" "-" "-" "$( [[ -s "$W/tls11-control.err" ]] && echo "failed" || echo "spoke TLS 1.1")"
if curl -sS --max-time 3 "${tls11[@]}" -o /dev/null "$url/validate" 2>"$W/tls11.err"; then bad "TLS 1.1 was accepted"
elif grep -qE 'alert (handshake failure|protocol version)' "$W/tls11.err" \
  && wait_metric 'churn_throttler_bad_requests_total{reason="tls-handshake"}' 2; then ok
else bad "TLS 1.1 failed, but not by the server's alert and a handshake failure it counted: $(cat "$W/tls11.err")"; fi
printf '%-44s %-6s %-8s %s\n' "TLS 1.1 client" "-" "-" "refused: $(sed 's/^curl: //' "$W/tls11.err" | head -c 90)"

# A broken policy while serving: refused, the last good one stays.
rules_before="$(metric churn_throttler_policy_rules)"
rules_in_file="$(grep -c '^  - name: ' "$W/policy.yaml")"
echo "rules: [" >"$W/policy.yaml"
if wait_metric 'churn_throttler_reloads_total{kind="policy",result="error"}' 1; then ok; else bad "broken policy not reported"; fi
line="$(grep -m1 'policy not reloaded' "$W/serve.log" | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*policy not reloaded/policy not reloaded/' | head -c 150)"
printf '%-44s %-6s %-8s %s\n' "broken policy written (hot reload)" "-" "-" "$line"
rules_after="$(metric churn_throttler_policy_rules)"
[[ "$rules_before" == "$rules_in_file" && "$rules_after" == "$rules_in_file" ]] && ok \
  || bad "the last good policy ($rules_in_file rules) is not in force: $rules_before rules before the broken file, $rules_after after"
# A key that does not match the certificate: refused, the last good pair keeps serving.
"$CHURN_THROTTLER_BIN" serve --dev --pod-cache=false --dev-dir "$W/other" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 >/dev/null 2>&1 &
other=$!
for _ in $(seq 1 50); do [[ -s "$W/other/tls.key" ]] && break; sleep 0.1; done
kill -TERM "$other" 2>/dev/null; wait "$other" 2>/dev/null
cp "$W/other/tls.key" "$W/dev/tls.key"
if wait_metric 'churn_throttler_reloads_total{kind="certificate",result="error"}' 1; then ok; else bad "mismatched key not reported"; fi
line="$(grep -m1 'certificate not reloaded' "$W/serve.log" | sed 's/\x1b\[[0-9;]*m//g' | sed 's/.*certificate not reloaded/certificate not reloaded/' | head -c 150)"
printf '%-44s %-6s %-8s %s\n' "mismatched key written (hot reload)" "-" "-" "$line"
case_ "a review after both bad reloads" 200 "${j[@]}" --data-binary @"$f/pod-eviction.json" "$url/validate"
echo
echo "counters: $(curl -s "http://127.0.0.1:$mport/metrics" | grep -E '^churn_throttler_(bad_requests_total|unhandled_requests_total|reloads_total)' | tr '\n' ' ')"
kill -0 "$SERVER" 2>/dev/null && ok || bad "the server died"
echo "faults: $passed passed, $failed failed"
(( failed == 0 ))
