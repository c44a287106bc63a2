//! Introspection: `COMMAND`, `CONFIG`, `INFO`, `CLIENT LIST` lines and the Prometheus text.
//!
//! Everything reported is measured or configured; nothing is a placeholder. Where keel lacks a
//! feature a Redis client may ask about (persistence, replication), the field says so with the
//! value Redis uses for "off".

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;

use crate::config::{
    Encodings, OutputLimit, THRESHOLDS, check_bulk_len, check_idle_poll, parse_poller,
};
use crate::data::Fail;
use crate::glob;
use crate::reply::Out;
use crate::server::{ClientInfo, LATENCY_BUCKETS, Shared};
use crate::table::{self, SPECS, Spec};

fn command_info(spec: &Spec, out: &mut Out<'_>) {
    out.array(10);
    out.bulk(spec.name.as_bytes());
    out.int(i64::from(spec.arity));
    out.set(spec.flags.len());
    for f in spec.flags {
        out.simple(f);
    }
    out.int(i64::from(spec.first_key));
    out.int(i64::from(spec.last_key));
    out.int(i64::from(spec.key_step));
    out.set(0);
    out.set(0);
    key_specs(spec, out);
    out.array(spec.subcommands.len());
    for (sub, arity) in spec.subcommands {
        out.array(10);
        out.bulk(format!("{}|{}", spec.name, sub).as_bytes());
        out.int(i64::from(*arity));
        out.set(0);
        for _ in 0..3 {
            out.int(0);
        }
        out.set(0);
        out.set(0);
        out.array(0);
        out.array(0);
    }
}

/// Redis 7's key specifications for a command, from its first key, last key and step: what
/// cluster clients route by, with the flags of its first ([`key_flags`]). One spec per command
/// (Redis gives `RENAME`, `RENAMENX`, `COPY`, `BITOP` and the `…STORE` commands two: source
/// and destination).
fn key_specs(spec: &Spec, out: &mut Out<'_>) {
    if spec.first_key <= 0 {
        out.set(0);
        return;
    }
    let flags = key_flags(spec)[0];
    // Redis counts `lastkey` from the first key when it is not negative.
    let last = if spec.last_key < 0 {
        spec.last_key
    } else {
        spec.last_key - spec.first_key
    };
    out.set(1);
    out.map(3);
    out.bulk(b"flags");
    out.set(flags.len());
    for f in flags {
        out.simple(f);
    }
    out.bulk(b"begin_search");
    out.map(2);
    out.bulk(b"type");
    out.bulk(b"index");
    out.bulk(b"spec");
    out.map(1);
    out.bulk(b"index");
    out.int(i64::from(spec.first_key));
    out.bulk(b"find_keys");
    out.map(2);
    out.bulk(b"type");
    out.bulk(b"range");
    out.bulk(b"spec");
    out.map(3);
    out.bulk(b"lastkey");
    out.int(i64::from(last));
    out.bulk(b"keystep");
    out.int(i64::from(spec.key_step));
    out.bulk(b"limit");
    out.int(0);
}

/// Redis 7.0's key-specification flags of each command it has, one list per specification
/// (`COMMAND INFO` of redis-server 7.0.15), for the commands keel has.
fn redis_key_flags(name: &str) -> Option<&'static [&'static [&'static str]]> {
    Some(match name {
        "bitcount" | "bitfield_ro" | "bitpos" | "expiretime" | "get" | "getbit" | "getrange"
        | "hget" | "hgetall" | "hkeys" | "hmget" | "hrandfield" | "hscan" | "hvals" | "lcs"
        | "lindex" | "lpos" | "lrange" | "mget" | "pexpiretime" | "pttl" | "sdiff" | "sinter"
        | "sintercard" | "smembers" | "smismember" | "srandmember" | "sscan" | "substr"
        | "sunion" | "ttl" | "zcount" | "zdiff" | "zinter" | "zintercard" | "zlexcount"
        | "zmscore" | "zrandmember" | "zrange" | "zrangebylex" | "zrangebyscore" | "zrank"
        | "zrevrange" | "zrevrangebylex" | "zrevrangebyscore" | "zrevrank" | "zscan" | "zscore"
        | "zunion" => &[&["RO", "access"]],
        "blmpop" | "blpop" | "brpop" | "bzmpop" | "bzpopmax" | "bzpopmin" | "getdel" | "lmpop"
        | "lpop" | "rpop" | "spop" | "zmpop" | "zpopmax" | "zpopmin" => {
            &[&["RW", "access", "delete"]]
        }
        "exists" | "hexists" | "hlen" | "hstrlen" | "llen" | "scard" | "sismember" | "strlen"
        | "touch" | "type" | "watch" | "zcard" => &[&["RO"]],
        "decr" | "decrby" | "getex" | "getset" | "hincrby" | "hincrbyfloat" | "incr" | "incrby"
        | "incrbyfloat" | "setbit" | "zincrby" => &[&["RW", "access", "update"]],
        "expire" | "expireat" | "hmset" | "hset" | "lset" | "persist" | "pexpire" | "pexpireat"
        | "setrange" | "zadd" => &[&["RW", "update"]],
        "append" | "hsetnx" | "linsert" | "lpush" | "lpushx" | "rpush" | "rpushx" | "sadd" => {
            &[&["RW", "insert"]]
        }
        "hdel" | "lrem" | "ltrim" | "srem" | "zrem" | "zremrangebylex" | "zremrangebyrank"
        | "zremrangebyscore" => &[&["RW", "delete"]],
        "bitop" | "sdiffstore" | "sunionstore" | "zdiffstore" | "zinterstore" | "zrangestore"
        | "zunionstore" => &[&["OW", "update"], &["RO", "access"]],
        "blmove" | "brpoplpush" | "lmove" | "rpoplpush" | "smove" => {
            &[&["RW", "access", "delete"], &["RW", "insert"]]
        }
        "mset" | "psetex" | "setex" => &[&["OW", "update"]],
        "spublish" | "ssubscribe" | "sunsubscribe" => &[&["not_key"]],
        "bitfield" | "set" => &[&["RW", "access", "update", "variable_flags"]],
        "del" | "unlink" => &[&["RM", "delete"]],
        "msetnx" | "setnx" => &[&["OW", "insert"]],
        "copy" => &[&["RO", "access"], &["OW", "update"]],
        "rename" => &[&["RW", "access", "delete"], &["OW", "update"]],
        "renamenx" => &[&["RW", "access", "delete"], &["OW", "insert"]],
        "move" => &[&["RW", "access", "update"]],
        "sinterstore" => &[&["RW", "update"], &["RO", "access"]],
        "sort" => &[&["RO", "access"], &["RO", "access"], &["OW", "update"]],
        "sort_ro" => &[&["RO", "access"], &["RO", "access"]],
        _ => return None,
    })
}

/// The flags of each of `spec`'s key specifications: Redis's for the commands Redis has
/// ([`redis_key_flags`]; its containers' subcommands that take a key, `OBJECT` and `MEMORY`,
/// read it); keel's own commands get `RO`, `access` when read-only, else `RW`, `update`.
fn key_flags(spec: &Spec) -> &'static [&'static [&'static str]] {
    match spec.name {
        "object" | "memory" => &[&["RO"]],
        name => redis_key_flags(name).unwrap_or(if spec.flags.contains(&"readonly") {
            &[&["RO", "access"]]
        } else {
            &[&["RW", "update"]]
        }),
    }
}

/// The flags Redis gives the `i`-th key of `args` (a command of `spec`, its name first) in
/// `COMMAND GETKEYSANDFLAGS`: the first key's specification's, then the last's (destination
/// or source: every command keel has with several puts its first key alone in the first),
/// with `SET`'s and `BITFIELD`'s variable flags resolved by what the call does.
fn flags_of_key(spec: &Spec, args: &[Bytes], i: usize) -> &'static [&'static str] {
    let specs = key_flags(spec);
    let flags = if i == 0 {
        specs[0]
    } else {
        specs[specs.len() - 1]
    };
    if !flags.contains(&"variable_flags") {
        return flags;
    }
    let has = |word: &[u8]| args[2..].iter().any(|a| a.eq_ignore_ascii_case(word));
    let writes = match spec.name {
        "set" => has(b"get"),
        _ => has(b"set") || has(b"incrby"),
    };
    match (spec.name, writes) {
        ("set", false) => &["OW", "update"],
        (_, true) => &["RW", "access", "update"],
        (_, false) => &["RO", "access"],
    }
}

/// `COMMAND GETKEYS command [arg ...]` and `COMMAND GETKEYSANDFLAGS …` (`flags`): the keys a
/// call would touch, as cluster clients (redis-py's `RedisCluster`) ask for the commands
/// whose keys move (`ZUNIONSTORE`, `LMPOP`, `SORT`, ...), with Redis's errors in Redis's
/// order.
fn getkeys(call: &[Bytes], flags: bool, out: &mut Out<'_>) -> Result<(), Fail> {
    let spec = table::lookup(&call[0]).ok_or("ERR Invalid command specified")?;
    let keyless = spec.first_key <= 0 && !spec.flags.contains(&"movablekeys");
    if keyless || key_flags(spec)[0] == ["not_key"] {
        return Err("ERR The command has no key arguments".into());
    }
    if !spec.arity_ok(call.len()) {
        return Err("ERR Invalid number of arguments specified for command".into());
    }
    let keys = crate::cluster::key_args(spec, call);
    if keys.is_empty() {
        return Err("ERR Invalid arguments specified for command".into());
    }
    out.array(keys.len());
    for (i, key) in keys.iter().enumerate() {
        if flags {
            out.array(2);
            out.bulk(key);
            let f = flags_of_key(spec, call, i);
            out.set(f.len());
            for f in f {
                out.simple(f);
            }
        } else {
            out.bulk(key);
        }
    }
    Ok(())
}

fn command_docs(spec: &Spec, out: &mut Out<'_>) {
    out.bulk(spec.name.as_bytes());
    out.map(3);
    out.bulk(b"summary");
    out.bulk(spec.summary.as_bytes());
    out.bulk(b"since");
    out.bulk(b"1.0.0");
    out.bulk(b"group");
    out.bulk(spec.group.as_bytes());
}

/// `COMMAND [COUNT | DOCS [name...] | INFO [name...] | LIST]`.
pub fn command(args: &[Bytes], out: &mut Out<'_>) -> Result<(), Fail> {
    let Some(sub) = args.get(1) else {
        out.array(SPECS.len());
        for spec in SPECS {
            command_info(spec, out);
        }
        return Ok(());
    };
    let names = &args[2..];
    if sub.eq_ignore_ascii_case(b"count") && names.is_empty() {
        out.int(SPECS.len() as i64);
    } else if sub.eq_ignore_ascii_case(b"list") {
        out.array(SPECS.len());
        for spec in SPECS {
            out.bulk(spec.name.as_bytes());
        }
    } else if sub.eq_ignore_ascii_case(b"info") {
        if names.is_empty() {
            out.array(SPECS.len());
            for spec in SPECS {
                command_info(spec, out);
            }
        } else {
            out.array(names.len());
            for name in names {
                match table::lookup(name) {
                    Some(spec) => command_info(spec, out),
                    None => out.null_array(),
                }
            }
        }
    } else if sub.eq_ignore_ascii_case(b"getkeys") || sub.eq_ignore_ascii_case(b"getkeysandflags") {
        if names.len() < 2 {
            return Err(format!(
                "ERR wrong number of arguments for 'command|{}' command",
                String::from_utf8_lossy(sub).to_ascii_lowercase()
            )
            .into());
        }
        getkeys(names, sub.eq_ignore_ascii_case(b"getkeysandflags"), out)?;
    } else if sub.eq_ignore_ascii_case(b"docs") {
        let specs: Vec<&Spec> = if names.is_empty() {
            SPECS.iter().collect()
        } else {
            names.iter().filter_map(|n| table::lookup(n)).collect()
        };
        out.map(specs.len());
        for spec in specs {
            command_docs(spec, out);
        }
    } else {
        return Err(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(sub)
        )
        .into());
    }
    Ok(())
}

/// Every parameter `CONFIG GET` knows, with its current value.
fn parameters(shared: &Shared) -> Vec<(&'static str, String)> {
    let c = &shared.config;
    let mut params = vec![
        ("bind", c.bind.to_string()),
        ("port", shared.local_addr.port().to_string()),
        ("dir", c.dir.display().to_string()),
        (
            "requirepass",
            shared.requirepass.read().clone().unwrap_or_default(),
        ),
        (
            "protected-mode",
            if c.protected_mode { "yes" } else { "no" }.into(),
        ),
        (
            "proto-max-bulk-len",
            shared.proto_max_bulk_len.load(Relaxed).to_string(),
        ),
        ("maxclients", shared.maxclients.load(Relaxed).to_string()),
        // keel never evicts: no memory limit, and Redis' policy that evicts nothing.
        ("maxmemory", "0".into()),
        ("maxmemory-policy", "noeviction".into()),
        (
            "slowlog-log-slower-than",
            shared.slowlog.slower_than_us().to_string(),
        ),
        ("slowlog-max-len", shared.slowlog.max_len().to_string()),
        ("databases", "1".into()),
        // keel has no RDB snapshots; its log plays the part of Redis's AOF.
        ("save", String::new()),
        (
            "appendonly",
            if shared.db.dir().is_some()
                || shared.replication.get().is_some_and(|r| r.dir().is_some())
            {
                "yes"
            } else {
                "no"
            }
            .into(),
        ),
        (
            "appendfsync",
            match c.durability {
                crate::config::Durability::Sync => "always",
                crate::config::Durability::Async { .. } => "everysec",
                crate::config::Durability::None => "no",
            }
            .into(),
        ),
        ("durability", c.durability.to_string()),
        ("split", c.split.to_string()),
        ("split-phase-ms", c.split_phase_ms.to_string()),
        ("poller", shared.lanes.setting().name().into()),
        ("idle-poll-us", shared.lanes.idle_poll_us().to_string()),
        (
            "client-output-buffer-limit",
            shared.pubsub.limit().redis_value(),
        ),
    ];
    // Redis' encoding thresholds, under their names and their Redis 6 aliases, as Redis 7
    // reports them.
    for (i, t) in THRESHOLDS.iter().enumerate() {
        let value = shared.encodings.get(i).to_string();
        params.extend(t.alias.map(|alias| (alias, value.clone())));
        params.push((t.name, value));
    }
    params
}

/// `CONFIG GET pattern...`, `CONFIG SET name value...`, `CONFIG RESETSTAT`.
pub fn config(shared: &Shared, args: &[Bytes], out: &mut Out<'_>) -> Result<(), Fail> {
    let sub = &args[1];
    if sub.eq_ignore_ascii_case(b"get") {
        if args.len() < 3 {
            return Err("ERR wrong number of arguments for 'config|get' command".into());
        }
        let params = parameters(shared);
        let hits: Vec<_> = params
            .iter()
            .filter(|(name, _)| {
                args[2..]
                    .iter()
                    .any(|p| glob::matches(&p.to_ascii_lowercase(), name.as_bytes()))
            })
            .collect();
        out.map(hits.len());
        for (name, value) in hits {
            out.bulk(name.as_bytes());
            out.bulk(value.as_bytes());
        }
    } else if sub.eq_ignore_ascii_case(b"set") {
        if args.len() < 4 || args.len() % 2 == 1 {
            return Err("ERR wrong number of arguments for 'config|set' command".into());
        }
        // Validate everything first, so that a bad pair changes nothing.
        let mut changes = Vec::new();
        for pair in args[2..].chunks(2) {
            let name = String::from_utf8_lossy(&pair[0]).to_ascii_lowercase();
            let value = String::from_utf8_lossy(&pair[1]).into_owned();
            let bad = |reason: &str| -> Fail {
                format!("ERR CONFIG SET failed (possibly related to argument '{name}') - {reason}")
                    .into()
            };
            match name.as_str() {
                "requirepass" => {}
                "proto-max-bulk-len" => {
                    let n: i64 = value
                        .parse()
                        .map_err(|_| bad("argument couldn't be parsed into an integer"))?;
                    check_bulk_len(n).map_err(|e| bad(&e.to_string()))?;
                }
                "maxclients" => {
                    value
                        .parse::<usize>()
                        .ok()
                        .filter(|&n| n >= 1)
                        .ok_or_else(|| {
                            bad("argument must be between 1 and 4294967295 inclusive")
                        })?;
                }
                "poller" => {
                    parse_poller(&value).map_err(|e| bad(&e.to_string()))?;
                }
                "idle-poll-us" => {
                    let us: u64 = value
                        .parse()
                        .map_err(|_| bad("argument couldn't be parsed into an integer"))?;
                    check_idle_poll(us).map_err(|e| bad(&e.to_string()))?;
                }
                "client-output-buffer-limit" => {
                    OutputLimit::parse(&value).map_err(|e| bad(&e))?;
                }
                "slowlog-log-slower-than" | "slowlog-max-len" => {
                    let n: i64 = value
                        .parse()
                        .map_err(|_| bad("argument couldn't be parsed into an integer"))?;
                    let min = if name == "slowlog-max-len" { 0 } else { -1 };
                    if n < min {
                        return Err(bad(&format!(
                            "argument must be between {min} and 9223372036854775807 inclusive"
                        )));
                    }
                }
                // Set to what they are, they change nothing; anything else would ask keel to
                // drop keys, which it never does.
                "maxmemory" => {
                    if value.trim().parse::<u64>() != Ok(0) {
                        return Err(bad(
                            "keel never evicts keys, so it takes no memory limit (only 0, none)",
                        ));
                    }
                }
                "maxmemory-policy" => {
                    if !value.eq_ignore_ascii_case("noeviction") {
                        return Err(bad("keel never evicts keys: its only policy is noeviction"));
                    }
                }
                name if Encodings::find(name).is_some() => {
                    let i = Encodings::find(name).expect("just found");
                    Encodings::parse(i, &value).map_err(|e| bad(&e))?;
                }
                // keel's log plays the part of Redis's AOF and it takes no RDB snapshots: set
                // to what they are (tools switch snapshots off with `save ""`), they change
                // nothing; the durability itself is chosen at start.
                "save" | "appendonly" | "appendfsync" => {
                    let params = parameters(shared);
                    let current = params
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, v)| v.as_str())
                        .unwrap_or_default();
                    if !value.trim().eq_ignore_ascii_case(current) {
                        return Err(bad(&format!(
                            "keel's durability is chosen at start (--durability \
                             sync|async:MS|none), and {name} is '{current}' (durability {})",
                            shared.config.durability
                        )));
                    }
                }
                "bind" | "port" | "dir" | "protected-mode" | "databases" | "durability"
                | "split" | "split-phase-ms" => {
                    return Err(bad("can't set immutable config"));
                }
                _ => {
                    return Err(format!(
                        "ERR Unknown option or number of arguments for CONFIG SET - '{name}'"
                    )
                    .into());
                }
            }
            changes.push((name, value));
        }
        for (name, value) in changes {
            match name.as_str() {
                "requirepass" => {
                    *shared.requirepass.write() = Some(value).filter(|v| !v.is_empty());
                }
                "proto-max-bulk-len" => shared
                    .proto_max_bulk_len
                    .store(value.parse().expect("validated above"), Relaxed),
                "maxclients" => shared
                    .maxclients
                    .store(value.parse().expect("validated above"), Relaxed),
                "poller" => shared
                    .lanes
                    .set_setting(parse_poller(&value).expect("validated above")),
                "idle-poll-us" => shared
                    .lanes
                    .set_idle_poll_us(value.parse().expect("validated above")),
                "client-output-buffer-limit" => {
                    if let Some(limit) = OutputLimit::parse(&value).expect("validated above") {
                        shared.pubsub.set_limit(limit);
                    }
                }
                "maxmemory" | "maxmemory-policy" | "save" | "appendonly" | "appendfsync" => {}
                "slowlog-log-slower-than" => shared
                    .slowlog
                    .set_slower_than_us(value.parse().expect("validated above")),
                "slowlog-max-len" => shared.slowlog.set_max_len(
                    usize::try_from(value.parse::<i64>().expect("validated above"))
                        .unwrap_or(usize::MAX),
                ),
                name => {
                    let i = Encodings::find(name).expect("validated above");
                    shared
                        .encodings
                        .set(i, Encodings::parse(i, &value).expect("validated above"));
                }
            }
        }
        out.ok();
    } else if sub.eq_ignore_ascii_case(b"resetstat") && args.len() == 2 {
        shared.counters.reset();
        shared.pubsub.disconnections.store(0, Relaxed);
        out.ok();
    } else {
        return Err(format!(
            "ERR unknown subcommand '{}'. Try CONFIG HELP.",
            String::from_utf8_lossy(sub)
        )
        .into());
    }
    Ok(())
}

/// One `CLIENT LIST` line, newline-terminated.
pub fn client_line(shared: &Shared, c: &ClientInfo) -> String {
    let (lib_name, lib_ver) = c.lib.lock().clone();
    let [sub, psub, ssub] = c.subscriptions.each_ref().map(|n| n.load(Relaxed));
    let idle_s = shared
        .now_ms()
        .saturating_sub(c.last_active_ms.load(Relaxed))
        / 1000;
    format!(
        "id={} addr={} laddr={} name={} age={} idle={} flags={} db=0 sub={sub} psub={psub} \
         ssub={ssub} user=default resp={} lib-name={} lib-ver={}\n",
        c.id,
        c.addr,
        c.laddr,
        c.name.lock(),
        c.created.elapsed().as_secs(),
        idle_s,
        match (sub + psub + ssub > 0, shared.blocked.is_blocked(c.id)) {
            (true, true) => "Pb",
            (true, false) => "P",
            (false, true) => "b",
            (false, false) => "N",
        },
        c.resp.load(Relaxed),
        lib_name,
        lib_ver,
    )
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The `INFO` text for the requested sections (default: all).
pub fn info(shared: &Shared, sections: &[Bytes]) -> String {
    let want = |name: &str| {
        sections.is_empty()
            || sections.iter().any(|s| {
                s.eq_ignore_ascii_case(name.as_bytes())
                    || s.eq_ignore_ascii_case(b"all")
                    || s.eq_ignore_ascii_case(b"everything")
                    || s.eq_ignore_ascii_case(b"default")
            })
    };
    let stats = shared.db.stats();
    let c = &shared.counters;
    let mut t = String::new();
    let uptime = shared.started.elapsed().as_secs();
    if want("server") {
        let _ = write!(
            t,
            "# Server\r\nredis_version:{}\r\nkeel_version:{}\r\nredis_mode:{}\r\nos:{} {}\r\n\
             arch_bits:64\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{uptime}\r\n\
             uptime_in_days:{}\r\nexecutable:keel\r\n\r\n",
            crate::REDIS_VERSION,
            crate::VERSION,
            if shared.cluster.is_some() {
                "cluster"
            } else {
                "standalone"
            },
            std::env::consts::OS,
            std::env::consts::ARCH,
            std::process::id(),
            shared.local_addr.port(),
            uptime / 86400,
        );
    }
    if want("clients") {
        let _ = write!(
            t,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:{}\r\n\r\n",
            shared.clients.lock().len(),
            shared.maxclients.load(Relaxed),
            shared.blocked.blocked_clients(),
        );
    }
    if want("memory") {
        let rss = rss_bytes().unwrap_or(0);
        let _ = write!(
            t,
            "# Memory\r\nused_memory:{rss}\r\nused_memory_rss:{rss}\r\nused_memory_note:keel reports \
             the process RSS as used_memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n\r\n"
        );
    }
    if want("persistence") {
        let files = shared.db.dir().is_some();
        let _ = write!(
            t,
            "# Persistence\r\nloading:0\r\nrdb_changes_since_last_save:0\r\nrdb_bgsave_in_progress:{}\r\n\
             aof_enabled:{}\r\nkeel_durability:{}\r\nkeel_dir:{}\r\nkeel_log_frames:{}\r\n\
             keel_log_fsyncs:{}\r\nkeel_log_inline_fsyncs:{}\r\nkeel_txns_per_fsync:{:.2}\r\n\
             keel_checkpoints:{}\r\n\
             rdb_last_save_time:{}\r\nkeel_checkpoint_age_seconds:{}\r\n\
             keel_log_bytes_since_checkpoint:{}\r\n\r\n",
            u8::from(shared.saving.load(Relaxed)),
            u8::from(files),
            shared.config.durability,
            shared
                .db
                .dir()
                .map_or(String::new(), |d| d.display().to_string()),
            stats.log_frames,
            stats.log_fsyncs,
            stats.log_inline_fsyncs,
            if stats.log_fsyncs == 0 {
                0.0
            } else {
                stats.log_frames as f64 / stats.log_fsyncs as f64
            },
            stats.checkpoints,
            stats
                .checkpoint_age
                .map_or(0, |age| unix_now().saturating_sub(age.as_secs())),
            stats.checkpoint_age.map_or(0, |age| age.as_secs()),
            stats.log_bytes_since_checkpoint,
        );
    }
    if want("stats") {
        let pubsub = shared.pubsub.counts();
        let _ = write!(
            t,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\n\
             total_net_input_bytes:{}\r\ntotal_net_output_bytes:{}\r\nrejected_connections:{}\r\n\
             protocol_errors:{}\r\npubsub_channels:{}\r\npubsub_patterns:{}\r\n\
             pubsubshard_channels:{}\r\nclient_output_buffer_limit_disconnections:{}\r\n\
             expired_keys:{}\r\nkeel_swept_keys:{}\r\n\r\n",
            c.connections_received.load(Relaxed),
            c.commands_processed.load(Relaxed),
            c.net_input_bytes.load(Relaxed),
            c.net_output_bytes.load(Relaxed),
            c.connections_rejected.load(Relaxed),
            c.protocol_errors.load(Relaxed),
            pubsub.0,
            pubsub.1,
            pubsub.2,
            shared.pubsub.disconnections.load(Relaxed),
            shared.reaper.expired_keys.load(Relaxed),
            shared.reaper.swept_keys.load(Relaxed),
        );
    }
    if want("replication") {
        t.push_str("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n");
        if let (Some(rep), Some(cluster)) = (shared.replication.get(), &shared.cluster) {
            let view = rep.view();
            let _ = write!(
                t,
                "keel_replicas:{}\r\nkeel_view_epoch:{}\r\nkeel_nodes:{}\r\nkeel_partitions:{}\r\n\
                 keel_replica_databases:{}\r\n",
                rep.r,
                view.epoch,
                view.live().count(),
                view.parts.len(),
                rep.open_databases().join(",")
            );
            for line in rep.describe(&cluster.map()) {
                t.push_str(&line);
                t.push_str("\r\n");
            }
        }
        t.push_str("\r\n");
    }
    if want("cluster") {
        let _ = write!(
            t,
            "# Cluster\r\ncluster_enabled:{}\r\n",
            u8::from(shared.cluster.is_some())
        );
        if shared.cluster.is_some() {
            // Commands whose keys are on several nodes, run gathered (`gather`).
            let c = &shared.counters;
            let _ = write!(
                t,
                "keel_cluster_gathered:{}\r\nkeel_cluster_gathered_retries:{}\r\n",
                c.gathered.load(Relaxed),
                c.gathered_retries.load(Relaxed),
            );
        }
        if let Some(cluster) = &shared.cluster {
            // Messages published here and sent on to the other nodes (`cluster::Relay`):
            // delivered to a node, or lost for it.
            let _ = write!(
                t,
                "keel_cluster_published_relayed:{}\r\nkeel_cluster_published_dropped:{}\r\n",
                cluster.relay.relayed.load(Relaxed),
                cluster.relay.dropped.load(Relaxed),
            );
            // Requests to each peer: forwarded commands, Raft's messages, requests to
            // partitions' leaders. Quantiles are bucket bounds (powers of two µs).
            let map = cluster.map();
            for (node, latency) in cluster.rpc.used() {
                let s = latency.summary();
                let _ = write!(
                    t,
                    "keel_rpc_{}:calls={},errors={},mean_us={},p50_us={},p99_us={},max_us={}\r\n",
                    map.nodes()
                        .get(node)
                        .map_or_else(|| node.to_string(), |n| n.id.to_string()),
                    s.calls,
                    s.errors,
                    s.mean_us,
                    s.p50_us,
                    s.p99_us,
                    s.max_us
                );
            }
        }
        if let Some(cluster) = &shared.cluster
            && shared.replication.get().is_none()
        {
            // Exactly-once forwarding (`once`), since start: writes sent again, given up,
            // answered from a kept answer here, answers kept and swept here; the forwarded
            // blocking pops waiting here now; and other nodes' clients blocked across nodes
            // that wait here for a push (`KEEL.AWAITPUSH`).
            let o = &cluster.once;
            let _ = write!(
                t,
                "keel_once_retries:{}\r\nkeel_once_ambiguous:{}\r\nkeel_once_replayed:{}\r\n\
                 keel_once_kept:{}\r\nkeel_once_swept:{}\r\nkeel_once_blocked:{}\r\n\
                 keel_cluster_push_watchers:{}\r\n",
                o.retries.load(Relaxed),
                o.ambiguous.load(Relaxed),
                o.replayed.load(Relaxed),
                o.kept.load(Relaxed),
                shared.reaper.swept_answers.load(Relaxed),
                cluster.attempts.count(),
                shared.blocked.watchers(),
            );
        }
        if let Some(x) = shared.xnode.get() {
            let s = &x.stats;
            let bus = shared
                .cluster
                .as_ref()
                .map(|c| c.bus_stats())
                .unwrap_or_default();
            let _ = write!(
                t,
                "keel_cluster_incarnation:{:x}\r\nkeel_cluster_txns_begun:{}\r\n\
                 keel_cluster_txns_committed:{}\r\nkeel_cluster_txns_aborted:{}\r\n\
                 keel_cluster_txns_unknown:{}\r\nkeel_cluster_prepares:{}\r\n\
                 keel_cluster_prepares_refused:{}\r\nkeel_cluster_prepares_again:{}\r\n\
                 keel_cluster_recovered_prepared:{}\r\n\
                 keel_cluster_recovered_decisions:{}\r\nkeel_cluster_exec_forwarded:{}\r\n\
                 keel_cluster_aborts_conflict:{}\r\nkeel_cluster_aborts_timeout:{}\r\n\
                 keel_cluster_aborts_failed:{}\r\nkeel_cluster_commit_us_mean:{}\r\n\
                 keel_cluster_commit_us_max:{}\r\nkeel_cluster_bus_frames_sent:{}\r\n\
                 keel_cluster_bus_messages_sent:{}\r\nkeel_cluster_bus_frames_received:{}\r\n\
                 keel_cluster_bus_messages_received:{}\r\nkeel_cluster_bus_messages_dropped:{}\r\n\
                 keel_cluster_stuck:{}\r\nkeel_cluster_stuck_waits:{}\r\n\
                 keel_cluster_stuck_refused:{}\r\nkeel_cluster_writes_held_ms:{}\r\n",
                x.incarnation,
                s.begun.load(Relaxed),
                s.committed.load(Relaxed),
                s.aborted.load(Relaxed),
                s.unknown.load(Relaxed),
                s.prepares.load(Relaxed),
                s.prepares_refused.load(Relaxed),
                s.prepares_again.load(Relaxed),
                s.recovered_prepared.load(Relaxed),
                s.recovered_decisions.load(Relaxed),
                s.one_node_forwarded.load(Relaxed),
                s.aborts_conflict.load(Relaxed),
                s.aborts_timeout.load(Relaxed),
                s.aborts_failed.load(Relaxed),
                s.commit_us_total.load(Relaxed) / s.committed.load(Relaxed).max(1),
                s.commit_us_max.load(Relaxed),
                bus.frames_sent,
                bus.messages_sent,
                bus.frames_received,
                bus.messages_received,
                bus.dropped,
                x.stuck.len(),
                s.stuck_waits.load(Relaxed),
                s.stuck_refused.load(Relaxed),
                shared.db.writes_held_for().as_millis(),
            );
        }
        t.push_str("\r\n");
    }
    if want("keel") {
        let _ = write!(
            t,
            "# Keel\r\nkeel_commits:{}\r\nkeel_read_only_commits:{}\r\nkeel_aborts_write_locked:{}\r\n\
             keel_aborts_read_changed:{}\r\nkeel_aborts_phantom:{}\r\nkeel_conflict_retries:{}\r\n\
             keel_watch_aborts:{}\r\nkeel_watch_renewals:{}\r\nkeel_versions:{}\r\nkeel_records:{}\r\nkeel_visible_ts:{}\r\n\
             keel_command_latency_p50_us_le:{:.3}\r\nkeel_command_latency_p99_us_le:{:.3}\r\n\
             keel_command_latency_p999_us_le:{:.3}\r\n\r\n",
            stats.commits,
            stats.read_only_commits,
            stats.aborts_write_locked,
            stats.aborts_read_changed,
            stats.aborts_phantom,
            c.exec_retries.load(Relaxed),
            c.watch_aborts.load(Relaxed),
            c.watch_renewals.load(Relaxed),
            stats.versions,
            stats.records,
            stats.visible_ts.0,
            c.latency_quantile_ns(0.5) as f64 / 1000.0,
            c.latency_quantile_ns(0.99) as f64 / 1000.0,
            c.latency_quantile_ns(0.999) as f64 / 1000.0,
        );
        let l = &shared.lanes;
        let _ = write!(
            t,
            "# Lanes\r\npoller:{}\r\nlane:{}\r\nlane_switches:{}\r\nconnection_moves:{}\r\n\
             idle_poll_us:{}\r\nspin_us:{}\r\n\r\n",
            l.setting().name(),
            l.lane().name(),
            l.switches.load(Relaxed),
            l.moves.load(Relaxed),
            l.idle_poll_us(),
            l.spin_us(),
        );
    }
    if want("split") {
        let keys = shared.db.split_keys();
        let _ = write!(
            t,
            "# Split\r\nsplit_mode:{}\r\nsplit_phase_ms:{}\r\nsplit_records:{}\r\nsplit_keys:{}\r\n\
             split_phases:{}\r\nsplit_commits:{}\r\nsplit_stashes:{}\r\nsplit_splits:{}\r\n\
             split_joins:{}\r\n\r\n",
            shared.config.split,
            shared.config.split_phase_ms,
            stats.split_records,
            split_key_list(&keys),
            stats.split_phases,
            stats.split_commits,
            stats.split_stashes,
            stats.split_splits,
            stats.split_joins,
        );
    }
    if want("keyspace") {
        t.push_str("# Keyspace\r\n");
        if let Ok(snap) = shared.db.snapshot() {
            let keys = crate::keyspace::count(&mut crate::data::View::Snap(&snap));
            let (expires, avg_ttl) = crate::keyspace::expiry_summary(&snap);
            if keys > 0 {
                let _ = write!(t, "db0:keys={keys},expires={expires},avg_ttl={avg_ttl}\r\n");
            }
        }
        t.push_str("\r\n");
    }
    if t.ends_with("\r\n\r\n") {
        t.truncate(t.len() - 2);
    }
    t
}

/// Most split keys `INFO split` names; the rest are elided as `...`.
pub const INFO_SPLIT_KEYS_MAX: usize = 16;

/// `split_keys` of `INFO split`: the first [`INFO_SPLIT_KEYS_MAX`] keys, comma-separated, then
/// `...` if there are more. Bytes that would break the `field:value\r\n` line or the list
/// (control characters, space, `,`, `\`, non-ASCII) are written as `\xNN`, and a key longer
/// than [`KEY_SHOWN_BYTES_MAX`] is cut there and marked with `...`.
fn split_key_list(keys: &[Vec<u8>]) -> String {
    let mut text = String::new();
    for (i, key) in keys.iter().take(INFO_SPLIT_KEYS_MAX).enumerate() {
        if i > 0 {
            text.push(',');
        }
        for &b in key.iter().take(KEY_SHOWN_BYTES_MAX) {
            if b.is_ascii_graphic() && b != b',' && b != b'\\' {
                text.push(char::from(b));
            } else {
                let _ = write!(text, "\\x{b:02x}");
            }
        }
        if key.len() > KEY_SHOWN_BYTES_MAX {
            text.push_str("...");
        }
    }
    if keys.len() > INFO_SPLIT_KEYS_MAX {
        text.push_str(",...");
    }
    text
}

/// Most bytes of one key `INFO split` shows, so that the section stays small.
const KEY_SHOWN_BYTES_MAX: usize = 128;

/// The metrics endpoint's body (Prometheus text format 0.0.4).
pub fn prometheus(shared: &Shared) -> String {
    let s = shared.db.stats();
    let c = &shared.counters;
    let mut t = String::new();
    let mut counter = |name: &str, help: &str, kind: &str, lines: &[(String, u64)]| {
        let _ = writeln!(t, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in lines {
            let _ = writeln!(t, "{name}{labels} {v}");
        }
    };
    let one = |v: u64| vec![(String::new(), v)];
    counter(
        "keel_commits_total",
        "Committed read-write transactions.",
        "counter",
        &one(s.commits),
    );
    counter(
        "keel_read_only_commits_total",
        "Read-only transactions and snapshots.",
        "counter",
        &one(s.read_only_commits),
    );
    counter(
        "keel_aborts_total",
        "Aborted transactions by reason.",
        "counter",
        &[
            ("{reason=\"write_locked\"}".into(), s.aborts_write_locked),
            ("{reason=\"read_changed\"}".into(), s.aborts_read_changed),
            ("{reason=\"phantom\"}".into(), s.aborts_phantom),
        ],
    );
    counter(
        "keel_expired_keys_total",
        "Keys the reaper deleted because their deadline passed.",
        "counter",
        &one(shared.reaper.expired_keys.load(Relaxed)),
    );
    counter(
        "keel_swept_keys_total",
        "Sub-keys of deleted, overwritten or expired collections the reaper deleted.",
        "counter",
        &one(shared.reaper.swept_keys.load(Relaxed)),
    );
    if let Some(x) = shared.xnode.get() {
        let x_stats = &x.stats;
        let load = |v: &std::sync::atomic::AtomicU64| v.load(Relaxed);
        counter(
            "keel_cluster_txns_total",
            "Transactions across nodes this node coordinated: begun, then committed (two-phase), \
             aborted, or of unknown outcome.",
            "counter",
            &[
                ("{outcome=\"begun\"}".into(), load(&x_stats.begun)),
                ("{outcome=\"committed\"}".into(), load(&x_stats.committed)),
                ("{outcome=\"aborted\"}".into(), load(&x_stats.aborted)),
                ("{outcome=\"unknown\"}".into(), load(&x_stats.unknown)),
            ],
        );
        counter(
            "keel_cluster_aborts_total",
            "Transactions across nodes aborted, by reason: a conflict, a vote that did not come in \
             time, a failing command.",
            "counter",
            &[
                (
                    "{reason=\"conflict\"}".into(),
                    load(&x_stats.aborts_conflict),
                ),
                ("{reason=\"timeout\"}".into(), load(&x_stats.aborts_timeout)),
                ("{reason=\"failed\"}".into(), load(&x_stats.aborts_failed)),
            ],
        );
        counter(
            "keel_cluster_one_phase_total",
            "EXECs whose keys were all on one other node: forwarded, committed there in one phase.",
            "counter",
            &one(load(&x_stats.one_node_forwarded)),
        );
        counter(
            "keel_cluster_prepares_total",
            "Prepares this node ran as a participant: all, refused, and run again after a conflict.",
            "counter",
            &[
                ("{event=\"run\"}".into(), load(&x_stats.prepares)),
                (
                    "{event=\"refused\"}".into(),
                    load(&x_stats.prepares_refused),
                ),
                ("{event=\"again\"}".into(), load(&x_stats.prepares_again)),
            ],
        );
        counter(
            "keel_cluster_in_doubt",
            "Transactions prepared here whose decision is overdue (stuck).",
            "gauge",
            &one(x.stuck.len() as u64),
        );
        counter(
            "keel_cluster_recovered_total",
            "At start: prepared transactions and decisions recovered from the log.",
            "counter",
            &[
                (
                    "{kind=\"prepared\"}".into(),
                    load(&x_stats.recovered_prepared),
                ),
                (
                    "{kind=\"decision\"}".into(),
                    load(&x_stats.recovered_decisions),
                ),
            ],
        );
        counter(
            "keel_cluster_commit_microseconds_total",
            "Two-phase commits this node coordinated, begin to answer, summed (over \
             keel_cluster_txns_total{outcome=\"committed\"}: the mean).",
            "counter",
            &one(load(&x_stats.commit_us_total)),
        );
        if let Some(cluster) = &shared.cluster {
            let bus = cluster.bus_stats();
            counter(
                "keel_cluster_bus_messages_total",
                "Messages between nodes (several go in one frame), sent, received, and dropped \
                 for a full queue.",
                "counter",
                &[
                    ("{direction=\"sent\"}".into(), bus.messages_sent),
                    ("{direction=\"received\"}".into(), bus.messages_received),
                    ("{direction=\"dropped\"}".into(), bus.dropped),
                ],
            );
        }
    }
    if let Some(cluster) = &shared.cluster
        && shared.replication.get().is_none()
    {
        let o = &cluster.once;
        counter(
            "keel_once_total",
            "Exactly-once forwarding: writes sent again after a lost answer (retried), given \
             up with an ambiguous answer (ambiguous), answered here from a kept answer \
             (replayed), answers kept here (kept), kept answers the reaper deleted (swept).",
            "counter",
            &[
                ("{event=\"retried\"}".into(), o.retries.load(Relaxed)),
                ("{event=\"ambiguous\"}".into(), o.ambiguous.load(Relaxed)),
                ("{event=\"replayed\"}".into(), o.replayed.load(Relaxed)),
                ("{event=\"kept\"}".into(), o.kept.load(Relaxed)),
                (
                    "{event=\"swept\"}".into(),
                    shared.reaper.swept_answers.load(Relaxed),
                ),
            ],
        );
    }
    let l = &shared.lanes;
    counter(
        "keel_lane_switches_total",
        "Times connections were sent from one lane (poller, pool) to the other.",
        "counter",
        &one(l.switches.load(Relaxed)),
    );
    counter(
        "keel_connection_moves_total",
        "Connections that moved from one lane to the other.",
        "counter",
        &one(l.moves.load(Relaxed)),
    );
    counter(
        "keel_lane_pool",
        "1 while connections are sent to the worker pool, 0 while to the poller.",
        "gauge",
        &one(u64::from(l.lane() == crate::lanes::Lane::Pool)),
    );
    counter(
        "keel_split_records",
        "Keys split into per-core slices now.",
        "gauge",
        &one(s.split_records),
    );
    counter(
        "keel_split_phases_total",
        "Split phases opened (each ends in one reconciliation).",
        "counter",
        &one(s.split_phases),
    );
    counter(
        "keel_split_commits_total",
        "Commits that applied commutative operations to slices of split keys.",
        "counter",
        &one(s.split_commits),
    );
    counter(
        "keel_split_stashes_total",
        "Times a transaction waited for a split key's reconciliation (it read the key).",
        "counter",
        &one(s.split_stashes),
    );
    counter(
        "keel_split_splits_total",
        "Times a key was split.",
        "counter",
        &one(s.split_splits),
    );
    counter(
        "keel_split_joins_total",
        "Times a split key was joined for good.",
        "counter",
        &one(s.split_joins),
    );
    counter(
        "keel_versions",
        "Versions held in memory.",
        "gauge",
        &one(s.versions),
    );
    counter(
        "keel_records",
        "Records (keys ever written).",
        "gauge",
        &one(s.records),
    );
    counter(
        "keel_log_frames_total",
        "Commits written to the log.",
        "counter",
        &one(s.log_frames),
    );
    counter(
        "keel_log_fsyncs_total",
        "fsyncs of the log (one covers every commit that arrived meanwhile).",
        "counter",
        &one(s.log_fsyncs),
    );
    counter(
        "keel_log_inline_fsyncs_total",
        "fsyncs of the log run by the poller itself (sync durability), not the flusher thread.",
        "counter",
        &one(s.log_inline_fsyncs),
    );
    counter(
        "keel_checkpoints_total",
        "Checkpoints written since start.",
        "counter",
        &one(s.checkpoints),
    );
    if let Some(age) = s.checkpoint_age {
        counter(
            "keel_checkpoint_age_seconds",
            "Seconds since the newest checkpoint written by this process (or since start).",
            "gauge",
            &one(age.as_secs()),
        );
    }
    counter(
        "keel_log_bytes_since_checkpoint",
        "Log bytes after the newest checkpoint: what a restart would replay.",
        "gauge",
        &one(s.log_bytes_since_checkpoint),
    );
    counter(
        "keel_connected_clients",
        "Connected clients.",
        "gauge",
        &one(shared.clients.lock().len() as u64),
    );
    counter(
        "keel_connections_received_total",
        "Accepted connections.",
        "counter",
        &one(c.connections_received.load(Relaxed)),
    );
    counter(
        "keel_commands_processed_total",
        "Commands run.",
        "counter",
        &one(c.commands_processed.load(Relaxed)),
    );
    counter(
        "keel_conflict_retries_total",
        "Transactions re-run by the server after a conflict.",
        "counter",
        &one(c.exec_retries.load(Relaxed)),
    );
    let (channels, patterns, shard_channels) = shared.pubsub.counts();
    counter(
        "keel_pubsub_channels",
        "Pub/sub channels, patterns and shard channels with subscribers.",
        "gauge",
        &[
            ("{kind=\"channel\"}".into(), channels as u64),
            ("{kind=\"pattern\"}".into(), patterns as u64),
            ("{kind=\"shard_channel\"}".into(), shard_channels as u64),
        ],
    );
    counter(
        "keel_client_output_buffer_limit_disconnections_total",
        "Subscribers disconnected for owing more than client-output-buffer-limit pubsub.",
        "counter",
        &one(shared.pubsub.disconnections.load(Relaxed)),
    );
    counter(
        "keel_watch_aborts_total",
        "EXECs that returned null because a watched key changed.",
        "counter",
        &one(c.watch_aborts.load(Relaxed)),
    );
    counter(
        "keel_watch_renewals_total",
        "Replicated cluster: renewals of a connection's WATCHes, so that they do not lapse.",
        "counter",
        &one(c.watch_renewals.load(Relaxed)),
    );
    counter(
        "keel_cluster_gathered_total",
        "Cluster mode: commands whose keys are on several nodes, run gathered across them.",
        "counter",
        &one(c.gathered.load(Relaxed)),
    );
    counter(
        "keel_cluster_gathered_retries_total",
        "Cluster mode: gathered commands run again because a key changed between read and write.",
        "counter",
        &one(c.gathered_retries.load(Relaxed)),
    );
    counter(
        "keel_protocol_errors_total",
        "Connections closed for a protocol error.",
        "counter",
        &one(c.protocol_errors.load(Relaxed)),
    );
    counter(
        "keel_net_input_bytes_total",
        "Bytes read from clients.",
        "counter",
        &one(c.net_input_bytes.load(Relaxed)),
    );
    counter(
        "keel_net_output_bytes_total",
        "Bytes written to clients.",
        "counter",
        &one(c.net_output_bytes.load(Relaxed)),
    );
    let _ = writeln!(
        t,
        "# HELP keel_command_duration_seconds Time to run one command (parse to reply buffered).\n\
         # TYPE keel_command_duration_seconds histogram"
    );
    let mut cumulative = 0;
    for b in 0..LATENCY_BUCKETS {
        cumulative += c.latency[b].load(Relaxed);
        let le = (1u64 << b) as f64 / 1e9;
        let _ = writeln!(
            t,
            "keel_command_duration_seconds_bucket{{le=\"{le:e}\"}} {cumulative}"
        );
    }
    let _ = writeln!(
        t,
        "keel_command_duration_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
    );
    let _ = writeln!(t, "keel_command_duration_seconds_count {cumulative}");
    if let Some(cluster) = &shared.cluster {
        let _ = writeln!(
            t,
            "# HELP keel_rpc_duration_seconds Time of one request to another node of the \
             cluster (forwarded commands, Raft messages), by peer.\n\
             # TYPE keel_rpc_duration_seconds histogram"
        );
        let map = cluster.map();
        for (node, latency) in cluster.rpc.used() {
            let peer = map
                .nodes()
                .get(node)
                .map_or_else(|| node.to_string(), |n| n.id.to_string());
            let cumulative = latency.cumulative();
            for &(bound_us, n) in &cumulative {
                let le = bound_us as f64 / 1e6;
                let _ = writeln!(
                    t,
                    "keel_rpc_duration_seconds_bucket{{peer=\"{peer}\",le=\"{le:e}\"}} {n}"
                );
            }
            let s = latency.summary();
            let _ = writeln!(
                t,
                "keel_rpc_duration_seconds_bucket{{peer=\"{peer}\",le=\"+Inf\"}} {}\n\
                 keel_rpc_duration_seconds_sum{{peer=\"{peer}\"}} {}\n\
                 keel_rpc_duration_seconds_count{{peer=\"{peer}\"}} {}",
                s.calls,
                s.sum_us as f64 / 1e6,
                s.calls
            );
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_key_list_is_short_and_one_line() {
        assert_eq!(split_key_list(&[]), "");
        assert_eq!(
            split_key_list(&[b"hot".to_vec(), b"a,b\r\n".to_vec()]),
            "hot,a\\x2cb\\x0d\\x0a"
        );
        let many: Vec<Vec<u8>> = (0..20).map(|i| format!("k{i}").into_bytes()).collect();
        let text = split_key_list(&many);
        assert_eq!(text.split(',').count(), INFO_SPLIT_KEYS_MAX + 1);
        assert!(
            text.starts_with("k0,k1,") && text.ends_with(",k15,..."),
            "{text}"
        );
        let long = split_key_list(&[vec![b'x'; 1000]]);
        assert_eq!(long.len(), KEY_SHOWN_BYTES_MAX + 3);
    }
}
