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

use std::io::Write;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mailcluster_model::message::parse_meta;
use mailcluster_model::{FlagSet, Flags, NewDelivery};
use mailcluster_server::delivery::forward::fuzzing::encode_request;

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
    b"References: ",
    b"In-Reply-To: ",
    b"Message-ID: ",
    b"<a@x>",
    b"\r\n\r\n",
    b"PROXY TCP4 ",
    b"PROXY TCP6 ",
    b"\r\n\r\n\0\r\nQUIT\n",
    b"250-",
    b"250 ",
    b"5.1.1 ",
    b"DKIM-Signature: v=1; a=ed25519-sha256; d=",
    b"From: a@org-a.test\r\n",
    b"\0",
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

/// `name` is the cargo-fuzz target of the same check. With
/// `MAILCLUSTER_FUZZ_SEEDS=<dir>` the corpus is also written to `<dir>/<name>/`,
/// which is how `fuzz/corpus/` gets its seeds.
fn run(name: &str, corpus: &[&[u8]], check: fn(&[u8])) {
    if let Some(dir) = std::env::var_os("MAILCLUSTER_FUZZ_SEEDS") {
        let dir = std::path::Path::new(&dir).join(name);
        std::fs::create_dir_all(&dir).expect("seed directory");
        for (i, input) in corpus.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), input).expect("seed");
        }
    }
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
    run("imap_command", IMAP_CORPUS, checks::imap_command);
}

/// The SMTP and POP3 sessions' line framing, on both corpora.
#[test]
fn line_framing() {
    let corpus: Vec<&[u8]> = SMTP_CORPUS.iter().chain(IMAP_CORPUS).copied().collect();
    run("lines", &corpus, checks::lines);
}

const MANAGESIEVE_CORPUS: &[&[u8]] = &[
    b"CAPABILITY\r\nSTARTTLS\r\nAUTHENTICATE \"PLAIN\" \"AGFsaWNlAHB3\"\r\n",
    b"AUTHENTICATE \"PLAIN\" {12+}\r\nAGFsaWNlAHB3\r\nNOOP \"tag\"\r\n",
    b"PUTSCRIPT \"main\" {26+}\r\nrequire \"fileinto\";\r\nkeep;\r\n",
    b"PUTSCRIPT \"a \\\"b\\\\\" {5}\r\nkeep;\r\nCHECKSCRIPT {6+}\r\nstop;\n\r\n",
    b"HAVESPACE \"main\" 65536\r\nLISTSCRIPTS\r\nSETACTIVE \"\"\r\nGETSCRIPT \"main\"\r\n",
    b"RENAMESCRIPT \"main\" {3+}\r\nnew\r\nDELETESCRIPT \"new\"\r\nLOGOUT\r\n",
];

#[test]
fn managesieve_commands() {
    run("managesieve_command", MANAGESIEVE_CORPUS, checks::managesieve_command);
}

#[test]
fn smtp_commands_and_data() {
    run("smtp_command", SMTP_CORPUS, checks::smtp);
}

#[test]
fn message_meta() {
    run("parse_meta", MESSAGE_CORPUS, checks::message_meta);
}

/// Header sections of a mailbox's messages, separated by blank lines: a thread
/// with replies, a reply to a message not there, a loop, a duplicate id.
const THREAD_CORPUS: &[&[u8]] = &[
    b"Message-ID: <1@a.example>\r\nSubject: plans\r\nDate: Mon, 1 Dec 2025 10:00:00 +0000\r\n\r\n\
Message-ID: <2@b.example>\r\nSubject: Re: plans\r\nIn-Reply-To: <1@a.example>\r\nReferences: <1@a.example>\r\n\r\n\
Message-ID: <3@a.example>\r\nSubject: Re: plans\r\nReferences: <1@a.example>\r\n <2@b.example>\r\n\r\n\
Message-ID: <4@c.example>\r\nSubject: [Fwd: plans]\r\nIn-Reply-To: <gone@x.example> (sent earlier)\r\n\r\n",
    b"Message-ID: <c@x>\nSubject: loop\nReferences: <d@x>\n\nMessage-ID: <d@x>\nSubject: loop\nReferences: <c@x>\n\n\
Message-ID: <c@x>\nSubject: dup\n\nSubject: (fwd) no id\nReferences: <> <<x>> <c@x\n",
    b"Subject: a\n\nSubject: A\n\nSubject: Re: a\nDate: Tue, 2 Dec 2025 10:00:00 -0800\n\nSubject:\n\n",
];

const PROXY_CORPUS: &[&[u8]] = &[
    b"PROXY TCP4 192.0.2.7 10.0.0.1 40000 25\r\nEHLO client.example\r\n",
    b"PROXY TCP6 2001:db8::1 2001:db8::2 1234 993\r\n",
    b"PROXY UNKNOWN\r\n",
    b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n",
    // v2, PROXY over TCP4 with a TLV after the addresses, then the session's bytes.
    b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x13\xc6\x33\x64\x09\x0a\x00\x00\x01\x15\xb3\x00\x19\x04\x00\x04test* OK\r\n",
    // v2 LOCAL (the balancer's own health check).
    b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00",
    b"\r\n\r\n\0\r\nQUIT\n\x21\x21\x00\x24\x20\x01\x0d\xb8\0\0\0\0\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x01\x04\xd2\x03\xe1",
];

/// Deflated client traffic (with the sync flush clients send), and plain text
/// for the round trip.
fn deflate_corpus() -> Vec<Vec<u8>> {
    let deflated = |chunks: &[&[u8]], level| {
        let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(level));
        for chunk in chunks {
            enc.write_all(chunk).expect("compress");
            enc.flush().expect("sync flush");
        }
        enc.finish().expect("finish")
    };
    vec![
        deflated(&[b"a1 NOOP\r\n", b"a2 FETCH 1:* (FLAGS)\r\n"], 6),
        deflated(&[b"a3 APPEND INBOX {11}\r\n", b"hello world\r\n"], 1),
        deflated(&[&[b'A'; 20_000]], 9),
        // A small bomb: 4 MiB of zeros.
        deflated(&[&vec![0u8; 4 << 20]], 9),
        b"a1 CAPABILITY\r\na2 LOGOUT\r\n".to_vec(),
        vec![0xff; 32],
    ]
}

const RELAY_CORPUS: &[&[u8]] = &[
    b"220 mx.example.com ESMTP ready\r\n",
    b"250-mx.example.com Hello\r\n250-PIPELINING\r\n250-SIZE 10240000\r\n250-STARTTLS\r\n250-AUTH PLAIN LOGIN\r\n\
250-ENHANCEDSTATUSCODES\r\n250-8BITMIME\r\n250-DSN\r\n250 SMTPUTF8\r\n",
    b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n550 5.1.1 <x@y.example>: Recipient address rejected\r\n354 End data\r\n",
    b"421-4.7.0 Try again later\n421 4.7.0 closing\n",
    b"452 4.5.3 Too many recipients\r\n250 2.0.0 Ok: queued as 4Zx\r\n221 2.0.0 Bye\r\n",
    b"554 no SMTP service here\r\n",
    b"250-mx\r\n251-mismatched codes\r\n",
];

/// Flags byte, then the remote reply, recipient, ORCPT, ENVID, sender and
/// message, NUL-separated.
const DSN_CORPUS: &[&[u8]] = &[
    b"\x04550 5.1.1 <bob@org-b.test>: no such user\r\n\0bob@org-b.test\0rfc822; Bob@Org-B.test\0QQ314159\0alice@org-a.test\0\
From: alice@org-a.test\r\nTo: bob@org-b.test\r\nSubject: hello\r\n\r\nthe body\r\n",
    b"\x09451-4.2.2 mailbox full\r\n451 4.2.2 try later\r\n\0carol@org-c.test\0\0ENV-1\0alice@org-a.test\0\
Subject: no body",
    b"\x4e250 2.0.0 Ok\r\n\0d\xc3\xa9@org-d.test\0utf-8; d\\x{E9}@org-d.test\0\0\0Subject: x\n\nbare LF body\n",
    b"\x00garbage\0x\r\ny\0\0\0a\rb\0\r\n\r\n",
    // A sender whose address reads like a MIME parameter (in the report's To:).
    b"\x04550 5.1.1 no\r\n\0caq\0\0\0org-cboundary=\"ice@org-a.test\0Subject: no\r\n\r\nbody\r\n",
];

/// Flags byte (remote address, MAIL FROM), then a message.
const INBOUND_CORPUS: &[&[u8]] = &[
    b"\x00From: Alice <alice@org-a.test>\r\nTo: bob@org-b.test\r\nSubject: hi\r\n\
Date: Tue, 1 Dec 2026 10:00:00 +0000\r\nMessage-ID: <1@org-a.test>\r\n\r\nhello\r\n",
    b"\x01DKIM-Signature: v=1; a=rsa-sha256; c=relaxed/relaxed; d=example.com; s=sel;\r\n\
 h=from:to:subject; bh=47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=; b=dGVzdA==\r\n\
From: someone@example.com\r\nTo: bob@org-b.test\r\nSubject: forwarded\r\n\r\nbody\r\n",
    b"\x03ARC-Seal: i=1; a=rsa-sha256; t=1728000000; cv=none; d=list.example; s=arc;\r\n b=c2VhbA==\r\n\
ARC-Message-Signature: i=1; a=rsa-sha256; c=relaxed/relaxed; d=list.example; s=arc;\r\n\
 h=from:subject; bh=47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=; b=c2ln\r\n\
ARC-Authentication-Results: i=1; mx.list.example; spf=pass smtp.mailfrom=org-a.test\r\n\
From: alice@org-a.test\r\nSubject: [list] hi\r\n\r\n",
    b"\x00From: =?utf-8?q?J=C3=B6rg?= <j@org-a.test>, other@org-b.test\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n\
--b\r\n\r\none\r\n--b--\r\n",
    b"\x02Subject: no from\n\nbody\n",
    // A From: domain with a bare CR and a BEL, under p=reject: the refusal is one line.
    b"\x03ARC-Seal: i=1; a=rs.test\x0dcation1; r=as\x00.mailFrom: rg-a.te\x0d\x0aFrom: alice@ttttttttttorg-a.testotbgst\x0d04l-aa.testtt\x07ttttttttttttttttttttttttttttttttt.org-a.test\x0d\x0aSu\xd2\xd3\x9d\x95\x9a\x9c\x8b\xc5 ",
];

/// Request and answer bodies as the other side writes them, and a stream of
/// length-prefixed frames.
fn group_commit_corpus() -> Vec<Vec<u8>> {
    let raw = b"From: alice@org-a.test\r\nSubject: hi\r\n\r\nbody\r\n";
    let delivery = NewDelivery {
        raw: Bytes::from_static(raw),
        meta: parse_meta(raw),
        internal_date: chrono::DateTime::from_timestamp(1_764_000_000, 5).expect("date"),
        targets: vec![7, 9],
        flags: FlagSet { system: Flags::SEEN, keywords: vec!["$Label1".into()] },
    };
    let request = encode_request(42, &delivery).expect("encodes").to_vec();
    let mut done = 9u64.to_be_bytes().to_vec();
    done.push(0);
    for (mailbox, uid, modseq, added) in [(7i64, 3u32, 11u64, 2u32), (9, 1, 4, 1)] {
        done.extend_from_slice(&mailbox.to_be_bytes());
        done.extend_from_slice(&uid.to_be_bytes());
        done.extend_from_slice(&modseq.to_be_bytes());
        done.extend_from_slice(&added.to_be_bytes());
    }
    let status = |id: u64, code: u8, text: &[u8]| [&id.to_be_bytes()[..], &[code], text].concat();
    let prefixed = |body: &[u8]| [&(body.len() as u32).to_be_bytes()[..], body].concat();
    vec![
        request[4..].to_vec(),
        done.clone(),
        status(10, 3, b"database unavailable"),
        status(11, 5, b""),
        status(12, 6, b""),
        [prefixed(&done), prefixed(&status(13, 1, b"no such mailbox")), request.clone()].concat(),
        request,
    ]
}

/// A runtime-built corpus as `run` takes it.
fn refs(corpus: &[Vec<u8>]) -> Vec<&[u8]> {
    corpus.iter().map(Vec::as_slice).collect()
}

#[test]
fn thread_references() {
    run("thread", THREAD_CORPUS, checks::thread);
}

#[test]
fn proxy_header() {
    run("proxy_header", PROXY_CORPUS, checks::proxy_header);
}

#[test]
fn deflate_stream() {
    let corpus = deflate_corpus();
    run("deflate", &refs(&corpus), checks::deflate);
}

#[test]
fn relay_replies() {
    run("relay_replies", RELAY_CORPUS, checks::relay_replies);
}

#[test]
fn dsn_reports() {
    run("dsn", DSN_CORPUS, checks::dsn);
}

#[test]
fn inbound_auth() {
    run("inbound_auth", INBOUND_CORPUS, checks::inbound_auth);
}

#[test]
fn group_commit_frames() {
    let corpus = group_commit_corpus();
    run("group_commit_frames", &refs(&corpus), checks::group_commit_frames);
}
