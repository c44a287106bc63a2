//! Connection and server commands: HELLO, AUTH, CLIENT, COMMAND, CONFIG, INFO, RESET,
//! SHUTDOWN, limits, protected mode and the metrics endpoint.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use redis::Value;

use crate::{TestServer, error, exchange, is_closed, query};

#[test]
fn hello_switches_protocol() {
    let server = TestServer::start();
    let mut s = server.raw();
    let got = exchange(&mut s, b"HELLO 3\r\n", 10);
    assert!(
        got.starts_with(b"%7\r\n"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let got = exchange(&mut s, b"GET nope\r\n", 3);
    assert_eq!(got, b"_\r\n");
    let got = exchange(&mut s, b"HELLO 4\r\n", 39);
    assert_eq!(got, b"-NOPROTO unsupported protocol version\r\n");
    let got = exchange(&mut s, b"HELLO 2\r\n", 4);
    assert!(got.starts_with(b"*14\r\n"));
    let mut c = server.client_proto(true);
    let hello: Value = query(&mut c, &["HELLO", "3"]);
    let Value::Map(fields) = hello else {
        panic!("HELLO 3 returns a map, got {hello:?}");
    };
    assert!(fields.contains(&(Value::BulkString(b"proto".to_vec()), Value::Int(3))));
}

#[test]
fn requirepass_auth_and_noauth() {
    let server = TestServer::with(|c| c.requirepass = Some("s3cret".into()));
    let mut s = server.raw();
    let got = exchange(&mut s, b"GET k\r\n", 34);
    assert_eq!(got, b"-NOAUTH Authentication required.\r\n");
    let wrongpass = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n";
    let got = exchange(&mut s, b"AUTH wrong\r\n", wrongpass.len());
    assert_eq!(got, wrongpass);
    // Unauthenticated clients may not send big requests.
    let got = exchange(&mut s, b"*11\r\n", 55);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR Protocol error: unauthenticated multibulk length\r\n"
    );
    assert!(is_closed(&mut s));
    let mut s = server.raw();
    assert_eq!(
        exchange(&mut s, b"AUTH s3cret\r\nPING\r\n", 12),
        b"+OK\r\n+PONG\r\n"
    );
    assert_eq!(exchange(&mut s, b"AUTH default s3cret\r\n", 5), b"+OK\r\n");
    // The redis crate authenticates from the URL, over RESP2 (AUTH) and RESP3 (HELLO AUTH).
    for resp3 in [false, true] {
        let proto = if resp3 { "?protocol=resp3" } else { "" };
        let url = format!("redis://:s3cret@{}/{proto}", server.addr);
        let mut c = redis::Client::open(url)
            .expect("url")
            .get_connection()
            .expect("authenticated connection");
        assert_eq!(query::<String>(&mut c, &["SET", "k", "v"]), "OK");
    }
    let bad = format!("redis://:nope@{}/?protocol=resp3", server.addr);
    assert!(
        redis::Client::open(bad)
            .expect("url")
            .get_connection()
            .is_err()
    );
    // CONFIG SET requirepass changes it for new connections.
    let mut c = redis::Client::open(format!("redis://:s3cret@{}/", server.addr))
        .expect("url")
        .get_connection()
        .expect("connect");
    let _: () = query(&mut c, &["CONFIG", "SET", "requirepass", ""]);
    let mut open = server.client();
    assert_eq!(query::<String>(&mut open, &["PING"]), "PONG");
    assert!(error(&mut open, &["AUTH", "x"]).starts_with("ERR AUTH <password> called without"));
    // Without a password the default user takes any: so Redis answers.
    assert_eq!(query::<String>(&mut open, &["AUTH", "default", "x"]), "OK");
    assert_eq!(
        error(&mut open, &["AUTH", "alice", "x"]),
        "WRONGPASS invalid username-password pair or user is disabled."
    );
}

#[test]
fn client_commands() {
    let server = TestServer::start();
    let mut a = server.client();
    let mut b = server.client();
    let id_a: i64 = query(&mut a, &["CLIENT", "ID"]);
    let id_b: i64 = query(&mut b, &["CLIENT", "ID"]);
    assert_ne!(id_a, id_b);
    assert_eq!(
        query::<Option<String>>(&mut a, &["CLIENT", "GETNAME"]),
        None
    );
    assert_eq!(
        query::<String>(&mut a, &["CLIENT", "SETNAME", "alpha"]),
        "OK"
    );
    assert_eq!(query::<String>(&mut a, &["CLIENT", "GETNAME"]), "alpha");
    assert_eq!(
        error(&mut a, &["CLIENT", "SETNAME", "a b"]),
        "ERR Client names cannot contain spaces, newlines or special characters."
    );
    assert_eq!(
        query::<String>(&mut a, &["CLIENT", "SETINFO", "LIB-NAME", "tester"]),
        "OK"
    );
    let list: String = query(&mut a, &["CLIENT", "LIST"]);
    assert!(list.contains(&format!("id={id_a} ")), "{list}");
    assert!(list.contains("name=alpha "), "{list}");
    assert!(list.contains("lib-name=tester "), "{list}");
    assert!(list.contains(&format!("id={id_b} ")), "{list}");
    assert_eq!(
        error(&mut a, &["CLIENT", "NOSUCH"]),
        "ERR unknown subcommand 'NOSUCH'. Try CLIENT HELP."
    );
    assert_eq!(
        query::<i64>(&mut a, &["CLIENT", "KILL", "ID", &id_b.to_string()]),
        1
    );
    assert!(query_fails(&mut b));
    assert_eq!(
        error(&mut a, &["CLIENT", "KILL", "1.2.3.4:5"]),
        "ERR No such client"
    );
}

fn query_fails(c: &mut redis::Connection) -> bool {
    for _ in 0..50 {
        if redis::cmd("PING").query::<String>(c).is_err() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

#[test]
fn command_config_info_reset() {
    let server = TestServer::start();
    let mut c = server.client();
    let count: i64 = query(&mut c, &["COMMAND", "COUNT"]);
    assert!(count >= 45);
    let all: Vec<Value> = query(&mut c, &["COMMAND"]);
    assert_eq!(all.len() as i64, count);
    let info: Vec<Value> = query(&mut c, &["COMMAND", "INFO", "get", "keel.range", "nosuch"]);
    assert_eq!(info.len(), 3);
    assert_eq!(info[2], Value::Nil);
    let Value::Array(get) = &info[0] else {
        panic!("{:?}", info[0]);
    };
    assert_eq!(get[0], Value::BulkString(b"get".to_vec()));
    assert_eq!(get[1], Value::Int(2));
    let docs: Value = query(&mut c, &["COMMAND", "DOCS", "keel.max"]);
    assert!(format!("{docs:?}").contains("Commutative"));

    let config: Vec<String> = query(&mut c, &["CONFIG", "GET", "*"]);
    assert!(config.contains(&"appendonly".to_string()));
    assert_eq!(
        query::<Vec<String>>(&mut c, &["CONFIG", "GET", "save", "appendonly"]),
        vec!["save", "", "appendonly", "no"]
    );
    assert_eq!(
        error(&mut c, &["CONFIG", "SET", "nosuch", "1"]),
        "ERR Unknown option or number of arguments for CONFIG SET - 'nosuch'"
    );
    assert_eq!(
        error(&mut c, &["CONFIG", "SET", "port", "1"]),
        "ERR CONFIG SET failed (possibly related to argument 'port') - can't set immutable config"
    );
    let _: () = query(&mut c, &["SET", "k", "v"]);
    let info: String = query(&mut c, &["INFO"]);
    for section in [
        "# Server",
        "# Clients",
        "# Memory",
        "# Persistence",
        "# Stats",
        "# Keel",
        "# Split",
        "# Keyspace",
    ] {
        assert!(info.contains(section), "INFO lacks {section}");
    }
    assert!(info.contains("db0:keys=1,"));
    assert!(info.contains("keel_commits:"));
    let only: String = query(&mut c, &["INFO", "keel"]);
    assert!(only.starts_with("# Keel") && !only.contains("# Server"));

    let _: () = query(&mut c, &["CLIENT", "SETNAME", "x"]);
    let _: () = query(&mut c, &["MULTI"]);
    let reset: String = query(&mut c, &["RESET"]);
    assert_eq!(reset, "RESET");
    assert_eq!(
        query::<Option<String>>(&mut c, &["CLIENT", "GETNAME"]),
        None
    );
    assert_eq!(query::<String>(&mut c, &["GET", "k"]), "v");
}

#[test]
fn shutdown_stops_the_server() {
    let server = TestServer::start();
    let addr = server.addr;
    let mut c = server.client();
    let _: () = query(&mut c, &["SET", "k", "v"]);
    let mut s = server.raw();
    s.write_all(b"SHUTDOWN\r\n").expect("write");
    let mut buf = [0u8; 16];
    assert_eq!(
        s.read(&mut buf).expect("read"),
        0,
        "SHUTDOWN closes without a reply"
    );
    server.join();
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[test]
fn maxclients_rejects_extra_connections() {
    let server = TestServer::with(|c| c.maxclients = 2);
    let _a = server.client();
    let _b = server.client();
    let mut s = server.raw();
    let got = exchange(&mut s, b"PING\r\n", 36);
    assert_eq!(got, b"-ERR max number of clients reached\r\n");
}

#[test]
fn protected_mode_refuses_open_bind_without_password() {
    let mut config = keel_server::Config::default();
    config.bind = "0.0.0.0".parse().expect("ip");
    config.port = 0;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = runtime.block_on(keel_server::Server::bind(config));
    let Err(e) = result else {
        panic!("bound 0.0.0.0 without a password");
    };
    assert!(e.to_string().contains("refusing to listen"), "{e}");
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let server = TestServer::with(|c| c.metrics = Some("127.0.0.1:0".parse().expect("addr")));
    let mut c = server.client();
    let _: () = query(&mut c, &["SET", "k", "v"]);
    let mut sub = server.client();
    let _: () = query(&mut sub, &["PSUBSCRIBE", "p*"]);
    let body = server.metrics();
    assert!(
        body.contains("keel_pubsub_channels{kind=\"pattern\"} 1"),
        "{body}"
    );
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(body.contains("keel_commits_total 1"), "{body}");
    assert!(body.contains("keel_aborts_total{reason=\"phantom\"} 0"));
    assert!(body.contains("keel_command_duration_seconds_bucket{le=\"+Inf\"}"));
    assert!(
        body.contains("keel_lane_pool 1"),
        "starts on the pool: {body}"
    );
}

/// With `sync` durability every acknowledged write is in the log, and concurrent writers share
/// fsyncs (group commit). On the poller, which fsyncs its commits itself.
#[test]
fn sync_durability_logs_and_groups_commits() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().to_path_buf();
    let server = TestServer::with(move |c| {
        c.dir = path;
        c.durability = keel_server::Durability::Sync;
        c.poller = keel_server::lanes::PollerMode::On;
    });
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let url = server.url(false);
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                for i in 0..50 {
                    let _: () = query(&mut c, &["SET", &format!("k{t}:{i}"), "v"]);
                }
                let _: () = redis::pipe()
                    .atomic()
                    .cmd("INCR")
                    .arg("n")
                    .cmd("INCR")
                    .arg("n")
                    .query(&mut c)
                    .expect("exec");
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client");
    }
    let mut c = server.client();
    let info: String = query(&mut c, &["INFO", "persistence"]);
    let field = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {info}"))
    };
    assert_eq!(field("aof_enabled"), 1);
    assert!(field("keel_log_frames") >= 408, "{info}");
    let fsyncs = field("keel_log_fsyncs");
    assert!(fsyncs > 0, "{info}");
    // The poller fsyncs its connections' commits itself.
    assert!(field("keel_log_inline_fsyncs") > 0, "{info}");
    assert!(field("keel_log_inline_fsyncs") <= fsyncs, "{info}");
    // Nothing checkpointed yet: the age counts from start, every frame would be replayed.
    assert!(field("keel_checkpoint_age_seconds") < 600, "{info}");
    assert!(
        field("keel_log_bytes_since_checkpoint") > 408 * 16,
        "{info}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    assert!(field("rdb_last_save_time").abs_diff(now) < 600, "{info}");
    assert!(dir.path().read_dir().expect("dir").count() > 0);
    assert_eq!(query::<i64>(&mut c, &["GET", "n"]), 16);
}

/// `WAIT` on a server without replicas: none holds anything, so it answers 0 at once
/// (Redis waits out the timeout first, or forever with 0), with Redis' errors.
#[test]
fn wait_without_replicas_answers_zero_at_once() {
    let server = TestServer::start();
    let mut c = server.client();
    let _: () = query(&mut c, &["SET", "k", "v"]);
    let began = Instant::now();
    let n: i64 = query(&mut c, &["WAIT", "0", "0"]);
    assert_eq!(n, 0);
    let n: i64 = query(&mut c, &["WAIT", "1", "0"]);
    assert_eq!(n, 0);
    assert!(began.elapsed() < Duration::from_secs(5), "WAIT blocked");
    assert_eq!(
        error(&mut c, &["WAIT", "x", "1"]),
        "ERR value is not an integer or out of range"
    );
    assert_eq!(
        error(&mut c, &["WAIT", "1", "x"]),
        "ERR timeout is not an integer or out of range"
    );
    assert_eq!(
        error(&mut c, &["WAIT", "1", "-1"]),
        "ERR timeout is negative"
    );
    assert_eq!(
        error(&mut c, &["WAIT", "1"]),
        "ERR wrong number of arguments for 'wait' command"
    );
    // Queued inside MULTI and answered at once by EXEC, as Redis answers it there.
    let _: () = query(&mut c, &["MULTI"]);
    let queued: String = query(&mut c, &["WAIT", "1", "100"]);
    assert_eq!(queued, "QUEUED");
    let _: String = query(&mut c, &["SET", "k", "w"]);
    let (n, ok): (i64, String) = query(&mut c, &["EXEC"]);
    assert_eq!((n, ok.as_str()), (0, "OK"));
    assert_eq!(query::<String>(&mut c, &["GET", "k"]), "w");
}

/// `SAVE` writes a checkpoint (the next start replays nothing before it), `BGSAVE`
/// writes one in the background, `LASTSAVE` moves with them; both refuse a server that keeps
/// no files, and bad arguments, with Redis' errors.
#[test]
fn save_bgsave_and_lastsave() {
    let field = |info: &str, name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {info}"))
    };
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let server = TestServer::sync_in(dir.path());
        let mut c = server.client();
        let started: i64 = query(&mut c, &["LASTSAVE"]);
        for i in 0..100 {
            let _: () = query(&mut c, &["SET", &format!("k{i}"), "v"]);
        }
        let info: String = query(&mut c, &["INFO", "persistence"]);
        let before = field(&info, "keel_checkpoints");
        assert!(
            field(&info, "keel_log_bytes_since_checkpoint") > 0,
            "{info}"
        );
        std::thread::sleep(Duration::from_millis(1100));
        let () = query(&mut c, &["SAVE"]);
        let info: String = query(&mut c, &["INFO", "persistence"]);
        assert_eq!(field(&info, "keel_checkpoints"), before + 1, "{info}");
        assert_eq!(field(&info, "keel_log_bytes_since_checkpoint"), 0, "{info}");
        assert_eq!(field(&info, "rdb_bgsave_in_progress"), 0, "{info}");
        let saved: i64 = query(&mut c, &["LASTSAVE"]);
        assert!(
            saved > started,
            "LASTSAVE {saved} after a save, {started} before"
        );
        let _: () = query(&mut c, &["SET", "after", "1"]);
        let answer: String = query(&mut c, &["BGSAVE"]);
        assert_eq!(answer, "Background saving started");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info: String = query(&mut c, &["INFO", "persistence"]);
            if field(&info, "keel_checkpoints") == before + 2 {
                assert_eq!(field(&info, "keel_log_bytes_since_checkpoint"), 0, "{info}");
                break;
            }
            assert!(Instant::now() < deadline, "BGSAVE never finished: {info}");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(error(&mut c, &["BGSAVE", "now"]), "ERR syntax error");
        assert_eq!(
            error(&mut c, &["BGSAVE", "schedule", "x"]),
            "ERR syntax error"
        );
        assert_eq!(
            error(&mut c, &["SAVE", "x"]),
            "ERR wrong number of arguments for 'save' command"
        );
        let () = query(&mut c, &["MULTI"]);
        assert_eq!(
            error(&mut c, &["SAVE"]),
            "ERR Command not allowed inside a transaction"
        );
        let () = query(&mut c, &["DISCARD"]);
        assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 101);
    }
    // A server without files has nothing to save.
    let memory = TestServer::start();
    let mut c = memory.client();
    let nothing =
        "ERR keel: nothing to save: this server keeps its data in memory only (no data directory)";
    assert_eq!(error(&mut c, &["SAVE"]), nothing);
    assert_eq!(error(&mut c, &["BGSAVE"]), nothing);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    assert!((query::<i64>(&mut c, &["LASTSAVE"]) - now).abs() < 600);
}

/// Waits until an fsync is held at `disk`'s gate ([`keel::SimDisk::hold_syncs`]).
fn fsync_held(disk: &keel::SimDisk) {
    let began = Instant::now();
    while disk.syncs_waiting() == 0 {
        assert!(began.elapsed() < Duration::from_secs(10), "no fsync began");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Under `sync`, a single node's commands that write read commits installed but not yet
/// durable (`Db::begin_installed`), and no reply reveals a commit before its fsync: a write
/// is answered once durable, and a read sees only what is durable. With fsyncs held (a slow
/// disk):
/// - eight clients' `LPUSH`es on one list all commit, each on top of the one before, and
///   none is answered, while a reader is answered at once with what is durable (none of
///   them); let go, one to four fsyncs cover all eight (before, each waited for the fsync
///   of the one before it to read it: eight fsyncs at least, one a link);
/// - a write that fails (`WRONGTYPE`) on what another wrote is not answered before that is
///   durable;
/// - power lost before the fsync loses a push nobody was answered for, and nothing else.
#[test]
fn sync_writers_share_fsyncs_and_no_reply_reveals_what_is_not_durable() {
    let disk = keel::SimDisk::new();
    let dir = std::path::PathBuf::from("/sim/keel");
    let start = |disk: &keel::SimDisk| {
        let (disk, dir) = (disk.clone(), dir.clone());
        TestServer::with(move |c| {
            c.dir = dir;
            c.durability = keel_server::Durability::Sync;
            c.sim_disk = Some(disk);
        })
    };
    let server = start(&disk);
    // Dropped before the server: a failing test lets fsyncs go on, or the server's shutdown
    // would wait for one forever.
    struct LetGo(keel::SimDisk);
    impl Drop for LetGo {
        fn drop(&mut self) {
            self.0.release_syncs();
        }
    }
    let _let_go = LetGo(disk.clone());
    let mut c = server.client();
    let fsyncs = |c: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query(c)
            .expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("keel_log_fsyncs:"))
            .expect("keel_log_fsyncs")
            .trim()
            .parse()
            .expect("a count")
    };
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query(&mut c)
        .expect("SET");
    let before = fsyncs(&mut c);
    // Answers arrive on `tx` as (what, reply).
    let (tx, rx) = std::sync::mpsc::channel::<(String, redis::RedisResult<i64>)>();
    // Connected beforehand: while an fsync is held, every reply waits (a connection's
    // handshake too), as under Redis's `appendfsync always` on a stuck disk.
    let mut conns: Vec<redis::Connection> = (0..11).map(|_| server.client()).collect();
    let (mut set_conn, mut push_conn) = (server.client(), server.client());
    let mut ask = |what: &str, cmd: redis::Cmd| {
        let (tx, mut conn, what) = (
            tx.clone(),
            conns.pop().expect("a connection"),
            what.to_string(),
        );
        std::thread::spawn(move || {
            let _ = tx.send((what, cmd.query(&mut conn)));
        })
    };
    disk.hold_syncs();
    let pushers: Vec<_> = (0..8)
        .map(|i| ask("LPUSH", redis::cmd("LPUSH").arg("q").arg(i).clone()))
        .collect();
    // Every push commits while the first fsync is held (a reader would wait too).
    fsync_held(&disk);
    let reader = ask("LLEN", redis::cmd("LLEN").arg("q").clone());
    std::thread::sleep(Duration::from_millis(500));
    // Before the fsync, only a reader that saw none of the pushes may be answered.
    let early: Vec<(String, redis::RedisResult<i64>)> = rx.try_iter().collect();
    for (what, reply) in &early {
        assert!(
            what == "LLEN" && reply == &Ok(0),
            "{what} answered {reply:?} before the fsync"
        );
    }
    disk.release_syncs();
    for t in pushers.into_iter().chain([reader]) {
        t.join().expect("client thread");
    }
    let (mut pushed, mut read) = (Vec::new(), Vec::new());
    for (what, reply) in early.into_iter().chain(rx.try_iter()) {
        let n = reply.unwrap_or_else(|e| panic!("{what}: {e}"));
        match what.as_str() {
            "LPUSH" => pushed.push(n),
            _ => read.push(n),
        }
    }
    pushed.sort_unstable();
    assert_eq!(pushed, (1..=8).collect::<Vec<i64>>());
    assert!(matches!(read[..], [0..=8]), "{read:?}");
    let fsyncs_taken = fsyncs(&mut c) - before;
    // One to three when every push came while the first fsync was held; on a loaded machine
    // a client's thread may start after the release, and its push takes an fsync of its own
    // (CI saw 4 once). Eight pushes that each waited for the one before would take eight.
    assert!(
        fsyncs_taken <= 4,
        "{fsyncs_taken} fsyncs for eight pushes committed while the first was held"
    );
    // A write that fails on what another wrote, not yet durable, is not answered before
    // that is: its error would tell of a commit power loss could erase.
    disk.hold_syncs();
    let set = std::thread::spawn(move || {
        redis::cmd("SET")
            .arg("n")
            .arg("x")
            .query::<String>(&mut set_conn)
    });
    fsync_held(&disk);
    let (failed_tx, failed_rx) = std::sync::mpsc::channel();
    let push = std::thread::spawn(move || {
        let reply = redis::cmd("LPUSH")
            .arg("n")
            .arg("y")
            .query::<i64>(&mut push_conn);
        let _ = failed_tx.send(reply.map_err(|e| e.to_string()));
    });
    std::thread::sleep(Duration::from_millis(300));
    if let Ok(reply) = failed_rx.try_recv() {
        panic!("LPUSH answered {reply:?} before the SET it read was durable");
    }
    disk.release_syncs();
    assert_eq!(set.join().expect("SET").expect("SET"), "OK");
    push.join().expect("LPUSH");
    let reply = failed_rx.recv().expect("LPUSH answered");
    assert!(
        reply.as_ref().is_err_and(|e| e.contains("WRONGTYPE")),
        "{reply:?}"
    );
    // Power lost while a push waits for its fsync: nobody hears of it, and it is gone.
    disk.hold_syncs();
    let lost = ask("LPUSH", redis::cmd("LPUSH").arg("q").arg("lost").clone());
    fsync_held(&disk);
    let reader = ask("LLEN", redis::cmd("LLEN").arg("q").clone());
    std::thread::sleep(Duration::from_millis(300));
    disk.crash();
    disk.release_syncs();
    lost.join().expect("client thread");
    reader.join().expect("client thread");
    // The push was never answered; the reader, if answered, saw only what was durable.
    for (what, reply) in rx.try_iter() {
        assert!(
            reply.is_err() || (what == "LLEN" && reply == Ok(8)),
            "{what} answered {reply:?} though the fsync failed"
        );
    }
    drop(c);
    drop(server);
    let server = start(&disk);
    let len: i64 = redis::cmd("LLEN")
        .arg("q")
        .query(&mut server.client())
        .expect("LLEN");
    assert_eq!(
        len, 8,
        "the unanswered push is gone, the answered ones are there"
    );
}
