//! Input-controlled depth against the real listeners (IMAP and POP3 over TCP on
//! 127.0.0.1:0, the embedded store): a References chain 100,000 ids long, MIME
//! parts nested 10,000 deep and search criteria chained 10,000 deep each get an
//! answer (a result, or BAD/NO) within a generous bound, and the server is still
//! there for the next command. A stack overflow aborts the whole process, this
//! test binary included.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use mailcluster_server::imap::ImapProtocol;
use mailcluster_server::net::listener::TlsMode;
use mailcluster_server::pop3::Pop3Protocol;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::net::TcpStream;

/// Generous: a debug build on a loaded CI machine. What is asserted is an
/// answer and a live server, not speed.
const ANSWER_WITHIN: Duration = Duration::from_secs(120);

struct Server {
    imap: SocketAddr,
    pop3: SocketAddr,
    _dir: tempfile::TempDir,
}

/// bob@example.org (password "pw") with an empty INBOX, served over plain
/// IMAP and POP3 with the default limits (literals up to 8 MiB for the APPENDs).
async fn server() -> Server {
    let (app, dir) = embedded_app(|c| {
        c.tls.allow_plaintext_auth = true;
        c.imap.max_literal_bytes = 8 * 1024 * 1024;
    })
    .await;
    account(&app, "bob@example.org", "pw").await;
    let addrs = serve_loopback(
        &app,
        tls_provider(),
        vec![
            ("imap", TlsMode::Plain, Arc::new(ImapProtocol::new(app.clone(), false))),
            ("pop3", TlsMode::Plain, Arc::new(Pop3Protocol::new(app.clone(), false))),
        ],
    );
    Server { imap: addrs[0], pop3: addrs[1], _dir: dir }
}

type Tcp = Client<TcpStream>;

async fn imap(s: &Server) -> Tcp {
    let mut c = Client::new(TcpStream::connect(s.imap).await.expect("connect"));
    let greeting = c.line().await;
    assert!(greeting.starts_with("* OK"), "{greeting}");
    let r = c.cmd("L", "LOGIN bob@example.org pw").await;
    assert!(r.last().is_some_and(|l| l.starts_with("L OK")), "{r:?}");
    let r = c.cmd("S", "SELECT INBOX").await;
    assert!(r.last().is_some_and(|l| l.starts_with("S OK")), "{r:?}");
    c
}

/// Sends `tag command` and reads up to its tagged response, literals included,
/// within [`ANSWER_WITHIN`]: the whole response as text.
async fn answer(c: &mut Tcp, tag: &str, command: &[u8]) -> String {
    let mut line = format!("{tag} ").into_bytes();
    line.extend_from_slice(command);
    line.extend_from_slice(b"\r\n");
    c.send_bytes(&line).await;
    tokio::time::timeout(ANSWER_WITHIN, read_response(c, tag))
        .await
        .unwrap_or_else(|_| panic!("{tag}: no answer within {ANSWER_WITHIN:?}"))
}

async fn read_response(c: &mut Tcp, tag: &str) -> String {
    let mut all = Vec::new();
    loop {
        let start = all.len();
        let n = c.io.read_until(b'\n', &mut all).await.expect("read");
        assert!(n > 0, "{tag}: connection closed");
        let line = &all[start..];
        // `{n}` at the end of a line: n octets of literal follow.
        if let Some(open) = line.iter().rposition(|&b| b == b'{')
            && let Some(len) = std::str::from_utf8(&line[open + 1..])
                .ok()
                .and_then(|t| t.trim_end().strip_suffix('}'))
                .and_then(|t| t.parse::<usize>().ok())
        {
            let mut literal = vec![0; len];
            c.io.read_exact(&mut literal).await.expect("literal");
            all.extend_from_slice(&literal);
            continue;
        }
        if line.starts_with(format!("{tag} ").as_bytes()) {
            return String::from_utf8_lossy(&all).into_owned();
        }
    }
}

/// The tagged line of a response.
fn tagged<'a>(response: &'a str, tag: &str) -> &'a str {
    response.lines().rev().find(|l| l.starts_with(&format!("{tag} "))).unwrap_or_default()
}

/// APPENDs `raw` to INBOX (a synchronizing literal).
async fn append(c: &mut Tcp, tag: &str, raw: &[u8]) {
    c.send(&format!("{tag} APPEND INBOX {{{}}}\r\n", raw.len())).await;
    let go = c.line().await;
    assert!(go.starts_with('+'), "{go}");
    let mut data = raw.to_vec();
    data.extend_from_slice(b"\r\n");
    c.send_bytes(&data).await;
    let r = tokio::time::timeout(ANSWER_WITHIN, read_response(c, tag)).await.expect("APPEND answered");
    assert!(tagged(&r, tag).starts_with(&format!("{tag} OK")), "{r}");
}

/// The session still answers: NOOP.
async fn alive(c: &mut Tcp) {
    let r = answer(c, "N", b"NOOP").await;
    assert!(tagged(&r, "N").starts_with("N OK"), "{r}");
}

/// A message whose References header lists 100,000 ids (one per folded line),
/// the first of them the Message-ID of an earlier message: the shape of the
/// message that made THREAD overflow the stack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_answers_a_references_chain_100000_deep() {
    let s = server().await;
    let mut c = imap(&s).await;
    let first = b"From: a@example.org\r\nSubject: deep\r\nMessage-ID: <root@example.org>\r\n\
Date: Mon, 1 Jan 2024 10:00:00 +0000\r\n\r\nfirst\r\n";
    append(&mut c, "A1", first).await;
    let mut reply = String::from(
        "From: b@example.org\r\nSubject: Re: deep\r\nMessage-ID: <reply@example.org>\r\n\
Date: Mon, 1 Jan 2024 11:00:00 +0000\r\nReferences: <root@example.org>",
    );
    for i in 0..100_000 {
        reply.push_str(&format!("\r\n <r{i}@example.org>"));
    }
    reply.push_str("\r\n\r\nreply\r\n");
    append(&mut c, "A2", reply.as_bytes()).await;

    // The ids between the two are not in the mailbox: their empty containers
    // are pruned and the reply hangs under the message it started from
    // (RFC 5256 §2.2 step 3).
    let r = answer(&mut c, "T1", b"THREAD REFERENCES UTF-8 ALL").await;
    assert!(r.contains("* THREAD (1 2)\r\n"), "{r}");
    assert!(tagged(&r, "T1").starts_with("T1 OK"), "{r}");
    let r = answer(&mut c, "T2", b"UID THREAD REFERENCES UTF-8 ALL").await;
    assert!(r.contains("* THREAD (1 2)\r\n"), "{r}");
    let r = answer(&mut c, "T3", b"THREAD ORDEREDSUBJECT UTF-8 ALL").await;
    assert!(r.contains("* THREAD (1 2)\r\n"), "{r}");
    alive(&mut c).await;
    // And again on a fresh session (the first answer left nothing behind).
    let mut c = imap(&s).await;
    let r = answer(&mut c, "T4", b"THREAD REFERENCES UTF-8 ALL").await;
    assert!(r.contains("* THREAD (1 2)\r\n"), "{r}");
    alive(&mut c).await;
}

/// A conversation 3,000 messages long, each a reply to the one before and
/// listing the first and its last few ancestors (RFC 5322 §3.6.4 trimming):
/// one thread as deep as the conversation, answered whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_answers_a_conversation_thousands_of_replies_deep() {
    let s = server().await;
    let mut c = imap(&s).await;
    const N: usize = 3_000;
    // One MULTIAPPEND (RFC 3502): one command, many literals.
    let mut messages = Vec::new();
    for i in 0..N {
        let mut m = format!(
            "From: a@example.org\r\nSubject: {}long talk\r\nMessage-ID: <m{i}@example.org>\r\n\
Date: Mon, 1 Jan 2024 10:00:00 +0000\r\n",
            if i == 0 { "" } else { "Re: " }
        );
        if i > 0 {
            m.push_str("References: <m0@example.org>");
            for a in i.saturating_sub(4).max(1)..i {
                m.push_str(&format!("\r\n <m{a}@example.org>"));
            }
            m.push_str("\r\n");
        }
        m.push_str("\r\nx\r\n");
        messages.push(m);
    }
    c.send("M APPEND INBOX").await;
    for (n, m) in messages.iter().enumerate() {
        c.send(&format!(" {{{}+}}\r\n", m.len())).await;
        c.send(m).await;
        if n + 1 == messages.len() {
            c.send("\r\n").await;
        }
    }
    let r =
        tokio::time::timeout(ANSWER_WITHIN, read_response(&mut c, "M")).await.expect("MULTIAPPEND answered");
    assert!(tagged(&r, "M").starts_with("M OK"), "{r}");
    let r = answer(&mut c, "T", b"THREAD REFERENCES UTF-8 ALL").await;
    let line = r.lines().find(|l| l.starts_with("* THREAD ")).unwrap_or_else(|| panic!("{r}"));
    // Every message once, in order, in one thread (past the depth the server
    // follows links, a reply goes on as a branch of the same thread, joined
    // by its subject: RFC 5256 §2.2 step 5).
    let list = &line["* THREAD ".len()..];
    let listed: Vec<usize> = list
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("number"))
        .collect();
    assert_eq!(listed, (1..=N).collect::<Vec<_>>(), "every message once, in order");
    let mut depth = 0;
    let mut threads = 0;
    for c in list.chars() {
        match c {
            '(' if depth == 0 => {
                threads += 1;
                depth += 1;
            }
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
    }
    assert_eq!(threads, 1, "{}", &list[..200.min(list.len())]);
    // Each reply under the one before: one line of numbers, no branches.
    assert!(
        list.starts_with("(1 ") && list.contains("2 3 4 5 6 7 8 9 10 11 12 "),
        "{}",
        &list[..200.min(list.len())]
    );
    let r = answer(&mut c, "O", b"THREAD ORDEREDSUBJECT UTF-8 ALL").await;
    assert!(tagged(&r, "O").starts_with("O OK"), "{r}");
    alive(&mut c).await;
}

/// `n` multiparts, each the only part of the one around it, around one text
/// part holding `text`.
fn nested_multiparts(n: usize, text: &str) -> Vec<u8> {
    let mut raw = String::from("From: a@example.org\r\nSubject: nested\r\nMIME-Version: 1.0\r\n");
    for i in 0..n {
        raw.push_str(&format!("Content-Type: multipart/mixed; boundary=\"b{i}\"\r\n\r\n--b{i}\r\n"));
    }
    raw.push_str(&format!("Content-Type: text/plain\r\n\r\n{text}\r\n"));
    for i in (0..n).rev() {
        raw.push_str(&format!("--b{i}--\r\n"));
    }
    raw.into_bytes()
}

/// `n` message/rfc822 parts, each holding the next message, around a text body.
fn nested_messages(n: usize, text: &str) -> Vec<u8> {
    let mut raw = String::new();
    for i in 0..n {
        raw.push_str(&format!("Subject: level {i}\r\nContent-Type: message/rfc822\r\n\r\n"));
    }
    raw.push_str(&format!("Subject: innermost\r\nContent-Type: text/plain\r\n\r\n{text}\r\n"));
    raw.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mime_nested_10000_deep_is_fetched_searched_and_retrieved() {
    let s = server().await;
    let mut c = imap(&s).await;
    let multipart = nested_multiparts(10_000, "needle-in-multiparts");
    let messages = nested_messages(10_000, "needle-in-messages");
    append(&mut c, "A1", &multipart).await;
    append(&mut c, "A2", &messages).await;

    let r = answer(&mut c, "F1", b"FETCH 1:2 (BODYSTRUCTURE BODY ENVELOPE)").await;
    assert!(tagged(&r, "F1").starts_with("F1 OK"), "{r}");
    assert_eq!(r.matches("* 1 FETCH").count() + r.matches("* 2 FETCH").count(), 2, "{}", &r[..200]);
    // Shallow sections still address the parts.
    let r = answer(&mut c, "F2", b"FETCH 1 BODY.PEEK[1.1.1.MIME]").await;
    assert!(tagged(&r, "F2").starts_with("F2 OK"), "{r}");
    assert!(r.contains("BODY[1.1.1.MIME] {"), "{r}");
    // The deepest section: 10,000 part numbers. Past the depth that is
    // described, a part is empty (RFC 3501 §6.4.5: a section that does not
    // exist is empty), never an error of the connection.
    let deep: Vec<&str> = vec!["1"; 10_000];
    for (tag, item) in [("F3", "BODY.PEEK"), ("F4", "BINARY.PEEK"), ("F5", "BINARY.SIZE")] {
        let cmd = format!("FETCH 1:2 ({item}[{}])", deep.join("."));
        let r = answer(&mut c, tag, cmd.as_bytes()).await;
        let end = &r[r.len().saturating_sub(300)..];
        assert!(tagged(&r, tag).starts_with(&format!("{tag} OK")), "{end}");
        let empty = if item == "BINARY.SIZE" { "] 0)" } else { "] {0}\r\n)" };
        assert_eq!(r.matches(empty).count(), 2, "{end}");
    }
    for (tag, needle, expected) in
        [("S1", "needle-in-multiparts", "* SEARCH 1"), ("S2", "needle-in-messages", "* SEARCH 2")]
    {
        let r = answer(&mut c, tag, format!("SEARCH TEXT {needle}").as_bytes()).await;
        assert!(r.contains(&format!("{expected}\r\n")), "{r}");
    }
    let r = answer(&mut c, "S3", b"SEARCH BODY nowhere-to-be-found").await;
    assert!(r.contains("* SEARCH\r\n"), "{r}");
    alive(&mut c).await;

    // POP3 RETR gives both back octet for octet.
    let mut p = Client::new(TcpStream::connect(s.pop3).await.expect("connect pop3"));
    assert!(p.line().await.starts_with("+OK"));
    p.send("USER bob@example.org\r\n").await;
    assert!(p.line().await.starts_with("+OK"));
    p.send("PASS pw\r\n").await;
    let ok = p.line().await;
    assert!(ok.starts_with("+OK"), "{ok}");
    for (n, raw) in [(1, &multipart), (2, &messages)] {
        p.send(&format!("RETR {n}\r\n")).await;
        let got = tokio::time::timeout(ANSWER_WITHIN, async {
            let status = p.line().await;
            assert!(status.starts_with("+OK"), "{status}");
            let mut body = Vec::new();
            loop {
                let mut line = Vec::new();
                p.io.read_until(b'\n', &mut line).await.expect("read");
                if line == b".\r\n" {
                    return body;
                }
                body.extend_from_slice(
                    line.strip_prefix(b".").filter(|_| line.starts_with(b"..")).unwrap_or(&line),
                );
            }
        })
        .await
        .expect("RETR answered");
        assert_eq!(got.len(), raw.len(), "RETR {n}");
        assert!(got == *raw, "RETR {n}: the message as stored");
    }
    p.send("QUIT\r\n").await;
    assert!(p.line().await.starts_with("+OK"));
}

/// Search criteria chained 10,000 deep, as SEARCH, SORT and THREAD criteria:
/// an OR chain (`OR OR … 1 1 …`), a NOT chain and nested parentheses. Each is
/// answered (a result or BAD), and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_criteria_10000_deep_are_answered() {
    let s = server().await;
    let mut c = imap(&s).await;
    append(&mut c, "A", b"From: a@example.org\r\nSubject: one\r\n\r\nbody\r\n").await;
    const N: usize = 10_000;
    let or_chain = format!("{}{}", "OR ".repeat(N), vec!["1"; N + 1].join(" "));
    let not_chain = format!("{}ALL", "NOT ".repeat(N));
    let parens = format!("{}ALL{}", "(".repeat(N), ")".repeat(N));
    let mixed = format!("{}ALL", "OR 2 NOT (".repeat(N / 3)) + &")".repeat(N / 3);
    for (n, criteria) in [or_chain, not_chain, parens, mixed].iter().enumerate() {
        for (k, command) in [
            format!("SEARCH {criteria}"),
            format!("UID SEARCH RETURN (COUNT) {criteria}"),
            format!("SORT (SUBJECT) UTF-8 {criteria}"),
            format!("THREAD REFERENCES UTF-8 {criteria}"),
        ]
        .iter()
        .enumerate()
        {
            assert!(command.len() < 60 * 1024, "within the default line limit");
            let tag = format!("Q{n}{k}");
            let r = answer(&mut c, &tag, command.as_bytes()).await;
            let done = tagged(&r, &tag);
            assert!(
                done.starts_with(&format!("{tag} OK")) || done.starts_with(&format!("{tag} BAD")),
                "{tag}: {done}"
            );
        }
    }
    alive(&mut c).await;
}
