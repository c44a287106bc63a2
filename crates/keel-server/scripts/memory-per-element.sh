#!/usr/bin/env bash
# Memory per element of Redis' collection types, keel against redis-server (issue 21): each
# server starts fresh, its resident memory (VmRSS) is read, a data set is loaded through
# `redis-cli --pipe`, and after a settle the growth is divided by the elements loaded.
#
#   crates/keel-server/scripts/memory-per-element.sh [N] > memory.csv
#
# Data sets (N defaults to 1000000): `hash` N hashes of 10 fields (10-byte values), `zset` one
# sorted set of N members, `list` N lists of 5 elements, `longlist` one list of N elements,
# `set` N sets of 5 members, `string` N strings (the baseline).
# KEEL_BIN (default target/release/keel) and REDIS_BIN pick the servers; SETS picks data sets.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
n=${1:-1000000}
keel=${KEEL_BIN:-target/release/keel}
redis=${REDIS_BIN:-$(command -v redis-server)}
sets=${SETS:-string hash zset list set}
work=$(mktemp -d /tmp/keel-mem.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=16395

# The data set as RESP commands on stdout, and its element count on fd 3.
generate() {
  python3 - "$1" "$n" <<'PY'
import os, sys
kind, n = sys.argv[1], int(sys.argv[2])
out = sys.stdout.buffer
def cmd(*args):
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    out.write(b"".join(parts))
if kind == "string":
    for i in range(n):
        cmd("SET", f"key:{i:010d}", "v" * 10)
    elements = n
elif kind == "hash":
    for i in range(n):
        args = ["HSET", f"hash:{i:010d}"]
        for f in range(10):
            args += [f"field{f}", "v" * 10]
        cmd(*args)
    elements = 10 * n
elif kind == "zset":
    for start in range(0, n, 1000):
        args = ["ZADD", "leaderboard"]
        for i in range(start, min(n, start + 1000)):
            args += [str(i * 7 % 1000003), f"member:{i:010d}"]
        cmd(*args)
    elements = n
elif kind == "list":
    for i in range(n):
        cmd("RPUSH", f"list:{i:010d}", *["v" * 10] * 5)
    elements = 5 * n
elif kind == "longlist":
    for start in range(0, n, 1000):
        cmd("RPUSH", "queue", *["v" * 10] * (min(n, start + 1000) - start))
    elements = n
elif kind == "set":
    for i in range(n):
        cmd("SADD", f"set:{i:010d}", *[f"member:{j}" for j in range(5)])
    elements = 5 * n
os.write(3, b"%d\n" % elements)
PY
}

echo "set,server,elements,rss_growth_bytes,bytes_per_element"
for set in $sets; do
  for server in keel redis; do
    rm -rf "$work/d"; mkdir -p "$work/d"
    case $server in
      keel) "$keel" serve --port $port --dir "$work/d" --durability none >/dev/null 2>&1 & ;;
      redis) "$redis" --port $port --dir "$work/d" --save '' --appendonly no \
        --daemonize no >/dev/null 2>&1 & ;;
    esac
    pid=$!
    wait_port
    before=$(rss_kib $pid)
    elements=$( { generate "$set" | redis-cli -p $port --pipe >/dev/null; } 3>&1 )
    sleep 2
    after=$(rss_kib $pid)
    growth=$(( (after - before) * 1024 ))
    echo "$set,$server,$elements,$growth,$(awk -v g=$growth -v e="$elements" 'BEGIN { printf "%.1f", g / e }')"
    kill -TERM $pid; wait $pid || true
  done
done
