#!/usr/bin/env bash
# Many clients writing one hot collection (issue 21): HINCRBY of a hash's fields, ZINCRBY of
# a sorted set's members, SADD to a set, and HSET of a hash's fields, all on one key, keel
# against redis-server, interleaved (the order rotates each round; every server starts fresh
# per test and pipeline depth): requests per second, the server's CPU time per request (from
# /proc/PID/stat), and for keel the transactions it retried after a conflict
# (keel_conflict_retries in INFO).
#
#   crates/keel-server/scripts/hot-collection.sh [rounds] [requests] [members] > hot.csv
#
# `members` (default 1000) is redis-benchmark's -r: how many distinct fields or members the
# clients spread over. With fewer than 128 a keel hash starts packed (docs/types.md) and is
# spread by its first conflict. -c 50 clients, at -P 1 and -P 16. KEEL_BIN (default
# target/release/keel), REDIS_BIN and BENCH_BIN pick the programs; DURABILITY is keel's
# (async:1000, paired with Redis' appendfsync everysec; sync with always). TESTS picks the
# tests (default: hincrby zincrby sadd hset). KEEL_BEFORE_BIN adds a second keel build, as
# server "before", to compare a change in the same run.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
rounds=${1:-1}
n=${2:-200000}
members=${3:-1000}
keel=${KEEL_BIN:-target/release/keel}
redis=${REDIS_BIN:-$(command -v redis-server)}
bench=${BENCH_BIN:-$(command -v redis-benchmark)}
cli=$(command -v redis-cli)
dur=${DURABILITY:-async:1000}
fsync=everysec
[ "$dur" = sync ] && fsync=always
work=$(mktemp -d /tmp/keel-hot.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=16397

start() { # server
  rm -rf "$work/d"; mkdir -p "$work/d"
  case $1 in
    redis) "$redis" --port $port --dir "$work/d" --save '' --appendonly yes \
      --appendfsync $fsync --daemonize no >/dev/null 2>&1 & ;;
    keel) "$keel" serve --port $port --dir "$work/d" --durability "$dur" >/dev/null 2>&1 & ;;
    before) "$KEEL_BEFORE_BIN" serve --port $port --dir "$work/d" --durability "$dur" \
      >/dev/null 2>&1 & ;;
  esac
  pid=$!
  wait_port
  kill -0 $pid 2>/dev/null || { echo "$1 exited at start (port $port taken?)" >&2; exit 1; }
}

# The command each test sends; __rand_int__ is redis-benchmark's random member (below -r).
command_of() {
  case $1 in
    hincrby) echo "HINCRBY hot:h f:__rand_int__ 1" ;;
    zincrby) echo "ZINCRBY hot:z 1 m:__rand_int__" ;;
    sadd) echo "SADD hot:s m:__rand_int__" ;;
    hset) echo "HSET hot:h f:__rand_int__ v" ;;
  esac
}

# The collection's size after a test, to check that both servers did the same work.
size_of() {
  case $1 in
    hincrby | hset) "$cli" -p $port hlen hot:h ;;
    zincrby) "$cli" -p $port zcard hot:z ;;
    sadd) "$cli" -p $port scard hot:s ;;
  esac
}

echo "round,server,pipeline,test,members,rps,cpu_us_per_request,size,conflict_retries"
all=(keel redis)
[ -n "${KEEL_BEFORE_BIN:-}" ] && all=(before keel redis)
read -r -a tests <<< "${TESTS:-hincrby zincrby sadd hset}"
for round in $(seq "$rounds"); do
  k=$(( (round - 1) % ${#all[@]} ))
  for server in "${all[@]:k}" "${all[@]:0:k}"; do
    for p in 1 16; do
      for t in "${tests[@]}"; do
        start "$server"
        read -r -a cmd <<< "$(command_of $t)"
        c0=$(cpu_s $pid)
        rps=$("$bench" -p $port -c 50 -n "$n" -r "$members" -P $p --csv -q "${cmd[@]}" \
          | tail -n 1 | cut -d, -f2 | tr -d '"')
        c1=$(cpu_s $pid)
        size=$(size_of $t)
        retries=""
        [ "$server" != redis ] && retries=$("$cli" -p $port info all \
          | awk -F: '/^keel_conflict_retries:/ { print $2 }' | tr -d '\r')
        cpu=$(awk -v a="$c0" -v b="$c1" -v n="$n" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }')
        echo "$round,$server,$p,$t,$members,$rps,$cpu,$size,$retries"
        kill -TERM $pid; wait $pid || true
      done
    done
  done
done
