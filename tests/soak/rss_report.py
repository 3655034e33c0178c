#!/usr/bin/env python3
"""Memory verdict of tests/soak/soak.sh: is the server's RSS flat once it is warm?

Usage: rss_report.py RSS_FILE RUN_S WARMUP_S

RSS_FILE has one sample a line: `ms_since_start rss_kB reservations_open` (the sampler's).
docs/soak.md: memory grows while the limiter's reservations fill up to their cap and the
connections' buffers reach their working size, within the first two minutes; after that
it is flat. So the steady span is [WARMUP_S, RUN_S]: its largest RSS must be within 5 %
+ 2 MiB of its first sample's, and the reservations must have stopped filling by then
(their count at the span's start at least 95 % of the largest later), or the span is not
steady and the verdict is a failure, not a pass. Prints one line of figures, then FLAT,
GROWING or NOT-STEADY. Exit 1 on unreadable input (fewer than 5 samples in the span).
"""
import sys

GROWTH = 1.05
SLACK_KB = 2048


def main():
    path, run_ms, warm_ms = sys.argv[1], int(sys.argv[2]) * 1000, int(sys.argv[3]) * 1000
    rows = []
    for line in open(path):
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            rows.append(tuple(map(int, parts)))
    span = [r for r in rows if warm_ms <= r[0] <= run_ms]
    if len(span) < 5:
        sys.exit(f"rss_report: {len(span)} samples between {warm_ms / 1000:.0f} s and "
                 f"{run_ms / 1000:.0f} s (need 5): the run is too short for its warm-up, or the sampler stopped")
    first_t, first_rss, first_res = span[0]
    top_t, top_rss, _ = max(span, key=lambda r: r[1])
    res_max = max(r[2] for r in span)
    start_rss = rows[0][1]
    print(f"RSS start {start_rss} kB; steady span {first_t / 1000:.0f}-{span[-1][0] / 1000:.0f} s: "
          f"{first_rss} kB at its start, largest {top_rss} kB at {top_t / 1000:.0f} s, "
          f"{span[-1][1]} kB at its end (bound {int(first_rss * GROWTH + SLACK_KB)} kB); "
          f"open reservations {first_res} at its start, at most {res_max} in it")
    if first_res * 100 < res_max * 95:
        print("NOT-STEADY")
    elif top_rss <= first_rss * GROWTH + SLACK_KB:
        print("FLAT")
    else:
        print("GROWING")


if __name__ == "__main__":
    main()
