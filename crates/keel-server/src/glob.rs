//! Redis glob patterns (`KEYS`, `SCAN MATCH`, `CONFIG GET`): `*`, `?`, `[abc]`, `[^a-z]` and
//! `\` escapes. Iterative, so a pattern of many stars cannot exhaust the stack, and linear in
//! practice (one backtrack point, the last star).

/// Whether `text` matches `pattern`.
pub fn matches(pattern: &[u8], text: &[u8]) -> bool {
    if text.is_empty() {
        // Redis's matcher never matches an empty string with a non-empty pattern, but
        // `KEYS *` and `SCAN MATCH *` skip the matcher and list the empty key too.
        return pattern.is_empty() || pattern == b"*";
    }
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    while p < pattern.len() && pattern[p] == b'*' {
                        p += 1;
                    }
                    if p == pattern.len() {
                        return true;
                    }
                    star = Some((p, t));
                    continue;
                }
                _ => {
                    if let Some(next_p) = single(pattern, p, text[t]) {
                        p = next_p;
                        t += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, st)) => {
                p = sp;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches one pattern element at `p` against `c`; the index after the element on success.
fn single(pattern: &[u8], p: usize, c: u8) -> Option<usize> {
    match pattern[p] {
        b'?' => Some(p + 1),
        b'\\' if p + 1 < pattern.len() => (pattern[p + 1] == c).then_some(p + 2),
        b'[' => {
            let mut i = p + 1;
            let negate = pattern.get(i) == Some(&b'^');
            if negate {
                i += 1;
            }
            let mut hit = false;
            while i < pattern.len() && pattern[i] != b']' {
                if pattern[i] == b'\\' && i + 1 < pattern.len() {
                    hit |= pattern[i + 1] == c;
                    i += 2;
                } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' {
                    // As in Redis, also when the range ends in `]`: `[a-]` is `]` to `a`.
                    let (lo, hi) = (
                        pattern[i].min(pattern[i + 2]),
                        pattern[i].max(pattern[i + 2]),
                    );
                    hit |= (lo..=hi).contains(&c);
                    i += 3;
                } else {
                    hit |= pattern[i] == c;
                    i += 1;
                }
            }
            // An unterminated class ends at the end of the pattern, as in Redis.
            let end = if i < pattern.len() { i + 1 } else { i };
            (hit != negate).then_some(end)
        }
        other => (other == c).then_some(p + 1),
    }
}

/// The literal prefix every match of `pattern` starts with: lets `KEYS user:*` scan only the
/// `user:` range of the ordered index.
pub fn literal_prefix(pattern: &[u8]) -> Vec<u8> {
    let mut prefix = Vec::new();
    let mut i = 0;
    while i < pattern.len() {
        match pattern[i] {
            b'*' | b'?' | b'[' => break,
            b'\\' if i + 1 < pattern.len() => {
                prefix.push(pattern[i + 1]);
                i += 2;
            }
            b'\\' => break,
            c => {
                prefix.push(c);
                i += 1;
            }
        }
    }
    prefix
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_patterns() {
        let yes: &[(&str, &str)] = &[
            ("*", ""),
            ("*", "abc"),
            ("h?llo", "hello"),
            ("h*llo", "heeeello"),
            ("h[ae]llo", "hallo"),
            ("h[^e]llo", "hallo"),
            ("h[a-b]llo", "hbllo"),
            ("h[b-a]llo", "hallo"),
            ("a*b*c", "axxbyyc"),
            ("\\*", "*"),
            ("user:*", "user:1"),
            ("*a", "aaaa"),
            ("", ""),
            ("[a-]", "_"),
            ("[a-]", "]"),
        ];
        for (p, t) in yes {
            assert!(matches(p.as_bytes(), t.as_bytes()), "{p} should match {t}");
        }
        let no: &[(&str, &str)] = &[
            ("h?llo", "hllo"),
            ("h[^e]llo", "hello"),
            ("h[a-b]llo", "hcllo"),
            ("a*b*c", "axxbyy"),
            ("\\*", "a"),
            ("abc", "abcd"),
            ("**", ""),
            ("?", ""),
            ("[a-]", "b"),
        ];
        for (p, t) in no {
            assert!(
                !matches(p.as_bytes(), t.as_bytes()),
                "{p} should not match {t}"
            );
        }
    }

    #[test]
    fn many_stars_are_cheap() {
        let pattern = "*a".repeat(10_000);
        assert!(!matches(pattern.as_bytes(), "b".repeat(100).as_bytes()));
    }

    #[test]
    fn prefixes() {
        assert_eq!(literal_prefix(b"user:*"), b"user:");
        assert_eq!(literal_prefix(b"a\\*b?"), b"a*b");
        assert_eq!(literal_prefix(b"*"), b"");
    }
}
