#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1 for the e2e tests:
# etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok
# (fake nodes; pods on them go Running/Ready without any container runtime).
#
# Usage as a command:
#   tests/e2e/cluster.sh up   WORKDIR [NODES]   # default NODES=3 (or $CLUSTER_NODES)
#   tests/e2e/cluster.sh down WORKDIR           # safe to call twice, or after a failed up
#   tests/e2e/cluster.sh issue-serving-cert WORKDIR NAME   # CA-signed cert for 127.0.0.1
#
# Usage as a library:
#   source tests/e2e/cluster.sh
#   W=$(mktemp -d); trap 'cluster_down "$W"' EXIT
#   cluster_up "$W" || exit 1
#   source "$W/env"       # KUBECONFIG, APISERVER_URL, CLUSTER_CA_FILE, ports, pids, PATH
#
# `up` records every pid in WORKDIR/pids as soon as the process is started, so a
# `down` from the caller's EXIT trap cleans up even when `up` failed half way.
# If `up` fails it tears down what it started itself (set CLUSTER_KEEP_ON_FAILURE=1
# to leave the processes running for debugging); logs stay in WORKDIR/logs/.
#
# Files written to WORKDIR:
#   kubeconfig            admin (static token, group system:masters)
#   env                   shell exports (see write_env below)
#   pki/                  CA, apiserver serving cert, service-account key pair, tokens.csv
#   logs/<component>.log  one log per component
#   pids                  "<name> <pid>" per started process
#
# Environment knobs:
#   E2E_BIN                  directory with the binaries (default: output of build-binaries.sh)
#   CLUSTER_NODES            number of fake nodes (default 3)
#   CLUSTER_NODE_PODS        allocatable pods per node (default 1000)
#   CLUSTER_UP_TIMEOUT       seconds for each wait (default 120)
#   CLUSTER_KUBE_ARGS_APISERVER / _KCM / _SCHEDULER / _KWOK   extra flags (word-split)
#   CLUSTER_KWOK_STAGES_EXTRA  a directory whose *.yaml kwok Stages are loaded after the
#                            default set (unset: the default set alone, e.g.
#                            tests/e2e/kwok-stages/slow for slow pods, see slowpods.sh)

_cluster_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

_cl_log() { echo "cluster: $*" >&2; }

# Prints the last lines of a component log, framed, to stderr.
_cl_tail() {
  local w="$1" name="$2" n="${3:-40}"
  local f="$w/logs/$name.log"
  if [[ -f "$f" ]]; then
    echo "----- last $n lines of $f -----" >&2
    tail -n "$n" "$f" >&2
    echo "----- end of $name.log -----" >&2
  fi
}

# _cl_free_ports N: prints N distinct free TCP ports on 127.0.0.1.
_cl_free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

# _cl_start W NAME CMD...: starts CMD in the background, logging to W/logs/NAME.log,
# and records its pid in W/pids right away.
_cl_start() {
  local w="$1" name="$2"; shift 2
  # `down` stops it by this recorded pid (the binary itself: no wrapper process).
  "$@" </dev/null >>"$w/logs/$name.log" 2>&1 &
  local pid=$!
  echo "$name $pid" >>"$w/pids"
  _cl_log "started $name (pid $pid), log: $w/logs/$name.log"
}

# True while pid $1 exists and is not a zombie (an exited child that nobody
# has reaped yet still answers kill -0).
_cl_alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local st
  st="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ -n "$st" && "$st" != Z && "$st" != X ]]
}

_cl_pid_of() { awk -v n="$1" '$1==n {print $2}' "$2/pids" 2>/dev/null | tail -n1; }

# _cl_wait W DESC TIMEOUT LOGNAME CMD...: polls CMD until it succeeds; fails
# (showing the tail of LOGNAME's log) on timeout or when that component died.
_cl_wait() {
  local w="$1" desc="$2" timeout="$3" logname="$4"; shift 4
  local start=$SECONDS pid
  while true; do
    if "$@" >/dev/null 2>&1; then
      _cl_log "$desc: ok after $((SECONDS - start))s"
      return 0
    fi
    for pidname in etcd kube-apiserver kube-controller-manager kube-scheduler kwok; do
      pid="$(_cl_pid_of "$pidname" "$w")"
      if [[ -n "$pid" ]] && ! _cl_alive "$pid"; then
        _cl_log "ERROR: $pidname (pid $pid) exited while waiting for: $desc"
        _cl_tail "$w" "$pidname" 60
        return 1
      fi
    done
    if (( SECONDS - start >= timeout )); then
      _cl_log "ERROR: timed out after ${timeout}s waiting for: $desc"
      _cl_tail "$w" "$logname" 60
      return 1
    fi
    sleep 0.5
  done
}

_cl_kubeconfig() {
  # _cl_kubeconfig FILE URL CAFILE TOKEN USER
  local file="$1" url="$2" ca="$3" token="$4" user="$5"
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: $url
    certificate-authority-data: $(base64 -w0 <"$ca")
users:
- name: $user
  user:
    token: $token
contexts:
- name: e2e
  context:
    cluster: e2e
    user: $user
current-context: e2e
EOF
  chmod 600 "$file"
}

_cl_gen_pki() {
  local pki="$1"
  mkdir -p "$pki"
  (
    cd "$pki"
    # CA
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 \
      -subj "/CN=churn-throttler-e2e-ca" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    # apiserver serving certificate (127.0.0.1 / localhost and the in-cluster names)
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
      -subj "/CN=kube-apiserver" 2>/dev/null
    cat >apiserver.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out apiserver.crt -days 30 -extfile apiserver.ext 2>/dev/null
    # service-account signing key pair
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    chmod 600 ./*.key
  ) || return 1
  [[ -s "$pki/ca.crt" && -s "$pki/apiserver.crt" && -s "$pki/sa.pub" ]]
}

# Runs in a subshell (errors end only the subshell, never a caller that sourced
# this file). Every step checks its own status: `set -e` is not relied upon,
# since bash ignores it inside a function called as `cluster_up ... || ...`.
cluster_up() (
  set -uo pipefail
  local w="${1:?usage: cluster_up WORKDIR [NODES]}"
  local nodes="${2:-${CLUSTER_NODES:-3}}"
  local node_pods="${CLUSTER_NODE_PODS:-1000}"
  local timeout="${CLUSTER_UP_TIMEOUT:-120}"
  local t_start=$SECONDS

  mkdir -p "$w" || return 1
  w="$(cd "$w" && pwd)" || return 1
  if [[ -s "$w/pids" ]]; then
    _cl_log "ERROR: $w/pids exists: a cluster was already started in $w (run down first)"
    return 1
  fi
  mkdir -p "$w/logs" "$w/pki"
  : >"$w/pids"

  on_fail() {
    local rc=$?
    if (( rc != 0 )); then
      _cl_log "ERROR: up failed (rc=$rc); logs are in $w/logs"
      if [[ "${CLUSTER_KEEP_ON_FAILURE:-0}" != 1 ]]; then cluster_down "$w" || true; fi
    fi
  }
  trap on_fail EXIT

  local bin="${E2E_BIN:-}"
  if [[ -z "$bin" ]]; then
    bin="$("$_cluster_here/build-binaries.sh" | tail -n1)" || { _cl_log "ERROR: build-binaries.sh failed"; return 1; }
  fi
  local b
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl; do
    [[ -x "$bin/$b" ]] || { _cl_log "ERROR: $bin/$b missing (run tests/e2e/build-binaries.sh)"; return 1; }
  done
  command -v openssl >/dev/null || { _cl_log "ERROR: openssl not found"; return 1; }
  command -v python3 >/dev/null || { _cl_log "ERROR: python3 not found (used to pick free ports)"; return 1; }
  command -v curl >/dev/null || { _cl_log "ERROR: curl not found"; return 1; }

  local pki="$w/pki"
  _cl_gen_pki "$pki" || { _cl_log "ERROR: certificate generation failed"; return 1; }

  local admin_token kcm_token sched_token kwok_token
  admin_token="$(openssl rand -hex 24)"
  kcm_token="$(openssl rand -hex 24)"
  sched_token="$(openssl rand -hex 24)"
  kwok_token="$(openssl rand -hex 24)"
  # token,user,uid,"group1,group2"
  cat >"$pki/tokens.csv" <<EOF
$admin_token,e2e-admin,e2e-admin,"system:masters"
$kcm_token,system:kube-controller-manager,system:kube-controller-manager,""
$sched_token,system:kube-scheduler,system:kube-scheduler,""
$kwok_token,kwok-controller,kwok-controller,"system:masters"
EOF
  chmod 600 "$pki/tokens.csv"

  local ports etcd_port etcd_peer_port api_port kcm_port sched_port kwok_port
  read -r -a ports <<<"$(_cl_free_ports 6)" || return 1
  (( ${#ports[@]} == 6 )) || { _cl_log "ERROR: could not pick free ports"; return 1; }
  etcd_port=${ports[0]} etcd_peer_port=${ports[1]} api_port=${ports[2]}
  kcm_port=${ports[3]} sched_port=${ports[4]} kwok_port=${ports[5]}
  local url="https://127.0.0.1:$api_port"

  _cl_kubeconfig "$w/kubeconfig" "$url" "$pki/ca.crt" "$admin_token" e2e-admin
  _cl_kubeconfig "$w/kcm.kubeconfig" "$url" "$pki/ca.crt" "$kcm_token" system:kube-controller-manager
  _cl_kubeconfig "$w/scheduler.kubeconfig" "$url" "$pki/ca.crt" "$sched_token" system:kube-scheduler
  _cl_kubeconfig "$w/kwok.kubeconfig" "$url" "$pki/ca.crt" "$kwok_token" kwok-controller

  # ---- etcd --------------------------------------------------------------
  _cl_start "$w" etcd "$bin/etcd" \
    --name=e2e \
    --data-dir="$w/etcd-data" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" \
    --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster="e2e=http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster-state=new \
    --unsafe-no-fsync=true \
    --log-level=warn
  _cl_wait "$w" "etcd healthy on 127.0.0.1:$etcd_port" "$timeout" etcd \
    curl -fsS "http://127.0.0.1:$etcd_port/health" || return 1

  # ---- kube-apiserver ----------------------------------------------------
  # shellcheck disable=SC2086
  _cl_start "$w" kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 \
    --secure-port="$api_port" \
    --cert-dir="$pki/apiserver-generated" \
    --tls-cert-file="$pki/apiserver.crt" \
    --tls-private-key-file="$pki/apiserver.key" \
    --token-auth-file="$pki/tokens.csv" \
    --authorization-mode=Node,RBAC \
    --endpoint-reconciler-type=none \
    --service-cluster-ip-range=10.0.0.0/24 \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" \
    --allow-privileged=true \
    ${CLUSTER_KUBE_ARGS_APISERVER:-}
  _cl_wait "$w" "kube-apiserver /readyz on $url" "$timeout" kube-apiserver \
    curl -fsS --cacert "$pki/ca.crt" -H "Authorization: Bearer $admin_token" "$url/readyz" || return 1

  # ---- kube-controller-manager ------------------------------------------
  # shellcheck disable=SC2086
  _cl_start "$w" kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig="$w/kcm.kubeconfig" \
    --authentication-kubeconfig="$w/kcm.kubeconfig" \
    --authorization-kubeconfig="$w/kcm.kubeconfig" \
    --bind-address=127.0.0.1 \
    --secure-port="$kcm_port" \
    --cert-dir="$pki/kcm-generated" \
    --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$pki/sa.key" \
    --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" \
    --cluster-signing-key-file="$pki/ca.key" \
    ${CLUSTER_KUBE_ARGS_KCM:-}

  # ---- kube-scheduler ----------------------------------------------------
  # shellcheck disable=SC2086
  _cl_start "$w" kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig="$w/scheduler.kubeconfig" \
    --authentication-kubeconfig="$w/scheduler.kubeconfig" \
    --authorization-kubeconfig="$w/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 \
    --secure-port="$sched_port" \
    --cert-dir="$pki/scheduler-generated" \
    --leader-elect=false \
    ${CLUSTER_KUBE_ARGS_SCHEDULER:-}

  # ---- kwok --------------------------------------------------------------
  # The stage set is the "fast" one kwokctl uses by default (see kwok-stages/).
  local stages="$w/kwok-stages.yaml" f first=1
  local stage_files=("$_cluster_here"/kwok-stages/*.yaml)
  if [[ -n "${CLUSTER_KWOK_STAGES_EXTRA:-}" ]]; then
    compgen -G "$CLUSTER_KWOK_STAGES_EXTRA/*.yaml" >/dev/null \
      || { _cl_log "ERROR: CLUSTER_KWOK_STAGES_EXTRA=$CLUSTER_KWOK_STAGES_EXTRA holds no *.yaml"; return 1; }
    stage_files+=("$CLUSTER_KWOK_STAGES_EXTRA"/*.yaml)
  fi
  : >"$stages"
  for f in "${stage_files[@]}"; do
    (( first )) || echo "---" >>"$stages"
    first=0
    cat "$f" >>"$stages"
  done
  mkdir -p "$w/kwok-home"
  # KWOK_WORKDIR keeps kwok from also loading ~/.kwok/kwok.yaml of the machine.
  # shellcheck disable=SC2086
  _cl_start "$w" kwok env KWOK_WORKDIR="$w/kwok-home" "$bin/kwok" \
    --kubeconfig="$w/kwok.kubeconfig" \
    --config="$stages" \
    --manage-all-nodes=true \
    --node-ip=127.0.0.1 \
    --node-port="$kwok_port" \
    --server-address="127.0.0.1:$kwok_port" \
    --cidr=10.244.0.1/16 \
    --node-lease-duration-seconds=40 \
    ${CLUSTER_KUBE_ARGS_KWOK:-}

  local kubectl=("$bin/kubectl" --kubeconfig="$w/kubeconfig" --request-timeout=10s)

  _cl_wait "$w" "kube-controller-manager /healthz" "$timeout" kube-controller-manager \
    curl -fsSk "https://127.0.0.1:$kcm_port/healthz" || return 1
  _cl_wait "$w" "kube-scheduler /healthz" "$timeout" kube-scheduler \
    curl -fsSk "https://127.0.0.1:$sched_port/healthz" || return 1
  _cl_wait "$w" "ServiceAccount default/default" "$timeout" kube-controller-manager \
    "${kubectl[@]}" get serviceaccount default -n default || return 1

  # ---- fake nodes --------------------------------------------------------
  local i
  {
    for ((i = 0; i < nodes; i++)); do
      cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: kwok-node-$i
    kubernetes.io/role: agent
    node-role.kubernetes.io/agent: ""
spec: {}
status:
  allocatable:
    cpu: "64"
    memory: 256Gi
    pods: "$node_pods"
  capacity:
    cpu: "64"
    memory: 256Gi
    pods: "$node_pods"
  nodeInfo:
    architecture: amd64
    operatingSystem: linux
    kubeletVersion: fake
    kubeProxyVersion: fake
EOF
    done
  } >"$w/nodes.yaml"
  if (( nodes > 0 )); then
    "${kubectl[@]}" apply -f "$w/nodes.yaml" >&2 || { _cl_log "ERROR: creating nodes failed"; return 1; }
    _cl_wait "$w" "$nodes node(s) Ready" "$timeout" kwok \
      _cl_nodes_ready "${kubectl[@]}" -- "$nodes" || return 1
    _cl_wait "$w" "node.kubernetes.io/not-ready taints removed" "$timeout" kube-controller-manager \
      _cl_nodes_untainted "${kubectl[@]}" || return 1
  fi

  cat >"$w/env" <<EOF
# generated by tests/e2e/cluster.sh up; source it
export KUBECONFIG='$w/kubeconfig'
export APISERVER_URL='$url'
export CLUSTER_CA_FILE='$pki/ca.crt'
export CLUSTER_CA_KEY_FILE='$pki/ca.key'
export CLUSTER_ADMIN_TOKEN='$admin_token'
export CLUSTER_WORKDIR='$w'
export E2E_BIN='$bin'
export ETCD_PORT=$etcd_port
export APISERVER_PORT=$api_port
export KCM_PORT=$kcm_port
export SCHEDULER_PORT=$sched_port
export KWOK_PORT=$kwok_port
export ETCD_PID=$(_cl_pid_of etcd "$w")
export APISERVER_PID=$(_cl_pid_of kube-apiserver "$w")
export KCM_PID=$(_cl_pid_of kube-controller-manager "$w")
export SCHEDULER_PID=$(_cl_pid_of kube-scheduler "$w")
export KWOK_PID=$(_cl_pid_of kwok "$w")
export PATH='$bin':"\$PATH"
EOF
  _cl_log "cluster up in $((SECONDS - t_start))s: $url (KUBECONFIG=$w/kubeconfig; source $w/env)"
)

# Helpers for the node waits (run inside _cl_wait).
_cl_nodes_ready() {
  local args=() n
  while [[ "$1" != "--" ]]; do args+=("$1"); shift; done
  shift; n="$1"
  local ready
  ready="$("${args[@]}" get nodes -o jsonpath='{range .items[*]}{range .status.conditions[?(@.type=="Ready")]}{.status}{"\n"}{end}{end}' | grep -c '^True$')" || true
  [[ "${ready:-0}" -ge "$n" ]]
}
_cl_nodes_untainted() {
  ! "$@" get nodes -o jsonpath='{range .items[*]}{.spec.taints[*].key}{"\n"}{end}' | grep -q 'node.kubernetes.io/not-ready'
}

# cluster_issue_serving_cert WORKDIR NAME: signs a serving certificate for
# 127.0.0.1/localhost with the cluster CA (e.g. for a webhook registered with
# clientConfig.url https://127.0.0.1:PORT/... and caBundle = base64 of
# $CLUSTER_CA_FILE). Writes WORKDIR/pki/NAME.crt and NAME.key and prints both paths.
cluster_issue_serving_cert() (
  set -uo pipefail
  local w="${1:?usage: cluster_issue_serving_cert WORKDIR NAME}" name="${2:?NAME}"
  local pki="$w/pki"
  [[ -s "$pki/ca.key" ]] || { _cl_log "ERROR: no CA in $pki (run up first)"; return 1; }
  openssl req -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -out "$pki/$name.csr" \
    -subj "/CN=$name" 2>/dev/null || return 1
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost" >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -out "$pki/$name.crt" -days 30 -extfile "$pki/$name.ext" 2>/dev/null || return 1
  chmod 600 "$pki/$name.key"
  echo "$pki/$name.crt $pki/$name.key"
)

cluster_down() {
  local w="${1:?usage: cluster_down WORKDIR}"
  [[ -f "$w/pids" ]] || return 0
  w="$(cd "$w" && pwd)" || return 0
  local name pid pids=() names=()
  # Stop in reverse start order: kwok, scheduler, kcm, apiserver, etcd.
  while read -r name pid; do
    [[ -n "${pid:-}" ]] || continue
    names=("$name" "${names[@]}"); pids=("$pid" "${pids[@]}")
  done <"$w/pids"
  local i
  for i in "${!pids[@]}"; do
    pid="${pids[$i]}"
    # Only signal the process we started: its command line must mention WORKDIR.
    if _cl_alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$w"; then
      kill -TERM "$pid" 2>/dev/null || true
      local t=0
      while _cl_alive "$pid" && (( t < 100 )); do sleep 0.1; t=$((t + 1)); done
      if _cl_alive "$pid"; then
        _cl_log "${names[$i]} (pid $pid) did not stop after 10s; sending KILL"
        kill -KILL "$pid" 2>/dev/null || true
      fi
      [[ -n "${CLUSTER_DEBUG:-}" ]] && _cl_log "stopped ${names[$i]} (pid $pid) after $((t / 10)).$((t % 10))s"
    fi
  done
  mv -f "$w/pids" "$w/pids.stopped" 2>/dev/null || true
  _cl_log "down: stopped ${#pids[@]} process(es) of $w"
  return 0
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  case "${1:-}" in
    up) shift; cluster_up "$@" ;;
    down) shift; cluster_down "$@" ;;
    issue-serving-cert) shift; cluster_issue_serving_cert "$@" ;;
    *) echo "usage: $0 up WORKDIR [NODES] | down WORKDIR | issue-serving-cert WORKDIR NAME" >&2; exit 2 ;;
  esac
fi
