//! The generated CustomResourceDefinition (the file under `crds/` is its output).
//!
//! Regenerate `crds/mailclusters.mailcluster.dev.yaml` with
//! `UPDATE_CRDS=1 cargo test -p mailcluster-operator --test crd` (or
//! `cargo run -p mailcluster-operator --example crdgen > crds/mailclusters.mailcluster.dev.yaml`);
//! the same test fails when the checked-in file drifts from the types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use mailcluster_api::{MailAccount, MailCluster, MailDomain};

/// The `MailCluster` CRD as YAML, exactly as checked into `crds/`.
pub fn crd_yaml() -> String {
    to_yaml(MailCluster::crd(), "api/src/cluster.rs")
}

/// Every CRD of the group (`mailcluster crd --all`), as `(file name under crds/,
/// YAML)`: the MailCluster first, then the kinds that live in a cluster's store (`api/src/accounts.rs`).
pub fn crd_files() -> Vec<(String, String)> {
    [
        (MailCluster::crd(), "api/src/cluster.rs"),
        (MailDomain::crd(), "api/src/accounts.rs"),
        (MailAccount::crd(), "api/src/accounts.rs"),
    ]
    .into_iter()
    .map(|(crd, source)| {
        let file = format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"));
        (file, to_yaml(crd, source))
    })
    .collect()
}

fn to_yaml(crd: CustomResourceDefinition, source: &str) -> String {
    // Serializing a CRD built from our own types cannot fail: every field is a plain
    // JSON value. A failure here is a programming error caught by the drift test.
    let body =
        serde_yaml_ng::to_string(&crd).unwrap_or_else(|e| format!("# CRD serialization failed: {e}\n"));
    let command = if source.ends_with("cluster.rs") { "mailcluster crd" } else { "mailcluster crd --all" };
    format!("# Generated from {source} by `{command}`; do not edit.\n---\n{body}")
}
