//! Hash commands (`HSET`, `HGET`, `HINCRBY`, `HSCAN`, ...), over the layout of
//! `docs/types.md`: the meta record holds the hash's generation; each field is its own engine
//! key `FF 'h' gen field`; the size record `FF 'n' gen` is kept with the engine's commutative
//! `add`.
//!
//! A field write reads the meta record (which changes only when the hash is created, deleted,
//! renamed or given a TTL) and the one field, and adds to the size record without reading it:
//! two writers of different fields never conflict. Every write adds, 0 when it only overwrites
//! fields, so that the size record has a new version whenever the hash changes: that is what
//! `WATCH` of the hash records. Only removing fields (`HDEL`) reads the size, to delete the key
//! with its last field, as Redis does. Deleting or overwriting a whole hash is O(1): its
//! generation goes to the graveyard (`keyspace::drop_meta`).

use std::ops::{Bound, ControlFlow};

use bytes::Bytes;
use keel::Txn;

use crate::data::{
    Ctx, Fail, NOT_FLOAT, REPLY_ITEMS_MAX, SYNTAX, View, int_arg, parse_cursor, random,
    random_count_arg, random_picks, reply_too_big, scan_options,
};
use crate::glob;
use crate::keyspace::{self as ks, HASH_FIELD, Held, Meta, Type, WRONGTYPE};
use crate::long_double;
use crate::reply::{Out, Proto};
use crate::resp::string_to_i64;
use crate::table::Cmd;

/// A hash of at most this many fields is returned whole by one `HSCAN`, with cursor 0, as
/// Redis does for a small (listpack-encoded) hash.
pub const HSCAN_WHOLE_FIELDS_MAX: u64 = 128;

/// Whether this module runs `cmd`.
pub fn handles(cmd: Cmd) -> bool {
    is_read_only(cmd)
        || matches!(
            cmd,
            Cmd::Hset | Cmd::Hsetnx | Cmd::Hmset | Cmd::Hdel | Cmd::Hincrby | Cmd::Hincrbyfloat
        )
}

/// Whether `cmd` is a hash command that only reads.
pub fn is_read_only(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Hget
            | Cmd::Hmget
            | Cmd::Hgetall
            | Cmd::Hlen
            | Cmd::Hexists
            | Cmd::Hkeys
            | Cmd::Hvals
            | Cmd::Hstrlen
            | Cmd::Hscan
            | Cmd::Hrandfield
    )
}

/// The hash at `key`: `None` if absent, `WRONGTYPE` if it holds something else.
fn find(view: &mut View<'_, '_>, ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<Meta>, Fail> {
    match ks::lookup(view, &ctx.clock, key, false)? {
        Held::Absent => Ok(None),
        Held::Meta(m) if m.ty == Type::Hash => Ok(Some(m)),
        _ => Err(WRONGTYPE.into()),
    }
}

/// The hash at `key` for a write: the existing one, or a new one (created in `t`, with an
/// absent size record, so that the first `add` sets it). Whether it is new.
fn find_or_create(t: &mut Txn<'_>, ctx: &Ctx<'_>, key: &[u8]) -> Result<Meta, Fail> {
    if let Some(m) = find(&mut View::Txn(t), ctx, key)? {
        return Ok(m);
    }
    let meta = Meta::collection(Type::Hash);
    ks::put_meta(t, key, &meta, 0)?;
    Ok(meta)
}

/// The number of fields (the size record).
fn size(view: &mut View<'_, '_>, generation: u64) -> Result<i64, Fail> {
    let n = view.get_with(&ks::size_key(generation), |v| v.map(string_to_i64))?;
    match n {
        None => Ok(0),
        Some(Some(n)) => Ok(n),
        Some(None) => Err("ERR keel: damaged collection size record".into()),
    }
}

/// Writes `field` = `value`; whether the field is new (the caller adds it to the size).
fn put_field(t: &mut Txn<'_>, generation: u64, field: &[u8], value: &[u8]) -> Result<bool, Fail> {
    let fk = ks::sub_key(HASH_FIELD, generation, field);
    let existed = t.get_with(&fk, |v| v.is_some())?;
    t.put(&fk, value)?;
    Ok(!existed)
}

/// Calls `f` on each field and value of the hash, in field order, until it says stop.
fn each_field(
    view: &mut View<'_, '_>,
    generation: u64,
    after: Option<&[u8]>,
    mut f: impl FnMut(&[u8], Vec<u8>) -> ControlFlow<()>,
) {
    let prefix = ks::sub_prefix(HASH_FIELD, generation);
    let (lo, hi) = ks::prefix_range(&prefix);
    let lo = match after {
        Some(field) => Bound::Excluded(ks::sub_key(HASH_FIELD, generation, field).to_vec()),
        None => lo,
    };
    view.range(lo, hi, false, |k, v| f(&k[prefix.len()..], v.to_vec()));
}

/// Runs one hash command (see [`handles`]).
pub fn run(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let key = &args[1];
    match cmd {
        Cmd::Hset | Cmd::Hmset => {
            if !args.len().is_multiple_of(2) {
                let name = if cmd == Cmd::Hset { "hset" } else { "hmset" };
                return Err(format!("ERR wrong number of arguments for '{name}' command").into());
            }
            let t = view.txn();
            let meta = find_or_create(t, ctx, key)?;
            let mut added = 0;
            for pair in args[2..].chunks(2) {
                added += i64::from(put_field(t, meta.generation, &pair[0], &pair[1])?);
            }
            // Also when every field was there already (add 0): `WATCH` sees the overwrite.
            t.add(&ks::size_key(meta.generation), added)?;
            if cmd == Cmd::Hset {
                out.int(added);
            } else {
                out.ok();
            }
        }
        Cmd::Hsetnx => {
            let t = view.txn();
            let meta = find_or_create(t, ctx, key)?;
            let fk = ks::sub_key(HASH_FIELD, meta.generation, &args[2]);
            if t.get_with(&fk, |v| v.is_some())? {
                out.int(0);
            } else {
                t.put(&fk, &args[3])?;
                t.add(&ks::size_key(meta.generation), 1)?;
                out.int(1);
            }
        }
        Cmd::Hget => match find(view, ctx, key)? {
            None => out.null(),
            Some(m) => {
                let fk = ks::sub_key(HASH_FIELD, m.generation, &args[2]);
                view.get_with(&fk, |v| out.bulk_or_null(v))?;
            }
        },
        Cmd::Hmget => {
            let meta = find(view, ctx, key)?;
            out.array(args.len() - 2);
            for field in &args[2..] {
                match &meta {
                    None => out.null(),
                    Some(m) => {
                        let fk = ks::sub_key(HASH_FIELD, m.generation, field);
                        view.get_with(&fk, |v| out.bulk_or_null(v))?;
                    }
                }
                if out.buf.len() > ctx.reply_bytes_max {
                    return Err(reply_too_big());
                }
            }
        }
        Cmd::Hgetall | Cmd::Hkeys | Cmd::Hvals => {
            let Some(m) = find(view, ctx, key)? else {
                match cmd {
                    Cmd::Hgetall => out.map(0),
                    _ => out.array(0),
                }
                return Ok(());
            };
            let mut pairs = Vec::new();
            let mut bytes = 0;
            each_field(view, m.generation, None, |f, v| {
                bytes += f.len() + v.len() + 32;
                pairs.push((f.to_vec(), v));
                if bytes > ctx.reply_bytes_max || pairs.len() > REPLY_ITEMS_MAX {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
            if bytes > ctx.reply_bytes_max || pairs.len() > REPLY_ITEMS_MAX {
                return Err(reply_too_big());
            }
            match cmd {
                Cmd::Hgetall => out.map(pairs.len()),
                _ => out.array(pairs.len()),
            }
            for (f, v) in &pairs {
                if cmd != Cmd::Hvals {
                    out.bulk(f);
                }
                if cmd != Cmd::Hkeys {
                    out.bulk(v);
                }
            }
        }
        Cmd::Hdel => {
            let t = view.txn();
            let Some(m) = find(&mut View::Txn(t), ctx, key)? else {
                out.int(0);
                return Ok(());
            };
            let mut removed = 0;
            for field in &args[2..] {
                let fk = ks::sub_key(HASH_FIELD, m.generation, field);
                if t.get_with(&fk, |v| v.is_some())? {
                    t.delete(&fk)?;
                    removed += 1;
                }
            }
            if removed > 0 {
                let left = size(&mut View::Txn(t), m.generation)? - removed;
                if left <= 0 {
                    // The last field went: the key goes, with nothing left to sweep.
                    t.delete(&ks::meta_key(key))?;
                    t.delete(&ks::size_key(m.generation))?;
                    if m.deadline != 0 {
                        t.delete(&ks::expiry_key(m.deadline, key))?;
                    }
                } else {
                    t.put(&ks::size_key(m.generation), left.to_string().as_bytes())?;
                }
            }
            out.int(removed);
        }
        Cmd::Hlen => {
            let n = match find(view, ctx, key)? {
                None => 0,
                Some(m) => size(view, m.generation)?,
            };
            out.int(n);
        }
        Cmd::Hexists => {
            let found = match find(view, ctx, key)? {
                None => false,
                Some(m) => view
                    .get_with(&ks::sub_key(HASH_FIELD, m.generation, &args[2]), |v| {
                        v.is_some()
                    })?,
            };
            out.int(i64::from(found));
        }
        Cmd::Hstrlen => {
            let len = match find(view, ctx, key)? {
                None => 0,
                Some(m) => view
                    .get_with(&ks::sub_key(HASH_FIELD, m.generation, &args[2]), |v| {
                        v.map_or(0, <[u8]>::len)
                    })?,
            };
            out.int(len as i64);
        }
        Cmd::Hincrby => {
            let delta = int_arg(&args[3])?;
            let t = view.txn();
            let meta = find_or_create(t, ctx, key)?;
            let fk = ks::sub_key(HASH_FIELD, meta.generation, &args[2]);
            let current = t.get_with(&fk, |v| v.map(string_to_i64))?;
            let base = match current {
                None => 0,
                Some(Some(n)) => n,
                Some(None) => return Err("ERR hash value is not an integer".into()),
            };
            let sum = base
                .checked_add(delta)
                .ok_or("ERR increment or decrement would overflow")?;
            t.put(&fk, sum.to_string().as_bytes())?;
            // 0 for an existing field: `WATCH` sees the overwrite.
            t.add(&ks::size_key(meta.generation), i64::from(current.is_none()))?;
            out.int(sum);
        }
        Cmd::Hincrbyfloat => {
            // In C's long double, as Redis adds (see `long_double`); the increment is checked
            // before the key's type, as in Redis.
            match long_double::is_infinite(&args[3]) {
                None => return Err(NOT_FLOAT.into()),
                Some(true) => return Err("ERR value is NaN or Infinity".into()),
                Some(false) => {}
            }
            let t = view.txn();
            let meta = find_or_create(t, ctx, key)?;
            let fk = ks::sub_key(HASH_FIELD, meta.generation, &args[2]);
            let current = t.get(&fk)?;
            let text = long_double::add(current.as_deref(), &args[3]).map_err(|e| match e {
                long_double::Error::Current => Fail::from("ERR hash value is not a float"),
                long_double::Error::Incr => NOT_FLOAT.into(),
                long_double::Error::NotFinite => {
                    "ERR increment would produce NaN or Infinity".into()
                }
            })?;
            t.put(&fk, &text)?;
            // 0 for an existing field: `WATCH` sees the overwrite.
            t.add(&ks::size_key(meta.generation), i64::from(current.is_none()))?;
            out.bulk(&text);
        }
        Cmd::Hscan => hscan(args, view, ctx, out)?,
        Cmd::Hrandfield => hrandfield(args, view, ctx, out)?,
        other => panic!("{other:?} is not a hash command"),
    }
    Ok(())
}

/// `HSCAN key cursor [MATCH pattern] [COUNT count]`.
fn hscan(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let cursor = parse_cursor(&args[2])?;
    // As in Redis: the key and its type before the options.
    let Some(m) = find(view, ctx, &args[1])? else {
        out.array(2);
        out.bulk(b"0");
        out.array(0);
        return Ok(());
    };
    let (pattern, mut count) = scan_options(args)?;
    let after = ctx.cursors.resume(cursor)?;
    if cursor == 0 && size(view, m.generation)? as u64 <= HSCAN_WHOLE_FIELDS_MAX {
        count = HSCAN_WHOLE_FIELDS_MAX as usize + 1;
    }
    let mut visited = Vec::new();
    let mut bytes = 0;
    each_field(view, m.generation, after.as_deref(), |f, v| {
        bytes += f.len() + v.len() + 32;
        visited.push((f.to_vec(), v));
        if visited.len() >= count || bytes > ctx.reply_bytes_max {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    if bytes > ctx.reply_bytes_max {
        return Err(reply_too_big());
    }
    let next = match visited.last() {
        Some((last, _)) if visited.len() == count => ctx.cursors.save(last.clone()),
        _ => 0,
    };
    let hits: Vec<_> = visited
        .iter()
        .filter(|(f, _)| pattern.is_none_or(|p| glob::matches(p, f)))
        .collect();
    out.array(2);
    out.bulk(next.to_string().as_bytes());
    out.array(hits.len() * 2);
    for (f, v) in hits {
        out.bulk(f);
        out.bulk(v);
    }
    Ok(())
}

/// `HRANDFIELD key [count [WITHVALUES]]`.
fn hrandfield(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let count = random_count_arg(args.get(2))?;
    let withvalues = match args.get(3) {
        None => false,
        Some(a) if args.len() == 4 && a.eq_ignore_ascii_case(b"withvalues") => true,
        Some(_) => return Err(SYNTAX.into()),
    };
    if args.len() > 4 {
        return Err(SYNTAX.into());
    }
    if withvalues && count.is_some_and(|n| !(-(i64::MAX / 2)..=i64::MAX / 2).contains(&n)) {
        return Err("ERR value is out of range".into());
    }
    let meta = find(view, ctx, &args[1])?;
    let Some(count) = count else {
        let Some(m) = meta else {
            out.null();
            return Ok(());
        };
        let n = size(view, m.generation)?;
        let pick = if n > 0 { random() % n as u64 } else { 0 };
        let mut i = 0;
        let mut chosen = None;
        each_field(view, m.generation, None, |f, _| {
            if i == pick {
                chosen = Some(f.to_vec());
                return ControlFlow::Break(());
            }
            i += 1;
            ControlFlow::Continue(())
        });
        out.bulk_or_null(chosen.as_deref());
        return Ok(());
    };
    let Some(m) = meta.filter(|_| count != 0) else {
        out.array(0);
        return Ok(());
    };
    // Read the hash (bounded by the reply limit), then pick from it.
    let mut all = Vec::new();
    let mut bytes = 0;
    each_field(view, m.generation, None, |f, v| {
        bytes += f.len() + v.len() + 32;
        all.push((f.to_vec(), v));
        if bytes > ctx.reply_bytes_max || all.len() > REPLY_ITEMS_MAX {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    if bytes > ctx.reply_bytes_max || all.len() > REPLY_ITEMS_MAX {
        return Err(reply_too_big());
    }
    if all.is_empty() {
        // Not left by any command (the last field's HDEL deletes the key), but no reason to
        // divide by zero below.
        out.array(0);
        return Ok(());
    }
    let picked = random_picks(all.len(), count)?;
    let per = picked.iter().map(|&i| all[i].0.len() + all[i].1.len() + 32);
    if per.sum::<usize>() > ctx.reply_bytes_max {
        return Err(reply_too_big());
    }
    if withvalues && out.proto == Proto::Resp3 {
        out.array(picked.len());
        for &i in &picked {
            out.array(2);
            out.bulk(&all[i].0);
            out.bulk(&all[i].1);
        }
    } else {
        out.array(picked.len() * if withvalues { 2 } else { 1 });
        for &i in &picked {
            out.bulk(&all[i].0);
            if withvalues {
                out.bulk(&all[i].1);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
