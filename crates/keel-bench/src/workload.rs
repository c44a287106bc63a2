//! The shared workloads (DESIGN.md, "Workloads every benchmark shares"), turned into
//! per-thread streams of transactions drawn before any timing starts.
//!
//! A stream is a flat list of [`Txn`]s whose keys live in one `Vec<u64>`; a thread runs its
//! stream from the start and wraps around if the run outlasts it. Keys are `u64`s, stored as
//! 8-byte big-endian byte strings by every target, so key order is numeric order. Values
//! written are [`VALUE_BYTES`] long and stamped with the writer's thread and sequence number,
//! so a test can tell written values from loaded ones. This module knows nothing about targets:
//! [`execute`] plays a transaction against any [`Tx`](crate::target::Tx).

use std::fmt;
use std::str::FromStr;

use anyhow::Context as _;
use rand::{Rng, SeedableRng as _};
use rand_chacha::ChaCha8Rng;

use crate::keys::KeyChooser;
use crate::target::{Step, Tx};

/// Length of every value the workloads load and write (DESIGN.md: 100-byte values).
pub const VALUE_BYTES: usize = 100;

/// YCSB-E scans read 1 to this many records.
pub const SCAN_LEN_MAX: u32 = 100;

/// Keys per ECC multi-get / multi-put transaction.
pub const MGP_KEYS: usize = 500;

/// Keys one stream holds at most (64 MiB); a stream of big transactions (mgp) stops
/// short of `stream_txns` rather than filling memory.
pub const STREAM_KEYS_MAX: usize = 1 << 23;

/// A workload by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Deuteronomy: 4 ops; 50% read-only (4 reads), 50% 2 reads + 2 updates; Zipfian.
    Deut,
    /// Deuteronomy's 100%-writes variant: 4 updates per transaction.
    DeutWrite,
    /// YCSB A: 50% reads, 50% updates.
    YcsbA,
    /// YCSB B: 95% reads, 5% updates.
    YcsbB,
    /// YCSB C: 100% reads.
    YcsbC,
    /// YCSB D: 95% reads of recently inserted keys, 5% inserts.
    YcsbD,
    /// YCSB E: 95% short scans (1..=100 records), 5% inserts.
    YcsbE,
    /// YCSB F: 50% reads, 50% read-modify-writes.
    YcsbF,
    /// Doppel INCR1: every transaction increments one hot key (with probability `hot`).
    Incr1,
    /// Doppel LIKE: like a page (INCR count, PUT user's last like) or read both; 50/50.
    Like,
    /// Doppel/RUBiS StoreBid: INCR bid count, MAX max bid, ordered PUT max bidder, PUT bid.
    Bid,
    /// ECC multi-get / multi-put: read-only or write-only transactions of 500 uniform keys.
    Mgp,
}

impl Workload {
    /// Every workload, in the order `--help` lists them.
    pub const ALL: [Workload; 12] = [
        Workload::Deut,
        Workload::DeutWrite,
        Workload::YcsbA,
        Workload::YcsbB,
        Workload::YcsbC,
        Workload::YcsbD,
        Workload::YcsbE,
        Workload::YcsbF,
        Workload::Incr1,
        Workload::Like,
        Workload::Bid,
        Workload::Mgp,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Deut => "deut",
            Workload::DeutWrite => "deut-write",
            Workload::YcsbA => "ycsb-a",
            Workload::YcsbB => "ycsb-b",
            Workload::YcsbC => "ycsb-c",
            Workload::YcsbD => "ycsb-d",
            Workload::YcsbE => "ycsb-e",
            Workload::YcsbF => "ycsb-f",
            Workload::Incr1 => "incr1",
            Workload::Like => "like",
            Workload::Bid => "bid",
            Workload::Mgp => "mgp",
        }
    }

    /// Records loaded when `--records` is not given.
    pub fn default_records(self) -> u64 {
        match self {
            Workload::Like | Workload::Bid | Workload::Incr1 | Workload::Mgp => 1_000_000,
            _ => 10_000_000,
        }
    }

    /// The default read ratio: the share of read-only transactions (deut, like, ycsb-*) or,
    /// for ycsb-f, of plain reads against read-modify-writes.
    pub fn default_read_ratio(self) -> f64 {
        match self {
            Workload::Deut | Workload::YcsbA | Workload::YcsbF | Workload::Like => 0.5,
            Workload::YcsbB | Workload::YcsbD | Workload::YcsbE => 0.95,
            Workload::YcsbC => 1.0,
            Workload::DeutWrite | Workload::Incr1 | Workload::Bid | Workload::Mgp => 0.0,
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Workload> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .with_context(|| {
                let names: Vec<_> = Workload::ALL.iter().map(|w| w.name()).collect();
                format!(
                    "unknown workload {s:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// Everything that shapes a workload's streams.
#[derive(Debug, Clone)]
pub struct Params {
    /// The workload.
    pub workload: Workload,
    /// Records loaded before the run (pages and users each for `like`, auctions for `bid`).
    pub records: u64,
    /// Zipfian exponent θ (0 = uniform).
    pub theta: f64,
    /// Share of read transactions; see [`Workload::default_read_ratio`].
    pub read_ratio: f64,
    /// `incr1`: probability that a transaction increments the hot key rather than a uniform one.
    pub hot: f64,
    /// Client threads; one stream each.
    pub threads: usize,
    /// Transactions per stream (fewer if they would hold more than [`STREAM_KEYS_MAX`] keys).
    pub stream_txns: usize,
    /// Seed of every random choice.
    pub seed: u64,
}

impl Params {
    /// Parameters with the workload's defaults.
    pub fn new(workload: Workload) -> Params {
        Params {
            workload,
            records: workload.default_records(),
            theta: 0.8,
            read_ratio: workload.default_read_ratio(),
            hot: 1.0,
            threads: 1,
            stream_txns: 1 << 20,
            seed: 1,
        }
    }
}

/// What a transaction does with its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Reads every key; read-only.
    Read,
    /// Reads the first `arg` keys, then writes a fresh value to each remaining key.
    ReadWrite,
    /// Reads each key and writes it back changed (YCSB-F).
    ReadModifyWrite,
    /// Reads `arg` consecutive records starting at the key; read-only.
    Scan,
    /// Adds 1 to each key.
    Incr,
    /// `like` write: keys are `[page, user]`; INCR the page, PUT the page id under the user.
    LikeWrite,
    /// `bid`: keys are `[count, max, max_bidder, new_bid, bidder id]`, `arg` the amount.
    Bid,
}

impl Kind {
    /// Whether the transaction writes nothing (it may run on a read-only snapshot).
    pub fn read_only(self) -> bool {
        matches!(self, Kind::Read | Kind::Scan)
    }
}

/// One transaction of a stream; its keys are [`Stream::keys`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Txn {
    /// What it does.
    pub kind: Kind,
    /// Kind-specific argument (reads before writes, scan length, bid amount).
    pub arg: u32,
    start: u32,
    len: u32,
}

/// The transactions one thread runs, drawn before timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    /// The transactions in order.
    pub txns: Vec<Txn>,
    keys: Vec<u64>,
}

impl Stream {
    /// The keys of `txn`, which must come from this stream.
    pub fn keys(&self, txn: &Txn) -> &[u64] {
        &self.keys[txn.start as usize..(txn.start + txn.len) as usize]
    }

    fn push(&mut self, kind: Kind, arg: u32, keys: &[u64]) {
        let start = u32::try_from(self.keys.len()).expect("a stream holds < 4G keys");
        self.keys.extend_from_slice(keys);
        self.txns.push(Txn {
            kind,
            arg,
            start,
            len: keys.len() as u32,
        });
    }

    /// The largest key any transaction touches (bidder ids excluded), if any.
    pub fn key_max(&self) -> Option<u64> {
        self.txns
            .iter()
            .flat_map(|t| {
                let keys = self.keys(t);
                match t.kind {
                    Kind::Bid => &keys[..4],
                    Kind::Scan => &keys[..1],
                    _ => keys,
                }
                .iter()
                .copied()
                .chain((t.kind == Kind::Scan).then(|| keys[0] + u64::from(t.arg) - 1))
            })
            .max()
    }
}

/// The key under which `bid` keeps `field` (0 count, 1 max, 2 max bidder) of `auction`.
fn bid_key(auction: u64, field: u64) -> u64 {
    auction * 3 + field
}

impl Params {
    /// Keys the initial load writes: `0..initial_keys()`.
    pub fn initial_keys(&self) -> u64 {
        match self.workload {
            Workload::Like => self.records * 2,
            Workload::Bid => self.records * 3,
            _ => self.records,
        }
    }

    /// The initial value of `key` (below [`Params::initial_keys`]).
    pub fn initial_value(&self, key: u64) -> Vec<u8> {
        match self.workload {
            Workload::Incr1 => b"0".to_vec(),
            Workload::Like if key < self.records => b"0".to_vec(),
            Workload::Like => u64::MAX.to_be_bytes().to_vec(),
            Workload::Bid => match key % 3 {
                2 => keel::encode_ordered(0, &0u64.to_be_bytes()),
                _ => b"0".to_vec(),
            },
            _ => {
                let mut v = vec![0; VALUE_BYTES];
                stamp(&mut v, u32::MAX, key);
                v
            }
        }
    }

    /// The stream of thread `thread` (below `threads`). The same parameters and thread
    /// always give the same stream.
    pub fn stream(&self, thread: usize) -> anyhow::Result<Stream> {
        anyhow::ensure!(self.records >= 1, "a workload needs at least one record");
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.read_ratio),
            "read ratio {} is not in [0, 1]",
            self.read_ratio
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.hot),
            "hot-key probability {} is not in [0, 1]",
            self.hot
        );
        let seed = self.seed ^ (thread as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Every thread scrambles with the same permutation, so all agree on the hot keys.
        let zipf = KeyChooser::zipf(self.records, self.theta, self.seed)?;
        let uniform = KeyChooser::zipf(self.records, 0.0, self.seed)?;
        let n = self.stream_txns;
        let mut s = Stream {
            txns: Vec::with_capacity(n),
            keys: Vec::with_capacity((n * 4).min(STREAM_KEYS_MAX)),
        };
        let threads = self.threads.max(1) as u64;
        // Inserted keys (ycsb-d, ycsb-e) and new bids are unique per thread: thread `t`'s
        // `i`-th insert takes `base + i * threads + t`.
        let mut inserted = 0u64;
        let fresh = |inserted: &mut u64, base: u64| {
            let key = base + *inserted * threads + thread as u64;
            *inserted += 1;
            key
        };
        let r = self.read_ratio;
        for i in 0..n {
            if s.keys.len() >= STREAM_KEYS_MAX {
                break;
            }
            match self.workload {
                Workload::Deut | Workload::DeutWrite => {
                    let keys: [u64; 4] = std::array::from_fn(|_| zipf.key(&mut rng));
                    if self.workload == Workload::DeutWrite {
                        s.push(Kind::ReadWrite, 0, &keys);
                    } else if rng.random_bool(r) {
                        s.push(Kind::Read, 0, &keys);
                    } else {
                        s.push(Kind::ReadWrite, 2, &keys);
                    }
                }
                Workload::YcsbA | Workload::YcsbB | Workload::YcsbC => {
                    let key = zipf.key(&mut rng);
                    if rng.random_bool(r) {
                        s.push(Kind::Read, 0, &[key]);
                    } else {
                        s.push(Kind::ReadWrite, 0, &[key]);
                    }
                }
                Workload::YcsbD => {
                    if rng.random_bool(r) {
                        // Latest: Zipfian over recency, newest first (not scrambled, as YCSB).
                        let newest = self.records + inserted * threads;
                        let key = newest.saturating_sub(1 + zipf.rank(&mut rng));
                        s.push(Kind::Read, 0, &[key]);
                    } else {
                        let key = fresh(&mut inserted, self.records);
                        s.push(Kind::ReadWrite, 0, &[key]);
                    }
                }
                Workload::YcsbE => {
                    if rng.random_bool(r) {
                        let key = zipf.key(&mut rng);
                        let len = rng.random_range(1..=SCAN_LEN_MAX);
                        s.push(Kind::Scan, len, &[key]);
                    } else {
                        let key = fresh(&mut inserted, self.records);
                        s.push(Kind::ReadWrite, 0, &[key]);
                    }
                }
                Workload::YcsbF => {
                    let key = zipf.key(&mut rng);
                    let kind = if rng.random_bool(r) {
                        Kind::Read
                    } else {
                        Kind::ReadModifyWrite
                    };
                    s.push(kind, 0, &[key]);
                }
                Workload::Incr1 => {
                    let key = if rng.random_bool(self.hot) {
                        0
                    } else {
                        uniform.key(&mut rng)
                    };
                    s.push(Kind::Incr, 0, &[key]);
                }
                Workload::Like => {
                    let page = zipf.key(&mut rng);
                    let user = self.records + uniform.key(&mut rng);
                    let kind = if rng.random_bool(r) {
                        Kind::Read
                    } else {
                        Kind::LikeWrite
                    };
                    s.push(kind, 0, &[page, user]);
                }
                Workload::Bid => {
                    let auction = zipf.key(&mut rng);
                    let bidder = uniform.key(&mut rng);
                    let amount = rng.random_range(1..=1_000_000);
                    let bid = fresh(&mut inserted, self.records * 3);
                    let keys = [
                        bid_key(auction, 0),
                        bid_key(auction, 1),
                        bid_key(auction, 2),
                        bid,
                        bidder,
                    ];
                    s.push(Kind::Bid, amount, &keys);
                }
                Workload::Mgp => {
                    // Half the clients read, half write; a lone client alternates.
                    let reader = if self.threads <= 1 {
                        i.is_multiple_of(2)
                    } else {
                        thread.is_multiple_of(2)
                    };
                    let keys: Vec<u64> = (0..MGP_KEYS).map(|_| uniform.key(&mut rng)).collect();
                    let kind = if reader { Kind::Read } else { Kind::ReadWrite };
                    s.push(kind, 0, &keys);
                }
            }
        }
        Ok(s)
    }
}

/// Writes the value stamp: the writer's thread and its sequence number, then filler bytes
/// derived from both, so every written value is distinct and checkable.
pub fn stamp(value: &mut [u8], thread: u32, seq: u64) {
    value[..4].copy_from_slice(&thread.to_be_bytes());
    value[4..12].copy_from_slice(&seq.to_be_bytes());
    let fill = (seq as u8).wrapping_add(thread as u8);
    for (i, b) in value[12..].iter_mut().enumerate() {
        *b = fill.wrapping_add(i as u8);
    }
}

/// The thread of a stamped value (`u32::MAX` for loaded values), if it is one.
pub fn stamp_thread(value: &[u8]) -> Option<u32> {
    (value.len() == VALUE_BYTES)
        .then(|| u32::from_be_bytes(value[..4].try_into().expect("4 bytes")))
}

/// Per-thread state for [`execute`]: the value buffer and the write sequence number.
#[derive(Debug)]
pub struct Writer {
    thread: u32,
    seq: u64,
    value: [u8; VALUE_BYTES],
    /// Sum of bytes read, so that reads cannot be optimised away.
    pub read_bytes: u64,
}

impl Writer {
    /// State for thread `thread`.
    pub fn new(thread: u32) -> Writer {
        Writer {
            thread,
            seq: 0,
            value: [0; VALUE_BYTES],
            read_bytes: 0,
        }
    }

    /// The next value to write: stamped with this thread and a fresh sequence number.
    pub fn next_value(&mut self) -> &[u8] {
        self.seq += 1;
        stamp(&mut self.value, self.thread, self.seq);
        &self.value
    }
}

/// Plays `txn` (with its `keys`) against `tx`. Conflicts and errors come back from `tx`.
pub fn execute(txn: &Txn, keys: &[u64], tx: &mut dyn Tx, w: &mut Writer) -> Step {
    let mut read = 0u64;
    let mut sink = |v: Option<&[u8]>| read += v.map_or(0, |v| v.len() as u64);
    if keys.len() > 1
        && matches!(
            txn.kind,
            Kind::Read | Kind::ReadWrite | Kind::ReadModifyWrite
        )
    {
        tx.prefetch(keys);
    }
    match txn.kind {
        Kind::Read => {
            for &k in keys {
                tx.read(k, &mut sink)?;
            }
        }
        Kind::ReadWrite => {
            let (reads, writes) = keys.split_at(txn.arg as usize);
            for &k in reads {
                tx.read(k, &mut sink)?;
            }
            for &k in writes {
                tx.write(k, w.next_value())?;
            }
        }
        Kind::ReadModifyWrite => {
            for &k in keys {
                let mut old = [0u8; VALUE_BYTES];
                tx.read(k, &mut |v| {
                    if let Some(v) = v {
                        let n = v.len().min(VALUE_BYTES);
                        old[..n].copy_from_slice(&v[..n]);
                    }
                })?;
                // The new value depends on the old one: a real read-modify-write.
                let mut new = [0u8; VALUE_BYTES];
                new.copy_from_slice(w.next_value());
                new[12] ^= old[12];
                tx.write(k, &new)?;
            }
        }
        Kind::Scan => {
            tx.scan(keys[0], txn.arg, &mut |_k, v| read += v.len() as u64)?;
        }
        Kind::Incr => {
            for &k in keys {
                tx.add(k, 1)?;
            }
        }
        Kind::LikeWrite => {
            tx.add(keys[0], 1)?;
            tx.write(keys[1], &keys[0].to_be_bytes())?;
        }
        Kind::Bid => {
            let amount = i64::from(txn.arg);
            tx.add(keys[0], 1)?;
            tx.max(keys[1], amount)?;
            tx.put_ordered(keys[2], u64::from(txn.arg), &keys[4].to_be_bytes())?;
            tx.write(keys[3], w.next_value())?;
        }
    }
    w.read_bytes = w.read_bytes.wrapping_add(read);
    Ok(())
}

/// Keys `0..key_space` cover the initial records and every key the streams touch.
pub fn key_space(params: &Params, streams: &[Stream]) -> u64 {
    streams
        .iter()
        .filter_map(Stream::key_max)
        .max()
        .map_or(0, |k| k + 1)
        .max(params.initial_keys())
}

#[cfg(test)]
mod tests;
