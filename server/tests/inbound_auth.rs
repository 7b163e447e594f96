//! Sender authentication on the MX (`inbound::check`) against a real DNS server
//! on loopback holding SPF, DKIM and DMARC records: each policy outcome, and a
//! resolver that does not answer deferring instead of passing.

use std::net::IpAddr;
use std::time::Duration;

use mailcluster_api::config::{DkimConfig, DkimKey, DnsConfig, InboundAuthConfig};
use mailcluster_server::dkim::{Signer, generate, write_key_file};
use mailcluster_server::dns::Dns;
use mailcluster_server::inbound::{Envelope, Verdict, check};
use mailcluster_testkit::dns::TestDns;

struct World {
    dns: TestDns,
    resolver: Dns,
    signer: Signer,
    _dir: tempfile::TempDir,
}

async fn world(dmarc_policy: &str) -> World {
    world_with(dmarc_policy, "ed25519").await
}

async fn world_with(dmarc_policy: &str, algorithm: &str) -> World {
    let dir = tempfile::tempdir().unwrap();
    let key = generate(algorithm).unwrap();
    let path = dir.path().join("k.pem");
    write_key_file(&path, &key.private_pem).unwrap();
    let signer = Signer::load(&DkimConfig {
        keys: vec![DkimKey {
            domain: "org-a.test".into(),
            selector: "s1".into(),
            key_file: path,
            algorithm: algorithm.into(),
        }],
    })
    .unwrap();
    // Negative answers last a minute (SOA minimum 60), here and at the root.
    let zone = format!(
        "@ 60 IN SOA ns.test. hostmaster.test. 1 60 60 600 60\n\
         @ 60 IN MX 10 mx.org-a.test.\n\
         mx 60 IN A 127.0.0.1\n\
         @ 60 IN TXT \"v=spf1 ip4:127.0.0.1 -all\"\n\
         s1._domainkey 60 IN TXT {}\n\
         _dmarc 60 IN TXT \"v=DMARC1; p={dmarc_policy}\"\n",
        key.zone_value()
    );
    let dns = TestDns::start(&[
        ("org-a.test.", &zone),
        ("relay.test.", "@ 60 IN SOA ns.test. hostmaster.test. 1 60 60 600 60\nmx 60 IN A 127.0.0.1\n"),
        (".", "@ 60 IN SOA ns.test. hostmaster.test. 1 60 60 600 60\n"),
    ])
    .await;
    let resolver =
        Dns::from_config(&DnsConfig { nameservers: vec![dns.addr()], ..Default::default() }).unwrap();
    World { dns, resolver, signer, _dir: dir }
}

const MESSAGE: &[u8] = b"From: Alice <alice@org-a.test>\r\nTo: bob@org-b.test\r\nSubject: hi\r\n\
Date: Tue, 1 Dec 2026 10:00:00 +0000\r\nMessage-ID: <1@org-a.test>\r\n\r\nhello\r\n";

async fn verdict(w: &World, ip: &str, mail_from: &str, message: &[u8]) -> Verdict {
    let env = Envelope { remote_ip: ip.parse::<IpAddr>().unwrap(), helo: "mx.org-a.test", mail_from };
    check(&w.resolver, &InboundAuthConfig::default(), "mx.org-b.test", &env, message).await
}

fn signed(w: &World) -> Vec<u8> {
    let mut m = w.signer.sign("org-a.test", MESSAGE).expect("signed").into_bytes();
    m.extend_from_slice(MESSAGE);
    m
}

#[tokio::test]
async fn aligned_spf_and_dkim_pass() {
    let w = world("reject").await;
    let v = verdict(&w, "127.0.0.1", "alice@org-a.test", &signed(&w)).await;
    let Verdict::Accept { header, junk: false, .. } = v else { panic!("{v:?}") };
    assert!(header.starts_with("Authentication-Results: mx.org-b.test;"), "{header}");
    for want in
        ["dkim=pass", "spf=pass", "dmarc=pass", "header.d=org-a.test", "smtp.mailfrom=alice@org-a.test"]
    {
        assert!(header.contains(want), "{want} missing: {header}");
    }
}

#[tokio::test]
async fn rsa_key_longer_than_one_txt_string_verifies() {
    let w = world_with("reject", "rsa").await;
    let v = verdict(&w, "127.0.0.9", "alice@org-a.test", &signed(&w)).await;
    let Verdict::Accept { header, junk: false, .. } = v else { panic!("{v:?}") };
    assert!(header.contains("dkim=pass") && header.contains("dmarc=pass"), "{header}");
}

#[tokio::test]
async fn dkim_alone_passes_dmarc_from_outside_spf() {
    let w = world("reject").await;
    let v = verdict(&w, "127.0.0.9", "alice@org-a.test", &signed(&w)).await;
    let Verdict::Accept { header, junk: false, .. } = v else { panic!("{v:?}") };
    assert!(
        header.contains("spf=fail") && header.contains("dkim=pass") && header.contains("dmarc=pass"),
        "{header}"
    );
}

#[tokio::test]
async fn forgery_is_rejected_under_p_reject_and_junked_under_quarantine() {
    let w = world("reject").await;
    let v = verdict(&w, "127.0.0.9", "alice@org-a.test", MESSAGE).await;
    assert!(matches!(&v, Verdict::Reject(t) if t.contains("org-a.test")), "{v:?}");
    // A tampered signed message fails DKIM too.
    let tampered = String::from_utf8(signed(&w)).unwrap().replace("hello", "pay me");
    let v = verdict(&w, "127.0.0.9", "alice@org-a.test", tampered.as_bytes()).await;
    assert!(matches!(v, Verdict::Reject(_)), "{v:?}");

    let w = world("quarantine").await;
    let v = verdict(&w, "127.0.0.9", "alice@org-a.test", MESSAGE).await;
    let Verdict::Accept { header, junk: true, .. } = v else { panic!("{v:?}") };
    assert!(header.contains("dmarc=fail"), "{header}");

    let w = world("none").await;
    let v = verdict(&w, "127.0.0.9", "alice@org-a.test", MESSAGE).await;
    assert!(matches!(v, Verdict::Accept { junk: false, .. }), "{v:?}");
}

#[tokio::test]
async fn unknown_domain_has_no_policy_and_passes_as_none() {
    let w = world("reject").await;
    let msg = b"From: x@nowhere.test\r\nSubject: s\r\n\r\nb\r\n";
    let v = verdict(&w, "127.0.0.9", "x@nowhere.test", msg).await;
    let Verdict::Accept { header, junk: false, .. } = v else { panic!("{v:?}") };
    assert!(header.contains("spf=none") && header.contains("dmarc=none"), "{header}");
}

/// The second message from a domain is checked from the caches: the SPF and DKIM
/// records it has, and the DMARC record it does not have (a negative answer, kept
/// for the zone's SOA minimum), are not asked for again.
#[tokio::test]
async fn answers_and_missing_records_are_cached() {
    let w = world("reject").await;
    // relay.test publishes no SPF and no DMARC record; its messages carry a DKIM
    // signature of org-a.test (a mailing-list shape).
    let msg = String::from_utf8(signed(&w)).unwrap().replace(
        "From: Alice <alice@org-a.test>\r\n",
        "From: Alice <alice@org-a.test>\r\nSender: list@relay.test\r\n",
    );
    let first = verdict(&w, "127.0.0.9", "list@relay.test", msg.as_bytes()).await;
    let asked = w.dns.queries();
    assert!(asked > 0);
    let second = verdict(&w, "127.0.0.9", "list@relay.test", msg.as_bytes()).await;
    assert_eq!(format!("{first:?}"), format!("{second:?}"));
    assert_eq!(w.dns.queries(), asked, "the second check asked DNS again ({second:?})");

    // A name that does not exist at all (NXDOMAIN) is kept too.
    let nowhere = b"From: x@nowhere.test\r\nSubject: s\r\n\r\nb\r\n";
    verdict(&w, "127.0.0.9", "x@nowhere.test", nowhere).await;
    let asked = w.dns.queries();
    verdict(&w, "127.0.0.9", "x@nowhere.test", nowhere).await;
    assert_eq!(w.dns.queries(), asked);
}

async fn shared_cache() -> std::sync::Arc<dyn mailcluster_server::cache::Cache> {
    let url = mailcluster_testkit::redis_url();
    mailcluster_server::cache::open(Some(&url), &mailcluster_testkit::unique("dns"), Duration::from_secs(2))
        .await
        .unwrap_or_else(|e| panic!("Redis at REDIS_URL ({url}): {e}"))
}

fn pod(dns: &TestDns, shared: &std::sync::Arc<dyn mailcluster_server::cache::Cache>) -> Dns {
    Dns::from_config(&DnsConfig { nameservers: vec![dns.addr()], ..Default::default() })
        .unwrap()
        .with_shared(shared.clone())
}

/// Pods share what they learn through Redis: a second pod checks the same message,
/// and routes mail to the same domain, without asking DNS.
#[tokio::test]
async fn pods_share_answers_through_redis() {
    let w = world("reject").await;
    let shared = shared_cache().await;
    let (a, b) = (pod(&w.dns, &shared), pod(&w.dns, &shared));
    let env = Envelope {
        remote_ip: "127.0.0.1".parse().unwrap(),
        helo: "mx.org-a.test",
        mail_from: "alice@org-a.test",
    };
    let config = InboundAuthConfig::default();
    let msg = signed(&w);
    let at_a = check(&a, &config, "mx.org-b.test", &env, &msg).await;
    let Verdict::Accept { header, .. } = &at_a else { panic!("{at_a:?}") };
    assert!(
        header.contains("spf=pass") && header.contains("dkim=pass") && header.contains("dmarc=pass"),
        "{header}"
    );
    let asked = w.dns.queries();
    let at_b = check(&b, &config, "mx.org-b.test", &env, &msg).await;
    assert_eq!(format!("{at_a:?}"), format!("{at_b:?}"));
    assert_eq!(w.dns.queries(), asked, "the second pod asked DNS: {:?}", &w.dns.questions()[asked..]);

    // A forgery from outside the SPF record, to a third pod: the same DMARC reject.
    let forged = check(
        &pod(&w.dns, &shared),
        &config,
        "mx.org-b.test",
        &Envelope { remote_ip: "127.0.0.9".parse().unwrap(), ..env },
        MESSAGE,
    )
    .await;
    assert!(matches!(forged, Verdict::Reject(_)), "{forged:?}");
    assert_eq!(w.dns.queries(), asked);

    // The relay's MX and address lookups.
    let route = a.route("org-a.test", 10).await.unwrap();
    assert_eq!(a.addresses("mx.org-a.test").await.unwrap(), vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
    let asked = w.dns.queries();
    assert_eq!(b.route("org-a.test", 10).await.unwrap(), route);
    assert_eq!(b.addresses("mx.org-a.test").await.unwrap(), vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
    assert_eq!(w.dns.queries(), asked, "the second pod asked DNS for the route");
}

/// A shared answer lives no longer than its TTL; so does a shared "no such record".
#[tokio::test]
async fn shared_answers_end_with_their_ttl() {
    let zone = "@ 2 IN SOA ns.test. hostmaster.test. 1 60 60 600 2\n@ 2 IN TXT \"v=spf1 -all\"\n";
    let dns = TestDns::start(&[
        ("short.test.", zone),
        (".", "@ 2 IN SOA ns.test. hostmaster.test. 1 60 60 600 2\n"),
    ])
    .await;
    let shared = shared_cache().await;
    let env =
        Envelope { remote_ip: "127.0.0.9".parse().unwrap(), helo: "h.short.test", mail_from: "x@short.test" };
    let msg = b"From: x@short.test\r\nSubject: s\r\n\r\nb\r\n";
    let config = InboundAuthConfig::default();
    let first = check(&pod(&dns, &shared), &config, "mx.test", &env, msg).await;
    let Verdict::Accept { header, .. } = &first else { panic!("{first:?}") };
    assert!(header.contains("spf=fail") && header.contains("dmarc=none"), "{header}");
    let asked = dns.queries();
    check(&pod(&dns, &shared), &config, "mx.test", &env, msg).await;
    assert_eq!(
        dns.queries(),
        asked,
        "within the TTL the answers come from Redis: {:?}",
        &dns.questions()[asked..]
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let later = check(&pod(&dns, &shared), &config, "mx.test", &env, msg).await;
    assert_eq!(format!("{first:?}"), format!("{later:?}"));
    assert!(dns.queries() >= asked + 2, "after the TTL DNS is asked again (SPF and DMARC)");
}

#[tokio::test]
async fn resolver_that_never_answers_defers() {
    // A UDP socket that reads queries and never answers.
    let silent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let resolver = Dns::from_config(&DnsConfig {
        nameservers: vec![addr],
        timeout_ms: 200,
        attempts: 1,
        ..Default::default()
    })
    .unwrap();
    let env = Envelope {
        remote_ip: "127.0.0.9".parse().unwrap(),
        helo: "mx.org-a.test",
        mail_from: "a@org-a.test",
    };
    let config = InboundAuthConfig { dns_budget_ms: 1500, ..Default::default() };
    let started = std::time::Instant::now();
    let v = check(&resolver, &config, "mx.org-b.test", &env, MESSAGE).await;
    assert!(matches!(v, Verdict::Defer(..)), "{v:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "bounded by the budget: {:?}", started.elapsed());
    drop(silent);
}
