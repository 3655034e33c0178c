#!/usr/bin/env bash
# Scaffolding shared by the end-to-end suites that run churn-throttler against the control
# plane of cluster.sh (partition.sh, slowpods.sh, maxunavailable.sh, status.sh, replay.sh,
# releaser.sh, budget.sh, forged.sh): counters and messages, the build step, the work dir
# and what is stopped on exit, bounded waits. Sourcing it also sources cluster.sh
# (cluster_up, cluster_down, ...). It only defines things; each suite calls what it needs,
# in this order:
#
#   # shellcheck source-path=SCRIPTDIR       # (before the first command) shellcheck -x
#                                            # then follows lib.sh from any directory
#   here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
#   # shellcheck source=lib.sh
#   source "$here/lib.sh"
#   e2e_suite partition PARTITION_E2E_KEEP   # NAME (message prefix) and the KEEP variable's name
#   timeout="${PARTITION_E2E_TIMEOUT:-240}"  # seconds per wait_for, the suite's own variable
#   e2e_die_logs() { e2e_tail_logs 15 'replica-*.log'; }   # optional: what die shows
#   e2e_before_cleanup() { ...; }            # optional: run first on exit; must return 0
#   e2e_build                                # CHURN_THROTTLER_BIN, E2E_BIN (exported)
#   e2e_workdir                              # W, the EXIT and INT/TERM traps
#   ... ok / bad / die / wait_for / PROC[name]=$! ...
#   e2e_finish                               # the last line; non-zero if a check failed
#
# e2e_suite NAME KEEP_VAR [--poll SECS] [--quiet-down]
#   --poll SECS      wait_for's poll interval (default 0.2)
#   --quiet-down     cluster_down's messages on exit go to /dev/null
#
# What it defines:
#   passed, failed            the counters
#   say MSG                   "NAME: MSG" on stdout
#   ok MSG                    passed + 1, "NAME: ok: MSG"
#   bad MSG                   failed + 1, "NAME: FAIL: MSG" on stderr
#   die MSG                   bad MSG, e2e_die_logs, "NAME: N passed, M failed", exit 1
#   e2e_finish                "NAME: N passed, M failed", status 0 only if nothing failed
#   now_ms, secs MS           the clock in ms; MS printed as seconds with 3 decimals
#   e2e_build                 `cargo build --quiet "${E2E_CARGO_ARGS[@]}"` (an array, empty
#                             unless the suite sets it after e2e_suite) and CHURN_THROTTLER_BIN,
#                             unless that is set; then e2e_cluster_bins
#   e2e_cluster_bins          E2E_BIN from build-binaries.sh unless set, exported
#   e2e_workdir               W="$(mktemp -d /tmp/NAME-e2e.XXXXXX)" (a NAME ending in -e2e
#                             is not doubled), the traps
#   PROC                      name -> pid of every process to stop on exit
#   stop_proc PID [SIG]       SIG (TERM), up to 5 s, then KILL
#   wait_for DESC CMD...      poll CMD until it succeeds; die after $timeout s
#   numeric EXPR              (( EXPR )) for a check on numbers read from a report or a
#                             scrape: fails, saying why, when a value is missing or not a
#                             number (null, None, True, 1.5, empty), which (( )) reads as 0
#   e2e_tail_logs LINES GLOB  for e2e_die_logs: the tail of each file of $W matching GLOB
#   e2e_tail_log LINES FILE   for e2e_die_logs: the tail of $W/FILE
#   e2e_kubeconfig SA_NS SA FILE
#                             a kubeconfig at FILE (mode 600) with a 2 h token of that
#                             ServiceAccount, for a process that must act as it
#   e2e_audit_args            kube-apiserver flags for an audit log of $W/audit-policy.yaml
#                             in $W/logs/audit.log (JSON lines, never rotated)
#   e2e_metrics_addr LOG      the metrics address a `serve --log-format json` log announced
#   lease_holder, holder_is ID   the releaser Lease's holder (is ID); each read waits at
#                             most $E2E_LEASE_TIMEOUT (default 20s)
#   scrape NAME, keep_scrape NAME
#                             /metrics of the replica whose address is $W/metrics-NAME.addr;
#                             keep_scrape saves it to $W/metrics-NAME.last (a killed
#                             process's counters die with it)
#   e2e_install_webhook FIELD_MANAGER
#                             manifests/overlays/e2e-local rendered for a webhook on
#                             127.0.0.1:$WH_PORT (a free port, set here) with the cluster's
#                             serving certificate, applied server-side, then
#                             $W/releaser.kubeconfig as churn-throttler's ServiceAccount
# On exit: e2e_before_cleanup, stop_proc on every PROC, cluster_down "$W", then $W is
# removed unless KEEP_VAR is 1 or the suite failed (then "NAME: work dir kept: W").

# shellcheck source-path=SCRIPTDIR
E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
E2E_ROOT="$(cd "$E2E_DIR/../.." && pwd)"
# shellcheck source=cluster.sh
source "$E2E_DIR/cluster.sh"

# e2e_suite NAME KEEP_VAR [OPTION...]: see the header.
e2e_suite() {
  E2E_NAME="$1" E2E_KEEP_VAR="$2"
  shift 2
  E2E_POLL=0.2 E2E_QUIET_DOWN=0
  while (( $# )); do
    case "$1" in
      --poll) E2E_POLL="$2"; shift ;;
      --quiet-down) E2E_QUIET_DOWN=1 ;;
      *) echo "e2e_suite: unknown option $1" >&2; return 2 ;;
    esac
    shift
  done
  E2E_CARGO_ARGS=()
  passed=0
  failed=0
  declare -gA PROC=()   # process name -> pid
}

say() { echo "$E2E_NAME: $*"; }
now_ms() { date +%s%3N; }
secs() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }
ok() { passed=$((passed + 1)); say "ok: $*"; }
bad() { failed=$((failed + 1)); echo "$E2E_NAME: FAIL: $*" >&2; }
die() {
  bad "$*"
  e2e_die_logs
  echo "$E2E_NAME: $passed passed, $failed failed"
  exit 1
}
e2e_finish() {
  echo "$E2E_NAME: $passed passed, $failed failed"
  (( failed == 0 ))
}

# Hooks, redefined by a suite after sourcing. Both run under errexit: they must return 0.
e2e_die_logs() { :; }
e2e_before_cleanup() { :; }

# e2e_tail_logs LINES GLOB: the last LINES lines of each file of $W matching GLOB, on
# stderr, each under "----- tail PATH -----". $W is unset when the build step dies.
e2e_tail_logs() {
  local lines="$1" f
  # shellcheck disable=SC2086  # $2 is a glob, expanded here on purpose
  for f in "${W:-/nonexistent}"/$2; do
    if [[ -f "$f" ]]; then echo "----- tail $f -----" >&2; tail -n "$lines" "$f" >&2; fi
  done
}
# e2e_tail_log LINES FILE: the same for the one file $W/FILE, under "----- tail FILE -----".
e2e_tail_log() {
  if [[ -f "${W:-/nonexistent}/$2" ]]; then echo "----- tail $2 -----" >&2; tail -n "$1" "$W/$2" >&2; fi
}

# ---- build -------------------------------------------------------------------
# CHURN_THROTTLER_BIN set: no cargo build (e.g. a release binary, or CI's own build).
e2e_build() {
  if [[ -z "${CHURN_THROTTLER_BIN:-}" ]]; then
    (cd "$E2E_ROOT" && cargo build --quiet "${E2E_CARGO_ARGS[@]}") || die "cargo build failed"
    CHURN_THROTTLER_BIN="${CARGO_TARGET_DIR:-$E2E_ROOT/target}/debug/churn-throttler"
  fi
  [[ -x "$CHURN_THROTTLER_BIN" ]] || die "no binary at $CHURN_THROTTLER_BIN"
  e2e_cluster_bins
}
# cluster_up reads E2E_BIN from the environment; build-binaries.sh prints the bin dir last.
e2e_cluster_bins() {
  if [[ -z "${E2E_BIN:-}" ]]; then
    E2E_BIN="$("$E2E_DIR/build-binaries.sh" | tail -n1)" || die "build-binaries.sh failed"
  fi
  export E2E_BIN
}

# ---- work dir, processes, exit -------------------------------------------------------
e2e_workdir() {
  W="$(mktemp -d "/tmp/${E2E_NAME%-e2e}-e2e.XXXXXX")"
  trap e2e_cleanup EXIT
  # INT/TERM end the script through exit, so the EXIT trap still cleans up.
  trap 'exit 130' INT TERM
}

stop_proc() {
  local pid="$1" sig="${2:-TERM}"
  kill -"$sig" "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

e2e_cleanup() {
  local rc=$? name
  e2e_before_cleanup
  for name in "${!PROC[@]}"; do stop_proc "${PROC[$name]}"; done
  if (( E2E_QUIET_DOWN )); then
    cluster_down "$W" >/dev/null 2>&1 || true
  else
    cluster_down "$W" || true
  fi
  # A failed run's logs (and audit log) are what there is to look at afterwards.
  if [[ "${!E2E_KEEP_VAR:-0}" == 1 || $rc -ne 0 || $failed -ne 0 ]]; then
    echo "$E2E_NAME: work dir kept: $W" >&2
  else
    rm -rf "$W"
  fi
}

# numeric EXPR: see the header. Every word of EXPR between operators must be an integer
# or the name of a variable holding one, and EXPR must parse (an empty value leaves an
# operator without its operand); then it is (( EXPR )).
numeric() {
  local expr="$*" word err
  for word in $(tr -s '()<>=!&|+*/%?:,-' ' ' <<<"$expr"); do
    [[ "$word" =~ ^[0-9]+$ ]] && continue
    [[ "$word" =~ ^[A-Za-z_][A-Za-z0-9_]*$ && "${!word-}" =~ ^-?[0-9]+$ ]] && continue
    [[ "$word" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] && word="$word (= '${!word-unset}')"
    echo "$E2E_NAME: not a number: $word in: $expr" >&2
    return 1
  done
  if ! err="$( ( eval "(( $expr ))" ) 2>&1 )" && [[ -n "$err" ]]; then
    echo "$E2E_NAME: not a numeric check: $expr: $err" >&2
    return 1
  fi
  eval "(( $expr ))"
}

# wait_for DESC CMD...: poll CMD every $E2E_POLL s until it succeeds or $timeout passes.
wait_for() {
  local desc="$1"; shift
  local start=$SECONDS
  # timeout: each suite sets its own (from its *_TIMEOUT variable); cluster.sh's is another.
  # shellcheck disable=SC2154,SC2031
  until "$@" >/dev/null 2>&1; do
    (( SECONDS - start < timeout )) || die "timed out after ${timeout}s waiting for: $desc"
    sleep "$E2E_POLL"
  done
}

# e2e_kubeconfig SA_NAMESPACE SA FILE: see the header.
e2e_kubeconfig() {
  local token
  token="$(kubectl -n "$1" create token "$2" --duration=2h)"
  _cl_kubeconfig "$3" "$APISERVER_URL" "$CLUSTER_CA_FILE" "$token" "$2"
}

# e2e_install_webhook FIELD_MANAGER: see the header. Needs $W/env sourced (cluster_up).
e2e_install_webhook() {
  read -r WH_PORT < <(_cl_free_ports 1)
  cluster_issue_serving_cert "$W" webhook >/dev/null
  kubectl --request-timeout=20s kustomize "$E2E_ROOT/manifests/overlays/e2e-local" \
    | sed -e "s#__WEBHOOK_URL__#https://127.0.0.1:${WH_PORT}#g" \
          -e "s#__CA_BUNDLE__#$(base64 -w0 <"$CLUSTER_CA_FILE")#g" >"$W/e2e-local.yaml"
  ! grep -q '__' "$W/e2e-local.yaml" || die "a placeholder is left in the rendered overlay"
  kubectl --request-timeout=20s apply --server-side --field-manager="$1" -f "$W/e2e-local.yaml" >/dev/null \
    || die "server-side apply of manifests/overlays/e2e-local failed"
  wait_for "ServiceAccount churn-throttler" kubectl -n churn-throttler get serviceaccount churn-throttler
  e2e_kubeconfig churn-throttler churn-throttler "$W/releaser.kubeconfig"
}

# e2e_audit_args: see the header.
e2e_audit_args() {
  echo "--audit-policy-file=$W/audit-policy.yaml --audit-log-path=$W/logs/audit.log --audit-log-format=json --audit-log-maxsize=0"
}

# e2e_metrics_addr LOG: see the header.
e2e_metrics_addr() {
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try: e = json.loads(line)
    except ValueError: continue
    f = e.get("fields", {})
    if f.get("message") == "churn-throttler serving":
        print(f["metrics_addr"]); break
PY
}

lease_holder() {
  kubectl --request-timeout="${E2E_LEASE_TIMEOUT:-20s}" -n churn-throttler get lease churn-throttler-releaser -o jsonpath='{.spec.holderIdentity}' 2>/dev/null
}
holder_is() { [[ "$(lease_holder)" == "$1" ]]; }
scrape() { curl -fsS --max-time 2 "http://$(cat "$W/metrics-$1.addr")/metrics"; }
keep_scrape() { scrape "$1" >"$W/metrics-$1.last" 2>/dev/null || true; }
