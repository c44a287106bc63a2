//! `LCS key1 key2 [LEN] [IDX] [MINMATCHLEN len] [WITHMATCHLEN]`: the longest common
//! subsequence of two strings, as Redis 7.0's `lcsCommand` computes it, so that which of
//! several equally long subsequences it gives, and which matching ranges, are Redis's: the
//! same dynamic programming table, walked back from its end with the same tie rule.

use bytes::Bytes;

use crate::data::{Ctx, Fail, SYNTAX, View};
use crate::keyspace as ks;
use crate::reply::Out;
use crate::resp::string_to_i64;

const NOT_STRINGS: &str = "ERR The specified keys must contain string values";

/// Runs `LCS` (`args[0]` is the command name).
pub fn lcs(
    args: &[Bytes],
    view: &mut View<'_, '_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> Result<(), Fail> {
    let read = |view: &mut View<'_, '_>, key: &[u8]| {
        ks::read_string(view, &ctx.clock, key, |v| v.unwrap_or_default().to_vec()).map_err(|e| {
            if e.0 == ks::WRONGTYPE {
                Fail::from(NOT_STRINGS)
            } else {
                e
            }
        })
    };
    let a = read(view, &args[1]);
    let b = read(view, &args[2]);
    let (a, b) = (a?, b?);
    let (mut getlen, mut getidx, mut withmatchlen, mut minmatchlen) = (false, false, false, 0u64);
    let mut j = 3;
    while j < args.len() {
        let opt = &args[j];
        let more = j + 1 < args.len();
        if opt.eq_ignore_ascii_case(b"idx") {
            getidx = true;
        } else if opt.eq_ignore_ascii_case(b"len") {
            getlen = true;
        } else if opt.eq_ignore_ascii_case(b"withmatchlen") {
            withmatchlen = true;
        } else if opt.eq_ignore_ascii_case(b"minmatchlen") && more {
            let n = string_to_i64(&args[j + 1]).ok_or(crate::data::NOT_INTEGER)?;
            minmatchlen = u64::try_from(n).unwrap_or(0);
            j += 1;
        } else {
            return Err(SYNTAX.into());
        }
        j += 1;
    }
    if getidx && getlen {
        return Err("ERR If you want both the length and indexes, please just use IDX.".into());
    }
    // The table of LCS(i, j) over prefixes, 4 bytes a cell, bounded as Redis bounds it.
    let cells = (a.len() as u64 + 1) * (b.len() as u64 + 1);
    if cells.saturating_mul(4) > ctx.bulk_bytes_max as u64 {
        return Err(
            "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len".into(),
        );
    }
    let width = b.len() + 1;
    let mut dp = vec![0u32; cells as usize];
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            dp[i * width + j] = if a[i - 1] == b[j - 1] {
                dp[(i - 1) * width + j - 1] + 1
            } else {
                dp[(i - 1) * width + j].max(dp[i * width + j - 1])
            };
        }
    }
    let total = dp[a.len() * width + b.len()];
    if getlen {
        out.int(i64::from(total));
        return Ok(());
    }
    // Walk back from the end, collecting the subsequence and, for IDX, its matching ranges
    // (from the end of the strings to their start, as Redis emits them).
    let mut result = vec![0u8; total as usize];
    let mut idx = total as usize;
    let mut matches: Vec<[u64; 5]> = Vec::new();
    let none = a.len();
    let (mut astart, mut aend, mut bstart, mut bend) = (none, 0, 0, 0);
    let (mut i, mut j) = (a.len(), b.len());
    while i > 0 && j > 0 {
        let mut emit = false;
        if a[i - 1] == b[j - 1] {
            result[idx - 1] = a[i - 1];
            if astart == none {
                (astart, aend, bstart, bend) = (i - 1, i - 1, j - 1, j - 1);
            } else if astart == i && bstart == j {
                // Contiguous: the range grows backwards.
                astart -= 1;
                bstart -= 1;
            } else {
                emit = true;
            }
            if astart == 0 || bstart == 0 {
                emit = true;
            }
            idx -= 1;
            i -= 1;
            j -= 1;
        } else {
            if dp[(i - 1) * width + j] > dp[i * width + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            if astart != none {
                emit = true;
            }
        }
        if emit {
            let len = (aend - astart + 1) as u64;
            if minmatchlen == 0 || len >= minmatchlen {
                matches.push([astart as u64, aend as u64, bstart as u64, bend as u64, len]);
            }
            astart = none;
        }
    }
    if !getidx {
        out.bulk(&result);
        return Ok(());
    }
    out.map(2);
    out.bulk(b"matches");
    out.array(matches.len());
    for [astart, aend, bstart, bend, len] in matches {
        out.array(2 + usize::from(withmatchlen));
        out.array(2);
        out.int(astart as i64);
        out.int(aend as i64);
        out.array(2);
        out.int(bstart as i64);
        out.int(bend as i64);
        if withmatchlen {
            out.int(len as i64);
        }
    }
    out.bulk(b"len");
    out.int(i64::from(total));
    Ok(())
}
