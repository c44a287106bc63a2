//! The slow log (`SLOWLOG GET|LEN|RESET|HELP`), as Redis keeps it: every command that took
//! at least `slowlog-log-slower-than` microseconds (10 000 by default; 0 logs every command, a
//! negative value none) goes in, newest first, up to `slowlog-max-len` entries (128), each
//! with an id, its Unix time, its duration, its arguments (at most 32, each cut at 128
//! bytes, as Redis cuts them), and the client's address and name.
//!
//! The duration is the one the connection already measures for its latency figures: a
//! command's own, or, for a pipelined run of commands that keel executes as one transaction
//! (`conn.rs`, `run_pending`), the run's, entered under its first command with a last
//! argument saying how many more ran with it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::data::Fail;
use crate::reply::Out;

/// Redis' default `slowlog-log-slower-than`, in microseconds.
pub const SLOWER_THAN_US_DEFAULT: i64 = 10_000;
/// Redis' default `slowlog-max-len`.
pub const MAX_LEN_DEFAULT: usize = 128;
/// Arguments an entry keeps (the last one kept says how many more there were).
const ARGS_MAX: usize = 32;
/// Bytes of one argument an entry keeps.
const ARG_BYTES_MAX: usize = 128;

/// One logged command.
#[derive(Debug, Clone)]
struct Entry {
    id: u64,
    unix_s: i64,
    micros: u64,
    args: Vec<Bytes>,
    addr: String,
    name: String,
}

/// The server's slow log.
pub struct SlowLog {
    slower_than_us: AtomicI64,
    max_len: AtomicUsize,
    inner: Mutex<(u64, VecDeque<Entry>)>,
}

impl Default for SlowLog {
    fn default() -> SlowLog {
        SlowLog {
            slower_than_us: AtomicI64::new(SLOWER_THAN_US_DEFAULT),
            max_len: AtomicUsize::new(MAX_LEN_DEFAULT),
            inner: Mutex::new((0, VecDeque::new())),
        }
    }
}

impl SlowLog {
    /// Whether a command that took `elapsed` goes in.
    #[inline]
    pub fn is_slow(&self, elapsed: Duration) -> bool {
        let threshold = self.slower_than_us.load(Relaxed);
        threshold >= 0 && elapsed.as_micros() >= threshold as u128
    }

    /// Whether any command could go in (a negative threshold logs none).
    #[inline]
    pub fn enabled(&self) -> bool {
        self.slower_than_us.load(Relaxed) >= 0
    }

    /// Enters a command (`args`) that took `elapsed`, run with `more` others in one
    /// transaction, from the client at `addr` named `name`.
    pub fn record(
        &self,
        elapsed: Duration,
        args: &[Bytes],
        more: usize,
        addr: String,
        name: String,
    ) {
        let max_len = self.max_len.load(Relaxed);
        if max_len == 0 {
            return;
        }
        let mut kept: Vec<Bytes> = Vec::with_capacity(args.len().min(ARGS_MAX) + 1);
        let room = if args.len() > ARGS_MAX {
            ARGS_MAX - 1
        } else {
            args.len()
        };
        for a in &args[..room] {
            if a.len() > ARG_BYTES_MAX {
                let mut cut = a[..ARG_BYTES_MAX].to_vec();
                cut.extend_from_slice(
                    format!("... ({} more bytes)", a.len() - ARG_BYTES_MAX).as_bytes(),
                );
                kept.push(Bytes::from(cut));
            } else {
                kept.push(a.clone());
            }
        }
        if args.len() > ARGS_MAX {
            kept.push(Bytes::from(format!(
                "... ({} more arguments)",
                args.len() - room
            )));
        }
        if more > 0 {
            kept.push(Bytes::from(format!(
                "(and {more} more pipelined commands in one transaction)"
            )));
        }
        let unix_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let mut inner = self.inner.lock();
        let id = inner.0;
        inner.0 += 1;
        inner.1.push_front(Entry {
            id,
            unix_s,
            micros: elapsed.as_micros().min(u128::from(u64::MAX)) as u64,
            args: kept,
            addr,
            name,
        });
        inner.1.truncate(max_len);
    }

    /// `CONFIG GET`'s values.
    pub fn slower_than_us(&self) -> i64 {
        self.slower_than_us.load(Relaxed)
    }

    pub fn max_len(&self) -> usize {
        self.max_len.load(Relaxed)
    }

    /// `CONFIG SET slowlog-log-slower-than`.
    pub fn set_slower_than_us(&self, us: i64) {
        self.slower_than_us.store(us, Relaxed);
    }

    /// `CONFIG SET slowlog-max-len`: a shorter length drops the oldest entries now.
    pub fn set_max_len(&self, len: usize) {
        self.max_len.store(len, Relaxed);
        self.inner.lock().1.truncate(len);
    }
}

/// `SLOWLOG <subcommand>` (the table has checked the subcommand and its arity).
pub fn command(log: &SlowLog, sub: &str, args: &[Bytes], out: &mut Out<'_>) -> Result<(), Fail> {
    match sub {
        "get" => {
            if args.len() > 3 {
                let given = &args[1][..args[1].len().min(128)];
                return Err(format!(
                    "ERR unknown subcommand or wrong number of arguments for '{}'. Try SLOWLOG \
                     HELP.",
                    String::from_utf8_lossy(given)
                )
                .into());
            }
            let count = match args.get(2) {
                None => 10,
                Some(a) => match crate::resp::string_to_i64(a) {
                    Some(-1) => usize::MAX,
                    Some(n) if n >= 0 => n as usize,
                    _ => return Err("ERR count should be greater than or equal to -1".into()),
                },
            };
            let entries: Vec<Entry> = log.inner.lock().1.iter().take(count).cloned().collect();
            out.array(entries.len());
            for e in entries {
                out.array(6);
                out.int(e.id as i64);
                out.int(e.unix_s);
                out.int(e.micros as i64);
                out.array(e.args.len());
                for a in &e.args {
                    out.bulk(a);
                }
                out.bulk(e.addr.as_bytes());
                out.bulk(e.name.as_bytes());
            }
        }
        "len" => out.int(log.inner.lock().1.len() as i64),
        "reset" => {
            log.inner.lock().1.clear();
            out.ok();
        }
        _ => {
            let lines = [
                "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "GET [<count>]",
                "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
                "    Entries are made of:",
                "    id, timestamp, time in microseconds, arguments array, client IP and port,",
                "    client name",
                "LEN",
                "    Return the length of the slowlog.",
                "RESET",
                "    Reset the slowlog.",
                "HELP",
                "    Prints this help.",
            ];
            out.help(&lines);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<Bytes> {
        a.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    /// Entries go in newest first, up to the length; long arguments and argument lists are
    /// cut as Redis cuts them; the threshold decides what is slow.
    #[test]
    fn entries_are_kept_newest_first_and_cut_as_redis_cuts_them() {
        let log = SlowLog::default();
        assert!(!log.is_slow(Duration::from_millis(9)));
        assert!(log.is_slow(Duration::from_millis(10)));
        log.set_slower_than_us(-1);
        assert!(!log.is_slow(Duration::from_secs(100)));
        log.set_max_len(2);
        for i in 0..3 {
            log.record(
                Duration::from_micros(i),
                &args(&["SET", &format!("k{i}"), "v"]),
                0,
                "127.0.0.1:1".into(),
                String::new(),
            );
        }
        let inner = log.inner.lock();
        assert_eq!(inner.1.len(), 2);
        assert_eq!(inner.1[0].id, 2);
        assert_eq!(inner.1[1].args[1], "k1");
        drop(inner);
        let long = "x".repeat(200);
        let many: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        let mut cmd = vec!["MSET"];
        cmd.extend(many.iter().map(String::as_str));
        log.record(Duration::ZERO, &args(&cmd), 3, String::new(), String::new());
        log.record(
            Duration::ZERO,
            &args(&["SET", "k", &long]),
            0,
            String::new(),
            String::new(),
        );
        let inner = log.inner.lock();
        let cut = &inner.1[0].args[2];
        assert_eq!(cut.len(), 128 + "... (72 more bytes)".len());
        assert!(cut.ends_with(b"... (72 more bytes)"));
        let listed = &inner.1[1].args;
        assert_eq!(listed.len(), 33);
        assert_eq!(listed[31], "... (10 more arguments)");
        assert_eq!(
            listed[32],
            "(and 3 more pipelined commands in one transaction)"
        );
    }
}
