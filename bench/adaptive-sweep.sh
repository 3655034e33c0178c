#!/usr/bin/env bash
# The adaptive network window against the fixed one in the simulator (docs/adaptive.md,
# "Measured in the simulator"): 300 pods behind both gate rules of the built-in policy
# (statefulset-creates, controller-creates) at the shipped rate, 20 per 10 s, under the
# gate and the partition action, against one FIFO CNI of C pods/s, base network time 2 s.
# Prints a Markdown table with each target checked, then the step from 10 to 1 pod/s.
# Usage: [SWEEP_BIN=path] bench/adaptive-sweep.sh [out-dir]   (exit 1 when a target is missed)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/adaptive-sweep}
mkdir -p "$out"
# SWEEP_BIN: a churn-throttler binary to use instead of building the release one (the
# simulator is deterministic: a debug build prints the same table, slower).
bin=${SWEEP_BIN:-}
if [[ -z $bin ]]; then
  cargo build --release --locked -q
  bin=target/release/churn-throttler
fi
base=2
rates="0.25 0.5 1 2 5 20 50"

# 100 StatefulSets x 2 (held by the partition rule, replacements behind
# statefulset-creates) and 20 Deployments x 5 (behind controller-creates): 300 pods.
cat >"$out/scenario.yaml" <<YAML
name: adaptive-300
statefulsets: 100
replicas: 2
namespaces: 100
deployments: 20
deploymentReplicas: 5
maxSurge: 5
maxUnavailable: 0
terminate: 10s
limit: 20/10s
maxNotReady: 200
collateral: false
actions: [gate, partition]
cniBase: ${base}s
YAML

run() { # name, extra flags...
  local name=$1
  shift
  "$bin" simulate --scenario "$out/scenario.yaml" --csv "$out/$name.csv" "$@" >"$out/$name.txt"
}

for start in 0s 20s 60s; do
  for c in $rates; do
    for a in off on; do
      run "s$start-c$c-$a" --start "$start" --cni-rate "$c/s" --adaptive "$a"
    done
  done
done
for a in off on; do
  run "step-$a" --start 0s --cni-rate "10/s,1/s@60s" --adaptive "$a"
done

# One row per run and action; targets from issue 28. A fixed-window row is shown beside
# its adaptive one but only the adaptive rows are held to the targets.
awk -v base=$base -v pods=300 -v rate=2 -v out="$out" -v rates="$rates" '
function col(name) { return idx[name] }
function load(file, key,   line, n, f, i) {
  n = 0
  while ((getline line < file) > 0) {
    split(line, f, ",")
    if (n++ == 0) { for (i in f) idx[f[i]] = i; continue }
    v[key, f[col("action")], "makespan"] = f[col("makespan_s")]
    v[key, f[col("action")], "p50"] = f[col("start_p50_s")]
    v[key, f[col("action")], "p99"] = f[col("start_p99_s")]
    v[key, f[col("action")], "queue"] = f[col("cni_queue_max")]
    v[key, f[col("action")], "settled"] = f[col("cni_queue_max_after_step")]
  }
  close(file)
}
function mark(ok) { if (!ok) missed++; return ok ? "ok" : "**missed**" }
function max(a, b) { return a > b ? a : b }
function min(a, b) { return a < b ? a : b }
BEGIN {
  nc = split(rates, cs, " ")
  split("0s 20s 60s", starts, " ")
  split("gate partition", actions, " ")
  for (s = 1; s <= 3; s++) for (i = 1; i <= nc; i++) for (w = 0; w < 2; w++) {
    mode = w ? "on" : "off"
    load(out "/s" starts[s] "-c" cs[i] "-" mode ".csv", starts[s] SUBSEP cs[i] SUBSEP mode)
  }
  print "| start | C pods/s | action | window | makespan s (target) | start p50 / p99 s (p99 target) | CNI queue max (target) | targets |"
  print "| ---: | ---: | --- | --- | ---: | ---: | ---: | --- |"
  for (s = 1; s <= 3; s++) for (i = 1; i <= nc; i++) for (a = 1; a <= 2; a++) for (w = 0; w < 2; w++) {
    c = cs[i]; st = starts[s]; act = actions[a]; mode = w ? "on" : "off"
    k = st SUBSEP c SUBSEP mode SUBSEP act
    m = v[k, "makespan"]; p50 = v[k, "p50"]; p99 = v[k, "p99"]; q = v[k, "queue"]
    if (st == "0s") {
      tm = 1.15 * (pods / min(c, rate) + base + 1 / c)
      tp = 3 * (base + 1 / c) + 0.5
      tq = max(5, 2 * c)
      verdict = "-"
      if (w) verdict = "makespan " mark(m != "" && m <= tm) ", p99 " mark(p99 <= tp) ", queue " mark(q <= tq)
      printf "| %s | %s | %s | %s | %s (%.0f) | %s / %s (%.1f) | %s (%.0f) | %s |\n", st, c, act, w ? "adaptive" : "fixed", m, tm, p50, p99, tp, q, tq, verdict
    } else {
      fixed = v[st, c, "off", act, "makespan"]
      verdict = "-"
      if (w) verdict = sprintf("makespan %.3f x fixed %s", m / fixed, mark(m != "" && m <= 1.05 * fixed))
      printf "| %s | %s | %s | %s | %s | %s / %s | %s | %s |\n", st, c, act, w ? "adaptive" : "fixed", m, p50, p99, q, verdict
    }
  }
  for (w = 0; w < 2; w++) {
    mode = w ? "on" : "off"
    load(out "/step-" mode ".csv", "step" SUBSEP mode)
  }
  print ""
  print "Step from 10 to 1 pod/s at 60 s, start 0 s: the deepest queue from 30 s after the step on (target max(5, 2 s x 1/s) = 5)"
  print ""
  print "| action | window | makespan s | start p50 / p99 s | CNI queue max | from 90 s on | target |"
  print "| --- | --- | ---: | ---: | ---: | ---: | --- |"
  for (a = 1; a <= 2; a++) for (w = 0; w < 2; w++) {
    mode = w ? "on" : "off"; act = actions[a]; k = "step" SUBSEP mode SUBSEP act
    printf "| %s | %s | %s | %s / %s | %s | %s | %s |\n", act, w ? "adaptive" : "fixed", v[k, "makespan"], v[k, "p50"], v[k, "p99"], v[k, "queue"], v[k, "settled"], w ? mark(v[k, "settled"] <= 5) : "-"
  }
  print ""
  printf "targets missed: %d\n", missed
  exit missed > 0
}'
