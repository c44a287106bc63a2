//! Which records are split, and their split states, by record address.
//!
//! A record used to carry a pointer to its split state, 8 of its 32 header bytes, null in all
//! but the few records that were ever split (hot keys). The pointer lives here instead, and a
//! record marks itself split with a bit of its key length word ([`Record::is_split`]), so
//! that the common case costs one bit. Every read of a split record looks it up here, so
//! lookups take no lock and write nothing: an open-addressing table of address pairs, where
//! entries are never removed (split records are never collected). When it is half full, the
//! only writer (the split coordinator, serialized by the table's lock) copies it into one
//! twice its size and publishes that; replaced tables stay until the database drops, since
//! readers may still be probing them.
//!
//! A record is marked split only after its entry is in the table that is current then (and,
//! through the copies, in every later one), so a reader that sees the mark finds the entry.

use std::sync::atomic::{AtomicPtr, Ordering};

use parking_lot::Mutex;

use crate::mvcc::Record;

use super::SplitRecord;

/// Slots of the first table.
const SLOTS_MIN: usize = 64;

/// One table: `(record, split state)` pairs; a null record marks a free slot.
struct Slots {
    pairs: Box<[(AtomicPtr<Record>, AtomicPtr<SplitRecord>)]>,
}

impl Slots {
    fn new(len: usize) -> Box<Slots> {
        debug_assert!(len.is_power_of_two());
        Box::new(Slots {
            pairs: (0..len)
                .map(|_| {
                    (
                        AtomicPtr::new(std::ptr::null_mut()),
                        AtomicPtr::new(std::ptr::null_mut()),
                    )
                })
                .collect(),
        })
    }

    /// Where the probe for `record` starts (Fibonacci hashing of the address: records are
    /// 8-byte aligned, so its low bits say little).
    fn start(&self, record: *const Record) -> usize {
        let h = (record as usize as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 32) as usize & (self.pairs.len() - 1)
    }

    /// Puts the pair in a free slot. The caller holds the table's lock and has made room.
    fn put(&self, record: *mut Record, split: *mut SplitRecord) {
        let mask = self.pairs.len() - 1;
        let mut at = self.start(record);
        loop {
            let (r, s) = &self.pairs[at];
            if r.load(Ordering::Relaxed).is_null() {
                // The state first: a reader that finds the record reads it after.
                s.store(split, Ordering::Relaxed);
                r.store(record, Ordering::Release);
                return;
            }
            at = (at + 1) & mask;
        }
    }

    fn get(&self, record: *const Record) -> Option<*mut SplitRecord> {
        let mask = self.pairs.len() - 1;
        let mut at = self.start(record);
        for _ in 0..self.pairs.len() {
            let (r, s) = &self.pairs[at];
            let found = r.load(Ordering::Acquire);
            if std::ptr::eq(found, record) {
                return Some(s.load(Ordering::Relaxed));
            }
            if found.is_null() {
                return None;
            }
            at = (at + 1) & mask;
        }
        None
    }
}

pub(crate) struct SplitTable {
    current: AtomicPtr<Slots>,
    /// Every table made, the current one last, and how many entries the current one holds.
    /// Boxed: `current` points at one, so it must not move when the vector grows.
    #[allow(clippy::vec_box, reason = "`current` points at the boxed tables")]
    tables: Mutex<(Vec<Box<Slots>>, usize)>,
}

impl SplitTable {
    pub(crate) fn new() -> SplitTable {
        let first = Slots::new(SLOTS_MIN);
        let current = std::ptr::from_ref::<Slots>(&first).cast_mut();
        SplitTable {
            current: AtomicPtr::new(current),
            tables: Mutex::new((vec![first], 0)),
        }
    }

    /// `record`'s split state, if it was ever split.
    #[inline]
    pub(crate) fn get(&self, record: &Record) -> Option<&'static SplitRecord> {
        if !record.is_split() {
            return None;
        }
        // SAFETY: tables are freed only with `self`; the current one is never null.
        let slots = unsafe { &*self.current.load(Ordering::Acquire) };
        let found = slots
            .get(record)
            .expect("a record marked split is in the split table");
        // SAFETY: split states are boxed, never moved and never freed while the database
        // (and so any caller holding one of its records) lives.
        Some(unsafe { &*found })
    }

    /// Records `split` as `record`'s split state and marks the record split (once per
    /// record: the coordinator does it).
    pub(crate) fn attach(&self, record: &Record, split: &SplitRecord) {
        let mut tables = self.tables.lock();
        let (all, len) = &mut *tables;
        let current = all.last().expect("a table");
        debug_assert!(current.get(record).is_none(), "a record is split once");
        if (*len + 1) * 2 > current.pairs.len() {
            let bigger = Slots::new(current.pairs.len() * 2);
            for (r, s) in &current.pairs {
                let r = r.load(Ordering::Relaxed);
                if !r.is_null() {
                    bigger.put(r, s.load(Ordering::Relaxed));
                }
            }
            self.current.store(
                std::ptr::from_ref::<Slots>(&bigger).cast_mut(),
                Ordering::Release,
            );
            all.push(bigger);
        }
        let current = all.last().expect("a table");
        current.put(
            std::ptr::from_ref(record).cast_mut(),
            std::ptr::from_ref(split).cast_mut(),
        );
        *len += 1;
        record.mark_split();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Arena;
    use crate::mvcc::LockOwner;
    use crate::split::Kind;

    /// Records split over several growths are all found, from their own marks; the others
    /// are not looked up at all.
    #[test]
    fn split_records_are_found_through_growths() {
        let arena = Arena::new();
        let table = SplitTable::new();
        let records: Vec<_> = (0..1000u32)
            .map(|i| {
                let r = Record::new_locked(&arena, &i.to_be_bytes(), LockOwner(1), None);
                crate::mvcc::RecordRef(r)
            })
            .collect();
        let states: Vec<Box<SplitRecord>> = records
            .iter()
            .step_by(3)
            .map(|&r| Box::new(SplitRecord::new(r, Kind::Add, 2)))
            .collect();
        for (state, &record) in states.iter().zip(records.iter().step_by(3)) {
            table.attach(record.get(), state);
        }
        assert!(table.tables.lock().0.len() > 3, "the table grew");
        for (i, record) in records.iter().enumerate() {
            let found = table.get(record.get());
            if i % 3 == 0 {
                let found = found.expect("a split record is found");
                assert!(std::ptr::eq(found, &*states[i / 3]));
                assert_eq!(record.get().key(), (i as u32).to_be_bytes());
            } else {
                assert!(found.is_none());
                assert!(!record.get().is_split());
            }
        }
    }
}
