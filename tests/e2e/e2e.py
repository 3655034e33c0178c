#!/usr/bin/env python3
"""Helpers of tests/e2e/run.sh: a watch recorder, a parallel patch client, the analysis
of recorded rollouts, audit-log and metrics counts, and the AdmissionReview capture.

Standard library only. Times are Unix milliseconds of this machine's clock, taken when
an event reaches this process (the API server's own timestamps have 1 s resolution).
Every subcommand prints a human-readable report and, where run.sh needs values, one
line `RESULT <json>`.
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request

GATE = "churn-throttler.io/paced"


def now_ms():
    return int(time.time() * 1000)


def result(obj):
    print("RESULT " + json.dumps(obj, sort_keys=True), flush=True)


# ---- record ------------------------------------------------------------------------------


def slim(obj):
    """The fields of a pod or StatefulSet the analysis needs, nothing else."""
    m = obj.get("metadata", {})
    spec = obj.get("spec", {})
    status = obj.get("status", {})
    out = {
        "ns": m.get("namespace"),
        "name": m.get("name"),
        "uid": m.get("uid"),
        "rv": m.get("resourceVersion"),
        "del": bool(m.get("deletionTimestamp")),
    }
    labels = m.get("labels") or {}
    ann = m.get("annotations") or {}
    if ann.get("e2e.churn-throttler.io/sentinel"):
        out["sentinel"] = ann["e2e.churn-throttler.io/sentinel"]
    if obj.get("kind") == "StatefulSet" or "updateStrategy" in spec:
        ru = (spec.get("updateStrategy") or {}).get("rollingUpdate") or {}
        out.update(
            kind="sts",
            gen=m.get("generation"),
            replicas=spec.get("replicas"),
            partition=ru.get("partition"),
            target=ann.get("churn-throttler.io/partition-target"),
            obs=status.get("observedGeneration"),
            ready=status.get("readyReplicas", 0),
            updated=status.get("updatedReplicas", 0),
            cur=status.get("currentRevision"),
            upd=status.get("updateRevision"),
        )
        return out
    owner = next((o for o in m.get("ownerReferences") or [] if o.get("controller")), {})
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    out.update(
        kind="pod",
        owner=owner.get("kind"),
        owner_name=owner.get("name"),
        gates=[g.get("name") for g in spec.get("schedulingGates") or []],
        node=spec.get("nodeName"),
        phase=status.get("phase"),
        ready=conds.get("Ready") == "True",
        rev=labels.get("controller-revision-hash"),
        gated=labels.get("churn-throttler.io/gated"),
        released_at=ann.get("churn-throttler.io/released-at"),
    )
    return out


def cmd_record(args):
    """Reads `kubectl get ... --watch-only --output-watch-events -o json` on stdin (one
    JSON document per event: a line with kubectl v1.36, indented and closed by a `}` line
    with older ones) and appends one compact JSON line per event to OUT, stamped with the
    time it arrived."""
    buf = []
    with open(args.out, "a", buffering=1) as out:
        for line in sys.stdin:
            buf.append(line)
            if len(buf) > 1 and line.rstrip("\n") != "}":
                continue
            t = now_ms()
            try:
                ev = json.loads("".join(buf))
            except ValueError:
                continue
            buf = []
            rec = {"t": t, "type": ev.get("type")}
            rec.update(slim(ev.get("object") or {}))
            out.write(json.dumps(rec, separators=(",", ":")) + "\n")


def load_events(path, since=None, until=None):
    evs = []
    with open(path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if since is not None and e["t"] < since:
                continue
            if until is not None and e["t"] > until:
                continue
            evs.append(e)
    evs.sort(key=lambda e: e["t"])
    return evs


def cmd_seen(args):
    """Exit 0 once the recorder has written the sentinel token."""
    try:
        with open(args.file) as f:
            ok = any(args.token in line for line in f)
    except OSError:
        ok = False
    sys.exit(0 if ok else 1)


# ---- API client (the parallel trigger) ----------------------------------------------------


class Api:
    def __init__(self, server, ca, token):
        u = urllib.parse.urlparse(server)
        self.host, self.port = u.hostname, u.port
        self.ctx = ssl.create_default_context(cafile=ca)
        self.token = token
        self.local = threading.local()

    def conn(self):
        c = getattr(self.local, "c", None)
        if c is None:
            c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=30)
            self.local.c = c
        return c

    def request(self, method, path, body=None, ctype="application/json"):
        headers = {"Authorization": "Bearer " + self.token, "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = ctype
        for attempt in range(2):
            c = self.conn()
            try:
                c.request(method, path, body=data, headers=headers)
                r = c.getresponse()
                payload = r.read()
                return r.status, payload
            except (http.client.HTTPException, OSError):
                self.local.c = None
                if attempt:
                    raise
        raise RuntimeError("unreachable")


def cmd_patch_many(args):
    """PATCHes (merge patch) every `namespace/name` of TARGETS at once from a thread pool,
    so that a mass template change lands within a second, as an operator upgrade would."""
    token = open(args.token_file).read().strip()
    api = Api(args.server, args.ca, token)
    body = json.loads(args.body)
    targets = [t.strip() for t in open(args.targets) if t.strip()]
    # Warm the connections first, so the trigger itself is only the PATCH requests.
    barrier = threading.Barrier(args.parallel)

    def warm(_):
        api.request("GET", "/version")
        barrier.wait(timeout=30)

    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(warm, range(args.parallel)))
        started = now_ms()

        def one(target):
            ns, name = target.split("/", 1)
            t = now_ms()
            status, payload = api.request(
                "PATCH",
                f"/apis/{args.group_version}/namespaces/{ns}/{args.resource}/{name}",
                body,
                "application/merge-patch+json",
            )
            return target, status, t, now_ms(), payload[:300].decode(errors="replace")

        done = list(pool.map(one, targets))
    ended = now_ms()
    failures = [(t, s, p) for t, s, _, _, p in done if s != 200]
    for t, s, p in failures:
        print(f"patch {t}: HTTP {s}: {p}", file=sys.stderr)
    first = min(d[2] for d in done)
    last = max(d[3] for d in done)
    print(f"patched {len(done) - len(failures)}/{len(done)} objects in {(last - first) / 1000:.3f} s")
    result({"started": started, "first": first, "last": last, "ended": ended,
            "count": len(done), "failures": len(failures)})
    sys.exit(1 if failures else 0)


# ---- StatefulSet state --------------------------------------------------------------------


def sts_converged(s):
    st = s.get("status", {})
    m = s["metadata"]
    want = s["spec"].get("replicas", 1)
    return (
        st.get("observedGeneration") == m.get("generation")
        and st.get("updatedReplicas", 0) == want
        and st.get("readyReplicas", 0) == want
        and st.get("currentRevision") == st.get("updateRevision")
    )


def cmd_sts_status(args):
    """Reads `kubectl get sts -o json` on stdin; exits 0 when all are converged."""
    items = json.load(sys.stdin)["items"]
    bad = [f'{s["metadata"]["namespace"]}/{s["metadata"]["name"]}' for s in items if not sts_converged(s)]
    if args.verbose:
        print(f"{len(items) - len(bad)}/{len(items)} converged; not yet: {' '.join(bad[:10])}")
    sys.exit(0 if items and not bad and len(items) >= args.expect else 1)


def cmd_revisions_pending(args):
    """Reads `kubectl get sts -o json` on stdin; exits 0 when every StatefulSet has
    observed its generation and has an update revision that differs from the current one."""
    items = json.load(sys.stdin)["items"]
    ok = [s for s in items
          if s["status"].get("observedGeneration") == s["metadata"].get("generation")
          and s["status"].get("updateRevision")
          and s["status"].get("updateRevision") != s["status"].get("currentRevision")]
    sys.exit(0 if len(ok) == len(items) >= args.expect else 1)


def cmd_pod_check(args):
    """Reads `kubectl get pods -o json` on stdin: every pod Ready, none Terminating, none
    gated. Prints the offenders and RESULT."""
    items = json.load(sys.stdin)["items"]
    if args.ns_prefix:
        items = [p for p in items if any(p["metadata"]["namespace"].startswith(x) for x in args.ns_prefix)]
    terminating, gated, not_ready = [], [], []
    for p in items:
        key = f'{p["metadata"]["namespace"]}/{p["metadata"]["name"]}'
        if p["metadata"].get("deletionTimestamp"):
            terminating.append(key)
        if p["spec"].get("schedulingGates"):
            gated.append(key)
        conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions") or []}
        if conds.get("Ready") != "True":
            not_ready.append(key)
    print(f"{len(items)} pods: {len(terminating)} terminating, {len(gated)} gated, {len(not_ready)} not Ready")
    for name, lst in (("terminating", terminating), ("gated", gated), ("not ready", not_ready)):
        if lst:
            print(f"  {name}: {' '.join(lst[:10])}{' ...' if len(lst) > 10 else ''}")
    result({"pods": len(items), "terminating": len(terminating), "gated": len(gated), "not_ready": len(not_ready)})


# ---- analysis ------------------------------------------------------------------------------


def max_in_window(times, window):
    """The most events in any half-open interval [t, t + window)."""
    times = sorted(times)
    best, j = 0, 0
    for i, t in enumerate(times):
        while j < len(times) and times[j] < t + window:
            j += 1
        best = max(best, j - i)
    return best


def worst_window_at(times, window):
    times = sorted(times)
    best, at, j = 0, None, 0
    for i, t in enumerate(times):
        while j < len(times) and times[j] < t + window:
            j += 1
        if j - i > best:
            best, at = j - i, t
    return best, at


def pod_story(events, selector):
    """Per pod uid: first seen, gated when created, gate lifted, delete, Ready times."""
    pods = {}
    for e in events:
        if e.get("kind") != "pod" or not selector(e):
            continue
        p = pods.get(e["uid"])
        if p is None:
            p = pods[e["uid"]] = {
                "ns": e["ns"], "name": e["name"], "owner": e.get("owner"), "owner_name": e.get("owner_name"),
                "added": None, "gated_at_add": None, "released": None, "deleted": None,
                "gone": None, "ready": None, "had_gate": False, "rev": e.get("rev"),
                "released_at": None,
            }
        t = e["t"]
        has_gate = GATE in (e.get("gates") or [])
        if e["type"] == "ADDED" and p["added"] is None:
            p["added"] = t
            p["gated_at_add"] = has_gate
        if has_gate:
            p["had_gate"] = True
        elif p["had_gate"] and p["released"] is None and e["type"] != "DELETED":
            p["released"] = t
        if e.get("released_at") and p["released_at"] is None:
            p["released_at"] = e["released_at"]
        if e.get("ready") and p["ready"] is None and not e.get("del"):
            p["ready"] = t
        if (e.get("del") or e["type"] == "DELETED") and p["deleted"] is None:
            p["deleted"] = t
        if e["type"] == "DELETED":
            p["gone"] = t
    return pods


def iso_ms(text):
    import datetime
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000


def audit_requests(path, since, until, ns_prefix):
    """Pod and StatefulSet writes from the API server's audit log (ResponseComplete), each
    with the times the request was received and answered."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                a = json.loads(line)
            except ValueError:
                continue
            if a.get("stage") != "ResponseComplete":
                continue
            ref = a.get("objectRef") or {}
            if not (ref.get("namespace") or "").startswith(ns_prefix):
                continue
            done = iso_ms(a["stageTimestamp"])
            if done < since - 60_000 or done > until + 60_000:
                continue
            user = a.get("user") or {}
            out.append({
                "verb": a.get("verb"), "resource": ref.get("resource"), "sub": ref.get("subresource"),
                "ns": ref.get("namespace"), "name": ref.get("name"),
                "user": user.get("username", ""),
                # Which token: a ServiceAccount token's ID (its jti), so processes sharing
                # one ServiceAccount are told apart by the token each was given.
                "credential": ",".join((user.get("extra") or {}).get("authentication.kubernetes.io/credential-id", [])),
                "code": (a.get("responseStatus") or {}).get("code"),
                "recv": iso_ms(a["requestReceivedTimestamp"]), "done": done,
                # The JSON patch's operations, when the audit policy logs the request body.
                "ops": a.get("requestObject"),
            })
    out.sort(key=lambda r: r["done"])
    return out


def is_gate_lift(r):
    """An accepted pod patch that removes a scheduling gate (JSON patch `remove` of
    /spec/schedulingGates/N): a release, at its answer (`done`)."""
    ops = r.get("ops")
    return (r["resource"] == "pods" and not r["sub"] and r["verb"] == "patch"
            and r["code"] is not None and 200 <= r["code"] < 300 and isinstance(ops, list)
            and any(op.get("op") == "remove" and str(op.get("path", "")).startswith("/spec/schedulingGates/")
                    for op in ops))


def request_before(reqs, pred, ns, name, seen):
    """The last request matching pred for ns/name answered before the watch saw its effect."""
    best = None
    for r in reqs:
        # The watch may deliver a change a little before the API server logs its answer.
        if r["done"] > seen + 2000:
            break
        if r["ns"] == ns and r["name"] == name and pred(r):
            best = r
    return best


def request_first(reqs, pred, ns, name, since, seen):
    """The first request matching pred for ns/name answered after since and before the
    watch saw its effect: for a deletion, the DELETE that set deletionTimestamp (later
    DELETEs of the terminating pod are answered 200 too, and are not charged)."""
    for r in reqs:
        if r["done"] > seen + 2000:
            break
        if r["done"] >= since and r["ns"] == ns and r["name"] == name and pred(r):
            return r
    return None


def most_inside(intervals, window):
    """The most intervals lying entirely inside one window [s, s + window): events whose
    moment is only known to lie within their interval, counted only where that is certain.
    A lower bound: a request straddling an edge is not counted in either window."""
    intervals = sorted(intervals)
    best = 0
    for i, (s, _) in enumerate(intervals):
        n = sum(1 for lo, hi in intervals[i:] if lo >= s and hi < s + window)
        best = max(best, n)
    return best


def most_overlapping(intervals, window):
    """The most intervals that merely overlap one window [s, s + window): an upper bound on
    the events in any window, whenever inside its request each event happened. The fullest
    window can start at the end of an interval it overlaps (moving it later, up to that
    end, loses none), so only those starts are tried."""
    best = 0
    for _, end in intervals:
        best = max(best, sum(1 for lo, hi in intervals if hi >= end and lo < end + window))
    return best


def effect_counts(reqs, t0, t_end, window, second):
    """What the CNI sees, at the answer of the API request that makes it happen: a pod
    starts when the scheduler's pods/binding is answered; a deletion or an eviction takes
    effect when its request is answered. Exact windows of the policy's length and of 1 s,
    no allowance for lag; beside them the requests' own intervals (most inside a window: a
    lower bound; most overlapping it: an upper bound)."""
    def pick(pred):
        return [r for r in reqs if pred(r) and t0 <= r["done"] <= t_end + 2000]
    binds = pick(lambda r: r["verb"] == "create" and r["resource"] == "pods" and r["sub"] == "binding" and r["code"] == 201)
    dels = pick(lambda r: r["verb"] == "delete" and r["resource"] == "pods" and not r["sub"] and r["code"] == 200)
    evictions = pick(lambda r: r["verb"] == "create" and r["resource"] == "pods" and r["sub"] == "eviction" and r["code"] == 201)
    # A pod deleted twice (the DELETE of a pod already terminating is answered 200 too)
    # takes effect at the first answer.
    first_del = {}
    for r in dels:
        first_del.setdefault((r["ns"], r["name"]), r)
    dels = sorted(first_del.values(), key=lambda r: r["done"])
    out = {}
    for name, rs in (("binds", binds), ("deletes", dels), ("evictions", evictions)):
        done = [r["done"] for r in rs]
        iv = [(r["recv"], r["done"]) for r in rs]
        out[f"effect_{name}"] = len(rs)
        out[f"effect_{name}_max"] = max_in_window(done, window)
        out[f"effect_{name}_max_1s"] = max_in_window(done, second)
        out[f"effect_{name}_inside"] = most_inside(iv, window)
        out[f"effect_{name}_overlap"] = most_overlapping(iv, window)
    return out


def step_effects(args, evs):
    """The releaser's partition steps at their patches' answers: each decrease of a
    StatefulSet's partition seen by the watch, matched to the last patch by
    churn-throttler's service account on that set answered before it (the watch can
    deliver a change a little before the audit log stamps its answer)."""
    t_end = args.t_end or args.t0 + 3_600_000
    reqs = audit_requests(args.audit, args.t0, t_end, args.ns_prefix)
    is_patch = lambda r: (r["verb"] == "patch" and r["resource"] == "statefulsets" and r["code"] == 200
                          and r["user"].startswith("system:serviceaccount:churn-throttler:"))
    last, done, sent, unmatched = {}, [], [], 0
    for e in evs:
        if e.get("kind") != "sts" or not (e.get("ns") or "").startswith(args.ns_prefix):
            continue
        p, key = e.get("partition"), e["uid"]
        if e["t"] >= args.t0 and last.get(key) is not None and p is not None and p < last[key]:
            best = None
            for r in reqs:
                if r["done"] > e["t"] + 500:
                    break
                if r["ns"] == e["ns"] and r["name"] == e["name"] and is_patch(r):
                    best = r
            if best is None:
                unmatched += 1
            else:
                done.extend([best["done"]] * (last[key] - p))
                sent.extend([best["recv"]] * (last[key] - p))
        last[key] = p
    done.sort()
    sent.sort()
    return {
        "effect_steps": len(done),
        "effect_steps_max": max_in_window(done, args.window_ms),
        "effect_steps_max_1s": max_in_window(done, 1000),
        "effect_steps_max_1s_sent": max_in_window(sent, 1000),
        "steps_unmatched": unmatched,
    }


def proven_counts(args, pods, excluded):
    """Deletions, creations and starts (ungated creations, gates lifted) of the rollout as
    intervals from the audit log, counted in exact windows: inside (most_inside, a lower
    bound) and overlapping (most_overlapping, an upper bound); and the effects at their
    answers (effect_counts)."""
    t_end = args.t_end or args.t0 + 3_600_000
    reqs = audit_requests(args.audit, args.t0, t_end, args.ns_prefix)
    sts_user = "system:serviceaccount:kube-system:statefulset-controller"
    is_delete = lambda r: r["verb"] == "delete" and r["resource"] == "pods" and not r["sub"] and r["user"] == sts_user and r["code"] == 200
    is_create = lambda r: r["verb"] == "create" and r["resource"] == "pods" and not r["sub"] and r["user"] == sts_user and r["code"] == 201
    is_release = lambda r: r["verb"] == "patch" and r["resource"] == "pods" and not r["sub"] and r["user"].startswith("system:serviceaccount:churn-throttler:") and r["code"] == 200
    dels, creates, starts, missing = [], [], [], 0
    for p in pods.values():
        if p["added"] is None and p["deleted"] is not None:
            r = request_first(reqs, is_delete, p["ns"], p["name"], args.t0, p["deleted"])
            if r is None:
                missing += 1
            elif not excluded(p["deleted"]):
                dels.append((r["recv"], r["done"]))
        if p["added"] is not None:
            r = request_before(reqs, is_create, p["ns"], p["name"], p["added"])
            if r is None:
                missing += 1
                continue
            if not excluded(p["added"]):
                creates.append((r["recv"], r["done"]))
                if not p["gated_at_add"]:
                    starts.append((r["recv"], r["done"]))
            if p["gated_at_add"] and p["released"] is not None:
                rr = request_before(reqs, is_release, p["ns"], p["name"], p["released"])
                if rr is None:
                    missing += 1
                else:
                    lo = iso_ms(p["released_at"]) if p.get("released_at") else rr["recv"]
                    starts.append((min(lo, rr["recv"]), rr["done"]))
    w = args.window_ms
    spans = [hi - lo for lo, hi in dels + creates + starts]
    spans.sort()
    res = {
        "proven_deletes": most_inside(dels, w),
        "proven_creates": most_inside(creates, w),
        "proven_starts": most_inside(starts, w),
        "overlap_deletes": most_overlapping(dels, w),
        "overlap_creates": most_overlapping(creates, w),
        "overlap_starts": most_overlapping(starts, w),
        # At the answer: creations (the others' paced creates).
        "effect_creates": len(creates),
        "effect_creates_max": max_in_window([hi for _, hi in creates], w),
        "effect_creates_max_1s": max_in_window([hi for _, hi in creates], 1000),
        "proven_unmatched": missing,
        "request_ms": {"median": int(spans[len(spans) // 2]), "max": int(spans[-1])} if spans else None,
    }
    if args.exclude_from is not None:
        # While no webhook answered, deletions and creations went through unpaced.
        lo, hi = args.exclude_from, args.exclude_to
        reqs = [r for r in reqs if not (lo <= r["done"] <= hi)]
    res.update(effect_counts(reqs, args.t0, t_end, w, 1000))
    return res


def cmd_rollout(args):
    """Figures and checks of one mass rollout, from the recorded pod events."""
    evs = load_events(args.events, since=args.t0)
    prefix = args.ns_prefix
    pods = pod_story(evs, lambda e: (e.get("ns") or "").startswith(prefix) and e.get("owner") == "StatefulSet")
    window = args.window_ms
    tol = args.jitter_ms
    limit = args.limit
    expected = args.sts * args.replicas
    creates = sorted(p["added"] for p in pods.values() if p["added"] is not None)
    deletes = sorted(p["deleted"] for p in pods.values() if p["deleted"] is not None and p["added"] is None)
    # A pod started (can be scheduled) when it was created without our gate, or when the gate
    # was lifted: that is what a gate rule charges.
    starts = sorted(
        (p["released"] if p["gated_at_add"] else p["added"])
        for p in pods.values()
        if p["added"] is not None and (not p["gated_at_add"] or p["released"] is not None)
    )
    gated = sum(1 for p in pods.values() if p["added"] is not None and p["gated_at_add"])
    new_ready = [p["ready"] for p in pods.values() if p["added"] is not None and p["ready"] is not None]
    last_ready = max(new_ready) if new_ready else None
    excluded = []
    creates_p, deletes_p, starts_p = creates, deletes, starts
    if args.exclude_from is not None:
        # While no webhook answered (failurePolicy Ignore), creations and deletions went
        # through unpaced, by design: they are left out. Gates lifted are always counted.
        lo, hi = args.exclude_from, args.exclude_to
        def outside(ts):
            return [t for t in ts if not (lo <= t <= hi)]
        excluded = [t for t in creates if lo <= t <= hi]
        creates_p, deletes_p = outside(creates), outside(deletes)
        starts_p = sorted(
            (p["released"] if p["gated_at_add"] else p["added"])
            for p in pods.values()
            if p["added"] is not None
            and ((p["gated_at_add"] and p["released"] is not None) or (not p["gated_at_add"] and not lo <= p["added"] <= hi))
        )
        res_outage = {
            "outage_creates": len(excluded),
            "outage_deletes": len([t for t in deletes if lo <= t <= hi]),
            "outage_gated": sum(1 for p in pods.values() if p["added"] is not None and lo <= p["added"] <= hi and p["gated_at_add"]),
        }
        # The windows that hold the restart: what seeding is for.
        def across(ts, w):
            return max([sum(1 for u in ts if t <= u < t + w) for t in ts if t <= hi < t + w] + [0])
        res_outage["starts_across_restart"] = across(starts_p, window - tol)
        res_outage["deletes_across_restart"] = across(deletes_p, window - tol)
    else:
        res_outage = {}
    w_eff = window - tol
    res = {
        "action": args.action,
        "creates": len(creates),
        "deletes": len(deletes),
        "starts": len(starts),
        "gated": gated,
        "expected": expected,
        "new_ready": len(new_ready),
        "makespan_s": round((last_ready - args.t0) / 1000, 1) if last_ready else None,
        "first_create_s": round((creates[0] - args.t0) / 1000, 2) if creates else None,
        "first_delete_s": round((deletes[0] - args.t0) / 1000, 2) if deletes else None,
        "window_ms": window,
        "jitter_ms": tol,
        "limit": limit,
        # Checked: windows of (window - jitter); also printed: exact windows, for the record.
        "max_creates": max_in_window(creates_p, w_eff),
        "max_deletes": max_in_window(deletes_p, w_eff),
        "max_starts": max_in_window(starts_p, w_eff),
        "max_creates_exact": max_in_window(creates_p, window),
        "max_deletes_exact": max_in_window(deletes_p, window),
        "max_starts_exact": max_in_window(starts_p, window),
        "excluded_creates": len(excluded),
    }
    res.update(res_outage)
    if args.audit:
        lo, hi = (args.exclude_from, args.exclude_to) if args.exclude_from is not None else (None, None)
        res.update(proven_counts(args, pods, lambda t: lo is not None and lo <= t <= hi))
        if args.sts_events:
            res.update(step_effects(args, load_events(args.sts_events)))
    paced = args.paced_events if args.paced_events else expected
    ideal = paced * window / 1000 / limit
    res["ideal_s"] = round(ideal, 1)
    res["ratio"] = round(res["makespan_s"] / ideal, 2) if res["makespan_s"] else None
    # Collateral StatefulSet: its pods in its own namespace.
    if args.collateral_ns:
        cpods = pod_story(evs, lambda e: e.get("ns") == args.collateral_ns)
        ready = [p["ready"] for p in cpods.values() if p["added"] is not None and p["ready"] is not None]
        made = [p for p in cpods.values() if p["added"] is not None]
        res["collateral_pods"] = len(made)
        if args.collateral_t is not None and len(ready) >= args.replicas:
            res["collateral_s"] = round((max(ready) - args.collateral_t) / 1000, 2)
        else:
            res["collateral_s"] = None
    # Seconds-resolution histogram, for the record.
    def per_window(ts):
        if not ts:
            return []
        n = int((max(ts) - args.t0) // window) + 1
        out = [0] * n
        for t in ts:
            out[int((t - args.t0) // window)] += 1
        return out
    res["deletes_per_window"] = per_window(deletes)
    res["creates_per_window"] = per_window(creates)
    res["starts_per_window"] = per_window(starts)
    # Gate: observation latency of releases against the releaser's own clock.
    lat = []
    res["released_at_lag_ms"] = None
    rel = {}
    for e in evs:
        if e.get("kind") == "pod" and e.get("released_at") and e["uid"] not in rel:
            rel[e["uid"]] = e["released_at"]
    for uid, p in pods.items():
        if p["released"] is not None and uid in rel:
            try:
                import datetime
                at = datetime.datetime.fromisoformat(rel[uid].replace("Z", "+00:00")).timestamp() * 1000
                lat.append(p["released"] - at)
            except ValueError:
                pass
    if lat:
        lat.sort()
        res["released_at_lag_ms"] = {"min": int(lat[0]), "median": int(lat[len(lat) // 2]), "max": int(lat[-1])}
    print(f"  pods re-created: {len(creates)} created, {len(deletes)} deleted, {gated} gated at creation, "
          f"{len(new_ready)} new pods Ready (expected {expected})")
    print(f"  makespan {res['makespan_s']} s (trigger to the last new pod Ready), ideal {res['ideal_s']} s "
          f"({paced} paced events / {limit} per {window / 1000:g} s), ratio {res['ratio']}")
    print(f"  watch: most in any {window / 1000:g} s window ({w_eff / 1000:g} s window): deletions "
          f"{res['max_deletes_exact']} ({res['max_deletes']}), creations {res['max_creates_exact']} "
          f"({res['max_creates']}), pod starts (ungated creations and gates lifted) "
          f"{res['max_starts_exact']} ({res['max_starts']}); limit {limit}")
    if args.audit:
        print(f"  from the audit log, counting an event in a window only when its whole API request "
              f"(received..answered; median {res['request_ms']['median'] if res['request_ms'] else '-'} ms, "
              f"max {res['request_ms']['max'] if res['request_ms'] else '-'} ms) lies inside it: most in one "
              f"{window / 1000:g} s window: deletions {res['proven_deletes']}, creations {res['proven_creates']}, "
              f"starts {res['proven_starts']}; limit {limit}"
              + (f" ({res['proven_unmatched']} watch events without their request!)" if res["proven_unmatched"] else ""))
        print(f"  ...and overlapping the window (an upper bound): deletions {res['overlap_deletes']}, creations "
              f"{res['overlap_creates']}, starts {res['overlap_starts']}")
        print(f"  at the effect (the API server's answer; a start at the scheduler's pods/binding), most in "
              f"one {window / 1000:g} s / 1 s window: bindings {res['effect_binds_max']} / {res['effect_binds_max_1s']} "
              f"of {res['effect_binds']}, deletions {res['effect_deletes_max']} / {res['effect_deletes_max_1s']} "
              f"of {res['effect_deletes']}, creations {res['effect_creates_max']} / {res['effect_creates_max_1s']} "
              f"of {res['effect_creates']}; bindings' requests inside {res['effect_binds_inside']}, "
              f"overlapping {res['effect_binds_overlap']}; limit {limit}")
    print(f"  per {window / 1000:g} s since the trigger: deletions {res['deletes_per_window']}")
    print(f"  {' ' * len(str(window / 1000))}                          creations {res['creates_per_window']}")
    if gated:
        print(f"  {' ' * len(str(window / 1000))}                          starts    {res['starts_per_window']}")
    if res["released_at_lag_ms"]:
        print(f"  gate lifted (releaser's released-at) -> seen by the watch: {res['released_at_lag_ms']} ms")
    if args.collateral_ns:
        print(f"  collateral StatefulSet ({args.collateral_ns}): rolled out in {res['collateral_s']} s")
    result(res)


def cmd_steps(args):
    """Partition steps of StatefulSets, from recorded StatefulSet events."""
    # Every event, so that the partition before the first step is known too.
    evs = load_events(args.events)
    last = {}
    steps = []
    for e in evs:
        if e.get("kind") != "sts" or not (e.get("ns") or "").startswith(args.ns_prefix):
            continue
        key = e["uid"]
        p = e.get("partition")
        if e["t"] >= args.t0 and key in last and p is not None and last[key] is not None and p < last[key]:
            steps.extend([e["t"]] * (last[key] - p))
        last[key] = p
    w_eff = args.window_ms - args.jitter_ms
    res = {}
    if args.audit:
        reqs = audit_requests(args.audit, args.t0, args.t_end, args.ns_prefix)
        iv = [(r["recv"], r["done"]) for r in reqs
              if r["resource"] == "statefulsets" and r["verb"] == "patch" and r["user"] == args.user
              and r["code"] == 200 and args.t0 <= r["done"] <= args.t_end + 2000]
        res["proven_steps"] = most_inside(iv, args.window_ms)
        res["overlap_steps"] = most_overlapping(iv, args.window_ms)
        # At the effect: a step takes effect when its patch is answered.
        res["effect_steps"] = len(iv)
        res["effect_steps_max"] = max_in_window([hi for _, hi in iv], args.window_ms)
        spans = sorted(hi - lo for lo, hi in iv)
        res["request_ms"] = {"median": int(spans[len(spans) // 2]), "max": int(spans[-1])} if spans else None
        print(f"  audit: {len(iv)} accepted partition patches; most whose whole request (median "
              f"{res['request_ms']['median'] if spans else '-'} ms, max {res['request_ms']['max'] if spans else '-'} ms) "
              f"lies in one {args.window_ms / 1000:g} s window: {res['proven_steps']}; overlapping it (an upper "
              f"bound): {res['overlap_steps']}; at their answers (the effect): {res['effect_steps_max']}")
    res.update({
        "steps": len(steps),
        "max_steps": max_in_window(steps, w_eff),
        "max_steps_exact": max_in_window(steps, args.window_ms),
        "last_step_s": round((max(steps) - args.t0) / 1000, 1) if steps else None,
    })
    print(f"  partition steps seen: {len(steps)}; most in any {w_eff / 1000:g} s window: {res['max_steps']} "
          f"(exact {args.window_ms / 1000:g} s window: {res['max_steps_exact']}); last step {res['last_step_s']} s after the start")
    result(res)


def cmd_effects(args):
    """The effects of a burst of workloads (bindings, deletions, evictions), at their
    answers in the audit log, in exact windows of the policy's length and of 1 s."""
    reqs = audit_requests(args.audit, args.t0, args.t_end, args.ns_prefix)
    res = effect_counts(reqs, args.t0, args.t_end, args.window_ms, 1000)
    done = sorted(r["done"] for r in reqs if r["sub"] == "binding" and r["code"] == 201 and r["done"] >= args.t0)
    res["last_bind_s"] = round((done[-1] - args.t0) / 1000, 1) if done else None
    print(f"  at the effect: {res['effect_binds']} bindings, most in one {args.window_ms / 1000:g} s window "
          f"{res['effect_binds_max']} (their requests inside {res['effect_binds_inside']}, overlapping "
          f"{res['effect_binds_overlap']}), in one 1 s window {res['effect_binds_max_1s']}; last binding "
          f"{res['last_bind_s']} s after the start")
    result(res)


# ---- audit log ----------------------------------------------------------------------------


def cmd_audit(args):
    """Counts ResponseComplete audit entries by resource, verb, user and HTTP code."""
    import datetime

    def ms(ts):
        return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000

    counts = {}
    with open(args.log) as f:
        for line in f:
            try:
                a = json.loads(line)
            except ValueError:
                continue
            if a.get("stage") != "ResponseComplete":
                continue
            t = ms(a["stageTimestamp"])
            if t < args.since or (args.until and t > args.until):
                continue
            ref = a.get("objectRef") or {}
            ns = ref.get("namespace") or ""
            if args.ns_prefix and not ns.startswith(args.ns_prefix):
                continue
            res = ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else "")
            user = a.get("user", {}).get("username", "")
            user = user.replace("system:serviceaccount:", "sa:")
            code = (a.get("responseStatus") or {}).get("code")
            key = f"{res} {a.get('verb')} {user} {code}"
            counts[key] = counts.get(key, 0) + 1
    for k in sorted(counts):
        print(f"  {counts[k]:6d}  {k}")
    result(counts)


# ---- metrics -------------------------------------------------------------------------------


def parse_exposition(text):
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        if "{" in name_labels:
            name, _, rest = name_labels.partition("{")
            labels = {}
            for part in rest.rstrip("}").split('",'):
                if "=" in part:
                    k, _, v = part.partition("=")
                    labels[k.strip()] = v.strip().strip('"')
        else:
            name, labels = name_labels, {}
        try:
            out.append((name, labels, float(value)))
        except ValueError:
            pass
    return out


def cmd_metric_sum(args):
    """Sum of a metric over the samples whose labels match every KEY=VALUE given
    (VALUE may list alternatives: action=allow|hold)."""
    text = sys.stdin.read()
    want = [kv.split("=", 1) for kv in args.match]
    total = 0.0
    for name, labels, value in parse_exposition(text):
        if name != args.name:
            continue
        if all(labels.get(k) in v.split("|") for k, v in want):
            total += value
    print(int(total) if total == int(total) else total)


def cmd_decisions(args):
    """The decision counters of an exposition, as RESULT {"rule operation action": n}."""
    out = {}
    for name, labels, value in parse_exposition(sys.stdin.read()):
        if name == "churn_throttler_decisions_total":
            out[f'{labels.get("rule")} {labels.get("operation")} {labels.get("action")}'] = int(value)
    result(out)


def cmd_prom(args):
    """An instant query against Prometheus' HTTP API, printed as RESULT {labels: value}."""
    q = urllib.parse.urlencode({"query": args.query, "time": f"{args.time / 1000:.3f}"})
    with urllib.request.urlopen(f"http://{args.addr}/api/v1/query?{q}", timeout=10) as r:
        data = json.load(r)
    if data.get("status") != "success":
        print(f"prometheus: {data}", file=sys.stderr)
        sys.exit(1)
    out = {}
    keys = args.keys.split(",") if args.keys else None
    for s in data["data"]["result"]:
        if keys:
            key = " ".join(s["metric"].get(k, "") for k in keys)
        else:
            key = " ".join(f"{k}={v}" for k, v in sorted(s["metric"].items()) if k not in ("instance", "job"))
        v = float(s["value"][1])
        out[key or "value"] = int(v) if v == int(v) else v
    result(out)


# ---- AdmissionReview capture ----------------------------------------------------------------


def cmd_capture_server(args):
    """An HTTPS webhook that saves every AdmissionReview it gets and allows it."""
    import http.server

    os.makedirs(args.dir, exist_ok=True)
    counter = {"n": 0}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            n = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(n)
            try:
                review = json.loads(body)
                req = review["request"]
                with lock:
                    counter["n"] += 1
                    i = counter["n"]
                name = f'{i:03d}-{req["resource"]["resource"]}{"-" + req["subResource"] if req.get("subResource") else ""}-{req["operation"].lower()}.json'
                with open(os.path.join(args.dir, name), "w") as f:
                    json.dump({"path": self.path, "content_type": self.headers.get("Content-Type"),
                               "review": review}, f, indent=1)
                answer = {"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
                          "response": {"uid": req["uid"], "allowed": True}}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except Exception as e:  # noqa: BLE001 - a test helper answers whatever comes
                self.send_response(400)
                self.end_headers()
                self.wfile.write(str(e).encode())

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


def shape(v, path="", out=None):
    """Every key path of a JSON value, with the JSON type at it (lists: their items)."""
    if out is None:
        out = {}
    if isinstance(v, dict):
        out[path or "/"] = "object"
        for k, x in v.items():
            shape(x, f"{path}/{k}", out)
    elif isinstance(v, list):
        out[path] = "array"
        for x in v:
            shape(x, f"{path}[]", out)
    else:
        out[path] = type(v).__name__
    return out


def cmd_compare_fixtures(args):
    """Compares captured reviews with tests/fixtures by the kind of request: key paths
    present on one side only (outside the objects' own spec), and type differences."""
    captured = {}
    for f in sorted(os.listdir(args.captured)):
        if f.endswith(".json"):
            captured[f] = json.load(open(os.path.join(args.captured, f)))["review"]
    fixtures = {}
    for f in sorted(os.listdir(args.fixtures)):
        if f.endswith(".json"):
            try:
                fixtures[f] = json.load(open(os.path.join(args.fixtures, f)))
            except ValueError:
                continue
    pairs = [p.split("=", 1) for p in args.pair]
    for fix, cap in pairs:
        if fix not in fixtures or cap not in captured:
            print(f"== {fix} vs {cap}: missing ({'fixture' if fix not in fixtures else 'capture'})")
            continue
        a, b = fixtures[fix], captured[cap]
        sa, sb = shape(a), shape(b)
        interesting = lambda p: not any(p.startswith(x) for x in (
            "/request/object/spec", "/request/oldObject/spec", "/request/object/status",
            "/request/oldObject/status", "/request/object/metadata/managedFields",
            "/request/oldObject/metadata/managedFields"))
        only_fix = sorted(p for p in sa if p not in sb and interesting(p))
        only_cap = sorted(p for p in sb if p not in sa and interesting(p))
        types = sorted(p for p in sa if p in sb and sa[p] != sb[p])
        print(f"== fixture {fix} vs captured {cap}")
        ra, rb = a.get("request", {}), b.get("request", {})
        for k in ("operation", "resource", "subResource", "requestSubResource", "dryRun", "options", "userInfo"):
            va, vb = ra.get(k), rb.get(k)
            if k == "userInfo":
                va = {x: y for x, y in (va or {}).items() if x != "uid"}
                vb = {x: y for x, y in (vb or {}).items() if x != "uid"}
                if isinstance(va.get("extra"), dict):
                    va["extra"] = sorted(va["extra"])
                if isinstance(vb.get("extra"), dict):
                    vb["extra"] = sorted(vb["extra"])
            if va != vb:
                print(f"   {k}: fixture {json.dumps(va)} | real {json.dumps(vb)}")
        for p in only_fix:
            print(f"   only in fixture: {p}")
        for p in only_cap:
            print(f"   only in real:    {p}")
        for p in types:
            print(f"   type differs:    {p}: fixture {sa[p]} | real {sb[p]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("record"); p.add_argument("out"); p.set_defaults(fn=cmd_record)
    p = sub.add_parser("seen"); p.add_argument("file"); p.add_argument("token"); p.set_defaults(fn=cmd_seen)

    p = sub.add_parser("patch-many")
    p.add_argument("--server", required=True); p.add_argument("--ca", required=True)
    p.add_argument("--token-file", required=True); p.add_argument("--targets", required=True)
    p.add_argument("--body", required=True); p.add_argument("--parallel", type=int, default=16)
    p.add_argument("--group-version", default="apps/v1"); p.add_argument("--resource", default="statefulsets")
    p.set_defaults(fn=cmd_patch_many)

    p = sub.add_parser("sts-status"); p.add_argument("--expect", type=int, default=1)
    p.add_argument("-v", "--verbose", action="store_true"); p.set_defaults(fn=cmd_sts_status)
    p = sub.add_parser("revisions-pending"); p.add_argument("--expect", type=int, default=1)
    p.set_defaults(fn=cmd_revisions_pending)
    p = sub.add_parser("pod-check"); p.add_argument("--ns-prefix", action="append")
    p.set_defaults(fn=cmd_pod_check)

    p = sub.add_parser("rollout")
    p.add_argument("--events", required=True); p.add_argument("--t0", type=int, required=True)
    p.add_argument("--action", required=True); p.add_argument("--ns-prefix", required=True)
    p.add_argument("--sts", type=int, required=True); p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--limit", type=int, required=True); p.add_argument("--window-ms", type=int, required=True)
    p.add_argument("--jitter-ms", type=int, default=0); p.add_argument("--paced-events", type=int)
    p.add_argument("--audit", help="the API server's audit log: also count from request intervals")
    p.add_argument("--t-end", type=int)
    p.add_argument("--collateral-ns"); p.add_argument("--collateral-t", type=int)
    p.add_argument("--exclude-from", type=int); p.add_argument("--exclude-to", type=int)
    p.add_argument("--sts-events", help="recorded StatefulSet events: the releaser's partition steps")
    p.set_defaults(fn=cmd_rollout)

    p = sub.add_parser("steps")
    p.add_argument("--events", required=True); p.add_argument("--t0", type=int, required=True)
    p.add_argument("--ns-prefix", required=True); p.add_argument("--window-ms", type=int, required=True)
    p.add_argument("--jitter-ms", type=int, default=0); p.add_argument("--audit"); p.add_argument("--t-end", type=int)
    p.add_argument("--user", default="e2e-admin"); p.set_defaults(fn=cmd_steps)

    p = sub.add_parser("effects")
    p.add_argument("--audit", required=True); p.add_argument("--t0", type=int, required=True)
    p.add_argument("--t-end", type=int, required=True); p.add_argument("--ns-prefix", required=True)
    p.add_argument("--window-ms", type=int, required=True); p.set_defaults(fn=cmd_effects)

    p = sub.add_parser("audit"); p.add_argument("log"); p.add_argument("--since", type=int, default=0)
    p.add_argument("--until", type=int, default=0); p.add_argument("--ns-prefix", default="")
    p.set_defaults(fn=cmd_audit)

    p = sub.add_parser("metric-sum"); p.add_argument("name"); p.add_argument("match", nargs="*")
    p.set_defaults(fn=cmd_metric_sum)
    p = sub.add_parser("decisions"); p.set_defaults(fn=cmd_decisions)
    p = sub.add_parser("prom"); p.add_argument("--addr", required=True); p.add_argument("--time", type=int, required=True)
    p.add_argument("--keys", help="label names joined (in this order) into each result's key")
    p.add_argument("query"); p.set_defaults(fn=cmd_prom)

    p = sub.add_parser("capture-server"); p.add_argument("--port", type=int, required=True)
    p.add_argument("--cert", required=True); p.add_argument("--key", required=True); p.add_argument("--dir", required=True)
    p.set_defaults(fn=cmd_capture_server)
    p = sub.add_parser("compare-fixtures"); p.add_argument("--captured", required=True)
    p.add_argument("--fixtures", required=True); p.add_argument("pair", nargs="*", help="FIXTURE=CAPTURED")
    p.set_defaults(fn=cmd_compare_fixtures)

    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
