//! Cluster mode (slice 1 of docs/cluster.md): three nodes in this process on loopback ports,
//! plain clients (forwarding), the `redis` crate's `ClusterClient` (routing by `CLUSTER
//! SLOTS`), `MOVED`, `CROSSSLOT`, `CLUSTERDOWN`, and the `CLUSTER` replies' shapes against a
//! real `redis-server --cluster-enabled yes`.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_server::cluster_map::{Membership, SLOTS, key_slot};

use crate::{TestServer, error, query};

/// The request timeout of the clusters whose tests are not about it: long enough that a
/// node slowed by a loaded machine still answers in time (a vote or a forwarded command
/// that took over 2 s failed tests here), so only a node that is really gone times out.
const TIMEOUT_MS: u64 = 10_000;

/// A cluster of `n` nodes with the slots split evenly; node `i` is `nodes[i]`.
struct TestCluster {
    nodes: Vec<Option<TestServer>>,
    addrs: Vec<SocketAddr>,
}

impl TestCluster {
    fn start(n: usize, timeout_ms: u64) -> TestCluster {
        TestCluster::start_with_buses(n, timeout_ms, |_, buses| buses.to_vec())
    }

    /// As [`TestCluster::start`], node `i` reaching the others' buses at `bus_of(i, buses)`
    /// (a relay in between, say) instead of `buses`.
    fn start_with_buses(
        n: usize,
        timeout_ms: u64,
        bus_of: impl Fn(usize, &[SocketAddr]) -> Vec<SocketAddr>,
    ) -> TestCluster {
        let listeners: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
            .collect();
        let addrs: Vec<SocketAddr> = listeners
            .iter()
            .map(|l| l.local_addr().expect("address"))
            .collect();
        // The transport's sockets too: free ports, bound before any node starts.
        let buses: Vec<Arc<TcpListener>> = (0..n)
            .map(|_| Arc::new(TcpListener::bind("127.0.0.1:0").expect("a free port")))
            .collect();
        let bus_addrs: Vec<SocketAddr> = buses
            .iter()
            .map(|l| l.local_addr().expect("address"))
            .collect();
        let nodes = listeners
            .into_iter()
            .enumerate()
            .map(|(i, l)| {
                let map = Membership::even(&addrs, i, timeout_ms).expect("valid cluster");
                let (bus_addrs, bus) = (bus_of(i, &bus_addrs), Arc::clone(&buses[i]));
                Some(TestServer::on(Some(l), move |c| {
                    c.cluster = Some(Arc::new(map));
                    c.cluster_bus = bus_addrs;
                    c.cluster_bus_listener = Some(bus);
                    c.metrics = Some("127.0.0.1:0".parse().expect("an address"));
                }))
            })
            .collect();
        TestCluster { nodes, addrs }
    }

    fn node(&self, i: usize) -> &TestServer {
        self.nodes[i].as_ref().expect("node is running")
    }

    /// Stops node `i` (its port then refuses connections).
    fn kill(&mut self, i: usize) {
        drop(self.nodes[i].take());
    }

    /// The node that owns `key` under the even split.
    fn owner(&self, key: &str) -> usize {
        let slot = usize::from(key_slot(key.as_bytes()).0);
        (0..self.addrs.len())
            .find(|&i| {
                let (start, end) =
                    keel_server::cluster_map::membership::even_range(i, self.addrs.len());
                (usize::from(start)..=usize::from(end)).contains(&slot)
            })
            .expect("every slot has an owner")
    }
}

/// One key for every slot, `k<n>` with the smallest `n` that lands there.
fn key_per_slot() -> Vec<String> {
    let mut keys = vec![String::new(); usize::from(SLOTS)];
    let mut missing = usize::from(SLOTS);
    let mut n = 0u64;
    while missing > 0 {
        let key = format!("k{n}");
        let slot = &mut keys[usize::from(key_slot(key.as_bytes()).0)];
        if slot.is_empty() {
            *slot = key;
            missing -= 1;
        }
        n += 1;
    }
    keys
}

/// A key owned by node `i`, among `k0`, `k1`, ...
fn key_on(cluster: &TestCluster, i: usize, tag: &str) -> String {
    (0..)
        .map(|n| format!("{tag}{n}"))
        .find(|k| cluster.owner(k) == i)
        .expect("some key lands on every node")
}

#[test]
fn plain_clients_reach_every_slot_from_any_node() {
    let cluster = TestCluster::start(3, TIMEOUT_MS);
    let keys = key_per_slot();
    // Set each slot's key through one node and read it through the next, in pipelines, so
    // that every node forwards to both others.
    let mut cons: Vec<redis::Connection> = (0..3).map(|i| cluster.node(i).client()).collect();
    for (via, con) in cons.iter_mut().enumerate() {
        let mut pipe = redis::pipe();
        for (slot, key) in keys.iter().enumerate() {
            if slot % 3 == via {
                pipe.cmd("SET").arg(key).arg(format!("v{slot}")).ignore();
            }
        }
        let () = pipe.query(con).expect("pipelined SETs");
    }
    for (via, con) in cons.iter_mut().enumerate() {
        let mut pipe = redis::pipe();
        let mine: Vec<usize> = (0..keys.len()).filter(|s| s % 3 == (via + 1) % 3).collect();
        for &slot in &mine {
            pipe.cmd("GET").arg(&keys[slot]);
        }
        let got: Vec<String> = pipe.query(con).expect("pipelined GETs");
        for (slot, value) in mine.iter().zip(got) {
            assert_eq!(value, format!("v{slot}"), "slot {slot} read via node {via}");
        }
    }
    // Each key lives on its owner only: the owner's DBSIZE counts its slots' keys.
    for (i, con) in cons.iter_mut().enumerate() {
        let owned = keys.iter().filter(|k| cluster.owner(k) == i).count();
        let size: usize = query(con, &["DBSIZE"]);
        assert_eq!(size, owned, "node {i}'s keys");
    }
    // RESP3 replies come back in RESP3.
    let mut con = cluster.node(0).client_proto(true);
    let key = key_on(&cluster, 2, "h");
    let _: i64 = query(&mut con, &["HSET", &key, "f", "1"]);
    let map: redis::Value = query(&mut con, &["HGETALL", &key]);
    assert!(matches!(map, redis::Value::Map(_)), "{map:?}");
}

#[test]
fn multi_key_commands_and_transactions() {
    let cluster = TestCluster::start(3, TIMEOUT_MS);
    let mut con = cluster.node(0).client();
    let (a, b) = (key_on(&cluster, 1, "a"), key_on(&cluster, 2, "b"));
    // Keys on two nodes: one transaction across them (Redis Cluster says CROSSSLOT).
    let () = query(&mut con, &["MSET", &a, "1", &b, "2"]);
    let got: Vec<String> = query(&mut con, &["MGET", &a, &b]);
    assert_eq!(got, ["1", "2"]);
    // The metrics count them: two transactions across nodes coordinated here, one of them
    // (the MSET) a two-phase commit, and the other nodes' prepares.
    let metrics = cluster.node(0).metrics();
    for line in [
        "keel_cluster_txns_total{outcome=\"begun\"} 2\n",
        "keel_cluster_aborts_total{reason=\"conflict\"} 0\n",
        "keel_cluster_in_doubt 0\n",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    assert!(
        metrics.contains("keel_cluster_commit_microseconds_total "),
        "{metrics}"
    );
    let metrics = cluster.node(1).metrics();
    assert!(
        metrics.contains("keel_cluster_prepares_total{event=\"refused\"} 0\n"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("keel_cluster_prepares_total{event=\"run\"} 0\n"),
        "{metrics}"
    );
    let n: i64 = query(&mut con, &["DEL", &a, &b]);
    assert_eq!(n, 2);
    // Hash tags: one slot, on some other node; forwarded whole.
    let () = query(&mut con, &["MSET", "{t}x", "1", "{t}y", "2"]);
    let got: Vec<String> = query(&mut con, &["MGET", "{t}x", "{t}y"]);
    assert_eq!(got, ["1", "2"]);
    // Different slots of one node: run there as one transaction.
    let (c, d) = (key_on(&cluster, 1, "c"), key_on(&cluster, 1, "d"));
    assert_ne!(key_slot(c.as_bytes()), key_slot(d.as_bytes()));
    let () = query(&mut con, &["MSET", &c, "3", &d, "4"]);
    let got: Vec<String> = query(&mut cluster.node(1).client(), &["MGET", &c, &d]);
    assert_eq!(got, ["3", "4"]);
    // BITOP's keys start after the operation: the destination and every source are routed;
    // on several nodes it runs gathered (keys read whole, computed here, written back).
    let n: i64 = query(&mut con, &["BITOP", "OR", &b, &c, &d]);
    assert_eq!(n, 1);
    let got: String = query(&mut con, &["GET", &b]);
    assert_eq!(got, "7", "'3' | '4'");
    let n: i64 = query(&mut con, &["DEL", &b]);
    assert_eq!(n, 1);
    let (e, f) = (key_on(&cluster, 1, "e"), key_on(&cluster, 1, "f"));
    let () = query(&mut con, &["SET", &e, "x"]);
    let n: i64 = query(&mut con, &["BITOP", "XOR", &f, &e, &f]);
    assert_eq!(n, 1, "forwarded to the node of both keys");
    let got: String = query(&mut con, &["GET", &f]);
    assert_eq!(got, "x");
    // COPY and RENAMENX name two keys: both are routed; on two nodes, gathered.
    let n: i64 = query(&mut con, &["COPY", &f, &b]);
    assert_eq!(n, 1, "COPY across nodes");
    let n: i64 = query(&mut con, &["RENAMENX", &f, &b]);
    assert_eq!(n, 0, "RENAMENX across nodes; the destination exists");
    let got: Vec<String> = query(&mut con, &["MGET", &f, &b]);
    assert_eq!(got, ["x", "x"]);
    let n: i64 = query(&mut con, &["DEL", &b]);
    assert_eq!(n, 1);
    let n: i64 = query(&mut con, &["COPY", &f, &e, "REPLACE"]);
    assert_eq!(n, 1, "COPY forwarded to the node of both keys");
    let n: i64 = query(&mut con, &["RENAMENX", &e, &f]);
    assert_eq!(n, 0, "RENAMENX forwarded; the destination exists");
    let encoding: String = query(&mut con, &["OBJECT", "ENCODING", &e]);
    assert_eq!(encoding, "embstr", "OBJECT routed by its key");
    // MULTI/EXEC with every key on one other node: forwarded as a whole transaction.
    let got: (i64, i64) = redis::pipe()
        .atomic()
        .cmd("INCR")
        .arg(&c)
        .cmd("INCRBY")
        .arg(&d)
        .arg(10)
        .query(&mut con)
        .expect("forwarded EXEC");
    assert_eq!(got, (4, 14));
    // ... and with keys on two nodes: one transaction across them.
    let got: (i64, i64) = redis::pipe()
        .atomic()
        .cmd("INCR")
        .arg(&a)
        .cmd("INCRBY")
        .arg(&b)
        .arg(5)
        .query(&mut con)
        .expect("EXEC across nodes");
    assert_eq!(got, (1, 5));
    // A failing command aborts all of it, on every node.
    let _: () = query(&mut con, &["MULTI"]);
    let _: String = query(&mut con, &["INCR", &a]);
    let _: String = query(&mut con, &["LPUSH", &b, "x"]);
    assert!(error(&mut con, &["EXEC"]).starts_with("WRONGTYPE"));
    let got: Vec<String> = query(&mut con, &["MGET", &a, &b]);
    assert_eq!(got, ["1", "5"]);
    // Multi-key commands whose keys are on several nodes, inside MULTI: key by key, each
    // part on its key's node in the one transaction, the replies merged as Redis gives them.
    type Replies = (String, Vec<Option<String>>, i64, i64);
    let got: Replies = redis::pipe()
        .atomic()
        .cmd("MSET")
        .arg(&a)
        .arg("7")
        .arg(&b)
        .arg("8")
        .arg(&a)
        .arg("9")
        .cmd("MGET")
        .arg(&[&b, &a, &c])
        .cmd("EXISTS")
        .arg(&[&a, &b, &a])
        .cmd("DEL")
        .arg(&[&a, &b])
        .query(&mut con)
        .expect("EXEC with multi-key commands across nodes");
    assert_eq!(
        got,
        (
            "OK".to_owned(),
            vec![Some("8".into()), Some("9".into()), Some("4".into())],
            3,
            2
        )
    );
    // Commands without keys: PING, ECHO and TIME are answered by the node the client is
    // on; DBSIZE (like KEYS, SCAN, FLUSHDB) runs on it, as outside MULTI, in the transaction.
    let local_keys: i64 = query(&mut con, &["DBSIZE"]);
    type Keyless = (String, String, String, i64, Vec<String>, String);
    let got: Keyless = redis::pipe()
        .atomic()
        .cmd("SET")
        .arg(&a)
        .arg("10")
        .cmd("PING")
        .cmd("ECHO")
        .arg("hi")
        .cmd("DBSIZE")
        .cmd("TIME")
        .cmd("SET")
        .arg(&b)
        .arg("11")
        .query(&mut con)
        .expect("EXEC across nodes with commands without keys");
    assert_eq!((&got.0[..], &got.1[..], &got.2[..]), ("OK", "PONG", "hi"));
    assert_eq!(got.3, local_keys, "DBSIZE of the node the client is on");
    assert_eq!(got.4.len(), 2, "TIME: seconds and microseconds");
    assert_eq!(got.5, "OK");
    let got: Vec<String> = query(&mut con, &["MGET", &a, &b]);
    assert_eq!(got, ["10", "11"]);
    // A command that is not a data command (nor PING, ECHO, TIME) is refused at EXEC, and
    // nothing of the transaction is applied.
    let _: () = query(&mut con, &["MULTI"]);
    let _: String = query(&mut con, &["SET", &a, "12"]);
    let _: String = query(&mut con, &["PUBLISH", "ch", "m"]);
    let _: String = query(&mut con, &["SET", &b, "13"]);
    let refused = error(&mut con, &["EXEC"]);
    assert!(refused.contains("'publish' is none"), "{refused}");
    let got: Vec<String> = query(&mut con, &["MGET", &a, &b]);
    assert_eq!(got, ["10", "11"]);
    let _: () = query(&mut con, &["MSET", &a, "1", &b, "5"]);
    // INFO cluster counts them by kind and outcome.
    let info: String = query(&mut con, &["INFO", "cluster"]);
    let count = |name: &str| -> u64 {
        let line = info
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("{name} in {info}"));
        line.trim().parse().expect("a count")
    };
    // MSET, MGET, DEL, the EXEC, the MGET, the split EXEC, the EXEC with PING and the
    // rest, two MGETs, the MSET: two-phase; BITOP and COPY gathered (a read and a write
    // each), RENAMENX gathered (a read: it changed nothing), the MGET after them; the failing
    // EXEC: aborted (the one with PUBLISH never began).
    assert_eq!(count("keel_cluster_txns_committed"), 16, "{info}");
    assert_eq!(count("keel_cluster_aborts_failed"), 1, "{info}");
    assert_eq!(count("keel_cluster_exec_forwarded"), 1, "{info}");
    assert!(count("keel_cluster_commit_us_max") > 0, "{info}");
    // The transport's messages: a prepare, a decision and more per transaction, in frames
    // that may carry several; CLUSTER INFO reports the same messages as Redis's bus.
    let (sent, received) = (
        count("keel_cluster_bus_messages_sent"),
        count("keel_cluster_bus_messages_received"),
    );
    assert!(sent >= 10 && received >= 10, "{info}");
    let frames = count("keel_cluster_bus_frames_sent");
    assert!(frames > 0 && frames <= sent, "{info}");
    assert_eq!(count("keel_cluster_bus_messages_dropped"), 0, "{info}");
    let cluster_info: String = query(&mut con, &["CLUSTER", "INFO"]);
    let bus_sent = crate::info_counter(&cluster_info, "cluster_stats_messages_sent");
    assert!(bus_sent >= sent, "{cluster_info}");
    // Local keys of several slots in MULTI run here, as on a single node.
    let (e, f) = (key_on(&cluster, 0, "e"), key_on(&cluster, 0, "f"));
    let got: (i64, i64) = redis::pipe()
        .atomic()
        .cmd("INCR")
        .arg(&e)
        .cmd("INCR")
        .arg(&f)
        .query(&mut con)
        .expect("local EXEC");
    assert_eq!(got, (1, 1));
}

#[test]
fn cluster_aware_connections_get_moved() {
    let cluster = TestCluster::start(3, TIMEOUT_MS);
    let mut con = cluster.node(0).client();
    let remote = key_on(&cluster, 2, "m");
    let local = key_on(&cluster, 0, "l");
    // Before asking for the slot map: forwarded.
    let () = query(&mut con, &["SET", &remote, "v"]);
    let _: redis::Value = query(&mut con, &["CLUSTER", "SLOTS"]);
    let slot = key_slot(remote.as_bytes()).0;
    assert_eq!(
        error(&mut con, &["GET", &remote]),
        format!("MOVED {slot} {}", cluster.addrs[2])
    );
    let v: Option<String> = query(&mut con, &["GET", &local]);
    assert_eq!(v, None);
    // Inside MULTI: MOVED at queue time, and EXEC aborts.
    let _: () = query(&mut con, &["MULTI"]);
    assert!(error(&mut con, &["GET", &remote]).starts_with("MOVED "));
    assert!(error(&mut con, &["EXEC"]).starts_with("EXECABORT"));
    // Another plain connection is still forwarded.
    let v: String = query(&mut cluster.node(0).client(), &["GET", &remote]);
    assert_eq!(v, "v");
}

#[test]
fn redis_rs_cluster_client_routes_by_itself() {
    let cluster = TestCluster::start(3, TIMEOUT_MS);
    let client = redis::cluster::ClusterClient::new(vec![format!("redis://{}/", cluster.addrs[1])])
        .expect("cluster client");
    let mut con = client
        .get_connection()
        .expect("bootstraps from CLUSTER SLOTS");
    let keys = key_per_slot();
    for key in keys.iter().step_by(97) {
        let () = redis::cmd("SET")
            .arg(key)
            .arg(key)
            .query(&mut con)
            .expect("SET");
    }
    for key in keys.iter().step_by(97) {
        let v: String = redis::cmd("GET").arg(key).query(&mut con).expect("GET");
        assert_eq!(&v, key);
        // The key is on its owner, where the client sent it.
        let owner = cluster.owner(key);
        let mut direct = cluster.node(owner).client();
        let _: redis::Value = query(&mut direct, &["CLUSTER", "SLOTS"]);
        let v: String = query(&mut direct, &["GET", key]);
        assert_eq!(&v, key);
    }
    let () = redis::cmd("MSET")
        .arg("{u}a")
        .arg(1)
        .arg("{u}b")
        .arg(2)
        .query(&mut con)
        .expect("one-slot MSET");
    let n: i64 = redis::cmd("INCR")
        .arg("{u}a")
        .query(&mut con)
        .expect("INCR");
    assert_eq!(n, 2);
}

#[test]
fn unreachable_owner_is_clusterdown_within_the_timeout() {
    // Node 2's port is a socket that accepts and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let listeners: Vec<TcpListener> = (0..2)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    let mut addrs: Vec<SocketAddr> = listeners
        .iter()
        .map(|l| l.local_addr().expect("address"))
        .collect();
    addrs.push(silent.local_addr().expect("address"));
    let mut listeners = listeners.into_iter();
    let node0 = TestServer::on(listeners.next(), {
        let map = Membership::even(&addrs, 0, 300).expect("valid");
        move |c| c.cluster = Some(Arc::new(map))
    });
    let killed = TestServer::on(listeners.next(), {
        let map = Membership::even(&addrs, 1, 300).expect("valid");
        move |c| c.cluster = Some(Arc::new(map))
    });
    let cluster = TestCluster {
        nodes: vec![],
        addrs: addrs.clone(),
    };
    let mut con = node0.client();
    let on_silent = key_on(&cluster, 2, "s");
    let started = Instant::now();
    let e = error(&mut con, &["GET", &on_silent]);
    let took = started.elapsed();
    assert!(
        e.starts_with("CLUSTERDOWN ") && e.contains("did not answer within 300 ms"),
        "{e}"
    );
    assert!(took >= Duration::from_millis(250), "gave up after {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // A stopped node: refused at once.
    let on_killed = key_on(&cluster, 1, "k");
    // Node 1 answers, but on a loaded machine not always within 300 ms: the SET (which
    // leaves node 0 a pooled connection to it) goes again until it lands.
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = redis::cmd("SET")
        .arg(&on_killed)
        .arg(1)
        .query::<()>(&mut con)
    {
        assert!(
            e.code() == Some("CLUSTERDOWN") && Instant::now() < deadline,
            "SET through node 0 to node 1: {e}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(killed);
    let e = error(&mut con, &["GET", &on_killed]);
    assert!(
        e.starts_with("CLUSTERDOWN ") && e.contains("cannot be reached"),
        "{e}"
    );
    // The node's own slots still work.
    let local = key_on(&cluster, 0, "o");
    let () = query(&mut con, &["SET", &local, "1"]);
    drop(silent);
}

#[test]
fn a_stopped_node_of_three() {
    let mut cluster = TestCluster::start(3, TIMEOUT_MS);
    let mut con = cluster.node(0).client();
    let key = key_on(&cluster, 1, "x");
    let () = query(&mut con, &["SET", &key, "1"]);
    cluster.kill(1);
    assert!(error(&mut con, &["GET", &key]).starts_with("CLUSTERDOWN "));
    let other = key_on(&cluster, 2, "y");
    let () = query(&mut con, &["SET", &other, "1"]);
}

#[test]
fn cluster_commands_outside_cluster_mode() {
    let server = TestServer::start();
    let mut con = server.client();
    for cmd in [
        &["CLUSTER", "SLOTS"][..],
        &["CLUSTER", "KEYSLOT", "x"],
        &["CLUSTER", "COUNTKEYSINSLOT", "1"],
        &["READONLY"],
    ] {
        assert_eq!(
            error(&mut con, cmd),
            "ERR This instance has cluster support disabled"
        );
    }
    let hello: redis::Value = query(&mut con, &["HELLO", "3"]);
    assert!(format!("{hello:?}").contains("standalone"), "{hello:?}");
}

#[test]
fn cluster_command_errors() {
    let cluster = TestCluster::start(1, TIMEOUT_MS);
    let mut con = cluster.node(0).client();
    assert_eq!(
        error(&mut con, &["CLUSTER", "KEYSLOT"]),
        "ERR wrong number of arguments for 'cluster|keyslot' command"
    );
    assert_eq!(
        error(&mut con, &["CLUSTER", "SLOTS", "x"]),
        "ERR wrong number of arguments for 'cluster|slots' command"
    );
    assert_eq!(
        error(&mut con, &["CLUSTER", "foo"]),
        "ERR unknown subcommand 'foo'. Try CLUSTER HELP."
    );
    // Redis Cluster's ways that keel has others for: the error names keel's.
    for (args, names) in [
        (
            &["CLUSTER", "MEET", "127.0.0.1", "7005"][..],
            "--cluster-join",
        ),
        (&["CLUSTER", "FORGET", "n2"], "remove-node"),
        (&["CLUSTER", "ADDSLOTS", "1"], "KEEL.MOVESLOTS"),
        (&["CLUSTER", "DELSLOTSRANGE", "1", "2"], "rebalance"),
        (&["CLUSTER", "REPLICATE", "n2"], "--replicas"),
        (&["CLUSTER", "FAILOVER"], "Raft"),
    ] {
        let text = error(&mut con, args);
        assert!(
            text.starts_with("ERR keel: ") && text.contains(names),
            "{text}"
        );
    }
    // A single-copy cluster cannot move slots: SETSLOT says so, and checks its input first.
    for (args, text) in [
        (
            &["CLUSTER", "SETSLOT", "16384", "NODE", "node-1"][..],
            "ERR Invalid or out of range slot",
        ),
        (
            &["CLUSTER", "SETSLOT", "1", "NODE", "nobody"],
            "ERR I don't know about node nobody",
        ),
        (
            &["CLUSTER", "SETSLOT", "1", "SIDEWAYS", "node-1"],
            "ERR Invalid CLUSTER SETSLOT action or number of arguments. Try CLUSTER HELP",
        ),
        (
            &["CLUSTER", "SETSLOT", "1"],
            "ERR wrong number of arguments for 'cluster|setslot' command",
        ),
    ] {
        assert_eq!(error(&mut con, args), text);
    }
    let refused = error(&mut con, &["CLUSTER", "SETSLOT", "1", "NODE", "node-1"]);
    assert!(refused.contains("replicated cluster"), "{refused}");
    assert_eq!(
        error(&mut con, &["READONLY", "x"]),
        "ERR wrong number of arguments for 'readonly' command"
    );
    let slot: i64 = query(&mut con, &["CLUSTER", "KEYSLOT", "{user1000}.following"]);
    assert_eq!(slot, 3443);
    let id: String = query(&mut con, &["CLUSTER", "MYID"]);
    assert_eq!(id, "node-1");
    for cmd in ["ASKING", "READONLY", "READWRITE"] {
        let ok: String = query(&mut con, &[cmd]);
        assert_eq!(ok, "OK");
    }
}

/// `CLUSTER COUNTKEYSINSLOT` and `GETKEYSINSLOT` answer for the node that holds the slot (a
/// string, a hash and a key set through another node), none elsewhere, with Redis' errors.
#[test]
fn keys_in_a_slot_are_counted_where_the_slot_lives() {
    let cluster = TestCluster::start(2, TIMEOUT_MS);
    let key = key_on(&cluster, 1, "k");
    let mut con = cluster.node(0).client();
    let slot: i64 = query(&mut con, &["CLUSTER", "KEYSLOT", &key]);
    let (tagged, hash) = (format!("{{{key}}}a"), format!("{{{key}}}h"));
    let () = query(&mut con, &["MSET", &key, "1", &tagged, "2"]);
    let _: i64 = query(&mut con, &["HSET", &hash, "f", "v"]);
    let slot = slot.to_string();
    let mut owner = cluster.node(1).client();
    let n: i64 = query(&mut owner, &["CLUSTER", "COUNTKEYSINSLOT", &slot]);
    assert_eq!(n, 3);
    let keys: Vec<String> = query(&mut owner, &["CLUSTER", "GETKEYSINSLOT", &slot, "2"]);
    assert_eq!(keys.len(), 2, "{keys:?}");
    let all: Vec<String> = query(&mut owner, &["CLUSTER", "GETKEYSINSLOT", &slot, "10"]);
    let mut expected = vec![key.clone(), tagged, hash];
    expected.sort();
    let mut got = all.clone();
    got.sort();
    assert_eq!(got, expected);
    let n: i64 = query(&mut con, &["CLUSTER", "COUNTKEYSINSLOT", &slot]);
    assert_eq!(n, 0, "the other node holds none of the slot");
    for (cmd, text) in [
        (
            &["CLUSTER", "COUNTKEYSINSLOT", "16384"][..],
            "ERR Invalid slot",
        ),
        (
            &["CLUSTER", "COUNTKEYSINSLOT", "x"],
            "ERR value is not an integer or out of range",
        ),
        (
            &["CLUSTER", "GETKEYSINSLOT", "1", "-1"],
            "ERR Invalid slot or number of keys",
        ),
        (
            &["CLUSTER", "GETKEYSINSLOT", "1"],
            "ERR wrong number of arguments for 'cluster|getkeysinslot' command",
        ),
    ] {
        assert_eq!(error(&mut owner, cmd), text, "{}", cmd.join(" "));
    }
}

// ---------------------------------------------------------------------------------------------
// Reply shapes against a real Redis Cluster node.

/// A `redis-server --cluster-enabled yes` owning every slot; killed when dropped.
struct RedisClusterNode {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl RedisClusterNode {
    fn start() -> RedisClusterNode {
        const BINARY: &str = "/usr/bin/redis-server";
        assert!(
            std::path::Path::new(BINARY).exists(),
            "{BINARY} is missing: the cluster reply test needs a real Redis (apt-get install \
             redis-server)"
        );
        for _ in 0..10 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            // The cluster bus listens on port + 10000.
            if port > 55_000 {
                continue;
            }
            let mut child = Command::new(BINARY)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--cluster-enabled",
                    "yes",
                ])
                .arg("--cluster-config-file")
                .arg(dir.path().join("nodes.conf"))
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("{BINARY} does not start: {e}"));
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if std::net::TcpStream::connect(addr).is_ok() {
                    let node = RedisClusterNode {
                        child,
                        addr,
                        _dir: dir,
                    };
                    let mut con = crate::connect(&format!("redis://{addr}/"));
                    let () = query(&mut con, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
                    return node;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("{BINARY} did not start listening on a loopback port");
    }
}

impl Drop for RedisClusterNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `v` with every node-specific string (ids, addresses) and port replaced, so that two
/// single-node clusters' replies compare by shape.
fn shape(v: redis::Value, ids: &[&str], port: i64) -> redis::Value {
    use redis::Value as V;
    let norm = |items: Vec<V>| items.into_iter().map(|x| shape(x, ids, port)).collect();
    match v {
        V::BulkString(b) => {
            let s = String::from_utf8_lossy(&b).into_owned();
            if ids.contains(&s.as_str()) || s.is_empty() || s == "127.0.0.1" {
                V::BulkString(b"X".to_vec())
            } else {
                V::BulkString(b)
            }
        }
        V::Int(n) if n == port => V::Int(0),
        V::Array(items) => V::Array(norm(items)),
        V::Map(pairs) => V::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (shape(k, ids, port), shape(v, ids, port)))
                .collect(),
        ),
        other => other,
    }
}

#[test]
fn cluster_replies_have_redis_shapes() {
    let redis = RedisClusterNode::start();
    let cluster = TestCluster::start(1, TIMEOUT_MS);
    for resp3 in [false, true] {
        let proto = if resp3 { "?protocol=resp3" } else { "" };
        let mut theirs = crate::connect(&format!("redis://{}/{proto}", redis.addr));
        let mut ours = cluster.node(0).client_proto(resp3);
        let their_id: String = query(&mut theirs, &["CLUSTER", "MYID"]);
        let ids = [their_id.as_str(), "node-1"];
        let (their_port, our_port) = (
            i64::from(redis.addr.port()),
            i64::from(cluster.addrs[0].port()),
        );
        for sub in ["SLOTS", "SHARDS"] {
            let t: redis::Value = query(&mut theirs, &["CLUSTER", sub]);
            let o: redis::Value = query(&mut ours, &["CLUSTER", sub]);
            assert_eq!(
                shape(o, &ids, our_port),
                shape(t, &ids, their_port),
                "CLUSTER {sub} (resp3 {resp3})"
            );
        }
        for key in ["foo", "{user1000}.followers", "", "a{}b{c}"] {
            let t: i64 = query(&mut theirs, &["CLUSTER", "KEYSLOT", key]);
            let o: i64 = query(&mut ours, &["CLUSTER", "KEYSLOT", key]);
            assert_eq!(o, t, "CLUSTER KEYSLOT {key:?}");
        }
        // INFO: the same fields in the same order.
        let t: String = query(&mut theirs, &["CLUSTER", "INFO"]);
        let o: String = query(&mut ours, &["CLUSTER", "INFO"]);
        let fields = |s: &str| -> Vec<String> {
            s.lines()
                .filter_map(|l| l.split_once(':').map(|(k, _)| k.to_owned()))
                .collect()
        };
        assert_eq!(fields(&o), fields(&t));
        assert!(o.starts_with("cluster_state:ok\r\n"), "{o}");
        // NODES: one line, the same fields but the address.
        let t: String = query(&mut theirs, &["CLUSTER", "NODES"]);
        let o: String = query(&mut ours, &["CLUSTER", "NODES"]);
        let words = |s: &str| -> Vec<String> {
            s.split_whitespace()
                .enumerate()
                // Not the id, the address or the config epoch.
                .filter(|(i, _)| ![0, 1, 6].contains(i))
                .map(|(_, w)| w.to_owned())
                .collect()
        };
        assert_eq!(words(&o), words(&t), "{o} vs {t}");
        assert!(o.ends_with('\n') && o.lines().count() == 1, "{o:?}");
        // Databases other than 0 get Redis Cluster's errors (this Redis node owns no slots,
        // so it answers commands with keys CLUSTERDOWN: MOVE's text is Redis's source).
        let reply = |con: &mut redis::Connection, args: &[&str]| match redis::cmd(args[0])
            .arg(&args[1..])
            .query::<redis::Value>(con)
        {
            Ok(v) => format!("{v:?}"),
            Err(e) => e.to_string(),
        };
        for args in [
            &["SELECT", "0"][..],
            &["SELECT", "1"],
            &["SELECT", "x"],
            &["SELECT", "99999999999"],
            &["SWAPDB", "0", "0"],
            &["SWAPDB", "0", "1"],
            &["SWAPDB", "x", "0"],
        ] {
            assert_eq!(reply(&mut ours, args), reply(&mut theirs, args), "{args:?}");
        }
        for db in ["0", "1", "x"] {
            assert_eq!(
                reply(&mut ours, &["MOVE", "a", db]),
                "ResponseError: MOVE is not allowed in cluster mode"
            );
        }
        // COMMAND's key specifications for routing.
        // (Not BITFIELD: Redis adds a `notes` text to its key specification.)
        for name in [
            "get", "mset", "del", "hget", "exists", "touch", "setbit", "getbit",
        ] {
            let t: redis::Value = query(&mut theirs, &["COMMAND", "INFO", name]);
            let o: redis::Value = query(&mut ours, &["COMMAND", "INFO", name]);
            let specs = |v: redis::Value| match v {
                redis::Value::Array(mut a) => match a.remove(0) {
                    redis::Value::Array(mut info) => info.remove(8),
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            };
            assert_eq!(specs(o), specs(t), "COMMAND INFO {name} key specs");
        }
    }
}

#[test]
fn movable_keys_and_blocking_pops_are_routed() {
    // A request timeout shorter than the pops' own timeouts: they still wait for them. (Not
    // shorter still: every forwarded request must finish within it on a loaded machine.)
    let cluster = TestCluster::start(3, 800);
    let mut con = cluster.node(0).client();
    let (a, b) = (key_on(&cluster, 1, "a"), key_on(&cluster, 2, "b"));
    let _: i64 = query(&mut con, &["SADD", &a, "x", "y"]);
    let n: i64 = query(&mut con, &["SINTERCARD", "1", &a]);
    assert_eq!(n, 2, "SINTERCARD's key is found by numkeys and forwarded");
    let n: i64 = query(&mut con, &["SINTERCARD", "2", &a, &b]);
    assert_eq!(n, 0, "keys on two nodes: gathered");
    // BLPOP with a timeout: forwarded, and waits its full two seconds.
    let started = Instant::now();
    let v: Option<Vec<String>> = query(&mut con, &["BLPOP", &b, "2"]);
    assert_eq!(v, None);
    assert!(started.elapsed() >= Duration::from_millis(1900));
    // BLPOP without a timeout: forwarded, served by a push on the owner.
    let owner = cluster.node(2).url(false);
    let b2 = b.clone();
    let pusher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let mut con = crate::connect(&owner);
        let _: i64 = query(&mut con, &["RPUSH", &b2, "v"]);
    });
    let v: Vec<String> = query(&mut con, &["BLPOP", &b, "0"]);
    assert_eq!(v, [b.clone(), "v".to_owned()]);
    pusher.join().expect("pusher");
}

/// Blocking pops whose keys are on several nodes (Redis Cluster: `CROSSSLOT`): each try runs
/// gathered, and a client with nothing to pop waits until a push on any node, its timeout
/// or `CLIENT UNBLOCK`; inside `MULTI` it pops or answers nil at once, as in Redis. Poppers
/// blocked on three nodes while pushes land on all of them take every element exactly once.
#[test]
fn blocking_pops_across_nodes_wait_for_a_push_anywhere() {
    let cluster = TestCluster::start(3, TIMEOUT_MS);
    let mut con = cluster.node(0).client();
    // x on node 1, y on node 2, z on this node (0).
    let (x, y, z) = keys_on_each_node(&cluster);
    let started = Instant::now();
    let v: Option<Vec<String>> = query(&mut con, &["BLPOP", &x, &y, "0.3"]);
    assert_eq!(v, None, "nothing to pop: nil at the timeout");
    assert!(started.elapsed() >= Duration::from_millis(290));
    let _: i64 = query(&mut con, &["RPUSH", &y, "y1"]);
    let v: Vec<String> = query(&mut con, &["BLPOP", &x, &y, "1"]);
    assert_eq!(
        v,
        [y.clone(), "y1".to_owned()],
        "the first key that has something"
    );
    // A push on a third node, and one on the waiting client's node, each serve the wait.
    for (pushed, on) in [(&y, 2), (&z, 0)] {
        let (url, key) = (cluster.node(on).url(false), pushed.clone());
        let pusher = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let _: i64 = query(&mut crate::connect(&url), &["LPUSH", &key, "late"]);
        });
        let started = Instant::now();
        let v: Vec<String> = query(&mut con, &["BLPOP", &x, pushed, "10"]);
        assert_eq!(v, [pushed.clone(), "late".to_owned()]);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        pusher.join().expect("pusher");
    }
    // BLMOVE waits on its source only, and moves across nodes.
    let _: i64 = query(&mut con, &["RPUSH", &z, "in-z"]);
    let url = cluster.node(1).url(false);
    let x2 = x.clone();
    let pusher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let _: i64 = query(&mut crate::connect(&url), &["RPUSH", &x2, "m"]);
    });
    let moved: String = query(&mut con, &["BLMOVE", &x, &z, "LEFT", "RIGHT", "10"]);
    assert_eq!(moved, "m");
    pusher.join().expect("pusher");
    let in_z: Vec<String> = query(&mut con, &["LRANGE", &z, "0", "-1"]);
    assert_eq!(in_z, ["in-z", "m"]);
    // An `LMOVE` across nodes (gathered: it writes its destination with `KEEL.RESTORE` on
    // the destination's node) wakes a client blocked there on the destination.
    let (url, key) = (cluster.node(2).url(false), y.clone());
    let waiter = std::thread::spawn(move || {
        let v: Option<Vec<String>> = query(&mut crate::connect(&url), &["BLPOP", &key, "10"]);
        v
    });
    let mut on_y = cluster.node(2).client();
    crate::lists::wait_blocked(&mut on_y, 1);
    let _: i64 = query(&mut con, &["RPUSH", &x, "to-y"]);
    let _: String = query(&mut con, &["LMOVE", &x, &y, "LEFT", "RIGHT"]);
    assert_eq!(
        waiter.join().expect("waiter"),
        Some(vec![y.clone(), "to-y".to_owned()])
    );
    // A waited key that another client turns into a sorted set (COPY, here on the waiting
    // client's node, which wakes it) keeps the client waiting, as in Redis 7.0: nil at the
    // timeout, not WRONGTYPE.
    let zsrc = format!("{{{z}}}zsrc");
    let _: i64 = query(&mut con, &["ZADD", &zsrc, "1", "m"]);
    let (url, src, dst) = (cluster.node(0).url(false), zsrc.clone(), z.clone());
    let _: i64 = query(&mut con, &["DEL", &z]);
    let copier = std::thread::spawn(move || {
        let mut c = crate::connect(&url);
        crate::lists::wait_blocked(&mut c, 1);
        let copied: i64 = query(&mut c, &["COPY", &src, &dst]);
        assert_eq!(copied, 1);
    });
    let v: Option<Vec<String>> = query(&mut con, &["BLPOP", &x, &z, "1.5"]);
    assert_eq!(v, None, "the sorted set is not popped, nor an error");
    copier.join().expect("copier");
    let _: i64 = query(&mut con, &["DEL", &z, &zsrc]);
    // Errors at once, and nothing moves.
    assert!(error(&mut con, &["BLPOP", &x, &y, "-1"]).contains("timeout is negative"));
    let _: () = query(&mut con, &["SET", &y, "s"]);
    assert!(error(&mut con, &["BLPOP", &x, &y, "0"]).starts_with("WRONGTYPE"));
    let _: i64 = query(&mut con, &["DEL", &y]);
    // CLIENT UNBLOCK ends the wait.
    let id: i64 = query(&mut con, &["CLIENT", "ID"]);
    let url = cluster.node(0).url(false);
    let unblocker = std::thread::spawn(move || {
        let mut con = crate::connect(&url);
        for _ in 0..100 {
            std::thread::sleep(Duration::from_millis(50));
            let n: i64 = query(&mut con, &["CLIENT", "UNBLOCK", &id.to_string(), "ERROR"]);
            if n == 1 {
                return;
            }
        }
        panic!("the client never blocked");
    });
    let unblocked = error(&mut con, &["BLPOP", &x, &y, "0"]);
    assert!(unblocked.starts_with("UNBLOCKED"), "{unblocked}");
    unblocker.join().expect("unblocker");
    // A client that goes while it waits leaves the registry (and stops looking).
    let started = Instant::now();
    {
        let mut gone = cluster.node(0).client();
        gone.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("read timeout");
        let waited = redis::cmd("BLPOP")
            .arg(&x)
            .arg(&y)
            .arg(0)
            .query::<Option<Vec<String>>>(&mut gone);
        assert!(waited.is_err(), "nothing to pop: {waited:?}");
    }
    let mut blocked = || -> i64 {
        let info: String = query(&mut con, &["INFO", "clients"]);
        info.lines()
            .find_map(|l| l.strip_prefix("blocked_clients:"))
            .expect("blocked_clients")
            .trim()
            .parse()
            .expect("a count")
    };
    while blocked() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a gone client still blocked"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Inside MULTI: gathered with the rest of the queue, never blocking.
    let got: (i64, Option<String>, String, Vec<String>) = redis::pipe()
        .atomic()
        .cmd("RPUSH")
        .arg(&x)
        .arg("q")
        .cmd("BLMOVE")
        .arg(&y)
        .arg(&z)
        .arg("LEFT")
        .arg("LEFT")
        .arg("0")
        .cmd("BLMOVE")
        .arg(&x)
        .arg(&y)
        .arg("LEFT")
        .arg("LEFT")
        .arg("0")
        .cmd("LRANGE")
        .arg(&y)
        .arg("0")
        .arg("-1")
        .query(&mut con)
        .expect("EXEC with blocking pops across nodes");
    assert_eq!(got, (1, None, "q".to_owned(), vec!["q".to_owned()]));
    let _: i64 = query(&mut con, &["DEL", &x, &y, &z]);
    // The sorted sets' blocking pops too.
    let _: i64 = query(&mut con, &["ZADD", &y, "2", "b"]);
    let v: (String, String, String) = query(&mut con, &["BZPOPMIN", &x, &y, "1"]);
    assert_eq!(v, (y.clone(), "b".to_owned(), "2".to_owned()));
    let v: Option<Vec<String>> = query(&mut con, &["BZPOPMAX", &x, &y, "0.1"]);
    assert_eq!(v, None);
    // Poppers blocked on every node, pushes on every node: each element popped once.
    const PUSHES: usize = 60;
    let popped = Arc::new(std::sync::Mutex::new(Vec::new()));
    let poppers: Vec<_> = (0..3)
        .map(|i| {
            let (url, keys) = (
                cluster.node(i).url(false),
                [x.clone(), y.clone(), z.clone()],
            );
            let popped = Arc::clone(&popped);
            std::thread::spawn(move || {
                let mut con = crate::connect(&url);
                loop {
                    let v: Option<(String, String)> =
                        query(&mut con, &["BLPOP", &keys[0], &keys[1], &keys[2], "2"]);
                    match v {
                        Some((_, value)) => popped.lock().expect("popped").push(value),
                        None => return,
                    }
                }
            })
        })
        .collect();
    for n in 0..PUSHES {
        let key = [&x, &y, &z][n % 3];
        let mut con = cluster.node((n / 3) % 3).client();
        let _: i64 = query(&mut con, &["RPUSH", key, &format!("v{n}")]);
        std::thread::sleep(Duration::from_millis(5));
    }
    for p in poppers {
        p.join().expect("popper");
    }
    let mut popped = std::mem::take(&mut *popped.lock().expect("popped"));
    popped.sort_by_key(|v| v[1..].parse::<usize>().expect("v<n>"));
    let pushed: Vec<String> = (0..PUSHES).map(|n| format!("v{n}")).collect();
    assert_eq!(popped, pushed, "every element popped exactly once");
    let n: i64 = query(&mut con, &["EXISTS", &x, &y, &z]);
    assert_eq!(n, 0);
}

/// `WATCH` of keys on other nodes: each owner records what to check, and `EXEC` (a
/// transaction across the nodes) checks it where the key lives: a change by another client,
/// on any node, aborts it (nil), and so does a watched key's deadline passing.
#[test]
fn watch_across_nodes() {
    let cluster = TestCluster::start(3, TIMEOUT_MS);
    let mut con = cluster.node(0).client();
    let mut other = cluster.node(1).client();
    let (a, b, c) = (
        key_on(&cluster, 0, "a"),
        key_on(&cluster, 1, "b"),
        key_on(&cluster, 2, "c"),
    );
    let () = query(&mut con, &["MSET", &a, "1", &b, "1", &c, "1"]);
    let exec = |con: &mut redis::Connection, watched: &[&str], change: Option<&str>| {
        let mut args = vec!["WATCH"];
        args.extend(watched);
        let _: () = query(con, &args);
        if let Some(key) = change {
            let _: i64 = query(&mut cluster.node(2).client(), &["INCR", key]);
        }
        let _: () = query(con, &["MULTI"]);
        let _: String = query(con, &["INCR", &a]);
        let _: String = query(con, &["INCR", &b]);
        query::<Option<Vec<i64>>>(con, &["EXEC"])
    };
    // Nothing changed: it runs.
    assert_eq!(exec(&mut con, &[&a, &b, &c], None), Some(vec![2, 2]));
    // A change of any watched key, on any node, aborts it.
    for key in [&a, &b, &c] {
        assert_eq!(exec(&mut con, &[&a, &b, &c], Some(key)), None, "{key}");
    }
    let got: Vec<i64> = query(&mut other, &["MGET", &a, &b, &c]);
    assert_eq!(got, [3, 3, 2]);
    // Only a remote key watched, only local commands queued: still checked.
    let _: () = query(&mut con, &["WATCH", &c]);
    let () = query(&mut other, &["SET", &c, "x"]);
    let _: () = query(&mut con, &["MULTI"]);
    let _: String = query(&mut con, &["SET", &a, "y"]);
    assert_eq!(query::<Option<Vec<String>>>(&mut con, &["EXEC"]), None);
    let got: String = query(&mut con, &["GET", &a]);
    assert_eq!(got, "3");
    // A watched remote key whose deadline passes aborts it too. The WATCH must come before
    // the deadline, which a loaded machine can miss: then again.
    for tries in 1.. {
        let set = Instant::now();
        let () = query(&mut con, &["SET", &c, "1", "PX", "200"]);
        let _: () = query(&mut con, &["WATCH", &c]);
        if set.elapsed() < Duration::from_millis(200) {
            break;
        }
        let _: () = query(&mut con, &["UNWATCH"]);
        assert!(tries < 20, "never watched {c} within 200 ms of setting it");
    }
    std::thread::sleep(Duration::from_millis(300));
    let _: () = query(&mut con, &["MULTI"]);
    let _: String = query(&mut con, &["SET", &a, "z"]);
    assert_eq!(query::<Option<Vec<String>>>(&mut con, &["EXEC"]), None);
    // UNWATCH forgets remote keys as well.
    let _: () = query(&mut con, &["WATCH", &b]);
    let () = query(&mut other, &["SET", &b, "7"]);
    let _: () = query(&mut con, &["UNWATCH"]);
    let _: () = query(&mut con, &["MULTI"]);
    let _: String = query(&mut con, &["SET", &a, "w"]);
    assert_eq!(
        query::<Option<Vec<String>>>(&mut con, &["EXEC"]),
        Some(vec!["OK".into()])
    );
}

/// `KEEL.RANGE` in cluster mode covers every node's keys, read in one transaction across the
/// nodes and merged in key order, with `REV` and `LIMIT` as on a single node.
#[test]
fn keel_range_spans_nodes() {
    let cluster = TestCluster::start(3, TIMEOUT_MS);
    let mut con = cluster.node(1).client();
    let keys: Vec<String> = (0..30).map(|i| format!("r{i:02}")).collect();
    let owners: std::collections::BTreeSet<usize> = keys.iter().map(|k| cluster.owner(k)).collect();
    assert_eq!(owners.len(), 3, "the keys are spread over every node");
    let mut args = vec!["MSET"];
    for k in &keys {
        args.push(k);
        args.push(k);
    }
    let () = query(&mut con, &args);
    let () = query(&mut con, &["SET", "other", "x"]);
    let pairs: Vec<(String, String)> = query(&mut con, &["KEEL.RANGE", "[r", "(s"]);
    let want: Vec<(String, String)> = keys.iter().map(|k| (k.clone(), k.clone())).collect();
    assert_eq!(pairs, want);
    let pairs: Vec<(String, String)> = query(&mut con, &["KEEL.RANGE", "[r", "(s", "LIMIT", "5"]);
    assert_eq!(pairs, want[..5]);
    let pairs: Vec<(String, String)> =
        query(&mut con, &["KEEL.RANGE", "-", "+", "REV", "LIMIT", "2"]);
    assert_eq!(pairs, [want[29].clone(), want[28].clone()]);
    let pairs: Vec<(String, String)> = query(&mut con, &["KEEL.RANGE", "-", "+", "LIMIT", "1"]);
    assert_eq!(pairs, [("other".to_string(), "x".to_string())]);
    assert_eq!(
        error(&mut con, &["KEEL.RANGE", "r", "+"]),
        "ERR min or max not valid string range item"
    );
}

/// A relay in front of a node's cluster bus that holds back the commit decisions
/// (`Decide`) sent through it while `hold` is set, and passes everything else: a
/// participant that voted yes and hears nothing more.
struct DecisionHold {
    addr: SocketAddr,
    hold: Arc<std::sync::atomic::AtomicBool>,
}

impl DecisionHold {
    fn start(target: SocketAddr) -> DecisionHold {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let addr = listener.local_addr().expect("address");
        let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let h = Arc::clone(&hold);
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { return };
                let hold = Arc::clone(&h);
                std::thread::spawn(move || Self::relay(inbound, target, &hold));
            }
        });
        DecisionHold { addr, hold }
    }

    fn release(&self) {
        self.hold.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// One dialer's connection: its hello both ways, then its frames (a `u32` length and
    /// that many bytes of messages), minus the decisions held back. Ends when either side
    /// closes.
    fn relay(
        mut inbound: std::net::TcpStream,
        target: SocketAddr,
        hold: &std::sync::atomic::AtomicBool,
    ) {
        use std::io::{Read, Write};
        let Ok(mut outbound) = std::net::TcpStream::connect(target) else {
            return;
        };
        // Only the acceptor's hello comes back.
        let (Ok(mut back), Ok(mut to)) = (outbound.try_clone(), inbound.try_clone()) else {
            return;
        };
        std::thread::spawn(move || std::io::copy(&mut back, &mut to));
        let mut hello = [0u8; 32];
        if inbound.read_exact(&mut hello).is_err() || outbound.write_all(&hello).is_err() {
            return;
        }
        let mut held = Vec::new();
        loop {
            let mut len = [0u8; 4];
            if inbound.read_exact(&mut len).is_err() {
                return;
            }
            let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
            if inbound.read_exact(&mut frame).is_err() {
                return;
            }
            let holding = hold.load(std::sync::atomic::Ordering::SeqCst);
            let mut pass = Vec::new();
            if !holding {
                // Released: what was held goes first.
                pass.append(&mut held);
            }
            let mut rest = &frame[..];
            while !rest.is_empty() {
                let (message, tail): (keel_server::BusMessage, &[u8]) =
                    postcard::take_from_bytes(rest).expect("a bus message");
                let bytes = &rest[..rest.len() - tail.len()];
                if holding
                    && matches!(
                        message,
                        keel_server::cluster_map::txn::Message::Decide { .. }
                    )
                {
                    held.extend_from_slice(bytes);
                } else {
                    pass.extend_from_slice(bytes);
                }
                rest = tail;
            }
            if !pass.is_empty() {
                let len = u32::try_from(pass.len()).expect("a frame's length");
                if outbound.write_all(&len.to_be_bytes()).is_err()
                    || outbound.write_all(&pass).is_err()
                {
                    return;
                }
            }
        }
    }
}

/// A transaction across two nodes whose commit decision does not reach one participant:
/// the coordinator answers its client after `ack_wait` (15 cluster timeouts) anyway, and a
/// read of that participant after the answer must not return the value from before it
/// (strict serializability). It waits for the decision and is answered `TRYAGAIN` if none
/// comes in half a cluster timeout (also inside a transaction another node forwarded); keys
/// the transaction did not touch are read at once; once the decision arrives, reads see it.
#[test]
fn reads_of_a_participant_that_missed_the_decision_wait_for_it() {
    const TIMEOUT: u64 = 300;
    let relay = std::sync::OnceLock::new();
    let cluster = TestCluster::start_with_buses(2, TIMEOUT, |i, buses| {
        let mut buses = buses.to_vec();
        if i == 0 {
            // Node 0 reaches node 1's bus through the relay.
            buses[1] = relay.get_or_init(|| DecisionHold::start(buses[1])).addr;
        }
        buses
    });
    let relay = relay.get().expect("node 0 started");
    let (a, b) = (key_on(&cluster, 0, "a"), key_on(&cluster, 1, "b"));
    let other = key_on(&cluster, 1, "o");
    let mut on_b = cluster.node(1).client();
    let () = query(&mut on_b, &["SET", &other, "untouched"]);
    // Through node 0, which coordinates: node 1 prepares and votes, and never hears commit.
    let began = Instant::now();
    let mut on_a = cluster.node(0).client();
    let () = query(&mut on_a, &["MULTI"]);
    let () = query(&mut on_a, &["SET", &a, "1"]);
    let () = query(&mut on_a, &["SET", &b, "1"]);
    let replies: Vec<String> = query(&mut on_a, &["EXEC"]);
    assert_eq!(replies, ["OK", "OK"]);
    assert!(
        began.elapsed() >= Duration::from_millis(15 * TIMEOUT),
        "answered after waiting for the acknowledgement"
    );
    // Answered committed: node 1 must not show the old value of b, nor a count without it.
    let waited = Instant::now();
    assert_eq!(error(&mut on_b, &["GET", &b]), keel_server::STUCK_TEXT);
    assert!(waited.elapsed() >= Duration::from_millis(TIMEOUT / 2));
    assert_eq!(error(&mut on_b, &["DBSIZE"]), keel_server::STUCK_TEXT);
    let () = query(&mut on_b, &["MULTI"]);
    let () = query(&mut on_b, &["GET", &b]);
    assert_eq!(error(&mut on_b, &["EXEC"]), keel_server::STUCK_TEXT);
    assert_eq!(
        error(&mut on_b, &["EXEC"]),
        "ERR EXEC without MULTI",
        "the refused EXEC discarded its transaction"
    );
    // A MULTI sent to node 0 with keys only on node 1 goes there whole (exactly once).
    let () = query(&mut on_a, &["MULTI"]);
    let () = query(&mut on_a, &["GET", &b]);
    let () = query(&mut on_a, &["SET", &other, "x"]);
    assert_eq!(error(&mut on_a, &["EXEC"]), keel_server::STUCK_TEXT);
    let got: String = query(&mut on_b, &["GET", &other]);
    assert_eq!(got, "untouched", "a key the transaction did not touch");
    let info: String = query(&mut on_b, &["INFO", "cluster"]);
    assert!(info.contains("keel_cluster_stuck:1\r\n"), "{info}");
    // Once the decision gets through, reads see the commit (and never the value before).
    relay.release();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match redis::cmd("GET").arg(&b).query::<Option<String>>(&mut on_b) {
            Ok(got) => {
                assert_eq!(got.as_deref(), Some("1"));
                break;
            }
            Err(e) => assert_eq!(e.code(), Some("TRYAGAIN"), "{e}"),
        }
        assert!(Instant::now() < deadline, "the decision never arrived");
    }
    let n: i64 = query(&mut on_b, &["DBSIZE"]);
    assert_eq!(n, 2);
    let info: String = query(&mut on_b, &["INFO", "cluster"]);
    assert!(info.contains("keel_cluster_stuck:0\r\n"), "{info}");
    let refused = info
        .lines()
        .find_map(|l| l.strip_prefix("keel_cluster_stuck_refused:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("keel_cluster_stuck_refused");
    assert!(refused >= 4, "{info}");
}

/// Three keys, on nodes 1, 2 and 0 of a three-node cluster (the client is on node 0).
/// `keel_cluster_push_watchers` of node `i`.
fn push_watchers(cluster: &TestCluster, i: usize) -> u64 {
    let info: String = query(&mut cluster.node(i).client(), &["INFO", "cluster"]);
    crate::info_counter(&info, "keel_cluster_push_watchers")
}

/// Waits until node `i` has `n` push watchers.
fn wait_push_watchers(cluster: &TestCluster, i: usize, n: u64) {
    let start = Instant::now();
    while push_watchers(cluster, i) != n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "node {i}: {} push watchers, not {n}",
            push_watchers(cluster, i)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A client blocked across nodes waits on the other nodes for their pushes
/// (`KEEL.AWAITPUSH`) instead of looking every 10 to 100 ms: each owner of some of its keys
/// holds one watcher for it while it waits, a push there wakes it, and the watchers go when
/// it is served or disconnects.
#[test]
fn blocked_pops_across_nodes_wait_on_the_owners() {
    let cluster = TestCluster::start(3, TIMEOUT_MS);
    let (x, y, z) = keys_on_each_node(&cluster);
    let (url, keys) = (cluster.node(0).url(false), [x.clone(), y.clone()]);
    let waiter = std::thread::spawn(move || {
        let v: Option<Vec<String>> = query(
            &mut crate::connect(&url),
            &["BLPOP", &keys[0], &keys[1], "10"],
        );
        v
    });
    wait_push_watchers(&cluster, 1, 1);
    wait_push_watchers(&cluster, 2, 1);
    assert_eq!(
        push_watchers(&cluster, 0),
        0,
        "its own keys wait in its registry"
    );
    let _: i64 = query(&mut cluster.node(2).client(), &["RPUSH", &y, "v"]);
    assert_eq!(
        waiter.join().expect("waiter"),
        Some(vec![y.clone(), "v".to_owned()])
    );
    wait_push_watchers(&cluster, 1, 0);
    wait_push_watchers(&cluster, 2, 0);
    // A sorted set's pop waits the same way; a client that goes takes its watchers along.
    let mut raw = std::net::TcpStream::connect(cluster.node(0).addr).expect("connect");
    let request = format!(
        "*4\r\n$8\r\nBZPOPMIN\r\n${}\r\n{x}\r\n${}\r\n{z}\r\n$1\r\n0\r\n",
        x.len(),
        z.len()
    );
    std::io::Write::write_all(&mut raw, request.as_bytes()).expect("send");
    wait_push_watchers(&cluster, 1, 1);
    drop(raw);
    wait_push_watchers(&cluster, 1, 0);
    // KEEL.AWAITPUSH itself, on the owner of y: nil at its timeout, 1 at once when the key
    // holds the kind, and clear errors.
    let mut on_y = cluster.node(2).client();
    let v: Option<i64> = query(&mut on_y, &["KEEL.AWAITPUSH", "list", "20", &y]);
    assert_eq!(v, None);
    let _: i64 = query(&mut on_y, &["RPUSH", &y, "w"]);
    let v: Option<i64> = query(&mut on_y, &["KEEL.AWAITPUSH", "list", "10000", &y]);
    assert_eq!(v, Some(1));
    let v: Option<i64> = query(&mut on_y, &["KEEL.AWAITPUSH", "zset", "20", &y]);
    assert_eq!(v, None, "a list is no sorted set");
    assert!(error(&mut on_y, &["KEEL.AWAITPUSH", "hash", "20", &y]).contains("list or a zset"));
    for bad in ["-1", "x", "10001"] {
        assert!(
            error(&mut on_y, &["KEEL.AWAITPUSH", "list", bad, &y]).contains("milliseconds"),
            "{bad}"
        );
    }
    let single = TestServer::start();
    assert!(
        error(&mut single.client(), &["KEEL.AWAITPUSH", "list", "20", "k"])
            .contains("cluster of single copies")
    );
}

fn keys_on_each_node(cluster: &TestCluster) -> (String, String, String) {
    (
        key_on(cluster, 1, "a"),
        key_on(cluster, 2, "b"),
        key_on(cluster, 0, "c"),
    )
}

/// The next move of a client moving members `m0`, `m1`, ... between two sets: which member,
/// and whether from the first set to the second (a step of a linear congruential
/// generator whose state is `r`).
fn next_move(r: &mut u64, members: usize) -> (usize, bool) {
    *r = r
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*r >> 33) as usize % members, (*r >> 20).is_multiple_of(2))
}

/// Each member `m<i>` is in the set `y` (where none began) exactly when its count of moves
/// that said they moved it, `moves[i]`, is odd: no move lost. Returns `y`'s members.
fn assert_moves_kept(con: &mut redis::Connection, y: &str, moves: &[u32]) -> Vec<String> {
    let in_y: Vec<String> = query(con, &["SMEMBERS", y]);
    for (i, n) in moves.iter().enumerate() {
        let there = in_y.contains(&format!("m{i}"));
        assert_eq!(there, n % 2 == 1, "m{i}, moved {n} times, lost a move");
    }
    in_y
}

/// A `MULTI` with a command whose keys are on several nodes and that no key-by-key split
/// serves (`SUNIONSTORE`, `SMOVE`, `RENAME`) runs whole, gathered: every reply as on one
/// node, a failed command rolls back all of it, a `WATCH` of a key on another node that
/// changed answers nil and writes nothing, a command without keys is refused, and
/// concurrent such transactions are serializable (each sees the two sets' sizes add up).
#[test]
fn transactions_with_commands_across_nodes_run_gathered() {
    let cluster = TestCluster::start(3, TIMEOUT_MS);
    let mut con = cluster.node(0).client();
    let (a, b, c) = keys_on_each_node(&cluster);
    let _: i64 = query(&mut con, &["SADD", &a, "x", "y"]);
    let _: i64 = query(&mut con, &["SADD", &b, "y", "z"]);
    let got: (i64, i64, Vec<String>, String, Option<String>) = redis::pipe()
        .atomic()
        .cmd("SADD")
        .arg(&a)
        .arg("w")
        .cmd("SUNIONSTORE")
        .arg(&c)
        .arg(&a)
        .arg(&b)
        .cmd("SMEMBERS")
        .arg(&c)
        .cmd("PING")
        .cmd("GET")
        .arg("nokey")
        .query(&mut con)
        .expect("EXEC gathered");
    let mut members = got.2.clone();
    members.sort();
    assert_eq!((got.0, got.1, &got.3[..], &got.4), (1, 4, "PONG", &None));
    assert_eq!(members, ["w", "x", "y", "z"]);
    let mut on_c: Vec<String> = query(&mut cluster.node(0).client(), &["SMEMBERS", &c]);
    on_c.sort();
    assert_eq!(on_c, members, "written on its node");
    // A failed command: its error in its slot, and nothing of the EXEC applied. (The redis
    // crate turns a reply holding an error into an Err: read the raw reply.)
    let mut raw = cluster.node(0).raw();
    let request =
        format!("MULTI\r\nSET s1{{x}} 1\r\nRENAME {c} moved{{x}}\r\nLPUSH {a} q\r\nEXEC\r\n");
    let expected = "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n+OK\r\n+OK\r\n\
                    -WRONGTYPE Operation against a key holding the wrong kind of value\r\n";
    let got = crate::exchange(&mut raw, request.as_bytes(), expected.len());
    assert_eq!(String::from_utf8_lossy(&got), expected);
    let got: (i64, i64, i64) = redis::pipe()
        .cmd("EXISTS")
        .arg("s1{x}")
        .cmd("EXISTS")
        .arg("moved{x}")
        .cmd("SCARD")
        .arg(&c)
        .query(&mut con)
        .expect("after the rolled back EXEC");
    assert_eq!(got, (0, 0, 4), "nothing applied");
    // WATCH of a key on another node: changed, nil and nothing written; unchanged, applied.
    let mut other = cluster.node(2).client();
    let _: () = query(&mut con, &["WATCH", &b]);
    let _: i64 = query(&mut other, &["SADD", &b, "late"]);
    let _: () = query(&mut con, &["MULTI"]);
    let _: String = query(&mut con, &["SMOVE", &a, &c, "x"]);
    let got: redis::Value = query(&mut con, &["EXEC"]);
    assert_eq!(got, redis::Value::Nil, "a watched key changed");
    assert_eq!(query::<i64>(&mut con, &["SISMEMBER", &a, "x"]), 1);
    let _: () = query(&mut con, &["WATCH", &b]);
    let _: () = query(&mut con, &["MULTI"]);
    let _: String = query(&mut con, &["SMOVE", &a, &b, "x"]);
    let got: Vec<i64> = query(&mut con, &["EXEC"]);
    assert_eq!(got, [1]);
    assert_eq!(query::<i64>(&mut con, &["SISMEMBER", &b, "x"]), 1);
    // A command without keys would see only the gathered keys: refused, nothing applied.
    let _: () = query(&mut con, &["MULTI"]);
    let _: String = query(&mut con, &["SMOVE", &b, &a, "x"]);
    let _: String = query(&mut con, &["DBSIZE"]);
    let refused = error(&mut con, &["EXEC"]);
    assert!(refused.contains("'dbsize' is none"), "{refused}");
    assert_eq!(query::<i64>(&mut con, &["SISMEMBER", &b, "x"]), 1);

    // Concurrent transactions, each an SMOVE across nodes and both sizes.
    const MEMBERS: usize = 30;
    let (x, y) = (key_on(&cluster, 1, "x"), key_on(&cluster, 2, "y"));
    let mut sadd = vec!["SADD".to_string(), x.clone()];
    sadd.extend((0..MEMBERS).map(|i| format!("m{i}")));
    let args: Vec<&str> = sadd.iter().map(String::as_str).collect();
    let _: i64 = query(&mut con, &args);
    let clients: Vec<_> = (0..2u64)
        .map(|t| {
            let url = cluster.node(t as usize).url(false);
            let (x, y) = (x.clone(), y.clone());
            std::thread::spawn(move || {
                let mut con = crate::connect(&url);
                let mut moved = vec![0u32; MEMBERS];
                let mut r = t * 7 + 1;
                let mut done = 0;
                while done < 40 {
                    let (i, forth) = next_move(&mut r, MEMBERS);
                    let (from, to) = if forth { (&x, &y) } else { (&y, &x) };
                    let got: redis::RedisResult<(i64, i64, i64)> = redis::pipe()
                        .atomic()
                        .cmd("SMOVE")
                        .arg(from)
                        .arg(to)
                        .arg(format!("m{i}"))
                        .cmd("SCARD")
                        .arg(&x)
                        .cmd("SCARD")
                        .arg(&y)
                        .query(&mut con);
                    match got {
                        Ok((n, nx, ny)) => {
                            assert_eq!(nx + ny, MEMBERS as i64, "sizes inside one EXEC");
                            moved[i] += u32::try_from(n).expect("0 or 1");
                            done += 1;
                        }
                        Err(e) if e.to_string().contains("TryAgain") => {}
                        Err(e) => panic!("EXEC: {e}"),
                    }
                }
                moved
            })
        })
        .collect();
    let mut moves = [0u32; MEMBERS];
    for m in clients {
        for (total, n) in moves.iter_mut().zip(m.join().expect("client")) {
            *total += n;
        }
    }
    let in_y = assert_moves_kept(&mut con, &y, &moves);
    assert_eq!(
        query::<i64>(&mut con, &["SCARD", &x]) + in_y.len() as i64,
        MEMBERS as i64
    );
}

/// Commands whose own keys are on several nodes and that no key-by-key split serves run
/// gathered: their keys read whole in one transaction across the nodes, the command run over
/// them on the node the client is on, and the keys it changed written back in a second
/// transaction that first checks none changed in between (else all of it runs again).
/// Replies are Redis's; an error changes nothing; TTLs move with the values. Meanwhile
/// clients moving members between two sets on two nodes (`SMOVE`) never lose or duplicate
/// one, and lose no move: each member ends where the number of moves that said they moved
/// it puts it.
#[test]
fn commands_across_nodes_run_gathered() {
    let cluster = TestCluster::start(3, TIMEOUT_MS);
    let mut con = cluster.node(0).client();
    let (a, b, c) = keys_on_each_node(&cluster);
    let _: i64 = query(&mut con, &["ZADD", &a, "1", "m1", "2", "m2"]);
    let _: i64 = query(&mut con, &["ZADD", &b, "5", "m2", "7", "m3"]);
    let got: Vec<String> = query(&mut con, &["ZUNION", "2", &a, &b, "WITHSCORES"]);
    assert_eq!(got, ["m1", "1", "m2", "7", "m3", "7"]);
    let n: i64 = query(
        &mut con,
        &["ZINTERSTORE", &c, "2", &a, &b, "AGGREGATE", "MAX"],
    );
    assert_eq!(n, 1);
    let got: Vec<String> = query(&mut con, &["ZRANGE", &c, "0", "-1", "WITHSCORES"]);
    assert_eq!(got, ["m2", "5"]);
    // A read-only one changes nothing; one that fails changes nothing either.
    let _: () = query(&mut con, &["SET", &c, "text"]);
    assert!(error(&mut con, &["ZUNIONSTORE", &c, "2", &a, &c]).starts_with("WRONGTYPE"));
    let got: String = query(&mut con, &["GET", &c]);
    assert_eq!(got, "text");
    // RENAME carries the TTL; the source is gone from its node.
    let _: () = query(&mut con, &["SET", &c, "v", "PX", "100000"]);
    let _: () = query(&mut con, &["RENAME", &c, &a]);
    let got: Option<String> = query(&mut con, &["GET", &c]);
    assert_eq!(got, None);
    let got: String = query(&mut cluster.node(1).client(), &["GET", &a]);
    assert_eq!(got, "v", "on the destination's node");
    let ttl: i64 = query(&mut con, &["PTTL", &a]);
    assert!(ttl > 90_000 && ttl <= 100_000, "{ttl}");
    // LMOVE between lists on two nodes; LCS over strings on two nodes.
    let (l1, l2) = (key_on(&cluster, 1, "l1"), key_on(&cluster, 2, "l2"));
    let _: i64 = query(&mut con, &["RPUSH", &l1, "1", "2", "3"]);
    let got: String = query(&mut con, &["LMOVE", &l1, &l2, "LEFT", "RIGHT"]);
    assert_eq!(got, "1");
    let got: (Vec<String>, Vec<String>) = (
        query(&mut con, &["LRANGE", &l1, "0", "-1"]),
        query(&mut con, &["LRANGE", &l2, "0", "-1"]),
    );
    assert_eq!(got, (vec!["2".into(), "3".into()], vec!["1".into()]));
    // SORT … STORE into a key on another node; its BY and GET patterns are refused here, as
    // Redis Cluster refuses them (they name keys that routing cannot see).
    let n: i64 = query(&mut con, &["SORT", &l1, "DESC", "STORE", &l2]);
    assert_eq!(n, 2);
    let got: Vec<String> = query(&mut con, &["LRANGE", &l2, "0", "-1"]);
    assert_eq!(got, ["3", "2"]);
    assert_eq!(
        error(&mut con, &["SORT", &l1, "BY", "w_*"]),
        "ERR BY option of SORT denied in Cluster mode."
    );
    assert_eq!(
        error(&mut con, &["SORT", &l1, "GET", "#"]),
        "ERR GET option of SORT denied in Cluster mode."
    );
    let (s1, s2) = (key_on(&cluster, 1, "s1"), key_on(&cluster, 2, "s2"));
    let () = query(&mut con, &["MSET", &s1, "ohmytext", &s2, "mynewtext"]);
    let got: String = query(&mut con, &["LCS", &s1, &s2]);
    assert_eq!(got, "mytext");

    // Concurrent SMOVEs between two sets on two nodes, and audits of both in one MULTI.
    const MEMBERS: usize = 40;
    let (x, y) = (key_on(&cluster, 1, "x"), key_on(&cluster, 2, "y"));
    let mut sadd = vec!["SADD".to_string(), x.clone()];
    sadd.extend((0..MEMBERS).map(|i| format!("m{i}")));
    let args: Vec<&str> = sadd.iter().map(String::as_str).collect();
    let _: i64 = query(&mut con, &args);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let movers: Vec<_> = (0..2u64)
        .map(|t| {
            let url = cluster.node(t as usize).url(false);
            let (x, y, stop) = (x.clone(), y.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut con = crate::connect(&url);
                let mut moved = vec![0u32; MEMBERS];
                let mut r = t * 7 + 1;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (i, forth) = next_move(&mut r, MEMBERS);
                    let (from, to) = if forth { (&x, &y) } else { (&y, &x) };
                    // A transaction across nodes that keeps losing conflicts answers
                    // TRYAGAIN, having changed nothing.
                    let n: redis::RedisResult<i64> = redis::cmd("SMOVE")
                        .arg(from)
                        .arg(to)
                        .arg(format!("m{i}"))
                        .query(&mut con);
                    match n {
                        Ok(n) => moved[i] += u32::try_from(n).expect("0 or 1"),
                        Err(e) if e.to_string().contains("TryAgain") => {}
                        Err(e) => panic!("SMOVE: {e}"),
                    }
                }
                moved
            })
        })
        .collect();
    let started = Instant::now();
    let mut audits = 0;
    while started.elapsed() < Duration::from_secs(3) || audits < 20 {
        let audit: redis::RedisResult<(i64, i64)> = redis::pipe()
            .atomic()
            .cmd("SCARD")
            .arg(&x)
            .cmd("SCARD")
            .arg(&y)
            .query(&mut con);
        match audit {
            Ok((nx, ny)) => {
                assert_eq!(nx + ny, MEMBERS as i64, "a member lost or doubled");
                audits += 1;
            }
            // Refused for conflicts too many times in a row: it read nothing.
            Err(e) if e.to_string().contains("TryAgain") => {}
            Err(e) => panic!("audit across nodes: {e}"),
        }
        if started.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut moves = [0u32; MEMBERS];
    for m in movers {
        for (total, n) in moves.iter_mut().zip(m.join().expect("mover")) {
            *total += n;
        }
    }
    let moved: u32 = moves.iter().sum();
    assert!(moved > 10, "the movers moved members: {moved}");
    assert_moves_kept(&mut con, &y, &moves);
    let union: Vec<String> = query(&mut con, &["SUNION", &x, &y]);
    assert_eq!(union.len(), MEMBERS);
    let both: i64 = query(&mut con, &["SINTERCARD", "2", &x, &y]);
    assert_eq!(both, 0, "no member in both sets");
    // INFO cluster counts them (on the node each ran on).
    let info: String = query(&mut con, &["INFO", "cluster"]);
    assert!(
        crate::info_counter(&info, "keel_cluster_gathered") > 10,
        "{info}"
    );
}

/// `PUBLISH` and `SPUBLISH` reach subscribers on every node, as in Redis Cluster (whose bus
/// carries each message to every node): a subscriber gets a publisher's messages once each,
/// in order, wherever either is connected, and the reply counts the publishing node's
/// receivers. Before, a message reached only the subscribers of the node it was published
/// on, and a subscriber elsewhere silently got nothing.
#[test]
fn published_messages_reach_subscribers_on_every_node() {
    use crate::pubsub::{expect, read_expect};
    let cluster = TestCluster::start(3, TIMEOUT_MS);
    let bulk = |s: &str| format!("${}\r\n{s}\r\n", s.len());
    // A subscriber to `news` on every node.
    let mut subs: Vec<std::net::TcpStream> = (0..3)
        .map(|i| {
            let mut s = cluster.node(i).raw();
            expect(
                &mut s,
                b"SUBSCRIBE news\r\n",
                b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n",
            );
            s
        })
        .collect();
    // A shard channel, subscribed to on a node that does not own its slot.
    let tag = key_on(&cluster, 2, "s");
    let shard = format!("{{{tag}}}chan");
    assert_eq!(cluster.owner(&shard), 2);
    let mut shard_sub = cluster.node(0).raw();
    expect(
        &mut shard_sub,
        format!("SSUBSCRIBE {shard}\r\n").as_bytes(),
        format!("*3\r\n$10\r\nssubscribe\r\n{}:1\r\n", bulk(&shard)).as_bytes(),
    );
    let mut publisher = cluster.node(1).client();
    let mut counts = Vec::new();
    for n in 0..100 {
        let count: i64 = query(&mut publisher, &["PUBLISH", "news", &format!("m{n}")]);
        counts.push(count);
        let _: i64 = query(&mut publisher, &["SPUBLISH", &shard, &format!("s{n}")]);
    }
    assert!(
        counts.iter().all(|&c| c == 1),
        "this node's receivers: {counts:?}"
    );
    for sub in &mut subs {
        sub.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        for n in 0..100 {
            let message = format!(
                "*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n{}",
                bulk(&format!("m{n}"))
            );
            read_expect(sub, message.as_bytes());
        }
    }
    shard_sub
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    for n in 0..100 {
        let message = format!(
            "*3\r\n$8\r\nsmessage\r\n{}{}",
            bulk(&shard),
            bulk(&format!("s{n}"))
        );
        read_expect(&mut shard_sub, message.as_bytes());
    }
    // The node that relayed them says so (once the last answers are in): 100 of each to
    // two nodes.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = query(&mut publisher, &["INFO", "cluster"]);
        if info.contains("keel_cluster_published_relayed:400\r\n")
            && info.contains("keel_cluster_published_dropped:0\r\n")
        {
            break;
        }
        assert!(Instant::now() < deadline, "{info}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
