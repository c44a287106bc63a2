#!/usr/bin/env python3
"""Blocking pops across nodes: how soon a push on another node serves a blocked client, and
what clients that wait cost the cluster.

Starts `keel cluster demo 3` (three nodes in one process: a on node 3, c on node 2, the
client on node 1), then:

- wake: a client on node 1 runs `BLPOP a c 10`; after a second of waiting, `RPUSH a v` on
  node 3; the time from the push's reply to the pop's, over --trials trials;
- idle: --clients clients block in `BLPOP a c 0` on node 1; the cluster's CPU (from /proc,
  the demo and its children) over --seconds seconds, beside the same with no client.

    /usr/bin/python3 benchmarks/blocking_across.py --keel target/release/keel [--port 17311]

Run two builds in alternation to compare them.
"""

import argparse
import os
import socket
import subprocess
import threading
import time


def request(port, *args, timeout=30.0):
    """Sends one command and returns its raw reply (enough of it for these commands)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(timeout)
    s.sendall(encode(args))
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        if data[:1] in (b":", b"+", b"-") and data.endswith(b"\r\n"):
            break
        if data.startswith(b"*-1\r\n") or (data.startswith(b"*2") and data.count(b"\r\n") >= 5):
            break
    s.close()
    return data


def encode(args):
    out = "*%d\r\n" % len(args)
    for a in args:
        out += "$%d\r\n%s\r\n" % (len(a), a)
    return out.encode()


def cpu_seconds(pid):
    pids = [pid] + [
        int(p)
        for p in subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True
        ).stdout.split()
    ]
    ticks = 0
    for p in pids:
        fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keel", default="target/release/keel")
    ap.add_argument("--port", type=int, default=17311)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    demo = subprocess.Popen(
        [a.keel, "cluster", "demo", "3", "--port", str(a.port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                request(a.port, "PING")
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(0.5)
        waits = []
        for _ in range(a.trials):
            got = {}

            def blocker():
                got["reply"] = request(a.port, "BLPOP", "a", "c", "10")
                got["at"] = time.time()

            t = threading.Thread(target=blocker)
            t.start()
            time.sleep(1.0)
            pushed = time.time()
            request(a.port + 2, "RPUSH", "a", "v")
            t.join()
            assert got["reply"].startswith(b"*2"), got["reply"]
            waits.append((got["at"] - pushed) * 1000)
        waits.sort()
        print(
            f"wake after a push on another node: median {waits[len(waits) // 2]:.1f} ms, "
            f"max {waits[-1]:.1f} ms ({a.trials} trials)"
        )
        idle = []
        for clients in (0, a.clients):
            socks = []
            for _ in range(clients):
                s = socket.create_connection(("127.0.0.1", a.port))
                s.sendall(encode(("BLPOP", "a", "c", "0")))
                socks.append(s)
            time.sleep(2)
            before = cpu_seconds(demo.pid)
            time.sleep(a.seconds)
            idle.append((cpu_seconds(demo.pid) - before) / a.seconds * 100)
            for s in socks:
                s.close()
            time.sleep(0.5)
        print(
            f"cluster CPU: {idle[0]:.1f}% of a core idle, {idle[1]:.1f}% with "
            f"{a.clients} clients blocked across nodes"
        )
    finally:
        demo.terminate()
        demo.wait()


if __name__ == "__main__":
    main()
