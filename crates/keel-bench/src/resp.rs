//! Server mode: drives a server that speaks RESP (keel's server or `redis-server`) over TCP,
//! one connection per client thread, transactions pipelined `depth` at a time.
//!
//! Transactions map onto commands a Redis server executes atomically: a multi-key read is
//! one `MGET`, a blind multi-key write one `MSET`, anything mixed a `MULTI ... EXEC` block
//! (no `WATCH`: the writes never depend on the reads, so the block is serializable on a
//! server that runs it atomically). `EXEC` answering null counts as an abort and is retried.
//! Scans (ycsb-e) and MAX / ordered puts (bid) have no portable Redis command and are refused.

use std::io::{BufRead as _, BufReader, BufWriter, Read as _, Write as _};
use std::net::TcpStream;
use std::sync::Mutex;

use anyhow::Context as _;

use crate::target::{Target, Worker, key_bytes};
use crate::workload::{Kind, Stream, Txn, Workload, Writer};

/// The longest bulk string or array a reply may hold; a bigger one means a broken stream.
const REPLY_ITEMS_MAX: i64 = 1 << 27;

/// A RESP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`.
    Error(String),
    /// `:42`.
    Int(i64),
    /// `$3\r\nabc` or null.
    Bulk(Option<Vec<u8>>),
    /// `*2\r\n...` or null.
    Array(Option<Vec<Reply>>),
}

/// One connection.
pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    sent: usize,
}

impl Conn {
    /// Connects to `addr` (`host:port`).
    pub fn connect(addr: &str) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true).context("setting TCP_NODELAY")?;
        let reader =
            BufReader::with_capacity(1 << 16, stream.try_clone().context("cloning socket")?);
        Ok(Conn {
            reader,
            writer: BufWriter::with_capacity(1 << 16, stream),
            sent: 0,
        })
    }

    /// Queues one command; [`Conn::flush`] sends it.
    pub fn send(&mut self, args: &[&[u8]]) -> anyhow::Result<()> {
        let w = &mut self.writer;
        write!(w, "*{}\r\n", args.len())?;
        for a in args {
            write!(w, "${}\r\n", a.len())?;
            w.write_all(a)?;
            w.write_all(b"\r\n")?;
        }
        self.sent += 1;
        Ok(())
    }

    /// Sends everything queued.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        self.writer.flush().context("sending commands")
    }

    /// Reads the next reply.
    pub fn recv(&mut self) -> anyhow::Result<Reply> {
        self.sent = self.sent.saturating_sub(1);
        read_reply(&mut self.reader, 0)
    }

    /// Sends one command and reads its reply; a server error becomes an `Err`.
    pub fn call(&mut self, args: &[&[u8]]) -> anyhow::Result<Reply> {
        self.send(args)?;
        self.flush()?;
        match self.recv()? {
            Reply::Error(e) => anyhow::bail!("server error: {e}"),
            r => Ok(r),
        }
    }
}

fn read_line(r: &mut BufReader<TcpStream>) -> anyhow::Result<String> {
    let mut line = String::new();
    let n = r.read_line(&mut line).context("reading a reply")?;
    anyhow::ensure!(n > 0, "the server closed the connection");
    anyhow::ensure!(line.ends_with("\r\n"), "reply line without CRLF: {line:?}");
    line.truncate(line.len() - 2);
    Ok(line)
}

fn read_reply(r: &mut BufReader<TcpStream>, depth: u32) -> anyhow::Result<Reply> {
    anyhow::ensure!(depth < 4, "reply nested too deeply");
    let line = read_line(r)?;
    let (kind, rest) = line.split_at_checked(1).context("empty reply line")?;
    let number = || -> anyhow::Result<i64> {
        let n: i64 = rest
            .parse()
            .with_context(|| format!("bad length in {line:?}"))?;
        anyhow::ensure!(n <= REPLY_ITEMS_MAX, "reply length {n} too large");
        Ok(n)
    };
    Ok(match kind {
        "+" => Reply::Simple(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(
            rest.parse()
                .with_context(|| format!("bad integer {line:?}"))?,
        ),
        "$" => match number()? {
            n if n < 0 => Reply::Bulk(None),
            n => {
                let mut buf = vec![0; n as usize + 2];
                r.read_exact(&mut buf).context("reading a bulk string")?;
                buf.truncate(n as usize);
                Reply::Bulk(Some(buf))
            }
        },
        "*" => match number()? {
            n if n < 0 => Reply::Array(None),
            n => Reply::Array(Some(
                (0..n)
                    .map(|_| read_reply(r, depth + 1))
                    .collect::<anyhow::Result<_>>()?,
            )),
        },
        _ => anyhow::bail!("unknown reply type in {line:?}"),
    })
}

/// A RESP server as a benchmark target.
pub struct Server {
    label: String,
    /// Where the connections go, in turn (the nodes of a cluster, or one server).
    addrs: Vec<String>,
    depth: usize,
    control: Mutex<Conn>,
}

impl Server {
    /// Connects to `addr`; `label` names it in reports, `depth` is the pipelining depth.
    /// `addr` may name several servers joined by `+` (a cluster's nodes): worker `i` connects
    /// to the `i`th of them, in turn, and loading goes through the first. Refuses workloads
    /// whose operations have no RESP mapping.
    pub fn connect(
        label: &str,
        addr: &str,
        depth: usize,
        workload: Workload,
    ) -> anyhow::Result<Server> {
        anyhow::ensure!(
            !matches!(workload, Workload::YcsbE | Workload::Bid),
            "{workload} is not supported over RESP: it needs scans or MAX, which Redis lacks"
        );
        let addrs: Vec<String> = addr.split('+').map(str::to_owned).collect();
        let mut control = None;
        for addr in &addrs {
            anyhow::ensure!(!addr.is_empty(), "an empty address in {addr:?}");
            let mut conn = Conn::connect(addr)?;
            match conn.call(&[b"PING"])? {
                Reply::Simple(s) if s == "PONG" => {}
                other => anyhow::bail!("{addr} answered PING with {other:?}"),
            }
            control.get_or_insert(conn);
        }
        let control = control.expect("split yields at least one address");
        Ok(Server {
            label: label.to_owned(),
            addrs,
            depth: depth.max(1),
            control: Mutex::new(control),
        })
    }
}

impl Target for Server {
    fn name(&self) -> String {
        self.label.clone()
    }
    fn isolation(&self) -> &'static str {
        "the server's: one MGET, MSET or MULTI/EXEC per txn (Redis runs them serially)"
    }
    fn durability(&self) -> &'static str {
        "server's own setting"
    }
    fn load(
        &self,
        records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
        progress: &mut dyn FnMut(u64),
    ) -> anyhow::Result<()> {
        let mut conn = self
            .control
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        let mut done = 0u64;
        // A server that refuses MSET across slots (Redis Cluster, a replicated keel cluster)
        // is loaded with SETs instead, pipelined as deep.
        let mut per_key = false;
        loop {
            // MSETs of 256 records (or 256 SETs), 16 batches in flight.
            let mut sent = Vec::new();
            for _ in 0..16 {
                let chunk: Vec<(u64, Vec<u8>)> = (&mut *records).take(256).collect();
                if chunk.is_empty() {
                    break;
                }
                let keys: Vec<[u8; 8]> = chunk.iter().map(|(k, _)| key_bytes(*k)).collect();
                if per_key {
                    for ((_, v), k) in chunk.iter().zip(&keys) {
                        conn.send(&[b"SET", k, v])?;
                    }
                } else {
                    let mut args: Vec<&[u8]> = vec![b"MSET"];
                    for ((_, v), k) in chunk.iter().zip(&keys) {
                        args.push(k);
                        args.push(v);
                    }
                    conn.send(&args)?;
                }
                sent.push(chunk);
            }
            if sent.is_empty() {
                return Ok(());
            }
            conn.flush()?;
            let replies = if per_key {
                sent.iter().map(Vec::len).sum()
            } else {
                sent.len()
            };
            let mut crossslot = false;
            for _ in 0..replies {
                match conn.recv()? {
                    Reply::Error(e) if !per_key && e.starts_with("CROSSSLOT") => crossslot = true,
                    Reply::Error(e) => anyhow::bail!("loading: server error {e}"),
                    _ => {}
                }
            }
            if crossslot {
                // Nothing of a refused MSET was written: send every batch again, key by key.
                per_key = true;
                for chunk in &sent {
                    for (k, v) in chunk {
                        conn.send(&[b"SET", &key_bytes(*k), v])?;
                    }
                }
                conn.flush()?;
                for _ in 0..sent.iter().map(Vec::len).sum::<usize>() {
                    if let Reply::Error(e) = conn.recv()? {
                        anyhow::bail!("loading: server error {e}");
                    }
                }
            }
            done += sent.iter().map(|c| c.len() as u64).sum::<u64>();
            progress(done);
        }
    }
    fn worker(&self, thread: u32) -> anyhow::Result<Box<dyn Worker + '_>> {
        Ok(Box::new(Client {
            conn: Conn::connect(&self.addrs[thread as usize % self.addrs.len()])?,
            depth: self.depth,
            writer: Writer::new(thread),
        }))
    }
    fn get(&self, key: u64) -> anyhow::Result<Option<Vec<u8>>> {
        let mut conn = self
            .control
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        match conn.call(&[b"GET", &key_bytes(key)])? {
            Reply::Bulk(v) => Ok(v),
            other => anyhow::bail!("GET answered {other:?}"),
        }
    }
}

struct Client {
    conn: Conn,
    depth: usize,
    writer: Writer,
}

/// How many replies a transaction's commands produce, and whether the last is an `EXEC`.
struct Sent {
    replies: usize,
    exec: bool,
}

impl Client {
    fn next_value(&mut self) -> Vec<u8> {
        self.writer.next_value().to_vec()
    }

    fn send_txn(&mut self, stream: &Stream, txn: &Txn) -> anyhow::Result<Sent> {
        let keys: Vec<[u8; 8]> = stream.keys(txn).iter().map(|k| key_bytes(*k)).collect();
        let c = &mut self.conn;
        let one = |c: &mut Conn, args: &[&[u8]]| -> anyhow::Result<Sent> {
            c.send(args)?;
            Ok(Sent {
                replies: 1,
                exec: false,
            })
        };
        match txn.kind {
            Kind::Read => {
                let mut args: Vec<&[u8]> = vec![if keys.len() == 1 { b"GET" } else { b"MGET" }];
                args.extend(keys.iter().map(|k| &k[..]));
                one(c, &args)
            }
            Kind::ReadWrite if txn.arg == 0 => {
                let values: Vec<Vec<u8>> = keys.iter().map(|_| self.next_value()).collect();
                let mut args: Vec<&[u8]> = vec![if keys.len() == 1 { b"SET" } else { b"MSET" }];
                for (k, v) in keys.iter().zip(&values) {
                    args.push(k);
                    args.push(v);
                }
                one(&mut self.conn, &args)
            }
            Kind::Incr if keys.len() == 1 => one(c, &[b"INCRBY", &keys[0], b"1"]),
            _ => {
                let mut cmds: Vec<Vec<Vec<u8>>> = Vec::new();
                match txn.kind {
                    Kind::ReadWrite => {
                        let (reads, writes) = keys.split_at(txn.arg as usize);
                        for k in reads {
                            cmds.push(vec![b"GET".to_vec(), k.to_vec()]);
                        }
                        for k in writes {
                            cmds.push(vec![b"SET".to_vec(), k.to_vec(), self.next_value()]);
                        }
                    }
                    Kind::ReadModifyWrite => {
                        for k in &keys {
                            cmds.push(vec![b"GET".to_vec(), k.to_vec()]);
                            cmds.push(vec![b"SET".to_vec(), k.to_vec(), self.next_value()]);
                        }
                    }
                    Kind::Incr => {
                        for k in &keys {
                            cmds.push(vec![b"INCRBY".to_vec(), k.to_vec(), b"1".to_vec()]);
                        }
                    }
                    Kind::LikeWrite => {
                        cmds.push(vec![b"INCRBY".to_vec(), keys[0].to_vec(), b"1".to_vec()]);
                        cmds.push(vec![b"SET".to_vec(), keys[1].to_vec(), keys[0].to_vec()]);
                    }
                    Kind::Read | Kind::Scan | Kind::Bid => {
                        anyhow::bail!("{:?} transactions have no RESP mapping", txn.kind)
                    }
                }
                let c = &mut self.conn;
                c.send(&[b"MULTI"])?;
                for cmd in &cmds {
                    let args: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
                    c.send(&args)?;
                }
                c.send(&[b"EXEC"])?;
                Ok(Sent {
                    replies: cmds.len() + 2,
                    exec: true,
                })
            }
        }
    }
}

impl Worker for Client {
    fn depth(&self) -> usize {
        self.depth
    }
    fn attempt(&mut self, stream: &Stream, batch: &[Txn], done: &mut [bool]) -> anyhow::Result<()> {
        let mut sent = Vec::with_capacity(batch.len());
        for (txn, done) in batch.iter().zip(done.iter()) {
            if !*done {
                sent.push(self.send_txn(stream, txn)?);
            } else {
                sent.push(Sent {
                    replies: 0,
                    exec: false,
                });
            }
        }
        self.conn.flush()?;
        for (s, done) in sent.iter().zip(done.iter_mut()) {
            if s.replies == 0 {
                continue;
            }
            let mut last = Reply::Simple(String::new());
            for _ in 0..s.replies {
                last = self.conn.recv()?;
                if let Reply::Error(e) = &last {
                    anyhow::bail!("server error: {e}");
                }
            }
            // EXEC answers null when the server aborted the block (WATCH, or a conflict
            // keel's server could not retry): count it as an abort and retry.
            *done = !(s.exec && last == Reply::Array(None));
        }
        Ok(())
    }
}
