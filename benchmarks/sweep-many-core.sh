#!/usr/bin/env bash
# The many-core sweep of issue 23 in one command, for a 16-core machine without a toolchain:
# pack on the build machine with ../shared/tools/pack-for-sweep.sh, copy the repository with
# its .sweep-pack/ there, then
#
#   OUT=/some/dir benchmarks/sweep-many-core.sh
#
# Writes into $OUT: deut.json and deut-write.json (keel against the no-CC ceilings, threads
# 1..16, durability none; the acceptance figures are keel / ceiling-hash at 16 threads), and
# lanes.csv (keel serve with --poller off|on and --threads 8 against Valkey with
# --io-threads 8 and Redis 7, servers on cores 0-7, redis-benchmark with 8 threads on 8-15).
# About 8 minutes with ROUNDS=1 N1=500000 N16=2000000 (lanes.sh's arguments; the defaults are
# 2 rounds of 1M and 4M requests).
set -euo pipefail
cd "$(dirname "$0")/.."
P=${P:-$PWD/.sweep-pack}
export LD_LIBRARY_PATH=$P/lib
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out"
nproc | grep -qE '^(1[6-9]|[2-9][0-9]|[0-9]{3,})$' || echo "warning: $(nproc) cores, the sweep expects 16" >&2

for w in deut deut-write; do
  "$P/keel" bench "$w" --records 10000000 --theta 0.9 --threads 1,2,4,8,16 \
    --target keel,ceiling-array,ceiling-hash --duration 3s --warmup 1s --runs 1 \
    --json "$out/$w.json" > "$out/$w.txt" 2>&1
done

KEEL_BIN=$P/keel REDIS_BIN=$P/redis-server VALKEY_BIN=$P/valkey-server \
  BENCH_BIN=$P/redis-benchmark SERVER_CPUS=0-7 CLIENT_CPUS=8-15 THREADS=8 BENCH_THREADS=8 \
  crates/keel-server/scripts/lanes.sh "${ROUNDS:-2}" "${N1:-1000000}" "${N16:-4000000}" > "$out/lanes.csv"
