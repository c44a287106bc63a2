//! Server mode: drives a server that speaks RESP (keel's server or `redis-server`) over TCP,
//! one connection per client thread (or, routed by slot, one to each node of a cluster),
//! transactions pipelined `depth` at a time.
//!
//! Transactions map onto commands a Redis server executes atomically: a multi-key read is
//! one `MGET`, a blind multi-key write one `MSET`, anything mixed a `MULTI ... EXEC` block
//! (no `WATCH`: the writes never depend on the reads, so the block is serializable on a
//! server that runs it atomically). `EXEC` answering null, or a cluster's `TRYAGAIN`, counts
//! as an abort and is retried.
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

/// Which node of a cluster a connection's transactions go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Route {
    /// Worker `i` connects to the `i`th address, in turn, and sends it everything; the
    /// cluster forwards what another node owns.
    #[default]
    Turn,
    /// As a cluster client does: every worker connects to every node named by `CLUSTER
    /// SLOTS` and sends each transaction to the node that owns the slot of its first key.
    Slot,
}

impl std::str::FromStr for Route {
    type Err = String;
    fn from_str(s: &str) -> Result<Route, String> {
        match s {
            "turn" => Ok(Route::Turn),
            "slot" => Ok(Route::Slot),
            _ => Err(format!("unknown route {s:?}: turn or slot")),
        }
    }
}

/// A RESP server as a benchmark target.
pub struct Server {
    label: String,
    /// The servers (a cluster's nodes, or one server).
    addrs: Vec<String>,
    /// With [`Route::Slot`]: the index in `addrs` of each slot's node.
    slots: Option<Vec<u16>>,
    depth: usize,
    /// One connection to each of `addrs`, for loading and checks.
    control: Mutex<Vec<Conn>>,
    /// With hash tags ([`Server::connect`]): the number of records.
    tagged: Option<u64>,
}

/// Groups of records with `--hash-tags`: record `r` is stored behind the tag `{r % TAG_GROUPS}`.
pub const TAG_GROUPS: u64 = 1024;

/// A key as the server stores it: the record's 8 bytes ([`key_bytes`]), behind its group's
/// hash tag (`{` four hex digits `}`) with `--hash-tags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    buf: [u8; 14],
    len: u8,
}

impl std::ops::Deref for Key {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl Key {
    fn new(record: u64, tagged: bool) -> Key {
        let mut buf = [0u8; 14];
        if !tagged {
            buf[..8].copy_from_slice(&key_bytes(record));
            return Key { buf, len: 8 };
        }
        // `{`, the group in four hex digits, `}`: no formatting on the client's hot path.
        let group = record % TAG_GROUPS;
        buf[0] = b'{';
        for (i, b) in buf[1..5].iter_mut().enumerate() {
            *b = b"0123456789abcdef"[((group >> (12 - 4 * i)) & 0xf) as usize];
        }
        buf[5] = b'}';
        buf[6..].copy_from_slice(&key_bytes(record));
        Key { buf, len: 14 }
    }
}

/// With hash tags, record `r` of a transaction whose first record is `first`, moved into
/// the first's group (the record at the same place in `r`'s stride; one stride back past the
/// last of the `n` records), so that every key of the transaction has the first's tag: one
/// slot, one partition.
fn grouped(r: u64, first: u64, n: u64) -> u64 {
    let moved = r - r % TAG_GROUPS + first % TAG_GROUPS;
    if moved < n { moved } else { moved - TAG_GROUPS }
}

impl Server {
    /// Connects to `addr`; `label` names it in reports, `depth` is the pipelining depth.
    /// `addr` may name several servers joined by `+` (a cluster's nodes): with
    /// [`Route::Turn`] worker `i` connects to the `i`th of them, in turn, and loading goes
    /// through the first; with [`Route::Slot`] the slot map comes from the first's `CLUSTER
    /// SLOTS` (nodes it names that `addr` does not are added) and every command goes to its
    /// key's node. Refuses workloads whose operations have no RESP mapping.
    pub fn connect(
        label: &str,
        addr: &str,
        depth: usize,
        workload: Workload,
        route: Route,
        hash_tags: Option<u64>,
    ) -> anyhow::Result<Server> {
        if let Some(n) = hash_tags {
            anyhow::ensure!(
                n >= TAG_GROUPS,
                "--hash-tags needs at least {TAG_GROUPS} records, not {n}"
            );
        }
        anyhow::ensure!(
            !matches!(workload, Workload::YcsbE | Workload::Bid),
            "{workload} is not supported over RESP: it needs scans or MAX, which Redis lacks"
        );
        let mut addrs: Vec<String> = addr.split('+').map(str::to_owned).collect();
        let mut control = Vec::new();
        for addr in &addrs {
            anyhow::ensure!(!addr.is_empty(), "an empty address in {addr:?}");
            control.push(ping(addr)?);
        }
        let slots = match route {
            Route::Turn => None,
            Route::Slot => {
                let (slots, more) = slot_map(&mut control[0], &addrs)?;
                for addr in more {
                    control.push(ping(&addr)?);
                    addrs.push(addr);
                }
                Some(slots)
            }
        };
        Ok(Server {
            label: label.to_owned(),
            addrs,
            slots,
            depth: depth.max(1),
            control: Mutex::new(control),
            tagged: hash_tags,
        })
    }

    fn key(&self, record: u64) -> Key {
        Key::new(record, self.tagged.is_some())
    }

    /// The keys of a transaction on `records`: with hash tags, all in the first's group.
    fn txn_keys(&self, records: &[u64]) -> Vec<Key> {
        let first = records.first().copied().unwrap_or(0);
        records
            .iter()
            .map(|&r| match self.tagged {
                Some(n) => self.key(grouped(r, first, n)),
                None => self.key(r),
            })
            .collect()
    }

    /// The index in `addrs` of the connection `key` goes to when not routed by worker.
    fn node_of(&self, key: &[u8]) -> usize {
        self.slots.as_ref().map_or(0, |slots| {
            usize::from(slots[usize::from(keel_cluster::key_slot(key).0)])
        })
    }
}

/// Connects to `addr` and checks that it answers `PING`.
fn ping(addr: &str) -> anyhow::Result<Conn> {
    let mut conn = Conn::connect(addr)?;
    match conn.call(&[b"PING"])? {
        Reply::Simple(s) if s == "PONG" => Ok(conn),
        other => anyhow::bail!("{addr} answered PING with {other:?}"),
    }
}

/// Asks `conn` for `CLUSTER SLOTS`: the index of each slot's primary in `addrs` extended
/// by the primaries `addrs` lacks (returned second, in order). A lone server without
/// cluster support serves every slot.
fn slot_map(conn: &mut Conn, addrs: &[String]) -> anyhow::Result<(Vec<u16>, Vec<String>)> {
    conn.send(&[b"CLUSTER", b"SLOTS"])?;
    conn.flush()?;
    let reply = conn.recv()?;
    if let Reply::Error(e) = &reply {
        anyhow::ensure!(
            addrs.len() == 1,
            "--route slot: {} answered CLUSTER SLOTS with {e}",
            addrs[0]
        );
        return Ok((vec![0; usize::from(keel_cluster::SLOTS)], Vec::new()));
    }
    let Reply::Array(Some(ranges)) = reply else {
        anyhow::bail!("CLUSTER SLOTS answered {reply:?}");
    };
    const UNSET: u16 = u16::MAX;
    let mut slots = vec![UNSET; usize::from(keel_cluster::SLOTS)];
    let mut more = Vec::new();
    for range in &ranges {
        let bad = || anyhow::anyhow!("CLUSTER SLOTS: a malformed range {range:?}");
        let Reply::Array(Some(items)) = range else {
            return Err(bad());
        };
        let (Some(Reply::Int(first)), Some(Reply::Int(last)), Some(Reply::Array(Some(node)))) =
            (items.first(), items.get(1), items.get(2))
        else {
            return Err(bad());
        };
        let (Some(Reply::Bulk(Some(host))), Some(Reply::Int(port))) = (node.first(), node.get(1))
        else {
            return Err(bad());
        };
        let node = format!("{}:{port}", String::from_utf8_lossy(host));
        let index = match addrs.iter().chain(&more).position(|a| *a == node) {
            Some(i) => i,
            None => {
                more.push(node);
                addrs.len() + more.len() - 1
            }
        };
        anyhow::ensure!(
            0 <= *first && first <= last && *last < i64::from(keel_cluster::SLOTS),
            "CLUSTER SLOTS: a range {first}-{last} outside 0-16383"
        );
        for slot in &mut slots[*first as usize..=*last as usize] {
            *slot = u16::try_from(index).context("more than 65535 nodes")?;
        }
    }
    if let Some(slot) = slots.iter().position(|&i| i == UNSET) {
        anyhow::bail!("CLUSTER SLOTS names no node for slot {slot}");
    }
    Ok((slots, more))
}

/// Records to load, in key order.
type Records = Vec<(u64, Vec<u8>)>;

/// Queues `records` on `conn` as one `MSET`, or one `SET` each.
fn send_records(
    conn: &mut Conn,
    records: &[(u64, Vec<u8>)],
    per_key: bool,
    tagged: bool,
) -> anyhow::Result<()> {
    let keys: Vec<Key> = records.iter().map(|(k, _)| Key::new(*k, tagged)).collect();
    if per_key {
        for ((_, v), k) in records.iter().zip(&keys) {
            conn.send(&[b"SET", k, v])?;
        }
        return Ok(());
    }
    let mut args: Vec<&[u8]> = vec![b"MSET"];
    for ((_, v), k) in records.iter().zip(&keys) {
        args.push(k);
        args.push(v);
    }
    conn.send(&args)
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
        let mut conns = self
            .control
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        let mut done = 0u64;
        // A server that refuses MSET across slots (Redis Cluster, a replicated keel cluster)
        // is loaded with SETs instead, pipelined as deep.
        let mut per_key = false;
        loop {
            // MSETs of 256 records (or 256 SETs), 16 batches in flight, each batch split by
            // the node its keys go to.
            // Per connection, the batches sent to it.
            let mut sent: Vec<Vec<Records>> = vec![Vec::new(); conns.len()];
            let mut count = 0u64;
            for _ in 0..16 {
                let chunk: Records = (&mut *records).take(256).collect();
                if chunk.is_empty() {
                    break;
                }
                count += chunk.len() as u64;
                let mut parts = vec![Vec::new(); conns.len()];
                for (k, v) in chunk {
                    parts[self.node_of(&self.key(k))].push((k, v));
                }
                for (i, part) in parts.into_iter().enumerate() {
                    if !part.is_empty() {
                        send_records(&mut conns[i], &part, per_key, self.tagged.is_some())?;
                        sent[i].push(part);
                    }
                }
            }
            if count == 0 {
                return Ok(());
            }
            for conn in conns.iter_mut() {
                conn.flush()?;
            }
            let mut crossslot = false;
            for (conn, batches) in conns.iter_mut().zip(&sent) {
                let replies = if per_key {
                    batches.iter().map(Vec::len).sum()
                } else {
                    batches.len()
                };
                for _ in 0..replies {
                    match conn.recv()? {
                        Reply::Error(e) if !per_key && e.starts_with("CROSSSLOT") => {
                            crossslot = true
                        }
                        Reply::Error(e) => anyhow::bail!("loading: server error {e}"),
                        _ => {}
                    }
                }
            }
            if crossslot {
                // A refused MSET wrote nothing, and one that was not refused wrote its
                // records: sending every batch again, key by key, writes the same values.
                per_key = true;
                for (conn, batches) in conns.iter_mut().zip(&sent) {
                    for batch in batches {
                        send_records(conn, batch, true, self.tagged.is_some())?;
                    }
                    conn.flush()?;
                    for _ in 0..batches.iter().map(Vec::len).sum::<usize>() {
                        if let Reply::Error(e) = conn.recv()? {
                            anyhow::bail!("loading: server error {e}");
                        }
                    }
                }
            }
            done += count;
            progress(done);
        }
    }
    fn worker(&self, thread: u32) -> anyhow::Result<Box<dyn Worker + '_>> {
        let conns = match self.slots {
            None => vec![Conn::connect(
                &self.addrs[thread as usize % self.addrs.len()],
            )?],
            Some(_) => self
                .addrs
                .iter()
                .map(|a| Conn::connect(a))
                .collect::<anyhow::Result<_>>()?,
        };
        Ok(Box::new(Client {
            conns,
            server: self,
            depth: self.depth,
            writer: Writer::new(thread),
        }))
    }
    fn get(&self, key: u64) -> anyhow::Result<Option<Vec<u8>>> {
        let mut conns = self
            .control
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        let key = self.key(key);
        match conns[self.node_of(&key)].call(&[b"GET", &key])? {
            Reply::Bulk(v) => Ok(v),
            other => anyhow::bail!("GET answered {other:?}"),
        }
    }
}

struct Client<'a> {
    /// One connection (routed in turn), or one to each of the server's nodes.
    conns: Vec<Conn>,
    server: &'a Server,
    depth: usize,
    writer: Writer,
}

/// Which connection a transaction went to, how many replies its commands produce, and
/// whether the last is an `EXEC`.
struct Sent {
    conn: usize,
    replies: usize,
    exec: bool,
}

impl Client<'_> {
    fn next_value(&mut self) -> Vec<u8> {
        self.writer.next_value().to_vec()
    }

    fn send_txn(&mut self, stream: &Stream, txn: &Txn) -> anyhow::Result<Sent> {
        let keys = self.server.txn_keys(stream.keys(txn));
        // A transaction goes to its first key's node: a coordinator, if it spans nodes.
        let conn = match self.conns.len() {
            1 => 0,
            _ => keys.first().map_or(0, |k| self.server.node_of(k)),
        };
        let one = |c: &mut Conn, args: &[&[u8]]| -> anyhow::Result<Sent> {
            c.send(args)?;
            Ok(Sent {
                conn,
                replies: 1,
                exec: false,
            })
        };
        let c = &mut self.conns[conn];
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
                one(&mut self.conns[conn], &args)
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
                let c = &mut self.conns[conn];
                c.send(&[b"MULTI"])?;
                for cmd in &cmds {
                    let args: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
                    c.send(&args)?;
                }
                c.send(&[b"EXEC"])?;
                Ok(Sent {
                    conn,
                    replies: cmds.len() + 2,
                    exec: true,
                })
            }
        }
    }
}

impl Worker for Client<'_> {
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
                    conn: 0,
                    replies: 0,
                    exec: false,
                });
            }
        }
        for conn in &mut self.conns {
            conn.flush()?;
        }
        for (s, done) in sent.iter().zip(done.iter_mut()) {
            if s.replies == 0 {
                continue;
            }
            let mut aborted = false;
            for i in 0..s.replies {
                let last = i + 1 == s.replies;
                match self.conns[s.conn].recv()? {
                    // EXEC answers null when the server aborted the block (WATCH, or a
                    // conflict keel's server could not retry); a cluster answers TRYAGAIN
                    // when a transaction should be sent again: an abort, retried.
                    Reply::Array(None) if last && s.exec => aborted = true,
                    Reply::Error(e) if last && e.starts_with("TRYAGAIN") => aborted = true,
                    Reply::Error(e) => anyhow::bail!("server error: {e}"),
                    _ => {}
                }
            }
            *done = !aborted;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With hash tags every key of a transaction lands in the first key's slot, each record
    /// stays a loaded one (below `n`) in its own stride, and without them nothing moves.
    #[test]
    fn hash_tags_put_a_transaction_in_one_slot() {
        let n = 10 * TAG_GROUPS + 5;
        let txns: [&[u64]; 3] = [&[7, 3000, 10_000, 9], &[n - 1, 1, 2048], &[1030, n - 2]];
        for records in txns {
            let moved: Vec<u64> = records.iter().map(|&r| grouped(r, records[0], n)).collect();
            let slot = keel_cluster::key_slot(&Key::new(moved[0], true)).0;
            for (&r, &m) in records.iter().zip(&moved) {
                assert!(m < n, "{m} is a record");
                assert_eq!(m % TAG_GROUPS, records[0] % TAG_GROUPS);
                assert!(m.abs_diff(r) < 2 * TAG_GROUPS, "{r} moved to {m}");
                assert_eq!(keel_cluster::key_slot(&Key::new(m, true)).0, slot);
            }
        }
        assert_eq!(&*Key::new(5, false), &key_bytes(5)[..]);
        assert_eq!(&Key::new(1025, true)[..6], b"{0001}");
        assert_eq!(&Key::new(1023, true)[..6], b"{03ff}");
    }
}
