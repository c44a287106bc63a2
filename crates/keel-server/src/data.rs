//! The data commands: strings, keys and keel's own, each run against one engine transaction
//! (or, for a read-only command outside `MULTI`, one read-only snapshot).
//!
//! A command here never commits: the caller owns the transaction, commits it, and retries it on
//! a conflict, so a command must have no effect outside the transaction and must be safe to run
//! again. Replies are written as the command runs; the caller truncates them on retry.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::ops::{Bound, ControlFlow};

use bytes::Bytes;
use keel::{Snapshot, Txn};
use parking_lot::Mutex;

use crate::glob;
use crate::reply::Out;
use crate::resp::string_to_i64;
use crate::table::Cmd;

/// An error reply: the text starts with the error code (`ERR`, `WRONGTYPE`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fail(pub Cow<'static, str>);

impl From<&'static str> for Fail {
    fn from(s: &'static str) -> Fail {
        Fail(Cow::Borrowed(s))
    }
}

impl From<String> for Fail {
    fn from(s: String) -> Fail {
        Fail(Cow::Owned(s))
    }
}

impl From<keel::Error> for Fail {
    fn from(e: keel::Error) -> Fail {
        engine_error(&e)
    }
}

/// The Redis error for an engine error.
pub fn engine_error(e: &keel::Error) -> Fail {
    match e {
        keel::Error::NotAnInteger { .. } => NOT_INTEGER.into(),
        keel::Error::Overflow { .. } => "ERR increment or decrement would overflow".into(),
        other => format!("ERR keel: {other}").into(),
    }
}

pub const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
pub const SYNTAX: &str = "ERR syntax error";
const NOT_FLOAT: &str = "ERR value is not a valid float";
const TOO_BIG: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";

/// Most items one `KEYS` or `KEEL.RANGE` reply may hold: the reply is built in memory.
pub const REPLY_ITEMS_MAX: usize = 1 << 20;
/// Most keys one `FLUSHDB` transaction deletes; outside `MULTI` the server loops.
pub const FLUSH_BATCH_KEYS: usize = 100_000;
/// Live `SCAN` cursors kept; the oldest is forgotten first.
pub const SCAN_CURSORS_MAX: usize = 1 << 16;
/// Most keys one `SCAN` call visits, whatever `COUNT` says.
pub const SCAN_COUNT_MAX: usize = 1 << 16;

/// Where a command reads and writes.
pub enum View<'a, 'db> {
    /// A read-write transaction (every command inside `MULTI`, writes outside it).
    Txn(&'a mut Txn<'db>),
    /// A read-only snapshot (read-only commands outside `MULTI`).
    Snap(&'a Snapshot<'db>),
}

impl<'db> View<'_, 'db> {
    fn get_with<T>(
        &mut self,
        key: &[u8],
        f: impl FnOnce(Option<&[u8]>) -> T,
    ) -> Result<T, keel::Error> {
        match self {
            View::Txn(t) => t.get_with(key, f),
            View::Snap(s) => s.get_with(key, f),
        }
    }

    fn txn(&mut self) -> &mut Txn<'db> {
        match self {
            View::Txn(t) => t,
            View::Snap(_) => panic!("a write command was given a read-only snapshot"),
        }
    }

    /// Calls `f` on each pair in `(lo, hi)`, in order (or reversed), until it says stop.
    fn range(
        &mut self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
        mut f: impl FnMut(Vec<u8>, Vec<u8>) -> ControlFlow<()>,
    ) {
        fn drive(
            it: &mut dyn DoubleEndedIterator<Item = (Vec<u8>, Vec<u8>)>,
            rev: bool,
            f: &mut dyn FnMut(Vec<u8>, Vec<u8>) -> ControlFlow<()>,
        ) {
            loop {
                let next = if rev { it.next_back() } else { it.next() };
                let Some((k, v)) = next else { return };
                if f(k, v).is_break() {
                    return;
                }
            }
        }
        match self {
            View::Txn(t) => drive(&mut t.range((lo, hi)), rev, &mut f),
            View::Snap(s) => drive(&mut s.range((lo, hi)), rev, &mut f),
        }
    }
}

/// `SCAN` cursors: the last key a scan returned, under a number the client passes back. Shared
/// by all connections (a cursor may be continued on another), bounded by [`SCAN_CURSORS_MAX`].
#[derive(Default)]
pub struct Cursors {
    inner: Mutex<CursorTable>,
}

#[derive(Default)]
struct CursorTable {
    next: u64,
    by_id: HashMap<u64, Vec<u8>>,
    order: VecDeque<u64>,
}

impl Cursors {
    fn save(&self, last_key: Vec<u8>) -> u64 {
        let mut t = self.inner.lock();
        t.next += 1;
        // Spread ids so that clients cannot mistake them for offsets; never 0.
        let id = t.next.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        if t.order.len() >= SCAN_CURSORS_MAX
            && let Some(old) = t.order.pop_front()
        {
            t.by_id.remove(&old);
        }
        t.by_id.insert(id, last_key);
        t.order.push_back(id);
        id
    }

    fn load(&self, id: u64) -> Option<Vec<u8>> {
        self.inner.lock().by_id.get(&id).cloned()
    }
}

/// What data commands need besides the transaction.
pub struct Ctx<'a> {
    /// `proto-max-bulk-len`: the largest string `APPEND`/`SETRANGE` may build.
    pub bulk_bytes_max: i64,
    /// `SCAN` cursors.
    pub cursors: &'a Cursors,
    /// The output buffer limit: most bytes one reply may take.
    pub reply_bytes_max: usize,
    /// `INCR` and its kin apply the engine's commutative `add` and reply with the value it
    /// resolves to at commit ([`Out::tracked`]): they read nothing, so concurrent increments
    /// of one key never conflict. The caller fills the replies after the commit, and runs
    /// the commands again with this off (reading, as Redis does) when it needs every reply
    /// of an attempt that did not commit.
    pub track_increments: bool,
}

/// The error for a reply over the output buffer limit.
pub fn reply_too_big() -> Fail {
    "ERR keel: reply exceeds the output buffer limit (reply-bytes-max)".into()
}

/// Whether `cmd` only reads, so that outside `MULTI` it may run on a snapshot.
pub fn is_read_only(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Get
            | Cmd::Mget
            | Cmd::Strlen
            | Cmd::Getrange
            | Cmd::Exists
            | Cmd::Type
            | Cmd::Keys
            | Cmd::Scan
            | Cmd::Dbsize
            | Cmd::KeelRange
    )
}

/// Whether `cmd` only applies a commutative operation (`KEEL.ADD`/`MAX`/`MIN`): it reads
/// nothing, so the engine may apply it to a split key's per-core slices.
pub fn is_commutative(cmd: Cmd) -> bool {
    matches!(cmd, Cmd::KeelAdd | Cmd::KeelMax | Cmd::KeelMin)
}

/// The keys a data command touches by name (for prefetching; a hint, so a command whose
/// arguments are not keys, like `KEEL.RANGE`'s bounds, may give a few that are not).
pub fn keys(cmd: Cmd, args: &[Bytes]) -> impl Iterator<Item = &[u8]> {
    let (step, all) = match cmd {
        Cmd::Mset | Cmd::Msetnx => (2, true),
        Cmd::Mget | Cmd::Del | Cmd::Unlink | Cmd::Exists => (1, true),
        _ => (1, false),
    };
    let end = if all { args.len() } else { args.len().min(2) };
    args.get(1..end)
        .unwrap_or_default()
        .iter()
        .step_by(step)
        .map(|a| &a[..])
}

/// Whether `cmd` is a data command (runs in a transaction).
pub fn is_data(cmd: Cmd) -> bool {
    is_read_only(cmd)
        || matches!(
            cmd,
            Cmd::Set
                | Cmd::Setnx
                | Cmd::Getset
                | Cmd::Getdel
                | Cmd::Mset
                | Cmd::Msetnx
                | Cmd::Append
                | Cmd::Setrange
                | Cmd::Incr
                | Cmd::Incrby
                | Cmd::Decr
                | Cmd::Decrby
                | Cmd::Incrbyfloat
                | Cmd::Del
                | Cmd::Unlink
                | Cmd::Rename
                | Cmd::Flushdb
                | Cmd::Flushall
                | Cmd::KeelMax
                | Cmd::KeelMin
                | Cmd::KeelAdd
        )
}

fn int_arg(arg: &[u8]) -> Result<i64, Fail> {
    string_to_i64(arg).ok_or(NOT_INTEGER.into())
}

fn float_arg(arg: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(arg).ok()?;
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_whitespace()) {
        return None;
    }
    let x: f64 = s.parse().ok()?;
    (!x.is_nan()).then_some(x)
}

/// `INCRBYFLOAT`'s result text: 15 significant digits with trailing zeros trimmed, which is
/// what Redis's long-double arithmetic prints for the common cases (`0.1 + 0.2` is `0.3`).
fn format_float(x: f64) -> String {
    let magnitude = if x == 0.0 {
        0
    } else {
        x.abs().log10().floor() as i32
    };
    let decimals = usize::try_from((14 - magnitude).max(0)).expect("non-negative");
    let mut s = format!("{x:.decimals$}");
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
    if s == "-0" { "0".into() } else { s }
}

/// Parses a `KEEL.RANGE` bound: `-`/`+` unbounded, `[x` inclusive, `(x` exclusive.
fn lex_bound(arg: &[u8], low: bool) -> Result<Bound<Vec<u8>>, Fail> {
    match arg {
        b"-" if low => Ok(Bound::Unbounded),
        b"+" if !low => Ok(Bound::Unbounded),
        [b'[', rest @ ..] => Ok(Bound::Included(rest.to_vec())),
        [b'(', rest @ ..] => Ok(Bound::Excluded(rest.to_vec())),
        _ => Err("ERR min or max not valid string range item".into()),
    }
}

/// The first key after every key starting with `prefix` (`None`: no such key).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn prefix_bounds(pattern: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let prefix = glob::literal_prefix(pattern);
    if prefix.is_empty() {
        return (Bound::Unbounded, Bound::Unbounded);
    }
    let hi = prefix_end(&prefix).map_or(Bound::Unbounded, Bound::Excluded);
    (Bound::Included(prefix), hi)
}

fn wrong_args(name: &str) -> Fail {
    format!("ERR wrong number of arguments for '{name}' command").into()
}

/// Runs one data command. `args[0]` is the name; arity has been checked.
pub fn run(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    match cmd {
        Cmd::Get => view.get_with(&args[1], |v| out.bulk_or_null(v))?,
        Cmd::Set => set(args, view, out)?,
        Cmd::Setnx => {
            let t = view.txn();
            if t.get_with(&args[1], |v| v.is_some())? {
                out.int(0);
            } else {
                t.put(&args[1], &args[2])?;
                out.int(1);
            }
        }
        Cmd::Getset => {
            let t = view.txn();
            t.get_with(&args[1], |v| out.bulk_or_null(v))?;
            t.put(&args[1], &args[2])?;
        }
        Cmd::Getdel => {
            let t = view.txn();
            if t.get_with(&args[1], |v| {
                out.bulk_or_null(v);
                v.is_some()
            })? {
                t.delete(&args[1])?;
            }
        }
        Cmd::Mget => {
            out.array(args.len() - 1);
            for key in &args[1..] {
                view.get_with(key, |v| out.bulk_or_null(v))?;
                if out.buf.len() > ctx.reply_bytes_max {
                    return Err(reply_too_big());
                }
            }
        }
        Cmd::Mset | Cmd::Msetnx => {
            if args.len().is_multiple_of(2) {
                return Err(wrong_args(if cmd == Cmd::Mset { "mset" } else { "msetnx" }));
            }
            let t = view.txn();
            if cmd == Cmd::Msetnx {
                for pair in args[1..].chunks(2) {
                    if t.get_with(&pair[0], |v| v.is_some())? {
                        out.int(0);
                        return Ok(());
                    }
                }
            }
            for pair in args[1..].chunks(2) {
                t.put(&pair[0], &pair[1])?;
            }
            if cmd == Cmd::Mset {
                out.ok();
            } else {
                out.int(1);
            }
        }
        Cmd::Append => {
            let t = view.txn();
            let mut value = t.get(&args[1])?.unwrap_or_default();
            if (value.len() + args[2].len()) as u64 > ctx.bulk_bytes_max as u64 {
                return Err(TOO_BIG.into());
            }
            value.extend_from_slice(&args[2]);
            t.put(&args[1], &value)?;
            out.int(value.len() as i64);
        }
        Cmd::Strlen => {
            let len = view.get_with(&args[1], |v| v.map_or(0, <[u8]>::len))?;
            out.int(len as i64);
        }
        Cmd::Getrange => {
            let start = int_arg(&args[2])?;
            let end = int_arg(&args[3])?;
            view.get_with(&args[1], |v| {
                let v = v.unwrap_or_default();
                out.bulk(substring(v, start, end));
            })?;
        }
        Cmd::Setrange => setrange(args, view.txn(), ctx, out)?,
        Cmd::Incr | Cmd::Decr | Cmd::Incrby | Cmd::Decrby => {
            let delta = match cmd {
                Cmd::Incr => 1,
                Cmd::Decr => -1,
                Cmd::Incrby => int_arg(&args[2])?,
                _ => {
                    let n = int_arg(&args[2])?;
                    n.checked_neg().ok_or("ERR decrement would overflow")?
                }
            };
            let t = view.txn();
            if ctx.track_increments {
                t.add(&args[1], delta)?;
                out.tracked(t.track(&args[1])?);
                return Ok(());
            }
            let current = t.get_with(&args[1], |v| v.map(string_to_i64))?;
            let base = match current {
                None => 0,
                Some(Some(n)) => n,
                Some(None) => return Err(NOT_INTEGER.into()),
            };
            let sum = base
                .checked_add(delta)
                .ok_or("ERR increment or decrement would overflow")?;
            t.put(&args[1], sum.to_string().as_bytes())?;
            out.int(sum);
        }
        Cmd::Incrbyfloat => {
            let incr = float_arg(&args[2]).ok_or(NOT_FLOAT)?;
            let t = view.txn();
            let base = match t.get(&args[1])? {
                None => 0.0,
                Some(v) => float_arg(&v).ok_or(NOT_FLOAT)?,
            };
            let sum = base + incr;
            if !sum.is_finite() {
                return Err("ERR increment would produce NaN or Infinity".into());
            }
            let text = format_float(sum);
            t.put(&args[1], text.as_bytes())?;
            out.bulk(text.as_bytes());
        }
        Cmd::Del | Cmd::Unlink => {
            let t = view.txn();
            let mut deleted = 0;
            for key in &args[1..] {
                if t.get_with(key, |v| v.is_some())? {
                    t.delete(key)?;
                    deleted += 1;
                }
            }
            out.int(deleted);
        }
        Cmd::Exists => {
            let mut n = 0;
            for key in &args[1..] {
                if view.get_with(key, |v| v.is_some())? {
                    n += 1;
                }
            }
            out.int(n);
        }
        Cmd::Type => {
            if view.get_with(&args[1], |v| v.is_some())? {
                out.simple("string");
            } else {
                out.simple("none");
            }
        }
        Cmd::Rename => {
            let t = view.txn();
            let value = t.get(&args[1])?.ok_or("ERR no such key")?;
            if args[1] != args[2] {
                t.put(&args[2], &value)?;
                t.delete(&args[1])?;
            }
            out.ok();
        }
        Cmd::Keys => {
            let pattern = &args[1];
            let (lo, hi) = prefix_bounds(pattern);
            let mut keys = Vec::new();
            let mut too_many = false;
            let mut bytes = 0;
            view.range(lo, hi, false, |k, _| {
                if glob::matches(pattern, &k) {
                    bytes += k.len() + 16;
                    if keys.len() >= REPLY_ITEMS_MAX || bytes > ctx.reply_bytes_max {
                        too_many = true;
                        return ControlFlow::Break(());
                    }
                    keys.push(k);
                }
                ControlFlow::Continue(())
            });
            if too_many {
                return Err(format!(
                    "ERR keel: KEYS matches more than {REPLY_ITEMS_MAX} keys or the output \
                     buffer limit; use SCAN"
                )
                .into());
            }
            out.array(keys.len());
            for k in &keys {
                out.bulk(k);
            }
        }
        Cmd::Scan => scan(args, view, ctx, out)?,
        Cmd::Dbsize => {
            let mut n = 0;
            view.range(Bound::Unbounded, Bound::Unbounded, false, |_, _| {
                n += 1;
                ControlFlow::Continue(())
            });
            out.int(n);
        }
        Cmd::Flushdb | Cmd::Flushall => {
            if args.len() > 2
                || args.get(1).is_some_and(|a| {
                    !a.eq_ignore_ascii_case(b"sync") && !a.eq_ignore_ascii_case(b"async")
                })
            {
                return Err(SYNTAX.into());
            }
            if flush_batch(view.txn())? {
                return Err(format!(
                    "ERR keel: FLUSHDB inside MULTI deletes at most {FLUSH_BATCH_KEYS} keys"
                )
                .into());
            }
            out.ok();
        }
        Cmd::KeelRange => keel_range(args, view, ctx, out)?,
        Cmd::KeelMax | Cmd::KeelMin | Cmd::KeelAdd => {
            let n = int_arg(&args[2])?;
            let t = view.txn();
            match cmd {
                Cmd::KeelMax => t.max(&args[1], n)?,
                Cmd::KeelMin => t.min(&args[1], n)?,
                _ => t.add(&args[1], n)?,
            }
            out.ok();
        }
        other => panic!("{other:?} is not a data command"),
    }
    Ok(())
}

/// Deletes up to [`FLUSH_BATCH_KEYS`] keys in `txn`; `true` when more remain.
pub fn flush_batch(txn: &mut Txn<'_>) -> Result<bool, Fail> {
    let mut keys = Vec::new();
    let mut more = false;
    for (k, _) in txn.range::<Vec<u8>>(..) {
        if keys.len() == FLUSH_BATCH_KEYS {
            more = true;
            break;
        }
        keys.push(k);
    }
    for k in &keys {
        txn.delete(k)?;
    }
    Ok(more)
}

fn substring(v: &[u8], start: i64, end: i64) -> &[u8] {
    let len = v.len() as i64;
    if start < 0 && end < 0 && start > end {
        return &[];
    }
    let mut start = if start < 0 { len + start } else { start };
    let mut end = if end < 0 { len + end } else { end };
    start = start.max(0);
    end = end.max(0);
    if end >= len {
        end = len - 1;
    }
    if start > end || len == 0 {
        return &[];
    }
    &v[start as usize..=end as usize]
}

fn set(args: &[Bytes], view: &mut View<'_, '_>, out: &mut Out<'_>) -> Result<(), Fail> {
    let (mut nx, mut xx, mut get) = (false, false, false);
    let mut i = 3;
    while i < args.len() {
        let opt = &args[i];
        if opt.eq_ignore_ascii_case(b"nx") && !xx {
            nx = true;
        } else if opt.eq_ignore_ascii_case(b"xx") && !nx {
            xx = true;
        } else if opt.eq_ignore_ascii_case(b"get") {
            get = true;
        } else if opt.eq_ignore_ascii_case(b"keepttl") {
            // keel has no expiry yet, so there is no TTL to keep.
        } else if ["ex", "px", "exat", "pxat"]
            .iter()
            .any(|o| opt.eq_ignore_ascii_case(o.as_bytes()))
        {
            if i + 1 >= args.len() {
                return Err(SYNTAX.into());
            }
            return Err("ERR keel: key expiry (EX, PX, EXAT, PXAT) is not supported yet".into());
        } else {
            return Err(SYNTAX.into());
        }
        i += 1;
    }
    let t = view.txn();
    let (key, value) = (&args[1], &args[2]);
    if !nx && !xx && !get {
        t.put(key, value)?;
        out.ok();
        return Ok(());
    }
    let exists = t.get_with(key, |v| {
        if get {
            out.bulk_or_null(v);
        }
        v.is_some()
    })?;
    let apply = !(nx && exists || xx && !exists);
    if apply {
        t.put(key, value)?;
    }
    if !get {
        if apply { out.ok() } else { out.null() }
    }
    Ok(())
}

fn setrange(args: &[Bytes], t: &mut Txn<'_>, ctx: &Ctx<'_>, out: &mut Out<'_>) -> Result<(), Fail> {
    let offset = int_arg(&args[2])?;
    if offset < 0 {
        return Err("ERR offset is out of range".into());
    }
    let patch = &args[3];
    let current = t.get(&args[1])?;
    if patch.is_empty() {
        out.int(current.map_or(0, |v| v.len() as i64));
        return Ok(());
    }
    if offset as u64 + patch.len() as u64 > ctx.bulk_bytes_max as u64 {
        return Err(TOO_BIG.into());
    }
    let offset = usize::try_from(offset).expect("bounded by proto-max-bulk-len");
    let mut value = current.unwrap_or_default();
    if value.len() < offset + patch.len() {
        value.resize(offset + patch.len(), 0);
    }
    value[offset..offset + patch.len()].copy_from_slice(patch);
    t.put(&args[1], &value)?;
    out.int(value.len() as i64);
    Ok(())
}

fn scan(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let cursor: u64 = std::str::from_utf8(&args[1])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or("ERR invalid cursor")?;
    let mut pattern: Option<&[u8]> = None;
    let mut count = 10usize;
    let mut strings = true;
    let mut i = 2;
    while i < args.len() {
        let opt = &args[i];
        let value = args.get(i + 1).ok_or(SYNTAX)?;
        if opt.eq_ignore_ascii_case(b"match") {
            pattern = Some(value);
        } else if opt.eq_ignore_ascii_case(b"count") {
            let n = int_arg(value)?;
            if n < 1 {
                return Err(SYNTAX.into());
            }
            count = usize::try_from(n).unwrap_or(usize::MAX).min(SCAN_COUNT_MAX);
        } else if opt.eq_ignore_ascii_case(b"type") {
            strings = value.eq_ignore_ascii_case(b"string");
        } else {
            return Err(SYNTAX.into());
        }
        i += 2;
    }
    let lo = if cursor == 0 {
        Bound::Unbounded
    } else {
        Bound::Excluded(
            ctx.cursors
                .load(cursor)
                .ok_or("ERR keel: unknown or expired SCAN cursor; start again from 0")?,
        )
    };
    let mut visited = 0;
    let mut last = None;
    let mut keys = Vec::new();
    let mut more = false;
    view.range(lo, Bound::Unbounded, false, |k, _| {
        if visited == count {
            more = true;
            return ControlFlow::Break(());
        }
        visited += 1;
        if strings && pattern.is_none_or(|p| glob::matches(p, &k)) {
            keys.push(k.clone());
        }
        last = Some(k);
        ControlFlow::Continue(())
    });
    let next = match (more, last) {
        (true, Some(last)) => ctx.cursors.save(last),
        _ => 0,
    };
    out.array(2);
    out.bulk(next.to_string().as_bytes());
    out.array(keys.len());
    for k in &keys {
        out.bulk(k);
    }
    Ok(())
}

fn keel_range(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let lo = lex_bound(&args[1], true)?;
    let hi = lex_bound(&args[2], false)?;
    let mut rev = false;
    let mut limit = None;
    let mut i = 3;
    while i < args.len() {
        if args[i].eq_ignore_ascii_case(b"rev") {
            rev = true;
            i += 1;
        } else if args[i].eq_ignore_ascii_case(b"limit") {
            let n = int_arg(args.get(i + 1).ok_or(SYNTAX)?)?;
            if n < 0 {
                return Err(NOT_INTEGER.into());
            }
            limit = Some(usize::try_from(n).unwrap_or(usize::MAX));
            i += 2;
        } else {
            return Err(SYNTAX.into());
        }
    }
    let cap = limit.unwrap_or(usize::MAX).min(REPLY_ITEMS_MAX + 1);
    let mut pairs = Vec::new();
    let mut bytes = 0;
    if cap > 0 {
        view.range(lo, hi, rev, |k, v| {
            bytes += k.len() + v.len() + 32;
            pairs.push((k, v));
            if pairs.len() >= cap || bytes > ctx.reply_bytes_max {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
    }
    if bytes > ctx.reply_bytes_max {
        return Err(reply_too_big());
    }
    if pairs.len() > REPLY_ITEMS_MAX {
        return Err(format!(
            "ERR keel: KEEL.RANGE returns at most {REPLY_ITEMS_MAX} pairs; use LIMIT"
        )
        .into());
    }
    out.array(pairs.len());
    for (k, v) in &pairs {
        out.array(2);
        out.bulk(k);
        out.bulk(v);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getrange_matches_redis() {
        let v = b"This is a string";
        assert_eq!(substring(v, 0, 3), b"This");
        assert_eq!(substring(v, -3, -1), b"ing");
        assert_eq!(substring(v, 0, -1), v);
        assert_eq!(substring(v, 10, 100), b"string");
        assert_eq!(substring(v, 5, 3), b"");
        assert_eq!(substring(v, -1, -5), b"");
        assert_eq!(substring(b"", 0, -1), b"");
    }

    #[test]
    fn float_text() {
        assert_eq!(format_float(10.5 + 0.1), "10.6");
        assert_eq!(format_float(0.1 + 0.2), "0.3");
        assert_eq!(format_float(5000.0), "5000");
        assert_eq!(format_float(-0.0), "0");
        assert_eq!(format_float(3.0e-5), "0.00003");
        assert_eq!(float_arg(b" 1"), None);
        assert_eq!(float_arg(b"nan"), None);
        assert_eq!(float_arg(b"1e3"), Some(1000.0));
    }

    #[test]
    fn prefix_ranges() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff"), None);
    }
}
