#!/usr/bin/env bash
# MGET of two keys in different partitions of a replicated cluster: a read-only transaction
# across partitions. `keel cluster start 3 --replicas 3` (sync) on ports 17401-17403,
# redis-benchmark through node 1 (16 clients), then requests/s, p50 and the CPU time of the
# three node processes per request (from /proc).
#
#   benchmarks/replicated-mget.sh [keel binary] [requests]
#
# Run two binaries in alternation to compare them.
set -euo pipefail
bin=${1:-target/release/keel}
n=${2:-20000}
dir=$(mktemp -d /tmp/keel-mget.XXXXXX)
setsid "$bin" cluster start 3 --replicas 3 --port 17401 --dir "$dir" --no-restart \
  > "$dir/out.log" 2>&1 &
cluster=$!
trap 'kill -INT $cluster 2>/dev/null || true; sleep 1; pkill -f "serve.*--port 1740[123]" || true; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do
  redis-cli -p 17401 set probe 1 >/dev/null 2>&1 && redis-cli -p 17403 set probe 1 >/dev/null 2>&1 && break
  sleep 0.3
done
sleep 2
# Three partitions own the slots in thirds: a key of another third than `a`'s.
third() { echo $(( $(redis-cli -p 17401 cluster keyslot "$1") * 3 / 16384 )); }
a=a
b=$(for k in b c d e f g h i j k l m n o p; do [ "$(third $k)" != "$(third $a)" ] && echo $k && break; done)
redis-cli -p 17401 mset "$a" 1 "$b" 2 >/dev/null
pids=$(pgrep -f "serve.*--port 1740[123]")
ticks() { for p in $pids; do awk '{print $14 + $15}' "/proc/$p/stat"; done | paste -sd+ | bc; }
t0=$(ticks)
out=$(redis-benchmark -p 17401 -c 16 -n "$n" -q MGET "$a" "$b" 2>&1 | tr '\r' '\n' | tail -1)
t1=$(ticks)
hz=$(getconf CLK_TCK)
echo "$(basename "$bin"): MGET $a $b:${out#*:}; server CPU $(( (t1 - t0) * 1000000000 / hz / n )) ns per request"
