//! Keys to hash slots, exactly as Redis Cluster computes them: CRC16/XMODEM (polynomial 0x1021,
//! initial value 0, no reflection) of the key, or of its hash tag, modulo 16384.
//!
//! The hash tag is the part between the first `{` and the first `}` after it, if that part is
//! not empty; `{user1000}.following` and `{user1000}.followers` then share a slot. Redis'
//! rules exactly: `foo{}{bar}` hashes whole (the first tag is empty), `foo{{bar}}` hashes
//! `{bar`, `foo{bar}{zap}` hashes `bar`.

/// Hash slots in a cluster (Redis' `CLUSTER_SLOTS`).
pub const SLOTS: u16 = 16384;
const _: () = assert!(SLOTS.is_power_of_two());

/// A hash slot, `0..SLOTS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(pub u16);

impl std::fmt::Display for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// CRC16/XMODEM lookup table, built at compile time.
static TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC16/XMODEM of `bytes` (Redis' `crc16`).
pub fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ TABLE[usize::from(((crc >> 8) as u8) ^ b)]
    })
}

/// The part of `key` that is hashed: its hash tag if it has a non-empty one, else all of it.
pub fn hashed_part(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// The slot `key` belongs to (Redis' `keyHashSlot`).
pub fn key_slot(key: &[u8]) -> Slot {
    Slot(crc16(hashed_part(key)) & (SLOTS - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_check_value() {
        // The CRC catalogue's check value for CRC-16/XMODEM, and Redis' own test vector.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn slots_match_redis() {
        // Every value here was read from `CLUSTER KEYSLOT` of a redis-server 7.0.
        for (key, slot) in [
            (&b"123456789"[..], 12739),
            (b"foo", 12182),
            (b"{user1000}.following", 3443),
            (b"{user1000}.followers", 3443),
            (b"{}foo", 9500),
            (b"foo{}{bar}", 8363),
        ] {
            assert_eq!(
                key_slot(key),
                Slot(slot),
                "{}",
                String::from_utf8_lossy(key)
            );
        }
    }

    #[test]
    fn hash_tags_follow_redis_rules() {
        assert_eq!(hashed_part(b"{user1000}.following"), b"user1000");
        assert_eq!(hashed_part(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hashed_part(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hashed_part(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hashed_part(b"foo{bar"), b"foo{bar");
        assert_eq!(hashed_part(b"}foo{"), b"}foo{");
        assert_eq!(hashed_part(b""), b"");
        assert_eq!(key_slot(b"a{x}b"), key_slot(b"x"));
    }

    #[test]
    fn every_slot_is_in_range() {
        for i in 0u32..100_000 {
            assert!(key_slot(i.to_string().as_bytes()).0 < SLOTS);
        }
    }
}
