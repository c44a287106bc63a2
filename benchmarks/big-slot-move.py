#!/usr/bin/env python3
"""How long `KEEL.MOVESLOTS` takes to move a slot that holds one large set, which goes in
chunks (docs/replication.md, "A slot too large for one entry moves in chunks").

    cargo build --release -p keel-cli
    /usr/bin/python3 benchmarks/big-slot-move.py target/release/keel 1000000

Starts three `keel serve --replicas 3 --durability sync` on ports 17401-17403 in a temporary
directory, fills `{big}set` with MEMBERS members, moves its slot to the next node's partition
and prints the time the move took and the set's size read back from another node; stops the
servers at the end. Needs python3-redis.
"""
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import redis

if len(sys.argv) != 3:
    sys.exit(__doc__)
keel = sys.argv[1]
members = int(sys.argv[2])
root = tempfile.mkdtemp(dir="/tmp")
ports = [17401, 17402, 17403]
procs = []
for i, p in enumerate(ports):
    args = [keel, "serve", "--port", str(p), "--dir", f"{root}/n{i+1}", "--durability", "sync", "--replicas", "3"]
    for j, q in enumerate(ports):
        per = 16384 // 3
        s = j * per; e = 16383 if j == 2 else s + per - 1
        args += ["--cluster-node", f"n{j+1},127.0.0.1:{q},{s}-{e}"]
    args += ["--cluster-myself", f"n{i+1}"]
    procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(f"{root}/n{i+1}.log", "w")))
try:
    c = redis.Redis(port=ports[0], socket_timeout=300)
    t = time.time()
    while True:
        try:
            c.delete("{big}warm"); break
        except Exception:
            if time.time() - t > 60: raise
            time.sleep(0.2)
    for b in range(0, members, 10000):
        c.sadd("{big}set", *[f"member-{i}" for i in range(b, min(members, b + 10000))])
    slot = c.execute_command("CLUSTER", "KEYSLOT", "{big}set")
    owner = min(slot * 3 // 16384, 2)
    to = f"n{(owner + 1) % 3 + 1}"
    t = time.perf_counter()
    n = c.execute_command("KEEL.MOVESLOTS", to, slot)
    took = time.perf_counter() - t
    card = redis.Redis(port=ports[2]).scard("{big}set")
    print(f"members={members} moved={n} to={to} seconds={took:.2f} scard={card}")
finally:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait()
    shutil.rmtree(root, ignore_errors=True)
