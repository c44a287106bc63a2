#!/usr/bin/env bash
# keel serve under each lane mode (--poller off|on) beside redis-server and, if present,
# valkey-server, interleaved (the order rotates each round, every server starts fresh per
# pipeline depth): requests per second and the server's CPU time per request (from
# /proc/PID/stat) for SET, GET, INCR and MSET (TESTS picks others: a comma-separated
# redis-benchmark -t list, e.g. TESTS=lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,zpopmin,
# lrange_100,lrange_300,lrange_500,lrange_600 for the data types), -c 50, at -P 1 and -P 16.
# This is the measurement behind the lane design (ARCHITECTURE.md, "Server threads").
#
#   crates/keel-server/scripts/lanes.sh [rounds] [requests -P 1] [requests -P 16] > lanes.csv
#
# KEEL_BIN (default target/release/keel), REDIS_BIN, VALKEY_BIN and BENCH_BIN pick the
# programs (a .sweep-pack from ../shared/tools/pack-for-sweep.sh has them all); MODES picks
# the servers (default "off on redis valkey"; valkey is skipped if it is not found);
# DURABILITY is keel's (async:1000, paired with appendfsync everysec; sync with always).
# SERVER_CPUS and CLIENT_CPUS (taskset lists, e.g. 0-7 and 8-15) pin the server and
# redis-benchmark apart, with THREADS server threads (keel --threads, valkey --io-threads)
# and BENCH_THREADS client threads. Unset, nothing is pinned: on 2 cores the client shares
# the server's cores.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
rounds=${1:-3}
n1=${2:-200000}
n16=${3:-1000000}
keel=${KEEL_BIN:-target/release/keel}
redis=${REDIS_BIN:-$(command -v redis-server || true)}
valkey=${VALKEY_BIN:-$(command -v valkey-server || true)}
bench=${BENCH_BIN:-$(command -v redis-benchmark)}
dur=${DURABILITY:-async:1000}
tests=${TESTS:-set,get,incr,mset}
modes=${MODES:-"off on redis valkey"}
[ -n "$valkey" ] || modes=${modes//valkey/}
fsync=everysec
[ "$dur" = sync ] && fsync=always
pin_server=(); pin_client=()
[ -n "${SERVER_CPUS:-}" ] && pin_server=(taskset -c "$SERVER_CPUS")
[ -n "${CLIENT_CPUS:-}" ] && pin_client=(taskset -c "$CLIENT_CPUS")
keel_threads=(); valkey_threads=(); bench_threads=()
[ -n "${THREADS:-}" ] && keel_threads=(--threads "$THREADS") && valkey_threads=(--io-threads "$THREADS")
[ -n "${BENCH_THREADS:-}" ] && bench_threads=(--threads "$BENCH_THREADS")
work=$(mktemp -d /tmp/keel-lanes.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=16393

start() { # mode
  rm -rf "$work/d"; mkdir -p "$work/d"
  case $1 in
    redis) "${pin_server[@]}" "$redis" --port $port --dir "$work/d" --save '' \
      --appendonly yes --appendfsync $fsync --daemonize no >/dev/null 2>&1 & ;;
    valkey) "${pin_server[@]}" "$valkey" --port $port --dir "$work/d" --save '' \
      --appendonly yes --appendfsync $fsync --daemonize no "${valkey_threads[@]}" \
      >/dev/null 2>&1 & ;;
    *) "${pin_server[@]}" "$keel" serve --port $port --dir "$work/d" --durability "$dur" \
      --poller "$1" "${keel_threads[@]}" >/dev/null 2>&1 & ;;
  esac
  pid=$!
  wait_port
  kill -0 $pid 2>/dev/null || { echo "$1 exited at start (port $port taken?)" >&2; exit 1; }
}

echo "round,server,pipeline,test,rps,cpu_us_per_request"
read -r -a all <<< "$modes"
for round in $(seq "$rounds"); do
  k=$(( (round - 1) % ${#all[@]} ))
  for mode in "${all[@]:k}" "${all[@]:0:k}"; do
    for p in 1 16; do
      n=$n1; [ $p = 16 ] && n=$n16
      start "$mode"
      for t in ${tests//,/ }; do
        c0=$(cpu_s $pid)
        rps=$("${pin_client[@]}" "$bench" -p $port -t $t -c 50 -n "$n" -r 1000000 -P $p \
          "${bench_threads[@]}" --csv -q | tail -n 1 | cut -d, -f2 | tr -d '"')
        c1=$(cpu_s $pid)
        echo "$round,$mode,$p,$t,$rps,$(awk -v a="$c0" -v b="$c1" -v n="$n" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }')"
      done
      kill -TERM $pid; wait $pid || true
    done
  done
done
