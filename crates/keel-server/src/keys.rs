//! Key commands that work on a key whatever its type: `RENAME`, `RENAMENX`, `COPY`,
//! `RANDOMKEY` and `OBJECT` (`DEL`, `EXISTS`, `TOUCH`, `TYPE`, `KEYS` and `SCAN` are in `data`).
//!
//! `RENAME` moves a key in O(1) (a collection keeps its generation); `COPY` shares its
//! placing of the key at the destination (`keyspace::place`) and copies a collection's members
//! under a new generation, O(n) in one transaction.
//!
//! `OBJECT ENCODING` answers what Redis 7.0 would report for the same data at its default
//! thresholds (`int`/`embstr`/`raw` for strings; `listpack`/`hashtable` for hashes;
//! `intset`/`hashtable` for sets; `listpack`/`skiplist` for sorted sets; `quicklist` for lists).
//! keel stores every type in its own layout (`docs/types.md`), so the answer is
//! Redis-compatible, not physical; and it follows the data as it is now, where Redis never
//! converts an encoding back (a hash that once had 129 fields stays `hashtable` in Redis).
//! `OBJECT REFCOUNT` follows the same rule (Redis's shared integers 0..9999 report
//! 2147483647). keel keeps no access times: `OBJECT FREQ` gives Redis's error for a server
//! without an LFU policy (keel's policy is `noeviction`), and `OBJECT IDLETIME` an error that
//! says it is not tracked.

use std::ops::{Bound, ControlFlow};

use bytes::Bytes;

use crate::data::{Ctx, Fail, SYNTAX, View, check_db_index, random};
use crate::keyspace::{self as ks, Held, Meta, Type};
use crate::reply::Out;
use crate::resp::string_to_i64;
use crate::table::Cmd;

/// Redis keeps a string of at most this many bytes in one allocation with its header.
const EMBSTR_BYTES_MAX: usize = 44;
/// Redis shares the integers below this among all keys (`OBJ_SHARED_INTEGERS`).
const SHARED_INTEGERS: i64 = 10_000;
/// The reference count Redis reports for a shared object (`OBJ_SHARED_REFCOUNT`).
const SHARED_REFCOUNT: i64 = i32::MAX as i64;
/// `RANDOMKEY` picks uniformly among the keys when there are at most this many.
const RANDOM_EXACT_KEYS_MAX: usize = 1024;
/// With more keys, it picks among this many from a random point of the key order.
const RANDOM_WINDOW_KEYS: usize = 16;

/// Whether this module runs `cmd`.
pub fn handles(cmd: Cmd) -> bool {
    is_read_only(cmd)
        || matches!(
            cmd,
            Cmd::Rename | Cmd::Renamenx | Cmd::Copy | Cmd::Move | Cmd::Swapdb
        )
}

/// Whether `cmd` is one of this module's commands that only read.
pub fn is_read_only(cmd: Cmd) -> bool {
    matches!(cmd, Cmd::Randomkey | Cmd::Object | Cmd::Memory)
}

/// Runs one key command (see [`handles`]).
pub fn run(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    match cmd {
        Cmd::Rename | Cmd::Renamenx => rename(cmd == Cmd::Renamenx, args, view, ctx, out),
        Cmd::Copy => copy(args, view, ctx, out),
        // keel has one database, as Redis with `databases 1`: Redis's checks, in its order.
        Cmd::Move => {
            if ctx.cluster {
                return Err("ERR MOVE is not allowed in cluster mode".into());
            }
            crate::data::check_db_index(&args[2])?;
            Err("ERR source and destination objects are the same".into())
        }
        Cmd::Swapdb => {
            if ctx.cluster {
                return Err(SWAPDB_IN_CLUSTER.into());
            }
            let mut zeros = true;
            for (arg, which) in [(&args[1], "first"), (&args[2], "second")] {
                match string_to_i64(arg).filter(|n| i32::try_from(*n).is_ok()) {
                    Some(n) => zeros &= n == 0,
                    None => return Err(format!("ERR invalid {which} DB index").into()),
                }
            }
            if !zeros {
                return Err("ERR DB index is out of range".into());
            }
            out.ok();
            Ok(())
        }
        Cmd::Randomkey => {
            match random_key(view, ctx) {
                Some(k) => out.bulk(&k),
                None => out.null(),
            }
            Ok(())
        }
        Cmd::Object => object(args, view, ctx, out),
        Cmd::Memory => memory(args, view, ctx, out),
        other => panic!("{other:?} is not a key command"),
    }
}

/// Redis Cluster's answer to `SWAPDB`, whose arguments it does not read.
pub const SWAPDB_IN_CLUSTER: &str = "ERR SWAPDB is not allowed in cluster mode";

fn rename(
    nx: bool,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let t = view.txn();
    let (src, dst) = (&args[1], &args[2]);
    let held = ks::lookup(&mut View::Txn(t), &ctx.clock, src, true)?;
    if held == Held::Absent {
        return Err("ERR no such key".into());
    }
    let done = if src == dst {
        // Renaming a key to itself changes nothing; RENAMENX says it did not rename.
        !nx
    } else if nx && ks::lookup(&mut View::Txn(t), &ctx.clock, dst, false)? != Held::Absent {
        false
    } else {
        ks::rename(t, &ctx.clock, src, dst, &held)?;
        true
    };
    if nx {
        out.int(i64::from(done));
    } else {
        out.ok();
    }
    Ok(())
}

fn copy(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let mut replace = false;
    let mut i = 3;
    while i < args.len() {
        if args[i].eq_ignore_ascii_case(b"replace") {
            replace = true;
        } else if args[i].eq_ignore_ascii_case(b"db") && i + 1 < args.len() {
            check_db_index(&args[i + 1])?;
            i += 1;
        } else {
            return Err(SYNTAX.into());
        }
        i += 1;
    }
    let (src, dst) = (&args[1], &args[2]);
    if src == dst {
        return Err("ERR source and destination objects are the same".into());
    }
    let t = view.txn();
    let held = ks::lookup(&mut View::Txn(t), &ctx.clock, src, true)?;
    if held == Held::Absent
        || !replace && ks::lookup(&mut View::Txn(t), &ctx.clock, dst, false)? != Held::Absent
    {
        out.int(0);
        return Ok(());
    }
    ks::copy(t, &ctx.clock, src, dst, &held)?;
    out.int(1);
    Ok(())
}

/// A random key that is not past its deadline (`None`: there is none). Uniform among up to
/// [`RANDOM_EXACT_KEYS_MAX`] keys. With more, keel has no positional index to pick from, so it
/// descends the key order like a trie: under a prefix holding more than
/// [`RANDOM_WINDOW_KEYS`] keys it skips the bytes they all share, draws the next byte
/// uniformly between the smallest and the largest present, and goes on under the first
/// present byte from there; under one holding fewer it picks uniformly. For keys of a common
/// shape (`user:1234`) that is close to uniform; bytes after a gap in the byte values are
/// likelier, and a key that is a prefix of others is rarer. (Redis's own pick, from a random
/// hash bucket, is not uniform either.) Cost: a few short scans per branching level.
fn random_key(view: &mut View<'_, '_>, ctx: &Ctx<'_>) -> Option<Vec<u8>> {
    let now = ctx.clock.now_ms();
    let pick = |keys: &[ks::Listed]| {
        (!keys.is_empty()).then(|| keys[(random() % keys.len() as u64) as usize].key.clone())
    };
    let mut prefix: Vec<u8> = Vec::new();
    let mut cap = RANDOM_EXACT_KEYS_MAX;
    loop {
        let lo = Bound::Included(prefix.clone());
        let hi = ks::prefix_end(&prefix).map_or(Bound::Unbounded, Bound::Excluded);
        let mut list = |rev: bool, cap: usize| {
            ks::list(view, now, &lo, &hi, rev, cap, false, &mut |_, _| true)
        };
        let some = list(false, cap + 1);
        if some.len() <= cap {
            return pick(&some);
        }
        cap = RANDOM_WINDOW_KEYS;
        let last = list(true, 1).pop()?;
        // More than one key is under the prefix, so the last is longer than it, and so is
        // the first but perhaps one.
        let first = some.iter().find(|k| k.key.len() > prefix.len())?;
        let shared = first
            .key
            .iter()
            .zip(&last.key)
            .take_while(|(a, b)| a == b)
            .count();
        if shared > prefix.len() {
            prefix = first.key[..shared].to_vec();
            continue;
        }
        let at = prefix.len();
        let (min, max) = (first.key[at], last.key[at]);
        let byte = min + (random() % (u64::from(max - min) + 1)) as u8;
        let mut probe = prefix.clone();
        probe.push(byte);
        let next = ks::list(
            view,
            now,
            &Bound::Included(probe),
            &hi,
            false,
            1,
            false,
            &mut |_, _| true,
        )
        .pop()?;
        prefix.push(next.key[at]);
    }
}

/// What keel keeps per engine record beside its key's and value's bytes: the record, its
/// version, and its entries in the point and ordered indexes (about 100 B measured per key
/// of a million 16-byte keys and 10-byte values: BENCHMARKS.md, "Per element of each data
/// type").
const RECORD_OVERHEAD: u64 = 100;

/// `MEMORY USAGE key [SAMPLES count]` and `MEMORY HELP`: the bytes keel keeps for a key, an
/// estimate as Redis's is. A string, or a small collection packed into its meta record, is
/// counted exactly: its record (and its deadline's entry in the expiry index); a spread
/// collection adds its size record and, for each kind of sub-key, the first `count` (5 by
/// default, as Redis samples; 0: all) scaled to their number (members, or a list's chunks
/// of 16 elements).
fn memory(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    // The subcommand and its arity were checked before the command was queued or run.
    if args[1].eq_ignore_ascii_case(b"help") {
        const HELP: &[&str] = &[
            "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "USAGE <key> [SAMPLES <count>]",
            "    Return memory in bytes used by <key> and its value. Nested values are",
            "    sampled up to <count> times (default: 5, 0 means sample all).",
            "HELP",
            "    Prints this help.",
        ];
        out.help(HELP);
        return Ok(());
    }
    let mut samples = 5u64;
    let mut i = 3;
    while i < args.len() {
        if args[i].eq_ignore_ascii_case(b"samples") && i + 1 < args.len() {
            let n =
                string_to_i64(&args[i + 1]).ok_or("ERR value is not an integer or out of range")?;
            if n < 0 {
                return Err(SYNTAX.into());
            }
            samples = if n == 0 { u64::MAX } else { n as u64 };
            i += 2;
        } else {
            return Err(SYNTAX.into());
        }
    }
    let key = &args[2];
    let held = ks::lookup(view, &ctx.clock, key, false)?;
    let record = |k: usize, v: usize| k as u64 + v as u64 + RECORD_OVERHEAD;
    let bytes = match held {
        Held::Absent => {
            out.null();
            return Ok(());
        }
        Held::Plain(_) => {
            let plain = ks::plain_key(key);
            let len = view.get_with(&plain, |v| v.map_or(0, <[u8]>::len))?;
            record(plain.len(), len)
        }
        Held::Meta(meta) => {
            let meta_key = ks::meta_key(key);
            let len = view.get_with(&meta_key, |v| v.map_or(0, <[u8]>::len))?;
            let mut bytes = record(meta_key.len(), len);
            if meta.deadline != 0 {
                bytes += record(ks::expiry_key(meta.deadline, key).len(), 0);
            }
            if !meta.packed && meta.generation != 0 {
                let members = if meta.ty == Type::List {
                    crate::lists::length(view, ctx, key)?
                } else {
                    bytes += record(ks::size_key(meta.generation).len(), 8);
                    crate::sets::size(view, meta.generation)?.max(0) as u64
                };
                for &kind in ks::sub_prefixes(meta.ty) {
                    let (lo, hi) = ks::prefix_range(&ks::sub_prefix(kind, meta.generation));
                    let (mut seen, mut sum) = (0u64, 0u64);
                    let mut whole = true;
                    view.range(lo, hi, false, |k, v| {
                        if seen == samples {
                            whole = false;
                            return std::ops::ControlFlow::Break(());
                        }
                        seen += 1;
                        sum += record(k.len(), v.len());
                        std::ops::ControlFlow::Continue(())
                    });
                    bytes += if whole || seen == 0 {
                        sum
                    } else {
                        let records = match kind {
                            ks::LIST_ITEM => members.div_ceil(16),
                            _ => members,
                        };
                        sum / seen * records.max(seen)
                    };
                }
            }
            bytes
        }
    };
    out.int(i64::try_from(bytes).unwrap_or(i64::MAX));
    Ok(())
}

fn object(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    // The subcommand and its arity were checked before the command was queued or run.
    let sub = args[1].to_ascii_lowercase();
    if sub == b"help" {
        const HELP: &[&str] = &[
            "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "ENCODING <key>",
            "    Return the kind of internal representation used in order to store the value",
            "    associated with a <key>.",
            "FREQ <key>",
            "    Return the access frequency index of the <key>. The returned integer is",
            "    proportional to the logarithm of the recent access frequency of the key.",
            "IDLETIME <key>",
            "    Return the idle time of the <key>, that is the approximated number of",
            "    seconds elapsed since the last access to the key.",
            "REFCOUNT <key>",
            "    Return the number of references of the value associated with the specified",
            "    <key>.",
            "HELP",
            "    Prints this help.",
        ];
        out.help(HELP);
        return Ok(());
    }
    let key = &args[2];
    let held = ks::lookup(view, &ctx.clock, key, true)?;
    if held == Held::Absent {
        out.null();
        return Ok(());
    }
    match &sub[..] {
        b"encoding" => out.bulk(encoding(view, &held, ctx.encodings)?.as_bytes()),
        b"refcount" => {
            let shared = held
                .string()
                .ok()
                .flatten()
                .filter(|v| v.len() <= 20)
                .and_then(string_to_i64)
                .is_some_and(|n| (0..SHARED_INTEGERS).contains(&n));
            out.int(if shared { SHARED_REFCOUNT } else { 1 });
        }
        b"freq" => {
            return Err(
                "ERR An LFU maxmemory policy is not selected, access frequency not \
                        tracked. Please note that when switching between policies at runtime \
                        LRU and LFU data will take some time to adjust."
                    .into(),
            );
        }
        _ => {
            return Err(
                "ERR keel: OBJECT IDLETIME is not tracked: keel keeps no access time \
                        per key (it never evicts keys)"
                    .into(),
            );
        }
    }
    Ok(())
}

/// What Redis 7.0 would call the encoding of what `held` describes, at the thresholds set
/// (`CONFIG SET hash-max-listpack-entries` and the like; Redis' defaults unless changed).
fn encoding(
    view: &mut View<'_, '_>,
    held: &Held,
    limits: &crate::config::Encodings,
) -> Result<&'static str, Fail> {
    let meta = match held {
        Held::Absent => unreachable!("the caller checked that the key exists"),
        Held::Plain(v) => return Ok(string_encoding(v.as_deref().unwrap_or_default())),
        Held::Meta(m) if m.ty == Type::String => return Ok(string_encoding(&m.value)),
        Held::Meta(m) if m.ty == Type::List => return Ok("quicklist"),
        Held::Meta(m) if m.packed && m.ty == Type::Set => {
            let members = ks::packed::items(&m.value)?;
            let intset = members.len() as i64 <= limits.intset_entries()
                && members.iter().all(|m| is_integer(m));
            return Ok(if intset { "intset" } else { "hashtable" });
        }
        Held::Meta(m) if m.packed => {
            let fields = crate::hashes::Fields::parse(&m.value)?;
            let listpack = fields.len() as i64 <= limits.hash_entries()
                && fields.iter().all(|(f, v)| fits(f, v, limits.hash_value()));
            return Ok(if listpack { "listpack" } else { "hashtable" });
        }
        Held::Meta(m) => m,
    };
    let size = crate::sets::size(view, meta.generation)?;
    Ok(match meta.ty {
        Type::String => unreachable!("handled above"),
        Type::List => "quicklist",
        Type::Set
            if size <= limits.intset_entries()
                && all_sub_keys(view, meta, |m, _| is_integer(m)) =>
        {
            "intset"
        }
        Type::Set => "hashtable",
        Type::Hash
            if size <= limits.hash_entries()
                && all_sub_keys(view, meta, |f, v| fits(f, v, limits.hash_value())) =>
        {
            "listpack"
        }
        Type::Hash => "hashtable",
        Type::ZSet
            if size <= limits.zset_entries()
                && all_sub_keys(view, meta, |m, _| fits(m, &[], limits.zset_value())) =>
        {
            "listpack"
        }
        Type::ZSet => "skiplist",
    })
}

/// A string's encoding: `int` for what Redis stores as a C long, `embstr` up to 44 bytes,
/// else `raw`.
fn string_encoding(v: &[u8]) -> &'static str {
    if v.len() <= 20 && string_to_i64(v).is_some() {
        "int"
    } else if v.len() <= EMBSTR_BYTES_MAX {
        "embstr"
    } else {
        "raw"
    }
}

fn is_integer(member: &[u8]) -> bool {
    string_to_i64(member).is_some()
}

/// Whether a listpack entry's item and value are both at most `max` bytes long.
fn fits(item: &[u8], value: &[u8], max: i64) -> bool {
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    item.len() <= max && value.len() <= max
}

/// Whether `test` holds for every member (and its value: a hash field's; empty for a set
/// member; a sorted set's is its score, which `fits_listpack` ignores as Redis does) of the
/// collection `meta`, read from its first sub-key kind.
fn all_sub_keys(
    view: &mut View<'_, '_>,
    meta: &Meta,
    mut test: impl FnMut(&[u8], &[u8]) -> bool,
) -> bool {
    let kind = ks::sub_prefixes(meta.ty)[0];
    let prefix = ks::sub_prefix(kind, meta.generation);
    let (lo, hi) = ks::prefix_range(&prefix);
    let mut all = true;
    let score = meta.ty == Type::ZSet;
    view.range(lo, hi, false, |k, v| {
        all = test(&k[prefix.len()..], if score { &[] } else { v });
        if all {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        }
    });
    all
}

#[cfg(test)]
mod tests;
