//! Key expiry commands: `EXPIRE`/`PEXPIRE`/`EXPIREAT`/`PEXPIREAT` (with `NX XX GT LT`),
//! `TTL`/`PTTL`/`EXPIRETIME`/`PEXPIRETIME`, `PERSIST`, `SETEX`/`PSETEX` and `GETEX`.
//!
//! A deadline is data in the key's meta record (see `keyspace`); these commands only read and
//! write it in the caller's transaction. Removing keys past their deadline is the expirer's
//! job (`reaper`) and that of any transaction meeting one. Replies follow Redis 7.2's,
//! including its rounding (`TTL` rounds to the nearest second) and error texts.

use bytes::Bytes;

use crate::data::{Ctx, Fail, SYNTAX, Ttl, View, int_arg};
use crate::keyspace::{self as ks, Held};
use crate::reply::Out;
use crate::table::Cmd;

/// Whether this module runs `cmd`.
pub fn handles(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Expire
            | Cmd::Pexpire
            | Cmd::Expireat
            | Cmd::Pexpireat
            | Cmd::Ttl
            | Cmd::Pttl
            | Cmd::Expiretime
            | Cmd::Pexpiretime
            | Cmd::Persist
            | Cmd::Setex
            | Cmd::Psetex
            | Cmd::Getex
    )
}

/// Runs one expiry command (see [`handles`]).
pub fn run(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let clock = &ctx.clock;
    match cmd {
        Cmd::Expire | Cmd::Pexpire | Cmd::Expireat | Cmd::Pexpireat => {
            expire(cmd, args, view.txn(), clock, out)?;
        }
        Cmd::Ttl | Cmd::Pttl | Cmd::Expiretime | Cmd::Pexpiretime => {
            let held = ks::lookup(view, clock, &args[1], false)?;
            let reply = match (&held, held.deadline()) {
                (Held::Absent, _) => -2,
                (_, 0) => -1,
                (_, deadline) => {
                    let ms = match cmd {
                        Cmd::Ttl | Cmd::Pttl => deadline.saturating_sub(clock.now_ms()),
                        _ => deadline,
                    };
                    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
                    match cmd {
                        Cmd::Pttl | Cmd::Pexpiretime => ms,
                        _ => ms.saturating_add(500) / 1000,
                    }
                }
            };
            out.int(reply);
        }
        Cmd::Persist => {
            let t = view.txn();
            let held = ks::lookup(&mut View::Txn(t), clock, &args[1], true)?;
            if held.deadline() == 0 {
                out.int(0);
            } else {
                ks::set_deadline(t, &args[1], &held, 0)?;
                out.int(1);
            }
        }
        Cmd::Setex | Cmd::Psetex => {
            let (unit, name) = match cmd {
                Cmd::Setex => (Ttl::Ex, "setex"),
                _ => (Ttl::Px, "psetex"),
            };
            let deadline = unit.deadline(&args[2], clock, name)?;
            let t = view.txn();
            let held = ks::lookup(&mut View::Txn(t), clock, &args[1], false)?;
            ks::put_string(t, &args[1], &args[3], deadline, &held)?;
            out.ok();
        }
        Cmd::Getex => getex(args, view.txn(), clock, out)?,
        other => panic!("{other:?} is not an expiry command"),
    }
    Ok(())
}

/// `EXPIRE key n [NX|XX|GT|LT]` and its kin.
fn expire(
    cmd: Cmd,
    args: &[Bytes],
    t: &mut keel::Txn<'_>,
    clock: &ks::Clock,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for opt in &args[3..] {
        if opt.eq_ignore_ascii_case(b"nx") {
            nx = true;
        } else if opt.eq_ignore_ascii_case(b"xx") {
            xx = true;
        } else if opt.eq_ignore_ascii_case(b"gt") {
            gt = true;
        } else if opt.eq_ignore_ascii_case(b"lt") {
            lt = true;
        } else {
            // Redis formats it with `%s`: the text ends at a NUL byte.
            let shown = opt.split(|&b| b == 0).next().unwrap_or_default();
            return Err(
                format!("ERR Unsupported option {}", String::from_utf8_lossy(shown)).into(),
            );
        }
    }
    if nx && (xx || gt || lt) {
        return Err("ERR NX and XX, GT or LT options at the same time are not compatible".into());
    }
    if gt && lt {
        return Err("ERR GT and LT options at the same time are not compatible".into());
    }
    let name = match cmd {
        Cmd::Expire => "expire",
        Cmd::Pexpire => "pexpire",
        Cmd::Expireat => "expireat",
        _ => "pexpireat",
    };
    let invalid = || -> Fail { format!("ERR invalid expire time in '{name}' command").into() };
    let mut when = int_arg(&args[2])?;
    if matches!(cmd, Cmd::Expire | Cmd::Expireat) {
        when = when.checked_mul(1000).ok_or_else(invalid)?;
    }
    if matches!(cmd, Cmd::Expire | Cmd::Pexpire) {
        let now = i64::try_from(clock.now_ms()).map_err(|_| invalid())?;
        when = when.checked_add(now).ok_or_else(invalid)?;
    }
    let held = ks::lookup(&mut View::Txn(t), clock, &args[1], true)?;
    if held == Held::Absent {
        out.int(0);
        return Ok(());
    }
    let current = held.deadline();
    let has_ttl = current != 0;
    let current = i64::try_from(current).unwrap_or(i64::MAX);
    let refused = (nx && has_ttl)
        || (xx && !has_ttl)
        || (gt && (!has_ttl || when <= current))
        || (lt && has_ttl && when >= current);
    if refused {
        out.int(0);
        return Ok(());
    }
    match u64::try_from(when) {
        Ok(deadline) if deadline > clock.now_ms() => {
            ks::set_deadline(t, &args[1], &held, deadline)?
        }
        // Already past: the key is deleted now.
        _ => {
            ks::delete(t, &args[1], &held)?;
        }
    }
    out.int(1);
    Ok(())
}

/// `GETEX key [EX s | PX ms | EXAT ts | PXAT ts | PERSIST]`.
fn getex(
    args: &[Bytes],
    t: &mut keel::Txn<'_>,
    clock: &ks::Clock,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let mut ttl: Option<(Ttl, &[u8])> = None;
    let mut persist = false;
    let mut i = 2;
    while i < args.len() {
        let opt = &args[i];
        if opt.eq_ignore_ascii_case(b"persist") && ttl.is_none() {
            persist = true;
        } else if let Some(unit) = Ttl::parse(opt)
            && !persist
            && ttl.is_none_or(|(u, _)| u == unit)
            && let Some(next) = args.get(i + 1)
        {
            ttl = Some((unit, next));
            i += 1;
        } else {
            return Err(SYNTAX.into());
        }
        i += 1;
    }
    // As in Redis: the key and its type first, then the expire time's value.
    let held = ks::lookup(&mut View::Txn(t), clock, &args[1], true)?;
    let Some(value) = held.string()? else {
        out.null();
        return Ok(());
    };
    let deadline = match ttl {
        Some((unit, arg)) => Some(unit.deadline(arg, clock, "getex")?),
        None => None,
    };
    out.bulk(value);
    match deadline {
        Some(d) if d <= clock.now_ms() => {
            ks::delete(t, &args[1], &held)?;
        }
        Some(d) => ks::set_deadline(t, &args[1], &held, d)?,
        None if persist && held.deadline() != 0 => ks::set_deadline(t, &args[1], &held, 0)?,
        None => {}
    }
    Ok(())
}
