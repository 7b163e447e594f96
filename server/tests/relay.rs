//! Relay workers against remote SMTP servers that misbehave on purpose, with a
//! real DNS server on loopback: a remote that defers and later accepts, one that
//! rejects (a DSN with the original headers reaches the local sender), expiry, a
//! delay notice, null MX, 100 MX records, an MX that points back at us, a greeting
//! that never ends and a server that never answers. Every case ends in bounded
//! time with a clear status on the queue entry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::Utc;
use mailcluster_model::{DsnNotify, DsnRequest, DsnRet, NewQueueItem, RecipientDsn, RecipientStatus};
use mailcluster_server::app::{App, MailExchange};
use mailcluster_server::auth::Authenticator;
use mailcluster_server::cache::Cache;
use mailcluster_server::config::Config;
use mailcluster_server::delivery::Deliverer;
use mailcluster_server::dns::Dns;
use mailcluster_server::metrics::Metrics;
use mailcluster_server::net::ShutdownController;
use mailcluster_server::relay::Relay;
use mailcluster_server::store::Store;
use mailcluster_testkit::dns::TestDns;
use mailcluster_testkit::smtp::{Greeting, ScriptedRemote};

struct Setup {
    app: App,
    remote: ScriptedRemote,
    _dns: TestDns,
    _dir: tempfile::TempDir,
    shutdown: ShutdownController,
    relay: tokio::task::JoinHandle<()>,
}

impl Setup {
    async fn start(zone_extra: &str, tweak: impl FnOnce(&mut Config)) -> Setup {
        Self::start_with_tls(zone_extra, None, tweak).await
    }

    async fn start_with_tls(
        zone_extra: &str,
        remote_tls: Option<Arc<rustls::ServerConfig>>,
        tweak: impl FnOnce(&mut Config),
    ) -> Setup {
        let remote = ScriptedRemote::start_with_tls("250 2.1.5 ok", remote_tls).await;
        let zone = format!("@ 60 IN MX 10 mx.remote.test.\nmx 60 IN A 127.0.0.1\n{zone_extra}");
        let dns = TestDns::start(&[("remote.test.", &zone)]).await;
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config { hostname: "mx.local.test".into(), ..Default::default() };
        config.dns.nameservers = vec![dns.addr()];
        config.relay.remote_port = remote.addr.port();
        config.relay.poll_interval_ms = 100;
        config.relay.retry_schedule_secs = vec![1];
        config.relay.command_timeout_secs = 2;
        config.relay.connect_timeout_secs = 2;
        config.relay.delay_notice_secs = 0;
        // the remote test servers listen on loopback
        config.relay.allowed_private_networks = vec!["127.0.0.0/8".parse().unwrap()];
        tweak(&mut config);
        let store =
            mailcluster_server::store::open(None, dir.path(), 4, Duration::from_secs(5)).await.unwrap();
        store.migrate().await.unwrap();
        store.domain_add("local.test").await.unwrap();
        let cache: Arc<dyn Cache> =
            mailcluster_server::cache::open(None, "t", Duration::from_secs(1)).await.unwrap();
        let auth = Arc::new(Authenticator::new(store.clone(), cache.clone(), Default::default()));
        let deliverer = Arc::new(Deliverer::new(store.clone()));
        let resolver = Arc::new(Dns::from_config(&config.dns).unwrap());
        let wake = Arc::new(tokio::sync::Notify::new());
        let app = App::new(Arc::new(config), store, cache, Arc::new(Metrics::new()), auth, deliverer)
            .with_mail(MailExchange {
                dns: Some(resolver.clone()),
                signer: Arc::new(Default::default()),
                relay_wake: wake.clone(),
            });
        let shutdown = ShutdownController::new(Duration::from_secs(2));
        let relay = Relay::new(app.clone(), resolver, wake).unwrap();
        let relay = tokio::spawn(relay.run(shutdown.clone()));
        Setup { app, remote, _dns: dns, _dir: dir, shutdown, relay }
    }

    fn store(&self) -> &Arc<dyn Store> {
        &self.app.store
    }

    async fn enqueue(&self, sender: &str, rcpts: &[&str], expires_in: chrono::Duration) -> i64 {
        self.enqueue_dsn(sender, rcpts, expires_in, DsnRequest::default()).await
    }

    async fn enqueue_dsn(
        &self,
        sender: &str,
        rcpts: &[&str],
        expires_in: chrono::Duration,
        dsn: DsnRequest,
    ) -> i64 {
        let now = Utc::now();
        let id = self
            .store()
            .queue_enqueue(&NewQueueItem {
                sender: sender.into(),
                recipients: rcpts.iter().map(|r| r.to_string()).collect(),
                raw: Bytes::from_static(
                    b"From: alice@local.test\r\nTo: x@remote.test\r\nSubject: relay test\r\n\r\n.leading dot\r\nbody\r\n",
                ),
                account_id: None,
                not_before: now,
                expires_at: now + expires_in,
                dsn,
            })
            .await
            .unwrap();
        self.app.mail.relay_wake.notify_one();
        id
    }

    /// Waits until `probe` holds, at most `limit`.
    async fn until(&self, what: &str, limit: Duration, mut probe: impl AsyncFnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !probe().await {
            if Instant::now() > deadline {
                let q = self.store().queue_list(10).await.unwrap();
                panic!("timed out waiting for {what}; queue: {q:#?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the first failed attempt at `id`; its queue entry then.
    async fn deferred(&self, id: i64, limit: Duration) -> mailcluster_model::QueueEntry {
        self.until("a deferral", limit, async || {
            self.store().queue_get(id).await.unwrap().is_some_and(|(e, _)| e.last_error.is_some())
        })
        .await;
        self.store().queue_get(id).await.unwrap().unwrap().0
    }

    /// The messages in `email`'s INBOX.
    async fn inbox(&self, email: &str) -> Vec<String> {
        let store = self.store();
        let account = store.account_get(email).await.unwrap().unwrap();
        let inbox = store.mailbox_get(account.id, "INBOX").await.unwrap().unwrap();
        let mut out = Vec::new();
        for e in store.maildrop(inbox.id, 0).await.unwrap() {
            out.push(String::from_utf8_lossy(&store.message_body(e.message_id).await.unwrap()).into_owned());
        }
        out
    }

    async fn stop(self) {
        self.shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(10), self.relay).await.expect("relay stops").unwrap();
    }
}

async fn queue_empty(s: &Setup) -> bool {
    s.store().queue_stats().await.unwrap().depth == 0
}

#[tokio::test]
async fn delivers_with_dot_stuffing_and_removes_the_item() {
    let s = Setup::start("", |_| {}).await;
    s.enqueue("alice@local.test", &["x@remote.test", "y@Remote.Test"], chrono::Duration::days(1)).await;
    s.until("delivery", Duration::from_secs(10), async || queue_empty(&s).await).await;
    let got = s.remote.received();
    assert_eq!(got.len(), 1, "one transaction for one domain: {got:?}");
    assert_eq!(got[0].from, "alice@local.test");
    assert_eq!(got[0].rcpts, vec!["x@remote.test", "y@Remote.Test"]);
    assert!(got[0].data.contains("\r\n..leading dot\r\n"), "dot-stuffed on the wire: {:?}", got[0].data);
    s.stop().await;
}

#[tokio::test]
async fn deferred_then_accepted_is_delivered_once_after_retry() {
    let s = Setup::start("", |_| {}).await;
    s.remote.set_rcpt_reply("451 4.3.0 try again later");
    let id = s.enqueue("alice@local.test", &["x@remote.test"], chrono::Duration::days(1)).await;
    s.until("a deferral", Duration::from_secs(10), async || {
        s.store().queue_get(id).await.unwrap().is_some_and(|(e, _)| e.attempts >= 1 && e.last_error.is_some())
    })
    .await;
    let (entry, _) = s.store().queue_get(id).await.unwrap().unwrap();
    assert!(entry.last_error.as_deref().unwrap().contains("451 4.3.0"), "{entry:?}");
    assert_eq!(entry.outcomes[0].status, RecipientStatus::Deferred);
    s.remote.set_rcpt_reply("250 2.1.5 ok");
    s.until("delivery after retry", Duration::from_secs(10), async || queue_empty(&s).await).await;
    assert_eq!(s.remote.received().len(), 1, "delivered exactly once");
    s.stop().await;
}

#[tokio::test]
async fn rejection_bounces_to_local_sender_with_original_headers_and_null_sender_never_bounces() {
    let s = Setup::start("", |_| {}).await;
    s.store().account_create("alice@local.test", "x").await.unwrap();
    s.remote.set_rcpt_reply("550 5.1.1 no such user here");
    s.enqueue("alice@local.test", &["nobody@remote.test"], chrono::Duration::days(1)).await;
    s.until("the DSN", Duration::from_secs(10), async || !s.inbox("alice@local.test").await.is_empty()).await;
    let dsn = &s.inbox("alice@local.test").await[0];
    assert!(dsn.starts_with("Return-Path: <>\r\n"), "{dsn}");
    assert!(dsn.contains("Final-Recipient: rfc822; nobody@remote.test"), "{dsn}");
    assert!(dsn.contains("Status: 5.1.1") && dsn.contains("Remote-MTA: dns; mx.remote.test"), "{dsn}");
    assert!(dsn.contains("Diagnostic-Code: smtp; 550 5.1.1 no such user here"), "{dsn}");
    assert!(dsn.contains("Subject: relay test"), "original headers: {dsn}");
    assert!(queue_empty(&s).await);

    // The null sender's failure ends there: no DSN, nothing queued.
    s.enqueue("", &["nobody@remote.test"], chrono::Duration::days(1)).await;
    s.until("the attempt", Duration::from_secs(10), async || queue_empty(&s).await).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(queue_empty(&s).await, "no bounce of a bounce");
    assert_eq!(s.inbox("alice@local.test").await.len(), 1);
    s.stop().await;
}

fn notify(success: bool, failure: bool, delay: bool) -> Option<DsnNotify> {
    Some(DsnNotify { success, failure, delay })
}

/// RFC 3461 §5.2.1: to a server offering DSN the request goes along (RET,
/// ENVID in xtext; each recipient's NOTIFY and ORCPT), and reporting success is
/// then that server's job: no report from here.
#[tokio::test]
async fn dsn_request_goes_to_a_remote_offering_dsn_which_then_reports_success() {
    let s = Setup::start("", |_| {}).await;
    s.remote.set_dsn(true);
    s.store().account_create("alice@local.test", "x").await.unwrap();
    let dsn = DsnRequest {
        ret: Some(DsnRet::Full),
        envid: Some("QQ 3+1".into()),
        recipients: vec![
            RecipientDsn {
                recipient: "x@remote.test".into(),
                notify: notify(true, true, false),
                orcpt: Some("X=Y@Remote.test".into()),
                ..Default::default()
            },
            // RFC 6533's type travels as it came.
            RecipientDsn {
                recipient: "y@remote.test".into(),
                orcpt: Some("j\\x{F6}rg@Remote.test".into()),
                orcpt_type: Some("utf-8".into()),
                ..Default::default()
            },
        ],
    };
    s.enqueue_dsn("alice@local.test", &["x@remote.test", "y@remote.test"], chrono::Duration::days(1), dsn)
        .await;
    s.until("delivery", Duration::from_secs(10), async || queue_empty(&s).await).await;
    let got = s.remote.received();
    assert_eq!(got[0].mail_line, "MAIL FROM:<alice@local.test> SIZE=86 RET=FULL ENVID=QQ+203+2B1");
    assert_eq!(
        got[0].rcpt_lines,
        [
            "RCPT TO:<x@remote.test> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;X+3DY@Remote.test",
            "RCPT TO:<y@remote.test> ORCPT=utf-8;j\\x{F6}rg@Remote.test"
        ]
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(s.inbox("alice@local.test").await.is_empty(), "the remote reports success, not we");
    s.stop().await;
}

/// RFC 3461 §5.2.2: a server without DSN cannot report; a recipient whose
/// sender asked for success is told "relayed", with its ENVID and ORCPT. One
/// who did not ask is not.
#[tokio::test]
async fn remote_without_dsn_gets_a_relayed_report_for_recipients_that_asked() {
    let s = Setup::start("", |_| {}).await;
    s.store().account_create("alice@local.test", "x").await.unwrap();
    let dsn = DsnRequest {
        ret: None,
        envid: Some("env-7".into()),
        recipients: vec![RecipientDsn {
            recipient: "x@remote.test".into(),
            notify: notify(true, false, false),
            orcpt: Some("X@Remote.test".into()),
            ..Default::default()
        }],
    };
    s.enqueue_dsn("alice@local.test", &["x@remote.test", "y@remote.test"], chrono::Duration::days(1), dsn)
        .await;
    s.until("the report", Duration::from_secs(10), async || !s.inbox("alice@local.test").await.is_empty())
        .await;
    let got = s.remote.received();
    assert_eq!(
        got[0].mail_line, "MAIL FROM:<alice@local.test> SIZE=86",
        "no DSN parameters to a non-DSN server"
    );
    assert_eq!(got[0].rcpt_lines, ["RCPT TO:<x@remote.test>", "RCPT TO:<y@remote.test>"]);
    let reports = s.inbox("alice@local.test").await;
    assert_eq!(reports.len(), 1, "{reports:?}");
    let r = &reports[0];
    assert!(r.contains("Subject: Successful Mail Delivery Report"), "{r}");
    assert!(r.contains("Original-Envelope-Id: env-7\r\n"), "{r}");
    assert!(
        r.contains("Original-Recipient: rfc822; X@Remote.test\r\nFinal-Recipient: rfc822; x@remote.test\r\nAction: relayed\r\nStatus: 2.0.0\r\nRemote-MTA: dns; mx.remote.test"),
        "{r}"
    );
    assert!(!r.contains("y@remote.test"), "y did not ask: {r}");
    assert!(!r.contains(".leading dot"), "a success report has the header only: {r}");
    s.stop().await;
}

/// NOTIFY=NEVER silences a failure; NOTIFY=FAILURE with RET=FULL gets the
/// whole message back (RFC 3461 §4.1, §4.3).
#[tokio::test]
async fn notify_never_silences_and_ret_full_returns_the_message() {
    let s = Setup::start("", |_| {}).await;
    s.store().account_create("alice@local.test", "x").await.unwrap();
    s.remote.set_rcpt_reply("550 5.1.1 no such user here");
    let dsn = DsnRequest {
        ret: Some(DsnRet::Full),
        envid: None,
        recipients: vec![
            RecipientDsn {
                recipient: "quiet@remote.test".into(),
                notify: notify(false, false, false),
                orcpt: None,
                ..Default::default()
            },
            RecipientDsn {
                recipient: "loud@remote.test".into(),
                notify: notify(false, true, false),
                orcpt: None,
                ..Default::default()
            },
        ],
    };
    s.enqueue_dsn(
        "alice@local.test",
        &["quiet@remote.test", "loud@remote.test"],
        chrono::Duration::days(1),
        dsn,
    )
    .await;
    s.until("the bounce", Duration::from_secs(10), async || !s.inbox("alice@local.test").await.is_empty())
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reports = s.inbox("alice@local.test").await;
    assert_eq!(reports.len(), 1, "{reports:?}");
    let r = &reports[0];
    assert!(r.contains("Final-Recipient: rfc822; loud@remote.test"), "{r}");
    assert!(!r.contains("quiet@remote.test"), "NOTIFY=NEVER: {r}");
    assert!(r.contains("Content-Type: message/rfc822\r\n\r\nFrom: alice@local.test"), "{r}");
    assert!(r.contains(".leading dot\r\nbody\r\n"), "the whole message: {r}");
    // A silenced failure is still a failure on the queue's record.
    assert!(queue_empty(&s).await);

    // Without NOTIFY a failure is reported, with the header section only.
    s.enqueue("alice@local.test", &["quiet@remote.test"], chrono::Duration::days(1)).await;
    s.until("the second bounce", Duration::from_secs(10), async || {
        s.inbox("alice@local.test").await.len() == 2
    })
    .await;
    let r = &s.inbox("alice@local.test").await[1];
    assert!(r.contains("Content-Type: text/rfc822-headers") && !r.contains(".leading dot"), "{r}");
    s.stop().await;
}

#[tokio::test]
async fn remote_sender_gets_its_dsn_sent_with_the_null_sender() {
    let s = Setup::start("", |_| {}).await;
    s.remote.set_unknown_user("nobody");
    s.enqueue("someone@remote.test", &["nobody@remote.test"], chrono::Duration::days(1)).await;
    s.until("the DSN at the sender's server", Duration::from_secs(10), async || {
        s.remote.received().iter().any(|m| m.rcpts == vec!["someone@remote.test".to_string()])
    })
    .await;
    let got = s.remote.received();
    let dsn = got.iter().find(|m| m.rcpts == vec!["someone@remote.test".to_string()]).unwrap();
    assert_eq!(dsn.from, "", "sent with the null sender");
    assert!(dsn.data.contains("Final-Recipient: rfc822; nobody@remote.test"), "{}", dsn.data);
    s.until("an empty queue", Duration::from_secs(10), async || queue_empty(&s).await).await;
    s.stop().await;
}

#[tokio::test]
async fn expiry_and_delay_notice_reach_the_sender() {
    let s = Setup::start("", |c| c.relay.delay_notice_secs = 1).await;
    s.store().account_create("alice@local.test", "x").await.unwrap();
    s.remote.set_rcpt_reply("452 4.2.2 mailbox full");
    s.enqueue("alice@local.test", &["x@remote.test"], chrono::Duration::seconds(4)).await;
    // NOTIFY=FAILURE alone (RFC 3461 §4.1): no delay notice for y.
    let failure_only = DsnRequest {
        recipients: vec![RecipientDsn {
            recipient: "y@remote.test".into(),
            notify: notify(false, true, false),
            orcpt: None,
            ..Default::default()
        }],
        ..Default::default()
    };
    s.enqueue_dsn("alice@local.test", &["y@remote.test"], chrono::Duration::seconds(4), failure_only).await;
    s.until("expiry", Duration::from_secs(20), async || queue_empty(&s).await).await;
    let inbox = s.inbox("alice@local.test").await;
    let delayed: Vec<_> = inbox.iter().filter(|m| m.contains("Action: delayed")).collect();
    let failed: Vec<_> = inbox.iter().filter(|m| m.contains("Action: failed")).collect();
    assert_eq!(delayed.len(), 1, "one delay notice: {inbox:#?}");
    assert!(delayed[0].contains("x@remote.test") && !delayed[0].contains("y@remote.test"), "{}", delayed[0]);
    assert_eq!(failed.len(), 2, "a failure notice for each: {inbox:#?}");
    assert!(
        failed[0].contains("Status: 4.4.7") && failed[0].contains("452 4.2.2 mailbox full"),
        "{}",
        failed[0]
    );
    assert!(s.remote.received().is_empty());
    s.stop().await;
}

/// A relay is not a port scanner: MX hosts, and a domain's own address when
/// it has no MX, on loopback, private (RFC 1918, ULA), link-local or other
/// non-global addresses are not connected to unless
/// `relay.allowed_private_networks` lists them; the message waits (and would
/// bounce at expiry) with a diagnostic saying why.
#[tokio::test]
async fn mx_targets_on_non_global_addresses_are_refused() {
    let zone = "private 60 IN MX 10 ten.remote.test.\nten 60 IN A 10.1.2.3\n\
                ula 60 IN MX 10 fd.remote.test.\nfd 60 IN AAAA fd00::25\n\
                linklocal 60 IN MX 10 ll.remote.test.\nll 60 IN AAAA fe80::1\n\
                bare 60 IN A 127.0.0.1\n";
    let s = Setup::start(zone, |c| c.relay.allowed_private_networks = Vec::new()).await;
    for (rcpt, address) in [
        ("x@remote.test", "127.0.0.1"),
        ("x@private.remote.test", "10.1.2.3"),
        ("x@ula.remote.test", "fd00::25"),
        ("x@linklocal.remote.test", "fe80::1"),
        ("x@bare.remote.test", "127.0.0.1"),
    ] {
        let id = s.enqueue("sender@local.test", &[rcpt], chrono::Duration::days(1)).await;
        let error = s.deferred(id, Duration::from_secs(20)).await.last_error.unwrap_or_default();
        assert!(
            error.contains("non-global addresses")
                && error.contains(address)
                && error.contains("allowed_private_networks"),
            "{rcpt}: {error}"
        );
    }
    assert_eq!(s.remote.connections(), 0, "no connection to any of them");
    s.stop().await;
}

#[tokio::test]
async fn null_mx_and_missing_domain_fail_at_once_and_mx_to_ourselves_is_a_loop() {
    let s = Setup::start("nullmx 60 IN MX 0 .\nloop 60 IN MX 10 mx.local.test.\n", |_| {}).await;
    s.store().account_create("alice@local.test", "x").await.unwrap();
    s.enqueue(
        "alice@local.test",
        &["a@nullmx.remote.test", "b@nowhere.remote.test", "c@loop.remote.test"],
        chrono::Duration::days(1),
    )
    .await;
    s.until("the DSN", Duration::from_secs(10), async || !s.inbox("alice@local.test").await.is_empty()).await;
    let dsn = &s.inbox("alice@local.test").await[0];
    for want in ["Status: 5.1.10", "Status: 5.1.2", "Status: 5.4.6", "null MX", "loops back"] {
        assert!(dsn.contains(want), "{want} missing in {dsn}");
    }
    assert!(queue_empty(&s).await);
    assert_eq!(s.remote.connections(), 0, "no connection for any of them");
    s.stop().await;
}

#[tokio::test]
async fn hundred_mx_records_endless_greeting_and_silent_server_are_bounded() {
    // 100 MX hosts (an answer only TCP carries), all silent: only
    // relay.max_mx_hosts of them are tried, each for the command timeout.
    let mut hundred = String::new();
    for i in 0..100 {
        hundred.push_str(&format!("many 60 IN MX {i} h{i}.remote.test.\nh{i} 60 IN A 127.0.0.1\n"));
    }
    let s = Setup::start(&hundred, |c| c.relay.max_mx_hosts = 3).await;
    s.remote.set_greeting(Greeting::Silent);
    let started = Instant::now();
    let id = s.enqueue("alice@local.test", &["x@many.remote.test"], chrono::Duration::days(1)).await;
    let e = s.deferred(id, Duration::from_secs(20)).await;
    assert!(e.last_error.as_deref().unwrap().contains("timed out"), "{e:?}");
    assert_eq!(s.remote.connections(), 3, "three hosts tried, not a hundred");
    assert!(started.elapsed() < Duration::from_secs(12), "{:?}", started.elapsed());
    s.store().queue_delete(id).await.unwrap();

    // A greeting that never ends: "reply too long", deferred.
    s.remote.set_greeting(Greeting::Endless);
    let id = s.enqueue("alice@local.test", &["x@remote.test"], chrono::Duration::days(1)).await;
    let e = s.deferred(id, Duration::from_secs(15)).await;
    assert!(e.last_error.as_deref().unwrap().contains("too long"), "{e:?}");
    s.stop().await;
}

/// A test CA and a certificate from it for the remote's MX and MTA-STS hosts.
struct TestPki {
    ca_file: tempfile::NamedTempFile,
    server: Arc<rustls::ServerConfig>,
    /// From the same CA, for a name that is not the MX's.
    wrong_name: Arc<rustls::ServerConfig>,
}

fn test_pki() -> TestPki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "relay test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let server_for = |names: &[&str]| {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        let key_der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert.der().clone()], key_der)
                .unwrap();
        Arc::new(config)
    };
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), ca.pem()).unwrap();
    TestPki {
        ca_file,
        server: server_for(&["mx.remote.test", "mta-sts.remote.test"]),
        wrong_name: server_for(&["other.test"]),
    }
}

/// Serves `policy` at https://mta-sts.remote.test/.well-known/mta-sts.txt (on a
/// free port of 127.0.0.1); returns the port.
async fn policy_server(tls: Arc<rustls::ServerConfig>, policy: &'static str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(sock).await else { return };
                let mut buf = [0u8; 2048];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]);
                let response = if request.starts_with("GET /.well-known/mta-sts.txt ") {
                    format!("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n{policy}")
                } else {
                    "HTTP/1.0 404 Not Found\r\n\r\n".to_string()
                };
                let _ = s.write_all(response.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    port
}

/// A relay that fetches MTA-STS policies from `port` and trusts the test CA; the
/// remote MX offers STARTTLS with `remote_tls` when given.
async fn sts_setup(port: u16, pki: &TestPki, remote_tls: Option<Arc<rustls::ServerConfig>>) -> Setup {
    let ca = pki.ca_file.path().to_path_buf();
    Setup::start_with_tls(STS_ZONE, remote_tls, |c| {
        c.relay.mta_sts_port = port;
        c.relay.tls_ca_file = Some(ca);
    })
    .await
}

const STS_ZONE: &str = "_mta-sts 60 IN TXT \"v=STSv1; id=20261201\"\nmta-sts 60 IN A 127.0.0.1\n";

#[tokio::test]
async fn mta_sts_enforce_requires_verified_tls_to_a_listed_mx() {
    let pki = test_pki();
    let port = policy_server(
        pki.server.clone(),
        "version: STSv1\r\nmode: enforce\r\nmx: mx.remote.test\r\nmax_age: 86400\r\n",
    )
    .await;
    // The MX offers STARTTLS with a certificate from the CA the relay trusts.
    let s = sts_setup(port, &pki, Some(pki.server.clone())).await;
    s.enqueue("", &["x@remote.test"], chrono::Duration::days(1)).await;
    s.until("delivery", Duration::from_secs(10), async || queue_empty(&s).await).await;
    let got = s.remote.received();
    assert_eq!(got.len(), 1);
    assert!(got[0].tls, "sent over TLS");
    s.stop().await;

    // The same policy, and an MX that does not offer STARTTLS: nothing is sent.
    let s = sts_setup(port, &pki, None).await;
    let id = s.enqueue("", &["x@remote.test"], chrono::Duration::days(1)).await;
    let e = s.deferred(id, Duration::from_secs(10)).await;
    assert!(e.last_error.as_deref().unwrap().contains("TLS is required"), "{e:?}");
    assert!(s.remote.received().is_empty(), "no cleartext copy");
    s.stop().await;

    // A certificate that is not the MX host's: refused too.
    let s = sts_setup(port, &pki, Some(pki.wrong_name.clone())).await;
    let id = s.enqueue("", &["x@remote.test"], chrono::Duration::days(1)).await;
    let e = s.deferred(id, Duration::from_secs(15)).await;
    assert!(e.last_error.as_deref().unwrap().contains("TLS handshake"), "{e:?}");
    assert!(s.remote.received().is_empty());
    s.stop().await;
}

#[tokio::test]
async fn mta_sts_policy_naming_other_hosts_defers_and_testing_mode_delivers() {
    let pki = test_pki();
    let port = policy_server(
        pki.server.clone(),
        "version: STSv1\nmode: enforce\nmx: *.elsewhere.test\nmax_age: 86400\n",
    )
    .await;
    let s = sts_setup(port, &pki, None).await;
    let id = s.enqueue("", &["x@remote.test"], chrono::Duration::days(1)).await;
    let e = s.deferred(id, Duration::from_secs(10)).await;
    assert!(e.last_error.as_deref().unwrap().contains("MTA-STS"), "{e:?}");
    assert_eq!(s.remote.connections(), 0);
    s.stop().await;

    let port = policy_server(
        pki.server.clone(),
        "version: STSv1\nmode: testing\nmx: *.elsewhere.test\nmax_age: 86400\n",
    )
    .await;
    let s = sts_setup(port, &pki, None).await;
    s.enqueue("", &["x@remote.test"], chrono::Duration::days(1)).await;
    s.until("delivery in testing mode", Duration::from_secs(10), async || queue_empty(&s).await).await;
    assert_eq!(s.remote.received().len(), 1);
    s.stop().await;
}

#[tokio::test]
async fn one_connection_carries_many_messages_within_the_destination_cap() {
    let s = Setup::start("", |c| c.relay.max_connections_per_destination = 1).await;
    for _ in 0..5 {
        s.enqueue("alice@local.test", &["x@remote.test"], chrono::Duration::days(1)).await;
    }
    s.until("five deliveries", Duration::from_secs(10), async || queue_empty(&s).await).await;
    assert_eq!(s.remote.received().len(), 5);
    assert_eq!(s.remote.connections(), 1, "the cap of one connection, reused for every message");
    s.stop().await;
}

#[tokio::test]
async fn pipelined_data_accepted_without_recipients_keeps_the_connection_in_step() {
    // MAIL refused for now, and a server that still says 354 to the pipelined
    // DATA: the relay ends that empty data phase, and the same connection
    // carries the next transaction.
    let s = Setup::start("", |c| c.relay.max_connections_per_destination = 1).await;
    s.remote.set_data_without_recipients(true);
    s.remote.set_mail_reply("451 4.3.0 sender check unavailable");
    let id = s.enqueue("", &["x@remote.test"], chrono::Duration::days(1)).await;
    let e = s.deferred(id, Duration::from_secs(10)).await;
    assert!(e.last_error.as_deref().unwrap().contains("451 4.3.0"), "{e:?}");
    s.remote.set_mail_reply("250 2.1.0 ok");
    s.store().queue_retry(Some(id)).await.unwrap();
    s.app.mail.relay_wake.notify_one();
    s.until("delivery on the same connection", Duration::from_secs(10), async || queue_empty(&s).await).await;
    assert_eq!(s.remote.received().len(), 1);
    assert_eq!(s.remote.connections(), 1, "the connection stayed usable");
    s.stop().await;
}

#[tokio::test]
async fn starttls_refused_with_454_goes_on_in_the_clear_unless_tls_is_required() {
    let s = Setup::start("", |_| {}).await;
    s.remote.set_starttls_refused(true);
    s.enqueue("", &["x@remote.test"], chrono::Duration::days(1)).await;
    s.until("delivery without TLS", Duration::from_secs(10), async || queue_empty(&s).await).await;
    let got = s.remote.received();
    assert_eq!(got.len(), 1);
    assert!(!got[0].tls);
    s.stop().await;

    // The same server under an MTA-STS policy in enforce mode: nothing is sent.
    let pki = test_pki();
    let port = policy_server(
        pki.server.clone(),
        "version: STSv1\nmode: enforce\nmx: mx.remote.test\nmax_age: 600\n",
    )
    .await;
    let s = sts_setup(port, &pki, None).await;
    s.remote.set_starttls_refused(true);
    let id = s.enqueue("", &["x@remote.test"], chrono::Duration::days(1)).await;
    let e = s.deferred(id, Duration::from_secs(10)).await;
    assert!(e.last_error.as_deref().unwrap().contains("454"), "{e:?}");
    assert!(s.remote.received().is_empty());
    s.stop().await;
}

/// Postfix's own SMTP test server, `smtp-sink` (Debian's postfix package), as the
/// remote: a real MTA's SMTP engine answering 4xx or 5xx where told to, and writing
/// each accepted transaction to a file.
struct PostfixSink {
    child: std::process::Child,
    port: u16,
    dumps: tempfile::TempDir,
}

impl PostfixSink {
    /// `refuse`: `Some(("-r", "rcpt"))` answers RCPT with a 4xx, `("-f", …)` with a 5xx.
    /// `None` when smtp-sink is not installed (outside CI: the test is skipped).
    async fn start(port: Option<u16>, refuse: Option<(&str, &str)>) -> Option<PostfixSink> {
        let sink = std::path::Path::new("/usr/sbin/smtp-sink");
        if !sink.exists() {
            assert!(std::env::var_os("CI").is_none(), "smtp-sink (Debian's postfix) is not installed");
            eprintln!("skipped: smtp-sink (Debian's postfix package) is not installed");
            return None;
        }
        let port = port.unwrap_or_else(|| {
            std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
        });
        let dumps = tempfile::tempdir().unwrap();
        // smtp-sink drops its privileges to -u when started as root; that user writes the dumps.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dumps.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut cmd = std::process::Command::new(sink);
        let root = std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
        if root {
            cmd.args(["-u", "nobody"]);
        }
        if let Some((flag, commands)) = refuse {
            cmd.args([flag, commands]);
        }
        cmd.arg("-d").arg(dumps.path().join("%H%M%S."));
        cmd.args([&format!("127.0.0.1:{port}"), "16"]);
        let child = cmd.stderr(std::process::Stdio::null()).spawn().expect("start smtp-sink");
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(Instant::now() < deadline, "smtp-sink does not listen on {port}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some(PostfixSink { child, port, dumps })
    }

    /// The transactions it accepted, as written by smtp-sink (envelope as X- headers).
    fn received(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(self.dumps.path())
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
            .collect();
        out.sort();
        out
    }
}

impl Drop for PostfixSink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn postfix_deferring_then_accepting_gets_the_message_once_after_retry() {
    let Some(sink) = PostfixSink::start(None, Some(("-r", "rcpt"))).await else { return };
    let port = sink.port;
    let s = Setup::start("", |c| c.relay.remote_port = port).await;
    let id = s.enqueue("alice@local.test", &["x@remote.test"], chrono::Duration::days(1)).await;
    let entry = s.deferred(id, Duration::from_secs(10)).await;
    assert!(entry.last_error.as_deref().unwrap().contains(": 450 4."), "{entry:?}");
    assert_eq!(entry.outcomes[0].status, RecipientStatus::Deferred);
    assert!(sink.received().is_empty());

    // The same address now accepts: the retry delivers, once.
    drop(sink);
    let sink = PostfixSink::start(Some(port), None).await.unwrap();
    s.until("delivery after retry", Duration::from_secs(15), async || queue_empty(&s).await).await;
    let got = sink.received();
    assert_eq!(got.len(), 1, "delivered exactly once: {got:#?}");
    assert!(got[0].contains("X-Mail-Args: <alice@local.test>"), "{}", got[0]);
    assert!(got[0].contains("X-Rcpt-Args: <x@remote.test>"), "{}", got[0]);
    assert!(got[0].contains("Subject: relay test"), "{}", got[0]);
    // smtp-sink undoes the dot-stuffing: the line arrived intact.
    assert!(got[0].contains("\n.leading dot\r\n") || got[0].contains("\n.leading dot\n"), "{}", got[0]);
    s.stop().await;
}

#[tokio::test]
async fn postfix_rejecting_bounces_to_the_sender_with_the_original_headers() {
    let Some(sink) = PostfixSink::start(None, Some(("-f", "rcpt"))).await else { return };
    let port = sink.port;
    let s = Setup::start("", |c| c.relay.remote_port = port).await;
    s.store().account_create("alice@local.test", "x").await.unwrap();
    s.enqueue("alice@local.test", &["nobody@remote.test"], chrono::Duration::days(1)).await;
    s.until("the DSN", Duration::from_secs(10), async || !s.inbox("alice@local.test").await.is_empty()).await;
    let dsn = &s.inbox("alice@local.test").await[0];
    assert!(dsn.contains("Final-Recipient: rfc822; nobody@remote.test"), "{dsn}");
    assert!(dsn.contains("Action: failed") && dsn.contains("Status: 5."), "{dsn}");
    assert!(dsn.contains("Diagnostic-Code: smtp; 5"), "Postfix's reply in the DSN: {dsn}");
    assert!(dsn.contains("Subject: relay test"), "original headers: {dsn}");
    assert!(queue_empty(&s).await);
    assert!(sink.received().is_empty());
    s.stop().await;
}

#[tokio::test]
async fn postfix_deferring_until_expiry_bounces() {
    let Some(sink) = PostfixSink::start(None, Some(("-r", "rcpt"))).await else { return };
    let port = sink.port;
    let s = Setup::start("", |c| c.relay.remote_port = port).await;
    s.store().account_create("alice@local.test", "x").await.unwrap();
    s.enqueue("alice@local.test", &["x@remote.test"], chrono::Duration::seconds(3)).await;
    s.until("expiry", Duration::from_secs(20), async || queue_empty(&s).await).await;
    let inbox = s.inbox("alice@local.test").await;
    let failed: Vec<_> = inbox.iter().filter(|m| m.contains("Action: failed")).collect();
    assert_eq!(failed.len(), 1, "one failure notice: {inbox:#?}");
    assert!(failed[0].contains("Status: 4.4.7") && failed[0].contains("450 4.3.0"), "{}", failed[0]);
    assert!(sink.received().is_empty());
    s.stop().await;
}
