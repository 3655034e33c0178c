#!/usr/bin/env python3
"""Helpers of tests/e2e/partition.sh (standard library only).

  record OUT          read the one-line events of `kubectl get pods --watch-only
                      --output-watch-events -o go-template` on stdin, append one JSON
                      line per event with the receive time (ms)
  seen FILE TOKEN     exit 0 once a recorded event carries TOKEN (the watch is live)
  sts-state           read `kubectl get sts -o json` on stdin, print one line per set:
                      ns/name partition target held updated ready replicas
  converged N         same input: exit 0 when N sets are done (updated == ready ==
                      replicas, partition 0, no hold annotations)
  analyze ...         the checks and figures, see `analyze --help`
  held-history LOG ...  whether every rollout was held, from a StatefulSet watch (slowpods.sh)
"""

import argparse
import datetime
import glob
import json
import os
import sys

TARGET = "churn-throttler.io/partition-target"
HELD = "churn-throttler.io/partition-held"
SINCE = "churn-throttler.io/partition-held-since"
PACED_BY = "churn-throttler.io/paced-by"
STEPPED_AT = "churn-throttler.io/partition-stepped-at"
STS_CONTROLLER = "system:serviceaccount:kube-system:statefulset-controller"


def now_ms():
    return int(datetime.datetime.now(datetime.timezone.utc).timestamp() * 1000)


def ms(text):
    return int(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def record(out):
    """Lines of `kubectl get pods --watch-only --output-watch-events -o go-template=...`:
    EVENT NAMESPACE NAME UID deleting|-."""
    with open(out, "a", buffering=1) as f:
        for line in iter(sys.stdin.readline, ""):
            parts = line.split()
            if len(parts) < 5:
                continue
            f.write(json.dumps({
                "t": now_ms(),
                "type": parts[0],
                "ns": parts[1],
                "name": parts[2],
                "uid": parts[3],
                "deleting": parts[4] == "deleting",
            }) + "\n")


def seen(path, token):
    try:
        with open(path) as f:
            return any(token in line for line in f)
    except OSError:
        return False


def sets(doc):
    for s in doc["items"]:
        m = s["metadata"]
        a = m.get("annotations") or {}
        spec = s["spec"]
        st = s.get("status") or {}
        part = ((spec.get("updateStrategy") or {}).get("rollingUpdate") or {}).get("partition", 0)
        yield {
            "key": f'{m["namespace"]}/{m["name"]}',
            "partition": part,
            "target": a.get(TARGET),
            "held": a.get(HELD),
            "record": a.get(PACED_BY) or a.get(STEPPED_AT),
            "since": a.get(SINCE),
            "replicas": spec.get("replicas", 1),
            "updated": st.get("updatedReplicas", 0),
            "ready": st.get("readyReplicas", 0),
            "current_gen": st.get("observedGeneration", 0) >= m.get("generation", 0),
            "update_rev": st.get("updateRevision"),
            "current_rev": st.get("currentRevision"),
        }


def done(s):
    return (s["current_gen"] and s["updated"] == s["replicas"] == s["ready"] and s["partition"] == 0
            and s["target"] is None and s["held"] is None and s["since"] is None)


def worst_window(times, window):
    times = sorted(times)
    best, at = 0, None
    j = 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        if i - j + 1 > best:
            best, at = i - j + 1, times[j]
    return best, at


def in_window_after(times, start, window):
    return sum(1 for t in times if start <= t < start + window)


def analyze(a):
    w = a.workdir
    window = a.window_ms
    paced = set(a.paced_namespaces.split(","))
    res = {}

    # Which process stepped what, from each process's log; the steps themselves come
    # from the audit log (a process killed with SIGKILL may not have logged its last).
    logged = []
    ends = []
    for log in sorted(glob.glob(f"{w}/replica-*.log")):
        proc = os.path.basename(log)[len("replica-"):-len(".log")]
        for line in open(log):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            f = e.get("fields", {})
            if f.get("message") == "releaser: partition stepped":
                logged.append((ms(e["timestamp"]), proc, f.get("statefulset"), f.get("reason"), f.get("from"), f.get("to")))
            elif f.get("message") == "releaser: partition hold ended":
                ends.append((ms(e["timestamp"]), proc, f.get("statefulset"), f.get("outcome"), f.get("held_s")))

    # Pod deletions and creations by the StatefulSet controller, from the audit log: the
    # first of each per pod after the change (each pod rolls once). kwok sometimes deletes
    # the new pod right after its creation (its delete stage acting on the old pod's
    # name); the controller then creates it again: counted apart, as `recreated_again`.
    deletes, creates, refused = [], [], []
    # At the effect (answer times): the first deletion per pod, the first gate lift by the
    # releaser and the first binding by the scheduler per pod (a start, where the CNI works).
    deletes_done, lifts_done, binds_done = {}, {}, {}
    # Pods created while no webhook answered (the API server failed open: no gate, so
    # nothing paced their start): "ns/pod" -> the creation's receive time.
    failed_open = {}
    recreated_again = 0
    codes = {}
    audit_steps = []  # (receive time, "ns/name", to)
    answers_429 = []
    pod_events = {}  # "ns/pod" -> [(t, verb)]
    for line in open(f"{w}/logs/audit.log"):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("stage") != "ResponseComplete":
            continue
        ref = e.get("objectRef") or {}
        user = (e.get("user") or {}).get("username", "")
        code = (e.get("responseStatus") or {}).get("code", 0)
        t = ms(e["requestReceivedTimestamp"])
        if code == 429:
            # A deny or a retry-after of the webhook, as the API server answered it.
            answers_429.append((t, user, e.get("verb"), ref.get("resource"), ref.get("namespace"), ref.get("name")))
        if user == STS_CONTROLLER and code >= 400 and code not in (404, 409):
            refused.append((t, e.get("verb"), ref.get("resource"), ref.get("namespace"), ref.get("name"), code))
        if ref.get("resource") == "statefulsets" and user == a.releaser_user:
            codes[str(code)] = codes.get(str(code), 0) + 1
            ops = e.get("requestObject")
            if 200 <= code < 300 and isinstance(ops, list):
                for op in ops:
                    if op.get("path") == "/spec/updateStrategy/rollingUpdate/partition" and op.get("op") in ("add", "replace"):
                        audit_steps.append((t, f'{ref.get("namespace")}/{ref.get("name")}', op.get("value")))
        if ref.get("namespace") not in paced or t < a.t_change:
            continue
        done_t = ms(e["stageTimestamp"])
        pod_key = f'{ref.get("namespace")}/{ref.get("name")}'
        if ref.get("resource") == "pods" and ref.get("subresource") == "binding" and e.get("verb") == "create" and code == 201:
            binds_done.setdefault(pod_key, done_t)
        ops = e.get("requestObject")
        lifts = isinstance(ops, list) and any(str(op.get("path", "")).startswith("/spec/schedulingGates") for op in ops)
        if ref.get("resource") == "pods" and not ref.get("subresource") and e.get("verb") == "patch" \
                and user == a.releaser_user and 200 <= code < 300 and lifts:
            lifts_done.setdefault(pod_key, done_t)
        if ref.get("resource") == "pods" and not ref.get("subresource") and e.get("verb") == "delete" \
                and user == STS_CONTROLLER and code == 200:
            deletes_done.setdefault(pod_key, done_t)
        if ref.get("resource") == "pods" and not ref.get("subresource") and user == STS_CONTROLLER and 200 <= code < 300:
            key = f'{ref.get("namespace")}/{ref.get("name")}'
            verb = e.get("verb")
            if any(v == verb for _, v in pod_events.get(key, [])):
                recreated_again += verb == "create"
                continue
            pod_events.setdefault(key, []).append((t, verb))
            if verb == "create" and any(k.startswith("failed-open.mutation.webhook.admission.k8s.io/")
                                        for k in (e.get("annotations") or {})):
                failed_open[key] = t
            if verb == "delete":
                deletes.append(t)
            elif verb == "create":
                creates.append(t)

    # Each audited step, with the process that logged it (the first log line after it).
    steps = []  # (receive time, proc, sts, reason, to)
    for t, sts, to in sorted(audit_steps):
        after = [(tl, p, r) for tl, p, s_, r, _, to_ in logged if s_ == sts and to_ == to and tl >= t]
        proc, reason = (min(after)[1], min(after)[2]) if after else ("(no log)", "rate")
        steps.append((t, proc, sts, reason, to))
    rate_steps = [s for s in steps if s[3] == "rate" and s[2].split("/")[0] in paced]
    step_times = [s[0] for s in rate_steps]

    # Per step: the deletion and the creation of the pod it released.
    to_delete, to_create = [], []
    for t, _, sts, _, to in rate_steps:
        evs = sorted(pod_events.get(f"{sts}-{to}", []))
        d = next((x for x, verb in evs if verb == "delete" and x >= t), None)
        c = next((x for x, verb in evs if verb == "create" and d is not None and x >= d), None)
        if d is not None:
            to_delete.append(d - t)
        if c is not None:
            to_create.append(c - t)

    # The same from the pod watch (receive times, so the client's jitter is in them).
    # The first of each per pod name, as above.
    watch_deletes, watch_creates, deleted, added = [], [], set(), set()
    for line in open(f"{w}/pods.jsonl"):
        e = json.loads(line)
        if e["ns"] not in paced or e["t"] < a.t_change:
            continue
        key = f'{e["ns"]}/{e["name"]}'
        if e["type"] == "ADDED" and key not in added:
            added.add(key)
            watch_creates.append(e["t"])
        if (e["deleting"] or e["type"] == "DELETED") and key not in deleted:
            deleted.add(key)
            watch_deletes.append(e["t"])

    # How far the watch was behind the API server, per pod event.
    first_watch = {}
    for line in open(f"{w}/pods.jsonl"):
        e = json.loads(line)
        key = f'{e["ns"]}/{e["name"]}'
        if e["type"] == "ADDED":
            first_watch.setdefault((key, "create"), e["t"])
        if e["deleting"] or e["type"] == "DELETED":
            first_watch.setdefault((key, "delete"), e["t"])
    lags = sorted(first_watch[(k, v)] - t for k, evs in pod_events.items() for t, v in evs if (k, v) in first_watch)
    res["watch_lag_ms"] = {"n": len(lags), "median": lags[len(lags) // 2], "p95": lags[int(len(lags) * 0.95)], "max": lags[-1]} if lags else None
    res["watch_lag_p95_ms"] = lags[int(len(lags) * 0.95)] if lags else 0
    # Two events a window apart at the API server can reach the watch up to this much
    # closer together: its own delivery jitter.
    jitter = lags[-1] - lags[0] if lags else 0
    res["watch_jitter_ms"] = jitter

    # A re-created pod keeps its name, so its binding is the first one after its old pod's
    # deletion; the setup's bindings (before the change) were dropped above by t_change.
    # The starts of pods created while no webhook answered are left out of the bindings'
    # windows (nothing could pace them); the suite checks that they all fell in its
    # webhook's outage.
    effect = {"effect_deletes": sorted(deletes_done.values()),
              "effect_lifts": sorted(lifts_done.values()),
              "effect_binds": sorted(t for k, t in binds_done.items() if k not in failed_open)}
    for name, times in effect.items():
        res[name] = len(times)
        res[f"worst_{name}"] = worst_window(times, window)[0]
        res[f"worst_{name}_1s"] = worst_window(times, 1000)[0]
    res["failed_open_creates"] = sorted(failed_open.values())
    for name, times in [("steps", step_times), ("deletes", deletes), ("creates", creates),
                        ("watch_deletes", watch_deletes), ("watch_creates", watch_creates)]:
        worst, at = worst_window(times, window)
        res[name] = len(times)
        res[f"worst_{name}"] = worst
        res[f"worst_{name}_at_s"] = round((at - a.t_change) / 1000, 3) if at else None
        if name.startswith("watch_"):
            res[f"worst_{name}_within_jitter"] = worst_window(times, window - jitter)[0]

    def dist(xs):
        xs = sorted(xs)
        return {"n": len(xs), "min": xs[0], "median": xs[len(xs) // 2], "max": xs[-1]} if xs else None
    res["step_to_delete_ms"] = dist(to_delete)
    res["step_to_create_ms"] = dist(to_create)

    # Steps per process, and around the disruptions.
    procs = {}
    for t, proc, *_ in rate_steps:
        lo, hi, n = procs.get(proc, (t, t, 0))
        procs[proc] = (min(lo, t), max(hi, t), n + 1)
    res["steps_by_process"] = {p: {"n": n, "from_s": round((lo - a.t_change) / 1000, 1), "to_s": round((hi - a.t_change) / 1000, 1)}
                               for p, (lo, hi, n) in sorted(procs.items(), key=lambda kv: kv[1][0])}
    after = lambda t: min((x for x in step_times if x > t), default=None)
    if a.t_kill:
        x = after(a.t_kill)
        res["first_step_after_kill_s"] = round((x - a.t_kill) / 1000, 3) if x else None
    if a.t_restart:
        x = after(a.t_restart)
        res["first_step_after_restart_s"] = round((x - a.t_restart) / 1000, 3) if x else None
        res["steps_in_window_before_restart"] = sum(1 for t in step_times if a.t_restart - window < t <= a.t_restart)
        res["steps_in_first_window_after_restart"] = in_window_after(step_times, a.t_restart, window)
        near = [t for t in step_times if abs(t - a.t_restart) < 2 * window]
        res["worst_window_around_restart"] = worst_window(near, window)[0]
        res["deletes_worst_window_around_restart"] = worst_window([t for t in deletes if abs(t - a.t_restart) < 2 * window], window)[0]

    # Step times, window by window from the change.
    buckets = {}
    for t in step_times:
        b = (t - a.t_change) // window
        buckets[b] = buckets.get(b, 0) + 1
    res["steps_per_window"] = [buckets.get(b, 0) for b in range(0, max(buckets) + 1)] if buckets else []
    res["first_step_s"] = round((step_times[0] - a.t_change) / 1000, 3) if step_times else None
    res["last_step_s"] = round((step_times[-1] - a.t_change) / 1000, 3) if step_times else None
    res["uncharged_steps"] = sum(1 for s in steps if s[3] != "rate")
    res["ends"] = {}
    for _, _, _, outcome, _ in ends:
        res["ends"][outcome] = res["ends"].get(outcome, 0) + 1
    held = [h for *_, h in ends if h is not None]
    res["held_s_max"] = max(held) if held else None
    res["refused"] = refused
    res["answers_429"] = answers_429
    res.update(partition_history(f"{w}/sts-watch.log", a.t_change, a.held_namespaces.split(","), a.free_namespace))
    res["recreated_again"] = recreated_again
    res["releaser_patch_codes"] = codes
    print("RESULT " + json.dumps(res))


def partition_history(path, t_change, held_ns, free_ns):
    """What the API server stored of each StatefulSet's partition, from a watch (lines of
    status_report.py's `record`: arrival ms, then EVENT NS NAME GENERATION PARTITION
    REPLICAS). A rollout was held when the first stored version of its new template (a
    generation above the one it had at the change) carries partition == replicas; then
    the partition may only go down. Sets in `held_ns` must all show that; the set in
    `free_ns` must not (its new template stored with partition 0)."""
    gen_at_change, first_new, rises, last = {}, {}, [], {}
    for line in open(path):
        parts = line.split()
        if len(parts) != 7 or not parts[4].isdigit() or not parts[5].isdigit() or not parts[6].isdigit():
            continue
        t, key, gen, part, replicas = int(parts[0]), f"{parts[2]}/{parts[3]}", int(parts[4]), int(parts[5]), int(parts[6])
        if t < t_change:
            gen_at_change[key] = gen
            last[key] = part
            continue
        if key in gen_at_change and gen > gen_at_change[key] and key not in first_new:
            first_new[key] = (part, replicas)
        elif key in first_new and part > last.get(key, part) and key.split("/")[0] in held_ns:
            rises.append((t, key, last[key], part))
        last[key] = part
    held = sorted(k for k, (p, r) in first_new.items() if p == r and k.split("/")[0] in held_ns)
    not_held = sorted(k for k in gen_at_change if k.split("/")[0] in held_ns and k not in held)
    free = sorted(f"{k} partition={p}" for k, (p, r) in first_new.items() if k.split("/")[0] == free_ns)
    return {"held_by_watch": len(held), "not_held_by_watch": not_held,
            "free_first_new": free, "partition_rises": rises[:5],
            "sets_seen_by_watch": len(gen_at_change)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("record").add_argument("out")
    s = sub.add_parser("seen")
    s.add_argument("path")
    s.add_argument("token")
    sub.add_parser("sts-state")
    c = sub.add_parser("converged")
    c.add_argument("n", type=int)
    an = sub.add_parser("analyze")
    an.add_argument("--workdir", required=True)
    an.add_argument("--window-ms", type=int, required=True)
    an.add_argument("--paced-namespaces", required=True)
    an.add_argument("--releaser-user", required=True)
    an.add_argument("--t-change", type=int, required=True)
    an.add_argument("--t-kill", type=int, default=0)
    an.add_argument("--t-restart", type=int, default=0)
    an.add_argument("--held-namespaces", required=True, help="namespaces whose rollouts must be held")
    an.add_argument("--free-namespace", required=True, help="the unlabelled namespace, never held")
    hh = sub.add_parser("held-history", help="partition_history of a StatefulSet watch log, one JSON line")
    hh.add_argument("log")
    hh.add_argument("--t-change", type=int, required=True)
    hh.add_argument("--held-namespaces", required=True)
    hh.add_argument("--free-namespace", required=True)
    a = p.parse_args()
    if a.cmd == "held-history":
        print(json.dumps(partition_history(a.log, a.t_change, a.held_namespaces.split(","), a.free_namespace)))
    elif a.cmd == "record":
        record(a.out)
    elif a.cmd == "seen":
        sys.exit(0 if seen(a.path, a.token) else 1)
    elif a.cmd == "sts-state":
        for s in sets(json.load(sys.stdin)):
            print(f'{s["key"]} partition={s["partition"]} target={s["target"]} held={s["held"]} '
                  f'updated={s["updated"]}/{s["replicas"]} ready={s["ready"]} record={"yes" if s["record"] else "no"}')
    elif a.cmd == "converged":
        n = sum(1 for s in sets(json.load(sys.stdin)) if done(s))
        sys.exit(0 if n >= a.n else 1)
    elif a.cmd == "analyze":
        analyze(a)


if __name__ == "__main__":
    main()
