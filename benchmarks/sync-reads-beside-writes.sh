#!/bin/bash
# GET latency on <port> while 20 other clients SET (BENCHMARKS.md, "A hot key under sync").
# usage: benchmarks/sync-reads-beside-writes.sh <port>
port=$1
redis-benchmark -p $port -t set -c 20 -n 10000000 -r 100000 -q > /dev/null 2>&1 &
w=$!
sleep 1
redis-benchmark -p $port -t get -c 20 -n 60000 -r 100000 2>&1 | tr '\r' '\n' | grep -A2 -E 'throughput summary|latency summary' | grep -v -- '--' | tr '\n' ' '
echo
kill $w; wait $w 2>/dev/null
