use super::*;

#[cfg(not(keel_loom))]
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

#[cfg(not(keel_loom))]
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

/// The slots in use stay a short prefix: a thread that keeps several snapshots open at once
/// does not walk the registry (it did, to all 4096 slots, when it started each probe where
/// the last one ended), and threads that come and go reuse the numbers of those that exited.
/// Every horizon computation scans that prefix.
#[cfg(not(keel_loom))]
#[test]
fn slots_in_use_stay_few_as_snapshots_and_threads_come_and_go() {
    let oracle = Oracle::new(Ts(0));
    for _ in 0..500 {
        let open: Vec<_> = (0..HOME_SPREAD + 3)
            .map(|_| oracle.register().unwrap().0)
            .collect();
        for slot in open {
            oracle.unregister(slot);
        }
    }
    // Other tests' threads hold numbers too: at most a few dozen at once.
    let bound = HOME_SPREAD * 64;
    let used = || oracle.slots_used.load(Ordering::SeqCst);
    assert!(used() <= bound, "{} slots used by one thread", used());
    for _ in 0..300 {
        std::thread::scope(|s| {
            s.spawn(|| oracle.unregister(oracle.register().unwrap().0));
        });
    }
    assert!(
        used() <= bound,
        "{} slots used by threads one at a time",
        used()
    );
}

/// Model checks of the lock-free handshakes with loom: every interleaving (and the weak
/// memory orders loom models) of a committer, a collector and a registering reader.
#[cfg(keel_loom)]
mod model {
    use super::*;
    use loom::sync::Arc;

    #[test]
    fn loom_horizon_never_passes_a_registered_snapshot() {
        loom::model(|| {
            let oracle = Arc::new(Oracle::with_slots(Ts(0), 2));
            let other = Arc::clone(&oracle);
            let committer = loom::thread::spawn(move || {
                let ts = other.next_commit_ts();
                assert!(other.publish(ts, || false));
                other.collect();
            });
            let (slot, read_ts) = oracle.register().expect("a free slot");
            let seen = oracle.horizon();
            committer.join().expect("committer");
            oracle.collect();
            assert!(
                seen <= read_ts,
                "horizon {seen:?} passed snapshot {read_ts:?}"
            );
            assert!(oracle.horizon() <= read_ts);
            oracle.unregister(slot);
            oracle.collect();
            assert_eq!(oracle.horizon(), Ts(1));
        });
    }

    /// The collector's grace period (`gc`): it unlinks a record, reads the watermark, takes
    /// an empty timestamp (as `Shared::gc_pass` does when nothing commits), recomputes the
    /// horizon and frees the record only if the horizon passed that watermark. A reader
    /// that registers and then finds the record in the index must never see it freed.
    #[test]
    fn loom_nothing_found_while_registered_is_freed() {
        use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
        loom::model(|| {
            let oracle = Arc::new(Oracle::with_slots(Ts(0), 2));
            let linked = Arc::new(AtomicUsize::new(1));
            let freed = Arc::new(AtomicBool::new(false));
            let (o, l, f) = (Arc::clone(&oracle), Arc::clone(&linked), Arc::clone(&freed));
            let reader = loom::thread::spawn(move || {
                let (slot, _) = o.register().expect("a free slot");
                if l.load(Ordering::Acquire) == 1 {
                    assert!(
                        !f.load(Ordering::Acquire),
                        "a record found while registered was freed"
                    );
                }
                o.unregister(slot);
            });
            linked.store(0, Ordering::Release);
            fence(Ordering::SeqCst);
            let after = oracle.visible();
            let ts = oracle.next_commit_ts();
            oracle.finish(ts);
            oracle.advance();
            oracle.collect();
            if oracle.horizon() > after {
                freed.store(true, Ordering::Release);
            }
            reader.join().expect("reader");
        });
    }

    /// A task that waits for the watermark (`watch`) while another thread finishes the
    /// timestamp and advances it: the watcher either learns at once that the watermark has
    /// passed, or is woken. Never neither (a lost wakeup would leave a commit unanswered).
    #[test]
    fn loom_a_watcher_is_told_or_woken() {
        use loom::sync::atomic::AtomicBool;
        struct Flag(Arc<AtomicBool>);
        impl std::task::Wake for Flag {
            fn wake(self: std::sync::Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        loom::model(|| {
            let oracle = Arc::new(Oracle::with_slots(Ts(0), 2));
            let other = Arc::clone(&oracle);
            let committer = loom::thread::spawn(move || {
                let ts = other.next_commit_ts();
                other.finish(ts);
                other.advance();
            });
            let woken = Arc::new(AtomicBool::new(false));
            let waker = std::task::Waker::from(std::sync::Arc::new(Flag(Arc::clone(&woken))));
            let passed = oracle.watch(Ts(1), &waker);
            committer.join().expect("committer");
            assert!(
                passed || woken.load(Ordering::SeqCst),
                "the watermark passed a watcher that was neither told nor woken"
            );
            assert_eq!(oracle.visible(), Ts(1));
        });
    }

    #[test]
    fn loom_watermark_is_published_in_order() {
        loom::model(|| {
            let oracle = Arc::new(Oracle::with_slots(Ts(0), 1));
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let oracle = Arc::clone(&oracle);
                    loom::thread::spawn(move || {
                        let ts = oracle.next_commit_ts();
                        assert!(oracle.publish(ts, || false));
                        // Once our publish returns, every earlier timestamp is visible too.
                        assert!(oracle.visible() >= ts);
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("committer");
            }
            assert_eq!(oracle.visible(), Ts(2));
        });
    }
}
