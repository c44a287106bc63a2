//! Server mode against a real `redis-server`, started on a free loopback port and stopped
//! when the test ends.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keel_bench::resp::Server;
use keel_bench::target::Target;
use keel_bench::workload::Workload;

use crate::smoke;

struct Redis {
    child: Child,
    addr: String,
}

impl Redis {
    fn start() -> Redis {
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("a free port")
            .local_addr()
            .expect("address")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Redis { child, addr }
    }

    fn open(&self, workload: Workload, depth: usize) -> Box<dyn Target> {
        // A fresh database for every run.
        let mut c = keel_bench::resp::Conn::connect(&self.addr).expect("connect");
        c.call(&[b"FLUSHALL"]).expect("FLUSHALL");
        Box::new(
            Server::connect(
                "redis",
                &self.addr,
                depth,
                workload,
                Default::default(),
                None,
            )
            .expect("connect"),
        )
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn redis_server_mode() {
    let redis = Redis::start();
    for depth in [1, 8] {
        smoke::incr1(&|_| redis.open(Workload::Incr1, depth));
        smoke::deut(&|_| redis.open(Workload::Deut, depth), Workload::Deut);
        smoke::deut(
            &|_| redis.open(Workload::DeutWrite, depth),
            Workload::DeutWrite,
        );
    }
    let err = Server::connect(
        "redis",
        &redis.addr,
        1,
        Workload::YcsbE,
        Default::default(),
        None,
    )
    .err()
    .expect("scans have no RESP mapping");
    assert!(err.to_string().contains("not supported"), "{err}");
}
