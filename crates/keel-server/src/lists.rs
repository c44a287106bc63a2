//! List commands (`LPUSH`, `LPOP`, `LRANGE`, `LINSERT`, `LMOVE`, `LMPOP`, ..., and the
//! blocking `BLPOP`/`BRPOP`/`BLMOVE`/`BRPOPLPUSH`/`BLMPOP`), over the layout of
//! `docs/types.md`.
//!
//! A spread list's elements sit at dense indices, an order-preserving signed 8-byte integer:
//! exactly those from its head up to its tail exist. Sixteen consecutive indices share a chunk
//! record, `FF 'l' gen chunk` (`lists/store.rs`, which also keeps a short list packed in its
//! meta record). Its length is also kept in the collection size record `FF 'n' gen` with the
//! engine's commutative `add`, so that a push replies with the new length without reading the
//! other end. Every write adds to it, 0 when the length stays (`LSET`): `WATCH` of a list
//! records that record.
//!
//! What conflicts with what: a push at the head reads and writes only the head chunk (and the
//! head record), a push at the tail only the tail's, so `LPUSH` and `RPUSH` conflict only while
//! both ends lie in one chunk. A pop reads its end, the chunks of the popped elements and of
//! the next one (whether any remain, to delete the key with its last element as Redis does),
//! not the other end: a consumer popping one end of a queue and a producer pushing at the other
//! conflict only when the list is down to about one chunk.
//! `LINSERT`, `LREM` and `LTRIM` keep the indices dense by moving elements: `LINSERT` moves
//! those on the shorter side of the new element, `LREM` those between the end it scans from and
//! the last element it removes. `LINDEX`, `LSET` and `LRANGE` go straight to an index.
//!
//! Blocking pops: outside `MULTI` the connection (`conn.rs`) runs [`run_blocking`], which pops
//! like the non-blocking command or says that it would block; the connection then waits in the
//! registry of `blocking.rs`. Inside `MULTI` they never block: nothing to pop is a null reply.

use std::ops::ControlFlow;

use bytes::Bytes;
use keel::Txn;

use crate::data::{Ctx, Fail, REPLY_ITEMS_MAX, SYNTAX, View, int_arg, reply_too_big};
use crate::keyspace::{self as ks, Held, Meta, Type, WRONGTYPE};
use crate::reply::Out;
use crate::table::Cmd;

mod store;
use store::{List, damaged};

/// The marker error of a blocking command outside `MULTI` that found nothing to pop: the caller
/// blocks, and never shows it.
pub const WOULD_BLOCK: &str = "ERR keel: would block";
const OUT_OF_RANGE: &str = "ERR index out of range";

/// Whether this module runs `cmd`.
pub fn handles(cmd: Cmd) -> bool {
    is_read_only(cmd)
        || (is_blocking(cmd) && !crate::zsets::is_blocking(cmd))
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

/// Whether `cmd` blocks when it finds nothing to pop (outside `MULTI`): the lists' blocking
/// pops and the sorted sets' (`BZPOPMIN`, `BZPOPMAX`, `BZMPOP`, run by `zsets`).
pub fn is_blocking(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Blpop | Cmd::Brpop | Cmd::Blmove | Cmd::Brpoplpush | Cmd::Blmpop
    ) || crate::zsets::is_blocking(cmd)
}

/// The key a committed `cmd` may have turned from absent into a non-empty list: clients
/// blocked on it are woken. (`LPUSHX`/`RPUSHX`/`LINSERT` only grow a list that exists, and a
/// list that exists has no client waiting for it for long: whoever pops it wakes the next.)
pub fn pushed_key(cmd: Cmd, args: &[Bytes]) -> Option<&[u8]> {
    match cmd {
        Cmd::Lpush | Cmd::Rpush => args.get(1),
        Cmd::Lmove | Cmd::Rpoplpush | Cmd::Blmove | Cmd::Brpoplpush => args.get(2),
        _ => None,
    }
    .map(|a| &a[..])
}

/// The keys a blocking command waits on (its arguments are valid: it ran once).
pub fn blocking_keys(cmd: Cmd, args: &[Bytes]) -> &[Bytes] {
    match cmd {
        Cmd::Blpop | Cmd::Brpop => &args[1..args.len() - 1],
        Cmd::Blmpop | Cmd::Bzmpop => {
            let n = crate::resp::string_to_i64(&args[2])
                .and_then(|n| usize::try_from(n).ok())
                .expect("BLMPOP's and BZMPOP's numkeys was checked");
            &args[3..3 + n]
        }
        Cmd::Bzpopmin | Cmd::Bzpopmax => &args[1..args.len() - 1],
        _ => &args[1..2],
    }
}

/// The timeout argument of a blocking command.
pub fn timeout_arg_of(cmd: Cmd, args: &[Bytes]) -> &[u8] {
    &args[timeout_at(cmd, args.len())]
}

/// Where a blocking command of `len` words has its timeout.
fn timeout_at(cmd: Cmd, len: usize) -> usize {
    match cmd {
        Cmd::Blmove => 5,
        Cmd::Brpoplpush => 3,
        Cmd::Blmpop | Cmd::Bzmpop => 1,
        _ => len - 1,
    }
}

/// `command` (a blocking pop) with its timeout argument set to `wait` (`None`: for ever),
/// in seconds with millisecond precision.
pub fn with_timeout(command: &[Bytes], wait: Option<std::time::Duration>) -> Vec<Bytes> {
    let cmd = crate::table::lookup(&command[0])
        .map(|spec| spec.cmd)
        .filter(|&cmd| is_blocking(cmd))
        .expect("a blocking pop");
    let mut out = command.to_vec();
    out[timeout_at(cmd, command.len())] = match wait {
        None => Bytes::from_static(b"0"),
        Some(w) => {
            let ms = w.as_millis();
            Bytes::from(format!("{}.{:03}", ms / 1000, ms % 1000))
        }
    };
    out
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

/// The list at `key`: `None` if absent, `WRONGTYPE` if it holds something else.
fn find(view: &mut View<'_, '_>, ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<Meta>, Fail> {
    match ks::lookup(view, &ctx.clock, key, false)? {
        Held::Absent => Ok(None),
        Held::Meta(m) if m.ty == Type::List => Ok(Some(m)),
        _ => Err(WRONGTYPE.into()),
    }
}

/// The number of elements of the list at `key` (0 if none), as `LLEN` counts them.
pub fn length(view: &mut View<'_, '_>, ctx: &Ctx<'_>, key: &[u8]) -> Result<u64, Fail> {
    Ok(match open(view, ctx, key)? {
        None => 0,
        Some(mut list) => list.len(view)? as u64,
    })
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
    // One element more than asked for: whether any remain. Indices are dense, so the first
    // absent one ends the list. A spread list reads each chunk once.
    let want = i64::try_from(count.saturating_add(1)).unwrap_or(i64::MAX);
    let mut found = Vec::new();
    for i in 0..want {
        let index = if tail { at - 1 - i } else { at + i };
        match list.get_with(&mut View::Txn(t), index, |v| v.map(<[u8]>::to_vec))? {
            Some(v) => found.push(v),
            None => break,
        }
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
            let read = list.each(view, head + s, head + e, false, |_, v| {
                bytes += v.len() + 16;
                written += 1;
                out.bulk(v);
                if bytes > ctx.reply_bytes_max {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
            if let Err(e) = read {
                out.buf.truncate(mark);
                return Err(e);
            }
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
    if crate::zsets::is_blocking(cmd) {
        return crate::zsets::run_blocking(cmd, args, t, ctx, out);
    }
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
    mpop_parts(args, numkeys_at, End::parse)
}

/// `numkeys key [key ...] <where> [COUNT count]` from `args[numkeys_at]`, as `LMPOP`,
/// `BLMPOP`, `ZMPOP` and `BZMPOP` take it, checked in Redis's order: where the keys are in
/// `args`, the `<where>` argument as `parse_where` reads it, and the count (1 if not given).
pub fn mpop_parts<W>(
    args: &[Bytes],
    numkeys_at: usize,
    parse_where: impl FnOnce(&[u8]) -> Result<W, Fail>,
) -> Result<(std::ops::Range<usize>, W, usize), Fail> {
    let numkeys = crate::resp::string_to_i64(&args[numkeys_at])
        .filter(|&n| n >= 1)
        .ok_or("ERR numkeys should be greater than 0")?;
    let first = numkeys_at + 1;
    let where_at = usize::try_from(numkeys)
        .ok()
        .and_then(|n| first.checked_add(n))
        .filter(|&w| w < args.len())
        .ok_or(SYNTAX)?;
    let at = parse_where(&args[where_at])?;
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
    Ok((first..where_at, at, count.unwrap_or(1)))
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
    })?;
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
    })?;
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
        })?;
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
    })?;
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
    use crate::keyspace::packed;

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
            1 + (n + 1).div_ceil(store::CHUNK_SLOTS) + 2 + 1 + 1,
            "meta, chunks of elements, ends, size, expiry"
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

    /// Chunk keys sort by chunk number, and an element kept in its own record sorts right
    /// after its chunk, before the next one.
    #[test]
    fn chunk_keys_keep_order() {
        use store::{chunk_key, chunk_of, external_key, index_bytes};
        let xs = [
            i64::MIN,
            -1_000_000,
            -17,
            -16,
            -2,
            -1,
            0,
            1,
            15,
            16,
            1_000_000,
            i64::MAX,
        ];
        for w in xs.windows(2) {
            assert!(index_bytes(w[0]) < index_bytes(w[1]), "{w:?}");
            assert!(
                external_key(7, w[0])[..] < external_key(7, w[1])[..],
                "{w:?}"
            );
        }
        assert_eq!(chunk_of(-1), (-1, 15));
        assert_eq!(chunk_of(-16), (-1, 0));
        assert_eq!(chunk_of(-17), (-2, 15));
        assert_eq!(chunk_of(16), (1, 0));
        for x in xs {
            let (k, _) = chunk_of(x);
            assert!(chunk_key(7, k)[..] < external_key(7, x)[..], "{x}");
            if let Some(next) = k.checked_add(1) {
                assert!(external_key(7, x)[..] < chunk_key(7, next)[..], "{x}");
            }
        }
    }

    /// Runs `a` in a transaction of its own (a snapshot for a read-only command, as the
    /// server does): its reply, or its error's text.
    fn call(db: &keel::Db, c: &Cursors, a: &[&[u8]]) -> Result<Vec<u8>, String> {
        use crate::reply::{Out, Proto};
        let cmd = crate::table::lookup(a[0]).expect("a command").cmd;
        let args: Vec<Bytes> = a.iter().map(|x| Bytes::copy_from_slice(x)).collect();
        let mut ctx = ctx(c);
        // A push's length is read, not tracked (resolved at commit by the connection).
        ctx.track_increments = false;
        let mut buf = bytes::BytesMut::new();
        let mut out = Out::new(&mut buf, Proto::Resp2);
        if is_read_only(cmd) {
            let snap = db.snapshot().expect("snapshot");
            crate::data::run(cmd, &args, &mut View::Snap(&snap), &ctx, &mut out)
                .map_err(|f| f.0.to_string())?;
        } else {
            let mut t = db.begin().expect("begin");
            crate::data::run(cmd, &args, &mut View::Txn(&mut t), &ctx, &mut out)
                .map_err(|f| f.0.to_string())?;
            t.commit().expect("commit").expect("no conflict");
        }
        Ok(buf.to_vec())
    }

    fn bulk(v: &[u8]) -> Vec<u8> {
        let mut out = format!("${}\r\n", v.len()).into_bytes();
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
        out
    }

    fn array<'a>(items: impl ExactSizeIterator<Item = &'a Vec<u8>>) -> Vec<u8> {
        let mut out = format!("*{}\r\n", items.len()).into_bytes();
        for v in items {
            out.extend(bulk(v));
        }
        out
    }

    /// Every list command on lists long enough to be spread over many chunks, with elements
    /// short, exactly at the limit of their chunk and longer (kept in records of their own),
    /// against a `VecDeque`: the same replies, and nothing left behind once the lists are gone.
    #[test]
    fn spread_lists_behave_as_a_deque() {
        use std::collections::VecDeque;
        let db = keel::Db::in_memory();
        let c = Cursors::default();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let sizes = [
            1,
            3,
            store::INLINE_BYTES_MAX,
            store::INLINE_BYTES_MAX + 1,
            600,
        ];
        let element = |next: &mut dyn FnMut(u64) -> u64| -> Vec<u8> {
            let len = sizes[next(sizes.len() as u64) as usize];
            let tag = b'a' + next(4) as u8;
            vec![tag; len]
        };
        let keys: [&[u8]; 2] = [b"p", b"q"];
        let mut model: [VecDeque<Vec<u8>>; 2] = Default::default();
        let empty = records(&db);
        let mut spread_rounds = 0;
        for round in 0..4000 {
            let which = next(2) as usize;
            let key = keys[which];
            let len = model[which].len() as i64;
            let int = |x: i64| x.to_string().into_bytes();
            let expect: Vec<u8>;
            let reply;
            match next(12) {
                0 | 1 => {
                    // A burst of pushes, so that the lists grow past the packed limits.
                    let n = 1 + next(40) as usize;
                    let values: Vec<Vec<u8>> = (0..n).map(|_| element(&mut next)).collect();
                    let left = next(2) == 0;
                    let mut a: Vec<&[u8]> = vec![if left { b"LPUSH" } else { b"RPUSH" }, key];
                    a.extend(values.iter().map(Vec::as_slice));
                    for v in values.iter().cloned() {
                        if left {
                            model[which].push_front(v);
                        } else {
                            model[which].push_back(v);
                        }
                    }
                    reply = call(&db, &c, &a);
                    expect = format!(":{}\r\n", model[which].len()).into_bytes();
                }
                2 => {
                    let n = next(20) as usize;
                    let left = next(2) == 0;
                    let name: &[u8] = if left { b"LPOP" } else { b"RPOP" };
                    reply = call(&db, &c, &[name, key, &int(n as i64)]);
                    let popped: Vec<Vec<u8>> = (0..n)
                        .map_while(|_| {
                            if left {
                                model[which].pop_front()
                            } else {
                                model[which].pop_back()
                            }
                        })
                        .collect();
                    expect = if len == 0 {
                        b"*-1\r\n".to_vec()
                    } else {
                        array(popped.iter())
                    };
                }
                3 => {
                    let (a, b) = (next(80) as i64 - 40, next(80) as i64 - 40);
                    reply = call(&db, &c, &[b"LRANGE", key, &int(a), &int(b)]);
                    expect = match clamp(a, b, len) {
                        None => b"*0\r\n".to_vec(),
                        Some((s, e)) => array(model[which].range(s as usize..=e as usize)),
                    };
                }
                4 => {
                    let i = next(60) as i64 - 30;
                    reply = call(&db, &c, &[b"LINDEX", key, &int(i)]);
                    let at = if i < 0 { len + i } else { i };
                    expect = match model[which].get(at as usize).filter(|_| at >= 0) {
                        Some(v) => bulk(v),
                        None => b"$-1\r\n".to_vec(),
                    };
                }
                5 if len > 0 => {
                    let i = next(len as u64) as i64 - if next(2) == 0 { len } else { 0 };
                    let v = element(&mut next);
                    reply = call(&db, &c, &[b"LSET", key, &int(i), &v]);
                    let at = if i < 0 { len + i } else { i };
                    model[which][at as usize] = v;
                    expect = b"+OK\r\n".to_vec();
                }
                6 if len > 0 => {
                    let pivot = model[which][next(len as u64) as usize].clone();
                    let after = next(2) == 0;
                    let v = element(&mut next);
                    let side: &[u8] = if after { b"AFTER" } else { b"BEFORE" };
                    reply = call(&db, &c, &[b"LINSERT", key, side, &pivot, &v]);
                    let at = model[which]
                        .iter()
                        .position(|x| *x == pivot)
                        .expect("a pivot");
                    model[which].insert(at + usize::from(after), v);
                    expect = format!(":{}\r\n", model[which].len()).into_bytes();
                }
                7 => {
                    let v = element(&mut next);
                    let count = next(5) as i64 - 2;
                    reply = call(&db, &c, &[b"LREM", key, &int(count), &v]);
                    let m = &mut model[which];
                    let limit = if count == 0 {
                        usize::MAX
                    } else {
                        count.unsigned_abs() as usize
                    };
                    let mut hits: Vec<usize> = (0..m.len()).filter(|&i| m[i] == v).collect();
                    if count < 0 {
                        hits.reverse();
                    }
                    hits.truncate(limit);
                    hits.sort_unstable();
                    for &i in hits.iter().rev() {
                        m.remove(i);
                    }
                    expect = format!(":{}\r\n", hits.len()).into_bytes();
                }
                8 if next(4) == 0 => {
                    let (a, b) = (next(20) as i64 - 5, next(400) as i64 - 200);
                    reply = call(&db, &c, &[b"LTRIM", key, &int(a), &int(b)]);
                    let m = &mut model[which];
                    match clamp(a, b, len) {
                        None => m.clear(),
                        Some((s, e)) => {
                            m.truncate(e as usize + 1);
                            m.drain(..s as usize);
                        }
                    }
                    expect = b"+OK\r\n".to_vec();
                }
                9 => {
                    let to = next(2) as usize;
                    let (from_left, to_left) = (next(2) == 0, next(2) == 0);
                    let side = |l: bool| -> &[u8] { if l { b"LEFT" } else { b"RIGHT" } };
                    reply = call(
                        &db,
                        &c,
                        &[b"LMOVE", key, keys[to], side(from_left), side(to_left)],
                    );
                    let v = if from_left {
                        model[which].pop_front()
                    } else {
                        model[which].pop_back()
                    };
                    expect = match v {
                        None => b"$-1\r\n".to_vec(),
                        Some(v) => {
                            let out = bulk(&v);
                            if to_left {
                                model[to].push_front(v);
                            } else {
                                model[to].push_back(v);
                            }
                            out
                        }
                    };
                }
                10 => {
                    let v = element(&mut next);
                    reply = call(&db, &c, &[b"LPOS", key, &v, b"RANK", b"-1"]);
                    expect = match model[which].iter().rposition(|x| *x == v) {
                        Some(i) => format!(":{i}\r\n").into_bytes(),
                        None => b"$-1\r\n".to_vec(),
                    };
                }
                _ => {
                    reply = call(&db, &c, &[b"LLEN", key]);
                    expect = format!(":{len}\r\n").into_bytes();
                }
            }
            let name = if which == 0 { "p" } else { "q" };
            if model[which].len() > packed::ITEMS_MAX && !meta(&db, name).packed {
                spread_rounds += 1;
            }
            let reply = reply.unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert!(
                reply == expect,
                "round {round}: {:?} != {:?}",
                String::from_utf8_lossy(&reply[..reply.len().min(200)]),
                String::from_utf8_lossy(&expect[..expect.len().min(200)]),
            );
        }
        assert!(spread_rounds > 1000, "spread in {spread_rounds} rounds");
        let full = call(&db, &c, &[b"LRANGE", b"p", b"0", b"-1"]).expect("LRANGE");
        assert_eq!(full, array(model[0].iter()));
        // COPY and RENAME carry the chunks and the elements kept out of them.
        let values: Vec<Vec<u8>> = (0..300).map(|_| element(&mut next)).collect();
        let mut a: Vec<&[u8]> = vec![b"RPUSH", b"big"];
        a.extend(values.iter().map(Vec::as_slice));
        call(&db, &c, &a).expect("RPUSH");
        assert!(!meta(&db, "big").packed);
        call(&db, &c, &[b"COPY", b"big", b"r"]).expect("COPY");
        call(&db, &c, &[b"RENAME", b"r", b"s"]).expect("RENAME");
        let copied = call(&db, &c, &[b"LRANGE", b"s", b"0", b"-1"]).expect("LRANGE");
        assert_eq!(copied, array(values.iter()));
        call(&db, &c, &[b"DEL", b"big", b"s"]).expect("DEL");
        while crate::reaper::sweep(&db).expect("sweep").full {}
        for key in keys {
            let _ = call(&db, &c, &[b"LTRIM", key, b"1", b"0"]).expect("LTRIM");
        }
        assert_eq!(
            records(&db),
            empty,
            "every chunk and element record went with the lists"
        );
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
