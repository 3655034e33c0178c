#!/usr/bin/env bash
# Server benchmarks (issue 5): churn-throttler side by side with (a) the bare axum+rustls
# baseline of the same stack and (b) Go peer webhooks (agnhost's, from Kubernetes' own
# e2e tests, and bench/peer-go, a stand-in with k8slimiter's rate rule), in one run, on
# 127.0.0.1 only.
# Builds everything, starts the servers, runs the same load against each (fixed rates, then
# maximum throughput), measures RSS after 100,000 distinct limiter buckets, prints a table
# with ratios, and stops every server it started. Figures: docs/BENCHMARKS.md.
#
#   bench/run.sh                         # about 6 minutes
#   SECONDS_PER_RUN=5 ROUNDS=1 bench/run.sh   # quicker, noisier
#   RT=1 bench/run.sh                    # fixed rates under SCHED_FIFO (root; see below)
#   RATES= MEMORY=0 ROUNDS=5 SERVERS="baseline churn-throttler churn-throttler-throttled" \
#     bench/run.sh                       # the throttled path against the allow path and bare
#
# Environment: CARGO_TARGET_DIR (default ./target), SECONDS_PER_RUN (10), RATES
# ("500 1000 2000"), CONCURRENCY (closed-loop workers, 32), PROTOS ("h2"; "h1 h2" for both),
# ROUNDS (closed-loop repetitions, 2), BUCKETS (100000), PORT_BASE (18440), SKIP_BUILD=1,
# SERVERS (the servers loaded, in this order; default all six; the Go peers are built only
# when listed), RATES= (empty: no fixed-rate phase), MEMORY=0 (no memory phase),
# CT_BIN (the churn-throttler binary to run, default the one built; a saved build of an
# older commit measures "before" with the same script),
# KEEP_WORK=1 (keep the temporary folder with logs and raw results), NICE, RT (below),
# OUT=dir (write the raw results there as bench-results.txt, the printed tables as
# bench-tables.md, and the plots bench-latency.svg and bench-throughput.svg, made by
# examples/bench_plot.rs; `OUT=docs bench/run.sh` refreshes docs/BENCHMARKS.md's figures).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
seconds=${SECONDS_PER_RUN:-10}
rates=${RATES-"500 1000 2000"}
concurrency=${CONCURRENCY:-32}
protos=${PROTOS:-h2}
rounds=${ROUNDS:-2}
buckets=${BUCKETS:-100000}
port=${PORT_BASE:-18440}
bin=$CARGO_TARGET_DIR/release
ct_bin=${CT_BIN:-$bin/churn-throttler}
all_servers="baseline churn-throttler peer-agnhost peer-go churn-throttler-throttled peer-go-throttled"
servers=${SERVERS:-$all_servers}
memory=${MEMORY:-1}
listed() { [[ " $servers " == *" $1 "* ]]; }
# NICE=-10 runs every server and the load generator at that priority (root only), so that
# other work on a shared machine takes less of their CPU; the default leaves priorities alone.
nice=""
[ -n "${NICE:-}" ] && nice="nice -n $NICE"
# RT=1 runs the fixed-rate phases (only those: they use a small part of a core) with every
# server and the load generator under SCHED_FIFO, so the latency measured is the code's
# and not the time spent waiting for a CPU behind other work on a shared machine. The
# kernel still keeps 5% of each second for everything else; the maximum-throughput and
# memory phases always run at normal priority.
rt=${RT:-0}
lg_prefix=""
realtime() { # on|off
  local pid
  for pid in "${pids[@]}"; do
    if [ "$1" = on ]; then chrt -a -f -p 50 "$pid"; else chrt -a -o -p 0 "$pid"; fi
  done
  if [ "$1" = on ]; then lg_prefix="chrt -f 50"; else lg_prefix=""; fi
}

work=$(mktemp -d /tmp/churn-bench.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "${KEEP_WORK:-0}" = 1 ]; then echo "bench: logs and raw results kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
say() { echo "bench: $*" >&2; }

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  say "building (release): churn-throttler, examples loadgen and baseline_webhook"
  cargo build --release --locked --bin churn-throttler --example loadgen --example baseline_webhook --example bench_plot
fi
if listed peer-go || listed peer-go-throttled; then
say "building the Go peer (bench/peer-go)"
(cd bench/peer-go && go build -o "$work/peer-go" .)
fi
# agnhost's webhook package, unmodified, from the module proxy at the control plane's
# version; serve_loopback.go is added to it (an overlay may not touch the module cache, so
# the build runs on a vendored copy) to listen on 127.0.0.1 instead of every interface.
if listed peer-agnhost; then
say "building the real Go peer (bench/peer-agnhost: k8s.io/kubernetes/test/images/agnhost/webhook)"
agn_src=$work/peer-agnhost-src
mkdir -p "$agn_src"
cp bench/peer-agnhost/go.mod bench/peer-agnhost/go.sum bench/peer-agnhost/main.go "$agn_src/"
(cd "$agn_src" && go mod vendor)
agn_pkg=$agn_src/vendor/k8s.io/kubernetes/test/images/agnhost/webhook
[ -f "$agn_pkg/pods.go" ] || { say "go mod vendor did not bring agnhost's webhook package to $agn_pkg"; exit 1; }
printf '{"Replace":{"%s/serve_loopback.go":"%s/bench/peer-agnhost/overlay/serve_loopback.go"}}\n' "$agn_pkg" "$root" >"$agn_src/overlay.json"
(cd "$agn_src" && go build -mod=vendor -overlay overlay.json -o "$work/peer-agnhost" .)
fi

say "certificates (certs/gen-certs.sh, ECDSA P-256, one pair for every server)"
bash certs/gen-certs.sh -o "$work/certs" --dns localhost --ip 127.0.0.1 >"$work/certs.log" 2>&1
ca=$work/certs/ca.crt crt=$work/certs/tls.crt key=$work/certs/tls.key

# Rules for the recorded controller requests. "allow": limits far above the offered load,
# so every request is matched, charged to its buckets and allowed (the path a healthy
# cluster takes). "throttle": 20 per 10 s, retry-after without maxHold, so past the first
# 20 every request is answered at once with 429 and retryAfterSeconds.
policy() { # $1 = limit line(s) for creates, $2 = for deletes, $3 = maxBuckets
  cat <<EOF
timeoutSeconds: 10
maxBuckets: $3
rules:
  - name: controller-creates
    match:
      resources: [pods]
      operations: [CREATE]
      controllerKinds: [ReplicaSet, StatefulSet, Job]
    limits: $1
    action: retry-after
  - name: controller-deletes
    match:
      resources: [pods]
      operations: [DELETE]
      users: [system:serviceaccount:kube-system:replicaset-controller]
    limits: $2
    action: retry-after
exempt:
  namespaces: [kube-system]
EOF
}
big='[{ events: 1000000, window: 10s, scope: global }, { events: 1000000, window: 10s, scope: namespace }]'
policy "$big" "$big" 100000 >"$work/allow.yaml"
small='[{ events: 20, window: 10s, scope: global }]'
policy "$small" "$small" 100000 >"$work/throttle.yaml"
ns='[{ events: 1000, window: 10m, scope: namespace }]'
policy "$ns" "$ns" $((buckets + 1000)) >"$work/buckets.yaml"
glob='[{ events: 1000000, window: 10m, scope: global }]'
policy "$glob" "$glob" $((buckets + 1000)) >"$work/global.yaml"
for p in allow throttle buckets global; do "$ct_bin" check-config "$work/$p.yaml" >/dev/null; done

declare -A url metrics_port pid_of
wait_port() { # port
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  say "nothing listens on 127.0.0.1:$1; logs in $work"; exit 1
}
start() { # name port command...
  local name=$1 p=$2; shift 2
  $nice "$@" >"$work/$name.log" 2>&1 &
  pids+=($!); pid_of[$name]=$!
  url[$name]=https://127.0.0.1:$p/validate
  wait_port "$p"
}
start_ct() { # name port policy
  metrics_port[$1]=$(($2 + 100))
  start "$1" "$2" env RUST_LOG=warn "$ct_bin" serve --config "$work/$3.yaml" \
    --tls-cert "$crt" --tls-key "$key" --listen "127.0.0.1:$2" \
    --metrics-listen "127.0.0.1:${metrics_port[$1]}" --releaser=false --shutdown-delay 0s
}
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
hwm_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status"; }

for s in $servers; do
  case $s in
    baseline) start baseline $((port + 1)) "$bin/examples/baseline_webhook" --tls-cert "$crt" --tls-key "$key" --listen "127.0.0.1:$((port + 1))" ;;
    churn-throttler) start_ct churn-throttler $((port + 2)) allow ;;
    churn-throttler-throttled) start_ct churn-throttler-throttled $((port + 3)) throttle ;;
    peer-go) start peer-go $((port + 4)) "$work/peer-go" --listen "127.0.0.1:$((port + 4))" --tls-cert "$crt" --tls-key "$key" --rate 1e12 --burst 1000000000 ;;
    peer-go-throttled) start peer-go-throttled $((port + 5)) "$work/peer-go" --listen "127.0.0.1:$((port + 5))" --tls-cert "$crt" --tls-key "$key" --rate 2 --burst 20 ;;
    peer-agnhost)
      start peer-agnhost $((port + 8)) "$work/peer-agnhost" --listen "127.0.0.1:$((port + 8))" --tls-cert "$crt" --tls-key "$key"
      url[peer-agnhost]=https://127.0.0.1:$((port + 8))/pods ;; # agnhost's pod validator
    *) say "unknown server $s (SERVERS takes: $all_servers)"; exit 1 ;;
  esac
done

fixtures=(--fixture tests/fixtures/pod-create-replicaset.json --fixture tests/fixtures/pod-create-statefulset.json --fixture tests/fixtures/pod-delete-running.json)
results=$work/results.txt
: >"$results"
# CPU time (user + system, clock ticks) a process has used: CPU per request is the figure
# that the other load on a shared machine disturbs least.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# A run whose loadgen fails is never dropped silently: exit 2 (requests failed) keeps its
# row, whose errors column counts them; any other exit or no row is a crash. Either is
# listed at the end and the script exits 1, after the tables.
failed_runs=()
lg() { # server proto label-suffix loadgen-args...
  local server=$1 proto=$2 suffix=$3; shift 3
  local before line rc=0
  before=$(cpu_ticks "${pid_of[$server]}")
  line=$($nice $lg_prefix "$bin/examples/loadgen" --url "${url[$server]}" --ca "$ca" --server-name localhost \
    --proto "$proto" "${fixtures[@]}" --label "$server" "$@" 2>>"$work/loadgen.log") || rc=$?
  if [[ $rc != 0 || "$line" != *" mode="* ]]; then
    local kept="no row"; [[ -n "$line" ]] && kept="row kept"
    failed_runs+=("$server $proto $suffix $* (loadgen exit $rc, $kept)")
    say "FAILED: loadgen against $server ($proto $suffix $*) exited $rc; $(tail -n 2 "$work/loadgen.log" | tr '\n' ' ')"
  fi
  [[ -n "$line" ]] || return 0
  echo "$line server_cpu_ticks=$(($(cpu_ticks "${pid_of[$server]}") - before)) clk_tck=$(getconf CLK_TCK) $suffix" | tee -a "$results" >&2
}

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
say "machine: $(nproc) cores, nice ${NICE:-0}, RT=$rt, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $load_start"
for proto in $protos; do
  [ "$rt" = 1 ] && realtime on
  for rate in $rates; do
    say "open loop, $proto, $rate req/s for ${seconds}s each (after 1s warm-up)"
    for s in $servers; do
      lg "$s" "$proto" "" --rate "$rate" --seconds "$seconds" --concurrency "$concurrency"
    done
  done
  [ "$rt" = 1 ] && realtime off
  for round in $(seq 1 "$rounds"); do
    say "closed loop, $proto, $concurrency workers, round $round of $rounds"
    order=$servers
    [ $((round % 2)) = 0 ] && order=$(echo "$servers" | tr ' ' '\n' | tac | tr '\n' ' ')
    for s in $order; do
      lg "$s" "$proto" "round=$round" --rate 0 --seconds "$seconds" --concurrency "$concurrency"
    done
  done
done

rss_lines=()
for s in baseline churn-throttler peer-agnhost peer-go; do
  listed "$s" && rss_lines+=("after the runs above|$s|$(rss_kib "${pid_of[$s]}")|$(hwm_kib "${pid_of[$s]}")|")
done
offset=6
memory_policies="buckets global"
if [ "$memory" = 1 ]; then
  say "memory: $buckets distinct namespaces through scope: namespace (one bucket each) and through scope: global"
else
  memory_policies=""
fi
for policy_name in $memory_policies; do
  name=churn-throttler-$policy_name
  start_ct "$name" $((port + offset)) "$policy_name"
  offset=$((offset + 1))
  sleep 0.5
  idle=$(rss_kib "${pid_of[$name]}")
  lg "$name" h2 "phase=memory" --rate 0 --warmup 0 --seconds 300 --max-requests "$buckets" --namespaces "$buckets" --concurrency "$concurrency"
  sleep 2.5 # the sweep publishes the bucket gauge every second
  live=$(curl -s "http://127.0.0.1:${metrics_port[$name]}/metrics" | awk '/^churn_throttler_buckets / {print $2}')
  rss_lines+=("fresh, idle|$name|$idle||")
  rss_lines+=("after $buckets requests in $buckets namespaces|$name|$(rss_kib "${pid_of[$name]}")|$(hwm_kib "${pid_of[$name]}")|$live")
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

tables=$work/tables.md
python3 - "$results" "$load_start" "$load_end" "$rates" "$protos" "${rss_lines[@]}" <<'PY' | tee "$tables"
import sys, collections
path, load_start, load_end, rates, protos = sys.argv[1:6]
rss = sys.argv[6:]
rows = []
for line in open(path):
    kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
    if "mode" in kv and kv.get("phase") != "memory":
        rows.append(kv)
nan = float("nan")
def num(r, k):
    try: return float(r[k])
    except (KeyError, ValueError): return nan
def cpu_us(r):
    """Server CPU time per request over the whole run (warm-up included), microseconds."""
    done = num(r, "sent")
    return num(r, "server_cpu_ticks") / num(r, "clk_tck") * 1e6 / done if done else nan
def peer_of(label):
    return "peer-go-throttled" if label.endswith("throttled") else "peer-go"
print(f"\nload average (1, 5, 15 min): {load_start} at the start, {load_end} at the end\n")
for proto in protos.split():
    print(f"### Fixed rates, {proto} (latency from the scheduled send time, ms)\n")
    print("| rate | server | p50 | p99 | p99.9 | max | achieved/s | allowed | denied | errors | server CPU µs/req | p99 vs baseline | p99 vs agnhost |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rate in rates.split():
        rs = [r for r in rows if r["proto"] == proto and r["mode"].startswith("open@")
              and float(r["mode"].split("@")[1]) == float(rate)]
        base = next((num(r, "p99_ms") for r in rs if r["label"] == "baseline"), nan)
        agn = next((num(r, "p99_ms") for r in rs if r["label"] == "peer-agnhost"), nan)
        for r in rs:
            print(f"| {rate} | {r['label']} | {num(r,'p50_ms'):.3f} | {num(r,'p99_ms'):.3f} | {num(r,'p999_ms'):.3f} | {num(r,'max_ms'):.2f} | {num(r,'throughput'):.0f} | {r['allowed']} | {r['denied']} | {r['errors']} | {cpu_us(r):.0f} | {num(r,'p99_ms')/base:.2f}× | {num(r,'p99_ms')/agn:.2f}× |")
    print()
    closed = [r for r in rows if r["proto"] == proto and r["mode"].startswith("closed@")]
    if not closed:
        continue
    by = collections.OrderedDict()
    for r in closed:
        by.setdefault(r["label"], []).append(r)
    tp = {k: max(num(r, "throughput") for r in v) for k, v in by.items()}
    cpu = {k: min(cpu_us(r) for r in v) for k, v in by.items()}
    print(f"### Maximum throughput, {proto}, {closed[0]['mode'].split('@')[1]} workers (best of {max(len(v) for v in by.values())} rounds)\n")
    print("| server | req/s per round | best req/s | vs baseline | vs agnhost | vs peer-go | server CPU µs/req (best) | CPU vs baseline | CPU vs agnhost | CPU vs peer-go | p50 ms | p99 ms | errors |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k, v in by.items():
        b = max(v, key=lambda r: num(r, "throughput"))
        per = ", ".join(f"{num(r,'throughput'):.0f}" for r in v)
        errs = sum(int(r.get("errors", 0)) for r in v)
        peer = peer_of(k)
        print(f"| {k} | {per} | {tp[k]:.0f} | {tp[k]/tp.get('baseline', nan):.2f}× | {tp[k]/tp.get('peer-agnhost', nan):.2f}× | {tp[k]/tp.get(peer, nan):.2f}× | {cpu[k]:.0f} | {cpu[k]/cpu.get('baseline', nan):.2f}× | {cpu[k]/cpu.get('peer-agnhost', nan):.2f}× | {cpu[k]/cpu.get(peer, nan):.2f}× | {num(b,'p50_ms'):.3f} | {num(b,'p99_ms'):.3f} | {errs} |")
    print()
    # The throttled path against the allow path and bare, round by round: each round loads
    # the servers one after the other (the order reversed every other round), so ratios
    # within a round share the machine's state; the medians of those ratios are the figures.
    labels = ("baseline", "churn-throttler", "churn-throttler-throttled")
    per_round = collections.OrderedDict()
    for r in closed:
        per_round.setdefault(r.get("round", "1"), {})[r["label"]] = r
    complete = [(k, v) for k, v in per_round.items() if all(l in v for l in labels)]
    rounds = [v for _, v in complete]
    if rounds:
        def med(xs):
            xs = sorted(xs)
            n = len(xs)
            return (xs[n // 2] + xs[(n - 1) // 2]) / 2 if n else nan
        tp_of = lambda v, l: num(v[l], "throughput")
        cpu_of = lambda v, l: cpu_us(v[l])
        pairs = [("throttled / allow", "churn-throttler-throttled", "churn-throttler"),
                 ("throttled / bare", "churn-throttler-throttled", "baseline"),
                 ("allow / bare", "churn-throttler", "baseline")]
        print(f"### Throttled path against the allow path and bare, {proto}: medians of {len(rounds)} interleaved rounds\n")
        print("| round | " + " | ".join(f"{l} req/s, CPU µs/req" for l in labels) + " | " + " | ".join(f"{n}: req/s, CPU/req" for n, _, _ in pairs) + " |")
        print("| ---: |" + " ---: |" * (len(labels) + len(pairs)))
        for k, v in complete:
            cells = [f"{tp_of(v, l):.0f}, {cpu_of(v, l):.1f}" for l in labels]
            cells += [f"{tp_of(v, a)/tp_of(v, b):.3f}×, {cpu_of(v, a)/cpu_of(v, b):.3f}×" for _, a, b in pairs]
            print(f"| {k} | " + " | ".join(cells) + " |")
        cells = [f"{med([tp_of(v, l) for v in rounds]):.0f}, {med([cpu_of(v, l) for v in rounds]):.1f}" for l in labels]
        cells += [f"**{med([tp_of(v, a)/tp_of(v, b) for v in rounds]):.3f}×, {med([cpu_of(v, a)/cpu_of(v, b) for v in rounds]):.3f}×**" for _, a, b in pairs]
        print("| median | " + " | ".join(cells) + " |")
        print()
print("### Resident memory (VmRSS, MiB)\n")
print("| when | server | RSS | peak (VmHWM) | live buckets (metric) |")
print("| --- | --- | ---: | ---: | ---: |")
for line in rss:
    when, server, now, peak, live = line.split("|")
    mib = lambda k: f"{int(k)/1024:.1f}" if k else ""
    print(f"| {when} | {server} | {mib(now)} | {mib(peak)} | {live} |")
PY

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$results" "$OUT/bench-results.txt"
  cp "$tables" "$OUT/bench-tables.md"
  "$bin/examples/bench_plot" "$results" "$OUT"
  say "raw results, tables and plots written to $OUT"
fi

if (( ${#failed_runs[@]} > 0 )); then
  say "${#failed_runs[@]} load runs failed (their figures are missing or count errors):"
  for r in "${failed_runs[@]}"; do say "  $r"; done
  exit 1
fi
