//! Integration tests: each starts a real server on a free loopback port and drives it with the
//! `redis` crate (a real client) or, for protocol edge cases, a raw TCP socket; `differential`
//! sends the same random commands to keel and to a real `redis-server` and compares replies.

mod basics;
mod cluster;
mod differential;
mod expiry;
mod hashes;
#[path = "../../../keel/tests/it/history.rs"]
#[allow(
    dead_code,
    reason = "the engine's checker; its other helpers serve the engine tests"
)]
mod history;
mod lanes;
mod lists;
mod once;
mod protocol;
mod pubsub;
mod server;
mod sets;
mod split;
mod txn;
mod types_bank;
mod types_history;
mod zsets;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use keel_server::{Config, Handle, Server};

/// A server running on its own runtime thread; stopped when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub metrics: Option<SocketAddr>,
    handle: Handle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start() -> TestServer {
        TestServer::with(|_| {})
    }

    /// A server with `sync` durability, its files in `dir`.
    pub fn sync_in(dir: &std::path::Path) -> TestServer {
        let dir = dir.to_path_buf();
        TestServer::with(move |c| {
            c.dir = dir;
            c.durability = keel_server::Durability::Sync;
        })
    }

    pub fn with(tune: impl FnOnce(&mut Config)) -> TestServer {
        TestServer::on(None, tune)
    }

    /// A server on `listener` if given (a cluster node, whose port its peers must know
    /// before it starts), else on a free port.
    pub fn on(
        listener: Option<std::net::TcpListener>,
        tune: impl FnOnce(&mut Config),
    ) -> TestServer {
        let mut config = Config::default();
        config.port = 0;
        config.durability = keel_server::Durability::None;
        tune(&mut config);
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let server = match listener {
                    Some(l) => Server::with_listener(config, l).await,
                    None => Server::bind(config).await,
                }
                .expect("bind");
                tx.send((server.local_addr(), server.metrics_addr(), server.handle()))
                    .expect("test is waiting");
                server.run().await.expect("the database closes cleanly");
            });
        });
        let (addr, metrics, handle) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("server started");
        TestServer {
            addr,
            metrics,
            handle,
            thread: Some(thread),
        }
    }

    pub fn url(&self, resp3: bool) -> String {
        let proto = if resp3 { "?protocol=resp3" } else { "" };
        format!("redis://{}/{proto}", self.addr)
    }

    pub fn client(&self) -> redis::Connection {
        self.client_proto(false)
    }

    pub fn client_proto(&self, resp3: bool) -> redis::Connection {
        redis::Client::open(self.url(resp3))
            .expect("url")
            .get_connection_with_timeout(Duration::from_secs(10))
            .expect("connect")
    }

    /// A raw socket, for what a client library would not send.
    pub fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s
    }

    /// The body of one `GET /metrics` (with its HTTP status line and headers).
    pub fn metrics(&self) -> String {
        let mut s = TcpStream::connect(self.metrics.expect("metrics address")).expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        let mut body = String::new();
        s.read_to_string(&mut body).expect("read");
        body
    }

    /// Waits for the server thread to end (after SHUTDOWN).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            t.join().expect("server thread");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends `request` and reads until `expected.len()` bytes came back (or EOF).
pub fn exchange(stream: &mut TcpStream, request: &[u8], expected_len: usize) -> Vec<u8> {
    stream.write_all(request).expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < expected_len {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("read failed after {:?}: {e}", String::from_utf8_lossy(&got)),
        }
    }
    got
}

/// Whether the server closed `stream`: the next read, within the timeout, meets EOF or a
/// reset (what a server that closes with input left unread sends). One read decides: after a
/// reset, the read that reports it is the only one that does, and any later one meets EOF.
pub fn is_closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(n) => n == 0,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// A client connection to `url` (from [`TestServer::url`]), for a client thread.
pub fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("url")
        .get_connection()
        .expect("connect")
}

/// One field of an `INFO` reply.
pub fn info_field<'a>(info: &'a str, name: &str) -> &'a str {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(str::trim)
        .unwrap_or_else(|| panic!("{name} in {info}"))
}

/// One numeric field of an `INFO` reply.
pub fn info_counter(info: &str, name: &str) -> u64 {
    info_field(info, name)
        .parse()
        .unwrap_or_else(|_| panic!("{name} is a number in {info}"))
}

pub fn query<T: redis::FromRedisValue>(con: &mut redis::Connection, args: &[&str]) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con)
        .unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

/// The server error text of a command expected to fail.
pub fn error(con: &mut redis::Connection, args: &[&str]) -> String {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    match c.query::<redis::Value>(con) {
        Err(e) => {
            let code = e.code().unwrap_or("");
            let detail = e.detail().unwrap_or("");
            if code.is_empty() {
                detail.to_string()
            } else {
                format!("{code} {detail}")
            }
        }
        Ok(v) => panic!("{args:?} should fail, got {v:?}"),
    }
}

/// Milliseconds since `set`, as far as a server's deadlines can tell: 2 ms more, as the
/// server's clock and this one each count whole milliseconds.
pub fn waited_ms(set: Instant) -> i64 {
    i64::try_from(set.elapsed().as_millis()).expect("a short wait") + 2
}

/// Asserts that `key`'s `TTL` is what a TTL of `seconds`, set after the instant `set`, has
/// left: `seconds` less the time since `set`, rounded to the nearest second as `TTL` does.
/// Right after the set that is `seconds` exactly; a loaded machine may take seconds between
/// setting and asking, and the bound widens by what it took.
pub fn assert_ttl(con: &mut redis::Connection, key: &str, seconds: i64, set: Instant) {
    let ttl: i64 = query(con, &["TTL", key]);
    let waited_ms = waited_ms(set);
    let least = (seconds * 1000 - waited_ms + 500).div_euclid(1000);
    assert!(
        (least..=seconds).contains(&ttl),
        "TTL {key} is {ttl}, set to {seconds} {waited_ms} ms before"
    );
}

/// Whether `watcher`'s transaction survives `write` by `other`: `watcher` watches `watched`,
/// `other` runs `write`, then `watcher` runs `MULTI`, `SET watch:marker 1`, `EXEC`. True if
/// `EXEC` ran (the marker is then deleted again), false if it was aborted (nil).
pub fn exec_survives(
    watcher: &mut redis::Connection,
    other: &mut redis::Connection,
    watched: &str,
    write: &[&str],
) -> bool {
    let _: () = query(watcher, &["WATCH", watched]);
    let _: redis::Value = query(other, write);
    let _: () = query(watcher, &["MULTI"]);
    let _: () = query(watcher, &["SET", "watch:marker", "1"]);
    let reply: redis::Value = query(watcher, &["EXEC"]);
    let ran = query::<i64>(watcher, &["DEL", "watch:marker"]) == 1;
    match reply {
        redis::Value::Nil => assert!(!ran, "an aborted EXEC set the marker"),
        _ => assert!(ran, "EXEC answered {reply:?} but did not set the marker"),
    }
    ran
}
