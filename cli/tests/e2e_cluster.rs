//! The whole loop on one machine: `scripts/e2e-cluster.sh` against the cluster of
//! `scripts/kube-up.sh` with its node (kubelet and containerd). The operator runs as
//! a Pod of the image scripts/image-build.sh builds, so do the migration Job and the
//! mail Pods; `kubectl logs` and `exec` work, the runtime's user, capabilities,
//! seccomp, read-only root and cgroup memory limit are checked, mail goes in with swaks through the SMTP Service and out with curl
//! through the IMAP Service, and the stress Job's verdict lands in the
//! MailCluster's status. Each of the script's waits is bounded; so is the whole.
//!
//! Then disruption under load (`scripts/e2e-disruption.sh`): rolling updates, a
//! killed Pod process and a deleted Pod (the group-commit leader, to which the
//! other Pod hands its deliveries) while deliveries run, every acknowledged
//! message stored exactly once.
//!
//! And the HPA on pool health (`scripts/e2e-autoscale.sh`): Prometheus scrapes the
//! Pods, prometheus-adapter serves custom.metrics.k8s.io, and the operator's HPA
//! scales the SMTP Deployment up under load and back down after it.
//!
//! Runs when `MAILCLUSTER_TEST_KUBECONFIG` names a cluster with the test node
//! (scripts/test.sh starts one as root). In CI as root a missing node fails the test.
//! The scripts run one at a time: each loads the one machine they share.

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

/// Runs `scripts/<script>` against the test cluster, bounded by `limit`; its stdout,
/// or `None` when no cluster is configured.
fn run_script(script: &str, limit: Duration) -> Option<String> {
    let Ok(kubeconfig) = std::env::var("MAILCLUSTER_TEST_KUBECONFIG") else {
        eprintln!("skipped: MAILCLUSTER_TEST_KUBECONFIG is not set (scripts/test.sh sets it)");
        return None;
    };
    // One script at a time, across test processes too (cargo-nextest runs each test
    // in a process of its own): a lock file beside the test binaries.
    let lock_path = std::env::temp_dir().join("mailcluster-e2e.lock");
    let lock = std::fs::File::create(&lock_path).expect("create the e2e lock file");
    lock.lock().expect("take the e2e lock");
    assert!(
        test_node_present(&kubeconfig),
        "the cluster has no test node (scripts/kube-up.sh starts one as root)"
    );
    let started = std::time::Instant::now();
    let out = Command::new("timeout")
        .arg(limit.as_secs().to_string())
        .arg(root().join("scripts").join(script))
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{script}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed ({}):\n{stdout}\n{stderr}", out.status);
    eprintln!("{script} in {:.0?}", started.elapsed());
    Some(stdout)
}

#[test]
fn whole_loop_on_the_test_node() {
    let Some(stdout) = run_script("e2e-cluster.sh", Duration::from_secs(900)) else { return };
    // Every step ran, in order, and the run ends on the stress verdict.
    let steps: Vec<&str> = stdout.lines().filter(|l| l.starts_with("==> ")).collect();
    for (i, want) in [
        "the node: the kubelet of the control plane's release on containerd",
        "operator from charts/mailcluster",
        "schema migration Job completes",
        "Pods Ready: smtp submission imap pop3",
        "kubectl logs and kubectl exec",
        "what the runtime enforces",
        "a MailDomain and a MailAccount with its password Secret",
        "swaks -> Service",
        "curl <- Service",
        "delete the MailAccount (deletionPolicy Retain)",
        "stress run on demand",
        "kubectl wait --for=condition=Ready",
        "delete the MailCluster",
    ]
    .iter()
    .enumerate()
    {
        assert!(steps.iter().any(|s| s.contains(want)), "step {i} ({want}) missing from the log:\n{stdout}");
    }
    // What the kubelet and runc enforce, as scripts/e2e_runtime_checks.py saw it.
    for want in [
        "node runtime containerd://",
        "mailcluster --version: mailcluster ",
        "uid/gid 65532, no capabilities, no new privileges, seccomp filter",
        "root filesystem read-only (EROFS as root)",
        "SIGKILLed by the OOM killer",
        // spec.tuning, as /proc/sys shows it inside the Pod, and the listener following it.
        "net.core.somaxconn = 8192",
        "net.ipv4.tcp_keepalive_time = 300",
        "SMTP listener backlog 8192",
    ] {
        assert!(stdout.contains(want), "({want}) missing from the log:\n{stdout}");
    }
    assert_eq!(stdout.lines().last(), Some("SLOMet=True"), "{stdout}");
}

#[test]
fn rolling_updates_and_pod_loss_under_load_lose_nothing() {
    let Some(stdout) = run_script("e2e-disruption.sh", Duration::from_secs(900)) else { return };
    let steps: Vec<&str> = stdout.lines().filter(|l| l.starts_with("==> ")).collect();
    for want in [
        "open-loop deliver",
        "group commit across pods: the SMTP Pods hand their deliveries to the leader",
        "rolling update under load: image tag",
        "rolling update under load: smtp.maxConnections",
        "SIGKILL of the group-commit leader's process",
        "deleted at once (grace 0)",
        "every acknowledged message is stored exactly once",
    ] {
        assert!(steps.iter().any(|s| s.contains(want)), "step ({want}) missing from the log:\n{stdout}");
    }
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("exactly once: ") && last.ends_with("each stored once"), "{stdout}");
}

#[test]
fn hpa_scales_on_pool_saturation_and_back() {
    let Some(stdout) = run_script("e2e-autoscale.sh", Duration::from_secs(1500)) else { return };
    let steps: Vec<&str> = stdout.lines().filter(|l| l.starts_with("==> ")).collect();
    for want in [
        "Prometheus on 127.0.0.1",
        "prometheus-adapter on",
        "open-loop deliver",
        "after the load: back to minReplicas",
        "timeline: replicas x poolSize within the budget",
    ] {
        assert!(steps.iter().any(|s| s.contains(want)), "step ({want}) missing from the log:\n{stdout}");
    }
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("HPA: 1 -> ") && last.contains("back to 1"), "{stdout}");
}
