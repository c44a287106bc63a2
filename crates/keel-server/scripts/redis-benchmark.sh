#!/usr/bin/env bash
# keel serve vs redis-server under redis-benchmark, like-for-like durability, in one run.
#
#   crates/keel-server/scripts/redis-benchmark.sh [requests] [sync-requests]
#
# Pairings (issue 4): keel async:1000 vs Redis appendonly yes + appendfsync everysec, and keel
# sync vs appendfsync always; each unpipelined and with -P 16. Needs redis-server and
# redis-benchmark (apt-get install redis-server) and a release build of keel
# (cargo build --release -p keel-cli). Prints one CSV line per test: server,pairing,pipeline,test,rps.
set -euo pipefail
cd "$(dirname "$0")/../../.."
n=${1:-1000000}
n_sync=${2:-200000}
keel=${KEEL_BIN:-target/release/keel}
work=$(mktemp -d /tmp/keel-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=16379

wait_port() {
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "server on $port did not start" >&2; return 1
}

bench() { # server pairing requests
  for p in 1 16; do
    redis-benchmark -p "$port" -t set,get,incr,mset -c 50 -n "$3" -r 1000000 -P "$p" --csv -q \
      | tail -n +2 | while IFS=, read -r test rps _; do
          echo "$1,$2,$p,${test//\"/},${rps//\"/}"
        done
  done
}

run_keel() { # durability pairing requests
  rm -rf "$work/keel"
  "$keel" serve --port "$port" --dir "$work/keel" --durability "$1" >/dev/null 2>&1 &
  local pid=$!
  wait_port
  bench keel "$2" "$3"
  kill -TERM $pid; wait $pid || true
}

run_redis() { # appendfsync pairing requests
  rm -rf "$work/redis"; mkdir -p "$work/redis"
  redis-server --port "$port" --dir "$work/redis" --save '' --appendonly yes \
    --appendfsync "$1" --daemonize no >/dev/null 2>&1 &
  local pid=$!
  wait_port
  bench redis "$2" "$3"
  kill -TERM $pid; wait $pid || true
}

echo "server,pairing,pipeline,test,rps"
run_keel async:1000 async "$n"
run_redis everysec async "$n"
run_keel sync sync "$n_sync"
run_redis always sync "$n_sync"
