//! Connections moving between the poller and the worker pool (`CONFIG SET poller`): state,
//! half-read requests and transactions survive a move, and nothing is lost or reordered.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use redis::Value;

use crate::{TestServer, exchange, query};

/// A field of `INFO keel`.
fn info_field(c: &mut redis::Connection, name: &str) -> String {
    let info: String = query(c, &["INFO", "keel"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {info}"))
        .to_owned()
}

fn moves(c: &mut redis::Connection) -> u64 {
    info_field(c, "connection_moves").parse().expect("a count")
}

#[test]
fn config_set_poller_moves_connections_with_their_state() {
    let server = TestServer::start();
    let mut admin = server.client();
    assert_eq!(info_field(&mut admin, "poller"), "off");
    assert_eq!(info_field(&mut admin, "lane"), "pool");

    // A connection with a queued MULTI and a WATCH snapshot, and a raw one that will move
    // holding half a request.
    let mut c = server.client();
    let id: i64 = query(&mut c, &["CLIENT", "ID"]);
    let _: () = query(&mut c, &["SET", "w", "1"]);
    let _: () = query(&mut c, &["WATCH", "w"]);
    let _: () = query(&mut c, &["MULTI"]);
    let _: () = query(&mut c, &["INCR", "w"]);
    let mut raw = server.raw();
    assert_eq!(exchange(&mut raw, b"PING\r\n", 7), b"+PONG\r\n");

    let before = moves(&mut admin);
    let _: () = query(&mut admin, &["CONFIG", "SET", "poller", "on"]);
    assert_eq!(info_field(&mut admin, "lane"), "poller");
    let setting: Vec<String> = query(&mut admin, &["CONFIG", "GET", "poller"]);
    assert_eq!(setting, vec!["poller", "on"]);

    // The PING runs where the connection is, then it moves with the rest of the SET.
    assert_eq!(
        exchange(&mut raw, b"PING\r\n*3\r\n$3\r\nSET\r\n$4\r\nhalf", 7),
        b"+PONG\r\n"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(exchange(&mut raw, b"\r\n$2\r\nok\r\n", 5), b"+OK\r\n");
    assert_eq!(query::<String>(&mut c, &["GET", "half"]), "QUEUED");
    let replies: Vec<Value> = query(&mut c, &["EXEC"]);
    assert_eq!(
        replies,
        vec![Value::Int(2), Value::BulkString(b"ok".to_vec())]
    );
    assert_eq!(
        query::<i64>(&mut c, &["CLIENT", "ID"]),
        id,
        "same connection"
    );
    // `admin` moved as well, at its first request after the switch.
    assert!(moves(&mut admin) >= before + 3, "every connection moved");

    // And back, to the pool.
    let _: () = query(&mut admin, &["CONFIG", "SET", "poller", "off"]);
    assert_eq!(info_field(&mut admin, "lane"), "pool");
    let _: () = query(&mut c, &["WATCH", "w"]);
    let _: () = query(&mut admin, &["SET", "w", "changed"]);
    let _: () = query(&mut c, &["MULTI"]);
    let _: () = query(&mut c, &["SET", "w", "mine"]);
    assert_eq!(
        query::<Value>(&mut c, &["EXEC"]),
        Value::Nil,
        "the WATCH moved too"
    );
    assert_eq!(query::<String>(&mut c, &["GET", "w"]), "changed");
    assert_eq!(exchange(&mut raw, b"GET half\r\n", 8), b"$2\r\nok\r\n");

    let bad = crate::error(&mut admin, &["CONFIG", "SET", "poller", "sometimes"]);
    assert!(bad.contains("poller takes on or off"), "{bad}");
    let bad = crate::error(&mut admin, &["CONFIG", "SET", "poller", "auto"]);
    assert!(bad.contains("auto was removed"), "{bad}");
    let bad = crate::error(&mut admin, &["CONFIG", "SET", "idle-poll-us", "-1"]);
    assert!(bad.contains("idle-poll-us"), "{bad}");
    let _: () = query(&mut admin, &["CONFIG", "SET", "idle-poll-us", "0"]);
    assert_eq!(info_field(&mut admin, "idle_poll_us"), "0");
    // No spinning means none under load either.
    assert_eq!(info_field(&mut admin, "spin_us"), "0");
    assert_eq!(
        query::<String>(&mut c, &["PING"]),
        "PONG",
        "serves without polling"
    );
}

/// Clients run transfers, WATCH increments and pipelines while another flips the lane every
/// millisecond: every transfer is whole, no increment is lost, every pipelined reply arrives
/// in order.
#[test]
fn moving_under_load_loses_and_reorders_nothing() {
    const ACCOUNTS: i64 = 8;
    const INITIAL: i64 = 100;
    let server = TestServer::start();
    let mut admin = server.client();
    for a in 0..ACCOUNTS {
        let _: () = query(
            &mut admin,
            &["SET", &format!("acct:{a}"), &INITIAL.to_string()],
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (url, stop) = (server.url(false), stop.clone());
        std::thread::spawn(move || {
            let mut c = crate::connect(&url);
            let mut flips = 0u64;
            while !stop.load(Relaxed) {
                let to = if flips.is_multiple_of(2) { "off" } else { "on" };
                let _: () = query(&mut c, &["CONFIG", "SET", "poller", to]);
                flips += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            flips
        })
    };
    let clients: Vec<_> = (0..4u64)
        .map(|t| {
            let url = server.url(t % 2 == 1);
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                let mut committed = 0i64;
                for i in 0..150u64 {
                    // A transfer in MULTI (moves between the two accounts' keys).
                    let (from, to) = ((t + i) % 8, (t * 3 + i + 1) % 8);
                    let _: () = query(&mut c, &["MULTI"]);
                    let _: () = query(&mut c, &["DECRBY", &format!("acct:{from}"), "3"]);
                    let _: () = query(&mut c, &["INCRBY", &format!("acct:{to}"), "3"]);
                    let _: Vec<i64> = query(&mut c, &["EXEC"]);
                    // A WATCH increment.
                    let _: () = query(&mut c, &["WATCH", "n"]);
                    let n: Option<i64> = query(&mut c, &["GET", "n"]);
                    let _: () = query(&mut c, &["MULTI"]);
                    let _: () = query(&mut c, &["SET", "n", &(n.unwrap_or(0) + 1).to_string()]);
                    if let Value::Array(_) = query::<Value>(&mut c, &["EXEC"]) {
                        committed += 1;
                    }
                    // A pipeline whose replies must come back in order.
                    let key = format!("p:{t}");
                    let mut pipe = redis::pipe();
                    for _ in 0..8 {
                        pipe.cmd("INCR").arg(&key);
                    }
                    let got: Vec<i64> = pipe.query(&mut c).expect("pipeline");
                    let base = i64::try_from(i * 8).expect("small");
                    assert_eq!(got, (base + 1..=base + 8).collect::<Vec<_>>());
                }
                committed
            })
        })
        .collect();
    let committed: i64 = clients
        .into_iter()
        .map(|c| c.join().expect("client thread"))
        .sum();
    stop.store(true, Relaxed);
    let flips = flipper.join().expect("flipper");
    let total: i64 = (0..ACCOUNTS)
        .map(|a| query::<i64>(&mut admin, &["GET", &format!("acct:{a}")]))
        .sum();
    assert_eq!(total, ACCOUNTS * INITIAL, "transfers are whole");
    assert_eq!(query::<i64>(&mut admin, &["GET", "n"]), committed);
    for t in 0..4 {
        assert_eq!(
            query::<i64>(&mut admin, &["GET", &format!("p:{t}")]),
            150 * 8
        );
    }
    let moved = moves(&mut admin);
    assert!(flips > 10 && moved > 10, "{flips} flips, {moved} moves");
}

/// Under `sync`, the poller spins only `idle-poll-us` past its last request while writes wait
/// for fsyncs (those gaps are the disk's); a load that fsyncs nothing, reads only, spins as
/// long as under `async`.
#[test]
fn under_sync_a_read_only_load_spins_longer_and_writes_do_not() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = TestServer::sync_in(dir.path());
    let mut admin = server.client();
    let mut c = server.client();
    let short = keel_server::lanes::IDLE_POLL_US_DEFAULT.to_string();
    let long = keel_server::lanes::BUSY_SPIN.as_micros().to_string();
    // Pipelines of 200 commands: well above the rate from which the spin is raised.
    let run_until =
        |c: &mut redis::Connection, admin: &mut redis::Connection, cmd: &str, spin: &str| {
            let began = std::time::Instant::now();
            while info_field(admin, "spin_us") != spin {
                assert!(
                    began.elapsed() < Duration::from_secs(20),
                    "{cmd}: spin stayed at {}",
                    info_field(admin, "spin_us")
                );
                let mut pipe = redis::pipe();
                for i in 0..200 {
                    pipe.cmd(cmd).arg(format!("k{i}"));
                    if cmd == "SET" {
                        pipe.arg("v");
                    }
                }
                let _: Vec<Value> = pipe.query(c).expect("pipeline");
            }
        };
    run_until(&mut c, &mut admin, "GET", &long);
    run_until(&mut c, &mut admin, "SET", &short);
    run_until(&mut c, &mut admin, "GET", &long);
}
