//! RESP request parsing: multibulk frames (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`), inline commands
//! (`GET k\r\n`, typed by hand) and pipelines of either.
//!
//! The parser is a pure function over a byte slice: it either finds one whole request at the
//! start of the buffer, says how many bytes it still needs, or reports the protocol error that
//! Redis reports for the same bytes, with the same text. It never allocates more than the
//! argument list of one request, and it never looks inside a bulk string body, so re-parsing a
//! request that arrives in pieces costs only its header lines.
//!
//! It deliberately mirrors Redis's `processMultibulkBuffer` / `processInlineBuffer`, quirks
//! included: the two bytes after a bulk body are skipped without being checked, a multibulk
//! count of zero or less is an empty request, and an inline line may end in `\n` alone.

use std::ops::Range;

/// Longest header line (`*<count>` / `$<len>`) or inline request, as in Redis
/// (`PROTO_INLINE_MAX_SIZE`).
pub const INLINE_BYTES_MAX: usize = 64 * 1024;

/// Largest multibulk count and bulk length a client may send before it has authenticated, as in
/// Redis: an unauthenticated client cannot make the server buffer much.
pub const UNAUTHENTICATED_ARGS_MAX: i64 = 10;
/// See [`UNAUTHENTICATED_ARGS_MAX`].
pub const UNAUTHENTICATED_BULK_BYTES_MAX: i64 = 16 * 1024;

/// How many argument slots are reserved up front, whatever count the header claims: the
/// arguments must arrive before they take memory.
const ARGS_PREALLOCATED_MAX: usize = 1024;

/// Limits that apply to one parse.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest bulk string accepted (`proto-max-bulk-len`).
    pub bulk_bytes_max: i64,
    /// Whether the client has authenticated (or no password is required).
    pub authenticated: bool,
}

/// One step of parsing.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A request: argument byte ranges inside the buffer, and how many bytes it used.
    Request {
        /// Each argument as a range of the parsed buffer.
        args: Vec<Range<usize>>,
        /// Bytes consumed from the start of the buffer.
        consumed: usize,
    },
    /// Bytes that carry no request (an empty line, `*0`); drop them and go on.
    Skip {
        /// Bytes to drop.
        consumed: usize,
    },
    /// The buffer holds only the beginning of a request.
    Incomplete {
        /// The total buffer length needed before parsing can make progress, when known.
        needed: Option<usize>,
    },
}

/// A malformed request. Redis replies with the error and closes the connection; so does keel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// A multibulk count line longer than [`INLINE_BYTES_MAX`].
    #[error("Protocol error: too big mbulk count string")]
    MbulkCountTooBig,
    /// A multibulk count that is not an integer or exceeds `i32::MAX`.
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    /// More than [`UNAUTHENTICATED_ARGS_MAX`] arguments before authentication.
    #[error("Protocol error: unauthenticated multibulk length")]
    UnauthenticatedMultibulkLength,
    /// A bulk length line longer than [`INLINE_BYTES_MAX`].
    #[error("Protocol error: too big bulk count string")]
    BulkCountTooBig,
    /// An element of a multibulk request that is not a bulk string.
    #[error("Protocol error: expected '$', got '{}'", char::from(*.0))]
    ExpectedDollar(u8),
    /// A bulk length that is not an integer, is negative, or exceeds `proto-max-bulk-len`.
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    /// A bulk longer than [`UNAUTHENTICATED_BULK_BYTES_MAX`] before authentication.
    #[error("Protocol error: unauthenticated bulk length")]
    UnauthenticatedBulkLength,
    /// An inline request longer than [`INLINE_BYTES_MAX`].
    #[error("Protocol error: too big inline request")]
    InlineTooBig,
    /// An inline request with an unterminated quote.
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
}

/// Parses the request at the start of `buf`.
///
/// Inline requests are returned as ranges too: their arguments are unquoted into
/// `unquoted`, and `args` then index into `unquoted` instead of `buf` (see [`Request`]).
pub fn parse(buf: &[u8], limits: Limits) -> Result<Request, ProtoError> {
    let mut args = Vec::new();
    let mut request = parse_into(buf, limits, &mut args)?;
    if let Request::Parsed(Parsed::Request { args: ranges, .. }) = &mut request {
        *ranges = args;
    }
    Ok(request)
}

/// [`parse`] for a caller that parses request after request: a multibulk request's argument
/// ranges go into `args` (cleared first), and the `args` of the `Parsed::Request` returned
/// is empty. A connection passes the same vector every time, so that parsing allocates
/// nothing once it has seen its widest request.
pub fn parse_into(
    buf: &[u8],
    limits: Limits,
    args: &mut Vec<Range<usize>>,
) -> Result<Request, ProtoError> {
    args.clear();
    match buf.first() {
        None => Ok(Request::Parsed(Parsed::Incomplete { needed: None })),
        Some(b'*') => parse_multibulk(buf, limits, args).map(Request::Parsed),
        Some(_) => parse_inline(buf),
    }
}

/// What [`parse`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// A multibulk request (or a skip / incomplete): ranges index into the parsed buffer.
    Parsed(Parsed),
    /// An inline request: its arguments, unquoted, and the bytes it used.
    Inline {
        /// The arguments.
        args: Vec<Vec<u8>>,
        /// Bytes consumed from the start of the buffer.
        consumed: usize,
    },
}

fn find_cr(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .iter()
        .position(|&b| b == b'\r')
        .map(|i| i + from)
}

fn parse_multibulk(
    buf: &[u8],
    limits: Limits,
    args: &mut Vec<Range<usize>>,
) -> Result<Parsed, ProtoError> {
    let Some(cr) = find_cr(buf, 0) else {
        if buf.len() > INLINE_BYTES_MAX {
            return Err(ProtoError::MbulkCountTooBig);
        }
        return Ok(Parsed::Incomplete { needed: None });
    };
    if cr + 1 >= buf.len() {
        // Redis waits for the byte after '\r' before it trusts the line.
        return Ok(Parsed::Incomplete {
            needed: Some(cr + 2),
        });
    }
    let count = match string_to_i64(&buf[1..cr]) {
        Some(n) if n <= i64::from(i32::MAX) => n,
        _ => return Err(ProtoError::InvalidMultibulkLength),
    };
    if count > UNAUTHENTICATED_ARGS_MAX && !limits.authenticated {
        return Err(ProtoError::UnauthenticatedMultibulkLength);
    }
    let mut pos = cr + 2;
    if count <= 0 {
        return Ok(Parsed::Skip { consumed: pos });
    }
    let count = usize::try_from(count).expect("count is positive and below i32::MAX");
    args.reserve(count.min(ARGS_PREALLOCATED_MAX));
    for _ in 0..count {
        let Some(cr) = find_cr(buf, pos) else {
            if buf.len() - pos > INLINE_BYTES_MAX {
                return Err(ProtoError::BulkCountTooBig);
            }
            return Ok(Parsed::Incomplete { needed: None });
        };
        if cr + 1 >= buf.len() {
            return Ok(Parsed::Incomplete {
                needed: Some(cr + 2),
            });
        }
        if buf[pos] != b'$' {
            return Err(ProtoError::ExpectedDollar(buf[pos]));
        }
        let len = match string_to_i64(&buf[pos + 1..cr]) {
            Some(n) if n >= 0 && n <= limits.bulk_bytes_max => n,
            _ => return Err(ProtoError::InvalidBulkLength),
        };
        if len > UNAUTHENTICATED_BULK_BYTES_MAX && !limits.authenticated {
            return Err(ProtoError::UnauthenticatedBulkLength);
        }
        let len = usize::try_from(len).expect("bulk length is non-negative and bounded");
        let start = cr + 2;
        let end = start + len;
        if buf.len() < end + 2 {
            return Ok(Parsed::Incomplete {
                needed: Some(end + 2),
            });
        }
        args.push(start..end);
        pos = end + 2;
    }
    Ok(Parsed::Request {
        args: Vec::new(),
        consumed: pos,
    })
}

fn parse_inline(buf: &[u8]) -> Result<Request, ProtoError> {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > INLINE_BYTES_MAX {
            return Err(ProtoError::InlineTooBig);
        }
        return Ok(Request::Parsed(Parsed::Incomplete { needed: None }));
    };
    let mut line = &buf[..nl];
    if let Some(stripped) = line.strip_suffix(b"\r") {
        line = stripped;
    }
    let args = split_args(line).ok_or(ProtoError::UnbalancedQuotes)?;
    if args.is_empty() {
        return Ok(Request::Parsed(Parsed::Skip { consumed: nl + 1 }));
    }
    Ok(Request::Inline {
        args,
        consumed: nl + 1,
    })
}

/// Redis's `string2ll`: an optional `-`, then decimal digits without leading zeros (except
/// `0` itself), fitting in an `i64`. No `+`, no spaces.
pub fn string_to_i64(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    match digits {
        [] => return None,
        [b'0'] => return if negative { None } else { Some(0) },
        [b'0', ..] => return None,
        _ => {}
    }
    let mut value: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let digit = i64::from(d - b'0');
        value = if negative {
            value.checked_mul(10)?.checked_sub(digit)?
        } else {
            value.checked_mul(10)?.checked_add(digit)?
        };
    }
    Some(value)
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t' | 0x0b | 0x0c)
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Redis's `sdssplitargs`: whitespace-separated words, `"..."` with C escapes (`\n`, `\xHH`,
/// ...) and `'...'` with only `\'`. A closing quote must be followed by a space or the end.
/// `None` when quotes are unbalanced.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && is_space(line[i]) {
            i += 1;
        }
        if i >= line.len() {
            return Some(args);
        }
        let mut current = Vec::new();
        let mut in_double = false;
        let mut in_single = false;
        loop {
            if in_double {
                let c = *line.get(i)?;
                if c == b'\\'
                    && line.get(i + 1) == Some(&b'x')
                    && let (Some(h), Some(l)) = (
                        line.get(i + 2).copied().and_then(hex_digit),
                        line.get(i + 3).copied().and_then(hex_digit),
                    )
                {
                    current.push(h * 16 + l);
                    i += 4;
                    continue;
                }
                if c == b'\\' && i + 1 < line.len() {
                    i += 1;
                    current.push(match line[i] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    });
                } else if c == b'"' {
                    // The closing quote must be followed by a space or the end.
                    if i + 1 < line.len() && !is_space(line[i + 1]) {
                        return None;
                    }
                    in_double = false;
                    i += 1;
                    break;
                } else {
                    current.push(c);
                }
                i += 1;
            } else if in_single {
                let c = *line.get(i)?;
                if c == b'\\' && line.get(i + 1) == Some(&b'\'') {
                    i += 1;
                    current.push(b'\'');
                } else if c == b'\'' {
                    if i + 1 < line.len() && !is_space(line[i + 1]) {
                        return None;
                    }
                    in_single = false;
                    i += 1;
                    break;
                } else {
                    current.push(c);
                }
                i += 1;
            } else {
                match line.get(i) {
                    None => break,
                    Some(&c) if is_space(c) => break,
                    Some(b'"') => in_double = true,
                    Some(b'\'') => in_single = true,
                    Some(&c) => current.push(c),
                }
                i += 1;
            }
        }
        debug_assert!(!in_double && !in_single);
        args.push(current);
    }
}

#[cfg(test)]
mod tests;
