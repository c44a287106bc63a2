//! Deltas: commutative operations folded together, so that a slice holds one entry per
//! commit timestamp instead of one per operation, and the log holds one entry per key.

use crate::commutative::{Op, decode_top_k};
use crate::error::Error;

/// What a split record accepts: every operation on it in a split phase has this kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Add,
    Max,
    Min,
    Ordered,
    /// Top-k insert with this `k` (inserts with different `k` do not commute).
    TopK(u32),
}

impl Kind {
    /// The kind of `op`; `None` for a score add, which never goes to a slice: it keeps an
    /// index entry in step with its value, which a slice's delta would leave behind.
    pub(crate) fn of(op: &Op) -> Option<Kind> {
        Some(match op {
            Op::Add(_) => Kind::Add,
            Op::Max(_) => Kind::Max,
            Op::Min(_) => Kind::Min,
            Op::OrderedPut { .. } => Kind::Ordered,
            Op::TopK { k, .. } => Kind::TopK(*k),
            Op::ScoreAdd { .. } => return None,
        })
    }

    /// Whether `base` (the committed value a phase starts from) can take this kind's
    /// operations without an error, so that no split operation can fail.
    pub(crate) fn accepts_base(self, key: &[u8], base: Option<&[u8]>) -> bool {
        let Some(base) = base else { return true };
        match self {
            Kind::Add | Kind::Max | Kind::Min => crate::commutative::parse_int(key, base).is_ok(),
            Kind::Ordered => crate::commutative::decode_ordered(base).is_some(),
            Kind::TopK(_) => decode_top_k(base).is_some(),
        }
    }
}

/// Several operations of one kind on one key, folded. Applying a delta to a value gives the
/// same result as applying its operations one by one, in any order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Delta {
    Add(i64),
    Max(i64),
    Min(i64),
    /// Ordered put: the winning encoded value.
    Ordered(Vec<u8>),
    /// Top-k: `k` and the encoded list of the inserts.
    TopK(u32, Vec<u8>),
}

const TAG_ADD: u8 = 1;
const TAG_MAX: u8 = 2;
const TAG_MIN: u8 = 3;
const TAG_ORDERED: u8 = 4;
const TAG_TOP_K: u8 = 5;

impl Delta {
    /// Folds `ops` (all of one kind, checked by the caller) into a delta. `None` if they are
    /// of mixed kinds or an addition overflows.
    pub(crate) fn fold(key: &[u8], ops: &[Op]) -> Option<Delta> {
        let mut delta: Option<Delta> = None;
        for op in ops {
            let next = Delta::from_op(key, op)?;
            match &mut delta {
                None => delta = Some(next),
                Some(d) => d.merge(key, &next)?,
            }
        }
        delta
    }

    fn from_op(key: &[u8], op: &Op) -> Option<Delta> {
        Some(match op {
            Op::Add(n) => Delta::Add(*n),
            Op::Max(n) => Delta::Max(*n),
            Op::Min(n) => Delta::Min(*n),
            Op::OrderedPut { .. } => Delta::Ordered(op.apply(key, None).ok()?),
            Op::TopK { k, .. } => Delta::TopK(*k, op.apply(key, None).ok()?),
            Op::ScoreAdd { .. } => return None,
        })
    }

    /// Folds `other` into `self`. `None` (and `self` unusable) if the kinds differ or an
    /// addition overflows; callers only merge deltas of one split record, which share a kind,
    /// and bound additions so that they cannot overflow.
    pub(crate) fn merge(&mut self, key: &[u8], other: &Delta) -> Option<()> {
        match (self, other) {
            (Delta::Add(a), Delta::Add(b)) => *a = a.checked_add(*b)?,
            (Delta::Max(a), Delta::Max(b)) => *a = (*a).max(*b),
            (Delta::Min(a), Delta::Min(b)) => *a = (*a).min(*b),
            (Delta::Ordered(a), Delta::Ordered(b)) => {
                let (order, payload) = crate::commutative::decode_ordered(b)?;
                *a = Op::OrderedPut {
                    order,
                    value: payload.to_vec(),
                }
                .apply(key, Some(a))
                .ok()?;
            }
            (Delta::TopK(k, a), Delta::TopK(j, b)) if k == j => {
                for (score, member) in decode_top_k(b)? {
                    *a = Op::TopK {
                        k: *k,
                        score,
                        member,
                    }
                    .apply(key, Some(a))
                    .ok()?;
                }
            }
            _ => return None,
        }
        Some(())
    }

    /// The value after applying the delta to `base`.
    pub(crate) fn apply(&self, key: &[u8], base: Option<&[u8]>) -> Result<Vec<u8>, Error> {
        match self {
            Delta::Add(n) => Op::Add(*n).apply(key, base),
            Delta::Max(n) => Op::Max(*n).apply(key, base),
            Delta::Min(n) => Op::Min(*n).apply(key, base),
            Delta::Ordered(encoded) => {
                let (order, payload) = crate::commutative::decode_ordered(encoded)
                    .ok_or_else(|| Error::NotOrdered { key: key.to_vec() })?;
                Op::OrderedPut {
                    order,
                    value: payload.to_vec(),
                }
                .apply(key, base)
            }
            Delta::TopK(k, encoded) => {
                let mut value = base.map(<[u8]>::to_vec);
                let entries =
                    decode_top_k(encoded).ok_or_else(|| Error::NotATopK { key: key.to_vec() })?;
                for (score, member) in entries {
                    value = Some(
                        Op::TopK {
                            k: *k,
                            score,
                            member,
                        }
                        .apply(key, value.as_deref())?,
                    );
                }
                value.ok_or_else(|| Error::NotATopK { key: key.to_vec() })
            }
        }
    }

    /// Sum of absolute additions (the quantity bounded per slice so merging cannot overflow);
    /// zero for other kinds.
    pub(crate) fn magnitude(&self) -> u64 {
        match self {
            Delta::Add(n) => n.unsigned_abs(),
            _ => 0,
        }
    }

    /// The log encoding: a tag byte, then the argument (see `docs/format.md`).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Delta::Add(n) => {
                out.push(TAG_ADD);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Delta::Max(n) => {
                out.push(TAG_MAX);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Delta::Min(n) => {
                out.push(TAG_MIN);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Delta::Ordered(v) => {
                out.push(TAG_ORDERED);
                out.extend_from_slice(v);
            }
            Delta::TopK(k, v) => {
                out.push(TAG_TOP_K);
                out.extend_from_slice(&k.to_le_bytes());
                out.extend_from_slice(v);
            }
        }
    }

    /// Decodes [`Delta::encode`]'s bytes; `None` if they are malformed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Delta> {
        let (&tag, rest) = bytes.split_first()?;
        let int = |rest: &[u8]| -> Option<i64> { Some(i64::from_le_bytes(rest.try_into().ok()?)) };
        Some(match tag {
            TAG_ADD => Delta::Add(int(rest)?),
            TAG_MAX => Delta::Max(int(rest)?),
            TAG_MIN => Delta::Min(int(rest)?),
            TAG_ORDERED => {
                crate::commutative::decode_ordered(rest)?;
                Delta::Ordered(rest.to_vec())
            }
            TAG_TOP_K => {
                let (k, list) = rest.split_first_chunk::<4>()?;
                decode_top_k(list)?;
                Delta::TopK(u32::from_le_bytes(*k), list.to_vec())
            }
            _ => return None,
        })
    }
}
