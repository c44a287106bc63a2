//! The transport on loopback: messages both ways between three nodes, batching (held and
//! released too), bounded queues, a peer restarted with a new incarnation, refused
//! handshakes, and bad frames.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::Receiver;

use super::*;
use crate::txn::{Message, TxnId};

type Msg = Message<Vec<u8>, Vec<u8>>;

/// How long a test waits for an event before it fails.
const WAIT: Duration = Duration::from_secs(10);

async fn listeners(n: usize) -> Vec<TcpListener> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(TcpListener::bind("127.0.0.1:0").await.expect("bind"));
    }
    out
}

fn addrs_of(listeners: &[TcpListener]) -> Vec<SocketAddr> {
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local addr"))
        .collect()
}

/// A message that says who sent it to whom, and its number.
fn msg(from: u16, to: u16, seq: u64, payload: usize) -> Msg {
    Message::Prepare {
        txn: TxnId {
            coordinator: Peer(from),
            incarnation: u64::from(to),
            seq,
        },
        participants: vec![Peer(from), Peer(to)],
        work: vec![7; payload],
    }
}

fn start(
    addrs: &[SocketAddr],
    i: usize,
    incarnation: u64,
    listener: TcpListener,
    config: Config,
) -> (Transport<Msg>, Receiver<Event<Msg>>) {
    let membership = Membership::even(addrs, i, 1000).expect("membership");
    Transport::start(&membership, addrs, incarnation, listener, config).expect("start")
}

/// Binds `addr` again, retrying while a dropped transport's listener is still closing.
async fn rebind(addr: SocketAddr) -> TcpListener {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("cannot bind {addr} again: {e}"),
        }
    }
}

/// The next event that `pick` accepts, skipping others; fails after [`WAIT`].
async fn until<T>(
    rx: &mut Receiver<Event<Msg>>,
    what: &str,
    mut pick: impl FnMut(Event<Msg>) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let event = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no event {what} within {WAIT:?}"))
            .expect("transport alive");
        if let Some(t) = pick(event) {
            return t;
        }
    }
}

async fn up(rx: &mut Receiver<Event<Msg>>, peer: u16) -> u64 {
    until(rx, "peer up", |e| match e {
        Event::PeerUp {
            peer: p,
            incarnation,
        } if p == Peer(peer) => Some(incarnation),
        _ => None,
    })
    .await
}

async fn received(rx: &mut Receiver<Event<Msg>>) -> (Peer, u64, Msg) {
    until(rx, "received", |e| match e {
        Event::Received {
            from,
            incarnation,
            message,
        } => Some((from, incarnation, message)),
        _ => None,
    })
    .await
}

#[tokio::test]
async fn three_nodes_exchange_messages_both_ways() {
    let ls = listeners(3).await;
    let addrs = addrs_of(&ls);
    let mut nodes = Vec::new();
    for (i, l) in ls.into_iter().enumerate() {
        nodes.push(start(&addrs, i, 100 + i as u64, l, Config::default()));
    }
    const EACH: u64 = 200;
    for (i, (t, _)) in nodes.iter().enumerate() {
        for j in 0..3u16 {
            if usize::from(j) == i {
                assert_eq!(
                    t.send(Peer(j), &msg(0, 0, 0, 1)),
                    Err(SendError::NoPeer(Peer(j)))
                );
                continue;
            }
            for seq in 0..EACH {
                t.send(Peer(j), &msg(i as u16, j, seq, 16)).expect("queued");
            }
        }
    }
    assert_eq!(
        nodes[0].0.send(Peer(3), &msg(0, 3, 0, 1)),
        Err(SendError::NoPeer(Peer(3)))
    );
    for (i, (_, rx)) in nodes.iter_mut().enumerate() {
        // Per sender, messages arrive in the order sent.
        let mut next = [0u64; 3];
        for _ in 0..2 * EACH {
            let (from, incarnation, message) = received(rx).await;
            assert_ne!(usize::from(from.0), i);
            assert_eq!(incarnation, 100 + u64::from(from.0));
            let Message::Prepare { txn, work, .. } = message else {
                panic!("not what was sent: {message:?}");
            };
            assert_eq!(txn.coordinator, from);
            assert_eq!(txn.incarnation, i as u64);
            assert_eq!(txn.seq, next[usize::from(from.0)]);
            assert_eq!(work, vec![7; 16]);
            next[usize::from(from.0)] += 1;
        }
        assert_eq!(next.iter().sum::<u64>(), 2 * EACH);
    }
    for (t, _) in &nodes {
        let s = t.stats();
        assert_eq!(s.messages_sent, 2 * EACH);
        assert_eq!(s.messages_received, 2 * EACH);
        assert_eq!(s.dropped, 0);
    }
}

#[tokio::test]
async fn held_messages_wait_for_release_and_leave_in_one_frame_per_peer() {
    let ls = listeners(3).await;
    let addrs = addrs_of(&ls);
    let mut ls = ls.into_iter();
    let (mut a, mut a_rx) = start(&addrs, 0, 1, ls.next().expect("a"), Config::default());
    let (b, mut b_rx) = start(&addrs, 1, 2, ls.next().expect("b"), Config::default());
    let (c, mut c_rx) = start(&addrs, 2, 3, ls.next().expect("c"), Config::default());
    up(&mut a_rx, 1).await;
    up(&mut a_rx, 2).await;
    const N: u64 = 50;
    for seq in 0..N {
        a.hold(Peer(1), &msg(0, 1, seq, 16)).expect("held");
        a.hold(Peer(2), &msg(0, 2, seq, 16)).expect("held");
    }
    // Nothing leaves while held, however long the writers have.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(a.stats().frames_sent, 0);
    assert_eq!(b.stats().frames_received, 0);
    assert_eq!(c.stats().frames_received, 0);
    a.release();
    for (rx, to) in [(&mut b_rx, 1), (&mut c_rx, 2)] {
        for seq in 0..N {
            let (from, _, m) = received(rx).await;
            assert_eq!(from, Peer(0));
            assert_eq!((m.txn().incarnation, m.txn().seq), (to, seq));
        }
    }
    // One frame per peer, the batches counted by their messages.
    assert_eq!(a.stats().frames_sent, 2);
    assert_eq!(a.stats().messages_sent, 2 * N);
    assert_eq!(
        (b.stats().frames_received, b.stats().messages_received),
        (1, N)
    );
    assert_eq!(
        (c.stats().frames_received, c.stats().messages_received),
        (1, N)
    );
    // A release with nothing held sends nothing; a message to a node outside the cluster is
    // refused at once.
    a.release();
    assert!(matches!(
        a.hold(Peer(3), &msg(0, 3, 0, 1)),
        Err(SendError::NoPeer(Peer(3)))
    ));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(a.stats().frames_sent, 2);
}

#[tokio::test]
async fn a_held_batch_that_would_outgrow_a_frame_goes_in_several() {
    let ls = listeners(2).await;
    let addrs = addrs_of(&ls);
    let mut ls = ls.into_iter();
    let small = Config {
        frame_bytes_max: 1024,
        ..Config::default()
    };
    let (mut a, mut a_rx) = start(&addrs, 0, 1, ls.next().expect("a"), small.clone());
    let (b, mut b_rx) = start(&addrs, 1, 2, ls.next().expect("b"), small);
    up(&mut a_rx, 1).await;
    const N: u64 = 100;
    for seq in 0..N {
        a.hold(Peer(1), &msg(0, 1, seq, 32)).expect("held");
    }
    assert!(matches!(
        a.hold(Peer(1), &msg(0, 1, N, 2000)),
        Err(SendError::TooLarge { max: 1024, .. })
    ));
    a.release();
    for seq in 0..N {
        let (_, _, m) = received(&mut b_rx).await;
        assert_eq!(m.txn().seq, seq);
    }
    // The receiver, with the same limit, refuses a longer frame: every one fit.
    let total: usize = (0..N)
        .map(|seq| {
            postcard::to_stdvec(&msg(0, 1, seq, 32))
                .expect("encode")
                .len()
        })
        .sum();
    let frames = a.stats().frames_sent;
    assert!(
        frames >= total.div_ceil(1024) as u64 && frames < N,
        "{frames} frames"
    );
    assert_eq!(b.stats().frames_received, frames);
    assert_eq!(b.stats().messages_received, N);
}

#[tokio::test]
async fn queued_messages_go_out_in_one_frame_and_frames_respect_the_limit() {
    let ls = listeners(2).await;
    let addrs = addrs_of(&ls);
    let mut ls = ls.into_iter();
    let (a, _a_rx) = start(&addrs, 0, 1, ls.next().expect("a"), Config::default());
    // B is not running yet: A's writer cannot connect, so everything sent waits in its queue.
    drop(ls.next());
    const N: u64 = 500;
    for seq in 0..N {
        a.send(Peer(1), &msg(0, 1, seq, 32)).expect("queued");
    }
    let (b, mut b_rx) = start(&addrs, 1, 2, rebind(addrs[1]).await, Config::default());
    for seq in 0..N {
        let (_, _, m) = received(&mut b_rx).await;
        assert_eq!(m.txn().seq, seq);
    }
    // The writer drained the whole queue into one frame, one write.
    assert_eq!(a.stats().frames_sent, 1);
    assert_eq!(a.stats().messages_sent, N);
    assert_eq!(b.stats().frames_received, 1);
    assert_eq!(b.stats().messages_received, N);

    // With a small frame limit the same queue is split, and no frame goes over it (the
    // receiver, with the same limit, would refuse one).
    let ls = listeners(2).await;
    let addrs = addrs_of(&ls);
    let mut ls = ls.into_iter();
    let small = Config {
        frame_bytes_max: 1024,
        ..Config::default()
    };
    let (a, _a_rx) = start(&addrs, 0, 1, ls.next().expect("a"), small.clone());
    drop(ls.next());
    let sizes: Vec<usize> = (0..N)
        .map(|seq| {
            postcard::to_stdvec(&msg(0, 1, seq, 32))
                .expect("encode")
                .len()
        })
        .collect();
    for seq in 0..N {
        a.send(Peer(1), &msg(0, 1, seq, 32)).expect("queued");
    }
    let (b, mut b_rx) = start(&addrs, 1, 2, rebind(addrs[1]).await, small.clone());
    for seq in 0..N {
        let (_, _, m) = received(&mut b_rx).await;
        assert_eq!(m.txn().seq, seq);
    }
    // Every frame but the last is full but for less than one message.
    let total: usize = sizes.iter().sum();
    let one_max = *sizes.iter().max().expect("some");
    let frames = a.stats().frames_sent;
    assert!(frames >= total.div_ceil(1024) as u64, "{frames} frames");
    assert!(
        frames <= (total / (1024 - one_max) + 1) as u64,
        "{frames} frames"
    );
    assert_eq!(b.stats().frames_received, frames);
    assert_eq!(b.stats().messages_received, N);
    // A message over the limit is refused by `send` itself.
    assert!(matches!(
        a.send(Peer(1), &msg(0, 1, 0, 2000)),
        Err(SendError::TooLarge { max: 1024, .. })
    ));
}

#[tokio::test]
async fn a_full_queue_drops_and_counts() {
    let ls = listeners(2).await;
    let addrs = addrs_of(&ls);
    let mut ls = ls.into_iter();
    let config = Config {
        queue_max: 10,
        ..Config::default()
    };
    let (a, _a_rx) = start(&addrs, 0, 1, ls.next().expect("a"), config);
    drop(ls.next());
    for seq in 0..10 {
        a.send(Peer(1), &msg(0, 1, seq, 8)).expect("queued");
    }
    for seq in 10..15 {
        assert_eq!(
            a.send(Peer(1), &msg(0, 1, seq, 8)),
            Err(SendError::Full(Peer(1)))
        );
    }
    assert_eq!(a.stats().dropped, 5);
}

#[tokio::test]
async fn a_restarted_peer_is_seen_down_then_up_with_its_new_incarnation() {
    let ls = listeners(2).await;
    let addrs = addrs_of(&ls);
    let mut ls = ls.into_iter();
    let (a, mut a_rx) = start(&addrs, 0, 10, ls.next().expect("a"), Config::default());
    let (b, mut b_rx) = start(&addrs, 1, 20, ls.next().expect("b"), Config::default());
    assert_eq!(up(&mut a_rx, 1).await, 20);
    assert_eq!(up(&mut b_rx, 0).await, 10);
    a.send(Peer(1), &msg(0, 1, 1, 4)).expect("queued");
    assert_eq!(received(&mut b_rx).await.1, 10);
    b.send(Peer(0), &msg(1, 0, 1, 4)).expect("queued");
    assert_eq!(received(&mut a_rx).await.1, 20);

    // B dies: A notices without sending anything.
    drop(b);
    drop(b_rx);
    until(&mut a_rx, "peer down", |e| match e {
        Event::PeerDown { peer: Peer(1), .. } => Some(()),
        Event::PeerUp { .. } => panic!("up before down"),
        _ => None,
    })
    .await;

    // B comes back as a new incarnation.
    let (b, mut b_rx) = start(&addrs, 1, 21, rebind(addrs[1]).await, Config::default());
    assert_eq!(up(&mut a_rx, 1).await, 21);
    a.send(Peer(1), &msg(0, 1, 2, 4)).expect("queued");
    let (from, incarnation, m) = received(&mut b_rx).await;
    assert_eq!((from, incarnation, m.txn().seq), (Peer(0), 10, 2));
    b.send(Peer(0), &msg(1, 0, 2, 4)).expect("queued");
    let (from, incarnation, m) = received(&mut a_rx).await;
    assert_eq!((from, incarnation, m.txn().seq), (Peer(1), 21, 2));
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test]
async fn a_digest_mismatch_is_refused_naming_both_digests() {
    let ls = listeners(3).await;
    let addrs = addrs_of(&ls);
    let mut ls = ls.into_iter();
    // A thinks the cluster is nodes 0 and 1; B thinks it is nodes 0, 1 and 2.
    let (a, mut a_rx) = start(&addrs[..2], 0, 1, ls.next().expect("a"), Config::default());
    let (b, mut b_rx) = start(&addrs, 1, 2, ls.next().expect("b"), Config::default());
    let da = Membership::even(&addrs[..2], 0, 1000).expect("m").digest();
    let db = Membership::even(&addrs, 1, 1000).expect("m").digest();
    assert_ne!(da, db);
    a.send(Peer(1), &msg(0, 1, 0, 4)).expect("queued");
    b.send(Peer(0), &msg(1, 0, 0, 4)).expect("queued");
    // Each side refuses twice: its own dial, and the other's. Both keep redialing (every 20,
    // 40, 80, 160 ms ...), but each disagreement is reported once.
    let mut events = (Vec::new(), Vec::new());
    let collect = async {
        loop {
            tokio::select! {
                Some(e) = a_rx.recv() => events.0.push(e),
                Some(e) = b_rx.recv() => events.1.push(e),
            }
        }
    };
    assert!(
        tokio::time::timeout(Duration::from_millis(600), collect)
            .await
            .is_err()
    );
    for (events, peer, dialed, ours, theirs) in [
        (&events.0, Peer(1), addrs[1], da, db),
        (&events.1, Peer(0), addrs[0], db, da),
    ] {
        let mut dials = 0;
        let mut incoming = 0;
        for e in events {
            let Event::Refused {
                peer: Some(p),
                addr,
                why,
            } = e
            else {
                panic!("not a refusal: {e:?}");
            };
            assert_eq!(*p, peer);
            assert_eq!(*why, Error::Digest { ours, theirs });
            let text = why.to_string();
            assert!(text.contains(&format!("{ours:016x}")), "{text}");
            assert!(text.contains(&format!("{theirs:016x}")), "{text}");
            if *addr == dialed {
                dials += 1;
            } else {
                incoming += 1;
            }
        }
        assert_eq!((dials, incoming), (1, 1), "{events:?}");
    }
    // Nothing crossed.
    assert_eq!(a.stats().frames_sent + b.stats().frames_sent, 0);
}

/// A raw client that has shaken hands with `addr` as node `from`; B's hello back.
async fn raw(addr: SocketAddr, hello: Hello) -> (TcpStream, Hello) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&hello.encode()).await.expect("hello");
    let mut b = [0u8; HELLO_BYTES];
    s.read_exact(&mut b).await.expect("hello back");
    (s, Hello::decode(&b))
}

/// Whether the other side closes `s` within [`WAIT`].
async fn closes(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(WAIT, s.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn bad_hellos_are_refused_with_both_values() {
    let ls = listeners(2).await;
    let addrs = addrs_of(&ls);
    let digest = Membership::even(&addrs, 0, 1000).expect("m").digest();
    let mut ls = ls.into_iter();
    let (_a, mut a_rx) = start(&addrs, 0, 1, ls.next().expect("a"), Config::default());
    let good = Hello {
        magic: MAGIC,
        version: VERSION,
        digest,
        from: 1,
        to: 0,
        incarnation: 5,
    };
    let cases = [
        (
            Hello {
                version: 99,
                ..good
            },
            Some(Peer(1)),
            Error::Version {
                ours: VERSION,
                theirs: 99,
            },
        ),
        (
            Hello { from: 7, ..good },
            None,
            Error::Identity {
                from: 7,
                to: 0,
                expected_from: u16::MAX,
                expected_to: 0,
            },
        ),
        (
            Hello { from: 0, ..good },
            None,
            Error::Identity {
                from: 0,
                to: 0,
                expected_from: u16::MAX,
                expected_to: 0,
            },
        ),
        (
            Hello {
                magic: *b"GET / HT",
                ..good
            },
            Some(Peer(1)),
            Error::Magic {
                found: *b"GET / HT",
            },
        ),
    ];
    for (hello, peer, why) in cases {
        let (mut s, back) = raw(addrs[0], hello).await;
        // A answered with its own values before closing.
        assert_eq!((back.version, back.digest, back.from), (VERSION, digest, 0));
        assert!(closes(&mut s).await);
        let got = until(&mut a_rx, "refused", |e| match e {
            Event::Refused { peer, why, .. } => Some((peer, why)),
            _ => None,
        })
        .await;
        assert_eq!(got, (peer, why));
    }
    assert!(
        Error::Version {
            ours: 1,
            theirs: 99
        }
        .to_string()
        .contains("version 99 at the peer, 1 here")
    );
}

#[tokio::test]
async fn an_oversized_or_garbage_frame_closes_only_its_connection() {
    let ls = listeners(2).await;
    let addrs = addrs_of(&ls);
    let digest = Membership::even(&addrs, 0, 1000).expect("m").digest();
    let mut ls = ls.into_iter();
    let config = Config {
        frame_bytes_max: 4096,
        ..Config::default()
    };
    let (a, mut a_rx) = start(&addrs, 0, 1, ls.next().expect("a"), config.clone());
    let (_b, mut b_rx) = start(&addrs, 1, 2, ls.next().expect("b"), config);
    up(&mut a_rx, 1).await;
    up(&mut b_rx, 0).await;
    // Raw connections posing as node 0, beside A's real one.
    let hello = Hello {
        magic: MAGIC,
        version: VERSION,
        digest,
        from: 0,
        to: 1,
        incarnation: 99,
    };
    type Check = fn(&Error) -> bool;
    let bad_frames: [(Vec<u8>, Check); 3] = [
        (4097u32.to_be_bytes().to_vec(), |e| {
            *e == Error::FrameTooLarge {
                len: 4097,
                max: 4096,
            }
        }),
        (
            [&3u32.to_be_bytes()[..], &[0xff, 0xff, 0xff]].concat(),
            |e| matches!(e, Error::Decode(_)),
        ),
        (0u32.to_be_bytes().to_vec(), |e| {
            matches!(e, Error::Decode(_))
        }),
    ];
    for (seq, (bytes, expected)) in bad_frames.into_iter().enumerate() {
        let (mut s, _) = raw(addrs[1], hello).await;
        s.write_all(&bytes).await.expect("write");
        assert!(closes(&mut s).await);
        let why = until(&mut b_rx, "broken", |e| match e {
            Event::Broken { peer, why } => {
                assert_eq!(peer, Peer(0));
                Some(why)
            }
            Event::Received { .. } => panic!("a message from a bad frame"),
            _ => None,
        })
        .await;
        assert!(expected(&why), "{why:?}");
        // A's own connection to B carries on.
        a.send(Peer(1), &msg(0, 1, seq as u64, 4)).expect("queued");
        let (from, incarnation, m) = received(&mut b_rx).await;
        assert_eq!((from, incarnation, m.txn().seq), (Peer(0), 1, seq as u64));
    }
    // A valid frame on a raw connection is delivered with that connection's incarnation.
    let (mut s, _) = raw(addrs[1], hello).await;
    let body = postcard::to_stdvec(&msg(0, 1, 42, 4)).expect("encode");
    let len = u32::try_from(body.len()).expect("small");
    s.write_all(&[&len.to_be_bytes()[..], &body].concat())
        .await
        .expect("write");
    let (from, incarnation, m) = received(&mut b_rx).await;
    assert_eq!((from, incarnation, m.txn().seq), (Peer(0), 99, 42));
    assert!(
        tokio::time::timeout(
            Duration::from_millis(100),
            until(&mut a_rx, "down", |e| match e {
                Event::PeerDown { .. } => Some(()),
                _ => None,
            })
        )
        .await
        .is_err(),
        "A's connection went down"
    );
}

#[tokio::test]
async fn incoming_connections_are_bounded() {
    let ls = listeners(2).await;
    let addrs = addrs_of(&ls);
    let digest = Membership::even(&addrs, 0, 1000).expect("m").digest();
    let mut ls = ls.into_iter();
    let config = Config {
        incoming_max: 1,
        ..Config::default()
    };
    let (_a, _a_rx) = start(&addrs, 0, 1, ls.next().expect("a"), config);
    let hello = Hello {
        magic: MAGIC,
        version: VERSION,
        digest,
        from: 1,
        to: 0,
        incarnation: 5,
    };
    let (_first, back) = raw(addrs[0], hello).await;
    assert_eq!(back.from, 0);
    let mut second = TcpStream::connect(addrs[0]).await.expect("connect");
    assert!(closes(&mut second).await);
}
