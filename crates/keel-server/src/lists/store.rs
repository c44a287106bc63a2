//! How a list's elements are stored (`docs/types.md`, "Lists"): packed in its meta record, or
//! spread over chunk records of [`CHUNK_SLOTS`] elements each. [`List`] gives every command
//! one view of either: elements at dense indices, read and written one by one, and written
//! back to the engine once, by [`List::finish`].
//!
//! A spread list's element `index` is slot `index mod 16` of chunk `index div 16` (floored),
//! the record `FF 'l' gen chunk`: a push rewrites the chunk at its end instead of adding a
//! record to the engine's ordered index, and a long list costs a record per 16 elements.
//! An element longer than [`INLINE_BYTES_MAX`] is a record of its own, `FF 'l' gen chunk
//! slot`, so that rewriting a chunk copies at most 16 short elements. The head and tail
//! records hold the numbers of the chunks of the first and the last element: they change
//! once per 16 pushes or pops at their end, not at every one.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use keel::Txn;

use crate::data::{Ctx, Fail, View};
use crate::keyspace::{self as ks, LIST_ITEM, Meta, Type, packed};
use crate::reply::Out;

/// Elements per chunk record of a spread list.
pub(super) const CHUNK_SLOTS: usize = 16;
/// The longest element kept inside its chunk record; a longer one is a record of its own.
pub(super) const INLINE_BYTES_MAX: usize = 254;
/// Bytes reserved after a chunk read by a command that may write into it.
const WRITTEN_ROOM: usize = 64;
/// The length byte, in a chunk record, of an element kept in its own record.
const EXTERNAL: u8 = 0xFF;

/// The order-preserving bytes of an index or chunk number.
pub(super) fn index_bytes(index: i64) -> [u8; 8] {
    ((index as u64) ^ (1 << 63)).to_be_bytes()
}

/// The chunk holding element `index`, and its slot there.
pub(super) fn chunk_of(index: i64) -> (i64, usize) {
    let n = CHUNK_SLOTS as i64;
    (index.div_euclid(n), index.rem_euclid(n) as usize)
}

/// The key of chunk `chunk`.
pub(super) fn chunk_key(generation: u64, chunk: i64) -> ks::KeyBuf {
    ks::sub_key(LIST_ITEM, generation, &index_bytes(chunk))
}

/// The key of element `index` when it is kept in its own record: its chunk's key and slot,
/// so that it sorts right after its chunk.
pub(super) fn external_key(generation: u64, index: i64) -> ks::KeyBuf {
    let (chunk, slot) = chunk_of(index);
    let mut item = [0u8; 9];
    item[..8].copy_from_slice(&index_bytes(chunk));
    item[8] = slot as u8;
    ks::sub_key(LIST_ITEM, generation, &item)
}

pub(super) fn damaged() -> Fail {
    "ERR keel: damaged list record".into()
}

fn not_dense() -> Fail {
    "ERR keel: a list's elements are not dense".into()
}

/// A list as one command sees it: packed in its meta record, or spread over chunk records. A
/// packed list's elements are loaded into a map under the dense indices a spread list would
/// give them (head 0), so that every command runs the same steps on either; [`List::finish`]
/// writes the changes back: a packed list packed, or spread when it outgrew the limits or its
/// record was contended, or deleted; a spread list's changed chunks and ends.
pub(super) struct List {
    /// The meta record as found (`None`: a list this command creates).
    meta: Option<Meta>,
    body: Body,
}

enum Body {
    Packed(Packed),
    Spread(Spread),
}

/// A packed list's elements while a command runs.
struct Packed {
    items: BTreeMap<i64, Vec<u8>>,
    head: i64,
    tail: i64,
    /// Changed: [`List::finish`] writes it back.
    dirty: bool,
    /// Its last element went: [`List::finish`] deletes the key.
    dropped: bool,
}

/// One slot of a chunk as a command sees it.
#[derive(Clone, Copy)]
enum Slot {
    Empty,
    /// An element: its bytes in [`Chunk::bytes`].
    Here(u32, u32),
    /// An element kept in its own record ([`external_key`]).
    External,
}

/// A chunk record of a spread list, decoded: its first occupied slot (1 byte), then each
/// element as a length byte and its bytes, or [`EXTERNAL`] alone. Its occupied slots are
/// consecutive.
struct Chunk {
    /// Its key ([`chunk_key`]).
    key: ks::KeyBuf,
    /// The record's bytes as read (empty for a chunk that was not stored), then the elements
    /// this command wrote, each appended.
    bytes: Vec<u8>,
    slots: [Slot; CHUNK_SLOTS],
    /// The occupied slots as read: the first, and one past the last (equal: not stored).
    was: (usize, usize),
    /// Changed by this command: [`Spread::flush`] writes it back, or deletes it if empty.
    dirty: bool,
}

impl Chunk {
    fn absent(key: ks::KeyBuf) -> Chunk {
        Chunk {
            key,
            bytes: Vec::new(),
            slots: [Slot::Empty; CHUNK_SLOTS],
            was: (0, 0),
            dirty: false,
        }
    }

    fn decode(key: ks::KeyBuf, read: Vec<u8>) -> Result<Chunk, Fail> {
        let mut slots = [Slot::Empty; CHUNK_SLOTS];
        let first = *read.first().ok_or_else(damaged)? as usize;
        let (mut slot, mut at) = (first, 1);
        while at < read.len() {
            if slot >= CHUNK_SLOTS {
                return Err(damaged());
            }
            let len = read[at];
            at += 1;
            slots[slot] = if len == EXTERNAL {
                Slot::External
            } else {
                let end = at + usize::from(len);
                if end > read.len() {
                    return Err(damaged());
                }
                let s = Slot::Here(at as u32, end as u32);
                at = end;
                s
            };
            slot += 1;
        }
        if slot == first {
            return Err(damaged());
        }
        Ok(Chunk {
            key,
            bytes: read,
            slots,
            was: (first, slot),
            dirty: false,
        })
    }

    /// The record's bytes; `None` when no slot is occupied.
    fn encode(&self) -> Result<Option<Vec<u8>>, Fail> {
        let occupied = |s: &Slot| !matches!(s, Slot::Empty);
        let Some(first) = self.slots.iter().position(occupied) else {
            return Ok(None);
        };
        let last = self.slots.iter().rposition(occupied).unwrap_or(first);
        let mut out = Vec::with_capacity(self.bytes.len() + 1);
        out.push(first as u8);
        for s in &self.slots[first..=last] {
            match s {
                Slot::Empty => return Err(not_dense()),
                Slot::External => out.push(EXTERNAL),
                Slot::Here(a, b) => {
                    out.push((b - a) as u8);
                    out.extend_from_slice(&self.bytes[*a as usize..*b as usize]);
                }
            }
        }
        Ok(Some(out))
    }

    /// Calls `f` with the element in `slot` (`index` is its index), reading it from its own
    /// record if it is kept there.
    fn visit<T>(
        &self,
        view: &mut View<'_, '_>,
        generation: u64,
        slot: usize,
        index: i64,
        f: impl FnOnce(Option<&[u8]>) -> T,
    ) -> Result<T, Fail> {
        match &self.slots[slot] {
            Slot::Empty => Ok(f(None)),
            Slot::Here(a, b) => Ok(f(Some(&self.bytes[*a as usize..*b as usize]))),
            Slot::External => view
                .get_with(&external_key(generation, index), |v| v.map(|v| f(Some(v))))?
                .ok_or_else(damaged),
        }
    }
}

/// Where one end of a spread list is.
#[derive(Debug, Clone, Copy)]
struct EndAt {
    /// The head's: the index of the first element; the tail's: one past the last.
    index: i64,
    /// The chunk number its record holds (`None`: no record yet, a list being spread).
    record: Option<i64>,
}

/// A spread list's chunks and ends, as far as a command has read and changed them.
struct Spread {
    generation: u64,
    /// Nothing of it is stored yet (a list being spread): chunks are not looked up.
    fresh: bool,
    /// The chunks read, by number, in order: a command reads one or two, or a run of them
    /// (boxed, so that keeping them in order moves little).
    chunks: Vec<(i64, Box<Chunk>)>,
    head: Option<EndAt>,
    tail: Option<EndAt>,
    /// Its last element went: [`List::drop_empty`] deleted its records.
    dropped: bool,
}

impl Spread {
    fn new(generation: u64) -> Spread {
        Spread {
            generation,
            fresh: false,
            chunks: Vec::new(),
            head: None,
            tail: None,
            dropped: false,
        }
    }

    /// Chunk `k`, read on first use.
    fn chunk(&mut self, view: &mut View<'_, '_>, k: i64) -> Result<&mut Chunk, Fail> {
        let at = match self.find(k) {
            Ok(at) => at,
            Err(at) => {
                let key = chunk_key(self.generation, k);
                let read = if self.fresh {
                    None
                } else {
                    // Room for a pushed element or two, which the command appends.
                    view.get_with(&key, |v| {
                        v.map(|v| {
                            let mut read = Vec::with_capacity(v.len() + WRITTEN_ROOM);
                            read.extend_from_slice(v);
                            read
                        })
                    })?
                };
                let c = match read {
                    None => Chunk::absent(key),
                    Some(read) => Chunk::decode(key, read)?,
                };
                self.chunks.insert(at, (k, Box::new(c)));
                at
            }
        };
        Ok(&mut self.chunks[at].1)
    }

    /// Where chunk `k` is among those read (`Err`: where it would go).
    fn find(&self, k: i64) -> Result<usize, usize> {
        // Most commands touch the last chunk read, or one next to it.
        match self.chunks.last() {
            Some(&(last, _)) if last == k => Ok(self.chunks.len() - 1),
            Some(&(last, _)) if last < k => Err(self.chunks.len()),
            _ => self.chunks.binary_search_by_key(&k, |&(n, _)| n),
        }
    }

    fn end(&mut self, view: &mut View<'_, '_>, tail: bool) -> Result<i64, Fail> {
        if let Some(e) = if tail { self.tail } else { self.head } {
            return Ok(e.index);
        }
        let k = view
            .get_with(&ks::list_end_key(self.generation, tail), |v| {
                v.and_then(|b| <[u8; 8]>::try_from(b).ok())
            })?
            .map(i64::from_be_bytes)
            .ok_or_else(damaged)?;
        let (first, past) = self.chunk(view, k)?.was;
        if first == past {
            return Err(damaged());
        }
        let base = k.checked_mul(CHUNK_SLOTS as i64).ok_or_else(damaged)?;
        let slot = if tail { past } else { first };
        let index = base + slot as i64;
        let at = Some(EndAt {
            index,
            record: Some(k),
        });
        if tail {
            self.tail = at;
        } else {
            self.head = at;
        }
        Ok(index)
    }

    fn set_end(&mut self, view: &mut View<'_, '_>, tail: bool, index: i64) -> Result<(), Fail> {
        self.end(view, tail)?;
        let at = if tail { &mut self.tail } else { &mut self.head };
        at.as_mut().expect("read above").index = index;
        Ok(())
    }

    fn put(&mut self, t: &mut Txn<'_>, index: i64, value: &[u8]) -> Result<(), Fail> {
        let generation = self.generation;
        let (k, slot) = chunk_of(index);
        let chunk = self.chunk(&mut View::Txn(t), k)?;
        let was_external = matches!(chunk.slots[slot], Slot::External);
        let external = value.len() > INLINE_BYTES_MAX;
        chunk.slots[slot] = if external {
            Slot::External
        } else {
            let start = chunk.bytes.len();
            chunk.bytes.extend_from_slice(value);
            Slot::Here(start as u32, chunk.bytes.len() as u32)
        };
        chunk.dirty = true;
        if external {
            t.put(&external_key(generation, index), value)?;
        } else if was_external {
            t.delete(&external_key(generation, index))?;
        }
        Ok(())
    }

    fn delete(&mut self, t: &mut Txn<'_>, index: i64) -> Result<(), Fail> {
        let generation = self.generation;
        let (k, slot) = chunk_of(index);
        let chunk = self.chunk(&mut View::Txn(t), k)?;
        if matches!(
            std::mem::replace(&mut chunk.slots[slot], Slot::Empty),
            Slot::External
        ) {
            t.delete(&external_key(generation, index))?;
        }
        chunk.dirty = true;
        Ok(())
    }

    /// See [`List::each`]. Chunks this command has not read are read without being kept.
    fn each(
        &mut self,
        view: &mut View<'_, '_>,
        lo: i64,
        hi: i64,
        rev: bool,
        mut f: impl FnMut(i64, &[u8]) -> ControlFlow<()>,
    ) -> Result<(), Fail> {
        let (first, last) = (chunk_of(lo).0, chunk_of(hi).0);
        let mut k = if rev { last } else { first };
        loop {
            let read;
            let chunk = match self.find(k) {
                Ok(at) => Some(&*self.chunks[at].1),
                Err(_) if self.fresh => None,
                Err(_) => {
                    let key = chunk_key(self.generation, k);
                    let bytes = view.get_with(&key, |v| v.map(<[u8]>::to_vec))?;
                    read = bytes.map(|b| Chunk::decode(key, b)).transpose()?;
                    read.as_ref()
                }
            };
            if let Some(chunk) = chunk {
                let base = k * CHUNK_SLOTS as i64;
                let from = (lo.max(base) - base) as usize;
                let to = (hi.min(base + CHUNK_SLOTS as i64 - 1) - base) as usize;
                for slot in (from..=to).map(|s| if rev { from + to - s } else { s }) {
                    if matches!(chunk.slots[slot], Slot::Empty) {
                        continue;
                    }
                    let index = base + slot as i64;
                    let flow = chunk.visit(view, self.generation, slot, index, |v| {
                        f(index, v.expect("an occupied slot"))
                    })?;
                    if flow.is_break() {
                        return Ok(());
                    }
                }
            }
            if k == if rev { first } else { last } {
                return Ok(());
            }
            k += if rev { -1 } else { 1 };
        }
    }

    /// Writes the changed chunks back, and the ends' records where their chunks changed.
    fn flush(&self, t: &mut Txn<'_>) -> Result<(), Fail> {
        let g = self.generation;
        for (_, chunk) in self.chunks.iter().filter(|(_, c)| c.dirty) {
            match chunk.encode()? {
                Some(bytes) => t.put(&chunk.key, &bytes)?,
                None if chunk.was.0 != chunk.was.1 => t.delete(&chunk.key)?,
                None => {}
            }
        }
        if self.dropped {
            return Ok(());
        }
        let ends = [(false, self.head, 0), (true, self.tail, 1)];
        for (tail, at, back) in ends {
            let Some(at) = at else { continue };
            let k = chunk_of(at.index - back).0;
            if at.record != Some(k) {
                t.put(&ks::list_end_key(g, tail), &k.to_be_bytes())?;
            }
        }
        Ok(())
    }
}

impl List {
    /// The list `meta` describes.
    pub(super) fn open(meta: Meta) -> Result<List, Fail> {
        if !meta.packed {
            return Ok(List {
                body: Body::Spread(Spread::new(meta.generation)),
                meta: Some(meta),
            });
        }
        let mut items = BTreeMap::new();
        let mut bytes = &meta.value[..];
        let mut tail = 0;
        while !bytes.is_empty() {
            items.insert(tail, packed::take(&mut bytes)?.to_vec());
            tail += 1;
        }
        Ok(List {
            meta: Some(meta),
            body: Body::Packed(Packed {
                items,
                head: 0,
                tail,
                dirty: false,
                dropped: false,
            }),
        })
    }

    /// A new, empty list (written by [`List::finish`] once something is pushed).
    pub(super) fn create() -> List {
        List {
            meta: None,
            body: Body::Packed(Packed {
                items: BTreeMap::new(),
                head: 0,
                tail: 0,
                dirty: false,
                dropped: false,
            }),
        }
    }

    /// A spread list's generation.
    fn generation(&self) -> u64 {
        self.meta.as_ref().map_or(0, |m| m.generation)
    }

    /// The head (`tail == false`: the index of the first element) or the tail (one past the
    /// last).
    pub(super) fn end(&mut self, view: &mut View<'_, '_>, tail: bool) -> Result<i64, Fail> {
        match &mut self.body {
            Body::Packed(p) => Ok(if tail { p.tail } else { p.head }),
            Body::Spread(s) => s.end(view, tail),
        }
    }

    /// Head and tail.
    pub(super) fn ends(&mut self, view: &mut View<'_, '_>) -> Result<(i64, i64), Fail> {
        Ok((self.end(view, false)?, self.end(view, true)?))
    }

    pub(super) fn set_end(&mut self, t: &mut Txn<'_>, tail: bool, index: i64) -> Result<(), Fail> {
        match &mut self.body {
            Body::Packed(p) => {
                *(if tail { &mut p.tail } else { &mut p.head }) = index;
                p.dirty = true;
                Ok(())
            }
            Body::Spread(s) => s.set_end(&mut View::Txn(t), tail, index),
        }
    }

    /// Calls `f` with the element at `index` (`None`: none).
    pub(super) fn get_with<T>(
        &mut self,
        view: &mut View<'_, '_>,
        index: i64,
        f: impl FnOnce(Option<&[u8]>) -> T,
    ) -> Result<T, Fail> {
        match &mut self.body {
            Body::Packed(p) => Ok(f(p.items.get(&index).map(Vec::as_slice))),
            Body::Spread(s) => {
                let (k, slot) = chunk_of(index);
                let generation = s.generation;
                s.chunk(view, k)?.visit(view, generation, slot, index, f)
            }
        }
    }

    pub(super) fn put(&mut self, t: &mut Txn<'_>, index: i64, value: &[u8]) -> Result<(), Fail> {
        match &mut self.body {
            Body::Packed(p) => {
                p.items.insert(index, value.to_vec());
                p.dirty = true;
                Ok(())
            }
            Body::Spread(s) => s.put(t, index, value),
        }
    }

    pub(super) fn delete(&mut self, t: &mut Txn<'_>, index: i64) -> Result<(), Fail> {
        match &mut self.body {
            Body::Packed(p) => {
                p.items.remove(&index);
                p.dirty = true;
                Ok(())
            }
            Body::Spread(s) => s.delete(t, index),
        }
    }

    /// Calls `f` on the elements with indices in `lo..=hi`, in order (reversed with `rev`),
    /// until it says stop.
    pub(super) fn each(
        &mut self,
        view: &mut View<'_, '_>,
        lo: i64,
        hi: i64,
        rev: bool,
        mut f: impl FnMut(i64, &[u8]) -> ControlFlow<()>,
    ) -> Result<(), Fail> {
        if lo > hi {
            return Ok(());
        }
        match &mut self.body {
            Body::Packed(p) => {
                let mut range = p.items.range(lo..=hi);
                let mut visit = |(&i, v): (&i64, &Vec<u8>)| f(i, v);
                let _ = if rev {
                    range.rev().try_for_each(&mut visit)
                } else {
                    range.try_for_each(&mut visit)
                };
                Ok(())
            }
            Body::Spread(s) => s.each(view, lo, hi, rev, f),
        }
    }

    /// Adds `n` to the length (0 when it stays: still a change that `WATCH` sees).
    pub(super) fn add_len(&mut self, t: &mut Txn<'_>, n: i64) -> Result<(), Fail> {
        match &mut self.body {
            Body::Packed(p) => p.dirty = true,
            Body::Spread(s) => t.add(&ks::size_key(s.generation), n)?,
        }
        Ok(())
    }

    /// The length.
    pub(super) fn len(&mut self, view: &mut View<'_, '_>) -> Result<i64, Fail> {
        if let Body::Packed(p) = &self.body {
            return Ok(p.items.len() as i64);
        }
        let n = view.get_with(&ks::size_key(self.generation()), |v| {
            v.map(crate::resp::string_to_i64)
        })?;
        match n {
            None => Ok(0),
            Some(Some(n)) => Ok(n),
            Some(None) => Err(damaged()),
        }
    }

    /// Removes the key of a list whose last element is gone (its elements already deleted):
    /// no graveyard entry, there is nothing left to sweep.
    pub(super) fn drop_empty(&mut self, t: &mut Txn<'_>, key: &[u8]) -> Result<(), Fail> {
        let s = match &mut self.body {
            Body::Packed(p) => {
                p.dropped = true;
                p.dirty = true;
                return Ok(());
            }
            Body::Spread(s) => s,
        };
        let meta = self
            .meta
            .as_ref()
            .expect("a spread list has its meta record");
        s.dropped = true;
        t.delete(&ks::meta_key(key))?;
        if meta.deadline != 0 {
            t.delete(&ks::expiry_key(meta.deadline, key))?;
        }
        t.delete(&ks::list_end_key(meta.generation, false))?;
        t.delete(&ks::list_end_key(meta.generation, true))?;
        t.delete(&ks::size_key(meta.generation))?;
        Ok(())
    }

    /// Replies with the length after a change: for a spread list tracked (resolved at commit,
    /// without reading the size record) when the caller allows it.
    pub(super) fn reply_len(
        &mut self,
        t: &mut Txn<'_>,
        ctx: &Ctx<'_>,
        out: &mut Out<'_>,
    ) -> Result<(), Fail> {
        if matches!(self.body, Body::Spread(_)) && ctx.track_increments {
            out.tracked(t.track(&ks::size_key(self.generation()))?);
        } else {
            out.int(self.len(&mut View::Txn(t))?);
        }
        Ok(())
    }

    /// The element index of offset `index` (negative: from the tail), `None` if out of range.
    pub(super) fn resolve(
        &mut self,
        view: &mut View<'_, '_>,
        index: i64,
    ) -> Result<Option<i64>, Fail> {
        let (head, tail) = self.ends(view)?;
        let at = if index < 0 {
            tail.checked_add(index)
        } else {
            head.checked_add(index)
        };
        Ok(at.filter(|&i| i >= head && i < tail))
    }

    /// Writes the command's changes back to `key` (see [`List`]).
    pub(super) fn finish(self, t: &mut Txn<'_>, ctx: &Ctx<'_>, key: &[u8]) -> Result<(), Fail> {
        let p = match self.body {
            Body::Spread(s) => return s.flush(t),
            Body::Packed(p) if p.dirty => p,
            Body::Packed(_) => return Ok(()),
        };
        let count = if p.dropped { 0 } else { p.items.len() };
        let dense = p.items.len() as i64 == p.tail - p.head
            && p.items.first_key_value().is_some_and(|(&i, _)| i == p.head);
        if count > 0 && !dense {
            return Err(not_dense());
        }
        let old = self.meta.as_ref();
        let contended = ctx.contends(key, old);
        let items = || p.items.values().map(Vec::as_slice);
        let packed = (packed::fit(count, items()) && !contended).then(|| packed::encode(items()));
        ks::write_collection(t, key, Type::List, old, count, packed, |t, g| {
            let mut s = Spread::new(g);
            s.fresh = true;
            for (i, v) in items().enumerate() {
                s.put(t, i as i64, v)?;
            }
            s.head = Some(EndAt {
                index: 0,
                record: None,
            });
            s.tail = Some(EndAt {
                index: count as i64,
                record: None,
            });
            s.flush(t)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A damaged chunk record is an error, never a panic; one that decodes encodes back to
    /// the same bytes.
    #[test]
    fn chunk_records_decode_or_fail_cleanly() {
        let key = || chunk_key(7, 0);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut good, mut bad) = (0, 0);
        for _ in 0..20_000 {
            let len = (next() % 40) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Now and then a well-formed record with random lengths, to reach the valid side.
            if next() % 2 == 0 && !bytes.is_empty() {
                bytes.clear();
                bytes.push((next() % CHUNK_SLOTS as u64) as u8);
                for _ in 0..1 + next() % 4 {
                    let n = (next() % 5) as u8;
                    bytes.push(n);
                    bytes.extend((0..n).map(|_| next() as u8));
                }
            }
            match Chunk::decode(key(), bytes.clone()) {
                Ok(chunk) => {
                    good += 1;
                    let (first, past) = chunk.was;
                    assert!(first < past && past <= CHUNK_SLOTS, "{bytes:?}");
                    assert_eq!(chunk.encode().expect("dense"), Some(bytes));
                }
                Err(e) => {
                    bad += 1;
                    assert_eq!(e.0, damaged().0);
                }
            }
        }
        assert!(good > 1_000 && bad > 1_000, "{good} decoded, {bad} refused");
    }
}
