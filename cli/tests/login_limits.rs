//! Failed-login limits against the real `mailcluster serve`, over real sockets,
//! as an attacker uses them: many wrong passwords for one account at once, from
//! one address. At most the limit of them is checked (the rest are refused at
//! once), and afterwards the owner logs in from another address: guessing slows
//! and stops the guesser, never locks the owner out.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use common::TestDatabase;
use common::cluster::{ServeProcess, add_users, cluster_env};
use common::{redis_url, unique};

/// `auth.max_failures_per_user`'s default: failures of one user from one address.
const LIMIT: usize = 10;
const GUESSES: usize = 60;

/// A TCP connection to `to` from the loopback address `from` (127.0.0.0/8 is all
/// loopback on Linux, so each address is a client of its own to the server).
fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let local: IpAddr = from.parse().unwrap();
    socket.bind(&SocketAddr::new(local, 0).into()).expect("bind the client address");
    socket.connect_timeout(&to.into(), Duration::from_secs(5)).expect("connect");
    let stream: TcpStream = socket.into();
    // Generous: a failure's answer waits out its delay (up to 15 s by default).
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    stream
}

fn read_line(r: &mut BufReader<TcpStream>) -> String {
    let mut line = String::new();
    r.read_line(&mut line).expect("read");
    line.trim_end().to_string()
}

/// One IMAP LOGIN on a connection of its own: the tagged reply.
fn imap_login(from: &str, to: SocketAddr, user: &str, password: &str) -> String {
    let stream = connect_from(from, to);
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    assert!(read_line(&mut r).starts_with("* OK"), "greeting");
    write!(w, "a LOGIN \"{user}\" \"{password}\"\r\n").unwrap();
    loop {
        let line = read_line(&mut r);
        if line.starts_with("a ") || line.is_empty() {
            return line;
        }
    }
}

/// One POP3 USER/PASS on a connection of its own: the reply to PASS.
fn pop3_login(from: &str, to: SocketAddr, user: &str, password: &str) -> String {
    let stream = connect_from(from, to);
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    assert!(read_line(&mut r).starts_with("+OK"), "greeting");
    write!(w, "USER {user}\r\n").unwrap();
    assert!(read_line(&mut r).starts_with("+OK"), "USER");
    write!(w, "PASS {password}\r\n").unwrap();
    let reply = read_line(&mut r);
    let _ = write!(w, "QUIT\r\n");
    reply
}

/// `mail_auth_total{result="<result>"}` on the admin port.
fn auth_total(server: &ServeProcess, result: &str) -> u64 {
    let metrics = common::wire::http_get(server.admin, "/metrics").1;
    let series = format!("mail_auth_total{{result=\"{result}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.trim().parse().expect("a counter value"))
}

/// Sends `GUESSES` wrong passwords for `user` at once from `from`; returns the
/// replies.
fn guess_in_parallel(
    login: fn(&str, SocketAddr, &str, &str) -> String,
    from: &'static str,
    to: SocketAddr,
    user: &'static str,
) -> Vec<String> {
    let threads: Vec<_> = (0..GUESSES)
        .map(|i| std::thread::spawn(move || login(from, to, user, &format!("guess{i}"))))
        .collect();
    threads.into_iter().map(|t| t.join().expect("guess thread")).collect()
}

#[test]
fn parallel_guesses_are_cut_at_the_limit_and_the_owner_still_logs_in() {
    let db = TestDatabase::create_blocking("mc_login");
    let prefix = format!("{}:", unique("mclogin"));
    let redis = redis_url();
    let dir = tempfile::tempdir().unwrap();
    let env = cluster_env(&db.url, &redis, &prefix, "imap,pop3");
    add_users(dir.path(), &env, &["alice@example.org", "bob@example.org"], "owner's secret");
    let server = ServeProcess::start(dir.path(), &env, 2);
    server.wait_for_cache_up(Duration::from_secs(30));

    // IMAP: 60 wrong passwords for alice at once, from 127.0.0.1.
    let replies = guess_in_parallel(imap_login, "127.0.0.1", server.addr("imap"), "alice@example.org");
    let failed = replies.iter().filter(|r| r.starts_with("a NO [AUTHENTICATIONFAILED]")).count();
    let refused = replies.iter().filter(|r| r.starts_with("a NO [UNAVAILABLE]")).count();
    assert_eq!(failed + refused, GUESSES, "every guess answered NO: {replies:?}");
    assert!(failed <= LIMIT, "{failed} guesses were checked, more than the limit of {LIMIT}: {replies:?}");
    assert_eq!(auth_total(&server, "failed"), failed as u64, "checked = counted as failed");
    assert!(auth_total(&server, "rate_limited") >= (GUESSES - LIMIT) as u64);
    // The guesser is still refused, even with the right password.
    assert!(
        imap_login("127.0.0.1", server.addr("imap"), "alice@example.org", "owner's secret")
            .starts_with("a NO")
    );
    // The owner, from another address, logs in.
    let owner = imap_login("127.0.0.2", server.addr("imap"), "alice@example.org", "owner's secret");
    assert!(owner.starts_with("a OK"), "the owner is locked out: {owner}");

    // POP3: the same for bob, from 127.0.0.3.
    let checked_before = auth_total(&server, "failed");
    let replies = guess_in_parallel(pop3_login, "127.0.0.3", server.addr("pop3"), "bob@example.org");
    assert!(replies.iter().all(|r| r.starts_with("-ERR")), "{replies:?}");
    let checked = auth_total(&server, "failed") - checked_before;
    assert!(checked <= LIMIT as u64, "{checked} POP3 guesses were checked: {replies:?}");
    let owner = pop3_login("127.0.0.4", server.addr("pop3"), "bob@example.org", "owner's secret");
    assert!(owner.starts_with("+OK"), "the owner is locked out: {owner}");
}
