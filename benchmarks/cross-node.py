import redis, time, sys, multiprocessing as mp
PORT=int(sys.argv[1]) if len(sys.argv)>1 else 7101
def keys_on_nodes():
    r=redis.Redis(port=PORT)
    slots={}
    for n in range(1000):
        k=f"x{n}"; s=r.execute_command("CLUSTER","KEYSLOT",k)
        node=0 if s<=5460 else 1 if s<=10921 else 2
        slots.setdefault(node,[]).append(k)
    return slots
K=keys_on_nodes()
a0,b0=K[0][0],K[0][1]   # both on node 1 (the one we talk to)
a1=K[1][0]; a2=K[2][0]
def lat(name, fn, n=2000):
    r=redis.Redis(port=PORT)
    for _ in range(100): fn(r)
    t=time.perf_counter()
    for _ in range(n): fn(r)
    us=(time.perf_counter()-t)/n*1e6
    print(f"{name:48s} {us:8.0f} us/op")
def tx(keys):
    def f(r):
        p=r.pipeline(transaction=True)
        for k in keys: p.incr(k)
        p.execute()
    return f
lat("SET (local key)", lambda r: r.set(K[0][40],"v"))
lat("MULTI INCR x2 EXEC, both keys on this node", tx([a0,b0]))
lat("MULTI INCR x2 EXEC, both keys on one other node", tx([K[1][0],K[1][1]]))
lat("MULTI INCR x2 EXEC, this node + another (2PC)", tx([a0,a1]))
lat("MULTI INCR x2 EXEC, two other nodes (2PC)", tx([a1,a2]))
lat("MULTI INCR x3 EXEC, three nodes (2PC)", tx([a0,a1,a2]))
lat("MSET across three nodes (2PC)", lambda r: r.mset({K[0][41]:"1",K[1][41]:"2",K[2][41]:"3"}))
def worker(args):
    i,dur=args
    r=redis.Redis(port=PORT+(i%3))
    ks=[K[0][2+i],K[1][2+i],K[2][2+i]]
    n=0; t=time.time()
    while time.time()-t<dur:
        p=r.pipeline(transaction=True)
        for k in ks[:2]: p.incr(k)
        p.execute(); n+=1
    return n
for procs in (4,16):
    with mp.Pool(procs) as pool:
        t=time.time(); res=pool.map(worker,[(i,3.0) for i in range(procs)])
        print(f"throughput, {procs} clients, 2-node MULTI on disjoint keys: {sum(res)/3.0:8.0f} txn/s")
