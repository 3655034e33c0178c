#!/usr/bin/env python3
"""Memory verdict of tests/soak/soak.sh: is the server's RSS flat once it is warm?

Usage: rss_report.py RSS_FILE RUN_S WARMUP_S

RSS_FILE has one sample a line: `ms_since_start rss_kB reservations_open` (the sampler's).
docs/soak.md: memory grows while the limiter's reservations fill up to their cap and the
connections' buffers reach their working size; after that it is flat. So the warm-up ends
at the first sample whose open reservations reach 95 % of the most the run ever held (and
not before WARMUP_S), and the steady span is the whole rest of the run. The judgement is
the slope of RSS over that span (least squares, so a steady leak shows however the samples
jitter): the growth it makes over the span, and the span's largest RSS, must each be within
5 % + 2 MiB of the span's first sample. A warm-up that leaves less than a third of the run
(the reservations still filling) is NOT-STEADY, a failure, not a pass. Prints one line of
figures, then FLAT, GROWING or NOT-STEADY. Exit 1 on unreadable input (fewer than 5
samples in the span).
"""
import sys

GROWTH = 1.05
SLACK_KB = 2048
FILLED = 0.95


def slope(points):
    """Least-squares slope of (t, y) points, y per unit of t."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / var if var else 0.0


def main():
    path, run_ms, warm_ms = sys.argv[1], int(sys.argv[2]) * 1000, int(sys.argv[3]) * 1000
    rows = []
    for line in open(path):
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            rows.append(tuple(map(int, parts)))
    rows = [r for r in rows if r[0] <= run_ms]
    if not rows:
        sys.exit("rss_report: no samples")
    res_max = max(r[2] for r in rows)
    filled_ms = next(r[0] for r in rows if r[2] >= res_max * FILLED)
    start_ms = max(warm_ms, filled_ms)
    span = [r for r in rows if r[0] >= start_ms]
    if len(span) < 5:
        sys.exit(f"rss_report: {len(span)} samples after the warm-up ({start_ms / 1000:.0f} s) "
                 f"to {run_ms / 1000:.0f} s (need 5): the run is too short, or the sampler stopped")
    first_t, first_rss, _ = span[0]
    top_t, top_rss, _ = max(span, key=lambda r: r[1])
    kb_per_s = slope([(t / 1000, rss) for t, rss, _ in span])
    span_s = (span[-1][0] - first_t) / 1000
    bound = first_rss * GROWTH + SLACK_KB
    print(f"RSS start {rows[0][1]} kB; reservations filled ({res_max} at most, 95 % at "
          f"{filled_ms / 1000:.0f} s); warm-up to {start_ms / 1000:.0f} s; steady span "
          f"{first_t / 1000:.0f}-{span[-1][0] / 1000:.0f} s ({len(span)} samples): {first_rss} kB "
          f"at its start, slope {kb_per_s:.1f} kB/s ({kb_per_s * span_s:.0f} kB over the span), "
          f"largest {top_rss} kB at {top_t / 1000:.0f} s, {span[-1][1]} kB at its end "
          f"(bound {int(bound)} kB)")
    if start_ms - rows[0][0] > run_ms * 2 / 3:
        print("NOT-STEADY")
    elif first_rss + kb_per_s * span_s <= bound and top_rss <= bound:
        print("FLAT")
    else:
        print("GROWING")


if __name__ == "__main__":
    main()
