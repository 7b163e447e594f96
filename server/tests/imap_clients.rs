//! Real clients against the real server (net listeners, SQLite store, in-process
//! cache) over TCP and TLS on 127.0.0.1:0: Python's imaplib (implicit TLS,
//! STARTTLS, IDLE on a raw socket), curl's imap(s):// and mbsync (isync).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::*;
use mailcluster_model::FlagSet;
use mailcluster_server::app::App;
use mailcluster_server::imap::ImapProtocol;
use mailcluster_server::net::TlsProvider;
use mailcluster_server::net::listener::TlsMode;
use mailcluster_server::pop3::Pop3Protocol;
use mailcluster_server::smtp::{SmtpKind, SmtpProtocol};

/// Serves `imaps` (implicit TLS) and `imap` with the production listeners on
/// 127.0.0.1:0; returns their addresses.
fn serve(app: App, tls: TlsProvider) -> (SocketAddr, SocketAddr) {
    let addrs = serve_loopback(
        &app,
        tls,
        vec![
            ("imaps", TlsMode::Implicit, Arc::new(ImapProtocol::new(app.clone(), true))),
            ("imap", TlsMode::Plain, Arc::new(ImapProtocol::new(app.clone(), false))),
        ],
    );
    (addrs[0], addrs[1])
}

/// The real embedded store (SQLite in a temporary directory) and in-process cache.
async fn setup() -> (App, SocketAddr, SocketAddr, tempfile::TempDir) {
    let (app, dir) = embedded_app(|_| {}).await;
    bob_with_two_messages(&app).await;
    let (imaps, imap) = serve(app.clone(), tls_provider());
    (app, imaps, imap, dir)
}

/// Six sessions on one INBOX at once (APPEND, UID STORE, EXPUNGE, UID MOVE,
/// FETCH, UID SEARCH, IDLE, QRESYNC) while mail arrives over SMTP and a POP3
/// client reads and deletes, each checking what it is told against what the
/// others did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sessions_agree_on_the_mailbox() {
    let (app, _dir) = embedded_app(|c| c.tls.allow_plaintext_auth = true).await;
    bob_with_two_messages(&app).await;
    let ports = serve_loopback(
        &app,
        tls_provider(),
        vec![
            ("imap", TlsMode::Plain, Arc::new(ImapProtocol::new(app.clone(), false))),
            ("smtp", TlsMode::Plain, Arc::new(SmtpProtocol::new(app.clone(), SmtpKind::Mx))),
            ("pop3", TlsMode::Plain, Arc::new(Pop3Protocol::new(app.clone(), false))),
        ],
    );
    imap_consistency(&[ports[0].port()], &[ports[1].port()], &[ports[2].port()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_imaplib() {
    let (_app, imaps, imap, _dir) = setup().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imaplib_session.py");
    let (ok, out) = run_client(tokio::process::Command::new("python3").args([
        script,
        &imaps.port().to_string(),
        &imap.port().to_string(),
    ]))
    .await;
    println!("{out}");
    assert!(ok, "imaplib session failed:\n{out}");
}

/// COMPRESS=DEFLATE (RFC 4978) with a client built on Python's zlib, over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_compress_deflate() {
    let (_app, imaps, _imap, _dir) = setup().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imap_compress.py");
    let (ok, out) =
        run_client(tokio::process::Command::new("python3").args([script, &imaps.port().to_string()])).await;
    println!("{out}");
    assert!(ok, "compressed session failed:\n{out}");
}

/// CONDSTORE/QRESYNC (RFC 7162) through imaplib, over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_imaplib_condstore_qresync() {
    let (_app, imaps, _imap, _dir) = setup().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imaplib_condstore.py");
    let (ok, out) =
        run_client(tokio::process::Command::new("python3").args([script, &imaps.port().to_string()])).await;
    println!("{out}");
    assert!(ok, "imaplib CONDSTORE/QRESYNC session failed:\n{out}");
}

/// QUOTA (RFC 9208) through imaplib, over TLS, with a limit of 64 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_imaplib_quota() {
    let (app, imaps, _imap, _dir) = setup().await;
    let limit = 64 * 1024;
    app.store.account_set_quota("bob@example.org", Some(limit)).await.expect("set quota");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imaplib_quota.py");
    let (ok, out) = run_client(tokio::process::Command::new("python3").args([
        script,
        &imaps.port().to_string(),
        &limit.to_string(),
    ]))
    .await;
    println!("{out}");
    assert!(ok, "imaplib QUOTA session failed:\n{out}");
}

/// UTF8=ACCEPT (RFC 9755) through imaplib's UTF-8 mode, over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_imaplib_utf8_accept() {
    let (_app, imaps, _imap, _dir) = setup().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/imaplib_utf8.py");
    let (ok, out) =
        run_client(tokio::process::Command::new("python3").args([script, &imaps.port().to_string()])).await;
    println!("{out}");
    assert!(ok, "imaplib UTF8=ACCEPT session failed:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_imaps() {
    let (_app, imaps, imap, _dir) = setup().await;
    let base = format!("imaps://127.0.0.1:{}", imaps.port());
    let curl = |url: String, extra: &[&str]| {
        let mut c = tokio::process::Command::new("curl");
        c.args(["-sSk", "--max-time", "20", "-u", "bob@example.org:pw"]).args(extra).arg(url);
        c
    };
    let (ok, out) = run_client(&mut curl(format!("{base}/"), &[])).await;
    assert!(ok && out.contains("* LIST (\\HasNoChildren) \"/\" \"INBOX\""), "LIST: {out}");
    let (ok, out) = run_client(&mut curl(format!("{base}/"), &["-X", "EXAMINE INBOX"])).await;
    assert!(ok && out.contains("* 2 EXISTS") && out.contains("* OK [UIDVALIDITY "), "EXAMINE: {out}");
    let (ok, out) = run_client(&mut curl(format!("{base}/INBOX"), &["-X", "UID SEARCH UNSEEN"])).await;
    assert!(ok && out.contains("* SEARCH 1 2"), "UID SEARCH: {out}");
    let (ok, out) = run_client(&mut curl(format!("{base}/INBOX;UID=2"), &[])).await;
    assert!(ok && out.contains("Subject: second") && out.contains("second body"), "FETCH: {out}");
    let (ok, out) = run_client(&mut curl(format!("{base}/INBOX?UNSEEN"), &[])).await;
    assert!(ok && out.contains("* SEARCH 1"), "SEARCH after fetch: {out}");
    // STARTTLS on the plain port.
    let (ok, out) = run_client(&mut curl(
        format!("imap://127.0.0.1:{}/INBOX", imap.port()),
        &["--ssl-reqd", "-X", "UID SEARCH ALL"],
    ))
    .await;
    assert!(ok && out.contains("* SEARCH 1 2"), "STARTTLS: {out}");
}

/// mbsync (isync), the two-way IMAP/Maildir synchroniser, over implicit TLS
/// trusting the server's certificate: a first pull; local changes pushed (a new
/// message, a flag, a deletion, a new folder); server changes pulled (a flag,
/// a new message, an expunge); and a run with nothing to do that changes
/// nothing. Each mbsync run must succeed; the server's state is read back
/// through an IMAP session, the local one from the Maildir file names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mbsync_two_way_sync() {
    // Plaintext logins for the in-memory session that reads the server's state.
    let (app, dir) = embedded_app(|c| c.tls.allow_plaintext_auth = true).await;
    let bob = bob_with_two_messages(&app).await;
    let (tls, pem) = tls_provider_with_pem();
    let (imaps, _imap) = serve(app.clone(), tls);
    let work = tempfile::tempdir().expect("tempdir");
    let cert = work.path().join("cert.pem");
    std::fs::write(&cert, pem).expect("write cert");
    let maildir = work.path().join("mail");
    std::fs::create_dir(&maildir).expect("maildir");
    let rc = work.path().join("mbsyncrc");
    std::fs::write(
        &rc,
        format!(
            "IMAPAccount mc\nHost 127.0.0.1\nPort {}\nUser bob@example.org\nPass pw\nSSLType IMAPS\nCertificateFile {}\n\n\
             IMAPStore remote\nAccount mc\n\n\
             MaildirStore local\nPath {m}/\nInbox {m}/INBOX\nSubFolders Verbatim\n\n\
             Channel mc\nFar :remote:\nNear :local:\nPatterns *\nCreate Both\nExpunge Both\nSyncState *\n",
            imaps.port(),
            cert.display(),
            m = maildir.display()
        ),
    )
    .expect("write mbsyncrc");
    let sync = || async {
        let (ok, out) = run_client(tokio::process::Command::new("mbsync").arg("-c").arg(&rc).arg("-a")).await;
        assert!(ok, "mbsync failed:\n{out}");
        assert!(!out.to_lowercase().contains("warning"), "{out}");
    };
    // Local messages of a folder: (file name, Maildir flags after ":2,").
    let local = |folder: &str| -> Vec<(std::path::PathBuf, String)> {
        let mut found = Vec::new();
        for sub in ["new", "cur"] {
            let Ok(entries) = std::fs::read_dir(maildir.join(folder).join(sub)) else { continue };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let flags = name.split_once(":2,").map(|(_, f)| f.to_string()).unwrap_or_default();
                found.push((e.path(), flags));
            }
        }
        found.sort();
        found
    };
    let body_of = |path: &std::path::Path| std::fs::read_to_string(path).expect("read message");

    // 1. The first pull: the two messages, unseen.
    sync().await;
    let inbox = local("INBOX");
    assert_eq!(inbox.len(), 2, "{inbox:?}");
    assert!(inbox.iter().all(|(_, f)| f.is_empty()), "{inbox:?}");
    assert!(["Sent", "Drafts", "Trash"].iter().all(|f| maildir.join(f).is_dir()), "folders created");

    // 2. Local changes pushed.
    let first = inbox.iter().find(|(p, _)| body_of(p).contains("first body")).expect("first").0.clone();
    let second = inbox.iter().find(|(p, _)| body_of(p).contains("second body")).expect("second").0.clone();
    let cur = maildir.join("INBOX/cur");
    let name = |p: &std::path::Path| p.file_name().unwrap().to_string_lossy().into_owned();
    let base = |p: &std::path::Path| name(p).split_once(":2,").map_or(name(p), |(b, _)| b.to_string());
    std::fs::rename(&first, cur.join(format!("{}:2,FS", base(&first)))).expect("flag");
    std::fs::rename(&second, cur.join(format!("{}:2,T", base(&second)))).expect("trash");
    std::fs::write(
        maildir.join("INBOX/new/1800000000.1_1.local"),
        "From: bob@example.org\r\nSubject: written offline\r\nMessage-ID: <offline-1@example.org>\r\n\r\nfrom the maildir\r\n",
    )
    .expect("new message");
    for sub in ["cur", "new", "tmp"] {
        std::fs::create_dir_all(maildir.join("Projekte").join(sub)).expect("folder");
    }
    std::fs::write(maildir.join("Projekte/new/1800000001.1_1.local"), "Subject: filed\r\n\r\nx\r\n")
        .expect("filed");
    sync().await;
    let (mut c, _tx) = login(&app, "bob@example.org", "pw").await;
    c.cmd("s1", "SELECT INBOX").await;
    let r = c.cmd("f1", "UID FETCH 1:* (FLAGS BODY.PEEK[HEADER.FIELDS (Subject)])").await;
    let joined = r.join("\n");
    assert!(joined.contains("FLAGS (\\Seen \\Flagged)") && joined.contains("Subject: first"), "{r:?}");
    assert!(!joined.contains("Subject: second"), "trashed locally, expunged here: {r:?}");
    assert!(joined.contains("Subject: written offline"), "{r:?}");
    let r = c.cmd("st", "STATUS Projekte (MESSAGES)").await;
    assert_eq!(r[0], "* STATUS \"Projekte\" (MESSAGES 1)");

    // 3. Server changes pulled.
    let r = c.cmd("se", "UID SEARCH HEADER Message-ID <offline-1@example.org>").await;
    let uid = r[0].strip_prefix("* SEARCH ").expect("found").to_string();
    c.cmd("fl", &format!("UID STORE {uid} +FLAGS (\\Answered)")).await;
    let r = c.cmd("sf", "UID SEARCH SUBJECT first").await;
    let first_uid = r[0].strip_prefix("* SEARCH ").expect("found").to_string();
    c.cmd("dl", &format!("UID STORE {first_uid} +FLAGS.SILENT (\\Deleted)")).await;
    c.cmd("ex", "EXPUNGE").await;
    deliver(&app, &bob, "INBOX", &sample("third", "third body"), FlagSet::default()).await;
    sync().await;
    let inbox = local("INBOX");
    assert_eq!(inbox.len(), 2, "{inbox:?}");
    let offline = inbox.iter().find(|(p, _)| body_of(p).contains("from the maildir")).expect("offline");
    assert!(offline.1.contains('R'), "\\Answered as R: {inbox:?}");
    assert!(inbox.iter().any(|(p, _)| body_of(p).contains("third body")), "{inbox:?}");
    assert!(!inbox.iter().any(|(p, _)| body_of(p).contains("first body")), "expunged there, gone here");

    // 4. Nothing to do: nothing changes on either side.
    c.cmd("n0", "NOOP").await;
    let before = (local("INBOX"), local("Projekte"));
    sync().await;
    assert_eq!((local("INBOX"), local("Projekte")), before);
    let r = c.cmd("n", "NOOP").await;
    assert_eq!(r, ["n OK NOOP completed"], "no change reached the server");
    drop(dir);
}
