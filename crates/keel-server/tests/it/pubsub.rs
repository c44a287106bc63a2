//! Pub/sub: Redis 7's replies byte for byte in RESP2 and RESP3, the RESP2 subscriber's
//! restrictions, patterns and shard channels, subscriptions that end with their connection,
//! the output buffer limit, and delivery under many publishers and subscribers while
//! connections move between lanes.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use redis::Value;

use crate::{TestServer, error, info_counter, query};

/// Sends `request` and reads exactly `expected.len()` bytes, which must be `expected`.
pub(crate) fn expect(stream: &mut TcpStream, request: &[u8], expected: &[u8]) {
    stream.write_all(request).expect("write");
    read_expect(stream, expected);
}

/// Reads exactly `expected.len()` bytes, which must be `expected`.
pub(crate) fn read_expect(stream: &mut TcpStream, expected: &[u8]) {
    let mut got = vec![0u8; expected.len()];
    stream.read_exact(&mut got).unwrap_or_else(|e| {
        panic!(
            "reading {:?}: {e}",
            String::from_utf8_lossy(expected).replace("\r\n", "|")
        )
    });
    assert_eq!(
        String::from_utf8_lossy(&got).replace("\r\n", "|"),
        String::from_utf8_lossy(expected).replace("\r\n", "|")
    );
}

fn resp3(server: &TestServer) -> TcpStream {
    let mut s = server.raw();
    s.write_all(b"HELLO 3\r\n").expect("write");
    // The HELLO map: read up to its last field, `modules` with an empty array.
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"$7\r\nmodules\r\n*0\r\n") {
        s.read_exact(&mut byte).expect("HELLO reply");
        got.push(byte[0]);
    }
    s
}

const CONTEXT: &str =
    "only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context";

#[test]
fn resp2_subscriber_gets_messages_and_only_pubsub_commands() {
    let server = TestServer::start();
    let mut publisher = server.client();
    let mut sub = server.raw();
    expect(
        &mut sub,
        b"SUBSCRIBE news news2 news\r\n",
        b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n\
          *3\r\n$9\r\nsubscribe\r\n$5\r\nnews2\r\n:2\r\n\
          *3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:2\r\n",
    );
    assert_eq!(
        query::<i64>(&mut publisher, &["PUBLISH", "news", "hello"]),
        1
    );
    read_expect(
        &mut sub,
        b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nhello\r\n",
    );
    assert_eq!(query::<i64>(&mut publisher, &["PUBLISH", "other", "x"]), 0);

    // Patterns: a message matching both a channel and a pattern arrives once for each.
    expect(
        &mut sub,
        b"PSUBSCRIBE n*s [x]\r\n",
        b"*3\r\n$10\r\npsubscribe\r\n$3\r\nn*s\r\n:3\r\n\
          *3\r\n$10\r\npsubscribe\r\n$3\r\n[x]\r\n:4\r\n",
    );
    assert_eq!(
        query::<i64>(&mut publisher, &["PUBLISH", "news", "both"]),
        2
    );
    read_expect(
        &mut sub,
        b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$4\r\nboth\r\n\
          *4\r\n$8\r\npmessage\r\n$3\r\nn*s\r\n$4\r\nnews\r\n$4\r\nboth\r\n",
    );
    assert_eq!(query::<i64>(&mut publisher, &["PUBLISH", "x", "p"]), 1);
    read_expect(
        &mut sub,
        b"*4\r\n$8\r\npmessage\r\n$3\r\n[x]\r\n$1\r\nx\r\n$1\r\np\r\n",
    );

    // Only (un)subscribing, PING, QUIT and RESET in this context, with Redis's errors
    // (subcommands by their full name; unknown ones and wrong arities as usual).
    expect(
        &mut sub,
        b"GET k\r\nSET k v\r\nCLIENT ID\r\nMULTI\r\nHELLO 3\r\nCLIENT NOSUCH\r\nNOSUCH\r\nSUBSCRIBE\r\n",
        format!(
            "-ERR Can't execute 'get': {CONTEXT}\r\n-ERR Can't execute 'set': {CONTEXT}\r\n\
             -ERR Can't execute 'client|id': {CONTEXT}\r\n-ERR Can't execute 'multi': {CONTEXT}\r\n\
             -ERR Can't execute 'hello': {CONTEXT}\r\n\
             -ERR unknown subcommand 'NOSUCH'. Try CLIENT HELP.\r\n\
             -ERR unknown command 'NOSUCH', with args beginning with: \r\n\
             -ERR wrong number of arguments for 'subscribe' command\r\n"
        )
        .as_bytes(),
    );
    // A refused EXEC says why, as Redis's EXECABORT.
    expect(
        &mut sub,
        b"EXEC\r\n",
        format!("-EXECABORT Transaction discarded because of: Can't execute 'exec': {CONTEXT}\r\n")
            .as_bytes(),
    );
    expect(
        &mut sub,
        b"PING\r\nPING hi\r\n",
        b"*2\r\n$4\r\npong\r\n$0\r\n\r\n*2\r\n$4\r\npong\r\n$2\r\nhi\r\n",
    );
    assert_eq!(
        query::<Vec<Value>>(&mut publisher, &["PUBSUB", "NUMSUB", "news", "x", "nope"]),
        vec![
            Value::BulkString(b"news".to_vec()),
            Value::Int(1),
            Value::BulkString(b"x".to_vec()),
            Value::Int(0),
            Value::BulkString(b"nope".to_vec()),
            Value::Int(0),
        ]
    );
    assert_eq!(query::<i64>(&mut publisher, &["PUBSUB", "NUMPAT"]), 2);
    let mut channels: Vec<String> = query(&mut publisher, &["PUBSUB", "CHANNELS"]);
    channels.sort();
    assert_eq!(channels, ["news", "news2"]);
    let channels: Vec<String> = query(&mut publisher, &["PUBSUB", "CHANNELS", "*2"]);
    assert_eq!(channels, ["news2"]);
    let info: String = query(&mut publisher, &["INFO", "stats"]);
    assert_eq!(info_counter(&info, "pubsub_channels"), 2);
    assert_eq!(info_counter(&info, "pubsub_patterns"), 2);
    let list: String = query(&mut publisher, &["CLIENT", "LIST"]);
    assert!(list.contains("flags=P db=0 sub=2 psub=2 ssub=0"), "{list}");

    // Unsubscribing from everything: one reply per subscription, in subscription order,
    // then one with a null name when there are none; out of the context, commands work.
    expect(
        &mut sub,
        b"UNSUBSCRIBE\r\nUNSUBSCRIBE\r\nPUNSUBSCRIBE nope\r\nPUNSUBSCRIBE\r\nSUNSUBSCRIBE\r\nGET k\r\nPING\r\n",
        b"*3\r\n$11\r\nunsubscribe\r\n$4\r\nnews\r\n:3\r\n\
          *3\r\n$11\r\nunsubscribe\r\n$5\r\nnews2\r\n:2\r\n\
          *3\r\n$11\r\nunsubscribe\r\n$-1\r\n:2\r\n\
          *3\r\n$12\r\npunsubscribe\r\n$4\r\nnope\r\n:2\r\n\
          *3\r\n$12\r\npunsubscribe\r\n$3\r\nn*s\r\n:1\r\n\
          *3\r\n$12\r\npunsubscribe\r\n$3\r\n[x]\r\n:0\r\n\
          *3\r\n$12\r\nsunsubscribe\r\n$-1\r\n:0\r\n\
          $-1\r\n+PONG\r\n",
    );
    assert_eq!(query::<i64>(&mut publisher, &["PUBLISH", "news", "x"]), 0);
    let info: String = query(&mut publisher, &["INFO", "stats"]);
    assert_eq!(info_counter(&info, "pubsub_channels"), 0);
    assert_eq!(info_counter(&info, "pubsub_patterns"), 0);
}

#[test]
fn resp3_subscriber_gets_pushes_and_runs_any_command() {
    let server = TestServer::start();
    let mut publisher = server.client();
    let mut sub = resp3(&server);
    expect(
        &mut sub,
        b"SUBSCRIBE c\r\nSET k v\r\nGET k\r\nPING\r\n",
        b">3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n+OK\r\n$1\r\nv\r\n+PONG\r\n",
    );
    assert_eq!(query::<i64>(&mut publisher, &["PUBLISH", "c", "m1"]), 1);
    read_expect(&mut sub, b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nm1\r\n");

    // A message to itself comes before PUBLISH's count, also from EXEC (inside its reply,
    // as from Redis), where it is sent only once the transaction committed.
    expect(
        &mut sub,
        b"PUBLISH c self\r\nMULTI\r\nINCR n\r\nPUBLISH c tx\r\nPUBSUB NUMSUB c\r\nEXEC\r\n",
        b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$4\r\nself\r\n:1\r\n+OK\r\n+QUEUED\r\n+QUEUED\r\n\
          +QUEUED\r\n*3\r\n:1\r\n>3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\ntx\r\n:1\r\n\
          *2\r\n$1\r\nc\r\n:1\r\n",
    );
    // A transaction keel rolls back sends nothing.
    expect(
        &mut sub,
        b"MULTI\r\nPUBLISH c lost\r\nINCR k\r\nEXEC\r\nPING\r\n",
        b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:0\r\n\
          -ERR value is not an integer or out of range\r\n+PONG\r\n",
    );
    // Shard channels are their own namespace.
    expect(
        &mut sub,
        b"SSUBSCRIBE s\r\nPUBLISH s no\r\nSPUBLISH c no\r\nSPUBLISH s yes\r\n",
        b">3\r\n$10\r\nssubscribe\r\n$1\r\ns\r\n:1\r\n:0\r\n:0\r\n\
          >3\r\n$8\r\nsmessage\r\n$1\r\ns\r\n$3\r\nyes\r\n:1\r\n",
    );
    let shard: Vec<String> = query(&mut publisher, &["PUBSUB", "SHARDCHANNELS"]);
    assert_eq!(shard, ["s"]);
    let counts: Vec<Value> = query(&mut publisher, &["PUBSUB", "SHARDNUMSUB", "s", "c"]);
    assert_eq!(
        counts,
        vec![
            Value::BulkString(b"s".to_vec()),
            Value::Int(1),
            Value::BulkString(b"c".to_vec()),
            Value::Int(0),
        ]
    );

    // Back to RESP2 while subscribed: the restrictions apply; RESET ends every
    // subscription and the RESP3 session.
    sub.write_all(b"HELLO 2\r\n").expect("write");
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"$7\r\nmodules\r\n*0\r\n") {
        sub.read_exact(&mut byte).expect("HELLO reply");
        got.push(byte[0]);
    }
    assert!(got.starts_with(b"*14\r\n"));
    expect(
        &mut sub,
        b"GET k\r\nRESET\r\nGET k\r\n",
        format!("-ERR Can't execute 'get': {CONTEXT}\r\n+RESET\r\n$1\r\nv\r\n").as_bytes(),
    );
    assert_eq!(query::<i64>(&mut publisher, &["PUBLISH", "c", "x"]), 0);
    assert_eq!(query::<i64>(&mut publisher, &["SPUBLISH", "s", "x"]), 0);
}

#[test]
fn pubsub_errors_and_help() {
    let server = TestServer::start();
    let mut c = server.client();
    assert_eq!(
        error(&mut c, &["PUBSUB", "FOO"]),
        "ERR unknown subcommand 'FOO'. Try PUBSUB HELP."
    );
    assert_eq!(
        error(&mut c, &["PUBSUB", "NUMPAT", "x"]),
        "ERR wrong number of arguments for 'pubsub|numpat' command"
    );
    assert_eq!(
        error(&mut c, &["PUBSUB", "CHANNELS", "a", "b"]),
        "ERR unknown subcommand or wrong number of arguments for 'CHANNELS'. Try PUBSUB HELP."
    );
    assert_eq!(
        error(&mut c, &["PUBLISH", "c"]),
        "ERR wrong number of arguments for 'publish' command"
    );
    assert_eq!(
        error(&mut c, &["PING", "a", "b"]),
        "ERR wrong number of arguments for 'ping' command"
    );
    let help: Vec<String> = query(&mut c, &["PUBSUB", "HELP"]);
    assert_eq!(help.len(), 14);
    assert!(help[0].starts_with("PUBSUB <subcommand>"));
    // In MULTI a bad PUBSUB is refused when queued, (un)subscribing is not queued at all.
    let _: () = query(&mut c, &["MULTI"]);
    assert_eq!(
        error(&mut c, &["PUBSUB", "FOO"]),
        "ERR unknown subcommand 'FOO'. Try PUBSUB HELP."
    );
    assert_eq!(
        error(&mut c, &["SUBSCRIBE", "a"]),
        "ERR Command not allowed inside a transaction"
    );
    assert_eq!(
        error(&mut c, &["EXEC"]),
        "EXECABORT Transaction discarded because of previous errors."
    );
    // The output buffer limit, in Redis's form.
    let limit: Vec<String> = query(&mut c, &["CONFIG", "GET", "client-output-buffer-limit"]);
    assert_eq!(
        limit[1],
        "normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60"
    );
    assert_eq!(
        error(
            &mut c,
            &["CONFIG", "SET", "client-output-buffer-limit", "pubsub 1mb"]
        ),
        "ERR CONFIG SET failed (possibly related to argument 'client-output-buffer-limit') - \
         Wrong number of arguments in buffer limit configuration."
    );
}

#[test]
fn closed_and_killed_subscribers_leave_no_subscription() {
    let server = TestServer::start();
    let mut admin = server.client();
    let mut subs: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = server.raw();
            expect(
                &mut s,
                b"SUBSCRIBE ch\r\nPSUBSCRIBE p*\r\n",
                b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n\
                  *3\r\n$10\r\npsubscribe\r\n$2\r\np*\r\n:2\r\n",
            );
            s
        })
        .collect();
    let numsub = |admin: &mut redis::Connection| -> i64 {
        let v: Vec<Value> = query(admin, &["PUBSUB", "NUMSUB", "ch"]);
        match v[1] {
            Value::Int(n) => n,
            ref other => panic!("{other:?}"),
        }
    };
    assert_eq!(numsub(&mut admin), 3);
    // Subscribed clients are of Redis's pubsub class.
    let lines = |admin: &mut redis::Connection, ty: &str| {
        query::<String>(admin, &["CLIENT", "LIST", "TYPE", ty])
            .lines()
            .count()
    };
    assert_eq!(lines(&mut admin, "pubsub"), 3);
    assert_eq!(lines(&mut admin, "normal"), 1);
    assert_eq!(lines(&mut admin, "replica"), 0);
    assert_eq!(
        error(&mut admin, &["CLIENT", "LIST", "TYPE", "nosuch"]),
        "ERR Unknown client type 'nosuch'"
    );
    assert_eq!(
        query::<i64>(&mut admin, &["CLIENT", "KILL", "TYPE", "master"]),
        0
    );
    assert_eq!(query::<i64>(&mut admin, &["PUBLISH", "ch", "x"]), 3);
    assert_eq!(query::<i64>(&mut admin, &["PUBLISH", "pq", "x"]), 3);

    // One closes its socket, one is killed, one RESETs.
    drop(subs.remove(0));
    let mut killed = subs.remove(0);
    let list: String = query(&mut admin, &["CLIENT", "LIST"]);
    let port = killed.local_addr().expect("addr").port();
    let id = list
        .lines()
        .find(|l| l.contains(&format!(":{port} ")))
        .and_then(|l| l.strip_prefix("id="))
        .and_then(|l| l.split(' ').next())
        .expect("the killed client is listed")
        .to_owned();
    assert_eq!(query::<i64>(&mut admin, &["CLIENT", "KILL", "ID", &id]), 1);
    // It reads the two messages it had, then the end.
    let mut rest = Vec::new();
    killed.read_to_end(&mut rest).expect("closed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while numsub(&mut admin) != 1 {
        assert!(
            Instant::now() < deadline,
            "subscriptions outlived their clients"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(query::<i64>(&mut admin, &["PUBSUB", "NUMPAT"]), 1);
    let mut last = subs.remove(0);
    last.write_all(b"RESET\r\n").expect("write");
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"+RESET\r\n") {
        last.read_exact(&mut byte).expect("reply");
        got.push(byte[0]);
    }
    assert_eq!(numsub(&mut admin), 0);
    assert_eq!(query::<i64>(&mut admin, &["PUBSUB", "NUMPAT"]), 0);
    let info: String = query(&mut admin, &["INFO", "stats"]);
    assert_eq!(info_counter(&info, "pubsub_channels"), 0);
    assert_eq!(info_counter(&info, "pubsub_patterns"), 0);
}

#[test]
fn subscriber_that_does_not_read_is_cut_off() {
    let server = TestServer::start();
    let mut admin = server.client();
    let _: () = query(
        &mut admin,
        &[
            "CONFIG",
            "SET",
            "client-output-buffer-limit",
            "pubsub 256kb 0 0",
        ],
    );
    let mut slow = server.raw();
    expect(
        &mut slow,
        b"SUBSCRIBE ch\r\n",
        b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n",
    );
    // A subscriber that keeps reading is not cut off.
    let mut fast = server.raw();
    expect(
        &mut fast,
        b"SUBSCRIBE ch\r\n",
        b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n",
    );
    let received = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&received);
    let reader = std::thread::spawn(move || {
        let mut parser = redis::Parser::new();
        let mut reader = BufReader::new(fast);
        let mut count = 0;
        while message(&mut parser, &mut reader).2 != "end" {
            count += 1;
            counted.store(count, std::sync::atomic::Ordering::Release);
        }
        count
    });
    let payload = "x".repeat(16 * 1024);
    let mut sent = 0;
    // The socket's buffers take some megabytes before the server has to hold anything.
    loop {
        let receivers: i64 = query(&mut admin, &["PUBLISH", "ch", &payload]);
        sent += 1;
        if receivers == 1 {
            break;
        }
        // The reading subscriber keeps up however the threads are scheduled (a busy machine
        // once let it fall 256 KiB behind): the next message goes once it has this one.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while received.load(std::sync::atomic::Ordering::Acquire) < sent {
            assert!(std::time::Instant::now() < deadline, "the reader stalled");
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        assert_eq!(receivers, 2);
        assert!(sent < 20_000, "the slow subscriber was never cut off");
    }
    let list: String = query(&mut admin, &["CLIENT", "LIST"]);
    assert_eq!(list.lines().count(), 2, "{list}");
    // The slow one reads what its socket held, then the end.
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    assert!(rest.len() < sent * (payload.len() + 64));
    let info: String = query(&mut admin, &["INFO", "stats"]);
    assert_eq!(info_counter(&info, "pubsub_channels"), 1);
    assert_eq!(
        info_counter(&info, "client_output_buffer_limit_disconnections"),
        1
    );
    assert_eq!(query::<i64>(&mut admin, &["PUBLISH", "ch", "end"]), 1);
    assert_eq!(
        reader.join().expect("reader"),
        sent,
        "the reading subscriber got everything"
    );
}

/// Reads messages (`message`/`pmessage`, RESP2 arrays or RESP3 pushes) from a subscriber.
fn message(
    parser: &mut redis::Parser,
    reader: &mut BufReader<TcpStream>,
) -> (bool, String, String) {
    let value = parser.parse_value(&mut *reader).expect("a message");
    let items = match value {
        Value::Array(items) => items,
        Value::Push { kind, data } => {
            let mut items = vec![Value::BulkString(kind.to_string().into_bytes())];
            items.extend(data);
            items
        }
        other => panic!("not a message: {other:?}"),
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).expect("utf-8"),
        other => panic!("not a bulk string: {other:?}"),
    };
    match items.len() {
        3 => (false, text(&items[1]), text(&items[2])),
        4 => (true, text(&items[2]), text(&items[3])),
        _ => panic!("not a message: {items:?}"),
    }
}

#[test]
fn many_publishers_and_subscribers_deliver_each_message_once_in_order() {
    const PUBLISHERS: usize = 4;
    const SUBSCRIBERS: usize = 6;
    const MESSAGES: usize = 400;
    let server = TestServer::start();
    let url = server.url(false);
    let channels: Vec<String> = (0..PUBLISHERS).map(|p| format!("ch{p}")).collect();
    // Half the subscribers speak RESP3, half of each also subscribe to a pattern matching
    // every channel: each of those gets every message twice, once per subscription.
    let subscribers: Vec<_> = (0..SUBSCRIBERS)
        .map(|i| {
            let mut s = if i % 2 == 0 {
                server.raw()
            } else {
                resp3(&server)
            };
            let mut request = format!("SUBSCRIBE {}\r\n", channels.join(" "));
            if i % 4 < 2 {
                request.push_str("PSUBSCRIBE ch*\r\n");
            }
            s.write_all(request.as_bytes()).expect("write");
            let mut parser = redis::Parser::new();
            let mut reader = BufReader::new(s.try_clone().expect("clone"));
            let replies = PUBLISHERS + usize::from(i % 4 < 2);
            for _ in 0..replies {
                parser.parse_value(&mut reader).expect("subscribe reply");
            }
            (i % 4 < 2, s, reader, parser)
        })
        .collect();
    let patterns = subscribers.iter().filter(|s| s.0).count();

    // Connections move between the poller and the pool meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let stop = stop.clone();
        let url = url.clone();
        std::thread::spawn(move || {
            let mut c = crate::connect(&url);
            let mut on = true;
            while !stop.load(Relaxed) {
                let mode = if on { "on" } else { "off" };
                let _: () = query(&mut c, &["CONFIG", "SET", "poller", mode]);
                on = !on;
                std::thread::sleep(Duration::from_millis(7));
            }
        })
    };
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|p| {
            let url = url.clone();
            let channel = channels[p].clone();
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                for seq in 0..MESSAGES {
                    let n: i64 = query(&mut c, &["PUBLISH", &channel, &format!("{p}:{seq}")]);
                    assert_eq!(n as usize, SUBSCRIBERS + patterns);
                }
            })
        })
        .collect();
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|(pattern, stream, mut reader, mut parser)| {
            std::thread::spawn(move || {
                let _keep = stream;
                // Per (pattern?, publisher): the next sequence number expected.
                let mut next = vec![[0usize; 2]; PUBLISHERS];
                let total = PUBLISHERS * MESSAGES * if pattern { 2 } else { 1 };
                for _ in 0..total {
                    let (by_pattern, channel, payload) = message(&mut parser, &mut reader);
                    let (p, seq) = payload.split_once(':').expect("p:seq");
                    let (p, seq): (usize, usize) =
                        (p.parse().expect("p"), seq.parse().expect("seq"));
                    assert_eq!(channel, format!("ch{p}"));
                    assert!(pattern || !by_pattern);
                    let slot = &mut next[p][usize::from(by_pattern)];
                    assert_eq!(
                        seq, *slot,
                        "publisher {p}'s messages out of order or repeated"
                    );
                    *slot += 1;
                }
                for counts in &next {
                    assert_eq!(counts[0], MESSAGES);
                    assert_eq!(counts[1], if pattern { MESSAGES } else { 0 });
                }
                // And nothing more.
                assert!(reader.buffer().is_empty());
                let stream = reader.get_mut();
                stream
                    .set_read_timeout(Some(Duration::from_millis(100)))
                    .expect("timeout");
                let mut byte = [0u8; 1];
                assert!(stream.read(&mut byte).is_err(), "a message too many");
            })
        })
        .collect();
    for p in publishers {
        p.join().expect("publisher");
    }
    for r in readers {
        r.join().expect("subscriber");
    }
    stop.store(true, Relaxed);
    mover.join().expect("mover");
    let mut admin = server.client();
    let info: String = query(&mut admin, &["INFO", "keel"]);
    assert!(
        info_counter(&info, "connection_moves") > 0,
        "subscribers moved between lanes while receiving"
    );
}

#[test]
fn a_client_library_subscribes_in_resp2_and_resp3() {
    let server = TestServer::start();
    let mut publisher = server.client();

    let mut con = server.client();
    let mut pubsub = con.as_pubsub();
    pubsub.subscribe("news").expect("subscribe");
    pubsub.psubscribe("n*").expect("psubscribe");
    assert_eq!(query::<i64>(&mut publisher, &["PUBLISH", "news", "hi"]), 2);
    pubsub
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let first = pubsub.get_message().expect("message");
    assert_eq!(first.get_channel_name(), "news");
    assert_eq!(first.get_payload::<String>().expect("payload"), "hi");
    assert!(!first.from_pattern());
    let second = pubsub.get_message().expect("pmessage");
    assert_eq!(second.get_pattern::<String>().expect("pattern"), "n*");
    assert_eq!(second.get_payload::<String>().expect("payload"), "hi");
    pubsub.unsubscribe("news").expect("unsubscribe");
    pubsub.punsubscribe("n*").expect("punsubscribe");
    drop(pubsub);
    assert_eq!(query::<String>(&mut con, &["PING"]), "PONG");

    let mut con = server.client_proto(true);
    let (tx, rx) = std::sync::mpsc::channel();
    con.set_push_sender(tx);
    con.subscribe_resp3("news").expect("subscribe");
    // The client does not wait for the subscription's confirmation (a push in RESP3): a reply
    // to a later command on the connection shows it was made. (On the worker pool the two
    // connections' commands run at once.)
    let _: String = query(&mut con, &["PING"]);
    assert_eq!(
        query::<i64>(&mut publisher, &["PUBLISH", "news", "pushed"]),
        1
    );
    // The push came before the reply to a command sent after it was published.
    let _: () = query(&mut con, &["SET", "k", "v"]);
    let pushes: Vec<redis::PushInfo> = rx.try_iter().collect();
    let message = pushes
        .iter()
        .find(|p| p.kind == redis::PushKind::Message)
        .unwrap_or_else(|| panic!("no message among {pushes:?}"));
    assert_eq!(
        message.data,
        vec![
            Value::BulkString(b"news".to_vec()),
            Value::BulkString(b"pushed".to_vec())
        ]
    );
}
