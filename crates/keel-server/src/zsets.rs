//! Sorted set commands (`ZADD`, `ZRANGE`, `ZRANK`, `ZPOPMIN`, `ZUNIONSTORE`, ...), over the
//! layout of `docs/types.md`: the meta record holds the sorted set's generation; each member
//! has a score key `FF 'z' gen member` (value: its score, 8 bytes) and an entry in the score
//! index `FF 'Z' gen score member` (empty value), so that a score range is a range scan; the
//! size record `FF 'n' gen` is kept with the engine's commutative `add`.
//!
//! Scores are stored in an order-preserving 8-byte form ([`encode_score`]): the bits of the
//! `f64`, sign bit flipped for positives and all bits flipped for negatives, big-endian, so
//! byte order is numeric order. `-0.0` is stored as `0.0`; NaN is never stored (every
//! command that could make one fails first, as in Redis). Within one score the index orders
//! members by their bytes, as Redis does.
//!
//! Writing a member (`ZADD`, `ZINCRBY`) reads the meta record and that member's score key,
//! writes its score key and index entry, and adds to the size without reading it: clients
//! writing different members never conflict. A write that only changes scores adds 0, so that
//! the size record has a new version whenever the set changes: that is what `WATCH` of it
//! records. Removing members reads the size, to delete the key with its last member, as Redis
//! does.
//!
//! Costs: there is no rank structure (it would be one more structure to keep in step with
//! every write, and shrink), so a rank is counted by scanning the index: `ZRANK`/`ZREVRANK`
//! are O(rank), `ZRANGE` by rank O(start + count), `ZCOUNT`/`ZLEXCOUNT` O(members counted).
//! `ZRANDMEMBER` reads the whole set (bounded by the reply limits). Score and lex ranges seek
//! straight to their first member.
//!
//! Lex ranges over members of different scores follow Redis's small (listpack) sorted sets:
//! the range starts at the first member, in score order, at or after `min` and runs while
//! members are at or before `max`. For members of one score (the documented use) that is
//! plain lexicographic order.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::ops::{Bound, ControlFlow};

use bytes::Bytes;
use keel::Txn;

use crate::data::{
    Ctx, Fail, NOT_INTEGER, REPLY_ITEMS_MAX, SYNTAX, View, int_arg, parse_cursor, random,
    random_count_arg, random_picks, reply_too_big, scan_options,
};
use crate::glob;
use crate::keyspace::{self as ks, Meta, Type, WRONGTYPE, ZSET_INDEX, ZSET_SCORE};
use crate::reply::{Out, Proto};
use crate::resp::string_to_i64;
use crate::sets::{self, find_typed, shrink, size};
use crate::table::Cmd;

/// A sorted set of at most this many members is returned whole by one `ZSCAN`, with cursor
/// 0, as Redis does for a small (listpack-encoded) sorted set.
pub const ZSCAN_WHOLE_MEMBERS_MAX: u64 = 128;

const NOT_FLOAT: &str = "ERR value is not a valid float";
const RANGE_NOT_FLOAT: &str = "ERR min or max is not a float";
const LEX_INVALID: &str = "ERR min or max not valid string range item";
const NAN_RESULT: &str = "ERR resulting score is not a number (NaN)";
const NOT_POSITIVE: &str = "ERR value is out of range, must be positive";

/// Whether this module runs `cmd`.
pub fn handles(cmd: Cmd) -> bool {
    is_read_only(cmd)
        || matches!(
            cmd,
            Cmd::Zadd
                | Cmd::Zincrby
                | Cmd::Zrem
                | Cmd::Zpopmin
                | Cmd::Zpopmax
                | Cmd::Zrangestore
                | Cmd::Zunionstore
                | Cmd::Zinterstore
                | Cmd::Zdiffstore
                | Cmd::Zmpop
                | Cmd::Bzpopmin
                | Cmd::Bzpopmax
                | Cmd::Bzmpop
                | Cmd::Zremrangebyscore
                | Cmd::Zremrangebyrank
                | Cmd::Zremrangebylex
        )
}

/// Whether `cmd` is a sorted set's blocking pop (`lists::is_blocking` counts them too).
pub fn is_blocking(cmd: Cmd) -> bool {
    matches!(cmd, Cmd::Bzpopmin | Cmd::Bzpopmax | Cmd::Bzmpop)
}

/// The key a committed `cmd` may have turned from absent into a sorted set: clients blocked
/// on it in `BZPOPMIN` and its kin are woken.
pub fn pushed_key(cmd: Cmd, args: &[Bytes]) -> Option<&[u8]> {
    match cmd {
        Cmd::Zadd
        | Cmd::Zincrby
        | Cmd::Zunionstore
        | Cmd::Zinterstore
        | Cmd::Zdiffstore
        | Cmd::Zrangestore => args.get(1).map(|a| &a[..]),
        _ => None,
    }
}

/// A blocking pop without the blocking: pops (and replies) if it can; `false`, with nothing
/// written, when no key holds a sorted set.
pub fn run_blocking(
    cmd: Cmd,
    args: &[Bytes],
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<bool, Fail> {
    if cmd == Cmd::Bzmpop {
        // Its arguments, then its timeout, then its keys, as Redis checks them.
        let how = zmpop_args(args, 2)?;
        crate::lists::timeout(crate::lists::timeout_arg_of(cmd, args))?;
        return zmpop_keys(args, how, t, ctx, out);
    }
    crate::lists::timeout(crate::lists::timeout_arg_of(cmd, args))?;
    for key in crate::lists::blocking_keys(cmd, args) {
        let Some(meta) = find(&mut View::Txn(t), ctx, key)? else {
            continue;
        };
        let items = pop_members(t, key, &meta, cmd == Cmd::Bzpopmax, 1, ctx)?;
        let (m, s) = items.first().ok_or("ERR keel: damaged sorted set")?;
        out.array(3);
        out.bulk(key);
        out.bulk(m);
        out.double(*s);
        return Ok(true);
    }
    Ok(false)
}

/// Whether `cmd` is a sorted set command that only reads.
pub fn is_read_only(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Zscore
            | Cmd::Zmscore
            | Cmd::Zcard
            | Cmd::Zcount
            | Cmd::Zlexcount
            | Cmd::Zrange
            | Cmd::Zrangebyscore
            | Cmd::Zrevrangebyscore
            | Cmd::Zrangebylex
            | Cmd::Zrevrangebylex
            | Cmd::Zrevrange
            | Cmd::Zrank
            | Cmd::Zrevrank
            | Cmd::Zscan
            | Cmd::Zrandmember
            | Cmd::Zunion
            | Cmd::Zinter
            | Cmd::Zdiff
            | Cmd::Zintercard
    )
}

// ---------------------------------------------------------------------------------------------
// Scores: their stored form and how Redis reads them.

pub use keel::{decode_score, encode_score};

/// C's `strtod` over the whole of `s`: `None` unless it reads all of it (an empty string
/// reads as 0, as `strtod` leaves its end pointer at the terminator). With the value,
/// whether `strtod` would set `ERANGE` (overflow to infinity, or underflow to zero).
pub(crate) fn strtod(s: &[u8]) -> Option<(f64, bool)> {
    if s.is_empty() {
        return Some((0.0, false));
    }
    let body = s.trim_ascii_start();
    let (negative, body) = match body {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, body),
    };
    let signed = |x: f64| if negative { -x } else { x };
    if body.eq_ignore_ascii_case(b"inf") || body.eq_ignore_ascii_case(b"infinity") {
        return Some((signed(f64::INFINITY), false));
    }
    if body.len() >= 3 && body[..3].eq_ignore_ascii_case(b"nan") {
        let rest = &body[3..];
        let ok = rest.is_empty()
            || (rest.first() == Some(&b'(')
                && rest.last() == Some(&b')')
                && rest[1..rest.len() - 1]
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || *c == b'_'));
        return ok.then_some((f64::NAN, false));
    }
    if body.len() > 2 && body[0] == b'0' && (body[1] | 0x20) == b'x' {
        return hex_float(&body[2..]).map(|(x, erange)| (signed(x), erange));
    }
    // Decimal: digits [. digits] [e [sign] digits], at least one mantissa digit.
    let int_len = body.iter().take_while(|c| c.is_ascii_digit()).count();
    let (int, rest) = body.split_at(int_len);
    let (frac, rest) = match rest {
        [b'.', tail @ ..] => {
            let n = tail.iter().take_while(|c| c.is_ascii_digit()).count();
            tail.split_at(n)
        }
        _ => (&rest[..0], rest),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let exp = match rest {
        [] => &rest[..0],
        [b'e' | b'E', tail @ ..] => {
            let digits = match tail {
                [b'+' | b'-', d @ ..] => d,
                d => d,
            };
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            tail
        }
        _ => return None,
    };
    let mut text = String::with_capacity(body.len() + 8);
    text.push_str(if int.is_empty() {
        "0"
    } else {
        std::str::from_utf8(int).ok()?
    });
    text.push('.');
    text.push_str(if frac.is_empty() {
        "0"
    } else {
        std::str::from_utf8(frac).ok()?
    });
    if !exp.is_empty() {
        text.push('e');
        text.push_str(std::str::from_utf8(exp).ok()?);
    }
    let x: f64 = text.parse().ok()?;
    let nonzero = int.iter().chain(frac).any(|&c| c != b'0');
    let erange = x.is_infinite() || (x == 0.0 && nonzero);
    Some((signed(x), erange))
}

/// The digits of a C hexadecimal float after `0x`: hex digits [. hex digits] [p [sign]
/// digits].
fn hex_float(s: &[u8]) -> Option<(f64, bool)> {
    let mut mantissa: u64 = 0;
    let mut exp: i64 = 0;
    let mut digits = 0;
    let mut nonzero = false;
    let mut i = 0;
    let mut seen_point = false;
    while i < s.len() {
        let c = s[i];
        if c == b'.' && !seen_point {
            seen_point = true;
            i += 1;
            continue;
        }
        let Some(d) = (c as char).to_digit(16) else {
            break;
        };
        digits += 1;
        nonzero |= d != 0;
        if mantissa >> 60 == 0 {
            mantissa = mantissa << 4 | u64::from(d);
            if seen_point {
                exp -= 4;
            }
        } else if !seen_point {
            exp += 4;
        }
        i += 1;
    }
    if digits == 0 {
        return None;
    }
    if i < s.len() {
        if s[i] | 0x20 != b'p' {
            return None;
        }
        let e = std::str::from_utf8(&s[i + 1..]).ok()?;
        let e = e.strip_prefix('+').unwrap_or(e);
        if e.is_empty()
            || !e
                .trim_start_matches('-')
                .bytes()
                .all(|c| c.is_ascii_digit())
        {
            return None;
        }
        exp += e.parse::<i64>().unwrap_or(if e.starts_with('-') {
            -100_000
        } else {
            100_000
        });
    }
    let mut x = mantissa as f64;
    let mut e = exp.clamp(-4000, 4000);
    while e > 0 {
        let step = e.min(1000);
        x *= 2f64.powi(step as i32);
        e -= step;
    }
    while e < 0 {
        let step = (-e).min(1000);
        x /= 2f64.powi(step as i32);
        e += step;
    }
    Some((x, x.is_infinite() || (x == 0.0 && nonzero)))
}

/// A score argument as Redis reads one (`getDoubleFromObject`): all of it a C float, no
/// leading space, no NaN, not out of range (`1e400`).
pub fn parse_score(arg: &[u8]) -> Option<f64> {
    if arg.is_empty() || arg[0].is_ascii_whitespace() || arg[0] == 0x0b {
        return None;
    }
    let (x, erange) = strtod(arg)?;
    if x.is_nan() || (erange && (x.is_infinite() || x == 0.0)) {
        return None;
    }
    Some(x)
}

/// One end of a score range: `(x` exclusive, else inclusive, as Redis parses them.
fn parse_score_bound(arg: &[u8]) -> Option<(f64, bool)> {
    let (text, exclusive) = match arg {
        [b'(', rest @ ..] => (rest, true),
        _ => (arg, false),
    };
    let (x, _) = strtod(text)?;
    (!x.is_nan()).then_some((x, exclusive))
}

/// A score range as stored-score bounds: `[lo, hi)` over [`encode_score`]; `None` if empty.
fn score_range(min: &[u8], max: &[u8]) -> Result<Option<(u64, u64)>, Fail> {
    let ((min, min_ex), (max, max_ex)) = parse_score_bound(min)
        .zip(parse_score_bound(max))
        .ok_or(RANGE_NOT_FLOAT)?;
    let lo = encode_score(min) + u64::from(min_ex);
    let hi = if max_ex {
        encode_score(max)
    } else {
        encode_score(max) + 1
    };
    Ok((lo < hi).then_some((lo, hi)))
}

/// One end of a lex range.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lex {
    /// `-`: before every string.
    Min,
    /// `+`: after every string.
    Max,
    Str(Vec<u8>),
}

impl Lex {
    fn cmp_member(&self, member: &[u8]) -> Ordering {
        match self {
            Lex::Min => Ordering::Less,
            Lex::Max => Ordering::Greater,
            Lex::Str(s) => s.as_slice().cmp(member),
        }
    }
}

/// A lex range, as Redis's `zlexrangespec`.
struct LexRange {
    min: Lex,
    min_ex: bool,
    max: Lex,
    max_ex: bool,
}

impl LexRange {
    fn parse(min: &[u8], max: &[u8]) -> Result<LexRange, Fail> {
        let item = |a: &[u8]| -> Option<(Lex, bool)> {
            match a {
                [b'+'] => Some((Lex::Max, true)),
                [b'-'] => Some((Lex::Min, true)),
                [b'(', rest @ ..] => Some((Lex::Str(rest.to_vec()), true)),
                [b'[', rest @ ..] => Some((Lex::Str(rest.to_vec()), false)),
                _ => None,
            }
        };
        let ((min, min_ex), (max, max_ex)) = item(min).zip(item(max)).ok_or(LEX_INVALID)?;
        Ok(LexRange {
            min,
            min_ex,
            max,
            max_ex,
        })
    }

    /// Whether no string can be in the range (Redis's first test in `zslIsInLexRange`).
    fn always_empty(&self) -> bool {
        let cmp = match (&self.min, &self.max) {
            (Lex::Min, Lex::Min) | (Lex::Max, Lex::Max) => Ordering::Equal,
            (Lex::Min, _) | (_, Lex::Max) => Ordering::Less,
            (Lex::Max, _) | (_, Lex::Min) => Ordering::Greater,
            (Lex::Str(a), Lex::Str(b)) => a.cmp(b),
        };
        cmp == Ordering::Greater || (cmp == Ordering::Equal && (self.min_ex || self.max_ex))
    }

    fn gte_min(&self, member: &[u8]) -> bool {
        let c = self.min.cmp_member(member);
        if self.min_ex {
            c == Ordering::Less
        } else {
            c != Ordering::Greater
        }
    }

    fn lte_max(&self, member: &[u8]) -> bool {
        let c = self.max.cmp_member(member);
        if self.max_ex {
            c == Ordering::Greater
        } else {
            c != Ordering::Less
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Members, the score index and ranges over it.

fn score_key(generation: u64, member: &[u8]) -> ks::KeyBuf {
    ks::sub_key(ZSET_SCORE, generation, member)
}

fn index_key(generation: u64, encoded: u64, member: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(18 + member.len());
    k.extend_from_slice(&ks::sub_prefix(ZSET_INDEX, generation));
    k.extend_from_slice(&encoded.to_be_bytes());
    k.extend_from_slice(member);
    k
}

/// The index key of the first member with stored score `encoded` (or after).
fn index_at(generation: u64, encoded: u64) -> Vec<u8> {
    index_key(generation, encoded, &[])
}

/// A member's stored score (`None`: not a member).
fn score_of(view: &mut View<'_, '_>, generation: u64, member: &[u8]) -> Result<Option<u64>, Fail> {
    let v = view.get_with(&score_key(generation, member), |v| {
        v.map(|v| <[u8; 8]>::try_from(v).map(u64::from_be_bytes))
    })?;
    match v {
        None => Ok(None),
        Some(Ok(k)) => Ok(Some(k)),
        Some(Err(_)) => Err("ERR keel: damaged sorted set score".into()),
    }
}

/// Writes `member` with score `score`, its old stored score being `old`.
fn put_member(
    t: &mut Txn<'_>,
    generation: u64,
    member: &[u8],
    old: Option<u64>,
    score: f64,
) -> Result<(), Fail> {
    let new = encode_score(score);
    if old == Some(new) {
        return Ok(());
    }
    if let Some(old) = old {
        t.delete(&index_key(generation, old, member))?;
    }
    t.put(&score_key(generation, member), &new.to_be_bytes())?;
    t.put(&index_key(generation, new, member), &[])?;
    Ok(())
}

/// Deletes `member`, whose stored score is `encoded`.
fn delete_member(
    t: &mut Txn<'_>,
    generation: u64,
    member: &[u8],
    encoded: u64,
) -> Result<(), Fail> {
    t.delete(&score_key(generation, member))?;
    t.delete(&index_key(generation, encoded, member))?;
    Ok(())
}

/// A member and its score.
type Scored = (Vec<u8>, f64);

/// Calls `f` on each member in score order (reversed with `rev`) between the index keys
/// `lo` and `hi`, with its stored score, until it says stop.
fn walk(
    view: &mut View<'_, '_>,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    rev: bool,
    mut f: impl FnMut(&[u8], u64) -> ControlFlow<()>,
) {
    view.range(lo, hi, rev, |k, _| {
        let Some((score, member)) = k.get(10..).and_then(|r| r.split_first_chunk::<8>()) else {
            return ControlFlow::Continue(());
        };
        f(member, u64::from_be_bytes(*score))
    });
}

/// The whole index's bounds.
fn all(generation: u64) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    ks::prefix_range(&ks::sub_prefix(ZSET_INDEX, generation))
}

/// Collects members (bounded by the reply limits) as `walk` gives them.
struct Collect {
    items: Vec<Scored>,
    bytes: usize,
    over: bool,
    bytes_max: usize,
}

impl Collect {
    fn new(bytes_max: usize) -> Collect {
        Collect {
            items: Vec::new(),
            bytes: 0,
            over: false,
            bytes_max,
        }
    }

    /// Takes one; `Break` once over the limits.
    fn push(&mut self, member: &[u8], encoded: u64) -> ControlFlow<()> {
        self.bytes += member.len() + 40;
        self.items.push((member.to_vec(), decode_score(encoded)));
        self.over = self.bytes > self.bytes_max || self.items.len() > REPLY_ITEMS_MAX;
        if self.over {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    fn done(self) -> Result<Vec<Scored>, Fail> {
        if self.over {
            return Err(reply_too_big());
        }
        Ok(self.items)
    }
}

/// Members `start..=end` by rank (Redis's index rules, reversed with `rev`).
fn by_rank(
    view: &mut View<'_, '_>,
    bytes_max: usize,
    generation: u64,
    start: i64,
    end: i64,
    rev: bool,
) -> Result<Vec<Scored>, Fail> {
    let Some((start, end)) = rank_span(size(view, generation)?, start, end) else {
        return Ok(Vec::new());
    };
    let (lo, hi) = all(generation);
    let mut rank = 0;
    let mut got = Collect::new(bytes_max);
    walk(view, lo, hi, rev, |m, s| {
        let here = rank;
        rank += 1;
        if here < start {
            return ControlFlow::Continue(());
        }
        if got.push(m, s).is_break() {
            return ControlFlow::Break(());
        }
        if here >= end {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    got.done()
}

/// Redis's sanitising of a rank range over `len` members: `None` if empty.
fn rank_span(len: i64, start: i64, end: i64) -> Option<(i64, i64)> {
    let mut start = if start < 0 { len + start } else { start };
    let end = if end < 0 { len + end } else { end };
    if start < 0 {
        start = 0;
    }
    if start > end || start >= len {
        return None;
    }
    Some((start, end.min(len - 1)))
}

/// Members with stored scores in `[lo, hi)`, skipping `offset`, at most `limit` (negative:
/// all), in score order (reversed with `rev`).
#[allow(clippy::too_many_arguments)]
fn by_score(
    view: &mut View<'_, '_>,
    bytes_max: usize,
    generation: u64,
    range: Option<(u64, u64)>,
    offset: i64,
    limit: i64,
    rev: bool,
) -> Result<Vec<Scored>, Fail> {
    let mut got = Collect::new(bytes_max);
    let Some((lo, hi)) = range else {
        return got.done();
    };
    if offset < 0 || limit == 0 {
        return got.done();
    }
    let mut skip = offset;
    let mut left = limit;
    walk(
        view,
        Bound::Included(index_at(generation, lo)),
        Bound::Excluded(index_at(generation, hi)),
        rev,
        |m, s| {
            if skip > 0 {
                skip -= 1;
                return ControlFlow::Continue(());
            }
            if got.push(m, s).is_break() {
                return ControlFlow::Break(());
            }
            left -= 1;
            if left == 0 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        },
    );
    got.done()
}

/// Members in a lex range (see the module docs), skipping `offset`, at most `limit`
/// (negative: all), forward or (`rev`) backward.
#[allow(clippy::too_many_arguments)]
fn by_lex(
    view: &mut View<'_, '_>,
    bytes_max: usize,
    generation: u64,
    range: &LexRange,
    offset: i64,
    limit: i64,
    rev: bool,
) -> Result<Vec<Scored>, Fail> {
    let mut got = Collect::new(bytes_max);
    if offset < 0 || limit == 0 || !lex_nonempty(view, generation, range) {
        return got.done();
    }
    let (lo, hi) = all(generation);
    let mut started = false;
    let mut skip = offset;
    let mut left = limit;
    walk(view, lo, hi, rev, |m, s| {
        // Forward: start at the first member at or after min; go on while at or before max.
        // Backward: the mirror image.
        let (start, keep) = if rev {
            (range.lte_max(m), range.gte_min(m))
        } else {
            (range.gte_min(m), range.lte_max(m))
        };
        if !started {
            if !start {
                return ControlFlow::Continue(());
            }
            started = true;
        }
        if !keep {
            return ControlFlow::Break(());
        }
        if skip > 0 {
            skip -= 1;
            return ControlFlow::Continue(());
        }
        if got.push(m, s).is_break() {
            return ControlFlow::Break(());
        }
        left -= 1;
        if left == 0 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    got.done()
}

/// Redis's test of a lex range against the first and last members (`zzlIsInLexRange`).
fn lex_nonempty(view: &mut View<'_, '_>, generation: u64, range: &LexRange) -> bool {
    if range.always_empty() {
        return false;
    }
    let mut ends = [None, None];
    for (i, rev) in [false, true].into_iter().enumerate() {
        let (lo, hi) = all(generation);
        walk(view, lo, hi, rev, |m, _| {
            ends[i] = Some(m.to_vec());
            ControlFlow::Break(())
        });
    }
    match ends {
        [Some(first), Some(last)] => range.gte_min(&last) && range.lte_max(&first),
        _ => false,
    }
}

/// Writes members (with their scores, as doubles, with `withscores`) as Redis's `ZRANGE`
/// does: flat in RESP2, pairs in RESP3.
fn reply_scored(out: &mut Out<'_>, items: &[Scored], withscores: bool) {
    if !withscores {
        out.array(items.len());
        for (m, _) in items {
            out.bulk(m);
        }
        return;
    }
    let resp3 = out.proto == Proto::Resp3;
    out.array(if resp3 { items.len() } else { 2 * items.len() });
    for (m, s) in items {
        if resp3 {
            out.array(2);
        }
        out.bulk(m);
        out.double(*s);
    }
}

/// Replaces `dst` by a sorted set of `items` (deleted if there are none), as the `...STORE`
/// commands do.
fn store(t: &mut Txn<'_>, ctx: &Ctx<'_>, dst: &[u8], items: &[Scored]) -> Result<(), Fail> {
    let Some(meta) = sets::replace(t, ctx, dst, Type::ZSet, items.is_empty())? else {
        return Ok(());
    };
    for (m, s) in items {
        put_member(t, meta.generation, m, None, *s)?;
    }
    let n = i64::try_from(items.len()).expect("bounded by REPLY_ITEMS_MAX");
    t.put(&ks::size_key(meta.generation), n.to_string().as_bytes())?;
    Ok(())
}

fn find(view: &mut View<'_, '_>, ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<Meta>, Fail> {
    find_typed(view, ctx, key, Type::ZSet)
}

// ---------------------------------------------------------------------------------------------
// The commands.

/// Runs one sorted set command (see [`handles`]).
pub fn run(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let key = &args[1];
    match cmd {
        Cmd::Zadd => zadd(args, 2, false, view.txn(), ctx, out)?,
        Cmd::Zincrby => zadd(args, 2, true, view.txn(), ctx, out)?,
        Cmd::Zrem => {
            let t = view.txn();
            let Some(meta) = find(&mut View::Txn(t), ctx, key)? else {
                out.int(0);
                return Ok(());
            };
            let mut removed = 0;
            for m in &args[2..] {
                if let Some(s) = score_of(&mut View::Txn(t), meta.generation, m)? {
                    delete_member(t, meta.generation, m, s)?;
                    removed += 1;
                }
            }
            shrink(t, key, &meta, removed)?;
            out.int(removed);
        }
        Cmd::Zscore => match find(view, ctx, key)? {
            None => out.null(),
            Some(m) => match score_of(view, m.generation, &args[2])? {
                None => out.null(),
                Some(s) => out.double(decode_score(s)),
            },
        },
        Cmd::Zmscore => {
            let meta = find(view, ctx, key)?;
            out.array(args.len() - 2);
            for member in &args[2..] {
                let s = match &meta {
                    None => None,
                    Some(m) => score_of(view, m.generation, member)?,
                };
                match s {
                    None => out.null(),
                    Some(s) => out.double(decode_score(s)),
                }
            }
        }
        Cmd::Zcard => {
            let n = match find(view, ctx, key)? {
                None => 0,
                Some(m) => size(view, m.generation)?,
            };
            out.int(n);
        }
        Cmd::Zcount => {
            let range = score_range(&args[2], &args[3])?;
            let mut n = 0i64;
            if let (Some(m), Some((lo, hi))) = (find(view, ctx, key)?, range) {
                walk(
                    view,
                    Bound::Included(index_at(m.generation, lo)),
                    Bound::Excluded(index_at(m.generation, hi)),
                    false,
                    |_, _| {
                        n += 1;
                        ControlFlow::Continue(())
                    },
                );
            }
            out.int(n);
        }
        Cmd::Zlexcount => {
            let range = LexRange::parse(&args[2], &args[3])?;
            let n = match find(view, ctx, key)? {
                None => 0,
                Some(m) => by_lex_count(view, m.generation, &range),
            };
            out.int(n);
        }
        Cmd::Zrange => zrange(args, 1, None, None, view, ctx, out)?,
        Cmd::Zrevrange => zrange(args, 1, Some(Kind::Rank), Some(true), view, ctx, out)?,
        Cmd::Zrangebyscore => zrange(args, 1, Some(Kind::Score), Some(false), view, ctx, out)?,
        Cmd::Zrevrangebyscore => zrange(args, 1, Some(Kind::Score), Some(true), view, ctx, out)?,
        Cmd::Zrangebylex => zrange(args, 1, Some(Kind::Lex), Some(false), view, ctx, out)?,
        Cmd::Zrevrangebylex => zrange(args, 1, Some(Kind::Lex), Some(true), view, ctx, out)?,
        Cmd::Zrangestore => zrange(args, 2, None, None, view, ctx, out)?,
        Cmd::Zrank | Cmd::Zrevrank => {
            let rank = match find(view, ctx, key)? {
                None => None,
                Some(m) => rank_of(view, m.generation, &args[2], cmd == Cmd::Zrevrank)?,
            };
            match rank {
                None => out.null(),
                Some(r) => out.int(r),
            }
        }
        Cmd::Zpopmin | Cmd::Zpopmax => zpop(args, cmd == Cmd::Zpopmax, view.txn(), ctx, out)?,
        Cmd::Zunionstore | Cmd::Zinterstore | Cmd::Zdiffstore => {
            combine_store(cmd, args, view.txn(), ctx, out)?
        }
        Cmd::Zunion | Cmd::Zinter | Cmd::Zdiff => combine_reply(cmd, args, view, ctx, out)?,
        Cmd::Zintercard => {
            let (result, _) = combine(cmd, args, view, ctx)?;
            out.int(result.len() as i64);
        }
        Cmd::Zmpop => {
            if !zmpop(args, 1, view.txn(), ctx, out)? {
                out.null_array();
            }
        }
        Cmd::Bzpopmin | Cmd::Bzpopmax | Cmd::Bzmpop => {
            // Inside MULTI there is no blocking: nothing to pop is a timeout at once.
            if !run_blocking(cmd, args, view.txn(), ctx, out)? {
                out.null_array();
            }
        }
        Cmd::Zremrangebyscore | Cmd::Zremrangebyrank | Cmd::Zremrangebylex => {
            zremrange(cmd, args, view.txn(), ctx, out)?
        }
        Cmd::Zscan => zscan(args, view, ctx, out)?,
        Cmd::Zrandmember => zrandmember(args, view, ctx, out)?,
        other => panic!("{other:?} is not a sorted set command"),
    }
    Ok(())
}

/// How many members a lex range holds (`ZLEXCOUNT`).
fn by_lex_count(view: &mut View<'_, '_>, generation: u64, range: &LexRange) -> i64 {
    if !lex_nonempty(view, generation, range) {
        return 0;
    }
    let (lo, hi) = all(generation);
    let mut started = false;
    let mut n = 0;
    walk(view, lo, hi, false, |m, _| {
        if !started {
            if !range.gte_min(m) {
                return ControlFlow::Continue(());
            }
            started = true;
        }
        if !range.lte_max(m) {
            return ControlFlow::Break(());
        }
        n += 1;
        ControlFlow::Continue(())
    });
    n
}

/// A member's rank, counted by scanning the index up to it (from the top with `rev`).
fn rank_of(
    view: &mut View<'_, '_>,
    generation: u64,
    member: &[u8],
    rev: bool,
) -> Result<Option<i64>, Fail> {
    let Some(s) = score_of(view, generation, member)? else {
        return Ok(None);
    };
    let at = index_key(generation, s, member);
    let (lo, hi) = all(generation);
    let (lo, hi) = if rev {
        (Bound::Excluded(at), hi)
    } else {
        (lo, Bound::Excluded(at))
    };
    let mut n = 0;
    walk(view, lo, hi, false, |_, _| {
        n += 1;
        ControlFlow::Continue(())
    });
    Ok(Some(n))
}

/// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]`, and `ZINCRBY key
/// increment member` (`incr`: options are not parsed, the pair starts at `args[2]`).
fn zadd(
    args: &[Bytes],
    mut at: usize,
    zincrby: bool,
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let (mut nx, mut xx, mut gt, mut lt, mut ch, mut incr) =
        (false, false, false, false, false, zincrby);
    if !zincrby {
        while at < args.len() {
            let opt = &args[at];
            let flag = if opt.eq_ignore_ascii_case(b"nx") {
                &mut nx
            } else if opt.eq_ignore_ascii_case(b"xx") {
                &mut xx
            } else if opt.eq_ignore_ascii_case(b"ch") {
                &mut ch
            } else if opt.eq_ignore_ascii_case(b"incr") {
                &mut incr
            } else if opt.eq_ignore_ascii_case(b"gt") {
                &mut gt
            } else if opt.eq_ignore_ascii_case(b"lt") {
                &mut lt
            } else {
                break;
            };
            *flag = true;
            at += 1;
        }
    }
    let pairs = &args[at..];
    if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
        return Err(SYNTAX.into());
    }
    if nx && xx {
        return Err("ERR XX and NX options at the same time are not compatible".into());
    }
    if ((gt || lt) && nx) || (gt && lt) {
        return Err("ERR GT, LT, and/or NX options at the same time are not compatible".into());
    }
    if incr && pairs.len() > 2 {
        return Err("ERR INCR option supports a single increment-element pair".into());
    }
    let mut scores = Vec::with_capacity(pairs.len() / 2);
    for pair in pairs.chunks(2) {
        scores.push(parse_score(&pair[0]).ok_or(NOT_FLOAT)?);
    }
    let key = &args[1];
    let meta = match find(&mut View::Txn(t), ctx, key)? {
        Some(m) => m,
        None if xx => {
            if incr {
                out.null();
            } else {
                out.int(0);
            }
            return Ok(());
        }
        None => {
            let meta = Meta::collection(Type::ZSet);
            ks::put_meta(t, key, &meta, 0)?;
            meta
        }
    };
    if incr && !(nx || xx || gt || lt) && scores[0] != 0.0 && ctx.track_increments {
        // As `HINCRBY`: the engine's score add, which moves the member's index entry at
        // commit and replies with the sum it resolves to. Only whether the member is new (for
        // the size) is read, and only its presence is validated, so concurrent increments of
        // one member do not conflict. (An increment of 0 changes nothing, as in Redis, and
        // reads.)
        let member = &pairs[1];
        let sk = score_key(meta.generation, member);
        let new = !t.exists_for_write(&sk)?;
        t.score_add(
            &sk,
            scores[0],
            &ks::sub_prefix(ZSET_INDEX, meta.generation),
            member,
        )
        .map_err(|e| incr_error(&e))?;
        // 0 for an existing member: `WATCH` sees the change.
        t.add(&ks::size_key(meta.generation), i64::from(new))?;
        out.tracked_score(t.track(&sk)?);
        return Ok(());
    }
    let (mut added, mut updated, mut processed) = (0i64, 0i64, 0i64);
    let mut last = 0.0;
    for (pair, &score) in pairs.chunks(2).zip(&scores) {
        let member = &pair[1];
        let old = score_of(&mut View::Txn(t), meta.generation, member)?;
        match old {
            Some(old) => {
                if nx {
                    continue;
                }
                let current = decode_score(old);
                let mut new = score;
                if incr {
                    new += current;
                    if new.is_nan() {
                        return Err(NAN_RESULT.into());
                    }
                }
                if (lt && new >= current) || (gt && new <= current) {
                    continue;
                }
                processed += 1;
                last = new;
                if new != current {
                    put_member(t, meta.generation, member, Some(old), new)?;
                    updated += 1;
                }
            }
            None => {
                if xx {
                    continue;
                }
                put_member(t, meta.generation, member, None, score)?;
                added += 1;
                processed += 1;
                last = score;
            }
        }
    }
    // Also when scores only changed (add 0), so that `WATCH` sees it; nothing when no
    // member was added or changed, as Redis then tells no watcher.
    if added > 0 || updated > 0 {
        t.add(&ks::size_key(meta.generation), added)?;
    }
    if incr {
        if processed > 0 {
            out.double(last);
        } else {
            out.null();
        }
    } else {
        out.int(if ch { added + updated } else { added });
    }
    Ok(())
}

/// `ZINCRBY`'s error for an engine error of its score add, which meets the member's score
/// only at commit (or at once, over the transaction's own write of the member).
pub fn incr_error(e: &keel::Error) -> Fail {
    match e {
        keel::Error::NotANumber { .. } => NAN_RESULT.into(),
        keel::Error::NotAScore { .. } => "ERR keel: damaged sorted set score".into(),
        other => crate::data::engine_error(other),
    }
}

/// What a `ZRANGE` ranges over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rank,
    Score,
    Lex,
}

/// `ZRANGE` and its older forms and `ZRANGESTORE`, as Redis's `zrangeGenericCommand`: the
/// key at `args[at]`, then min and max; `kind` and `rev` fixed by the command, or (`None`)
/// taken from the options. `at == 2`: `ZRANGESTORE` (the destination is `args[1]`).
fn zrange(
    args: &[Bytes],
    at: usize,
    kind: Option<Kind>,
    rev: Option<bool>,
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let storing = at == 2;
    let (mut kind, mut rev) = (kind, rev);
    let mut withscores = false;
    let (mut offset, mut limit) = (0i64, -1i64);
    let mut limited = false;
    let mut j = at + 3;
    while j < args.len() {
        let opt = &args[j];
        let left = args.len() - j - 1;
        if !storing && opt.eq_ignore_ascii_case(b"withscores") {
            withscores = true;
        } else if opt.eq_ignore_ascii_case(b"limit") && left >= 2 {
            offset = int_arg(&args[j + 1])?;
            limit = int_arg(&args[j + 2])?;
            limited = true;
            j += 2;
        } else if rev.is_none() && opt.eq_ignore_ascii_case(b"rev") {
            rev = Some(true);
        } else if kind.is_none() && opt.eq_ignore_ascii_case(b"bylex") {
            kind = Some(Kind::Lex);
        } else if kind.is_none() && opt.eq_ignore_ascii_case(b"byscore") {
            kind = Some(Kind::Score);
        } else {
            return Err(SYNTAX.into());
        }
        j += 1;
    }
    let kind = kind.unwrap_or(Kind::Rank);
    let rev = rev.unwrap_or(false);
    // Redis tests `limit != -1`: `LIMIT 0 -1` with a rank range passes.
    if limited && limit != -1 && kind == Kind::Rank {
        return Err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX"
                .into(),
        );
    }
    if withscores && kind == Kind::Lex {
        return Err("ERR syntax error, WITHSCORES not supported in combination with BYLEX".into());
    }
    let (mut min, mut max) = (&args[at + 1], &args[at + 2]);
    if rev && kind != Kind::Rank {
        std::mem::swap(&mut min, &mut max);
    }
    enum Range {
        Rank(i64, i64),
        Score(Option<(u64, u64)>),
        Lex(LexRange),
    }
    let range = match kind {
        Kind::Rank => Range::Rank(int_arg(min)?, int_arg(max)?),
        Kind::Score => Range::Score(score_range(min, max)?),
        Kind::Lex => Range::Lex(LexRange::parse(min, max)?),
    };
    let src = &args[at];
    let meta = if storing {
        find(&mut View::Txn(view.txn()), ctx, src)?
    } else {
        find(view, ctx, src)?
    };
    let items = match meta {
        None => Vec::new(),
        Some(m) => match &range {
            Range::Rank(start, end) => {
                by_rank(view, ctx.reply_bytes_max, m.generation, *start, *end, rev)?
            }
            Range::Score(r) => by_score(
                view,
                ctx.reply_bytes_max,
                m.generation,
                *r,
                offset,
                limit,
                rev,
            )?,
            Range::Lex(r) => by_lex(
                view,
                ctx.reply_bytes_max,
                m.generation,
                r,
                offset,
                limit,
                rev,
            )?,
        },
    };
    if storing {
        store(view.txn(), ctx, &args[1], &items)?;
        out.int(items.len() as i64);
    } else {
        reply_scored(out, &items, withscores);
    }
    Ok(())
}

/// `ZPOPMIN`/`ZPOPMAX key [count]` (`max`: from the top).
fn zpop(
    args: &[Bytes],
    max: bool,
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    if args.len() > 3 {
        return Err(SYNTAX.into());
    }
    let count = match args.get(2) {
        None => None,
        Some(a) => Some(string_to_i64(a).filter(|&n| n >= 0).ok_or(NOT_POSITIVE)?),
    };
    let key = &args[1];
    let Some(meta) = find(&mut View::Txn(t), ctx, key)? else {
        out.array(0);
        return Ok(());
    };
    if count == Some(0) {
        out.array(0);
        return Ok(());
    }
    let items = pop_members(t, key, &meta, max, count.unwrap_or(1), ctx)?;
    let nested = count.is_some() && out.proto == Proto::Resp3;
    out.array(if nested { items.len() } else { 2 * items.len() });
    for (m, s) in &items {
        if nested {
            out.array(2);
        }
        out.bulk(m);
        out.double(*s);
    }
    Ok(())
}

/// Pops `want` members (or all there are) from the sorted set `key` (`meta`), the lowest
/// scores first, or the highest with `max`.
fn pop_members(
    t: &mut Txn<'_>,
    key: &[u8],
    meta: &Meta,
    max: bool,
    want: i64,
    ctx: &Ctx<'_>,
) -> Result<Vec<Scored>, Fail> {
    let (mut lo, mut hi) = all(meta.generation);
    // Where this transaction's last pop of this set left off, if nothing was written since:
    // every member before it is popped, so the scan starts there instead of passing them
    // all again (a pipeline of pops runs as one transaction). The pops before cover the
    // rest of the range the commit checks.
    if let Some(left) = t.note::<PopsLeftOff>()
        && left.generation == meta.generation
        && left.max == max
        && left.writes == t.write_count()
    {
        if max {
            hi = Bound::Excluded(left.after.clone());
        } else {
            lo = Bound::Excluded(left.after.clone());
        }
    }
    let mut got = Collect::new(ctx.reply_bytes_max);
    let mut left = want;
    // One member past those popped, if any, says the set stays non-empty without reading its
    // size record, which every pop writes: pops then conflict only on the members they read.
    let mut more = false;
    walk(&mut View::Txn(t), lo, hi, max, |m, s| {
        if left == 0 {
            more = true;
            return ControlFlow::Break(());
        }
        if got.push(m, s).is_break() {
            return ControlFlow::Break(());
        }
        left -= 1;
        ControlFlow::Continue(())
    });
    let items = got.done()?;
    for (m, s) in &items {
        delete_member(t, meta.generation, m, encode_score(*s))?;
    }
    if more {
        t.add(&ks::size_key(meta.generation), -(items.len() as i64))?;
    } else {
        shrink(t, key, meta, items.len() as i64)?;
    }
    if let Some((member, score)) = items.last() {
        let after = index_key(meta.generation, encode_score(*score), member);
        let writes = t.write_count();
        t.set_note(PopsLeftOff {
            generation: meta.generation,
            max,
            after,
            writes,
        });
    }
    Ok(items)
}

/// Where a transaction's last pop of a sorted set left off ([`pop_members`]): the index key
/// of the last member it popped, which holds while the transaction's write count is
/// `writes`.
struct PopsLeftOff {
    generation: u64,
    max: bool,
    after: Vec<u8>,
    writes: u64,
}

/// What the set operations over sorted sets (and sets) compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SetOp {
    Union,
    Inter,
    Diff,
}

/// `cmd`'s `numkeys key [key ...]` and the options that follow (`WEIGHTS`, `AGGREGATE`,
/// `WITHSCORES`, `LIMIT`), computed as Redis's `zunionInterDiffGenericCommand` does: the keys
/// are looked up (`WRONGTYPE` for a key that is neither a set nor a sorted set) before the
/// options are read. A `…STORE` command's destination takes the result, so `WITHSCORES` is
/// refused there; `ZINTERCARD` takes only `LIMIT`, and its intersection stops at it. Returns
/// the result (in no order) and whether scores were asked for.
fn combine(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
) -> Result<(Vec<Scored>, bool), Fail> {
    let (name, op, at) = match cmd {
        Cmd::Zunionstore => ("zunionstore", SetOp::Union, 2),
        Cmd::Zinterstore => ("zinterstore", SetOp::Inter, 2),
        Cmd::Zdiffstore => ("zdiffstore", SetOp::Diff, 2),
        Cmd::Zunion => ("zunion", SetOp::Union, 1),
        Cmd::Zinter => ("zinter", SetOp::Inter, 1),
        Cmd::Zdiff => ("zdiff", SetOp::Diff, 1),
        Cmd::Zintercard => ("zintercard", SetOp::Inter, 1),
        other => unreachable!("{other:?} combines no sets"),
    };
    let (store, card) = (at == 2, cmd == Cmd::Zintercard);
    let numkeys = string_to_i64(&args[at]).ok_or(NOT_INTEGER)?;
    if numkeys < 1 {
        return Err(format!("ERR at least 1 input key is needed for '{name}' command").into());
    }
    if numkeys > (args.len() - at - 1) as i64 {
        return Err(SYNTAX.into());
    }
    let numkeys = numkeys as usize;
    let mut sources = Vec::with_capacity(numkeys);
    for key in &args[at + 1..at + 1 + numkeys] {
        match ks::lookup(view, &ctx.clock, key, false)? {
            ks::Held::Absent => sources.push(None),
            ks::Held::Meta(m) if matches!(m.ty, Type::Set | Type::ZSet) => sources.push(Some(m)),
            _ => return Err(WRONGTYPE.into()),
        }
    }
    let mut weights = vec![1.0f64; numkeys];
    #[derive(Clone, Copy)]
    enum Aggregate {
        Sum,
        Min,
        Max,
    }
    let mut aggregate = Aggregate::Sum;
    let (mut withscores, mut limit) = (false, 0usize);
    let mut j = at + 1 + numkeys;
    while j < args.len() {
        let left = args.len() - j;
        let opt = &args[j];
        if op != SetOp::Diff && !card && left > numkeys && opt.eq_ignore_ascii_case(b"weights") {
            for (i, w) in weights.iter_mut().enumerate() {
                *w = parse_score(&args[j + 1 + i]).ok_or("ERR weight value is not a float")?;
            }
            j += 1 + numkeys;
        } else if op != SetOp::Diff && !card && left >= 2 && opt.eq_ignore_ascii_case(b"aggregate")
        {
            let a = &args[j + 1];
            aggregate = if a.eq_ignore_ascii_case(b"sum") {
                Aggregate::Sum
            } else if a.eq_ignore_ascii_case(b"min") {
                Aggregate::Min
            } else if a.eq_ignore_ascii_case(b"max") {
                Aggregate::Max
            } else {
                return Err(SYNTAX.into());
            };
            j += 2;
        } else if !store && !card && opt.eq_ignore_ascii_case(b"withscores") {
            withscores = true;
            j += 1;
        } else if card && left >= 2 && opt.eq_ignore_ascii_case(b"limit") {
            // Redis's `getPositiveLongFromObjectOrReply`: one message for both failures.
            let n = string_to_i64(&args[j + 1])
                .filter(|&n| n >= 0)
                .ok_or("ERR LIMIT can't be negative")?;
            limit = usize::try_from(n).unwrap_or(usize::MAX);
            j += 2;
        } else {
            return Err(SYNTAX.into());
        }
    }
    let combine = |acc: f64, x: f64| -> f64 {
        match aggregate {
            Aggregate::Sum => {
                let s = acc + x;
                // +inf and -inf add up to 0 in Redis, not NaN.
                if s.is_nan() { 0.0 } else { s }
            }
            Aggregate::Min => acc.min(x),
            Aggregate::Max => acc.max(x),
        }
    };
    let weighted = |w: f64, s: f64| {
        let x = w * s;
        if x.is_nan() { 0.0 } else { x }
    };
    if op == SetOp::Diff {
        // The first input's members that no other input has, at their scores there.
        let mut rest = sources.into_iter();
        let Some(Some(first)) = rest.next() else {
            return Ok((Vec::new(), withscores));
        };
        let others: Vec<Meta> = rest.flatten().collect();
        let mut result = Vec::new();
        'diff: for (member, s) in members_of(view, ctx, &first)? {
            for m in &others {
                if score_in(view, m, &member)?.is_some() {
                    continue 'diff;
                }
            }
            result.push((member, s));
        }
        return Ok((result, withscores));
    }
    // Smallest first, as Redis orders its inputs (a stable sort, so ties keep their order).
    let mut inputs: Vec<(i64, usize, Option<Meta>)> = Vec::with_capacity(numkeys);
    for (i, m) in sources.into_iter().enumerate() {
        let n = match &m {
            None => 0,
            Some(m) if m.ty == Type::Set => sets::set_len(view, m)?,
            Some(m) => size(view, m.generation)?,
        };
        inputs.push((n, i, m));
    }
    inputs.sort_by_key(|(n, _, _)| *n);
    let mut result: Vec<Scored> = Vec::new();
    if op == SetOp::Inter {
        if inputs.iter().all(|(_, _, m)| m.is_some()) {
            let (_, first_i, first) = &inputs[0];
            let first = first.as_ref().expect("checked");
            'members: for (member, s) in members_of(view, ctx, first)? {
                let mut acc = weighted(weights[*first_i], s);
                for (_, i, m) in &inputs[1..] {
                    let m = m.as_ref().expect("checked");
                    let Some(s) = score_in(view, m, &member)? else {
                        continue 'members;
                    };
                    acc = combine(acc, weighted(weights[*i], s));
                }
                result.push((member, acc));
                if card && result.len() == limit {
                    break;
                }
            }
        }
    } else {
        let mut acc: HashMap<Vec<u8>, f64> = HashMap::new();
        let mut order = Vec::new();
        for (_, i, m) in &inputs {
            let Some(m) = m else { continue };
            for (member, s) in members_of(view, ctx, m)? {
                let x = weighted(weights[*i], s);
                match acc.get_mut(&member) {
                    Some(a) => *a = combine(*a, x),
                    None => {
                        if acc.len() >= REPLY_ITEMS_MAX {
                            return Err(reply_too_big());
                        }
                        order.push(member.clone());
                        acc.insert(member, x);
                    }
                }
            }
        }
        result = order
            .into_iter()
            .map(|m| {
                let s = acc[&m];
                (m, s)
            })
            .collect();
    }
    Ok((result, withscores))
}

/// `ZUNIONSTORE`, `ZINTERSTORE`, `ZDIFFSTORE destination numkeys key [key ...] [options]`.
fn combine_store(
    cmd: Cmd,
    args: &[Bytes],
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let (result, _) = combine(cmd, args, &mut View::Txn(t), ctx)?;
    store(t, ctx, &args[1], &result)?;
    out.int(result.len() as i64);
    Ok(())
}

/// `ZUNION`, `ZINTER`, `ZDIFF numkeys key [key ...] [options] [WITHSCORES]`: the result in
/// score order, then by member, as `ZRANGE` would list it stored.
fn combine_reply(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let (mut result, withscores) = combine(cmd, args, view, ctx)?;
    result.sort_by(|a, b| {
        a.1.partial_cmp(&b.1)
            .unwrap_or(Ordering::Equal)
            .then_with(|| a.0.cmp(&b.0))
    });
    reply_scored(out, &result, withscores);
    Ok(())
}

/// `ZMPOP numkeys key [key ...] MIN|MAX [COUNT count]` (from `args[at]`; `BZMPOP` has its
/// timeout first): pops from the first of the keys that holds a sorted set. `false`, with
/// nothing written, when none does.
fn zmpop(
    args: &[Bytes],
    at: usize,
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<bool, Fail> {
    let how = zmpop_args(args, at)?;
    zmpop_keys(args, how, t, ctx, out)
}

/// What `ZMPOP`'s arguments from `args[at]` ask: where its keys are, whether it pops the
/// highest scores, and how many.
struct Mpop {
    keys: std::ops::Range<usize>,
    max: bool,
    count: i64,
}

fn zmpop_args(args: &[Bytes], at: usize) -> Result<Mpop, Fail> {
    let (keys, max, count) = crate::lists::mpop_parts(args, at, |w| {
        if w.eq_ignore_ascii_case(b"min") {
            Ok(false)
        } else if w.eq_ignore_ascii_case(b"max") {
            Ok(true)
        } else {
            Err(SYNTAX.into())
        }
    })?;
    Ok(Mpop {
        keys,
        max,
        count: i64::try_from(count).unwrap_or(i64::MAX),
    })
}

/// Pops as `how` says, from the first of its keys that holds a sorted set (`false`, nothing
/// written, if none does).
fn zmpop_keys(
    args: &[Bytes],
    how: Mpop,
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<bool, Fail> {
    for key in &args[how.keys] {
        let Some(meta) = find(&mut View::Txn(t), ctx, key)? else {
            continue;
        };
        let items = pop_members(t, key, &meta, how.max, how.count, ctx)?;
        out.array(2);
        out.bulk(key);
        out.array(items.len());
        for (m, s) in &items {
            out.array(2);
            out.bulk(m);
            out.double(*s);
        }
        return Ok(true);
    }
    Ok(false)
}

/// Every member of a set or sorted set with its score (1 for a set member).
fn members_of(view: &mut View<'_, '_>, ctx: &Ctx<'_>, m: &Meta) -> Result<Vec<Scored>, Fail> {
    let mut got = Collect::new(ctx.reply_bytes_max);
    if m.ty == Type::Set {
        for member in sets::members(view, ctx, m)? {
            if got.push(&member, encode_score(1.0)).is_break() {
                break;
            }
        }
    } else {
        let (lo, hi) = all(m.generation);
        walk(view, lo, hi, false, |member, s| got.push(member, s));
    }
    got.done()
}

/// `member`'s score in a set (1) or sorted set.
fn score_in(view: &mut View<'_, '_>, m: &Meta, member: &[u8]) -> Result<Option<f64>, Fail> {
    if m.ty == Type::Set {
        return Ok(sets::is_member(view, m, member)?.then_some(1.0));
    }
    Ok(score_of(view, m.generation, member)?.map(decode_score))
}

/// `ZREMRANGEBYSCORE`, `ZREMRANGEBYRANK`, `ZREMRANGEBYLEX key min max`.
fn zremrange(
    cmd: Cmd,
    args: &[Bytes],
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    enum Range {
        Rank(i64, i64),
        Score(Option<(u64, u64)>),
        Lex(LexRange),
    }
    let range = match cmd {
        Cmd::Zremrangebyrank => Range::Rank(int_arg(&args[2])?, int_arg(&args[3])?),
        Cmd::Zremrangebyscore => Range::Score(score_range(&args[2], &args[3])?),
        _ => Range::Lex(LexRange::parse(&args[2], &args[3])?),
    };
    let key = &args[1];
    let Some(meta) = find(&mut View::Txn(t), ctx, key)? else {
        out.int(0);
        return Ok(());
    };
    let g = meta.generation;
    // Removal is not bounded by a reply, but by what one transaction may write.
    let unbounded = usize::MAX;
    let mut view = View::Txn(t);
    let doomed = match &range {
        Range::Rank(start, end) => by_rank(&mut view, unbounded, g, *start, *end, false)?,
        Range::Score(r) => by_score(&mut view, unbounded, g, *r, 0, -1, false)?,
        Range::Lex(r) => by_lex(&mut view, unbounded, g, r, 0, -1, false)?,
    };
    for (m, s) in &doomed {
        delete_member(t, g, m, encode_score(*s))?;
    }
    shrink(t, key, &meta, doomed.len() as i64)?;
    out.int(doomed.len() as i64);
    Ok(())
}

/// `ZSCAN key cursor [MATCH pattern] [COUNT count]`, in score order.
fn zscan(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let cursor = parse_cursor(&args[2])?;
    let Some(meta) = find(view, ctx, &args[1])? else {
        out.array(2);
        out.bulk(b"0");
        out.array(0);
        return Ok(());
    };
    let (pattern, mut count) = scan_options(args)?;
    let g = meta.generation;
    let (lo, hi) = all(g);
    let lo = if let Some(after) = ctx.cursors.resume(cursor)? {
        let mut k = ks::sub_prefix(ZSET_INDEX, g).to_vec();
        k.extend_from_slice(&after);
        Bound::Excluded(k)
    } else {
        lo
    };
    if cursor == 0 && size(view, g)? as u64 <= ZSCAN_WHOLE_MEMBERS_MAX {
        count = ZSCAN_WHOLE_MEMBERS_MAX as usize + 1;
    }
    let mut got = Collect::new(ctx.reply_bytes_max);
    let mut last = Vec::new();
    walk(view, lo, hi, false, |m, s| {
        if got.push(m, s).is_break() {
            return ControlFlow::Break(());
        }
        last.clear();
        last.extend_from_slice(&s.to_be_bytes());
        last.extend_from_slice(m);
        if got.items.len() >= count {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    let visited = got.done()?;
    let next = if visited.len() == count {
        ctx.cursors.save(last)
    } else {
        0
    };
    let hits: Vec<&Scored> = visited
        .iter()
        .filter(|(m, _)| pattern.is_none_or(|p| glob::matches(p, m)))
        .collect();
    out.array(2);
    out.bulk(next.to_string().as_bytes());
    out.array(hits.len() * 2);
    for (m, s) in hits {
        out.bulk(m);
        out.bulk(crate::reply::format_double(*s).as_bytes());
    }
    Ok(())
}

/// `ZRANDMEMBER key [count [WITHSCORES]]`.
fn zrandmember(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let count = random_count_arg(args.get(2))?;
    let withscores = match args.get(3) {
        None => false,
        Some(a) if args.len() == 4 && a.eq_ignore_ascii_case(b"withscores") => true,
        Some(_) => return Err(SYNTAX.into()),
    };
    if args.len() > 4 {
        return Err(SYNTAX.into());
    }
    if withscores && count.is_some_and(|n| !(-(i64::MAX / 2)..=i64::MAX / 2).contains(&n)) {
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
        let (lo, hi) = all(m.generation);
        let mut i = 0;
        let mut chosen = None;
        walk(view, lo, hi, false, |member, _| {
            if i == pick {
                chosen = Some(member.to_vec());
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
    let (lo, hi) = all(m.generation);
    let mut got = Collect::new(ctx.reply_bytes_max);
    walk(view, lo, hi, false, |member, s| got.push(member, s));
    let every = got.done()?;
    let picks = random_picks(every.len(), count)?;
    let bytes: usize = picks.iter().map(|&i| every[i].0.len() + 40).sum();
    if bytes > ctx.reply_bytes_max {
        return Err(reply_too_big());
    }
    let picked: Vec<Scored> = picks.iter().map(|&i| every[i].clone()).collect();
    reply_scored(out, &picked, withscores);
    Ok(())
}

#[cfg(test)]
mod tests;
