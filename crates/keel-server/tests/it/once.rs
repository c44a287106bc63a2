//! Exactly-once forwarding in a cluster of single copies (`once`, docs/cluster.md,
//! "Exactly-once forwarding"): a forwarded write whose answer is lost is sent again with its
//! id and applied once; kept answers go after their deadline; they are invisible to the
//! keyspace commands and outlive `FLUSHALL`. (That they survive a crash of the owner:
//! `keel-cli/tests/cross_node.rs`, which restarts processes.)

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use keel_server::cluster_map::{Membership, key_slot};
use parking_lot::Mutex;

use crate::{TestServer, error, info_counter, query};

/// A TCP proxy in front of a node. While armed with a byte string, the first connection
/// whose replies contain it is cut there: the replies are swallowed and both sides closed,
/// so the sender's request ran but its answer is lost. Armed to stay down, it then closes
/// every connection it accepts at once.
struct Proxy {
    armed: Arc<Armed>,
}

/// The reply to cut at, and whether to stay down after.
type Armed = Mutex<Option<(Vec<u8>, bool)>>;

impl Proxy {
    fn start(listener: TcpListener, to: SocketAddr) -> Proxy {
        let armed: Arc<Armed> = Arc::default();
        let down: Arc<AtomicBool> = Arc::default();
        let (arm, is_down) = (Arc::clone(&armed), Arc::clone(&down));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if is_down.load(SeqCst) {
                    continue;
                }
                let Ok(server) = TcpStream::connect(to) else {
                    continue;
                };
                let (mut c_in, mut s_out) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_in, &mut s_out);
                    let _ = s_out.shutdown(Shutdown::Write);
                });
                let (arm, is_down) = (Arc::clone(&arm), Arc::clone(&is_down));
                std::thread::spawn(move || pump_replies(server, client, &arm, &is_down));
            }
        });
        Proxy { armed }
    }

    /// Cuts the next connection whose replies contain `reply`; with `stay_down`, refuses
    /// every connection from then on.
    fn lose(&self, reply: &[u8], stay_down: bool) {
        *self.armed.lock() = Some((reply.to_vec(), stay_down));
    }

    fn disarmed(&self) -> bool {
        self.armed.lock().is_none()
    }
}

/// Copies `server`'s replies to `client`; while the proxy is armed they are held back, and
/// once they contain the armed bytes the connection is cut without passing them on.
fn pump_replies(mut server: TcpStream, mut client: TcpStream, armed: &Armed, down: &AtomicBool) {
    let mut held = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = match server.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        held.extend_from_slice(&buf[..n]);
        let mut arm = armed.lock();
        match arm.as_ref() {
            Some((pattern, stay_down)) if held.windows(pattern.len()).any(|w| w == pattern) => {
                if *stay_down {
                    down.store(true, SeqCst);
                }
                *arm = None;
                drop(arm);
                let _ = server.shutdown(Shutdown::Both);
                let _ = client.shutdown(Shutdown::Both);
                return;
            }
            Some(_) => continue,
            None => {}
        }
        drop(arm);
        if client.write_all(&held).is_err() {
            break;
        }
        held.clear();
    }
    let _ = client.shutdown(Shutdown::Write);
}

/// Two nodes, slots split evenly; node 0's config gives node 1 the address of `proxy`, which
/// passes everything on to node 1. (Their configs differ, so their cluster transport refuses
/// to connect; forwarding, which goes to the client port, does not care.)
struct Pair {
    nodes: Vec<TestServer>,
    proxy: Proxy,
    addrs: Vec<SocketAddr>,
}

impl Pair {
    fn start(timeout_ms: u64) -> Pair {
        let node0 = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let node1 = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let front = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let addrs = vec![
            node0.local_addr().expect("address"),
            node1.local_addr().expect("address"),
        ];
        let seen_by_0 = vec![addrs[0], front.local_addr().expect("address")];
        let proxy = Proxy::start(front, addrs[1]);
        let buses: Vec<Arc<TcpListener>> = (0..2)
            .map(|_| Arc::new(TcpListener::bind("127.0.0.1:0").expect("a free port")))
            .collect();
        let bus_addrs: Vec<SocketAddr> = buses
            .iter()
            .map(|l| l.local_addr().expect("address"))
            .collect();
        let nodes = [node0, node1]
            .into_iter()
            .enumerate()
            .map(|(i, l)| {
                let seen = if i == 0 { &seen_by_0 } else { &addrs };
                let map = Membership::even(seen, i, timeout_ms).expect("valid cluster");
                let (bus_addrs, bus) = (bus_addrs.clone(), Arc::clone(&buses[i]));
                TestServer::on(Some(l), move |c| {
                    c.cluster = Some(Arc::new(map));
                    c.cluster_bus = bus_addrs;
                    c.cluster_bus_listener = Some(bus);
                    c.metrics = Some("127.0.0.1:0".parse().expect("an address"));
                })
            })
            .collect();
        Pair {
            nodes,
            proxy,
            addrs,
        }
    }

    /// A key node `i` owns, `<tag><n>`.
    fn key_on(&self, i: usize, tag: &str) -> String {
        (0..)
            .map(|n| format!("{tag}{n}"))
            .find(|k| {
                let slot = key_slot(k.as_bytes()).0;
                let (start, end) =
                    keel_server::cluster_map::membership::even_range(i, self.addrs.len());
                (start..=end).contains(&slot)
            })
            .expect("some key lands on every node")
    }
}

fn info(server: &TestServer) -> String {
    query(&mut server.client(), &["INFO", "cluster"])
}

/// A try that reaches its owner well after its sender stopped waiting (the network held it
/// back, or the owner was stopped with it unread) is refused and runs nothing, an `EXEC`'s
/// transaction with it: run then, it could come after its id's answer was swept, and a write
/// that had run would run again. A try within the slack runs.
#[test]
fn a_forwarded_write_that_arrives_after_its_sender_gave_up_is_refused() {
    let pair = Pair::start(1000);
    let key = pair.key_on(1, "late");
    let mut owner = pair.nodes[1].client();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    let stale = (now - 60_000).to_string();
    fn once<'a>(seq: &'a str, until: &'a str) -> [&'a str; 6] {
        ["KEEL.ONCE", "0", "77", seq, "60000", until]
    }
    let late = error(
        &mut owner,
        &[&once("1", &stale)[..], &["INCR", &key]].concat(),
    );
    assert!(
        late.starts_with("TRYAGAIN") && late.contains("not applied"),
        "{late}"
    );
    let v: Option<i64> = query(&mut owner, &["GET", &key]);
    assert_eq!(v, None, "the late INCR ran nothing");
    // Its transaction is discarded: the connection's next command runs, unqueued.
    let _: () = query(&mut owner, &["MULTI"]);
    let _: String = query(&mut owner, &["INCR", &key]);
    let late = error(&mut owner, &[&once("2", &stale)[..], &["EXEC"]].concat());
    assert!(late.starts_with("TRYAGAIN"), "{late}");
    let v: Option<i64> = query(&mut owner, &["GET", &key]);
    assert_eq!(v, None, "the late EXEC ran nothing, and MULTI is over");
    // The same id in time runs (nothing was kept for it), within the slack too.
    let recent = (now - 1_000).to_string();
    let n: i64 = query(
        &mut owner,
        &[&once("1", &recent)[..], &["INCR", &key]].concat(),
    );
    assert_eq!(n, 1);
    let n: i64 = query(&mut owner, &[&once("3", "0")[..], &["INCR", &key]].concat());
    assert_eq!(n, 2, "no deadline: never late");
    let bad = error(
        &mut owner,
        &[&once("4", "soon")[..], &["INCR", &key]].concat(),
    );
    assert!(bad.contains("until-ms"), "{bad}");
}

#[test]
fn a_write_whose_answer_is_lost_is_sent_again_and_applied_once() {
    let pair = Pair::start(1000);
    let key = pair.key_on(1, "c");
    let mut con = pair.nodes[0].client();
    // Warm the pool: the first forward goes through an ordinary connection.
    let n: i64 = query(&mut con, &["INCR", &key]);
    assert_eq!(n, 1);
    // The owner runs the INCR, its answer is cut on the way back: node 0 sends it again with
    // the same id and relays the kept answer; the counter moved once.
    pair.proxy.lose(b":2\r\n", false);
    let n: i64 = query(&mut con, &["INCR", &key]);
    assert!(pair.proxy.disarmed(), "the answer was cut");
    assert_eq!(n, 2);
    let v: i64 = query(&mut con, &["GET", &key]);
    assert_eq!(v, 2);
    let mut owner = pair.nodes[1].client();
    let v: i64 = query(&mut owner, &["GET", &key]);
    assert_eq!(v, 2, "the owner applied the INCR once");
    assert_eq!(info_counter(&info(&pair.nodes[0]), "keel_once_retries"), 1);
    assert_eq!(info_counter(&info(&pair.nodes[1]), "keel_once_replayed"), 1);

    // The same for a transaction forwarded whole (MULTI ... EXEC on one other node).
    let other = pair.key_on(1, "d");
    pair.proxy.lose(b"*2\r\n:3\r\n:1\r\n", false);
    let replies: (i64, i64) = redis::pipe()
        .atomic()
        .cmd("INCR")
        .arg(&key)
        .cmd("INCR")
        .arg(&other)
        .query(&mut con)
        .expect("EXEC");
    assert!(pair.proxy.disarmed(), "the answer was cut");
    assert_eq!(replies, (3, 1));
    let v: (i64, i64) = redis::cmd("MGET")
        .arg(&key)
        .arg(&other)
        .query(&mut owner)
        .expect("MGET");
    assert_eq!(v, (3, 1), "the transaction ran once");
    assert_eq!(info_counter(&info(&pair.nodes[0]), "keel_once_retries"), 2);
    assert_eq!(info_counter(&info(&pair.nodes[1]), "keel_once_replayed"), 2);
    let metrics = pair.nodes[1].metrics();
    assert!(
        metrics.contains("keel_once_total{event=\"replayed\"} 2\n"),
        "{metrics}"
    );

    // Reads carry no id and are not kept.
    let kept = info_counter(&info(&pair.nodes[1]), "keel_once_kept");
    let _: i64 = query(&mut con, &["GET", &key]);
    assert_eq!(info_counter(&info(&pair.nodes[1]), "keel_once_kept"), kept);
    assert_eq!(kept, 3, "three writes were forwarded");
}

/// A forwarded blocking pop goes exactly once too: when its answer is lost after it popped,
/// node 0 sends it again with the same id (and what is left of its wait) and relays the kept
/// answer, whether the element was there at once or came while the pop waited. Nothing is
/// lost and nothing popped twice.
#[test]
fn a_blocking_pop_whose_answer_is_lost_pops_once() {
    let pair = Pair::start(1000);
    let key = pair.key_on(1, "q");
    let mut con = pair.nodes[0].client();
    let mut owner = pair.nodes[1].client();
    // Warm the pool: the first forward goes through an ordinary connection.
    let n: i64 = query(&mut con, &["RPUSH", &key, "a"]);
    assert_eq!(n, 1);
    // There at once: popped, the answer cut, sent again, the kept answer relayed.
    pair.proxy.lose(b"$1\r\na\r\n", false);
    let got: (String, String) = query(&mut con, &["BLPOP", &key, "5"]);
    assert!(pair.proxy.disarmed(), "the answer was cut");
    assert_eq!(got, (key.clone(), "a".to_owned()));
    let n: i64 = query(&mut owner, &["LLEN", &key]);
    assert_eq!(n, 0);
    assert_eq!(info_counter(&info(&pair.nodes[1]), "keel_once_replayed"), 1);
    // Pushed while the pop waits at the owner.
    let pushing = {
        let key = key.clone();
        let mut owner = pair.nodes[1].client();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let n: i64 = query(&mut owner, &["RPUSH", &key, "b", "c"]);
            assert_eq!(n, 2);
        })
    };
    pair.proxy.lose(b"$1\r\nb\r\n", false);
    let began = Instant::now();
    let got: (String, String) = query(&mut con, &["BLPOP", &key, "5"]);
    pushing.join().expect("the push");
    assert!(pair.proxy.disarmed(), "the answer was cut");
    assert!(
        began.elapsed() >= Duration::from_millis(250),
        "it waited for the push"
    );
    assert_eq!(got, (key.clone(), "b".to_owned()));
    let rest: Vec<String> = query(&mut owner, &["LRANGE", &key, "0", "-1"]);
    assert_eq!(rest, ["c"], "b popped once, c not at all");
    assert_eq!(info_counter(&info(&pair.nodes[0]), "keel_once_retries"), 2);
    assert_eq!(info_counter(&info(&pair.nodes[1]), "keel_once_replayed"), 2);
    // A wait that ends: nil, and nothing kept.
    let kept = info_counter(&info(&pair.nodes[1]), "keel_once_kept");
    let v: redis::Value = query(&mut con, &["BLPOP", &pair.key_on(1, "empty"), "0.2"]);
    assert_eq!(v, redis::Value::Nil);
    assert_eq!(info_counter(&info(&pair.nodes[1]), "keel_once_kept"), kept);
    assert_eq!(info_counter(&info(&pair.nodes[1]), "keel_once_blocked"), 0);
}

#[test]
fn an_answer_lost_for_the_whole_window_is_ambiguous() {
    let pair = Pair::start(200);
    let key = pair.key_on(1, "c");
    let mut con = pair.nodes[0].client();
    let () = query(&mut con, &["SET", &key, "1"]);
    // The answer is cut and the owner stays unreachable: every try until the window (three
    // timeouts) ends fails, and only then does the client hear that it may have happened.
    pair.proxy.lose(b"+OK\r\n", true);
    let started = Instant::now();
    let e = error(&mut con, &["SET", &key, "2"]);
    let took = started.elapsed();
    assert!(pair.proxy.disarmed(), "the answer was cut");
    assert!(
        e.starts_with("CLUSTERDOWN ") && e.ends_with("the write may or may not have happened"),
        "{e}"
    );
    assert!(took >= Duration::from_millis(550), "gave up after {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// One node owning every slot.
fn single() -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = listener.local_addr().expect("address");
    let bus = Arc::new(TcpListener::bind("127.0.0.1:0").expect("a free port"));
    let bus_addr = bus.local_addr().expect("address");
    let map = Membership::even(&[addr], 0, 1000).expect("valid cluster");
    TestServer::on(Some(listener), move |c| {
        c.cluster = Some(Arc::new(map));
        c.cluster_bus = vec![bus_addr];
        c.cluster_bus_listener = Some(bus);
    })
}

#[test]
fn kept_answers_go_after_their_deadline() {
    let node = single();
    let mut con = node.client();
    let once = |con: &mut redis::Connection, seq: &str, keep: &str| -> i64 {
        query(con, &["KEEL.ONCE", "3", "77", seq, keep, "0", "INCR", "n"])
    };
    // Kept 2 s: long enough that the second send meets it on a stalled machine, short
    // enough for a test.
    assert_eq!(once(&mut con, "1", "2000"), 1);
    assert_eq!(
        once(&mut con, "1", "2000"),
        1,
        "the kept answer; nothing ran"
    );
    assert_eq!(once(&mut con, "2", "60000"), 2, "another id runs");
    assert_eq!(info_counter(&info(&node), "keel_once_kept"), 2);
    // The reaper drops the first answer once its 2 s are over, and only that one.
    let deadline = Instant::now() + Duration::from_secs(10);
    while info_counter(&info(&node), "keel_once_swept") < 1 {
        assert!(Instant::now() < deadline, "the answer was never swept");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(info_counter(&info(&node), "keel_once_swept"), 1);
    assert_eq!(once(&mut con, "2", "60000"), 2, "still kept");
    // Gone: the same id runs again.
    assert_eq!(once(&mut con, "1", "2000"), 3);
}

#[test]
fn kept_answers_are_not_keys() {
    let node = single();
    let mut con = node.client();
    let set = ["KEEL.ONCE", "1", "5", "1", "60000", "0", "SET", "k", "v"];
    let () = query(&mut con, &set);
    let keys: Vec<String> = query(&mut con, &["KEYS", "*"]);
    assert_eq!(keys, ["k"]);
    let (cursor, keys): (u64, Vec<String>) = query(&mut con, &["SCAN", "0", "COUNT", "1000"]);
    assert_eq!((cursor, keys), (0, vec!["k".to_owned()]));
    let n: i64 = query(&mut con, &["DBSIZE"]);
    assert_eq!(n, 1);
    let k: String = query(&mut con, &["RANDOMKEY"]);
    assert_eq!(k, "k");
    let pairs: Vec<(String, String)> = query(&mut con, &["KEEL.RANGE", "-", "+"]);
    assert_eq!(pairs, [("k".to_owned(), "v".to_owned())]);
    let keyspace: String = query(&mut con, &["INFO", "keyspace"]);
    assert!(keyspace.contains("db0:keys=1,"), "{keyspace}");
    // FLUSHALL deletes the data, not the answers: the SET sent again after it runs nothing.
    let () = query(&mut con, &["FLUSHALL"]);
    let n: i64 = query(&mut con, &["DBSIZE"]);
    assert_eq!(n, 0);
    assert_eq!(info_counter(&info(&node), "keel_once_kept"), 1);
    let () = query(&mut con, &set);
    let n: i64 = query(&mut con, &["DBSIZE"]);
    assert_eq!(n, 0, "the kept answer, nothing run");
    // A fresh id runs.
    let () = query(
        &mut con,
        &["KEEL.ONCE", "1", "5", "2", "60000", "0", "SET", "k", "w"],
    );
    let v: String = query(&mut con, &["GET", "k"]);
    assert_eq!(v, "w");
}

#[test]
fn keel_once_refuses_what_it_cannot_run_once() {
    let plain = TestServer::start();
    let e = error(
        &mut plain.client(),
        &["KEEL.ONCE", "1", "2", "3", "100", "0", "INCR", "a"],
    );
    assert!(e.contains("cluster of single copies"), "{e}");
    let node = single();
    let mut con = node.client();
    for (args, expect) in [
        (
            &["KEEL.ONCE", "1", "2", "3", "x", "0", "INCR", "a"][..],
            "keep-ms",
        ),
        (
            &["KEEL.ONCE", "1", "2", "3", "100", "0", "DBSIZE"],
            "ERR keel: KEEL.ONCE runs a data command with keys, and 'dbsize' is not one",
        ),
        (
            &["KEEL.ONCE", "1", "2", "3", "100", "0", "BLPOP", "a", "-1"],
            "timeout is negative",
        ),
        (&["KEEL.ONCE", "1", "2", "3", "100", "0", "PING"], "not one"),
        (
            &["KEEL.ONCE", "1", "2", "3", "100", "0", "INCR"],
            "wrong number",
        ),
        (
            &["KEEL.ONCE", "1", "2", "3", "100", "0", "NOPE"],
            "unknown command",
        ),
        (
            &["KEEL.ONCE", "1", "2", "3", "100", "0", "EXEC"],
            "EXEC without MULTI",
        ),
        (
            &["KEEL.ONCE", "1", "2", "3", "3600001", "0", "INCR", "a"],
            "at most",
        ),
    ] {
        let e = error(&mut con, args);
        assert!(e.contains(expect), "{args:?}: {e}");
    }
    // A transaction's EXEC, once.
    let mut raw = node.raw();
    let request = b"*1\r\n$5\r\nMULTI\r\n*2\r\n$4\r\nINCR\r\n$1\r\nt\r\n\
                    *7\r\n$9\r\nKEEL.ONCE\r\n$1\r\n1\r\n$1\r\n2\r\n$1\r\n9\r\n$5\r\n60000\r\n\
                    $1\r\n0\r\n$4\r\nEXEC\r\n";
    let want = b"+OK\r\n+QUEUED\r\n*1\r\n:1\r\n";
    assert_eq!(crate::exchange(&mut raw, request, want.len()), want);
    assert_eq!(crate::exchange(&mut raw, request, want.len()), want);
    let v: i64 = query(&mut con, &["GET", "t"]);
    assert_eq!(v, 1);
    // A failing command is not kept: nothing changed, and the same id may run later.
    let () = query(&mut con, &["SET", "s", "x"]);
    let e = error(
        &mut con,
        &["KEEL.ONCE", "1", "2", "10", "100", "0", "INCR", "s"],
    );
    assert!(e.contains("not an integer"), "{e}");
    let () = query(&mut con, &["SET", "s", "5"]);
    let v: i64 = query(
        &mut con,
        &["KEEL.ONCE", "1", "2", "10", "100", "0", "INCR", "s"],
    );
    assert_eq!(v, 6);
}

#[test]
fn attempts_of_one_id_at_once_run_it_once() {
    // A retry may reach the owner while the first attempt still runs (the first answer was
    // only late). Three connections send every id at about the same time: each id runs
    // once, and every attempt answers what it kept. (`KEEL.ADD` is blind, `INCR` reads.)
    let node = single();
    const IDS: u64 = 300;
    let url = node.url(false);
    let replies: Vec<Vec<i64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let url = url.clone();
                s.spawn(move || {
                    let mut con = crate::connect(&url);
                    let mut incrs = Vec::new();
                    for seq in 0..IDS {
                        let (a, b) = (seq.to_string(), (seq + IDS).to_string());
                        incrs.push(query(
                            &mut con,
                            &["KEEL.ONCE", "4", "42", &a, "60000", "0", "INCR", "n"],
                        ));
                        let () = query(
                            &mut con,
                            &[
                                "KEEL.ONCE",
                                "4",
                                "42",
                                &b,
                                "60000",
                                "0",
                                "KEEL.ADD",
                                "m",
                                "1",
                            ],
                        );
                    }
                    incrs
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let (n, m): (i64, i64) = redis::cmd("MGET")
        .arg("n")
        .arg("m")
        .query(&mut node.client())
        .expect("MGET");
    assert_eq!((n, m), (IDS as i64, IDS as i64), "each id ran once");
    for seq in 0..IDS as usize {
        assert!(
            replies.iter().all(|r| r[seq] == replies[0][seq]),
            "id {seq}: every attempt got the same answer"
        );
    }
    let mut answers: Vec<i64> = replies[0].clone();
    answers.sort_unstable();
    answers.dedup();
    assert_eq!(answers.len(), IDS as usize, "each id its own increment");
}
