use super::*;

#[test]
fn visibility_follows_timestamps_and_trim_keeps_what_snapshots_need() {
    let me = LockOwner(9);
    let arena = Arena::new();
    let ptr = Record::new_locked(&arena, b"k", 0, me, Some(1));
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
