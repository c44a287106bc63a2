#!/usr/bin/env bash
# Issue 20's scaling figure: single-key SET and GET against 1, 2, 4 and 8 unreplicated
# cluster nodes (`--replicas 1`; one node is a plain `keel serve`), each node pinned to a core
# of its own, with `redis-benchmark --cluster` (it routes every key to its slot's node, as a
# cluster client does) pinned to other cores. Prints CSV: nodes, test, pipeline, requests
# per second, and the nodes' CPU µs per request (from /proc, all nodes together).
#
#   benchmarks/scaling.sh [nodes list, default "1 2 4 8"] > scaling.csv
#
# KEEL_BIN and BENCH_BIN pick the programs (a .sweep-pack has both); node i runs on core
# NODE_CPUS_FIRST + i (default 0), up to NODE_CPUS_LAST (default 7); CLIENT_CPUS (default 8-15) and BENCH_THREADS
# (default 8) place the client; N1 and N16 are the requests per run at -P 1 and -P 16.
# Needs as many cores as nodes plus the client's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../crates/keel-server/scripts/lib.sh
source "$root/crates/keel-server/scripts/lib.sh"
nodes_list=${1:-"1 2 4 8"}
keel=${KEEL_BIN:-$root/target/release/keel}
bench=${BENCH_BIN:-$(command -v redis-benchmark)}
read -r -a cpus <<< "$(seq -s ' ' "${NODE_CPUS_FIRST:-0}" "${NODE_CPUS_LAST:-7}")"
client_cpus=${CLIENT_CPUS:-8-15}
threads=${BENCH_THREADS:-8}
n1=${N1:-1000000}
n16=${N16:-4000000}
base=7701
work=$(mktemp -d /tmp/keel-scaling.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# Seconds of CPU all the nodes in "${pids[@]}" have used.
nodes_cpu_s() { for pid in "${pids[@]}"; do cpu_s "$pid"; done | awk '{ t += $1 } END { print t }'; }

echo "nodes,test,pipeline,rps,cpu_us_per_request"
for n in $nodes_list; do
  [ "$n" -le "${#cpus[@]}" ] || { echo "$n nodes need $n cores from NODE_CPUS_FIRST to NODE_CPUS_LAST" >&2; exit 1; }
  per=$((16384 / n)); config=()
  for i in $(seq 0 $((n - 1))); do
    end=$(( i == n - 1 ? 16383 : (i + 1) * per - 1 ))
    config+=(--cluster-node "n$((i + 1)),127.0.0.1:$((base + i)),$((i * per))-$end")
  done
  pids=()
  for i in $(seq 0 $((n - 1))); do
    args=(serve --port $((base + i)) --dir "$work/n$n-$i" --durability none)
    [ "$n" -gt 1 ] && args+=(--replicas 1 --cluster-myself "n$((i + 1))" "${config[@]}")
    taskset -c "${cpus[$i]}" "$keel" "${args[@]}" >/dev/null 2>"$work/n$n-$i.log" &
    pids+=($!)
  done
  for i in $(seq 0 $((n - 1))); do port=$((base + i)) wait_port; done
  cluster=(); [ "$n" -gt 1 ] && cluster=(--cluster)
  for p in 1 16; do
    reqs=$n1; [ $p = 16 ] && reqs=$n16
    for t in set get; do
      c0=$(nodes_cpu_s)
      rps=$(taskset -c "$client_cpus" "$bench" "${cluster[@]}" -p $base -t $t -c 128 -n "$reqs" \
        -r 1000000 -P $p --threads "$threads" --csv -q | tail -n 1 | cut -d, -f2 | tr -d '"')
      c1=$(nodes_cpu_s)
      echo "$n,$t,$p,$rps,$(awk -v a="$c0" -v b="$c1" -v r="$reqs" 'BEGIN { printf "%.2f", (b - a) * 1e6 / r }')"
    done
  done
  kill -TERM "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
done
