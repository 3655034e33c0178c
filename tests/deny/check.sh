#!/usr/bin/env bash
# cargo deny: licences, sources and bans (duplicates) of the dependency graph, against
# deny.toml; then the RustSec advisory check against the advisory database from GitHub,
# or, when it cannot be fetched, offline against a local snapshot (see below). Installs cargo-deny (pinned) into ~/.cache/churn-throttler-tools.
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
  say "installing cargo-deny $VERSION into $ROOT (about a minute, once)"
  # A debug build: 73 s to install on 2 cores against about 5.5 min optimised, and the
  # checks below still take about 12 s (measured 2026-12-06); it matters on a cold CI.
  if ! cargo install cargo-deny --version "$VERSION" --locked --debug --root "$ROOT" >"${TMPDIR:-/tmp}/cargo-deny-install.log" 2>&1; then
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

# The advisory database is a git clone of github.com/RustSec/advisory-db. Where it
# cannot be fetched, a snapshot (a git bundle, $ADVISORY_DB_BUNDLE, by default
# ../shared/rustsec-advisory-db.bundle next to the clone) is cloned into cargo-deny's
# database directory and the check runs offline against it; its date is printed, since
# advisories newer than the snapshot are not seen.
advisories() {
  if "$DENY" "$@" --locked check --hide-inclusion-graph advisories 2>"${TMPDIR:-/tmp}/deny-advisories.log"; then
    ok "advisories$SNAPSHOT"
  else
    cat "${TMPDIR:-/tmp}/deny-advisories.log" >&2
    bad "advisories$SNAPSHOT"
  fi
}
SNAPSHOT=""
if "$DENY" fetch db >"${TMPDIR:-/tmp}/deny-fetch.log" 2>&1; then
  advisories
else
  why="$(grep -m1 'ERROR' "${TMPDIR:-/tmp}/deny-fetch.log" | sed 's/^.*\] //; s/ with cli:.*//')"
  why="$why ($(grep -m1 'fatal:' "${TMPDIR:-/tmp}/deny-fetch.log" || echo 'no git error line'))"
  say "the RustSec advisory database cannot be fetched here: ${why:-see ${TMPDIR:-/tmp}/deny-fetch.log}"
  # cargo-deny 0.20 names the default database's directory after its URL.
  db="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs/advisory-db-3157b0e258782691"
  bundle="${ADVISORY_DB_BUNDLE:-../shared/rustsec-advisory-db.bundle}"
  if [[ ! -d "$db/.git" && -f "$bundle" ]]; then
    mkdir -p "$(dirname "$db")"
    git clone --quiet --branch main "$bundle" "$db" || rm -rf "$db"
  fi
  if [[ -d "$db/.git" ]]; then
    date="$(git -C "$db" log -1 --format=%cs 2>/dev/null || echo 'unknown date')"
    SNAPSHOT=" (offline, against the local advisory database of $date)"
    say "running the advisory check offline against the local database of $date"
    advisories --offline
  else
    bad "advisories: no database to check against (no fetch, no local copy, no bundle at $bundle)"
  fi
fi
finish
