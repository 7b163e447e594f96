//! The `mailcluster` binary as an operator meets it: configuration errors, exit
//! codes and one-line messages, without any external service.

mod common;

use common::{run, run_with};

#[test]
fn version_prints_name_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["version"], &[]);
    out.ok();
    assert_eq!(out.stdout.trim(), format!("mailcluster {}", env!("CARGO_PKG_VERSION")));
    let out = run(dir.path(), &["--version"], &[]);
    out.ok();
    assert!(out.stdout.contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn print_config_redacts_the_database_password() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &["serve", "--print-config"],
        &[
            ("MAILCLUSTER_DATABASE_URL", "postgres://mail:hunter2@db.internal:5432/mail"),
            ("MAILCLUSTER_REDIS_URL", "redis://:pa55word@cache:6379"),
            ("MAILCLUSTER_IMAP_PORT", "1143"),
        ],
    );
    out.ok();
    assert!(!out.stdout.contains("hunter2") && !out.stderr.contains("hunter2"), "{}", out.stdout);
    assert!(!out.stdout.contains("pa55word"), "{}", out.stdout);
    assert!(out.stdout.contains("<redacted>"), "{}", out.stdout);
    assert!(out.stdout.contains("imap = 1143"), "{}", out.stdout);
    // Nothing was started or created: printing is side-effect free.
    assert!(!dir.path().join("mailcluster-data").exists());
}

#[test]
fn print_config_reads_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mc.toml");
    std::fs::write(&file, "hostname = \"mx.example.net\"\n").unwrap();
    let out = run(dir.path(), &["serve", "--config", file.to_str().unwrap(), "--print-config"], &[]);
    out.ok();
    assert!(out.stdout.contains("hostname = \"mx.example.net\""), "{}", out.stdout);
    // The same through MAILCLUSTER_CONFIG.
    let out =
        run(dir.path(), &["serve", "--print-config"], &[("MAILCLUSTER_CONFIG", file.to_str().unwrap())]);
    out.ok();
    assert!(out.stdout.contains("mx.example.net"), "{}", out.stdout);
}

#[test]
fn unknown_config_key_exits_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mc.toml");
    std::fs::write(&file, "hostname = \"x\"\n[database]\npool_sise = 3\n").unwrap();
    for args in [vec!["serve"], vec!["user", "list"], vec!["migrate"]] {
        let mut args = args.clone();
        args.extend(["--config", file.to_str().unwrap()]);
        let out = run(dir.path(), &args, &[]);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        let line = out.error_line();
        assert!(line.contains("pool_sise") && line.contains("mc.toml:3"), "{line}");
        out.assert_no_panic();
    }
}

#[test]
fn malformed_env_value_exits_2_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    for (var, value) in [
        ("MAILCLUSTER_IMAP_PORT", "143x"),
        ("MAILCLUSTER_LISTEN_ADDR", "localhost:1"),
        ("MAILCLUSTER_BOGUS", "1"),
    ] {
        let out = run(dir.path(), &["serve"], &[(var, value)]);
        assert_eq!(out.code, Some(2), "{var}: {}", out.stderr);
        assert!(out.error_line().contains(var), "{}", out.stderr);
        out.assert_no_panic();
    }
}

#[test]
fn invalid_combination_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["serve"], &[("MAILCLUSTER_TLS_CERT", "/nonexistent.pem")]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.error_line().contains("tls.key"), "{}", out.stderr);
}

#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["frobnicate"], &[]);
    assert_eq!(out.code, Some(2));
    let out = run(dir.path(), &["user", "add"], &[]);
    assert_eq!(out.code, Some(2));
    // A bad address or an empty password is refused before any store is opened.
    let out = run_with(
        dir.path(),
        &["user", "add", "not-an-address"],
        &[],
        "pw\n",
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let out = run_with(
        dir.path(),
        &["user", "add", "a@example.com"],
        &[],
        "\n",
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.error_line().contains("empty password"), "{}", out.stderr);
    let out = run(dir.path(), &["--log-level", "=[", "serve", "--print-config"], &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.error_line().contains("--log-level"), "{}", out.stderr);
}

#[test]
fn crd_prints_the_checked_in_crd() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["crd"], &[]);
    out.ok();
    let on_disk = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crds/mailclusters.mailcluster.dev.yaml"
    ))
    .unwrap();
    assert_eq!(out.stdout, on_disk);
    let out = run(dir.path(), &["crd", "--all"], &[]);
    out.ok();
    let mut all = String::new();
    for file in [
        "mailclusters.mailcluster.dev.yaml",
        "maildomains.mailcluster.dev.yaml",
        "mailaccounts.mailcluster.dev.yaml",
    ] {
        all += &std::fs::read_to_string(format!("{}/../crds/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    }
    assert_eq!(out.stdout, all);
}

#[test]
fn render_prints_the_children_of_a_sample() {
    let dir = tempfile::tempdir().unwrap();
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../operator/tests/fixtures/minimal.yaml");
    let out = run(dir.path(), &["render", "-f", sample], &[]);
    out.ok();
    for kind in ["kind: ConfigMap", "kind: Deployment", "kind: Service", "kind: HorizontalPodAutoscaler"] {
        assert!(out.stdout.contains(kind), "render output lacks {kind}:\n{}", out.stdout);
    }
    let out = run(dir.path(), &["render", "-f", "/nonexistent/cluster.yaml"], &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.error_line().contains("/nonexistent/cluster.yaml"), "{}", out.stderr);
    out.assert_no_panic();
}

#[test]
fn malformed_dkim_key_stops_the_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("broken.key");
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n").unwrap();
    let config = dir.path().join("mail.toml");
    std::fs::write(
        &config,
        format!(
            "[[dkim.keys]]\ndomain = \"example.org\"\nselector = \"s1\"\nkey_file = \"{}\"\nalgorithm = \"ed25519\"\n",
            key.display()
        ),
    )
    .unwrap();
    let mut env = common::cluster::ephemeral_ports();
    env.push(("MAILCLUSTER_CONFIG", config.to_str().unwrap()));
    let out = run(dir.path(), &["serve"], &env);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let line = out.error_line();
    assert!(line.contains("DKIM") && line.contains("broken.key") && line.contains("example.org"), "{line}");
    out.assert_no_panic();
}
