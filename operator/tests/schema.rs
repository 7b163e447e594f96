//! Every object the operator builds, and the CRD itself, validated offline against the
//! Kubernetes OpenAPI schemas with `kubernetes-validate --strict` (unknown fields
//! fail). Pods use the native `preStop.sleep` action, so the oldest version checked
//! for rendered objects is 1.30 (where it is on by default); the CRD is checked
//! from 1.25. Missing tool: skipped locally, a failure when `CI` is set
//! (`pip install kubernetes-validate`).

use std::path::Path;
use std::process::Command;

const OLDEST_FOR_OBJECTS: &str = "1.30.0";
const OLDEST_FOR_CRD: &str = "1.25.0";
const NEWEST: &str = "1.37.0";

fn tool_available() -> bool {
    let found =
        Command::new("kubernetes-validate").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "kubernetes-validate is required in CI: pip install kubernetes-validate"
        );
        eprintln!("kubernetes-validate not installed; schema validation skipped");
    }
    found
}

fn validate(file: &Path, version: &str) {
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "--quiet", "-k", version])
        .arg(file)
        .output()
        .expect("run kubernetes-validate");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && !text.contains("ERROR"), "{} against {version}:\n{text}", file.display());
}

/// Splits rendered YAML into built-in kinds (validated) and CRD kinds (no schema bundled).
fn builtin_docs(rendered: &str) -> (String, usize) {
    let mut out = String::new();
    let mut n = 0;
    for doc in rendered.split("\n---\n").map(|d| d.trim_start_matches("---\n")) {
        if doc.contains("apiVersion: cert-manager.io/") || doc.contains("apiVersion: monitoring.coreos.com/")
        {
            continue;
        }
        if doc.trim().is_empty() || doc.lines().all(|l| l.starts_with('#')) {
            continue;
        }
        out.push_str("---\n");
        out.push_str(doc);
        out.push('\n');
        n += 1;
    }
    (out, n)
}

#[test]
fn rendered_objects_match_kubernetes_schemas() {
    if !tool_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for fixture in ["minimal", "full"] {
        let text =
            std::fs::read_to_string(format!("{}/tests/fixtures/{fixture}.yaml", env!("CARGO_MANIFEST_DIR")))
                .unwrap();
        let rendered = mailcluster_operator::render(&text).unwrap();
        let (docs, n) = builtin_docs(&rendered);
        assert!(n >= 12, "{fixture}: only {n} objects");
        let file = dir.path().join(format!("{fixture}.yaml"));
        std::fs::write(&file, docs).unwrap();
        for v in [OLDEST_FOR_OBJECTS, NEWEST] {
            validate(&file, v);
        }
    }
}

#[test]
fn crd_matches_kubernetes_schema() {
    if !tool_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("crd.yaml");
    std::fs::write(&file, mailcluster_operator::crd_yaml()).unwrap();
    for v in [OLDEST_FOR_CRD, NEWEST] {
        validate(&file, v);
    }
}

#[test]
fn validation_catches_a_bad_object() {
    // The check itself must be able to fail: an unknown field is rejected in strict mode.
    if !tool_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\nbogus: 1\n")
        .unwrap();
    let out =
        Command::new("kubernetes-validate").args(["--strict", "-k", NEWEST]).arg(&file).output().unwrap();
    assert!(!out.status.success(), "strict validation accepted an unknown field");
}
