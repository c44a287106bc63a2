//! The wire: inline commands, pipelining, malformed frames, limits, unknown commands, arity.

use std::io::Write;

use crate::{TestServer, error, exchange, is_closed, query};

#[test]
fn inline_and_pipelined() {
    let server = TestServer::start();
    let mut s = server.raw();
    let reply = exchange(&mut s, b"PING\r\nSET k \"a b\"\r\nGET k\n", 20);
    assert_eq!(reply, b"+PONG\r\n+OK\r\n$3\r\na b\r\n");
    // A pipeline of 1000 requests, sent in one write, answered in order.
    let mut request = Vec::new();
    let mut expected = Vec::new();
    for i in 0..1000 {
        let v = i.to_string();
        request.extend_from_slice(
            format!(
                "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${}\r\n{v}\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
                v.len()
            )
            .as_bytes(),
        );
        expected.extend_from_slice(format!("+OK\r\n${}\r\n{v}\r\n", v.len()).as_bytes());
    }
    assert_eq!(exchange(&mut s, &request, expected.len()), expected);
    // A request split across many writes.
    let frame = b"*3\r\n$3\r\nSET\r\n$5\r\nsplit\r\n$5\r\nhello\r\n";
    for chunk in frame.chunks(3) {
        s.write_all(chunk).expect("write");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(exchange(&mut s, b"", 5), b"+OK\r\n");

    let mut c = server.client();
    let (a, b): (String, Option<String>) = redis::pipe()
        .cmd("GET")
        .arg("split")
        .cmd("GET")
        .arg("missing")
        .query(&mut c)
        .expect("pipeline");
    assert_eq!((a.as_str(), b), ("hello", None));
}

#[test]
fn malformed_frames_close_with_redis_errors() {
    let server = TestServer::start();
    let cases: &[(&[u8], &str)] = &[
        (
            b"*1\r\n+PING\r\n",
            "-ERR Protocol error: expected '$', got '+'\r\n",
        ),
        (
            b"*x\r\n",
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*1\r\n$-5\r\n",
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"SET \"a\r\n",
            "-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
        (
            b"*1\r\n$99999999999\r\n",
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
    ];
    for (request, reply) in cases {
        let mut s = server.raw();
        // A valid command before the bad frame is still answered.
        let mut bytes = b"PING\r\n".to_vec();
        bytes.extend_from_slice(request);
        let got = exchange(&mut s, &bytes, 7 + reply.len());
        assert_eq!(String::from_utf8_lossy(&got), format!("+PONG\r\n{reply}"));
        assert!(is_closed(&mut s), "connection must close after {reply}");
    }
    // The server is unharmed.
    let mut c = server.client();
    assert_eq!(query::<String>(&mut c, &["PING"]), "PONG");
}

#[test]
fn oversized_inline_request_closes() {
    let server = TestServer::start();
    let mut s = server.raw();
    let long = vec![b'a'; 70 * 1024];
    let got = exchange(&mut s, &long, 44);
    assert_eq!(got, b"-ERR Protocol error: too big inline request\r\n");
    assert!(is_closed(&mut s));
}

#[test]
fn proto_max_bulk_len_is_enforced_and_settable() {
    let server = TestServer::start();
    let mut c = server.client();
    assert_eq!(
        query::<Vec<String>>(&mut c, &["CONFIG", "GET", "proto-max-bulk-len"]),
        vec!["proto-max-bulk-len".to_string(), "16777216".to_string()]
    );
    let _: () = query(&mut c, &["CONFIG", "SET", "proto-max-bulk-len", "2048"]);
    let mut s = server.raw();
    let got = exchange(&mut s, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2049\r\n", 40);
    assert_eq!(got, b"-ERR Protocol error: invalid bulk length\r\n");
    assert!(is_closed(&mut s));
    let value = "x".repeat(2048);
    assert_eq!(query::<String>(&mut c, &["SET", "k", &value]), "OK");
    assert_eq!(
        error(&mut c, &["APPEND", "k", "y"]),
        "ERR string exceeds maximum allowed size (proto-max-bulk-len)"
    );
}

#[test]
fn unknown_commands_and_arity_keep_the_connection() {
    let server = TestServer::start();
    let mut c = server.client();
    assert_eq!(
        error(&mut c, &["NOSUCH", "a", "b"]),
        "ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' "
    );
    // Arguments as C's printf shows them: cut at a NUL byte, and at 128 bytes in all.
    let long = "x".repeat(100);
    assert_eq!(
        error(&mut c, &["NOSUCH", "a\0b", &long, &long, "c"]),
        format!(
            "ERR unknown command 'NOSUCH', with args beginning with: 'a' '{long}' '{}' ",
            &long[..21]
        )
    );
    assert_eq!(
        error(&mut c, &["GET"]),
        "ERR wrong number of arguments for 'get' command"
    );
    assert_eq!(
        error(&mut c, &["GET", "a", "b"]),
        "ERR wrong number of arguments for 'get' command"
    );
    assert_eq!(
        error(&mut c, &["SELECT", "1"]),
        "ERR DB index is out of range"
    );
    assert_eq!(
        error(&mut c, &["SELECT", "2147483648"]),
        "ERR value is out of range, value must between -2147483648 and 2147483647"
    );
    assert_eq!(query::<String>(&mut c, &["SELECT", "0"]), "OK");
    assert_eq!(query::<String>(&mut c, &["PING"]), "PONG");
}

#[test]
fn client_that_stops_reading_does_not_stall_others() {
    let server = TestServer::start();
    let mut c = server.client();
    let value = "v".repeat(1 << 20);
    let _: () = query(&mut c, &["SET", "big", &value]);
    // Pipeline many GETs of a 1 MiB value and never read the replies: the server must stop
    // reading from this client (bounded output) instead of buffering hundreds of MiB.
    let rss = |info: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory_rss:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("used_memory_rss")
    };
    // The server runs in this test process beside the other tests: measure what it grew by.
    let before = rss(&query::<String>(&mut c, &["INFO", "memory"]));
    let mut s = server.raw();
    s.set_nonblocking(true).expect("nonblocking");
    let request = b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n".repeat(1_000_000);
    let mut written = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while written < request.len() && std::time::Instant::now() < deadline {
        match s.write(&request[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Err(e) => panic!("write: {e}"),
        }
    }
    assert!(
        written < request.len(),
        "the server kept reading a client that does not read its replies"
    );
    let info: String = query(&mut c, &["INFO", "memory"]);
    let grown = rss(&info).saturating_sub(before);
    // About 290 MB alone (a pipeline batch's replies wait in the output buffer), more with
    // the other tests of this process running beside it; buffering every reply of the
    // pipeline would take about a terabyte.
    eprintln!("server RSS grew by {grown} bytes");
    assert!(grown < 1 << 30, "server RSS grew by {grown} bytes");
    assert_eq!(query::<String>(&mut c, &["PING"]), "PONG");
}

#[test]
fn reply_bytes_limit() {
    let server = TestServer::with(|c| c.reply_bytes_max = 1 << 20);
    let mut c = server.client();
    let value = "v".repeat(300 * 1024);
    let _: () = query(&mut c, &["SET", "a", &value]);
    assert_eq!(query::<Vec<String>>(&mut c, &["MGET", "a", "a"]).len(), 2);
    assert_eq!(
        error(&mut c, &["MGET", "a", "a", "a", "a"]),
        "ERR keel: reply exceeds the output buffer limit (reply-bytes-max)"
    );
    assert_eq!(query::<String>(&mut c, &["PING"]), "PONG");
}

/// A pipeline of writes shares engine transactions (and so fsyncs), yet replies and effects
/// are those of running each command alone, failures included.
#[test]
fn pipelined_writes_share_commits_with_per_command_semantics() {
    let server = TestServer::start();
    let mut c = server.client();
    let _: () = query(&mut c, &["SET", "text", "abc"]);
    let commits = |c: &mut redis::Connection| -> u64 {
        let info: String = query(c, &["INFO", "keel"]);
        info.lines()
            .find_map(|l| l.strip_prefix("keel_commits:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("keel_commits")
    };
    let before = commits(&mut c);
    let mut s = server.raw();
    let mut request = Vec::new();
    let mut expected = Vec::new();
    for i in 0..100 {
        request.extend_from_slice(format!("SET p{i} {i}\r\nINCR n\r\n").as_bytes());
        expected.extend_from_slice(format!("+OK\r\n:{}\r\n", i + 1).as_bytes());
    }
    assert_eq!(exchange(&mut s, &request, expected.len()), expected);
    let after = commits(&mut c);
    assert!(
        after - before < 200,
        "200 pipelined writes took {} commits",
        after - before
    );
    // A failure in the middle: only that command fails.
    let got = exchange(&mut s, b"SET a 1\r\nINCR text\r\nSET b 2\r\nGET a\r\n", 63);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "+OK\r\n-ERR value is not an integer or out of range\r\n+OK\r\n$1\r\n1\r\n"
    );
    assert_eq!(query::<i64>(&mut c, &["GET", "b"]), 2);
    assert_eq!(query::<i64>(&mut c, &["GET", "n"]), 100);
    assert_eq!(query::<String>(&mut c, &["GET", "text"]), "abc");
}

#[test]
fn multi_queue_is_bounded() {
    let server = TestServer::start();
    let mut s = server.raw();
    let mut request = b"MULTI\r\n".to_vec();
    request.extend_from_slice(&b"INCR n\r\n".repeat(65_537));
    request.extend_from_slice(b"EXEC\r\n");
    let queued = b"+QUEUED\r\n".len() * 65_536;
    let full = "-ERR keel: MULTI queue is full (at most 65536 commands and 33554432 bytes)\r\n";
    let abort = "-EXECABORT Transaction discarded because of previous errors.\r\n";
    let got = exchange(&mut s, &request, 5 + queued + full.len() + abort.len());
    assert_eq!(
        String::from_utf8_lossy(&got[5 + queued..]),
        format!("{full}{abort}")
    );
    let mut c = server.client();
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "n"]), 0);
}

#[test]
fn query_buffer_is_bounded() {
    let server = TestServer::start();
    let mut s = server.raw();
    // Three 16 MiB arguments are more than one request may hold: the server closes the
    // connection before the request is whole, as Redis does at client-query-buffer-limit.
    let chunk = vec![b'x'; 16 * 1024 * 1024];
    let mut sent = 0;
    let _ = s.write_all(b"*4\r\n$3\r\nSET\r\n");
    for _ in 0..3 {
        if s.write_all(b"$16777216\r\n").is_err() || s.write_all(&chunk).is_err() {
            break;
        }
        let _ = s.write_all(b"\r\n");
        sent += 1;
    }
    assert!(sent <= 3);
    assert!(
        is_closed(&mut s),
        "the connection stays open past the query buffer limit"
    );
    let mut c = server.client();
    assert_eq!(query::<String>(&mut c, &["PING"]), "PONG");
}

/// A server that closes a connection with input left unread resets it, and the client's
/// first read after that reports the reset (the next ones read EOF): [`is_closed`] counts
/// either as closed. `query_buffer_is_bounded` meets the reset there when its writes all
/// went into socket buffers before the server closed, as on a loaded machine.
#[test]
fn is_closed_sees_a_reset_on_the_first_read() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let mut client =
        std::net::TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
    client
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let (server, _) = listener.accept().expect("accept");
    client.write_all(b"never read").expect("write");
    // Once the bytes arrived, closing resets the connection.
    server.peek(&mut [0u8; 1]).expect("the bytes arrive");
    drop(server);
    assert!(is_closed(&mut client));
}
