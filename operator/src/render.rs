//! `mailcluster render -f cluster.yaml`: every object the operator would apply, as
//! multi-document YAML, with no cluster. Secrets are not read (the pods reference
//! them by name) and the steady state is shown: migrations done, optional CRDs present.

use anyhow::Context;
use mailcluster_api::MailCluster;

use crate::build::{BuildContext, build};

/// Parses a `MailCluster` (YAML or JSON) and renders its children.
pub fn render(mc_yaml: &str) -> anyhow::Result<String> {
    let mc: MailCluster = serde_yaml_ng::from_str(mc_yaml).context("parsing MailCluster")?;
    render_cluster(&mc)
}

pub fn render_cluster(mc: &MailCluster) -> anyhow::Result<String> {
    let built = build(mc, &BuildContext::steady_state(mc))?;
    let mut out = String::new();
    for w in &built.warnings {
        out.push_str(&format!("# warning: {w}\n"));
    }
    for child in &built.children {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&child.object).context("serializing object")?);
    }
    Ok(out)
}
