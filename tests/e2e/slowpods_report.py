#!/usr/bin/env python3
"""Helpers of tests/e2e/slowpods.sh (standard library only).

  status             read `kubectl get sts -o json` on stdin; print
                     "converged=K held=H free=0|1 sets=N" (free: the set in --free-namespace
                     converged); a set is converged when updatedReplicas == readyReplicas ==
                     replicas at its generation, partition 0 and no hold annotation is left
  held NS/NAME...    same input: print "NS/NAME yes|no" (hold annotation present)
  records-gone       same input: exit 0 when no set carries a churn-throttler.io/ annotation
  pods ...           the pods' record annotations (released-at, admitted-by), the gate left
  audit ...          per pod, from the API server's audit log (times at the answers,
                     stageTimestamp): the StatefulSet controller's deletion, kwok's final
                     delete, the creation, the releaser's gate lift, the scheduler's binding,
                     kwok's status write (Ready); the windows, durations and refusals; prints
                     "RESULT {json}"
"""

import argparse
import datetime
import json
import sys

PREFIX = "churn-throttler.io/"
TARGET = "churn-throttler.io/partition-target"
HELD = "churn-throttler.io/partition-held"
SINCE = "churn-throttler.io/partition-held-since"
RELEASED_AT = "churn-throttler.io/released-at"
ADMITTED_BY = "churn-throttler.io/admitted-by"
GATED_LABEL = "churn-throttler.io/gated"
GATE = "churn-throttler.io/paced"
STS_CONTROLLER = "system:serviceaccount:kube-system:statefulset-controller"
KWOK = "kwok-controller"


def ms(text):
    return int(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def converged(s):
    m = s["metadata"]
    a = m.get("annotations") or {}
    spec = s["spec"]
    st = s.get("status") or {}
    part = ((spec.get("updateStrategy") or {}).get("rollingUpdate") or {}).get("partition", 0)
    replicas = spec.get("replicas", 1)
    return (st.get("observedGeneration", 0) >= m.get("generation", 0)
            and st.get("updatedReplicas", 0) == replicas == st.get("readyReplicas", 0)
            and part == 0 and not any(k in a for k in (TARGET, HELD, SINCE)))


def status(a):
    items = json.load(sys.stdin)["items"]
    paced = [s for s in items if s["metadata"]["namespace"] != a.free_namespace]
    free = [s for s in items if s["metadata"]["namespace"] == a.free_namespace]
    n_conv = sum(1 for s in paced if converged(s))
    n_held = sum(1 for s in paced if TARGET in (s["metadata"].get("annotations") or {}))
    free_ok = 1 if free and all(converged(s) for s in free) else 0
    print(f"converged={n_conv} held={n_held} free={free_ok} sets={len(paced)}")


def worst_window(times, window):
    times = sorted(times)
    best, at, j = 0, None, 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        if i - j + 1 > best:
            best, at = i - j + 1, times[j]
    return best, at


def dist(xs):
    xs = sorted(xs)
    if not xs:
        return None
    return {"n": len(xs), "min": xs[0], "median": xs[len(xs) // 2], "max": xs[-1]}


def is_lift(ops):
    return isinstance(ops, list) and any(
        op.get("op") == "remove" and str(op.get("path", "")).startswith("/spec/schedulingGates/") for op in ops)


def is_step(ops):
    if not isinstance(ops, list):
        return None
    for op in ops:
        if op.get("path") == "/spec/updateStrategy/rollingUpdate/partition" and op.get("op") in ("add", "replace"):
            return op.get("value")
    return None


def removes_target(ops):
    return isinstance(ops, list) and any(
        op.get("op") == "remove" and op.get("path") == "/metadata/annotations/churn-throttler.io~1partition-target"
        for op in ops)


def audit(a):
    namespaces = set(a.namespaces.split(","))
    since, until = a.since, a.until or 1 << 62
    window = a.window_ms
    pods = {}  # "ns/name" -> dict of first times
    refused, steps, hold_ends, patch_codes, answers_429 = [], [], [], {}, []
    marks = 0

    def first(key, what, t):
        pods.setdefault(key, {}).setdefault(what, t)

    for line in open(a.audit):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("stage") != "ResponseComplete":
            continue
        ref = e.get("objectRef") or {}
        ns = ref.get("namespace")
        t = ms(e["stageTimestamp"])
        if ns not in namespaces or t < since or t > until:
            continue
        user = (e.get("user") or {}).get("username", "")
        code = (e.get("responseStatus") or {}).get("code", 0)
        verb = e.get("verb")
        res, sub = ref.get("resource"), ref.get("subresource") or ""
        key = f'{ns}/{ref.get("name")}'
        if code == 429:
            # A deny or a retry-after of the webhook, as the API server answered it.
            answers_429.append([round((t - since) / 1000, 3), user, verb, res + ("/" + sub if sub else ""), key])
        if user == STS_CONTROLLER and code >= 400 and code not in (404, 409):
            refused.append([round((t - since) / 1000, 3), verb, res + ("/" + sub if sub else ""), key, code])
        if res == "statefulsets" and not sub and user == a.releaser_user and verb == "patch":
            patch_codes[str(code)] = patch_codes.get(str(code), 0) + 1
            if 200 <= code < 300:
                if is_step(e.get("requestObject")) is not None:
                    steps.append(t)
                if removes_target(e.get("requestObject")):
                    hold_ends.append(t)
            continue
        if res != "pods":
            continue
        ok = 200 <= code < 300
        if not ok:
            continue
        if not sub and verb == "delete" and user == STS_CONTROLLER:
            first(key, "delete", t)
        elif not sub and verb == "delete" and user == KWOK and "delete" in pods.get(key, {}):
            first(key, "gone", t)
        elif not sub and verb == "create" and user == STS_CONTROLLER:
            first(key, "create", t)
        elif not sub and verb == "patch" and user == a.releaser_user:
            if is_lift(e.get("requestObject")):
                first(key, "lift", t)
            elif any(op.get("path") == "/metadata/labels/churn-throttler.io~1gated" and op.get("value") == "released"
                     for op in (e.get("requestObject") or []) if isinstance(op, dict)):
                marks += 1
        elif sub == "binding" and verb == "create":
            first(key, "bind", t)
        elif sub == "status" and user == KWOK and "bind" in pods.get(key, {}):
            first(key, "ready", t)

    res = {"refused": refused, "releaser_sts_patch_codes": patch_codes, "marked_released": marks,
           "answers_429": answers_429}
    series = {
        "deletes": [p["delete"] for p in pods.values() if "delete" in p],
        "creates": [p["create"] for p in pods.values() if "create" in p],
        "lifts": [p["lift"] for p in pods.values() if "lift" in p],
        "binds": [p["bind"] for p in pods.values() if "bind" in p],
        "steps": steps,
    }
    for name, times in series.items():
        worst, at = worst_window(times, window)
        res[name] = len(times)
        res[f"worst_{name}"] = worst
        res[f"worst_{name}_at_s"] = round((at - since) / 1000, 1) if at else None
        res[f"worst_{name}_1s"] = worst_window(times, 1000)[0]
        res[f"{name}_first_s"] = round((min(times) - since) / 1000, 1) if times else None
        res[f"{name}_last_s"] = round((max(times) - since) / 1000, 1) if times else None
        # per window of the policy's length from `since`, for the record
        buckets = {}
        for x in times:
            buckets[(x - since) // window] = buckets.get((x - since) // window, 0) + 1
        res[f"{name}_per_window"] = [buckets.get(b, 0) for b in range(0, max(buckets) + 1)] if buckets else []
        if a.t_kill:
            near = [x for x in times if abs(x - a.t_kill) <= 3 * window]
            res[f"worst_{name}_around_kill"] = worst_window(near, window)[0]
            after = [x for x in times if x > a.t_kill]
            res[f"first_{name}_after_kill_s"] = round((min(after) - a.t_kill) / 1000, 3) if after else None
    # kwok's stages: deletion (the controller's DELETE answered -> kwok's final DELETE
    # answered) and Ready (the binding answered -> kwok's status write answered).
    res["deletion_ms"] = dist([p["gone"] - p["delete"] for p in pods.values() if "gone" in p and "delete" in p])
    res["ready_after_bind_ms"] = dist([p["ready"] - p["bind"] for p in pods.values() if "ready" in p and "bind" in p])
    res["create_to_bind_ms"] = dist([p["bind"] - p["create"] for p in pods.values() if "bind" in p and "create" in p])
    res["hold_ends"] = len(hold_ends)
    res["last_hold_end_s"] = round((max(hold_ends) - since) / 1000, 3) if hold_ends else None
    res["last_ready_s"] = round((max(p["ready"] for p in pods.values() if "ready" in p) - since) / 1000, 3) \
        if any("ready" in p for p in pods.values()) else None
    print("RESULT " + json.dumps(res))


def pods_summary(a):
    namespaces = set(a.namespaces.split(","))
    items = [p for p in json.load(sys.stdin)["items"] if p["metadata"]["namespace"] in namespaces]
    released = admitted = gated = labelled = 0
    for p in items:
        ann = p["metadata"].get("annotations") or {}
        lab = p["metadata"].get("labels") or {}
        released += RELEASED_AT in ann
        admitted += ADMITTED_BY in ann
        labelled += lab.get(GATED_LABEL) == "true"
        gated += any(g.get("name") == GATE for g in (p["spec"].get("schedulingGates") or []))
    print(json.dumps({"pods": len(items), "released_at": released, "admitted_by": admitted,
                      "gated": gated, "labelled_gated": labelled}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("status")
    s.add_argument("--free-namespace", required=True)
    h = sub.add_parser("held")
    h.add_argument("sets", nargs="+")
    sub.add_parser("records-gone")
    ps = sub.add_parser("pods")
    ps.add_argument("--namespaces", required=True)
    au = sub.add_parser("audit")
    au.add_argument("--audit", required=True)
    au.add_argument("--namespaces", required=True)
    au.add_argument("--since", type=int, required=True)
    au.add_argument("--until", type=int, default=0)
    au.add_argument("--t-kill", type=int, default=0)
    au.add_argument("--window-ms", type=int, default=10000)
    au.add_argument("--releaser-user", required=True)
    a = p.parse_args()
    if a.cmd == "status":
        status(a)
    elif a.cmd == "held":
        items = {f'{s["metadata"]["namespace"]}/{s["metadata"]["name"]}': s for s in json.load(sys.stdin)["items"]}
        for key in a.sets:
            s = items.get(key)
            print(key, "yes" if s and TARGET in (s["metadata"].get("annotations") or {}) else "no")
    elif a.cmd == "records-gone":
        items = json.load(sys.stdin)["items"]
        sys.exit(0 if not any(k.startswith(PREFIX) for s in items for k in (s["metadata"].get("annotations") or {})) else 1)
    elif a.cmd == "pods":
        pods_summary(a)
    elif a.cmd == "audit":
        audit(a)


if __name__ == "__main__":
    main()
