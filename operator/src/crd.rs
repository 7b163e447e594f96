//! The generated CustomResourceDefinition (the file under `crds/` is its output).
//!
//! Regenerate `crds/mailclusters.mailcluster.dev.yaml` with
//! `UPDATE_CRDS=1 cargo test -p mailcluster-operator --test crd` (or
//! `cargo run -p mailcluster-operator --example crdgen > crds/mailclusters.mailcluster.dev.yaml`);
//! the same test fails when the checked-in file drifts from the types.

use kube::CustomResourceExt;
use mailcluster_api::MailCluster;

/// The `MailCluster` CRD as YAML, exactly as checked into `crds/`.
pub fn crd_yaml() -> String {
    let crd = MailCluster::crd();
    // Serializing a CRD built from our own types cannot fail: every field is a plain
    // JSON value. A failure here is a programming error caught by the drift test.
    let body =
        serde_yaml_ng::to_string(&crd).unwrap_or_else(|e| format!("# CRD serialization failed: {e}\n"));
    format!("# Generated from api/src/cluster.rs by `mailcluster crd`; do not edit.\n---\n{body}")
}
