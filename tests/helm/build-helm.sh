#!/usr/bin/env bash
# Builds helm from the Go module proxy (helm.sh/helm/v3 at a pinned version, checked
# against sum.golang.org like every module), CGO off, into a cache outside the repository:
#
#   ${CHURN_TOOLS_CACHE:-$HOME/.cache/churn-throttler-tools}/helm-<version>_<go version>/helm
#
# A no-op when that binary exists. The last line of stdout is the binary's path.
set -euo pipefail

HELM_VERSION=v3.21.4

log() { echo "build-helm: $*" >&2; }
command -v go >/dev/null || { log "ERROR: go is not on PATH"; exit 1; }

export CGO_ENABLED=0
export GOFLAGS="-buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
cache_root="${CHURN_TOOLS_CACHE:-$HOME/.cache/churn-throttler-tools}"
# v2: the Kubernetes version ldflags below (v1 said v1.20 to `helm template`).
dir="$cache_root/helm-${HELM_VERSION}_$(go env GOVERSION)_v2"
if [[ -x "$dir/helm" ]]; then
  echo "$dir/helm"
  exit 0
fi
mkdir -p "$dir"
log "building helm $HELM_VERSION into $dir (a few minutes, once)"
# As helm's Makefile does: the version, and the Kubernetes version that `helm template`
# and `helm lint` assume without a cluster (that of the client-go helm is built with;
# without it they assume v1.20 and refuse a chart that needs matchConditions).
gomod="$(go mod download -json "helm.sh/helm/v3@${HELM_VERSION}" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')"
[[ -f "$gomod" ]] || { log "ERROR: no go.mod for helm ${HELM_VERSION}"; exit 1; }
k8s_minor="$(sed -n 's/^\s*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$gomod" | head -n1)"
[[ -n "$k8s_minor" ]] || { log "ERROR: no k8s.io/client-go in $gomod"; exit 1; }
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=${k8s_minor}"
done
tmp="$(mktemp -d "$dir/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" go install -p "${CHURN_E2E_BUILD_P:-2}" -trimpath -ldflags "$ldflags" \
  "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
mv "$tmp/helm" "$dir/helm"
"$dir/helm" version --short >&2
echo "$dir/helm"
