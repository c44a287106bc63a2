//! Set commands (`SADD`, `SREM`, `SINTER`, `SPOP`, `SSCAN`, ...), over the layout of
//! `docs/types.md`, in one of two encodings.
//!
//! Packed: a small set lives in its meta record (type code `T`), its members in the order they
//! were added, within the limits of `keyspace::packed` (as hashes and lists). Every write
//! rewrites the record, so writers of one packed set conflict; a write that would outgrow the
//! limits, or that follows a conflict on the record (`Ctx::contended`), spreads it.
//!
//! Spread: the meta record holds the set's generation; each member is its own engine
//! key `FF 's' gen member` with an empty value; the size record `FF 'n' gen` is kept with the
//! engine's commutative `add`.
//!
//! Adding a member reads the meta record and the member's key and adds to the size without
//! reading it: two clients adding different members never conflict. Removing members (`SREM`,
//! `SMOVE`) reads the size, to delete the key with its last member as Redis does; `SPOP`
//! reads it only when it may take the last member (below).
//! Deleting or overwriting a whole set is O(1) (its generation goes to the graveyard), and so
//! is `SPOP` of every member.
//!
//! Costs: `SPOP`/`SRANDMEMBER` without a count read the first and the last member and the one
//! picked (a uniform pick needs a position, and there is no positional index: one would be a
//! structure to keep in step with every write); with a count they read every member, O(n),
//! bounded by the reply limits. A pop that leaves members behind (it read two, or all of them)
//! takes its members off the size record with the commutative add, without reading it. `SINTER`
//! walks the smallest set and looks each member up in the others.
//!
//! Helpers shared with the sorted sets (`zsets`) live here too: finding a collection of a
//! type, its size, shrinking it, random numbers and `SCAN`-style cursors.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use bytes::Bytes;
use keel::Txn;

use crate::data::{Ctx, Fail, REPLY_ITEMS_MAX, SYNTAX, View};
use crate::data::{
    distinct_picks, parse_cursor, random, random_count_arg, random_picks, reply_too_big,
    scan_options,
};
use crate::glob;
use crate::keyspace::{self as ks, Held, Meta, SET_MEMBER, Type, WRONGTYPE, packed};
use crate::reply::Out;
use crate::resp::string_to_i64;
use crate::table::Cmd;

/// A set of at most this many members is returned whole by one `SSCAN`, with cursor 0, as
/// Redis does for a small (listpack-encoded) set.
pub const SSCAN_WHOLE_MEMBERS_MAX: u64 = 128;

/// Whether this module runs `cmd`.
pub fn handles(cmd: Cmd) -> bool {
    is_read_only(cmd)
        || matches!(
            cmd,
            Cmd::Sadd
                | Cmd::Srem
                | Cmd::Spop
                | Cmd::Smove
                | Cmd::Sinterstore
                | Cmd::Sunionstore
                | Cmd::Sdiffstore
        )
}

/// Whether `cmd` is a set command that only reads.
pub fn is_read_only(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Smembers
            | Cmd::Sismember
            | Cmd::Smismember
            | Cmd::Scard
            | Cmd::Srandmember
            | Cmd::Sinter
            | Cmd::Sunion
            | Cmd::Sdiff
            | Cmd::Sintercard
            | Cmd::Sscan
    )
}

/// The collection of type `ty` at `key`: `None` if absent, `WRONGTYPE` if it holds something
/// else.
pub fn find_typed(
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    key: &[u8],
    ty: Type,
) -> Result<Option<Meta>, Fail> {
    match ks::lookup(view, &ctx.clock, key, false)? {
        Held::Absent => Ok(None),
        Held::Meta(m) if m.ty == ty => Ok(Some(m)),
        _ => Err(WRONGTYPE.into()),
    }
}

/// A collection's number of members (its size record).
pub fn size(view: &mut View<'_, '_>, generation: u64) -> Result<i64, Fail> {
    let n = view.get_with(&ks::size_key(generation), |v| v.map(string_to_i64))?;
    match n {
        None => Ok(0),
        Some(Some(n)) => Ok(n),
        Some(None) => Err("ERR keel: damaged collection size record".into()),
    }
}

/// Accounts for `removed` members deleted from the collection `meta` at `key`: the key goes
/// with its last member (with nothing left to sweep), else the size record is rewritten.
pub fn shrink(t: &mut Txn<'_>, key: &[u8], meta: &Meta, removed: i64) -> Result<(), Fail> {
    if removed == 0 {
        return Ok(());
    }
    let left = size(&mut View::Txn(t), meta.generation)? - removed;
    if left <= 0 {
        t.delete(&ks::meta_key(key))?;
        t.delete(&ks::size_key(meta.generation))?;
        if meta.deadline != 0 {
            t.delete(&ks::expiry_key(meta.deadline, key))?;
        }
    } else {
        t.put(&ks::size_key(meta.generation), left.to_string().as_bytes())?;
    }
    Ok(())
}

/// Replaces whatever `key` holds by a new, empty collection of type `ty` (no TTL), as the
/// `...STORE` commands do; `None` (and the key deleted) when it is to stay empty.
pub fn replace(
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    key: &[u8],
    ty: Type,
    empty: bool,
) -> Result<Option<Meta>, Fail> {
    let held = ks::lookup(&mut View::Txn(t), &ctx.clock, key, false)?;
    ks::delete(t, key, &held)?;
    if empty {
        return Ok(None);
    }
    let meta = Meta::collection(ty);
    ks::put_meta(t, key, &meta, 0)?;
    Ok(Some(meta))
}

fn member_key(generation: u64, member: &[u8]) -> ks::KeyBuf {
    ks::sub_key(SET_MEMBER, generation, member)
}

/// Whether `member` is in the set `meta`.
pub fn is_member(view: &mut View<'_, '_>, meta: &Meta, member: &[u8]) -> Result<bool, Fail> {
    if meta.packed {
        return packed::contains(&meta.value, member);
    }
    Ok(view.get_with(&member_key(meta.generation, member), |v| v.is_some())?)
}

/// The number of members of the set `meta`.
pub fn set_len(view: &mut View<'_, '_>, meta: &Meta) -> Result<i64, Fail> {
    if meta.packed {
        return Ok(packed::count(&meta.value)? as i64);
    }
    size(view, meta.generation)
}

/// Writes the set at `key` (`old`: its meta record; `None`: it is new) with `members` after a
/// change: packed if they fit and no conflict on the record preceded this attempt, else spread
/// under a new generation; with no members left, deletes it.
fn write_packed(
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    key: &[u8],
    old: Option<&Meta>,
    members: &[&[u8]],
) -> Result<(), Fail> {
    let contended = ctx.contends(key, old);
    let fit = packed::fit(members.len(), members.iter().copied());
    let items = (fit && !contended).then(|| packed::encode(members.iter().copied()));
    ks::write_collection(t, key, Type::Set, old, members.len(), items, |t, g| {
        put_members(t, g, members)
    })
}

/// Spreads the set at `key` (`old`: its meta record; `None`: it is new) with `members` over
/// sub-keys of a new generation; its new meta record.
fn spread(
    t: &mut Txn<'_>,
    key: &[u8],
    old: Option<&Meta>,
    members: &[&[u8]],
) -> Result<Meta, Fail> {
    ks::spread_collection(t, key, Type::Set, old, members.len(), |t, g| {
        put_members(t, g, members)
    })
}

/// Writes `members` as sub-keys of `generation`.
fn put_members(t: &mut Txn<'_>, generation: u64, members: &[&[u8]]) -> Result<(), Fail> {
    for m in members {
        t.put(&member_key(generation, m), &[])?;
    }
    Ok(())
}

/// Adds `members` to the set `meta` at `key` (`None`: creates it, unless none is added); how
/// many were not there. Adding only members it has writes nothing (not a change to Redis).
fn add_members(
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    key: &[u8],
    meta: Option<&Meta>,
    members: &[&[u8]],
) -> Result<i64, Fail> {
    let packed_now = meta.is_none_or(|m| m.packed);
    if packed_now && members.len() <= packed::ITEMS_MAX {
        let mut all = match meta {
            Some(m) => packed::items(&m.value)?,
            None => Vec::new(),
        };
        let mut added = 0;
        for &m in members {
            if !all.contains(&m) {
                all.push(m);
                added += 1;
            }
        }
        if added > 0 {
            write_packed(t, ctx, key, meta, &all)?;
        }
        return Ok(added);
    }
    // Spread, or to be spread at once: too many members to add one by one to a packed list.
    let spread = match meta {
        Some(m) if !m.packed => m.clone(),
        Some(m) => spread(t, key, meta, &packed::items(&m.value)?)?,
        None => spread(t, key, None, &[])?,
    };
    let mut added = 0;
    for m in members {
        let mk = member_key(spread.generation, m);
        if !t.get_with(&mk, |v| v.is_some())? {
            t.put(&mk, &[])?;
            added += 1;
        }
    }
    if added > 0 {
        t.add(&ks::size_key(spread.generation), added)?;
    }
    Ok(added)
}

/// Removes `members` from the set `meta` at `key`, deleting the key with its last member; how
/// many were there.
fn remove_members(
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    key: &[u8],
    meta: &Meta,
    members: &[&[u8]],
) -> Result<i64, Fail> {
    if meta.packed {
        let mut all = packed::items(&meta.value)?;
        let before = all.len();
        all.retain(|m| !members.contains(m));
        let removed = (before - all.len()) as i64;
        if removed > 0 {
            write_packed(t, ctx, key, Some(meta), &all)?;
        }
        return Ok(removed);
    }
    let mut removed = 0;
    for m in members {
        let mk = member_key(meta.generation, m);
        if t.get_with(&mk, |v| v.is_some())? {
            t.delete(&mk)?;
            removed += 1;
        }
    }
    shrink(t, key, meta, removed)?;
    Ok(removed)
}

/// Calls `f` on each member, in byte order, after `after` if given, until it says stop.
fn each_member(
    view: &mut View<'_, '_>,
    generation: u64,
    after: Option<&[u8]>,
    mut f: impl FnMut(&[u8]) -> ControlFlow<()>,
) {
    let prefix = ks::sub_prefix(SET_MEMBER, generation);
    let (lo, hi) = ks::prefix_range(&prefix);
    let lo = match after {
        Some(m) => std::ops::Bound::Excluded(member_key(generation, m).to_vec()),
        None => lo,
    };
    view.range(lo, hi, false, |k, _| f(&k[prefix.len()..]));
}

/// A member [`random_member`] picked, and whether it is the set's only one.
struct Pick {
    member: Vec<u8>,
    alone: bool,
}

/// One member, picked at random in O(log n) without reading the set: a descent of the
/// store's ordered index drawn at random within the set's members
/// ([`keel::Txn::sample_key`]) gives a key, and the pick is the first member at or after it
/// (after the last member, the first). A member under a fuller part of the index comes up
/// somewhat more often than one under an emptier part: random, not uniform (Redis's own
/// `SPOP` is not uniform either).
///
/// Any member is a correct pick, so the ranges walked for it are not checked at commit
/// ([`View::range_unchecked`]); the pick is read, checked, and, for a pop (`popping`), so
/// is a second member (the next one, or the first when the pick is the last) unless the
/// pick is `alone`: while that one stays, a pop of the pick leaves the set non-empty. A pop
/// checks the members as its scan meets them ([`View::range_read`]), not by reading each
/// again.
/// Concurrent pops of a large set then conflict only when they pick the same member or its
/// neighbour, and a member added anywhere meanwhile conflicts with none of them.
fn random_member(
    view: &mut View<'_, '_>,
    generation: u64,
    popping: bool,
) -> Result<Option<Pick>, Fail> {
    use std::ops::Bound;
    let prefix = ks::sub_prefix(SET_MEMBER, generation);
    let (lo, hi) = ks::prefix_range(&prefix);
    let start = view.sample_key(bound_ref(&lo), bound_ref(&hi));
    // Up to two members from `from` on, or from the first if the draw found none. A pop
    // reads both as it scans (the commit checks neither changed); a pick that is not a pop
    // reads only the member it picks, below.
    let two_from = |view: &mut View<'_, '_>, from: Bound<Vec<u8>>| -> Result<_, Fail> {
        let mut found: Vec<Vec<u8>> = Vec::with_capacity(2);
        let mut take = |k: &[u8], _: &[u8]| {
            found.push(k[prefix.len()..].to_vec());
            if found.len() == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        if popping {
            view.range_read(from, hi.clone(), false, &mut take)?;
        } else {
            view.range_unchecked(from, hi.clone(), false, &mut take);
        }
        Ok(found)
    };
    let mut found = match start {
        Some(key) => two_from(view, Bound::Included(key))?,
        None => Vec::new(),
    };
    if found.len() < 2 {
        // Past the last member: the first ones follow it.
        for m in two_from(view, lo)? {
            if found.len() < 2 && !found.contains(&m) {
                found.push(m);
            }
        }
    }
    let mut found = found.into_iter();
    let Some(member) = found.next() else {
        return Ok(None);
    };
    if !popping {
        confirm(view, generation, &member)?;
    }
    Ok(Some(Pick {
        member,
        alone: found.next().is_none(),
    }))
}

/// `b` borrowed.
fn bound_ref(b: &std::ops::Bound<Vec<u8>>) -> std::ops::Bound<&[u8]> {
    b.as_ref().map(Vec::as_slice)
}

/// A checked read of `member`, which an unchecked range found in the set: the commit fails
/// unless it is still there (a snapshot, whose reads nobody checks, skips it).
fn confirm(view: &mut View<'_, '_>, generation: u64, member: &[u8]) -> Result<(), Fail> {
    if view.checks_reads() {
        let there = view.get_with(&member_key(generation, member), |v| v.is_some())?;
        debug_assert!(
            there,
            "an unchecked range found the member at the same snapshot"
        );
    }
    Ok(())
}

/// Every member (in the order added when packed, else in byte order); fails past the reply
/// limits (the result is built in memory).
pub fn members(view: &mut View<'_, '_>, ctx: &Ctx<'_>, meta: &Meta) -> Result<Vec<Vec<u8>>, Fail> {
    if meta.packed {
        // At most `packed::BYTES_MAX` bytes: within any reply limit.
        return Ok(packed::items(&meta.value)?
            .into_iter()
            .map(<[u8]>::to_vec)
            .collect());
    }
    let mut all = Vec::new();
    let mut bytes = 0;
    let mut over = false;
    each_member(view, meta.generation, None, |m| {
        bytes += m.len() + 16;
        all.push(m.to_vec());
        over = bytes > ctx.reply_bytes_max || all.len() > REPLY_ITEMS_MAX;
        if over {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    if over {
        return Err(reply_too_big());
    }
    Ok(all)
}

/// The error for a set that has no member to pick.
fn empty_set() -> Fail {
    "ERR keel: a set with a size record but no members".into()
}

/// Writes a set reply (an array in RESP2).
fn reply_set<'m>(out: &mut Out<'_>, members: impl ExactSizeIterator<Item = &'m Vec<u8>>) {
    out.set(members.len());
    for m in members {
        out.bulk(m);
    }
}

/// Runs one set command (see [`handles`]).
pub fn run(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let key = &args[1];
    match cmd {
        Cmd::Sadd => {
            let t = view.txn();
            let meta = find_typed(&mut View::Txn(t), ctx, key, Type::Set)?;
            let members: Vec<&[u8]> = args[2..].iter().map(|m| &m[..]).collect();
            out.int(add_members(t, ctx, key, meta.as_ref(), &members)?);
        }
        Cmd::Srem => {
            let t = view.txn();
            let Some(meta) = find_typed(&mut View::Txn(t), ctx, key, Type::Set)? else {
                out.int(0);
                return Ok(());
            };
            let members: Vec<&[u8]> = args[2..].iter().map(|m| &m[..]).collect();
            out.int(remove_members(t, ctx, key, &meta, &members)?);
        }
        Cmd::Smembers => match find_typed(view, ctx, key, Type::Set)? {
            None => out.set(0),
            Some(m) => {
                let all = members(view, ctx, &m)?;
                reply_set(out, all.iter());
            }
        },
        Cmd::Sismember => {
            let found = match find_typed(view, ctx, key, Type::Set)? {
                None => false,
                Some(m) => is_member(view, &m, &args[2])?,
            };
            out.int(i64::from(found));
        }
        Cmd::Smismember => {
            let meta = find_typed(view, ctx, key, Type::Set)?;
            out.array(args.len() - 2);
            for m in &args[2..] {
                let found = match &meta {
                    None => false,
                    Some(meta) => is_member(view, meta, m)?,
                };
                out.int(i64::from(found));
            }
        }
        Cmd::Scard => {
            let n = match find_typed(view, ctx, key, Type::Set)? {
                None => 0,
                Some(m) => set_len(view, &m)?,
            };
            out.int(n);
        }
        Cmd::Spop => spop(args, view.txn(), ctx, out)?,
        Cmd::Srandmember => srandmember(args, view, ctx, out)?,
        Cmd::Smove => smove(args, view.txn(), ctx, out)?,
        Cmd::Sinter | Cmd::Sunion | Cmd::Sdiff => {
            let result = combine(cmd, &args[1..], view, ctx, usize::MAX)?;
            reply_set(out, result.iter());
        }
        Cmd::Sinterstore | Cmd::Sunionstore | Cmd::Sdiffstore => {
            let op = match cmd {
                Cmd::Sinterstore => Cmd::Sinter,
                Cmd::Sunionstore => Cmd::Sunion,
                _ => Cmd::Sdiff,
            };
            let t = view.txn();
            let result = combine(op, &args[2..], &mut View::Txn(t), ctx, usize::MAX)?;
            // The destination goes (whatever it held), and the result is written anew.
            replace(t, ctx, key, Type::Set, true)?;
            let members: Vec<&[u8]> = result.iter().map(Vec::as_slice).collect();
            add_members(t, ctx, key, None, &members)?;
            out.int(result.len() as i64);
        }
        Cmd::Sintercard => sintercard(args, view, ctx, out)?,
        Cmd::Sscan => sscan(args, view, ctx, out)?,
        other => panic!("{other:?} is not a set command"),
    }
    Ok(())
}

/// The members of `SINTER`/`SUNION`/`SDIFF` (`op`) of `keys`, at most `limit` of them (for
/// `SINTERCARD`). Every key's type is checked first, as Redis does; a missing key is an
/// empty set.
fn combine(
    op: Cmd,
    keys: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    limit: usize,
) -> Result<BTreeSet<Vec<u8>>, Fail> {
    let mut sets = Vec::with_capacity(keys.len());
    for key in keys {
        sets.push(find_typed(view, ctx, key, Type::Set)?);
    }
    let mut result = BTreeSet::new();
    let mut bytes = 0usize;
    let mut keep = |result: &mut BTreeSet<Vec<u8>>, m: &[u8]| -> Result<bool, Fail> {
        if result.insert(m.to_vec()) {
            bytes += m.len() + 16;
            if bytes > ctx.reply_bytes_max || result.len() > REPLY_ITEMS_MAX {
                return Err(reply_too_big());
            }
        }
        Ok(result.len() < limit)
    };
    match op {
        Cmd::Sinter => {
            if sets.iter().any(Option::is_none) {
                return Ok(result);
            }
            let mut by_size = Vec::with_capacity(sets.len());
            for m in sets.iter().flatten() {
                by_size.push((set_len(view, m)?, m));
            }
            by_size.sort_unstable_by_key(|&(n, _)| n);
            let (_, smallest) = by_size[0];
            for m in members(view, ctx, smallest)? {
                let mut everywhere = true;
                for &(_, other) in &by_size[1..] {
                    if !is_member(view, other, &m)? {
                        everywhere = false;
                        break;
                    }
                }
                if everywhere && !keep(&mut result, &m)? {
                    break;
                }
            }
        }
        Cmd::Sunion => {
            for m in sets.iter().flatten() {
                for member in members(view, ctx, m)? {
                    keep(&mut result, &member)?;
                }
            }
        }
        _ => {
            let Some(Some(first)) = sets.first() else {
                return Ok(result);
            };
            let others: Vec<&Meta> = sets[1..].iter().flatten().collect();
            for m in members(view, ctx, first)? {
                let mut elsewhere = false;
                for &other in &others {
                    if is_member(view, other, &m)? {
                        elsewhere = true;
                        break;
                    }
                }
                if !elsewhere {
                    keep(&mut result, &m)?;
                }
            }
        }
    }
    Ok(result)
}

/// `SINTERCARD numkeys key [key ...] [LIMIT limit]`.
fn sintercard(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let numkeys = string_to_i64(&args[1])
        .filter(|&n| n >= 1)
        .ok_or("ERR numkeys should be greater than 0")?;
    if numkeys > (args.len() - 2) as i64 {
        return Err("ERR Number of keys can't be greater than number of args".into());
    }
    let numkeys = numkeys as usize;
    let mut limit = 0i64;
    let mut i = 2 + numkeys;
    while i < args.len() {
        if args[i].eq_ignore_ascii_case(b"limit") && i + 1 < args.len() {
            limit = string_to_i64(&args[i + 1])
                .filter(|&n| n >= 0)
                .ok_or("ERR LIMIT can't be negative")?;
            i += 2;
        } else {
            return Err(SYNTAX.into());
        }
    }
    let limit = if limit == 0 {
        usize::MAX
    } else {
        usize::try_from(limit).unwrap_or(usize::MAX)
    };
    let result = combine(Cmd::Sinter, &args[2..2 + numkeys], view, ctx, limit)?;
    out.int(result.len() as i64);
    Ok(())
}

/// `SPOP key [count]`.
fn spop(args: &[Bytes], t: &mut Txn<'_>, ctx: &Ctx<'_>, out: &mut Out<'_>) -> Result<(), Fail> {
    if args.len() > 3 {
        return Err(SYNTAX.into());
    }
    let count = match args.get(2) {
        None => None,
        Some(a) => Some(
            string_to_i64(a)
                .filter(|&n| n >= 0)
                .ok_or("ERR value is out of range, must be positive")?,
        ),
    };
    let key = &args[1];
    let Some(meta) = find_typed(&mut View::Txn(t), ctx, key, Type::Set)? else {
        match count {
            None => out.null(),
            Some(_) => out.set(0),
        }
        return Ok(());
    };
    if count == Some(0) {
        out.set(0);
        return Ok(());
    }
    if meta.packed {
        let all = packed::items(&meta.value)?;
        let picks = match count {
            None => vec![random() as usize % all.len().max(1)],
            Some(n) => distinct_picks(all.len(), usize::try_from(n).unwrap_or(usize::MAX)),
        };
        let popped: Vec<&[u8]> = picks.iter().map(|&i| all[i]).collect();
        let left: Vec<&[u8]> = all
            .iter()
            .enumerate()
            .filter(|(i, _)| !picks.contains(i))
            .map(|(_, m)| *m)
            .collect();
        write_packed(t, ctx, key, Some(&meta), &left)?;
        match count {
            None => out.bulk(popped.first().ok_or_else(empty_set)?),
            Some(_) => {
                out.set(popped.len());
                for m in popped {
                    out.bulk(m);
                }
            }
        }
        return Ok(());
    }
    let Some(count) = count else {
        let pick =
            random_member(&mut View::Txn(t), meta.generation, true)?.ok_or_else(empty_set)?;
        t.delete(&member_key(meta.generation, &pick.member))?;
        if pick.alone {
            shrink(t, key, &meta, 1)?;
        } else {
            // Another member was read, and stays: the set does not run empty, so the size
            // goes down without being read (pops of one set then conflict only on the
            // members they read, not on the size every pop writes).
            t.add(&ks::size_key(meta.generation), -1)?;
        }
        out.bulk(&pick.member);
        return Ok(());
    };
    let all = members(&mut View::Txn(t), ctx, &meta)?;
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    if count >= all.len() {
        // Every member: the whole set goes, O(1), to the graveyard.
        ks::drop_meta(t, key, &meta)?;
        reply_set(out, all.iter());
        return Ok(());
    }
    let picks = distinct_picks(all.len(), count);
    out.set(picks.len());
    for &i in &picks {
        t.delete(&member_key(meta.generation, &all[i]))?;
        out.bulk(&all[i]);
    }
    // Every member was read and some stay: no need to read the size.
    t.add(&ks::size_key(meta.generation), -(picks.len() as i64))?;
    Ok(())
}

/// `SRANDMEMBER key [count]`.
fn srandmember(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    if args.len() > 3 {
        return Err(SYNTAX.into());
    }
    let count = random_count_arg(args.get(2))?;
    let meta = find_typed(view, ctx, &args[1], Type::Set)?;
    let Some(count) = count else {
        match meta {
            None => out.null(),
            Some(m) if m.packed => {
                let all = packed::items(&m.value)?;
                out.bulk(
                    all.get(random() as usize % all.len().max(1))
                        .ok_or_else(empty_set)?,
                );
            }
            Some(m) => {
                let pick = random_member(view, m.generation, false)?.ok_or_else(empty_set)?;
                out.bulk(&pick.member);
            }
        }
        return Ok(());
    };
    let Some(meta) = meta.filter(|_| count != 0) else {
        out.array(0);
        return Ok(());
    };
    let all = members(view, ctx, &meta)?;
    let picks = random_picks(all.len(), count)?;
    let bytes: usize = picks.iter().map(|&i| all[i].len() + 16).sum();
    if bytes > ctx.reply_bytes_max {
        return Err(reply_too_big());
    }
    out.array(picks.len());
    for &i in &picks {
        out.bulk(&all[i]);
    }
    Ok(())
}

/// `SMOVE source destination member`.
fn smove(args: &[Bytes], t: &mut Txn<'_>, ctx: &Ctx<'_>, out: &mut Out<'_>) -> Result<(), Fail> {
    let (src, dst, member) = (&args[1], &args[2], &args[3]);
    let src_held = ks::lookup(&mut View::Txn(t), &ctx.clock, src, false)?;
    let dst_held = ks::lookup(&mut View::Txn(t), &ctx.clock, dst, false)?;
    let Some(src_ty) = src_held.ty() else {
        out.int(0);
        return Ok(());
    };
    if src_ty != Type::Set || dst_held.ty().is_some_and(|ty| ty != Type::Set) {
        return Err(WRONGTYPE.into());
    }
    let Held::Meta(src_meta) = src_held else {
        unreachable!("a set has a meta record")
    };
    if src == dst {
        let found = is_member(&mut View::Txn(t), &src_meta, member)?;
        out.int(i64::from(found));
        return Ok(());
    }
    if remove_members(t, ctx, src, &src_meta, &[member])? == 0 {
        out.int(0);
        return Ok(());
    }
    let dst_meta = match dst_held {
        Held::Meta(m) => Some(m),
        _ => None,
    };
    add_members(t, ctx, dst, dst_meta.as_ref(), &[member])?;
    out.int(1);
    Ok(())
}

/// `SSCAN key cursor [MATCH pattern] [COUNT count]`.
fn sscan(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let cursor = parse_cursor(&args[2])?;
    let Some(meta) = find_typed(view, ctx, &args[1], Type::Set)? else {
        out.array(2);
        out.bulk(b"0");
        out.array(0);
        return Ok(());
    };
    let (pattern, mut count) = scan_options(args)?;
    let (visited, next) = if meta.packed {
        // Whole, whatever the cursor, as Redis scans a listpack.
        (members(view, ctx, &meta)?, 0)
    } else {
        let after = ctx.cursors.resume(cursor)?;
        if cursor == 0 && size(view, meta.generation)? as u64 <= SSCAN_WHOLE_MEMBERS_MAX {
            count = SSCAN_WHOLE_MEMBERS_MAX as usize + 1;
        }
        let mut visited = Vec::new();
        let mut bytes = 0;
        each_member(view, meta.generation, after.as_deref(), |m| {
            bytes += m.len() + 16;
            visited.push(m.to_vec());
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
            Some(last) if visited.len() == count => ctx.cursors.save(last.clone()),
            _ => 0,
        };
        (visited, next)
    };
    let hits: Vec<&Vec<u8>> = visited
        .iter()
        .filter(|m| pattern.is_none_or(|p| glob::matches(p, m)))
        .collect();
    out.array(2);
    out.bulk(next.to_string().as_bytes());
    out.array(hits.len());
    for m in hits {
        out.bulk(m);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
