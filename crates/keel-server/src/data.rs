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
use crate::keyspace::{self as ks, Held};
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

/// The Redis error of `cmd` for an engine error its commutative operations met at commit
/// ([`Ctx::track_increments`]).
pub fn apply_error(cmd: Cmd, e: &keel::Error) -> Fail {
    match cmd {
        Cmd::Hincrby => crate::hashes::incr_error(e),
        Cmd::Zincrby | Cmd::Zadd => crate::zsets::incr_error(e),
        _ => engine_error(e),
    }
}

pub const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
pub const SYNTAX: &str = "ERR syntax error";
pub const NOT_FLOAT: &str = "ERR value is not a valid float";
const TOO_BIG: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";

/// Most items one `KEYS` or `KEEL.RANGE` reply may hold: the reply is built in memory.
pub const REPLY_ITEMS_MAX: usize = 1 << 20;
/// Most keys one `FLUSHDB` transaction deletes (the engine's limit on keys one transaction
/// writes; less when the transaction wrote others already); outside `MULTI` the server loops.
pub const FLUSH_BATCH_KEYS: usize = keel::limits::TXN_WRITE_KEYS_MAX;
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
    /// Reads `key` (an engine key) in place.
    pub fn get_with<T>(
        &mut self,
        key: &[u8],
        f: impl FnOnce(Option<&[u8]>) -> T,
    ) -> Result<T, keel::Error> {
        match self {
            View::Txn(t) => t.get_with(key, f),
            View::Snap(s) => s.get_with(key, f),
        }
    }

    /// The transaction of a write command.
    pub fn txn(&mut self) -> &mut Txn<'db> {
        match self {
            View::Txn(t) => t,
            View::Snap(_) => panic!("a write command was given a read-only snapshot"),
        }
    }

    /// Calls `f` on each pair in `(lo, hi)`, in order (or reversed), until it says stop. The
    /// pairs are passed in place: nothing is copied unless `f` copies it.
    pub fn range(
        &mut self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
        f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) {
        self.range_maybe_checked(lo, hi, rev, true, f);
    }

    /// [`View::range`] that a transaction's commit does not check
    /// ([`keel::Txn::range_unchecked`]): for picks that any outcome of which is correct, each
    /// confirmed by a checked read of the key picked.
    pub fn range_unchecked(
        &mut self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
        f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) {
        self.range_maybe_checked(lo, hi, rev, false, f);
    }

    /// [`View::range_unchecked`] whose every pair `f` sees is a checked point read: the
    /// commit checks that nobody wrote those keys since ([`keel::Range::next_read`]), as a
    /// [`View::get_with`] of each would, without looking them up again.
    pub fn range_read(
        &mut self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
        mut f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) -> Result<(), keel::Error> {
        match self {
            View::Txn(t) => {
                let mut range = t.range_unchecked(lo, hi);
                while let Some(flow) = range.next_read(rev, &mut f)? {
                    if flow.is_break() {
                        break;
                    }
                }
                Ok(())
            }
            View::Snap(_) => {
                self.range_unchecked(lo, hi, rev, f);
                Ok(())
            }
        }
    }

    fn range_maybe_checked(
        &mut self,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
        rev: bool,
        checked: bool,
        mut f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>,
    ) {
        match self {
            View::Txn(t) => {
                let mut range = if checked {
                    t.range_owned(lo, hi)
                } else {
                    t.range_unchecked(lo, hi)
                };
                while let Some(flow) = range.next_with(rev, &mut f) {
                    if flow.is_break() {
                        return;
                    }
                }
            }
            View::Snap(s) => {
                let mut scan = s.range_owned(lo, hi);
                while let Some(flow) = scan.next_with(rev, &mut f) {
                    if flow.is_break() {
                        return;
                    }
                }
            }
        }
    }
}

impl View<'_, '_> {
    /// A key drawn at random among those the store holds in `lo..hi` (dead ones too), a
    /// place to start a [`View::range_unchecked`] from ([`keel::Txn::sample_key`]).
    pub fn sample_key(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Option<Vec<u8>> {
        let draw = |n: usize| (random() % n as u64) as usize;
        match self {
            View::Txn(t) => t.sample_key(lo, hi, draw),
            View::Snap(s) => s.sample_key(lo, hi, draw),
        }
    }

    /// Whether reads here are checked at a commit (a transaction's are; a snapshot has none).
    pub fn checks_reads(&self) -> bool {
        matches!(self, View::Txn(_))
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
    /// Remembers where a scan stopped; the cursor number to give the client.
    pub fn save(&self, last_key: Vec<u8>) -> u64 {
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

    /// Where the scan of cursor `id` stopped (`None`: unknown or forgotten).
    fn load(&self, id: u64) -> Option<Vec<u8>> {
        self.inner.lock().by_id.get(&id).cloned()
    }

    /// Where a `SCAN`-family call with `cursor` resumes: `None` from the start (cursor 0),
    /// else after the last key or item the cursor's earlier call returned.
    pub fn resume(&self, cursor: u64) -> Result<Option<Vec<u8>>, Fail> {
        if cursor == 0 {
            return Ok(None);
        }
        self.load(cursor)
            .map(Some)
            .ok_or("ERR keel: unknown or expired SCAN cursor; start again from 0".into())
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
    /// The attempt's clock (the caller resets it before each attempt).
    pub clock: ks::Clock,
    /// Redis' encoding thresholds, for `OBJECT ENCODING`.
    pub encodings: &'a crate::config::Encodings,
    /// The engine key on which the caller's last attempt lost a conflict: a packed hash whose
    /// meta record it is spreads over sub-keys when this attempt writes it (`hashes`). Never
    /// set where commands must run alike on every replica (a replicated partition's log).
    pub contended: Contended,
    /// Cluster mode (replicated or not): a command may not read keys its routing did not
    /// name (`SORT`'s `BY` and `GET` patterns are refused, as in Redis Cluster).
    pub cluster: bool,
}

impl Ctx<'_> {
    /// Whether a write to the packed collection `old` at `key` (`None`: a new one) spreads it
    /// because the last attempt lost a conflict on its meta record.
    pub fn contends(&self, key: &[u8], old: Option<&ks::Meta>) -> bool {
        old.is_some_and(|m| m.packed) && self.contended.is(&ks::meta_key(key))
    }
}

/// The key of the conflict that ended the last attempt (see [`Ctx::contended`]).
#[derive(Default)]
pub struct Contended(std::sync::Mutex<Option<Vec<u8>>>);

impl Contended {
    /// Records the conflict that ended an attempt.
    pub fn set(&self, conflict: &keel::Conflict) {
        *self.0.lock().expect("not poisoned") = Some(conflict.key.clone());
    }

    /// Whether the last attempt lost a conflict on `key`.
    pub fn is(&self, key: &[u8]) -> bool {
        self.0.lock().expect("not poisoned").as_deref() == Some(key)
    }
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
            | Cmd::Substr
            | Cmd::Lcs
            | Cmd::SortRo
            | Cmd::Exists
            | Cmd::Touch
            | Cmd::Type
            | Cmd::Keys
            | Cmd::Scan
            | Cmd::Dbsize
            | Cmd::KeelRange
            | Cmd::KeelDump
            | Cmd::KeelCheck
            | Cmd::Ttl
            | Cmd::Pttl
            | Cmd::Expiretime
            | Cmd::Pexpiretime
    ) || crate::bits::is_read_only(cmd)
        || crate::keys::is_read_only(cmd)
        || crate::hashes::is_read_only(cmd)
        || crate::sets::is_read_only(cmd)
        || crate::lists::is_read_only(cmd)
        || crate::zsets::is_read_only(cmd)
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
        Cmd::Mget | Cmd::Del | Cmd::Unlink | Cmd::Exists | Cmd::Touch => (1, true),
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
                | Cmd::Flushdb
                | Cmd::Flushall
                | Cmd::KeelMax
                | Cmd::KeelMin
                | Cmd::KeelAdd
                | Cmd::KeelRestore
                | Cmd::KeelReap
                | Cmd::KeelFlushbatch
                | Cmd::Sort
        )
        || crate::expiry::handles(cmd)
        || crate::bits::handles(cmd)
        || crate::keys::handles(cmd)
        || crate::hashes::handles(cmd)
        || crate::sets::handles(cmd)
        || crate::lists::handles(cmd)
        || crate::zsets::handles(cmd)
}

/// A pseudo-random number: a splitmix64 generator per thread, seeded from the OS (through
/// `RandomState`) at the thread's first draw; good enough for picking members and fields,
/// which needs no secrecy. Under [`with_seed`], that seed's generator draws instead.
pub fn random() -> u64 {
    if let Some(r) = seeded_random() {
        return r;
    }
    STATE.with(|s| {
        let state = match s.get() {
            Some(state) => state,
            None => {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u64(0);
                h.finish()
            }
        };
        let (next, drawn) = splitmix64(state);
        s.set(Some(next));
        drawn
    })
}

/// One step of splitmix64 from `state`: the next state and the number drawn.
fn splitmix64(state: u64) -> (u64, u64) {
    let state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (state, z ^ (z >> 31))
}

thread_local! {
    /// While a replica applies a log entry: the state of the generator that replaces
    /// [`random`] (and new collections' generations), so that every replica draws the same.
    static SEED: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
    /// [`random`]'s own generator on this thread, once it has drawn.
    static STATE: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with [`random`] (and every draw of a collection's generation) on this thread
/// replaced by a generator seeded with `seed`: what a replicated partition's replicas do to
/// apply one log entry identically (`replica`).
pub fn with_seed<T>(seed: u64, f: impl FnOnce() -> T) -> T {
    struct Unseed(Option<u64>);
    impl Drop for Unseed {
        fn drop(&mut self) {
            SEED.with(|s| s.set(self.0));
        }
    }
    let _unseed = Unseed(SEED.with(|s| s.replace(Some(seed))));
    f()
}

/// The next draw of the generator [`with_seed`] installed, if any (splitmix64).
pub fn seeded_random() -> Option<u64> {
    SEED.with(|s| {
        let (next, drawn) = splitmix64(s.get()?);
        s.set(Some(next));
        Some(drawn)
    })
}

/// `k` distinct indexes below `n`, in random order (partial Fisher-Yates).
pub fn distinct_picks(n: usize, k: usize) -> Vec<usize> {
    let k = k.min(n);
    let mut idx: Vec<usize> = (0..n).collect();
    for i in 0..k {
        let j = i + (random() % (n - i) as u64) as usize;
        idx.swap(i, j);
    }
    idx.truncate(k);
    idx
}

/// The picks of `HRANDFIELD`/`SRANDMEMBER`/`ZRANDMEMBER` with a `count` among `n > 0` items:
/// a positive count takes distinct items, a negative one `|count|` items with repeats.
pub fn random_picks(n: usize, count: i64) -> Result<Vec<usize>, Fail> {
    if count > 0 {
        return Ok(distinct_picks(
            n,
            usize::try_from(count).unwrap_or(usize::MAX),
        ));
    }
    let k = count.unsigned_abs();
    if k > REPLY_ITEMS_MAX as u64 {
        return Err(reply_too_big());
    }
    Ok((0..k).map(|_| (random() % n as u64) as usize).collect())
}

/// The optional `count` of `HRANDFIELD`/`SRANDMEMBER`/`ZRANDMEMBER`, with Redis's error for
/// the one count it cannot negate.
pub fn random_count_arg(arg: Option<&Bytes>) -> Result<Option<i64>, Fail> {
    let Some(a) = arg else { return Ok(None) };
    let n = string_to_i64(a).ok_or(NOT_INTEGER)?;
    if n == i64::MIN {
        return Err("ERR value is out of range, value must between \
                    -9223372036854775807 and 9223372036854775807"
            .into());
    }
    Ok(Some(n))
}

/// Checks a database index (`SELECT`, `COPY ... DB`): keel has one database, 0; other
/// indexes get Redis's errors for an index it does not have.
pub fn check_db_index(arg: &[u8]) -> Result<(), Fail> {
    match string_to_i64(arg) {
        Some(0) => Ok(()),
        // Redis reads the index as a C int first.
        Some(n) if i32::try_from(n).is_err() => Err("ERR value is out of range, value must \
                                                    between -2147483648 and 2147483647"
            .into()),
        Some(_) => Err("ERR DB index is out of range".into()),
        None => Err(NOT_INTEGER.into()),
    }
}

pub fn int_arg(arg: &[u8]) -> Result<i64, Fail> {
    string_to_i64(arg).ok_or(NOT_INTEGER.into())
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

fn prefix_bounds(pattern: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let prefix = glob::literal_prefix(pattern);
    if prefix.is_empty() {
        return (Bound::Unbounded, Bound::Unbounded);
    }
    let hi = ks::prefix_end(&prefix).map_or(Bound::Unbounded, Bound::Excluded);
    (Bound::Included(prefix), hi)
}

/// A `SCAN` cursor, read as Redis reads it (C's `strtoul`, without leading space): an
/// empty string is 0, a sign is allowed (a negative one wraps, as in C).
pub fn parse_cursor(arg: &[u8]) -> Result<u64, Fail> {
    const INVALID: &str = "ERR invalid cursor";
    let (negative, digits) = match arg {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, arg),
    };
    if arg.is_empty() {
        return Ok(0);
    }
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(INVALID.into());
    }
    let mut n: u64 = 0;
    for &d in digits {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(d - b'0')))
            .ok_or(INVALID)?;
    }
    Ok(if negative { n.wrapping_neg() } else { n })
}

/// `MATCH` and `COUNT` of `HSCAN`/`SSCAN`/`ZSCAN` (from `args[3]` on), as Redis parses them.
pub fn scan_options(args: &[Bytes]) -> Result<(Option<&[u8]>, usize), Fail> {
    let mut pattern: Option<&[u8]> = None;
    let mut count = 10usize;
    let mut i = 3;
    while i < args.len() {
        let opt = &args[i];
        let more = i + 1 < args.len();
        if opt.eq_ignore_ascii_case(b"count") && more {
            let n = int_arg(&args[i + 1])?;
            if n < 1 {
                return Err(SYNTAX.into());
            }
            count = usize::try_from(n).unwrap_or(usize::MAX).min(SCAN_COUNT_MAX);
        } else if opt.eq_ignore_ascii_case(b"match") && more {
            pattern = Some(&args[i + 1]);
        } else {
            return Err(SYNTAX.into());
        }
        i += 2;
    }
    Ok((pattern, count))
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
    let clock = &ctx.clock;
    match cmd {
        Cmd::Get => ks::read_string(view, clock, &args[1], |v| out.bulk_or_null(v))?,
        Cmd::Set => set(args, view.txn(), clock, out)?,
        Cmd::Setnx => {
            let t = view.txn();
            let held = ks::lookup(&mut View::Txn(t), clock, &args[1], false)?;
            if held == Held::Absent {
                ks::put_string(t, &args[1], &args[2], 0, &held)?;
                out.int(1);
            } else {
                out.int(0);
            }
        }
        Cmd::Getset => {
            let t = view.txn();
            let held = ks::lookup(&mut View::Txn(t), clock, &args[1], true)?;
            out.bulk_or_null(held.string()?);
            ks::put_string(t, &args[1], &args[2], 0, &held)?;
        }
        Cmd::Getdel => {
            let t = view.txn();
            let held = ks::lookup(&mut View::Txn(t), clock, &args[1], true)?;
            out.bulk_or_null(held.string()?);
            ks::delete(t, &args[1], &held)?;
        }
        Cmd::Mget => {
            out.array(args.len() - 1);
            for key in &args[1..] {
                match ks::read_string(view, clock, key, |v| out.bulk_or_null(v)) {
                    Ok(()) => {}
                    // MGET answers nil for a key of another type.
                    Err(Fail(e)) if e == ks::WRONGTYPE => out.null(),
                    Err(e) => return Err(e),
                }
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
                    if ks::lookup(&mut View::Txn(t), clock, &pair[0], false)? != Held::Absent {
                        out.int(0);
                        return Ok(());
                    }
                }
            }
            for pair in args[1..].chunks(2) {
                let held = meta_held(t, clock, &pair[0])?;
                ks::put_string(t, &pair[0], &pair[1], 0, &held)?;
            }
            if cmd == Cmd::Mset {
                out.ok();
            } else {
                out.int(1);
            }
        }
        Cmd::Append => {
            let t = view.txn();
            let held = ks::lookup(&mut View::Txn(t), clock, &args[1], true)?;
            let mut value = held.string()?.unwrap_or_default().to_vec();
            if (value.len() + args[2].len()) as u64 > ctx.bulk_bytes_max as u64 {
                return Err(TOO_BIG.into());
            }
            value.extend_from_slice(&args[2]);
            ks::put_string(t, &args[1], &value, held.deadline(), &held)?;
            out.int(value.len() as i64);
        }
        Cmd::Strlen => {
            let len = ks::read_string(view, clock, &args[1], |v| v.map_or(0, <[u8]>::len))?;
            out.int(len as i64);
        }
        Cmd::Lcs => crate::lcs::lcs(args, view, ctx, out)?,
        Cmd::Sort | Cmd::SortRo => crate::sort::sort(args, cmd == Cmd::SortRo, view, ctx, out)?,
        Cmd::Getrange | Cmd::Substr => {
            let start = int_arg(&args[2])?;
            let end = int_arg(&args[3])?;
            ks::read_string(view, clock, &args[1], |v| {
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
                // A key with no meta record is a plain string or absent: the commutative
                // add applies (it fails at commit if the value is not an integer).
                let meta = ks::read_meta(&mut View::Txn(t), clock, &args[1])?;
                if meta.is_none() {
                    let key = ks::plain_key(&args[1]);
                    t.add(&key, delta)?;
                    out.tracked(t.track(&key)?);
                    return Ok(());
                }
            }
            let held = ks::lookup(&mut View::Txn(t), clock, &args[1], true)?;
            let base = match held.string()? {
                None => 0,
                Some(v) => string_to_i64(v).ok_or(NOT_INTEGER)?,
            };
            let sum = base
                .checked_add(delta)
                .ok_or("ERR increment or decrement would overflow")?;
            ks::put_string(
                t,
                &args[1],
                sum.to_string().as_bytes(),
                held.deadline(),
                &held,
            )?;
            out.int(sum);
        }
        Cmd::Incrbyfloat => {
            let t = view.txn();
            let held = ks::lookup(&mut View::Txn(t), clock, &args[1], true)?;
            // In C's long double, as Redis adds (see `long_double`).
            let text = crate::long_double::add(held.string()?, &args[2]).map_err(|e| match e {
                crate::long_double::Error::NotFinite => {
                    Fail::from("ERR increment would produce NaN or Infinity")
                }
                _ => NOT_FLOAT.into(),
            })?;
            ks::put_string(t, &args[1], &text, held.deadline(), &held)?;
            out.bulk(&text);
        }
        Cmd::Del | Cmd::Unlink => {
            let t = view.txn();
            let mut deleted = 0;
            for key in &args[1..] {
                let held = ks::lookup(&mut View::Txn(t), clock, key, false)?;
                if ks::delete(t, key, &held)? {
                    deleted += 1;
                }
            }
            out.int(deleted);
        }
        // keel keeps no access times, so TOUCH only counts, as EXISTS does.
        Cmd::Exists | Cmd::Touch => {
            let mut n = 0;
            for key in &args[1..] {
                if ks::lookup(view, clock, key, false)? != Held::Absent {
                    n += 1;
                }
            }
            out.int(n);
        }
        Cmd::Type => match ks::lookup(view, clock, &args[1], false)?.ty() {
            Some(ty) => out.simple(ty.name()),
            None => out.simple("none"),
        },
        Cmd::Keys => {
            let pattern = &args[1];
            let (lo, hi) = prefix_bounds(pattern);
            let mut bytes = 0;
            let mut too_many = false;
            let keys = ks::list(
                view,
                clock.now_ms(),
                &lo,
                &hi,
                false,
                REPLY_ITEMS_MAX + 1,
                false,
                &mut |k, _| {
                    let hit = glob::matches(pattern, k);
                    if hit {
                        bytes += k.len() + 16;
                        too_many |= bytes > ctx.reply_bytes_max;
                    }
                    hit && !too_many
                },
            );
            if too_many || keys.len() > REPLY_ITEMS_MAX {
                return Err(format!(
                    "ERR keel: KEYS matches more than {REPLY_ITEMS_MAX} keys or the output \
                     buffer limit; use SCAN"
                )
                .into());
            }
            out.array(keys.len());
            for k in &keys {
                out.bulk(&k.key);
            }
        }
        Cmd::Scan => scan(args, view, ctx, out)?,
        Cmd::Dbsize => out.int(ks::count(view) as i64),
        Cmd::Flushdb | Cmd::Flushall => {
            check_flush_args(args)?;
            if flush_batch(view.txn())? {
                return Err(format!(
                    "ERR keel: FLUSHDB inside MULTI deletes at most {FLUSH_BATCH_KEYS} keys"
                )
                .into());
            }
            out.ok();
        }
        Cmd::KeelRange => keel_range(args, view, ctx, out)?,
        Cmd::KeelFlushbatch => {
            let more = flush_batch(view.txn())?;
            out.int(i64::from(more));
        }
        Cmd::KeelReap => {
            let done = crate::reaper::reap_in(view.txn(), ctx.clock.now_ms())?;
            out.array(2);
            out.int(i64::try_from(done.expired).unwrap_or(i64::MAX));
            out.int(i64::try_from(done.swept).unwrap_or(i64::MAX));
        }
        Cmd::KeelDump | Cmd::KeelCheck | Cmd::KeelRestore => {
            crate::gather::command(cmd, args, view, ctx, out)?
        }
        Cmd::KeelMax | Cmd::KeelMin | Cmd::KeelAdd => {
            // Blind, by design (see `keyspace`): a read of the meta record would make every
            // one a reader, and end split mode for the key.
            let n = int_arg(&args[2])?;
            let t = view.txn();
            let key = ks::plain_key(&args[1]);
            match cmd {
                Cmd::KeelMax => t.max(&key, n)?,
                Cmd::KeelMin => t.min(&key, n)?,
                _ => t.add(&key, n)?,
            }
            out.ok();
        }
        _ if crate::expiry::handles(cmd) => crate::expiry::run(cmd, args, view, ctx, out)?,
        _ if crate::bits::handles(cmd) => crate::bits::run(cmd, args, view, ctx, out)?,
        _ if crate::keys::handles(cmd) => crate::keys::run(cmd, args, view, ctx, out)?,
        _ if crate::hashes::handles(cmd) => crate::hashes::run(cmd, args, view, ctx, out)?,
        _ if crate::sets::handles(cmd) => crate::sets::run(cmd, args, view, ctx, out)?,
        _ if crate::lists::handles(cmd) => crate::lists::run(cmd, args, view, ctx, out)?,
        _ if crate::zsets::handles(cmd) => crate::zsets::run(cmd, args, view, ctx, out)?,
        other => panic!("{other:?} is not a data command"),
    }
    Ok(())
}

/// What a blind string write needs to know about `key`: its meta record (absent for a plain
/// string or no key; a plain value is simply overwritten).
fn meta_held(t: &mut Txn<'_>, clock: &ks::Clock, key: &[u8]) -> Result<Held, Fail> {
    Ok(ks::read_meta(&mut View::Txn(t), clock, key)?.map_or(Held::Absent, Held::Meta))
}

/// `FLUSHDB`/`FLUSHALL` take nothing or one of `SYNC`, `ASYNC`.
pub fn check_flush_args(args: &[Bytes]) -> Result<(), Fail> {
    if args.len() > 2
        || args
            .get(1)
            .is_some_and(|a| !a.eq_ignore_ascii_case(b"sync") && !a.eq_ignore_ascii_case(b"async"))
    {
        return Err(SYNTAX.into());
    }
    Ok(())
}

/// Deletes as many keys in `txn` as it may still write, up to [`FLUSH_BATCH_KEYS`]; `true`
/// when more remain. Exactly-once answers (`FF 'o'`, `once`) are not data and stay: a
/// forwarded write sent again after the flush still finds its answer.
pub fn flush_batch(txn: &mut Txn<'_>) -> Result<bool, Fail> {
    let once = [ks::INTERNAL, crate::once::ONCE];
    delete_all_but(txn, &once, FLUSH_BATCH_KEYS, 0, false).map(|(_, more)| more)
}

/// Deletes, in key order, the keys of `txn`'s view but those under `kept` (records that
/// are not data), as many as `keys_max` and what `txn` may still write allow, leaving
/// `bytes_room` of its bytes unwritten; with `whole`, all of them or, if they do not fit,
/// none. Returns how many it deleted (for `whole` and too many: found) and whether any is
/// left.
pub fn delete_all_but(
    txn: &mut Txn<'_>,
    kept: &[u8],
    keys_max: usize,
    bytes_room: usize,
    whole: bool,
) -> Result<(usize, bool), Fail> {
    let (keys_left, bytes_left) = txn.writes_left();
    let keys_max = keys_left.min(keys_max);
    let mut bytes_left = bytes_left.saturating_sub(bytes_room);
    let mut keys = Vec::new();
    let mut more = false;
    let after = ks::prefix_end(kept);
    'ranges: for part in [
        (Bound::Unbounded, Bound::Excluded(kept)),
        match &after {
            Some(after) => (Bound::Included(&after[..]), Bound::Unbounded),
            None => (Bound::Excluded(kept), Bound::Excluded(kept)),
        },
    ] {
        for (k, _) in txn.range::<[u8]>(part) {
            if keys.len() == keys_max || k.len() > bytes_left {
                more = true;
                break 'ranges;
            }
            bytes_left -= k.len();
            keys.push(k);
        }
    }
    if more && whole {
        return Ok((keys.len(), true));
    }
    for k in &keys {
        txn.delete(k)?;
    }
    Ok((keys.len(), more))
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

fn set(args: &[Bytes], t: &mut Txn<'_>, clock: &ks::Clock, out: &mut Out<'_>) -> Result<(), Fail> {
    let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
    let mut ttl: Option<(Ttl, &[u8])> = None;
    let mut i = 3;
    while i < args.len() {
        let opt = &args[i];
        let next = args.get(i + 1);
        if opt.eq_ignore_ascii_case(b"nx") && !xx {
            nx = true;
        } else if opt.eq_ignore_ascii_case(b"xx") && !nx {
            xx = true;
        } else if opt.eq_ignore_ascii_case(b"get") {
            get = true;
        } else if opt.eq_ignore_ascii_case(b"keepttl") && ttl.is_none() {
            keepttl = true;
        } else if let Some(unit) = Ttl::parse(opt)
            && !keepttl
            && ttl.is_none_or(|(u, _)| u == unit)
            && let Some(next) = next
        {
            ttl = Some((unit, next));
            i += 1;
        } else {
            return Err(SYNTAX.into());
        }
        i += 1;
    }
    let deadline = match ttl {
        Some((unit, arg)) => Some(unit.deadline(arg, clock, "set")?),
        None => None,
    };
    let key = &args[1];
    let value = &args[2];
    if !nx && !xx && !get && !keepttl && deadline.is_none() {
        // The common SET: one read of the (usually absent) meta record, and the put.
        let held = meta_held(t, clock, key)?;
        ks::put_string(t, key, value, 0, &held)?;
        out.ok();
        return Ok(());
    }
    let held = ks::lookup(&mut View::Txn(t), clock, key, get)?;
    if get {
        out.bulk_or_null(held.string()?);
    }
    let exists = held != Held::Absent;
    let apply = !(nx && exists || xx && !exists);
    if apply {
        match deadline {
            // A deadline already past is stored too, as Redis does: the key is expired at
            // once (no reader sees it), and `DBSIZE` counts it until the reaper deletes it.
            Some(d) => ks::put_string(t, key, value, d, &held)?,
            None => {
                let keep = if keepttl { held.deadline() } else { 0 };
                ks::put_string(t, key, value, keep, &held)?;
            }
        }
    }
    if !get {
        if apply { out.ok() } else { out.null() }
    }
    Ok(())
}

/// The unit of a TTL option (`EX`, `PX`, `EXAT`, `PXAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// Seconds from now.
    Ex,
    /// Milliseconds from now.
    Px,
    /// Unix time in seconds.
    ExAt,
    /// Unix time in milliseconds.
    PxAt,
}

/// What the keyword `arg` stands for in `table` (names in lower case; `arg` in any case).
pub fn keyword<T: Copy>(arg: &[u8], table: &[(&str, T)]) -> Option<T> {
    table
        .iter()
        .find(|(name, _)| arg.eq_ignore_ascii_case(name.as_bytes()))
        .map(|&(_, t)| t)
}

impl Ttl {
    /// The option `opt` names, in any case.
    pub fn parse(opt: &[u8]) -> Option<Ttl> {
        keyword(
            opt,
            &[
                ("ex", Ttl::Ex),
                ("px", Ttl::Px),
                ("exat", Ttl::ExAt),
                ("pxat", Ttl::PxAt),
            ],
        )
    }

    /// The deadline (unix ms) `arg` gives, with Redis's checks: positive, no overflow.
    /// `cmd` names the command in the error.
    pub fn deadline(self, arg: &[u8], clock: &ks::Clock, cmd: &str) -> Result<u64, Fail> {
        let n = int_arg(arg)?;
        let invalid = || -> Fail { format!("ERR invalid expire time in '{cmd}' command").into() };
        if n <= 0 {
            return Err(invalid());
        }
        let ms = match self {
            Ttl::Ex | Ttl::ExAt => n.checked_mul(1000).ok_or_else(invalid)?,
            Ttl::Px | Ttl::PxAt => n,
        };
        let ms = match self {
            Ttl::Ex | Ttl::Px => {
                let now = i64::try_from(clock.now_ms()).map_err(|_| invalid())?;
                ms.checked_add(now).ok_or_else(invalid)?
            }
            Ttl::ExAt | Ttl::PxAt => ms,
        };
        u64::try_from(ms).map_err(|_| invalid())
    }
}

fn setrange(args: &[Bytes], t: &mut Txn<'_>, ctx: &Ctx<'_>, out: &mut Out<'_>) -> Result<(), Fail> {
    let offset = int_arg(&args[2])?;
    if offset < 0 {
        return Err("ERR offset is out of range".into());
    }
    let patch = &args[3];
    let held = ks::lookup(&mut View::Txn(t), &ctx.clock, &args[1], true)?;
    let current = held.string()?;
    if patch.is_empty() {
        out.int(current.map_or(0, |v| v.len() as i64));
        return Ok(());
    }
    if offset as u64 + patch.len() as u64 > ctx.bulk_bytes_max as u64 {
        return Err(TOO_BIG.into());
    }
    let offset = usize::try_from(offset).expect("bounded by proto-max-bulk-len");
    let mut value = current.unwrap_or_default().to_vec();
    if value.len() < offset + patch.len() {
        value.resize(offset + patch.len(), 0);
    }
    value[offset..offset + patch.len()].copy_from_slice(patch);
    ks::put_string(t, &args[1], &value, held.deadline(), &held)?;
    out.int(value.len() as i64);
    Ok(())
}

fn scan(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let cursor = parse_cursor(&args[1])?;
    let mut pattern: Option<&[u8]> = None;
    let mut count = 10usize;
    let mut ty: Option<&[u8]> = None;
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
            ty = Some(value);
        } else {
            return Err(SYNTAX.into());
        }
        i += 2;
    }
    let lo = ctx
        .cursors
        .resume(cursor)?
        .map_or(Bound::Unbounded, Bound::Excluded);
    // COUNT keys are visited; MATCH and TYPE filter what was visited, as in Redis.
    let visited = ks::list(
        view,
        ctx.clock.now_ms(),
        &lo,
        &Bound::Unbounded,
        false,
        count,
        false,
        &mut |_, _| true,
    );
    let next = match visited.last() {
        Some(last) if visited.len() == count => ctx.cursors.save(last.key.clone()),
        _ => 0,
    };
    let keys: Vec<&[u8]> = visited
        .iter()
        .filter(|l| ty.is_none_or(|t| t.eq_ignore_ascii_case(l.ty.name().as_bytes())))
        .filter(|l| pattern.is_none_or(|p| glob::matches(p, &l.key)))
        .map(|l| &l.key[..])
        .collect();
    out.array(2);
    out.bulk(next.to_string().as_bytes());
    out.array(keys.len());
    for k in keys {
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
    let mut bytes = 0;
    // Strings only (plain, and those with a TTL); a key of another type is skipped.
    let pairs = ks::list(
        view,
        ctx.clock.now_ms(),
        &lo,
        &hi,
        rev,
        cap,
        true,
        &mut |k, ty| {
            if ty != ks::Type::String || bytes > ctx.reply_bytes_max {
                return false;
            }
            bytes += k.len() + 32;
            true
        },
    );
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = pairs.into_iter().map(|l| (l.key, l.value)).collect();
    bytes += pairs.iter().map(|(_, v)| v.len()).sum::<usize>();
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
    fn cursors_parse_as_strtoul() {
        assert_eq!(parse_cursor(b""), Ok(0));
        assert_eq!(parse_cursor(b"0"), Ok(0));
        assert_eq!(parse_cursor(b"+7"), Ok(7));
        assert_eq!(parse_cursor(b"-1"), Ok(u64::MAX));
        assert_eq!(parse_cursor(b"18446744073709551615"), Ok(u64::MAX));
        for bad in [
            &b" 1"[..],
            b"1 ",
            b"x",
            b"-",
            b"18446744073709551616",
            b"1.0",
        ] {
            assert!(parse_cursor(bad).is_err(), "{bad:?}");
        }
    }
}

/// What the type modules' unit tests share: run one command against an engine transaction and
/// get its RESP2 reply bytes.
#[cfg(test)]
pub mod test_support {
    use bytes::{Bytes, BytesMut};
    use keel::Txn;

    use super::{Ctx, Cursors, View};
    use crate::reply::{Out, Proto};

    pub fn ctx(cursors: &Cursors) -> Ctx<'_> {
        static ENCODINGS: std::sync::LazyLock<crate::config::Encodings> =
            std::sync::LazyLock::new(Default::default);
        Ctx {
            bulk_bytes_max: 512 << 20,
            cursors,
            reply_bytes_max: 1 << 30,
            track_increments: true,
            clock: Default::default(),
            encodings: &ENCODINGS,
            contended: Default::default(),
            cluster: false,
        }
    }

    /// How many engine records the database holds.
    pub fn records(db: &keel::Db) -> usize {
        db.snapshot()
            .expect("snapshot")
            .range::<Vec<u8>>(..)
            .count()
    }

    /// The meta record of `key`, which must exist.
    pub fn meta(db: &keel::Db, key: &str) -> crate::keyspace::Meta {
        let snap = db.snapshot().expect("snapshot");
        let v = snap
            .get(&crate::keyspace::meta_key(key.as_bytes()))
            .expect("read");
        crate::keyspace::Meta::decode(&v.expect("a meta record")).expect("decodes")
    }

    pub fn args(a: &[&str]) -> Vec<Bytes> {
        a.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    /// Runs one command in `txn`, returning its reply bytes.
    pub fn run_in(txn: &mut Txn<'_>, cursors: &Cursors, a: &[&str]) -> Vec<u8> {
        run_in_ctx(txn, &ctx(cursors), a)
    }

    /// Runs one command in `txn` with `ctx`, returning its reply bytes.
    pub fn run_in_ctx(txn: &mut Txn<'_>, ctx: &Ctx<'_>, a: &[&str]) -> Vec<u8> {
        let cmd = crate::table::lookup(a[0].as_bytes())
            .expect("a command")
            .cmd;
        // Room for a short reply at once, as the server's reused output buffer has: growing
        // from nothing cost `cost::` a reallocation or two per command.
        let mut buf = BytesMut::with_capacity(256);
        let mut out = Out::new(&mut buf, Proto::Resp2);
        super::run(cmd, &args(a), &mut View::Txn(txn), ctx, &mut out).expect("runs");
        buf.to_vec()
    }

    /// Runs one command in a transaction of its own: its reply, or its error (then nothing
    /// is committed).
    pub fn try_exec(db: &keel::Db, cursors: &Cursors, a: &[&str]) -> Result<Vec<u8>, super::Fail> {
        let cmd = crate::table::lookup(a[0].as_bytes())
            .expect("a command")
            .cmd;
        let mut txn = db.begin().expect("begin");
        let mut buf = BytesMut::new();
        let mut out = Out::new(&mut buf, Proto::Resp2);
        super::run(
            cmd,
            &args(a),
            &mut View::Txn(&mut txn),
            &ctx(cursors),
            &mut out,
        )?;
        txn.commit().expect("commit").expect("no conflict");
        Ok(buf.to_vec())
    }

    /// Runs one command in a transaction of its own, which must commit.
    pub fn exec(db: &keel::Db, cursors: &Cursors, a: &[&str]) -> Vec<u8> {
        let mut txn = db.begin().expect("begin");
        let reply = run_in(&mut txn, cursors, a);
        txn.commit().expect("commit").expect("no conflict");
        reply
    }
}
