//! What clients can make a pod hold, against the real `mailcluster serve` (the
//! embedded store): literals before login, many large transfers at once under
//! the pod's memory limit, deadlines a busy client cannot stretch, and per-IP
//! connection caps. The server is a process of its own, so its resident memory
//! is measured from `/proc`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{ServeProcess, ephemeral_ports};
use common::run;

const MIB: u64 = 1024 * 1024;

/// A pod with one account, bob@example.org (password pw), serving SMTP, IMAP and
/// POP3 over plaintext with `extra` settings.
fn start(dir: &Path, extra: &[(&str, &str)]) -> ServeProcess {
    run(dir, &["domain", "add", "example.org"], &[]).ok();
    run(dir, &["user", "add", "bob@example.org", "--password", "pw"], &[]).ok();
    let mut env = ephemeral_ports();
    env.extend([
        ("MAILCLUSTER_PROTOCOLS", "smtp,submission,imap,pop3"),
        ("MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH", "true"),
        ("MAILCLUSTER_INBOUND__ENABLED", "false"),
    ]);
    env.extend_from_slice(extra);
    ServeProcess::start(dir, &env, 4)
}

/// A field of `/proc/<pid>/status` in bytes (VmRSS, VmHWM).
fn vm(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} missing"));
    let kb: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number");
    kb * 1024
}

fn connect(addr: SocketAddr) -> (BufReader<TcpStream>, TcpStream) {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let w = stream.try_clone().unwrap();
    (BufReader::new(stream), w)
}

fn line(r: &mut BufReader<TcpStream>) -> String {
    let mut l = String::new();
    r.read_line(&mut l).expect("a line");
    l
}

/// Clients arrive at a point, the test measures, then lets them go on. Unlike a
/// barrier it never hangs: a client that failed before arriving fails the wait.
#[derive(Default)]
struct Gate {
    arrived: AtomicUsize,
    open: AtomicBool,
}

impl Gate {
    fn arrive_and_wait(&self) {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(300);
        while !self.open.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the gate never opened");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_for(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(300);
        while self.arrived.load(Ordering::SeqCst) < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} clients arrived",
                self.arrived.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

/// An SMTP reply, its last line.
fn reply(r: &mut BufReader<TcpStream>) -> String {
    loop {
        let l = line(r);
        if l.as_bytes().get(3) != Some(&b'-') {
            return l;
        }
    }
}

/// Twelve unauthenticated IMAP clients announcing 40 MiB literals, then twenty
/// SMTP clients sending 24 MiB messages at the same moment: a pod given 512 MiB
/// stays far below it (a quarter of it may be in flight), the literals are
/// refused without a continuation, and every SMTP client gets an answer: its
/// message stored, or a temporary error to try again.
#[test]
fn many_large_transfers_at_once_stay_within_the_memory_limit() {
    const LIMIT: u64 = 512 * MIB;
    // Under the limit with an eighth to spare: a quarter of it in flight, the
    // rest taken by the process itself and the copies storing makes.
    const BOUND: u64 = LIMIT * 7 / 8;
    let dir = tempfile::tempdir().unwrap();
    let limit = LIMIT.to_string();
    let server = start(dir.path(), &[("MAILCLUSTER_NET__MEMORY_LIMIT_BYTES", limit.as_str())]);
    let pid = server.child.id();

    // IMAP: every client is answered before it sends the literal, or sends it
    // (all but its last octet, so that a server that reads them holds them all
    // at once) when told to go ahead.
    const LITERAL: usize = 40 * 1024 * 1024;
    let imap = server.addr("imap");
    let ready = Arc::new(Gate::default());
    let clients: Vec<_> = (0..12)
        .map(|_| {
            let ready = ready.clone();
            std::thread::spawn(move || {
                let (mut r, mut w) = connect(imap);
                assert!(line(&mut r).starts_with("* OK"));
                write!(w, "x LOGIN {{{LITERAL}}}\r\n").unwrap();
                let answer = line(&mut r);
                if answer.starts_with('+') {
                    let data = vec![b'a'; LITERAL - 1];
                    let _ = w.write_all(&data);
                }
                ready.arrive_and_wait();
                answer
            })
        })
        .collect();
    ready.wait_for(12);
    let after_literals = vm(pid, "VmHWM:");
    eprintln!("peak with the literals announced: {} MiB", after_literals / MIB);
    ready.open();
    for client in clients {
        let answer = client.join().expect("client");
        assert!(answer.starts_with("x BAD"), "a literal before login: {answer:?}");
    }

    // SMTP: twenty messages of 24 MiB, all content but the final dot sent before
    // any is ended.
    const MESSAGE: usize = 24 * 1024 * 1024;
    const SENDERS: usize = 20;
    let mut content = b"From: a@remote.test\r\nSubject: large\r\n\r\n".to_vec();
    let mut text_line = vec![b'x'; 998];
    text_line.extend_from_slice(b"\r\n");
    while content.len() < MESSAGE {
        content.extend_from_slice(&text_line);
    }
    let content = Arc::new(content);
    let smtp = server.addr("smtp");
    let sent = Arc::new(Gate::default());
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (sent, content) = (sent.clone(), content.clone());
            std::thread::spawn(move || {
                let (mut r, mut w) = connect(smtp);
                assert!(reply(&mut r).starts_with("220"));
                for (cmd, code) in [
                    ("EHLO c.test", "250"),
                    ("MAIL FROM:<a@remote.test>", "250"),
                    ("RCPT TO:<bob@example.org>", "250"),
                ] {
                    write!(w, "{cmd}\r\n").unwrap();
                    let answer = reply(&mut r);
                    assert!(answer.starts_with(code), "{cmd}: {answer}");
                }
                write!(w, "DATA\r\n").unwrap();
                let go = reply(&mut r);
                if !go.starts_with("354") {
                    sent.arrive_and_wait();
                    return go;
                }
                w.write_all(&content).unwrap();
                sent.arrive_and_wait();
                w.write_all(b".\r\n").unwrap();
                reply(&mut r)
            })
        })
        .collect();
    sent.wait_for(SENDERS);
    let after_messages = vm(pid, "VmRSS:");
    sent.open();
    let answers: Vec<String> = senders.into_iter().map(|s| s.join().expect("sender")).collect();
    let peak = vm(pid, "VmHWM:");
    let stored = answers.iter().filter(|a| a.starts_with("250")).count();
    let deferred = answers.iter().filter(|a| a.starts_with("452 4.3.1")).count();
    assert_eq!(stored + deferred, SENDERS, "every client answered, stored or deferred: {answers:?}");
    assert!(stored > 0 && deferred > 0, "{stored} stored, {deferred} deferred");
    eprintln!(
        "resident with messages in flight {} MiB, peak {} MiB; {stored} stored",
        after_messages / MIB,
        peak / MIB
    );
    assert!(peak < BOUND, "peak resident memory {} MiB, bound {} MiB", peak / MIB, BOUND / MIB);
    let metrics = common::wire::http_get(server.admin, "/metrics").1;
    let refusals: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("mail_transfer_refusals_total{protocol=\"smtp\"}"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum();
    assert!(refusals >= deferred as u64, "refusals counted: {metrics}");
    assert!(metrics.contains(&format!("mail_transfer_budget_limit_bytes {}", LIMIT / 4)), "{metrics}");
}

/// Before login a literal larger than a password is refused with BAD and no
/// continuation (the client sends nothing); small ones work as before, and
/// after login the usual limit holds. A non-synchronising literal above the cap
/// is already on its way: BAD, and the connection is closed (RFC 7888 §4).
#[test]
fn literals_before_login_are_capped_without_a_continuation() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let (mut r, mut w) = connect(server.addr("imap"));
    assert!(line(&mut r).starts_with("* OK"));
    write!(w, "a LOGIN {{9000}}\r\n").unwrap();
    let answer = line(&mut r);
    assert!(answer.starts_with("a BAD [TOOBIG]"), "{answer:?}");
    // The connection carries on, and literals of a login's size are continued.
    write!(w, "b LOGIN {{15}}\r\n").unwrap();
    assert!(line(&mut r).starts_with('+'));
    write!(w, "bob@example.org {{2}}\r\n").unwrap();
    assert!(line(&mut r).starts_with('+'));
    write!(w, "pw\r\n").unwrap();
    let mut answer = line(&mut r);
    while answer.starts_with('*') {
        answer = line(&mut r);
    }
    assert!(answer.starts_with("b OK"), "{answer:?}");
    write!(w, "c APPEND INBOX {{20000}}\r\n").unwrap();
    assert!(line(&mut r).starts_with('+'), "after login the usual limit");
    let mut message = b"Subject: after login\r\n\r\n".to_vec();
    message.resize(20000 - 2, b'y');
    message.extend_from_slice(b"\r\n");
    w.write_all(&message).unwrap();
    write!(w, "\r\n").unwrap();
    let answer = line(&mut r);
    assert!(answer.starts_with("c OK"), "{answer:?}");

    let (mut r, mut w) = connect(server.addr("imap"));
    assert!(line(&mut r).starts_with("* OK"));
    write!(w, "d LOGIN {{9000+}}\r\n").unwrap();
    let _ = w.write_all(&[b'z'; 9000]);
    let answer = line(&mut r);
    assert!(answer.starts_with("d BAD [TOOBIG]"), "{answer:?}");
    assert!(line(&mut r).starts_with("* BYE"));
    let mut rest = Vec::new();
    let _ = r.read_to_end(&mut rest);
}

/// A client that keeps every read of its message inside the data timeout but
/// never finishes is cut at the DATA deadline with 421 4.4.2.
#[test]
fn message_content_has_a_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[("MAILCLUSTER_SMTP__DATA_DEADLINE_SECS", "3")]);
    let (mut r, mut w) = connect(server.addr("smtp"));
    assert!(reply(&mut r).starts_with("220"));
    for cmd in ["EHLO c.test", "MAIL FROM:<a@remote.test>", "RCPT TO:<bob@example.org>", "DATA"] {
        write!(w, "{cmd}\r\n").unwrap();
        reply(&mut r);
    }
    let started = Instant::now();
    r.get_ref().set_nonblocking(true).unwrap();
    let mut seen = Vec::new();
    while started.elapsed() < Duration::from_secs(60) {
        if w.write_all(b"a slow line\r\n").is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
        let mut buf = [0u8; 512];
        match r.get_mut().read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
        if seen.ends_with(b"\r\n") {
            break;
        }
    }
    let took = started.elapsed();
    let seen = String::from_utf8_lossy(&seen);
    assert!(seen.starts_with("421 4.4.2"), "{seen:?} after {took:?}");
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(30), "{took:?}");
}

/// Before login a session ends at its deadline however busy the client keeps
/// it: IMAP and POP3 (NOOP, CAPA) and SMTP submission (NOOP) alike.
#[test]
fn unauthenticated_sessions_end_at_their_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &[
            ("MAILCLUSTER_IMAP__PREAUTH_TIMEOUT_SECS", "3"),
            ("MAILCLUSTER_POP3__PREAUTH_TIMEOUT_SECS", "3"),
            ("MAILCLUSTER_SMTP__PREAUTH_TIMEOUT_SECS", "3"),
            ("MAILCLUSTER_SMTP__MAX_JUNK_COMMANDS", "1000"),
        ],
    );
    let cases = [
        ("imap", "a NOOP", "a OK", "* BYE"),
        ("pop3", "CAPA", "+OK", "-ERR"),
        ("submission", "NOOP", "250", "421 4.7.0"),
    ];
    let threads: Vec<_> = cases
        .into_iter()
        .map(|(listener, keepalive, fine, end)| {
            let addr = server.addr(listener);
            std::thread::spawn(move || {
                let (mut r, mut w) = connect(addr);
                line(&mut r);
                let started = Instant::now();
                loop {
                    assert!(started.elapsed() < Duration::from_secs(30), "{listener}: never cut");
                    write!(w, "{keepalive}\r\n").unwrap_or_else(|e| panic!("{listener}: {e}"));
                    loop {
                        let answer = line(&mut r);
                        assert!(!answer.is_empty(), "{listener}: closed without a goodbye");
                        if answer.starts_with(end) {
                            return (listener, started.elapsed());
                        }
                        let complete = match listener {
                            "imap" => answer.starts_with(fine),
                            // CAPA's list ends with a dot.
                            "pop3" => answer.trim_end() == ".",
                            _ => answer.starts_with(fine) && answer.as_bytes().get(3) == Some(&b' '),
                        };
                        if complete {
                            break;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        })
        .collect();
    for t in threads {
        let (listener, took) = t.join().expect("client");
        assert!(took >= Duration::from_secs(2), "{listener} cut early: {took:?}");
    }
}

/// IMAP and POP3 take at most 256 connections from one address on a pod by
/// default (SMTP's cap); the next gets the protocol's busy reply, and a slot
/// freed is taken again.
#[test]
fn imap_and_pop3_connections_per_address_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    for (listener, greeting, busy) in
        [("imap", "* OK", "* BYE [UNAVAILABLE]"), ("pop3", "+OK", "-ERR [SYS/TEMP]")]
    {
        let addr = server.addr(listener);
        let mut open: Vec<_> = (0..256)
            .map(|i| {
                let (mut r, w) = connect(addr);
                let l = line(&mut r);
                assert!(l.starts_with(greeting), "{listener} connection {i}: {l:?}");
                (r, w)
            })
            .collect();
        let (mut r, _w) = connect(addr);
        let l = line(&mut r);
        assert!(l.starts_with(busy), "{listener} connection 257: {l:?}");
        drop(open.pop());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (mut r, _w) = connect(addr);
            let l = line(&mut r);
            if l.starts_with(greeting) {
                break;
            }
            assert!(Instant::now() < deadline, "{listener}: the freed slot never came back: {l:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
