#!/usr/bin/env bash
# YCSB core workloads A-F (go-ycsb, github.com/pingcap/go-ycsb, its Redis binding in its default
# datatype, hash: a record is one hash, `usertable/user<N>`, written with HSET of its 10 fields
# and read with HMGET of them) against keel serve and redis-server. For each workload, and for
# each server in turn, the server starts fresh (empty temp dir, a free loopback port),
# `go-ycsb load redis` inserts the records, then `go-ycsb run redis` runs the workload's mix of
# operations. Per phase: operations per second and p99 latency (go-ycsb's TOTAL line, which
# counts the database calls that succeeded: a read-modify-write of workload F counts as its READ
# and its UPDATE), the server's CPU time per operation (from /proc/PID/stat, over the phase),
# and the operations that failed (go-ycsb's *_ERROR lines).
#
#   benchmarks/go-ycsb.sh [records] [operations] [threads] > ycsb.csv
#
# CSV on stdout: server,workload,phase,ops_per_sec,p99_us,cpu_us_per_op,errors. Defaults:
# 100000 records, 100000 operations per run, 16 client threads (one connection each).
#
# go-ycsb v1.0.3's Redis binding has no scans: it fails every SCAN (workload E's 95%) in the
# client, without a request, so E's row counts them as errors and its throughput is that of its
# inserts alone. It also drops HMGET's error, so a failed READ counts as a success.
#
# YCSB_BIN (default $YCSB_DIR/bin/go-ycsb) and YCSB_WORKLOADS (the workloada..workloadf files,
# default $YCSB_DIR/src/workloads) pick go-ycsb; benchmarks/go-ycsb-build.sh builds both into
# YCSB_DIR (default ${XDG_CACHE_HOME:-~/.cache}/go-ycsb). KEEL_BIN (default
# target/release/keel) and REDIS_BIN (default redis-server on the PATH) pick the servers; SERVERS
# (default "keel redis") and WORKLOADS (default "a b c d e f") what runs. DURABILITY is keel's
# (async:1000, paired with Redis's appendfsync everysec; sync with always). YCSB_PROPS adds
# go-ycsb properties, space-separated name=value (e.g. "requestdistribution=uniform"). LOG_DIR,
# if set, keeps go-ycsb's output and the servers' logs there. A phase that runs past
# YCSB_TIMEOUT seconds (default 1800) is killed and the script fails.
set -euo pipefail
records=${1:-100000}
operations=${2:-100000}
threads=${3:-16}
ycsb_dir=${YCSB_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/go-ycsb}
ycsb=${YCSB_BIN:-$ycsb_dir/bin/go-ycsb}
workloads_dir=${YCSB_WORKLOADS:-$ycsb_dir/src/workloads}
keel=${KEEL_BIN:-target/release/keel}
redis=${REDIS_BIN:-$(command -v redis-server || true)}
servers=${SERVERS:-"keel redis"}
workloads=${WORKLOADS:-"a b c d e f"}
dur=${DURABILITY:-async:1000}
limit=${YCSB_TIMEOUT:-1800}
fsync=everysec
[ "$dur" = sync ] && fsync=always

[ -x "$ycsb" ] || { echo "no go-ycsb at $ycsb: run benchmarks/go-ycsb-build.sh, or set YCSB_BIN" >&2; exit 1; }
for w in $workloads; do
  [ -f "$workloads_dir/workload$w" ] || { echo "no workload file $workloads_dir/workload$w" >&2; exit 1; }
done
for s in $servers; do
  case $s in
    keel) [ -x "$keel" ] || { echo "no keel at $keel: set KEEL_BIN" >&2; exit 1; } ;;
    redis) [ -n "$redis" ] && [ -x "$redis" ] || { echo "no redis-server: set REDIS_BIN" >&2; exit 1; } ;;
    *) echo "unknown server $s (keel or redis)" >&2; exit 1 ;;
  esac
done
props=()
for p in ${YCSB_PROPS:-}; do props+=(-p "$p"); done

work=$(mktemp -d /tmp/keel-ycsb.XXXXXX)
pid=
stop() {
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=
}
trap 'stop; rm -rf "$work"' EXIT
tck=$(getconf CLK_TCK)

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 30000))
    listening "$p" || { echo "$p"; return 0; }
  done
  echo "no free port found" >&2; return 1
}

start() { # server
  rm -rf "$work/d"; mkdir -p "$work/d"
  port=$(free_port)
  case $1 in
    redis) "$redis" --port "$port" --bind 127.0.0.1 --dir "$work/d" --save '' --appendonly yes \
      --appendfsync $fsync --daemonize no >"$work/server.log" 2>&1 & ;;
    keel) "$keel" serve --port "$port" --dir "$work/d" --durability "$dur" \
      >"$work/server.log" 2>&1 & ;;
  esac
  pid=$!
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    listening "$port" && return 0
    sleep 0.1
  done
  echo "$1 did not start on port $port:" >&2; tail -n 20 "$work/server.log" >&2; exit 1
}

phase() { # server workload load|run
  local out="$work/$1-$2-$3.txt" c0 c1 rc=0
  c0=$(cpu_ticks "$pid")
  timeout "$limit" "$ycsb" "$3" redis -P "$workloads_dir/workload$2" \
    -p recordcount="$records" -p operationcount="$operations" -p threadcount="$threads" \
    -p redis.addr="127.0.0.1:$port" -p debug.pprof=127.0.0.1:0 "${props[@]}" \
    >"$out" 2>&1 || rc=$?
  c1=$(cpu_ticks "$pid")
  [ -z "${LOG_DIR:-}" ] || { mkdir -p "$LOG_DIR"; cp "$out" "$LOG_DIR/"; }
  if [ $rc != 0 ] || ! grep -q '^Run finished' "$out"; then
    echo "go-ycsb $3 of workload $2 against $1 failed (exit $rc):" >&2
    tail -n 20 "$out" >&2
    exit 1
  fi
  # The summary follows "Run finished"; before it come the progress reports every 10 s.
  awk -v server="$1" -v w="$2" -v ph="$3" -v ticks="$((c1 - c0))" -v tck="$tck" '
    /^Run finished/ { done = 1; next }
    !done || !/ - Takes\(s\): / { next }
    {
      op = $1
      count = 0; ops = 0; p99 = ""
      n = split($0, parts, /, /)
      for (i = 1; i <= n; i++) {
        split(parts[i], kv, /: /)
        sub(/^.* - /, "", kv[1])
        if (kv[1] == "Count") count = kv[2]
        if (kv[1] == "OPS") ops = kv[2]
        if (kv[1] == "99th(us)") p99 = kv[2]
      }
      if (op == "TOTAL") { total = count; total_ops = ops; total_p99 = p99 }
      else if (op ~ /_ERROR$/) errors += count
    }
    END {
      cpu = total > 0 ? sprintf("%.2f", ticks / tck * 1e6 / total) : ""
      printf "%s,%s,%s,%.1f,%s,%s,%d\n", server, w, ph, total_ops, total_p99, cpu, errors
    }' "$out"
}

echo "server,workload,phase,ops_per_sec,p99_us,cpu_us_per_op,errors"
for w in $workloads; do
  for s in $servers; do
    start "$s"
    phase "$s" "$w" load
    phase "$s" "$w" run
    stop
    [ -z "${LOG_DIR:-}" ] || cp "$work/server.log" "$LOG_DIR/$s-$w-server.log"
  done
done
