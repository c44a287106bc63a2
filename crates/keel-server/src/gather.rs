//! Cluster mode: commands whose own keys are on several nodes and that no key-by-key split
//! serves (`SUNIONSTORE`, `ZUNION`, `RENAME`, `SMOVE`, `LMOVE`, `COPY`, `LCS`, ...).
//!
//! The node the client sent the command to:
//!
//! 1. reads every key's value whole (`KEEL.DUMP`) in one transaction across nodes, a
//!    consistent cut;
//! 2. restores them into a transaction of its own engine that it never commits, runs the
//!    command there (its reply is the client's), and dumps the keys again to see which the
//!    command changed;
//! 3. if it changed none, answers; otherwise runs a second transaction across nodes that
//!    first checks, on each key's owner, that the key still holds what step 1 read
//!    (`KEEL.CHECK`, a read of the key like any other, held by the prepare until the
//!    decision) and then replaces each changed key by its new value (`KEEL.RESTORE`). A check
//!    that fails aborts all of it, and the three steps run again.
//!
//! So the command is one serializable transaction: its reads are those of step 3's checks,
//! and its writes commit with them. The cost is the keys' whole values over the network,
//! twice for those it changes (a `SMOVE` out of a million-member set rewrites that set).
//!
//! A dump is keel's own bytes, not Redis's `DUMP` format: a type byte (`0` for an absent key),
//! the deadline (8 bytes, big-endian, unix ms; 0 for none), then the items, each a 4-byte
//! big-endian length and its bytes: a string's value; a hash's fields and values and a set's
//! members, sorted (so that equal contents dump equal); a sorted set's members and scores
//! in score order; a list's elements in order.

use bytes::{Bytes, BytesMut};

use crate::data::{self, Ctx, Fail, View};
use crate::reply::{Out, Proto};
use crate::table::{self, Cmd};

/// What `KEEL.CHECK` answers when the key changed: the gatherer runs the command again.
pub const CHANGED: &str = "TRYAGAIN keel: a key changed while a command across nodes read it";

/// Runs `args` (a command with its name) in `view`, as a client in RESP2 would: the reply.
pub(crate) fn run(
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    args: Vec<Bytes>,
) -> Result<Vec<u8>, Fail> {
    let cmd = table::lookup(&args[0]).expect("a known command").cmd;
    let mut buf = BytesMut::new();
    data::run(cmd, &args, view, ctx, &mut Out::new(&mut buf, Proto::Resp2))?;
    Ok(buf.to_vec())
}

pub(crate) fn words(parts: &[&[u8]]) -> Vec<Bytes> {
    parts.iter().map(|p| Bytes::copy_from_slice(p)).collect()
}

/// The elements of a RESP2 array of bulk strings, or a lone bulk string as one.
pub(crate) fn bulks(reply: &[u8]) -> Option<Vec<Vec<u8>>> {
    fn line(r: &[u8]) -> Option<(&[u8], &[u8])> {
        let end = r.windows(2).position(|w| w == b"\r\n")?;
        Some((&r[..end], &r[end + 2..]))
    }
    fn bulk(r: &[u8]) -> Option<(Vec<u8>, &[u8])> {
        let (head, rest) = line(r)?;
        let len: usize = std::str::from_utf8(head.strip_prefix(b"$")?)
            .ok()?
            .parse()
            .ok()?;
        let body = rest.get(..len)?;
        Some((body.to_vec(), rest.get(len + 2..)?))
    }
    if reply.first() == Some(&b'$') {
        return Some(vec![bulk(reply)?.0]);
    }
    let (head, mut rest) = line(reply)?;
    let n: usize = std::str::from_utf8(head.strip_prefix(b"*")?)
        .ok()?
        .parse()
        .ok()?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (item, next) = bulk(rest)?;
        out.push(item);
        rest = next;
    }
    Some(out)
}

fn damaged() -> Fail {
    "ERR keel: a key's dump could not be read".into()
}

/// `key`'s dump (see the module docs) as `view` sees it.
pub fn dump(view: &mut View<'_, '_>, ctx: &Ctx<'_>, key: &[u8]) -> Result<Vec<u8>, Fail> {
    let ty = run(view, ctx, words(&[b"TYPE", key]))?;
    let (tag, content): (u8, &[&[u8]]) = match &ty[..] {
        b"+none\r\n" => return Ok(vec![0; 9]),
        b"+string\r\n" => (b's', &[b"GET"]),
        b"+hash\r\n" => (b'h', &[b"HGETALL"]),
        b"+set\r\n" => (b'S', &[b"SMEMBERS"]),
        b"+zset\r\n" => (b'z', &[b"ZRANGE", b"0", b"-1", b"WITHSCORES"]),
        b"+list\r\n" => (b'l', &[b"LRANGE", b"0", b"-1"]),
        _ => return Err(damaged()),
    };
    let deadline = run(view, ctx, words(&[b"PEXPIRETIME", key]))?;
    let deadline: i64 = std::str::from_utf8(deadline.strip_prefix(b":").ok_or_else(damaged)?)
        .ok()
        .and_then(|d| d.trim_end().parse().ok())
        .ok_or_else(damaged)?;
    let mut args = vec![content[0], key];
    args.extend_from_slice(&content[1..]);
    let mut items = bulks(&run(view, ctx, words(&args))?).ok_or_else(damaged)?;
    match tag {
        b'h' => {
            let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(items.len() / 2);
            let mut it = items.into_iter();
            while let (Some(f), Some(v)) = (it.next(), it.next()) {
                pairs.push((f, v));
            }
            pairs.sort();
            items = pairs.into_iter().flat_map(|(f, v)| [f, v]).collect();
        }
        b'S' => items.sort(),
        _ => {}
    }
    let mut out = Vec::with_capacity(9 + items.iter().map(|i| 4 + i.len()).sum::<usize>());
    out.push(tag);
    out.extend_from_slice(&u64::try_from(deadline.max(0)).unwrap_or(0).to_be_bytes());
    for item in items {
        let len = u32::try_from(item.len()).map_err(|_| damaged())?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&item);
    }
    Ok(out)
}

/// Replaces `key` in `t` by what `dump` holds (deletes it for an absent key's dump).
pub fn restore(t: &mut keel::Txn<'_>, ctx: &Ctx<'_>, key: &[u8], dump: &[u8]) -> Result<(), Fail> {
    let (&tag, rest) = dump.split_first().ok_or_else(damaged)?;
    let (deadline, mut rest) = rest.split_first_chunk::<8>().ok_or_else(damaged)?;
    let deadline = u64::from_be_bytes(*deadline);
    let mut items: Vec<&[u8]> = Vec::new();
    while !rest.is_empty() {
        let (len, after) = rest.split_first_chunk::<4>().ok_or_else(damaged)?;
        let len = u32::from_be_bytes(*len) as usize;
        items.push(after.get(..len).ok_or_else(damaged)?);
        rest = &after[len..];
    }
    let mut view = View::Txn(t);
    run(&mut view, ctx, words(&[b"DEL", key]))?;
    let name: &[u8] = match tag {
        0 => return Ok(()),
        b's' => b"SET",
        b'h' => b"HSET",
        b'S' => b"SADD",
        b'z' => b"ZADD",
        b'l' => b"RPUSH",
        _ => return Err(damaged()),
    };
    let mut args = vec![name, key];
    if tag == b'z' {
        // ZRANGE gave member, score; ZADD takes score, member.
        for pair in items.chunks(2) {
            args.extend([*pair.get(1).ok_or_else(damaged)?, pair[0]]);
        }
    } else {
        args.extend(items);
    }
    run(&mut view, ctx, words(&args))?;
    if deadline > 0 {
        let at = deadline.to_string();
        run(&mut view, ctx, words(&[b"PEXPIREAT", key, at.as_bytes()]))?;
    }
    Ok(())
}

/// `KEEL.DUMP key`, `KEEL.CHECK key dump` and `KEEL.RESTORE key dump`.
pub fn command(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    match cmd {
        Cmd::KeelDump => out.bulk(&dump(view, ctx, &args[1])?),
        Cmd::KeelCheck => {
            if dump(view, ctx, &args[1])? != args[2][..] {
                return Err(CHANGED.into());
            }
            out.ok();
        }
        _ => {
            restore(view.txn(), ctx, &args[1], &args[2])?;
            out.ok();
        }
    }
    Ok(())
}

/// Whether a command whose keys are on several nodes may run gathered (see the module
/// docs): a data command with keys, other than these three. A blocking pop runs as inside
/// `MULTI`: it pops, or answers nil at once (outside `MULTI`, `Conn::block_across` runs
/// it again until it pops).
pub fn may_gather(cmd: Cmd) -> bool {
    data::is_data(cmd) && !matches!(cmd, Cmd::KeelDump | Cmd::KeelCheck | Cmd::KeelRestore)
}

/// What step 2 found: each command's reply (in the client's protocol) and the keys the
/// commands changed with their new dumps. When a command failed (`failed`), its reply is
/// its error and nothing is to change: as in any keel transaction, one failed command rolls
/// back the whole.
pub struct Ran {
    pub replies: Vec<Vec<u8>>,
    pub failed: bool,
    pub changed: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Step 2: restores `dumps` (`keys[i]`'s is `dumps[i]`) into a transaction of `db` that is
/// never committed, runs `commands` there in turn (a `MULTI`'s queue, or one command) and
/// dumps the keys again.
pub fn compute(
    db: &keel::Db,
    ctx: &Ctx<'_>,
    proto: Proto,
    commands: &[&[Bytes]],
    keys: &[Vec<u8>],
    dumps: &[Vec<u8>],
) -> Result<Ran, Fail> {
    let mut txn = db
        .begin()
        .map_err(|e| Fail::from(format!("ERR keel: {e}")))?;
    for (key, d) in keys.iter().zip(dumps) {
        restore(&mut txn, ctx, key, d)?;
    }
    let mut replies = Vec::with_capacity(commands.len());
    let mut failed = false;
    for args in commands {
        let cmd = table::lookup(&args[0]).expect("a known command").cmd;
        let mut buf = BytesMut::new();
        let result = data::run(
            cmd,
            args,
            &mut View::Txn(&mut txn),
            ctx,
            &mut Out::new(&mut buf, proto),
        );
        if let Err(Fail(text)) = result {
            buf.clear();
            Out::new(&mut buf, proto).error(&text);
            failed = true;
        }
        replies.push(buf.to_vec());
    }
    let mut changed = Vec::new();
    if !failed {
        for (key, before) in keys.iter().zip(dumps) {
            let after = dump(&mut View::Txn(&mut txn), ctx, key)?;
            if after != *before {
                changed.push((key.clone(), after));
            }
        }
    }
    // Dropped, never committed: nothing of it reaches the engine's records or log.
    drop(txn);
    Ok(Ran {
        replies,
        failed,
        changed,
    })
}

/// A dump from a bulk-string reply of `KEEL.DUMP`.
pub fn dump_of_reply(reply: &[u8]) -> Result<Vec<u8>, Fail> {
    bulks(reply)
        .and_then(|b| b.into_iter().next())
        .filter(|_| reply.first() == Some(&b'$'))
        .ok_or_else(damaged)
}
