//! redis-server processes of a test's own (data nodes, replicas, Sentinels), on free
//! ports, so that tests that kill or fail over Redis leave the shared one alone.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free port on 127.0.0.1 (bound, then released for the server to take).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A redis-server process (data node or Sentinel); killed on drop.
pub struct RedisProcess(Child);

impl RedisProcess {
    pub fn start(args: &[&str], port: u16) -> RedisProcess {
        let child = Command::new("redis-server")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (scripts/test.sh installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisProcess(child)
    }

    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn data_node(port: u16, dir: &Path, extra: &[&str]) -> RedisProcess {
    let port_s = port.to_string();
    let mut args = vec!["--bind", "127.0.0.1", "--port", &port_s, "--save", "", "--appendonly", "no"];
    let dir_s = dir.to_str().unwrap().to_string();
    args.extend(["--dir", &dir_s]);
    args.extend_from_slice(extra);
    RedisProcess::start(&args, port)
}
