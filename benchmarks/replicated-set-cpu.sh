#!/usr/bin/env bash
# Server CPU per SET of three `keel serve` cluster nodes on loopback, all three processes
# counted (/proc), with `--replicas R`, while `redis-benchmark -t set -c CLIENTS` writes
# through node 1; prints requests per second and CPU µs per request. Extra arguments go to
# every `keel serve` (e.g. --durability sync, --threads 1). Run builds in alternation to
# compare them; CPU per request holds far better than requests per second on a shared
# machine.
#
#   benchmarks/replicated-set-cpu.sh target/release/keel 3 16 --durability none
#   benchmarks/replicated-set-cpu.sh target/release/keel 1 16 --durability none
set -euo pipefail
bin=$1 r=$2 clients=$3
shift 3
port=${PORT:-17201}
n=${N:-60000}
dir=$(mktemp -d /tmp/keel-repcpu.XXXXXX)
nodes=(--cluster-node "n1,127.0.0.1:$port,0-5460"
  --cluster-node "n2,127.0.0.1:$((port + 1)),5461-10921"
  --cluster-node "n3,127.0.0.1:$((port + 2)),10922-16383")
pids=()
for i in 1 2 3; do
  "$bin" serve --port $((port + i - 1)) --dir "$dir/node-$i" --replicas "$r" \
    --cluster-myself "n$i" "${nodes[@]}" "$@" >"$dir/node-$i.log" 2>&1 &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
# Every partition takes writes (its leader elected) before the measurement.
for _ in $(seq 1 200); do
  ok=0
  for p in 0 1 2; do
    redis-cli -p $((port + p)) set "warm$p" 1 2>/dev/null | grep -q OK && ok=$((ok + 1))
  done
  [ "$ok" = 3 ] && break
  sleep 0.2
done
ticks() { local t=0; for p in "${pids[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
t1=$(ticks); s=$(date +%s.%N)
redis-benchmark -p "$port" -t set -n "$n" -r 100000 -c "$clients" -q >/dev/null 2>&1
t2=$(ticks); e=$(date +%s.%N)
hz=$(getconf CLK_TCK)
echo "replicas=$r clients=$clients $*: $(echo "$n / ($e - $s)" | bc) req/s," \
  "$(( (t2 - t1) * 1000000 / hz / n )) µs server CPU per request"
