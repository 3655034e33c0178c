#!/usr/bin/env python3
"""Helpers of tests/e2e/status.sh (no third-party modules).

  record OUT                      stdin lines -> OUT, each prefixed with the arrival time
                                  in epoch milliseconds (a pod watch's clock)
  compare STATUS.json PODS.json TOLERANCE_MS AUDIT.log USER
                                  `status -A -o json` taken while pods waited against their
                                  releases: USER's accepted patches that removed their gate,
                                  at their answers in the API server's audit log (the pods'
                                  own released-at stamps only as a cross-check): one JSON
                                  line with the order check and the estimate errors
  ready-at WATCH.log REVISION POD...
                                  the first arrival time at which every POD was seen Ready
                                  at REVISION (controller-revision-hash), or 0
"""
import json
import os
import sys
import time
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e import audit_requests, is_gate_lift  # noqa: E402


def ms(text):
    """RFC 3339 (the annotations' form, e.g. 2026-12-06T10:00:00.123Z) to epoch ms."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def record(out):
    with open(out, "a", buffering=1) as f:
        for line in sys.stdin:
            f.write(f"{int(time.time() * 1000)} {line}")


ROUND_MS = 1000


def compare(status_path, pods_path, tolerance_ms, audit_path, user):
    status = json.load(open(status_path))
    pods = json.load(open(pods_path))["items"]
    taken = ms(status["time"])
    # The release of each pod: the answer of the first accepted patch by `user` that
    # removed its gate (a second one would be a second release, counted below).
    lifts = {}
    twice = []
    for r in audit_requests(audit_path, taken - 3_600_000, taken + 3_600_000, ""):
        if is_gate_lift(r) and r["user"] == user:
            key = (r["ns"], r["name"])
            if key in lifts:
                twice.append("/".join(key))
            else:
                lifts[key] = r["done"]
    released = {}
    stamp_lag = []
    for p in pods:
        key = (p["metadata"]["namespace"], p["metadata"]["name"])
        a = p["metadata"].get("annotations") or {}
        if key in lifts:
            released[key] = (lifts[key], a.get("churn-throttler.io/admitted-by"))
            if "churn-throttler.io/released-at" in a:
                stamp_lag.append(lifts[key] - ms(a["churn-throttler.io/released-at"]))
    rows = []
    missing = []
    for g in status["gatedPods"]:
        key = (g["namespace"], g["name"])
        if key not in released or g.get("estimatedRelease") is None:
            missing.append("/".join(key))
            continue
        real, admitted_by = released[key]
        rows.append({
            "pod": "/".join(key),
            "position": g["position"],
            "estimated": ms(g["estimatedRelease"]),
            "released": real,
            "admitted_by": admitted_by,
        })
    rows.sort(key=lambda r: r["position"])
    # The releaser's order: releases never go back along the positions. The patches of
    # one round are sent together and may be answered in any order within it, so a later
    # position answered up to ROUND_MS before an earlier one is not an inversion (after
    # the burst of two, consecutive releases lie a spacing, 2.1 s, apart).
    inversions = [
        (a["pod"], b["pod"])
        for a, b in zip(rows, rows[1:])
        if b["released"] < a["released"] - ROUND_MS
    ]
    errors = sorted(abs(r["released"] - r["estimated"]) for r in rows)
    late = [r["released"] - r["estimated"] for r in rows]
    worst = max(rows, key=lambda r: abs(r["released"] - r["estimated"]), default=None)
    result = {
        "listed": len(status["gatedPods"]),
        "compared": len(rows),
        "missing": missing,
        "admitted_at_once_among_them": sum(1 for r in rows if r["admitted_by"]),
        "inversions": inversions[:5],
        "inversion_count": len(inversions),
        "max_error_s": round(errors[-1] / 1000, 3) if errors else None,
        "median_error_s": round(errors[len(errors) // 2] / 1000, 3) if errors else None,
        "mean_late_s": round(sum(late) / len(late) / 1000, 3) if late else None,
        "worst": worst and {k: worst[k] for k in ("pod", "position")},
        "within_window": sum(1 for e in errors if e <= tolerance_ms),
        "tolerance_ms": tolerance_ms,
        "released_twice": twice,
        "stamp_to_answer_ms": [min(stamp_lag), max(stamp_lag)] if stamp_lag else None,
        "first_release_after_status_s": round((min(r["released"] for r in rows) - taken) / 1000, 3) if rows else None,
        "last_release_after_status_s": round((max(r["released"] for r in rows) - taken) / 1000, 3) if rows else None,
        "last_estimated_after_status_s": round((max(r["estimated"] for r in rows) - taken) / 1000, 3) if rows else None,
    }
    print(json.dumps(result))


def ready_at(log, revision, names):
    state = {}
    for line in open(log):
        parts = line.split()
        if len(parts) < 3:
            continue
        at, name, rev = int(parts[0]), parts[1], parts[2]
        ready = parts[3] if len(parts) > 3 else ""
        state[name] = (rev, ready)
        if all(state.get(n) == (revision, "True") for n in names):
            print(at)
            return
    print(0)


def main():
    cmd = sys.argv[1]
    if cmd == "record":
        record(sys.argv[2])
    elif cmd == "compare":
        compare(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])
    elif cmd == "ready-at":
        ready_at(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
