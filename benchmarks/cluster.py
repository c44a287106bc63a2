#!/usr/bin/env python3
"""Transactions across partitions: `keel bench --server` against one `keel serve` and against
three unreplicated cluster nodes (`--replicas 1`), with the servers' CPU from /proc.

    cargo build --release -p keel-cli
    /usr/bin/python3 benchmarks/cluster.py [--durability none|sync] [--seconds 8]
        [--workloads deut,ycsb-a,mgp] [--serve-args '--idle-poll-us 0'] [--json out.json]

On a machine with cores to spare, the scaling sweep of issue 20 (each node on its own core,
the benchmark client on others):

    benchmarks/cluster.py --nodes 1,2,4,8 --cpus-per-node 1 --client-cpus 8-15 \
        --threads 64 --pipeline 4 --route slot --keel .sweep-pack/keel

deut's transactions read and write several keys drawn over all slots, so on three nodes
almost every one spans partitions (two-phase commit); ycsb-a's are single keys (one
partition: one-phase, forwarded when the key lives on another node than the connection's).
Connections go to the nodes in turn. Per run: committed txn/s, aborts/s, p50/p99, the
servers' CPU seconds, operations per second of server CPU, and (cluster) the one-phase and
two-phase commits counted by `INFO cluster`, and the bus's frames and messages per
transaction begun. The CPU covers the load and the warm-up as
well as the timed run, so it overstates the cost per operation: compare the rows.
Starts its own servers on loopback ports 7501-7503 in temporary directories, and stops them.
"""

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time

import redis

KEEL = os.environ.get("KEEL_BIN") or os.path.join(
    os.path.dirname(__file__), "..", "target", "release", "keel")
BASE = 7501
# Operations per transaction of each workload (its definition in BENCHMARKS.md, Workloads).
OPS = {"deut": 4, "deut-write": 4, "ycsb-a": 1, "ycsb-b": 1, "ycsb-c": 1, "mgp": 500}


def cpu_seconds(pids):
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


class Servers:
    """`n` keel processes: one plain server, or the nodes of an unreplicated cluster."""

    def __init__(self, n, durability, root, extra=(), cpus_per_node=0):
        self.n = n
        self.procs = []
        per = 16384 // n
        nodes = []
        for i in range(n):
            end = 16383 if i == n - 1 else (i + 1) * per - 1
            nodes.append(f"n{i + 1},127.0.0.1:{BASE + i},{i * per}-{end}")
        for i in range(n):
            pin = []
            if cpus_per_node:
                first = i * cpus_per_node
                pin = ["taskset", "-c", f"{first}-{first + cpus_per_node - 1}"]
            args = [*pin, KEEL, "serve", "--port", str(BASE + i), "--durability", durability,
                    "--dir", os.path.join(root, f"node-{i + 1}"), *extra]
            if n > 1:
                args += ["--replicas", "1", "--cluster-myself", f"n{i + 1}"]
                for node in nodes:
                    args += ["--cluster-node", node]
            log = open(os.path.join(root, f"node-{i + 1}.log"), "ab")
            self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log))
        for i in range(n):
            deadline = time.time() + 20
            while True:
                try:
                    redis.Redis(port=BASE + i, socket_timeout=1).ping()
                    break
                except redis.RedisError:
                    if time.time() > deadline:
                        raise RuntimeError(f"node {i + 1} did not start")
                    time.sleep(0.05)

    def addrs(self):
        return "+".join(f"127.0.0.1:{BASE + i}" for i in range(self.n))

    def pids(self):
        return [p.pid for p in self.procs]

    def commits(self):
        """Sums over the nodes of the counters of cross-node transactions (`INFO cluster`)
        and of the engines' commits (`INFO keel`)."""
        out = {}
        for i in range(self.n):
            c = redis.Redis(port=BASE + i, socket_timeout=5)
            info = {**c.info("cluster"), **c.info("keel")}
            for k, v in info.items():
                counter = k.startswith("keel_cluster_") and "_us_" not in k or k in (
                    "keel_commits", "keel_conflict_retries")
                if counter and isinstance(v, int):
                    out[k] = out.get(k, 0) + v
        return out

    def stop(self):
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def run(workload, n, args):
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        s = Servers(n, args.durability, root, args.serve_args.split(), args.cpus_per_node)
        try:
            out = os.path.join(root, "bench.json")
            label = f"keel-{n}"
            pin = ["taskset", "-c", args.client_cpus] if args.client_cpus else []
            cmd = [*pin, KEEL, "bench", workload, "--server", f"{label}={s.addrs()}",
                   "--threads", str(args.threads), "--records", str(args.records),
                   "--pipeline", str(args.pipeline), "--route", args.route,
                   "--duration", f"{args.seconds}s", "--warmup", "2s", "--runs", "1",
                   "--json", out] + (["--hash-tags"] if args.hash_tags else [])
            before = s.commits()
            cpu0 = cpu_seconds(s.pids())
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            cpu = cpu_seconds(s.pids()) - cpu0
            after = s.commits()
            with open(out) as f:
                r = json.load(f)[0]
            row = {"workload": workload, "nodes": n, "durability": args.durability,
                   "txn_per_s": round(r["txn_per_s"]), "aborts_per_s": round(r["aborts_per_s"]),
                   "p50_us": r["p50_us"], "p99_us": r["p99_us"], "server_cpu_s": round(cpu, 2)}
            # Operations committed over the whole run (load excluded) per CPU second: the
            # timed part is `seconds` of the run; the warm-up's share is at the same rate.
            ops = r["txn_per_s"] * (args.seconds + 2) * OPS.get(workload, 1)
            row["ops_per_cpu_s"] = round(ops / cpu) if cpu else None
            for k, v in after.items():
                row[k] = v - before.get(k, 0)
            # What crossed the bus per transaction begun (retries included).
            begun = row.get("keel_cluster_txns_begun")
            if begun:
                row["bus_frames_per_txn"] = round(row["keel_cluster_bus_frames_sent"] / begun, 2)
                row["bus_messages_per_txn"] = round(
                    row["keel_cluster_bus_messages_sent"] / begun, 2)
            return row
        finally:
            s.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--durability", default="none", choices=["none", "sync"])
    p.add_argument("--seconds", type=int, default=8)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--records", type=int, default=100000)
    p.add_argument("--workloads", default="deut,ycsb-a")
    p.add_argument("--nodes", default="1,3")
    p.add_argument("--serve-args", default="",
                   help="more `keel serve` flags for every node, e.g. '--idle-poll-us 0'")
    p.add_argument("--pipeline", type=int, default=1,
                   help="transactions in flight per connection (keel bench --pipeline)")
    p.add_argument("--route", default="turn", choices=["turn", "slot"],
                   help="keel bench --route: connections to nodes in turn, or by key slot")
    p.add_argument("--cpus-per-node", type=int, default=0,
                   help="pin node i to cores i*K..i*K+K-1 (taskset); 0 pins nothing")
    p.add_argument("--client-cpus", help="pin the benchmark client to these cores, e.g. 8-15")
    p.add_argument("--hash-tags", action="store_true",
                   help="keel bench --hash-tags: every transaction's keys in one slot")
    p.add_argument("--keel", help="the keel binary (default $KEEL_BIN, else target/release/keel)")
    p.add_argument("--json")
    args = p.parse_args()
    if args.keel:
        global KEEL
        KEEL = args.keel
    rows = []
    for workload in args.workloads.split(","):
        for n in map(int, args.nodes.split(",")):
            row = run(workload, n, args)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
