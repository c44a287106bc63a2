use super::*;

#[test]
fn watermark_publishes_in_order_and_horizon_respects_snapshots() {
    let oracle = Oracle::new(Ts(0));
    let (old_slot, old_ts) = oracle.register().unwrap();
    assert_eq!(old_ts, Ts(0));
    let a = oracle.next_commit_ts();
    let b = oracle.next_commit_ts();
    std::thread::scope(|s| {
        s.spawn(|| oracle.publish(b, || false));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(oracle.visible(), Ts(0), "b waits for a");
        oracle.publish(a, || false);
    });
    assert_eq!(oracle.visible(), Ts(2));
    oracle.collect();
    assert_eq!(oracle.horizon(), Ts(0), "the old snapshot pins the horizon");
    let (new_slot, new_ts) = oracle.register().unwrap();
    assert_eq!(new_ts, Ts(2));
    oracle.unregister(old_slot);
    oracle.collect();
    assert_eq!(oracle.horizon(), Ts(2));
    oracle.unregister(new_slot);
}

#[test]
fn registry_is_bounded() {
    let oracle = Oracle::new(Ts(0));
    let slots: Vec<_> = (0..OPEN_TXNS_MAX)
        .map(|_| oracle.register().unwrap().0)
        .collect();
    assert!(oracle.register().is_none());
    oracle.unregister(slots[17]);
    assert!(oracle.register().is_some());
}
