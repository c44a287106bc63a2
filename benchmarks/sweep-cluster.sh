#!/usr/bin/env bash
# The multi-node half of the many-core sweep, for a 16-core machine without a toolchain (see
# sweep-many-core.sh for packing): issue 20's scaling (1, 2, 4 and 8 cluster nodes, each on
# a core of its own, `keel bench --server` on cores 8-15) and issue 22's cost of replication
# (three nodes on two cores each, R=3 against R=1, clients on cores 8-15). Needs python3 with
# redis-py (a wheel in .whl/ is installed into a temporary directory if it is missing).
#
#   OUT=/some/dir benchmarks/sweep-cluster.sh
#
# Writes into $OUT: scaling.json (benchmarks/cluster.py rows) and replication.json
# (benchmarks/replication.py --only workloads and --only cost). About 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${P:-$PWD/.sweep-pack}
export LD_LIBRARY_PATH=$P/lib PATH=$P:$PATH
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out"
if ! python3 -c 'import redis' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/redis-*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
python3 benchmarks/cluster.py --keel "$P/keel" --nodes 1,2,4,8 --cpus-per-node 1 \
  --client-cpus 8-15 --threads 64 --pipeline 4 --seconds 5 --records 1000000 \
  --workloads ycsb-a,deut --json "$out/scaling.json"
python3 benchmarks/replication.py --keel "$P/keel" --cpus-per-node 2 --client-cpus 8-15 \
  --only workloads --seconds 5 --json "$out/replication-workloads.json"
python3 benchmarks/replication.py --keel "$P/keel" --cpus-per-node 2 --client-cpus 8-15 \
  --only cost --json "$out/replication-cost.json"
