//! Small clients that report what happened instead of asserting it, for tests that
//! count outcomes under faults (an outage, a failover): an admin endpoint's status,
//! one SMTP delivery's verdict, one IMAP exchange's tagged replies.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// `GET path` on the admin port: (status, body); (0, "") when nothing answers.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// The last line of the next SMTP reply (multi-line replies end with `NNN `).
fn smtp_reply(r: &mut BufReader<TcpStream>) -> Result<String, String> {
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("connection closed".into());
        }
        if line.as_bytes().get(3) != Some(&b'-') {
            return Ok(line.trim_end().to_string());
        }
    }
}

/// One delivery to `rcpt` on a connection of its own: the verdict on the message —
/// the first reply that is not positive, or the reply to the end of DATA — and the
/// time from connecting to that verdict. `Err` is an I/O failure (a timeout, a
/// closed connection), which a server must never cause.
pub fn smtp_try(addr: SocketAddr, rcpt: &str, n: usize) -> Result<(String, Duration), String> {
    let start = Instant::now();
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    smtp_reply(&mut r)?;
    for cmd in [
        "EHLO load.test".to_string(),
        "MAIL FROM:<load@remote.test>".into(),
        format!("RCPT TO:<{rcpt}>"),
        "DATA".into(),
    ] {
        write!(w, "{cmd}\r\n").map_err(|e| e.to_string())?;
        let line = smtp_reply(&mut r).map_err(|e| format!("{cmd}: {e}"))?;
        if !(line.starts_with('2') || line.starts_with('3')) {
            return Ok((line, start.elapsed()));
        }
    }
    write!(w, "From: load@remote.test\r\nSubject: load {n}\r\nMessage-ID: <load-{n}@remote.test>\r\n\r\nmessage {n}\r\n.\r\n")
        .map_err(|e| e.to_string())?;
    let verdict = smtp_reply(&mut r).map_err(|e| format!("end of DATA: {e}"))?;
    let took = start.elapsed();
    let _ = write!(w, "QUIT\r\n");
    Ok((verdict, took))
}

/// LOGIN (then each of `commands`, tagged b, c, …) on a connection of its own: the
/// tagged reply lines in order, stopping after the first that is not OK.
pub fn imap_exchange(
    addr: SocketAddr,
    user: &str,
    password: &str,
    commands: &[&str],
) -> Result<Vec<String>, String> {
    Ok(imap_session(addr, user, password, commands)?.0)
}

/// As [`imap_exchange`], every line the server sent (untagged ones in order
/// among the tagged ones).
pub fn imap_transcript(
    addr: SocketAddr,
    user: &str,
    password: &str,
    commands: &[&str],
) -> Result<Vec<String>, String> {
    Ok(imap_session(addr, user, password, commands)?.1)
}

/// (tagged replies, every line) of one session.
fn imap_session(
    addr: SocketAddr,
    user: &str,
    password: &str,
    commands: &[&str],
) -> Result<(Vec<String>, Vec<String>), String> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    let mut greeting = String::new();
    r.read_line(&mut greeting).map_err(|e| e.to_string())?;
    let login = format!("LOGIN {user} {password}");
    let (mut replies, mut lines) = (Vec::new(), Vec::new());
    for (i, cmd) in std::iter::once(login.as_str()).chain(commands.iter().copied()).enumerate() {
        let tag = char::from(b'a' + i as u8);
        write!(w, "{tag} {cmd}\r\n").map_err(|e| e.to_string())?;
        let reply = loop {
            let mut line = String::new();
            if r.read_line(&mut line).map_err(|e| format!("{cmd}: {e}"))? == 0 {
                return Err(format!("{cmd}: connection closed"));
            }
            if line.starts_with(&format!("{tag} ")) {
                break line.trim_end().to_string();
            }
            lines.push(line.trim_end().to_string());
        };
        let ok = reply.starts_with(&format!("{tag} OK"));
        lines.push(reply.clone());
        replies.push(reply);
        if !ok {
            break;
        }
    }
    let _ = write!(w, "z LOGOUT\r\n");
    Ok((replies, lines))
}
