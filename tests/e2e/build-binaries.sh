#!/usr/bin/env bash
# Builds the real Kubernetes control-plane binaries used by the e2e tests
# (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok)
# from the pinned wrapper Go module in tests/e2e/cluster, into a cache outside
# the repository:
#
#   ${CHURN_E2E_CACHE:-$HOME/.cache/churn-throttler-e2e}/<key>/bin
#
# <key> names the versions (and a hash of go.mod/go.sum), so bumping a version
# builds into a fresh directory. When every binary already exists the script is
# a no-op that takes well under a second (plus the prometheus check).
#
# It also makes sure Debian's `prometheus` package (prometheus + promtool) is
# installed, running `apt-get update` at most once and only when needed.
#
# The last line of stdout is the bin directory; everything else goes to stderr.
#
# Environment:
#   CHURN_E2E_CACHE        cache root (default $HOME/.cache/churn-throttler-e2e)
#   CHURN_E2E_SKIP_PROM=1  do not check/install prometheus
#   CHURN_E2E_BUILD_P      go build -p value (default 2)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod="$here/cluster"

log() { echo "build-binaries: $*" >&2; }
die() { echo "build-binaries: ERROR: $*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH (need go >= 1.26)"

# Versions, kept in one place; they must agree with cluster/go.mod (checked below).
K8S_VERSION=v1.36.5
ETCD_VERSION=v3.6.8
KWOK_VERSION=v0.8.0

export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

gover="$(go env GOVERSION)"
sum="$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-10)"
key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_${gover}_${sum}"
cache_root="${CHURN_E2E_CACHE:-$HOME/.cache/churn-throttler-e2e}"
bin="$cache_root/$key/bin"

binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok)

all_present() {
  local b
  for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || return 1; done
  return 0
}

ensure_prometheus() {
  [[ "${CHURN_E2E_SKIP_PROM:-0}" == 1 ]] && return 0
  if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    return 0
  fi
  command -v apt-get >/dev/null || die "prometheus/promtool missing and apt-get not available"
  local sudo=()
  [[ "$(id -u)" == 0 ]] || sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  log "installing Debian package 'prometheus' (provides prometheus and promtool)"
  if ! apt-cache policy prometheus 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    log "apt-get update (package lists do not know prometheus yet)"
    "${sudo[@]}" apt-get update -qq >&2
  fi
  if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus >&2; then
    log "apt-get install failed; retrying once after apt-get update"
    "${sudo[@]}" apt-get update -qq >&2
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus >&2
  fi
  command -v prometheus >/dev/null && command -v promtool >/dev/null \
    || die "prometheus package installed but prometheus/promtool not on PATH"
}

build() {
  # Check that go.mod pins what this script believes it pins.
  local got
  got="$(cd "$mod" && go list -m -f '{{.Path}} {{.Version}}' k8s.io/kubernetes go.etcd.io/etcd/server/v3 sigs.k8s.io/kwok)"
  [[ "$got" == *"k8s.io/kubernetes $K8S_VERSION"* && "$got" == *"go.etcd.io/etcd/server/v3 $ETCD_VERSION"* && "$got" == *"sigs.k8s.io/kwok $KWOK_VERSION"* ]] \
    || die "cluster/go.mod does not match the versions in this script:"$'\n'"$got"

  local p="${CHURN_E2E_BUILD_P:-2}"
  tmp="$cache_root/$key/bin.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT

  local build_date minor
  build_date="$(cd "$mod" && go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)"
  minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  local vpkg=k8s.io/component-base/version
  local k8s_ldflags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=$build_date"

  local t0=$SECONDS
  log "building kube-apiserver kube-controller-manager kube-scheduler kubectl ($K8S_VERSION), -p $p ..."
  (cd "$mod" && go build -p "$p" -trimpath -ldflags "$k8s_ldflags" -o "$tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kubectl) >&2
  log "building etcd ($ETCD_VERSION) ..."
  (cd "$mod" && go build -p "$p" -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3) >&2
  log "building kwok ($KWOK_VERSION) ..."
  (cd "$mod" && go build -p "$p" -trimpath \
      -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
      -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok) >&2

  mkdir -p "$bin"
  local b
  for b in "${binaries[@]}"; do
    [[ -x "$tmp/$b" ]] || die "go build did not produce $b"
    mv -f "$tmp/$b" "$bin/$b"
  done
  rm -rf "$tmp"
  log "built ${#binaries[@]} binaries in $((SECONDS - t0))s"
}

if all_present; then
  log "binaries already built in $bin"
else
  build
fi
ensure_prometheus
echo "$bin"
