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
//!
//! When the operator runs rspamd (`spec.filter.rspamd.deploy`) a second Secret,
//! made the same way, holds its controller password (the pods' and rspamd's),
//! its Redis password, and the two configuration fragments rspamd includes
//! them from (rspamd reads no password from its environment).

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

/// rspamd's controller password (`MAILCLUSTER_FILTER__RSPAMD__PASSWORD`).
pub const RSPAMD_PASSWORD: &str = "password";
/// The password of rspamd's Redis.
pub const RSPAMD_REDIS_PASSWORD: &str = "redis-password";
/// rspamd's controller settings naming its password, included by the
/// controller's configuration.
pub const RSPAMD_CONTROLLER_INCLUDE: &str = "controller.inc";
/// rspamd's Redis settings naming the Redis password.
pub const RSPAMD_REDIS_INCLUDE: &str = "redis.inc";
/// Every key of rspamd's Secret.
pub const RSPAMD_KEYS: [&str; 4] =
    [RSPAMD_PASSWORD, RSPAMD_REDIS_PASSWORD, RSPAMD_CONTROLLER_INCLUDE, RSPAMD_REDIS_INCLUDE];

fn secret(mc: &MailCluster, name: &str, component: &str, data: Vec<(&str, String)>) -> Secret {
    Secret {
        metadata: metadata(mc, name, component),
        type_: Some("Opaque".into()),
        data: Some(data.into_iter().map(|(k, v)| (k.to_string(), ByteString(v.into_bytes()))).collect()),
        ..Default::default()
    }
}

/// A new Secret with fresh random keys.
pub fn new_secret(mc: &MailCluster) -> Secret {
    secret(mc, &names::keys_secret(mc), "keys", KEYS.iter().map(|k| (*k, random_hex())).collect())
}

/// A new Secret of rspamd's passwords (random hex: nothing to quote in the
/// configuration fragments).
pub fn new_rspamd_secret(mc: &MailCluster) -> Secret {
    let (password, redis) = (random_hex(), random_hex());
    let data = vec![
        (
            RSPAMD_CONTROLLER_INCLUDE,
            format!("password = \"{password}\";\nenable_password = \"{password}\";\n"),
        ),
        (RSPAMD_REDIS_INCLUDE, format!("password = \"{redis}\";\n")),
        (RSPAMD_PASSWORD, password),
        (RSPAMD_REDIS_PASSWORD, redis),
    ];
    secret(mc, &names::rspamd(mc), "rspamd", data)
}

/// Makes sure the Secret exists, creating it if it does not; never changes one
/// that does. Returns a problem to report when it exists without a key the pods
/// need (then nothing is built: the pods would not start).
pub async fn ensure(mc: &MailCluster, ns: &str, client: &Client) -> Result<Option<String>, kube::Error> {
    let problem = ensure_one(client, ns, new_secret(mc), &KEYS).await?;
    if problem.is_some() || mc.spec.rspamd_deploy().is_none() {
        return Ok(problem);
    }
    ensure_one(client, ns, new_rspamd_secret(mc), &RSPAMD_KEYS).await
}

async fn ensure_one(
    client: &Client,
    ns: &str,
    new: Secret,
    keys: &[&str],
) -> Result<Option<String>, kube::Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let name = new.metadata.name.clone().unwrap_or_default();
    if let Some(found) = api.get_opt(&name).await? {
        let data = found.data.unwrap_or_default();
        let missing: Vec<&str> = keys.iter().copied().filter(|k| !data.contains_key(*k)).collect();
        return Ok((!missing.is_empty()).then(|| {
            format!(
                "Secret {name} has no key {}; delete it and the operator makes a new one",
                missing.join(", no key ")
            )
        }));
    }
    match api.create(&PostParams::default(), &new).await {
        Ok(_) => {
            info!(secret = %name, "created a Secret of generated keys");
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

    #[test]
    fn rspamds_fragments_name_the_passwords_of_their_secret() {
        let mc: MailCluster = serde_yaml_ng::from_str(
            "apiVersion: mailcluster.dev/v1alpha1\nkind: MailCluster\nmetadata: {name: mail, namespace: mail}\n\
             spec: {image: {tag: '1'}, domains: [example.com], postgres: {urlSecretRef: {name: db}}, \
             redis: {urlSecretRef: {name: r}}}",
        )
        .unwrap();
        let (a, b) = (new_rspamd_secret(&mc), new_rspamd_secret(&mc));
        assert_eq!(a.metadata.name.as_deref(), Some("mail-rspamd"));
        let (a, b) = (a.data.unwrap(), b.data.unwrap());
        let text = |k: &str| String::from_utf8(a[k].0.clone()).unwrap();
        let (password, redis) = (text(RSPAMD_PASSWORD), text(RSPAMD_REDIS_PASSWORD));
        assert_eq!((password.len(), redis.len()), (KEY_BYTES * 2, KEY_BYTES * 2));
        assert_ne!(password, redis);
        assert_ne!(a[RSPAMD_PASSWORD], b[RSPAMD_PASSWORD], "random per Secret");
        assert_eq!(
            text(RSPAMD_CONTROLLER_INCLUDE),
            format!("password = \"{password}\";\nenable_password = \"{password}\";\n")
        );
        assert_eq!(text(RSPAMD_REDIS_INCLUDE), format!("password = \"{redis}\";\n"));
        assert_eq!(a.len(), RSPAMD_KEYS.len());
    }
}
