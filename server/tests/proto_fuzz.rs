//! Bounded fuzzing that runs with the test suite: seeded random mutations of a
//! corpus of valid IMAP commands, SMTP dialogues and MIME messages, fed to the
//! same entry points and checked for the same properties as the cargo-fuzz
//! targets in `fuzz/` (shared through `fuzz/checks.rs`).
//!
//! Why both: a cargo-fuzz build instruments the whole dependency tree with
//! sanitizers on a nightly compiler, which takes longer than CI should spend on
//! it; this runs on the ordinary test build at no extra build cost. It finds
//! less (no coverage guidance) and the libFuzzer targets remain for deeper runs.
//!
//! Each target runs for `MAILCLUSTER_FUZZ_SECS` seconds (default 4) or 5 000 inputs
//! per second of it, whichever comes first. The seed is random per run and printed;
//! `MAILCLUSTER_FUZZ_SEED=<n>` replays a run. A failing input is printed escaped.

#[path = "../../fuzz/checks.rs"]
mod checks;

use std::time::{Duration, Instant};

const IMAP_CORPUS: &[&[u8]] = &[
    b"a1 CAPABILITY\r\n",
    b"a2 LOGIN alice \"pass word\"\r\n",
    b"a3 LOGIN {5}\r\nalice {4+}\r\npass\r\n",
    b"a4 AUTHENTICATE PLAIN AGFsaWNlAHB3\r\n",
    b"a5 SELECT INBOX (CONDSTORE)\r\n",
    b"a6 EXAMINE \"Sent &AOk-\"\r\n",
    b"a7 LIST \"\" \"*\" RETURN (CHILDREN SPECIAL-USE)\r\n",
    b"a8 STATUS INBOX (MESSAGES UIDNEXT UIDVALIDITY UNSEEN RECENT)\r\n",
    b"a9 APPEND INBOX (\\Seen $Label) \"17-Jul-1996 02:44:25 -0700\" {12+}\r\nHello world!\r\n",
    b"b1 APPEND INBOX {3}\r\nabc INBOX {2+}\r\nde\r\n",
    b"b2 FETCH 1:* (UID FLAGS INTERNALDATE RFC822.SIZE ENVELOPE BODYSTRUCTURE)\r\n",
    b"b3 FETCH 2,4:6,* (BODY.PEEK[HEADER.FIELDS (From Subject)] BODY[1.2.MIME]<0.100>)\r\n",
    b"b4 UID FETCH 100:* (BODY[TEXT]<10.20> BINARY.PEEK[1] BINARY.SIZE[1])\r\n",
    b"b5 STORE 1:3 +FLAGS.SILENT (\\Deleted \\Flagged)\r\n",
    b"b6 UID STORE 7 -FLAGS (\\Seen)\r\n",
    b"b7 SEARCH CHARSET UTF-8 OR FROM \"a\" (SUBJECT {3}\r\nabc NOT SEEN) SINCE 1-Feb-2024 LARGER 100\r\n",
    b"b8 UID SEARCH UID 1:5,9 HEADER Message-ID \"<x@y>\" BEFORE 01-Jan-2030 KEYWORD $Junk\r\n",
    b"b9 COPY 1:* Archive\r\n",
    b"c1 UID MOVE 3:4 \"Junk\"\r\n",
    b"c2 EXPUNGE\r\n",
    b"c3 SELECT INBOX (QRESYNC (67890007 20050715194045000 41,43:211,214:541 (1:3 4:6)))\r\n",
    b"c4 UID FETCH 300:500 (FLAGS MODSEQ BODY.PEEK[HEADER.FIELDS (X-MODSEQ)]) (CHANGEDSINCE 12345 VANISHED)\r\n",
    b"c5 STORE 7,5,9 (UNCHANGEDSINCE 320162338) +FLAGS.SILENT (\\Deleted)\r\n",
    b"c6 UID SEARCH RETURN (MIN COUNT) MODSEQ \"/flags/\\\\draft\" all 620162338 UNSEEN\r\n",
    b"c7 STATUS \"a b\" (HIGHESTMODSEQ SIZE)\r\n",
    b"c3 UID EXPUNGE 1:10\r\n",
    b"c4 IDLE\r\nDONE\r\n",
    b"c5 ID (\"name\" \"client\" \"version\" NIL)\r\n",
    b"c6 ENABLE UTF8=ACCEPT CONDSTORE\r\n",
    b"c7 CREATE \"a/b/c\"\r\nc8 RENAME a z\r\nc9 DELETE z\r\n",
    b"d1 SUBSCRIBE INBOX\r\nd2 LSUB \"\" %\r\nd3 NAMESPACE\r\nd4 UNSELECT\r\nd5 CLOSE\r\nd6 LOGOUT\r\n",
    b"d7 STARTTLS\r\nd8 NOOP\r\nd9 CHECK\r\n",
    b"e1 FETCH 1 (BINARY.PEEK[2]<5> BINARY[1.2]<0.10> BINARY.SIZE[] UID)\r\n",
    b"e2 APPEND INBOX ~{5}\r\na\x00b\r\n\r\n",
    b"e3 UID SORT RETURN (MIN MAX COUNT ALL) (REVERSE DISPLAYFROM DATE) UTF-8 OR YOUNGER 60 OLDER 3600\r\n",
    b"e4 SEARCH RETURN (MIN) MODSEQ 5 NOT YOUNGER 10\r\n",
    b"e5 STATUS INBOX (APPENDLIMIT HIGHESTMODSEQ)\r\n",
    b"e6 ENABLE IMAP4rev2 UTF8=ACCEPT\r\ne7 CREATE \"Gr\xc3\xbc\xc3\x9fe\" (USE (\\Archive))\r\n",
    b"e8 APPEND INBOX (\\Seen) UTF8 (~{6}\r\nS\xc3\xbcb:\r)\r\n",
    b"e9 SEARCH SUBJECT OLDER 5 HEADER X-A YOUNGER OLDER 9 CHARSET MODSEQ\r\n",
    b"f1 UID FETCH 1:* (EMAILID THREADID MODSEQ) (CHANGEDSINCE 1)\r\nf2 STATUS INBOX (MAILBOXID SIZE)\r\n",
    b"f3 SEARCH OR EMAILID M1 NOT THREADID \"T-_9\" SUBJECT EMAILID\r\nf4 LIST \"\" * RETURN (STATUS (MAILBOXID))\r\n",
    b"f5 UID SEARCH OR OR OR OR OR OR OR OR OR OR SEEN FROM \"a\" TO {1+}\r\nb (OR DRAFT NOT NEW) HEADER X-A c MODSEQ \"/flags/x\" all 5 UID 1:* 7 8 9 10\r\n",
    b"f6 SORT (DATE) UTF-8 OR 1 OR 2 OR 3 OR 4 OR 5 OR 6 OR 7 OR 8 OR 9 10\r\n",
];

const SMTP_CORPUS: &[&[u8]] = &[
    b"EHLO client.example\r\nMAIL FROM:<a@b.example> SIZE=100 BODY=8BITMIME SMTPUTF8\r\nRCPT TO:<c@d.example> NOTIFY=NEVER\r\nDATA\r\n",
    b"HELO x\r\nMAIL FROM:<>\r\nRCPT TO:<postmaster>\r\nRSET\r\nNOOP\r\nVRFY x\r\nQUIT\r\n",
    b"AUTH PLAIN AGFsaWNlAHB3\r\nAUTH LOGIN\r\nYWxpY2U=\r\nSTARTTLS\r\nBDAT 10 LAST\r\n",
    b"Subject: x\r\n\r\n..leading dot\r\nbody\r\n.\r\nQUIT\r\n",
    b"\x00.\r\nline\rbare\nlf\r\n.\r\n",
    b"MAIL FROM:<a@b.example> RET=FULL ENVID=QQ+2B1\r\nRCPT TO:<c@d.example> NOTIFY=SUCCESS,FAILURE,DELAY ORCPT=rfc822;C+40d.example\r\n",
    b"RCPT TO:<c@d.example> ORCPT=utf-8;c\\x{E9}@d.example NOTIFY=DELAY\r\nRCPT TO:<e@[192.0.2.1]> ORCPT=x-y;z\r\n",
    b".\r\n",
];

const MESSAGE_CORPUS: &[&[u8]] = &[
    b"From: a@b\r\nTo: c@d\r\nSubject: hi\r\n\r\nbody\r\n",
    b"Content-Type: multipart/mixed; boundary=\"b1\"\r\n\r\npre\r\n--b1\r\nContent-Type: text/plain\r\n\r\none\r\n--b1\r\nContent-Type: multipart/alternative; boundary=b2\r\n\r\n--b2\r\n\r\ntwo\r\n--b2--\r\n--b1\r\nContent-Type: message/rfc822\r\n\r\nSubject: inner\r\n\r\nthree\r\n--b1--\r\nepilogue\r\n",
    b"Subject: =?utf-8?B?w6k=?=\r\nContent-Transfer-Encoding: base64\r\n\r\naGVsbG8=\r\n",
    "Subject: [Fwd: Re: Gr\u{fc}\u{df}e (fwd)]\r\nFrom: \"J\u{f6}rg\" <j@b>\r\n\r\n\u{df}\u{df}\u{df}\r\n".as_bytes(),
];

/// Tokens that matter to the grammars, spliced in by the mutator.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"{0}\r\n",
    b"{4+}\r\n",
    b"{99999999999}\r\n",
    b"{18446744073709551616}\r\n",
    b"\r\n",
    b"\n",
    b"\r",
    b"(",
    b")",
    b"[",
    b"]",
    b"<",
    b">",
    b"\"",
    b"\\",
    b"*",
    b":",
    b",",
    b"0",
    b"4294967295",
    b"4294967296",
    b"BODY[",
    b"BODY.PEEK[1.2.3.4.5]<0.4294967295>",
    b"NIL",
    b" ",
    b"\x00",
    b"\xff",
    b"UID ",
    b".",
    b"\r\n.\r\n",
    b"--b1",
    b"--b1--",
    b"boundary=",
    b"Content-Type: multipart/mixed; boundary=b1\r\n",
    b"MAIL FROM:<",
    b"RCPT TO:<",
    b"AUTH PLAIN ",
    b"=?",
    b"?=",
    b"&",
    b"-",
    b"Re: ",
    b"[Fwd: ",
    b" (fwd)",
    "\u{df}".as_bytes(),
    "\u{20ac}".as_bytes(),
];

fn mutate(rng: &mut checks::Rng, corpus: &[&[u8]]) -> Vec<u8> {
    let mut data = corpus[rng.below(corpus.len())].to_vec();
    for _ in 0..=rng.below(8) {
        let at = rng.below(data.len() + 1);
        match rng.below(8) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 => data.insert(at, rng.next() as u8),
            2 => {
                let token = TOKENS[rng.below(TOKENS.len())];
                data.splice(at..at, token.iter().copied());
            }
            3 if !data.is_empty() => {
                let end = (at + rng.below(16)).min(data.len());
                data.drain(at.min(end)..end);
            }
            4 => {
                // Repeat a slice: long lines, many literals, deep nesting.
                let end = (at + rng.below(32)).min(data.len());
                let piece = data[at.min(end)..end].to_vec();
                for _ in 0..rng.below(200) {
                    data.splice(at..at, piece.iter().copied());
                }
            }
            5 => {
                let other = corpus[rng.below(corpus.len())];
                let from = rng.below(other.len());
                data.splice(at..at, other[from..].iter().copied());
            }
            6 => data.truncate(at),
            _ => {
                let n = rng.below(3000);
                let byte = [b'a', b' ', b'(', b'{', b'1'][rng.below(5)];
                data.splice(at..at, std::iter::repeat_n(byte, n));
            }
        }
    }
    data
}

fn escaped(data: &[u8]) -> String {
    data.iter().flat_map(|&b| std::ascii::escape_default(b)).map(char::from).collect()
}

fn run(name: &str, corpus: &[&[u8]], check: fn(&[u8])) {
    let (seed, secs) = checks::budget();
    println!("{name}: MAILCLUSTER_FUZZ_SEED={seed}, {secs} s");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut rng = checks::Rng(seed);
    // The corpus itself first, then mutations.
    let inputs =
        corpus.iter().map(|c| c.to_vec()).chain(std::iter::from_fn(|| Some(mutate(&mut rng, corpus))));
    let mut count = 0;
    for input in inputs.take(5_000 * secs as usize) {
        if Instant::now() > deadline {
            break;
        }
        if let Err(panic) = std::panic::catch_unwind(|| check(&input)) {
            eprintln!("{name}: failing input (seed {seed}, #{count}): b\"{}\"", escaped(&input));
            std::panic::resume_unwind(panic);
        }
        count += 1;
    }
    println!("{name}: {count} inputs");
    assert!(count >= corpus.len(), "not even the corpus ran");
}

#[test]
fn imap_framer_and_parser() {
    run("imap", IMAP_CORPUS, checks::imap_command);
}

/// The SMTP and POP3 sessions' line framing, on both corpora.
#[test]
fn line_framing() {
    let corpus: Vec<&[u8]> = SMTP_CORPUS.iter().chain(IMAP_CORPUS).copied().collect();
    run("lines", &corpus, checks::lines);
}

#[test]
fn smtp_commands_and_data() {
    run("smtp", SMTP_CORPUS, checks::smtp);
}

#[test]
fn message_meta() {
    run("message", MESSAGE_CORPUS, checks::message_meta);
}
