//! Commutative operations: deltas buffered in a transaction and applied to whatever value is
//! committed when the transaction commits. They add no read dependency, so two transactions
//! that only apply them to the same key never conflict.
//!
//! Value encodings (all documented in the crate root and stable across versions):
//! - `add`, `max`, `min`: the value is a decimal `i64` in ASCII, as Redis stores integers. A
//!   missing key counts as 0 for `add` and as "no value" for `max`/`min`.
//! - ordered put: 8-byte big-endian order, then the payload. The write with the highest order
//!   wins; on equal orders the larger payload (bytewise) wins. The tie rule makes ordered put
//!   truly commutative — the result does not depend on the order of the writes — which is
//!   what lets a split record (`split`) apply it on per-core slices and merge them later.
//! - top-k: a sequence of entries, each an 8-byte big-endian score (`i64` with the sign bit
//!   flipped, so bytes sort like numbers), a 4-byte big-endian member length and the member.
//!   Entries are kept sorted by score, highest first, then by member; a member appears once,
//!   with its highest score; at most `k` entries are kept.
//! - score add: the value is a score, an `f64` in 8 order-preserving bytes ([`encode_score`],
//!   big-endian); a missing key counts as 0. The operation also keeps one index entry in
//!   step: the key `prefix ++ score ++ suffix` (empty value) exists for the score the key
//!   holds, so that the index orders its keys by score. The commit that resolves the add
//!   deletes the entry at the old score and writes the one at the new (`Txn::score_add`).

use crate::error::Error;
use crate::limits::{TOP_K_MAX, VALUE_BYTES_MAX};

/// One commutative operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Add(i64),
    Max(i64),
    Min(i64),
    OrderedPut {
        order: u64,
        value: Vec<u8>,
    },
    TopK {
        k: u32,
        score: i64,
        member: Vec<u8>,
    },
    /// Adds an `f64` (its bits) to a score, and moves the score's index entry
    /// `prefix ++ score ++ suffix` with it: `index` is the prefix and the suffix, one after
    /// the other, the prefix `split` bytes long.
    ScoreAdd {
        delta: u64,
        index: Vec<u8>,
        split: u32,
    },
}

impl Op {
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Op::Add(_) | Op::Max(_) | Op::Min(_) => 8,
            Op::OrderedPut { value, .. } => 8 + value.len(),
            Op::TopK { member, .. } => 12 + member.len(),
            // The key's 8 bytes, and the two index entries the commit writes.
            Op::ScoreAdd { index, .. } => 8 + 2 * (index.len() + 8),
        }
    }

    /// Whether this is a score add, which keeps an index entry in step with its value.
    pub(crate) fn moves_index(&self) -> bool {
        matches!(self, Op::ScoreAdd { .. })
    }

    /// A score add: `delta` added, the index entry `prefix ++ score ++ suffix` kept.
    pub(crate) fn score_add(delta: f64, prefix: &[u8], suffix: &[u8]) -> Op {
        let mut index = Vec::with_capacity(prefix.len() + suffix.len());
        index.extend_from_slice(prefix);
        index.extend_from_slice(suffix);
        Op::ScoreAdd {
            delta: delta.to_bits(),
            index,
            split: u32::try_from(prefix.len()).expect("keys are bounded"),
        }
    }

    /// A score add's index prefix and suffix.
    pub(crate) fn index_parts(&self) -> Option<(&[u8], &[u8])> {
        let Op::ScoreAdd { index, split, .. } = self else {
            return None;
        };
        Some(index.split_at(*split as usize))
    }

    /// Whether `key` could be an index entry of this score add: its prefix, 8 bytes, its
    /// suffix.
    pub(crate) fn indexes(&self, key: &[u8]) -> bool {
        let Some((prefix, suffix)) = self.index_parts() else {
            return false;
        };
        key.len() == prefix.len() + 8 + suffix.len()
            && key.starts_with(prefix)
            && key.ends_with(suffix)
    }

    /// Whether `range` could hold an index entry of this score add.
    pub(crate) fn index_overlaps(&self, range: &crate::store::KeyRange) -> bool {
        use std::ops::Bound;
        let (Some(first), Some(last)) = (self.index_key(&[0; 8]), self.index_key(&[0xff; 8]))
        else {
            return false;
        };
        let ends_before = match &range.hi {
            Bound::Included(h) => h.as_slice() < first.as_slice(),
            Bound::Excluded(h) => h.as_slice() <= first.as_slice(),
            Bound::Unbounded => false,
        };
        let starts_after = match &range.lo {
            Bound::Included(l) => l.as_slice() > last.as_slice(),
            Bound::Excluded(l) => l.as_slice() >= last.as_slice(),
            Bound::Unbounded => false,
        };
        !ends_before && !starts_after
    }

    /// The index entry a score add keeps for `value`, the score the key holds (its index
    /// spec: `None` for the other operations).
    pub(crate) fn index_key(&self, value: &[u8]) -> Option<crate::txn::WriteKey> {
        let (prefix, suffix) = self.index_parts()?;
        let mut key =
            crate::txn::WriteKey::with_capacity(prefix.len() + value.len() + suffix.len());
        key.extend_from_slice(prefix);
        key.extend_from_slice(value);
        key.extend_from_slice(suffix);
        Some(key)
    }

    /// Applies the operation to `current` (`None`: the key is absent) and returns the new
    /// value.
    pub(crate) fn apply(&self, key: &[u8], current: Option<&[u8]>) -> Result<Vec<u8>, Error> {
        match self {
            Op::Add(delta) => {
                let base = current.map(|v| parse_int(key, v)).transpose()?.unwrap_or(0);
                let sum = base
                    .checked_add(*delta)
                    .ok_or_else(|| Error::Overflow { key: key.to_vec() })?;
                Ok(sum.to_string().into_bytes())
            }
            Op::Max(n) | Op::Min(n) => {
                let result = match current.map(|v| parse_int(key, v)).transpose()? {
                    None => *n,
                    Some(base) if matches!(self, Op::Max(_)) => base.max(*n),
                    Some(base) => base.min(*n),
                };
                Ok(result.to_string().into_bytes())
            }
            Op::OrderedPut { order, value } => {
                if let Some(current) = current {
                    let (current_order, current_payload) = decode_ordered(current)
                        .ok_or_else(|| Error::NotOrdered { key: key.to_vec() })?;
                    if (current_order, current_payload) >= (*order, value.as_slice()) {
                        return Ok(current.to_vec());
                    }
                }
                Ok(encode_ordered(*order, value))
            }
            Op::TopK { k, score, member } => {
                let mut entries = match current {
                    Some(v) => {
                        decode_top_k(v).ok_or_else(|| Error::NotATopK { key: key.to_vec() })?
                    }
                    None => Vec::new(),
                };
                match entries.iter_mut().find(|(_, m)| m == member) {
                    Some(entry) => entry.0 = entry.0.max(*score),
                    None => entries.push((*score, member.clone())),
                }
                entries.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
                entries.truncate(*k as usize);
                let encoded = encode_top_k(&entries);
                if encoded.len() > VALUE_BYTES_MAX {
                    return Err(Error::LimitExceeded {
                        limit: crate::Limit::ValueBytes,
                        requested: encoded.len(),
                    });
                }
                Ok(encoded)
            }
            Op::ScoreAdd { delta, .. } => {
                let base = match current {
                    None => 0.0,
                    Some(v) => decode_score_value(v)
                        .ok_or_else(|| Error::NotAScore { key: key.to_vec() })?,
                };
                let sum = base + f64::from_bits(*delta);
                if sum.is_nan() {
                    return Err(Error::NotANumber { key: key.to_vec() });
                }
                Ok(encode_score(sum).to_be_bytes().to_vec())
            }
        }
    }

    /// Checks the operation's own arguments (not the value it will meet).
    pub(crate) fn check(&self) -> Result<(), Error> {
        match self {
            Op::TopK { k, .. } if *k > TOP_K_MAX || *k == 0 => Err(Error::LimitExceeded {
                limit: crate::Limit::TopK,
                requested: *k as usize,
            }),
            Op::OrderedPut { value, .. } if value.len() + 8 > VALUE_BYTES_MAX => {
                Err(Error::LimitExceeded {
                    limit: crate::Limit::ValueBytes,
                    requested: value.len() + 8,
                })
            }
            _ => Ok(()),
        }
    }
}

/// The order-preserving 8 bits of a score: big-endian, they sort as the numbers do (`-inf`
/// first, `inf` last). `-0.0` encodes as `0.0`. The sign bit is flipped for a positive score,
/// every bit for a negative one. NaN has no place in the order; callers never store it.
pub fn encode_score(x: f64) -> u64 {
    debug_assert!(!x.is_nan());
    let x = if x == 0.0 { 0.0 } else { x };
    let bits = x.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

/// The score of its encoded form ([`encode_score`]).
pub fn decode_score(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

/// The score a stored value holds: its 8 bytes, decoded; `None` for any other length.
pub fn decode_score_value(value: &[u8]) -> Option<f64> {
    let bytes = <[u8; 8]>::try_from(value).ok()?;
    Some(decode_score(u64::from_be_bytes(bytes)))
}

/// Parses a Redis-style integer: optional `-`, decimal digits, no spaces, no leading `+`,
/// no leading zeros, fits in `i64`.
pub fn parse_int(key: &[u8], value: &[u8]) -> Result<i64, Error> {
    let not_int = || Error::NotAnInteger { key: key.to_vec() };
    let text = std::str::from_utf8(value).map_err(|_| not_int())?;
    let digits = text.strip_prefix('-').unwrap_or(text);
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && text != "-0";
    if !canonical {
        return Err(not_int());
    }
    text.parse::<i64>().map_err(|_| not_int())
}

/// Encodes an ordered-put value: 8-byte big-endian order, then the payload.
pub fn encode_ordered(order: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&order.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Splits an ordered-put value into its order and payload.
pub fn decode_ordered(value: &[u8]) -> Option<(u64, &[u8])> {
    let (order, payload) = value.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*order), payload))
}

/// Decodes a top-k value into `(score, member)` pairs, highest score first.
pub fn decode_top_k(mut value: &[u8]) -> Option<Vec<(i64, Vec<u8>)>> {
    let mut out = Vec::new();
    while !value.is_empty() {
        let (score, rest) = value.split_first_chunk::<8>()?;
        let (len, rest) = rest.split_first_chunk::<4>()?;
        let len = u32::from_be_bytes(*len) as usize;
        if rest.len() < len {
            return None;
        }
        let score = (u64::from_be_bytes(*score) ^ (1 << 63)) as i64;
        out.push((score, rest[..len].to_vec()));
        value = &rest[len..];
    }
    Some(out)
}

fn encode_top_k(entries: &[(i64, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (score, member) in entries {
        out.extend_from_slice(&((*score as u64) ^ (1 << 63)).to_be_bytes());
        let len = u32::try_from(member.len()).expect("members are bounded by KEY_BYTES_MAX");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(member);
    }
    out
}

#[cfg(test)]
mod tests;
