#!/usr/bin/env python3
"""Writes a kube-apiserver audit log (audit.k8s.io/v1 Event JSON lines, Metadata level,
ordered by stageTimestamp) of unpaced mass re-creations: StatefulSets rolled one ordinal
at a time (OrderedReady) and Deployments surged, amid the lines about other resources a
real cluster writes (leases, configmaps, events, pod reads and status). Deterministic.

  bench/gen-audit-log.py --sets 3 --replicas 5 --deployments 1 --dep-replicas 4 \
      --noise 5 > tests/fixtures/audit/metadata-rollout.jsonl
  bench/gen-audit-log.py --target-bytes 1100000000 > /tmp/audit-1g.jsonl   # the benchmark
"""
import argparse
import json
import random
import sys
from datetime import datetime, timedelta, timezone

SA = "system:serviceaccount:kube-system:"
GROUPS_SA = ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]


def ts(t):
    return (datetime(2026, 5, 1, 10, 0, 0, tzinfo=timezone.utc) + timedelta(seconds=t)).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")


class Log:
    def __init__(self, rng):
        self.rng = rng
        self.lines = []
        self.n = 0

    def ev(self, t, verb, user, resource, ns, name, sub=None, code=200, groups=None,
           latency=None, group=""):
        self.n += 1
        if latency is None:
            latency = self.rng.uniform(0.002, 0.02)
        obj = {"resource": resource, "apiVersion": "v1" if not group else "v1"}
        if group:
            obj["apiGroup"] = group
        if ns:
            obj["namespace"] = ns
        if name:
            obj["name"] = name
        if sub:
            obj["subresource"] = sub
        path = "/api/v1" if not group else f"/apis/{group}/v1"
        uri = f"{path}/namespaces/{ns}/{resource}" + (f"/{name}" if name else "") + (
            f"/{sub}" if sub else "")
        e = {
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": f"{self.rng.getrandbits(64):016x}-{self.n:08d}", "stage": "ResponseComplete",
            "requestURI": uri, "verb": verb,
            "user": {"username": user, "uid": f"{hash(user) & 0xffffffff:08x}",
                     "groups": groups or GROUPS_SA},
            "sourceIPs": ["172.18.0.2"],
            "userAgent": "kube-controller-manager/v1.36.0 (linux/amd64) kubernetes/4c1d9a7/" + user,
            "objectRef": obj,
            "responseStatus": {"metadata": {}, "code": code},
            "requestReceivedTimestamp": ts(t), "stageTimestamp": ts(t + latency),
            "annotations": {"authorization.k8s.io/decision": "allow",
                            "authorization.k8s.io/reason": "RBAC: allowed by ClusterRoleBinding"},
        }
        self.lines.append((t + latency, json.dumps(e, separators=(",", ":"))))

    def noise(self, t0, t1, per_second):
        rng = self.rng
        count = int((t1 - t0) * per_second)
        for _ in range(count):
            t = rng.uniform(t0, t1)
            r = rng.random()
            node = f"node-{rng.randrange(50):03d}"
            if r < 0.45:
                self.ev(t, "update", f"system:node:{node}", "leases", "kube-node-lease", node,
                        groups=["system:nodes", "system:authenticated"], group="coordination.k8s.io")
            elif r < 0.65:
                self.ev(t, "get", SA + "generic-garbage-collector", "configmaps", "kube-system",
                        "extension-apiserver-authentication")
            elif r < 0.78:
                self.ev(t, "create", SA + "statefulset-controller", "events",
                        f"tenant-{rng.randrange(20)}", "", group="events.k8s.io")
            elif r < 0.88:
                self.ev(t, "watch", "system:kube-scheduler", "pods", "", "")
            elif r < 0.95:
                self.ev(t, "patch", f"system:node:{node}", "pods", f"tenant-{rng.randrange(20)}",
                        f"app-{rng.randrange(100)}", sub="status",
                        groups=["system:nodes", "system:authenticated"])
            else:
                self.ev(t, "list", "admin", "secrets", f"tenant-{rng.randrange(20)}", "",
                        groups=["system:masters", "system:authenticated"])


def statefulset(log, ns, name, replicas, t0, rng):
    log.ev(t0, "patch", "admin", "statefulsets", ns, name, group="apps",
           groups=["system:masters", "system:authenticated"])
    t = t0 + rng.uniform(0.02, 0.2)
    end = t
    for o in reversed(range(replicas)):
        pod = f"{name}-{o}"
        log.ev(t, "delete", SA + "statefulset-controller", "pods", ns, pod)
        term = rng.uniform(1.0, 3.0)
        node = f"node-{rng.randrange(50):03d}"
        log.ev(t + term - 0.01, "delete", f"system:node:{node}", "pods", ns, pod,
               groups=["system:nodes", "system:authenticated"])
        c = t + term + rng.uniform(0.01, 0.05)
        log.ev(c, "create", SA + "statefulset-controller", "pods", ns, pod, code=201)
        b = c + rng.uniform(0.01, 0.1)
        log.ev(b, "create", "system:kube-scheduler", "pods", ns, pod, sub="binding", code=201,
               groups=["system:authenticated"])
        ready = b + rng.uniform(2.0, 4.0)
        t = ready + rng.uniform(0.01, 0.05)
        end = ready
    return end


def deployment(log, ns, name, replicas, t0, rng):
    old = f"{rng.getrandbits(40):010x}"[:10]
    new = f"{rng.getrandbits(40):010x}"[:10]
    log.ev(t0, "patch", "admin", "deployments", ns, name, group="apps",
           groups=["system:masters", "system:authenticated"])
    surge = max(1, replicas // 4)
    t = t0 + 0.05
    done = 0
    sfx = lambda: "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
    while done < replicas:
        batch = min(surge, replicas - done)
        readies = []
        for _ in range(batch):
            c = t + rng.uniform(0.0, 0.05)
            log.ev(c, "create", SA + "replicaset-controller", "pods", ns, "", code=201)
            b = c + rng.uniform(0.02, 0.2)
            log.ev(b, "create", "system:kube-scheduler", "pods", ns, f"{name}-{new}-{sfx()}",
                   sub="binding", code=201, groups=["system:authenticated"])
            readies.append(b + rng.uniform(2.0, 4.0))
        for r in readies:
            pod = f"{name}-{old}-{sfx()}"
            d = r + rng.uniform(0.01, 0.05)
            log.ev(d, "delete", SA + "replicaset-controller", "pods", ns, pod)
            log.ev(d + rng.uniform(1.0, 3.0), "delete", f"system:node:node-001", "pods", ns, pod,
                   groups=["system:nodes", "system:authenticated"])
        t = max(readies) + 0.05
        done += batch
    return t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sets", type=int, default=10)
    p.add_argument("--replicas", type=int, default=30)
    p.add_argument("--deployments", type=int, default=5)
    p.add_argument("--dep-replicas", type=int, default=40)
    p.add_argument("--noise", type=float, default=200.0, help="other lines per second")
    p.add_argument("--target-bytes", type=int, default=0,
                   help="repeat rollouts (one per 10 minutes) until this many bytes")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng = random.Random(a.seed)
    out = sys.stdout
    written = 0
    rnd = 0
    while True:
        log = Log(rng)
        t0 = rnd * 600.0
        end = t0
        for i in range(a.sets):
            end = max(end, statefulset(log, f"tenant-{i % 20}", f"db-{i}", a.replicas, t0 + 1, rng))
        for i in range(a.deployments):
            end = max(end, deployment(log, f"tenant-{i % 20}", f"web-{i}", a.dep_replicas,
                                      t0 + 1, rng))
        log.noise(t0, t0 + 600.0 if a.target_bytes else end + 1, a.noise)
        log.lines.sort(key=lambda x: x[0])
        for _, line in log.lines:
            out.write(line)
            out.write("\n")
            written += len(line) + 1
        rnd += 1
        if not a.target_bytes or written >= a.target_bytes:
            break


if __name__ == "__main__":
    main()
