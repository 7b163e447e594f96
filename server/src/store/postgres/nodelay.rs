//! TCP_NODELAY for the PostgreSQL connections.
//!
//! sqlx 0.9.0 opens its TCP connections without TCP_NODELAY (a regression upstream:
//! transact-rs/sqlx#4335, fixed by #4336 after the 0.9.0 release, which is the
//! newest one published). With Nagle's algorithm on, every statement larger than
//! one TCP segment — a group-commit INSERT of message bodies always is — leaves its
//! tail waiting for PostgreSQL's delayed ACK, about 40 ms. Measured with
//! `server/examples/smtp_bench_{server,client}`, 50 sessions of 4 KB messages to one
//! mailbox: 935 msg/s with P50 52 ms over TCP, against 6,361 msg/s with P50 7 ms over
//! the Unix socket, where Nagle does not exist. sqlx has no hook to reach the socket,
//! so after each new connection the process's own sockets to the database port get
//! the option set here. Remove this module once a sqlx release sets it again.

use std::os::fd::{BorrowedFd, RawFd};

/// Sets TCP_NODELAY on every TCP socket of this process connected to `port` that
/// does not have it yet; returns how many were changed. Linux only (`/proc`); a
/// no-op elsewhere.
pub fn set_on_connections_to(port: u16) -> usize {
    let mut changed = 0;
    for_each_socket_to(port, |sock| {
        if sock.tcp_nodelay().is_ok_and(|on| !on) && sock.set_tcp_nodelay(true).is_ok() {
            changed += 1;
        }
    });
    changed
}

/// TCP sockets of this process connected to `port` without TCP_NODELAY.
pub fn connections_without(port: u16) -> usize {
    let mut count = 0;
    for_each_socket_to(port, |sock| {
        if sock.tcp_nodelay().is_ok_and(|on| !on) {
            count += 1;
        }
    });
    count
}

fn for_each_socket_to(port: u16, mut f: impl FnMut(socket2::SockRef<'_>)) {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    for entry in dir.flatten() {
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.as_os_str().as_encoded_bytes().starts_with(b"socket:"));
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<RawFd>().ok()) else { continue };
        if !is_socket {
            continue;
        }
        with_borrowed(fd, |borrowed| {
            let sock = socket2::SockRef::from(&borrowed);
            let to_port = sock.peer_addr().ok().and_then(|a| a.as_socket()).is_some_and(|a| a.port() == port);
            if to_port {
                f(sock);
            }
        });
    }
}

#[allow(unsafe_code)]
fn with_borrowed(fd: RawFd, f: impl FnOnce(BorrowedFd<'_>)) {
    // SAFETY: `fd` was listed as an open socket of this process a moment ago and is
    // used only for getsockopt/getpeername/setsockopt(TCP_NODELAY) within this call.
    // If another thread closes it meanwhile, the calls fail with EBADF; if the
    // number is reused, they reach another descriptor of this process, where only
    // a socket connected to the database port would be changed, and only by
    // enabling TCP_NODELAY. No memory is touched through the descriptor.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    f(borrowed);
}
