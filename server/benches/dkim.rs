//! `cargo bench -p mailcluster-server --bench dkim`: what DKIM costs per message —
//! signing (ed25519-sha256 and rsa-sha256, 2048 bits) as submission does it, and
//! verification as the MX does it, the key answered by a loopback DNS server and
//! then from the resolver cache (so the figure is parsing, hashing and the
//! signature check, not the network). A 4 KB message; microseconds per message.

use std::time::Instant;

use mail_builder::MessageBuilder;
use mailcluster_api::config::{DkimConfig, DkimKey, DnsConfig};
use mailcluster_server::dkim::{Signer, generate, write_key_file};
use mailcluster_server::dns::Dns;
use mailcluster_testkit::dns::TestDns;

fn per_message(n: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let message = MessageBuilder::new()
        .from(("Alice", "alice@example.com"))
        .to("bob@example.org")
        .subject("A 4 KB message")
        .message_id("bench@example.com")
        .text_body("lorem ipsum dolor sit amet ".repeat(150))
        .write_to_vec()
        .expect("build");
    let dir = tempfile::tempdir().expect("tempdir");
    for (algorithm, n) in [("ed25519", 5000u32), ("rsa", 500)] {
        let key = generate(algorithm).expect("key");
        let path = dir.path().join(format!("{algorithm}.pem"));
        write_key_file(&path, &key.private_pem).expect("write key");
        let signer = Signer::load(&DkimConfig {
            keys: vec![DkimKey {
                domain: "example.com".into(),
                selector: "s1".into(),
                key_file: path,
                algorithm: algorithm.into(),
            }],
        })
        .expect("load");
        let sign = per_message(n, || {
            std::hint::black_box(signer.sign("example.com", std::hint::black_box(&message)));
        });
        let mut signed = signer.sign("example.com", &message).expect("signed").into_bytes();
        signed.extend_from_slice(&message);

        let zone = format!("s1._domainkey 60 IN TXT {}\n", key.zone_value());
        let verify = rt.block_on(async {
            let dns = TestDns::start(&[("example.com.", &zone)]).await;
            let resolver =
                Dns::from_config(&DnsConfig { nameservers: vec![dns.addr()], ..Default::default() })
                    .expect("resolver");
            let auth = &resolver.authenticator;
            let check = async || {
                let parsed = mail_auth::AuthenticatedMessage::parse(&signed).expect("parses");
                let out = auth.verify_dkim(resolver.params(&parsed)).await;
                assert!(out.iter().all(|o| *o.result() == mail_auth::DkimResult::Pass));
            };
            check().await;
            for _ in 0..n / 10 {
                check().await;
            }
            let start = Instant::now();
            for _ in 0..n {
                check().await;
            }
            start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        });
        println!(
            "{algorithm:<8} {} bytes  sign {sign:>8.1} µs/message  verify {verify:>8.1} µs/message",
            message.len()
        );
    }
}
