#!/usr/bin/env python3
"""Structural checks on the rendered kustomize variants and the Grafana dashboard.

Called by tests/manifests/check.sh; each `render` argument is VARIANT=FILE (the
output of `kustomize build`). Prints one line per check and a summary line
"manifests: N passed, N failed"; exits 1 if any check failed.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

NS = "churn-throttler"
SA_USER = f"system:serviceaccount:{NS}:churn-throttler"
POLICY_CM = "churn-throttler-policy"
TLS_SECRET = "churn-throttler-tls"
SERVING_CERT = "churn-throttler-serving"
SVC_DNS = [f"churn-throttler.{NS}.svc", f"churn-throttler.{NS}.svc.cluster.local"]
OPT_IN = {"churn-throttler.io/enabled": "true"}
NAMESPACED = {
    "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Deployment",
    "PodDisruptionBudget", "ServiceMonitor", "Issuer", "Certificate", "Secret",
}

passed = 0
failed = 0
warnings = []


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"  ok   {name}")
    else:
        failed += 1
        print(f"  FAIL {name}" + (f": {detail}" if detail else ""))
    return ok


def duration_seconds(text):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", text)
    if not m:
        raise ValueError(f"unparsable duration {text!r}")
    n, unit = int(m.group(1)), m.group(2)
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def index(docs):
    by = {}
    for d in docs:
        key = (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
        by.setdefault(key, []).append(d)
    return by


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found[0] if len(found) == 1 else None


def expected_rules(kind):
    core = lambda ops, res: {"apiGroups": [""], "apiVersions": ["v1"], "operations": ops, "resources": [res], "scope": "Namespaced"}
    sts = {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["statefulsets"], "scope": "Namespaced"}
    if kind == "ValidatingWebhookConfiguration":
        return [core(["CREATE", "DELETE"], "pods"), core(["CREATE"], "pods/eviction"), sts]
    return [core(["CREATE"], "pods"), sts]


def canon(rules):
    return sorted(json.dumps(r, sort_keys=True) for r in rules)


def check_common(variant, docs, policy_src):
    by = index(docs)
    check(f"{variant}: every document has apiVersion, kind, metadata.name",
          all(d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name") for d in docs))
    dups = [k for k, v in by.items() if len(v) > 1]
    check(f"{variant}: no duplicate objects", not dups, str(dups))
    wrong_ns = [(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs
                if d["kind"] in NAMESPACED and d["metadata"].get("namespace") != NS]
    check(f"{variant}: namespaced objects are in {NS}", not wrong_ns, str(wrong_ns))

    ns = one(docs, "Namespace", NS)
    if check(f"{variant}: Namespace {NS} present", ns is not None):
        check(f"{variant}: Namespace {NS} is not opted in",
              (ns["metadata"].get("labels") or {}).get("churn-throttler.io/enabled") != "true")

    sa = one(docs, "ServiceAccount", "churn-throttler")
    check(f"{variant}: ServiceAccount churn-throttler present", sa is not None)

    # Policy ConfigMap: the built-in default policy, byte for byte.
    cm = one(docs, "ConfigMap", POLICY_CM)
    timeout = None
    if check(f"{variant}: ConfigMap {POLICY_CM} present", cm is not None):
        text = (cm.get("data") or {}).get("policy.yaml", "")
        check(f"{variant}: ConfigMap policy.yaml == src/policy/default-policy.yaml", text == policy_src,
              "manifests/base/policy.yaml differs; copy src/policy/default-policy.yaml over it")
        policy = yaml.safe_load(text) or {}
        timeout = policy.get("timeoutSeconds", 10)  # the server's default is 10
        check(f"{variant}: policy has rules", bool(policy.get("rules")))
        check(f"{variant}: policy exempts its own namespace and ServiceAccount",
              NS in (policy.get("exempt") or {}).get("namespaces", [])
              and SA_USER in (policy.get("exempt") or {}).get("users", []))

    # RBAC: least privilege, bound to our ServiceAccount only.
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    check(f"{variant}: RBAC roles and bindings present", roles and bindings)
    wild = [(r["metadata"]["name"], rule) for r in roles for rule in r.get("rules", [])
            if "*" in rule.get("verbs", []) + rule.get("resources", []) + rule.get("apiGroups", [])]
    check(f"{variant}: no wildcard in RBAC rules", not wild, str(wild))
    secrets = [r["metadata"]["name"] for r in roles for rule in r.get("rules", []) if "secrets" in rule.get("resources", [])]
    check(f"{variant}: no access to secrets", not secrets, str(secrets))
    pod_verbs = {v for r in roles for rule in r.get("rules", []) if "pods" in rule.get("resources", []) for v in rule["verbs"]}
    check(f"{variant}: pods only get/list/watch/patch", pod_verbs <= {"get", "list", "watch", "patch"}, str(sorted(pod_verbs)))
    sts_verbs = {v for r in roles for rule in r.get("rules", []) if "statefulsets" in rule.get("resources", []) and "apps" in rule.get("apiGroups", []) for v in rule["verbs"]}
    check(f"{variant}: statefulsets get/list/watch/patch (partition releaser)",
          sts_verbs == {"get", "list", "watch", "patch"}, str(sorted(sts_verbs)))
    leases = [r for r in roles for rule in r.get("rules", []) if "leases" in rule.get("resources", [])]
    check(f"{variant}: leases only through a namespaced Role in {NS}",
          leases and all(r["kind"] == "Role" and r["metadata"].get("namespace") == NS for r in leases))
    role_names = {(r["kind"], r["metadata"]["name"]) for r in roles}
    bad_bind = []
    for b in bindings:
        ref = b["roleRef"]
        if (ref["kind"], ref["name"]) not in role_names:
            bad_bind.append((b["metadata"]["name"], "roleRef not in the bundle"))
        for s in b.get("subjects", []):
            if (s.get("kind"), s.get("name"), s.get("namespace")) != ("ServiceAccount", "churn-throttler", NS):
                bad_bind.append((b["metadata"]["name"], s))
    check(f"{variant}: every binding binds a bundled role to ServiceAccount {NS}/churn-throttler only", not bad_bind, str(bad_bind))

    # Webhook configurations.
    for kind, path in (("ValidatingWebhookConfiguration", "/validate"), ("MutatingWebhookConfiguration", "/mutate")):
        cfg = one(docs, kind, "churn-throttler")
        if not check(f"{variant}: {kind} churn-throttler present", cfg is not None):
            continue
        hooks = cfg.get("webhooks") or []
        check(f"{variant}: {kind} has exactly one webhook", len(hooks) == 1)
        for h in hooks:
            p = f"{variant}: {kind}/{h.get('name')}"
            check(f"{p} failurePolicy Ignore", h.get("failurePolicy") == "Ignore")
            check(f"{p} timeoutSeconds == policy timeoutSeconds == 10",
                  h.get("timeoutSeconds") == timeout == 10, f"webhook {h.get('timeoutSeconds')}, policy {timeout}")
            check(f"{p} sideEffects NoneOnDryRun", h.get("sideEffects") == "NoneOnDryRun")
            check(f"{p} matchPolicy Equivalent", h.get("matchPolicy") == "Equivalent")
            check(f"{p} admissionReviewVersions [v1]", h.get("admissionReviewVersions") == ["v1"])
            if kind == "MutatingWebhookConfiguration":
                check(f"{p} reinvocationPolicy Never", h.get("reinvocationPolicy") == "Never")
            sel = h.get("namespaceSelector") or {}
            check(f"{p} namespaceSelector matchLabels opt-in", sel.get("matchLabels") == OPT_IN, str(sel.get("matchLabels")))
            excluded = set()
            for e in sel.get("matchExpressions") or []:
                if e.get("key") == "kubernetes.io/metadata.name" and e.get("operator") == "NotIn":
                    excluded |= set(e.get("values") or [])
            check(f"{p} excludes its own namespace and kube-system by name", {NS, "kube-system"} <= excluded, str(sorted(excluded)))
            check(f"{p} no objectSelector that could widen or hide the match", "objectSelector" not in h or h["objectSelector"] == {})
            check(f"{p} rules", canon(h.get("rules") or []) == canon(expected_rules(kind)), json.dumps(h.get("rules")))
            cc = h.get("clientConfig") or {}
            if variant == "e2e-local":
                check(f"{p} clientConfig.url placeholder + path", cc.get("url") == f"__WEBHOOK_URL__{path}" and "service" not in cc, str(cc))
                check(f"{p} clientConfig.caBundle placeholder", cc.get("caBundle") == "__CA_BUNDLE__", str(cc))
            else:
                svc = cc.get("service") or {}
                check(f"{p} clientConfig.service -> {NS}/churn-throttler:443{path}",
                      "url" not in cc and svc == {"name": "churn-throttler", "namespace": NS, "path": path, "port": 443}, str(cc))
                if variant.startswith("cert-manager"):
                    ann = (cfg["metadata"].get("annotations") or {}).get("cert-manager.io/inject-ca-from")
                    check(f"{p} cert-manager.io/inject-ca-from {NS}/{SERVING_CERT}", ann == f"{NS}/{SERVING_CERT}", str(ann))

    pdb = one(docs, "PodDisruptionBudget", "churn-throttler")
    if check(f"{variant}: PodDisruptionBudget present", pdb is not None):
        check(f"{variant}: PodDisruptionBudget minAvailable 1", pdb["spec"].get("minAvailable") == 1)

    dep = one(docs, "Deployment", "churn-throttler")
    svc = one(docs, "Service", "churn-throttler")
    if variant == "e2e-local":
        check(f"{variant}: no Deployment (the e2e runs the binary locally)", dep is None)
        check(f"{variant}: no Service", svc is None)
        return
    if check(f"{variant}: Deployment present", dep is not None) and check(f"{variant}: Service present", svc is not None):
        check_deployment(variant, dep, svc, pdb, docs)
    if variant.startswith("cert-manager"):
        check_cert_manager(variant, docs)
    if "servicemonitor" in variant:
        sm = one(docs, "ServiceMonitor", "churn-throttler")
        if check(f"{variant}: ServiceMonitor present", sm is not None):
            labels = svc["metadata"].get("labels") or {}
            match = sm["spec"]["selector"].get("matchLabels") or {}
            check(f"{variant}: ServiceMonitor selects the Service", all(labels.get(k) == v for k, v in match.items()) and match)
            port_names = {p["name"] for p in svc["spec"]["ports"]}
            eps = sm["spec"].get("endpoints") or []
            check(f"{variant}: ServiceMonitor scrapes the plain-HTTP metrics port at /metrics",
                  eps and all(e.get("port") == "metrics" and e.get("path", "/metrics") == "/metrics" and e.get("scheme", "http") == "http" for e in eps)
                  and "metrics" in port_names)
    np = one(docs, "NetworkPolicy", "churn-throttler")
    if "networkpolicy" in variant:
        if check(f"{variant}: NetworkPolicy present", np is not None):
            check_network_policy(variant, np, dep)
    else:
        check(f"{variant}: no NetworkPolicy (optional, a component)", np is None)


def check_network_policy(variant, np, dep):
    """Selects the webhook pods, is ingress-only, and lets each container port in from
    a non-empty peer list only (an empty `from` would admit everyone)."""
    p = f"{variant}: NetworkPolicy"
    labels = dep["spec"]["template"]["metadata"].get("labels") or {}
    match = np["spec"]["podSelector"].get("matchLabels") or {}
    check(f"{p} selects the webhook pods", match and all(labels.get(k) == v for k, v in match.items()))
    check(f"{p} is Ingress only", np["spec"].get("policyTypes") == ["Ingress"], str(np["spec"].get("policyTypes")))
    names = {c_port["name"] for c in dep["spec"]["template"]["spec"]["containers"] for c_port in c.get("ports") or []}
    rules = np["spec"].get("ingress") or []
    by_port = {}
    for r in rules:
        for port in r.get("ports") or []:
            by_port.setdefault(port.get("port"), []).append(r)
    check(f"{p} has one rule per container port ({sorted(names)})", set(by_port) == names and all(len(v) == 1 for v in by_port.values()),
          str(sorted(by_port, key=str)))
    check(f"{p} every rule names its peers", rules and all(r.get("from") for r in rules))


def check_deployment(variant, dep, svc, pdb, docs):
    p = f"{variant}: Deployment"
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels") or {}
    check(f"{p} replicas >= 2", (spec.get("replicas") or 1) >= 2, str(spec.get("replicas")))
    check(f"{p} selector matches its pod labels", all(labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()))
    check(f"{p} rolling update never drops below replicas", (spec.get("strategy", {}).get("rollingUpdate") or {}).get("maxUnavailable") == 0)
    check(f"{p} serviceAccountName churn-throttler", pod.get("serviceAccountName") == "churn-throttler")
    check(f"{p} no priorityClassName", "priorityClassName" not in pod, str(pod.get("priorityClassName")))
    psc = pod.get("securityContext") or {}
    check(f"{p} pod runAsNonRoot, uid 65532", psc.get("runAsNonRoot") is True and psc.get("runAsUser") == 65532)
    check(f"{p} pod seccomp RuntimeDefault", (psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault")
    aff = ((pod.get("affinity") or {}).get("podAntiAffinity") or {})
    terms = [t.get("podAffinityTerm", t) for t in aff.get("preferredDuringSchedulingIgnoredDuringExecution", []) + aff.get("requiredDuringSchedulingIgnoredDuringExecution", [])]
    check(f"{p} podAntiAffinity across kubernetes.io/hostname", any(t.get("topologyKey") == "kubernetes.io/hostname" for t in terms))
    check(f"{p} topologySpreadConstraints", bool(pod.get("topologySpreadConstraints")))
    containers = pod.get("containers") or []
    check(f"{p} one container", len(containers) == 1)
    c = containers[0]
    csc = c.get("securityContext") or {}
    check(f"{p} readOnlyRootFilesystem", csc.get("readOnlyRootFilesystem") is True)
    check(f"{p} allowPrivilegeEscalation false", csc.get("allowPrivilegeEscalation") is False)
    check(f"{p} capabilities drop ALL", (csc.get("capabilities") or {}).get("drop") == ["ALL"] and not (csc.get("capabilities") or {}).get("add"))
    check(f"{p} container not privileged, non-root", not csc.get("privileged") and csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True)
    res = c.get("resources") or {}
    check(f"{p} resource requests (cpu, memory) and a memory limit",
          {"cpu", "memory"} <= set((res.get("requests") or {}).keys()) and "memory" in (res.get("limits") or {}))
    args = c.get("args") or []
    check(f"{p} runs `serve`", args[:1] == ["serve"] and not c.get("command"), str(args[:1]))
    flags = {}
    for a in args[1:]:
        k, _, v = a.partition("=")
        flags[k] = v
    ports = {pt["name"]: pt["containerPort"] for pt in c.get("ports") or []}
    check(f"{p} ports https 8443 and metrics 9090", ports == {"https": 8443, "metrics": 9090}, str(ports))
    check(f"{p} --listen/--metrics-listen agree with the ports",
          flags.get("--listen", "0.0.0.0:8443").endswith(":8443") and flags.get("--metrics-listen", "0.0.0.0:9090").endswith(":9090"))
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        hg = (c.get(probe) or {}).get("httpGet") or {}
        check(f"{p} {probe} GET {path} on the metrics port",
              hg.get("path") == path and hg.get("port") in ("metrics", 9090) and hg.get("scheme", "HTTP") == "HTTP", str(hg))
    env = {e["name"]: ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") for e in c.get("env") or []}
    check(f"{p} POD_NAME/POD_NAMESPACE from the downward API",
          env.get("POD_NAME") == "metadata.name" and env.get("POD_NAMESPACE") == "metadata.namespace", str(env))
    # Files: which paths the volumes provide, and that the flags point at them.
    provided = {}
    vols = {v["name"]: v for v in pod.get("volumes") or []}
    for m in c.get("volumeMounts") or []:
        v = vols.get(m["name"]) or {}
        sources = []
        if "projected" in v:
            sources = v["projected"]["sources"]
        else:
            sources = [{k: v[k]} for k in ("configMap", "secret") if k in v]
        for s in sources:
            for kind in ("configMap", "secret"):
                if kind in s:
                    for item in s[kind].get("items") or []:
                        provided[os.path.join(m["mountPath"], item["path"])] = (kind, s[kind]["name"], item["key"])
        check(f"{p} mount {m['mountPath']} is read-only and not a subPath (kubelet never updates subPath mounts)",
              m.get("readOnly") is True and "subPath" not in m)
    check(f"{p} --config /etc/churn-throttler/policy.yaml from ConfigMap {POLICY_CM}",
          flags.get("--config") == "/etc/churn-throttler/policy.yaml"
          and provided.get("/etc/churn-throttler/policy.yaml") == ("configMap", POLICY_CM, "policy.yaml"), str(provided))
    check(f"{p} --tls-cert/--tls-key under /etc/churn-throttler/tls from Secret {TLS_SECRET}",
          provided.get(flags.get("--tls-cert")) == ("secret", TLS_SECRET, "tls.crt")
          and provided.get(flags.get("--tls-key")) == ("secret", TLS_SECRET, "tls.key")
          and flags.get("--tls-cert", "").startswith("/etc/churn-throttler/tls/"), str(flags))
    delay = duration_seconds(flags.get("--shutdown-delay", "5s"))
    drain = duration_seconds(flags.get("--drain-timeout", "15s"))
    grace = pod.get("terminationGracePeriodSeconds", 30)
    check(f"{p} terminationGracePeriodSeconds > shutdown delay + drain", grace > delay + drain, f"{grace} <= {delay}+{drain}")
    # Service and PDB select these pods; the Service's 443 reaches the https port.
    sel = svc["spec"].get("selector") or {}
    check(f"{variant}: Service selects the Deployment's pods", sel and all(labels.get(k) == v for k, v in sel.items()))
    sports = {pt["name"]: pt for pt in svc["spec"]["ports"]}
    check(f"{variant}: Service 443 -> https (8443)",
          sports.get("https", {}).get("port") == 443 and sports["https"].get("targetPort") in ("https", 8443))
    check(f"{variant}: Service metrics 9090 -> metrics",
          sports.get("metrics", {}).get("port") == 9090 and sports["metrics"].get("targetPort") in ("metrics", 9090))
    psel = (pdb or {}).get("spec", {}).get("selector", {}).get("matchLabels") or {}
    check(f"{variant}: PodDisruptionBudget selects the Deployment's pods", psel and all(labels.get(k) == v for k, v in psel.items()))


def check_cert_manager(variant, docs):
    p = f"{variant}: cert-manager"
    issuers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}
    certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    serving = certs.get(SERVING_CERT)
    if not check(f"{p} serving Certificate {SERVING_CERT}", serving is not None):
        return
    s = serving["spec"]
    check(f"{p} serving Certificate writes Secret {TLS_SECRET}", s.get("secretName") == TLS_SECRET)
    check(f"{p} serving Certificate covers the Service DNS names", set(SVC_DNS) <= set(s.get("dnsNames") or []), str(s.get("dnsNames")))
    ca_issuer = issuers.get(s["issuerRef"]["name"])
    check(f"{p} serving Certificate issued by a CA Issuer in the bundle", ca_issuer is not None and "ca" in ca_issuer["spec"])
    if ca_issuer:
        ca_secret = ca_issuer["spec"]["ca"]["secretName"]
        ca_cert = [c for c in certs.values() if c["spec"].get("secretName") == ca_secret]
        check(f"{p} CA Issuer's secret comes from an isCA Certificate", len(ca_cert) == 1 and ca_cert[0]["spec"].get("isCA") is True)
        if ca_cert:
            root = issuers.get(ca_cert[0]["spec"]["issuerRef"]["name"])
            check(f"{p} CA Certificate issued by a selfSigned Issuer", root is not None and "selfSigned" in root["spec"])


def check_dashboard(path, src_dir, promtool):
    p = "dashboard"
    try:
        with open(path) as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        check(f"{p}: {path} parses as JSON", False, str(e))
        return
    check(f"{p}: parses as JSON", True)
    check(f"{p}: has uid and title", bool(dash.get("uid")) and bool(dash.get("title")))
    known = set()
    for root, _, files in os.walk(src_dir):
        for fn in files:
            if fn.endswith(".rs"):
                with open(os.path.join(root, fn)) as f:
                    known |= set(re.findall(r'"(churn_throttler_[a-z0-9_]+)"', f.read()))
    panels = []
    for pnl in dash.get("panels", []):
        panels.append(pnl)
        panels.extend(pnl.get("panels", []))
    ids = [pnl["id"] for pnl in panels]
    check(f"{p}: panel ids unique", len(ids) == len(set(ids)))
    exprs = []
    for pnl in panels:
        if pnl.get("type") == "row":
            continue
        targets = pnl.get("targets") or []
        check(f"{p}: panel {pnl.get('title')!r} has targets and a gridPos", bool(targets) and "gridPos" in pnl)
        exprs += [(pnl.get("title"), t.get("expr", "")) for t in targets]
    for v in (dash.get("templating") or {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            exprs.append((f"variable {v['name']}", q.get("query", "")))
    missing = []
    for title, expr in exprs:
        names = set(re.findall(r"churn_throttler_[a-z0-9_]+", expr))
        if not names:
            missing.append((title, "no churn_throttler_ metric in " + expr))
        for n in names:
            base = re.sub(r"_(bucket|sum|count)$", "", n)
            if n in known or base in known:
                continue
            missing.append((title, n))
    check(f"{p}: every expr references a metric defined in src/ ({len(exprs)} exprs)", not missing, str(missing))
    used = {re.sub(r"_(bucket|sum|count)$", "", n) for _, e in exprs for n in re.findall(r"churn_throttler_[a-z0-9_]+", e)}
    unused = sorted(known - used)
    check(f"{p}: every metric defined in src/ is on a panel ({len(known)} metrics)", not unused, str(unused))
    # PromQL syntax: promtool parses each expr as a recording rule.
    if promtool:
        rules = []
        for i, (_, expr) in enumerate(exprs):
            e = (expr.replace("$__rate_interval", "5m").replace("$__range", "1h")
                 .replace('"$job"', '".*"').replace('"$rule"', '".*"'))
            if e.startswith("label_values("):
                m = re.fullmatch(r"label_values\((\w+), *\w+\)", e)
                e = m.group(1) if m else e
            rules.append({"record": f"dashboard:expr_{i}", "expr": e})
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
            f.flush()
            r = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
        check(f"{p}: every expr parses as PromQL (promtool check rules)", r.returncode == 0, (r.stdout + r.stderr).strip())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--promtool", help="promtool binary: check that the dashboard exprs parse")
    ap.add_argument("--passed-before", action="append", default=[],
                    help="a check that passed in check.sh before this script (counted in the summary)")
    ap.add_argument("--failed-before", action="append", default=[],
                    help="a check that failed in check.sh before this script (counted in the summary)")
    ap.add_argument("render", nargs="+", help="VARIANT=FILE")
    a = ap.parse_args()
    for name in a.passed_before:
        check(name, True)
    for name in a.failed_before:
        check(name, False, "see above")
    with open(a.policy) as f:
        policy_src = f.read()
    for spec in a.render:
        variant, _, path = spec.partition("=")
        print(f"{variant} ({path}):")
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        check(f"{variant}: renders to objects", bool(docs))
        check_common(variant, docs, policy_src)
    print("dashboard:")
    check_dashboard(a.dashboard, a.src, a.promtool)
    for w in warnings:
        print(f"  WARN {w}")
    print(f"manifests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
