//! `SORT key [BY pattern] [LIMIT offset count] [GET pattern ...] [ASC|DESC] [ALPHA]
//! [STORE destination]` and `SORT_RO` (no `STORE`), as Redis 7.0's `sortCommandGeneric`:
//! options parsed first, then the key's type checked (a list, a set or a sorted set; an
//! absent key sorts as empty); elements compared as numbers (C's `strtod` over the whole
//! element, or over the `BY` key's value), ties broken by the elements' bytes, or as bytes
//! with `ALPHA` (the C locale's collation); `BY` without `*` sorts nothing (a list or sorted
//! set keeps its order, reversed with `DESC`; a set is sorted by its members' bytes, as Redis
//! does when it stores one, since its own order is its hash table's); `LIMIT` clamped as
//! Redis clamps it; `GET #` is the element, `GET pattern` and `BY pattern` read the key that
//! the element substituted for the pattern's first `*` names (`key->field`: a hash's field),
//! nil (or weight 0) where it is missing or of another type. In cluster mode `BY` and `GET`
//! patterns are refused, as Redis Cluster refuses them: they name keys routing cannot see.
//! `STORE` replaces the destination by a list of the results (nil as an empty string) or
//! deletes it when there are none, and replies with the count.
//!
//! The elements are read whole (`LRANGE`, `SMEMBERS`, `ZRANGE`) and sorted in memory, bounded
//! by the reply limit. One difference: Redis 7.0 does not clear `errno` before its `strtod`,
//! so after any earlier overflow in its main thread (`ZCOUNT k 1e400 1`) a numeric `SORT`
//! can fail with "One or more scores can't be converted" over valid numbers; keel judges each
//! number alone.

use std::cmp::Ordering;

use bytes::Bytes;

use crate::data::{Ctx, Fail, NOT_INTEGER, SYNTAX, View};
use crate::gather::{bulks, run, words};
use crate::keyspace::WRONGTYPE;
use crate::reply::Out;
use crate::resp::string_to_i64;

/// `SORT`'s destination, the last `STORE` given, found as Redis's `sortGetKeys` finds it:
/// skipping the arguments of `LIMIT`, `GET` and `BY`.
pub fn store_key<A: AsRef<[u8]>>(args: &[A]) -> Option<&[u8]> {
    let mut store = None;
    let mut j = 2;
    while j < args.len() {
        let a = args[j].as_ref();
        if a.eq_ignore_ascii_case(b"limit") {
            j += 2;
        } else if a.eq_ignore_ascii_case(b"get") || a.eq_ignore_ascii_case(b"by") {
            j += 1;
        } else if a.eq_ignore_ascii_case(b"store") && j + 1 < args.len() {
            store = Some(args[j + 1].as_ref());
            j += 1;
        }
        j += 1;
    }
    store
}

/// Runs `SORT` (`readonly`: `SORT_RO`).
pub fn sort(
    args: &[Bytes],
    readonly: bool,
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let (mut desc, mut alpha, mut dontsort) = (false, false, false);
    let (mut limit_start, mut limit_count) = (0i64, -1i64);
    let mut store: Option<&Bytes> = None;
    let mut by: Option<&Bytes> = None;
    let mut gets: Vec<&Bytes> = Vec::new();
    let mut j = 2;
    while j < args.len() {
        let left = args.len() - j - 1;
        let opt = &args[j];
        if opt.eq_ignore_ascii_case(b"asc") {
            desc = false;
        } else if opt.eq_ignore_ascii_case(b"desc") {
            desc = true;
        } else if opt.eq_ignore_ascii_case(b"alpha") {
            alpha = true;
        } else if opt.eq_ignore_ascii_case(b"limit") && left >= 2 {
            limit_start = string_to_i64(&args[j + 1]).ok_or(NOT_INTEGER)?;
            limit_count = string_to_i64(&args[j + 2]).ok_or(NOT_INTEGER)?;
            j += 2;
        } else if !readonly && opt.eq_ignore_ascii_case(b"store") && left >= 1 {
            store = Some(&args[j + 1]);
            j += 1;
        } else if opt.eq_ignore_ascii_case(b"by") && left >= 1 {
            by = Some(&args[j + 1]);
            if !args[j + 1].contains(&b'*') {
                dontsort = true;
            } else if ctx.cluster {
                return Err("ERR BY option of SORT denied in Cluster mode.".into());
            }
            j += 1;
        } else if opt.eq_ignore_ascii_case(b"get") && left >= 1 {
            if ctx.cluster {
                return Err("ERR GET option of SORT denied in Cluster mode.".into());
            }
            gets.push(&args[j + 1]);
            j += 1;
        } else {
            return Err(SYNTAX.into());
        }
        j += 1;
    }
    let key = &args[1];
    let ty = run(view, ctx, words(&[b"TYPE", key]))?;
    let (kind, read): (u8, &[&[u8]]) = match &ty[..] {
        b"+none\r\n" => (b'l', &[]),
        b"+list\r\n" => (b'l', &[b"LRANGE", b"0", b"-1"]),
        b"+set\r\n" => (b'S', &[b"SMEMBERS"]),
        b"+zset\r\n" => (b'z', &[b"ZRANGE", b"0", b"-1"]),
        _ => return Err(WRONGTYPE.into()),
    };
    let mut elements: Vec<Vec<u8>> = match read.split_first() {
        None => Vec::new(),
        Some((name, rest)) => {
            let mut a = vec![*name, &key[..]];
            a.extend_from_slice(rest);
            bulks(&run(view, ctx, words(&a))?).ok_or("ERR keel: SORT could not read its key")?
        }
    };
    // A set has no order of its own to keep: sorted by its members' bytes.
    if dontsort && kind == b'S' {
        (dontsort, alpha, by) = (false, true, None);
    }
    let len = elements.len() as i64;
    let start = limit_start.clamp(0, len);
    let count = limit_count.clamp(-1, len);
    let (mut start, mut end) = (
        start,
        if count < 0 {
            len - 1
        } else {
            start + count - 1
        },
    );
    if start >= len {
        (start, end) = (len - 1, len - 2);
    }
    end = end.min(len - 1);
    if dontsort {
        if desc {
            elements.reverse();
        }
    } else {
        let weights: Vec<Option<Vec<u8>>> = match by {
            Some(pattern) => elements
                .iter()
                .map(|e| lookup(view, ctx, pattern, e))
                .collect::<Result<_, _>>()?,
            None => vec![None; elements.len()],
        };
        let mut keyed: Vec<(Vec<u8>, Sortable)> = Vec::with_capacity(elements.len());
        for (e, w) in elements.into_iter().zip(weights) {
            let sortable = if alpha {
                Sortable::Text(if by.is_some() { w } else { Some(e.clone()) })
            } else {
                let source = if by.is_some() {
                    w.unwrap_or_default()
                } else {
                    e.clone()
                };
                // Redis hands the bytes to C's strtod, which stops at a NUL.
                let text = c_string(&source);
                let score = if text.is_empty() {
                    0.0
                } else {
                    crate::zsets::strtod(text)
                        .filter(|(x, erange)| !erange && !x.is_nan())
                        .map(|(x, _)| x)
                        .ok_or("ERR One or more scores can't be converted into double")?
                };
                Sortable::Number(score)
            };
            keyed.push((e, sortable));
        }
        keyed.sort_by(|(ea, a), (eb, b)| {
            let cmp = match (a, b) {
                (Sortable::Number(x), Sortable::Number(y)) => x
                    .partial_cmp(y)
                    .unwrap_or(Ordering::Equal)
                    .then_with(|| ea.cmp(eb)),
                // Redis compares with C's strcoll (the C locale's strcmp, which stops at a
                // NUL), or, with STORE, byte by byte; equals keep their order (glibc's
                // qsort is a merge sort).
                (Sortable::Text(Some(x)), Sortable::Text(Some(y))) if store.is_none() => {
                    c_string(x).cmp(c_string(y))
                }
                (Sortable::Text(x), Sortable::Text(y)) => x.cmp(y),
                _ => Ordering::Equal,
            };
            if desc { cmp.reverse() } else { cmp }
        });
        elements = keyed.into_iter().map(|(e, _)| e).collect();
    }
    let picked: &[Vec<u8>] = if end >= start {
        &elements[start as usize..=end as usize]
    } else {
        &[]
    };
    let mut results: Vec<Option<Vec<u8>>> = Vec::new();
    for e in picked {
        if gets.is_empty() {
            results.push(Some(e.clone()));
        }
        for pattern in &gets {
            results.push(lookup(view, ctx, pattern, e)?);
        }
    }
    match store {
        None => {
            out.array(results.len());
            for r in &results {
                out.bulk_or_null(r.as_deref());
            }
        }
        Some(dst) => {
            let t = view.txn();
            let mut v = View::Txn(t);
            run(&mut v, ctx, words(&[b"DEL", dst]))?;
            if !results.is_empty() {
                let mut a: Vec<&[u8]> = vec![b"RPUSH", dst];
                a.extend(results.iter().map(|r| r.as_deref().unwrap_or_default()));
                run(&mut v, ctx, words(&a))?;
            }
            out.int(results.len() as i64);
        }
    }
    Ok(())
}

/// The bytes C sees of `s`: up to its first NUL.
fn c_string(s: &[u8]) -> &[u8] {
    s.split(|&b| b == 0).next().unwrap_or_default()
}

/// What an element sorts by: a number, or bytes (`None`, a missing `BY` key, first).
enum Sortable {
    Number(f64),
    Text(Option<Vec<u8>>),
}

/// Redis's `lookupKeyByPattern`: `#` is the element itself; otherwise the key the pattern
/// names with its first `*` replaced by the element (nothing without a `*`), a string's value,
/// or with `->field` after the `*`, that field of a hash; `None` where there is none.
fn lookup(
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    pattern: &[u8],
    element: &[u8],
) -> Result<Option<Vec<u8>>, Fail> {
    if pattern == b"#" {
        return Ok(Some(element.to_vec()));
    }
    let Some(star) = pattern.iter().position(|&b| b == b'*') else {
        return Ok(None);
    };
    let rest = &pattern[star + 1..];
    let field = rest
        .windows(2)
        .position(|w| w == b"->")
        .filter(|&at| at + 2 < rest.len());
    let (suffix, field) = match field {
        Some(at) => (&rest[..at], Some(&rest[at + 2..])),
        None => (rest, None),
    };
    let key = [&pattern[..star], element, suffix].concat();
    let ty = run(view, ctx, words(&[b"TYPE", &key]))?;
    let reply = match (field, &ty[..]) {
        (Some(f), b"+hash\r\n") => run(view, ctx, words(&[b"HGET", &key, f]))?,
        (None, b"+string\r\n") => run(view, ctx, words(&[b"GET", &key]))?,
        _ => return Ok(None),
    };
    if reply.starts_with(b"$-1") {
        return Ok(None);
    }
    Ok(bulks(&reply).and_then(|b| b.into_iter().next()))
}
