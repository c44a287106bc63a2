//! Bit commands on strings (`SETBIT`, `GETBIT`, `BITCOUNT`, `BITPOS`, `BITOP`, `BITFIELD`,
//! `BITFIELD_RO`), as Redis 7.0's `bitops.c` answers them: the same argument checks in the same
//! order, the same replies and error texts.
//!
//! A string is stored whole (`docs/types.md`), so a bit write reads the value, changes it and
//! writes it back in the command's transaction: two concurrent writers of one key conflict,
//! and one commits after the other, as any read-modify-write does. A write that grows the
//! string pads it with zero bytes. Offsets are bounded as in Redis, by `proto-max-bulk-len`
//! (`bit offset is not an integer or out of range`), and the string they would build also by
//! keel's value size limit ([`ks::string_bytes_max`]), with an error that names it.
//!
//! What `WATCH` sees follows Redis 7.0: `SETBIT` writes the key only when it creates or grows
//! the string or changes the bit; `BITFIELD` when one of its `SET`/`INCRBY` ops that did not
//! fail creates or grows the string or changes its field (so two ops that undo each other
//! still count). One difference: a `BITFIELD` whose every write op fails (`OVERFLOW FAIL`)
//! but that creates or grows the string writes it in keel, so a `WATCH` of the key aborts;
//! Redis creates the key without telling its watchers.

use bytes::Bytes;
use keel::Txn;

use crate::data::{Ctx, Fail, NOT_INTEGER, SYNTAX, View, keyword};
use crate::keyspace::{self as ks};
use crate::reply::Out;
use crate::resp::string_to_i64;
use crate::table::Cmd;

const BAD_OFFSET: &str = "ERR bit offset is not an integer or out of range";
const BAD_BIT: &str = "ERR bit is not an integer or out of range";
const BAD_TYPE: &str = "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is \
                        not supported but i64 is.";

/// Whether this module runs `cmd`.
pub fn handles(cmd: Cmd) -> bool {
    is_read_only(cmd) || matches!(cmd, Cmd::Setbit | Cmd::Bitop | Cmd::Bitfield)
}

/// Whether `cmd` is a bit command that only reads.
pub fn is_read_only(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Getbit | Cmd::Bitcount | Cmd::Bitpos | Cmd::BitfieldRo
    )
}

/// Runs one bit command (see [`handles`]).
pub fn run(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    match cmd {
        Cmd::Setbit => setbit(args, view.txn(), ctx, out),
        Cmd::Getbit => {
            let offset = bit_offset(&args[2], None, ctx)?;
            let bit = ks::read_string(view, &ctx.clock, &args[1], |v| {
                bit_at(v.unwrap_or_default(), offset)
            })?;
            out.int(i64::from(bit));
            Ok(())
        }
        Cmd::Bitcount => bitcount(args, view, ctx, out),
        Cmd::Bitpos => bitpos(args, view, ctx, out),
        Cmd::Bitop => bitop(args, view.txn(), ctx, out),
        Cmd::Bitfield | Cmd::BitfieldRo => bitfield(cmd, args, view, ctx, out),
        other => panic!("{other:?} is not a bit command"),
    }
}

/// A bit offset argument, as Redis's `getBitOffsetFromArgument` reads it: an integer, or with
/// `hash_bits` (`BITFIELD`) also `#n`, meaning `n` times the field's width; at least 0 and
/// within `proto-max-bulk-len` bytes.
fn bit_offset(arg: &[u8], hash_bits: Option<u32>, ctx: &Ctx<'_>) -> Result<u64, Fail> {
    let (times, digits) = match (hash_bits, arg) {
        (Some(bits), [b'#', rest @ ..]) if !rest.is_empty() => (Some(bits), rest),
        _ => (None, arg),
    };
    let mut n = string_to_i64(digits).ok_or(BAD_OFFSET)?;
    if let Some(bits) = times {
        // Redis multiplies in a C long long; wrapping keeps its answer for huge `#n`.
        n = n.wrapping_mul(i64::from(bits));
    }
    let n = u64::try_from(n).map_err(|_| BAD_OFFSET)?;
    if n >> 3 >= ctx.bulk_bytes_max.max(0) as u64 {
        return Err(BAD_OFFSET.into());
    }
    Ok(n)
}

/// The bit at `offset` (bit 0 is the most significant bit of byte 0); 0 past the end.
fn bit_at(v: &[u8], offset: u64) -> u8 {
    usize::try_from(offset >> 3)
        .ok()
        .and_then(|byte| v.get(byte))
        .map_or(0, |b| (b >> (7 - (offset & 7))) & 1)
}

/// The string at `key` for a bit write: its value grown with zero bytes to hold bit
/// `max_bit`, what the key holds (to write it back with), and whether the string is new or
/// grew. `WRONGTYPE` for another type; a keel error when the string would outgrow keel's value
/// size limit.
fn string_for_write(
    t: &mut Txn<'_>,
    ctx: &Ctx<'_>,
    key: &[u8],
    max_bit: u64,
    cmd: &str,
) -> Result<(Vec<u8>, ks::Held, bool), Fail> {
    let held = ks::lookup(&mut View::Txn(t), &ctx.clock, key, true)?;
    let mut value = held.string()?.unwrap_or_default().to_vec();
    let need = max_bit / 8 + 1;
    let grown = held == ks::Held::Absent || need > value.len() as u64;
    if need > value.len() as u64 {
        let max = ks::string_bytes_max(held.deadline());
        if need > max as u64 {
            return Err(format!(
                "ERR keel: {cmd} at bit offset {max_bit} needs a string of {need} bytes, over \
                 keel's value size limit of {max} bytes"
            )
            .into());
        }
        value.resize(
            usize::try_from(need).expect("below the value size limit"),
            0,
        );
    }
    Ok((value, held, grown))
}

fn setbit(args: &[Bytes], t: &mut Txn<'_>, ctx: &Ctx<'_>, out: &mut Out<'_>) -> Result<(), Fail> {
    let offset = bit_offset(&args[2], None, ctx)?;
    let on = match string_to_i64(&args[3]) {
        Some(0) => 0u8,
        Some(1) => 1,
        _ => return Err(BAD_BIT.into()),
    };
    let (mut value, held, grown) = string_for_write(t, ctx, &args[1], offset, "SETBIT")?;
    let old = bit_at(&value, offset);
    if !grown && old == on {
        out.int(i64::from(old));
        return Ok(());
    }
    let byte = usize::try_from(offset >> 3).expect("within the string");
    let mask = 1u8 << (7 - (offset & 7));
    if on == 1 {
        value[byte] |= mask;
    } else {
        value[byte] &= !mask;
    }
    ks::put_string(t, &args[1], &value, held.deadline(), &held)?;
    out.int(i64::from(old));
    Ok(())
}

/// A `start end [BYTE|BIT]` range as Redis resolves it against a string of `len` bytes: the
/// first and last bit, or `None` when it is empty. `end: None` means to the end (in bytes).
fn resolve_range(len: usize, start: i64, end: Option<i64>, in_bits: bool) -> Option<(u64, u64)> {
    let mut total = len as i64;
    let mut end = end.unwrap_or(total - 1);
    if in_bits {
        total <<= 3;
    }
    let mut start = start;
    if start < 0 {
        start += total;
    }
    if end < 0 {
        end += total;
    }
    start = start.max(0);
    end = end.max(0);
    if end >= total {
        end = total - 1;
    }
    if start > end {
        return None;
    }
    let (start, end) = (start as u64, end as u64);
    Some(if in_bits {
        (start, end)
    } else {
        (start * 8, end * 8 + 7)
    })
}

/// `BYTE` or `BIT`, in any case: whether the range counts bits.
fn unit_arg(arg: &[u8]) -> Result<bool, Fail> {
    Ok(keyword(arg, &[("bit", true), ("byte", false)]).ok_or(SYNTAX)?)
}

/// The set bits of `v` from bit `first` to bit `last`, both included.
fn count_ones(v: &[u8], first: u64, last: u64) -> u64 {
    let (a, b) = ((first / 8) as usize, (last / 8) as usize);
    let whole: u64 = v[a..=b].iter().map(|x| u64::from(x.count_ones())).sum();
    // Bits of the edge bytes outside the range: before `first` and after `last`.
    let head = v[a] & !(0xFFu8 >> (first % 8));
    let tail = v[b] & 0xFFu8.checked_shr((last % 8 + 1) as u32).unwrap_or(0);
    whole - u64::from(head.count_ones()) - u64::from(tail.count_ones())
}

fn bitcount(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    // Redis 7.0 looks the key up before it reads the range: an absent key counts 0 whatever
    // the arguments say.
    let n = ks::read_string(view, &ctx.clock, &args[1], |v| -> Result<u64, Fail> {
        let Some(v) = v else { return Ok(0) };
        let range = match args.len() {
            2 => resolve_range(v.len(), 0, None, false),
            4 | 5 => {
                let start = string_to_i64(&args[2]).ok_or(NOT_INTEGER)?;
                let end = string_to_i64(&args[3]).ok_or(NOT_INTEGER)?;
                // Before the unit is read, as Redis 7.0 does.
                if start < 0 && end < 0 && start > end {
                    return Ok(0);
                }
                let in_bits = match args.get(4) {
                    Some(a) => unit_arg(a)?,
                    None => false,
                };
                resolve_range(v.len(), start, Some(end), in_bits)
            }
            _ => return Err(SYNTAX.into()),
        };
        Ok(range.map_or(0, |(first, last)| count_ones(v, first, last)))
    })??;
    out.int(n as i64);
    Ok(())
}

/// The first bit equal to `bit` from bit `first` to bit `last` of `v`.
fn find_bit(v: &[u8], bit: u8, first: u64, last: u64) -> Option<u64> {
    let (a, b) = ((first / 8) as usize, (last / 8) as usize);
    for (i, &byte) in v[a..=b].iter().enumerate() {
        let i = a + i;
        // Looking for a 1 in `x`: flip the byte when looking for a 0.
        let mut x = if bit == 1 { byte } else { !byte };
        if i == a {
            x &= 0xFF >> (first % 8);
        }
        if i == b {
            x &= 0xFFu8 << (7 - last % 8);
        }
        if x != 0 {
            return Some(i as u64 * 8 + u64::from(x.leading_zeros()));
        }
    }
    None
}

fn bitpos(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let bit = match string_to_i64(&args[2]) {
        Some(b @ (0 | 1)) => b as u8,
        Some(_) => return Err("ERR The bit argument must be 1 or 0.".into()),
        None => return Err(NOT_INTEGER.into()),
    };
    // An absent key is an endless run of zeros (Redis 7.0 answers before reading the range).
    let pos = ks::read_string(view, &ctx.clock, &args[1], |v| -> Result<i64, Fail> {
        let Some(v) = v else {
            return Ok(if bit == 1 { -1 } else { 0 });
        };
        let (range, end_given) = match args.len() {
            3 => (resolve_range(v.len(), 0, None, false), false),
            4..=6 => {
                let start = string_to_i64(&args[3]).ok_or(NOT_INTEGER)?;
                let in_bits = match args.get(5) {
                    Some(a) => unit_arg(a)?,
                    None => false,
                };
                let end = match args.get(4) {
                    Some(a) => Some(string_to_i64(a).ok_or(NOT_INTEGER)?),
                    None => None,
                };
                (resolve_range(v.len(), start, end, in_bits), end.is_some())
            }
            _ => return Err(SYNTAX.into()),
        };
        let Some((first, last)) = range else {
            return Ok(-1);
        };
        Ok(match find_bit(v, bit, first, last) {
            Some(p) => p as i64,
            // Looking for a 0 with no end given, the string counts as padded with zeros.
            None if bit == 0 && !end_given => (last + 1) as i64,
            None => -1,
        })
    })??;
    out.int(pos);
    Ok(())
}

fn bitop(args: &[Bytes], t: &mut Txn<'_>, ctx: &Ctx<'_>, out: &mut Out<'_>) -> Result<(), Fail> {
    #[derive(Clone, Copy, PartialEq)]
    enum Op {
        And,
        Or,
        Xor,
        Not,
    }
    let op = keyword(
        &args[1],
        &[
            ("and", Op::And),
            ("or", Op::Or),
            ("xor", Op::Xor),
            ("not", Op::Not),
        ],
    )
    .ok_or(SYNTAX)?;
    if op == Op::Not && args.len() != 4 {
        return Err("ERR BITOP NOT must be called with a single source key.".into());
    }
    let mut sources: Vec<Vec<u8>> = Vec::with_capacity(args.len() - 3);
    for key in &args[3..] {
        let v = ks::read_string(&mut View::Txn(t), &ctx.clock, key, |v| {
            v.unwrap_or_default().to_vec()
        })?;
        sources.push(v);
    }
    let len = sources.iter().map(Vec::len).max().unwrap_or(0);
    let dest = &args[2];
    let held = ks::lookup(&mut View::Txn(t), &ctx.clock, dest, false)?;
    if len == 0 {
        // Every source is empty or absent: the destination is deleted, whatever it held.
        ks::delete(t, dest, &held)?;
        out.int(0);
        return Ok(());
    }
    let byte = |s: &Vec<u8>, i: usize| s.get(i).copied().unwrap_or(0);
    let result: Vec<u8> = (0..len)
        .map(|i| {
            let first = byte(&sources[0], i);
            sources[1..].iter().fold(
                if op == Op::Not { !first } else { first },
                |acc, s| match op {
                    Op::And => acc & byte(s, i),
                    Op::Or => acc | byte(s, i),
                    Op::Xor => acc ^ byte(s, i),
                    Op::Not => acc,
                },
            )
        })
        .collect();
    // A source is within the limit, so the result is too; it replaces any TTL, as SET does.
    ks::put_string(t, dest, &result, 0, &held)?;
    out.int(len as i64);
    Ok(())
}

/// `OVERFLOW` behaviour of `BITFIELD`'s `SET` and `INCRBY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overflow {
    Wrap,
    Sat,
    Fail,
}

/// One `BITFIELD` operation.
#[derive(Debug, Clone, Copy)]
struct FieldOp {
    /// `None`: `GET`; `Some(false)`: `SET`; `Some(true)`: `INCRBY`.
    write: Option<bool>,
    signed: bool,
    bits: u32,
    offset: u64,
    /// `SET`'s value or `INCRBY`'s increment.
    arg: i64,
    overflow: Overflow,
}

/// A `BITFIELD` type: `i1`..`i64` or `u1`..`u63` (lower-case, as Redis reads it).
fn field_type(arg: &[u8]) -> Result<(bool, u32), Fail> {
    let (signed, digits) = match arg {
        [b'i', rest @ ..] => (true, rest),
        [b'u', rest @ ..] => (false, rest),
        _ => return Err(BAD_TYPE.into()),
    };
    match string_to_i64(digits) {
        Some(n) if n >= 1 && n <= if signed { 64 } else { 63 } => Ok((signed, n as u32)),
        _ => Err(BAD_TYPE.into()),
    }
}

/// Parses `BITFIELD`'s operations (`args[2..]`), with Redis's errors in its order.
fn field_ops(args: &[Bytes], ctx: &Ctx<'_>) -> Result<Vec<FieldOp>, Fail> {
    let mut ops = Vec::new();
    let mut overflow = Overflow::Wrap;
    let mut j = 2;
    while j < args.len() {
        let left = args.len() - j - 1;
        let sub = &args[j];
        let write = if sub.eq_ignore_ascii_case(b"get") && left >= 2 {
            None
        } else if sub.eq_ignore_ascii_case(b"set") && left >= 3 {
            Some(false)
        } else if sub.eq_ignore_ascii_case(b"incrby") && left >= 3 {
            Some(true)
        } else if sub.eq_ignore_ascii_case(b"overflow") && left >= 1 {
            overflow = keyword(
                &args[j + 1],
                &[
                    ("wrap", Overflow::Wrap),
                    ("sat", Overflow::Sat),
                    ("fail", Overflow::Fail),
                ],
            )
            .ok_or("ERR Invalid OVERFLOW type specified")?;
            j += 2;
            continue;
        } else {
            return Err(SYNTAX.into());
        };
        let (signed, bits) = field_type(&args[j + 1])?;
        let offset = bit_offset(&args[j + 2], Some(bits), ctx)?;
        let arg = match write {
            None => 0,
            Some(_) => string_to_i64(&args[j + 3]).ok_or(NOT_INTEGER)?,
        };
        ops.push(FieldOp {
            write,
            signed,
            bits,
            offset,
            arg,
            overflow,
        });
        j += if write.is_none() { 3 } else { 4 };
    }
    Ok(ops)
}

/// The `bits`-wide unsigned field at bit `offset` of `v` (zeros past its end).
fn get_field(v: &[u8], offset: u64, bits: u32) -> u64 {
    (0..u64::from(bits)).fold(0u64, |acc, i| (acc << 1) | u64::from(bit_at(v, offset + i)))
}

/// The field read as signed: its top bit extended.
fn get_signed(v: &[u8], offset: u64, bits: u32) -> i64 {
    let u = get_field(v, offset, bits);
    if bits < 64 && u & (1 << (bits - 1)) != 0 {
        (u | (u64::MAX << bits)) as i64
    } else {
        u as i64
    }
}

/// Writes the low `bits` bits of `value` at bit `offset` (the string holds them).
fn set_field(v: &mut [u8], offset: u64, bits: u32, value: u64) {
    for i in 0..u64::from(bits) {
        let on = value & (1 << (u64::from(bits) - 1 - i)) != 0;
        let at = offset + i;
        let byte = usize::try_from(at >> 3).expect("within the string");
        let mask = 1u8 << (7 - (at & 7));
        if on {
            v[byte] |= mask;
        } else {
            v[byte] &= !mask;
        }
    }
}

/// Redis's `checkUnsignedBitfieldOverflow`: whether `value + incr` leaves the `bits`-wide
/// unsigned range, and the value to store then (wrapped or saturated).
fn unsigned_overflow(value: u64, incr: i64, bits: u32, how: Overflow) -> Option<u64> {
    let max = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let max_incr = max.wrapping_sub(value) as i64;
    let min_incr = (value as i64).wrapping_neg();
    let wrap = || value.wrapping_add(incr as u64) & !(u64::MAX.checked_shl(bits).unwrap_or(0));
    if value > max || (incr > 0 && incr > max_incr) {
        Some(match how {
            Overflow::Wrap => wrap(),
            _ => max,
        })
    } else if incr < 0 && incr < min_incr {
        Some(match how {
            Overflow::Wrap => wrap(),
            _ => 0,
        })
    } else {
        None
    }
}

/// Redis's `checkSignedBitfieldOverflow`, likewise for the `bits`-wide signed range.
fn signed_overflow(value: i64, incr: i64, bits: u32, how: Overflow) -> Option<i64> {
    let max = if bits == 64 {
        i64::MAX
    } else {
        (1i64 << (bits - 1)) - 1
    };
    let min = -max - 1;
    let max_incr = (max as u64).wrapping_sub(value as u64) as i64;
    let min_incr = min.wrapping_sub(value);
    let wrap = || {
        let c = (value as u64).wrapping_add(incr as u64);
        if bits < 64 {
            let mask = u64::MAX << bits;
            if c & (1 << (bits - 1)) != 0 {
                (c | mask) as i64
            } else {
                (c & !mask) as i64
            }
        } else {
            c as i64
        }
    };
    if value > max || (bits != 64 && incr > max_incr) || (value >= 0 && incr > 0 && incr > max_incr)
    {
        Some(match how {
            Overflow::Wrap => wrap(),
            _ => max,
        })
    } else if value < min
        || (bits != 64 && incr < min_incr)
        || (value < 0 && incr < 0 && incr < min_incr)
    {
        Some(match how {
            Overflow::Wrap => wrap(),
            _ => min,
        })
    } else {
        None
    }
}

/// Runs one `SET`/`INCRBY` op on `v`: its reply (`None`: nil, an `OVERFLOW FAIL` that wrote
/// nothing), and whether the field's value changed.
fn write_field(v: &mut [u8], op: &FieldOp) -> Option<(i64, bool)> {
    let incr = op.write == Some(true);
    if op.signed {
        let old = get_signed(v, op.offset, op.bits);
        let (new, overflow) = if incr {
            match signed_overflow(old, op.arg, op.bits, op.overflow) {
                Some(w) => (w, true),
                None => (old.wrapping_add(op.arg), false),
            }
        } else {
            match signed_overflow(op.arg, 0, op.bits, op.overflow) {
                Some(w) => (w, true),
                None => (op.arg, false),
            }
        };
        if overflow && op.overflow == Overflow::Fail {
            return None;
        }
        set_field(v, op.offset, op.bits, new as u64);
        Some((if incr { new } else { old }, new != old))
    } else {
        let old = get_field(v, op.offset, op.bits);
        let (new, overflow) = if incr {
            match unsigned_overflow(old, op.arg, op.bits, op.overflow) {
                Some(w) => (w, true),
                None => (old.wrapping_add(op.arg as u64), false),
            }
        } else {
            match unsigned_overflow(op.arg as u64, 0, op.bits, op.overflow) {
                Some(w) => (w, true),
                None => (op.arg as u64, false),
            }
        };
        if overflow && op.overflow == Overflow::Fail {
            return None;
        }
        set_field(v, op.offset, op.bits, new);
        Some((if incr { new as i64 } else { old as i64 }, new != old))
    }
}

/// A `GET` op's reply.
fn read_field(v: &[u8], op: &FieldOp) -> i64 {
    if op.signed {
        get_signed(v, op.offset, op.bits)
    } else {
        get_field(v, op.offset, op.bits) as i64
    }
}

fn bitfield(
    cmd: Cmd,
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let ops = field_ops(args, ctx)?;
    let highest = ops
        .iter()
        .filter(|op| op.write.is_some())
        .map(|op| op.offset + u64::from(op.bits) - 1)
        .max();
    let Some(highest) = highest else {
        // Only GETs: a read; an absent key reads as zeros.
        return ks::read_string(view, &ctx.clock, &args[1], |v| {
            let v = v.unwrap_or_default();
            out.array(ops.len());
            for op in &ops {
                out.int(read_field(v, op));
            }
        });
    };
    if cmd == Cmd::BitfieldRo {
        return Err("ERR BITFIELD_RO only supports the GET subcommand".into());
    }
    let t = view.txn();
    let (mut value, held, grown) = string_for_write(t, ctx, &args[1], highest, "BITFIELD")?;
    let mut changed = grown;
    out.array(ops.len());
    for op in &ops {
        if op.write.is_some() {
            match write_field(&mut value, op) {
                Some((n, differs)) => {
                    changed |= differs;
                    out.int(n);
                }
                None => out.null(),
            }
        } else {
            out.int(read_field(&value, op));
        }
    }
    // Also when every op failed but the key was created or padded, as in Redis (which then
    // does not tell the key's watchers: see the module's docs).
    if changed {
        ks::put_string(t, &args[1], &value, held.deadline(), &held)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
