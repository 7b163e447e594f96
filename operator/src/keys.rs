//! The cluster's own keys: one Secret per `MailCluster`, made by the operator.
//!
//! It holds random keys the pods share and nobody needs to choose:
//! `group-commit-key` (the key leader and followers prove to each other before
//! a delivery is handed over, `smtp.group_commit_secret`) and `cache-mac-key`
//! (`cache.mac_key`). The Secret is created once with fresh random values and
//! never written again: a reconcile that finds it leaves it as it is, so the
//! keys stay the same across operator restarts and upgrades. It is owned by the
//! MailCluster and goes with it. To change the keys, delete the Secret (the
//! operator makes a new one) and restart the pods.
//!
//! The values are random bytes in hex: environment variables carry text.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PostParams};
use mailcluster_api::MailCluster;
use tracing::info;

use crate::names;
use crate::names::metadata;

/// Key of the group-commit key in the Secret (`MAILCLUSTER_SMTP__GROUP_COMMIT_SECRET`).
pub const GROUP_COMMIT_KEY: &str = "group-commit-key";
/// Key of the cache's MAC key in the Secret (`MAILCLUSTER_CACHE__MAC_KEY`).
pub const CACHE_MAC_KEY: &str = "cache-mac-key";
/// Every key the Secret holds.
pub const KEYS: [&str; 2] = [GROUP_COMMIT_KEY, CACHE_MAC_KEY];
/// Random bytes per key.
pub const KEY_BYTES: usize = 32;

fn random_hex() -> String {
    let mut bytes = [0u8; KEY_BYTES];
    rand::fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new Secret with fresh random keys.
pub fn new_secret(mc: &MailCluster) -> Secret {
    let data = KEYS.iter().map(|k| (k.to_string(), ByteString(random_hex().into_bytes()))).collect();
    Secret {
        metadata: metadata(mc, &names::keys_secret(mc), "keys"),
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// Makes sure the Secret exists, creating it if it does not; never changes one
/// that does. Returns a problem to report when it exists without a key the pods
/// need (then nothing is built: the pods would not start).
pub async fn ensure(mc: &MailCluster, ns: &str, client: &Client) -> Result<Option<String>, kube::Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let name = names::keys_secret(mc);
    if let Some(found) = api.get_opt(&name).await? {
        let data = found.data.unwrap_or_default();
        let missing: Vec<&str> = KEYS.iter().copied().filter(|k| !data.contains_key(*k)).collect();
        return Ok((!missing.is_empty()).then(|| {
            format!(
                "Secret {name} has no key {}; delete it and the operator makes a new one",
                missing.join(", no key ")
            )
        }));
    }
    match api.create(&PostParams::default(), &new_secret(mc)).await {
        Ok(_) => {
            info!(secret = %name, "created the cluster's keys");
            Ok(None)
        }
        // Made meanwhile (another reconcile, or a person): that one stands.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_secret_has_fresh_keys_of_full_length() {
        let mc: MailCluster = serde_yaml_ng::from_str(
            "apiVersion: mailcluster.dev/v1alpha1\nkind: MailCluster\nmetadata: {name: mail, namespace: mail}\n\
             spec: {image: {tag: '1'}, domains: [example.com], postgres: {urlSecretRef: {name: db}}, \
             redis: {urlSecretRef: {name: r}}}",
        )
        .unwrap();
        let (a, b) = (new_secret(&mc), new_secret(&mc));
        assert_eq!(a.metadata.name.as_deref(), Some("mail-keys"));
        let (a, b) = (a.data.unwrap(), b.data.unwrap());
        for key in KEYS {
            let value = std::str::from_utf8(&a[key].0).unwrap();
            assert_eq!(value.len(), KEY_BYTES * 2, "{key}");
            assert!(value.bytes().all(|c| c.is_ascii_hexdigit()), "{key}");
            assert_ne!(a[key], b[key], "{key}: random per Secret");
        }
        assert_ne!(a[GROUP_COMMIT_KEY], a[CACHE_MAC_KEY], "keys differ from each other");
    }
}
