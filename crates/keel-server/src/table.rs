//! The command table: every command keel answers, with the facts `COMMAND` reports (arity,
//! flags, key positions) and that dispatch checks (arity) before running anything.
//!
//! Arity follows Redis: a positive arity is exact, a negative one is a minimum, and both count
//! the command name.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::LazyLock;

/// What a command is, for dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Cmd {
    // Connection and server.
    Ping,
    Echo,
    Quit,
    Reset,
    Hello,
    Auth,
    Select,
    Client,
    Command,
    Config,
    Info,
    Time,
    Role,
    Shutdown,
    Save,
    Bgsave,
    Lastsave,
    Slowlog,
    Wait,
    // Cluster (cluster.rs).
    Cluster,
    Asking,
    Readonly,
    Readwrite,
    // Transactions.
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
    // Pub/sub.
    Subscribe,
    Unsubscribe,
    Psubscribe,
    Punsubscribe,
    Ssubscribe,
    Sunsubscribe,
    Publish,
    Spublish,
    Pubsub,
    // Strings and keys.
    Get,
    Set,
    Setnx,
    Getset,
    Getdel,
    Mget,
    Mset,
    Msetnx,
    Append,
    Strlen,
    Getrange,
    Substr,
    Lcs,
    Sort,
    SortRo,
    Setrange,
    Incr,
    Incrby,
    Decr,
    Decrby,
    Incrbyfloat,
    Del,
    Unlink,
    Exists,
    Type,
    Rename,
    Renamenx,
    Copy,
    Move,
    Swapdb,
    Randomkey,
    Touch,
    Object,
    Memory,
    Keys,
    Scan,
    Dbsize,
    Flushdb,
    Flushall,
    // Bits (bits.rs).
    Setbit,
    Getbit,
    Bitcount,
    Bitpos,
    Bitop,
    Bitfield,
    BitfieldRo,
    // Expiry.
    Expire,
    Pexpire,
    Expireat,
    Pexpireat,
    Ttl,
    Pttl,
    Expiretime,
    Pexpiretime,
    Persist,
    Setex,
    Psetex,
    Getex,
    // Hashes.
    Hset,
    Hsetnx,
    Hget,
    Hmget,
    Hmset,
    Hgetall,
    Hdel,
    Hlen,
    Hexists,
    Hkeys,
    Hvals,
    Hincrby,
    Hincrbyfloat,
    Hstrlen,
    Hscan,
    Hrandfield,
    // Sets.
    Sadd,
    Srem,
    Smembers,
    Sismember,
    Smismember,
    Scard,
    Spop,
    Srandmember,
    Smove,
    Sinter,
    Sinterstore,
    Sunion,
    Sunionstore,
    Sdiff,
    Sdiffstore,
    Sintercard,
    Sscan,
    // Lists.
    Lpush,
    Rpush,
    Lpushx,
    Rpushx,
    Lpop,
    Rpop,
    Llen,
    Lrange,
    Lindex,
    Lset,
    Lrem,
    Ltrim,
    Linsert,
    Lpos,
    Lmove,
    Rpoplpush,
    Blpop,
    Brpop,
    Blmove,
    Brpoplpush,
    Lmpop,
    Blmpop,
    // Sorted sets.
    Zadd,
    Zrem,
    Zscore,
    Zmscore,
    Zincrby,
    Zcard,
    Zcount,
    Zlexcount,
    Zrange,
    Zrangebyscore,
    Zrevrangebyscore,
    Zrangebylex,
    Zrevrangebylex,
    Zrevrange,
    Zrank,
    Zrevrank,
    Zpopmin,
    Zpopmax,
    Zrangestore,
    Zunionstore,
    Zinterstore,
    Zdiffstore,
    Zunion,
    Zinter,
    Zdiff,
    Zintercard,
    Zmpop,
    Bzpopmin,
    Bzpopmax,
    Bzmpop,
    Zremrangebyscore,
    Zremrangebyrank,
    Zremrangebylex,
    Zscan,
    Zrandmember,
    // keel's own.
    KeelRange,
    KeelDump,
    KeelCheck,
    KeelRestore,
    KeelMax,
    KeelMin,
    KeelAdd,
    KeelRaft,
    KeelMoveslots,
    KeelJoin,
    KeelRemovenode,
    KeelLearnslots,
    KeelOnce,
    KeelPublish,
    KeelAwaitpush,
    KeelReap,
    KeelFlushbatch,
}

/// One command's description.
#[derive(Debug)]
pub struct Spec {
    /// Lower-case name, as `COMMAND` reports it.
    pub name: &'static str,
    /// What to run.
    pub cmd: Cmd,
    /// Redis arity: exact when positive, a minimum when negative; counts the name.
    pub arity: i32,
    /// `COMMAND` flags.
    pub flags: &'static [&'static str],
    /// Position of the first key (0: none).
    pub first_key: i32,
    /// Position of the last key (-1: the last argument).
    pub last_key: i32,
    /// Step between keys.
    pub key_step: i32,
    /// `COMMAND DOCS` group.
    pub group: &'static str,
    /// `COMMAND DOCS` summary.
    pub summary: &'static str,
    /// Sub-commands, for `CLIENT`, `CONFIG` and `COMMAND`.
    pub subcommands: &'static [(&'static str, i32)],
}

impl Spec {
    /// Whether `argc` arguments (name included) fit the arity.
    pub fn arity_ok(&self, argc: usize) -> bool {
        let argc = i64::try_from(argc).unwrap_or(i64::MAX);
        let arity = i64::from(self.arity);
        if arity >= 0 {
            argc == arity
        } else {
            argc >= -arity
        }
    }
}

const RO: &[&str] = &["readonly", "fast"];
const RO_SLOW: &[&str] = &["readonly"];
const WR: &[&str] = &["write", "denyoom", "fast"];
const WR_SLOW: &[&str] = &["write"];
const PUBSUB_SUB: &[&str] = &["pubsub", "noscript", "loading", "stale"];
const PUBSUB_PUB: &[&str] = &["pubsub", "loading", "stale", "fast"];
const WR_FAST: &[&str] = &["write", "fast"];
const WR_OOM: &[&str] = &["write", "denyoom"];
const WR_BLOCKING: &[&str] = &["write", "noscript", "blocking"];
const WR_MOVABLE: &[&str] = &["write", "movablekeys"];
const WR_BLOCKING_MOVABLE: &[&str] = &["write", "blocking", "movablekeys"];
const WR_OOM_BLOCKING: &[&str] = &["write", "denyoom", "noscript", "blocking"];
const CONN: &[&str] = &["fast", "loading", "stale"];
const NOAUTH: &[&str] = &[
    "noscript",
    "loading",
    "stale",
    "fast",
    "no_auth",
    "allow_busy",
];

macro_rules! spec {
    ($name:literal, $cmd:ident, $arity:expr, $flags:expr, $first:expr, $last:expr, $step:expr, $group:literal, $summary:literal) => {
        spec!(
            $name,
            $cmd,
            $arity,
            $flags,
            $first,
            $last,
            $step,
            $group,
            $summary,
            &[]
        )
    };
    ($name:literal, $cmd:ident, $arity:expr, $flags:expr, $first:expr, $last:expr, $step:expr, $group:literal, $summary:literal, $subs:expr) => {
        Spec {
            name: $name,
            cmd: Cmd::$cmd,
            arity: $arity,
            flags: $flags,
            first_key: $first,
            last_key: $last,
            key_step: $step,
            group: $group,
            summary: $summary,
            subcommands: $subs,
        }
    };
}

/// Every command, in the order `COMMAND` lists them.
pub static SPECS: &[Spec] = &[
    spec!(
        "ping",
        Ping,
        -1,
        CONN,
        0,
        0,
        0,
        "connection",
        "Returns the server's liveliness response."
    ),
    spec!(
        "echo",
        Echo,
        2,
        CONN,
        0,
        0,
        0,
        "connection",
        "Returns the given string."
    ),
    spec!(
        "quit",
        Quit,
        -1,
        NOAUTH,
        0,
        0,
        0,
        "connection",
        "Closes the connection."
    ),
    spec!(
        "reset",
        Reset,
        1,
        NOAUTH,
        0,
        0,
        0,
        "connection",
        "Resets the connection."
    ),
    spec!(
        "hello",
        Hello,
        -1,
        NOAUTH,
        0,
        0,
        0,
        "connection",
        "Handshakes with the server: protocol version, AUTH, SETNAME."
    ),
    spec!(
        "auth",
        Auth,
        -2,
        NOAUTH,
        0,
        0,
        0,
        "connection",
        "Authenticates the connection."
    ),
    spec!(
        "select",
        Select,
        2,
        CONN,
        0,
        0,
        0,
        "connection",
        "Changes the selected database (keel has only database 0)."
    ),
    spec!(
        "client",
        Client,
        -2,
        &["slow"],
        0,
        0,
        0,
        "connection",
        "A container for client connection commands.",
        &[
            ("id", 2),
            ("setname", 3),
            ("getname", 2),
            ("setinfo", 4),
            ("list", -2),
            ("kill", -3),
            ("info", 2),
            ("unblock", -3)
        ]
    ),
    spec!(
        "command",
        Command,
        -1,
        &["loading", "stale"],
        0,
        0,
        0,
        "server",
        "Returns detailed information about all commands.",
        &[
            ("count", 2),
            ("docs", -2),
            ("getkeys", -4),
            ("getkeysandflags", -4),
            ("info", -2),
            ("list", -2)
        ]
    ),
    spec!(
        "config",
        Config,
        -2,
        &["admin", "noscript", "loading", "stale"],
        0,
        0,
        0,
        "server",
        "A container for server configuration commands.",
        &[("get", -3), ("set", -4), ("resetstat", 2)]
    ),
    spec!(
        "info",
        Info,
        -1,
        &["loading", "stale"],
        0,
        0,
        0,
        "server",
        "Returns information and statistics about the server."
    ),
    spec!(
        "time",
        Time,
        1,
        &["loading", "stale", "fast"],
        0,
        0,
        0,
        "server",
        "Returns the server time."
    ),
    spec!(
        "role",
        Role,
        1,
        &["noscript", "loading", "stale", "fast"],
        0,
        0,
        0,
        "server",
        "Returns the replication role."
    ),
    spec!(
        "shutdown",
        Shutdown,
        -1,
        &[
            "admin",
            "noscript",
            "loading",
            "stale",
            "no_multi",
            "allow_busy"
        ],
        0,
        0,
        0,
        "server",
        "Stops the server gracefully."
    ),
    spec!(
        "save",
        Save,
        1,
        &["admin", "noscript", "no_async_loading", "no_multi"],
        0,
        0,
        0,
        "server",
        "Synchronously saves the database(s) to disk."
    ),
    spec!(
        "bgsave",
        Bgsave,
        -1,
        &["admin", "noscript", "no_async_loading"],
        0,
        0,
        0,
        "server",
        "Asynchronously saves the database(s) to disk."
    ),
    spec!(
        "slowlog",
        Slowlog,
        -2,
        &["admin", "loading", "stale"],
        0,
        0,
        0,
        "server",
        "A container for slow log commands.",
        &[("get", -2), ("help", 2), ("len", 2), ("reset", 2)]
    ),
    spec!(
        "wait",
        Wait,
        3,
        &["noscript"],
        0,
        0,
        0,
        "generic",
        "Blocks until the replication of all preceding write commands sent by the connection is completed."
    ),
    spec!(
        "lastsave",
        Lastsave,
        1,
        &["loading", "stale", "fast"],
        0,
        0,
        0,
        "server",
        "Returns the Unix timestamp of the last successful save to disk."
    ),
    spec!(
        "cluster",
        Cluster,
        -2,
        &["slow"],
        0,
        0,
        0,
        "cluster",
        "A container for Redis Cluster commands.",
        &[
            ("countkeysinslot", 3),
            ("getkeysinslot", 4),
            ("help", 2),
            ("info", 2),
            ("keyslot", 3),
            ("myid", 2),
            ("nodes", 2),
            ("setslot", -4),
            ("shards", 2),
            ("slots", 2)
        ]
    ),
    spec!(
        "asking",
        Asking,
        1,
        &["fast"],
        0,
        0,
        0,
        "cluster",
        "Signals that a cluster client is following an -ASK redirect."
    ),
    spec!(
        "readonly",
        Readonly,
        1,
        &["loading", "stale", "fast"],
        0,
        0,
        0,
        "cluster",
        "Enables read-only queries for a connection to a Redis Cluster replica node."
    ),
    spec!(
        "readwrite",
        Readwrite,
        1,
        &["loading", "stale", "fast"],
        0,
        0,
        0,
        "cluster",
        "Enables read-write queries for a connection to a Redis Cluster replica node."
    ),
    spec!(
        "multi",
        Multi,
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        0,
        0,
        0,
        "transactions",
        "Starts a transaction."
    ),
    spec!(
        "exec",
        Exec,
        1,
        &["noscript", "loading", "stale", "skip_slowlog"],
        0,
        0,
        0,
        "transactions",
        "Executes all commands in a transaction as one serializable transaction."
    ),
    spec!(
        "discard",
        Discard,
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        0,
        0,
        0,
        "transactions",
        "Discards a transaction."
    ),
    spec!(
        "watch",
        Watch,
        -2,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        1,
        -1,
        1,
        "transactions",
        "Monitors changes to keys to determine the execution of a transaction."
    ),
    spec!(
        "unwatch",
        Unwatch,
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        0,
        0,
        0,
        "transactions",
        "Forgets about watched keys of a transaction."
    ),
    spec!(
        "subscribe",
        Subscribe,
        -2,
        PUBSUB_SUB,
        0,
        0,
        0,
        "pubsub",
        "Listens for messages published to channels."
    ),
    spec!(
        "unsubscribe",
        Unsubscribe,
        -1,
        PUBSUB_SUB,
        0,
        0,
        0,
        "pubsub",
        "Stops listening to messages posted to channels."
    ),
    spec!(
        "psubscribe",
        Psubscribe,
        -2,
        PUBSUB_SUB,
        0,
        0,
        0,
        "pubsub",
        "Listens for messages published to channels that match one or more patterns."
    ),
    spec!(
        "punsubscribe",
        Punsubscribe,
        -1,
        PUBSUB_SUB,
        0,
        0,
        0,
        "pubsub",
        "Stops listening to messages published to channels that match one or more patterns."
    ),
    spec!(
        "ssubscribe",
        Ssubscribe,
        -2,
        PUBSUB_SUB,
        1,
        -1,
        1,
        "pubsub",
        "Listens for messages published to shard channels."
    ),
    spec!(
        "sunsubscribe",
        Sunsubscribe,
        -1,
        PUBSUB_SUB,
        1,
        -1,
        1,
        "pubsub",
        "Stops listening to messages posted to shard channels."
    ),
    spec!(
        "publish",
        Publish,
        3,
        PUBSUB_PUB,
        0,
        0,
        0,
        "pubsub",
        "Posts a message to a channel."
    ),
    spec!(
        "spublish",
        Spublish,
        3,
        PUBSUB_PUB,
        1,
        1,
        1,
        "pubsub",
        "Post a message to a shard channel"
    ),
    spec!(
        "pubsub",
        Pubsub,
        -2,
        &[],
        0,
        0,
        0,
        "pubsub",
        "A container for Pub/Sub commands.",
        crate::pubsub::PUBSUB_SUBCOMMANDS
    ),
    spec!(
        "get",
        Get,
        2,
        RO,
        1,
        1,
        1,
        "string",
        "Returns the string value of a key."
    ),
    spec!(
        "set",
        Set,
        -3,
        &["write", "denyoom"],
        1,
        1,
        1,
        "string",
        "Sets the string value of a key, ignoring its type. The key is created if it doesn't exist."
    ),
    spec!(
        "setnx",
        Setnx,
        3,
        WR,
        1,
        1,
        1,
        "string",
        "Set the string value of a key only when the key doesn't exist."
    ),
    spec!(
        "getset",
        Getset,
        3,
        WR,
        1,
        1,
        1,
        "string",
        "Returns the previous string value of a key after setting it to a new value."
    ),
    spec!(
        "getdel",
        Getdel,
        2,
        &["write", "fast"],
        1,
        1,
        1,
        "string",
        "Returns the string value of a key after deleting the key."
    ),
    spec!(
        "mget",
        Mget,
        -2,
        RO,
        1,
        -1,
        1,
        "string",
        "Atomically returns the string values of one or more keys."
    ),
    spec!(
        "mset",
        Mset,
        -3,
        &["write", "denyoom"],
        1,
        -1,
        2,
        "string",
        "Atomically creates or modifies the string values of one or more keys."
    ),
    spec!(
        "msetnx",
        Msetnx,
        -3,
        &["write", "denyoom"],
        1,
        -1,
        2,
        "string",
        "Atomically modifies the string values of one or more keys only when all keys don't exist."
    ),
    spec!(
        "append",
        Append,
        3,
        WR,
        1,
        1,
        1,
        "string",
        "Appends a string to the value of a key. Creates the key if it doesn't exist."
    ),
    spec!(
        "strlen",
        Strlen,
        2,
        RO,
        1,
        1,
        1,
        "string",
        "Returns the length of a string value."
    ),
    spec!(
        "getrange",
        Getrange,
        4,
        RO_SLOW,
        1,
        1,
        1,
        "string",
        "Returns a substring of the string stored at a key."
    ),
    spec!(
        "substr",
        Substr,
        4,
        RO_SLOW,
        1,
        1,
        1,
        "string",
        "Returns a substring from a string value."
    ),
    spec!(
        "sort",
        Sort,
        -2,
        &["write", "denyoom", "movablekeys"],
        1,
        1,
        1,
        "generic",
        "Sorts the elements in a list, a set, or a sorted set, optionally storing the result."
    ),
    spec!(
        "sort_ro",
        SortRo,
        -2,
        &["readonly", "movablekeys"],
        1,
        1,
        1,
        "generic",
        "Returns the sorted elements of a list, a set, or a sorted set."
    ),
    spec!(
        "lcs",
        Lcs,
        -3,
        RO_SLOW,
        1,
        2,
        1,
        "string",
        "Finds the longest common substring."
    ),
    spec!(
        "setrange",
        Setrange,
        4,
        &["write", "denyoom"],
        1,
        1,
        1,
        "string",
        "Overwrites a part of a string value with another by an offset."
    ),
    spec!(
        "incr",
        Incr,
        2,
        WR,
        1,
        1,
        1,
        "string",
        "Increments the integer value of a key by one."
    ),
    spec!(
        "incrby",
        Incrby,
        3,
        WR,
        1,
        1,
        1,
        "string",
        "Increments the integer value of a key by a number."
    ),
    spec!(
        "decr",
        Decr,
        2,
        WR,
        1,
        1,
        1,
        "string",
        "Decrements the integer value of a key by one."
    ),
    spec!(
        "decrby",
        Decrby,
        3,
        WR,
        1,
        1,
        1,
        "string",
        "Decrements a number from the integer value of a key."
    ),
    spec!(
        "incrbyfloat",
        Incrbyfloat,
        3,
        WR,
        1,
        1,
        1,
        "string",
        "Increment the floating point value of a key by a number."
    ),
    spec!(
        "del",
        Del,
        -2,
        WR_SLOW,
        1,
        -1,
        1,
        "generic",
        "Deletes one or more keys."
    ),
    spec!(
        "unlink",
        Unlink,
        -2,
        &["write", "fast"],
        1,
        -1,
        1,
        "generic",
        "Deletes one or more keys."
    ),
    spec!(
        "exists",
        Exists,
        -2,
        RO,
        1,
        -1,
        1,
        "generic",
        "Determines whether one or more keys exist."
    ),
    spec!(
        "type",
        Type,
        2,
        RO,
        1,
        1,
        1,
        "generic",
        "Determines the type of value stored at a key."
    ),
    spec!(
        "rename",
        Rename,
        3,
        WR_SLOW,
        1,
        2,
        1,
        "generic",
        "Renames a key and overwrites the destination."
    ),
    spec!(
        "renamenx",
        Renamenx,
        3,
        WR_FAST,
        1,
        2,
        1,
        "generic",
        "Renames a key only when the target key name doesn't exist."
    ),
    spec!(
        "copy",
        Copy,
        -3,
        WR_OOM,
        1,
        2,
        1,
        "generic",
        "Copies the value of a key to a new key."
    ),
    spec!(
        "move",
        Move,
        3,
        WR_FAST,
        1,
        1,
        1,
        "generic",
        "Moves a key to another database (keel has only database 0, so every move is refused \
         with Redis' errors)."
    ),
    spec!(
        "swapdb",
        Swapdb,
        3,
        WR_FAST,
        0,
        0,
        0,
        "server",
        "Swaps two databases (keel has only database 0: SWAPDB 0 0 is the one swap there is)."
    ),
    spec!(
        "randomkey",
        Randomkey,
        1,
        RO_SLOW,
        0,
        0,
        0,
        "generic",
        "Returns a random key name from the database."
    ),
    spec!(
        "touch",
        Touch,
        -2,
        RO,
        1,
        -1,
        1,
        "generic",
        "Returns the number of existing keys out of those specified after updating the time they were last accessed."
    ),
    // Redis gives the container no key positions (its subcommands have them); keel gives it
    // the key of `OBJECT ENCODING key` and its kin, which is what routes it in a cluster.
    spec!(
        "memory",
        Memory,
        -2,
        &["readonly"],
        2,
        2,
        1,
        "server",
        "A container for memory diagnostics commands.",
        &[("help", 2), ("usage", -3)]
    ),
    spec!(
        "object",
        Object,
        -2,
        &[],
        2,
        2,
        1,
        "generic",
        "A container for object introspection commands.",
        &[
            ("encoding", 3),
            ("freq", 3),
            ("help", 2),
            ("idletime", 3),
            ("refcount", 3)
        ]
    ),
    spec!(
        "keys",
        Keys,
        2,
        RO_SLOW,
        0,
        0,
        0,
        "generic",
        "Returns all key names that match a pattern."
    ),
    spec!(
        "scan",
        Scan,
        -2,
        RO_SLOW,
        0,
        0,
        0,
        "generic",
        "Iterates over the key names in the database."
    ),
    spec!(
        "dbsize",
        Dbsize,
        1,
        RO,
        0,
        0,
        0,
        "server",
        "Returns the number of keys in the database."
    ),
    spec!(
        "flushdb",
        Flushdb,
        -1,
        WR_SLOW,
        0,
        0,
        0,
        "server",
        "Removes all keys from the current database."
    ),
    spec!(
        "flushall",
        Flushall,
        -1,
        WR_SLOW,
        0,
        0,
        0,
        "server",
        "Removes all keys from all databases."
    ),
    spec!(
        "expire",
        Expire,
        -3,
        WR_FAST,
        1,
        1,
        1,
        "generic",
        "Sets the expiration time of a key in seconds."
    ),
    spec!(
        "pexpire",
        Pexpire,
        -3,
        WR_FAST,
        1,
        1,
        1,
        "generic",
        "Sets the expiration time of a key in milliseconds."
    ),
    spec!(
        "expireat",
        Expireat,
        -3,
        WR_FAST,
        1,
        1,
        1,
        "generic",
        "Sets the expiration time of a key to a Unix timestamp."
    ),
    spec!(
        "pexpireat",
        Pexpireat,
        -3,
        WR_FAST,
        1,
        1,
        1,
        "generic",
        "Sets the expiration time of a key to a Unix milliseconds timestamp."
    ),
    spec!(
        "ttl",
        Ttl,
        2,
        RO,
        1,
        1,
        1,
        "generic",
        "Returns the expiration time in seconds of a key."
    ),
    spec!(
        "pttl",
        Pttl,
        2,
        RO,
        1,
        1,
        1,
        "generic",
        "Returns the expiration time in milliseconds of a key."
    ),
    spec!(
        "expiretime",
        Expiretime,
        2,
        RO,
        1,
        1,
        1,
        "generic",
        "Returns the expiration time of a key as a Unix timestamp."
    ),
    spec!(
        "pexpiretime",
        Pexpiretime,
        2,
        RO,
        1,
        1,
        1,
        "generic",
        "Returns the expiration time of a key as a Unix milliseconds timestamp."
    ),
    spec!(
        "persist",
        Persist,
        2,
        WR_FAST,
        1,
        1,
        1,
        "generic",
        "Removes the expiration time of a key."
    ),
    spec!(
        "setex",
        Setex,
        4,
        WR_OOM,
        1,
        1,
        1,
        "string",
        "Sets the string value and expiration time of a key. Creates the key if it doesn't exist."
    ),
    spec!(
        "psetex",
        Psetex,
        4,
        WR_OOM,
        1,
        1,
        1,
        "string",
        "Sets both string value and expiration time in milliseconds of a key. The key is created if it doesn't exist."
    ),
    spec!(
        "getex",
        Getex,
        -2,
        WR_FAST,
        1,
        1,
        1,
        "string",
        "Returns the string value of a key after setting its expiration time."
    ),
    spec!(
        "hset",
        Hset,
        -4,
        WR,
        1,
        1,
        1,
        "hash",
        "Creates or modifies the value of a field in a hash."
    ),
    spec!(
        "hsetnx",
        Hsetnx,
        4,
        WR,
        1,
        1,
        1,
        "hash",
        "Sets the value of a field in a hash only when the field doesn't exist."
    ),
    spec!(
        "hget",
        Hget,
        3,
        RO,
        1,
        1,
        1,
        "hash",
        "Returns the value of a field in a hash."
    ),
    spec!(
        "hmget",
        Hmget,
        -3,
        RO,
        1,
        1,
        1,
        "hash",
        "Returns the values of all fields in a hash."
    ),
    spec!(
        "hmset",
        Hmset,
        -4,
        WR,
        1,
        1,
        1,
        "hash",
        "Sets the values of multiple fields."
    ),
    spec!(
        "hgetall",
        Hgetall,
        2,
        RO_SLOW,
        1,
        1,
        1,
        "hash",
        "Returns all fields and values in a hash."
    ),
    spec!(
        "hdel",
        Hdel,
        -3,
        WR_FAST,
        1,
        1,
        1,
        "hash",
        "Deletes one or more fields and their values from a hash. Deletes the hash if no fields remain."
    ),
    spec!(
        "hlen",
        Hlen,
        2,
        RO,
        1,
        1,
        1,
        "hash",
        "Returns the number of fields in a hash."
    ),
    spec!(
        "hexists",
        Hexists,
        3,
        RO,
        1,
        1,
        1,
        "hash",
        "Determines whether a field exists in a hash."
    ),
    spec!(
        "hkeys",
        Hkeys,
        2,
        RO_SLOW,
        1,
        1,
        1,
        "hash",
        "Returns all fields in a hash."
    ),
    spec!(
        "hvals",
        Hvals,
        2,
        RO_SLOW,
        1,
        1,
        1,
        "hash",
        "Returns all values in a hash."
    ),
    spec!(
        "hincrby",
        Hincrby,
        4,
        WR,
        1,
        1,
        1,
        "hash",
        "Increments the integer value of a field in a hash by a number. Uses 0 as initial value if the field doesn't exist."
    ),
    spec!(
        "hincrbyfloat",
        Hincrbyfloat,
        4,
        WR,
        1,
        1,
        1,
        "hash",
        "Increments the floating point value of a field by a number. Uses 0 as initial value if the field doesn't exist."
    ),
    spec!(
        "hstrlen",
        Hstrlen,
        3,
        RO,
        1,
        1,
        1,
        "hash",
        "Returns the length of the value of a field."
    ),
    spec!(
        "hscan",
        Hscan,
        -3,
        RO_SLOW,
        1,
        1,
        1,
        "hash",
        "Iterates over fields and values of a hash."
    ),
    spec!(
        "hrandfield",
        Hrandfield,
        -2,
        RO_SLOW,
        1,
        1,
        1,
        "hash",
        "Returns one or more random fields from a hash."
    ),
    spec!(
        "sadd",
        Sadd,
        -3,
        WR,
        1,
        1,
        1,
        "set",
        "Add one or more members to a set."
    ),
    spec!(
        "srem",
        Srem,
        -3,
        WR_FAST,
        1,
        1,
        1,
        "set",
        "Remove one or more members from a set."
    ),
    spec!(
        "smembers",
        Smembers,
        2,
        RO_SLOW,
        1,
        1,
        1,
        "set",
        "Get all the members in a set."
    ),
    spec!(
        "sismember",
        Sismember,
        3,
        RO,
        1,
        1,
        1,
        "set",
        "Determine if a given value is a member of a set."
    ),
    spec!(
        "smismember",
        Smismember,
        -3,
        RO,
        1,
        1,
        1,
        "set",
        "Returns the membership associated with the given elements for a set."
    ),
    spec!(
        "scard",
        Scard,
        2,
        RO,
        1,
        1,
        1,
        "set",
        "Get the number of members in a set."
    ),
    spec!(
        "spop",
        Spop,
        -2,
        WR_FAST,
        1,
        1,
        1,
        "set",
        "Remove and return one or multiple random members from a set."
    ),
    spec!(
        "srandmember",
        Srandmember,
        -2,
        RO_SLOW,
        1,
        1,
        1,
        "set",
        "Get one or multiple random members from a set."
    ),
    spec!(
        "smove",
        Smove,
        4,
        WR_FAST,
        1,
        2,
        1,
        "set",
        "Move a member from one set to another."
    ),
    spec!(
        "sinter",
        Sinter,
        -2,
        RO_SLOW,
        1,
        -1,
        1,
        "set",
        "Intersect multiple sets."
    ),
    spec!(
        "sinterstore",
        Sinterstore,
        -3,
        WR_OOM,
        1,
        -1,
        1,
        "set",
        "Intersect multiple sets and store the resulting set in a key."
    ),
    spec!(
        "sunion",
        Sunion,
        -2,
        RO_SLOW,
        1,
        -1,
        1,
        "set",
        "Add multiple sets."
    ),
    spec!(
        "sunionstore",
        Sunionstore,
        -3,
        WR_OOM,
        1,
        -1,
        1,
        "set",
        "Add multiple sets and store the resulting set in a key."
    ),
    spec!(
        "sdiff",
        Sdiff,
        -2,
        RO_SLOW,
        1,
        -1,
        1,
        "set",
        "Subtract multiple sets."
    ),
    spec!(
        "sdiffstore",
        Sdiffstore,
        -3,
        WR_OOM,
        1,
        -1,
        1,
        "set",
        "Subtract multiple sets and store the resulting set in a key."
    ),
    spec!(
        "sintercard",
        Sintercard,
        -3,
        &["readonly", "movablekeys"],
        0,
        0,
        0,
        "set",
        "Intersect multiple sets and return the cardinality of the result."
    ),
    spec!(
        "sscan",
        Sscan,
        -3,
        RO_SLOW,
        1,
        1,
        1,
        "set",
        "Incrementally iterate Set elements."
    ),
    spec!(
        "zadd",
        Zadd,
        -4,
        WR,
        1,
        1,
        1,
        "sorted-set",
        "Add one or more members to a sorted set, or update its score if it already exists."
    ),
    spec!(
        "zrem",
        Zrem,
        -3,
        WR_FAST,
        1,
        1,
        1,
        "sorted-set",
        "Remove one or more members from a sorted set."
    ),
    spec!(
        "zscore",
        Zscore,
        3,
        RO,
        1,
        1,
        1,
        "sorted-set",
        "Get the score associated with the given member in a sorted set."
    ),
    spec!(
        "zmscore",
        Zmscore,
        -3,
        RO,
        1,
        1,
        1,
        "sorted-set",
        "Get the score associated with the given members in a sorted set."
    ),
    spec!(
        "zincrby",
        Zincrby,
        4,
        WR,
        1,
        1,
        1,
        "sorted-set",
        "Increment the score of a member in a sorted set."
    ),
    spec!(
        "zcard",
        Zcard,
        2,
        RO,
        1,
        1,
        1,
        "sorted-set",
        "Get the number of members in a sorted set."
    ),
    spec!(
        "zcount",
        Zcount,
        4,
        RO,
        1,
        1,
        1,
        "sorted-set",
        "Count the members in a sorted set with scores within the given values."
    ),
    spec!(
        "zlexcount",
        Zlexcount,
        4,
        RO,
        1,
        1,
        1,
        "sorted-set",
        "Count the number of members in a sorted set between a given lexicographical range."
    ),
    spec!(
        "zrange",
        Zrange,
        -4,
        RO_SLOW,
        1,
        1,
        1,
        "sorted-set",
        "Return a range of members in a sorted set."
    ),
    spec!(
        "zrangebyscore",
        Zrangebyscore,
        -4,
        RO_SLOW,
        1,
        1,
        1,
        "sorted-set",
        "Return a range of members in a sorted set, by score."
    ),
    spec!(
        "zrevrangebyscore",
        Zrevrangebyscore,
        -4,
        RO_SLOW,
        1,
        1,
        1,
        "sorted-set",
        "Return a range of members in a sorted set, by score, with scores ordered from high to low."
    ),
    spec!(
        "zrangebylex",
        Zrangebylex,
        -4,
        RO_SLOW,
        1,
        1,
        1,
        "sorted-set",
        "Return a range of members in a sorted set, by lexicographical range."
    ),
    spec!(
        "zrevrangebylex",
        Zrevrangebylex,
        -4,
        RO_SLOW,
        1,
        1,
        1,
        "sorted-set",
        "Return a range of members in a sorted set, by lexicographical range, ordered from higher to lower strings.."
    ),
    spec!(
        "zrevrange",
        Zrevrange,
        -4,
        RO_SLOW,
        1,
        1,
        1,
        "sorted-set",
        "Return a range of members in a sorted set, by index, with scores ordered from high to low."
    ),
    spec!(
        "zrank",
        Zrank,
        3,
        RO,
        1,
        1,
        1,
        "sorted-set",
        "Determine the index of a member in a sorted set."
    ),
    spec!(
        "zrevrank",
        Zrevrank,
        3,
        RO,
        1,
        1,
        1,
        "sorted-set",
        "Determine the index of a member in a sorted set, with scores ordered from high to low."
    ),
    spec!(
        "zpopmin",
        Zpopmin,
        -2,
        WR_FAST,
        1,
        1,
        1,
        "sorted-set",
        "Remove and return members with the lowest scores in a sorted set."
    ),
    spec!(
        "zpopmax",
        Zpopmax,
        -2,
        WR_FAST,
        1,
        1,
        1,
        "sorted-set",
        "Remove and return members with the highest scores in a sorted set."
    ),
    spec!(
        "zrangestore",
        Zrangestore,
        -5,
        WR_OOM,
        1,
        2,
        1,
        "sorted-set",
        "Store a range of members from sorted set into another key."
    ),
    spec!(
        "zunionstore",
        Zunionstore,
        -4,
        &["write", "denyoom", "movablekeys"],
        1,
        1,
        1,
        "sorted-set",
        "Add multiple sorted sets and store the resulting sorted set in a new key."
    ),
    spec!(
        "zinterstore",
        Zinterstore,
        -4,
        &["write", "denyoom", "movablekeys"],
        1,
        1,
        1,
        "sorted-set",
        "Intersect multiple sorted sets and store the resulting sorted set in a new key."
    ),
    spec!(
        "zdiffstore",
        Zdiffstore,
        -4,
        &["write", "denyoom", "movablekeys"],
        1,
        1,
        1,
        "sorted-set",
        "Stores the difference of multiple sorted sets in a key."
    ),
    spec!(
        "zunion",
        Zunion,
        -3,
        &["readonly", "movablekeys"],
        0,
        0,
        0,
        "sorted-set",
        "Returns the union of multiple sorted sets."
    ),
    spec!(
        "zinter",
        Zinter,
        -3,
        &["readonly", "movablekeys"],
        0,
        0,
        0,
        "sorted-set",
        "Returns the intersect of multiple sorted sets."
    ),
    spec!(
        "zdiff",
        Zdiff,
        -3,
        &["readonly", "movablekeys"],
        0,
        0,
        0,
        "sorted-set",
        "Returns the difference between multiple sorted sets."
    ),
    spec!(
        "zintercard",
        Zintercard,
        -3,
        &["readonly", "movablekeys"],
        0,
        0,
        0,
        "sorted-set",
        "Returns the number of members of the intersect of multiple sorted sets."
    ),
    spec!(
        "zmpop",
        Zmpop,
        -4,
        WR_MOVABLE,
        0,
        0,
        0,
        "sorted-set",
        "Returns the highest- or lowest-scoring members from one or more sorted sets after removing them. Deletes the sorted set if the last member was popped."
    ),
    spec!(
        "bzpopmin",
        Bzpopmin,
        -3,
        &["write", "noscript", "blocking", "fast"],
        1,
        -2,
        1,
        "sorted-set",
        "Removes and returns the member with the lowest score from one or more sorted sets. Blocks until a member is available otherwise. Deletes the sorted set if the last element was popped."
    ),
    spec!(
        "bzpopmax",
        Bzpopmax,
        -3,
        &["write", "noscript", "blocking", "fast"],
        1,
        -2,
        1,
        "sorted-set",
        "Removes and returns the member with the highest score from one or more sorted sets. Blocks until a member available otherwise.  Deletes the sorted set if the last element was popped."
    ),
    spec!(
        "bzmpop",
        Bzmpop,
        -5,
        WR_BLOCKING_MOVABLE,
        0,
        0,
        0,
        "sorted-set",
        "Removes and returns a member by score from one or more sorted sets. Blocks until a member is available otherwise. Deletes the sorted set if the last element was popped."
    ),
    spec!(
        "zremrangebyscore",
        Zremrangebyscore,
        4,
        WR_SLOW,
        1,
        1,
        1,
        "sorted-set",
        "Remove all members in a sorted set within the given scores."
    ),
    spec!(
        "zremrangebyrank",
        Zremrangebyrank,
        4,
        WR_SLOW,
        1,
        1,
        1,
        "sorted-set",
        "Remove all members in a sorted set within the given indexes."
    ),
    spec!(
        "zremrangebylex",
        Zremrangebylex,
        4,
        WR_SLOW,
        1,
        1,
        1,
        "sorted-set",
        "Remove all members in a sorted set between the given lexicographical range."
    ),
    spec!(
        "zscan",
        Zscan,
        -3,
        RO_SLOW,
        1,
        1,
        1,
        "sorted-set",
        "Incrementally iterate sorted sets elements and associated scores."
    ),
    spec!(
        "zrandmember",
        Zrandmember,
        -2,
        RO_SLOW,
        1,
        1,
        1,
        "sorted-set",
        "Get one or multiple random elements from a sorted set."
    ),
    spec!(
        "lpush",
        Lpush,
        -3,
        WR,
        1,
        1,
        1,
        "list",
        "Prepends one or more elements to a list. Creates the key if it doesn't exist."
    ),
    spec!(
        "rpush",
        Rpush,
        -3,
        WR,
        1,
        1,
        1,
        "list",
        "Appends one or more elements to a list. Creates the key if it doesn't exist."
    ),
    spec!(
        "lpushx",
        Lpushx,
        -3,
        WR,
        1,
        1,
        1,
        "list",
        "Prepends one or more elements to a list only when the list exists."
    ),
    spec!(
        "rpushx",
        Rpushx,
        -3,
        WR,
        1,
        1,
        1,
        "list",
        "Appends an element to a list only when the list exists."
    ),
    spec!(
        "lpop",
        Lpop,
        -2,
        WR_FAST,
        1,
        1,
        1,
        "list",
        "Returns the first elements in a list after removing it. Deletes the list if the last element was popped."
    ),
    spec!(
        "rpop",
        Rpop,
        -2,
        WR_FAST,
        1,
        1,
        1,
        "list",
        "Returns and removes the last elements of a list. Deletes the list if the last element was popped."
    ),
    spec!(
        "llen",
        Llen,
        2,
        RO,
        1,
        1,
        1,
        "list",
        "Returns the length of a list."
    ),
    spec!(
        "lrange",
        Lrange,
        4,
        RO_SLOW,
        1,
        1,
        1,
        "list",
        "Returns a range of elements from a list."
    ),
    spec!(
        "lindex",
        Lindex,
        3,
        RO_SLOW,
        1,
        1,
        1,
        "list",
        "Returns an element from a list by its index."
    ),
    spec!(
        "lset",
        Lset,
        4,
        WR_OOM,
        1,
        1,
        1,
        "list",
        "Sets the value of an element in a list by its index."
    ),
    spec!(
        "lrem",
        Lrem,
        4,
        WR_SLOW,
        1,
        1,
        1,
        "list",
        "Removes elements from a list. Deletes the list if the last element was removed."
    ),
    spec!(
        "ltrim",
        Ltrim,
        4,
        WR_SLOW,
        1,
        1,
        1,
        "list",
        "Removes elements from both ends a list. Deletes the list if all elements were trimmed."
    ),
    spec!(
        "linsert",
        Linsert,
        5,
        WR_OOM,
        1,
        1,
        1,
        "list",
        "Inserts an element before or after another element in a list."
    ),
    spec!(
        "lpos",
        Lpos,
        -3,
        RO_SLOW,
        1,
        1,
        1,
        "list",
        "Returns the index of matching elements in a list."
    ),
    spec!(
        "lmove",
        Lmove,
        5,
        WR_OOM,
        1,
        2,
        1,
        "list",
        "Returns an element after popping it from one list and pushing it to another. Deletes the list if the last element was moved."
    ),
    spec!(
        "rpoplpush",
        Rpoplpush,
        3,
        WR_OOM,
        1,
        2,
        1,
        "list",
        "Returns the last element of a list after removing and pushing it to another list. Deletes the list if the last element was popped."
    ),
    spec!(
        "blpop",
        Blpop,
        -3,
        WR_BLOCKING,
        1,
        -2,
        1,
        "list",
        "Removes and returns the first element in a list. Blocks until an element is available otherwise. Deletes the list if the last element was popped."
    ),
    spec!(
        "brpop",
        Brpop,
        -3,
        WR_BLOCKING,
        1,
        -2,
        1,
        "list",
        "Removes and returns the last element in a list. Blocks until an element is available otherwise. Deletes the list if the last element was popped."
    ),
    spec!(
        "blmove",
        Blmove,
        6,
        WR_OOM_BLOCKING,
        1,
        2,
        1,
        "list",
        "Pops an element from a list, pushes it to another list and returns it. Blocks until an element is available otherwise. Deletes the list if the last element was moved."
    ),
    spec!(
        "brpoplpush",
        Brpoplpush,
        4,
        WR_OOM_BLOCKING,
        1,
        2,
        1,
        "list",
        "Pops an element from a list, pushes it to another list and returns it. Block until an element is available otherwise. Deletes the list if the last element was popped."
    ),
    spec!(
        "lmpop",
        Lmpop,
        -4,
        WR_MOVABLE,
        0,
        0,
        0,
        "list",
        "Returns multiple elements from a list after removing them. Deletes the list if the last element was popped."
    ),
    spec!(
        "blmpop",
        Blmpop,
        -5,
        WR_BLOCKING_MOVABLE,
        0,
        0,
        0,
        "list",
        "Pops the first element from one of multiple lists. Blocks until an element is available otherwise. Deletes the list if the last element was popped."
    ),
    spec!(
        "setbit",
        Setbit,
        4,
        WR_OOM,
        1,
        1,
        1,
        "bitmap",
        "Sets or clears the bit at offset of the string value. Creates the key if it doesn't exist."
    ),
    spec!(
        "getbit",
        Getbit,
        3,
        RO,
        1,
        1,
        1,
        "bitmap",
        "Returns a bit value by offset."
    ),
    spec!(
        "bitcount",
        Bitcount,
        -2,
        RO_SLOW,
        1,
        1,
        1,
        "bitmap",
        "Counts the number of set bits (population counting) in a string."
    ),
    spec!(
        "bitpos",
        Bitpos,
        -3,
        RO_SLOW,
        1,
        1,
        1,
        "bitmap",
        "Finds the first set (1) or clear (0) bit in a string."
    ),
    spec!(
        "bitop",
        Bitop,
        -4,
        WR_OOM,
        2,
        -1,
        1,
        "bitmap",
        "Performs bitwise operations on multiple strings, and stores the result."
    ),
    spec!(
        "bitfield",
        Bitfield,
        -2,
        WR_OOM,
        1,
        1,
        1,
        "bitmap",
        "Performs arbitrary bitfield integer operations on strings."
    ),
    spec!(
        "bitfield_ro",
        BitfieldRo,
        -2,
        RO,
        1,
        1,
        1,
        "bitmap",
        "Performs arbitrary read-only bitfield integer operations on strings."
    ),
    spec!(
        "keel.range",
        KeelRange,
        -3,
        RO_SLOW,
        0,
        0,
        0,
        "keel",
        "Ordered range read: KEEL.RANGE start end [REV] [LIMIT n]; bounds as in ZRANGEBYLEX ([a (a - +). Phantom-safe inside MULTI."
    ),
    spec!(
        "keel.dump",
        KeelDump,
        2,
        RO_SLOW,
        1,
        1,
        1,
        "keel",
        "A key's whole value, type and deadline, in keel's own format (what a command across nodes gathers; see KEEL.RESTORE)."
    ),
    spec!(
        "keel.check",
        KeelCheck,
        3,
        RO_SLOW,
        1,
        1,
        1,
        "keel",
        "Fails with TRYAGAIN unless the key holds what the given KEEL.DUMP reply holds; OK otherwise."
    ),
    spec!(
        "keel.restore",
        KeelRestore,
        3,
        WR_SLOW,
        1,
        1,
        1,
        "keel",
        "Replaces the key by the value, type and deadline of a KEEL.DUMP reply (deletes it for an absent key's dump)."
    ),
    spec!(
        "keel.max",
        KeelMax,
        3,
        WR,
        1,
        1,
        1,
        "keel",
        "Commutative: keeps the larger of the stored integer and the argument. Never conflicts with other KEEL.MAX/MIN/ADD."
    ),
    spec!(
        "keel.min",
        KeelMin,
        3,
        WR,
        1,
        1,
        1,
        "keel",
        "Commutative: keeps the smaller of the stored integer and the argument. Never conflicts with other KEEL.MAX/MIN/ADD."
    ),
    spec!(
        "keel.add",
        KeelAdd,
        3,
        WR,
        1,
        1,
        1,
        "keel",
        "Commutative: adds the argument to the stored integer, replying OK. Never conflicts with other KEEL.MAX/MIN/ADD."
    ),
    spec!(
        "keel.raft",
        KeelRaft,
        4,
        &["loading", "stale"],
        0,
        0,
        0,
        "keel",
        "Between the nodes of a replicated cluster: KEEL.RAFT partition kind payload carries Raft's messages and requests forwarded to a partition's leader."
    ),
    spec!(
        "keel.moveslots",
        KeelMoveslots,
        -3,
        &["admin", "noscript"],
        0,
        0,
        0,
        "keel",
        "Replicated cluster: KEEL.MOVESLOTS node-id slot|start-end ... moves the slots (and their keys) to the partition whose home is node-id, online and transactionally. Replies the number of slots moved."
    ),
    spec!(
        "keel.join",
        KeelJoin,
        3,
        &["admin", "noscript"],
        0,
        0,
        0,
        "keel",
        "Replicated cluster: KEEL.JOIN node-id host:port adds the node (sent by keel serve --cluster-join): a new partition on it, and replicas moved to it. Replies the cluster's view, encoded."
    ),
    spec!(
        "keel.learnslots",
        KeelLearnslots,
        1,
        &["admin", "noscript"],
        0,
        0,
        0,
        "keel",
        "Replicated cluster: KEEL.LEARNSLOTS asks every partition's leader which slots it owns, so that this node's CLUSTER SLOTS/SHARDS/NODES show every move. Replies the number of partitions that answered."
    ),
    spec!(
        "keel.removenode",
        KeelRemovenode,
        2,
        &["admin", "noscript"],
        0,
        0,
        0,
        "keel",
        "Replicated cluster: KEEL.REMOVENODE node-id moves the node's replicas to other nodes and removes it from the cluster; its partition must own no slots. Replies the number of partitions whose replica moved."
    ),
    spec!(
        "keel.once",
        KeelOnce,
        -7,
        &["write", "noscript"],
        0,
        0,
        0,
        "keel",
        "Between the nodes of a cluster of single copies: KEEL.ONCE node incarnation seq keep-ms until-ms command [arg ...] runs a forwarded write (or the EXEC of the connection's MULTI) at most once per id, keeping its reply for keep-ms; sent again, it answers the kept reply and runs nothing; arrived over 2 s after until-ms (Unix ms, 0: none), it is refused unrun."
    ),
    spec!(
        "keel.publish",
        KeelPublish,
        4,
        PUBSUB_PUB,
        0,
        0,
        0,
        "keel",
        "Between the nodes of a cluster: KEEL.PUBLISH 0|1 channel message delivers a message published on another node to this node's subscribers of the channel (1: a shard channel), as PUBLISH or SPUBLISH would, without sending it on. Replies the number of subscriptions that got it."
    ),
    spec!(
        "keel.reap",
        KeelReap,
        1,
        &["write", "noscript"],
        0,
        0,
        0,
        "keel",
        "Deletes up to 512 keys past their deadline and 512 sub-keys of deleted collections now, as the background reaper does; replies how many of each, as an array of two. A replicated partition's leader proposes it as a log entry, since a replicated node runs no reaper of its own."
    ),
    spec!(
        "keel.flushbatch",
        KeelFlushbatch,
        1,
        &["write", "noscript"],
        0,
        0,
        0,
        "keel",
        "Deletes as many keys as one transaction may write (at most 65536); replies 1 while keys remain, 0 once none does. FLUSHALL and FLUSHDB send it, entry after entry, to a replicated partition that holds more keys than one of its log entries may delete."
    ),
    spec!(
        "keel.awaitpush",
        KeelAwaitpush,
        -4,
        &["readonly", "blocking", "noscript"],
        0,
        0,
        0,
        "keel",
        "Between the nodes of a cluster of single copies: KEEL.AWAITPUSH list|zset timeout-ms key [key ...] waits for one of this node's keys to hold a list (or sorted set), for a client blocked on another node (BLPOP across nodes). Replies 1 once one does (at once if one does already), nil at the timeout."
    ),
];

/// Commands by name. Every request looks its name up here, so the hash is FNV-1a rather
/// than the default SipHash, which alone cost about as much as parsing the request. SipHash
/// defends a table against keys chosen to collide; this one holds only the fixed command
/// names, and a lookup of any other name costs one probe sequence whatever it hashes to.
static BY_NAME: LazyLock<HashMap<&'static [u8], &'static Spec, BuildHasherDefault<NameHasher>>> =
    LazyLock::new(|| SPECS.iter().map(|s| (s.name.as_bytes(), s)).collect());

/// FNV-1a, for [`BY_NAME`].
struct NameHasher(u64);

impl Default for NameHasher {
    fn default() -> NameHasher {
        NameHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_usize(&mut self, n: usize) {
        // The length a slice hashes first: one step, not eight bytes.
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x0100_0000_01b3);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The subcommand `args[1]` of the container command `spec` (`CLIENT`, `OBJECT`, ...), in
/// lower case, checked against its arity, or Redis's error text: an unknown subcommand (named
/// up to 128 bytes) or one with the wrong number of arguments.
pub fn subcommand(spec: &Spec, args: &[bytes::Bytes]) -> Result<&'static str, String> {
    let sub = args[1].to_ascii_lowercase();
    let Some(&(name, arity)) = spec.subcommands.iter().find(|(n, _)| n.as_bytes() == sub) else {
        let shown = &args[1][..args[1].len().min(128)];
        return Err(format!(
            "ERR unknown subcommand '{}'. Try {} HELP.",
            String::from_utf8_lossy(shown),
            spec.name.to_ascii_uppercase()
        ));
    };
    let fits = if arity >= 0 {
        args.len() == arity as usize
    } else {
        args.len() >= arity.unsigned_abs() as usize
    };
    if !fits {
        return Err(format!(
            "ERR wrong number of arguments for '{}|{name}' command",
            spec.name
        ));
    }
    Ok(name)
}

/// Longest command name; longer names are unknown without a lookup.
const NAME_BYTES_MAX: usize = 16;

/// The command called `name`, in any case.
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    if name.len() > NAME_BYTES_MAX {
        return None;
    }
    let mut lower = [0u8; NAME_BYTES_MAX];
    for (d, s) in lower.iter_mut().zip(name) {
        *d = s.to_ascii_lowercase();
    }
    BY_NAME.get(&lower[..name.len()]).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_lowercase_and_short() {
        let mut seen = std::collections::HashSet::new();
        for spec in SPECS {
            assert!(seen.insert(spec.name), "{} twice", spec.name);
            assert_eq!(spec.name, spec.name.to_ascii_lowercase());
            assert!(spec.name.len() <= NAME_BYTES_MAX);
        }
        assert_eq!(lookup(b"GeT").map(|s| s.cmd), Some(Cmd::Get));
        assert_eq!(lookup(b"KEEL.RANGE").map(|s| s.cmd), Some(Cmd::KeelRange));
        assert!(lookup(b"nosuchcommand").is_none());
        assert_eq!(lookup(b"PSUBSCRIBE").map(|s| s.cmd), Some(Cmd::Psubscribe));
    }

    #[test]
    fn arity() {
        let get = lookup(b"get").expect("get exists");
        assert!(get.arity_ok(2));
        assert!(!get.arity_ok(3));
        let mset = lookup(b"mset").expect("mset exists");
        assert!(mset.arity_ok(3));
        assert!(mset.arity_ok(5));
        assert!(!mset.arity_ok(2));
    }
}
