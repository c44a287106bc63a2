//! Hash commands (`HSET`, `HGET`, `HINCRBY`, `HSCAN`, ...), over the layout of
//! `docs/types.md`, in one of two encodings.
//!
//! Packed ([`Fields`]): a small hash lives in its meta record (type code `H`), its fields in
//! the order they were added, as Redis packs a small hash into a listpack. One record per
//! hash instead of one per field plus two: a fifth of the memory for a hash of ten short
//! fields. Every write rewrites the record, so writers of one packed hash conflict. A hash is
//! spread (below) when it outgrows [`FIELDS_MAX`] fields, a field or value outgrows
//! [`ITEM_BYTES_MAX`] bytes or all of them `packed::BYTES_MAX`, and when a write to it
//! follows a conflict on its meta record ([`Ctx::contended`]): a hash that concurrent writers
//! contend for stops conflicting. A hash never goes back from spread to packed (nor does
//! Redis' listpack), until it is deleted.
//!
//! Spread: the meta record holds the hash's generation; each field is its own engine key
//! `FF 'h' gen field`; the size record `FF 'n' gen` is kept with the engine's commutative
//! `add`. A field write reads the meta record (which changes only when the hash is created,
//! deleted, renamed or given a TTL) and the one field, and adds to the size record without
//! reading it: two writers of different fields never conflict. `HINCRBY` reads not even its
//! field's value, only whether it exists (`Txn::exists_for_write`), and adds to it: its
//! writers of one field do not conflict either, unless they create it. Every write adds, 0
//! when it only overwrites fields, so that the size record has a new version whenever the
//! hash changes: that is what `WATCH` of the hash records. Only removing fields (`HDEL`) reads the
//! size, to delete the key with its last field, as Redis does. Deleting or overwriting a whole
//! hash is O(1): its generation goes to the graveyard (`keyspace::drop_meta`).

use std::borrow::Cow;
use std::ops::{Bound, ControlFlow};

use bytes::Bytes;
use keel::Txn;

use crate::data::{
    Ctx, Fail, NOT_FLOAT, REPLY_ITEMS_MAX, SYNTAX, View, int_arg, parse_cursor, random,
    random_count_arg, random_picks, reply_too_big, scan_options,
};
use crate::glob;
use crate::keyspace::{self as ks, HASH_FIELD, Held, Meta, Type, WRONGTYPE, packed};
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

/// The largest packed hash: one more field spreads it.
pub const FIELDS_MAX: usize = packed::ITEMS_MAX;
/// The longest field or value a packed hash holds: a longer one spreads it.
pub const ITEM_BYTES_MAX: usize = packed::ITEM_BYTES_MAX;

/// A packed hash's fields and values, in the order they were added: decoded from (and
/// encoded to) its meta record's value, a sequence of `len (1 byte) field len (1 byte)
/// value`.
pub struct Fields<'a> {
    list: Vec<(&'a [u8], Cow<'a, [u8]>)>,
}

impl<'a> Fields<'a> {
    /// No fields: a hash about to be created.
    fn new() -> Fields<'a> {
        Fields { list: Vec::new() }
    }

    /// Decodes a packed hash's fields; damage is an error.
    pub fn parse(mut bytes: &'a [u8]) -> Result<Fields<'a>, Fail> {
        let mut list = Vec::new();
        while !bytes.is_empty() {
            let field = packed::take(&mut bytes)?;
            let value = packed::take(&mut bytes)?;
            list.push((field, Cow::Borrowed(value)));
        }
        Ok(Fields { list })
    }

    /// How many fields.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Each field and its value, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.list.iter().map(|(f, v)| (*f, &**v))
    }

    fn position(&self, field: &[u8]) -> Option<usize> {
        self.list.iter().position(|(f, _)| *f == field)
    }

    /// The value of `field`.
    pub fn get(&self, field: &[u8]) -> Option<&[u8]> {
        self.position(field).map(|i| &*self.list[i].1)
    }

    /// Sets `field` to `value` (in place, or added last); whether it is new.
    fn set(&mut self, field: &'a [u8], value: Cow<'a, [u8]>) -> bool {
        match self.position(field) {
            Some(i) => {
                self.list[i].1 = value;
                false
            }
            None => {
                self.list.push((field, value));
                true
            }
        }
    }

    /// Removes `field`; whether it was there.
    fn remove(&mut self, field: &[u8]) -> bool {
        match self.position(field) {
            Some(i) => {
                self.list.remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether the fields may stay packed.
    fn fit(&self) -> bool {
        let items = self.list.iter().flat_map(|(f, v)| [*f, &**v]);
        packed::fit(self.list.len(), items)
    }

    fn encode(&self) -> Vec<u8> {
        packed::encode(self.list.iter().flat_map(|(f, v)| [*f, &**v]))
    }
}

/// Writes the hash at `key` (`old`: its meta record; `None`: it is new) with `fields` after a
/// change, packed if they fit and no conflict on the record preceded this attempt, else
/// spread; with no fields left, deletes it.
fn write_packed(
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    key: &[u8],
    old: Option<&Meta>,
    fields: &Fields<'_>,
) -> Result<(), Fail> {
    let contended = ctx.contends(key, old);
    let packed = (fields.fit() && !contended).then(|| fields.encode());
    ks::write_collection(t, key, Type::Hash, old, fields.len(), packed, |t, g| {
        put_fields(t, g, fields)
    })
}

/// Spreads the hash at `key` (`old`: its meta record; `None`: it is new) with `fields` over
/// sub-keys of a new generation; its new meta record.
fn spread(
    t: &mut Txn<'_>,
    key: &[u8],
    old: Option<&Meta>,
    fields: &Fields<'_>,
) -> Result<Meta, Fail> {
    ks::spread_collection(t, key, Type::Hash, old, fields.len(), |t, g| {
        put_fields(t, g, fields)
    })
}

/// Writes `fields` as sub-keys of `generation`.
fn put_fields(t: &mut Txn<'_>, generation: u64, fields: &Fields<'_>) -> Result<(), Fail> {
    for (f, v) in fields.iter() {
        t.put(&ks::sub_key(HASH_FIELD, generation, f), v)?;
    }
    Ok(())
}

/// A hash about to be written: the packed fields to change (of a new hash, or a packed one),
/// or a spread hash's meta record.
enum Target<'m> {
    Packed(Option<&'m Meta>, Fields<'m>),
    Spread(Meta),
}

impl<'m> Target<'m> {
    /// The hash `meta` (`None`: absent, to be created), to be written with `items` (fields
    /// and values): spread at once (in `t`) if they cannot all be packed, so that a large
    /// `HSET` never packs field by field.
    fn of(
        t: &mut Txn<'_>,
        key: &[u8],
        meta: Option<&'m Meta>,
        items: &[Bytes],
    ) -> Result<Target<'m>, Fail> {
        let target = match meta {
            None => Target::Packed(None, Fields::new()),
            Some(m) if m.packed => Target::Packed(Some(m), Fields::parse(&m.value)?),
            Some(m) => return Ok(Target::Spread(m.clone())),
        };
        let fit = items.len() / 2 <= FIELDS_MAX
            && items.iter().all(|a| a.len() <= ITEM_BYTES_MAX)
            && items.iter().map(|a| a.len() + 1).sum::<usize>() <= packed::BYTES_MAX;
        match target {
            Target::Packed(old, fields) if !fit => {
                Ok(Target::Spread(spread(t, key, old, &fields)?))
            }
            target => Ok(target),
        }
    }
}

/// Reads a hash's field: from its packed fields, or its sub-key.
fn read_field<T>(
    view: &mut View<'_, '_>,
    meta: &Meta,
    field: &[u8],
    f: impl FnOnce(Option<&[u8]>) -> T,
) -> Result<T, Fail> {
    if meta.packed {
        return Ok(f(packed::value_of(&meta.value, field)?));
    }
    Ok(view.get_with(&ks::sub_key(HASH_FIELD, meta.generation, field), f)?)
}

/// The number of fields of the hash `meta`.
fn len(view: &mut View<'_, '_>, meta: &Meta) -> Result<i64, Fail> {
    if meta.packed {
        let items = packed::count(&meta.value)?;
        if items % 2 != 0 {
            return Err("ERR keel: damaged packed collection".into());
        }
        return Ok(items as i64 / 2);
    }
    size(view, meta.generation)
}

/// `HINCRBY`'s error for a field value that is not an integer.
const NOT_INTEGER: &str = "ERR hash value is not an integer";

/// `HINCRBY`'s sum.
fn incr_int(current: Option<&[u8]>, delta: i64) -> Result<i64, Fail> {
    let base = match current {
        None => 0,
        Some(v) => string_to_i64(v).ok_or(NOT_INTEGER)?,
    };
    Ok(base
        .checked_add(delta)
        .ok_or("ERR increment or decrement would overflow")?)
}

/// `HINCRBY`'s error for an engine error of its commutative add, which meets the field's
/// value only at commit (or at once, over the transaction's own write of the field).
pub fn incr_error(e: &keel::Error) -> Fail {
    match e {
        keel::Error::NotAnInteger { .. } => NOT_INTEGER.into(),
        other => crate::data::engine_error(other),
    }
}

/// `HINCRBYFLOAT`'s sum, as text.
fn incr_float(current: Option<&[u8]>, incr: &[u8]) -> Result<Vec<u8>, Fail> {
    long_double::add(current, incr).map_err(|e| match e {
        long_double::Error::Current => Fail::from("ERR hash value is not a float"),
        long_double::Error::Incr => NOT_FLOAT.into(),
        long_double::Error::NotFinite => "ERR increment would produce NaN or Infinity".into(),
    })
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

/// A field and its value.
type Pair = (Vec<u8>, Vec<u8>);

/// Every field and value of the hash `meta` (in the order they were added when packed, else
/// in field order), bounded by the reply limits.
fn all_fields(view: &mut View<'_, '_>, ctx: &Ctx<'_>, meta: &Meta) -> Result<Vec<Pair>, Fail> {
    let mut pairs = Vec::new();
    let mut bytes = 0;
    let mut take = |f: &[u8], v: Vec<u8>| {
        bytes += f.len() + v.len() + 32;
        pairs.push((f.to_vec(), v));
        if bytes > ctx.reply_bytes_max || pairs.len() > REPLY_ITEMS_MAX {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    if meta.packed {
        for (f, v) in Fields::parse(&meta.value)?.iter() {
            if take(f, v.to_vec()).is_break() {
                break;
            }
        }
    } else {
        each_field(view, meta.generation, None, take);
    }
    if bytes > ctx.reply_bytes_max || pairs.len() > REPLY_ITEMS_MAX {
        return Err(reply_too_big());
    }
    Ok(pairs)
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
            let meta = find(&mut View::Txn(t), ctx, key)?;
            let mut added = 0;
            match Target::of(t, key, meta.as_ref(), &args[2..])? {
                Target::Packed(old, mut fields) => {
                    for pair in args[2..].chunks(2) {
                        added += i64::from(fields.set(&pair[0], Cow::Borrowed(&pair[1])));
                    }
                    write_packed(t, ctx, key, old, &fields)?;
                }
                Target::Spread(m) => {
                    for pair in args[2..].chunks(2) {
                        added += i64::from(put_field(t, m.generation, &pair[0], &pair[1])?);
                    }
                    // Also when every field was there already (add 0): `WATCH` sees the
                    // overwrite.
                    t.add(&ks::size_key(m.generation), added)?;
                }
            }
            if cmd == Cmd::Hset {
                out.int(added);
            } else {
                out.ok();
            }
        }
        Cmd::Hsetnx => {
            let t = view.txn();
            let meta = find(&mut View::Txn(t), ctx, key)?;
            let added = match Target::of(t, key, meta.as_ref(), &args[2..])? {
                Target::Packed(old, mut fields) => {
                    let added = fields.get(&args[2]).is_none();
                    if added {
                        fields.set(&args[2], Cow::Borrowed(&args[3]));
                        write_packed(t, ctx, key, old, &fields)?;
                    }
                    added
                }
                Target::Spread(m) => {
                    let fk = ks::sub_key(HASH_FIELD, m.generation, &args[2]);
                    let added = !t.get_with(&fk, |v| v.is_some())?;
                    if added {
                        t.put(&fk, &args[3])?;
                        t.add(&ks::size_key(m.generation), 1)?;
                    }
                    added
                }
            };
            out.int(i64::from(added));
        }
        Cmd::Hget => match find(view, ctx, key)? {
            None => out.null(),
            Some(m) => read_field(view, &m, &args[2], |v| out.bulk_or_null(v))?,
        },
        Cmd::Hmget => {
            let meta = find(view, ctx, key)?;
            let packed = match &meta {
                Some(m) if m.packed => Some(Fields::parse(&m.value)?),
                _ => None,
            };
            out.array(args.len() - 2);
            for field in &args[2..] {
                match (&meta, &packed) {
                    (None, _) => out.null(),
                    (Some(_), Some(fields)) => out.bulk_or_null(fields.get(field)),
                    (Some(m), None) => {
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
            let pairs = all_fields(view, ctx, &m)?;
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
            if m.packed {
                let mut fields = Fields::parse(&m.value)?;
                for field in &args[2..] {
                    removed += i64::from(fields.remove(field));
                }
                if removed > 0 {
                    write_packed(t, ctx, key, Some(&m), &fields)?;
                }
                out.int(removed);
                return Ok(());
            }
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
                Some(m) => len(view, &m)?,
            };
            out.int(n);
        }
        Cmd::Hexists => {
            let found = match find(view, ctx, key)? {
                None => false,
                Some(m) => read_field(view, &m, &args[2], |v| v.is_some())?,
            };
            out.int(i64::from(found));
        }
        Cmd::Hstrlen => {
            let len = match find(view, ctx, key)? {
                None => 0,
                Some(m) => read_field(view, &m, &args[2], |v| v.map_or(0, <[u8]>::len))?,
            };
            out.int(len as i64);
        }
        Cmd::Hincrby => {
            let delta = int_arg(&args[3])?;
            let t = view.txn();
            let meta = find(&mut View::Txn(t), ctx, key)?;
            let sum = match Target::of(t, key, meta.as_ref(), &args[2..3])? {
                Target::Packed(old, mut fields) => {
                    let sum = incr_int(fields.get(&args[2]), delta)?;
                    fields.set(&args[2], Cow::Owned(sum.to_string().into_bytes()));
                    write_packed(t, ctx, key, old, &fields)?;
                    sum
                }
                Target::Spread(m) => {
                    let fk = ks::sub_key(HASH_FIELD, m.generation, &args[2]);
                    if ctx.track_increments {
                        // As `INCR`: the commutative add, replying with the value it resolves
                        // to at commit. Whether the field is new (for the size) is the only
                        // thing read, and only its presence is validated, so concurrent
                        // increments of one field do not conflict.
                        let new = !t.exists_for_write(&fk)?;
                        t.add(&fk, delta).map_err(|e| incr_error(&e))?;
                        // 0 for an existing field: `WATCH` sees the overwrite.
                        t.add(&ks::size_key(m.generation), i64::from(new))?;
                        out.tracked(t.track(&fk)?);
                        return Ok(());
                    }
                    let (sum, new) = t.get_with(&fk, |v| (incr_int(v, delta), v.is_none()))?;
                    let sum = sum?;
                    t.put(&fk, sum.to_string().as_bytes())?;
                    // 0 for an existing field: `WATCH` sees the overwrite.
                    t.add(&ks::size_key(m.generation), i64::from(new))?;
                    sum
                }
            };
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
            let meta = find(&mut View::Txn(t), ctx, key)?;
            let text = match Target::of(t, key, meta.as_ref(), &args[2..3])? {
                Target::Packed(old, mut fields) => {
                    let text = incr_float(fields.get(&args[2]), &args[3])?;
                    fields.set(&args[2], Cow::Owned(text.clone()));
                    write_packed(t, ctx, key, old, &fields)?;
                    text
                }
                Target::Spread(m) => {
                    let fk = ks::sub_key(HASH_FIELD, m.generation, &args[2]);
                    let current = t.get(&fk)?;
                    let text = incr_float(current.as_deref(), &args[3])?;
                    t.put(&fk, &text)?;
                    // 0 for an existing field: `WATCH` sees the overwrite.
                    t.add(&ks::size_key(m.generation), i64::from(current.is_none()))?;
                    text
                }
            };
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
    let (visited, next) = if m.packed {
        // Whole, whatever the cursor, as Redis scans a listpack.
        (all_fields(view, ctx, &m)?, 0)
    } else {
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
        (visited, next)
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
        if m.packed {
            let fields = Fields::parse(&m.value)?;
            let pick = random() as usize % fields.len().max(1);
            out.bulk_or_null(fields.iter().nth(pick).map(|(f, _)| f));
            return Ok(());
        }
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
    let all = all_fields(view, ctx, &m)?;
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
