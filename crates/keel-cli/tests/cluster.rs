//! `keel cluster demo` and `keel serve --cluster` as processes: the demo prints its nodes,
//! any node serves any key, SIGINT stops every node; a bad cluster config is refused with
//! the reason.

use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Killed on drop, so that a failing test leaves nothing running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits (at most 20 s) for the process to exit; its status.
fn wait(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the process did not exit within 20 s");
}

/// Starts `keel cluster demo 3` on free ports; the process, its nodes' addresses, and the rest
/// of its output.
fn demo() -> (
    Running,
    Vec<String>,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["cluster", "demo", "3", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn keel cluster demo");
    let mut running = Running(child);
    let stdout = running.0.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut addrs = Vec::new();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("stdout");
        if let Some(rest) = line.trim().strip_prefix("node-") {
            let addr = rest.split_whitespace().nth(1).expect("address").to_owned();
            addrs.push(addr);
        }
        let done = line.starts_with("Ctrl-C");
        seen.push(line);
        if done {
            break;
        }
    }
    assert_eq!(addrs.len(), 3, "{seen:#?}");
    assert!(seen.iter().any(|l| l.contains("redis-cli -p")), "{seen:#?}");
    (running, addrs, lines)
}

#[test]
fn demo_starts_serves_and_stops_on_sigint() {
    let (mut running, addrs, lines) = demo();
    let clients: Vec<redis::Connection> = addrs
        .iter()
        .map(|a| {
            redis::Client::open(format!("redis://{a}/"))
                .expect("url")
                .get_connection_with_timeout(Duration::from_secs(10))
                .expect("connect")
        })
        .collect();
    let mut clients = clients;
    for i in 0..30 {
        let key = format!("key{i}");
        let () = redis::cmd("SET")
            .arg(&key)
            .arg(i)
            .query(&mut clients[i % 3])
            .expect("SET through any node");
        let v: i64 = redis::cmd("GET")
            .arg(&key)
            .query(&mut clients[(i + 1) % 3])
            .expect("GET through another node");
        assert_eq!(v, i as i64);
    }
    let status = Command::new("kill")
        .args(["-INT", &running.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let status = wait(&mut running.0);
    assert!(status.success(), "keel cluster demo exited with {status}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|l| l == "stopping 3 nodes"), "{rest:#?}");
}

#[test]
fn serve_refuses_a_bad_cluster_config() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("cluster.toml");
    let mut file = std::fs::File::create(&path).expect("create");
    write!(
        file,
        "myself = \"n1\"\n\
         [[node]]\nid = \"n1\"\naddr = \"127.0.0.1:7001\"\nslots = \"0-9000\"\n\
         [[node]]\nid = \"n2\"\naddr = \"127.0.0.1:7002\"\nslots = \"9000-16383\"\n"
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["serve", "--durability", "none", "--cluster"])
        .arg(&path)
        .output()
        .expect("run keel serve");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("slot 9000 is owned by both n1 and n2"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["serve", "--durability", "none"])
        .args(["--cluster-node", "n1,127.0.0.1:7001,0-16383"])
        .args(["--cluster-myself", "n2"])
        .output()
        .expect("run keel serve");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("this node, \"n2\", is not among the cluster's nodes (n1)"),
        "{stderr}"
    );
}

/// redis-py's `RedisCluster` (Debian's python3-redis, which `.ci/run` installs) bootstraps from
/// one node with `CLUSTER SLOTS` and `COMMAND`, then sends each command straight to its
/// key's owner: keys land on every node, and each reads back through the cluster client;
/// commands whose keys move (`ZUNIONSTORE`, `LMPOP`, `SORT`) route by `COMMAND GETKEYS`.
#[test]
fn redis_py_cluster_client_bootstraps_and_routes() {
    let (_running, addrs, _lines) = demo();
    let (host, port) = addrs[1].rsplit_once(':').expect("host:port");
    let script = r#"
import sys
from redis.cluster import RedisCluster
rc = RedisCluster(host=sys.argv[1], port=int(sys.argv[2]), socket_timeout=10)
owners = set()
for i in range(300):
    key = "py:%d" % i
    assert rc.set(key, str(i)) is True
    owners.add(rc.get_node_from_key(key).port)
for i in range(300):
    assert rc.get("py:%d" % i) == str(i).encode(), i
assert rc.incr("{tag}n") == 1 and rc.incr("{tag}n") == 2
# Commands whose keys move: routed by the keys COMMAND GETKEYS names.
rc.zadd("{z}a", {"x": 1}); rc.zadd("{z}b", {"y": 2}); rc.rpush("{z}l", "p")
assert rc.zunionstore("{z}c", ["{z}a", "{z}b"]) == 2
assert rc.zinter(["{z}a", "{z}c"]) == [b"x"]
assert rc.lmpop(2, "{z}l", "{z}m", direction="LEFT") == [b"{z}l", [b"p"]]
assert rc.sort("{z}c", alpha=True) == [b"x", b"y"]
assert len(rc.get_nodes()) == 3, rc.get_nodes()
assert len(owners) == 3, owners
print("ok")
"#;
    let out = Command::new("/usr/bin/python3")
        .args(["-c", script, host, port])
        .output()
        .expect("/usr/bin/python3 must be installed, with python3-redis (apt-get install python3-redis)");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "redis-py RedisCluster failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
