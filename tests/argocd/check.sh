#!/usr/bin/env bash
# The Argo CD health check of docs/argocd/statefulset-health.lua, run by Debian's Lua 5.4
# (installed with apt-get when missing, with lua-cjson) through tests/argocd/health.lua,
# which evaluates it as Argo CD does: the object in the global `obj`, {status, message}
# returned.
#
#   check.sh                 the fixtures (no cluster): held at the start of a rollout and
#                            mid-rollout -> Progressing; rolling without a hold -> the
#                            built-in logic (Progressing, a pod not Ready); done -> Healthy.
#   check.sh --print FILE... one line per StatefulSet of each file (an object or a List, as
#                            `kubectl get sts -o json` writes): namespace/name, status,
#                            held|free, message. tests/e2e/partition.sh runs it on the
#                            StatefulSets of its control plane, held and done.
#
# The fixtures have the shape of the e2e's StatefulSets (tests/e2e/partition.sh); to take
# fresh ones from a real API server: PARTITION_E2E_KEEP=1 bash tests/e2e/partition.sh,
# then pick items of $W/argocd-held.json and $W/argocd-final.json.
# Last line: `argocd: N passed, M failed` (exit 1 when M > 0).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1

SCRIPT=docs/argocd/statefulset-health.lua
HARNESS=tests/argocd/health.lua
passed=0
failed=0
say() { echo "argocd: $*"; }
ok() { passed=$((passed + 1)); say "ok: $*"; }
bad() { failed=$((failed + 1)); echo "argocd: FAIL: $*" >&2; }
finish() { echo "argocd: $passed passed, $failed failed"; (( failed == 0 )); exit $?; }

if ! command -v lua5.4 >/dev/null 2>&1 || ! lua5.4 -e 'require "cjson"' >/dev/null 2>&1; then
  say "installing lua5.4 and lua-cjson (apt-get)"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq lua5.4 lua-cjson; } >"${TMPDIR:-/tmp}/argocd-lua-install.log" 2>&1; then
    tail -n 20 "${TMPDIR:-/tmp}/argocd-lua-install.log" >&2
    bad "apt-get install lua5.4 lua-cjson failed"
    finish
  fi
fi

if [[ "${1:-}" == --print ]]; then
  shift
  exec lua5.4 "$HARNESS" "$SCRIPT" "$@"
fi

# fixture, expected status, text expected in the message
cases=(
  "held-start.json|Progressing|churn-throttler holds this rollout at partition 3 and lowers it to 0"
  "held-mid.json|Progressing|at partition 2 and lowers it to 0 one pod at a time (rule sts-rollouts); 1 of 3 pods updated, 3 ready"
  "rolling-free.json|Progressing|Waiting for 1 pods to be ready..."
  "done.json|Healthy|partitioned roll out complete: 3 new pods have been updated..."
)
for case in "${cases[@]}"; do
  IFS='|' read -r file want text <<<"$case"
  if ! line="$(lua5.4 "$HARNESS" "$SCRIPT" "tests/argocd/fixtures/$file" 2>&1)"; then
    bad "$file: $line"
    continue
  fi
  status="$(cut -f2 <<<"$line")"
  message="$(cut -f4- <<<"$line")"
  if [[ "$status" == "$want" && "$message" == *"$text"* ]]; then
    ok "$file: $status ($message)"
  else
    bad "$file: want $want with \"$text\", got: $line"
  fi
done

# Why the check exists: without its churn-throttler branch (the built-in logic), the
# rollout held at its start is Healthy. The same script, the annotation removed.
stripped="${TMPDIR:-/tmp}/argocd-held-start-stripped.$$.json"
python3 -c '
import json, sys
o = json.load(open(sys.argv[1]))
o["metadata"]["annotations"].pop("churn-throttler.io/partition-target")
json.dump(o, open(sys.argv[2], "w"))' tests/argocd/fixtures/held-start.json "$stripped"
line="$(lua5.4 "$HARNESS" "$SCRIPT" "$stripped" 2>&1)"
rm -f "$stripped"
[[ "$(cut -f2 <<<"$line")" == Healthy ]] \
  && ok "the same held object seen by the built-in logic alone is Healthy ($(cut -f4- <<<"$line"))" \
  || bad "built-in logic on the held object: $line"

# docs/partition.md shows the script: the same text as the file.
python3 -c '
import sys
doc, lua = open(sys.argv[1]).read(), open(sys.argv[2]).read()
sys.exit(0 if "```lua\n" + lua + "```" in doc else 1)' docs/partition.md "$SCRIPT" \
  && ok "docs/partition.md shows $SCRIPT as it is" || bad "docs/partition.md and $SCRIPT differ"

# Bad input: a clear error, non-zero.
if err="$(lua5.4 "$HARNESS" "$SCRIPT" /nonexistent.json 2>&1)"; then
  bad "a missing file was accepted: $err"
else
  ok "a missing file is an error"
fi
finish
