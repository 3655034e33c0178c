#!/usr/bin/env bash
# Tests certs/gen-certs.sh:
#   - without --apply: files, `openssl verify`, SANs, key/cert match, CA reuse and
#     --new-ca, RSA keys, usage errors (exit 2) and missing kubectl (exit 1);
#   - --apply against a stub kubectl that records what it is asked to do;
#   - TLS: churn-throttler `serve` with the generated pair answers /validate to a
#     client that trusts only the generated CA and dials the Service DNS name
#     ($CHURN_THROTTLER_BIN, or target/{release,debug}/churn-throttler, or under
#     $CARGO_TARGET_DIR; built with `cargo build` when there is none);
#   - --apply against a real kube-apiserver (tests/e2e/cluster.sh), after a
#     server-side apply of manifests/base: the Secret and both caBundles are
#     checked. The e2e binaries are built when missing (tests/e2e/build-binaries.sh,
#     minutes once); only CHURN_CERTS_CLUSTER=0 leaves this out (said as SKIP).
# Last line: "certs: N passed, N failed"; exit 1 on any failure.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
gen="$repo/certs/gen-certs.sh"

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "  ok   $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL $*"; }
check() { # check NAME COMMAND...
  local name="$1"; shift
  if "$@" >/dev/null 2>&1; then ok "$name"; else bad "$name"; fi
}
skip() { echo "  SKIP $*"; }

command -v openssl >/dev/null || { echo "certs: openssl is not on PATH" >&2; exit 1; }
work="$(mktemp -d)"
server_pid=""
cluster_w=""
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  [[ -n "$cluster_w" ]] && "$repo/tests/e2e/cluster.sh" down "$cluster_w" >/dev/null 2>&1 && rm -rf "$cluster_w"
  rm -rf "$work"
}
trap cleanup EXIT

sans_of() { # the SAN list, one per line, sorted, as "DNS:x" / "IP:y"
  openssl x509 -in "$1" -noout -ext subjectAltName | tail -n +2 | tr ',' '\n' \
    | sed -e 's/^ *//' -e 's/^IP Address:/IP:/' | sort
}
fingerprint() { openssl x509 -in "$1" -noout -fingerprint -sha256 | cut -d= -f2; }
same_key() { [[ "$(openssl x509 -in "$1" -noout -pubkey)" == "$(openssl pkey -in "$2" -pubout)" ]]; }
mode_of() { stat -c %a "$1"; }

echo "gen-certs.sh without --apply:"
d="$work/out"
if "$gen" -o "$d" --dns extra.example.com --ip 127.0.0.1 --ip ::1 >"$work/gen.log" 2>&1; then
  ok "runs (exit 0)"
else
  bad "runs (exit 0)"; cat "$work/gen.log"
fi
for f in ca.crt ca.key tls.crt tls.key ca-bundle.b64; do check "writes $f" test -s "$d/$f"; done
check "openssl verify -purpose sslserver tls.crt against ca.crt" \
  bash -c "openssl verify -CAfile '$d/ca.crt' -purpose sslserver '$d/tls.crt' | grep -qx '$d/tls.crt: OK'"
expected="$(printf '%s\n' DNS:churn-throttler.churn-throttler.svc DNS:churn-throttler.churn-throttler.svc.cluster.local \
  DNS:extra.example.com IP:127.0.0.1 IP:0:0:0:0:0:0:0:1 | sort)"
got="$(sans_of "$d/tls.crt")"
if [[ "$got" == "$expected" ]]; then ok "SANs are the Service names plus --dns/--ip"; else bad "SANs: got [$got] want [$expected]"; fi
check "tls.key belongs to tls.crt" same_key "$d/tls.crt" "$d/tls.key"
check "ca.key belongs to ca.crt" same_key "$d/ca.crt" "$d/ca.key"
check "CA is CA:TRUE with keyCertSign" bash -c "openssl x509 -in '$d/ca.crt' -noout -ext basicConstraints,keyUsage | grep -q 'CA:TRUE' && openssl x509 -in '$d/ca.crt' -noout -ext keyUsage | grep -q 'Certificate Sign'"
check "serving certificate is CA:FALSE, serverAuth" bash -c "openssl x509 -in '$d/tls.crt' -noout -ext basicConstraints | grep -q 'CA:FALSE' && openssl x509 -in '$d/tls.crt' -noout -ext extendedKeyUsage | grep -q 'TLS Web Server Authentication'"
check "subject CN is the Service DNS name" bash -c "openssl x509 -in '$d/tls.crt' -noout -subject | grep -q 'CN *= *churn-throttler.churn-throttler.svc'"
check "ECDSA P-256 keys by default" bash -c "openssl pkey -in '$d/tls.key' -noout -text | grep -q 'prime256v1'"
check "serving certificate valid for 365 days" bash -c "openssl x509 -in '$d/tls.crt' -noout -checkend $((364 * 86400)) && ! openssl x509 -in '$d/tls.crt' -noout -checkend $((366 * 86400))"
[[ "$(mode_of "$d/tls.key")" == 600 && "$(mode_of "$d/ca.key")" == 600 ]] && ok "keys are mode 0600" || bad "keys are mode 0600 ($(mode_of "$d/tls.key"), $(mode_of "$d/ca.key"))"
[[ "$(base64 -d <"$d/ca-bundle.b64")" == "$(cat "$d/ca.crt")" && "$(wc -l <"$d/ca-bundle.b64")" == 0 ]] \
  && ok "ca-bundle.b64 is ca.crt in base64 on one line" || bad "ca-bundle.b64 is ca.crt in base64 on one line"
check "no temporary files left in the output directory" bash -c "[[ -z \"\$(ls -A '$d' | grep -v -E '^(ca|tls)\.(crt|key)$|^ca-bundle\.b64$')\" ]]"

ca_fp="$(fingerprint "$d/ca.crt")"
tls_fp="$(fingerprint "$d/tls.crt")"
"$gen" -o "$d" >"$work/gen2.log" 2>&1 && ok "re-run exits 0" || { bad "re-run exits 0"; cat "$work/gen2.log"; }
[[ "$(fingerprint "$d/ca.crt")" == "$ca_fp" ]] && ok "re-run reuses the CA (caBundle unchanged)" || bad "re-run reuses the CA"
[[ "$(fingerprint "$d/tls.crt")" != "$tls_fp" ]] && ok "re-run makes a new serving certificate" || bad "re-run makes a new serving certificate"
check "renewed certificate verifies against the same CA" openssl verify -CAfile "$d/ca.crt" "$d/tls.crt"
"$gen" -o "$d" --new-ca >/dev/null 2>&1 && [[ "$(fingerprint "$d/ca.crt")" != "$ca_fp" ]] && ok "--new-ca makes a new CA" || bad "--new-ca makes a new CA"
check "certificate after --new-ca verifies against the new CA" openssl verify -CAfile "$d/ca.crt" "$d/tls.crt"

r="$work/rsa"
"$gen" -o "$r" --key-type rsa --days 30 --namespace other-ns --service hook >/dev/null 2>&1 && ok "--key-type rsa --days 30 --namespace --service" || bad "--key-type rsa"
check "RSA 2048 key" bash -c "openssl pkey -in '$r/tls.key' -noout -text | grep -q 'Private-Key: (2048 bit'"
check "RSA certificate verifies" openssl verify -CAfile "$r/ca.crt" -purpose sslserver "$r/tls.crt"
[[ "$(sans_of "$r/tls.crt" | tr '\n' ' ')" == "DNS:hook.other-ns.svc DNS:hook.other-ns.svc.cluster.local " ]] \
  && ok "--namespace/--service change the SANs" || bad "--namespace/--service SANs: $(sans_of "$r/tls.crt" | tr '\n' ' ')"

# A CA key that does not match its certificate is refused, not silently used.
m="$work/mismatch"; mkdir -p "$m"; cp "$d/ca.crt" "$m/ca.crt"; cp "$r/ca.key" "$m/ca.key"
"$gen" -o "$m" >"$work/mm.log" 2>&1; rc=$?
[[ $rc == 1 ]] && grep -q 'does not belong to' "$work/mm.log" && ok "mismatched ca.key/ca.crt: exit 1, says why" || bad "mismatched CA pair: rc=$rc $(cat "$work/mm.log")"

echo "usage and errors:"
"$gen" --help >"$work/help" 2>&1 && grep -q '^Usage: gen-certs.sh' "$work/help" && ok "--help prints usage, exit 0" || bad "--help"
expect_rc() { # expect_rc RC PATTERN ARGS...
  local want="$1" pat="$2"; shift 2
  local out rc
  out="$("$gen" "$@" 2>&1)"; rc=$?
  if [[ $rc == "$want" ]] && grep -q -- "$pat" <<<"$out"; then ok "$* -> exit $want, '$pat'"; else bad "$* -> rc=$rc (want $want): $out"; fi
}
expect_rc 2 "unknown argument: --bogus" --bogus
expect_rc 2 "is not an IPv4 or IPv6 address" -o "$work/x" --ip 10.0.0
expect_rc 2 "is not a DNS name" -o "$work/x" --dns 'Bad_Name'
expect_rc 2 "positive whole number" -o "$work/x" --days 0
expect_rc 2 "needs a value" -o "$work/x" --days
expect_rc 2 "must be ecdsa or rsa" -o "$work/x" --key-type dsa
expect_rc 2 "not a valid namespace name" -o "$work/x" --namespace Bad_NS
expect_rc 1 "needs kubectl" -o "$work/x" --apply --kubectl /nonexistent/kubectl
check "--opt=value form works" "$gen" --out-dir="$work/eq" --days=10
check "no files written after a usage error" test ! -e "$work/x/tls.crt"

echo "--apply with a stub kubectl:"
stub="$work/stub-kubectl"
cat >"$stub" <<'EOF'
#!/usr/bin/env bash
# Records each call (args, and stdin for apply) and plays a cluster with both
# webhook configurations holding one webhook each.
echo "ARGS $*" >>"$STUB_LOG"
case "$*" in
  *" create secret tls "*) cat <<YAML
apiVersion: v1
kind: Secret
metadata: {name: churn-throttler-tls, namespace: churn-throttler}
type: kubernetes.io/tls
data: {tls.crt: CERT, tls.key: KEY}
YAML
  ;;
  *"apply "*) echo "STDIN $(cat | tr '\n' ' ')" >>"$STUB_LOG" ;;
  *"get validatingwebhookconfiguration"*|*"get mutatingwebhookconfiguration"*) printf 1 ;;
esac
exit 0
EOF
chmod +x "$stub"
export STUB_LOG="$work/stub.log"
if "$gen" -o "$work/apply" --apply --kubectl "$stub" --context test-ctx >"$work/apply.log" 2>&1; then ok "--apply exits 0"; else bad "--apply exits 0: $(cat "$work/apply.log")"; fi
b64="$(cat "$work/apply/ca-bundle.b64" 2>/dev/null)"
check "uses --context" grep -q -- '--context test-ctx' "$STUB_LOG"
check "makes the TLS Secret from tls.crt/tls.key in the namespace" grep -q -- "-n churn-throttler create secret tls churn-throttler-tls --cert=$work/apply/tls.crt --key=$work/apply/tls.key" "$STUB_LOG"
check "applies it server-side" grep -q -- "apply --server-side" "$STUB_LOG"
for kind in validatingwebhookconfiguration mutatingwebhookconfiguration; do
  check "patches caBundle into $kind/churn-throttler" grep -qF -- "patch $kind churn-throttler --type=json -p [{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$b64\"}]" "$STUB_LOG"
done

echo "TLS handshake with the generated pair:"
bin="${CHURN_THROTTLER_BIN:-}"
if [[ -z "$bin" ]]; then
  for c in "${CARGO_TARGET_DIR:-$repo/target}"/{release,debug}/churn-throttler \
           "${CARGO_TARGET_DIR:-$repo/target}"/x86_64-unknown-linux-musl/release/churn-throttler; do
    [[ -x "$c" ]] && { bin="$c"; break; }
  done
fi
if [[ -z "$bin" ]] && (cd "$repo" && cargo build --locked --quiet --bin churn-throttler); then
  bin="${CARGO_TARGET_DIR:-$repo/target}/debug/churn-throttler"
fi
if [[ ! -x "$bin" ]]; then
  bad "no churn-throttler binary (CHURN_THROTTLER_BIN, or cargo build failed)"
elif ! command -v curl >/dev/null; then
  bad "curl is not on PATH"
else
  "$gen" -o "$work/tls" >/dev/null 2>&1
  read -r p1 p2 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
  CHURN_THROTTLER_RELEASER=false "$bin" serve --tls-cert "$work/tls/tls.crt" --tls-key "$work/tls/tls.key" \
    --listen "127.0.0.1:$p1" --metrics-listen "127.0.0.1:$p2" >"$work/serve.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$p2/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
  host=churn-throttler.churn-throttler.svc
  code="$(curl -sS -o "$work/resp.json" -w '%{http_code}' --cacert "$work/tls/ca.crt" --resolve "$host:$p1:127.0.0.1" \
    -H 'Content-Type: application/json' --data-binary @"$repo/tests/fixtures/pod-delete-running.json" \
    "https://$host:$p1/validate" 2>"$work/curl.err")"
  if [[ "$code" == 200 ]] && grep -q '"uid"' "$work/resp.json"; then
    ok "serve with the pair: /validate over TLS to $host, trusting only ca.crt -> 200 ($("$bin" --version))"
  else
    bad "serve with the pair: HTTP $code $(cat "$work/curl.err") $(tail -n5 "$work/serve.log")"
  fi
  if curl -sS -o /dev/null --cacert "$d/ca.crt" --resolve "$host:$p1:127.0.0.1" "https://$host:$p1/validate" 2>/dev/null; then
    bad "a client trusting another CA is refused"
  else
    ok "a client trusting another CA is refused"
  fi
  kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=""
fi

echo "--apply against a real API server:"
want="${CHURN_CERTS_CLUSTER:-1}"
if [[ "$want" == 0 ]]; then
  skip "CHURN_CERTS_CLUSTER=0"
elif ! e2e_bin="$(CHURN_E2E_SKIP_PROM=1 "$repo/tests/e2e/build-binaries.sh" | tail -n1)" || [[ -z "$e2e_bin" ]]; then
  bad "tests/e2e/build-binaries.sh (the control plane for --apply)"
else
  cluster_w="$(mktemp -d)"
  if ! E2E_BIN="$e2e_bin" CHURN_E2E_SKIP_PROM=1 CLUSTER_NODES=1 "$repo/tests/e2e/cluster.sh" up "$cluster_w" >"$work/cluster.log" 2>&1; then
    bad "cluster up: $(tail -n 20 "$work/cluster.log")"
  else
    # shellcheck disable=SC1091
    source "$cluster_w/env"
    kc="$(command -v kubectl)"
    kustomized="$work/base.yaml"
    if "$kc" kustomize "$repo/manifests/base" >"$kustomized" 2>"$work/kz.err" \
       && "$kc" apply --server-side --field-manager=certs-check -f "$kustomized" >"$work/apply-base.log" 2>&1; then
      ok "kubectl apply --server-side of manifests/base ($("$kc" version --client 2>/dev/null | head -n1), API server $APISERVER_URL)"
    else
      bad "apply manifests/base: $(cat "$work/kz.err" "$work/apply-base.log")"
    fi
    c="$work/cluster-certs"
    if "$gen" -o "$c" --apply --kubectl "$kc" >"$work/real-apply.log" 2>&1; then ok "gen-certs.sh --apply exits 0"; else bad "gen-certs.sh --apply: $(cat "$work/real-apply.log")"; fi
    sec_crt="$("$kc" -n churn-throttler get secret churn-throttler-tls -o 'jsonpath={.data.tls\.crt}' 2>/dev/null | base64 -d)"
    sec_type="$("$kc" -n churn-throttler get secret churn-throttler-tls -o 'jsonpath={.type}' 2>/dev/null)"
    [[ "$sec_crt" == "$(cat "$c/tls.crt")" && "$sec_type" == kubernetes.io/tls ]] \
      && ok "Secret churn-throttler/churn-throttler-tls (kubernetes.io/tls) holds tls.crt" || bad "Secret content/type ($sec_type)"
    for kind in validatingwebhookconfiguration mutatingwebhookconfiguration; do
      got="$("$kc" get "$kind" churn-throttler -o 'jsonpath={.webhooks[*].clientConfig.caBundle}' 2>/dev/null)"
      [[ "$got" == "$(cat "$c/ca-bundle.b64")" ]] && ok "$kind caBundle == ca-bundle.b64" || bad "$kind caBundle: '${got:0:40}...'"
      svc="$("$kc" get "$kind" churn-throttler -o 'jsonpath={.webhooks[0].clientConfig.service.name}' 2>/dev/null)"
      [[ "$svc" == churn-throttler ]] && ok "$kind still calls the Service after the patch" || bad "$kind clientConfig.service lost"
    done
    old="$(cat "$c/tls.crt")"
    if "$gen" -o "$c" --apply --kubectl "$kc" >"$work/real-apply2.log" 2>&1; then
      sec_crt="$("$kc" -n churn-throttler get secret churn-throttler-tls -o 'jsonpath={.data.tls\.crt}' | base64 -d)"
      [[ "$sec_crt" == "$(cat "$c/tls.crt")" && "$sec_crt" != "$old" ]] && ok "second --apply rotates the Secret in place" || bad "second --apply did not update the Secret"
    else
      bad "second --apply: $(cat "$work/real-apply2.log")"
    fi
    "$repo/tests/e2e/cluster.sh" down "$cluster_w" >/dev/null 2>&1 && rm -rf "$cluster_w"
    cluster_w=""
  fi
fi

echo "certs: $passed passed, $failed failed"
[[ $failed == 0 ]]
