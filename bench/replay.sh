#!/usr/bin/env bash
# Streaming benchmark of `simulate --replay`: a generated audit log of at least 1 GiB
# (most lines about other resources), read on one core; prints MB/s, lines/s,
# disruptive requests/s and peak RSS. The log is written under /tmp, never committed.
#   bench/replay.sh            # plain JSON lines
#   GZIP=1 bench/replay.sh     # the same log gzipped
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=${LOG:-/tmp/audit-1g.jsonl}
BYTES=${BYTES:-1100000000}
if [ ! -s "$LOG" ]; then
  python3 bench/gen-audit-log.py --target-bytes "$BYTES" > "$LOG"
fi
INPUT=$LOG
if [ "${GZIP:-0}" = 1 ]; then
  INPUT=$LOG.gz
  [ -s "$INPUT" ] || gzip -1 -c "$LOG" > "$INPUT"
fi
cargo build --release --locked -q
ls -l "$INPUT"
# One core: the replay is single-threaded; taskset keeps the figure honest on a shared box.
taskset -c 0 /usr/bin/time -f 'peak RSS %M KiB, %e s elapsed, %U s user' \
  target/release/churn-throttler simulate --replay "$INPUT" | grep -E '^(read|kind|creations|starts|deletions|evictions|partition_steps)'
