#!/usr/bin/env python3
"""An emulated CNI and service data plane of limited capacity, for tests/e2e/adaptive.sh.

`run`: watches the pods of one namespace (the API server of tests/e2e/cluster.sh, admin
token from its env file) and, for pods labelled e2e.churn-throttler.io/cni=emulated once
they are bound to a (kwok) node:
  - wires them in FIFO order at C pods/s (--rate "0.5", or a step "10,1@60": 10 pods/s,
    then 1 pod/s from 60 s after the first pod was queued); an ADD that waited more than
    --fail-after (60 s, as Cilium's endpoint-create limiter) fails and is queued again
    --retry-after s later, as the kubelet retries;
  - --base s after its wiring sets PodReadyToStartContainers=True, then --app s later
    Ready (phase Running, a pod IP), by status patches as a kubelet would;
  - "programs" each change of a Service's ready backends (a pod labelled
    e2e.churn-throttler.io/svc=NAME became Ready, or one that was Ready was deleted)
    through a second FIFO of --svc-rate changes/s, as a Cilium agent or kube-proxy does.
kwok must leave these pods' conditions alone: tests/e2e/kwok-stages/cni/pod-ready-cni.yaml
(loaded with CLUSTER_KWOK_STAGES_EXTRA=tests/e2e/kwok-stages/cni) matches the label with
weight 1, so kwok's fast pod-ready (weight 0) never acts on them, and waits an hour.
kwok's fast pod-delete still completes their deletion.

It serves on 127.0.0.1 (port written to --port-file) a /metrics with the names and labels
of Cilium's agent and kube-proxy: cilium_api_limiter_wait_duration_seconds (mean of the
last 10 s), cilium_api_limiter_requests_in_flight, cilium_api_limiter_processed_requests_total
{outcome}, cilium_service_implementation_delay and
kubeproxy_network_programming_duration_seconds (histograms). It writes JSON lines to
--records: one per pod (bound, wired, netready, ready ms; fails), one per deleted backend
(deleted, programmed ms: its stale time), and the CNI queue every 0.5 s. SIGTERM stops it.

`report`: the figures of a records file from --t0 (ms): start latency (binding ->
PodReadyToStartContainers) p50/p99/max, the CNI queue's max, failed ADDs, makespan
(t0 -> last PodReadyToStartContainers), stale time p50/p99/max. One JSON line.
"""
import argparse
import collections
import heapq
import http.server
import json
import os
import queue
import signal
import ssl
import sys
import threading
import time
import urllib.request

CNI_LABEL = ("e2e.churn-throttler.io/cni", "emulated")
SVC_LABEL = "e2e.churn-throttler.io/svc"
BUCKETS = [0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]


def now_ms():
    return int(time.time() * 1000)


def parse_rate(text):
    """'0.5' -> [(0, 0.5)]; '10,1@60' -> [(0, 10), (60, 1)]."""
    steps = []
    for i, part in enumerate(text.split(",")):
        r, _, at = part.partition("@")
        steps.append((float(at) if at else 0.0 if i == 0 else None, float(r)))
    if any(at is None for at, _ in steps):
        raise SystemExit("cni_emulator: every step after the first needs @SECONDS")
    return steps


class Hist:
    def __init__(self):
        self.counts = [0] * len(BUCKETS)
        self.n = 0
        self.sum = 0.0

    def observe(self, v):
        self.n += 1
        self.sum += v
        for i, b in enumerate(BUCKETS):
            if v <= b:
                self.counts[i] += 1

    def text(self, name, labels=""):
        sep = "," if labels else ""
        out = [f"# TYPE {name} histogram"]
        for b, c in zip(BUCKETS, self.counts):
            out.append(f'{name}_bucket{{{labels}{sep}le="{b}"}} {c}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.n}')
        out.append(f"{name}_sum{{{labels}}} {self.sum:.3f}" if labels else f"{name}_sum {self.sum:.3f}")
        out.append(f"{name}_count{{{labels}}} {self.n}" if labels else f"{name}_count {self.n}")
        return out


class Emulator:
    def __init__(self, a, env):
        self.a = a
        self.api = env["APISERVER_URL"]
        self.token = env["CLUSTER_ADMIN_TOKEN"]
        self.ctx = ssl.create_default_context(cafile=env["CLUSTER_CA_FILE"])
        self.rates = parse_rate(a.rate)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.pods = {}          # uid -> record
        self.cni_q = collections.deque()   # uids waiting for the CNI, with their enqueue time
        self.current = None     # (uid, done_at)
        self.timers = []        # heap of (t, seq, kind, uid)
        self.seq = 0
        self.svc_q = collections.deque()   # (t_change, kind, uid)
        self.svc_next = 0.0
        self.t_first = None
        self.processed = {"success": 0, "fail": 0}
        self.waits = collections.deque()   # (t, wait s) of the last 10 s
        self.svc_hist = Hist()
        self.patches = queue.Queue()
        self.out = open(a.records, "a", buffering=1)

    # ---- API ---------------------------------------------------------------------
    def req(self, method, path, body=None, ctype=None, timeout=30):
        r = urllib.request.Request(self.api + path, method=method,
                                   data=json.dumps(body).encode() if body is not None else None)
        r.add_header("Authorization", "Bearer " + self.token)
        if ctype:
            r.add_header("Content-Type", ctype)
        return urllib.request.urlopen(r, context=self.ctx, timeout=timeout)

    def patch_status(self, ns, name, body):
        try:
            self.req("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", body,
                     "application/strategic-merge-patch+json").read()
        except Exception as e:  # a pod deleted meanwhile: nothing to wire
            print(f"cni_emulator: patch {ns}/{name}: {e}", file=sys.stderr)

    def patcher(self):
        while not self.stop.is_set():
            try:
                ns, name, body = self.patches.get(timeout=0.5)
            except queue.Empty:
                continue
            self.patch_status(ns, name, body)

    def watch(self):
        ns = self.a.namespace
        while not self.stop.is_set():
            try:
                lst = json.load(self.req("GET", f"/api/v1/namespaces/{ns}/pods"))
                for p in lst["items"]:
                    self.seen("ADDED", p)
                rv = lst["metadata"]["resourceVersion"]
                resp = self.req("GET", f"/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion={rv}"
                                       "&timeoutSeconds=120", timeout=150)
                for line in resp:
                    if self.stop.is_set():
                        return
                    ev = json.loads(line)
                    if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self.seen(ev["type"], ev["object"])
            except Exception as e:
                print(f"cni_emulator: watch: {e}", file=sys.stderr)
                self.stop.wait(1)

    # ---- what the watch shows ------------------------------------------------------
    def seen(self, typ, p):
        md, spec, st = p["metadata"], p.get("spec", {}), p.get("status", {})
        labels = md.get("labels") or {}
        uid, t = md["uid"], now_ms()
        conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
        with self.lock:
            r = self.pods.get(uid)
            if r is None:
                r = self.pods[uid] = {"pod": md["name"], "svc": labels.get(SVC_LABEL),
                                      "emulated": labels.get(CNI_LABEL[0]) == CNI_LABEL[1], "fails": 0}
            if r["emulated"] and spec.get("nodeName") and "bound" not in r and typ != "DELETED":
                r["bound"] = t
                self.enqueue(uid, t / 1000)
            if conds.get("Ready") == "True" and "ready_seen" not in r:
                r["ready_seen"] = t
                if r["svc"]:
                    r["backend"] = True
                    self.svc_q.append((t / 1000, "add", uid))
            if (typ == "DELETED" or md.get("deletionTimestamp")) and "deleted" not in r:
                r["deleted"] = t
                if r["emulated"] and "done" not in r:
                    self.cni_q = collections.deque(x for x in self.cni_q if x[0] != uid)
                    self.write(r, uid)
                if r.get("backend"):
                    self.svc_q.append((t / 1000, "remove", uid))

    def enqueue(self, uid, t):
        if self.t_first is None:
            self.t_first = t
        self.cni_q.append((uid, t))

    def rate(self, t):
        rel = t - (self.t_first or t)
        r = self.rates[0][1]
        for at, rr in self.rates:
            if rel >= at:
                r = rr
        return r

    def write(self, r, uid):
        r["done"] = True
        self.out.write(json.dumps({"kind": "pod", "uid": uid, **{k: v for k, v in r.items()
                                                                  if k not in ("done", "backend")}}) + "\n")

    def ns_name(self, uid):
        return self.a.namespace, self.pods[uid]["pod"]

    # ---- the two FIFOs and the timers (under the lock, every 10 ms) -------------------
    def tick(self):
        t = time.time()
        a = self.a
        # ADDs that waited too long fail; the kubelet tries again later.
        while self.cni_q and t - self.cni_q[0][1] > a.fail_after:
            uid, _ = self.cni_q.popleft()
            self.processed["fail"] += 1
            self.pods[uid]["fails"] += 1
            self.push(t + a.retry_after, "retry", uid)
        if self.current and t >= self.current[1]:
            uid = self.current[0]
            self.current = None
            if "deleted" not in self.pods[uid]:
                self.pods[uid]["wired"] = int(t * 1000)
                self.processed["success"] += 1
                self.push(t + a.base, "netready", uid)
        if self.current is None and self.cni_q:
            uid, enq = self.cni_q.popleft()
            self.waits.append((t, t - enq))
            self.current = (uid, t + 1.0 / self.rate(t))
        while self.waits and self.waits[0][0] < t - 10:
            self.waits.popleft()
        while self.timers and self.timers[0][0] <= t:
            _, _, kind, uid = heapq.heappop(self.timers)
            r = self.pods[uid]
            if "deleted" in r:
                continue
            ns, name = self.ns_name(uid)
            if kind == "retry":
                self.cni_q.append((uid, t))
            elif kind == "netready":
                r["netready"] = int(t * 1000)
                self.patches.put((ns, name, {"status": {"conditions": [
                    {"type": "PodReadyToStartContainers", "status": "True"}]}}))
                self.push(t + a.app, "ready", uid)
            elif kind == "ready":
                r["ready"] = int(t * 1000)
                n = len(self.pods)
                self.patches.put((ns, name, {"status": {
                    "phase": "Running",
                    "podIP": f"10.{200 + n // 65536 % 50}.{n // 256 % 256}.{n % 256}",
                    "conditions": [{"type": t_, "status": "True"} for t_ in
                                   ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")]}}))
                self.write(r, uid)
        if self.svc_q and t >= self.svc_next:
            tc, kind, uid = self.svc_q.popleft()
            self.svc_next = t + 1.0 / a.svc_rate
            self.svc_hist.observe(t - tc)
            if kind == "remove":
                r = self.pods[uid]
                self.out.write(json.dumps({"kind": "stale", "pod": r["pod"], "svc": r["svc"],
                                           "deleted": r["deleted"], "programmed": int(t * 1000)}) + "\n")

    def push(self, t, kind, uid):
        self.seq += 1
        heapq.heappush(self.timers, (t, self.seq, kind, uid))

    def queued(self):
        return len(self.cni_q) + (1 if self.current else 0)

    # ---- /metrics ---------------------------------------------------------------------
    def metrics(self):
        with self.lock:
            mean = sum(w for _, w in self.waits) / len(self.waits) if self.waits else 0.0
            lab = 'api_call="endpoint-create"'
            out = [
                "# TYPE cilium_api_limiter_wait_duration_seconds gauge",
                f'cilium_api_limiter_wait_duration_seconds{{{lab},value="mean"}} {mean:.3f}',
                "# TYPE cilium_api_limiter_requests_in_flight gauge",
                f'cilium_api_limiter_requests_in_flight{{{lab},value="in-flight"}} {self.queued()}',
                "# TYPE cilium_api_limiter_processed_requests_total counter",
            ] + [f'cilium_api_limiter_processed_requests_total{{{lab},outcome="{o}"}} {n}'
                 for o, n in self.processed.items()]
            out += self.svc_hist.text("cilium_service_implementation_delay", 'action="update"')
            out += self.svc_hist.text("kubeproxy_network_programming_duration_seconds")
        return ("\n".join(out) + "\n").encode()

    def serve(self):
        emu = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = emu.metrics()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        with open(self.a.port_file + ".tmp", "w") as f:
            f.write(str(srv.server_address[1]))
        os.replace(self.a.port_file + ".tmp", self.a.port_file)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    def run(self):
        srv = self.serve()
        for _ in range(4):
            threading.Thread(target=self.patcher, daemon=True).start()
        threading.Thread(target=self.watch, daemon=True).start()
        next_sample = 0.0
        while not self.stop.is_set():
            with self.lock:
                self.tick()
                t = time.time()
                if t >= next_sample:
                    next_sample = t + 0.5
                    self.out.write(json.dumps({"kind": "queue", "t": int(t * 1000), "queue": self.queued(),
                                               "fails": self.processed["fail"]}) + "\n")
            self.stop.wait(0.01)
        srv.shutdown()
        self.out.close()


def report(a):
    pods, stale, samples = [], [], []
    for line in open(a.records):
        e = json.loads(line)
        if e["kind"] == "pod":
            pods.append(e)
        elif e["kind"] == "stale":
            stale.append(e["programmed"] - e["deleted"])
        elif e["kind"] == "queue" and e["t"] >= a.t0:
            samples.append(e)

    def q(xs, p):
        xs = sorted(xs)
        return round(xs[min(len(xs) - 1, int(p * len(xs)))] / 1000, 2) if xs else None

    pods = [p for p in pods if p.get("bound", 0) >= a.t0]
    start = [p["netready"] - p["bound"] for p in pods if "netready" in p]
    res = {
        "pods": len(pods), "netready": len(start),
        "start_p50_s": q(start, 0.5), "start_p99_s": q(start, 0.99), "start_max_s": q(start, 1.0),
        "queue_max": max((s["queue"] for s in samples), default=0),
        "failed_adds": sum(p.get("fails", 0) for p in pods),
        "makespan_s": round((max(p["netready"] for p in pods if "netready" in p) - a.t0) / 1000, 1) if start else None,
        "stale_n": len(stale), "stale_p50_s": q(stale, 0.5), "stale_p99_s": q(stale, 0.99), "stale_max_s": q(stale, 1.0),
    }
    if a.after:  # the queue's max from this many s after the first binding (after a step)
        t1 = min(p["bound"] for p in pods) + a.after * 1000 if pods else a.t0
        res["queue_max_after"] = max((s["queue"] for s in samples if s["t"] >= t1), default=0)
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--env", required=True, help="the cluster's env file (cluster.sh)")
    r.add_argument("--namespace", required=True)
    r.add_argument("--rate", required=True)
    r.add_argument("--base", type=float, default=2.0)
    r.add_argument("--app", type=float, default=1.0)
    r.add_argument("--svc-rate", type=float, default=1.0)
    r.add_argument("--fail-after", type=float, default=60.0)
    r.add_argument("--retry-after", type=float, default=10.0)
    r.add_argument("--records", required=True)
    r.add_argument("--port-file", required=True)
    p = sub.add_parser("report")
    p.add_argument("--records", required=True)
    p.add_argument("--t0", type=int, required=True)
    p.add_argument("--after", type=float, default=0)
    a = ap.parse_args()
    if a.cmd == "report":
        return report(a)
    env = {}
    for line in open(a.env):
        line = line.strip()
        if line.startswith("export "):
            k, _, v = line[7:].partition("=")
            env[k] = v.strip("'\"")
    emu = Emulator(a, env)
    signal.signal(signal.SIGTERM, lambda *_: emu.stop.set())
    signal.signal(signal.SIGINT, lambda *_: emu.stop.set())
    emu.run()


if __name__ == "__main__":
    main()
