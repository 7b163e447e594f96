//! Helpers for tests that run the real `mailcluster` binary.
#![allow(dead_code)]

pub mod cluster;
pub mod redis;
pub mod wire;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_mailcluster");

pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn ok(&self) -> &Self {
        assert_eq!(self.code, Some(0), "expected success\nstdout: {}\nstderr: {}", self.stdout, self.stderr);
        self
    }
    /// The single error line the binary prints on failure.
    pub fn error_line(&self) -> &str {
        let lines: Vec<&str> = self.stderr.lines().filter(|l| l.contains("mailcluster: error:")).collect();
        assert_eq!(lines.len(), 1, "exactly one error line expected in: {}", self.stderr);
        lines[0]
    }
    pub fn assert_no_panic(&self) {
        assert!(!self.stderr.contains("panicked"), "panic: {}", self.stderr);
        assert!(!self.stderr.contains("RUST_BACKTRACE"), "backtrace hint: {}", self.stderr);
    }
}

/// A command with a clean environment: nothing `MAILCLUSTER_*` or `RUST_LOG` leaks
/// in from the machine running the tests, and `cwd` holds the default data dir.
pub fn command(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).current_dir(cwd).env_clear();
    for keep in ["PATH", "HOME", "TMPDIR"] {
        if let Ok(v) = std::env::var(keep) {
            cmd.env(keep, v);
        }
    }
    cmd.envs(env.iter().copied());
    cmd
}

/// Runs to completion (at most `limit`), feeding `stdin`.
pub fn run_with(cwd: &Path, args: &[&str], env: &[(&str, &str)], stdin: &str, limit: Duration) -> Output {
    let mut child = command(cwd, args, env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mailcluster");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).expect("write stdin");
    drop(input);
    wait_output(child, limit)
}

pub fn run(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    run_with(cwd, args, env, "", Duration::from_secs(60))
}

/// Waits for `child` (killing it after `limit`) while draining its output.
pub fn wait_output(mut child: Child, limit: Duration) -> Output {
    let mut out = child.stdout.take().expect("stdout piped");
    let mut err = child.stderr.take().expect("stderr piped");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mailcluster did not finish within {limit:?}: {}", err_t.join().unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        code: status.code(),
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
    }
}

// Each test file uses some of these.
#[allow(unused_imports)]
pub use mailcluster_testkit::{TestDatabase, database_url, redis_url, unique, with_database};
