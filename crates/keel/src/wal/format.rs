//! Byte formats of the log (see `docs/format.md`, which this code must match).
//!
//! A segment file `wal-<first LSN, 20 digits>.log` is a 24-byte header followed by frames.
//! A frame is an 8-byte header word — payload length (u32 LE) then CRC32C of the payload
//! (u32 LE) — then the payload, then zero padding to a multiple of 8. A header word of zero
//! marks the end of written data (the log is zero-filled beyond it). LSNs are byte offsets in
//! the concatenation of all frames; frame `n` of a segment starts at LSN
//! `first_lsn + (file offset - 24)`.
//!
//! Payload: commit timestamp (u64 LE), entry count (u32 LE), then per entry key length
//! (u32 LE), value length (u32 LE; `u32::MAX` = delete; bit 31 set = the bytes are a delta of
//! a split record, length in the low 31 bits), key bytes, value bytes.
//!
//! Version 2 added deltas; version 1 files (no deltas) are read unchanged. Version 3 added
//! the frames of two-phase commit, marked by the high bits of the entry count: a *prepare*
//! frame (bit 31; metadata length (u32 LE) and bytes follow the count, then the entries) holds
//! a prepared transaction's writes at its reserved timestamp, and a *decision* frame (bit 30:
//! committed, bit 29: aborted; no entries) settles the prepare frame of the same timestamp.

use crate::Ts;

pub(crate) const SEGMENT_MAGIC: &[u8; 8] = b"KEELWAL\0";
pub(crate) const FORMAT_VERSION: u32 = 3;
pub(crate) const SEGMENT_HEADER_BYTES: usize = 24;
pub(crate) const FRAME_HEADER_BYTES: usize = 8;
pub(crate) const DELETE: u32 = u32::MAX;
/// Bit of the value length that marks a delta (see `split::Delta::encode`).
pub(crate) const DELTA: u32 = 1 << 31;
const _: () = assert!(crate::limits::VALUE_BYTES_MAX + 64 < DELTA as usize);
const PAYLOAD_FIXED_BYTES: usize = 12;
/// Entry-count bits of the two-phase commit frames (version 3).
const PREPARE: u32 = 1 << 31;
const COMMITTED: u32 = 1 << 30;
const ABORTED: u32 = 1 << 29;
const COUNT_MASK: u32 = ABORTED - 1;
const _: () = assert!(crate::limits::TXN_WRITE_KEYS_MAX < COUNT_MASK as usize);
const ENTRY_FIXED_BYTES: usize = 8;

/// Largest payload a frame may carry: one transaction's writes at their limits, and a
/// prepare frame's metadata.
pub(crate) const PAYLOAD_BYTES_MAX: usize = PAYLOAD_FIXED_BYTES
    + 4
    + crate::limits::PREPARE_META_BYTES_MAX
    + crate::limits::TXN_WRITE_BYTES_MAX
    + ENTRY_FIXED_BYTES * crate::limits::TXN_WRITE_KEYS_MAX;
const _: () = assert!(PAYLOAD_BYTES_MAX < u32::MAX as usize);

pub(crate) fn segment_name(first_lsn: u64) -> String {
    format!("wal-{first_lsn:020}.log")
}

pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("wal-")?.strip_suffix(".log")?;
    (digits.len() == 20).then(|| digits.parse().ok())?
}

pub(crate) fn segment_header(first_lsn: u64) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    header[..8].copy_from_slice(SEGMENT_MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[16..24].copy_from_slice(&first_lsn.to_le_bytes());
    header
}

/// Frame size on disk for a payload of `payload` bytes.
pub(crate) fn frame_bytes(payload: usize) -> usize {
    FRAME_HEADER_BYTES + payload.next_multiple_of(8)
}

/// What a log entry does to its key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Logged<'a> {
    Put(&'a [u8]),
    Delete,
    /// A delta of a split record, encoded in place (`Delta::encode`).
    Delta(&'a crate::split::Delta),
}

/// What a frame records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind<'a> {
    /// A commit (or, without entries, a timestamp lease).
    Commit,
    /// A prepared transaction's writes, with the caller's metadata.
    Prepare(&'a [u8]),
    /// The decision on the prepare frame of the same timestamp: `true` committed.
    Decision(bool),
}

/// Appends the payload of a frame to `out`.
pub(crate) fn encode_payload<'a>(
    out: &mut Vec<u8>,
    ts: Ts,
    kind: Kind<'_>,
    count: usize,
    entries: impl Iterator<Item = (&'a [u8], Logged<'a>)>,
) {
    out.extend_from_slice(&ts.0.to_le_bytes());
    let count = u32::try_from(count).expect("bounded by TXN_WRITE_KEYS_MAX");
    let flags = match kind {
        Kind::Commit => 0,
        Kind::Prepare(_) => PREPARE,
        Kind::Decision(true) => COMMITTED,
        Kind::Decision(false) => ABORTED,
    };
    out.extend_from_slice(&(count | flags).to_le_bytes());
    if let Kind::Prepare(meta) = kind {
        let len = u32::try_from(meta.len()).expect("bounded by PREPARE_META_BYTES_MAX");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(meta);
    }
    for (key, value) in entries {
        out.extend_from_slice(
            &u32::try_from(key.len())
                .expect("bounded by KEY_BYTES_MAX")
                .to_le_bytes(),
        );
        let bounded = |v: &[u8]| u32::try_from(v.len()).expect("bounded by VALUE_BYTES_MAX");
        match value {
            Logged::Put(v) => {
                out.extend_from_slice(&bounded(v).to_le_bytes());
                out.extend_from_slice(key);
                out.extend_from_slice(v);
            }
            Logged::Delete => {
                out.extend_from_slice(&DELETE.to_le_bytes());
                out.extend_from_slice(key);
            }
            Logged::Delta(d) => {
                // The length is known once the delta is encoded: patch it in.
                let len_at = out.len();
                out.extend_from_slice(&0u32.to_le_bytes());
                out.extend_from_slice(key);
                let start = out.len();
                d.encode(out);
                let len = bounded(&out[start..]) | DELTA;
                out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
            }
        }
    }
}

/// The frame header word for a payload.
pub(crate) fn frame_header(payload: &[u8]) -> u64 {
    let len = u32::try_from(payload.len()).expect("bounded by PAYLOAD_BYTES_MAX");
    u64::from(len) | (u64::from(crc32c::crc32c(payload)) << 32)
}

/// A frame's payload, checked and borrowed from the log's bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame<'a> {
    /// The commit timestamp.
    pub(crate) ts: Ts,
    pub(crate) kind: Kind<'a>,
    count: usize,
    /// The entries, encoded.
    body: &'a [u8],
}

/// One logged write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry<'a> {
    Put(&'a [u8], &'a [u8]),
    Delete(&'a [u8]),
    /// An encoded delta of a split record, to apply above the key's last full value.
    Delta(&'a [u8], &'a [u8]),
}

impl<'a> Entry<'a> {
    /// The key written.
    pub(crate) fn key(&self) -> &'a [u8] {
        match *self {
            Entry::Put(key, _) | Entry::Delete(key) | Entry::Delta(key, _) => key,
        }
    }
}

impl<'a> Frame<'a> {
    /// The timestamp and entry count in front of a payload, and the encoded entries after.
    fn header(payload: &'a [u8]) -> Option<Frame<'a>> {
        let (ts, rest) = payload.split_at_checked(8)?;
        let (count, mut body) = rest.split_at_checked(4)?;
        let word = u32::from_le_bytes(count.try_into().ok()?);
        let count = (word & COUNT_MASK) as usize;
        let kind = match word & !COUNT_MASK {
            0 => Kind::Commit,
            PREPARE => {
                let (len, rest) = body.split_at_checked(4)?;
                let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
                let (meta, rest) = rest.split_at_checked(len)?;
                body = rest;
                Kind::Prepare(meta)
            }
            COMMITTED if count == 0 => Kind::Decision(true),
            ABORTED if count == 0 => Kind::Decision(false),
            _ => return None,
        };
        Some(Frame {
            ts: Ts(u64::from_le_bytes(ts.try_into().ok()?)),
            kind,
            count,
            body,
        })
    }

    /// Parses a payload whose checksum already matched, checking every entry (so that
    /// [`Frame::entries`] cannot fail). `None` if its structure is invalid.
    pub(crate) fn parse(payload: &'a [u8]) -> Option<Frame<'a>> {
        let frame = Frame::header(payload)?;
        let mut entries = frame.entries();
        for _ in 0..frame.count {
            if let Entry::Delta(_, delta) = entries.decode()? {
                crate::split::Delta::decode(delta)?;
            }
        }
        entries.rest.is_empty().then_some(frame)
    }

    /// A payload that [`Frame::parse`] accepted before, without checking it again.
    pub(crate) fn parsed(payload: &'a [u8]) -> Frame<'a> {
        Frame::header(payload).expect("checked by Frame::parse")
    }

    /// A frame with no entries is a timestamp lease, not a commit (no commit without writes
    /// is logged): it only raises the clock recovery resumes from.
    pub(crate) fn is_lease(&self) -> bool {
        self.count == 0 && self.kind == Kind::Commit
    }

    pub(crate) fn entries(&self) -> Entries<'a> {
        Entries {
            rest: self.body,
            left: self.count,
        }
    }
}

/// The entries of a [`Frame`], in logged order.
pub(crate) struct Entries<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Entries<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = self.rest.split_at_checked(n)?;
        self.rest = tail;
        Some(head)
    }

    fn decode(&mut self) -> Option<Entry<'a>> {
        let key_len = u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize;
        let value_len = u32::from_le_bytes(self.take(4)?.try_into().ok()?);
        let key = self.take(key_len)?;
        Some(if value_len == DELETE {
            Entry::Delete(key)
        } else if value_len & DELTA != 0 {
            Entry::Delta(key, self.take((value_len & !DELTA) as usize)?)
        } else {
            Entry::Put(key, self.take(value_len as usize)?)
        })
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        self.left = self.left.checked_sub(1)?;
        Some(self.decode().expect("checked by Frame::parse"))
    }
}
