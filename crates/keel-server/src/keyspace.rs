//! The layout of Redis keys, types and expiry over the engine's one ordered keyspace
//! (`docs/types.md`), and the lookups and writes every data command goes through.
//!
//! A plain string with no TTL is stored at its user key, unchanged (a user key starting with
//! `FF` is escaped as `FF 00 <rest>`). Everything else about a key lives in its meta record at
//! `FF 'm' <user key>`: type, deadline and, for a string with a TTL, the value; for a
//! collection, the random generation its sub-keys are stored under.
//!
//! Invariant: at most one of the plain key and the meta record holds a key. Every write reads
//! the meta record first, so that a concurrent change of type conflicts instead of leaving
//! both. The one exception is keel's commutative `KEEL.ADD`/`MAX`/`MIN`, which read nothing
//! (a read would end split mode): on a key with a TTL or of another type they write a plain
//! integer that shadows the meta record. Readers look at the plain key first, so it wins, and
//! every write that replaces or deletes a key clears both.
//!
//! Expiry is materialised: a key past its deadline is removed only by a committed write. A
//! read-write transaction that meets one deletes it in its own write set ([`expire`]); a
//! read-only snapshot cannot, so the lookup fails with [`Expired`] and the caller runs the
//! command again as a read-write transaction. This module never commits.

use std::borrow::Cow;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use keel::Txn;

use crate::data::{Fail, View};

/// The first byte of every internal key. User keys starting with it are escaped.
pub const INTERNAL: u8 = 0xFF;
/// After [`INTERNAL`]: an escaped user key (`FF 00 <rest>` is the user key `FF <rest>`).
pub const ESCAPED: u8 = 0x00;
/// After [`INTERNAL`]: a meta record, keyed by user key.
pub const META: u8 = b'm';
/// After [`INTERNAL`]: a collection's size, keyed by generation.
pub const SIZE: u8 = b'n';
/// After [`INTERNAL`]: a hash field, keyed by generation and field.
pub const HASH_FIELD: u8 = b'h';
/// After [`INTERNAL`]: a set member, keyed by generation and member.
pub const SET_MEMBER: u8 = b's';
/// After [`INTERNAL`]: a sorted set member's score, keyed by generation and member.
pub const ZSET_SCORE: u8 = b'z';
/// After [`INTERNAL`]: a sorted set's score index, keyed by generation, score and member.
pub const ZSET_INDEX: u8 = b'Z';
/// After [`INTERNAL`]: a list's chunk of 16 elements, keyed by generation and
/// order-preserving chunk number (and an element too long for its chunk, by its slot after).
pub const LIST_ITEM: u8 = b'l';
/// After [`INTERNAL`]: a list's ends (the chunks of its first and last element), keyed by
/// generation and `00`/`01`.
pub const LIST_ENDS: u8 = b'e';
/// After [`INTERNAL`]: the expiry index, keyed by deadline and user key.
pub const EXPIRY: u8 = b'x';
/// After [`INTERNAL`]: the graveyard, keyed by generation.
pub const GRAVE: u8 = b'g';

/// Every kind of sub-key a generation may own (for a graveyard entry of an unknown type).
pub const ALL_SUB_KINDS: &[u8] = &[
    HASH_FIELD, SET_MEMBER, ZSET_SCORE, ZSET_INDEX, LIST_ITEM, LIST_ENDS,
];

/// The sub-key prefixes a collection's generation owns, by type (besides its size record).
pub fn sub_prefixes(ty: Type) -> &'static [u8] {
    match ty {
        Type::String => &[],
        Type::Hash => &[HASH_FIELD],
        Type::Set => &[SET_MEMBER],
        Type::ZSet => &[ZSET_SCORE, ZSET_INDEX],
        Type::List => &[LIST_ITEM, LIST_ENDS],
    }
}

/// `WRONGTYPE`, as Redis words it.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
/// The error a lookup in a read-only snapshot gives when it meets a key past its deadline
/// (see [`Expired`]); the caller runs the command again in a transaction and never shows it.
pub const EXPIRED_IN_SNAPSHOT: &str = "ERR keel: an expired key needs a read-write transaction";

/// What a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// A string (at its plain key when it has no TTL).
    String,
    /// A hash: fields at `FF 'h' gen field`.
    Hash,
    /// A set: members at `FF 's' gen member`.
    Set,
    /// A sorted set: scores at `FF 'z' gen member`, and the score index `FF 'Z' gen score
    /// member`.
    ZSet,
    /// A list: chunks of 16 elements at `FF 'l' gen chunk`, its ends at `FF 'e' gen 00|01`.
    List,
}

impl Type {
    fn code(self) -> u8 {
        match self {
            Type::String => b's',
            Type::Hash => b'h',
            Type::Set => b'S',
            Type::ZSet => b'z',
            Type::List => b'q',
        }
    }

    /// The type of a type code (`None`: unknown).
    pub fn from_code(code: u8) -> Option<Type> {
        match code {
            b's' => Some(Type::String),
            b'h' => Some(Type::Hash),
            b'S' => Some(Type::Set),
            b'z' => Some(Type::ZSet),
            b'q' => Some(Type::List),
            _ => None,
        }
    }

    /// The name `TYPE` replies with.
    pub fn name(self) -> &'static str {
        match self {
            Type::String => "string",
            Type::Hash => "hash",
            Type::Set => "set",
            Type::ZSet => "zset",
            Type::List => "list",
        }
    }
}

/// A decoded meta record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// The key's type.
    pub ty: Type,
    /// Unix time in ms at which the key expires; 0: never.
    pub deadline: u64,
    /// A collection's generation (0 for a string).
    pub generation: u64,
    /// A string's value; a packed collection's items ([`packed`]); empty for any other
    /// collection.
    pub value: Vec<u8>,
    /// A small hash, list or set packed into this record (type code `H`, `L` or `T`): its
    /// items are `value`, and it has no generation, sub-keys or size record.
    pub packed: bool,
}

const META_HEAD_BYTES: usize = 9;

/// The type code of a packed hash's meta record.
const PACKED_HASH: u8 = b'H';
/// The type code of a packed list's meta record.
const PACKED_LIST: u8 = b'L';
/// The type code of a packed set's meta record.
const PACKED_SET: u8 = b'T';
/// The type code keel gave a spread list before its elements were packed into chunks (one
/// record per element): such a list is refused, not misread.
const OLD_LIST: u8 = b'l';
const OLD_LIST_LAYOUT: &str = "ERR keel: this list was stored by an older keel, one record per \
                               element; this keel stores lists in chunks and does not read it";

impl Meta {
    /// A string with a TTL.
    pub fn string(value: &[u8], deadline: u64) -> Meta {
        Meta {
            ty: Type::String,
            deadline,
            generation: 0,
            value: value.to_vec(),
            packed: false,
        }
    }

    /// A hash, list or set packed into its meta record, with `items` ([`packed`]'s bytes)
    /// and `deadline`.
    pub fn packed(ty: Type, items: Vec<u8>, deadline: u64) -> Meta {
        debug_assert!(matches!(ty, Type::Hash | Type::List | Type::Set));
        Meta {
            ty,
            deadline,
            generation: 0,
            value: items,
            packed: true,
        }
    }

    /// A new, empty collection of type `ty` under a fresh generation.
    pub fn collection(ty: Type) -> Meta {
        Meta {
            ty,
            deadline: 0,
            generation: new_generation(),
            value: Vec::new(),
            packed: false,
        }
    }

    /// The record's bytes: type, deadline (8, big-endian), then the value (a string's, a
    /// packed hash's fields) or the generation.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(META_HEAD_BYTES + 8 + self.value.len());
        out.push(match (self.packed, self.ty) {
            (true, Type::List) => PACKED_LIST,
            (true, Type::Set) => PACKED_SET,
            (true, _) => PACKED_HASH,
            (false, ty) => ty.code(),
        });
        out.extend_from_slice(&self.deadline.to_be_bytes());
        if self.ty == Type::String || self.packed {
            out.extend_from_slice(&self.value);
        } else {
            out.extend_from_slice(&self.generation.to_be_bytes());
        }
        out
    }

    /// Decodes a meta record; an error names what is wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<Meta, Fail> {
        let damaged = || -> Fail { "ERR keel: damaged meta record".into() };
        let (&code, rest) = bytes.split_first().ok_or_else(damaged)?;
        let (deadline, body) = rest.split_first_chunk::<8>().ok_or_else(damaged)?;
        let deadline = u64::from_be_bytes(*deadline);
        match code {
            PACKED_HASH => return Ok(Meta::packed(Type::Hash, body.to_vec(), deadline)),
            PACKED_LIST => return Ok(Meta::packed(Type::List, body.to_vec(), deadline)),
            PACKED_SET => return Ok(Meta::packed(Type::Set, body.to_vec(), deadline)),
            OLD_LIST => return Err(OLD_LIST_LAYOUT.into()),
            _ => {}
        }
        let ty = Type::from_code(code).ok_or_else(damaged)?;
        let (generation, value) = match ty {
            Type::String => (0, body.to_vec()),
            _ => {
                let g: [u8; 8] = body.try_into().map_err(|_| damaged())?;
                (u64::from_be_bytes(g), Vec::new())
            }
        };
        Ok(Meta {
            ty,
            deadline,
            generation,
            value,
            packed: false,
        })
    }

    /// Whether the key is past its deadline at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.deadline != 0 && self.deadline <= now_ms
    }
}

/// The longest string `key` may hold with `deadline` (0: none): the engine's value size limit,
/// less the meta record's head for a string with a TTL (which lives in its meta record).
pub fn string_bytes_max(deadline: u64) -> usize {
    if deadline == 0 {
        keel::limits::VALUE_BYTES_MAX
    } else {
        keel::limits::VALUE_BYTES_MAX - META_HEAD_BYTES
    }
}

/// A fresh random generation. 64 random bits: two collections drawing the same one is as
/// likely as a 64-bit hash collision among the collections alive at once.
fn new_generation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    if let Some(g) = crate::data::seeded_random() {
        return g;
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // `RandomState` is seeded from the OS once per process (and per thread, then bumped):
    // hashing a counter and the clock through it gives independent-looking values.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Inline capacity of [`KeyBuf`]: internal keys of user keys up to about this long are built
/// on the stack.
const KEY_INLINE_BYTES: usize = 80;

/// An internal key, built on the stack when short (the hot path builds one per write).
pub struct KeyBuf {
    len: usize,
    inline: [u8; KEY_INLINE_BYTES],
    heap: Vec<u8>,
}

impl KeyBuf {
    fn new() -> KeyBuf {
        KeyBuf {
            len: 0,
            inline: [0; KEY_INLINE_BYTES],
            heap: Vec::new(),
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.heap.is_empty() && self.len + bytes.len() <= KEY_INLINE_BYTES {
            self.inline[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
            return;
        }
        if self.heap.is_empty() {
            self.heap.extend_from_slice(&self.inline[..self.len]);
        }
        self.heap.extend_from_slice(bytes);
    }

    fn of(parts: &[&[u8]]) -> KeyBuf {
        let mut k = KeyBuf::new();
        for p in parts {
            k.push(p);
        }
        k
    }
}

impl std::ops::Deref for KeyBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

/// The engine key of a plain string: the user key, escaped if it starts with `FF`.
pub fn plain_key(key: &[u8]) -> Cow<'_, [u8]> {
    match key.first() {
        Some(&INTERNAL) => {
            let mut k = Vec::with_capacity(key.len() + 1);
            k.extend_from_slice(&[INTERNAL, ESCAPED]);
            k.extend_from_slice(&key[1..]);
            Cow::Owned(k)
        }
        _ => Cow::Borrowed(key),
    }
}

/// `CLUSTER COUNTKEYSINSLOT` and `GETKEYSINSLOT`: how many user keys of hash slot `slot`
/// `db` holds (keys past their deadline that the reaper has not deleted yet included, as
/// Redis counts them), and the first `limit` of them in key order. A scan of every record:
/// O(records), where Redis keeps an index per slot.
pub fn keys_in_slot(
    db: &keel::Db,
    slot: u16,
    limit: usize,
) -> Result<(u64, Vec<Vec<u8>>), keel::BeginError> {
    let snap = db.snapshot()?;
    let (mut count, mut keys) = (0u64, Vec::new());
    for (engine_key, _) in snap.range::<[u8]>(..) {
        let user = match &engine_key[..] {
            [INTERNAL, META, rest @ ..] => Cow::Borrowed(rest),
            k => match user_key(k) {
                Some(user) => user,
                None => continue,
            },
        };
        if keel_cluster::key_slot(&user).0 == slot {
            count += 1;
            if keys.len() < limit {
                keys.push(user.into_owned());
            }
        }
    }
    Ok((count, keys))
}

/// The user key of a plain engine key (`None`: an internal key).
pub fn user_key(engine_key: &[u8]) -> Option<Cow<'_, [u8]>> {
    match engine_key {
        [INTERNAL, ESCAPED, rest @ ..] => {
            let mut k = Vec::with_capacity(rest.len() + 1);
            k.push(INTERNAL);
            k.extend_from_slice(rest);
            Some(Cow::Owned(k))
        }
        [INTERNAL, ..] => None,
        _ => Some(Cow::Borrowed(engine_key)),
    }
}

/// Where plain keys end: every engine key below this is a plain string's.
pub const PLAIN_END: &[u8] = &[INTERNAL, ESCAPED + 1];

/// The meta record's key.
pub fn meta_key(key: &[u8]) -> KeyBuf {
    KeyBuf::of(&[&[INTERNAL, META], key])
}

/// The expiry index entry of `key` expiring at `deadline`.
pub fn expiry_key(deadline: u64, key: &[u8]) -> KeyBuf {
    KeyBuf::of(&[&[INTERNAL, EXPIRY], &deadline.to_be_bytes(), key])
}

/// Splits an expiry index key into deadline and user key.
pub fn parse_expiry_key(k: &[u8]) -> Option<(u64, &[u8])> {
    let rest = k.strip_prefix(&[INTERNAL, EXPIRY])?;
    let (deadline, key) = rest.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*deadline), key))
}

/// A collection's size record.
pub fn size_key(generation: u64) -> KeyBuf {
    KeyBuf::of(&[&[INTERNAL, SIZE], &generation.to_be_bytes()])
}

/// A list's head (`tail == false`: the index of its first element) or tail (one past its
/// last) record.
pub fn list_end_key(generation: u64, tail: bool) -> KeyBuf {
    KeyBuf::of(&[&sub_prefix(LIST_ENDS, generation), &[u8::from(tail)]])
}

/// A collection's graveyard entry.
pub fn grave_key(generation: u64) -> KeyBuf {
    KeyBuf::of(&[&[INTERNAL, GRAVE], &generation.to_be_bytes()])
}

/// The prefix of a generation's sub-keys of one kind (`FF kind gen`).
pub fn sub_prefix(kind: u8, generation: u64) -> [u8; 10] {
    let mut p = [0u8; 10];
    p[0] = INTERNAL;
    p[1] = kind;
    p[2..].copy_from_slice(&generation.to_be_bytes());
    p
}

/// A sub-key: `FF kind gen item`.
pub fn sub_key(kind: u8, generation: u64, item: &[u8]) -> KeyBuf {
    KeyBuf::of(&[&sub_prefix(kind, generation), item])
}

/// The first key after every key starting with `prefix` (`None`: no such key).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Engine bounds of every key starting with `prefix`.
pub fn prefix_range(prefix: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let hi = prefix_end(prefix).map_or(Bound::Unbounded, Bound::Excluded);
    (Bound::Included(prefix.to_vec()), hi)
}

/// Unix time in milliseconds, never going backwards within the process.
pub fn unix_ms() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let last = LAST.fetch_max(now, Relaxed);
    now.max(last)
}

/// The clock of one transaction attempt: read at most once, on first use, so a command that
/// meets no deadline never reads it, and every command of an attempt sees one time.
#[derive(Default)]
pub struct Clock {
    now_ms: AtomicU64,
    /// A lookup in a snapshot met an expired key: run the command again in a transaction.
    pub rerun: AtomicBool,
}

impl Clock {
    /// The attempt's time.
    pub fn now_ms(&self) -> u64 {
        match self.now_ms.load(Relaxed) {
            0 => {
                let now = unix_ms();
                self.now_ms.store(now, Relaxed);
                now
            }
            now => now,
        }
    }

    /// A clock that reads `now_ms` (not the system clock) until reset: a replica applying a
    /// log entry runs at the time its leader gave the entry, as every other replica does.
    pub fn at(now_ms: u64) -> Clock {
        Clock {
            now_ms: AtomicU64::new(now_ms.max(1)),
            rerun: AtomicBool::new(false),
        }
    }

    /// Starts a new attempt: the next use reads the clock again.
    pub fn reset(&self) {
        self.now_ms.store(0, Relaxed);
        self.rerun.store(false, Relaxed);
    }
}

/// The marker error of a snapshot lookup that met an expired key (see the module docs).
pub struct Expired;

impl From<Expired> for Fail {
    fn from(_: Expired) -> Fail {
        EXPIRED_IN_SNAPSHOT.into()
    }
}

/// Reads `key`'s meta record as of the view, applying expiry: a transaction deletes a key past
/// its deadline and sees it absent; a snapshot fails (and flags `clock.rerun`).
pub fn read_meta(view: &mut View<'_, '_>, clock: &Clock, key: &[u8]) -> Result<Option<Meta>, Fail> {
    let mk = meta_key(key);
    let Some(meta) = view.get_with(&mk, |v| v.map(Meta::decode))?.transpose()? else {
        return Ok(None);
    };
    if !meta.expired(clock.now_ms()) {
        return Ok(Some(meta));
    }
    match view {
        View::Txn(t) => {
            expire(t, key, &meta)?;
            Ok(None)
        }
        View::Snap(_) => {
            clock.rerun.store(true, Relaxed);
            Err(Expired.into())
        }
    }
}

/// Reads `key` as a string: `f` sees the value (`None`: absent), or the lookup fails with
/// `WRONGTYPE`. A plain string costs one lookup.
pub fn read_string<T>(
    view: &mut View<'_, '_>,
    clock: &Clock,
    key: &[u8],
    f: impl FnOnce(Option<&[u8]>) -> T,
) -> Result<T, Fail> {
    let mut f = Some(f);
    let plain = plain_key(key);
    let hit = view.get_with(&plain, |v| {
        v.map(|v| (f.take().expect("called once"))(Some(v)))
    })?;
    if let Some(hit) = hit {
        return Ok(hit);
    }
    let f = f.take().expect("not called yet");
    match read_meta(view, clock, key)? {
        None => Ok(f(None)),
        Some(m) if m.ty == Type::String => Ok(f(Some(&m.value))),
        Some(_) => Err(WRONGTYPE.into()),
    }
}

/// What a key holds, as a command sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// Nothing (or something past its deadline).
    Absent,
    /// A plain string (no TTL); its value was not read unless asked for.
    Plain(Option<Vec<u8>>),
    /// Whatever its meta record says.
    Meta(Meta),
}

impl Held {
    /// The key's type, if it exists.
    pub fn ty(&self) -> Option<Type> {
        match self {
            Held::Absent => None,
            Held::Plain(_) => Some(Type::String),
            Held::Meta(m) => Some(m.ty),
        }
    }

    /// The key's deadline (0: none or absent).
    pub fn deadline(&self) -> u64 {
        match self {
            Held::Meta(m) => m.deadline,
            _ => 0,
        }
    }

    /// The string value, if the key is a string (read with `value: true`).
    pub fn string(&self) -> Result<Option<&[u8]>, Fail> {
        match self {
            Held::Absent => Ok(None),
            Held::Plain(v) => Ok(v.as_deref()),
            Held::Meta(m) if m.ty == Type::String => Ok(Some(&m.value)),
            Held::Meta(_) => Err(WRONGTYPE.into()),
        }
    }
}

/// What `key` holds: the plain key first, then the meta record. With `value`, a plain
/// string's value is copied out.
pub fn lookup(
    view: &mut View<'_, '_>,
    clock: &Clock,
    key: &[u8],
    value: bool,
) -> Result<Held, Fail> {
    let plain = plain_key(key);
    let hit = view.get_with(&plain, |v| v.map(|v| value.then(|| v.to_vec())))?;
    if let Some(v) = hit {
        return Ok(Held::Plain(v));
    }
    Ok(read_meta(view, clock, key)?.map_or(Held::Absent, Held::Meta))
}

/// Removes `key` whose meta record is `meta` (and any plain integer shadowing it is left to
/// the caller): the meta record, its expiry index entry and, for a collection with sub-keys
/// (not a packed hash), its size record, with a graveyard entry for the sweeper to delete its
/// sub-keys.
pub fn drop_meta(t: &mut Txn<'_>, key: &[u8], meta: &Meta) -> Result<(), Fail> {
    t.delete(&meta_key(key))?;
    if meta.deadline != 0 {
        t.delete(&expiry_key(meta.deadline, key))?;
    }
    if meta.ty != Type::String && !meta.packed {
        t.delete(&size_key(meta.generation))?;
        t.put(&grave_key(meta.generation), &[meta.ty.code()])?;
    }
    Ok(())
}

/// Deletes a key found past its deadline, in `t`.
pub fn expire(t: &mut Txn<'_>, key: &[u8], meta: &Meta) -> Result<(), Fail> {
    drop_meta(t, key, meta)?;
    // A plain integer written by KEEL.ADD over an expired key shadows it; it stays.
    Ok(())
}

/// Deletes whatever `key` holds (as found by [`lookup`]); whether it existed.
pub fn delete(t: &mut Txn<'_>, key: &[u8], held: &Held) -> Result<bool, Fail> {
    match held {
        Held::Absent => Ok(false),
        Held::Plain(_) => {
            t.delete(&plain_key(key))?;
            // A meta record shadowed by a KEEL.ADD integer goes too.
            if let Some(m) = t.get_with(&meta_key(key), |v| v.map(Meta::decode))? {
                drop_meta(t, key, &m?)?;
            }
            Ok(true)
        }
        Held::Meta(m) => {
            drop_meta(t, key, m)?;
            Ok(true)
        }
    }
}

/// Writes `value` as `key`'s string with `deadline` (0: no TTL), replacing what `held`
/// says the key holds (from [`lookup`] or [`read_meta`] in the same transaction).
pub fn put_string(
    t: &mut Txn<'_>,
    key: &[u8],
    value: &[u8],
    deadline: u64,
    held: &Held,
) -> Result<(), Fail> {
    match held {
        Held::Meta(m) if deadline != 0 && m.ty == Type::String && m.deadline != deadline => {
            t.delete(&expiry_key(m.deadline, key))?;
        }
        Held::Meta(m) if deadline != 0 && m.ty == Type::String => {}
        Held::Meta(m) => drop_meta(t, key, m)?,
        _ => {}
    }
    if deadline == 0 {
        t.put(&plain_key(key), value)?;
        return Ok(());
    }
    if matches!(held, Held::Plain(_)) {
        t.delete(&plain_key(key))?;
    }
    t.put(&meta_key(key), &Meta::string(value, deadline).encode())?;
    t.put(&expiry_key(deadline, key), &[])?;
    Ok(())
}

/// Writes a collection's meta record (new, or with a changed deadline), keeping the expiry
/// index in step with `old_deadline`.
pub fn put_meta(t: &mut Txn<'_>, key: &[u8], meta: &Meta, old_deadline: u64) -> Result<(), Fail> {
    if old_deadline != 0 && old_deadline != meta.deadline {
        t.delete(&expiry_key(old_deadline, key))?;
    }
    if meta.deadline != 0 && meta.deadline != old_deadline {
        t.put(&expiry_key(meta.deadline, key), &[])?;
    }
    t.put(&meta_key(key), &meta.encode())?;
    Ok(())
}

/// Writes the hash, list or set of type `ty` at `key` after a change left it `count` items
/// (`old`: its meta record; `None`: it is new): with none left, deletes it; packed into its
/// meta record when `packed` gives the record's items ([`packed`]), else spread by
/// [`spread_collection`].
pub fn write_collection(
    t: &mut Txn<'_>,
    key: &[u8],
    ty: Type,
    old: Option<&Meta>,
    count: usize,
    packed: Option<Vec<u8>>,
    put: impl FnOnce(&mut Txn<'_>, u64) -> Result<(), Fail>,
) -> Result<(), Fail> {
    if count == 0 {
        if let Some(m) = old {
            drop_meta(t, key, m)?;
        }
        return Ok(());
    }
    let deadline = old.map_or(0, |m| m.deadline);
    match packed {
        Some(items) => put_meta(t, key, &Meta::packed(ty, items, deadline), deadline),
        None => spread_collection(t, key, ty, old, count, put).map(drop),
    }
}

/// Writes the collection of type `ty` at `key` (`old`: its meta record, whose deadline it
/// keeps; `None`: it is new) spread over a fresh generation: `put` writes its `count` items'
/// sub-keys under the generation it is given, and the size record starts at `count`. Its new
/// meta record.
pub fn spread_collection(
    t: &mut Txn<'_>,
    key: &[u8],
    ty: Type,
    old: Option<&Meta>,
    count: usize,
    put: impl FnOnce(&mut Txn<'_>, u64) -> Result<(), Fail>,
) -> Result<Meta, Fail> {
    let deadline = old.map_or(0, |m| m.deadline);
    let mut meta = Meta::collection(ty);
    meta.deadline = deadline;
    put(t, meta.generation)?;
    if count > 0 {
        t.add(&size_key(meta.generation), count as i64)?;
    }
    put_meta(t, key, &meta, deadline)?;
    Ok(meta)
}

/// Gives `key` (holding `held`, a string's value read) the deadline `deadline` (0: none,
/// as `PERSIST`): a string moves between its plain key and its meta record; a collection's
/// meta record is rewritten.
pub fn set_deadline(t: &mut Txn<'_>, key: &[u8], held: &Held, deadline: u64) -> Result<(), Fail> {
    match held {
        Held::Absent => unreachable!("the caller checked that the key exists"),
        Held::Plain(_)
        | Held::Meta(Meta {
            ty: Type::String, ..
        }) => {
            let value = held.string()?.expect("the caller read the value").to_vec();
            put_string(t, key, &value, deadline, held)
        }
        Held::Meta(m) => {
            let mut new = m.clone();
            new.deadline = deadline;
            put_meta(t, key, &new, m.deadline)
        }
    }
}

/// Moves `src` (holding `held`, with its value read) to `dst`, replacing whatever `dst`
/// holds; the TTL goes with it. A collection keeps its generation: O(1).
pub fn rename(
    t: &mut Txn<'_>,
    clock: &Clock,
    src: &[u8],
    dst: &[u8],
    held: &Held,
) -> Result<(), Fail> {
    place(t, clock, dst, held)?;
    match held {
        Held::Absent => unreachable!("the caller checked that the source exists"),
        Held::Plain(_) => t.delete(&plain_key(src))?,
        Held::Meta(m) => {
            t.delete(&meta_key(src))?;
            if m.deadline != 0 {
                t.delete(&expiry_key(m.deadline, src))?;
            }
        }
    }
    Ok(())
}

/// Copies `src` (holding `held`, with its value read) to `dst`, replacing whatever `dst`
/// holds; the TTL is copied too. A packed hash is copied with its meta record; another
/// collection is copied member by member under a new generation (sub-keys and size record), in `t`: O(n), within one transaction's limits.
pub fn copy(
    t: &mut Txn<'_>,
    clock: &Clock,
    src: &[u8],
    dst: &[u8],
    held: &Held,
) -> Result<(), Fail> {
    let copied = match held {
        Held::Absent => unreachable!("the caller checked that the source exists"),
        Held::Plain(_) => held.clone(),
        Held::Meta(m) if m.ty == Type::String || m.packed => held.clone(),
        Held::Meta(m) => {
            let fresh = Meta::collection(m.ty).generation;
            copy_members(t, src, m, fresh)?;
            Held::Meta(Meta {
                generation: fresh,
                ..m.clone()
            })
        }
    };
    place(t, clock, dst, &copied)
}

/// Most sub-keys one `COPY` writes (in one transaction, with the meta record, the size
/// record and the destination's removal): the engine's bound on keys written by one
/// transaction, less a few for those.
const COPY_SUB_KEYS_MAX: usize = keel::limits::TXN_WRITE_KEYS_MAX - 8;

/// Writes the sub-keys and size record of the collection `meta` (at `src`) again under
/// `generation`.
fn copy_members(t: &mut Txn<'_>, src: &[u8], meta: &Meta, generation: u64) -> Result<(), Fail> {
    let mut copied = Vec::new();
    for &kind in sub_prefixes(meta.ty) {
        let prefix = sub_prefix(kind, meta.generation);
        let (lo, hi) = prefix_range(&prefix);
        for (k, v) in t.range((lo, hi)) {
            if copied.len() == COPY_SUB_KEYS_MAX {
                return Err(format!(
                    "ERR keel: COPY of the {} '{}' would write more than {COPY_SUB_KEYS_MAX} \
                     keys in one transaction (keel's limit)",
                    meta.ty.name(),
                    String::from_utf8_lossy(&src[..src.len().min(128)])
                )
                .into());
            }
            copied.push((sub_key(kind, generation, &k[prefix.len()..]), v));
        }
    }
    for (k, v) in &copied {
        t.put(k, v)?;
    }
    if let Some(size) = t.get_with(&size_key(meta.generation), |v| v.map(<[u8]>::to_vec))? {
        t.put(&size_key(generation), &size)?;
    }
    Ok(())
}

/// Writes the key `held` describes (a plain string's value, or a meta record with its
/// deadline) at `dst`, after removing whatever `dst` holds: what `RENAME` and `COPY` share.
fn place(t: &mut Txn<'_>, clock: &Clock, dst: &[u8], held: &Held) -> Result<(), Fail> {
    let old = lookup(&mut View::Txn(t), clock, dst, false)?;
    match &old {
        Held::Absent => {}
        // Deleting a plain string before the new one is written is a wasted write; the put
        // below replaces it. A meta record must go (it may be a collection).
        Held::Plain(_) => {
            if let Some(m) = t.get_with(&meta_key(dst), |v| v.map(Meta::decode))? {
                drop_meta(t, dst, &m?)?;
            }
        }
        Held::Meta(m) => drop_meta(t, dst, m)?,
    }
    match held {
        Held::Absent => unreachable!("the caller checked that the source exists"),
        Held::Plain(v) => {
            let v = v.as_deref().expect("the caller read the value");
            t.put(&plain_key(dst), v)?;
        }
        Held::Meta(m) => {
            if matches!(old, Held::Plain(_)) {
                t.delete(&plain_key(dst))?;
            }
            if m.deadline != 0 {
                t.put(&expiry_key(m.deadline, dst), &[])?;
            }
            t.put(&meta_key(dst), &m.encode())?;
        }
    }
    Ok(())
}

/// One key of a listing, in user-key order.
pub struct Listed {
    /// The user key.
    pub key: Vec<u8>,
    /// Its type.
    pub ty: Type,
    /// A plain string's value, or the meta record's (for strings with a TTL: the value).
    pub value: Vec<u8>,
}

/// Lists keys in user-key order (reversed with `rev`) between `lo` and `hi` (user keys):
/// the first `cap` that `keep` accepts. The plain range and the meta range are read side by
/// side and merged. Values are copied only with `values`. Keys past their deadline at `now_ms`
/// are skipped, not deleted (the expirer deletes them): a listing in a transaction would
/// otherwise conflict with every writer.
#[allow(clippy::too_many_arguments)]
pub fn list(
    view: &mut View<'_, '_>,
    now_ms: u64,
    lo: &Bound<Vec<u8>>,
    hi: &Bound<Vec<u8>>,
    rev: bool,
    cap: usize,
    values: bool,
    keep: &mut dyn FnMut(&[u8], Type) -> bool,
) -> Vec<Listed> {
    use std::ops::ControlFlow::{Break, Continue};
    if cap == 0 {
        return Vec::new();
    }
    let map_plain = |b: &Bound<Vec<u8>>| match b {
        Bound::Included(k) => Bound::Included(plain_key(k).into_owned()),
        Bound::Excluded(k) => Bound::Excluded(plain_key(k).into_owned()),
        Bound::Unbounded => Bound::Unbounded,
    };
    let map_meta = |b: &Bound<Vec<u8>>| match b {
        Bound::Included(k) => Bound::Included(meta_key(k).to_vec()),
        Bound::Excluded(k) => Bound::Excluded(meta_key(k).to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    };
    // Plain keys end below `FF 01`.
    let plain_hi = match map_plain(hi) {
        Bound::Unbounded => Bound::Excluded(PLAIN_END.to_vec()),
        Bound::Included(k) if k.as_slice() >= PLAIN_END => Bound::Excluded(PLAIN_END.to_vec()),
        Bound::Excluded(k) if k.as_slice() > PLAIN_END => Bound::Excluded(PLAIN_END.to_vec()),
        b => b,
    };
    let mut plain = Vec::new();
    view.range(map_plain(lo), plain_hi, rev, |k, v| {
        let Some(user) = user_key(k) else {
            return Continue(());
        };
        if keep(&user, Type::String) {
            plain.push(Listed {
                key: user.into_owned(),
                ty: Type::String,
                value: if values { v.to_vec() } else { Vec::new() },
            });
        }
        if plain.len() >= cap {
            Break(())
        } else {
            Continue(())
        }
    });
    let meta_lo = match map_meta(lo) {
        Bound::Unbounded => Bound::Included(vec![INTERNAL, META]),
        b => b,
    };
    let meta_hi = match map_meta(hi) {
        Bound::Unbounded => Bound::Excluded(vec![INTERNAL, META + 1]),
        b => b,
    };
    let mut metas = Vec::new();
    view.range(meta_lo, meta_hi, rev, |k, v| {
        if let Ok(m) = Meta::decode(v)
            && !m.expired(now_ms)
            && keep(&k[2..], m.ty)
        {
            metas.push(Listed {
                key: k[2..].to_vec(),
                ty: m.ty,
                value: if values { m.value } else { Vec::new() },
            });
        }
        if metas.len() >= cap {
            Break(())
        } else {
            Continue(())
        }
    });
    merge(plain, metas, rev, cap)
}

/// Merges two key-ordered lists (reversed with `rev`), keeping the first `cap`. A key in both
/// (a plain integer shadowing a meta record) is listed once, as the plain string.
fn merge(a: Vec<Listed>, b: Vec<Listed>, rev: bool, cap: usize) -> Vec<Listed> {
    let mut out = Vec::with_capacity((a.len() + b.len()).min(cap));
    let mut a = a.into_iter().peekable();
    let mut b = b.into_iter().peekable();
    while out.len() < cap {
        let take_a = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(x), Some(y)) => {
                if x.key == y.key {
                    b.next();
                    true
                } else {
                    (x.key < y.key) != rev
                }
            }
        };
        out.extend(if take_a { a.next() } else { b.next() });
    }
    out
}

/// Counts the keys (plain strings and meta records, expired ones too, as Redis's `DBSIZE`
/// counts keys not yet evicted).
pub fn count(view: &mut View<'_, '_>) -> u64 {
    let mut n = 0u64;
    view.range(
        Bound::Unbounded,
        Bound::Excluded(PLAIN_END.to_vec()),
        false,
        |_, _| {
            n += 1;
            std::ops::ControlFlow::Continue(())
        },
    );
    view.range(
        Bound::Included(vec![INTERNAL, META]),
        Bound::Excluded(vec![INTERNAL, META + 1]),
        false,
        |_, _| {
            n += 1;
            std::ops::ControlFlow::Continue(())
        },
    );
    n
}

/// `INFO keyspace`'s `expires` and `avg_ttl`: the entries in the expiry index, and the mean
/// time left (ms) of those not yet past their deadline.
pub fn expiry_summary(snap: &keel::Snapshot<'_>) -> (u64, u64) {
    let now = unix_ms();
    let (mut n, mut left_n, mut left_sum) = (0u64, 0u64, 0u128);
    let end = [INTERNAL, EXPIRY + 1];
    for (k, _) in snap.range([INTERNAL, EXPIRY].as_slice()..end.as_slice()) {
        n += 1;
        if let Some((deadline, _)) = parse_expiry_key(&k)
            && deadline > now
        {
            left_n += 1;
            left_sum += u128::from(deadline - now);
        }
    }
    let avg = if left_n == 0 {
        0
    } else {
        u64::try_from(left_sum / u128::from(left_n)).unwrap_or(u64::MAX)
    };
    (n, avg)
}

/// The items of a collection packed into its meta record (a hash's fields and values, a
/// list's elements, a set's members): each a length byte, then its bytes.
pub mod packed {
    use std::ops::ControlFlow;

    use crate::data::Fail;

    /// The longest item a packed collection holds: a longer one spreads it. What one length
    /// byte can say; Redis packs items of up to 64 bytes, but a record of its own costs keel
    /// more than Redis' dictionary entry does, so keel packs YCSB's 100-byte fields too.
    pub const ITEM_BYTES_MAX: usize = u8::MAX as usize;

    /// Most items (fields, elements) a packed collection holds: one more spreads it.
    pub const ITEMS_MAX: usize = 128;

    /// Most bytes of a packed collection's items (with their length bytes): a write that
    /// would take it past this spreads it. Every write rewrites the whole record, into the
    /// log too, where Redis' append-only file gets only the command: this bounds that copy.
    pub const BYTES_MAX: usize = 4096;

    /// Appends one item.
    fn push(out: &mut Vec<u8>, item: &[u8]) {
        out.push(u8::try_from(item.len()).expect("a packed item fits a length byte"));
        out.extend_from_slice(item);
    }

    /// Splits one item off the front of `bytes`; damage is an error.
    pub fn take<'a>(bytes: &mut &'a [u8]) -> Result<&'a [u8], Fail> {
        let damaged = || Fail::from("ERR keel: damaged packed collection");
        let (&len, rest) = bytes.split_first().ok_or_else(damaged)?;
        let item = rest.get(..usize::from(len)).ok_or_else(damaged)?;
        *bytes = &rest[usize::from(len)..];
        Ok(item)
    }

    /// Calls `f` on each item of `bytes`, in order, until it says stop; damage is an error.
    pub fn each<'a>(
        mut bytes: &'a [u8],
        mut f: impl FnMut(&'a [u8]) -> ControlFlow<()>,
    ) -> Result<(), Fail> {
        while !bytes.is_empty() {
            if f(take(&mut bytes)?).is_break() {
                break;
            }
        }
        Ok(())
    }

    /// Every item of `bytes`, in order; damage is an error.
    pub fn items(bytes: &[u8]) -> Result<Vec<&[u8]>, Fail> {
        let mut items = Vec::new();
        each(bytes, |item| {
            items.push(item);
            ControlFlow::Continue(())
        })?;
        Ok(items)
    }

    /// How many items `bytes` holds.
    pub fn count(bytes: &[u8]) -> Result<usize, Fail> {
        let mut n = 0;
        each(bytes, |_| {
            n += 1;
            ControlFlow::Continue(())
        })?;
        Ok(n)
    }

    /// Whether `bytes` holds `item`.
    pub fn contains(bytes: &[u8], item: &[u8]) -> Result<bool, Fail> {
        let mut found = false;
        each(bytes, |i| {
            found = i == item;
            if found {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        Ok(found)
    }

    /// The item after `key` among `bytes`' pairs of items (a hash's field and value).
    pub fn value_of<'a>(mut bytes: &'a [u8], key: &[u8]) -> Result<Option<&'a [u8]>, Fail> {
        while !bytes.is_empty() {
            let (k, v) = (take(&mut bytes)?, take(&mut bytes)?);
            if k == key {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// The items, encoded.
    pub fn encode<'a>(items: impl Iterator<Item = &'a [u8]> + Clone) -> Vec<u8> {
        let mut out = Vec::with_capacity(items.clone().map(|i| 1 + i.len()).sum());
        for item in items {
            push(&mut out, item);
        }
        out
    }

    /// Whether `count` items may stay packed.
    pub fn fit<'a>(count: usize, items: impl Iterator<Item = &'a [u8]>) -> bool {
        if count > ITEMS_MAX {
            return false;
        }
        let mut bytes = 0;
        for item in items {
            if item.len() > ITEM_BYTES_MAX {
                return false;
            }
            bytes += 1 + item.len();
        }
        bytes <= BYTES_MAX
    }
}

#[cfg(test)]
mod tests;
