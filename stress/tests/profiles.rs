//! The shipped profiles: each parses and resolves into the figures its comment
//! cites, flags override them like a scenario file, and `--print` shows the result.

use std::time::Duration;

use mailcluster_api::stress::{
    AuthMechanism, Protocol, ScenarioKind, SmtpTarget, StressProfile, StressSpec, TlsMode,
};
use mailcluster_stress::StressArgs;
use mailcluster_stress::args::{print, resolve};
use mailcluster_stress::engine::{Op, Plan};

fn profile_args(p: StressProfile) -> StressArgs {
    StressArgs { profile: Some(p), insecure: true, ..Default::default() }
}

fn threshold_texts(plan: &Plan) -> Vec<&str> {
    plan.slo.iter().map(|t| t.text.as_str()).collect()
}

/// Weights of a resolved mix, by operation (the plan keeps them cumulative).
fn weights(plan: &Plan) -> Vec<(Op, u64)> {
    let mut prev = 0;
    plan.mix
        .iter()
        .map(|(op, cum)| {
            let w = cum - prev;
            prev = *cum;
            (*op, w)
        })
        .collect()
}

#[test]
fn every_profile_resolves_against_its_own_targets() {
    for p in StressProfile::ALL {
        let setup = resolve(&profile_args(p)).unwrap_or_else(|e| panic!("profile {p}: {e:#}"));
        assert!(!setup.plans.is_empty(), "{p}");
        let text = print(&profile_args(p)).unwrap_or_else(|e| panic!("profile {p}: {e:#}"));
        assert!(text.starts_with(&p.header()), "{p}: --print starts with the source figures");
        // What --print shows is itself a scenario file that resolves to the same run.
        let spec: StressSpec = serde_yaml_ng::from_str(&text).expect("printed run parses");
        assert_eq!(spec.scenarios.len(), setup.plans.len());
        for (s, plan) in spec.scenarios.iter().zip(&setup.plans) {
            assert_eq!(s.name.as_deref(), Some(plan.name.as_str()));
            assert_eq!(s.concurrency, Some(plan.concurrency as u32));
            assert_eq!(s.rate, plan.rate);
        }
        assert!(!text.contains("password: pass"), "{p}: no password in --print");
    }
}

fn whitepaper_shape(p: StressProfile) -> Vec<Plan> {
    let setup = resolve(&profile_args(p)).expect("resolves");
    let kinds: Vec<ScenarioKind> = setup.plans.iter().map(|p| p.kind).collect();
    use ScenarioKind as K;
    assert_eq!(kinds, [K::ConnectFlood, K::Auth, K::Deliver, K::Search, K::Fetch], "{p}");
    let plans = setup.plans;
    // 5,000 concurrent TLS connections held.
    assert_eq!(plans[0].concurrency, 5000);
    assert_eq!(plans[0].protocol, Some(Protocol::Imap));
    assert_eq!(setup.targets.imap.as_ref().map(|e| e.tls_mode), Some(TlsMode::Implicit));
    // A 1,000-user LOGIN / AUTH PLAIN storm.
    assert_eq!(setup.users.len(), 1000);
    assert_eq!((plans[1].concurrency, plans[1].auth), (1000, AuthMechanism::Both));
    assert_eq!(plans[1].protocol, Some(Protocol::Imap));
    // SMTP at 2,000 msg/s.
    assert_eq!(plans[2].rate, Some(2000.0));
    // 200 users on UID SEARCH UNSEEN and UID FETCH BODY.PEEK[].
    assert_eq!((plans[3].concurrency, plans[4].concurrency), (200, 200));
    // success >= 99.95 %, SMTP P95 <= 120 ms, IMAP FETCH P95 <= 350 ms.
    let run: Vec<String> = setup.run_thresholds.iter().map(|t| t.text.clone()).collect();
    for want in ["success_rate >= 99.95%", "deliver.p95 <= 120ms", "fetch.p95 <= 350ms"] {
        assert!(run.iter().any(|t| t == want), "{p}: {want} missing from {run:?}");
    }
    assert!(threshold_texts(&plans[2]).contains(&"deliver.p95 <= 120ms"));
    assert!(threshold_texts(&plans[4]).contains(&"fetch.p95 <= 350ms"));
    plans
}

fn total(plans: &[Plan]) -> Duration {
    plans.iter().map(|p| p.ramp_up + p.duration).sum()
}

#[test]
fn whitepaper_is_the_white_paper_suite_and_short_keeps_its_shape() {
    let full = whitepaper_shape(StressProfile::Whitepaper);
    assert_eq!(full[2].duration, Duration::from_secs(30 * 60), "SMTP for 30 minutes");
    // It must fit the in-cluster Job's default deadline (3600 s) with room to drain.
    assert!(total(&full) <= Duration::from_secs(55 * 60), "{:?}", total(&full));

    let short = whitepaper_shape(StressProfile::WhitepaperShort);
    assert!(total(&short) <= Duration::from_secs(10 * 60), "minutes: {:?}", total(&short));
    for (f, s) in full.iter().zip(&short) {
        assert_eq!((f.kind, f.concurrency, f.rate, f.auth), (s.kind, s.concurrency, s.rate, s.auth));
        assert!(s.duration < f.duration, "{}", s.name);
    }
}

#[test]
fn submission_pop3_is_the_jmeter_practice() {
    let setup = resolve(&profile_args(StressProfile::SubmissionPop3)).expect("resolves");
    let t = &setup.targets;
    assert_eq!(
        t.submissions.as_ref().map(|e| (e.address.as_str(), e.tls_mode)),
        Some(("127.0.0.1:10465", TlsMode::Implicit))
    );
    assert_eq!(
        t.submission.as_ref().map(|e| (e.address.as_str(), e.tls_mode)),
        Some(("127.0.0.1:10587", TlsMode::Starttls))
    );
    assert_eq!(
        t.pop3.as_ref().map(|e| (e.address.as_str(), e.tls_mode)),
        Some(("127.0.0.1:10995", TlsMode::Implicit))
    );
    assert!(t.smtp.is_none() && t.imap.is_none());

    let mixed = setup.plans.iter().find(|p| p.kind == ScenarioKind::Mixed).expect("mixed scenario");
    assert_eq!(mixed.auth, AuthMechanism::Plain);
    let w = weights(mixed);
    let send: u64 = w.iter().filter(|(op, _)| matches!(op, Op::Deliver(_))).map(|(_, w)| w).sum();
    let pop3: u64 = w.iter().filter(|(op, _)| *op == Op::Pop3).map(|(_, w)| w).sum();
    assert_eq!((send, pop3), (60, 40), "{w:?}");
    for port in [SmtpTarget::Submission, SmtpTarget::Submissions] {
        assert!(w.iter().any(|(op, w)| *op == Op::Deliver(Some(port)) && *w > 0), "{port:?} in {w:?}");
    }
    let sizes: Vec<(u64, u32, bool)> =
        mixed.sizes.iter().map(|s| (s.bytes, s.weight, s.attachment)).collect();
    assert_eq!(sizes, [(4096, 70, false), (65536, 20, true), (524288, 10, true)]);
    // Every scenario authenticates and sends as the user it logged in as.
    for plan in &setup.plans {
        assert_eq!(plan.auth, AuthMechanism::Plain, "{}", plan.name);
        assert_eq!(plan.sender, None, "{}", plan.name);
    }
}

#[test]
fn flags_override_a_profile_like_a_scenario_file() {
    let mut a = profile_args(StressProfile::SubmissionPop3);
    a.submissions = Some("127.0.0.1:2465".into());
    a.pop3 = Some("127.0.0.1:2995".into());
    a.duration = Some("3s".into());
    a.rate = Some(5.0);
    a.users_count = Some(4);
    let setup = resolve(&a).expect("resolves");
    // The address changes; the profile's TLS mode stays.
    let s = setup.targets.submissions.expect("submissions");
    assert_eq!((s.address.as_str(), s.tls_mode), ("127.0.0.1:2465", TlsMode::Implicit));
    let p = setup.targets.pop3.expect("pop3");
    assert_eq!((p.address.as_str(), p.tls_mode), ("127.0.0.1:2995", TlsMode::Implicit));
    assert_eq!(setup.users.len(), 4);
    let mixed = setup.plans.iter().find(|p| p.kind == ScenarioKind::Mixed).expect("mixed");
    assert_eq!((mixed.duration, mixed.rate), (Duration::from_secs(3), Some(5.0)));
}

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    stress: StressArgs,
}

fn parse(args: &[&str]) -> Result<StressArgs, clap::Error> {
    use clap::Parser;
    Cli::try_parse_from(std::iter::once("stress").chain(args.iter().copied())).map(|c| c.stress)
}

#[test]
fn profile_names_and_flags_on_the_command_line() {
    let a = parse(&["--profile", "submission-pop3", "--print"]).expect("parses");
    assert_eq!((a.profile, a.print), (Some(StressProfile::SubmissionPop3), true));
    let err = parse(&["--profile", "whitepaper-long"]).expect_err("unknown profile").to_string();
    assert!(err.contains("whitepaper-short") && err.contains("submission-pop3"), "{err}");
    // A profile and a file are alternatives, not layers.
    assert!(parse(&["--profile", "whitepaper", "-f", "scenarios.yaml"]).is_err());
    // The in-cluster Job names its mounted file this way.
    let a = parse(&["--scenario-file", "/etc/mailcluster/stress.yaml"]).expect("parses");
    assert_eq!(a.file.as_deref(), Some(std::path::Path::new("/etc/mailcluster/stress.yaml")));
    let a = parse(&["--submissions", "h:465", "--smtp-target", "submissions", "--sender", "a@b.test"])
        .expect("parses");
    assert_eq!(a.smtp_target, Some(SmtpTarget::Submissions));
    assert_eq!(a.sender.as_deref(), Some("a@b.test"));
}

#[test]
fn a_delivery_without_its_target_is_refused_before_running() {
    let mut a = StressArgs { smtp: Some("127.0.0.1:2525".into()), ..Default::default() };
    a.scenarios = vec![ScenarioKind::Deliver];
    a.smtp_target = Some(SmtpTarget::Submissions);
    let err = resolve(&a).err().expect("no submissions target");
    assert!(format!("{err:#}").contains("submissions"), "{err:#}");

    a.submissions = Some("127.0.0.1:2465".into());
    let setup = resolve(&a).expect("now it has one");
    assert_eq!(setup.targets.submissions.map(|e| e.tls_mode), Some(TlsMode::Implicit));

    a.sender = Some("two words@example.test".into());
    assert!(resolve(&a).is_err(), "a sender that would corrupt MAIL FROM is refused");
}

#[test]
fn imap_mix_draws_client_commands_by_weight() {
    use mailcluster_stress::engine::ImapCmd;
    let a = parse(&["--imap", "127.0.0.1:1143", "-s", "imap-mix"]).expect("parses");
    let setup = resolve(&a).expect("resolves");
    let plan = &setup.plans[0];
    assert_eq!(
        (plan.kind, plan.concurrency, plan.rate, plan.ops_per_connection),
        (ScenarioKind::ImapMix, 50, None, 50)
    );
    let w = weights(plan);
    assert_eq!(w.iter().map(|(_, n)| n).sum::<u64>(), 100, "{w:?}");
    assert!(w.contains(&(Op::Imap(ImapCmd::FetchBody), 30)), "{w:?}");
    assert!(
        w.contains(&(Op::Imap(ImapCmd::Delete), 5)) && w.contains(&(Op::Imap(ImapCmd::Append), 5)),
        "{w:?}"
    );

    // Weights of its own commands replace the defaults; another scenario's
    // operation is refused rather than quietly sent to the wrong protocol.
    let a =
        parse(&["--imap", "h:143", "-s", "imap-mix", "--weights", "imap-fetch-body=1,imap-store=3"]).unwrap();
    let w = weights(&resolve(&a).expect("resolves").plans[0]);
    assert_eq!(w, vec![(Op::Imap(ImapCmd::FetchBody), 1), (Op::Imap(ImapCmd::Store), 3)]);
    let a = parse(&["--imap", "h:143", "-s", "imap-mix", "--weights", "deliver=1"]).unwrap();
    assert!(format!("{:#}", resolve(&a).err().expect("refused")).contains("imap-mix"));
    // It needs an IMAP target.
    let a = parse(&["--smtp", "h:25", "-s", "imap-mix"]).unwrap();
    assert!(format!("{:#}", resolve(&a).err().expect("no IMAP")).contains("IMAP"));

    // --print shows the weights it will draw by.
    let a = parse(&["--imap", "h:143", "-s", "imap-mix"]).unwrap();
    let text = print(&a).expect("prints");
    assert!(text.contains("imap-fetch-envelope: 20") && text.contains("kind: imap-mix"), "{text}");
}
