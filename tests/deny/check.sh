#!/usr/bin/env bash
# cargo deny: licences, sources and bans (duplicates) of the dependency graph, against
# deny.toml; then the RustSec advisory check, which needs the advisory database from
# GitHub: when it cannot be fetched, that check is skipped with the reason, and the rest
# still runs for real. Installs cargo-deny (pinned) into ~/.cache/churn-throttler-tools.
# Last line: `deny: N passed, M failed` (exit 1 when M > 0).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1

VERSION=0.20.2
ROOT="${CHURN_TOOLS:-$HOME/.cache/churn-throttler-tools}/cargo-deny-$VERSION"
DENY="$ROOT/bin/cargo-deny"
passed=0
failed=0
say() { echo "deny: $*"; }
ok() { passed=$((passed + 1)); say "ok: $*"; }
bad() { failed=$((failed + 1)); echo "deny: FAIL: $*" >&2; }
finish() { echo "deny: $passed passed, $failed failed"; (( failed == 0 )); exit $?; }

if [[ ! -x "$DENY" ]]; then
  say "installing cargo-deny $VERSION into $ROOT (a few minutes, once)"
  if ! cargo install cargo-deny --version "$VERSION" --locked --root "$ROOT" >"${TMPDIR:-/tmp}/cargo-deny-install.log" 2>&1; then
    tail -n 20 "${TMPDIR:-/tmp}/cargo-deny-install.log" >&2
    bad "cargo install cargo-deny $VERSION failed"
    finish
  fi
fi
"$DENY" --version

for check in licenses sources bans; do
  if "$DENY" --locked check --hide-inclusion-graph "$check" 2>"${TMPDIR:-/tmp}/deny-$check.log"; then
    ok "$check ($(grep -c '^warning' "${TMPDIR:-/tmp}/deny-$check.log") warnings)"
    grep '^warning' "${TMPDIR:-/tmp}/deny-$check.log" | sort | uniq -c | sed 's/^/deny:   /'
  else
    cat "${TMPDIR:-/tmp}/deny-$check.log" >&2
    bad "$check"
  fi
done

# The advisory database is a git clone of github.com/RustSec/advisory-db.
if "$DENY" fetch db >"${TMPDIR:-/tmp}/deny-fetch.log" 2>&1; then
  if "$DENY" --locked check --hide-inclusion-graph advisories 2>"${TMPDIR:-/tmp}/deny-advisories.log"; then
    ok "advisories"
  else
    cat "${TMPDIR:-/tmp}/deny-advisories.log" >&2
    bad "advisories"
  fi
else
  why="$(grep -m1 'ERROR' "${TMPDIR:-/tmp}/deny-fetch.log" | sed 's/^.*\] //; s/ with cli:.*//')"
  why="$why ($(grep -m1 'fatal:' "${TMPDIR:-/tmp}/deny-fetch.log" || echo 'no git error line'))"
  say "SKIPPED advisories: the RustSec advisory database cannot be fetched here: ${why:-see ${TMPDIR:-/tmp}/deny-fetch.log}"
fi
finish
