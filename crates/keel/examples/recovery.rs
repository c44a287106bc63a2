//! Restart time: how long `Db::open` takes to recover a database from its log alone, and
//! from a fresh checkpoint.
//!
//! `cargo run --release -p keel --example recovery -- [dir] [records]`
//! Writes `records` keys (8-byte keys, 100-byte values) in one process that then exits
//! without a checkpoint (as after a crash), reopens from the log, checkpoints, closes, and
//! reopens from the checkpoint. Prints times and log replay speed.
//! `-- dir records --write` only writes; `-- dir records --open` only opens what is there
//! (to profile recovery alone).

use std::process::Command;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "/tmp/keel-recovery".into());
    let records: u64 = args
        .get(2)
        .map_or(1_000_000, |a| a.parse().expect("records"));
    match args.get(3).map(String::as_str) {
        Some("--write") => return write(&dir, records),
        Some("--open") => {
            let started = Instant::now();
            let options = keel::Options::default().capacity_hint(records as usize);
            let db = keel::Db::open(&dir, options).expect("open");
            println!(
                "open: {:.2}s, {:?}",
                started.elapsed().as_secs_f64(),
                db.recovery()
            );
            // Leave without a checkpoint, so that the directory can be opened again.
            std::process::exit(0);
        }
        _ => {}
    }
    let _ = std::fs::remove_dir_all(&dir);
    let me = std::env::current_exe().expect("own path");
    let status = Command::new(me)
        .args([&dir, &records.to_string(), "--write"])
        .status()
        .expect("writer");
    assert!(status.success());
    let options = || keel::Options::default().capacity_hint(records as usize);

    let started = Instant::now();
    let db = keel::Db::open(&dir, options()).expect("open from the log");
    let from_log = started.elapsed();
    let recovery = db.recovery().expect("opened from files").clone();
    let mb = recovery.log_bytes as f64 / 1e6;
    println!(
        "from the log: {} commits, {mb:.0} MB replayed in {:.2}s ({:.0} MB/s of log; \
         ordered index {:.2}s of it; open total {:.2}s)",
        recovery.log_frames,
        recovery.elapsed.as_secs_f64(),
        mb / recovery.elapsed.as_secs_f64(),
        recovery.index_elapsed.as_secs_f64(),
        from_log.as_secs_f64()
    );
    let keys = db.stats().records;
    assert_eq!(
        keys,
        records + 1,
        "every record recovered (and the end marker)"
    );
    db.close().expect("close with a checkpoint");

    let started = Instant::now();
    let db = keel::Db::open(&dir, options()).expect("open from the checkpoint");
    let from_checkpoint = started.elapsed();
    let recovery = db.recovery().expect("opened from files");
    println!(
        "from a checkpoint: {:?}, {} log commits, ordered index {:.2}s, open total {:.2}s",
        recovery.checkpoint,
        recovery.log_frames,
        recovery.index_elapsed.as_secs_f64(),
        from_checkpoint.as_secs_f64()
    );
    assert_eq!(db.stats().records, records + 1);
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
}

fn write(dir: &str, records: u64) {
    let options = keel::Options::default()
        .capacity_hint(records as usize)
        .durability(keel::Durability::Async {
            interval: Duration::from_millis(10),
        })
        .checkpoint_log_bytes(u64::MAX)
        .checkpoint_interval(Duration::from_secs(1 << 30));
    let db = keel::Db::open(dir, options).expect("open for writing");
    let value = [5u8; 100];
    for chunk in (0..records).collect::<Vec<_>>().chunks(100) {
        let mut txn = db.begin().expect("begin");
        for k in chunk {
            txn.put(&k.to_be_bytes(), &value).expect("put");
        }
        txn.commit().expect("commit").expect("no conflict");
    }
    // Make it durable, then die without a checkpoint, as a crash would.
    let mut txn = db.begin().expect("begin");
    txn.set_durability(keel::Durability::Sync);
    txn.put(b"~end", b"").expect("put");
    txn.commit().expect("commit").expect("no conflict");
    std::process::exit(0);
}
