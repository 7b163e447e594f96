//! The mail pods and what surrounds them: ConfigMap, Deployments, Services, HPAs,
//! PDBs, NetworkPolicy as typed k8s-openapi objects; Certificate and ServiceMonitor
//! (kinds of optional CRDs k8s-openapi does not have) as JSON checked by the schema
//! test.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HPAScalingPolicy, HPAScalingRules, HorizontalPodAutoscaler,
    HorizontalPodAutoscalerBehavior, HorizontalPodAutoscalerSpec, MetricIdentifier, MetricSpec, MetricTarget,
    PodsMetricSource, ResourceMetricSource,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, HTTPGetAction, KeyToPath, Lifecycle, LifecycleHandler, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceFieldSelector, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecretVolumeSource, SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec, SleepAction,
    Sysctl, TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mailcluster_api::{IssuerRef, MailCluster, Protocol, ServiceType, TlsSpec};
use serde_json::{Value, json};

use super::metadata;
use super::pod_config as config;
use crate::budget::{ProtocolBudget, SURGE};
use crate::keys;
use crate::names::{self, ADMIN_PORT, CONFIG_DIR, DATA_DIR, TLS_DIR};

/// Seconds the pod keeps serving after it is marked for deletion, before SIGTERM:
/// endpoint removal must reach every kube-proxy and load balancer first, or new
/// connections keep arriving at a listener that is about to close.
pub const PRE_STOP_SLEEP_SECONDS: i64 = 5;
/// Non-root user of the image (distroless `nonroot`).
pub const RUN_AS_USER: i64 = 65532;

pub(crate) fn runtime_default_seccomp() -> Option<SeccompProfile> {
    Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() })
}

pub(crate) fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS_USER),
        run_as_group: Some(RUN_AS_USER),
        fs_group: Some(RUN_AS_USER),
        seccomp_profile: runtime_default_seccomp(),
        ..Default::default()
    }
}

/// The mail pods' sysctls from `spec.tuning`; None without any, so a cluster
/// that asks for none has pods any node runs.
pub fn pod_sysctls(mc: &MailCluster) -> Option<Vec<Sysctl>> {
    let sysctls: Vec<Sysctl> =
        mc.spec.sysctls().into_iter().map(|(name, value)| Sysctl { name: name.into(), value }).collect();
    (!sysctls.is_empty()).then_some(sysctls)
}

pub(crate) fn container_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
        seccomp_profile: runtime_default_seccomp(),
        ..Default::default()
    }
}

pub(crate) fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
}

pub(crate) fn secret_env(name: &str, r: &mailcluster_api::SecretKeyRef) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: r.name.clone(),
                key: r.key.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The server's `worker_threads` from the container's CPU request, in whole
/// cores rounded up (the kubelet's rounding; 0 when nothing is requested: then
/// the server takes one per CPU it may use). Without a CPU limit a pod sees
/// every core of its node, and a runtime with a thread per core of a large node
/// only adds switching to a pod that was given a fraction of one.
fn worker_threads_env() -> EnvVar {
    EnvVar {
        name: "MAILCLUSTER_WORKER_THREADS".into(),
        value_from: Some(EnvVarSource {
            resource_field_ref: Some(ResourceFieldSelector {
                resource: "requests.cpu".into(),
                divisor: Some(Quantity("1".into())),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The server's `net.memory_limit_bytes` from the container's memory limit (the
/// node's allocatable memory when it has none), which sizes the pod's budget for
/// client input in flight: the pod refuses transfers with a temporary error
/// before it would reach the limit and be killed.
fn memory_limit_env() -> EnvVar {
    EnvVar {
        name: "MAILCLUSTER_NET__MEMORY_LIMIT_BYTES".into(),
        value_from: Some(EnvVarSource {
            resource_field_ref: Some(ResourceFieldSelector {
                resource: "limits.memory".into(),
                divisor: Some(Quantity("1".into())),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Database and Redis URLs, from Secrets: never in the ConfigMap, never in the spec.
pub(crate) fn secret_envs(mc: &MailCluster) -> Vec<EnvVar> {
    vec![
        secret_env("MAILCLUSTER_DATABASE_URL", &mc.spec.postgres.url_secret_ref),
        secret_env("MAILCLUSTER_REDIS_URL", &mc.spec.redis.url_secret_ref),
    ]
}

/// The cluster's own keys, from the Secret the operator made (`keys.rs`): the
/// cache's MAC key for every mail pod, the group-commit key for the pods that
/// hand deliveries to each other. Not optional: a pod without its keys must not
/// start.
fn cluster_key_envs(mc: &MailCluster, p: Protocol) -> Vec<EnvVar> {
    let from_keys = |var: &str, key: &str| EnvVar {
        name: var.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: names::keys_secret(mc),
                key: key.into(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut envs = vec![from_keys("MAILCLUSTER_CACHE__MAC_KEY", keys::CACHE_MAC_KEY)];
    if names::groups_commits(mc, p) {
        envs.push(from_keys("MAILCLUSTER_SMTP__GROUP_COMMIT_SECRET", keys::GROUP_COMMIT_KEY));
    }
    envs
}

pub(crate) fn tls_secret_name(mc: &MailCluster) -> Option<String> {
    let tls = mc.spec.tls.as_ref()?;
    Some(tls.secret_name.clone().unwrap_or_else(|| names::tls_secret_from_issuer(mc)))
}

/// The volume of one key of a ConfigMap.
pub(crate) fn config_map_volume(name: &str, config_map: String, key: &str) -> Volume {
    Volume {
        name: name.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map,
            items: Some(vec![KeyToPath { key: key.into(), path: key.into(), ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// Writable scratch space: the root filesystem is read-only.
pub(crate) fn scratch_volumes() -> Vec<Volume> {
    let empty_dir = |name: &str, size: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(size.into())),
            ..Default::default()
        }),
        ..Default::default()
    };
    vec![empty_dir("tmp", "64Mi"), empty_dir("data", "1Gi")]
}

pub(crate) fn scratch_mounts() -> Vec<VolumeMount> {
    vec![mount("tmp", "/tmp", false), mount("data", DATA_DIR, false)]
}

/// Requests and a memory limit, e.g. `resources("100m", "128Mi", "512Mi")`.
pub(crate) fn resources(cpu: &str, memory: &str, memory_limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity(memory.into())),
        ])),
        limits: Some(BTreeMap::from([("memory".to_string(), Quantity(memory_limit.into()))])),
        ..Default::default()
    }
}

fn match_labels(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector { match_labels: Some(labels), ..Default::default() }
}

pub fn service_account(mc: &MailCluster) -> ServiceAccount {
    ServiceAccount {
        metadata: metadata(mc, names::cluster_name(mc), "server"),
        // The mail pods never talk to the Kubernetes API.
        automount_service_account_token: Some(false),
        ..Default::default()
    }
}

pub fn config_map(mc: &MailCluster) -> ConfigMap {
    let mut data = BTreeMap::new();
    for p in mc.spec.enabled_protocols().into_iter().map(Some).chain([None]) {
        // Rendering a struct of strings and numbers to TOML cannot fail.
        let text = config::render_toml(mc, p).unwrap_or_default();
        data.insert(config::config_key(p), text);
    }
    ConfigMap {
        metadata: metadata(mc, &names::config_map(mc), "config"),
        data: Some(data),
        ..Default::default()
    }
}

fn pod_labels(mc: &MailCluster, p: Protocol) -> BTreeMap<String, String> {
    let mut l = names::component_labels(mc, p.name());
    l.extend(names::all_pods_selector(mc));
    l
}

fn http_probe(path: &str, period: i32, timeout: Option<i32>, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("admin".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: timeout,
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

pub fn deployment(
    mc: &MailCluster,
    p: Protocol,
    image: &str,
    config_map: &ConfigMap,
    budget: &ProtocolBudget,
) -> Deployment {
    let spec = &mc.spec;
    let ps = spec.protocol(p);
    let name = names::protocol_object(mc, p);
    let key = config::config_key(Some(p));
    // Pods restart when their own config file changes, not when another protocol's does.
    let config_text = config_map.data.as_ref().and_then(|d| d.get(&key)).map_or("", String::as_str);
    let config_hash = names::hash_hex(config_text);
    let listeners: Vec<&str> = p.listeners().iter().map(|l| l.name()).collect();

    let mut envs = vec![
        env("MAILCLUSTER_PROTOCOLS", listeners.join(",")),
        env("MAILCLUSTER_DATA_DIR", DATA_DIR),
        worker_threads_env(),
        memory_limit_env(),
    ];
    envs.extend(secret_envs(mc));
    let mut volumes = vec![config_map_volume("config", names::config_map(mc), &key)];
    volumes.extend(scratch_volumes());
    let mut mounts = vec![mount("config", CONFIG_DIR, true)];
    mounts.extend(scratch_mounts());
    if let Some(secret) = tls_secret_name(mc) {
        envs.push(env("MAILCLUSTER_TLS_CERT", format!("{TLS_DIR}/tls.crt")));
        envs.push(env("MAILCLUSTER_TLS_KEY", format!("{TLS_DIR}/tls.key")));
        volumes.push(Volume {
            name: "tls".into(),
            secret: Some(SecretVolumeSource { secret_name: Some(secret), ..Default::default() }),
            ..Default::default()
        });
        mounts.push(mount("tls", TLS_DIR, true));
    }
    if matches!(p, Protocol::Smtp | Protocol::Submission) {
        for (i, key) in spec.dkim.iter().enumerate() {
            let name = format!("dkim-{i}");
            volumes.push(Volume {
                name: name.clone(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(key.secret_name.clone()),
                    items: Some(vec![KeyToPath {
                        key: key.secret_key.clone(),
                        path: "dkim.key".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            });
            let dir = names::dkim_key_path(&key.domain);
            let dir = dir.parent().map(|d| d.display().to_string()).unwrap_or_default();
            mounts.push(mount(&name, &dir, true));
        }
        if let Some(secret) = spec.relay.as_ref().and_then(|r| r.smarthost_secret_name.as_ref()) {
            let from_secret = |var: &str, key: &str| EnvVar {
                name: var.into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: secret.clone(),
                        key: key.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            envs.push(from_secret("MAILCLUSTER_RELAY__SMARTHOST_USERNAME", "username"));
            envs.push(from_secret("MAILCLUSTER_RELAY__SMARTHOST_PASSWORD", "password"));
        }
    }
    if let Some(r) = super::pod_config::rspamd_of(mc, Some(p)) {
        // The operator's rspamd: the password it made; the user's: theirs.
        let secret = match (&r.deploy, &r.password_secret_ref) {
            (Some(_), _) => Some(mailcluster_api::SecretKeyRef {
                name: names::rspamd(mc),
                key: keys::RSPAMD_PASSWORD.into(),
            }),
            (None, Some(s)) => {
                Some(mailcluster_api::SecretKeyRef { name: s.name.clone(), key: s.key.clone() })
            }
            (None, None) => None,
        };
        if let Some(secret) = secret {
            envs.push(secret_env("MAILCLUSTER_FILTER__RSPAMD__PASSWORD", &secret));
        }
    }
    envs.extend(cluster_key_envs(mc, p));
    let port = |name: &str, number: i32| ContainerPort {
        name: Some(name.into()),
        container_port: number,
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let mut ports: Vec<ContainerPort> =
        p.listeners().iter().map(|l| port(l.name(), l.container_port())).collect();
    ports.push(port("admin", ADMIN_PORT));
    if names::groups_commits(mc, p) {
        ports.push(port("group-commit", names::GROUP_COMMIT_PORT));
    }

    let selector = names::selector_labels(mc, p);
    let spread = |key: &str| TopologySpreadConstraint {
        max_skew: 1,
        topology_key: key.into(),
        // Spread when possible; never leave a pod pending because a zone is full.
        when_unsatisfiable: "ScheduleAnyway".into(),
        label_selector: Some(match_labels(selector.clone())),
        ..Default::default()
    };
    let grace = i64::from(spec.shutdown_grace_seconds);
    let pull_policy = spec.image.pull_policy.map_or("IfNotPresent", |p| match p {
        mailcluster_api::PullPolicy::Always => "Always",
        mailcluster_api::PullPolicy::IfNotPresent => "IfNotPresent",
        mailcluster_api::PullPolicy::Never => "Never",
    });
    let container = Container {
        name: "mailcluster".into(),
        image: Some(image.into()),
        image_pull_policy: Some(pull_policy.into()),
        args: Some(vec!["serve".into(), "--config".into(), format!("{CONFIG_DIR}/{key}")]),
        env: Some(envs),
        ports: Some(ports),
        resources: Some(ps.resources.clone().unwrap_or_else(|| resources("100m", "128Mi", "512Mi"))),
        security_context: Some(container_security_context()),
        volume_mounts: Some(mounts),
        startup_probe: Some(http_probe("/healthz", 2, None, 60)),
        readiness_probe: Some(http_probe("/readyz", 5, Some(2), 2)),
        liveness_probe: Some(http_probe("/healthz", 10, Some(3), 3)),
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction { seconds: PRE_STOP_SLEEP_SECONDS }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels(mc, p)),
            annotations: Some(BTreeMap::from([
                (names::CONFIG_HASH_ANNOTATION.to_string(), config_hash),
                (names::IMAGE_ANNOTATION.to_string(), image.to_string()),
            ])),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(names::cluster_name(mc).to_string()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            security_context: Some(PodSecurityContext { sysctls: pod_sysctls(mc), ..pod_security_context() }),
            // preStop sleep + the server's own drain (shutdown_grace_secs) + margin
            // for the goodbye lines and socket close: the kubelet must not SIGKILL a
            // draining session.
            termination_grace_period_seconds: Some(PRE_STOP_SLEEP_SECONDS + grace + 5),
            topology_spread_constraints: Some(vec![
                spread("kubernetes.io/hostname"),
                spread("topology.kubernetes.io/zone"),
            ]),
            containers: vec![container],
            volumes: Some(volumes),
            ..Default::default()
        }),
    };
    Deployment {
        metadata: metadata(mc, &name, p.name()),
        spec: Some(DeploymentSpec {
            // With an HPA the replica count is the HPA's: leaving it out of the
            // applied object means server-side apply never resets what the
            // autoscaler chose.
            replicas: (!budget.autoscaled).then_some(budget.max_replicas),
            revision_history_limit: Some(5),
            selector: match_labels(selector),
            // maxUnavailable 0: capacity never drops during a rollout; the surge pod
            // is counted in the connection budget.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(SURGE)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn service(mc: &MailCluster, p: Protocol) -> Service {
    let svc = &mc.spec.protocol(p).service;
    let ports = p
        .listeners()
        .iter()
        .map(|l| ServicePort {
            name: Some(l.name().into()),
            port: svc.ports.iter().find(|o| o.name == *l).map_or(l.standard_port(), |o| o.port),
            target_port: Some(IntOrString::String(l.name().into())),
            protocol: Some("TCP".into()),
            ..Default::default()
        })
        .collect();
    let mut meta = metadata(mc, &names::protocol_object(mc, p), p.name());
    if !svc.annotations.is_empty() {
        meta.annotations = Some(svc.annotations.clone());
    }
    let type_ = match svc.type_ {
        ServiceType::ClusterIP => "ClusterIP",
        ServiceType::NodePort => "NodePort",
        ServiceType::LoadBalancer => "LoadBalancer",
    };
    let mut spec = ServiceSpec {
        type_: Some(type_.into()),
        selector: Some(names::selector_labels(mc, p)),
        ports: Some(ports),
        ..Default::default()
    };
    if svc.type_ == ServiceType::LoadBalancer {
        // Local: no second hop through another node, so the pod sees the client's real
        // address (rate limits, logs, SPF) and health checks skip nodes without pods.
        spec.external_traffic_policy = Some("Local".into());
        if !svc.load_balancer_source_ranges.is_empty() {
            spec.load_balancer_source_ranges = Some(svc.load_balancer_source_ranges.clone());
        }
    }
    Service { metadata: meta, spec: Some(spec), ..Default::default() }
}

/// Headless Service over the ready pods of a delivering protocol: the pods look
/// its name up and hand their deliveries to the lowest address (group commit
/// across pods). Not-ready pods are left out, so a draining pod stops leading.
pub fn group_commit_service(mc: &MailCluster, p: Protocol) -> Service {
    Service {
        metadata: metadata(mc, &names::group_commit_service(mc, p), p.name()),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(names::selector_labels(mc, p)),
            ports: Some(vec![ServicePort {
                name: Some("group-commit".into()),
                port: names::GROUP_COMMIT_PORT,
                target_port: Some(IntOrString::String("group-commit".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// ClusterIP Service over the admin port of every pod: the scrape target. Kept apart
/// from the mail Services so a LoadBalancer never exposes `/metrics`.
pub fn metrics_service(mc: &MailCluster) -> Service {
    Service {
        metadata: metadata(mc, &names::metrics_service(mc), "metrics"),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(names::all_pods_selector(mc)),
            ports: Some(vec![ServicePort {
                name: Some("metrics".into()),
                port: ADMIN_PORT,
                target_port: Some(IntOrString::String("admin".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn hpa(mc: &MailCluster, p: Protocol, budget: &ProtocolBudget) -> HorizontalPodAutoscaler {
    let a = mc.spec.autoscaling_for(p);
    let name = names::protocol_object(mc, p);
    let pods_average = |metric: &str, value: String| MetricSpec {
        type_: "Pods".into(),
        pods: Some(PodsMetricSource {
            metric: MetricIdentifier { name: metric.into(), ..Default::default() },
            target: MetricTarget {
                type_: "AverageValue".into(),
                average_value: Some(Quantity(value)),
                ..Default::default()
            },
        }),
        ..Default::default()
    };
    let mut metrics = Vec::new();
    if let Some(cpu) = a.cpu_target() {
        metrics.push(MetricSpec {
            type_: "Resource".into(),
            resource: Some(ResourceMetricSource {
                name: "cpu".into(),
                target: MetricTarget {
                    type_: "Utilization".into(),
                    average_utilization: Some(cpu),
                    ..Default::default()
                },
            }),
            ..Default::default()
        });
    }
    if let Some(sat) = a.pool_saturation_target() {
        // mail_pool_saturation is 0..1; the spec says percent. 70 % → "700m".
        metrics.push(pods_average("mail_pool_saturation", format!("{}m", sat * 10)));
    }
    if let Some(conns) = a.connections_per_pod {
        metrics.push(pods_average("mail_connections_active", conns.to_string()));
    }
    let policy = |type_: &str, value: i32, period: i32| HPAScalingPolicy {
        type_: type_.into(),
        value,
        period_seconds: period,
    };
    HorizontalPodAutoscaler {
        metadata: metadata(mc, &name, p.name()),
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".into()),
                kind: "Deployment".into(),
                name,
            },
            min_replicas: Some(budget.min_replicas),
            max_replicas: budget.max_replicas,
            metrics: Some(metrics),
            behavior: Some(HorizontalPodAutoscalerBehavior {
                // Load arrives in bursts (connect storms after an outage): scale up at once.
                scale_up: Some(HPAScalingRules {
                    stabilization_window_seconds: Some(0),
                    select_policy: Some("Max".into()),
                    policies: Some(vec![policy("Percent", 100, 30), policy("Pods", 4, 30)]),
                    ..Default::default()
                }),
                // Scaling down ends long-lived IMAP sessions (IDLE clients reconnect):
                // one pod at a time, after five calm minutes.
                scale_down: Some(HPAScalingRules {
                    stabilization_window_seconds: Some(300),
                    select_policy: Some("Min".into()),
                    policies: Some(vec![policy("Pods", 1, 120)]),
                    ..Default::default()
                }),
            }),
        }),
        ..Default::default()
    }
}

pub fn pdb(mc: &MailCluster, p: Protocol) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: metadata(mc, &names::protocol_object(mc, p), p.name()),
        spec: Some(PodDisruptionBudgetSpec {
            // One pod at a time through voluntary disruptions (node drains), so drains
            // never take a whole protocol down; never blocks a single-replica drain.
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(match_labels(names::selector_labels(mc, p))),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn network_policy(mc: &MailCluster) -> NetworkPolicy {
    let tcp = |port: i32| NetworkPolicyPort {
        protocol: Some("TCP".into()),
        port: Some(IntOrString::Int(port)),
        ..Default::default()
    };
    let mail_ports = mc
        .spec
        .enabled_protocols()
        .iter()
        .flat_map(|p| p.listeners())
        .map(|l| tcp(l.container_port()))
        .collect();
    let np = &mc.spec.network_policy;
    let namespaces = |labels: BTreeMap<String, String>| NetworkPolicyPeer {
        namespace_selector: Some(match_labels(labels)),
        ..Default::default()
    };
    // Not the cluster's own namespace: what runs there (stress Jobs, other
    // apps) has no business with metrics or health.
    let mut metrics_from: Vec<NetworkPolicyPeer> = np
        .metrics_namespaces
        .iter()
        .map(|ns| namespaces(BTreeMap::from([("kubernetes.io/metadata.name".to_string(), ns.clone())])))
        .collect();
    if !np.metrics_namespace_labels.is_empty() {
        metrics_from.push(namespaces(np.metrics_namespace_labels.clone()));
    }
    let grouping: Vec<String> = mc
        .spec
        .enabled_protocols()
        .into_iter()
        .filter(|p| names::groups_commits(mc, *p))
        .map(|p| p.name().to_string())
        .collect();
    let group_commit = !grouping.is_empty();
    let mut ingress = vec![
        // Mail is public: anyone may connect to the mail listeners.
        NetworkPolicyIngressRule { ports: Some(mail_ports), ..Default::default() },
    ];
    // The admin port (metrics, health) only from the namespaces named; none
    // named: from nowhere (the kubelet's probes are not subject to the policy).
    if !metrics_from.is_empty() {
        ingress
            .push(NetworkPolicyIngressRule { from: Some(metrics_from), ports: Some(vec![tcp(ADMIN_PORT)]) });
    }
    if group_commit {
        // Deliveries handed to the group-commit leader: from this cluster's
        // delivering pods only.
        let mut delivering = match_labels(names::all_pods_selector(mc));
        delivering.match_expressions = Some(vec![LabelSelectorRequirement {
            key: names::COMPONENT_LABEL.into(),
            operator: "In".into(),
            values: Some(grouping),
        }]);
        ingress.push(NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer { pod_selector: Some(delivering), ..Default::default() }]),
            ports: Some(vec![tcp(names::GROUP_COMMIT_PORT)]),
        });
    }
    // DNS for MX lookups and sender authentication, SMTP for the relay, and the
    // stores, to any address: where they live is not the operator's to know.
    let egress = mc.spec.network_policy.restrict_egress.then(|| {
        let udp = NetworkPolicyPort {
            protocol: Some("UDP".into()),
            port: Some(IntOrString::Int(53)),
            ..Default::default()
        };
        let mut ports = vec![udp, tcp(53), tcp(25), tcp(465), tcp(587), tcp(5432), tcp(6379), tcp(26379)];
        // Followers reach their group-commit leader (a pod of this cluster).
        if group_commit {
            ports.push(tcp(names::GROUP_COMMIT_PORT));
        }
        ports.extend(mc.spec.network_policy.egress_ports.iter().map(|p| tcp(*p)));
        // The content filter, at the port its URL names.
        if let Some(port) = mc
            .spec
            .filter
            .as_ref()
            .and_then(|f| f.rspamd.as_ref())
            .map(|r| url_port(&config::rspamd_url(mc, r)))
            && !ports.contains(&tcp(port))
        {
            ports.push(tcp(port));
        }
        vec![NetworkPolicyEgressRule { ports: Some(ports), to: None }]
    });
    NetworkPolicy {
        metadata: metadata(mc, names::cluster_name(mc), "server"),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(match_labels(names::all_pods_selector(mc))),
            policy_types: Some(if egress.is_some() {
                vec!["Ingress".into(), "Egress".into()]
            } else {
                vec!["Ingress".into()]
            }),
            ingress: Some(ingress),
            egress,
        }),
    }
}

/// The port of an `http://host[:port]/…` URL (80 when it names none).
fn url_port(url: &str) -> i32 {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or("");
    // An IPv6 literal's colons are inside its brackets.
    let after_host = authority.rsplit_once(']').map_or(authority, |(_, tail)| tail);
    after_host.rsplit_once(':').and_then(|(_, port)| port.parse().ok()).unwrap_or(80)
}

/// cert-manager's Certificate: a kind of an optional CRD, written as JSON.
pub fn certificate(mc: &MailCluster, tls: &TlsSpec, issuer: &IssuerRef) -> Value {
    let mut dns = vec![mc.spec.hostname()];
    for d in mc.spec.domains.iter().chain(&tls.dns_names) {
        if !dns.contains(d) {
            dns.push(d.clone());
        }
    }
    json!({
        "metadata": metadata(mc, &names::tls_secret_from_issuer(mc), "tls"),
        "spec": {
            "secretName": names::tls_secret_from_issuer(mc),
            "dnsNames": dns,
            "issuerRef": {"name": issuer.name, "kind": issuer.kind, "group": issuer.group},
            // The pods reload changed files; a fresh key on each renewal costs nothing.
            "privateKey": {"rotationPolicy": "Always"},
        },
    })
}

/// Prometheus operator's ServiceMonitor: a kind of an optional CRD, written as JSON.
pub fn service_monitor(mc: &MailCluster) -> Value {
    json!({
        "metadata": metadata(mc, names::cluster_name(mc), "metrics"),
        "spec": {
            "selector": {"matchLabels": names::component_labels(mc, "metrics")},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": mc.spec.monitoring.interval}],
        },
    })
}
