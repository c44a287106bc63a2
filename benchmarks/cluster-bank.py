#!/usr/bin/env python3
"""A bank across three unreplicated cluster nodes: transfers and audits racing each other.

    cargo build --release -p keel-cli
    /usr/bin/python3 benchmarks/cluster-bank.py [--seconds 8] [--writers 8] [--auditors 2]
        [--per-node 2] [--split off|auto|force] [--adds] [--keel target/release/keel]

Accounts (`--per-node` on each node, 100 each) take transfers, each a `MULTI` of two
`INCRBY`s (`--adds`: `KEEL.ADD`s, which a split key's slices take) between two accounts drawn
at random, so most span nodes, through a node drawn at random; audits are `MGET`s of every
account across the nodes. Every audit must see the whole total (it stops with an error if
one does not). Prints one JSON line: transfers and audits done and refused (`TRYAGAIN`), the
audits' latency, and `INFO cluster`'s prepares, refusals, prepares run again and aborts,
summed over the nodes. Starts its own nodes on loopback ports 7301-7303 in a temporary
directory (`--durability none`), and stops them.
"""

import argparse
import json
import os
import random
import subprocess
import tempfile
import threading
import time

import redis

KEEL = os.environ.get("KEEL_BIN") or os.path.join(
    os.path.dirname(__file__), "..", "target", "release", "keel")
PORTS = [7301, 7302, 7303]
START = 100


def start(keel, split, tmp):
    nodes = [f"n{i + 1},127.0.0.1:{p},{lo}-{hi}" for i, (p, (lo, hi)) in
             enumerate(zip(PORTS, [(0, 5460), (5461, 10922), (10923, 16383)]))]
    procs = []
    for i, port in enumerate(PORTS):
        args = [keel, "serve", "--port", str(port), "--dir", os.path.join(tmp, f"n{i + 1}"),
                "--durability", "none", "--replicas", "1", "--split", split,
                "--cluster-myself", f"n{i + 1}"]
        for n in nodes:
            args += ["--cluster-node", n]
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    deadline = time.time() + 20
    for port in PORTS:
        while True:
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                if time.time() > deadline:
                    raise SystemExit(f"node on {port} did not start")
                time.sleep(0.05)
    return procs


def accounts(per_node):
    c = redis.Redis(port=PORTS[0])
    ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
    found = [[] for _ in ranges]
    i = 0
    while any(len(f) < per_node for f in found):
        key = f"acct{i}"
        slot = c.execute_command("CLUSTER", "KEYSLOT", key)
        for f, (lo, hi) in zip(found, ranges):
            if lo <= slot <= hi and len(f) < per_node:
                f.append(key)
        i += 1
    return [k for f in found for k in f]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--writers", type=int, default=8)
    p.add_argument("--auditors", type=int, default=2)
    p.add_argument("--per-node", type=int, default=2)
    p.add_argument("--split", choices=["off", "auto", "force"], default="off")
    p.add_argument("--adds", action="store_true", help="transfers as KEEL.ADD, not INCRBY")
    p.add_argument("--keel", default=KEEL)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        procs = start(a.keel, a.split, tmp)
        try:
            run(a)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()


def run(a):
    acc = accounts(a.per_node)
    total = START * len(acc)
    pipe = redis.Redis(port=PORTS[0]).pipeline(transaction=True)
    for k in acc:
        pipe.set(k, START)
    pipe.execute()
    stop = threading.Event()
    lock = threading.Lock()
    counts = {"transfers": 0, "transfers_refused": 0, "audits": 0, "audits_refused": 0}
    latencies = []
    failures = []

    def count(name):
        with lock:
            counts[name] += 1

    def transfer(seed):
        conns = [redis.Redis(port=p) for p in PORTS]
        rng = random.Random(seed)
        op = "KEEL.ADD" if a.adds else "INCRBY"
        while not stop.is_set():
            src, dst = rng.sample(acc, 2)
            amount = rng.randint(1, 9)
            pipe = rng.choice(conns).pipeline(transaction=True)
            pipe.execute_command(op, src, -amount)
            pipe.execute_command(op, dst, amount)
            try:
                pipe.execute()
                count("transfers")
            except redis.ResponseError:
                count("transfers_refused")

    def audit(seed):
        conns = [redis.Redis(port=p) for p in PORTS]
        rng = random.Random(seed)
        while not stop.is_set():
            began = time.time()
            try:
                values = rng.choice(conns).mget(acc)
            except redis.ResponseError:
                count("audits_refused")
                continue
            with lock:
                latencies.append(time.time() - began)
            seen = sum(int(v) for v in values)
            if seen != total:
                failures.append(f"an audit saw {seen} of {total}: {values}")
                stop.set()
            count("audits")

    threads = [threading.Thread(target=transfer, args=(w,)) for w in range(a.writers)]
    threads += [threading.Thread(target=audit, args=(100 + w,)) for w in range(a.auditors)]
    for t in threads:
        t.start()
    stop.wait(a.seconds)
    stop.set()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(failures[0])
    latencies.sort()
    pick = lambda q: round(latencies[min(len(latencies) - 1, int(len(latencies) * q))] * 1e3, 2)
    result = dict(counts, seconds=a.seconds, writers=a.writers, auditors=a.auditors,
                  split=a.split, adds=a.adds)
    if latencies:
        result.update(audit_p50_ms=pick(0.5), audit_p99_ms=pick(0.99),
                      audit_max_ms=round(latencies[-1] * 1e3, 2))
    for field in ("prepares", "prepares_refused", "prepares_again", "aborts_conflict"):
        result[field] = sum(int(redis.Redis(port=p).info("cluster").get(
            f"keel_cluster_{field}", 0)) for p in PORTS)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
