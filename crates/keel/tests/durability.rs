//! Durability: what is acknowledged survives crashes, torn writes, fsync errors and a full
//! disk; damage is found and named; checkpoints bound the log. Power loss is simulated with
//! `SimDisk` (exact, deterministic); process death with SIGKILL on real files (crash loop).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use keel::{CommitError, Db, Durability, Fault, OpenError, Options, SimDisk, SplitMode};

fn sim_options(disk: &SimDisk) -> Options {
    Options::default().disk(disk.reboot()).recovery_threads(2)
}

/// Options for a database on `disk` under `async` that fsyncs only when asked: a test never
/// reaches the interval.
fn sim_async_options(disk: &SimDisk) -> Options {
    sim_options(disk).durability(Durability::Async {
        interval: Duration::from_secs(3600),
    })
}

fn dir() -> PathBuf {
    PathBuf::from("/sim/db")
}

/// Commits one put; returns its commit timestamp.
fn put(db: &Db, key: &str, value: &str) -> Result<keel::Ts, CommitError> {
    let mut txn = db.begin().expect("begin");
    txn.put(key.as_bytes(), value.as_bytes()).expect("put");
    txn.commit()
        .map(|outcome| outcome.expect("no concurrent writers"))
}

fn contents(db: &Db) -> BTreeMap<String, String> {
    let snapshot = db.snapshot().expect("snapshot");
    snapshot
        .range::<&[u8]>(..)
        .map(|(k, v)| {
            (
                String::from_utf8(k).expect("utf8"),
                String::from_utf8(v).expect("utf8"),
            )
        })
        .collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("keel-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn sync_commits_survive_power_loss() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    for i in 0..200 {
        put(&db, &format!("k{i:03}"), &i.to_string()).unwrap();
    }
    disk.crash();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    let got = contents(&db);
    assert_eq!(got.len(), 200);
    assert_eq!(got["k199"], "199");
    assert_eq!(db.recovery().unwrap().log_frames, 200);
}

#[test]
fn async_loses_at_most_the_unsynced_window_never_part_of_a_commit() {
    let disk = SimDisk::new();
    let options = sim_async_options(&disk);
    let db = Db::open(dir(), options).unwrap();
    for i in 0..50 {
        db.transact(|txn| {
            txn.put(format!("a{i}").as_bytes(), b"x")?;
            txn.put(format!("b{i}").as_bytes(), b"x")
        })
        .unwrap();
    }
    disk.crash();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    let got = contents(&db);
    // The interval never elapsed, so nothing was fsynced; whatever survived is whole commits.
    for i in 0..50 {
        assert_eq!(
            got.contains_key(&format!("a{i}")),
            got.contains_key(&format!("b{i}"))
        );
    }
}

#[test]
fn torn_tail_is_cut_and_everything_before_it_kept() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    for i in 0..10 {
        put(&db, &format!("k{i}"), "v").unwrap();
    }
    // The next frame reaches the disk only partly, then the power goes.
    disk.inject(Fault::ShortWrite(13));
    let err = put(&db, "torn", "v").unwrap_err();
    assert!(matches!(err, CommitError::Log(_)), "{err}");
    assert!(
        put(&db, "after", "v").is_err(),
        "the log is poisoned after a failed write"
    );
    disk.crash_keep_written();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    let got = contents(&db);
    assert_eq!(got.len(), 10, "{got:?}");
    let torn = db.recovery().unwrap().torn_tail.clone();
    assert!(torn.is_some(), "the partial frame was found and cut");
    put(&db, "new", "v").unwrap();
}

#[test]
fn fsync_error_fails_the_commit_and_poisons_writes() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    put(&db, "before", "1").unwrap();
    disk.inject(Fault::SyncError);
    let err = put(&db, "failed", "1").unwrap_err();
    assert!(err.to_string().contains("fsync"), "{err}");
    assert!(
        put(&db, "later", "1").is_err(),
        "never retried and reported durable"
    );
    // Reads go on, and never show the commit whose fsync failed.
    assert_eq!(db.snapshot().unwrap().get(b"failed").unwrap(), None);
    assert_eq!(
        db.snapshot().unwrap().get(b"before").unwrap(),
        Some(b"1".to_vec())
    );
    disk.crash();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(contents(&db).get("before").map(String::as_str), Some("1"));
    assert_eq!(contents(&db).get("later"), None);
}

#[test]
fn full_disk_gives_an_error_and_loses_nothing_acknowledged() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    let mut acked = Vec::new();
    disk.inject(Fault::FullAt(disk.used_bytes() + 4000));
    let mut failure = None;
    for i in 0..1000 {
        match put(&db, &format!("k{i:04}"), &"v".repeat(50)) {
            Ok(_) => acked.push(format!("k{i:04}")),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let failure = failure.expect("the disk filled up");
    assert!(failure.to_string().contains("No space left"), "{failure}");
    // Space is freed and the machine restarts.
    disk.crash();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    let got = contents(&db);
    for key in &acked {
        assert!(got.contains_key(key), "acknowledged {key} lost");
    }
}

#[test]
fn checkpoints_bound_the_log_and_recovery_matches_the_model() {
    let disk = SimDisk::new();
    let options = sim_options(&disk)
        .segment_bytes(8 << 10)
        .checkpoint_log_bytes(32 << 10);
    let db = Db::open(dir(), options).unwrap();
    let mut model = BTreeMap::new();
    for round in 0..60 {
        for i in 0..50 {
            let key = format!("k{:03}", (round * 7 + i) % 97);
            let value = format!("{round}-{i}");
            if (round + i) % 11 == 0 {
                db.transact(|txn| txn.delete(key.as_bytes())).unwrap();
                model.remove(&key);
            } else {
                put(&db, &key, &value).unwrap();
                model.insert(key, value);
            }
        }
        if round % 20 == 19 {
            db.checkpoint().unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let files = disk.reboot();
    let logged: u64 = {
        use keel::Disk;
        files
            .list(&dir())
            .unwrap()
            .iter()
            .filter(|n| n.starts_with("wal-"))
            .map(|n| files.read(&dir().join(n)).unwrap().len() as u64)
            .sum()
    };
    assert!(
        logged < 128 << 10,
        "the log stays bounded by checkpoints: {logged} bytes"
    );
    assert!(db.stats().checkpoints >= 3);
    disk.crash();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(contents(&db), model);
    assert!(db.recovery().unwrap().checkpoint.is_some());
    // A clean close checkpoints: the next open replays nothing.
    db.close().unwrap();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(db.recovery().unwrap().log_frames, 0);
    assert_eq!(contents(&db), model);
}

#[test]
fn flipped_byte_mid_log_is_damage_named_by_file_and_offset() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    for i in 0..20 {
        put(&db, &format!("k{i}"), "value").unwrap();
    }
    drop(db);
    let segment = dir().join("wal-00000000000000000000.log");
    disk.corrupt(&segment, 24 + 8 + 3);
    match Db::open(dir(), sim_options(&disk)) {
        Err(OpenError::Damaged { file, offset, .. }) => {
            assert_eq!(file, segment);
            assert_eq!(offset, 24);
        }
        other => panic!("expected damage, got {other:?}"),
    }
}

#[test]
fn flipped_byte_in_checkpoint_is_detected() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    for i in 0..20 {
        put(&db, &format!("k{i}"), "value").unwrap();
    }
    let info = db.checkpoint().unwrap().unwrap();
    drop(db);
    disk.corrupt(&dir().join(&info.name), 50);
    let err = Db::open(dir(), sim_options(&disk)).unwrap_err();
    assert!(matches!(err, OpenError::Damaged { .. }), "{err}");
    assert!(err.to_string().contains(&info.name), "{err}");
}

#[test]
fn foreign_and_locked_directories_are_refused() {
    let dir = temp_dir("foreign");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    assert!(matches!(
        Db::open(&dir, Options::default()),
        Err(OpenError::NotKeel { .. })
    ));
    std::fs::remove_file(dir.join("notes.txt")).unwrap();
    let db = Db::open(&dir, Options::default()).unwrap();
    assert!(matches!(
        Db::open(&dir, Options::default()),
        Err(OpenError::Locked { .. })
    ));
    drop(db);
    Db::open(&dir, Options::default()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_reports_and_repairs_a_damaged_tail() {
    let dir = temp_dir("check");
    {
        let db = Db::open(
            &dir,
            Options::default().checkpoint_interval(Duration::from_secs(3600)),
        )
        .unwrap();
        for i in 0..30 {
            put(&db, &format!("k{i:02}"), "value").unwrap();
        }
        // Drop without a final checkpoint would still checkpoint; keep the log instead.
        std::mem::forget(db);
    }
    let segment = dir.join("wal-00000000000000000000.log");
    let mut bytes = std::fs::read(&segment).unwrap();
    let len = bytes.len();
    bytes[len - 20] ^= 0x55;
    std::fs::write(&segment, &bytes).unwrap();
    let report = keel::check(&dir, false).unwrap();
    assert!(
        report.torn_tail.is_some(),
        "damage in the last frame reads as a torn tail: {report:?}"
    );
    // Damage in the middle is not a tail.
    bytes[len - 20] ^= 0x55;
    bytes[24 + 8 + 2] ^= 0x55;
    std::fs::write(&segment, &bytes).unwrap();
    let err = keel::check(&dir, false).unwrap_err();
    assert!(err.to_string().contains("offset 24"), "{err}");
    let report = keel::check(&dir, true).unwrap();
    assert!(
        report.damage.is_some() && !report.repaired.is_empty(),
        "{report:?}"
    );
    keel::check(&dir, false).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Power loss in the middle of split phases: every acknowledged add survives, whether it went
/// to a slice alone (no timestamp) or with other writes (mixed), across checkpoints written
/// while records were split; no transaction survives in part.
#[test]
fn split_operations_survive_power_loss_mid_phase() {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    for round in 0..3u64 {
        let disk = SimDisk::new();
        let options = || {
            sim_options(&disk)
                .split(SplitMode::Force)
                .split_phase(Duration::from_millis(2))
                .checkpoint_log_bytes(16 << 10)
                .segment_bytes(8 << 10)
        };
        let db = Db::open(dir(), options()).unwrap();
        db.transact(|txn| txn.add(b"hot", 0)).unwrap();
        let (stop, hot_acked, mixed_acked) =
            (AtomicBool::new(false), AtomicI64::new(0), AtomicI64::new(0));
        let (hot_tried, mixed_tried) = (AtomicI64::new(0), AtomicI64::new(0));
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let mut txn = db.begin().unwrap();
                        txn.add(b"hot", 1).unwrap();
                        hot_tried.fetch_add(1, Ordering::SeqCst);
                        match txn.commit() {
                            Ok(Ok(_)) => drop(hot_acked.fetch_add(1, Ordering::SeqCst)),
                            Ok(Err(_)) => drop(hot_tried.fetch_sub(1, Ordering::SeqCst)),
                            Err(_) => return, // the power went: the log failed
                        }
                    }
                });
            }
            s.spawn(|| {
                for n in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let mut txn = db.begin().unwrap();
                    txn.add(b"hot", 1000).unwrap();
                    txn.put(format!("m{n:06}").as_bytes(), b"x").unwrap();
                    mixed_tried.fetch_add(1, Ordering::SeqCst);
                    match txn.commit() {
                        Ok(Ok(_)) => drop(mixed_acked.fetch_add(1, Ordering::SeqCst)),
                        Ok(Err(_)) => drop(mixed_tried.fetch_sub(1, Ordering::SeqCst)),
                        Err(_) => return,
                    }
                }
            });
            let started = std::time::Instant::now();
            while db.stats().checkpoints < 2 + round || db.stats().split_commits < 2000 {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "{:?}",
                    db.stats()
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            disk.crash();
            stop.store(true, Ordering::Relaxed);
        });
        drop(db);
        let db = Db::open(dir(), options()).unwrap();
        let snapshot = db.snapshot().unwrap();
        let hot: i64 = String::from_utf8(snapshot.get(b"hot").unwrap().unwrap())
            .unwrap()
            .parse()
            .unwrap();
        let mixed = snapshot.range(b"m".as_slice()..b"n".as_slice()).count() as i64;
        let (hot_acked, mixed_acked) = (hot_acked.into_inner(), mixed_acked.into_inner());
        let (hot_tried, mixed_tried) = (hot_tried.into_inner(), mixed_tried.into_inner());
        assert!(
            mixed >= mixed_acked && mixed <= mixed_tried,
            "round {round}: {mixed} mixed commits survived; {mixed_acked} acknowledged, {mixed_tried} tried"
        );
        // Each surviving mixed commit survived whole: its 1000 are in `hot`.
        let singles = hot - 1000 * mixed;
        assert!(
            singles >= hot_acked && singles <= hot_tried,
            "round {round}: hot = {hot} holds {singles} single adds besides {mixed} mixed;              {hot_acked} acknowledged, {hot_tried} tried"
        );
        drop(snapshot);
        db.close().unwrap();
    }
}

/// The child side of the crash loop: commits forever, printing each acknowledged commit.
fn crash_child(dir: &Path) {
    use std::io::Write;
    let db = Db::open(
        dir,
        Options::default()
            .segment_bytes(64 << 10)
            .checkpoint_log_bytes(256 << 10),
    )
    .unwrap();
    let start: u64 = db.snapshot().unwrap().get(b"last").unwrap().map_or(0, |v| {
        String::from_utf8(v).unwrap().parse::<u64>().unwrap() + 1
    });
    let mut out = std::io::stdout().lock();
    for n in start.. {
        db.transact(|txn| {
            txn.put(format!("k{n:08}").as_bytes(), &n.to_le_bytes())?;
            txn.put(b"last", n.to_string().as_bytes())?;
            txn.add(b"count", 1)
        })
        .unwrap();
        writeln!(out, "{n}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn crash_loop_sigkill_never_loses_an_acknowledged_commit() {
    if let Ok(dir) = std::env::var("KEEL_CRASH_CHILD_DIR") {
        crash_child(Path::new(&dir));
        return;
    }
    let cycles: u64 = std::env::var("KEEL_CRASH_CYCLES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(50);
    let dir = temp_dir("crash-loop");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut acked_max: Option<u64> = None;
    for cycle in 0..cycles {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash_loop_sigkill_never_loses_an_acknowledged_commit",
                "--nocapture",
            ])
            .env("KEEL_CRASH_CHILD_DIR", &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let acks_before_kill = 1 + seed % 300;
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = 0;
        while seen < acks_before_kill {
            let Some(Ok(line)) = lines.next() else { break };
            // The harness prints its own lines too; acknowledgements are bare numbers.
            if let Ok(n) = line.trim().parse::<u64>() {
                acked_max = Some(acked_max.map_or(n, |m| m.max(n)));
                seen += 1;
            }
        }
        child.kill().unwrap();
        // Whatever the child printed after our last read was acknowledged too.
        for line in lines.map_while(Result::ok) {
            if let Ok(n) = line.trim().parse::<u64>() {
                acked_max = Some(acked_max.map_or(n, |m| m.max(n)));
            }
        }
        child.wait().unwrap();
        let db = Db::open(&dir, Options::default()).unwrap();
        let snapshot = db.snapshot().unwrap();
        let last: u64 =
            String::from_utf8(snapshot.get(b"last").unwrap().expect("something committed"))
                .unwrap()
                .parse()
                .unwrap();
        let acked = acked_max.expect("the child acknowledged commits");
        assert!(
            last >= acked,
            "cycle {cycle}: acknowledged {acked} but only {last} survived"
        );
        // No partial transaction: exactly the keys k0..=last, and the counter agrees.
        let keys: Vec<_> = snapshot.range(b"k".as_slice()..b"l".as_slice()).collect();
        assert_eq!(keys.len() as u64, last + 1, "cycle {cycle}");
        for (i, (k, v)) in keys.iter().enumerate() {
            assert_eq!(k, format!("k{i:08}").as_bytes());
            assert_eq!(v, &(i as u64).to_le_bytes());
        }
        assert_eq!(
            snapshot.get(b"count").unwrap(),
            Some((last + 1).to_string().into_bytes()),
            "cycle {cycle}"
        );
        drop(snapshot);
        db.close().unwrap();
        acked_max = Some(last);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn newer_format_is_refused_with_a_clear_error() {
    use keel::Disk;
    let disk = SimDisk::new();
    drop(Db::open(dir(), sim_options(&disk)).unwrap());
    let files = disk.reboot();
    let path = dir().join("MANIFEST");
    let mut manifest = files.read(&path).unwrap();
    manifest[8..12].copy_from_slice(&2u32.to_le_bytes());
    let body = manifest.len() - 4;
    let crc = crc32c::crc32c(&manifest[..body]);
    manifest[body..].copy_from_slice(&crc.to_le_bytes());
    let file = files.create(&path).unwrap();
    file.append(&manifest).unwrap();
    file.sync().unwrap();
    let err = Db::open(dir(), sim_options(&disk)).unwrap_err();
    assert!(
        matches!(
            err,
            OpenError::NewerFormat {
                found: 2,
                supported: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("newer than this keel supports"),
        "{err}"
    );
}

/// `Stats` tells how much log a restart would replay and how old the newest checkpoint is.
#[test]
fn stats_report_the_log_since_the_newest_checkpoint() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(db.stats().log_bytes_since_checkpoint, 0);
    for i in 0..100 {
        put(&db, &format!("k{i:03}"), "value").unwrap();
    }
    let before = db.stats();
    assert!(before.log_bytes_since_checkpoint >= 100 * 8, "{before:?}");
    std::thread::sleep(Duration::from_millis(300));
    let aged = db.stats().checkpoint_age.unwrap();
    assert!(aged >= Duration::from_millis(300));
    db.checkpoint().unwrap();
    let after = db.stats();
    assert_eq!(after.log_bytes_since_checkpoint, 0);
    assert!(after.checkpoint_age.unwrap() < aged);
    put(&db, "one", "more").unwrap();
    assert!(db.stats().log_bytes_since_checkpoint > 0);
    assert_eq!(Db::in_memory().stats().checkpoint_age, None);
}

/// A snapshot may read at a timestamp no logged commit carries (one taken by a commit that
/// lost its validation); a commit after a crash must still get a later timestamp, or
/// timestamp order would stop being a serial order across restarts.
#[test]
fn timestamps_keep_rising_across_a_crash() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    put(&db, "a", "1").unwrap();
    let mut loser = db.begin().unwrap();
    loser.get(b"a").unwrap();
    loser.put(b"b", b"x").unwrap();
    put(&db, "a", "2").unwrap();
    assert!(loser.commit().unwrap().is_err(), "a changed under the read");
    let seen = db.snapshot().unwrap().read_ts();
    disk.crash();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    let mut txn = db.begin().unwrap();
    txn.put(b"c", b"1").unwrap();
    let ts = txn.commit().unwrap().unwrap();
    assert!(ts > seen, "commit at {ts:?} after a snapshot at {seen:?}");
    assert!(db.snapshot().unwrap().read_ts() >= ts);
}

/// The next timestamp lease is logged half a step ahead and made durable in the background:
/// commits go on while its fsync is slow, and only a commit past the end of the current
/// lease waits for it. (A commit that waited at every lease step held up the server's whole
/// event loop for an fsync.)
#[test]
fn commits_do_not_wait_for_a_lease_renewed_ahead() {
    let disk = SimDisk::new();
    // No fsync but those asked for: the interval is never reached.
    let options = sim_async_options(&disk).ts_lease_step(64);
    let db = Db::open(dir(), options).unwrap();
    let commit_until = |ts: u64| {
        let mut last = put(&db, &format!("k{ts}"), "v").unwrap();
        while last.0 < ts {
            last = put(&db, &format!("k{}", last.0 + 1), "v").unwrap();
        }
        assert_eq!(last.0, ts, "one timestamp per commit");
    };
    // A fresh database leases timestamps 1 to 64 at open; from 33 on, commits log the next
    // lease (to 128). With every fsync held, none of them may wait for it.
    let fsyncs = db.stats().log_fsyncs;
    disk.hold_syncs();
    commit_until(64);
    disk.release_syncs();
    let began = std::time::Instant::now();
    while db.stats().log_fsyncs == fsyncs {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the renewal was never fsynced"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // That fsync made the next lease durable: timestamps 65 to 96 need no fsync at all.
    disk.hold_syncs();
    std::thread::scope(|s| {
        let (sent, received) = std::sync::mpsc::channel();
        let commit_until = &commit_until;
        s.spawn(move || {
            commit_until(96);
            sent.send(()).unwrap();
        });
        let done = received.recv_timeout(Duration::from_secs(20));
        disk.release_syncs();
        done.expect("commits under a lease renewed ahead waited for an fsync");
    });
    // 97 logs the lease after (to 192); 128 is the last under the current one, and 129 must
    // wait until the renewal is durable.
    disk.hold_syncs();
    commit_until(128);
    std::thread::scope(|s| {
        let (sent, received) = std::sync::mpsc::channel();
        let db = &db;
        s.spawn(move || sent.send(put(db, "past the lease", "v").unwrap()).unwrap());
        let early = received.recv_timeout(Duration::from_millis(200));
        disk.release_syncs();
        assert!(
            early.is_err(),
            "a commit past the lease went on before the next lease was durable"
        );
        let ts = received
            .recv_timeout(Duration::from_secs(20))
            .expect("the commit goes on once the next lease is durable");
        assert_eq!(ts.0, 129);
    });
}

/// Leases renewed ahead keep timestamps rising across a crash: in `async` mode only lease
/// frames were fsynced here, and a snapshot read at the newest timestamp handed out.
#[test]
fn timestamps_keep_rising_across_a_crash_with_leases_renewed_ahead() {
    let disk = SimDisk::new();
    let options = |disk: &SimDisk| sim_async_options(disk).ts_lease_step(16);
    let db = Db::open(dir(), options(&disk)).unwrap();
    for i in 0..300 {
        put(&db, &format!("k{i}"), "v").unwrap();
    }
    let seen = db.snapshot().unwrap().read_ts();
    assert!(seen.0 >= 300);
    disk.crash();
    drop(db);
    let db = Db::open(dir(), options(&disk)).unwrap();
    let ts = put(&db, "after", "v").unwrap();
    assert!(ts > seen, "commit at {ts:?} after a snapshot at {seen:?}");
}

/// The log's in-memory ring (64 MiB) is given back to the kernel page by page behind the
/// flusher and reused lap after lap: 150 MiB of commits, more than two laps, all come back
/// after a restart, byte for byte.
#[test]
fn commits_over_several_laps_of_the_log_ring_all_recover() {
    let disk = SimDisk::new();
    // No fsync but at close: SimDisk copies the whole file at each one.
    let options = |disk: &SimDisk| sim_async_options(disk);
    let value = |k: u32| -> Vec<u8> {
        (0..128 << 10)
            .map(|i: u32| (i.wrapping_mul(31) ^ k) as u8)
            .collect()
    };
    const KEYS: u32 = 1200;
    let db = Db::open(dir(), options(&disk)).unwrap();
    for k in 0..KEYS {
        let mut txn = db.begin().unwrap();
        txn.put(&k.to_be_bytes(), &value(k)).unwrap();
        txn.commit().unwrap().unwrap();
    }
    db.close().unwrap();
    let db = Db::open(dir(), options(&disk)).unwrap();
    let snapshot = db.snapshot().unwrap();
    for k in 0..KEYS {
        let got = snapshot.get(&k.to_be_bytes()).unwrap();
        assert!(got.as_deref() == Some(&value(k)[..]), "key {k}");
    }
}

/// Drives a future on this thread: polls it, and calls `between` each time it is pending
/// (`between` waits for the wake: the waker unparks this thread).
fn drive<F: std::future::Future>(f: F, mut between: impl FnMut()) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        between();
    }
}

/// Drives a future on this thread: parks until woken. A lost wakeup shows as a panic, not as
/// a slow test: every wait must end with a wake.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    drive(f, || {
        let parked = std::time::Instant::now();
        std::thread::park_timeout(Duration::from_secs(20));
        assert!(
            parked.elapsed() < Duration::from_secs(20),
            "a pending commit was never woken"
        );
    })
}

/// Drives a future as an event loop that flushes the log itself does: polls, then writes and
/// fsyncs what its commits wait for ([`Db::flush_log_here`]), and parks only when nothing of
/// its own waits for the log.
fn block_on_flushing<F: std::future::Future>(db: &Db, f: F) -> F::Output {
    let mut polls = 0;
    drive(f, || {
        if !db.flush_log_here().waiting {
            std::thread::park_timeout(Duration::from_millis(1));
        }
        polls += 1;
        assert!(polls < 1_000_000, "a commit never completed");
    })
}

/// Installs an inline-flush hook on this thread that counts its calls.
fn flush_inline_here() -> std::rc::Rc<std::cell::Cell<u64>> {
    let calls = std::rc::Rc::new(std::cell::Cell::new(0));
    let counted = calls.clone();
    Db::flush_log_inline_on_this_thread(Some(std::rc::Rc::new(move || {
        counted.set(counted.get() + 1)
    })));
    calls
}

/// On an inline-flushing thread, a commit that waits asynchronously calls the hook instead
/// of waking the flusher thread, one that blocks does not; an fsync that fails under an
/// inline flush fails its commit, and the log stays failed for everyone.
#[test]
fn inline_flush_calls_the_hook_and_reports_a_failed_fsync() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    let calls = flush_inline_here();
    for i in 0..20 {
        let mut txn = db.begin().unwrap();
        txn.put(format!("async{i:02}").as_bytes(), b"1").unwrap();
        block_on_flushing(&db, txn.commit_async()).unwrap().unwrap();
    }
    // Each commit calls it once, unless the flusher thread's timed round made its frame
    // durable before the commit registered.
    let hooked = calls.get();
    assert!(
        (1..=20).contains(&hooked),
        "{hooked} hook calls for 20 commits"
    );
    put(&db, "blocking", "1").unwrap();
    assert_eq!(
        calls.get(),
        hooked,
        "a blocking commit wakes the flusher thread instead"
    );
    assert_eq!(
        db.flush_log_here(),
        keel::LogFlush::default(),
        "nothing waits"
    );
    disk.inject(Fault::SyncError);
    let mut txn = db.begin().unwrap();
    txn.put(b"failed", b"1").unwrap();
    let err = block_on_flushing(&db, txn.commit_async()).unwrap_err();
    assert!(err.to_string().contains("fsync"), "{err}");
    assert_eq!(db.snapshot().unwrap().get(b"failed").unwrap(), None);
    assert!(put(&db, "later", "1").is_err(), "the log stays failed");
    Db::flush_log_inline_on_this_thread(None);
    disk.crash();
    drop(db);
    let got = contents(&Db::open(dir(), sim_options(&disk)).unwrap());
    let mut want: Vec<String> = (0..20).map(|i| format!("async{i:02}")).collect();
    want.push("blocking".into());
    assert_eq!(got.into_keys().collect::<Vec<_>>(), want);
}

/// `commit_async` with `sync` durability from `threads` committers at once, those for which
/// `inline` holds flushing the log themselves, and a power loss in the middle: every commit
/// acknowledged before the crash survives it, whole (both of its keys), and was visible to
/// a fresh snapshot as soon as it was acknowledged.
fn commit_async_through_a_power_loss(threads: usize, inline: fn(usize) -> bool) {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    let acked = Mutex::new(Vec::new());
    let crashed = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (db, acked, crashed) = (&db, &acked, &crashed);
            s.spawn(move || {
                let hook_calls = inline(t).then(flush_inline_here);
                let mut mine = 0;
                for i in 0..400 {
                    let (a, b) = (format!("a{t}-{i:03}"), format!("b{t}-{i:03}"));
                    let mut txn = db.begin().unwrap();
                    txn.put(a.as_bytes(), b"1").unwrap();
                    txn.put(b.as_bytes(), b"2").unwrap();
                    let outcome = if hook_calls.is_some() {
                        block_on_flushing(db, txn.commit_async())
                    } else {
                        block_on(txn.commit_async())
                    };
                    match outcome {
                        Ok(outcome) => {
                            outcome.expect("disjoint keys never conflict");
                            assert_eq!(
                                db.snapshot().unwrap().get(a.as_bytes()).unwrap(),
                                Some(b"1".to_vec()),
                                "acknowledged but not visible"
                            );
                            acked.lock().unwrap().push((a, b));
                            mine += 1;
                        }
                        Err(e) => {
                            assert!(
                                crashed.load(Ordering::SeqCst),
                                "failed without a crash: {e}"
                            );
                            break;
                        }
                    }
                }
                if let Some(calls) = hook_calls {
                    // A commit skips the hook only if the flusher thread's timed round made
                    // its frame durable first: not for fifty in a row.
                    assert!(
                        mine < 50 || calls.get() > 0,
                        "waiting commits call the hook"
                    );
                    Db::flush_log_inline_on_this_thread(None);
                }
            });
        }
        // Let them get going, then pull the plug.
        while acked.lock().unwrap().len() < 500 {
            std::thread::sleep(Duration::from_millis(1));
        }
        crashed.store(true, Ordering::SeqCst);
        disk.crash();
    });
    let acked = acked.into_inner().unwrap();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    let got = contents(&db);
    for (a, b) in &acked {
        assert!(
            got.contains_key(a) && got.contains_key(b),
            "acknowledged {a} lost"
        );
    }
    for key in got.keys().filter(|k| k.starts_with('a')) {
        let b = format!("b{}", &key[1..]);
        assert!(
            got.contains_key(&b),
            "{key} recovered without {b}: half a commit"
        );
    }
    assert!(acked.len() >= 500);
}

#[test]
fn async_sync_commits_are_durable_and_visible_when_acknowledged() {
    commit_async_through_a_power_loss(8, |_| false);
}

/// Threads that flush the log themselves (as the server's poller does under `sync`), beside
/// threads that leave it to the flusher thread.
#[test]
fn inline_flushers_and_the_flusher_thread_lose_no_acknowledged_commit() {
    commit_async_through_a_power_loss(6, |t| t % 2 == 0);
}

/// Committers waiting in `commit_async` when an fsync fails get the error (they are woken,
/// not left waiting), and their commits never become visible.
#[test]
fn async_commit_waiting_on_a_failed_fsync_gets_the_error() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    put(&db, "before", "1").unwrap();
    disk.inject(Fault::SyncError);
    let mut txn = db.begin().unwrap();
    txn.put(b"failed", b"1").unwrap();
    let err = block_on(txn.commit_async()).unwrap_err();
    assert!(err.to_string().contains("fsync"), "{err}");
    assert_eq!(db.snapshot().unwrap().get(b"failed").unwrap(), None);
    let mut txn = db.begin().unwrap();
    txn.put(b"later", b"1").unwrap();
    assert!(
        block_on(txn.commit_async()).is_err(),
        "the log stays failed"
    );
}

/// A `commit_async` future dropped before it resolves still commits (its work is done) and
/// does not stop the watermark: later commits publish and see it.
#[test]
fn dropping_a_pending_async_commit_keeps_the_database_moving() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    for i in 0..50 {
        let mut txn = db.begin().unwrap();
        txn.put(format!("dropped{i}").as_bytes(), b"1").unwrap();
        drop(txn.commit_async());
    }
    put(&db, "after", "1").unwrap();
    let got = contents(&db);
    assert_eq!(got.len(), 51, "{got:?}");
    disk.crash();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(contents(&db).len(), 51);
}

/// Polls `future` on this thread until it resolves or `limit` passes.
fn resolves_within<F: std::future::Future>(future: F, limit: Duration) -> Option<F::Output> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    let began = std::time::Instant::now();
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
        std::thread::park_timeout(limit.checked_sub(began.elapsed())?);
    }
}

/// Whether any log segment on `disk` holds `needle`, as the OS has it now (written, durable
/// or not): what a `kill -9` of the process leaves.
fn log_holds(disk: &SimDisk, needle: &[u8]) -> bool {
    use keel::Disk;
    disk.list(&dir())
        .unwrap()
        .iter()
        .filter(|name| name.ends_with(".log"))
        .any(|name| {
            let data = disk.read(&dir().join(name)).unwrap();
            data.windows(needle.len()).any(|w| w == needle)
        })
}

/// An `async` database on `disk` whose timestamp lease is 64 long, so that commit 33 asks
/// for an fsync (of the next lease) that nobody waits for.
fn async_db_with_short_leases(disk: &SimDisk) -> Db {
    let options = sim_async_options(disk).ts_lease_step(64);
    Db::open(dir(), options).unwrap()
}

/// Lets fsyncs go on when dropped, so that a failing test does not hang in `Db::drop`.
struct SyncsHeld<'a>(&'a SimDisk);

impl Drop for SyncsHeld<'_> {
    fn drop(&mut self) {
        self.0.release_syncs();
    }
}

/// Holds every fsync and commits until the flusher thread is stuck in one (the lease
/// renewal's), as behind a slow disk. No commit waits for it. Fsyncs go on once the result
/// is dropped.
fn hold_the_flusher_in_an_fsync<'a>(disk: &'a SimDisk, db: &Db) -> SyncsHeld<'a> {
    disk.hold_syncs();
    let held = SyncsHeld(disk);
    let mut i = 0;
    let began = std::time::Instant::now();
    while disk.syncs_waiting() == 0 {
        assert!(began.elapsed() < Duration::from_secs(20), "no fsync began");
        let ts = put(db, &format!("filler{i}"), "v").unwrap();
        assert!(ts.0 < 64, "past the lease: the commits would wait");
        i += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    held
}

/// Under `async`, `Db::log_written` (what the server awaits before replying) waits for the
/// log's write to the OS, never for an fsync: while the flusher thread is stuck in a slow
/// fsync, it still resolves, and the commit is then in the file though not yet durable.
#[test]
fn log_written_resolves_during_a_slow_fsync_with_the_commit_in_the_file() {
    let disk = SimDisk::new();
    let db = async_db_with_short_leases(&disk);
    let held = hold_the_flusher_in_an_fsync(&disk, &db);
    commit_and_await_written(&db, &disk, "during", held);
}

/// With the flusher thread stuck in an fsync (`held`): commits `key`, then awaits
/// `Db::log_written`, which must resolve within 5 s with the commit in the file.
fn commit_and_await_written(db: &Db, disk: &SimDisk, key: &str, held: SyncsHeld<'_>) {
    put(db, key, "v").unwrap();
    assert!(!log_holds(disk, key.as_bytes()), "not written yet");
    let written = resolves_within(db.log_written(), Duration::from_secs(5));
    let in_file = log_holds(disk, key.as_bytes());
    drop(held);
    written
        .expect("log_written waited for the flusher's fsync")
        .expect("the log did not fail");
    assert!(
        in_file,
        "log_written resolved before the commit was in the file"
    );
}

/// On a thread that flushes the log inline (the server's poller), `Db::log_written` calls
/// the thread's hook instead of writing or waking the flusher thread, and resolves once
/// the thread writes the log with `Db::flush_log_here`.
#[test]
fn log_written_on_an_inline_thread_waits_for_its_own_write() {
    let disk = SimDisk::new();
    let db = async_db_with_short_leases(&disk);
    // The flusher thread writes every 5 ms by itself: hold it in an fsync so that it stays
    // out of the way.
    let _held = hold_the_flusher_in_an_fsync(&disk, &db);
    let called = std::rc::Rc::new(std::cell::Cell::new(0));
    let hook = std::rc::Rc::clone(&called);
    Db::flush_log_inline_on_this_thread(Some(std::rc::Rc::new(move || hook.set(hook.get() + 1))));
    put(&db, "inline", "v").unwrap();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut written = std::pin::pin!(db.log_written());
    assert!(
        written.as_mut().poll(&mut cx).is_pending(),
        "not written yet"
    );
    assert_eq!(called.get(), 1, "the wait called the thread's hook");
    assert!(!log_holds(&disk, b"inline"), "nobody else wrote it");
    let flush = db.flush_log_here();
    assert!(!flush.waiting, "the write covered every reply that waited");
    assert!(log_holds(&disk, b"inline"));
    assert!(matches!(
        written.as_mut().poll(&mut cx),
        std::task::Poll::Ready(Ok(()))
    ));
    Db::flush_log_inline_on_this_thread(None);
}

/// Starting a new segment fsyncs the full one under the writer lock; under `async` the
/// flusher fsyncs it outside the lock first, so a reply's write of the log does not wait for
/// that bulk fsync either.
#[test]
fn log_written_resolves_while_a_full_segment_is_fsynced() {
    let disk = SimDisk::new();
    let options = sim_async_options(&disk).segment_bytes(4096);
    let db = Db::open(dir(), options).unwrap();
    // No fsync is due before the segment is full: the first one is the rotation's.
    disk.hold_syncs();
    let held = SyncsHeld(&disk);
    let value = "v".repeat(100);
    let began = std::time::Instant::now();
    let mut i = 0;
    while disk.syncs_waiting() == 0 {
        assert!(began.elapsed() < Duration::from_secs(20), "no fsync began");
        put(&db, &format!("fill{i}"), &value).unwrap();
        i += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    commit_and_await_written(&db, &disk, "after", held);
}

/// Under `sync`, a transaction begun at the installed watermark (`Db::begin_installed`, how
/// the server begins commands that write) reads a commit that is installed but not yet
/// durable, so a chain of them on one key waits for no fsync between its links; each is
/// acknowledged only once durable, and a read-only one only once what it read is. Snapshots
/// (`Db::snapshot`, `Db::begin`) still see only what is durable. Power lost before the fsync
/// loses the whole chain, none of it acknowledged; after it, nothing.
#[test]
fn writers_read_installed_commits_and_are_acknowledged_once_durable() {
    type Commit<'a> = std::pin::Pin<Box<keel::CommitFuture<'a>>>;
    // With the fsync held: three links of a chain, then a reader at the installed watermark;
    // none is acknowledged, and a snapshot sees none of them.
    fn chain<'d>(db: &'d Db, cx: &mut std::task::Context<'_>, from: u32) -> Vec<Commit<'d>> {
        let mut commits: Vec<Commit<'d>> = Vec::new();
        for i in from + 1..=from + 3 {
            let mut txn = db.begin_installed().unwrap();
            let last = txn.get(b"k").unwrap().expect("k");
            assert_eq!(
                last,
                (i - 1).to_string().into_bytes(),
                "the last link, at once"
            );
            txn.put(b"k", i.to_string().as_bytes()).unwrap();
            let mut commit = Box::pin(txn.commit_async());
            assert!(
                commit.as_mut().poll(cx).is_pending(),
                "acknowledged before durable"
            );
            commits.push(commit);
        }
        assert_eq!(
            db.snapshot().unwrap().get(b"k").unwrap(),
            Some(from.to_string().into_bytes()),
            "a snapshot sees only what is durable"
        );
        let mut reader = db.begin_installed().unwrap();
        let read = reader.get(b"k").unwrap();
        assert_eq!(read, Some((from + 3).to_string().into_bytes()));
        let mut read = Box::pin(reader.commit_async());
        assert!(
            read.as_mut().poll(cx).is_pending(),
            "answered before durable"
        );
        commits.push(read);
        commits
    }
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    put(&db, "k", "0").unwrap();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // The fsync goes on: every link and the reader are acknowledged, and survive power loss.
    disk.hold_syncs();
    let held = SyncsHeld(&disk);
    let commits = chain(&db, &mut cx, 0);
    drop(held);
    for commit in commits {
        assert!(matches!(
            resolves_within(commit, Duration::from_secs(5)),
            Some(Ok(Ok(_)))
        ));
    }
    disk.crash();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(contents(&db)["k"], "3", "acknowledged, so durable");
    // Power lost while the fsync is held: none is acknowledged, and none survives.
    disk.hold_syncs();
    let held = SyncsHeld(&disk);
    let commits = chain(&db, &mut cx, 3);
    disk.crash();
    drop(held);
    for commit in commits {
        let outcome = resolves_within(commit, Duration::from_secs(5)).expect("ends");
        assert!(
            outcome.is_err(),
            "acknowledged though never durable: {outcome:?}"
        );
    }
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(
        contents(&db)["k"],
        "3",
        "none of the second chain was durable"
    );
}

/// A prepared transaction (two-phase commit's first phase) survives power loss in doubt:
/// locked again, invisible, its metadata kept, until the caller decides it; the decision then
/// survives the next crash.
#[test]
fn a_prepared_transaction_comes_back_in_doubt_and_its_commit_survives() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    put(&db, "a", "1").unwrap();
    let mut txn = db.begin().unwrap();
    txn.put(b"a", b"2").unwrap();
    txn.put(b"b", b"3").unwrap();
    let prepared = txn.prepare(|_| b"txn-1".to_vec()).unwrap().unwrap();
    let ts = prepared.ts();
    disk.crash();
    std::mem::forget(prepared);
    drop(db);

    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(db.recovery().unwrap().in_doubt, 1);
    assert_eq!(contents(&db), BTreeMap::from([("a".into(), "1".into())]));
    let mut in_doubt = db.in_doubt();
    assert!(db.in_doubt().is_empty(), "handed out once");
    let prepared = in_doubt.pop().unwrap();
    drop(in_doubt);
    assert_eq!((prepared.ts(), prepared.meta()), (ts, &b"txn-1"[..]));
    // Its keys are locked: a writer loses.
    let mut writer = db.begin().unwrap();
    writer.put(b"a", b"9").unwrap();
    assert!(writer.commit().unwrap().is_err());
    // A commit of another key waits for the decision (its timestamp is later).
    std::thread::scope(|s| {
        let later = s.spawn(|| put(&db, "c", "4").unwrap());
        assert_eq!(prepared.commit().unwrap(), ts);
        assert!(later.join().unwrap() > ts);
    });
    let expected = BTreeMap::from([
        ("a".into(), "2".into()),
        ("b".into(), "3".into()),
        ("c".into(), "4".into()),
    ]);
    assert_eq!(contents(&db), expected);
    disk.crash();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(db.recovery().unwrap().in_doubt, 0);
    assert_eq!(contents(&db), expected);
}

/// Several transactions in doubt each hold their keys under an owner of their own, one a
/// commit recognizes as a prepared transaction's: a writer of any of their keys loses at once
/// (`ConflictReason::Prepared`) until its decision, then commits. (The second owner handed
/// out used to be the collector's mark for a dead record, and the first the splitter's.)
#[test]
fn every_transaction_in_doubt_holds_its_keys_until_decided() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    let mut prepared = Vec::new();
    for i in 0..3 {
        let mut txn = db.begin().unwrap();
        txn.put(format!("k{i}").as_bytes(), b"prepared").unwrap();
        prepared.push(
            txn.prepare(|_| format!("txn-{i}").into_bytes())
                .unwrap()
                .unwrap(),
        );
    }
    disk.crash();
    prepared.into_iter().for_each(std::mem::forget);
    drop(db);

    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(db.recovery().unwrap().in_doubt, 3);
    let mut in_doubt = db.in_doubt();
    in_doubt.sort_by_key(|p| p.meta().to_vec());
    for i in 0..3 {
        let key = format!("k{i}");
        assert!(db.awaits_decision(key.as_bytes()), "{key}");
        let started = std::time::Instant::now();
        let mut writer = db.begin().unwrap();
        writer.put(key.as_bytes(), b"w").unwrap();
        let conflict = writer.commit().unwrap().unwrap_err();
        assert_eq!(conflict.reason, keel::ConflictReason::Prepared, "{key}");
        assert!(started.elapsed() < Duration::from_millis(500), "{key}");
    }
    for (i, p) in in_doubt.into_iter().enumerate() {
        assert_eq!(p.meta(), format!("txn-{i}").as_bytes());
        if i == 1 {
            p.commit().unwrap();
        } else {
            p.abort().unwrap();
        }
    }
    for i in 0..3 {
        assert!(!db.awaits_decision(format!("k{i}").as_bytes()));
    }
    put(&db, "k0", "after").unwrap();
    let expected = BTreeMap::from([
        ("k0".into(), "after".into()),
        ("k1".into(), "prepared".into()),
    ]);
    assert_eq!(contents(&db), expected);
}

/// The two-phase commit steps that do not block for the disk (`Txn::prepare_async`,
/// `Prepared::commit_nowait`, `abort_nowait`): the future gives the prepared transaction once
/// its frame is durable, a commit that did not wait becomes visible once its decision is
/// durable, a dropped future aborts, and both decisions survive power loss as the blocking
/// steps' do.
#[test]
fn prepares_and_decisions_that_do_not_wait_for_the_disk_survive_power_loss() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    let mut txn = db.begin().unwrap();
    txn.put(b"a", b"1").unwrap();
    let pending = txn.prepare_async(|_| b"txn-a".to_vec()).unwrap().unwrap();
    let prepared = block_on(pending).unwrap();
    let ts = prepared.commit_nowait().unwrap();
    block_on(db.visible(ts)).unwrap();
    assert_eq!(contents(&db), BTreeMap::from([("a".into(), "1".into())]));

    // Dropped before it resolved: aborted, its keys free at once.
    let mut txn = db.begin().unwrap();
    txn.put(b"b", b"dropped").unwrap();
    drop(txn.prepare_async(|_| b"txn-b".to_vec()).unwrap().unwrap());
    put(&db, "b", "2").unwrap();

    // `ready` hands out the transaction once durable, and `abort_nowait` gives it up.
    let mut txn = db.begin().unwrap();
    txn.put(b"c", b"aborted").unwrap();
    let mut pending = txn.prepare_async(|_| b"txn-c".to_vec()).unwrap().unwrap();
    let prepared = loop {
        if let Some(prepared) = pending.ready() {
            break prepared.unwrap();
        }
        std::thread::sleep(Duration::from_micros(100));
    };
    drop(pending); // spent: dropping it does nothing
    prepared.abort_nowait().unwrap();
    let ts = put(&db, "d", "4").unwrap();
    db.wait_visible(ts).unwrap();

    disk.crash();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(db.recovery().unwrap().in_doubt, 0);
    let expected = BTreeMap::from([
        ("a".into(), "1".into()),
        ("b".into(), "2".into()),
        ("d".into(), "4".into()),
    ]);
    assert_eq!(contents(&db), expected);
}

/// Commits logged after a prepared transaction, never acknowledged because it held the
/// watermark, come back invisible behind it until it is decided, here aborted.
#[test]
fn commits_after_a_transaction_in_doubt_stay_invisible_until_it_is_aborted() {
    let disk = SimDisk::new();
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    put(&db, "a", "1").unwrap();
    let mut txn = db.begin().unwrap();
    txn.put(b"a", b"2").unwrap();
    let prepared = txn.prepare(|_| b"txn-2".to_vec()).unwrap().unwrap();
    let frames = db.stats().log_frames;
    std::thread::scope(|s| {
        let later = s.spawn(|| put(&db, "b", "1"));
        while db.stats().log_frames == frames {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Power fails with the later commit's frame written but not acknowledged. The
        // abort cannot be logged any more: the log fails, which ends the later commit's wait.
        disk.crash_keep_written();
        drop(prepared);
        assert!(later.join().unwrap().is_err(), "never acknowledged");
    });
    drop(db);

    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(contents(&db), BTreeMap::from([("a".into(), "1".into())]));
    let prepared = db.in_doubt().pop().unwrap();
    assert_eq!(prepared.meta(), b"txn-2");
    let ts = prepared.ts();
    prepared.abort().unwrap();
    db.wait_visible(ts).unwrap();
    let expected = BTreeMap::from([("a".into(), "1".into()), ("b".into(), "1".into())]);
    assert_eq!(contents(&db), expected);
    disk.crash();
    drop(db);
    let db = Db::open(dir(), sim_options(&disk)).unwrap();
    assert_eq!(db.recovery().unwrap().in_doubt, 0);
    assert_eq!(contents(&db), expected);
}
