//! rspamd run by the operator (`spec.filter.rspamd.deploy`): a Deployment of
//! the user's rspamd image and a Redis of its own, each with a Service and,
//! when NetworkPolicy is on, a policy letting in only who needs it (the mail
//! pods to rspamd, rspamd to its Redis).
//!
//! rspamd's configuration is the image's, with a few files mounted over it one
//! by one (`subPath`, so the image's other `local.d/` files stay): the
//! controller worker on all addresses with no password-free address (the pods
//! scan and teach through it, with the password), as many of its processes as
//! `workers`, the `http_headers` module on (the pods pass their SPF, DKIM and
//! DMARC results along), logs to the console, and the Redis server. Passwords
//! are never in the ConfigMap: the mounted files include them from the Secret
//! the operator makes (`keys::ensure_rspamd`), which this pure build only
//! names.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, HTTPGetAction,
    KeyToPath, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SecretVolumeSource, SecurityContext,
    Service, ServicePort, ServiceSpec, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mailcluster_api::{MailCluster, RspamdDeploySpec, SecretKeyRef};

use super::metadata;
use super::workload::{container_security_context, resources, runtime_default_seccomp, secret_env};
use crate::keys;
use crate::names::{self, RSPAMD_PORT};

const RSPAMD: &str = "rspamd";
const REDIS: &str = "rspamd-redis";
const REDIS_PORT: i32 = 6379;
/// Where the Secret's include files are mounted in rspamd's container.
pub const SECRET_DIR: &str = "/etc/mailcluster-rspamd";
/// The Redis server's settings: a key of rspamd's ConfigMap, mounted here.
const REDIS_CONFIG: &str = "redis-server.conf";
const REDIS_CONFIG_DIR: &str = "/etc/mailcluster-redis";
/// User of the Redis image (the official images' `redis`): it runs as that
/// user from the start, so it needs no capability to switch to it.
const REDIS_USER: i64 = 999;

/// The files mounted over the image's configuration: ConfigMap key and its
/// path under the configuration directory.
fn files(mc: &MailCluster, d: &RspamdDeploySpec) -> Vec<(&'static str, &'static str, String)> {
    vec![
        (
            "worker-controller.inc",
            "override.d/worker-controller.inc",
            format!(
                "bind_socket = \"*:{RSPAMD_PORT}\";\ncount = {};\n# Every client gives the password, local ones too.\n\
                 secure_ip = [];\n.include \"{SECRET_DIR}/{}\"\n",
                d.workers,
                keys::RSPAMD_CONTROLLER_INCLUDE
            ),
        ),
        ("http_headers.conf", "local.d/http_headers.conf", "enabled = true;\n".into()),
        ("logging.inc", "local.d/logging.inc", "type = \"console\";\nlevel = \"notice\";\n".into()),
        (
            "redis.conf",
            "local.d/redis.conf",
            format!(
                "servers = \"{}:{REDIS_PORT}\";\n.include \"{SECRET_DIR}/{}\"\n",
                names::rspamd_redis(mc),
                keys::RSPAMD_REDIS_INCLUDE
            ),
        ),
    ]
}

pub fn config_map(mc: &MailCluster, d: &RspamdDeploySpec) -> ConfigMap {
    let mut data: BTreeMap<String, String> =
        files(mc, d).into_iter().map(|(key, _, text)| (key.to_string(), text)).collect();
    // Append-only file in the emptyDir; reachable through its Service (the
    // password and the NetworkPolicy guard it, not loopback-only mode).
    data.insert(
        REDIS_CONFIG.into(),
        format!("port {REDIS_PORT}\ndir /data\nappendonly yes\nprotected-mode no\nsave \"\"\n"),
    );
    ConfigMap { metadata: metadata(mc, &names::rspamd(mc), RSPAMD), data: Some(data), ..Default::default() }
}

fn tcp_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

fn labels(mc: &MailCluster, component: &str) -> BTreeMap<String, String> {
    let mut l = names::component_labels(mc, component);
    l.extend(names::selector_labels_for(mc, component));
    l
}

fn pod_meta(mc: &MailCluster, component: &str, config_hash: Option<String>) -> ObjectMeta {
    ObjectMeta {
        labels: Some(labels(mc, component)),
        annotations: config_hash.map(|h| BTreeMap::from([(names::CONFIG_HASH_ANNOTATION.to_string(), h)])),
        ..Default::default()
    }
}

pub fn deployment(mc: &MailCluster, d: &RspamdDeploySpec, config_map: &ConfigMap) -> Deployment {
    let files = files(mc, d);
    let config_hash = names::hash_hex(&format!("{:?}", config_map.data));
    let dir = d.config_dir.trim_end_matches('/');
    let mut mounts: Vec<VolumeMount> = files
        .iter()
        .map(|(key, path, _)| VolumeMount {
            name: "config".into(),
            mount_path: format!("{dir}/{path}"),
            sub_path: Some((*key).into()),
            read_only: Some(true),
            ..Default::default()
        })
        .collect();
    mounts.push(VolumeMount {
        name: "secrets".into(),
        mount_path: SECRET_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    });
    let ping = |failures: i32, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/ping".into()),
            port: IntOrString::String("controller".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(5),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    let container = Container {
        name: RSPAMD.into(),
        image: Some(d.image.clone()),
        ports: Some(vec![tcp_port("controller", RSPAMD_PORT)]),
        volume_mounts: Some(mounts),
        resources: Some(d.resources.clone().unwrap_or_else(|| resources("500m", "512Mi", "1Gi"))),
        // Loading rules (and compiling them on a first start) takes a while.
        startup_probe: Some(ping(60, 5)),
        readiness_probe: Some(ping(3, 10)),
        liveness_probe: Some(ping(6, 20)),
        // The image decides its user (rspamd images start as root and switch
        // to their own user): no escalation beyond what it starts with.
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            seccomp_profile: runtime_default_seccomp(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let volumes = vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource { name: names::rspamd(mc), ..Default::default() }),
            ..Default::default()
        },
        Volume {
            name: "secrets".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names::rspamd(mc)),
                items: Some(
                    [keys::RSPAMD_CONTROLLER_INCLUDE, keys::RSPAMD_REDIS_INCLUDE]
                        .into_iter()
                        .map(|k| KeyToPath { key: k.into(), path: k.into(), ..Default::default() })
                        .collect(),
                ),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    Deployment {
        metadata: metadata(mc, &names::rspamd(mc), RSPAMD),
        spec: Some(DeploymentSpec {
            replicas: Some(d.replicas),
            selector: LabelSelector {
                match_labels: Some(names::selector_labels_for(mc, RSPAMD)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(pod_meta(mc, RSPAMD, Some(config_hash))),
                spec: Some(PodSpec {
                    // rspamd never talks to the Kubernetes API.
                    automount_service_account_token: Some(false),
                    containers: vec![container],
                    volumes: Some(volumes),
                    security_context: Some(PodSecurityContext {
                        seccomp_profile: runtime_default_seccomp(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn redis_deployment(mc: &MailCluster, d: &RspamdDeploySpec) -> Deployment {
    let container = Container {
        name: "redis".into(),
        image: Some(d.redis_image.clone()),
        command: Some(vec!["redis-server".into()]),
        // `$(VAR)` is expanded by the kubelet from the environment below; the
        // rest is in a file (YAML 1.1 readers would take a bare `yes` for true).
        args: Some(vec![
            format!("{REDIS_CONFIG_DIR}/{REDIS_CONFIG}"),
            "--requirepass".into(),
            "$(REDIS_PASSWORD)".into(),
        ]),
        env: Some(vec![secret_env(
            "REDIS_PASSWORD",
            &SecretKeyRef { name: names::rspamd(mc), key: keys::RSPAMD_REDIS_PASSWORD.into() },
        )]),
        ports: Some(vec![tcp_port("redis", REDIS_PORT)]),
        volume_mounts: Some(vec![
            VolumeMount { name: "data".into(), mount_path: "/data".into(), ..Default::default() },
            VolumeMount {
                name: "config".into(),
                mount_path: REDIS_CONFIG_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
        ]),
        resources: Some(resources("100m", "128Mi", "512Mi")),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("redis".into()),
                ..Default::default()
            }),
            period_seconds: Some(10),
            ..Default::default()
        }),
        // The mail pods' restrictions, as the image's own user.
        security_context: Some(SecurityContext {
            run_as_user: Some(REDIS_USER),
            run_as_group: Some(REDIS_USER),
            ..container_security_context()
        }),
        ..Default::default()
    };
    Deployment {
        metadata: metadata(mc, &names::rspamd_redis(mc), REDIS),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            // One writer of the append-only file at a time.
            strategy: Some(DeploymentStrategy { type_: Some("Recreate".into()), ..Default::default() }),
            selector: LabelSelector {
                match_labels: Some(names::selector_labels_for(mc, REDIS)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(pod_meta(mc, REDIS, None)),
                spec: Some(PodSpec {
                    automount_service_account_token: Some(false),
                    containers: vec![container],
                    volumes: Some(vec![
                        Volume {
                            name: "data".into(),
                            empty_dir: Some(EmptyDirVolumeSource {
                                size_limit: Some(Quantity("1Gi".into())),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                        Volume {
                            name: "config".into(),
                            config_map: Some(ConfigMapVolumeSource {
                                name: names::rspamd(mc),
                                items: Some(vec![KeyToPath {
                                    key: REDIS_CONFIG.into(),
                                    path: REDIS_CONFIG.into(),
                                    ..Default::default()
                                }]),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    ]),
                    security_context: Some(PodSecurityContext {
                        fs_group: Some(REDIS_USER),
                        seccomp_profile: runtime_default_seccomp(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn service(mc: &MailCluster, name: String, component: &str, port_name: &str, port: i32) -> Service {
    Service {
        metadata: metadata(mc, &name, component),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(names::selector_labels_for(mc, component)),
            ports: Some(vec![ServicePort {
                name: Some(port_name.into()),
                port,
                target_port: Some(IntOrString::String(port_name.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn rspamd_service(mc: &MailCluster) -> Service {
    service(mc, names::rspamd(mc), RSPAMD, "controller", RSPAMD_PORT)
}

pub fn redis_service(mc: &MailCluster) -> Service {
    service(mc, names::rspamd_redis(mc), REDIS, "redis", REDIS_PORT)
}

/// Ingress to `component`'s pods on `port` from the pods `from` selects only.
fn ingress_policy(
    mc: &MailCluster,
    name: String,
    component: &str,
    from: BTreeMap<String, String>,
    port: i32,
) -> NetworkPolicy {
    NetworkPolicy {
        metadata: metadata(mc, &name, component),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(names::selector_labels_for(mc, component)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(LabelSelector { match_labels: Some(from), ..Default::default() }),
                    ..Default::default()
                }]),
                ports: Some(vec![NetworkPolicyPort {
                    protocol: Some("TCP".into()),
                    port: Some(IntOrString::Int(port)),
                    ..Default::default()
                }]),
            }]),
            egress: None,
        }),
    }
}

/// rspamd takes connections from this cluster's mail pods only.
pub fn rspamd_network_policy(mc: &MailCluster) -> NetworkPolicy {
    ingress_policy(mc, names::rspamd(mc), RSPAMD, names::all_pods_selector(mc), RSPAMD_PORT)
}

/// rspamd's Redis takes connections from rspamd only.
pub fn redis_network_policy(mc: &MailCluster) -> NetworkPolicy {
    ingress_policy(mc, names::rspamd_redis(mc), REDIS, names::selector_labels_for(mc, RSPAMD), REDIS_PORT)
}
