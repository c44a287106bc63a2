#!/usr/bin/env bash
# Server CPU per pop (or any redis-benchmark test after a fill), keel's collector thread
# apart: a fresh `keel serve --poller on --durability none`, `redis-benchmark -t FILL -n N`,
# then `-t POP -n N` (both -P 16 -c 50 -r 1000000), and the CPU time the process (and its
# keel-gc thread) spent in the second, from /proc, per request.
#
#   crates/keel-server/scripts/pops.sh [keel binary] [fill] [pop] [N]
#   crates/keel-server/scripts/pops.sh target/release/keel zadd zpopmin 400000
#   crates/keel-server/scripts/pops.sh /usr/bin/redis-server zadd zpopmin 400000   # Redis, no persistence
#
# Run two binaries in alternation to compare them; CPU per request holds far better than
# requests per second on a shared machine.
set -euo pipefail
bin=${1:-target/release/keel}
fill=${2:-lpush}
pop=${3:-lpop}
n=${4:-2000000}
port=${PORT:-16420}
dir=$(mktemp -d /tmp/keel-pops.XXXXXX)
case $(basename "$bin") in
  redis-server*) "$bin" --port "$port" --dir "$dir" --save '' --appendonly no >/dev/null 2>&1 & ;;
  *) "$bin" serve --port "$port" --dir "$dir" --durability none --poller on >/dev/null 2>&1 & ;;
esac
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-benchmark -p "$port" -t "$fill" -n "$n" -r 1000000 -P 16 -c 50 -q >/dev/null 2>&1
ticks() { awk '{print $14 + $15}' "$1"; }
# The collector thread (none in Redis: then the process's main thread stands in, and the
# collector column repeats nothing useful).
gc=$( (grep -l keel-gc /proc/$server/task/*/comm 2>/dev/null || true) | head -1 | xargs -r dirname)
gc=${gc:-/proc/$server}
s1=$(ticks /proc/$server/stat); g1=$(ticks "$gc/stat")
redis-benchmark -p "$port" -t "$pop" -n "$n" -r 1000000 -P 16 -c 50 -q >/dev/null 2>&1
s2=$(ticks /proc/$server/stat); g2=$(ticks "$gc/stat")
hz=$(getconf CLK_TCK)
echo "$(basename "$bin") $pop: server $(( (s2 - s1) * 1000000000 / hz / n )) ns/op," \
  "collector $(( (g2 - g1) * 1000000000 / hz / n )) ns/op"
