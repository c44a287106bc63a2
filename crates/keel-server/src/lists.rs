//! List commands (`LPUSH`, `LPOP`, `LRANGE`, `LINSERT`, `LMOVE`, `LMPOP`, ..., and the
//! blocking `BLPOP`/`BRPOP`/`BLMOVE`/`BRPOPLPUSH`/`BLMPOP`), over the layout of
//! `docs/types.md`.
//!
//! Elements are engine keys `FF 'l' gen index`, the index an order-preserving signed 8-byte
//! integer. The indices of a list are dense: exactly those from its head (`FF 'e' gen 00`, the
//! index of the first element) up to its tail (`FF 'e' gen 01`, one past the last) exist. Its
//! length is also kept in the collection size record `FF 'n' gen` with the engine's commutative
//! `add`, so that a push replies with the new length without reading the other end. Every
//! write adds to it, 0 when the length stays (`LSET`): `WATCH` of a list records that record.
//!
//! What conflicts with what: a push at the head reads and writes only the head record, a push
//! at the tail only the tail record, so `LPUSH` and `RPUSH` never conflict. A pop reads its end,
//! the popped elements and the next one (whether any remain, to delete the key with its last
//! element as Redis does), not the other end: a consumer popping one end of a queue and a
//! producer pushing at the other conflict only when the list is about to run empty.
//! `LINSERT`, `LREM` and `LTRIM` keep the indices dense by moving elements: `LINSERT` moves
//! those on the shorter side of the new element, `LREM` those between the end it scans from and
//! the last element it removes. `LINDEX`, `LSET` and `LRANGE` go straight to an index.
//!
//! Blocking pops: outside `MULTI` the connection (`conn.rs`) runs [`run_blocking`], which pops
//! like the non-blocking command or says that it would block; the connection then waits in the
//! registry of `blocking.rs`. Inside `MULTI` they never block: nothing to pop is a null reply.

use std::collections::BTreeMap;
use std::ops::{Bound, ControlFlow};

use bytes::Bytes;
use keel::Txn;

use crate::data::{Ctx, Fail, REPLY_ITEMS_MAX, SYNTAX, View, int_arg, reply_too_big};
use crate::keyspace::{self as ks, Held, LIST_ITEM, Meta, Type, WRONGTYPE, packed};
use crate::reply::Out;
use crate::table::Cmd;

/// The marker error of a blocking command outside `MULTI` that found nothing to pop: the caller
/// blocks, and never shows it.
pub const WOULD_BLOCK: &str = "ERR keel: would block";
const OUT_OF_RANGE: &str = "ERR index out of range";

/// Whether this module runs `cmd`.
pub fn handles(cmd: Cmd) -> bool {
    is_read_only(cmd)
        || is_blocking(cmd)
        || matches!(
            cmd,
            Cmd::Lpush
                | Cmd::Rpush
                | Cmd::Lpushx
                | Cmd::Rpushx
                | Cmd::Lpop
                | Cmd::Rpop
                | Cmd::Lset
                | Cmd::Lrem
                | Cmd::Ltrim
                | Cmd::Linsert
                | Cmd::Lmove
                | Cmd::Rpoplpush
                | Cmd::Lmpop
        )
}

/// Whether `cmd` is a list command that only reads.
pub fn is_read_only(cmd: Cmd) -> bool {
    matches!(cmd, Cmd::Llen | Cmd::Lrange | Cmd::Lindex | Cmd::Lpos)
}

/// Whether `cmd` blocks when it finds nothing to pop (outside `MULTI`).
pub fn is_blocking(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Blpop | Cmd::Brpop | Cmd::Blmove | Cmd::Brpoplpush | Cmd::Blmpop
    )
}

/// The key a committed `cmd` may have turned from absent into a non-empty list: clients
/// blocked on it are woken. (`LPUSHX`/`RPUSHX`/`LINSERT` only grow a list that exists, and a
/// list that exists has no client waiting for it for long: whoever pops it wakes the next.)
pub fn pushed_key(cmd: Cmd, args: &[Bytes]) -> Option<&[u8]> {
    match cmd {
        Cmd::Lpush | Cmd::Rpush => args.get(1),
        Cmd::Lmove
        | Cmd::Rpoplpush
        | Cmd::Blmove
        | Cmd::Brpoplpush
        | Cmd::Rename
        | Cmd::Renamenx
        | Cmd::Copy => args.get(2),
        _ => None,
    }
    .map(|a| &a[..])
}

/// The keys a blocking command waits on (its arguments are valid: it ran once).
pub fn blocking_keys(cmd: Cmd, args: &[Bytes]) -> &[Bytes] {
    match cmd {
        Cmd::Blpop | Cmd::Brpop => &args[1..args.len() - 1],
        Cmd::Blmpop => {
            let n = crate::resp::string_to_i64(&args[2])
                .and_then(|n| usize::try_from(n).ok())
                .expect("BLMPOP's numkeys was checked");
            &args[3..3 + n]
        }
        _ => &args[1..2],
    }
}

/// The timeout argument of a blocking command.
pub fn timeout_arg_of(cmd: Cmd, args: &[Bytes]) -> &[u8] {
    match cmd {
        Cmd::Blmove => &args[5],
        Cmd::Brpoplpush => &args[3],
        Cmd::Blmpop => &args[1],
        _ => &args[args.len() - 1],
    }
}

/// A blocking command's timeout (`None`: wait forever), parsed as Redis does: seconds as a
/// float, rounded up to whole milliseconds.
pub fn timeout(arg: &[u8]) -> Result<Option<std::time::Duration>, Fail> {
    let secs = std::str::from_utf8(arg)
        .ok()
        .filter(|s| !s.is_empty() && !s.starts_with(|c: char| c.is_ascii_whitespace()))
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|x| !x.is_nan())
        .ok_or("ERR timeout is not a float or out of range")?;
    let ms = (secs * 1000.0).ceil();
    // Redis 7.0 converts the milliseconds to a C long long unchecked: past its range (as
    // `inf`) they come out negative.
    if ms < 0.0 || ms >= i64::MAX as f64 {
        return Err("ERR timeout is negative".into());
    }
    if ms == 0.0 {
        return Ok(None);
    }
    // Redis adds the timeout to the clock in ms; past i64 it is out of range.
    let now = i64::try_from(ks::unix_ms()).unwrap_or(i64::MAX);
    if ms as i64 > i64::MAX - now {
        return Err("ERR timeout is out of range".into());
    }
    Ok(Some(std::time::Duration::from_millis(ms as u64)))
}

/// Which end of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The head (left).
    Head,
    /// The tail (right).
    Tail,
}

impl End {
    fn parse(arg: &[u8]) -> Result<End, Fail> {
        if arg.eq_ignore_ascii_case(b"left") {
            Ok(End::Head)
        } else if arg.eq_ignore_ascii_case(b"right") {
            Ok(End::Tail)
        } else {
            Err(SYNTAX.into())
        }
    }
}

/// The order-preserving bytes of an index.
fn index_bytes(index: i64) -> [u8; 8] {
    ((index as u64) ^ (1 << 63)).to_be_bytes()
}

/// The index of an element key.
fn index_of(key: &[u8]) -> i64 {
    let b: [u8; 8] = key[key.len() - 8..]
        .try_into()
        .expect("an element key ends in 8 bytes");
    (u64::from_be_bytes(b) ^ (1 << 63)) as i64
}

fn item_key(generation: u64, index: i64) -> ks::KeyBuf {
    ks::sub_key(LIST_ITEM, generation, &index_bytes(index))
}

fn damaged() -> Fail {
    "ERR keel: damaged list record".into()
}

/// A list as one command sees it: spread over sub-keys (its elements at `FF 'l' gen index`,
/// its ends and its size record), or packed in its meta record. A packed list's elements are
/// loaded into a map under the dense indices a spread list would give them (head 0), so that
/// every command runs the same steps on either; [`List::finish`] writes a changed packed list
/// back: packed, or spread when it outgrew the limits or its record was contended, or deleted.
struct List {
    /// The meta record as found (`None`: a list this command creates).
    meta: Option<Meta>,
    /// A packed (or new) list's elements, as the command changes them.
    packed: Option<Packed>,
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

impl List {
    /// The list `meta` describes.
    fn open(meta: Meta) -> Result<List, Fail> {
        if !meta.packed {
            return Ok(List {
                meta: Some(meta),
                packed: None,
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
            packed: Some(Packed {
                items,
                head: 0,
                tail,
                dirty: false,
                dropped: false,
            }),
        })
    }

    /// A new, empty list (written by [`List::finish`] once something is pushed).
    fn create() -> List {
        List {
            meta: None,
            packed: Some(Packed {
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

    fn item_key(&self, index: i64) -> ks::KeyBuf {
        item_key(self.generation(), index)
    }

    /// The head (`tail == false`: the index of the first element) or the tail (one past the
    /// last).
    fn end(&mut self, view: &mut View<'_, '_>, tail: bool) -> Result<i64, Fail> {
        if let Some(p) = &self.packed {
            return Ok(if tail { p.tail } else { p.head });
        }
        let v = view.get_with(&ks::list_end_key(self.generation(), tail), |v| {
            v.and_then(|b| <[u8; 8]>::try_from(b).ok())
        })?;
        v.map(i64::from_be_bytes).ok_or_else(damaged)
    }

    /// Head and tail.
    fn ends(&mut self, view: &mut View<'_, '_>) -> Result<(i64, i64), Fail> {
        Ok((self.end(view, false)?, self.end(view, true)?))
    }

    fn set_end(&mut self, t: &mut Txn<'_>, tail: bool, index: i64) -> Result<(), Fail> {
        if let Some(p) = &mut self.packed {
            *(if tail { &mut p.tail } else { &mut p.head }) = index;
            p.dirty = true;
            return Ok(());
        }
        t.put(
            &ks::list_end_key(self.generation(), tail),
            &index.to_be_bytes(),
        )?;
        Ok(())
    }

    /// Calls `f` with the element at `index` (`None`: none).
    fn get_with<T>(
        &mut self,
        view: &mut View<'_, '_>,
        index: i64,
        f: impl FnOnce(Option<&[u8]>) -> T,
    ) -> Result<T, Fail> {
        if let Some(p) = &self.packed {
            return Ok(f(p.items.get(&index).map(Vec::as_slice)));
        }
        Ok(view.get_with(&self.item_key(index), f)?)
    }

    fn put(&mut self, t: &mut Txn<'_>, index: i64, value: &[u8]) -> Result<(), Fail> {
        if let Some(p) = &mut self.packed {
            p.items.insert(index, value.to_vec());
            p.dirty = true;
            return Ok(());
        }
        t.put(&self.item_key(index), value)?;
        Ok(())
    }

    fn delete(&mut self, t: &mut Txn<'_>, index: i64) -> Result<(), Fail> {
        if let Some(p) = &mut self.packed {
            p.items.remove(&index);
            p.dirty = true;
            return Ok(());
        }
        t.delete(&self.item_key(index))?;
        Ok(())
    }

    /// Calls `f` on the elements with indices in `lo..=hi`, in order (reversed with `rev`),
    /// until it says stop.
    fn each(
        &mut self,
        view: &mut View<'_, '_>,
        lo: i64,
        hi: i64,
        rev: bool,
        mut f: impl FnMut(i64, &[u8]) -> ControlFlow<()>,
    ) {
        if lo > hi {
            return;
        }
        if let Some(p) = &self.packed {
            let mut range = p.items.range(lo..=hi);
            let mut visit = |(&i, v): (&i64, &Vec<u8>)| f(i, v);
            if rev {
                let _ = range.rev().try_for_each(&mut visit);
            } else {
                let _ = range.try_for_each(&mut visit);
            }
            return;
        }
        let generation = self.generation();
        let lo = Bound::Included(item_key(generation, lo).to_vec());
        let hi = Bound::Included(item_key(generation, hi).to_vec());
        view.range(lo, hi, rev, |k, v| f(index_of(k), v));
    }

    /// Adds `n` to the length (0 when it stays: still a change that `WATCH` sees).
    fn add_len(&mut self, t: &mut Txn<'_>, n: i64) -> Result<(), Fail> {
        if let Some(p) = &mut self.packed {
            p.dirty = true;
            return Ok(());
        }
        t.add(&ks::size_key(self.generation()), n)?;
        Ok(())
    }

    /// The length.
    fn len(&mut self, view: &mut View<'_, '_>) -> Result<i64, Fail> {
        if let Some(p) = &self.packed {
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
    fn drop_empty(&mut self, t: &mut Txn<'_>, key: &[u8]) -> Result<(), Fail> {
        if let Some(p) = &mut self.packed {
            p.dropped = true;
            p.dirty = true;
            return Ok(());
        }
        let meta = self
            .meta
            .as_ref()
            .expect("a spread list has its meta record");
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
    fn reply_len(&mut self, t: &mut Txn<'_>, ctx: &Ctx<'_>, out: &mut Out<'_>) -> Result<(), Fail> {
        if self.packed.is_none() && ctx.track_increments {
            out.tracked(t.track(&ks::size_key(self.generation()))?);
        } else {
            out.int(self.len(&mut View::Txn(t))?);
        }
        Ok(())
    }

    /// The element index of offset `index` (negative: from the tail), `None` if out of range.
    fn resolve(&mut self, view: &mut View<'_, '_>, index: i64) -> Result<Option<i64>, Fail> {
        let (head, tail) = self.ends(view)?;
        let at = if index < 0 {
            tail.checked_add(index)
        } else {
            head.checked_add(index)
        };
        Ok(at.filter(|&i| i >= head && i < tail))
    }

    /// Writes a changed packed list back to `key` (see [`List`]); a spread list's changes are
    /// written already.
    fn finish(self, t: &mut Txn<'_>, ctx: &Ctx<'_>, key: &[u8]) -> Result<(), Fail> {
        let Some(p) = self.packed.filter(|p| p.dirty) else {
            return Ok(());
        };
        let count = if p.dropped { 0 } else { p.items.len() };
        let dense = p.items.len() as i64 == p.tail - p.head
            && p.items.first_key_value().is_some_and(|(&i, _)| i == p.head);
        if count > 0 && !dense {
            return Err("ERR keel: a list's elements are not dense".into());
        }
        let old = self.meta.as_ref();
        let contended = ctx.contends(key, old);
        let items = || p.items.values().map(Vec::as_slice);
        let packed = (packed::fit(count, items()) && !contended).then(|| packed::encode(items()));
        ks::write_collection(t, key, Type::List, old, count, packed, |t, g| {
            for (i, v) in items().enumerate() {
                t.put(&item_key(g, i as i64), v)?;
            }
            t.put(&ks::list_end_key(g, false), &0i64.to_be_bytes())?;
            t.put(&ks::list_end_key(g, true), &(count as i64).to_be_bytes())?;
            Ok(())
        })
    }
}

/// The list at `key`: `None` if absent, `WRONGTYPE` if it holds something else.
fn find(view: &mut View<'_, '_>, ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<Meta>, Fail> {
    match ks::lookup(view, &ctx.clock, key, false)? {
        Held::Absent => Ok(None),
        Held::Meta(m) if m.ty == Type::List => Ok(Some(m)),
        _ => Err(WRONGTYPE.into()),
    }
}

/// The list at `key`, opened: `None` if absent, `WRONGTYPE` if it holds something else.
fn open(view: &mut View<'_, '_>, ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<List>, Fail> {
    find(view, ctx, key)?.map(List::open).transpose()
}

/// Pushes `values` at `end` of `list` (`None`: create it); the list, to finish. The caller
/// adds to the length.
fn push(
    t: &mut Txn<'_>,
    list: Option<List>,
    end: End,
    values: &[impl AsRef<[u8]>],
) -> Result<List, Fail> {
    let tail = end == End::Tail;
    let mut list = list.unwrap_or_else(List::create);
    let mut at = list.end(&mut View::Txn(t), tail)?;
    for v in values {
        match end {
            End::Head => {
                at -= 1;
                list.put(t, at, v.as_ref())?;
            }
            End::Tail => {
                list.put(t, at, v.as_ref())?;
                at += 1;
            }
        }
    }
    list.set_end(t, tail, at)?;
    Ok(list)
}

/// Pops of at most this many elements (one more is read, to see whether any remain) read
/// them one by one rather than as a range.
const POP_POINT_READS_MAX: usize = 8;

/// Pops up to `count` elements from `end` of `list` at `key`, deleting the key with its last
/// element.
fn pop(
    t: &mut Txn<'_>,
    key: &[u8],
    list: &mut List,
    end: End,
    count: usize,
) -> Result<Vec<Vec<u8>>, Fail> {
    let tail = end == End::Tail;
    let at = list.end(&mut View::Txn(t), tail)?;
    // One element more than asked for: whether any remain.
    let want = count.saturating_add(1);
    let span = i64::try_from(want).unwrap_or(i64::MAX);
    let (lo, hi) = match end {
        End::Head => (at, at.saturating_add(span - 1)),
        End::Tail => (at.saturating_sub(span), at - 1),
    };
    let mut found = Vec::new();
    if want <= POP_POINT_READS_MAX {
        // A few elements: read them by index. Indices are dense, so the first absent one
        // ends the list. Point reads go through the hash index and validate one record each;
        // a range would descend the ordered index and be scanned again at commit.
        for i in 0..span {
            let index = if tail { at - 1 - i } else { at + i };
            match list.get_with(&mut View::Txn(t), index, |v| v.map(<[u8]>::to_vec))? {
                Some(v) => found.push(v),
                None => break,
            }
        }
    } else {
        list.each(&mut View::Txn(t), lo, hi, tail, |_, v| {
            found.push(v.to_vec());
            if found.len() >= want {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
    }
    let more = found.len() > count;
    found.truncate(count);
    let n = found.len() as i64;
    for i in 0..n {
        let index = match end {
            End::Head => at + i,
            End::Tail => at - 1 - i,
        };
        list.delete(t, index)?;
    }
    if !more {
        list.drop_empty(t, key)?;
    } else if n > 0 {
        list.set_end(t, tail, if tail { at - n } else { at + n })?;
        list.add_len(t, -n)?;
    }
    Ok(found)
}

/// Redis's `start`/`end` of a range over a list of `len` elements, as offsets from the head
/// (both inclusive); `None` when the range is empty.
fn clamp(start: i64, end: i64, len: i64) -> Option<(i64, i64)> {
    let mut start = if start < 0 {
        len.saturating_add(start)
    } else {
        start
    };
    let mut end = if end < 0 {
        len.saturating_add(end)
    } else {
        end
    };
    if start < 0 {
        start = 0;
    }
    if start > end || start >= len {
        return None;
    }
    if end >= len {
        end = len - 1;
    }
    Some((start, end))
}

/// Runs one list command (see [`handles`]). Blocking commands here do not block (`MULTI`).
pub fn run(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let key = &args[1];
    match cmd {
        Cmd::Lpush | Cmd::Rpush | Cmd::Lpushx | Cmd::Rpushx => {
            let end = if matches!(cmd, Cmd::Lpush | Cmd::Lpushx) {
                End::Head
            } else {
                End::Tail
            };
            let t = view.txn();
            let list = open(&mut View::Txn(t), ctx, key)?;
            if list.is_none() && matches!(cmd, Cmd::Lpushx | Cmd::Rpushx) {
                out.int(0);
                return Ok(());
            }
            let mut list = push(t, list, end, &args[2..])?;
            list.add_len(t, (args.len() - 2) as i64)?;
            list.reply_len(t, ctx, out)?;
            list.finish(t, ctx, key)?;
        }
        Cmd::Lpop | Cmd::Rpop => {
            let end = if cmd == Cmd::Lpop {
                End::Head
            } else {
                End::Tail
            };
            if args.len() > 3 {
                let name = if cmd == Cmd::Lpop { "lpop" } else { "rpop" };
                return Err(format!("ERR wrong number of arguments for '{name}' command").into());
            }
            let count = match args.get(2) {
                None => None,
                Some(a) => Some(
                    crate::resp::string_to_i64(a)
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or("ERR value is out of range, must be positive")?,
                ),
            };
            let t = view.txn();
            let Some(mut list) = open(&mut View::Txn(t), ctx, key)? else {
                match count {
                    Some(_) => out.null_array(),
                    None => out.null(),
                }
                return Ok(());
            };
            match count {
                None => {
                    let popped = pop(t, key, &mut list, end, 1)?;
                    out.bulk_or_null(popped.first().map(Vec::as_slice));
                }
                Some(0) => out.array(0),
                Some(n) => {
                    let popped = pop(t, key, &mut list, end, n.min(REPLY_ITEMS_MAX + 1))?;
                    if popped.len() > REPLY_ITEMS_MAX
                        || popped.iter().map(|v| v.len() + 16).sum::<usize>() > ctx.reply_bytes_max
                    {
                        return Err(reply_too_big());
                    }
                    out.array(popped.len());
                    for v in &popped {
                        out.bulk(v);
                    }
                }
            }
            list.finish(t, ctx, key)?;
        }
        Cmd::Llen => {
            let n = match open(view, ctx, key)? {
                None => 0,
                Some(mut list) => list.len(view)?,
            };
            out.int(n);
        }
        Cmd::Lrange => {
            let start = int_arg(&args[2])?;
            let stop = int_arg(&args[3])?;
            let Some(mut list) = open(view, ctx, key)? else {
                out.array(0);
                return Ok(());
            };
            let (head, tail) = list.ends(view)?;
            let Some((s, e)) = clamp(start, stop, tail - head) else {
                out.array(0);
                return Ok(());
            };
            if e - s >= REPLY_ITEMS_MAX as i64 {
                return Err(reply_too_big());
            }
            // The elements go straight from the engine into the reply, uncopied: the
            // indices are dense, so their count is known before they are read.
            let mark = out.buf.len();
            let count = (e - s + 1) as usize;
            out.array(count);
            let (mut bytes, mut written) = (0, 0);
            list.each(view, head + s, head + e, false, |_, v| {
                bytes += v.len() + 16;
                written += 1;
                out.bulk(v);
                if bytes > ctx.reply_bytes_max {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
            if bytes > ctx.reply_bytes_max {
                out.buf.truncate(mark);
                return Err(reply_too_big());
            }
            if written != count {
                out.buf.truncate(mark);
                return Err("ERR keel: a list's elements are not dense".into());
            }
        }
        Cmd::Lindex => {
            let Some(mut list) = open(view, ctx, key)? else {
                out.null();
                return Ok(());
            };
            let index = int_arg(&args[2])?;
            match list.resolve(view, index)? {
                None => out.null(),
                Some(at) => list.get_with(view, at, |v| out.bulk_or_null(v))?,
            }
        }
        Cmd::Lset => {
            let t = view.txn();
            let Some(mut list) = open(&mut View::Txn(t), ctx, key)? else {
                return Err("ERR no such key".into());
            };
            let index = int_arg(&args[2])?;
            let at = list
                .resolve(&mut View::Txn(t), index)?
                .ok_or(OUT_OF_RANGE)?;
            list.put(t, at, &args[3])?;
            // No change of length, but a new version of the size record: `WATCH` sees it.
            list.add_len(t, 0)?;
            list.finish(t, ctx, key)?;
            out.ok();
        }
        Cmd::Ltrim => {
            let start = int_arg(&args[2])?;
            let stop = int_arg(&args[3])?;
            let t = view.txn();
            let Some(mut list) = open(&mut View::Txn(t), ctx, key)? else {
                out.ok();
                return Ok(());
            };
            ltrim(t, key, &mut list, start, stop)?;
            list.finish(t, ctx, key)?;
            out.ok();
        }
        Cmd::Lrem => {
            let count = int_arg(&args[2])?;
            let t = view.txn();
            let Some(mut list) = open(&mut View::Txn(t), ctx, key)? else {
                out.int(0);
                return Ok(());
            };
            let removed = lrem(t, key, &mut list, count, &args[3])?;
            list.finish(t, ctx, key)?;
            out.int(removed);
        }
        Cmd::Linsert => {
            let after = if args[2].eq_ignore_ascii_case(b"after") {
                true
            } else if args[2].eq_ignore_ascii_case(b"before") {
                false
            } else {
                return Err(SYNTAX.into());
            };
            let t = view.txn();
            let Some(mut list) = open(&mut View::Txn(t), ctx, key)? else {
                out.int(0);
                return Ok(());
            };
            if linsert(t, &mut list, after, &args[3], &args[4])? {
                list.reply_len(t, ctx, out)?;
                list.finish(t, ctx, key)?;
            } else {
                out.int(-1);
            }
        }
        Cmd::Lpos => lpos(args, view, ctx, out)?,
        Cmd::Lmpop => {
            let (keys, end, count) = mpop_args(args, 1)?;
            if !mpop(view.txn(), ctx, &args[keys], end, count, out)? {
                out.null_array();
            }
        }
        Cmd::Lmove | Cmd::Rpoplpush => {
            let (from, to) = if cmd == Cmd::Lmove {
                (End::parse(&args[3])?, End::parse(&args[4])?)
            } else {
                (End::Tail, End::Head)
            };
            let t = view.txn();
            if !lmove(t, ctx, &args[1], &args[2], from, to, out)? {
                out.null();
            }
        }
        Cmd::Blpop | Cmd::Brpop | Cmd::Blmove | Cmd::Brpoplpush | Cmd::Blmpop => {
            if !run_blocking(cmd, args, view.txn(), ctx, out)? {
                // Inside MULTI there is no blocking: nothing to pop is a timeout at once.
                if matches!(cmd, Cmd::Blpop | Cmd::Brpop | Cmd::Blmpop) {
                    out.null_array();
                } else {
                    out.null();
                }
            }
        }
        other => panic!("{other:?} is not a list command"),
    }
    Ok(())
}

/// A blocking command without the blocking: pops (and replies) if it can; `false`, with
/// nothing written, when every list it would pop from is absent.
pub fn run_blocking(
    cmd: Cmd,
    args: &[Bytes],
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<bool, Fail> {
    match cmd {
        Cmd::Blpop | Cmd::Brpop => {
            timeout(timeout_arg_of(cmd, args))?;
            let end = if cmd == Cmd::Blpop {
                End::Head
            } else {
                End::Tail
            };
            for key in blocking_keys(cmd, args) {
                if let Some(mut list) = open(&mut View::Txn(t), ctx, key)? {
                    let popped = pop(t, key, &mut list, end, 1)?;
                    list.finish(t, ctx, key)?;
                    let value = popped.first().ok_or_else(damaged)?;
                    out.array(2);
                    out.bulk(key);
                    out.bulk(value);
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Cmd::Blmpop => {
            let (keys, end, count) = mpop_args(args, 2)?;
            timeout(timeout_arg_of(cmd, args))?;
            mpop(t, ctx, &args[keys], end, count, out)
        }
        _ => {
            let (from, to) = if cmd == Cmd::Blmove {
                (End::parse(&args[3])?, End::parse(&args[4])?)
            } else {
                (End::Tail, End::Head)
            };
            timeout(timeout_arg_of(cmd, args))?;
            lmove(t, ctx, &args[1], &args[2], from, to, out)
        }
    }
}

/// `LMPOP`'s and `BLMPOP`'s `numkeys key [key ...] LEFT|RIGHT [COUNT count]`, from
/// `args[numkeys_at]`: where the keys are in `args`, the end, the count.
fn mpop_args(
    args: &[Bytes],
    numkeys_at: usize,
) -> Result<(std::ops::Range<usize>, End, usize), Fail> {
    let numkeys = crate::resp::string_to_i64(&args[numkeys_at])
        .filter(|&n| n >= 1)
        .ok_or("ERR numkeys should be greater than 0")?;
    let first = numkeys_at + 1;
    let where_at = usize::try_from(numkeys)
        .ok()
        .and_then(|n| first.checked_add(n))
        .filter(|&w| w < args.len())
        .ok_or(SYNTAX)?;
    let end = End::parse(&args[where_at])?;
    let mut count = None;
    let mut i = where_at + 1;
    while i < args.len() {
        if count.is_none() && args[i].eq_ignore_ascii_case(b"count") && i + 1 < args.len() {
            let n = crate::resp::string_to_i64(&args[i + 1])
                .filter(|&n| n >= 1)
                .ok_or("ERR count should be greater than 0")?;
            count = Some(usize::try_from(n).unwrap_or(usize::MAX));
            i += 2;
        } else {
            return Err(SYNTAX.into());
        }
    }
    Ok((first..where_at, end, count.unwrap_or(1)))
}

/// `LMPOP`: pops up to `count` elements from the first of `keys` that is a list, replying
/// with its name and the elements; `false` (nothing written) if none is.
fn mpop(
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    keys: &[Bytes],
    end: End,
    count: usize,
    out: &mut Out<'_>,
) -> Result<bool, Fail> {
    for key in keys {
        let Some(mut list) = open(&mut View::Txn(t), ctx, key)? else {
            continue;
        };
        let popped = pop(t, key, &mut list, end, count.min(REPLY_ITEMS_MAX + 1))?;
        list.finish(t, ctx, key)?;
        if popped.len() > REPLY_ITEMS_MAX
            || popped.iter().map(|v| v.len() + 16).sum::<usize>() > ctx.reply_bytes_max
        {
            return Err(reply_too_big());
        }
        out.array(2);
        out.bulk(key);
        out.array(popped.len());
        for v in &popped {
            out.bulk(v);
        }
        return Ok(true);
    }
    Ok(false)
}

/// `LMOVE`: pops from `from` of `src`, pushes at `to` of `dst`, replies with the element;
/// `false` (nothing written) if `src` is absent.
fn lmove(
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    src: &[u8],
    dst: &[u8],
    from: End,
    to: End,
    out: &mut Out<'_>,
) -> Result<bool, Fail> {
    let Some(mut list) = open(&mut View::Txn(t), ctx, src)? else {
        return Ok(false);
    };
    // The destination's type is checked before anything moves, as in Redis.
    find(&mut View::Txn(t), ctx, dst)?;
    if src == dst {
        let (head, tail) = list.ends(&mut View::Txn(t))?;
        if tail - head == 1 {
            // Moving the only element of a list onto itself leaves the list as it was; Redis
            // pushes before it checks whether the source ran empty, so the key (and its TTL)
            // stays. Nothing moves, but 0 is added to the length, so that it is still a
            // write to a WATCH (as `LSET`).
            let value = list
                .get_with(&mut View::Txn(t), head, |v| v.map(<[u8]>::to_vec))?
                .ok_or_else(damaged)?;
            list.add_len(t, 0)?;
            list.finish(t, ctx, src)?;
            out.bulk(&value);
            return Ok(true);
        }
    }
    let popped = pop(t, src, &mut list, from, 1)?;
    list.finish(t, ctx, src)?;
    let value = popped.into_iter().next().ok_or_else(damaged)?;
    // Looked up again: popping the last element of `src` deleted it, and `dst` may be `src`.
    let dst_list = open(&mut View::Txn(t), ctx, dst)?;
    let mut dst_list = push(t, dst_list, to, &[&value])?;
    dst_list.add_len(t, 1)?;
    dst_list.finish(t, ctx, dst)?;
    out.bulk(&value);
    Ok(true)
}

fn ltrim(t: &mut Txn<'_>, key: &[u8], list: &mut List, start: i64, stop: i64) -> Result<(), Fail> {
    let (head, tail) = list.ends(&mut View::Txn(t))?;
    let len = tail - head;
    let (left, right) = match clamp(start, stop, len) {
        None => (len, 0),
        Some((s, e)) => (s, len - e - 1),
    };
    if left == 0 && right == 0 {
        // Nothing trimmed, but Redis counts `LTRIM` of a list as a change all the same: a
        // new version of the length, so that `WATCH` sees it.
        return list.add_len(t, 0);
    }
    for i in head..head + left {
        list.delete(t, i)?;
    }
    for i in tail - right..tail {
        list.delete(t, i)?;
    }
    if left + right == len {
        return list.drop_empty(t, key);
    }
    if left > 0 {
        list.set_end(t, false, head + left)?;
    }
    if right > 0 {
        list.set_end(t, true, tail - right)?;
    }
    list.add_len(t, -(left + right))
}

/// `LREM`: removes up to `|count|` elements equal to `element` (all with 0), from the head
/// (from the tail for a negative count); how many. The elements between the end scanned from
/// and the last one removed move toward that end by the number removed before them.
fn lrem(
    t: &mut Txn<'_>,
    key: &[u8],
    list: &mut List,
    count: i64,
    element: &[u8],
) -> Result<i64, Fail> {
    let (head, tail) = list.ends(&mut View::Txn(t))?;
    let rev = count < 0;
    let limit = count.unsigned_abs();
    // Every element from the scanned end up to the last match, in scan order.
    let mut scanned: Vec<(i64, Vec<u8>, bool)> = Vec::new();
    let mut matches = 0u64;
    let mut last_match = 0;
    list.each(&mut View::Txn(t), head, tail - 1, rev, |i, v| {
        let hit = v == element;
        scanned.push((i, v.to_vec(), hit));
        if hit {
            matches += 1;
            last_match = scanned.len();
            if limit != 0 && matches == limit {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    });
    if matches == 0 {
        return Ok(0);
    }
    scanned.truncate(last_match);
    let removed = matches as i64;
    if removed == tail - head {
        for (i, _, _) in &scanned {
            list.delete(t, *i)?;
        }
        list.drop_empty(t, key)?;
        return Ok(removed);
    }
    // Survivors move toward the end scanned from, filling the gaps: walk from the last
    // scanned element back toward that end, writing each survivor at the next free slot.
    let mut slot = scanned.last().expect("a match was scanned").0;
    for (i, v, hit) in scanned.iter().rev() {
        if *hit {
            continue;
        }
        if *i != slot {
            list.put(t, slot, v)?;
        }
        slot = if rev { slot + 1 } else { slot - 1 };
    }
    // `slot` is now the last vacated index, counting from the scanned end.
    if rev {
        for i in slot..tail {
            list.delete(t, i)?;
        }
        list.set_end(t, true, slot)?;
    } else {
        for i in head..=slot {
            list.delete(t, i)?;
        }
        list.set_end(t, false, slot + 1)?;
    }
    list.add_len(t, -removed)?;
    Ok(removed)
}

/// `LINSERT`: inserts `element` before or after the first `pivot` from the head; whether the
/// pivot was found. The elements on the shorter side of the new one move outward by one.
fn linsert(
    t: &mut Txn<'_>,
    list: &mut List,
    after: bool,
    pivot: &[u8],
    element: &[u8],
) -> Result<bool, Fail> {
    let (head, tail) = list.ends(&mut View::Txn(t))?;
    let mut before = Vec::new();
    let mut found = None;
    list.each(&mut View::Txn(t), head, tail - 1, false, |i, v| {
        if v == pivot {
            found = Some(i);
            before.push(v.to_vec());
            return ControlFlow::Break(());
        }
        before.push(v.to_vec());
        ControlFlow::Continue(())
    });
    let Some(pivot_at) = found else {
        return Ok(false);
    };
    // The new element's offset from the head once inserted.
    let q = pivot_at - head + i64::from(after);
    let len = tail - head;
    if q <= len - q {
        // Move the q elements before it one step toward the head.
        for (j, v) in before.iter().take(q as usize).enumerate() {
            list.put(t, head + j as i64 - 1, v)?;
        }
        list.put(t, head + q - 1, element)?;
        list.set_end(t, false, head - 1)?;
    } else {
        // Move the elements from offset q on one step toward the tail.
        let mut rest = Vec::new();
        list.each(&mut View::Txn(t), head + q, tail - 1, false, |i, v| {
            rest.push((i, v.to_vec()));
            ControlFlow::Continue(())
        });
        for (i, v) in &rest {
            list.put(t, i + 1, v)?;
        }
        list.put(t, head + q, element)?;
        list.set_end(t, true, tail + 1)?;
    }
    list.add_len(t, 1)?;
    Ok(true)
}

/// `LPOS key element [RANK rank] [COUNT num-matches] [MAXLEN len]`.
fn lpos(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let mut rank: i64 = 1;
    let mut count: Option<i64> = None;
    let mut maxlen: i64 = 0;
    let mut i = 3;
    while i < args.len() {
        let opt = &args[i];
        let more = i + 1 < args.len();
        if opt.eq_ignore_ascii_case(b"rank") && more {
            rank = int_arg(&args[i + 1])?;
            if rank == i64::MIN {
                return Err("ERR value is out of range, value must between \
                            -9223372036854775807 and 9223372036854775807"
                    .into());
            }
            if rank == 0 {
                return Err(
                    "ERR RANK can't be zero: use 1 to start from the first match, 2 \
                            from the second ... or use negative to start from the end of the \
                            list"
                        .into(),
                );
            }
        } else if opt.eq_ignore_ascii_case(b"count") && more {
            let n = crate::resp::string_to_i64(&args[i + 1])
                .filter(|&n| n >= 0)
                .ok_or("ERR COUNT can't be negative")?;
            count = Some(n);
        } else if opt.eq_ignore_ascii_case(b"maxlen") && more {
            maxlen = crate::resp::string_to_i64(&args[i + 1])
                .filter(|&n| n >= 0)
                .ok_or("ERR MAXLEN can't be negative")?;
        } else {
            return Err(SYNTAX.into());
        }
        i += 2;
    }
    let rev = rank < 0;
    let rank = rank.unsigned_abs();
    let Some(mut list) = open(view, ctx, &args[1])? else {
        if count.is_some() {
            out.array(0);
        } else {
            out.null();
        }
        return Ok(());
    };
    let (head, tail) = list.ends(view)?;
    let element = &args[2];
    let mut scanned = 0i64;
    let mut matches = 0u64;
    let mut hits = Vec::new();
    list.each(view, head, tail - 1, rev, |i, v| {
        if maxlen != 0 && scanned >= maxlen {
            return ControlFlow::Break(());
        }
        scanned += 1;
        if *v == element[..] {
            matches += 1;
            if matches >= rank {
                hits.push(i - head);
                match count {
                    None => return ControlFlow::Break(()),
                    Some(c) if c != 0 && hits.len() as i64 >= c => {
                        return ControlFlow::Break(());
                    }
                    _ if hits.len() > REPLY_ITEMS_MAX => return ControlFlow::Break(()),
                    _ => {}
                }
            }
        }
        ControlFlow::Continue(())
    });
    match count {
        None => match hits.first() {
            Some(&at) => out.int(at),
            None => out.null(),
        },
        Some(_) => {
            if hits.len() > REPLY_ITEMS_MAX {
                return Err(reply_too_big());
            }
            out.array(hits.len());
            for at in hits {
                out.int(at);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Cursors;
    use crate::data::test_support::{ctx, exec, meta, records, run_in, run_in_ctx};

    /// A short list is one engine record, its meta record, through every command; one element
    /// too many or too long spreads it over sub-keys, keeping its elements and TTL.
    #[test]
    fn a_short_list_is_packed_until_it_outgrows_the_limits() {
        let db = keel::Db::in_memory();
        let c = Cursors::default();
        let steps: &[(&[&str], &[u8])] = &[
            (&["RPUSH", "l", "b", "c", "d"], b":3\r\n"),
            (&["LPUSH", "l", "a"], b":4\r\n"),
            (&["LINSERT", "l", "BEFORE", "c", "x"], b":5\r\n"),
            (&["LSET", "l", "-1", "z"], b"+OK\r\n"),
            (&["LREM", "l", "0", "x"], b":1\r\n"),
            (&["LMOVE", "l", "l", "LEFT", "RIGHT"], b"$1\r\na\r\n"),
            (&["RPOP", "l"], b"$1\r\na\r\n"),
            (&["LTRIM", "l", "0", "-1"], b"+OK\r\n"),
            (&["EXPIRE", "l", "1000"], b":1\r\n"),
            (&["LPOS", "l", "z"], b":2\r\n"),
            (&["LINDEX", "l", "1"], b"$1\r\nc\r\n"),
            (
                &["LRANGE", "l", "0", "-1"],
                b"*3\r\n$1\r\nb\r\n$1\r\nc\r\n$1\r\nz\r\n",
            ),
        ];
        for (cmd, reply) in steps {
            assert_eq!(exec(&db, &c, cmd), *reply, "{cmd:?}");
        }
        assert!(meta(&db, "l").packed);
        assert_eq!(records(&db), 2, "the meta record and the expiry entry");
        let more: Vec<String> = (3..packed::ITEMS_MAX).map(|i| i.to_string()).collect();
        let mut rpush = vec!["RPUSH", "l"];
        rpush.extend(more.iter().map(String::as_str));
        let n = packed::ITEMS_MAX;
        assert_eq!(exec(&db, &c, &rpush), format!(":{n}\r\n").as_bytes());
        assert!(meta(&db, "l").packed);
        assert_eq!(
            exec(&db, &c, &["LPUSH", "l", "first"]),
            format!(":{}\r\n", n + 1).as_bytes()
        );
        assert!(!meta(&db, "l").packed);
        assert_eq!(
            records(&db),
            1 + (n + 1) + 2 + 1 + 1,
            "meta, elements, ends, size, expiry"
        );
        assert_eq!(exec(&db, &c, &["LINDEX", "l", "0"]), b"$5\r\nfirst\r\n");
        assert_eq!(
            exec(&db, &c, &["LINDEX", "l", "-1"]),
            format!("${}\r\n{}\r\n", (n - 1).to_string().len(), n - 1).as_bytes()
        );
        let ttl = exec(&db, &c, &["TTL", "l"]);
        assert!(ttl.starts_with(b":9") || ttl == b":1000\r\n", "{ttl:?}");

        // A long element spreads a list at once.
        let long = "v".repeat(packed::ITEM_BYTES_MAX + 1);
        exec(&db, &c, &["RPUSH", "m", "a", &long]);
        assert!(!meta(&db, "m").packed);
        // Popping the last element of a packed list deletes it, leaving nothing.
        exec(&db, &c, &["DEL", "l", "m"]);
        let before = records(&db);
        exec(&db, &c, &["RPUSH", "p", "a", "b"]);
        assert_eq!(
            exec(&db, &c, &["LPOP", "p", "5"]),
            b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"
        );
        assert_eq!(exec(&db, &c, &["EXISTS", "p"]), b":0\r\n");
        exec(&db, &c, &["RPUSH", "p", "a", "b"]);
        assert_eq!(exec(&db, &c, &["RPOPLPUSH", "p", "q"]), b"$1\r\nb\r\n");
        assert_eq!(
            exec(&db, &c, &["LMOVE", "p", "q", "LEFT", "LEFT"]),
            b"$1\r\na\r\n"
        );
        assert_eq!(
            exec(&db, &c, &["LRANGE", "q", "0", "-1"]),
            b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"
        );
        assert_eq!(exec(&db, &c, &["LTRIM", "q", "5", "6"]), b"+OK\r\n");
        assert_eq!(exec(&db, &c, &["EXISTS", "p", "q"]), b":0\r\n");
        assert_eq!(records(&db), before);
    }

    /// A push at each end of a packed list conflict (both rewrite its meta record); the retry
    /// of the one that lost spreads the list, after which they no longer conflict.
    #[test]
    fn a_contended_packed_list_is_spread() {
        let db = keel::Db::in_memory();
        let c = Cursors::default();
        exec(&db, &c, &["RPUSH", "q", "a"]);
        let mut t1 = db.begin().expect("begin");
        let mut t2 = db.begin().expect("begin");
        run_in(&mut t1, &c, &["LPUSH", "q", "x"]);
        run_in(&mut t2, &c, &["RPUSH", "q", "y"]);
        assert!(t1.commit().expect("commit").is_ok());
        let conflict = t2.commit().expect("commit").expect_err("one meta record");
        assert_eq!(conflict.key, ks::meta_key(b"q").to_vec());
        let retry = ctx(&c);
        retry.contended.set(&conflict);
        let mut t2 = db.begin().expect("begin");
        assert_eq!(run_in_ctx(&mut t2, &retry, &["RPUSH", "q", "y"]), b":3\r\n");
        assert!(t2.commit().expect("commit").is_ok());
        assert!(!meta(&db, "q").packed);
        let mut t1 = db.begin().expect("begin");
        let mut t2 = db.begin().expect("begin");
        run_in(&mut t1, &c, &["LPUSH", "q", "w"]);
        run_in(&mut t2, &c, &["RPUSH", "q", "z"]);
        assert!(t1.commit().expect("commit").is_ok());
        assert!(t2.commit().expect("commit").is_ok());
        assert_eq!(
            exec(&db, &c, &["LRANGE", "q", "0", "-1"]),
            b"*5\r\n$1\r\nw\r\n$1\r\nx\r\n$1\r\na\r\n$1\r\ny\r\n$1\r\nz\r\n"
        );
    }

    #[test]
    fn index_bytes_keep_order() {
        let xs = [i64::MIN, -1_000_000, -2, -1, 0, 1, 2, 1_000_000, i64::MAX];
        for w in xs.windows(2) {
            assert!(index_bytes(w[0]) < index_bytes(w[1]), "{w:?}");
        }
        for x in xs {
            let key = item_key(7, x);
            assert_eq!(index_of(&key), x);
        }
    }

    #[test]
    fn ranges_clamp_as_in_redis() {
        assert_eq!(clamp(0, -1, 5), Some((0, 4)));
        assert_eq!(clamp(-100, 100, 5), Some((0, 4)));
        assert_eq!(clamp(2, 1, 5), None);
        assert_eq!(clamp(5, 10, 5), None);
        assert_eq!(clamp(-2, -1, 5), Some((3, 4)));
        assert_eq!(clamp(0, -6, 5), None);
        assert_eq!(clamp(i64::MIN, i64::MAX, 3), Some((0, 2)));
        assert_eq!(clamp(0, 0, 0), None);
    }

    #[test]
    fn timeouts_parse_as_in_redis() {
        assert_eq!(timeout(b"0").ok(), Some(None));
        assert_eq!(
            timeout(b"0.0011").ok(),
            Some(Some(std::time::Duration::from_millis(2)))
        );
        assert_eq!(
            timeout(b"1").ok(),
            Some(Some(std::time::Duration::from_secs(1)))
        );
        assert_eq!(
            timeout(b"-1").err().map(|f| f.0),
            Some("ERR timeout is negative".into())
        );
        assert_eq!(
            timeout(b"x").err().map(|f| f.0),
            Some("ERR timeout is not a float or out of range".into())
        );
        assert_eq!(
            timeout(b"inf").err().map(|f| f.0),
            Some("ERR timeout is negative".into())
        );
        assert_eq!(
            timeout(b"9223371036854775").err().map(|f| f.0),
            Some("ERR timeout is out of range".into())
        );
    }
}
