//! Pub/sub: `SUBSCRIBE`, `PSUBSCRIBE`, `SSUBSCRIBE`, their `UNSUBSCRIBE`s, `PUBLISH`,
//! `SPUBLISH` and `PUBSUB`, with Redis 7's replies. Nothing here touches the engine: messages
//! are neither stored nor transactional, as in Redis.
//!
//! The [`Registry`] maps each channel to its subscribers' [`Mailbox`]es. Channels live in
//! [`SHARDS`] hash maps, each behind its own lock, so publishers to different channels do not
//! contend, and a `PUBLISH` to a channel nobody listens to costs one hash, one read lock and
//! one lookup (plus one atomic load while no pattern is subscribed). Shard channels
//! (`SSUBSCRIBE`/`SPUBLISH`) are a second, separate namespace, as in Redis: on a single node
//! they behave like channels, but `PUBLISH` never reaches them and `SPUBLISH` reaches nothing
//! else. Patterns are few in practice and every publish must try each of them, so they share
//! one map.
//!
//! A publisher pushes the message into each subscriber's mailbox while it holds the channel's
//! read lock. An `UNSUBSCRIBE` takes the write lock, so once it returns no message for that
//! channel can arrive any more; the connection delivers what its mailbox holds before it runs
//! each command, so every message published before a command started is written before that
//! command's reply (a subscriber that publishes to itself sees the message before `PUBLISH`'s
//! count, as with Redis), and none follows its `UNSUBSCRIBE` reply.
//!
//! The connection's task waits for its socket or its mailbox, whichever comes first (see
//! `conn`), on whichever lane it runs: the mailbox wakes it through tokio's `Notify`, which
//! keeps a wake-up that finds no waiter, so a connection moving between lanes misses nothing.
//! Messages are kept as shared `Bytes` and encoded by the subscriber, in the protocol it
//! speaks when it writes them (`message` arrays in RESP2, push frames in RESP3).
//!
//! Bounded: a mailbox counts the bytes of the messages it holds plus those delivered into the
//! connection's output and not yet written to its socket, Redis's output buffer. Past
//! `client-output-buffer-limit pubsub` (hard limit, or soft limit for longer than its seconds;
//! `OutputLimit::default` is Redis's 32 MiB / 8 MiB / 60 s) the subscriber is disconnected
//! and its messages dropped. A closed connection's subscriptions are removed (`Subs::leave`).

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::OutputLimit;
use crate::data::Fail;
use crate::glob;
use crate::reply::{Out, Proto};
use crate::server::ClientInfo;

/// Locks the channel registry is split over.
pub const SHARDS: usize = 64;
const _: () = assert!(SHARDS.is_power_of_two());

/// Bytes a message costs beyond its channel, pattern and payload: its frame headers.
const MESSAGE_OVERHEAD_BYTES: u64 = 48;

/// The three kinds of subscription, each its own namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `SUBSCRIBE`: a channel.
    Channel,
    /// `PSUBSCRIBE`: a glob pattern over channels.
    Pattern,
    /// `SSUBSCRIBE`: a shard channel.
    Shard,
}

impl Kind {
    fn index(self) -> usize {
        self as usize
    }

    fn subscribe_word(self) -> &'static [u8] {
        match self {
            Kind::Channel => b"subscribe",
            Kind::Pattern => b"psubscribe",
            Kind::Shard => b"ssubscribe",
        }
    }

    fn unsubscribe_word(self) -> &'static [u8] {
        match self {
            Kind::Channel => b"unsubscribe",
            Kind::Pattern => b"punsubscribe",
            Kind::Shard => b"sunsubscribe",
        }
    }
}

/// One published message as subscribers hold it: shared, not copied per subscriber.
struct Message {
    /// The `PSUBSCRIBE` pattern it matched, for `pmessage`.
    pattern: Option<Bytes>,
    channel: Bytes,
    payload: Bytes,
    /// From `SPUBLISH`: an `smessage`.
    shard: bool,
}

impl Message {
    fn bytes(&self) -> u64 {
        let pattern = self.pattern.as_ref().map_or(0, Bytes::len);
        (pattern + self.channel.len() + self.payload.len()) as u64 + MESSAGE_OVERHEAD_BYTES
    }

    fn encode(&self, out: &mut Out<'_>) {
        match &self.pattern {
            Some(pattern) => {
                out.push(4);
                out.bulk(b"pmessage");
                out.bulk(pattern);
            }
            None => {
                out.push(3);
                out.bulk(if self.shard { b"smessage" } else { b"message" });
            }
        }
        out.bulk(&self.channel);
        out.bulk(&self.payload);
    }
}

/// What a subscriber's mailbox holds.
#[derive(Default)]
struct Queue {
    messages: VecDeque<Message>,
    /// Bytes of the messages queued, plus those delivered into the connection's output and
    /// not yet written ([`Queue::in_flight`]): what the output buffer limit bounds.
    owed: u64,
    /// Of `owed`, delivered and not yet written.
    in_flight: u64,
    /// When `owed` last rose above the soft limit (and has stayed above since).
    over_soft_since: Option<Instant>,
    /// The subscriber went over its limit and is being disconnected: nothing more is queued.
    cut: bool,
}

/// Where messages for one subscribed connection wait until its task writes them.
pub struct Mailbox {
    /// The client's id.
    id: u64,
    queue: Mutex<Queue>,
    /// Wakes the connection's task when a message arrives in an empty mailbox.
    pub notify: Notify,
    /// The client's kill switch, pulled when it goes over its output buffer limit.
    kill: CancellationToken,
}

impl Mailbox {
    /// Queues `message`, or disconnects the subscriber if it would owe more than `limit`:
    /// then `true`.
    fn push(&self, message: Message, limit: OutputLimit) -> bool {
        let bytes = message.bytes();
        let mut q = self.queue.lock();
        if q.cut {
            return false;
        }
        q.owed += bytes;
        let over_hard = limit.hard_bytes != 0 && q.owed > limit.hard_bytes;
        let over_soft = limit.soft_bytes != 0 && q.owed > limit.soft_bytes;
        let over_soft_too_long = if over_soft {
            let now = Instant::now();
            let since = *q.over_soft_since.get_or_insert(now);
            now - since > Duration::from_secs(limit.soft_seconds)
        } else {
            q.over_soft_since = None;
            false
        };
        if over_hard || over_soft_too_long {
            q.cut = true;
            let owed = q.owed;
            q.messages = VecDeque::new();
            drop(q);
            tracing::warn!(
                id = self.id,
                owed,
                "closing a subscriber over client-output-buffer-limit pubsub"
            );
            self.kill.cancel();
            return true;
        }
        let was_empty = q.messages.is_empty();
        q.messages.push_back(message);
        drop(q);
        if was_empty {
            self.notify.notify_one();
        }
        false
    }

    /// Whether messages wait.
    #[cfg(test)]
    fn has_mail(&self) -> bool {
        !self.queue.lock().messages.is_empty()
    }

    /// Encodes waiting messages into `out` until it has grown by `bytes_max` or the mailbox is
    /// empty; whether messages are left. They stay owed until [`Mailbox::written`].
    pub fn deliver(&self, out: &mut Out<'_>, bytes_max: usize) -> bool {
        let start = out.buf.len();
        let mut q = self.queue.lock();
        while out.buf.len() - start < bytes_max {
            let Some(message) = q.messages.pop_front() else {
                break;
            };
            q.in_flight += message.bytes();
            message.encode(out);
        }
        if q.messages.is_empty() && q.messages.capacity() > 64 {
            q.messages = VecDeque::new();
        }
        !q.messages.is_empty()
    }

    /// The connection wrote its output: what was delivered into it is no longer owed.
    pub fn written(&self, limit: OutputLimit) {
        let mut q = self.queue.lock();
        q.owed -= q.in_flight;
        q.in_flight = 0;
        if q.owed <= limit.soft_bytes {
            q.over_soft_since = None;
        }
    }
}

/// Whether `channel` matches `pattern`, as Redis's matcher decides for pub/sub: also for the
/// empty channel, which only the empty pattern matches (`KEYS *` lists the empty key only
/// because Redis special-cases `*` there; `PSUBSCRIBE *` and `PUBSUB CHANNELS *` do not).
fn matches(pattern: &[u8], channel: &[u8]) -> bool {
    if channel.is_empty() {
        return pattern.is_empty();
    }
    glob::matches(pattern, channel)
}

type Subscribers = HashMap<u64, Arc<Mailbox>>;
type Channels = HashMap<Bytes, Subscribers>;

/// Frees a map's spare room once it holds a quarter of what it could: a burst of channels
/// leaves no memory behind.
fn shrink<K, V>(map: &mut HashMap<K, V>)
where
    K: Eq + std::hash::Hash,
{
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to_fit();
    }
}

/// One namespace of channels, sharded by the channel's hash.
struct Namespace {
    shards: Box<[RwLock<Channels>]>,
    /// Channels with at least one subscriber.
    count: AtomicUsize,
}

impl Namespace {
    fn new() -> Namespace {
        Namespace {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            count: AtomicUsize::new(0),
        }
    }
}

/// Every subscription of every connection.
pub struct Registry {
    hasher: std::hash::RandomState,
    channels: Namespace,
    shard_channels: Namespace,
    patterns: RwLock<Channels>,
    /// Patterns with at least one subscriber: lets `PUBLISH` skip the pattern lock.
    pattern_count: AtomicUsize,
    hard_bytes: AtomicU64,
    soft_bytes: AtomicU64,
    soft_seconds: AtomicU64,
    /// Subscribers disconnected for their output buffer (`INFO stats`
    /// `client_output_buffer_limit_disconnections`).
    pub disconnections: AtomicU64,
}

impl Registry {
    pub fn new(limit: OutputLimit) -> Registry {
        Registry {
            hasher: std::hash::RandomState::new(),
            channels: Namespace::new(),
            shard_channels: Namespace::new(),
            patterns: RwLock::default(),
            pattern_count: AtomicUsize::new(0),
            hard_bytes: AtomicU64::new(limit.hard_bytes),
            soft_bytes: AtomicU64::new(limit.soft_bytes),
            soft_seconds: AtomicU64::new(limit.soft_seconds),
            disconnections: AtomicU64::new(0),
        }
    }

    /// The output buffer limit subscribers are held to now.
    pub fn limit(&self) -> OutputLimit {
        OutputLimit {
            hard_bytes: self.hard_bytes.load(Relaxed),
            soft_bytes: self.soft_bytes.load(Relaxed),
            soft_seconds: self.soft_seconds.load(Relaxed),
        }
    }

    /// `CONFIG SET client-output-buffer-limit`: applies to messages published from now on.
    pub fn set_limit(&self, limit: OutputLimit) {
        self.hard_bytes.store(limit.hard_bytes, Relaxed);
        self.soft_bytes.store(limit.soft_bytes, Relaxed);
        self.soft_seconds.store(limit.soft_seconds, Relaxed);
    }

    /// The shard of `channel`. The map inside hashes the name again, which costs a few
    /// nanoseconds and keeps the two independent.
    fn shard(&self, channel: &[u8]) -> usize {
        (self.hasher.hash_one(channel) as usize) & (SHARDS - 1)
    }

    /// The lock holding `name` of `kind` (patterns: the one pattern map) and its count.
    fn map(&self, kind: Kind, name: &[u8]) -> (&RwLock<Channels>, &AtomicUsize) {
        match kind {
            Kind::Channel => {
                let s = self.shard(name);
                (&self.channels.shards[s], &self.channels.count)
            }
            Kind::Shard => {
                let s = self.shard(name);
                (&self.shard_channels.shards[s], &self.shard_channels.count)
            }
            Kind::Pattern => (&self.patterns, &self.pattern_count),
        }
    }

    fn add(&self, kind: Kind, name: &Bytes, mailbox: &Arc<Mailbox>) {
        let (lock, count) = self.map(kind, name);
        let mut map = lock.write();
        let subscribers = map.entry(name.clone()).or_insert_with(|| {
            count.fetch_add(1, Relaxed);
            HashMap::new()
        });
        subscribers.insert(mailbox.id, mailbox.clone());
    }

    fn remove(&self, kind: Kind, name: &[u8], id: u64) {
        let (lock, count) = self.map(kind, name);
        let mut map = lock.write();
        let Some(subscribers) = map.get_mut(name) else {
            return;
        };
        subscribers.remove(&id);
        if subscribers.is_empty() {
            map.remove(name);
            count.fetch_sub(1, Relaxed);
            shrink(&mut map);
        } else {
            shrink(subscribers);
        }
    }

    /// `PUBLISH` (`shard`: `SPUBLISH`): queues the message for every subscriber of `channel`
    /// and, for `PUBLISH`, for every pattern subscription matching it; how many that was.
    pub fn publish(&self, shard: bool, channel: &Bytes, payload: &Bytes) -> usize {
        let limit = self.limit();
        let kind = if shard { Kind::Shard } else { Kind::Channel };
        let mut receivers = 0;
        let mut cut = 0;
        {
            let (lock, _) = self.map(kind, channel);
            let map = lock.read();
            if let Some(subscribers) = map.get(&channel[..]) {
                for mailbox in subscribers.values() {
                    let message = Message {
                        pattern: None,
                        channel: channel.clone(),
                        payload: payload.clone(),
                        shard,
                    };
                    cut += u64::from(mailbox.push(message, limit));
                }
                receivers += subscribers.len();
            }
        }
        if !shard && self.pattern_count.load(Relaxed) > 0 {
            let patterns = self.patterns.read();
            for (pattern, subscribers) in patterns.iter() {
                if !matches(pattern, channel) {
                    continue;
                }
                for mailbox in subscribers.values() {
                    let message = Message {
                        pattern: Some(pattern.clone()),
                        channel: channel.clone(),
                        payload: payload.clone(),
                        shard,
                    };
                    cut += u64::from(mailbox.push(message, limit));
                }
                receivers += subscribers.len();
            }
        }
        if cut > 0 {
            self.disconnections.fetch_add(cut, Relaxed);
        }
        receivers
    }

    /// Channels (or shard channels) with subscribers, matching `pattern` if given.
    fn active(&self, shard: bool, pattern: Option<&[u8]>) -> Vec<Bytes> {
        let namespace = if shard {
            &self.shard_channels
        } else {
            &self.channels
        };
        let mut names = Vec::new();
        for lock in &namespace.shards {
            names.extend(
                lock.read()
                    .keys()
                    .filter(|c| pattern.is_none_or(|p| matches(p, c)))
                    .cloned(),
            );
        }
        names
    }

    fn subscribers(&self, kind: Kind, name: &[u8]) -> usize {
        let (lock, _) = self.map(kind, name);
        lock.read().get(name).map_or(0, HashMap::len)
    }

    /// Channels, patterns and shard channels with subscribers, for `INFO`.
    pub fn counts(&self) -> (usize, usize, usize) {
        (
            self.channels.count.load(Relaxed),
            self.pattern_count.load(Relaxed),
            self.shard_channels.count.load(Relaxed),
        )
    }
}

/// One connection's subscriptions. Each name maps to when it was subscribed, so that
/// unsubscribing from all of them replies in subscription order.
pub struct Subs {
    pub mailbox: Arc<Mailbox>,
    names: [HashMap<Bytes, u64>; 3],
    next: u64,
}

impl Subs {
    pub fn new(info: &ClientInfo) -> Subs {
        Subs {
            mailbox: Arc::new(Mailbox {
                id: info.id,
                queue: Mutex::default(),
                notify: Notify::new(),
                kill: info.kill.clone(),
            }),
            names: Default::default(),
            next: 0,
        }
    }

    /// Whether the connection is in Redis's pub/sub context: subscribed to anything.
    pub fn active(&self) -> bool {
        self.names.iter().any(|n| !n.is_empty())
    }

    /// The count a (un)subscribe reply carries: shard channels count apart, as in Redis.
    fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Shard => self.names[Kind::Shard.index()].len(),
            Kind::Channel | Kind::Pattern => {
                self.names[Kind::Channel.index()].len() + self.names[Kind::Pattern.index()].len()
            }
        }
    }

    fn publish_counts(&self, info: &ClientInfo) {
        for (slot, names) in info.subscriptions.iter().zip(&self.names) {
            slot.store(names.len() as u64, Relaxed);
        }
    }

    /// `SUBSCRIBE`/`PSUBSCRIBE`/`SSUBSCRIBE`: one reply per name, in the order given.
    pub fn subscribe(
        &mut self,
        registry: &Registry,
        info: &ClientInfo,
        kind: Kind,
        names: &[Bytes],
        out: &mut Out<'_>,
    ) {
        for name in names {
            if !self.names[kind.index()].contains_key(name) {
                self.names[kind.index()].insert(name.clone(), self.next);
                self.next += 1;
                registry.add(kind, name, &self.mailbox);
            }
            out.push(3);
            out.bulk(kind.subscribe_word());
            out.bulk(name);
            out.int(self.count(kind) as i64);
        }
        self.publish_counts(info);
    }

    /// `UNSUBSCRIBE`/`PUNSUBSCRIBE`/`SUNSUBSCRIBE`: one reply per name; without names, one per
    /// subscription of that kind (in the order subscribed), or one with a null name if there
    /// were none.
    pub fn unsubscribe(
        &mut self,
        registry: &Registry,
        info: &ClientInfo,
        kind: Kind,
        names: &[Bytes],
        out: &mut Out<'_>,
    ) {
        let all: Vec<Bytes>;
        let names = if names.is_empty() {
            let mut held: Vec<(&Bytes, &u64)> = self.names[kind.index()].iter().collect();
            held.sort_unstable_by_key(|&(_, seq)| *seq);
            all = held.into_iter().map(|(n, _)| n.clone()).collect();
            if all.is_empty() {
                out.push(3);
                out.bulk(kind.unsubscribe_word());
                out.null();
                out.int(self.count(kind) as i64);
                return;
            }
            &all[..]
        } else {
            names
        };
        for name in names {
            if self.names[kind.index()].remove(name).is_some() {
                registry.remove(kind, name, self.mailbox.id);
                // Whatever the channel sent before it let go goes out before the reply: none
                // follows it.
                self.mailbox.deliver(out, usize::MAX);
            }
            out.push(3);
            out.bulk(kind.unsubscribe_word());
            out.bulk(name);
            out.int(self.count(kind) as i64);
        }
        shrink(&mut self.names[kind.index()]);
        self.publish_counts(info);
    }

    /// Drops every subscription without a reply (`RESET`, disconnect).
    pub fn leave(&mut self, registry: &Registry, info: &ClientInfo) {
        for kind in [Kind::Channel, Kind::Pattern, Kind::Shard] {
            for (name, _) in std::mem::take(&mut self.names[kind.index()]) {
                registry.remove(kind, &name, self.mailbox.id);
            }
        }
        self.publish_counts(info);
    }
}

/// `PUBSUB` subcommands and their Redis arities (the name counts as 1, the subcommand as 2).
pub const PUBSUB_SUBCOMMANDS: &[(&str, i32)] = &[
    ("channels", -2),
    ("numpat", 2),
    ("numsub", -2),
    ("shardchannels", -2),
    ("shardnumsub", -2),
    ("help", 2),
];

/// Checks a `PUBSUB` request's subcommand and arity, as Redis does before it runs (or queues)
/// the command.
pub fn check_pubsub(args: &[Bytes]) -> Result<(), Fail> {
    let sub = args[1].to_ascii_lowercase();
    let Some(&(name, arity)) = PUBSUB_SUBCOMMANDS
        .iter()
        .find(|(name, _)| name.as_bytes() == sub)
    else {
        return Err(format!(
            "ERR unknown subcommand '{}'. Try PUBSUB HELP.",
            String::from_utf8_lossy(&args[1][..args[1].len().min(128)])
        )
        .into());
    };
    let fits = if arity >= 0 {
        args.len() == arity as usize
    } else {
        args.len() >= arity.unsigned_abs() as usize
    };
    if !fits {
        return Err(format!("ERR wrong number of arguments for 'pubsub|{name}' command").into());
    }
    if matches!(name, "channels" | "shardchannels") && args.len() > 3 {
        return Err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try PUBSUB HELP.",
            String::from_utf8_lossy(&args[1])
        )
        .into());
    }
    Ok(())
}

const PUBSUB_HELP: &[&str] = &[
    "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CHANNELS [<pattern>]",
    "    Return the currently active channels matching a <pattern> (default: '*').",
    "NUMPAT",
    "    Return number of subscriptions to patterns.",
    "NUMSUB [<channel> ...]",
    "    Return the number of subscribers for the specified channels, excluding",
    "    pattern subscriptions(default: no channels).",
    "SHARDCHANNELS [<pattern>]",
    "    Return the currently active shard level channels matching a <pattern> (default: '*').",
    "SHARDNUMSUB [<shardchannel> ...]",
    "    Return the number of subscribers for the specified shard level channel(s)",
    "HELP",
    "    Prints this help.",
];

/// `PUBSUB CHANNELS|NUMSUB|NUMPAT|SHARDCHANNELS|SHARDNUMSUB|HELP`.
pub fn pubsub(registry: &Registry, args: &[Bytes], out: &mut Out<'_>) -> Result<(), Fail> {
    check_pubsub(args)?;
    let sub = args[1].to_ascii_lowercase();
    match &sub[..] {
        b"channels" | b"shardchannels" => {
            let names = registry.active(sub[0] == b's', args.get(2).map(|p| &p[..]));
            out.array(names.len());
            for name in &names {
                out.bulk(name);
            }
        }
        b"numsub" | b"shardnumsub" => {
            let kind = if sub[0] == b's' {
                Kind::Shard
            } else {
                Kind::Channel
            };
            out.array(2 * (args.len() - 2));
            for name in &args[2..] {
                out.bulk(name);
                out.int(registry.subscribers(kind, name) as i64);
            }
        }
        b"numpat" => out.int(registry.counts().1 as i64),
        b"help" => out.help(PUBSUB_HELP),
        _ => unreachable!("check_pubsub knows every subcommand"),
    }
    Ok(())
}

/// The error a RESP2 connection in the pub/sub context gets for any other command;
/// `fullname` is Redis's (`client|id` for a subcommand).
pub fn not_in_context(fullname: &str) -> String {
    format!(
        "ERR Can't execute '{fullname}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT \
         / RESET are allowed in this context"
    )
}

/// Whether a connection in Redis's pub/sub context may run `cmd` in RESP2.
pub fn allowed_in_context(cmd: crate::table::Cmd) -> bool {
    use crate::table::Cmd;
    matches!(
        cmd,
        Cmd::Subscribe
            | Cmd::Unsubscribe
            | Cmd::Psubscribe
            | Cmd::Punsubscribe
            | Cmd::Ssubscribe
            | Cmd::Sunsubscribe
            | Cmd::Ping
            | Cmd::Quit
            | Cmd::Reset
    )
}

/// `PING` in the pub/sub context of a RESP2 connection: `["pong", message or ""]`.
pub fn ping(args: &[Bytes], out: &mut Out<'_>) {
    debug_assert_eq!(out.proto, Proto::Resp2);
    out.array(2);
    out.bulk(b"pong");
    out.bulk(args.get(1).map_or(&b""[..], |m| &m[..]));
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn mailbox() -> Arc<Mailbox> {
        Arc::new(Mailbox {
            id: 1,
            queue: Mutex::default(),
            notify: Notify::new(),
            kill: CancellationToken::new(),
        })
    }

    #[test]
    fn publish_reaches_channels_and_patterns_once_each() {
        let registry = Registry::new(OutputLimit::default());
        let m = mailbox();
        let none = registry.publish(false, &Bytes::from_static(b"news"), &Bytes::new());
        assert_eq!(none, 0);
        registry.add(Kind::Channel, &Bytes::from_static(b"news"), &m);
        registry.add(Kind::Pattern, &Bytes::from_static(b"n*"), &m);
        registry.add(Kind::Shard, &Bytes::from_static(b"news"), &m);
        let n = registry.publish(false, &Bytes::from_static(b"news"), &Bytes::from("hi"));
        assert_eq!(n, 2);
        assert_eq!(registry.counts(), (1, 1, 1));
        let mut buf = BytesMut::new();
        let mut out = Out::new(&mut buf, Proto::Resp3);
        assert!(!m.deliver(&mut out, usize::MAX));
        assert_eq!(
            &buf[..],
            &b">3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$2\r\nhi\r\n\
               >4\r\n$8\r\npmessage\r\n$2\r\nn*\r\n$4\r\nnews\r\n$2\r\nhi\r\n"[..]
        );
        registry.remove(Kind::Channel, b"news", 1);
        registry.remove(Kind::Pattern, b"n*", 1);
        registry.remove(Kind::Shard, b"news", 1);
        assert_eq!(registry.counts(), (0, 0, 0));
        assert!(registry.active(false, None).is_empty());
    }

    #[test]
    fn only_the_empty_pattern_matches_the_empty_channel() {
        assert!(matches(b"", b""));
        for pattern in ["*", "**", "?", "[a]", "a"] {
            assert!(!matches(pattern.as_bytes(), b""), "{pattern}");
        }
        assert!(matches(b"*", b"a"));
        let registry = Registry::new(OutputLimit::default());
        let m = mailbox();
        registry.add(Kind::Pattern, &Bytes::from_static(b"*"), &m);
        registry.add(Kind::Channel, &Bytes::new(), &m);
        assert_eq!(registry.publish(false, &Bytes::new(), &Bytes::new()), 1);
        assert_eq!(registry.active(false, Some(b"*")), Vec::<Bytes>::new());
        assert_eq!(registry.active(false, Some(b"")), vec![Bytes::new()]);
    }

    #[test]
    fn a_subscriber_over_its_hard_limit_is_cut_off() {
        let limit = OutputLimit {
            hard_bytes: 1000,
            soft_bytes: 0,
            soft_seconds: 0,
        };
        let m = mailbox();
        let message = || Message {
            pattern: None,
            channel: Bytes::from_static(b"c"),
            payload: Bytes::from(vec![0u8; 250]),
            shard: false,
        };
        // 299 bytes each with the frame.
        for _ in 0..3 {
            assert!(!m.push(message(), limit));
        }
        assert!(!m.kill.is_cancelled());
        // Delivered but not written still counts.
        let mut buf = BytesMut::new();
        m.deliver(&mut Out::new(&mut buf, Proto::Resp2), usize::MAX);
        assert!(m.push(message(), limit), "this push cut it off");
        assert!(m.kill.is_cancelled());
        assert!(!m.has_mail(), "a cut subscriber's messages are dropped");
    }

    #[test]
    fn written_messages_are_no_longer_owed() {
        let limit = OutputLimit {
            hard_bytes: 1000,
            soft_bytes: 0,
            soft_seconds: 0,
        };
        let m = mailbox();
        for _ in 0..10 {
            m.push(
                Message {
                    pattern: None,
                    channel: Bytes::from_static(b"c"),
                    payload: Bytes::from(vec![0u8; 300]),
                    shard: false,
                },
                limit,
            );
            let mut buf = BytesMut::new();
            m.deliver(&mut Out::new(&mut buf, Proto::Resp2), usize::MAX);
            m.written(limit);
        }
        assert!(!m.kill.is_cancelled());
    }

    #[test]
    fn soft_limit_needs_its_seconds() {
        let limit = OutputLimit {
            hard_bytes: 0,
            soft_bytes: 100,
            soft_seconds: 3600,
        };
        let m = mailbox();
        for _ in 0..100 {
            m.push(
                Message {
                    pattern: None,
                    channel: Bytes::from_static(b"c"),
                    payload: Bytes::from(vec![0u8; 100]),
                    shard: false,
                },
                limit,
            );
        }
        assert!(
            !m.kill.is_cancelled(),
            "over the soft limit for less than its time"
        );
        let instant = OutputLimit {
            soft_seconds: 0,
            ..limit
        };
        std::thread::sleep(Duration::from_millis(2));
        m.push(
            Message {
                pattern: None,
                channel: Bytes::from_static(b"c"),
                payload: Bytes::new(),
                shard: false,
            },
            instant,
        );
        assert!(m.kill.is_cancelled());
    }
}
