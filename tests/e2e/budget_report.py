#!/usr/bin/env python3
"""Analysis for tests/e2e/budget.sh: admissions per sliding window, summed over replicas.

Usage: budget_report.py WORKDIR EVENTS GATE_EVENTS WINDOW_MS

Reads WORKDIR/{phases,evictions.csv,creates.csv,alone.csv,monitor.log} and prints one table
row per phase, then PASS/FAIL lines that budget.sh turns into its verdicts. A missing or
empty file is an error (exit 1), never an empty phase that passes.

Every phase is bounded on both sides: at most the limit (+1 while a replica joins), and at
least 80 % of what the shares admit under this load (an admission that stopped, e.g. every
eviction denied, fails).

Times are the load client's receive times (wall clock, ms). A window is WINDOW_MS - 50 ms
long, to absorb the client's measurement jitter: an admission the server made exactly one
window after another may be received a few ms late, which would otherwise look like two in
one window.
"""
import csv
import sys

TOLERANCE_MS = 50


# The least the shares admit in the fullest window ending in each phase, as a fraction of
# the limit (warm-up: 1 per replica, absolute). The load (60/s, 8:1:1) fills every share:
# b and c receive 30 per 5 s window, more than their share of 10 (15 of two).
#   three replicas: 10 + 10 + 10; two: 15 + 15; c gone but not yet forgotten, the
#   fallback (1/3 each) and the phases while it is held: 10 + 10; all to a: a's 10.
FLOOR_OF_LIMIT = {
    "three-replicas": 1, "c-leaves": 2 / 3, "two-replicas": 1, "api-frozen": 1,
    "fallback": 2 / 3, "api-back": 2 / 3, "two-again": 2 / 3, "c-rejoins": 2 / 3,
    "three-again": 1, "all-to-a": 1 / 3,
}
FLOOR_MARGIN = 0.8


def read_rows(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"budget_report: {path} has no rows")
    return rows


def read_events(path, want):
    out = [(int(r["recv_ms"]), int(r["target"])) for r in read_rows(path) if want(r)]
    out.sort()
    return out


def windows(events, length):
    """For each event: (end time, total in (end - length, end], per target counts)."""
    start = 0
    per = {}
    for end_i, (t, target) in enumerate(events):
        per[target] = per.get(target, 0) + 1
        while events[start][0] <= t - length:
            per[events[start][1]] -= 1
            start += 1
        yield t, end_i - start + 1, dict(per)


def main():
    work, events, gate_events, window_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    length = window_ms - TOLERANCE_MS
    phases = []
    with open(f"{work}/phases") as f:
        for line in f:
            name, at = line.split()
            phases.append((name, int(at)))

    def phase_of(t):
        current = None
        for name, at in phases:
            if t >= at:
                current = name
        return current

    admitted = read_events(f"{work}/evictions.csv", lambda r: r["allowed"] == "1")
    admitted += read_events(f"{work}/alone.csv", lambda r: r["allowed"] == "1")
    admitted.sort()
    starts = dict(phases)
    ends = {name: phases[i + 1][1] for i, (name, _) in enumerate(phases[:-1])}
    best = {}     # every window that ends in the phase
    inside = {}   # windows entirely inside the phase
    warm = 0      # windows that end within the warm-up proper (6 s of the first start)
    for t, total, per in windows(admitted, length):
        p = phase_of(t)
        if p is None:
            continue
        if total > best.get(p, (0, {}))[0]:
            best[p] = (total, per)
        if t - length >= starts[p] and total > inside.get(p, (0, {}))[0]:
            inside[p] = (total, per)
        if t < starts["warm-up"] + 6000:
            warm = max(warm, total)
    # Phases in which a replica joins: its warm-up admits 1 per window while the others'
    # windows may still hold their larger share of the moment before.
    joins = {"c-rejoins": 1, "three-again": 1}
    names = ["a", "b", "c"]
    print(f"evictions (deny rule, {events} per {window_ms} ms), skewed 8:1:1 over a, b, c (all-to-a: 1:0:0):")
    print(f"{'phase':<14} {'s':>5} {'max in any window':>17} {'a':>3} {'b':>3} {'c':>3} {'epsilon':>8}   {'windows inside':>14} {'a':>3} {'b':>3} {'c':>3} {'of limit':>8}")
    worst = 0.0
    verdicts = []
    for name, at in phases:
        if name == "end":
            continue
        total, per = best.get(name, (0, {}))
        itotal, iper = inside.get(name, (0, {}))
        eps = total / events - 1
        worst = max(worst, eps)
        cols = " ".join(f"{per.get(i, 0):>3}" for i in range(3))
        icols = " ".join(f"{iper.get(i, 0):>3}" for i in range(3))
        span = (ends.get(name, at) - at) / 1000
        itext = f"{itotal:>14} {icols} {100 * itotal / events:>7.0f}%" if name in inside else f"{'-':>14}"
        print(f"{name:<14} {span:>5.1f} {total:>17} {cols} {eps:>+8.3f}   {itext}")
        bound = events + joins.get(name, 0)
        floor = 3 if name == "warm-up" else int(FLOOR_MARGIN * FLOOR_OF_LIMIT[name] * events)
        verdicts.append((floor <= total <= bound, f"{name}: at most {total} evictions admitted in any window by all replicas together (at least {floor}, at most {bound})"))
    print(f"epsilon over the run (max window sum / limit - 1): {worst:+.3f}")
    print("(bound: the limit, + 1 while a replica joins: its warm-up admits 1 per window; "
          "'windows inside' counts only windows that lie wholly in the phase)")
    print(f"warm-up: at most {warm} admitted in any window ending in the first 6 s (1 per replica per window)")
    verdicts.append((warm <= 3, f"warm-up: at most {warm} evictions in a window while the replicas warm up (bound 3)"))

    # Errors: only requests to c while it is down (from c-leaves until three-again).
    down = (starts["c-leaves"], starts["three-again"])
    errors = read_events(f"{work}/evictions.csv", lambda r: r["status"] != "200")
    errors += read_events(f"{work}/creates.csv", lambda r: r["status"] != "200")
    errors += read_events(f"{work}/alone.csv", lambda r: r["status"] != "200")
    expected = [e for e in errors if e[1] == 2 and down[0] <= e[0] <= down[1] + 1000]
    print(f"failed requests: {len(errors)}, of which {len(expected)} to c while it was down")
    verdicts.append((len(errors) == len(expected), f"no request failed except those to c while it was down ({len(errors) - len(expected)} others)"))

    # Gate rule: pods admitted without a gate, all replicas together, and by whom.
    creates = read_events(f"{work}/creates.csv", lambda r: r["allowed"] == "1" and r["gated"] == "0")
    gated = read_events(f"{work}/creates.csv", lambda r: r["gated"] == "1")
    top = max((total for _, total, _ in windows(creates, length)), default=0)
    by = {names[i]: sum(1 for _, t in creates if t == i) for i in range(3)}
    print(f"creations (gate rule, {gate_events} per {window_ms} ms, 10/s spread evenly): "
          f"{len(creates)} admitted ungated ({by}), {len(gated)} gated; "
          f"at most {top} ungated in any window")
    # Which replica led the releaser at each admission (from the monitor's samples).
    samples = []
    with open(f"{work}/monitor.log") as f:
        for line in f:
            parts = line.split()
            t = int(parts[0])
            leaders = {kv.split("=")[0] for kv in parts[1:] if kv.split("=")[1].split("/")[-1] == "1"}
            samples.append((t, leaders))
    if not samples:
        sys.exit(f"budget_report: {work}/monitor.log has no samples")
    stray = 0
    unsampled = 0
    for t, target in creates:
        near = [s for s in samples if abs(s[0] - t) <= 1500]
        if not near:
            unsampled += 1
        elif not any(names[target] in leaders for _, leaders in near):
            stray += 1
    print(f"ungated admissions by a replica that did not lead the releaser (within 1.5 s): {stray}; "
          f"with no monitor sample within 1.5 s: {unsampled}")
    verdicts.append((top <= gate_events, f"gate rule: at most {top} pods admitted ungated in any window (limit {gate_events})"))
    verdicts.append((stray == 0 and unsampled == 0, f"gate rule: only the releaser's leader admitted pods ungated ({stray} by others, {unsampled} with no leader sample near)"))
    # The leader receives a third of 10/s, about 17 per window: the limit of 20 is not
    # reached, but an admission path that gates everything would admit none.
    gate_floor = gate_events // 2
    verdicts.append((top >= gate_floor, f"gate rule: the leader admitted up to {top} pods ungated in a window (at least {gate_floor})"))
    verdicts.append((len(gated) > 0, f"gate rule: followers gated pods ({len(gated)} gated)"))
    for ok, what in verdicts:
        print(("PASS " if ok else "FAIL ") + what)


if __name__ == "__main__":
    main()
