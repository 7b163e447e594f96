//! The mail pods and what surrounds them: ConfigMap, Deployments, Services, HPAs,
//! PDBs, NetworkPolicy, Certificate, ServiceMonitor.

use std::collections::BTreeMap;

use mailcluster_api::{IssuerRef, Listener, MailCluster, Protocol, ServiceType, TlsSpec};
use serde_json::{Value, json};

use super::metadata;
use super::pod_config as config;
use crate::budget::{ProtocolBudget, SURGE};
use crate::names::{self, ADMIN_PORT, CONFIG_DIR, DATA_DIR, TLS_DIR};

/// Seconds the pod keeps serving after it is marked for deletion, before SIGTERM:
/// endpoint removal must reach every kube-proxy and load balancer first, or new
/// connections keep arriving at a listener that is about to close.
pub const PRE_STOP_SLEEP_SECONDS: i64 = 5;
/// Non-root user of the image (distroless `nonroot`).
pub const RUN_AS_USER: i64 = 65532;

pub(crate) fn pod_security_context() -> Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

pub(crate) fn container_security_context() -> Value {
    json!({
        "runAsNonRoot": true,
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

fn secret_env(name: &str, r: &mailcluster_api::SecretKeyRef) -> Value {
    json!({"name": name, "valueFrom": {"secretKeyRef": {"name": r.name, "key": r.key}}})
}

/// Database and Redis URLs, from Secrets: never in the ConfigMap, never in the spec.
pub(crate) fn secret_envs(mc: &MailCluster) -> Vec<Value> {
    vec![
        secret_env("MAILCLUSTER_DATABASE_URL", &mc.spec.postgres.url_secret_ref),
        secret_env("MAILCLUSTER_REDIS_URL", &mc.spec.redis.url_secret_ref),
    ]
}

pub(crate) fn tls_secret_name(mc: &MailCluster) -> Option<String> {
    let tls = mc.spec.tls.as_ref()?;
    Some(tls.secret_name.clone().unwrap_or_else(|| names::tls_secret_from_issuer(mc)))
}

/// Writable scratch space: the root filesystem is read-only.
pub(crate) fn scratch_volumes() -> Vec<Value> {
    vec![
        json!({"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}),
        json!({"name": "data", "emptyDir": {"sizeLimit": "1Gi"}}),
    ]
}

pub(crate) fn scratch_mounts() -> Vec<Value> {
    vec![json!({"name": "tmp", "mountPath": "/tmp"}), json!({"name": "data", "mountPath": DATA_DIR})]
}

pub fn service_account(mc: &MailCluster) -> Value {
    json!({
        "metadata": metadata(mc, names::cluster_name(mc), "server"),
        // The mail pods never talk to the Kubernetes API.
        "automountServiceAccountToken": false,
    })
}

pub fn config_map(mc: &MailCluster) -> Value {
    let mut data = BTreeMap::new();
    for p in mc.spec.enabled_protocols().into_iter().map(Some).chain([None]) {
        // Rendering a struct of strings and numbers to TOML cannot fail.
        let text = config::render_toml(mc, p).unwrap_or_default();
        data.insert(config::config_key(p), text);
    }
    json!({"metadata": metadata(mc, &names::config_map(mc), "config"), "data": data})
}

fn pod_labels(mc: &MailCluster, p: Protocol) -> BTreeMap<String, String> {
    let mut l = names::component_labels(mc, p.name());
    l.extend(names::all_pods_selector(mc));
    l
}

fn default_resources() -> Value {
    json!({
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    })
}

pub fn deployment(
    mc: &MailCluster,
    p: Protocol,
    image: &str,
    config_map: &Value,
    budget: &ProtocolBudget,
) -> Value {
    let spec = &mc.spec;
    let ps = spec.protocol(p);
    let name = names::protocol_object(mc, p);
    let key = config::config_key(Some(p));
    // Pods restart when their own config file changes, not when another protocol's does.
    let config_text = config_map["data"][&key].as_str().unwrap_or_default();
    let config_hash = names::hash_hex(config_text);
    let listeners: Vec<&str> = p.listeners().iter().map(|l| l.name()).collect();

    let mut env = vec![
        json!({"name": "MAILCLUSTER_PROTOCOLS", "value": listeners.join(",")}),
        json!({"name": "MAILCLUSTER_DATA_DIR", "value": DATA_DIR}),
    ];
    env.extend(secret_envs(mc));
    let mut volumes = vec![json!({
        "name": "config",
        "configMap": {"name": names::config_map(mc), "items": [{"key": key, "path": key}]},
    })];
    volumes.extend(scratch_volumes());
    let mut mounts = vec![json!({"name": "config", "mountPath": CONFIG_DIR, "readOnly": true})];
    mounts.extend(scratch_mounts());
    if let Some(secret) = tls_secret_name(mc) {
        env.push(json!({"name": "MAILCLUSTER_TLS_CERT", "value": format!("{TLS_DIR}/tls.crt")}));
        env.push(json!({"name": "MAILCLUSTER_TLS_KEY", "value": format!("{TLS_DIR}/tls.key")}));
        volumes.push(json!({"name": "tls", "secret": {"secretName": secret}}));
        mounts.push(json!({"name": "tls", "mountPath": TLS_DIR, "readOnly": true}));
    }
    let mut ports: Vec<Value> = p
        .listeners()
        .iter()
        .map(|l| json!({"name": l.name(), "containerPort": l.container_port(), "protocol": "TCP"}))
        .collect();
    ports.push(json!({"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"}));

    let selector = names::selector_labels(mc, p);
    let spread = |key: &str| {
        json!({
            "maxSkew": 1,
            "topologyKey": key,
            // Spread when possible; never leave a pod pending because a zone is full.
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector},
        })
    };
    let grace = i64::from(spec.shutdown_grace_seconds);
    let mut dspec = json!({
        "revisionHistoryLimit": 5,
        "selector": {"matchLabels": selector},
        // maxUnavailable 0: capacity never drops during a rollout; the surge pod is
        // counted in the connection budget.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": SURGE, "maxUnavailable": 0}},
        "template": {
            "metadata": {
                "labels": pod_labels(mc, p),
                "annotations": {
                    names::CONFIG_HASH_ANNOTATION: config_hash,
                    names::IMAGE_ANNOTATION: image,
                },
            },
            "spec": {
                "serviceAccountName": names::cluster_name(mc),
                "automountServiceAccountToken": false,
                "enableServiceLinks": false,
                "securityContext": pod_security_context(),
                // preStop sleep + the server's own drain (shutdown_grace_secs) + margin
                // for the goodbye lines and socket close: the kubelet must not SIGKILL a
                // draining session.
                "terminationGracePeriodSeconds": PRE_STOP_SLEEP_SECONDS + grace + 5,
                "topologySpreadConstraints": [spread("kubernetes.io/hostname"), spread("topology.kubernetes.io/zone")],
                "containers": [{
                    "name": "mailcluster",
                    "image": image,
                    "imagePullPolicy": spec.image.pull_policy.map_or("IfNotPresent", |p| match p {
                        mailcluster_api::PullPolicy::Always => "Always",
                        mailcluster_api::PullPolicy::IfNotPresent => "IfNotPresent",
                        mailcluster_api::PullPolicy::Never => "Never",
                    }),
                    "args": ["serve", "--config", format!("{CONFIG_DIR}/{key}")],
                    "env": env,
                    "ports": ports,
                    "resources": ps.resources.as_ref().map_or_else(default_resources, |r| json!(r)),
                    "securityContext": container_security_context(),
                    "volumeMounts": mounts,
                    "startupProbe": {
                        "httpGet": {"path": "/healthz", "port": "admin"},
                        "periodSeconds": 2,
                        "failureThreshold": 60,
                    },
                    "readinessProbe": {
                        "httpGet": {"path": "/readyz", "port": "admin"},
                        "periodSeconds": 5,
                        "timeoutSeconds": 2,
                        "failureThreshold": 2,
                    },
                    "livenessProbe": {
                        "httpGet": {"path": "/healthz", "port": "admin"},
                        "periodSeconds": 10,
                        "timeoutSeconds": 3,
                        "failureThreshold": 3,
                    },
                    "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_SECONDS}}},
                }],
                "volumes": volumes,
            },
        },
    });
    // With an HPA the replica count is the HPA's: leaving it out of the applied object
    // means server-side apply never resets what the autoscaler chose.
    if !budget.autoscaled {
        dspec["replicas"] = json!(budget.max_replicas);
    }
    json!({"metadata": metadata(mc, &name, p.name()), "spec": dspec})
}

pub fn service(mc: &MailCluster, p: Protocol) -> Value {
    let ps = mc.spec.protocol(p);
    let svc = &ps.service;
    let ports: Vec<Value> = p
        .listeners()
        .iter()
        .map(|l: &Listener| {
            let port = svc.ports.iter().find(|o| o.name == *l).map_or(l.standard_port(), |o| o.port);
            json!({"name": l.name(), "port": port, "targetPort": l.name(), "protocol": "TCP"})
        })
        .collect();
    let mut meta = metadata(mc, &names::protocol_object(mc, p), p.name());
    if !svc.annotations.is_empty() {
        meta["annotations"] = json!(svc.annotations);
    }
    let type_ = match svc.type_ {
        ServiceType::ClusterIP => "ClusterIP",
        ServiceType::NodePort => "NodePort",
        ServiceType::LoadBalancer => "LoadBalancer",
    };
    let mut spec = json!({
        "type": type_,
        "selector": names::selector_labels(mc, p),
        "ports": ports,
    });
    if svc.type_ == ServiceType::LoadBalancer {
        // Local: no second hop through another node, so the pod sees the client's real
        // address (rate limits, logs, SPF) and health checks skip nodes without pods.
        spec["externalTrafficPolicy"] = json!("Local");
        if !svc.load_balancer_source_ranges.is_empty() {
            spec["loadBalancerSourceRanges"] = json!(svc.load_balancer_source_ranges);
        }
    }
    json!({"metadata": meta, "spec": spec})
}

/// ClusterIP Service over the admin port of every pod: the scrape target. Kept apart
/// from the mail Services so a LoadBalancer never exposes `/metrics`.
pub fn metrics_service(mc: &MailCluster) -> Value {
    json!({
        "metadata": metadata(mc, &names::metrics_service(mc), "metrics"),
        "spec": {
            "type": "ClusterIP",
            "selector": names::all_pods_selector(mc),
            "ports": [{"name": "metrics", "port": ADMIN_PORT, "targetPort": "admin", "protocol": "TCP"}],
        },
    })
}

pub fn hpa(mc: &MailCluster, p: Protocol, budget: &ProtocolBudget) -> Value {
    let a = mc.spec.autoscaling_for(p);
    let name = names::protocol_object(mc, p);
    let mut metrics = Vec::new();
    if let Some(cpu) = a.cpu_utilization {
        metrics.push(json!({
            "type": "Resource",
            "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": cpu}},
        }));
    }
    if let Some(sat) = a.pool_saturation {
        // mail_pool_saturation is 0..1; the spec says percent. 70 % → "700m".
        metrics.push(json!({
            "type": "Pods",
            "pods": {
                "metric": {"name": "mail_pool_saturation"},
                "target": {"type": "AverageValue", "averageValue": format!("{}m", sat * 10)},
            },
        }));
    }
    if let Some(conns) = a.connections_per_pod {
        metrics.push(json!({
            "type": "Pods",
            "pods": {
                "metric": {"name": "mail_connections_active"},
                "target": {"type": "AverageValue", "averageValue": conns.to_string()},
            },
        }));
    }
    json!({
        "metadata": metadata(mc, &name, p.name()),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": budget.min_replicas,
            "maxReplicas": budget.max_replicas,
            "metrics": metrics,
            "behavior": {
                // Load arrives in bursts (connect storms after an outage): scale up at once.
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "selectPolicy": "Max",
                    "policies": [
                        {"type": "Percent", "value": 100, "periodSeconds": 30},
                        {"type": "Pods", "value": 4, "periodSeconds": 30},
                    ],
                },
                // Scaling down ends long-lived IMAP sessions (IDLE clients reconnect):
                // one pod at a time, after five calm minutes.
                "scaleDown": {
                    "stabilizationWindowSeconds": 300,
                    "selectPolicy": "Min",
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                },
            },
        },
    })
}

pub fn pdb(mc: &MailCluster, p: Protocol) -> Value {
    json!({
        "metadata": metadata(mc, &names::protocol_object(mc, p), p.name()),
        "spec": {
            // One pod at a time through voluntary disruptions (node drains), so drains
            // never take a whole protocol down; never blocks a single-replica drain.
            "maxUnavailable": 1,
            "selector": {"matchLabels": names::selector_labels(mc, p)},
        },
    })
}

pub fn network_policy(mc: &MailCluster) -> Value {
    let mail_ports: Vec<Value> = mc
        .spec
        .enabled_protocols()
        .iter()
        .flat_map(|p| p.listeners())
        .map(|l| json!({"protocol": "TCP", "port": l.container_port()}))
        .collect();
    let mut metrics_from = vec![json!({"podSelector": {}})];
    for ns in &mc.spec.network_policy.metrics_namespaces {
        metrics_from.push(json!({
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        }));
    }
    json!({
        "metadata": metadata(mc, names::cluster_name(mc), "server"),
        "spec": {
            "podSelector": {"matchLabels": names::all_pods_selector(mc)},
            "policyTypes": ["Ingress"],
            "ingress": [
                // Mail is public: anyone may connect to the mail listeners.
                {"ports": mail_ports},
                // The admin port (metrics, health) only from this namespace and monitoring.
                {"from": metrics_from, "ports": [{"protocol": "TCP", "port": ADMIN_PORT}]},
            ],
        },
    })
}

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

pub fn service_monitor(mc: &MailCluster) -> Value {
    json!({
        "metadata": metadata(mc, names::cluster_name(mc), "metrics"),
        "spec": {
            "selector": {"matchLabels": names::component_labels(mc, "metrics")},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": mc.spec.monitoring.interval}],
        },
    })
}
