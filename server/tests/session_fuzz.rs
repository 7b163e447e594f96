//! Whole sessions under mutated input: what `proto_fuzz` does for the parsers,
//! done to the command handlers behind them.
//! - IMAP: a logged-in session with a mailbox of varied messages (multipart,
//!   nested message/rfc822, UTF-8 and encoded subjects, 8-bit and base64
//!   bodies, no Date, a folded header) gets commands a client would send,
//!   mutated, each followed by a NOOP; every fourth session first gets mutated
//!   commands of the not-authenticated state (LOGIN, AUTHENTICATE, …).
//! - SMTP: inbound and submission sessions get mutated dialogues (EHLO, MAIL
//!   and RCPT with their parameters, DATA, BDAT, AUTH, RSET, VRFY …).
//! - POP3: mutated dialogues over a maildrop of the same messages (USER/PASS,
//!   AUTH PLAIN with and without an initial response, LIST, UIDL, RETR, TOP,
//!   DELE, RSET, QUIT), refilled when deletions have emptied it.
//!
//! Nothing in the process may panic. Bounded like `proto_fuzz`:
//! MAILCLUSTER_FUZZ_SECS seconds per protocol, one after the other (default 4),
//! MAILCLUSTER_FUZZ_SEED to replay a run.

#[path = "../../fuzz/checks.rs"]
mod checks;
mod common;
mod smtp_support;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use checks::Rng;
use common::*;
use mailcluster_model::{Account, FlagSet};
use tokio::io::AsyncBufReadExt;

/// Commands of a logged-in session, as clients send them.
const COMMANDS: &[&str] = &[
    "FETCH 1:* (FLAGS UID RFC822.SIZE INTERNALDATE ENVELOPE BODYSTRUCTURE)",
    "UID FETCH 1:* (BODY.PEEK[HEADER.FIELDS (From Subject Date Message-ID)] EMAILID THREADID MODSEQ)",
    "FETCH 2 (BODY[1.2] BODY.PEEK[2.MIME] BODY[3.1.HEADER] BODY[TEXT]<10.20> BODY[]<0>)",
    "FETCH 3 (BINARY.PEEK[1] BINARY.SIZE[2] BINARY[2]<0.100> BODY.PEEK[1.TEXT])",
    "UID FETCH 1:* (FLAGS) (CHANGEDSINCE 1 VANISHED)",
    "FETCH 1,3:4 (RFC822 RFC822.HEADER RFC822.TEXT BODY)",
    "SEARCH CHARSET UTF-8 OR SUBJECT Grüße (NOT FROM alice) HEADER Message-ID <m2@example.com>",
    "UID SEARCH RETURN (MIN MAX COUNT ALL SAVE) OR OR SEEN FLAGGED (LARGER 100 SMALLER 100000) UID 1:*",
    "SEARCH SENTBEFORE 1-Jan-2030 SINCE 1-Feb-1990 ON 5-Dec-2026 BODY umlaut TEXT x KEYWORD $Label",
    "SEARCH MODSEQ 1 YOUNGER 3600 OLDER 1 EMAILID M1 THREADID T1 NOT $",
    "SORT (REVERSE ARRIVAL SUBJECT DISPLAYFROM SIZE CC TO DATE) UTF-8 ALL",
    "UID THREAD REFERENCES UTF-8 OR FROM a TO b",
    "THREAD ORDEREDSUBJECT US-ASCII UNDELETED",
    "STORE 1:2 +FLAGS (\\Seen $Label \\Flagged)",
    "UID STORE 1:* (UNCHANGEDSINCE 5) -FLAGS.SILENT (\\Deleted)",
    "STORE 4 FLAGS.SILENT ()",
    "COPY 1:2 Archive",
    "UID MOVE 3 Trash",
    "UID EXPUNGE 1:2",
    "EXPUNGE",
    "CREATE Work/Sub (USE (\\Archive))",
    "RENAME Work/Sub \"Other/Grüße\"",
    "DELETE Other",
    "LIST \"\" * RETURN (CHILDREN SPECIAL-USE STATUS (MESSAGES UNSEEN SIZE MAILBOXID))",
    "LIST (SUBSCRIBED RECURSIVEMATCH) \"\" (INBOX \"%\")",
    "LSUB \"\" *%",
    "STATUS INBOX (MESSAGES RECENT UIDNEXT UIDVALIDITY UNSEEN HIGHESTMODSEQ SIZE DELETED APPENDLIMIT)",
    "SELECT INBOX (QRESYNC (1 1 1:5 (1:3 1:3)))",
    "EXAMINE Archive (CONDSTORE)",
    "APPEND INBOX (\\Seen) \"05-Dec-2026 10:00:00 +0100\" {25+}\r\nSubject: appended\r\n\r\nbody",
    "APPEND Archive UTF8 (~{21+}\r\nSubject: Grüße\r\n\r\nx)",
    "ENABLE QRESYNC UTF8=ACCEPT IMAP4rev2",
    "GETQUOTAROOT INBOX",
    "NAMESPACE",
    "ID (\"name\" \"fuzz\")",
    "IDLE\r\nDONE",
    "UNSELECT",
    "CLOSE",
    "CHECK",
];

/// Pieces the mutator splices in: what the grammars turn on.
const TOKENS: &[&str] = &[
    "0",
    "1",
    "*",
    "4294967295",
    "4294967296",
    "-1",
    "1:*",
    "*:1",
    "$",
    "[",
    "]",
    "<",
    ">",
    "<0.0>",
    "<4294967295.1>",
    "(",
    ")",
    "\"",
    "\\",
    "{0}\r\n",
    "{3+}\r\nabc",
    " ",
    "NIL",
    "1.",
    ".MIME",
    ".HEADER.FIELDS.NOT (",
    ".TEXT",
    "HEADER",
    "OR ",
    "NOT ",
    "UID ",
    "ü",
    "€",
    "\u{0}",
    "%",
    "&",
    "&AOQ-",
    "UTF-8",
    "X-UNKNOWN",
];

/// Messages of many shapes, so that FETCH, SEARCH and SORT reach every path.
fn messages() -> Vec<String> {
    vec![
        "From: Alice <alice@example.com>\r\nTo: bob@example.org\r\nSubject: plain\r\nDate: Tue, 1 Jul 2003 10:52:37 +0200\r\nMessage-ID: <m1@example.com>\r\n\r\nhello\r\n".into(),
        "From: =?UTF-8?Q?J=C3=B6rg?= <j@example.com>\r\nSubject: Re: [Fwd: Grüße (fwd)]\r\nMessage-ID: <m2@example.com>\r\nIn-Reply-To: <m1@example.com>\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"b1\"\r\n\r\n--b1\r\nContent-Type: multipart/alternative; boundary=b2\r\n\r\n--b2\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\numlaut =C3=BC\r\n--b2\r\nContent-Type: text/html\r\n\r\n<p>x</p>\r\n--b2--\r\n--b1\r\nContent-Type: application/octet-stream; name=a.bin\r\nContent-Transfer-Encoding: base64\r\n\r\nAAECAwQ=\r\n--b1--\r\n".into(),
        "From: a@example.com\r\nSubject: nested\r\nContent-Type: multipart/mixed; boundary=x\r\n\r\n--x\r\nContent-Type: text/plain\r\n\r\none\r\n--x\r\nContent-Type: message/rfc822\r\n\r\nSubject: inner\r\nContent-Type: multipart/mixed; boundary=y\r\n\r\n--y\r\n\r\ndeep\r\n--y--\r\n--x--\r\n".into(),
        "Subject: no date, folded\r\n\tsubject line\r\nX-Header: ä raw 8-bit\r\nReferences: <m1@example.com>\r\n <m2@example.com>\r\n\r\n8-bit body: ß€\r\n".into(),
        format!("From: big@example.com\r\nSubject: big\r\n\r\n{}\r\n", "line of text\r\n".repeat(2000)),
    ]
}

/// `data` with up to `times` mutations: a token spliced in, a range of up to
/// `span` bytes dropped, or a range of up to `span` repeated up to `repeat`
/// times (long lines, many parameters, stacked commands).
fn mutate(
    rng: &mut Rng,
    mut data: Vec<u8>,
    tokens: &[&str],
    times: usize,
    span: usize,
    repeat: usize,
) -> Vec<u8> {
    for _ in 0..1 + rng.below(times) {
        let at = rng.below(data.len() + 1);
        match rng.below(3) {
            0 => {
                let token = tokens[rng.below(tokens.len())].as_bytes();
                data.splice(at..at, token.iter().copied());
            }
            1 => {
                let end = (at + 1 + rng.below(span)).min(data.len());
                data.drain(at.min(end)..end);
            }
            _ => {
                let end = (at + 1 + rng.below(span)).min(data.len());
                let piece = data[at.min(end)..end].to_vec();
                for _ in 0..1 + rng.below(repeat) {
                    data.splice(at..at, piece.iter().copied());
                }
            }
        }
    }
    data
}

/// A command of the list, mutated, with `tag`.
fn mutated(rng: &mut Rng, tag: &str) -> Vec<u8> {
    let cmd = COMMANDS[rng.below(COMMANDS.len())].as_bytes().to_vec();
    let cmd = mutate(rng, cmd, TOKENS, 3, 12, 1);
    [tag.as_bytes(), b" ", &cmd, b"\r\n"].concat()
}

static PANICS: AtomicUsize = AtomicUsize::new(0);
static LAST_SENT: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Counts every panic of the process (a session's task included) and prints
/// what was sent last.
fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            let last = LAST_SENT.lock().map(|l| l.clone()).unwrap_or_default();
            eprintln!("panic after sending: {:?}", String::from_utf8_lossy(&last));
            default_hook(info);
        }));
    });
}

fn remember(sent: &[u8]) {
    if let Ok(mut last) = LAST_SENT.lock() {
        last.clear();
        last.extend_from_slice(sent);
    }
}

/// Commands before authentication.
const PRE_AUTH: &[&str] = &[
    "LOGIN bob@example.org pw",
    "LOGIN \"bob@example.org\" {2+}\r\npw",
    "AUTHENTICATE PLAIN AGJvYkBleGFtcGxlLm9yZwBwdw==",
    "AUTHENTICATE PLAIN\r\nAGJvYkBleGFtcGxlLm9yZwBwdw==",
    "AUTHENTICATE PLAIN\r\n*",
    "AUTHENTICATE LOGIN",
    "CAPABILITY",
    "ID (\"name\" \"fuzz\" \"version\" NIL)",
    "ENABLE UTF8=ACCEPT",
    "STARTTLS",
    "SELECT INBOX",
];

/// Reads up to the tagged answer of `tag` (with its space): false when the
/// session went quiet for 2 s or ended first.
async fn answered(c: &mut Client<tokio::io::DuplexStream>, tag: &str) -> bool {
    loop {
        let mut line = Vec::new();
        match tokio::time::timeout(Duration::from_secs(2), c.io.read_until(b'\n', &mut line)).await {
            Ok(Ok(read)) if read > 0 => {
                if line.starts_with(tag.as_bytes()) {
                    return true;
                }
            }
            _ => return false,
        }
    }
}

/// One test, the protocols in turn: the panic hook and the last input it
/// prints are the process's, so two tests at once could blame each other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_survive_mutated_input() {
    count_panics();
    let (seed, secs) = checks::budget();
    imap_sessions(seed, secs).await;
    smtp_sessions(seed, secs).await;
    pop3_sessions(seed, secs).await;
}

/// The embedded default with bob@example.org (password "pw") and no login
/// lockout: the fuzzer's failed logins, all from one address, would lock bob
/// and the address out (the limits have tests of their own).
async fn fuzzed_app() -> (mailcluster_server::app::App, tempfile::TempDir, Account) {
    let (app, dir) = embedded_app(|c| {
        c.tls.allow_plaintext_auth = true;
        c.auth.max_failures_per_user = 0;
        c.auth.max_failures_per_ip = 0;
    })
    .await;
    let bob = account(&app, "bob@example.org", "pw").await;
    (app, dir, bob)
}

/// Reads replies until the session goes quiet for 100 ms or ends.
async fn drain(io: &mut (impl tokio::io::AsyncRead + Unpin)) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(Ok(n)) =
        tokio::time::timeout(Duration::from_millis(100), tokio::io::AsyncReadExt::read(io, &mut buf)).await
    {
        if n == 0 {
            break;
        }
    }
}

async fn imap_sessions(seed: u64, secs: u64) {
    println!("imap sessions: MAILCLUSTER_FUZZ_SEED={seed}, {secs} s");
    let mut rng = Rng(seed);
    let (app, _dir, bob) = fuzzed_app().await;
    for raw in messages() {
        for mailbox in ["INBOX", "Archive"] {
            deliver(&app, &bob, mailbox, raw.as_bytes(), FlagSet::default()).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut commands, mut sessions) = (0usize, 0usize);
    while Instant::now() < deadline {
        sessions += 1;
        if sessions % 4 == 0 {
            // Before authentication: LOGIN, AUTHENTICATE (with and without an
            // initial response, and its continuation), CAPABILITY, ID, ENABLE.
            let (mut c, _tx) = connect(&app);
            c.line().await;
            for n in 0..6 {
                let cmd = PRE_AUTH[rng.below(PRE_AUTH.len())].as_bytes().to_vec();
                let cmd =
                    [&format!("p{n} ").into_bytes()[..], &mutate(&mut rng, cmd, TOKENS, 3, 12, 1), b"\r\n"]
                        .concat();
                remember(&cmd);
                commands += 1;
                c.send_bytes(&[&cmd[..], format!("q{n} NOOP\r\n").as_bytes()].concat()).await;
                if !answered(&mut c, &format!("q{n} ")).await {
                    break;
                }
            }
        }
        let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
        c.cmd("s", if rng.below(2) == 0 { "SELECT INBOX" } else { "SELECT Archive" }).await;
        'session: for n in 0..25 {
            let cmd = mutated(&mut rng, &format!("f{n}"));
            let sentinel = format!("z{n} NOOP\r\n");
            remember(&cmd);
            commands += 1;
            c.send_bytes(&[cmd.as_slice(), sentinel.as_bytes()].concat()).await;
            // A session left waiting (for a literal, DONE or a SASL response)
            // or closed (LOGOUT, BYE) is replaced by a new one.
            if !answered(&mut c, &format!("z{n} ")).await {
                break 'session;
            }
        }
    }
    println!("{sessions} sessions, {commands} mutated commands");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a session panicked (seed {seed}); see above");
}

/// SMTP dialogues as clients hold them, inbound (`mx`) and submission.
fn smtp_dialogues() -> Vec<(bool, String)> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let plain = b64(&format!("\0alice@example.test\0{}", smtp_support::PASSWORD));
    vec![
        (false, "EHLO c.test\r\nMAIL FROM:<a@remote.test> SIZE=300 BODY=8BITMIME RET=HDRS ENVID=x+2By\r\n\
             RCPT TO:<alice@example.test> NOTIFY=SUCCESS,DELAY ORCPT=rfc822;alice@example.test\r\n\
             RCPT TO:<bob@example.test>\r\nDATA\r\nFrom: a@remote.test\r\nSubject: hi\r\n\r\nbody\r\n..dot\r\n.\r\nQUIT\r\n".into()),
        (false, "EHLO c\r\nMAIL FROM:<>\r\nRCPT TO:<bob@example.test>\r\nBDAT 22\r\nSubject: x\r\n\r\nbody\r\n\r\nBDAT 0 LAST\r\nNOOP\r\n".into()),
        (false, "HELO c\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<postmaster>\r\nRSET\r\nVRFY bob\r\nEXPN x\r\nHELP\r\nNOOP\r\nQUIT\r\n".into()),
        (true, format!("EHLO c\r\nAUTH PLAIN {plain}\r\nMAIL FROM:<alice@example.test> SMTPUTF8\r\nRCPT TO:<bob@example.test>\r\n\
             RCPT TO:<someone@remote.test> NOTIFY=NEVER\r\nDATA\r\nSubject: Grüße\r\n\r\nx\r\n.\r\nQUIT\r\n")),
        (true, format!("EHLO c\r\nAUTH LOGIN\r\n{}\r\n{}\r\nMAIL FROM:<alice@example.test>\r\nRCPT TO:<bob@example.test>\r\n\
             BDAT 9 LAST\r\nSubject:\r\nRSET\r\n", b64("alice@example.test"), b64(smtp_support::PASSWORD))),
    ]
}

const SMTP_TOKENS: &[&str] = &[
    "\r\n",
    "\n",
    ".",
    "\r\n.\r\n",
    "<",
    ">",
    "@",
    ":",
    "=",
    " ",
    "\t",
    "SIZE=",
    "BDAT ",
    " LAST",
    "0",
    "4294967296",
    "99999999999999999999",
    "NOTIFY=",
    "ORCPT=",
    "rfc822;",
    "utf-8;",
    "+2B",
    "+",
    "\u{0}",
    "ü",
    "MAIL FROM:",
    "RCPT TO:",
    "DATA\r\n",
    "AUTH PLAIN =\r\n",
    "*\r\n",
];

async fn smtp_sessions(seed: u64, secs: u64) {
    println!("smtp sessions: MAILCLUSTER_FUZZ_SEED={seed}, {secs} s");
    let mut rng = Rng(seed);
    let h = smtp_support::Harness::new(
        smtp_support::Backend::Sqlite,
        smtp_support::config(|c| {
            // As for IMAP: the dialogues' failed AUTHs must not lock alice out.
            c.auth.max_failures_per_user = 0;
            c.auth.max_failures_per_ip = 0;
        }),
    )
    .await;
    let dialogues = smtp_dialogues();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut sessions = 0usize;
    while Instant::now() < deadline {
        sessions += 1;
        let (submission, dialogue) = &dialogues[rng.below(dialogues.len())];
        let data = mutate(&mut rng, dialogue.as_bytes().to_vec(), SMTP_TOKENS, 4, 40, 20);
        remember(&data);
        let mut c = h.connect(if *submission { &h.submission } else { &h.mx });
        c.send_bytes(&data).await;
        drain(&mut c.io).await;
        let task = c.task.take();
        drop(c);
        if let Some(task) = task
            && let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(10), task).await
        {
            assert!(!e.is_panic(), "an SMTP session panicked (seed {seed}): {e}");
        }
    }
    println!("{sessions} mutated dialogues");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a session panicked (seed {seed}); see above");
}

/// POP3 dialogues as clients hold them: a mail client's download-and-delete,
/// a header preview, SASL logins, a session that ends without QUIT.
const POP3_DIALOGUES: &[&str] = &[
    "CAPA\r\nUSER bob@example.org\r\nPASS pw\r\nSTAT\r\nLIST\r\nUIDL\r\nRETR 1\r\nDELE 1\r\nQUIT\r\n",
    "USER bob@example.org\r\nPASS pw\r\nUIDL 2\r\nLIST 3\r\nTOP 2 0\r\nTOP 3 5\r\nRETR 5\r\nNOOP\r\nRSET\r\nQUIT\r\n",
    "AUTH PLAIN AGJvYkBleGFtcGxlLm9yZwBwdw==\r\nDELE 2\r\nDELE 2\r\nRETR 2\r\nRSET\r\nSTAT\r\nQUIT\r\n",
    "AUTH PLAIN\r\nAGJvYkBleGFtcGxlLm9yZwBwdw==\r\nLIST\r\nRETR 4\r\nDELE 4\r\nDELE 5\r\nQUIT\r\n",
    "AUTH\r\nAUTH PLAIN\r\n*\r\nAPOP bob 0123456789abcdef\r\nUSER bob@example.org\r\nPASS pw\r\nTOP 1 99999\r\nUIDL\r\n",
    "STLS\r\nUSER x\r\nUSER bob@example.org\r\nPASS wrong\r\nPASS pw\r\nSTAT\r\nQUIT\r\n",
];

const POP3_TOKENS: &[&str] = &[
    "\r\n",
    "\n",
    " ",
    "0",
    "1",
    "-1",
    "4294967295",
    "18446744073709551616",
    "99999999999999999999",
    ".",
    "=",
    "\u{0}",
    "ü",
    "*",
    "+",
    "DELE ",
    "RETR ",
    "TOP ",
    "PASS ",
    "USER ",
    "AUTH PLAIN ",
];

async fn pop3_sessions(seed: u64, secs: u64) {
    use mailcluster_server::net::{Protocol, SessionStream, Shutdown};
    use mailcluster_server::pop3::Pop3Protocol;

    println!("pop3 sessions: MAILCLUSTER_FUZZ_SEED={seed}, {secs} s");
    let mut rng = Rng(seed);
    let (app, _dir, bob) = fuzzed_app().await;
    let inbox = app.store.mailbox_get(bob.id, "INBOX").await.expect("get").expect("INBOX").id;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut sessions = 0usize;
    while Instant::now() < deadline {
        sessions += 1;
        // QUIT commits the dialogues' DELEs: keep something to fetch and delete.
        if app.store.mailbox_uids(inbox).await.expect("uids").len() < 3 {
            for raw in messages() {
                deliver(&app, &bob, "INBOX", raw.as_bytes(), FlagSet::default()).await;
            }
        }
        let dialogue = POP3_DIALOGUES[rng.below(POP3_DIALOGUES.len())];
        let data = mutate(&mut rng, dialogue.as_bytes().to_vec(), POP3_TOKENS, 4, 20, 20);
        remember(&data);
        let (client, server) = tokio::io::duplex(1 << 20);
        let (tx, shutdown) = Shutdown::new();
        let proto = Pop3Protocol::new(app.clone(), false);
        let task =
            tokio::spawn(async move { proto.handle(SessionStream::Memory(server), ctx(shutdown)).await });
        let mut c = Client::new(client);
        c.send_bytes(&data).await;
        drain(&mut c.io).await;
        drop(c);
        drop(tx);
        if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(10), task).await {
            assert!(!e.is_panic(), "a POP3 session panicked (seed {seed}): {e}");
        }
    }
    println!("{sessions} mutated dialogues");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a session panicked (seed {seed}); see above");
}
