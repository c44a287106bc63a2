#!/usr/bin/env python3
"""What replication costs and what it buys: keel with --replicas 3 against --replicas 1, the
time from kill -9 of a partition's leader to the next commit on that partition, and the
acknowledged writes lost when a primary dies, beside Redis' primary + replica.

    cargo build --release -p keel-cli
    /usr/bin/python3 benchmarks/replication.py [--trials 20] [--json out.json]

Starts its own servers on loopback (keel: three `keel serve` processes on ports 7301-7303 with
`--durability sync`; Redis: a primary on 7311 with `appendfsync always` and a replica on
7312), in temporary directories, and stops them at the end. Needs redis-server and
python3-redis.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import redis

KEEL = os.environ.get("KEEL_BIN") or os.path.join(
    os.path.dirname(__file__), "..", "target", "release", "keel")
NODES = 3
# Pinning (--cpus-per-node, --client-cpus): node i on cores i*K..i*K+K-1, clients apart.
CPUS_PER_NODE = 0
CLIENT_PIN = []
BASE = 7301


def slots(i, n):
    per = 16384 // n
    start = i * per
    end = 16383 if i == n - 1 else start + per - 1
    return start, end


class Keel:
    """Three `keel serve` processes, every partition on `replicas` of them."""

    def __init__(self, replicas, root):
        self.replicas = replicas
        self.root = root
        self.procs = [None] * NODES
        for i in range(NODES):
            self.start(i)
        self.wait_ready()

    def args(self, i):
        pin = []
        if CPUS_PER_NODE:
            first = i * CPUS_PER_NODE
            pin = ["taskset", "-c", f"{first}-{first + CPUS_PER_NODE - 1}"]
        a = [*pin, KEEL, "serve", "--port", str(BASE + i), "--durability", "sync",
             "--dir", os.path.join(self.root, f"node-{i + 1}"),
             "--replicas", str(self.replicas), "--cluster-myself", f"n{i + 1}"]
        for j in range(NODES):
            s, e = slots(j, NODES)
            a += ["--cluster-node", f"n{j + 1},127.0.0.1:{BASE + j},{s}-{e}"]
        return a

    def start(self, i):
        log = open(os.path.join(self.root, f"node-{i + 1}.log"), "ab")
        self.procs[i] = subprocess.Popen(self.args(i), stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                redis.Redis(port=BASE + i, socket_timeout=1).ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"node {i + 1} did not start")

    def wait_ready(self):
        """Every partition takes a write."""
        c = redis.Redis(port=BASE, socket_timeout=10)
        for k in keys_per_partition(c).values():
            deadline = time.time() + 20
            while True:
                try:
                    c.set(k, "x")
                    break
                except redis.RedisError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.05)

    def kill9(self, i):
        self.procs[i].kill()
        self.procs[i].wait()
        self.procs[i] = None

    def pids(self):
        return [p.pid for p in self.procs if p]

    def stop(self):
        for p in self.procs:
            if p:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            if p:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()


def keys_per_partition(c):
    """A key in each partition: {partition: key}."""
    found = {}
    n = 0
    while len(found) < NODES:
        k = f"key{n}"
        slot = c.execute_command("CLUSTER", "KEYSLOT", k)
        p = next(i for i in range(NODES) if slots(i, NODES)[0] <= slot <= slots(i, NODES)[1])
        found.setdefault(p, k)
        n += 1
    return found


def leader_of(port, key):
    c = redis.Redis(port=port, socket_timeout=2)
    slot = c.execute_command("CLUSTER", "KEYSLOT", key)
    for entry in c.execute_command("CLUSTER", "SLOTS"):
        if entry[0] <= slot <= entry[1]:
            node_id = entry[2][2]
            node_id = node_id.decode() if isinstance(node_id, bytes) else node_id
            return int(node_id[1:]) - 1
    return None


def cpu_seconds(pids):
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return total


def latency_us(port, op, n=2000):
    c = redis.Redis(port=port, socket_timeout=10)
    op(c, 0)
    t = time.perf_counter()
    for i in range(n):
        op(c, i)
    return (time.perf_counter() - t) / n * 1e6


def throughput(ports, pids, clients, seconds=5.0, write=True):
    """Single-key SETs (or GETs) from `clients` processes for `seconds`; (ops/s, CPU µs/op)."""
    code = (
        "import redis,random,sys,time\n"
        "p=[int(x) for x in sys.argv[1].split(',')]\n"
        "c=[redis.Redis(port=q,socket_timeout=10) for q in p]\n"
        "end=time.time()+float(sys.argv[2]);n=0;w=sys.argv[3]=='1'\n"
        "while time.time()<end:\n"
        "  k='k%d'%random.randrange(100000);x=c[n%len(c)]\n"
        "  x.set(k,'v'*100) if w else x.get(k)\n"
        "  n+=1\n"
        "print(n)\n"
    )
    cpu0 = cpu_seconds(pids)
    procs = [subprocess.Popen([*CLIENT_PIN, sys.executable, "-c", code, ",".join(map(str, ports)),
                               str(seconds), "1" if write else "0"],
                              stdout=subprocess.PIPE) for _ in range(clients)]
    total = sum(int(p.communicate()[0]) for p in procs)
    cpu = cpu_seconds(pids) - cpu0
    return total / seconds, cpu / total * 1e6


def cost(results):
    print("== cost of replication: 3 keel processes, sync durability, clients spread over the nodes")
    for replicas in (1, 3):
        with tempfile.TemporaryDirectory(dir="/tmp") as root:
            k = Keel(replicas, root)
            try:
                c = redis.Redis(port=BASE)
                local = keys_per_partition(c)
                # A key led here and one elsewhere (with R=3 leaders move; the latency of a
                # key whose partition the contacted node leads, and of one it forwards).
                row = {"replicas": replicas}
                row["set_us"] = latency_us(BASE, lambda c, i: c.set(local[0], i))
                row["get_us"] = latency_us(BASE, lambda c, i: c.get(local[0]))
                row["multi_us"] = latency_us(
                    BASE, lambda c, i: c.pipeline(transaction=True).incr(local[0]).incr(local[0]).execute())
                ports = [BASE + i for i in range(NODES)]
                for clients in (4, 16):
                    ops, us = throughput(ports, k.pids(), clients)
                    row[f"set_ops_{clients}"] = ops
                    row[f"set_cpu_us_{clients}"] = us
                ops, us = throughput(ports, k.pids(), 16, write=False)
                row["get_ops_16"] = ops
                row["get_cpu_us_16"] = us
                results.setdefault("cost", []).append(row)
                print(json.dumps(row))
            finally:
                k.stop()


def workloads(results, seconds):
    """deut (multi-key transactions: across partitions) and ycsb-a (single-key reads and
    updates) through one node with `keel bench --server`, R=3 against R=1: txn/s, p99 and
    the servers' CPU per transaction."""
    print("== workloads through the server: deut and ycsb-a, 16 connections to node 1, sync")
    for workload in ("deut", "ycsb-a"):
        for replicas in (1, 3):
            with tempfile.TemporaryDirectory(dir="/tmp") as root:
                k = Keel(replicas, root)
                try:
                    out = os.path.join(root, "bench.json")
                    cmd = [*CLIENT_PIN, KEEL, "bench", workload, "--server", f"keel=127.0.0.1:{BASE}",
                           "--threads", "16", "--records", "100000",
                           "--duration", f"{seconds}s", "--warmup", "2s", "--runs", "1",
                           "--json", out]
                    cpu0 = cpu_seconds(k.pids())
                    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                    cpu = cpu_seconds(k.pids()) - cpu0
                    with open(out) as f:
                        r = json.load(f)[0]
                    # The CPU covers loading, warm-up and the run: per transaction of the run
                    # it overstates; the ratio between R=3 and R=1 is what to read.
                    row = {"workload": workload, "replicas": replicas,
                           "txn_per_s": r["txn_per_s"], "aborts_per_s": r["aborts_per_s"],
                           "p50_us": r["p50_us"], "p99_us": r["p99_us"],
                           "server_cpu_s": cpu}
                    results.setdefault("workloads", []).append(row)
                    print(json.dumps(row))
                finally:
                    k.stop()


def failover(results, trials):
    print(f"== failover: kill -9 of partition 0's leader, {trials} trials")
    times = []
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        k = Keel(3, root)
        try:
            key = keys_per_partition(redis.Redis(port=BASE))[0]
            for t in range(trials):
                leader = leader_of(BASE + (t % NODES), key)
                via = (leader + 1) % NODES
                c = redis.Redis(port=BASE + via, socket_timeout=10)
                c.set(key, "before")
                k.kill9(leader)
                killed = time.perf_counter()
                while True:
                    try:
                        c.set(key, f"after{t}")
                        break
                    except redis.RedisError:
                        c = redis.Redis(port=BASE + via, socket_timeout=10)
                        time.sleep(0.005)
                times.append(time.perf_counter() - killed)
                k.start(leader)
                time.sleep(2.0)
                print(f"trial {t + 1}: {times[-1] * 1000:.0f} ms")
        finally:
            k.stop()
    row = {"trials": trials, "median_ms": statistics.median(times) * 1000,
           "max_ms": max(times) * 1000, "min_ms": min(times) * 1000}
    results["failover"] = row
    print(json.dumps(row))


def writers(port_of, key, seconds, n=4):
    """`n` threads RPUSH unique ids to `key` through `port_of()` until `seconds` pass;
    returns the ids acknowledged."""
    acked = []
    lock = threading.Lock()
    stop = time.time() + seconds

    def run(w):
        i = 0
        c = None
        while time.time() < stop:
            try:
                if c is None:
                    c = redis.Redis(port=port_of(), socket_timeout=2)
                c.rpush(key, f"{w}.{i}")
                with lock:
                    acked.append(f"{w}.{i}")
            except redis.RedisError:
                c = None
                time.sleep(0.01)
            i += 1

    threads = [threading.Thread(target=run, args=(w,)) for w in range(n)]
    for th in threads:
        th.start()
    return threads, acked


def redis_pair(root, replicaof):
    """A Redis primary on 7311 and a replica on 7312 of `replicaof` (the primary, or a proxy
    to it), both `appendfsync always`; returns them once the replica is in sync."""
    common = ["--save", "", "--appendonly", "yes", "--appendfsync", "always",
              "--bind", "127.0.0.1", "--protected-mode", "no",
              "--repl-diskless-sync-delay", "0"]
    os.makedirs(root + "/p")
    os.makedirs(root + "/r")
    primary = subprocess.Popen(["redis-server", "--port", "7311", "--dir", root + "/p"] + common,
                               stdout=subprocess.DEVNULL)
    replica = subprocess.Popen(["redis-server", "--port", "7312", "--dir", root + "/r",
                                "--replicaof", "127.0.0.1", str(replicaof)] + common,
                               stdout=subprocess.DEVNULL)
    deadline = time.time() + 20
    while True:
        try:
            info = redis.Redis(port=7312).info("replication")
            if info.get("master_link_status") == "up" and not info.get("master_sync_in_progress"):
                return primary, replica
        except redis.RedisError:
            pass
        if time.time() > deadline:
            raise RuntimeError("the Redis replica did not sync within 20 s")
        time.sleep(0.1)


def lost_writes(results):
    print("== acknowledged writes lost when the primary/leader is killed under load")
    # Redis: primary + asynchronous replica, writes to the primary, kill -9 it, promote.
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        primary, replica = redis_pair(root, 7311)
        target = {"port": 7311}
        threads, acked = writers(lambda: target["port"], "log", 4.0)
        time.sleep(2.0)
        primary.kill()
        primary.wait()
        target["port"] = 7312
        redis.Redis(port=7312).execute_command("REPLICAOF", "NO", "ONE")
        for th in threads:
            th.join()
        present = {x.decode() for x in redis.Redis(port=7312).lrange("log", 0, -1)}
        lost = [a for a in acked if a not in present]
        replica.kill()
        replica.wait()
        row = {"system": "redis primary+replica (appendfsync always)", "acked": len(acked),
               "lost": len(lost)}
        results.setdefault("lost", []).append(row)
        print(json.dumps(row))
    # keel: 3 replicas; writes through the partition's leader itself, kill -9 it.
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        k = Keel(3, root)
        try:
            # A list in the same slot as the partition's probe key (which holds a string).
            key = "{" + keys_per_partition(redis.Redis(port=BASE))[0] + "}log"
            leader = leader_of(BASE, key)
            target = {"port": BASE + leader}
            threads, acked = writers(lambda: target["port"], key, 6.0)
            time.sleep(2.0)
            k.kill9(leader)
            target["port"] = BASE + (leader + 1) % NODES
            for th in threads:
                th.join()
            c = redis.Redis(port=target["port"], socket_timeout=10)
            present = {x.decode() for x in c.lrange(key, 0, -1)}
            lost = [a for a in acked if a not in present]
            row = {"system": "keel --replicas 3 (sync)", "acked": len(acked), "lost": len(lost)}
            results.setdefault("lost", []).append(row)
            print(json.dumps(row))
        finally:
            k.stop()


class Proxy:
    """Forwards 127.0.0.1:`port` to `to`; `cut()` drops every connection and refuses new
    ones (a network partition between the two ends)."""

    def __init__(self, port, to):
        import socket
        self.to = to
        self.open = True
        self.conns = []
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", port))
        self.server.listen()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        import socket
        while True:
            try:
                a, _ = self.server.accept()
            except OSError:
                return
            if not self.open:
                a.close()
                continue
            b = socket.create_connection(("127.0.0.1", self.to))
            self.conns += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self.pump, args=(x, y), daemon=True).start()

    def pump(self, x, y):
        try:
            while self.open:
                data = x.recv(65536)
                if not data:
                    break
                y.sendall(data)
        except OSError:
            pass

    def cut(self):
        import socket
        self.open = False
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass


def partitioned_redis(results):
    """Redis primary + replica with the link between them cut (clients still reach the
    primary); after 2 s the replica is promoted, as Sentinel would, and the old primary dies.
    What the old primary acknowledged during the cut is lost."""
    print("== acknowledged writes lost when the primary is cut off from its replica, then replaced")
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        proxy = Proxy(7313, 7311)
        primary, replica = redis_pair(root, 7313)
        target = {"port": 7311}
        threads, acked = writers(lambda: target["port"], "log", 6.0)
        time.sleep(2.0)
        proxy.cut()
        time.sleep(2.0)
        redis.Redis(port=7312).execute_command("REPLICAOF", "NO", "ONE")
        target["port"] = 7312
        primary.kill()
        primary.wait()
        for th in threads:
            th.join()
        present = {x.decode() for x in redis.Redis(port=7312).lrange("log", 0, -1)}
        lost = [a for a in acked if a not in present]
        replica.kill()
        replica.wait()
        row = {"system": "redis primary+replica, link cut 2 s, replica promoted",
               "acked": len(acked), "lost": len(lost)}
        results.setdefault("lost", []).append(row)
        print(json.dumps(row))


def membership(results, records):
    """A node joins a loaded 3-node cluster, slots are rebalanced onto it, then node 1 is
    removed, while writers keep going: how long each step takes, the writes per second
    around them, and whether every acknowledged write is there at the end."""
    print(f"== membership: join n4, rebalance, remove n1; {records} records of 100 B, writers on")
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        k = Keel(3, root)
        joiner = None
        try:
            c = redis.Redis(port=BASE, socket_timeout=30)
            for start in range(0, records, 1000):
                p = c.pipeline(transaction=False)
                for i in range(start, min(records, start + 1000)):
                    p.set(f"r{i}", "v" * 100)
                p.execute()
            acked, lock, stop = [], threading.Lock(), [False]
            marks = []

            def write(w):
                ports = [BASE + 1, BASE + 2]
                i, conn = 0, None
                while not stop[0]:
                    key = f"m{w}.{i}"
                    try:
                        if conn is None:
                            conn = redis.Redis(port=ports[i % 2], socket_timeout=10)
                        conn.set(key, "x")
                        with lock:
                            acked.append((time.perf_counter(), key))
                    except redis.RedisError:
                        conn = None
                        time.sleep(0.01)
                    i += 1

            threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
            for th in threads:
                th.start()
            t0 = time.perf_counter()
            time.sleep(3)
            marks.append(("join", time.perf_counter()))
            log = open(os.path.join(root, "node-4.log"), "ab")
            joiner = subprocess.Popen(
                [KEEL, "serve", "--cluster-join", f"127.0.0.1:{BASE}", "--cluster-myself", "n4",
                 "--port", str(BASE + 3), "--durability", "sync",
                 "--dir", os.path.join(root, "node-4")],
                stdout=subprocess.DEVNULL, stderr=log)
            # Joined once n4 is a voter of every partition placed on it.
            while True:
                try:
                    info = redis.Redis(port=BASE + 3, socket_timeout=2).info("replication")
                    parts = [v for key, v in info.items() if key.startswith("keel_partition_")]
                    if len(parts) == 3 and all("n4" in str(p.get("replicas", "")) and
                                               p.get("role") in ("leader", "follower")
                                               for p in parts):
                        break
                except redis.RedisError:
                    pass
                time.sleep(0.05)
            marks.append(("rebalance", time.perf_counter()))
            subprocess.run([KEEL, "cluster", "rebalance", "--node", f"127.0.0.1:{BASE + 1}"],
                           check=True, stdout=subprocess.DEVNULL)
            marks.append(("remove", time.perf_counter()))
            subprocess.run([KEEL, "cluster", "remove-node", "n1", "--node",
                            f"127.0.0.1:{BASE + 1}"], check=True, stdout=subprocess.DEVNULL)
            marks.append(("after", time.perf_counter()))
            time.sleep(3)
            stop[0] = True
            for th in threads:
                th.join()
            end = time.perf_counter()
            k.kill9(0)
            c = redis.Redis(port=BASE + 2, socket_timeout=30)
            keys = [key for _, key in acked]
            lost = sum(1 for i in range(0, len(keys), 500)
                       for v in c.mget(keys[i:i + 500]) if v is None)
            row = {"records": records, "acknowledged": len(keys), "lost": lost}
            bounds = [("before", t0)] + marks + [("end", end)]
            for (name, a), (_, b) in zip(bounds, bounds[1:]):
                n = sum(1 for t, _ in acked if a <= t < b)
                row[f"{name}_s"] = round(b - a, 2)
                row[f"{name}_writes_per_s"] = round(n / (b - a)) if b > a else 0
            # Writes per half second, for the eye: where they stall.
            row["writes_per_half_second"] = [
                sum(1 for t, _ in acked if t0 + i / 2 <= t < t0 + (i + 1) / 2)
                for i in range(int((end - t0) * 2))]
            results["membership"] = row
            print(json.dumps(row))
        finally:
            if joiner:
                joiner.send_signal(signal.SIGTERM)
                joiner.wait(timeout=15)
            k.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--only", choices=["cost", "workloads", "failover", "lost", "partition",
                                       "membership"])
    ap.add_argument("--records", type=int, default=100000,
                    help="records loaded before the membership run")
    ap.add_argument("--seconds", type=int, default=10, help="length of each workload run")
    ap.add_argument("--cpus-per-node", type=int, default=0,
                    help="pin node i to cores i*K..i*K+K-1 (taskset); 0 pins nothing")
    ap.add_argument("--client-cpus", help="pin the clients to these cores, e.g. 8-15")
    ap.add_argument("--keel", help="the keel binary (default $KEEL_BIN, else target/release/keel)")
    args = ap.parse_args()
    global KEEL, CPUS_PER_NODE, CLIENT_PIN
    KEEL = args.keel or KEEL
    CPUS_PER_NODE = args.cpus_per_node
    CLIENT_PIN = ["taskset", "-c", args.client_cpus] if args.client_cpus else []
    results = {}
    if args.only in (None, "cost"):
        cost(results)
    if args.only in (None, "workloads"):
        workloads(results, args.seconds)
    if args.only in (None, "failover"):
        failover(results, args.trials)
    if args.only in (None, "lost"):
        lost_writes(results)
    if args.only in (None, "partition"):
        partitioned_redis(results)
    if args.only in (None, "membership"):
        membership(results, args.records)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
