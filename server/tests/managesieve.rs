//! ManageSieve (RFC 5804) over real sockets and TLS, against the embedded
//! store: a transcript per section of the RFC (each command's success and
//! failure responses), what hostile clients send, and `sieve-connect`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use mailcluster_server::app::App;
use mailcluster_server::auth::Authenticator;
use mailcluster_server::config::Config;
use mailcluster_server::delivery::Deliverer;
use mailcluster_server::managesieve::ManageSieveProtocol;
use mailcluster_server::metrics::Metrics;
use mailcluster_server::net::listener::TlsMode;
use mailcluster_server::net::{Protocol, SessionStream, Shutdown};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;

struct Server {
    app: App,
    addr: std::net::SocketAddr,
    pem: String,
    _dir: tempfile::TempDir,
}

/// A pod serving ManageSieve on 127.0.0.1 (plaintext logins allowed unless
/// `tweak` says otherwise), with bob@example.org (password "pw"). Failed
/// logins are answered at once, and the fourth for a user is refused.
async fn server(tweak: impl FnOnce(&mut Config)) -> Server {
    let (store, dir) = sqlite_store().await;
    let cache: Arc<dyn mailcluster_server::cache::Cache> =
        Arc::new(mailcluster_server::cache::local::LocalCache::new());
    let s = serve(store, cache, dir, tweak);
    account(&s.app, "bob@example.org", "pw").await;
    s
}

fn serve(
    store: Arc<dyn mailcluster_server::store::Store>,
    cache: Arc<dyn mailcluster_server::cache::Cache>,
    dir: tempfile::TempDir,
    tweak: impl FnOnce(&mut Config),
) -> Server {
    let mut config = Config::default();
    config.tls.allow_plaintext_auth = true;
    config.auth.failure_delay_ms = 0;
    config.auth.max_failure_delay_ms = 0;
    config.auth.max_failures_per_user = 3;
    tweak(&mut config);
    let auth = Arc::new(Authenticator::new(store.clone(), cache.clone(), config.auth.clone()));
    let deliverer = Arc::new(Deliverer::with_options(store.clone(), Default::default()));
    let app = App::new(Arc::new(config), store, cache, Arc::new(Metrics::new()), auth, deliverer);
    let (tls, pem) = tls_provider_with_pem();
    let proto: Arc<dyn Protocol> = Arc::new(ManageSieveProtocol::new(app.clone()));
    let addr = serve_loopback(&app, tls, vec![("managesieve", TlsMode::Plain, proto)])[0];
    Server { app, addr, pem, _dir: dir }
}

/// A pod of the PostgreSQL database `url` with its own pool and its own Redis
/// connection under `prefix`.
async fn pg_pod(url: &str, prefix: &str) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let connect = Duration::from_secs(10);
    let store = mailcluster_server::store::open(Some(url), dir.path(), 4, connect).await.expect("open pg");
    store.migrate().await.expect("migrate");
    let cache = mailcluster_server::cache::redis::RedisCache::connect(
        &mailcluster_testkit::redis_url(),
        prefix,
        connect,
        mailcluster_server::config::RedisConfig::default().client_cache_keys,
    )
    .await
    .expect("Redis is reachable");
    serve(store, Arc::new(cache), dir, |_| {})
}

/// The lines of one response, up to and including its `OK`, `NO` or `BYE`;
/// a literal is one entry, its data.
async fn response<S: AsyncRead + AsyncWrite + Unpin>(c: &mut Client<S>) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let l = c.line().await;
        if let Some(n) = l.strip_prefix('{').and_then(|r| r.strip_suffix('}')).and_then(|n| n.parse().ok()) {
            let mut data = vec![0; n];
            c.io.read_exact(&mut data).await.expect("literal data");
            lines.push(String::from_utf8_lossy(&data).into_owned());
            continue;
        }
        let done = ["OK", "NO", "BYE"].iter().any(|k| l == *k || l.starts_with(&format!("{k} ")));
        lines.push(l);
        if done {
            return lines;
        }
    }
}

async fn cmd<S: AsyncRead + AsyncWrite + Unpin>(c: &mut Client<S>, line: &str) -> Vec<String> {
    c.send(&format!("{line}\r\n")).await;
    response(c).await
}

/// The final line of the response to `line`.
async fn last<S: AsyncRead + AsyncWrite + Unpin>(c: &mut Client<S>, line: &str) -> String {
    cmd(c, line).await.pop().expect("a response")
}

fn plain(user: &str, password: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("\0{user}\0{password}"))
}

async fn connect(s: &Server) -> (Client<TcpStream>, Vec<String>) {
    let mut c = Client::new(TcpStream::connect(s.addr).await.expect("connect"));
    let greeting = response(&mut c).await;
    (c, greeting)
}

async fn logged_in(s: &Server) -> Client<TcpStream> {
    let (mut c, _) = connect(s).await;
    let r = last(&mut c, &format!("AUTHENTICATE \"PLAIN\" \"{}\"", plain("bob@example.org", "pw"))).await;
    assert_eq!(r, "OK \"Logged in\"");
    c
}

async fn bob(s: &Server) -> i64 {
    s.app.store.account_get("bob@example.org").await.expect("get").expect("bob").id
}

// ------------------------------------------------------------------ §1.7, §2.4, §2.14

#[tokio::test]
async fn greeting_capability_and_noop() {
    let s = server(|c| c.tls.allow_plaintext_auth = false).await;
    let (mut c, greeting) = connect(&s).await;
    // The SIEVE capability: every extension delivery runs (RFC 5804 §1.7),
    // at least those mail clients' filter editors write.
    let sieve = greeting.iter().find(|l| l.starts_with("\"SIEVE\" ")).expect("SIEVE capability");
    let announced: Vec<&str> = sieve["\"SIEVE\" ".len()..].trim_matches('"').split(' ').collect();
    for wanted in [
        "fileinto",
        "reject",
        "ereject",
        "envelope",
        "imap4flags",
        "copy",
        "body",
        "variables",
        "vacation",
        "vacation-seconds",
        "relational",
        "subaddress",
        "date",
        "index",
        "mailbox",
        "include",
        "duplicate",
        "editheader",
        "spamtest",
        "virustest",
    ] {
        assert!(announced.contains(&wanted), "{wanted} in {sieve}");
    }
    assert_eq!(
        greeting,
        [
            "\"IMPLEMENTATION\" \"Mailcluster\"",
            "\"SASL\" \"\"",
            sieve.as_str(),
            "\"STARTTLS\"",
            "\"MAXREDIRECTS\" \"4\"",
            "\"VERSION\" \"1.0\"",
            "OK \"Mailcluster ManageSieve ready\"",
        ],
        "no PLAIN before TLS when plaintext logins are off"
    );
    let caps = cmd(&mut c, "capability").await;
    assert_eq!(caps[..caps.len() - 1], greeting[..greeting.len() - 1]);
    assert_eq!(caps.last().map(String::as_str), Some("OK \"Capability completed\""));
    assert_eq!(last(&mut c, "NOOP").await, "OK \"Done\"");
    assert_eq!(last(&mut c, "NOOP \"STARTTLS-SYNC-42\"").await, "OK (TAG \"STARTTLS-SYNC-42\") \"Done\"");
    // §2.1: PLAIN is not offered in the clear, and not taken either.
    let r = last(&mut c, &format!("AUTHENTICATE \"PLAIN\" \"{}\"", plain("bob@example.org", "pw"))).await;
    assert!(r.starts_with("NO (ENCRYPT-NEEDED)"), "{r}");
    assert_eq!(last(&mut c, "LOGOUT").await, "OK \"Logout completed\"");
    assert!(c.closed().await);
}

// ------------------------------------------------------------------ §2.2 STARTTLS, §2.1 AUTHENTICATE

#[tokio::test]
async fn starttls_reissues_capabilities_then_plain_logs_in() {
    let s = server(|c| c.tls.allow_plaintext_auth = false).await;
    let (mut c, _) = connect(&s).await;
    // Pipelined after STARTTLS, in the clear: dropped, never executed.
    c.send("STARTTLS\r\nLISTSCRIPTS\r\n").await;
    assert_eq!(response(&mut c).await, ["OK \"Begin TLS negotiation\""]);
    let mut roots = rustls::RootCertStore::empty();
    let der = rustls_pemfile::certs(&mut s.pem.as_bytes()).next().expect("cert").expect("pem");
    roots.add(der).expect("root");
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = c.io.into_inner();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("handshake");
    let mut c = Client::new(tls);
    let caps = response(&mut c).await;
    assert!(caps.contains(&"\"SASL\" \"PLAIN\"".to_string()), "{caps:?}");
    assert!(!caps.iter().any(|l| l.contains("STARTTLS")), "{caps:?}");
    assert_eq!(caps.last().map(String::as_str), Some("OK \"TLS negotiation successful\""));
    assert!(last(&mut c, "STARTTLS").await.starts_with("NO"), "not twice");
    assert!(last(&mut c, "LISTSCRIPTS").await.starts_with("NO"), "not before AUTHENTICATE");
    // The initial response in a literal.
    let ir = plain("bob@example.org", "pw");
    c.send(&format!("AUTHENTICATE \"PLAIN\" {{{}+}}\r\n{ir}\r\n", ir.len())).await;
    assert_eq!(response(&mut c).await, ["OK \"Logged in\""]);
    let caps = cmd(&mut c, "CAPABILITY").await;
    assert!(caps.contains(&"\"OWNER\" \"bob@example.org\"".to_string()), "{caps:?}");
    assert!(caps.contains(&"\"SASL\" \"\"".to_string()), "{caps:?}");
    assert!(last(&mut c, "AUTHENTICATE \"PLAIN\"").await.starts_with("NO"), "once per session");
    assert_eq!(last(&mut c, "LISTSCRIPTS").await, "OK \"Listscripts completed\"");
}

#[tokio::test]
async fn authenticate_with_a_challenge_and_its_failures() {
    let s = server(|_| {}).await;
    let (mut c, _) = connect(&s).await;
    assert!(last(&mut c, "AUTHENTICATE \"DIGEST-MD5\"").await.starts_with("NO"), "PLAIN only");
    // No initial response: an empty challenge, then the response as a string.
    c.send("AUTHENTICATE \"PLAIN\"\r\n").await;
    assert_eq!(c.line().await, "\"\"");
    assert!(last(&mut c, "\"*\"").await.starts_with("NO"), "the client cancels");
    c.send("AUTHENTICATE \"PLAIN\"\r\n").await;
    assert_eq!(c.line().await, "\"\"");
    assert!(last(&mut c, "\"not base64!\"").await.starts_with("NO"));
    c.send("AUTHENTICATE \"PLAIN\"\r\n").await;
    assert_eq!(c.line().await, "\"\"");
    let wrong = plain("bob@example.org", "wrong");
    assert_eq!(last(&mut c, &format!("\"{wrong}\"")).await, "NO \"Authentication failed\"");
    let other = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode("alice@example.org\0bob@example.org\0pw")
    };
    assert!(
        last(&mut c, &format!("AUTHENTICATE \"PLAIN\" \"{other}\"")).await.starts_with("NO"),
        "no proxying"
    );
    c.send("AUTHENTICATE \"PLAIN\"\r\n").await;
    assert_eq!(c.line().await, "\"\"");
    let ok = plain("bob@example.org", "pw");
    c.send(&format!("{{{}+}}\r\n{ok}\r\n", ok.len())).await;
    assert_eq!(response(&mut c).await, ["OK \"Logged in\""]);
}

/// Failed logins over ManageSieve count with those of every other protocol:
/// past the limit the right password is refused here and over IMAP alike.
#[tokio::test]
async fn failed_logins_count_in_the_shared_limiter() {
    let s = server(|_| {}).await;
    let (mut c, _) = connect(&s).await;
    for _ in 0..3 {
        let r =
            last(&mut c, &format!("AUTHENTICATE \"PLAIN\" \"{}\"", plain("bob@example.org", "guess"))).await;
        assert_eq!(r, "NO \"Authentication failed\"");
    }
    let r = last(&mut c, &format!("AUTHENTICATE \"PLAIN\" \"{}\"", plain("bob@example.org", "pw"))).await;
    assert!(r.starts_with("NO (TRYLATER)"), "{r}");
    let (mut imap, _tx) = common::connect(&s.app);
    imap.line().await;
    let r = imap.cmd("a", "LOGIN bob@example.org pw").await;
    assert!(r.last().expect("tagged").starts_with("a NO"), "{r:?}");
}

// ------------------------------------------------------------------ §2.3 - §2.12 on scripts

#[tokio::test]
async fn scripts_transcript() {
    let s = server(|c| {
        c.sieve.max_scripts = 2;
        c.sieve.max_script_bytes = 128;
    })
    .await;
    let (mut c, _) = connect(&s).await;
    for before in ["LISTSCRIPTS", "GETSCRIPT \"a\"", "PUTSCRIPT \"a\" {5+}\r\nkeep;", "HAVESPACE \"a\" 1"] {
        assert_eq!(last(&mut c, before).await, "NO \"Authenticate first\"", "{before}");
    }
    let mut c = logged_in(&s).await;
    // §2.5 HAVESPACE
    assert_eq!(last(&mut c, "HAVESPACE \"main\" 128").await, "OK \"Putscript would succeed\"");
    assert!(last(&mut c, "HAVESPACE \"main\" 129").await.starts_with("NO (QUOTA/MAXSIZE)"));
    // §2.6 PUTSCRIPT: non-synchronising and synchronising literals alike
    assert_eq!(last(&mut c, "PUTSCRIPT \"main\" {5+}\r\nkeep;").await, "OK \"Putscript completed\"");
    assert_eq!(
        last(&mut c, "Putscript \"other \\\"one\\\"\" {8}\r\ndiscard;").await,
        "OK \"Putscript completed\""
    );
    assert!(last(&mut c, "HAVESPACE \"third\" 1").await.starts_with("NO (QUOTA/MAXSCRIPTS)"));
    assert_eq!(
        last(&mut c, "HAVESPACE \"main\" 10").await,
        "OK \"Putscript would succeed\"",
        "a replacement"
    );
    assert!(last(&mut c, "PUTSCRIPT \"third\" {5+}\r\nkeep;").await.starts_with("NO (QUOTA/MAXSCRIPTS)"));
    // A script the check refuses is not stored.
    c.send_bytes(b"PUTSCRIPT \"main\" {9+}\r\nkeep;\r\n\xff\r\n").await;
    assert_eq!(response(&mut c).await, ["NO \"line 2: the script is not UTF-8\""]);
    // §2.7 LISTSCRIPTS
    assert_eq!(
        cmd(&mut c, "LISTSCRIPTS").await,
        ["\"main\"", "\"other \\\"one\\\"\"", "OK \"Listscripts completed\""]
    );
    // §2.8 SETACTIVE
    assert_eq!(last(&mut c, "SETACTIVE \"main\"").await, "OK \"Setactive completed\"");
    assert!(last(&mut c, "SETACTIVE \"nothing\"").await.starts_with("NO (NONEXISTENT)"));
    assert_eq!(
        cmd(&mut c, "LISTSCRIPTS").await,
        ["\"main\" ACTIVE", "\"other \\\"one\\\"\"", "OK \"Listscripts completed\""]
    );
    // §2.9 GETSCRIPT
    assert_eq!(cmd(&mut c, "GETSCRIPT \"main\"").await, ["keep;", "", "OK \"Getscript completed\""]);
    assert!(last(&mut c, "GETSCRIPT \"nothing\"").await.starts_with("NO (NONEXISTENT)"));
    // §2.10 DELETESCRIPT
    assert!(last(&mut c, "DELETESCRIPT \"main\"").await.starts_with("NO (ACTIVE)"));
    assert!(last(&mut c, "DELETESCRIPT \"nothing\"").await.starts_with("NO (NONEXISTENT)"));
    // §2.11.1 RENAMESCRIPT
    assert!(
        last(&mut c, "RENAMESCRIPT \"main\" \"other \\\"one\\\"\"").await.starts_with("NO (ALREADYEXISTS)")
    );
    assert!(last(&mut c, "RENAMESCRIPT \"nothing\" \"x\"").await.starts_with("NO (NONEXISTENT)"));
    assert_eq!(last(&mut c, "RENAMESCRIPT \"main\" \"renamed\"").await, "OK \"Renamescript completed\"");
    let active = s.app.store.sieve_active(bob(&s).await).await.expect("active");
    assert_eq!(active, Some(("renamed".into(), b"keep;".to_vec())), "still active under its new name");
    // §2.12 CHECKSCRIPT stores nothing
    assert_eq!(last(&mut c, "CHECKSCRIPT {5+}\r\nstop;").await, "OK \"Script is valid\"");
    c.send_bytes(b"CHECKSCRIPT {3+}\r\n\xc3\x28;\r\n").await;
    assert!(response(&mut c).await[0].starts_with("NO"));
    // SETACTIVE "" leaves none active; then the script may go.
    assert_eq!(last(&mut c, "SETACTIVE \"\"").await, "OK \"Setactive completed\"");
    assert_eq!(last(&mut c, "DELETESCRIPT \"renamed\"").await, "OK \"Deletescript completed\"");
    assert_eq!(cmd(&mut c, "LISTSCRIPTS").await, ["\"other \\\"one\\\"\"", "OK \"Listscripts completed\""]);
    // A script with lines and quotes comes back as a literal, byte for byte.
    let script = "require \"fileinto\";\r\nif header :contains \"subject\" \"x\" { fileinto \"X\"; }\r\n";
    assert_eq!(
        last(&mut c, &format!("PUTSCRIPT \"b\" {{{}+}}\r\n{script}", script.len())).await,
        "OK \"Putscript completed\""
    );
    assert_eq!(cmd(&mut c, "GETSCRIPT \"b\"").await, [script, "", "OK \"Getscript completed\""]);
    let m = &s.app.metrics;
    assert!(m.commands_total.with_label_values(&["managesieve", "PUTSCRIPT", "ok"]).get() >= 3);
    assert!(m.commands_total.with_label_values(&["managesieve", "PUTSCRIPT", "err"]).get() >= 2);
}

#[tokio::test]
async fn script_names_follow_rfc_5804_section_1_6() {
    let s = server(|_| {}).await;
    let mut c = logged_in(&s).await;
    let long = "é".repeat(129);
    for bad in ["\"\"".to_string(), "{3+}\r\na\tb".into(), "{4+}\r\na\r\nb".into(), format!("\"{long}\"")] {
        let r = last(&mut c, &format!("PUTSCRIPT {bad} {{5+}}\r\nkeep;")).await;
        assert!(r.starts_with("NO"), "{bad:?}: {r}");
    }
    let r = last(&mut c, &format!("PUTSCRIPT \"{}\" {{5+}}\r\nkeep;", "é".repeat(128))).await;
    assert_eq!(r, "OK \"Putscript completed\"");
    assert!(last(&mut c, "RENAMESCRIPT \"x\" \"\"").await.starts_with("NO"));
    assert!(s.app.store.sieve_list(bob(&s).await).await.expect("list").len() == 1);
    // Malformed commands count as errors; enough of them end the session.
    for _ in 0..9 {
        assert!(last(&mut c, "GETSCRIPT unquoted").await.starts_with("NO \"Syntax error"));
    }
    assert_eq!(last(&mut c, "BOGUS").await, "NO \"Unknown command\"");
    assert_eq!(c.line().await, "BYE \"Too many errors\"");
    assert!(c.closed().await);
}

/// Two pods of one PostgreSQL database and one Redis: a script stored and
/// activated on one is the other's, and failed logins on one count on the
/// other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_share_scripts_and_the_login_limiter() {
    let db = mailcluster_testkit::TestDatabase::create("mc_sieve").await;
    let prefix = format!("mc_sieve_test_{:08x}:", rand::random::<u32>());
    let a = pg_pod(&db.url, &prefix).await;
    let b = pg_pod(&db.url, &prefix).await;
    a.app.store.domain_add("example.org").await.expect("domain");
    account(&a.app, "bob@example.org", "pw").await;
    account(&a.app, "carol@example.org", "pw").await;
    let mut on_a = logged_in(&a).await;
    assert_eq!(last(&mut on_a, "PUTSCRIPT \"main\" {5+}\r\nkeep;").await, "OK \"Putscript completed\"");
    assert_eq!(last(&mut on_a, "SETACTIVE \"main\"").await, "OK \"Setactive completed\"");
    let mut on_b = logged_in(&b).await;
    assert_eq!(cmd(&mut on_b, "LISTSCRIPTS").await, ["\"main\" ACTIVE", "OK \"Listscripts completed\""]);
    assert!(last(&mut on_b, "DELETESCRIPT \"main\"").await.starts_with("NO (ACTIVE)"));

    let (mut guesser, _) = connect(&a).await;
    for _ in 0..3 {
        let r =
            last(&mut guesser, &format!("AUTHENTICATE \"PLAIN\" \"{}\"", plain("carol@example.org", "x")))
                .await;
        assert_eq!(r, "NO \"Authentication failed\"");
    }
    let (mut c, _) = connect(&b).await;
    let r = last(&mut c, &format!("AUTHENTICATE \"PLAIN\" \"{}\"", plain("carol@example.org", "pw"))).await;
    assert!(r.starts_with("NO (TRYLATER)"), "the other pod counts them: {r}");
    drop((on_a, on_b, guesser, c, a, b));
    drop(db);
}

// ------------------------------------------------------------------ hostile clients

/// A literal announced before login larger than a login needs is refused from
/// its announcement: the session ends without reading (or holding) it.
#[tokio::test]
async fn a_huge_literal_before_login_ends_the_session_unread() {
    let s = server(|_| {}).await;
    for announce in ["{1000000000+}", "{1000000000}", "{5000+}"] {
        let (mut c, _) = connect(&s).await;
        c.send(&format!("AUTHENTICATE \"PLAIN\" {announce}\r\nAAAA")).await;
        let r = c.line().await;
        assert!(r.starts_with("BYE"), "{announce}: {r}");
        assert!(c.closed().await, "{announce}");
    }
    budget_returns_to_zero(&s.app).await;
    // Within the limit a literal is fine before login.
    let (mut c, _) = connect(&s).await;
    let ok = plain("bob@example.org", "pw");
    assert_eq!(
        last(&mut c, &format!("AUTHENTICATE \"PLAIN\" {{{}}}\r\n{ok}", ok.len())).await,
        "OK \"Logged in\""
    );
}

/// After login a script over `sieve.max_script_bytes` gets QUOTA/MAXSIZE from
/// its announcement; its data is read and dropped, and the session goes on.
/// One far beyond it ends the session instead.
#[tokio::test]
async fn a_literal_over_quota_is_refused_and_the_session_stays_in_step() {
    let s = server(|c| c.sieve.max_script_bytes = 1000).await;
    let mut c = logged_in(&s).await;
    let big = "#".repeat(1001);
    let r = last(&mut c, &format!("PUTSCRIPT \"big\" {{1001+}}\r\n{big}")).await;
    assert!(r.starts_with("NO (QUOTA/MAXSIZE)"), "{r}");
    assert_eq!(last(&mut c, "NOOP").await, "OK \"Done\"", "in step after the dropped literal");
    assert_eq!(last(&mut c, "LISTSCRIPTS").await, "OK \"Listscripts completed\"", "nothing stored");
    c.send("PUTSCRIPT \"huge\" {100000000+}\r\n").await;
    assert!(c.line().await.starts_with("BYE"));
    assert!(c.closed().await);
    budget_returns_to_zero(&s.app).await;
}

#[tokio::test]
async fn a_long_line_ends_the_session() {
    let s = server(|_| {}).await;
    let (mut c, _) = connect(&s).await;
    c.send(&format!("NOOP \"{}\"\r\n", "a".repeat(10_000))).await;
    assert_eq!(c.line().await, "BYE \"Command line too long\"");
    assert!(c.closed().await);
}

/// A client that does not log in is let go at the deadline, busy or not; a
/// third connection from one address finds the per-IP cap.
#[tokio::test]
async fn logins_have_a_deadline_and_addresses_a_cap() {
    let s = server(|c| {
        c.sieve.preauth_timeout_secs = 1;
        c.sieve.max_connections_per_ip = 2;
    })
    .await;
    let (mut idle, _) = connect(&s).await;
    let (mut busy, _) = connect(&s).await;
    let mut third = Client::new(TcpStream::connect(s.addr).await.expect("connect"));
    assert_eq!(third.line().await, "BYE (TRYLATER) \"Too many connections, try again later\"");
    for _ in 0..4 {
        busy.send("NOOP\r\n").await;
        assert_eq!(busy.line().await, "OK \"Done\"");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(idle.line().await, "BYE \"Idle for too long\"");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), busy.io.read_to_end(&mut rest)).await;
    assert!(String::from_utf8_lossy(&rest).contains("BYE \"Idle for too long\""), "busy too");
}

/// The pod's transfer budget once every session is gone: all given back.
async fn budget_returns_to_zero(app: &App) {
    for _ in 0..50 {
        if app.budget.in_use() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.budget.in_use(), 0, "transfer budget given back");
}

/// A session on an in-memory stream leaves at shutdown with BYE.
#[tokio::test]
async fn shutdown_says_bye() {
    let s = server(|_| {}).await;
    let (client, server_side) = tokio::io::duplex(1 << 16);
    let (tx, shutdown) = Shutdown::new();
    let proto = ManageSieveProtocol::new(s.app.clone());
    tokio::spawn(async move { proto.handle(SessionStream::Memory(server_side), ctx(shutdown)).await });
    let mut c = Client::new(client);
    response(&mut c).await;
    tx.send(true).expect("signal");
    assert_eq!(c.line().await, "BYE (TRYLATER) \"Server shutting down\"");
}

// ------------------------------------------------------------------ a real client

/// `sieve-connect` (Debian's) uploads, activates and lists a script over
/// STARTTLS (it may not send credentials in the clear), and is refused the
/// deletion of the active one.
/// Skipped when it is not installed, unless MAILCLUSTER_REQUIRE_SIEVE_CONNECT is
/// set (CI sets it).
#[tokio::test]
async fn sieve_connect_uploads_and_activates_over_starttls() {
    if which("sieve-connect").is_none() {
        assert!(
            std::env::var_os("MAILCLUSTER_REQUIRE_SIEVE_CONNECT").is_none(),
            "sieve-connect is required (MAILCLUSTER_REQUIRE_SIEVE_CONNECT) but not installed"
        );
        eprintln!("sieve-connect is not installed: skipped");
        return;
    }
    let s = server(|c| c.tls.allow_plaintext_auth = false).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let script = "require [\"fileinto\", \"mailbox\"];\nif header :contains \"subject\" \"[list]\" {\n  fileinto :create \"Lists\";\n}\n";
    let local = dir.path().join("filter.sieve");
    std::fs::write(&local, script).expect("write script");
    std::fs::write(dir.path().join("password"), "pw\n").expect("write password");
    let run = |action: &str| {
        let line = format!(
            "sieve-connect --server 127.0.0.1 --port {} --user bob@example.org --passwordfd 3 --notlsverify \
             --noclearchan {action} 3<{}",
            s.addr.port(),
            dir.path().join("password").display()
        );
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", &line]).stdin(std::process::Stdio::null());
        cmd
    };
    let (ok, out) =
        run_client(&mut run(&format!("--upload --localsieve {} --remotesieve filter", local.display())))
            .await;
    assert!(ok, "upload: {out}");
    let (ok, out) = run_client(&mut run("--activate --remotesieve filter")).await;
    assert!(ok, "activate: {out}");
    let (ok, out) = run_client(&mut run("--list")).await;
    assert!(ok && out.contains("filter"), "list: {out}");
    let active = s.app.store.sieve_active(bob(&s).await).await.expect("active");
    assert_eq!(active, Some(("filter".into(), script.as_bytes().to_vec())));
    let (ok, out) = run_client(&mut run("--delete --remotesieve filter")).await;
    assert!(!ok && out.contains("NO (ACTIVE)"), "the active script stays: {out}");
    assert!(s.app.store.sieve_active(bob(&s).await).await.expect("active").is_some());

    // Mail then arriving on the same pod's MX is filed by it.
    let (tls, _) = tls_provider_with_pem();
    let mx: Arc<dyn Protocol> = Arc::new(mailcluster_server::smtp::SmtpProtocol::new(
        s.app.clone(),
        mailcluster_server::smtp::SmtpKind::Mx,
    ));
    let smtp = serve_loopback(&s.app, tls, vec![("smtp", TlsMode::Plain, mx)])[0];
    let send = format!(
        "import smtplib\nwith smtplib.SMTP('127.0.0.1', {}) as c:\n\
         \x20   c.sendmail('dev@lists.example', ['bob@example.org'], 'Subject: [list] release\\r\\n\\r\\nx\\r\\n')\n\
         \x20   c.sendmail('amy@example.net', ['bob@example.org'], 'Subject: lunch\\r\\n\\r\\ny\\r\\n')\n",
        smtp.port()
    );
    let (ok, out) = run_client(tokio::process::Command::new("python3").args(["-c", &send])).await;
    assert!(ok, "smtplib: {out}");
    let id = bob(&s).await;
    let count = |name: &'static str| {
        let store = s.app.store.clone();
        async move {
            let Some(m) = store.mailbox_get(id, name).await.expect("mailbox") else { return 0 };
            store.mailbox_status(m.id).await.expect("status").messages
        }
    };
    assert_eq!(
        (count("Lists").await, count("INBOX").await),
        (1, 1),
        "the list message filed, the other kept"
    );
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| p.exists())
}
