//! `keel serve` as a process: the banner, SIGTERM exits 0 after a final checkpoint, and a
//! restart finds every acknowledged write.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Running {
    child: Child,
    addr: String,
    banner: Vec<String>,
}

/// A test that fails midway must not leave its server running: killed on drop (after a
/// clean SIGTERM exit this does nothing).
impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn start(dir: &std::path::Path, durability: &str) -> Running {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["serve", "--port", "0", "--durability", durability, "--dir"])
        .arg(dir);
    launch(command)
}

/// Spawns `command` (a `keel serve`) with its stdout piped.
fn spawn(mut command: Command) -> Child {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn keel serve")
}

/// Spawns `command` (a `keel serve`) and reads its banner: up to the recovery line, or the
/// split line when there are no files to recover.
fn launch(command: Command) -> Running {
    let mut child = spawn(command);
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut banner: Vec<String> = Vec::new();
    let mut addr = None;
    while banner.len() < 8 {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(a) = line.strip_prefix("listening on") {
            addr = Some(a.trim().to_string());
        }
        let in_memory = banner.iter().any(|l| l == "durability     none");
        let done = line.starts_with("recovery") || (in_memory && line.starts_with("split"));
        banner.push(line);
        if done {
            break;
        }
    }
    let addr = addr.unwrap_or_else(|| panic!("no address in banner {banner:?}"));
    Running {
        child,
        addr,
        banner,
    }
}

fn sigterm(mut r: Running) {
    let status = Command::new("kill")
        .args(["-TERM", &r.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    for _ in 0..200 {
        if let Some(status) = r.child.try_wait().expect("wait") {
            assert!(status.success(), "keel serve exited with {status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = r.child.kill();
    panic!("keel serve did not stop within 10 s of SIGTERM");
}

#[test]
fn restart_keeps_acknowledged_writes() {
    let dir = tempfile::tempdir().expect("temp dir");
    for durability in ["sync", "async:50"] {
        let first = start(dir.path(), durability);
        assert!(
            first.banner.iter().any(|l| l.contains(durability)),
            "{:?}",
            first.banner
        );
        let mut c = redis::Client::open(format!("redis://{}/", first.addr))
            .expect("url")
            .get_connection()
            .expect("connect");
        for i in 0..100 {
            let _: () = redis::cmd("SET")
                .arg(format!("{durability}:{i}"))
                .arg(i)
                .query(&mut c)
                .expect("SET");
        }
        let _: () = redis::pipe()
            .atomic()
            .cmd("INCRBY")
            .arg("total")
            .arg(5)
            .cmd("SET")
            .arg("last")
            .arg(durability)
            .query(&mut c)
            .expect("EXEC");
        drop(c);
        sigterm(first);

        let second = start(dir.path(), durability);
        assert!(
            second.banner.iter().any(|l| l.starts_with("recovery")),
            "{:?}",
            second.banner
        );
        let mut c = redis::Client::open(format!("redis://{}/", second.addr))
            .expect("url")
            .get_connection()
            .expect("connect");
        let n: i64 = redis::cmd("GET")
            .arg(format!("{durability}:99"))
            .query(&mut c)
            .expect("GET");
        assert_eq!(n, 99);
        let last: String = redis::cmd("GET").arg("last").query(&mut c).expect("GET");
        assert_eq!(last, durability);
        sigterm(second);
    }
    // Both runs' data is there: the second durability mode reopened the first one's files.
    let third = start(dir.path(), "sync");
    let mut c = redis::Client::open(format!("redis://{}/", third.addr))
        .expect("url")
        .get_connection()
        .expect("connect");
    let total: i64 = redis::cmd("GET").arg("total").query(&mut c).expect("GET");
    assert_eq!(total, 10);
    let keys: i64 = redis::cmd("DBSIZE").query(&mut c).expect("DBSIZE");
    assert_eq!(keys, 202);
    sigterm(third);
}

/// Deadlines are data: they survive a restart, and a key whose deadline passed while the
/// server was down is gone when it comes back (and the expirer deletes it).
#[test]
fn ttls_survive_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let connect = |r: &Running| {
        redis::Client::open(format!("redis://{}/", r.addr))
            .expect("url")
            .get_connection()
            .expect("connect")
    };
    let query = |c: &mut redis::Connection, args: &[&str]| -> redis::Value {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    };
    let int = |v: redis::Value| -> i64 { redis::from_redis_value(v).expect("an integer") };
    let first = start(dir.path(), "sync");
    let mut c = connect(&first);
    query(&mut c, &["SET", "long", "l", "EX", "1000"]);
    let set = std::time::Instant::now();
    query(&mut c, &["SET", "short", "s", "PX", "300"]);
    query(&mut c, &["SET", "plain", "p"]);
    let keys = int(query(&mut c, &["DBSIZE"]));
    // Before its deadline `short` counts; a loaded machine may get here after it, when the
    // expirer may have deleted it already.
    if set.elapsed() < Duration::from_millis(300) {
        assert_eq!(keys, 3);
    } else {
        assert!((2..=3).contains(&keys), "{keys} keys");
    }
    drop(c);
    sigterm(first);
    std::thread::sleep(Duration::from_millis(400));

    let second = start(dir.path(), "sync");
    let mut c = connect(&second);
    let ttl = int(query(&mut c, &["TTL", "long"]));
    assert!((990..=1000).contains(&ttl), "{ttl}");
    assert_eq!(
        query(&mut c, &["GET", "long"]),
        redis::Value::BulkString(b"l".to_vec())
    );
    assert_eq!(
        query(&mut c, &["GET", "plain"]),
        redis::Value::BulkString(b"p".to_vec())
    );
    assert_eq!(query(&mut c, &["GET", "short"]), redis::Value::Nil);
    assert_eq!(int(query(&mut c, &["TTL", "short"])), -2);
    let started = std::time::Instant::now();
    while int(query(&mut c, &["DBSIZE"])) != 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the expirer never deleted the short key"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    sigterm(second);
}

/// `--split` and `--split-phase-ms` (or `split` / `split-phase-ms` in `--config`) reach the
/// engine; bad values are refused before anything starts.
#[test]
fn split_settings_from_flags_and_file() {
    let keel = env!("CARGO_BIN_EXE_keel");
    let help = Command::new(keel)
        .args(["serve", "--help"])
        .output()
        .expect("keel serve --help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--split <auto|off|force>") && help.contains("--split-phase-ms <MS>"),
        "{help}"
    );
    for (args, message) in [
        (
            &["--split", "sometimes"][..],
            "split must be auto, off or force, not \"sometimes\"",
        ),
        (
            &["--split-phase-ms", "0"][..],
            "split-phase-ms must be between 1 and 10000",
        ),
    ] {
        let out = Command::new(keel)
            .args(["serve", "--port", "0", "--durability", "none"])
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("keel serve");
        assert!(!out.status.success(), "{args:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("keel.toml");
    std::fs::write(
        &file,
        "port = 0\ndurability = \"none\"\nsplit = \"force\"\nsplit-phase-ms = 7\n",
    )
    .expect("write keel.toml");
    let mut command = Command::new(keel);
    command.arg("serve").arg("--config").arg(&file);
    let running = launch(command);
    assert!(
        running
            .banner
            .iter()
            .any(|l| l == "split          force (phase 7 ms)"),
        "{:?}",
        running.banner
    );
    let mut c = redis::Client::open(format!("redis://{}/", running.addr))
        .expect("url")
        .get_connection()
        .expect("connect");
    let split: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("split*")
        .query(&mut c)
        .expect("CONFIG GET");
    assert_eq!(split, ["split", "force", "split-phase-ms", "7"]);
    drop(c);
    sigterm(running);
}

/// SIGTERM as soon as the first banner line appears (the server is still starting) is a
/// clean shutdown, not death by the signal's default action.
#[test]
fn sigterm_during_startup_exits_cleanly() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command
            .args(["serve", "--port", "0", "--dir"])
            .arg(dir.path());
        let mut child = spawn(command);
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next();
        assert!(
            matches!(first, Some(Ok(ref l)) if l.starts_with("keel ")),
            "{first:?}"
        );
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        // Keep reading: the rest of the banner and whatever shutdown prints.
        lines.for_each(drop);
        let status = child.wait().expect("wait");
        assert!(status.success(), "keel serve exited with {status}");
    }
}

/// `sync`: a reply means the write is in the log, fsynced.
#[test]
fn sigkill_under_sync_loses_no_acknowledged_write() {
    sigkill_loses_no_acknowledged_write("sync");
}

/// `async`: a reply means the write is in the log, written to the OS (not yet fsynced), as
/// with Redis's `appendfsync everysec`. A crash of the process alone loses none of it.
#[test]
fn sigkill_under_async_loses_no_acknowledged_write() {
    sigkill_loses_no_acknowledged_write("async:1000");
}

/// Clients write concurrently (single commands, pipelines, `MULTI`), the server is killed
/// with SIGKILL mid-stream, and a restart finds every acknowledged write, and each `MULTI`
/// whole or not at all.
fn sigkill_loses_no_acknowledged_write(durability: &str) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().expect("temp dir");
    let mut first = start(dir.path(), durability);
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|t| {
            let url = format!("redis://{}/", first.addr);
            let (acked, count) = (Arc::clone(&acked), Arc::clone(&count));
            std::thread::spawn(move || {
                let mut c = redis::Client::open(url)
                    .expect("url")
                    .get_connection()
                    .expect("connect");
                for i in 0.. {
                    let (one, p1, p2, m) = (
                        format!("one:{t}:{i}"),
                        format!("pipe:{t}:{i}:a"),
                        format!("pipe:{t}:{i}:b"),
                        format!("multi:{t}:{i}"),
                    );
                    let done = redis::cmd("SET").arg(&one).arg(i).query::<()>(&mut c);
                    if done.is_err() {
                        return;
                    }
                    acked.lock().unwrap().push(one);
                    let done = redis::pipe()
                        .cmd("SET")
                        .arg(&p1)
                        .arg(i)
                        .cmd("SET")
                        .arg(&p2)
                        .arg(i)
                        .query::<()>(&mut c);
                    if done.is_err() {
                        return;
                    }
                    acked.lock().unwrap().extend([p1, p2]);
                    let done = redis::pipe()
                        .atomic()
                        .cmd("SET")
                        .arg(format!("{m}:a"))
                        .arg(i)
                        .cmd("SET")
                        .arg(format!("{m}:b"))
                        .arg(i)
                        .query::<()>(&mut c);
                    if done.is_err() {
                        return;
                    }
                    acked
                        .lock()
                        .unwrap()
                        .extend([format!("{m}:a"), format!("{m}:b")]);
                    count.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    while count.load(Ordering::SeqCst) < 200 {
        std::thread::sleep(Duration::from_millis(5));
    }
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reaped");
    for client in clients {
        client.join().expect("client thread");
    }
    let acked = acked.lock().unwrap().clone();

    let second = start(dir.path(), durability);
    let mut c = redis::Client::open(format!("redis://{}/", second.addr))
        .expect("url")
        .get_connection()
        .expect("connect");
    for chunk in acked.chunks(500) {
        let found: i64 = redis::cmd("EXISTS")
            .arg(chunk)
            .query(&mut c)
            .expect("EXISTS");
        assert_eq!(
            found,
            chunk.len() as i64,
            "an acknowledged write is missing"
        );
    }
    let multis: Vec<String> = redis::cmd("KEYS")
        .arg("multi:*")
        .query(&mut c)
        .expect("KEYS");
    for key in &multis {
        let other = match key.strip_suffix(":a") {
            Some(stem) => format!("{stem}:b"),
            None => format!("{}:a", key.strip_suffix(":b").expect("a or b")),
        };
        assert!(multis.contains(&other), "{key} recovered without {other}");
    }
    assert!(acked.len() >= 1000);
    sigterm(second);
}

/// Waits (at most 10 s) until the engine holds no records beyond a few of its own: the
/// collector has freed everything deleted. `keel_records` (`INFO keel`) is exact, where RSS
/// moves by ±10 MiB from round to round on this machine.
fn wait_until_records_are_gone(c: &mut redis::Connection, round: usize) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO").arg("keel").query(c).expect("INFO");
        let records: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("keel_records:"))
            .expect("keel_records in INFO")
            .trim()
            .parse()
            .expect("a count");
        if records <= 16 {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "round {round}: {records} records left 10 s after every key was gone"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Resident memory of process `pid`, from /proc.
fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// Issue 23's finding through the server: rounds of SET on keys never used before, then DEL
/// of them all, used to grow the server by ~190 bytes a key for good. Now the collector
/// gives deleted keys' memory back and the server stays the size it settled at.
#[test]
fn a_server_that_creates_and_deletes_keys_stays_bounded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = start(dir.path(), "none");
    let mut c = redis::Client::open(format!("redis://{}/", server.addr))
        .expect("url")
        .get_connection()
        .expect("connect");
    const KEYS: usize = 40_000;
    let mut rss = Vec::new();
    for round in 0..10 {
        let keys: Vec<String> = (0..KEYS).map(|i| format!("churn:{round}:{i}")).collect();
        for chunk in keys.chunks(1000) {
            let mut pipe = redis::pipe();
            for k in chunk {
                pipe.cmd("SET").arg(k).arg("a session value").ignore();
            }
            let _: () = pipe.query(&mut c).expect("SET");
        }
        let size: i64 = redis::cmd("DBSIZE").query(&mut c).expect("DBSIZE");
        assert_eq!(size, KEYS as i64);
        for chunk in keys.chunks(1000) {
            let deleted: i64 = redis::cmd("DEL").arg(chunk).query(&mut c).expect("DEL");
            assert_eq!(deleted, chunk.len() as i64);
        }
        let size: i64 = redis::cmd("DBSIZE").query(&mut c).expect("DBSIZE");
        assert_eq!(size, 0);
        wait_until_records_are_gone(&mut c, round);
        rss.push(rss_of(server.child.id()));
    }
    let mib: Vec<u64> = rss.iter().map(|b| b >> 20).collect();
    // Without reclamation: ~7 MiB more a round, 40 MiB over these six; RSS moves by ±10 MiB
    // between rounds here, so the exact check is the record count above.
    assert!(
        rss[7..].iter().max() <= Some(&(rss[..4].iter().max().unwrap() + (24 << 20))),
        "the server kept growing (MiB per round): {mib:?}"
    );
    drop(c);
    sigterm(server);
}

/// Issue 21's churn test: collections created and then deleted or left to expire, round after
/// round. Their fields, size records and meta records must come back (the graveyard sweeper
/// deletes a dropped collection's fields, the expirer deletes expired keys, and the engine's
/// collector frees what they deleted), so the server's memory stays flat.
#[test]
fn a_server_that_churns_collections_and_ttls_stays_bounded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = start(dir.path(), "none");
    let mut c = redis::Client::open(format!("redis://{}/", server.addr))
        .expect("url")
        .get_connection()
        .expect("connect");
    const HASHES: usize = 2_000;
    const FIELDS: usize = 10;
    let mut rss = Vec::new();
    for round in 0..10 {
        for chunk in (0..HASHES).collect::<Vec<_>>().chunks(100) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                let key = format!("churn:{round}:{i}");
                let mut hset = redis::cmd("HSET");
                hset.arg(&key);
                for f in 0..FIELDS {
                    hset.arg(format!("field{f}")).arg("a session value");
                }
                pipe.add_command(hset).ignore();
                if i % 2 == 1 {
                    // Half expire (nobody reads them again), half are deleted.
                    pipe.cmd("PEXPIRE").arg(&key).arg(1).ignore();
                }
            }
            let _: () = pipe.query(&mut c).expect("HSET");
        }
        let deleted: i64 = redis::cmd("DEL")
            .arg(
                (0..HASHES)
                    .step_by(2)
                    .map(|i| format!("churn:{round}:{i}"))
                    .collect::<Vec<_>>(),
            )
            .query(&mut c)
            .expect("DEL");
        assert_eq!(deleted, (HASHES / 2) as i64);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let size: i64 = redis::cmd("DBSIZE").query(&mut c).expect("DBSIZE");
            if size == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "{size} keys never expired"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The sweeper deletes the dropped hashes' fields, then the collector frees the
        // records.
        wait_until_records_are_gone(&mut c, round);
        rss.push(rss_of(server.child.id()));
    }
    let mib: Vec<u64> = rss.iter().map(|b| b >> 20).collect();
    // RSS is noisy here (±10 MiB between rounds, and a round that ends as the collector
    // swaps in a rebuilt index holds both for a moment: one CI run saw 104 MiB among rounds
    // of 72-86); without the sweeper it grows ~4 MiB a round. The median of the last three
    // rounds against the first four: a spike does not count, steady growth does.
    let mut last = rss[7..].to_vec();
    last.sort_unstable();
    assert!(
        last[1] <= rss[..4].iter().max().unwrap() + (16 << 20),
        "the server kept growing (MiB per round): {mib:?}"
    );
    drop(c);
    sigterm(server);
}

/// Issue 21's crash loop with types: cycles of clients writing hash fields, counting with
/// `HINCRBY` and giving keys TTLs, each cycle ended by SIGKILL under `sync`; every restart must
/// find every acknowledged field with its value, every counter at least at its acknowledged
/// count (at most one increment more per client: the one in flight), every long TTL still
/// set, and no key whose TTL passed.
#[test]
fn crash_loop_keeps_types_and_ttls() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    const CLIENTS: usize = 3;
    let dir = tempfile::tempdir().expect("temp dir");
    // (hash, field, value) acknowledged; per client, increments acknowledged.
    let fields = Arc::new(Mutex::new(Vec::<(String, String, u64)>::new()));
    let increments = Arc::new(Mutex::new(vec![0u64; CLIENTS]));
    for cycle in 0..4u64 {
        let server = start(dir.path(), "sync");
        let mut c = redis::Client::open(format!("redis://{}/", server.addr))
            .expect("url")
            .get_connection()
            .expect("connect");
        // What the previous cycles acknowledged is all there.
        for chunk in fields.lock().unwrap().chunks(200) {
            let mut pipe = redis::pipe();
            for (h, f, _) in chunk {
                pipe.cmd("HGET").arg(h).arg(f);
            }
            let got: Vec<Option<u64>> = pipe.query(&mut c).expect("HGET");
            for ((h, f, v), got) in chunk.iter().zip(got) {
                assert_eq!(got, Some(*v), "cycle {cycle}: {h} {f} lost");
            }
        }
        for (t, &acked) in increments.lock().unwrap().iter().enumerate() {
            let n: Option<u64> = redis::cmd("HGET")
                .arg("counters")
                .arg(format!("c{t}"))
                .query(&mut c)
                .expect("HGET");
            let n = n.unwrap_or(0);
            assert!(
                n >= acked && n <= acked + cycle,
                "cycle {cycle}: counter {t} is {n}, {acked} acknowledged"
            );
        }
        for t in 0..CLIENTS {
            let ttl: i64 = redis::cmd("TTL")
                .arg(format!("long:{t}"))
                .query(&mut c)
                .expect("TTL");
            assert!(
                cycle == 0 || ttl > 0,
                "cycle {cycle}: long:{t} lost its TTL ({ttl})"
            );
            let short: i64 = redis::cmd("EXISTS")
                .arg(format!("short:{t}"))
                .query(&mut c)
                .expect("EXISTS");
            assert_eq!(short, 0, "cycle {cycle}: short:{t} outlived its TTL");
        }

        let count = Arc::new(AtomicUsize::new(0));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|t| {
                let url = format!("redis://{}/", server.addr);
                let (fields, increments, count) = (
                    Arc::clone(&fields),
                    Arc::clone(&increments),
                    Arc::clone(&count),
                );
                std::thread::spawn(move || {
                    let mut c = redis::Client::open(url)
                        .expect("url")
                        .get_connection()
                        .expect("connect");
                    let setup = redis::pipe()
                        .cmd("SET")
                        .arg(format!("long:{t}"))
                        .arg("v")
                        .arg("EX")
                        .arg(3600)
                        .cmd("SET")
                        .arg(format!("short:{t}"))
                        .arg("v")
                        .arg("PX")
                        .arg(1)
                        .query::<()>(&mut c);
                    if setup.is_err() {
                        return;
                    }
                    for i in 0u64.. {
                        let (h, f) = (format!("h:{cycle}:{t}:{}", i % 7), format!("f{i}"));
                        let done = redis::pipe()
                            .atomic()
                            .cmd("HSET")
                            .arg(&h)
                            .arg(&f)
                            .arg(i)
                            .cmd("HINCRBY")
                            .arg("counters")
                            .arg(format!("c{t}"))
                            .arg(1)
                            .query::<()>(&mut c);
                        if done.is_err() {
                            return;
                        }
                        fields.lock().unwrap().push((h, f, i));
                        increments.lock().unwrap()[t] += 1;
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        // The clients stop at their first error, so a server that died, or stopped
        // answering, would leave this waiting forever: fail instead, saying which.
        let mut server = server;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while count.load(Ordering::SeqCst) < 150 {
            if let Some(status) = server.child.try_wait().expect("server status") {
                panic!("cycle {cycle}: the server exited on its own: {status}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "cycle {cycle}: {} transactions acknowledged in 60 s",
                count.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        server.child.kill().expect("SIGKILL");
        server.child.wait().expect("reaped");
        for client in clients {
            client.join().expect("client thread");
        }
    }
    assert!(fields.lock().unwrap().len() >= 450);
}
