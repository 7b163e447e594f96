//! The binary as the install paths use it: the operator Deployment's arguments (chart
//! and manifests/install.yaml) parse, and every sample MailCluster renders with
//! `mailcluster render -f`.

mod common;

use std::path::{Path, PathBuf};

use common::run;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Arguments of the operator container in manifests/install.yaml.
fn install_yaml_args() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("manifests/install.yaml")).unwrap();
    for doc in text.split("\n---\n") {
        let v: serde_json::Value = serde_yaml_ng::from_str(doc).unwrap();
        if v["kind"] == "Deployment" {
            let args = &v["spec"]["template"]["spec"]["containers"][0]["args"];
            return args.as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
        }
    }
    panic!("no Deployment in install.yaml");
}

/// Every flag the chart's template can emit, with a value where it takes one
/// (the template itself is Go text, so flags are read from its `- --` lines).
fn chart_flags() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("charts/mailcluster/templates/deployment.yaml")).unwrap();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("- --"))
        .map(|f| match f.split_once('=') {
            Some(("metrics-addr", _)) => "--metrics-addr=127.0.0.1:0".to_string(),
            Some((name, _)) => format!("--{name}=mail"),
            None => format!("--{f}"),
        })
        .collect()
}

#[test]
fn operator_accepts_the_arguments_the_chart_gives_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut sets = vec![install_yaml_args()];
    let mut all = vec!["operator".to_string()];
    all.extend(chart_flags());
    assert!(all.len() >= 5, "flags read from the template: {all:?}");
    sets.push(all);
    for args in sets {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // No cluster here: a run that got past argument parsing fails connecting
        // (exit 1), a usage error would exit 2.
        let out = run(dir.path(), &args, &[("KUBECONFIG", "/nonexistent/kubeconfig")]);
        out.assert_no_panic();
        assert_eq!(out.code, Some(1), "{args:?}\n{}", out.stderr);
        assert!(out.error_line().contains("connecting to the Kubernetes API"), "{}", out.stderr);
    }
}

#[test]
fn samples_render_with_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let mut rendered = 0;
    for name in ["minimal.yaml", "full.yaml", "tls-secret.yaml"] {
        let path = root().join("manifests/samples").join(name);
        let out = run(dir.path(), &["render", "-f", path.to_str().unwrap()], &[]);
        out.ok();
        assert!(!out.stdout.contains("# warning:"), "{name}: {}", out.stdout);
        assert!(out.stdout.matches("\nkind: Deployment").count() >= 3, "{name}");
        rendered += 1;
    }
    assert_eq!(rendered, 3);
}
