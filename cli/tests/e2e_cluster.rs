//! The whole loop on one machine: `scripts/e2e-cluster.sh` against the cluster of
//! `scripts/kube-up.sh` with its test node. The operator runs as a Pod installed
//! from the chart, the migration Job and the mail Pods run as processes on the
//! test node, mail goes in with swaks through the SMTP Service and out with curl
//! through the IMAP Service, and the stress Job's verdict lands in the
//! MailCluster's status. Each of the script's waits is bounded; so is the whole.
//!
//! Runs when `MAILCLUSTER_TEST_KUBECONFIG` names a cluster with the test node
//! (scripts/test.sh starts one as root). In CI as root a missing node fails the test.

use std::process::Command;
use std::time::Duration;

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn test_node_present(kubeconfig: &str) -> bool {
    let out = Command::new("kubectl")
        .args(["get", "nodes", "-l", "mailcluster.dev/test-node=true", "-o", "name"])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run kubectl");
    out.status.success() && !String::from_utf8_lossy(&out.stdout).trim().is_empty()
}

#[test]
fn whole_loop_on_the_test_node() {
    let Ok(kubeconfig) = std::env::var("MAILCLUSTER_TEST_KUBECONFIG") else {
        eprintln!("skipped: MAILCLUSTER_TEST_KUBECONFIG is not set (scripts/test.sh sets it)");
        return;
    };
    assert!(
        test_node_present(&kubeconfig),
        "the cluster has no test node (scripts/kube-up.sh starts one as root)"
    );
    let started = std::time::Instant::now();
    let out = Command::new("timeout")
        .arg(Duration::from_secs(900).as_secs().to_string())
        .arg(root().join("scripts/e2e-cluster.sh"))
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .expect("run scripts/e2e-cluster.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "e2e-cluster.sh failed ({}):\n{stdout}\n{stderr}", out.status);
    // Every step ran, in order, and the run ends on the stress verdict.
    let steps: Vec<&str> = stdout.lines().filter(|l| l.starts_with("==> ")).collect();
    for (i, want) in [
        "operator from charts/mailcluster",
        "schema migration Job completes",
        "SMTP, submission, IMAP and POP3 Pods Ready",
        "swaks -> Service",
        "curl <- Service",
        "stress run on demand",
        "kubectl wait --for=condition=Ready",
        "delete the MailCluster",
    ]
    .iter()
    .enumerate()
    {
        assert!(steps.iter().any(|s| s.contains(want)), "step {i} ({want}) missing from the log:\n{stdout}");
    }
    assert_eq!(stdout.lines().last(), Some("SLOMet=True"), "{stdout}");
    eprintln!("whole loop in {:.0?}", started.elapsed());
}
