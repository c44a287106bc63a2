#!/usr/bin/env bash
# Two keel builds against each other and against redis-server, under redis-benchmark: per
# round, each of the three starts fresh and runs every test, in an order that rotates from
# round to round, so that drift in a shared machine hits all three alike. For a change that
# is worth a few percent, where one round of the same binary varies by ±15% here.
#
#   A_BIN=old/keel B_BIN=new/keel crates/keel-server/scripts/keel-ab.sh [rounds] [requests] [pipeline]
#
# TESTS (default set,get,incr,mset) picks the tests; A_ARGS / B_ARGS add keel flags. keel runs
# with async:1000 durability, Redis with appendonly yes + appendfsync everysec. Prints, per
# test, the medians of B/A, A/Redis and B/Redis and the per-round ratios.
set -euo pipefail
rounds=${1:-6}
n=${2:-300000}
pipeline=${3:-1}
tests=${TESTS:-set,get,incr,mset}
: "${A_BIN:?set A_BIN to the keel binary to compare against}"
: "${B_BIN:?set B_BIN to the keel binary to measure}"
work=$(mktemp -d /tmp/keel-ab2.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=16389

wait_port() {
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "server on $port did not start" >&2; return 1
}

run() { # kind (a, b or redis): prints one rps per test
  rm -rf "$work/data"; mkdir -p "$work/data"
  # Each server is the background job itself (not a subshell around it), so that $! is
  # the server and the kill below stops it.
  case $1 in
    # shellcheck disable=SC2086 # the *_ARGS are lists of flags
    a) "$A_BIN" serve --port $port --dir "$work/data" --durability async:1000 ${A_ARGS:-} \
      >/dev/null 2>&1 & ;;
    # shellcheck disable=SC2086
    b) "$B_BIN" serve --port $port --dir "$work/data" --durability async:1000 ${B_ARGS:-} \
      >/dev/null 2>&1 & ;;
    redis) redis-server --port $port --dir "$work/data" --save '' --appendonly yes \
      --appendfsync everysec --daemonize no >/dev/null 2>&1 & ;;
  esac
  local pid=$!
  wait_port
  # A server that could not bind exits, and the port answers for someone else.
  kill -0 $pid 2>/dev/null || { echo "$1 exited at start (port $port taken?)" >&2; exit 1; }
  redis-benchmark -p $port -t "$tests" -c 50 -n "$n" -r 1000000 -P "$pipeline" --csv -q \
    | tail -n +2 | cut -d, -f2 | tr -d '"' | tr '\n' ' '
  kill -TERM $pid; wait $pid || true
}

for round in $(seq "$rounds"); do
  case $((round % 3)) in
    0) order="a b redis" ;;
    1) order="b redis a" ;;
    2) order="redis a b" ;;
  esac
  declare -A out=()
  for kind in $order; do out[$kind]=$(run $kind); done
  echo "${out[a]}| ${out[b]}| ${out[redis]}" >> "$work/rounds"
done

python3 - "$tests" "$work/rounds" <<'PY'
import statistics as st, sys
tests = sys.argv[1].split(',')
rows = [[list(map(float, part.split())) for part in line.split('|')] for line in open(sys.argv[2])]
for i, t in enumerate(tests):
    ba = [b[i] / a[i] for a, b, r in rows]
    ar = [a[i] / r[i] for a, b, r in rows]
    br = [b[i] / r[i] for a, b, r in rows]
    fmt = lambda xs: ' '.join(f'{x:.2f}' for x in xs)
    print(f"{t:5s} B/A {st.median(ba):.3f} [{fmt(ba)}]  A/redis {st.median(ar):.3f} [{fmt(ar)}]  "
          f"B/redis {st.median(br):.3f} [{fmt(br)}]")
PY
