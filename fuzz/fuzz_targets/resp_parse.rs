//! Fuzzes the RESP request parser: any bytes, under tight and loose limits, fed whole and in
//! pieces. The parser must never panic, never claim more bytes than it was given, return
//! argument ranges inside the buffer, and give the same answer for a request whether it arrives
//! at once or byte by byte.

#![no_main]

use keel_server::resp::{INLINE_BYTES_MAX, Limits, Parsed, Request, parse};
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8], limits: Limits) -> Option<usize> {
    match parse(data, limits) {
        Ok(Request::Parsed(Parsed::Request { args, consumed })) => {
            assert!(consumed > 0 && consumed <= data.len());
            for r in args {
                assert!(r.start <= r.end && r.end <= consumed);
            }
            Some(consumed)
        }
        Ok(Request::Inline { args, consumed }) => {
            assert!(consumed > 0 && consumed <= data.len());
            assert!(!args.is_empty());
            Some(consumed)
        }
        Ok(Request::Parsed(Parsed::Skip { consumed })) => {
            assert!(consumed > 0 && consumed <= data.len());
            Some(consumed)
        }
        Ok(Request::Parsed(Parsed::Incomplete { needed })) => {
            if let Some(n) = needed {
                assert!(n > data.len());
            }
            None
        }
        Err(_) => None,
    }
}

fuzz_target!(|data: &[u8]| {
    for limits in [
        Limits { bulk_bytes_max: 1 << 20, authenticated: true },
        Limits { bulk_bytes_max: 16, authenticated: false },
    ] {
        // Walk a pipeline to the end.
        let mut rest = data;
        while let Some(used) = check(rest, limits) {
            let whole = parse(rest, limits);
            // Every proper prefix of a whole request is incomplete, never an error or a
            // different request (the parser must not decide early). Past INLINE_BYTES_MAX a
            // prefix without its line end is an error by design, as in Redis.
            for end in [0, used / 2, used.saturating_sub(1)] {
                if end < used && used <= INLINE_BYTES_MAX {
                    match parse(&rest[..end], limits) {
                        Ok(Request::Parsed(Parsed::Incomplete { .. })) => {}
                        other => panic!("prefix {end} of a {used}-byte request gave {other:?}, whole gave {whole:?}"),
                    }
                }
            }
            rest = &rest[used..];
        }
    }
});
