//! Reply encoding for RESP2 and RESP3.
//!
//! Commands write replies straight into the connection's output buffer through [`Out`], which
//! knows the protocol the client chose with `HELLO` and picks the encoding: a RESP3 map is a flat
//! RESP2 array, a RESP3 null is `$-1` (or `*-1` for a null array), verbatim text is a bulk string.

use bytes::{BufMut, BytesMut};
use keel::{Committed, Ticket};

/// The protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// RESP2, the default.
    Resp2,
    /// RESP3, after `HELLO 3`.
    Resp3,
}

impl Proto {
    /// The number `HELLO` takes and reports.
    pub fn version(self) -> i64 {
        match self {
            Proto::Resp2 => 2,
            Proto::Resp3 => 3,
        }
    }
}

/// A reply writer over an output buffer.
pub struct Out<'a> {
    /// The buffer replies are appended to.
    pub buf: &'a mut BytesMut,
    /// The protocol to encode for.
    pub proto: Proto,
    /// Replies known only once the transaction commits ([`Out::tracked`], [`Out::later`]):
    /// where each goes in `buf`, in order, and what it waits for.
    tickets: Vec<(usize, Slot)>,
}

/// A reply written after the commit.
enum Slot {
    /// An integer the engine computes at commit.
    Ticket(Ticket),
    /// A score the engine computes at commit ([`keel::Txn::score_add`]), a double reply.
    Score(Ticket),
    /// Whatever the caller of [`Out::fill_with`] writes for this number.
    Later(usize),
}

impl<'a> Out<'a> {
    /// A writer appending to `buf`.
    pub fn new(buf: &'a mut BytesMut, proto: Proto) -> Out<'a> {
        Out {
            buf,
            proto,
            tickets: Vec::new(),
        }
    }
}

impl Out<'_> {
    /// An integer reply that is the value behind `ticket`, written by [`Out::fill`] after the
    /// commit. The caller clears the pending ones ([`Out::forget_tracked`]) before it reuses
    /// the buffer for another attempt.
    pub fn tracked(&mut self, ticket: Ticket) {
        self.tickets.push((self.buf.len(), Slot::Ticket(ticket)));
    }

    /// A double reply that is the score behind `ticket` (a score add's sum), written by
    /// [`Out::fill`] after the commit, as [`Out::tracked`].
    pub fn tracked_score(&mut self, ticket: Ticket) {
        self.tickets.push((self.buf.len(), Slot::Score(ticket)));
    }

    /// A reply the caller writes after the commit: [`Out::fill_with`] calls its function
    /// with `n` where this reply goes (`EXEC` uses it for `PUBLISH`, whose message is sent
    /// only once the transaction committed).
    pub fn later(&mut self, n: usize) {
        self.tickets.push((self.buf.len(), Slot::Later(n)));
    }

    /// Whether some reply waits for the engine's commit ([`Out::tracked`]).
    pub fn has_tracked(&self) -> bool {
        self.tickets
            .iter()
            .any(|(_, slot)| matches!(slot, Slot::Ticket(_) | Slot::Score(_)))
    }

    /// Drops the replies waiting for a commit that will not happen.
    pub fn forget_tracked(&mut self) {
        self.tickets.clear();
    }

    /// Writes the replies that waited for `committed` where they belong. An integer's value is
    /// decimal text (what `add` stores), written as it is; a score is decoded and written as
    /// a double reply.
    ///
    /// The replies after the first waiting one are copied aside and written back around the
    /// values. Usually there are none (an increment, or a pipeline of them, writes nothing
    /// else), and the copy is empty. A copy, not `BytesMut::split_off`, which would give the
    /// buffer's spare capacity to the split-off part and turn the connection's output buffer
    /// into a reference-counted one, so that the very next write reserves again.
    pub fn fill(&mut self, committed: &Committed) {
        self.fill_with(Some(committed), &mut |_, _| {
            unreachable!("only EXEC defers replies, and it fills them itself")
        });
    }

    /// [`Out::fill`], also writing each [`Out::later`] reply with `later`. Without a commit
    /// (the transaction rolled back) only `later` replies may wait.
    pub fn fill_with(
        &mut self,
        committed: Option<&Committed>,
        later: &mut dyn FnMut(usize, &mut Out<'_>),
    ) {
        let Some(&(first, _)) = self.tickets.first() else {
            return;
        };
        let tail = self.buf[first..].to_vec();
        self.buf.truncate(first);
        let mut from = first;
        for (at, slot) in std::mem::take(&mut self.tickets) {
            self.buf.put_slice(&tail[from - first..at - first]);
            match slot {
                Slot::Ticket(ticket) => {
                    let value = committed
                        .expect("an increment's reply waits for a commit")
                        .value(ticket)
                        .expect("an add leaves a value");
                    self.line(b':', value);
                }
                Slot::Score(ticket) => {
                    let score = committed
                        .expect("an increment's reply waits for a commit")
                        .value(ticket)
                        .and_then(keel::decode_score_value)
                        .expect("a score add leaves a score");
                    self.double(score);
                }
                Slot::Later(n) => later(n, self),
            }
            from = at;
        }
        self.buf.put_slice(&tail[from - first..]);
    }

    fn line(&mut self, prefix: u8, body: &[u8]) {
        self.buf.reserve(body.len() + 3);
        self.buf.put_u8(prefix);
        self.buf.put_slice(body);
        self.buf.put_slice(b"\r\n");
    }

    fn number(&mut self, prefix: u8, n: i64) {
        let mut digits = itoa_buf(n);
        self.line(prefix, digits.as_bytes_mut());
    }

    /// `+OK`-style status reply. `text` must not contain CR or LF.
    pub fn simple(&mut self, text: &str) {
        debug_assert!(!text.contains(['\r', '\n']));
        self.line(b'+', text.as_bytes());
    }

    /// A `HELP` subcommand's answer: its lines, an array of simple strings, as Redis sends it.
    pub fn help(&mut self, lines: &[&str]) {
        self.array(lines.len());
        for line in lines {
            self.simple(line);
        }
    }

    /// `+OK`.
    pub fn ok(&mut self) {
        self.buf.put_slice(b"+OK\r\n");
    }

    /// An error reply. `text` starts with the error code (`ERR`, `WRONGTYPE`, ...); CR and LF
    /// are replaced by spaces, as Redis does.
    pub fn error(&mut self, text: &str) {
        self.error_bytes(text.as_bytes());
    }

    /// An error reply from bytes that may not be UTF-8 (Redis quotes arguments as they came).
    pub fn error_bytes(&mut self, text: &[u8]) {
        let clean: Vec<u8> = text
            .iter()
            .map(|&c| if c == b'\r' || c == b'\n' { b' ' } else { c })
            .collect();
        self.line(b'-', &clean);
    }

    /// An integer reply.
    pub fn int(&mut self, n: i64) {
        self.number(b':', n);
    }

    /// A bulk string reply.
    pub fn bulk(&mut self, data: &[u8]) {
        self.number(
            b'$',
            i64::try_from(data.len()).expect("buffers are far below i64::MAX"),
        );
        self.buf.reserve(data.len() + 2);
        self.buf.put_slice(data);
        self.buf.put_slice(b"\r\n");
    }

    /// A double (`,` in RESP3, a bulk string in RESP2), printed as Redis prints one: C's
    /// `%.17g`, and `inf`/`-inf`.
    pub fn double(&mut self, x: f64) {
        // An integer (a sorted set's usual score) prints as `format_double` prints it,
        // without building a string: `-0` is left to it.
        if x.fract() == 0.0 && x.abs() < 1e17 && !(x == 0.0 && x.is_sign_negative()) {
            let mut digits = itoa_buf(x as i64);
            let text = digits.as_bytes_mut();
            match self.proto {
                Proto::Resp2 => self.bulk(text),
                Proto::Resp3 => self.line(b',', text),
            }
            return;
        }
        let text = format_double(x);
        match self.proto {
            Proto::Resp2 => self.bulk(text.as_bytes()),
            Proto::Resp3 => self.line(b',', text.as_bytes()),
        }
    }

    /// A bulk string, or the null reply for `None`.
    pub fn bulk_or_null(&mut self, data: Option<&[u8]>) {
        match data {
            Some(d) => self.bulk(d),
            None => self.null(),
        }
    }

    /// The null reply (`$-1` in RESP2, `_` in RESP3).
    pub fn null(&mut self) {
        match self.proto {
            Proto::Resp2 => self.buf.put_slice(b"$-1\r\n"),
            Proto::Resp3 => self.buf.put_slice(b"_\r\n"),
        }
    }

    /// The null array (`*-1` in RESP2, `_` in RESP3): what a failed `EXEC` returns.
    pub fn null_array(&mut self) {
        match self.proto {
            Proto::Resp2 => self.buf.put_slice(b"*-1\r\n"),
            Proto::Resp3 => self.buf.put_slice(b"_\r\n"),
        }
    }

    /// The header of an array of `n` elements; the elements follow.
    pub fn array(&mut self, n: usize) {
        self.number(
            b'*',
            i64::try_from(n).expect("lengths are far below i64::MAX"),
        );
    }

    /// The header of a push frame of `n` elements (an array in RESP2): pub/sub messages and
    /// (un)subscribe replies.
    pub fn push(&mut self, n: usize) {
        let prefix = match self.proto {
            Proto::Resp2 => b'*',
            Proto::Resp3 => b'>',
        };
        self.number(
            prefix,
            i64::try_from(n).expect("lengths are far below i64::MAX"),
        );
    }

    /// The header of a set of `n` elements (an array in RESP2).
    pub fn set(&mut self, n: usize) {
        let prefix = match self.proto {
            Proto::Resp2 => b'*',
            Proto::Resp3 => b'~',
        };
        self.number(
            prefix,
            i64::try_from(n).expect("lengths are far below i64::MAX"),
        );
    }

    /// The header of a map of `n` pairs (an array of `2n` elements in RESP2); keys and values
    /// follow, alternating.
    pub fn map(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => self.array(2 * n),
            Proto::Resp3 => self.number(
                b'%',
                i64::try_from(n).expect("lengths are far below i64::MAX"),
            ),
        }
    }

    /// A verbatim text reply (a bulk string in RESP2), as `INFO` and `CLIENT LIST` send.
    pub fn verbatim(&mut self, text: &str) {
        match self.proto {
            Proto::Resp2 => self.bulk(text.as_bytes()),
            Proto::Resp3 => {
                let len = text.len() + 4;
                self.number(b'=', i64::try_from(len).expect("text is small"));
                self.buf.put_slice(b"txt:");
                self.buf.put_slice(text.as_bytes());
                self.buf.put_slice(b"\r\n");
            }
        }
    }
}

/// `x` as C's `printf("%.17g")` prints it (17 significant digits, trailing zeros dropped,
/// exponent form below 1e-4 and from 1e17), with `inf`, `-inf` and `nan` as Redis writes them.
pub fn format_double(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // An integer below 10^17 has at most 17 digits and is exact: printed whole.
    if x.fract() == 0.0 && x.abs() < 1e17 {
        return (x as i64).to_string();
    }
    let sci = format!("{x:.16e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} writes an exponent");
    let exp: i32 = exp.parse().expect("{:e} writes a decimal exponent");
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..17).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.unsigned_abs())
    } else {
        let decimals = usize::try_from(16 - exp).expect("exp < 17");
        trim(&format!("{x:.decimals$}"))
    }
}

/// Decimal digits of `n` without allocating through `format!`.
fn itoa_buf(n: i64) -> ItoaBuf {
    let mut buf = ItoaBuf {
        bytes: [0; 20],
        start: 20,
    };
    let negative = n < 0;
    let mut v = n.unsigned_abs();
    loop {
        buf.start -= 1;
        buf.bytes[buf.start] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if negative {
        buf.start -= 1;
        buf.bytes[buf.start] = b'-';
    }
    buf
}

struct ItoaBuf {
    bytes: [u8; 20],
    start: usize,
}

impl ItoaBuf {
    fn as_bytes_mut(&mut self) -> &[u8] {
        &self.bytes[self.start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_print_as_redis_does() {
        for (x, text) in [
            (1.0, "1"),
            (1.5, "1.5"),
            (-2.25, "-2.25"),
            (0.1, "0.10000000000000001"),
            (1e-5, "1.0000000000000001e-05"),
            (123_456_789_012_345_678.0, "1.2345678901234568e+17"),
            (1e16, "10000000000000000"),
            (-123.0, "-123"),
            (9_007_199_254_740_993.0, "9007199254740992"),
            (99_999_999_999_999_984.0, "99999999999999984"),
            (1e17, "1e+17"),
            (5e-324, "4.9406564584124654e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (0.0001, "0.0001"),
            (3.0000000000000001, "3"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (-0.0, "-0"),
        ] {
            assert_eq!(format_double(x), text, "{x:?}");
            // The reply writes the same text, by its integer shortcut or not.
            for proto in [Proto::Resp2, Proto::Resp3] {
                let mut buf = bytes::BytesMut::new();
                Out::new(&mut buf, proto).double(x);
                let want = match proto {
                    Proto::Resp2 => format!("${}\r\n{text}\r\n", text.len()),
                    Proto::Resp3 => format!(",{text}\r\n"),
                };
                assert_eq!(&buf[..], want.as_bytes(), "{x:?} in {proto:?}");
            }
        }
    }

    #[test]
    fn encodings() {
        let mut buf = BytesMut::new();
        let mut out = Out::new(&mut buf, Proto::Resp2);
        out.int(i64::MIN);
        out.bulk(b"hi");
        out.null();
        out.map(1);
        assert_eq!(
            &buf[..],
            b":-9223372036854775808\r\n$2\r\nhi\r\n$-1\r\n*2\r\n"
        );
        let mut buf = BytesMut::new();
        let mut out = Out::new(&mut buf, Proto::Resp3);
        out.null();
        out.map(1);
        out.null_array();
        out.error("ERR a\r\nb");
        assert_eq!(&buf[..], b"_\r\n%1\r\n_\r\n-ERR a  b\r\n");
    }
}
