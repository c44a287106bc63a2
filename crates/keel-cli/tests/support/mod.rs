//! Real cluster processes for the multi-process tests: `keel serve --cluster-node …` per
//! node on loopback, each killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A test's directory of node data and logs (`node-<n>.log`): removed when the test passes,
/// kept (its path printed) when it fails, for the logs of what went wrong.
pub struct TestDir(Option<tempfile::TempDir>);

impl TestDir {
    pub fn new() -> TestDir {
        TestDir(Some(tempfile::tempdir().expect("temp dir")))
    }

    pub fn path(&self) -> &Path {
        self.0.as_ref().expect("until dropped").path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.0.take()
        {
            eprintln!(
                "the nodes' data and logs are kept in {}",
                dir.keep().display()
            );
        }
    }
}

/// A node process, killed on drop.
pub struct Node {
    child: Option<Child>,
    pub port: u16,
    pub dir: PathBuf,
    pub index: usize,
    ports: Vec<u16>,
    extra: Vec<String>,
    /// Every node's host (127.0.0.1 unless started in network namespaces).
    hosts: Vec<std::net::IpAddr>,
    /// The network namespace the process runs in, if any (`ip netns exec`).
    netns: Option<String>,
    /// A node that joins a running replicated cluster through this node of it
    /// (`--cluster-join`) instead of being in the config.
    join: Option<std::net::SocketAddr>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Client ports for `n` (at most 8) nodes: block `block` (0 to 6) of this process's 56
/// ports in 10000-16719, chosen by process id, so that concurrent test runs rarely meet and
/// the tests of one run never do. Their bus ports (+ 10000) stay below the ephemeral range
/// (32768 up), where a client connection's local port could hold one.
pub fn ports(block: u16, n: usize) -> Vec<u16> {
    assert!(n <= 8 && block < 7, "8 nodes a block, 7 blocks a process");
    let base = 10_000 + (std::process::id() % 120) as u16 * 56 + block * 8;
    (0..n as u16).map(|i| base + i).collect()
}

impl Node {
    /// Starts node `index` of the cluster whose nodes listen on `ports` (the slots split
    /// evenly in order), with data under `dir/node-<index + 1>` and `sync` durability, not
    /// replicated (`--replicas 1`).
    pub fn start(dir: &Path, index: usize, ports: &[u16]) -> Node {
        Node::start_with(dir, index, ports, &["--replicas", "1"])
    }

    /// As [`Node::start`], with more `keel serve` arguments.
    pub fn start_with(dir: &Path, index: usize, ports: &[u16], extra: &[&str]) -> Node {
        let mut node = Node {
            child: None,
            port: ports[index],
            dir: dir.join(format!("node-{}", index + 1)),
            index,
            ports: ports.to_vec(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            hosts: vec![std::net::Ipv4Addr::LOCALHOST.into(); ports.len()],
            netns: None,
            join: None,
        };
        node.spawn();
        node
    }

    /// Starts node `n<index + 1>` on loopback port `port`, joining the replicated cluster
    /// that `seed` belongs to (`keel serve --cluster-join`), with data under
    /// `dir/node-<index + 1>`.
    pub fn join(dir: &Path, index: usize, port: u16, seed: std::net::SocketAddr) -> Node {
        let mut node = Node {
            child: None,
            port,
            dir: dir.join(format!("node-{}", index + 1)),
            index: 0,
            ports: vec![port],
            extra: vec!["--cluster-myself".into(), format!("n{}", index + 1)],
            hosts: vec![std::net::Ipv4Addr::LOCALHOST.into()],
            netns: None,
            join: Some(seed),
        };
        node.spawn();
        node
    }

    /// As [`Node::start_with`], node `index` in network namespace `netns[index]` at
    /// `hosts[index]` (every node on `port`), listening without protected mode.
    pub fn start_in_netns(
        dir: &Path,
        index: usize,
        hosts: &[std::net::IpAddr],
        port: u16,
        netns: &str,
        extra: &[&str],
    ) -> Node {
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        extra.extend(["--protected-mode".to_owned(), "no".to_owned()]);
        let mut node = Node {
            child: None,
            port,
            dir: dir.join(format!("node-{}", index + 1)),
            index,
            ports: vec![port; hosts.len()],
            extra,
            hosts: hosts.to_vec(),
            netns: Some(netns.to_owned()),
            join: None,
        };
        node.spawn();
        node
    }

    /// The node's client address.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.hosts[self.index], self.port)
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the process (again), and waits until it answers `PING`.
    pub fn spawn(&mut self) {
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_keel")]);
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_keel")),
        };
        command
            .args(["serve", "--durability", "sync", "--port"])
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(&self.dir);
        match self.join {
            Some(seed) => {
                command.arg("--cluster-join").arg(seed.to_string());
            }
            None => {
                for (i, port) in self.ports.iter().enumerate() {
                    let (start, end) =
                        keel_server::cluster_map::membership::even_range(i, self.ports.len());
                    let host = self.hosts[i];
                    command
                        .arg("--cluster-node")
                        .arg(format!("n{},{host}:{port},{start}-{end}", i + 1));
                }
                command
                    .arg("--cluster-myself")
                    .arg(format!("n{}", self.index + 1));
            }
        }
        command.args(&self.extra);
        // Transactions' steps, applied and driven, in the log a failed test keeps
        // (`TestDir`), unless the run asks for other logging.
        if std::env::var_os("RUST_LOG").is_none() {
            command.env(
                "RUST_LOG",
                "info,openraft=off,keel_server::replica::txn=debug,\
                 keel_server::replica::machine=debug",
            );
        }
        // Its log, kept for a failure message.
        let log_path = self.dir.with_extension("log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("node log");
        let child = command
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn keel serve");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(mut c) = connect_addr(self.addr())
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "node {} did not answer within 20 s; its log:\n{}",
            self.index + 1,
            self.log()
        );
    }

    /// What the node wrote to stderr, over all its runs.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default()
    }

    pub fn kill_9(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
    }

    /// Waits for the process to exit (after a signal that stops it).
    pub fn wait(&mut self) {
        let mut child = self.child.take().expect("running");
        child.wait().expect("wait");
    }

    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

pub fn connect(port: u16) -> redis::RedisResult<redis::Connection> {
    connect_addr(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
}

pub fn connect_addr(addr: std::net::SocketAddr) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    let c = client.get_connection_with_timeout(Duration::from_secs(1))?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(c)
}

/// Keys named `<prefix><number>`, `per` on each of `n` nodes' slots (split evenly), found with
/// `CLUSTER KEYSLOT` on `c`: `[node][i]`.
pub fn keys_per_node(
    c: &mut redis::Connection,
    n: usize,
    per: usize,
    prefix: &str,
) -> Vec<Vec<String>> {
    let mut keys = vec![Vec::new(); n];
    for i in 0.. {
        let name = format!("{prefix}{i}");
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&name)
            .query(c)
            .expect("keyslot");
        let node = owner(slot, n);
        if keys[node].len() < per {
            keys[node].push(name);
        }
        if keys.iter().all(|k| k.len() == per) {
            break;
        }
    }
    keys
}

/// The node (index) that owns `slot` when `n` nodes split the slots evenly.
pub fn owner(slot: u16, n: usize) -> usize {
    (0..n)
        .find(|&i| {
            let (s, e) = keel_server::cluster_map::membership::even_range(i, n);
            (s..=e).contains(&slot)
        })
        .expect("every slot is owned")
}

/// Sets its flag when dropped.
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
