//! `INCRBYFLOAT`'s arithmetic, as Redis does it: in the platform's C `long double` (x87 80-bit
//! on x86-64, which Rust has no type for), operands read with `strtold`, the result written
//! with `%.17Lf` and its trailing zeros trimmed. Calling the C library Redis calls is what
//! gives the same digits: `10.5 + 0.1` is `10.6`, but `1000 + 10.7` is
//! `1010.69999999999999996`, hexadecimal operands (`0x10`) are read, and `1e308 + 1e308` is a
//! 309-digit number rather than an overflow. `HINCRBYFLOAT` adds the same way. The C side is
//! `csrc/long_double.c`.

/// Redis's `MAX_LONG_DOUBLE_CHARS`: the longest operand read, and room for any result.
const CHARS_MAX: usize = 5 * 1024;

unsafe extern "C" {
    fn keel_ld_classify(s: *const u8, len: usize) -> i32;
    fn keel_ld_incr(
        current: *const u8,
        current_len: usize,
        has_current: i32,
        incr: *const u8,
        incr_len: usize,
        out: *mut u8,
        out_cap: usize,
    ) -> std::ffi::c_long;
}

/// Why a sum failed; the command picks the error text (`INCRBYFLOAT` and `HINCRBYFLOAT`
/// word them differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The stored value is not a float.
    Current,
    /// The increment is not a float.
    Incr,
    /// The sum is infinite or not a number.
    NotFinite,
}

/// Whether `arg` is a float Redis accepts (`None` if not), and if so whether it is infinite.
pub fn is_infinite(arg: &[u8]) -> Option<bool> {
    // SAFETY: the C side reads `arg.len()` bytes from `arg`'s start, nothing else.
    match unsafe { keel_ld_classify(arg.as_ptr(), arg.len()) } {
        0 => None,
        kind => Some(kind == 2),
    }
}

/// The text Redis stores and replies for `current` (absent: 0) plus `incr`.
pub fn add(current: Option<&[u8]>, incr: &[u8]) -> Result<Vec<u8>, Error> {
    let mut out = vec![0u8; CHARS_MAX];
    let (ptr, len) = current.map_or((std::ptr::null(), 0), |c| (c.as_ptr(), c.len()));
    // SAFETY: every pointer comes with its slice's length and the C side reads only within
    // it; `out` has `CHARS_MAX` writable bytes, which the C side never writes past.
    let n = unsafe {
        keel_ld_incr(
            ptr,
            len,
            i32::from(current.is_some()),
            incr.as_ptr(),
            incr.len(),
            out.as_mut_ptr(),
            out.len(),
        )
    };
    match n {
        -2 => Err(Error::Current),
        -3 => Err(Error::Incr),
        n if n <= 0 => Err(Error::NotFinite),
        n => {
            out.truncate(usize::try_from(n).expect("a positive length"));
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incr(current: Option<&str>, by: &str) -> Result<String, Error> {
        add(current.map(str::as_bytes), by.as_bytes()).map(|v| String::from_utf8(v).expect("ASCII"))
    }

    #[test]
    fn sums_as_redis_prints_them() {
        assert_eq!(incr(Some("10.50"), "0.1").as_deref(), Ok("10.6"));
        assert_eq!(incr(Some("5.0e3"), "2.0e2").as_deref(), Ok("5200"));
        assert_eq!(incr(None, "0.1").as_deref(), Ok("0.1"));
        assert_eq!(incr(Some("-0"), "0").as_deref(), Ok("0"));
        assert_eq!(incr(Some("3"), "-3").as_deref(), Ok("0"));
        assert_eq!(
            incr(Some("9223372036854775808"), "0x10").as_deref(),
            Ok("9223372036854775824")
        );
        if cfg!(all(target_arch = "x86_64", target_os = "linux")) {
            // x87 extended precision shows through the 17 decimals, as in Redis.
            assert_eq!(
                incr(Some("10.6"), "1000.1").as_deref(),
                Ok("1010.69999999999999996")
            );
        }
    }

    #[test]
    fn refuses_what_redis_refuses() {
        for bad in [
            "", " 1", "1 ", "abc", "nan", "1e5000", "1e-5000", "1.0e", "1\u{0}", "\u{0}",
        ] {
            assert_eq!(incr(None, bad), Err(Error::Incr), "{bad:?}");
            assert_eq!(incr(Some(bad), "x"), Err(Error::Current), "{bad:?}");
            assert_eq!(is_infinite(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(incr(Some("inf"), "1"), Err(Error::NotFinite));
        assert_eq!(incr(Some("1"), "-inf"), Err(Error::NotFinite));
        assert_eq!(incr(Some("inf"), "-inf"), Err(Error::NotFinite));
        assert_eq!(incr(Some(&"1".repeat(CHARS_MAX)), "1"), Err(Error::Current));
        assert_eq!(is_infinite(b"-infinity"), Some(true));
        assert_eq!(is_infinite(b"1e4000"), Some(false));
    }
}
