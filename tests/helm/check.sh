#!/usr/bin/env bash
# The Helm chart (charts/churn-throttler) and the shipped alerts, checked offline and
# against a real control plane (tests/e2e/cluster.sh):
#   1. promtool check rules + promtool test rules (tests/helm/alerts-test.yaml) on the
#      PrometheusRule of manifests/components/prometheusrule and on the chart's;
#   2. helm lint --strict and helm template on every charts/churn-throttler/ci/*-values.yaml,
#      and `churn-throttler check-config` on the policy each one renders;
#   3. the chart and kustomize give the same objects (compare.py, Helm's labels ignored):
#      default values vs manifests/base (the Namespace is Helm's --create-namespace, or
#      namespace.create=true, compared on its own), certManager vs overlays/cert-manager,
#      serviceMonitor + prometheusRule vs base + those components;
#   4. on a real kube-apiserver v1.36 with cert-manager's and the Prometheus Operator's CRDs
#      stubbed: `helm install --dry-run=server` and `helm template | kubectl apply
#      --dry-run=server` for every ci values file;
#   5. uninstall: the pre-delete hook's command, run with the hook's own RBAC, deletes both
#      webhook configurations; a real `helm install` + `helm uninstall` runs the hook before
#      the Deployment is deleted;
#   6. matchConditions, with the chart's webhook configurations (clientConfig pointed at a
#      local `churn-throttler serve` with the built-in policy) in an opted-in namespace:
#      a pod delete made as the kubelet would make it and the namespace controller's
#      deletes reach no webhook (its request counter does not move; with the webhook down,
#      the audit log has no failed-open annotation on them), while the ReplicaSet
#      controller's delete does (counter, its rule's audit annotation, failed-open when
#      down). A control run with the matchConditions switched off shows the same two
#      deletes do reach the webhook, so the check can fail.
# Everything listens on 127.0.0.1; waits are bounded; the cluster goes down on exit.
# Last line: "helm: N passed, M failed".
#
# Environment: CHURN_THROTTLER_BIN (skip `cargo build`), E2E_BIN (cluster binaries),
# HELM (a helm binary; default: tests/helm/build-helm.sh), HELM_E2E_KEEP=1 (keep the work dir),
# HELM_E2E_TIMEOUT (s per wait, default 120), HELM_E2E_CLUSTER=0 (offline checks only).
# shellcheck disable=SC2015  # `check && ok || bad`: ok() never fails
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
chart="$root/charts/churn-throttler"
timeout="${HELM_E2E_TIMEOUT:-120}"
passed=0
failed=0

say() { echo "helm: $*"; }
ok() { passed=$((passed + 1)); say "ok: $*"; }
bad() { failed=$((failed + 1)); echo "helm: FAIL: $*" >&2; }
die() {
  bad "$*"
  [[ -f "${W:-/nonexistent}/webhook.log" ]] && { echo "----- tail webhook.log -----" >&2; tail -n 15 "$W/webhook.log" >&2; }
  echo "helm: $passed passed, $failed failed"
  exit 1
}

# ---- tools -------------------------------------------------------------------
HELM="${HELM:-$("$here/build-helm.sh" | tail -n1)}" || die "build-helm.sh failed"
[[ -x "$HELM" ]] || die "no helm at $HELM"
if [[ -z "${E2E_BIN:-}" ]]; then
  E2E_BIN="$("$root/tests/e2e/build-binaries.sh" | tail -n1)" || die "build-binaries.sh failed"
fi
export E2E_BIN
KUBECTL="$E2E_BIN/kubectl"
[[ -x "$KUBECTL" ]] || die "no kubectl in $E2E_BIN"
command -v promtool >/dev/null || die "promtool not on PATH (Debian package prometheus; tests/e2e/build-binaries.sh installs it)"
python3 -c 'import yaml' 2>/dev/null || die "python3 has no yaml module (PyYAML)"
if [[ -z "${CHURN_THROTTLER_BIN:-}" ]]; then
  (cd "$root" && cargo build --quiet) || die "cargo build failed"
  CHURN_THROTTLER_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/churn-throttler"
fi
[[ -x "$CHURN_THROTTLER_BIN" ]] || die "no binary at $CHURN_THROTTLER_BIN"
say "$("$HELM" version --short), kubectl $("$KUBECTL" version --client -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])'), $(promtool --version 2>&1 | head -n1)"

W="$(mktemp -d /tmp/helm-check.XXXXXX)"
WEBHOOK_PID=""
cluster_started=0
cleanup() {
  local rc=$?
  [[ -n "$WEBHOOK_PID" ]] && kill "$WEBHOOK_PID" 2>/dev/null || true
  if [[ $cluster_started == 1 ]]; then cluster_down "$W" || true; fi
  if [[ "${HELM_E2E_KEEP:-0}" == 1 || $rc -ne 0 || $failed -ne 0 ]]; then
    echo "helm: work dir kept: $W" >&2
  else
    rm -rf "$W"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

NS=churn-throttler
tmpl() { "$HELM" template churn-throttler "$chart" --namespace "$NS" "$@"; }
# yq-less extraction: the objects of KIND from a rendered stream.
only_kind() { python3 -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(sys.stdin) if d and d.get("kind") == sys.argv[1]]
yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)' "$1"; }
rules_of() { python3 -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "PrometheusRule"]
assert len(docs) == 1, f"{len(docs)} PrometheusRules in {sys.argv[1]}"
yaml.safe_dump(docs[0]["spec"], open(sys.argv[2], "w"), sort_keys=False)' "$1" "$2"; }

# ---- 1. alerts ---------------------------------------------------------------
mkdir -p "$W/alerts-component" "$W/alerts-chart"
rules_of "$root/manifests/components/prometheusrule/prometheusrule.yaml" "$W/alerts-component/rules.yaml"
tmpl --set prometheusRule.enabled=true --show-only templates/prometheusrule.yaml >"$W/chart-prometheusrule.yaml" \
  || die "helm template of the PrometheusRule failed"
rules_of "$W/chart-prometheusrule.yaml" "$W/alerts-chart/rules.yaml"
for v in component chart; do
  cp "$here/alerts-test.yaml" "$W/alerts-$v/"
  if (cd "$W/alerts-$v" && promtool check rules rules.yaml >check.out 2>&1); then
    ok "promtool check rules ($v): $(grep -o '[0-9]* rules found' "$W/alerts-$v/check.out")"
  else
    cat "$W/alerts-$v/check.out" >&2; bad "promtool check rules ($v)"
  fi
  if (cd "$W/alerts-$v" && promtool test rules alerts-test.yaml >test.out 2>&1); then
    ok "promtool test rules ($v): $(grep -c '^  - name:' "$here/alerts-test.yaml") unit tests"
  else
    cat "$W/alerts-$v/test.out" >&2; bad "promtool test rules ($v)"
  fi
done
alerts="$(python3 -c '
import sys, yaml
g = yaml.safe_load(open(sys.argv[1]))["groups"]
print(" ".join(r["alert"] for x in g for r in x["rules"]))' "$W/alerts-component/rules.yaml")"
tested="$(grep -o 'alertname: [A-Za-z]*' "$here/alerts-test.yaml" | awk '{print $2}' | sort -u | tr '\n' ' ')"
untested=""
for a in $alerts; do [[ " $tested " == *" $a "* ]] || untested+=" $a"; done
missing_runbook="$(python3 -c '
import sys, yaml
g = yaml.safe_load(open(sys.argv[1]))["groups"]
print(" ".join(r["alert"] for x in g for r in x["rules"] if not r.get("annotations", {}).get("runbook")))' "$W/alerts-component/rules.yaml")"
[[ -z "$untested" && -z "$missing_runbook" ]] \
  && ok "every alert ($alerts) has a runbook annotation and a promtool unit test" \
  || bad "alerts without a unit test:$untested; without a runbook: $missing_runbook"
cmp -s "$W/alerts-component/rules.yaml" "$W/alerts-chart/rules.yaml" \
  && ok "the chart's PrometheusRule has the same rules as manifests/components/prometheusrule" \
  || { diff "$W/alerts-component/rules.yaml" "$W/alerts-chart/rules.yaml" >&2 || true; bad "the chart's alert rules differ from manifests/components/prometheusrule"; }

# ---- 2. lint, template, policy ------------------------------------------------
ci_files=("$chart"/ci/*-values.yaml)
(( ${#ci_files[@]} >= 3 )) || bad "fewer than 3 ci values files in $chart/ci"
for f in "${ci_files[@]}"; do
  name="$(basename "$f" .yaml)"
  if "$HELM" lint --strict --namespace "$NS" "$chart" -f "$f" >"$W/lint-$name.out" 2>&1; then
    ok "helm lint --strict ($name)"
  else
    cat "$W/lint-$name.out" >&2; bad "helm lint --strict ($name)"
  fi
  # lint reports a template's `fail` only as [INFO]: render too.
  if tmpl -f "$f" >"$W/render-$name.yaml" 2>"$W/render-$name.err"; then
    only_kind ConfigMap <"$W/render-$name.yaml" | python3 -c '
import sys, yaml
cm = [d for d in yaml.safe_load_all(sys.stdin) if d["metadata"]["name"] == "churn-throttler-policy"][0]
open(sys.argv[1], "w").write(cm["data"]["policy.yaml"])' "$W/policy-$name.yaml"
    if "$CHURN_THROTTLER_BIN" check-config "$W/policy-$name.yaml" >"$W/check-$name.out" 2>&1; then
      ok "helm template ($name): $(grep -c '^kind:' "$W/render-$name.yaml") objects; its policy passes check-config"
    else
      cat "$W/check-$name.out" >&2; bad "the policy rendered with $name fails check-config"
    fi
  else
    cat "$W/render-$name.err" >&2; bad "helm template ($name)"
  fi
done
# Bad values are refused with a clear message.
refused() { # refused DESC EXPECTED-TEXT ARGS...
  local desc="$1" want="$2"; shift 2
  if tmpl "$@" >/dev/null 2>"$W/refused.err"; then
    bad "helm template accepted $desc"
  elif grep -q -- "$want" "$W/refused.err"; then
    ok "helm template refuses $desc: $(grep -o -- "$want[^\"]*" "$W/refused.err" | head -n1 | cut -c1-100)"
  else
    cat "$W/refused.err" >&2; bad "helm template refused $desc without saying \"$want\""
  fi
}
refused "a webhook timeout that differs from the policy's" "must equal timeoutSeconds" --set webhooks.timeoutSeconds=7
refused "failurePolicy Maybe (values.schema.json)" "failurePolicy" --set webhooks.failurePolicy=Maybe
refused "an unknown value (values.schema.json)" "additional properties" --set replica=3
if "$HELM" template churn-throttler "$chart" --namespace elsewhere >/dev/null 2>"$W/refused.err"; then
  bad "helm template accepted a namespace other than churn-throttler"
else
  grep -q "install into the namespace churn-throttler" "$W/refused.err" \
    && ok "helm template refuses a namespace other than churn-throttler (the policy exempts it by name)" \
    || { cat "$W/refused.err" >&2; bad "wrong message for another namespace"; }
fi
# The default values' policy is the built-in one and the chart's uninstall hook is there.
cmp -s "$W/policy-default-values.yaml" "$root/src/policy/default-policy.yaml" \
  && ok "the chart's default policy is src/policy/default-policy.yaml, byte for byte" \
  || bad "the chart's default policy differs from src/policy/default-policy.yaml (copy it into values.yaml)"

# ---- 3. the same objects as kustomize ------------------------------------------
combo() { # combo NAME COMPONENT...: base + components in a throw-away kustomization
  local d="$W/combo-$1"; shift
  mkdir -p "$d"; ln -sfn "$root/manifests" "$d/manifests"
  { echo "apiVersion: kustomize.config.k8s.io/v1beta1"; echo "kind: Kustomization"
    echo "resources: [manifests/base]"; echo "components:"
    local c; for c in "$@"; do echo "  - manifests/components/$c"; done; } >"$d/kustomization.yaml"
  echo "$d"
}
compare() { # compare DESC KUSTOMIZE-DIR -- COMPARE-ARGS -- HELM-ARGS...
  local desc="$1" dir="$2"; shift 3
  local cargs=()
  while [[ "$1" != -- ]]; do cargs+=("$1"); shift; done
  shift
  local slug="${desc//[^a-z0-9]/-}"
  "$KUBECTL" kustomize "$dir" >"$W/k-$slug.yaml" || { bad "kubectl kustomize $dir"; return; }
  tmpl "$@" >"$W/h-$slug.yaml" || { bad "helm template for $desc"; return; }
  if python3 "$here/compare.py" "$W/k-$slug.yaml" "$W/h-$slug.yaml" "${cargs[@]}" >"$W/compare-$slug.out" 2>&1; then
    ok "$desc: $(tail -n1 "$W/compare-$slug.out" | sed 's/^compare: //')"
  else
    { grep -v '^compare: ok' "$W/compare-$slug.out" >&2 || true; }; bad "$desc: the chart and kustomize differ"
  fi
}
compare "default values = manifests/base" "$root/manifests/base" \
  -- --missing Namespace/churn-throttler --extra-hooks --
"$KUBECTL" kustomize "$root/manifests/base" | only_kind Namespace >"$W/k-namespace.yaml"
tmpl --set namespace.create=true --show-only templates/namespace.yaml >"$W/h-namespace.yaml"
python3 "$here/compare.py" "$W/k-namespace.yaml" "$W/h-namespace.yaml" >"$W/compare-ns.out" 2>&1 \
  && ok "namespace.create=true renders manifests/base's Namespace" \
  || { cat "$W/compare-ns.out" >&2; bad "namespace.create=true: the Namespace differs from manifests/base's"; }
compare "certificates.source=certManager = overlays/cert-manager" "$root/manifests/overlays/cert-manager" \
  -- --missing Namespace/churn-throttler --extra-hooks -- --set certificates.source=certManager
compare "serviceMonitor + prometheusRule = base + components" "$(combo mon servicemonitor prometheusrule)" \
  -- --missing Namespace/churn-throttler --extra-hooks -- --set serviceMonitor.enabled=true --set prometheusRule.enabled=true
compare "networkPolicy.enabled=true = base + components/networkpolicy" "$(combo np networkpolicy)" \
  -- --missing Namespace/churn-throttler --extra-hooks -- --set networkPolicy.enabled=true
refused "a NetworkPolicy with no admission peers" "networkPolicy.admissionFrom must list" \
  --set networkPolicy.enabled=true --set networkPolicy.admissionFrom=null

# The uninstall hook: pre-delete, the webhook configurations only.
tmpl --show-only templates/uninstall-hook.yaml >"$W/hook.yaml"
python3 - "$W/hook.yaml" >"$W/hook.out" 2>&1 <<'PY' && ok "uninstall hook: $(cat "$W/hook.out")" || { cat "$W/hook.out" >&2; bad "uninstall hook"; }
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
assert all(d["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete" for d in docs), "not all pre-delete"
job = [d for d in docs if d["kind"] == "Job"][0]
args = job["spec"]["template"]["spec"]["containers"][0]["args"]
assert args[:3] == ["delete", "validatingwebhookconfiguration/churn-throttler", "mutatingwebhookconfiguration/churn-throttler"], args
role = [d for d in docs if d["kind"] == "ClusterRole"][0]
assert role["rules"] == [{"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"], "resourceNames": ["churn-throttler"], "verbs": ["get", "delete"]}], role["rules"]
weights = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in docs}
assert weights["Job"] > max(v for k, v in weights.items() if k != "Job"), weights
print(f"{len(docs)} pre-delete objects; the Job deletes both webhook configurations, its ClusterRole allows that only")
PY

if [[ "${HELM_E2E_CLUSTER:-1}" == 0 ]]; then
  say "SKIP the control-plane checks (HELM_E2E_CLUSTER=0)"
  say "$passed passed, $failed failed"
  (( failed == 0 ))
  exit
fi

# ---- 4. a real control plane ---------------------------------------------------
# shellcheck source=../e2e/cluster.sh
source "$root/tests/e2e/cluster.sh"
mkdir -p "$W/logs"
cat >"$W/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    resources: [{ group: "", resources: [pods] }]
    verbs: [create, delete, deletecollection]
  - level: None
EOF
cluster_started=1
CHURN_E2E_SKIP_PROM=1 CLUSTER_KUBE_ARGS_APISERVER="${CLUSTER_KUBE_ARGS_APISERVER:-} --audit-policy-file=$W/audit-policy.yaml --audit-log-path=$W/logs/audit.log --audit-log-format=json --audit-log-maxsize=0" \
  cluster_up "$W" 1 >"$W/cluster-up.log" 2>&1 || { tail -n 30 "$W/cluster-up.log" >&2; die "cluster up failed"; }
# shellcheck disable=SC1091
source "$W/env"
k() { "$KUBECTL" --request-timeout=20s "$@"; }
wait_for() { # wait_for DESC CMD...
  local desc="$1"; shift
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    (( SECONDS - start < timeout )) || die "timed out after ${timeout}s waiting for: $desc"
    sleep 0.2
  done
}
say "control plane $(k version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"

# cert-manager's and the Prometheus Operator's CRDs, stubbed: their real group, kind and
# scope, any content (the objects' schema is theirs, not this chart's).
stub_crd() { # stub_crd GROUP KIND PLURAL
  cat <<EOF
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: $3.$1
spec:
  group: $1
  names: { kind: $2, plural: $3, singular: $(echo "$2" | tr '[:upper:]' '[:lower:]'), listKind: ${2}List }
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema: { openAPIV3Schema: { type: object, x-kubernetes-preserve-unknown-fields: true } }
---
EOF
}
{ stub_crd cert-manager.io Certificate certificates; stub_crd cert-manager.io Issuer issuers
  stub_crd monitoring.coreos.com ServiceMonitor servicemonitors
  stub_crd monitoring.coreos.com PrometheusRule prometheusrules; } >"$W/crds.yaml"
k apply -f "$W/crds.yaml" >/dev/null || die "stub CRDs"
for crd in certificates.cert-manager.io issuers.cert-manager.io servicemonitors.monitoring.coreos.com prometheusrules.monitoring.coreos.com; do
  wait_for "CRD $crd established" k wait --for=condition=Established "crd/$crd" --timeout=5s
done
k create namespace "$NS" >/dev/null
k label namespace "$NS" churn-throttler.io/enabled=false pod-security.kubernetes.io/enforce=restricted >/dev/null

for f in "${ci_files[@]}"; do
  name="$(basename "$f" .yaml)"
  if "$HELM" install churn-throttler "$chart" --namespace "$NS" -f "$f" --dry-run=server >"$W/dry-helm-$name.out" 2>&1; then
    ok "helm install --dry-run=server ($name)"
  else
    tail -n 20 "$W/dry-helm-$name.out" >&2; bad "helm install --dry-run=server ($name)"
  fi
  # The namespace exists already; the chart's Namespace would be created by Helm otherwise.
  if tmpl -f "$f" --set namespace.create=false | k apply --dry-run=server -f - >"$W/dry-kubectl-$name.out" 2>&1; then
    ok "helm template | kubectl apply --dry-run=server ($name): $(grep -c . "$W/dry-kubectl-$name.out") objects accepted"
  else
    tail -n 20 "$W/dry-kubectl-$name.out" >&2; bad "helm template | kubectl apply --dry-run=server ($name)"
  fi
done

# ---- 5. uninstall ----------------------------------------------------------------
# The hook's command with the hook's RBAC (kwok runs no container, so the Job cannot run it).
tmpl --show-only templates/webhooks.yaml | k apply -f - >/dev/null || die "apply the webhook configurations"
python3 - "$W/hook.yaml" "$W/hook-rbac.yaml" "$W/hook-args" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
yaml.safe_dump_all([d for d in docs if d["kind"] != "Job"], open(sys.argv[2], "w"))
job = [d for d in docs if d["kind"] == "Job"][0]
open(sys.argv[3], "w").write("\n".join(job["spec"]["template"]["spec"]["containers"][0]["args"]) + "\n")
PY
k apply -f "$W/hook-rbac.yaml" >/dev/null || die "apply the hook's RBAC"
mapfile -t hook_args <"$W/hook-args"
if k --as="system:serviceaccount:$NS:churn-throttler-uninstall" "${hook_args[@]}" >"$W/hook-run.out" 2>&1 \
   && ! k get validatingwebhookconfiguration churn-throttler >/dev/null 2>&1 \
   && ! k get mutatingwebhookconfiguration churn-throttler >/dev/null 2>&1; then
  ok "the uninstall hook's command, as its ServiceAccount, deleted both webhook configurations ($(tr '\n' ' ' <"$W/hook-run.out"))"
else
  cat "$W/hook-run.out" >&2; bad "the uninstall hook's command did not delete both webhook configurations"
fi
k delete -f "$W/hook-rbac.yaml" >/dev/null 2>&1 || true
# A real install and uninstall: the hook runs before any object is deleted.
if "$HELM" install churn-throttler "$chart" --namespace "$NS" >"$W/install.out" 2>&1; then
  ok "helm install (default values) on the control plane"
  "$HELM" uninstall churn-throttler --namespace "$NS" --debug --timeout 120s >"$W/uninstall.out" 2>&1 || true
  python3 - "$W/uninstall.out" >"$W/uninstall.check" 2>&1 <<'PY' && ok "helm uninstall: $(cat "$W/uninstall.check")" || { cat "$W/uninstall.check" "$W/uninstall.out" >&2; bad "helm uninstall order"; }
import sys
lines = open(sys.argv[1]).read().splitlines()
def first(pred, what, after=-1):
    for i, l in enumerate(lines):
        if i > after and pred(l): return i
    raise SystemExit(f"no line for {what}")
hook = first(lambda l: "Watching for changes to Job churn-throttler-uninstall" in l, "the hook Job's run")
# hook-delete-policy hook-succeeded: Helm deletes the Job once it has succeeded.
done = first(lambda l: "Starting delete for \"churn-throttler-uninstall\" Job" in l, "the hook Job's success", hook)
deploy = first(lambda l: "Starting delete for \"churn-throttler\" Deployment" in l, "the Deployment's delete")
vwc = first(lambda l: "Starting delete for \"churn-throttler\" ValidatingWebhookConfiguration" in l, "Helm's own delete of the webhook configuration")
assert hook < done < deploy, f"hook at line {hook + 1}, its end at {done + 1}, Deployment delete at {deploy + 1}"
assert any("release \"churn-throttler\" uninstalled" in l for l in lines), "not uninstalled"
print(f"the pre-delete hook Job ran (log lines {hook + 1}-{done + 1}) before the Deployment's delete (line {deploy + 1}); "
      f"Helm's own delete of the webhook configurations comes after it (line {vwc + 1}), hence the hook")
PY
else
  tail -n 20 "$W/install.out" >&2; bad "helm install (default values)"
fi

# ---- 6. matchConditions ------------------------------------------------------------
read -r WH_PORT < <(_cl_free_ports 1)
cluster_issue_serving_cert "$W" webhook >/dev/null || die "serving certificate"
# The chart's webhook configurations, clientConfig pointed at the local process.
webhooks_to_local() { # webhooks_to_local HELM-ARGS...: apply the chart's webhooks, by URL
  tmpl --show-only templates/webhooks.yaml "$@" | python3 -c '
import sys, yaml
url, ca = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
for d in docs:
    for h in d["webhooks"]:
        path = h["clientConfig"]["service"]["path"]
        h["clientConfig"] = {"url": url + path, "caBundle": ca}
yaml.safe_dump_all(docs, sys.stdout)' "https://127.0.0.1:$WH_PORT" "$(base64 -w0 <"$CLUSTER_CA_FILE")" \
  | k apply -f - >/dev/null
}
tmpl --show-only templates/configmap.yaml | python3 -c '
import sys, yaml
print(yaml.safe_load(sys.stdin)["data"]["policy.yaml"], end="")' >"$W/policy.yaml"
start_webhook() {
  "$CHURN_THROTTLER_BIN" serve --config "$W/policy.yaml" \
    --tls-cert "$W/pki/webhook.crt" --tls-key "$W/pki/webhook.key" \
    --listen "127.0.0.1:$WH_PORT" --metrics-listen 127.0.0.1:0 \
    --releaser=false --replica-budget=false \
    --shutdown-delay 0s --drain-timeout 4s --log-format json >>"$W/webhook.log" 2>&1 &
  WEBHOOK_PID=$!
  wait_for "webhook serving" grep -q '"churn-throttler serving"' "$W/webhook.log"
  METRICS="$(python3 -c '
import json, sys
addr = None
for line in open(sys.argv[1]):
    try: f = json.loads(line).get("fields", {})
    except ValueError: continue
    if f.get("message") == "churn-throttler serving": addr = f["metrics_addr"]
print(addr)' "$W/webhook.log")"
}
stop_webhook() {
  kill "$WEBHOOK_PID" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$WEBHOOK_PID" 2>/dev/null || break; sleep 0.1; done
  WEBHOOK_PID=""
}
# Requests the webhook answered, all endpoints (not the metrics scrape itself); 0 when down.
calls() {
  { curl -fsS --max-time 2 "http://$METRICS/metrics" 2>/dev/null || true; } | python3 -c '
import sys
n = 0
for l in sys.stdin:
    if l.startswith("churn_throttler_http_requests_total{"): n += float(l.rsplit(" ", 1)[1])
print(int(n))'
}
GHOST=ghost-node-0
METRICS=127.0.0.1:1
# scenario LABEL: the three deletes; sets KUBELET_D, TEARDOWN_D, RS_D (counter deltas)
# and records the audit IDs of the kubelet's and the ReplicaSet controller's deletes.
scenario() {
  local label="$1" ns="paced-$1" gone="teardown-$1"
  k create namespace "$ns" >/dev/null && k label namespace "$ns" churn-throttler.io/enabled=true >/dev/null
  k create namespace "$gone" >/dev/null && k label namespace "$gone" churn-throttler.io/enabled=true >/dev/null
  # A pod bound to a node that stays after its delete (a finalizer), so the kubelet's
  # final delete finds it with a deletionTimestamp, as a kubelet does. The node is not
  # kwok's: kwok would make that final delete itself, as another user.
  cat <<EOF | k apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: { name: lingering, namespace: $ns, finalizers: [example.com/hold] }
spec:
  nodeName: $GHOST
  containers: [{ name: c, image: registry.k8s.io/pause:3.10 }]
EOF
  for i in 1 2 3; do
    cat <<EOF | k apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: { name: doomed-$i, namespace: $gone }
spec:
  nodeSelector: { example.com/no-such-node: "true" }
  containers: [{ name: c, image: registry.k8s.io/pause:3.10 }]
EOF
  done
  cat <<EOF | k apply -f - >/dev/null
apiVersion: apps/v1
kind: ReplicaSet
metadata: { name: web, namespace: $ns }
spec:
  replicas: 2
  selector: { matchLabels: { app: web } }
  template:
    metadata: { labels: { app: web } }
    spec:
      containers: [{ name: c, image: registry.k8s.io/pause:3.10 }]
EOF
  # Running pods (kwok): deleting a pod that never ran is never paced, so no rule would show.
  wait_for "$ns: 2 ReplicaSet pods running" bash -c "[[ \$('$KUBECTL' -n $ns get pods -l app=web --field-selector=status.phase=Running -o name | wc -l) == 2 ]]"
  k -n "$ns" delete pod lingering --wait=false >/dev/null
  wait_for "$ns/lingering terminating" bash -c "[[ -n \$('$KUBECTL' -n $ns get pod lingering -o jsonpath='{.metadata.deletionTimestamp}') ]]"
  sleep 1
  # The kubelet's final delete.
  MARK="$(calls)"
  k -n "$ns" --as="system:node:$GHOST" --as-group=system:nodes --as-group=system:authenticated \
    delete pod lingering --grace-period=0 --force --wait=false >"$W/kubelet-$label.out" 2>&1 \
    || { cat "$W/kubelet-$label.out" >&2; die "$label: the delete as system:node:$GHOST was refused"; }
  sleep 2
  KUBELET_D=$(( $(calls) - MARK ))
  k -n "$ns" patch pod lingering --type=json -p '[{"op":"remove","path":"/metadata/finalizers"}]' >/dev/null
  # The namespace controller's deletes.
  MARK="$(calls)"
  k delete namespace "$gone" --wait=false >/dev/null
  wait_for "namespace $gone gone" bash -c "! '$KUBECTL' get namespace $gone"
  TEARDOWN_D=$(( $(calls) - MARK ))
  # The ReplicaSet controller's delete.
  MARK="$(calls)"
  k -n "$ns" scale replicaset web --replicas=1 >/dev/null
  wait_for "$ns: 1 ReplicaSet pod" bash -c "[[ \$('$KUBECTL' -n $ns get pods -l app=web -o name | wc -l) == 1 ]]"
  sleep 1
  RS_D=$(( $(calls) - MARK ))
}
# audit DESC NS USER: the pod delete events by USER in NS, with their churn-throttler
# annotations ("rule=..." from the webhook's answer, "failed-open" when it was down).
audit() {
  python3 - "$W/logs/audit.log" "$1" "$2" <<'PY'
import json, sys
path, ns, user = sys.argv[1:]
out = []
for line in open(path):
    e = json.loads(line)
    if e.get("verb") not in ("delete", "deletecollection") or e.get("stage") != "ResponseComplete": continue
    ref = e.get("objectRef", {})
    if ref.get("resource") != "pods" or ref.get("namespace") != ns or ref.get("subresource"): continue
    if e.get("user", {}).get("username") != user and e.get("impersonatedUser", {}).get("username") != user: continue
    ann = e.get("annotations", {})
    tags = [f"{k.split('/', 1)[1]}={v}" for k, v in ann.items() if k.startswith("validate.churn-throttler.io/")]
    tags += ["failed-open" for k in ann if k.startswith("failed-open.validating.webhook.admission.k8s.io/")]
    out.append(",".join(tags) or "-")
print(" ".join(out) or "none")
PY
}
KUBELET_USER="system:node:$GHOST"
NSCTL_USER=system:serviceaccount:kube-system:namespace-controller
RSCTL_USER=system:serviceaccount:kube-system:replicaset-controller

webhooks_to_local
start_webhook
sleep 2 # the API server picks up webhook configurations from a watch
scenario on
a_kubelet="$(audit paced-on "$KUBELET_USER")"; a_ns="$(audit teardown-on "$NSCTL_USER")"; a_rs="$(audit paced-on "$RSCTL_USER")"
(( KUBELET_D == 0 )) && [[ "$a_kubelet" != *rule=* && "$a_kubelet" != none ]] \
  && ok "matchConditions: the kubelet's final delete reached no webhook (requests +$KUBELET_D; audit: $a_kubelet)" \
  || bad "the kubelet's final delete reached the webhook (requests +$KUBELET_D; audit: $a_kubelet)"
(( TEARDOWN_D == 0 )) && [[ "$a_ns" != none ]] \
  && ok "matchConditions: the namespace controller's deletes reached no webhook (requests +$TEARDOWN_D; audit of its pod deletes: $a_ns)" \
  || bad "the namespace controller's deletes reached the webhook, or none was made (requests +$TEARDOWN_D; audit: $a_ns)"
(( RS_D >= 1 )) && [[ "$a_rs" == *rule=controller-deletes* ]] \
  && ok "the ReplicaSet controller's delete still reaches the webhook (requests +$RS_D; audit: $a_rs)" \
  || bad "the ReplicaSet controller's delete did not reach the webhook (requests +$RS_D; audit: $a_rs)"
# kube-apiserver applied the mutating webhook's base64 patch to the ReplicaSet's pods.
labelled="$(k -n paced-on get pods -l app=web -o jsonpath='{.items[*].metadata.labels.churn-throttler\.io/gated}')"
[[ -n "$labelled" ]] \
  && ok "kube-apiserver applied the mutating answers' base64 patch (ReplicaSet pod labelled churn-throttler.io/gated=$labelled)" \
  || bad "the ReplicaSet pods carry no churn-throttler.io/gated label: the base64 patch was not applied"

# With the webhook down: every call leaves a failed-open annotation in the audit log.
stop_webhook
scenario down
a_kubelet="$(audit paced-down "$KUBELET_USER")"; a_ns="$(audit teardown-down "$NSCTL_USER")"; a_rs="$(audit paced-down "$RSCTL_USER")"
[[ "$a_kubelet" != *failed-open* && "$a_kubelet" != none && "$a_ns" != *failed-open* && "$a_ns" != none && "$a_rs" == *failed-open* ]] \
  && ok "webhook down: audit shows failed-open only on the ReplicaSet controller's delete (kubelet: $a_kubelet; namespace controller: $a_ns; ReplicaSet controller: $a_rs)" \
  || bad "webhook down: audit kubelet: $a_kubelet; namespace controller: $a_ns; ReplicaSet controller: $a_rs"

# Control: without the matchConditions the same deletes do reach the webhook.
webhooks_to_local --set webhooks.skipNodes=false --set webhooks.skipExemptUsers=false
sleep 2
k get validatingwebhookconfiguration churn-throttler -o jsonpath='{.webhooks[0].matchConditions}' | grep -q . \
  && die "control: matchConditions still set"
start_webhook
sleep 2
scenario off
(( KUBELET_D >= 1 && TEARDOWN_D >= 3 && RS_D >= 1 )) \
  && ok "control without matchConditions: the same deletes reach the webhook (kubelet +$KUBELET_D, namespace controller +$TEARDOWN_D, ReplicaSet controller +$RS_D)" \
  || bad "control without matchConditions: kubelet +$KUBELET_D, namespace controller +$TEARDOWN_D, ReplicaSet controller +$RS_D (expected each to reach the webhook)"
stop_webhook

say "$passed passed, $failed failed"
(( failed == 0 ))
