use super::*;

use std::sync::atomic::AtomicUsize;

use crate::io::SimDisk;
use format::Logged;

/// A log segment whose fsync takes `sync_cost` (like a real disk's, unlike `SimDisk`'s) and
/// fails from the `fail_at`-th call on.
struct SlowFile {
    sync_cost: Duration,
    fail_at: usize,
    syncs: Arc<AtomicUsize>,
}

impl AppendFile for SlowFile {
    fn append(&self, _buf: &[u8]) -> io::Result<()> {
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        std::thread::sleep(self.sync_cost);
        if self.syncs.fetch_add(1, Ordering::Relaxed) + 1 >= self.fail_at {
            return Err(io::Error::other("injected fsync error"));
        }
        Ok(())
    }
}

fn slow_log(sync_cost: Duration, fail_at: usize) -> (Log, Arc<AtomicUsize>) {
    let syncs = Arc::new(AtomicUsize::new(0));
    let segment = SlowFile {
        sync_cost,
        fail_at,
        syncs: Arc::clone(&syncs),
    };
    let log = Log::start(
        Arc::new(SimDisk::new()),
        PathBuf::from("/sim/wal"),
        Tail {
            segment: Box::new(segment),
            segment_first_lsn: 0,
            start_lsn: 0,
        },
        Durability::Sync,
        u64::MAX,
        None,
    );
    (log, syncs)
}

/// Appends one small commit and waits for it, as a `sync` committer does.
fn commit(log: &Log, i: u64) -> Result<u64, LogFailed> {
    let key = i.to_be_bytes();
    let entries = [(&key[..], Logged::Put(b"value"))];
    let end = log.append(Ts(i + 1), 1, entries.iter().copied())?;
    log.wait_durable(end)?;
    assert!(log.durable_lsn() >= end, "acknowledged only once durable");
    Ok(end)
}

#[test]
fn concurrent_committers_share_fsyncs() {
    let (log, syncs) = slow_log(Duration::from_millis(1), usize::MAX);
    let (threads, each) = (16, 40);
    std::thread::scope(|s| {
        for t in 0..threads {
            let log = &log;
            s.spawn(move || {
                for i in 0..each {
                    commit(log, t * each + i).expect("no failure injected");
                }
            });
        }
    });
    let commits = (threads * each) as usize;
    let fsyncs = syncs.load(Ordering::Relaxed);
    assert!(
        fsyncs * 4 <= commits,
        "{commits} commits took {fsyncs} fsyncs"
    );
    log.close().expect("close");
}

#[test]
fn a_failed_fsync_fails_every_waiter_and_every_later_commit() {
    let (log, _) = slow_log(Duration::from_micros(300), 20);
    let failures = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..16 {
            let (log, failures) = (&log, &failures);
            s.spawn(move || {
                for i in 0.. {
                    if commit(log, t * 1_000_000 + i).is_err() {
                        failures.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            });
        }
    });
    assert_eq!(failures.load(Ordering::Relaxed), 16, "nobody hangs");
    let error = commit(&log, u64::MAX - 1).expect_err("poisoned for good");
    assert!(error.0.contains("fsync"), "{error}");
    assert!(log.close().is_err());
}

#[test]
fn close_makes_everything_durable() {
    let (log, _) = slow_log(Duration::from_micros(200), usize::MAX);
    let key = 1u64.to_be_bytes();
    let entries = [(&key[..], Logged::Delete)];
    let end = log
        .append(Ts(1), 1, entries.iter().copied())
        .expect("append");
    log.close().expect("close");
    assert!(log.durable_lsn() >= end);
}

#[test]
fn gather_waits_for_company_only_when_it_had_some() {
    let mut gather = Gather::new();
    for _ in 0..20 {
        gather.after_sync(Duration::from_micros(500), 64);
    }
    assert_eq!(gather.expected, 64);
    assert!(gather.patience() > Duration::ZERO);
    assert!(gather.quiet() < gather.patience());
    // The committers leave; one goes on alone: the target decays to "nobody" quickly.
    let mut syncs = 0;
    while gather.expected >= 2 {
        gather.after_sync(Duration::from_micros(500), 1);
        syncs += 1;
    }
    assert!(syncs <= 64, "{syncs} fsyncs to forget the crowd");
    // A free fsync (as in memory) means no patience at all.
    let mut free = Gather::new();
    free.after_sync(Duration::ZERO, 64);
    assert_eq!(free.patience(), Duration::ZERO);
}

/// Ring pages go back to the kernel once the flusher has written past them: after more than
/// two laps, only the pages around the writers are resident, not all 64 MiB.
#[test]
fn the_ring_keeps_only_pages_near_the_writers_in_memory() {
    let (log, _) = slow_log(Duration::ZERO, usize::MAX);
    let value = vec![7u8; 60 << 10];
    let mut end = 0;
    for i in 0..(RING_BYTES * 5 / 2 / value.len()) as u64 {
        let key = i.to_be_bytes();
        let entries = [(&key[..], Logged::Put(&value))];
        end = log.append(Ts(i + 1), 1, entries.iter().copied()).unwrap();
    }
    log.wait_durable(end).unwrap();
    let ring = log.shared().ring.start().as_ptr() as usize;
    let resident_pages = (0..RING_PAGES)
        .filter(|page| {
            (0..RING_PAGE_BYTES).step_by(4096).any(|at| {
                let mut vec = 0u8;
                let addr = ring + page * RING_PAGE_BYTES + at;
                // SAFETY: one page of the ring's mapping; `vec` has room for its one entry.
                let rc = unsafe { libc::mincore(addr as *mut libc::c_void, 4096, &mut vec) };
                assert_eq!(rc, 0, "mincore: {}", io::Error::last_os_error());
                vec & 1 == 1
            })
        })
        .count();
    assert!(
        resident_pages <= RING_PAGES_AHEAD + 2,
        "{resident_pages} of {RING_PAGES} ring pages resident"
    );
}
