//! Names and labels of child objects: one place, so build, orphan deletion and tests agree.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use mailcluster_api::{CLUSTER_LABEL, MANAGED_BY, MANAGED_BY_LABEL, MailCluster, Protocol};
use sha2::{Digest, Sha256};

pub const NAME_LABEL: &str = "app.kubernetes.io/name";
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const CONFIG_HASH_ANNOTATION: &str = "mailcluster.dev/config-hash";
pub const IMAGE_ANNOTATION: &str = "mailcluster.dev/image";

/// Longest `MailCluster` name: children append at most `-submission-commit`
/// (18) or `-migrate-<10 hex>` (19) and Service names must stay DNS labels (63).
pub const MAX_NAME_LEN: usize = 40;

/// Where the pods find things (read-only root filesystem: only these are writable or mounted).
pub const CONFIG_DIR: &str = "/etc/mailcluster";
pub const TLS_DIR: &str = "/etc/mailcluster/tls";
/// DKIM keys: `DKIM_DIR/<domain>/dkim.key`, one Secret volume per domain.
pub const DKIM_DIR: &str = "/etc/mailcluster/dkim";

pub fn dkim_key_path(domain: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("{DKIM_DIR}/{}/dkim.key", domain.to_ascii_lowercase()))
}
pub const DATA_DIR: &str = "/var/lib/mailcluster";
pub const ADMIN_PORT: i32 = 9090;
/// Where the pods that deliver take each other's deliveries (group commit
/// across pods: the server's `smtp.group_commit_port`).
pub const GROUP_COMMIT_PORT: i32 = 7025;

pub fn cluster_name(mc: &MailCluster) -> &str {
    mc.metadata.name.as_deref().unwrap_or("")
}

pub fn namespace(mc: &MailCluster) -> &str {
    mc.metadata.namespace.as_deref().unwrap_or("default")
}

/// Labels every child carries; orphan deletion lists by the last two.
pub fn common_labels(mc: &MailCluster) -> BTreeMap<String, String> {
    let name = cluster_name(mc).to_string();
    BTreeMap::from([
        (NAME_LABEL.to_string(), "mailcluster".to_string()),
        (INSTANCE_LABEL.to_string(), name.clone()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (CLUSTER_LABEL.to_string(), name),
    ])
}

/// The label selector of orphan deletion: everything this operator made for this cluster.
pub fn owned_selector(mc: &MailCluster) -> String {
    format!("{MANAGED_BY_LABEL}={MANAGED_BY},{CLUSTER_LABEL}={}", cluster_name(mc))
}

pub fn component_labels(mc: &MailCluster, component: &str) -> BTreeMap<String, String> {
    let mut l = common_labels(mc);
    l.insert(COMPONENT_LABEL.to_string(), component.to_string());
    l
}

/// Pod selector of one protocol's pods. Deliberately excludes anything that changes
/// over the life of a Deployment (image, version): selectors are immutable.
pub fn selector_labels(mc: &MailCluster, p: Protocol) -> BTreeMap<String, String> {
    selector_labels_for(mc, p.name())
}

/// name/instance/component only: for pods and for objects that must not be mistaken
/// for operator-owned children (Jobs spawned by the stress CronJob).
pub fn selector_labels_for(mc: &MailCluster, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.to_string(), "mailcluster".to_string()),
        (INSTANCE_LABEL.to_string(), cluster_name(mc).to_string()),
        (COMPONENT_LABEL.to_string(), component.to_string()),
    ])
}

/// Selector of every mail pod of the cluster (metrics Service, NetworkPolicy).
pub fn all_pods_selector(mc: &MailCluster) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.to_string(), "mailcluster".to_string()),
        (INSTANCE_LABEL.to_string(), cluster_name(mc).to_string()),
        ("mailcluster.dev/role".to_string(), "server".to_string()),
    ])
}

pub fn protocol_object(mc: &MailCluster, p: Protocol) -> String {
    format!("{}-{}", cluster_name(mc), p.name())
}

/// The headless Service naming every ready pod of a delivering protocol: its
/// lowest address is the group-commit leader.
pub fn group_commit_service(mc: &MailCluster, p: Protocol) -> String {
    format!("{}-commit", protocol_object(mc, p))
}

/// The protocols whose pods store mail they receive (and so group-commit it).
pub fn delivers(p: Protocol) -> bool {
    matches!(p, Protocol::Smtp | Protocol::Submission)
}

/// Whether `p`'s pods hand their deliveries to a leader among them (and get
/// the headless Service, port and NetworkPolicy rules for it).
pub fn groups_commits(mc: &MailCluster, p: Protocol) -> bool {
    delivers(p) && mc.spec.group_commit.across_pods
}

pub fn config_map(mc: &MailCluster) -> String {
    format!("{}-config", cluster_name(mc))
}

/// The Secret of the cluster's own keys (`keys.rs`).
pub fn keys_secret(mc: &MailCluster) -> String {
    format!("{}-keys", cluster_name(mc))
}

/// rspamd run by the operator (`spec.filter.rspamd.deploy`): its Deployment,
/// Service, ConfigMap and NetworkPolicy, and the Secret of its passwords.
pub fn rspamd(mc: &MailCluster) -> String {
    format!("{}-rspamd", cluster_name(mc))
}

/// The Redis of the operator's rspamd: Deployment, Service and NetworkPolicy.
pub fn rspamd_redis(mc: &MailCluster) -> String {
    format!("{}-rspamd-redis", cluster_name(mc))
}

/// rspamd's controller worker port: scans, learning and its web interface.
pub const RSPAMD_PORT: i32 = 11334;

/// The URL the pods use for the operator's rspamd.
pub fn rspamd_url(mc: &MailCluster) -> String {
    format!("http://{}.{}.svc:{RSPAMD_PORT}", rspamd(mc), namespace(mc))
}

pub fn metrics_service(mc: &MailCluster) -> String {
    format!("{}-metrics", cluster_name(mc))
}

pub fn stress(mc: &MailCluster) -> String {
    format!("{}-stress", cluster_name(mc))
}

pub fn tls_secret_from_issuer(mc: &MailCluster) -> String {
    format!("{}-tls", cluster_name(mc))
}

/// First 10 hex digits of SHA-256 over the parts, separated so ("ab","c") ≠ ("a","bc").
pub fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    let digest = h.finalize();
    digest.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

/// Full hex SHA-256 (config-hash annotation).
pub fn hash_hex(data: &str) -> String {
    Sha256::digest(data.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Metadata of a child: name, namespace, labels, owner reference.
pub(crate) fn metadata(mc: &MailCluster, name: &str, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(namespace(mc).to_string()),
        labels: Some(component_labels(mc, component)),
        // The owner reference needs the resource's uid; `render` without a cluster has
        // none, and then the objects are printed without one.
        owner_references: mc.controller_owner_ref(&()).map(|owner| vec![owner]),
        ..Default::default()
    }
}
