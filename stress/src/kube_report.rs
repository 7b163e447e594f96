//! Write a run's verdict into `status.lastStress` of a MailCluster.
//!
//! The resource is addressed dynamically (`mailcluster.dev/v1alpha1`, plural
//! `mailclusters`) so the stress runner does not depend on the operator's CRD type,
//! and patched with a JSON merge patch on the status subresource: only
//! `lastStress` is replaced; conditions and replica counts owned by the operator
//! stay untouched.

use anyhow::Context;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use mailcluster_api::stress::LastStress;

pub const GROUP: &str = "mailcluster.dev";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "MailCluster";
pub const PLURAL: &str = "mailclusters";

/// The merge patch body.
pub fn patch_body(last: &LastStress) -> serde_json::Value {
    serde_json::json!({ "status": { "lastStress": last } })
}

pub async fn report_to_cluster(
    client: kube::Client,
    ns: &str,
    name: &str,
    last: &LastStress,
) -> anyhow::Result<()> {
    let ar = ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.into(),
        plural: PLURAL.into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &ar);
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch_body(last)))
        .await
        .with_context(|| format!("patching status.lastStress of {ns}/{name}"))?;
    Ok(())
}
