#!/usr/bin/env bash
# keel serve vs redis-server, interleaved: per round both servers start fresh, and every test
# runs on keel and then at once on Redis, so that drift in a shared machine hits both alike.
# PAIRING=async (the default): keel async:1000 vs Redis appendonly yes + appendfsync everysec;
# PAIRING=sync: keel sync vs Redis appendfsync always.
#
#   crates/keel-server/scripts/redis-benchmark-ab.sh [rounds] [requests -P 1] [requests -P 16]
#
# Needs redis-server and redis-benchmark and a release build of keel (KEEL_BIN, default
# target/release/keel; KEEL_ARGS adds flags, e.g. "--threads 1"). Prints CSV:
# round,pipeline,test,keel_rps,redis_rps,ratio.
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds=${1:-3}
n1=${2:-300000}
n16=${3:-1000000}
keel=${KEEL_BIN:-target/release/keel}
case ${PAIRING:-async} in
  async) durability=async:1000 appendfsync=everysec ;;
  sync) durability=sync appendfsync=always ;;
  *) echo "PAIRING must be async or sync, not ${PAIRING}" >&2; exit 2 ;;
esac
work=$(mktemp -d /tmp/keel-ab.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
kport=16391
rport=16392

wait_port() {
  for _ in $(seq 100); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "server on $1 did not start" >&2; return 1
}

rps() { # port test pipeline requests
  redis-benchmark -p "$1" -t "$2" -c 50 -n "$4" -r 1000000 -P "$3" --csv -q \
    | tail -n 1 | cut -d, -f2 | tr -d '"'
}

echo "round,pipeline,test,keel_rps,redis_rps,ratio"
for round in $(seq "$rounds"); do
  for p in 1 16; do
    n=$n1; [ "$p" = 16 ] && n=$n16
    rm -rf "$work/keel" "$work/redis"; mkdir -p "$work/redis"
    # shellcheck disable=SC2086 # KEEL_ARGS is a list of flags
    "$keel" serve --port $kport --dir "$work/keel" --durability "$durability" ${KEEL_ARGS:-} \
      >/dev/null 2>&1 &
    kpid=$!
    redis-server --port $rport --dir "$work/redis" --save '' --appendonly yes \
      --appendfsync "$appendfsync" --daemonize no >/dev/null 2>&1 &
    rpid=$!
    wait_port $kport; wait_port $rport
    for t in set get incr mset; do
      k=$(rps $kport $t $p "$n")
      r=$(rps $rport $t $p "$n")
      echo "$round,$p,$t,$k,$r,$(awk -v k="$k" -v r="$r" 'BEGIN { printf "%.3f", k / r }')"
    done
    kill -TERM $kpid $rpid; wait $kpid $rpid || true
  done
done
