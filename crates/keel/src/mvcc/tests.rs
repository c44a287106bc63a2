use super::*;

#[test]
fn visibility_follows_timestamps_and_trim_keeps_what_snapshots_need() {
    let me = LockOwner(9);
    let arena = Arena::new();
    let ptr = Record::new_locked(&arena, b"k", me, Some(1));
    // SAFETY: freed at the end of the test, used only here.
    let record = unsafe { ptr.as_ref() };
    assert_eq!(record.install(me, Ts(10), Some(b"a"), Ts(0)), 1);
    assert_eq!(record.install(me, Ts(20), None, Ts(0)), 1);
    assert_eq!(record.install(me, Ts(30), Some(b"c"), Ts(0)), 1);
    assert_eq!(record.value_at(Ts(9)), None);
    assert_eq!(record.value_at(Ts(15)), Some(&b"a"[..]));
    assert_eq!(record.value_at(Ts(25)), None, "tombstone");
    assert_eq!(record.value_at(Ts(35)), Some(&b"c"[..]));
    // Horizon 25: the snapshot at 25 needs the tombstone at 20; the version at 10 goes.
    assert_eq!(record.install(me, Ts(40), Some(b"d"), Ts(25)), 0);
    assert_eq!(record.value_at(Ts(25)), None);
    assert_eq!(record.value_at(Ts(31)), Some(&b"c"[..]));
    let mut chain = 0;
    let mut v = record.head();
    while let Some(version) = v {
        chain += 1;
        v = version.next();
    }
    assert_eq!(chain, 3);
    assert_eq!(record.staleness(Ts(35), LockOwner(1)), Staleness::Locked);
    assert_eq!(record.staleness(Ts(35), me), Staleness::Changed);
    assert_eq!(record.staleness(Ts(40), me), Staleness::Fresh);
    record.unlock(me);
    assert_eq!(record.staleness(Ts(40), LockOwner(1)), Staleness::Fresh);
    // SAFETY: nobody else holds it.
    unsafe { Record::free_versions(ptr) };
}

/// Installs under a horizon that trails by one version, so every install cuts a version off
/// and may build the new one in its block: values of every size (and tombstones) must still
/// read back exactly, at their own timestamps, and the chain must stay short.
#[test]
fn installs_that_reuse_cut_versions_keep_every_value_exact() {
    let me = LockOwner(9);
    let arena = Arena::new();
    let ptr = Record::new_locked(&arena, b"k", me, None);
    // SAFETY: freed at the end of the test, used only here.
    let record = unsafe { ptr.as_ref() };
    let value = |i: u64| -> Option<Vec<u8>> {
        let len = usize::try_from(i / 4 * 3 % 41).unwrap();
        (i % 7 != 3).then(|| vec![u8::try_from(i % 251).unwrap(); len])
    };
    let mut live = 0i64;
    let mut addresses = vec![std::ptr::null::<Version>()];
    let mut reused = 0;
    for i in 1..=500u64 {
        let v = value(i);
        live += record.install(me, Ts(i * 10), v.as_deref(), Ts((i - 1) * 10));
        let head = std::ptr::from_ref(record.head().unwrap());
        if i > 2 && head == addresses[usize::try_from(i - 2).unwrap()] {
            reused += 1;
        }
        addresses.push(head);
        assert_eq!(record.value_at(Ts(i * 10)), v.as_deref(), "version {i}");
        if i > 1 {
            let before = value(i - 1);
            assert_eq!(
                record.value_at(Ts(i * 10 - 1)),
                before.as_deref(),
                "version {}",
                i - 1
            );
        }
        let mut chain = 0;
        let mut at = record.head();
        while let Some(version) = at {
            chain += 1;
            at = version.next();
        }
        assert_eq!(
            i64::from(chain),
            live,
            "install returns the change in chain length"
        );
        assert!(
            chain <= 2,
            "the horizon trails by one version, so at most two stay"
        );
    }
    assert!(
        reused > 100,
        "only {reused} installs reused a cut version's block"
    );
    // SAFETY: nobody else holds it.
    unsafe { Record::free_versions(ptr) };
}

/// A record with an embedded slot, updated under a horizon that trails by one version: once
/// trimming cuts the version in the slot, the next install that fits builds there again, so
/// the newest version sits in the record's own block every other install; a value too large
/// for the slot goes to the heap and leaves the slot to the next one that fits.
#[test]
fn the_embedded_slot_is_built_in_again_once_its_version_is_cut() {
    let me = LockOwner(9);
    let arena = Arena::new();
    let ptr = Record::new_locked(&arena, b"key", me, Some(8));
    // SAFETY: freed at the end of the test, used only here.
    let record = unsafe { ptr.as_ref() };
    let slot = ptr
        .as_ptr()
        .cast::<u8>()
        .wrapping_add(Record::slot_offset(3))
        .cast::<Version>()
        .cast_const();
    let value = |i: u64| -> Vec<u8> {
        // Every tenth value is larger than the slot.
        let len = if i.is_multiple_of(10) {
            20
        } else {
            usize::try_from(i % 9).unwrap()
        };
        vec![u8::try_from(i % 251).unwrap(); len]
    };
    let mut in_slot = 0;
    let mut live = 0i64;
    for i in 1..=300u64 {
        let v = value(i);
        live += record.install(me, Ts(i * 10), Some(&v), Ts((i - 1) * 10));
        let head = std::ptr::from_ref(record.head().unwrap());
        if head == slot {
            in_slot += 1;
            assert!(
                v.len() <= 8,
                "version {i} of {} bytes built in the slot",
                v.len()
            );
        }
        assert_eq!(record.value_at(Ts(i * 10)), Some(&v[..]), "version {i}");
        if i > 1 {
            assert_eq!(
                record.value_at(Ts(i * 10 - 1)),
                Some(&value(i - 1)[..]),
                "version {}",
                i - 1
            );
        }
        assert!(
            live <= 2,
            "the horizon trails by one version, so at most two stay"
        );
    }
    // Without the slot coming free again, only the first version would have been in it.
    assert!(
        in_slot > 100,
        "only {in_slot} of 300 versions were built in the embedded slot"
    );
    record.unlock(me);
    // SAFETY: nobody else holds it; the record's block goes back to the arena.
    unsafe { Record::free(ptr, &arena) };
}
