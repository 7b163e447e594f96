//! The pure build step from YAML fixtures, asserted field by field.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mailcluster_api::stress::{EndpointSpec, StressProfile, StressSpec, TlsMode};
use mailcluster_api::{Listener, MailCluster};
use mailcluster_operator::build::{BuildContext, Built, Rollout, build};
use mailcluster_operator::children::ChildKind;
use mailcluster_operator::names;

fn fixture(name: &str) -> MailCluster {
    let path = format!("{}/tests/fixtures/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    serde_yaml_ng::from_str(&text).expect("fixture parses as MailCluster")
}

fn steady(mc: &MailCluster) -> Built {
    build(mc, &BuildContext::steady_state(mc)).expect("fixture builds")
}

fn get<T: serde::de::DeserializeOwned>(b: &Built, kind: ChildKind, name: &str) -> T {
    b.get(kind, name).unwrap_or_else(|| panic!("{kind:?} {name} missing")).to_typed().expect("decodes")
}

fn container(d: &Deployment) -> Container {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0].clone()
}

fn names_of(b: &Built, kind: ChildKind) -> Vec<String> {
    let mut v: Vec<String> = b.of_kind(kind).map(|c| c.name().to_string()).collect();
    v.sort();
    v
}

#[test]
fn minimal_builds_every_default_object() {
    let mc = fixture("minimal");
    let b = steady(&mc);
    assert_eq!(names_of(&b, ChildKind::Deployment), ["mail-imap", "mail-smtp", "mail-submission"]);
    assert_eq!(
        names_of(&b, ChildKind::Service),
        ["mail-imap", "mail-metrics", "mail-smtp", "mail-submission"]
    );
    assert_eq!(
        names_of(&b, ChildKind::HorizontalPodAutoscaler),
        ["mail-imap", "mail-smtp", "mail-submission"]
    );
    assert_eq!(names_of(&b, ChildKind::PodDisruptionBudget), ["mail-imap", "mail-smtp", "mail-submission"]);
    assert_eq!(names_of(&b, ChildKind::ConfigMap), ["mail-config"]);
    assert_eq!(names_of(&b, ChildKind::ServiceAccount), ["mail"]);
    assert_eq!(names_of(&b, ChildKind::Job), std::slice::from_ref(&b.migration_job));
    assert!(
        b.migration_job.starts_with("mail-migrate-") && b.migration_job.len() == "mail-migrate-".len() + 10
    );
    assert_eq!(names_of(&b, ChildKind::ServiceMonitor), ["mail"]);
    // A NetworkPolicy unless the spec turns it off.
    assert_eq!(names_of(&b, ChildKind::NetworkPolicy), ["mail"]);
    for absent in [ChildKind::CronJob, ChildKind::Certificate, ChildKind::Role] {
        assert_eq!(b.of_kind(absent).count(), 0, "{absent:?} not asked for");
    }
    assert_eq!(b.rollout, Rollout::Current);
    assert!(b.warnings.is_empty(), "{:?}", b.warnings);
}

/// With group commit across pods, the pods that deliver find their leader
/// through a headless Service of their own Deployment's pods, on a port they
/// all open.
#[test]
fn delivering_pods_group_commit_through_their_headless_service() {
    let mut mc = fixture("minimal");
    mc.spec.group_commit.across_pods = true;
    let b = steady(&mc);
    let svc: Service = get(&b, ChildKind::Service, "mail-smtp-commit");
    let spec = svc.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "headless: one address per ready pod");
    let deployment: Deployment = get(&b, ChildKind::Deployment, "mail-smtp");
    let pod_labels =
        deployment.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().labels.clone().unwrap();
    for (k, v) in spec.selector.unwrap() {
        assert_eq!(pod_labels.get(&k), Some(&v), "selects the smtp pods");
    }
    let port = &spec.ports.unwrap()[0];
    let target = port.target_port.clone().unwrap();
    let opened = container(&deployment).ports.unwrap();
    assert!(
        opened.iter().any(|p| IntOrString::String(p.name.clone().unwrap_or_default()) == target
            && p.container_port == port.port),
        "the pods open the Service's port: {opened:?}"
    );
    let config =
        mailcluster_operator::build::pod_config::pod_config(&mc, Some(mailcluster_api::Protocol::Smtp));
    let namespace = mc.metadata.namespace.clone().unwrap();
    assert_eq!(config.smtp.group_commit_leader, format!("mail-smtp-commit.{namespace}.svc:{}", port.port));
    assert_eq!(i32::from(config.smtp.group_commit_port), port.port);
    // IMAP pods deliver nothing: no port, no Service, no leader.
    let imap =
        mailcluster_operator::build::pod_config::pod_config(&mc, Some(mailcluster_api::Protocol::Imap));
    assert_eq!((imap.smtp.group_commit_leader.as_str(), imap.smtp.group_commit_port), ("", 0));
    assert!(b.get(ChildKind::Service, "mail-imap-commit").is_none());
}

#[test]
fn group_commit_across_pods_is_asked_for() {
    let mut mc = fixture("minimal");
    mc.spec.network_policy.enabled = true;
    mc.spec.network_policy.restrict_egress = true;
    let name = names::cluster_name(&mc).to_string();
    let policy_ports = |b: &Built| {
        let policy: k8s_openapi::api::networking::v1::NetworkPolicy = get(b, ChildKind::NetworkPolicy, &name);
        let spec = policy.spec.unwrap();
        let port_list = |ports: &Option<Vec<k8s_openapi::api::networking::v1::NetworkPolicyPort>>| {
            ports.iter().flatten().filter_map(|p| p.port.clone()).collect::<Vec<_>>()
        };
        let ingress: Vec<IntOrString> =
            spec.ingress.iter().flatten().flat_map(|r| port_list(&r.ports)).collect();
        let egress: Vec<IntOrString> =
            spec.egress.iter().flatten().flat_map(|r| port_list(&r.ports)).collect();
        (ingress, egress)
    };
    let commit = IntOrString::Int(names::GROUP_COMMIT_PORT);
    // Off (the default): each pod commits its own; nothing is opened for it.
    assert!(!mc.spec.group_commit.across_pods, "off unless asked for");
    let b = steady(&mc);
    assert!(b.get(ChildKind::Service, "mail-smtp-commit").is_none());
    assert!(b.get(ChildKind::Service, "mail-submission-commit").is_none());
    let deployment: Deployment = get(&b, ChildKind::Deployment, "mail-smtp");
    let ports = container(&deployment).ports.unwrap();
    assert!(ports.iter().all(|p| p.container_port != names::GROUP_COMMIT_PORT), "{ports:?}");
    let config =
        mailcluster_operator::build::pod_config::pod_config(&mc, Some(mailcluster_api::Protocol::Smtp));
    assert_eq!((config.smtp.group_commit_leader.as_str(), config.smtp.group_commit_port), ("", 0));
    let (ingress, egress) = policy_ports(&b);
    assert!(!ingress.contains(&commit) && !egress.contains(&commit), "{ingress:?} / {egress:?}");

    // On: followers may reach the leader even where egress is denied by
    // default, and the leader takes them.
    mc.spec.group_commit.across_pods = true;
    let (ingress, egress) = policy_ports(&steady(&mc));
    assert!(ingress.contains(&commit) && egress.contains(&commit), "{ingress:?} / {egress:?}");
}

#[test]
fn every_child_has_owner_reference_and_labels() {
    for f in ["minimal", "full"] {
        let mc = fixture(f);
        let uid = mc.metadata.uid.clone().unwrap();
        let b = steady(&mc);
        for c in &b.children {
            let owners = c.object.metadata.owner_references.as_ref().expect("owner refs");
            assert_eq!(owners.len(), 1);
            assert_eq!(owners[0].uid, uid);
            assert_eq!(owners[0].kind, "MailCluster");
            assert_eq!(owners[0].api_version, "mailcluster.dev/v1alpha1");
            assert_eq!(owners[0].controller, Some(true));
            let labels = c.object.metadata.labels.as_ref().expect("labels");
            assert_eq!(labels["app.kubernetes.io/managed-by"], "mailcluster-operator", "{}", c.name());
            assert_eq!(labels["mailcluster.dev/cluster"], mc.metadata.name.clone().unwrap());
            assert_eq!(c.object.metadata.namespace.as_deref(), Some("mail"));
        }
    }
}

#[test]
fn deployment_pod_is_locked_down_and_probed() {
    let mc = fixture("minimal");
    let b = steady(&mc);
    let d: Deployment = get(&b, ChildKind::Deployment, "mail-imap");
    let spec = d.spec.as_ref().unwrap();
    // HPA owns the count: not in the applied object.
    assert_eq!(spec.replicas, None);
    let ru = spec.strategy.as_ref().unwrap().rolling_update.as_ref().unwrap();
    assert_eq!(ru.max_surge, Some(IntOrString::Int(1)));
    assert_eq!(ru.max_unavailable, Some(IntOrString::Int(0)));
    let pod = spec.template.spec.as_ref().unwrap();
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(psc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.termination_grace_period_seconds, Some(5 + 25 + 5));
    let spread = pod.topology_spread_constraints.as_ref().unwrap();
    assert_eq!(spread[0].topology_key, "kubernetes.io/hostname");
    assert_eq!(spread[0].label_selector.as_ref().unwrap().match_labels, spec.selector.match_labels);

    let c = container(&d);
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.capabilities.as_ref().unwrap().drop, Some(vec!["ALL".to_string()]));
    assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    assert_eq!(c.image.as_deref(), Some("ghcr.io/mailcluster/mailcluster:0.1.0"));
    assert_eq!(c.args.as_ref().unwrap(), &["serve", "--config", "/etc/mailcluster/imap.toml"]);

    let ready = c.readiness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
    assert_eq!(ready.path.as_deref(), Some("/readyz"));
    assert_eq!(ready.port, IntOrString::String("admin".into()));
    let live = c.liveness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
    assert_eq!(live.path.as_deref(), Some("/healthz"));
    let ports: Vec<(String, i32)> =
        c.ports.as_ref().unwrap().iter().map(|p| (p.name.clone().unwrap(), p.container_port)).collect();
    assert_eq!(
        ports,
        [
            ("imap".into(), 10143),
            ("imaps".into(), 10993),
            ("managesieve".into(), 14190),
            ("admin".into(), 9090)
        ]
    );
    assert_eq!(c.lifecycle.as_ref().unwrap().pre_stop.as_ref().unwrap().sleep.as_ref().unwrap().seconds, 5);
    let mounts: Vec<&str> = c.volume_mounts.as_ref().unwrap().iter().map(|m| m.mount_path.as_str()).collect();
    assert!(mounts.contains(&"/tmp") && mounts.contains(&"/var/lib/mailcluster"), "{mounts:?}");

    let env = c.env.as_ref().unwrap();
    let var = |n: &str| env.iter().find(|e| e.name == n).unwrap_or_else(|| panic!("{n} missing"));
    assert_eq!(var("MAILCLUSTER_PROTOCOLS").value.as_deref(), Some("imap,imaps,managesieve"));
    let db = var("MAILCLUSTER_DATABASE_URL").value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    assert_eq!((db.name.as_str(), db.key.as_str()), ("mail-db", "url"));
    let redis = var("MAILCLUSTER_REDIS_URL").value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    assert_eq!(redis.name, "mail-redis");
    assert!(env.iter().all(|e| !e.name.starts_with("MAILCLUSTER_TLS")), "no TLS configured");
    // Threads from the CPU request in whole cores (the kubelet rounds up), not
    // one per core of whatever node the pod lands on.
    let workers =
        var("MAILCLUSTER_WORKER_THREADS").value_from.as_ref().unwrap().resource_field_ref.as_ref().unwrap();
    assert_eq!(workers.resource, "requests.cpu");
    assert_eq!(workers.divisor.as_ref().map(|q| q.0.as_str()), Some("1"));
    // The transfer budget is sized from the container's memory limit, in bytes.
    let memory = var("MAILCLUSTER_NET__MEMORY_LIMIT_BYTES")
        .value_from
        .as_ref()
        .unwrap()
        .resource_field_ref
        .as_ref()
        .unwrap();
    assert_eq!(
        (memory.resource.as_str(), memory.divisor.as_ref().map(|q| q.0.as_str())),
        ("limits.memory", Some("1"))
    );

    // The config hash is the hash of this protocol's file in the ConfigMap.
    let cm: ConfigMap = get(&b, ChildKind::ConfigMap, "mail-config");
    let text = &cm.data.as_ref().unwrap()["imap.toml"];
    let ann = spec.template.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
    assert_eq!(ann[names::CONFIG_HASH_ANNOTATION], names::hash_hex(text));
}

/// The file as a pod reads it: through the server's loader, with every check it
/// makes at start (unknown keys, listener clashes, filters, URLs).
fn server_loads(key: &str, text: &str) -> mailcluster_api::config::Config {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(key);
    std::fs::write(&path, text).unwrap();
    mailcluster_server::config::load(Some(&path), std::iter::empty())
        .unwrap_or_else(|e| panic!("{key} rejected by the server: {e}\n{text}"))
}

#[test]
fn config_files_are_accepted_by_the_server() {
    let mc = fixture("full");
    let b = steady(&mc);
    let cm: ConfigMap = get(&b, ChildKind::ConfigMap, "prod-config");
    let data = cm.data.unwrap();
    let keys: Vec<&str> = data.keys().map(String::as_str).collect();
    assert_eq!(keys, ["imap.toml", "migrate.toml", "pop3.toml", "smtp.toml", "submission.toml"]);
    for (key, text) in &data {
        let cfg = server_loads(key, text);
        assert!(!cfg.database.migrate_on_start, "{key}: the migration Job migrates");
        assert!(cfg.database.url.is_none(), "{key}: URLs come from Secrets, not the ConfigMap");
        assert_eq!(cfg.hostname, "mx.example.com");
        assert_eq!(cfg.redis.key_prefix, "prod:");
        assert_eq!(cfg.shutdown_grace_secs, 40);
        assert_eq!(cfg.ports, mailcluster_api::config::Ports::default(), "contract ports");
        assert_eq!(cfg.tls.cert.as_deref(), Some(std::path::Path::new("/etc/mailcluster/tls/tls.crt")));
        assert!(cfg.net.proxy_protocol.enabled);
        assert_eq!(cfg.net.proxy_protocol.trusted_cidrs, vec!["10.0.0.0/8".parse::<ipnet::IpNet>().unwrap()]);
        assert_eq!(cfg.log.level, "debug");
    }
    let smtp = server_loads("smtp.toml", &data["smtp.toml"]);
    assert_eq!(smtp.protocols, [Listener::Smtp]);
    assert_eq!(smtp.database.pool_size, 10);
    assert_eq!(smtp.net.max_connections, 2000);
    assert_eq!(smtp.net.max_connections_per_ip, 20);
    let sub = server_loads("submission.toml", &data["submission.toml"]);
    assert_eq!(sub.protocols, [Listener::Submission, Listener::Submissions]);
    let migrate = server_loads("migrate.toml", &data["migrate.toml"]);
    assert_eq!(migrate.database.pool_size, 2);
    // The sending pods sign and relay; the others neither load keys nor need them.
    for cfg in [&smtp, &sub] {
        let keys: Vec<_> = cfg
            .dkim
            .keys
            .iter()
            .map(|k| (k.domain.as_str(), k.selector.as_str(), k.algorithm.as_str()))
            .collect();
        assert_eq!(keys, [("example.com", "mail", "ed25519"), ("example.org", "s2024", "rsa")]);
        assert_eq!(
            cfg.dkim.keys[0].key_file,
            std::path::Path::new("/etc/mailcluster/dkim/example.com/dkim.key")
        );
        assert_eq!(cfg.relay.smarthost.as_deref(), Some("smtp.provider.example:587"));
    }
    for key in ["imap.toml", "pop3.toml", "migrate.toml"] {
        assert!(server_loads(key, &data[key]).dkim.keys.is_empty(), "{key}");
    }

    // Default key prefix is per cluster so clusters can share a Redis.
    let minimal = steady(&fixture("minimal"));
    let cm: ConfigMap = get(&minimal, ChildKind::ConfigMap, "mail-config");
    let cfg = server_loads("smtp.toml", &cm.data.unwrap()["smtp.toml"]);
    assert_eq!(cfg.redis.key_prefix, "mc:mail:mail:");
    assert_eq!(cfg.hostname, "mail.example.com");
    assert!(cfg.tls.cert.is_none());
}

#[test]
fn dkim_secrets_and_smarthost_credentials_reach_the_sending_pods_only() {
    let mc = fixture("full");
    let b = steady(&mc);
    let smtp: Deployment = get(&b, ChildKind::Deployment, "prod-smtp");
    let pod = smtp.spec.as_ref().unwrap().template.spec.clone().unwrap();
    let volume = |name: &str| pod.volumes.as_ref().unwrap().iter().find(|v| v.name == name).cloned().unwrap();
    let secret = volume("dkim-1").secret.unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("dkim-example-org"));
    let items = secret.items.unwrap();
    assert_eq!((items[0].key.as_str(), items[0].path.as_str()), ("private.pem", "dkim.key"));
    let c = container(&smtp);
    let mounts = c.volume_mounts.clone().unwrap();
    let m = mounts.iter().find(|m| m.name == "dkim-1").unwrap();
    assert_eq!(m.mount_path, "/etc/mailcluster/dkim/example.org");
    assert_eq!(m.read_only, Some(true));
    let env = c.env.unwrap();
    let pw = env.iter().find(|e| e.name == "MAILCLUSTER_RELAY__SMARTHOST_PASSWORD").expect("password env");
    let sel = pw.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    assert_eq!((sel.name.as_str(), sel.key.as_str()), ("relay-credentials", "password"));

    let imap: Deployment = get(&b, ChildKind::Deployment, "prod-imap");
    let ipod = imap.spec.unwrap().template.spec.unwrap();
    assert!(!ipod.volumes.unwrap().iter().any(|v| v.name.starts_with("dkim")));
    assert!(!ipod.containers[0].env.as_ref().unwrap().iter().any(|e| e.name.contains("SMARTHOST")));
}

/// The cluster's keys come from the Secret the operator makes, never from the
/// spec or the ConfigMap; each pod gets the ones it uses, and none may start
/// without them.
#[test]
fn cluster_keys_reach_the_pods_from_the_operators_secret() {
    let from_keys = |d: &Deployment| -> Vec<(String, String)> {
        container(d)
            .env
            .unwrap()
            .iter()
            .filter_map(|e| {
                let sel = e.value_from.as_ref()?.secret_key_ref.as_ref()?;
                (sel.name == "prod-keys").then(|| {
                    assert_eq!(sel.optional, Some(false), "{}", e.name);
                    (e.name.clone(), sel.key.clone())
                })
            })
            .collect()
    };
    let mut mc = fixture("full");
    assert!(mc.spec.group_commit.across_pods);
    let b = steady(&mc);
    let mac = ("MAILCLUSTER_CACHE__MAC_KEY".to_string(), "cache-mac-key".to_string());
    let group = ("MAILCLUSTER_SMTP__GROUP_COMMIT_SECRET".to_string(), "group-commit-key".to_string());
    for name in ["prod-smtp", "prod-submission"] {
        assert_eq!(from_keys(&get(&b, ChildKind::Deployment, name)), [mac.clone(), group.clone()], "{name}");
    }
    for name in ["prod-imap", "prod-pop3"] {
        assert_eq!(
            from_keys(&get(&b, ChildKind::Deployment, name)),
            std::slice::from_ref(&mac),
            "{name}: no group commit"
        );
    }
    mc.spec.group_commit.across_pods = false;
    let b = steady(&mc);
    assert_eq!(from_keys(&get(&b, ChildKind::Deployment, "prod-smtp")), std::slice::from_ref(&mac));
    // Not in the pods' configuration file.
    let cm: ConfigMap = get(&b, ChildKind::ConfigMap, "prod-config");
    for (_, text) in cm.data.unwrap() {
        assert!(!text.contains("prod-keys") && !text.contains("mac_key"), "{text}");
    }
    // The migration Job needs no key.
    let job: Job = get(&b, ChildKind::Job, &b.migration_job);
    let env = format!("{:?}", job.spec.unwrap().template.spec.unwrap().containers[0].env);
    assert!(!env.contains("prod-keys"), "{env}");
}

#[test]
fn services_map_standard_ports_and_follow_spec() {
    let b = steady(&fixture("full"));
    let smtp: Service = get(&b, ChildKind::Service, "prod-smtp");
    let s = smtp.spec.unwrap();
    assert_eq!(s.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(s.external_traffic_policy.as_deref(), Some("Local"));
    assert_eq!(s.load_balancer_source_ranges, Some(vec!["0.0.0.0/0".to_string()]));
    let p = &s.ports.unwrap()[0];
    assert_eq!((p.port, p.target_port.clone()), (25, Some(IntOrString::String("smtp".into()))));
    assert_eq!(
        smtp.metadata.annotations.unwrap()["service.beta.kubernetes.io/aws-load-balancer-type"],
        "nlb"
    );
    let imap: Service = get(&b, ChildKind::Service, "prod-imap");
    let s = imap.spec.unwrap();
    assert_eq!(s.type_.as_deref(), Some("NodePort"));
    assert_eq!(s.external_traffic_policy, None);
    let ports: Vec<(String, i32)> =
        s.ports.unwrap().iter().map(|p| (p.name.clone().unwrap(), p.port)).collect();
    assert_eq!(ports, [("imap".into(), 143), ("imaps".into(), 993), ("managesieve".into(), 4190)]);
    let pop3: Service = get(&b, ChildKind::Service, "prod-pop3");
    let ports: Vec<i32> = pop3.spec.unwrap().ports.unwrap().iter().map(|p| p.port).collect();
    assert_eq!(ports, [110, 995]);
    let metrics: Service = get(&b, ChildKind::Service, "prod-metrics");
    let s = metrics.spec.unwrap();
    assert_eq!(s.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(s.ports.unwrap()[0].port, 9090);
}

#[test]
fn hpa_metrics_and_behaviour() {
    let b = steady(&fixture("full"));
    let hpa: HorizontalPodAutoscaler = get(&b, ChildKind::HorizontalPodAutoscaler, "prod-smtp");
    let s = hpa.spec.unwrap();
    assert_eq!((s.min_replicas, s.max_replicas), (Some(3), 20));
    assert_eq!(s.scale_target_ref.kind, "Deployment");
    assert_eq!(s.scale_target_ref.name, "prod-smtp");
    let m = s.metrics.unwrap();
    assert_eq!(m.len(), 3);
    assert_eq!(m[0].resource.as_ref().unwrap().target.average_utilization, Some(60));
    let pods = m[1].pods.as_ref().unwrap();
    assert_eq!(pods.metric.name, "mail_pool_saturation");
    assert_eq!(pods.target.average_value.as_ref().unwrap().0, "800m");
    let conns = m[2].pods.as_ref().unwrap();
    assert_eq!(conns.metric.name, "mail_connections_active");
    assert_eq!(conns.target.average_value.as_ref().unwrap().0, "1500");
    let behavior = s.behavior.unwrap();
    assert_eq!(behavior.scale_down.unwrap().stabilization_window_seconds, Some(300));
    assert_eq!(behavior.scale_up.unwrap().stabilization_window_seconds, Some(0));

    // Global defaults for the others: CPU 70 %, saturation 0.7.
    let imap: HorizontalPodAutoscaler = get(&b, ChildKind::HorizontalPodAutoscaler, "prod-imap");
    let s = imap.spec.unwrap();
    assert_eq!((s.min_replicas, s.max_replicas), (Some(2), 8));
    let m = s.metrics.unwrap();
    assert_eq!(m[0].resource.as_ref().unwrap().target.average_utilization, Some(70));
    assert_eq!(m[1].pods.as_ref().unwrap().target.average_value.as_ref().unwrap().0, "700m");

    // pop3 has a fixed count: no HPA, replicas in the Deployment, still a PDB.
    assert!(b.get(ChildKind::HorizontalPodAutoscaler, "prod-pop3").is_none());
    let pop3: Deployment = get(&b, ChildKind::Deployment, "prod-pop3");
    assert_eq!(pop3.spec.unwrap().replicas, Some(2));
    let pdb: PodDisruptionBudget = get(&b, ChildKind::PodDisruptionBudget, "prod-pop3");
    assert_eq!(pdb.spec.unwrap().max_unavailable, Some(IntOrString::Int(1)));
}

/// A cluster without metrics-server turns the CPU target off with 0: the HPA then has
/// no Resource metric, which it could never read and which would block scaling down.
#[test]
fn zero_turns_a_target_off() {
    let mut mc = fixture("full");
    let smtp = mc.spec.smtp.autoscaling.as_mut().expect("smtp autoscaling in the fixture");
    smtp.cpu_utilization = Some(0);
    let hpa: HorizontalPodAutoscaler = get(&steady(&mc), ChildKind::HorizontalPodAutoscaler, "prod-smtp");
    let names: Vec<String> = hpa
        .spec
        .unwrap()
        .metrics
        .unwrap()
        .iter()
        .map(|m| m.pods.as_ref().map_or_else(|| m.type_.clone(), |p| p.metric.name.clone()))
        .collect();
    assert_eq!(names, ["mail_pool_saturation", "mail_connections_active"]);

    // Every target off is no target at all: refused, like a spec without any.
    let smtp = mc.spec.smtp.autoscaling.as_mut().unwrap();
    smtp.pool_saturation = Some(0);
    smtp.connections_per_pod = None;
    let problems = mailcluster_operator::validate::validate(&mc).expect_err("no target").problems;
    assert!(
        problems.iter().any(|p| p.contains("smtp: autoscaling needs at least one target metric")),
        "{problems:?}"
    );
}

#[test]
fn tls_from_cert_manager() {
    let b = steady(&fixture("full"));
    let cert = b.get(ChildKind::Certificate, "prod-tls").expect("Certificate");
    let spec = &cert.object.data["spec"];
    assert_eq!(spec["secretName"], "prod-tls");
    assert_eq!(spec["issuerRef"]["kind"], "ClusterIssuer");
    let dns: Vec<&str> = spec["dnsNames"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(dns, ["mx.example.com", "example.com", "example.org", "imap.example.com"]);
    let d: Deployment = get(&b, ChildKind::Deployment, "prod-smtp");
    let pod = d.spec.unwrap().template.spec.unwrap();
    let tls = pod.volumes.unwrap().into_iter().find(|v| v.name == "tls").expect("tls volume");
    assert_eq!(tls.secret.unwrap().secret_name.as_deref(), Some("prod-tls"));

    // Without cert-manager: no Certificate, and a warning says why the Secret is missing.
    let mc = fixture("full");
    let ctx = BuildContext { has_cert_manager: false, ..BuildContext::steady_state(&mc) };
    let b = build(&mc, &ctx).unwrap();
    assert!(b.get(ChildKind::Certificate, "prod-tls").is_none());
    assert!(b.warnings.iter().any(|w| w.contains("cert-manager")), "{:?}", b.warnings);
}

/// Who an ingress rule of the mail pods' NetworkPolicy lets in on `port`:
/// None when no rule opens it, Some(empty) when one opens it to everyone.
fn admitted(np: &serde_json::Value, port: i64) -> Option<Vec<serde_json::Value>> {
    let mut from: Option<Vec<serde_json::Value>> = None;
    for rule in np["spec"]["ingress"].as_array().unwrap() {
        if rule["ports"].as_array().unwrap().iter().any(|p| p["port"] == port) {
            match rule.get("from").and_then(|f| f.as_array()) {
                None => return Some(Vec::new()),
                Some(peers) => from.get_or_insert_with(Vec::new).extend(peers.iter().cloned()),
            }
        }
    }
    from
}

#[test]
fn network_policy_opens_mail_ports_and_guards_admin() {
    let b = steady(&fixture("full"));
    let np = b.get(ChildKind::NetworkPolicy, "prod").expect("NetworkPolicy");
    let ingress = np.object.data["spec"]["ingress"].as_array().unwrap();
    let mail_ports: Vec<i64> =
        ingress[0]["ports"].as_array().unwrap().iter().map(|p| p["port"].as_i64().unwrap()).collect();
    assert_eq!(mail_ports, [10025, 10587, 10465, 10143, 10993, 14190, 10110, 10995]);
    for port in mail_ports {
        assert_eq!(admitted(&np.object.data, port), Some(vec![]), "mail port {port} is open to all");
    }
    // The admin port: from the monitoring namespace only, not from pods of the
    // cluster's own namespace.
    assert_eq!(
        admitted(&np.object.data, 9090),
        Some(vec![
            serde_json::json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}})
        ])
    );
    // Group commit: between the cluster's delivering pods only.
    let commit = admitted(&np.object.data, i64::from(names::GROUP_COMMIT_PORT)).expect("group-commit rule");
    assert_eq!(commit.len(), 1, "{commit:?}");
    let selector = &commit[0]["podSelector"];
    assert!(commit[0].get("namespaceSelector").is_none(), "this namespace only: {commit:?}");
    assert_eq!(selector["matchLabels"]["app.kubernetes.io/instance"], "prod");
    assert_eq!(selector["matchLabels"]["mailcluster.dev/role"], "server");
    assert_eq!(
        selector["matchExpressions"],
        serde_json::json!([{"key": "app.kubernetes.io/component", "operator": "In", "values": ["smtp", "submission"]}])
    );
    // Egress restricted to what the pods need: DNS, SMTP, the stores, and the extra port.
    assert_eq!(np.object.data["spec"]["policyTypes"], serde_json::json!(["Ingress", "Egress"]));
    let egress = &np.object.data["spec"]["egress"][0];
    assert!(egress.get("to").is_none(), "to any address");
    let ports: Vec<(String, i64)> = egress["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["protocol"].as_str().unwrap().to_string(), p["port"].as_i64().unwrap()))
        .collect();
    for want in
        [("UDP", 53), ("TCP", 53), ("TCP", 25), ("TCP", 587), ("TCP", 5432), ("TCP", 6379), ("TCP", 6380)]
    {
        assert!(ports.contains(&(want.0.to_string(), want.1)), "{want:?} missing: {ports:?}");
    }
    // Without restrictEgress, egress is left alone.
    let mut mc = fixture("full");
    mc.spec.network_policy.restrict_egress = false;
    let np = steady(&mc).get(ChildKind::NetworkPolicy, "prod").expect("NetworkPolicy").object.data.clone();
    assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    assert!(np["spec"].get("egress").is_none());
}

#[test]
fn network_policy_is_on_unless_turned_off_and_admin_follows_the_settings() {
    // A spec that says nothing about it gets one.
    let mut mc = fixture("minimal");
    let np = steady(&mc).get(ChildKind::NetworkPolicy, "mail").expect("on by default").object.data.clone();
    assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Ingress"]), "egress as before");
    assert_eq!(admitted(&np, 9090).unwrap().len(), 1, "monitoring only: {np}");
    assert!(admitted(&np, i64::from(names::GROUP_COMMIT_PORT)).is_none(), "no group commit, no port");
    // Namespaces chosen by their labels as well as by name.
    mc.spec.network_policy.metrics_namespaces = vec!["observability".into()];
    mc.spec.network_policy.metrics_namespace_labels = [("team".to_string(), "sre".to_string())].into();
    let np = steady(&mc).get(ChildKind::NetworkPolicy, "mail").unwrap().object.data.clone();
    assert_eq!(
        admitted(&np, 9090).unwrap(),
        [
            serde_json::json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}),
            serde_json::json!({"namespaceSelector": {"matchLabels": {"team": "sre"}}}),
        ]
    );
    // Nobody named: the admin port is open to no one.
    mc.spec.network_policy.metrics_namespaces.clear();
    mc.spec.network_policy.metrics_namespace_labels.clear();
    let np = steady(&mc).get(ChildKind::NetworkPolicy, "mail").unwrap().object.data.clone();
    assert!(admitted(&np, 9090).is_none(), "{np}");
    // Turned off: none.
    mc.spec.network_policy.enabled = false;
    assert_eq!(steady(&mc).of_kind(ChildKind::NetworkPolicy).count(), 0);
}

#[test]
fn stress_cron_job_and_on_demand_job() {
    let mc = fixture("full");
    let b = steady(&mc);
    let cj: CronJob = get(&b, ChildKind::CronJob, "prod-stress");
    let s = cj.spec.unwrap();
    assert_eq!(s.schedule, "0 3 * * *");
    assert_eq!(s.concurrency_policy.as_deref(), Some("Forbid"));
    let job = s.job_template.spec.unwrap();
    assert_eq!(job.backoff_limit, Some(0));
    let pod = job.template.spec.unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(pod.service_account_name.as_deref(), Some("prod-stress"));
    assert_eq!(
        pod.containers[0].args.as_ref().unwrap(),
        &[
            "stress",
            "--report-to",
            "mail/prod",
            "--scenario-file",
            "/etc/mailcluster/stress.yaml",
            "--provision-accounts"
        ]
    );
    // Jobs the CronJob spawns must not carry the labels orphan deletion lists by.
    let jt_labels = s.job_template.metadata.unwrap().labels.unwrap();
    assert!(!jt_labels.contains_key("app.kubernetes.io/managed-by"));

    let token_job = format!("prod-stress-{}", names::short_hash(&["2026-11-30-a"]));
    let j: Job = get(&b, ChildKind::Job, &token_job);
    assert_eq!(j.spec.unwrap().backoff_limit, Some(0));

    let cm: ConfigMap = get(&b, ChildKind::ConfigMap, "prod-stress");
    // The runner's own scenario format, targets pointed at this cluster's Services.
    let plan: StressSpec = serde_yaml_ng::from_str(&cm.data.unwrap()["stress.yaml"]).unwrap();
    let targets = plan.targets.unwrap();
    let smtp = targets.smtp.unwrap();
    assert_eq!(smtp.address, "prod-smtp.mail.svc:25");
    assert_eq!(smtp.tls, TlsMode::Starttls);
    assert_eq!(smtp.server_name.as_deref(), Some("mx.example.com"));
    assert_eq!(targets.imap.unwrap().address, "prod-imap.mail.svc:143");
    assert_eq!(targets.pop3.unwrap().address, "prod-pop3.mail.svc:110");
    assert_eq!(plan.scenarios.len(), 3);
    assert_eq!(plan.scenarios[1].rate, Some(200.0));
    assert_eq!(plan.slo.success_rate, Some(99.9));
    assert_eq!(plan.users.unwrap().template, "stress{:04}@example.com");

    let role = b.get(ChildKind::Role, "prod-stress").expect("Role");
    let rules = role.object.data["rules"].as_array().unwrap();
    assert_eq!(rules[1]["resources"][0], "mailclusters/status");
    assert_eq!(rules[1]["resourceNames"][0], "prod");
    assert!(b.get(ChildKind::RoleBinding, "prod-stress").is_some());
    assert!(b.get(ChildKind::ServiceAccount, "prod-stress").is_some());
}

#[test]
fn stress_profile_is_mounted_into_the_job_with_this_clusters_targets() {
    let mc = fixture("stress-profile");
    let b = steady(&mc);
    let token_job = format!("post-stress-{}", names::short_hash(&["demo-1"]));
    let job: Job = get(&b, ChildKind::Job, &token_job);
    let pod = job.spec.unwrap().template.spec.unwrap();
    let c = &pod.containers[0];
    let args = c.args.as_ref().unwrap();
    let file =
        args.iter().position(|a| a == "--scenario-file").map(|i| args[i + 1].clone()).expect("file arg");
    // The file the runner reads is the ConfigMap mounted into the pod.
    let mount =
        c.volume_mounts.as_ref().unwrap().iter().find(|m| file.starts_with(&m.mount_path)).expect("mount");
    let volume = pod.volumes.as_ref().unwrap().iter().find(|v| v.name == mount.name).expect("volume");
    assert_eq!(volume.config_map.as_ref().map(|c| c.name.as_str()), Some("post-stress"));
    let key = file.rsplit('/').next().unwrap();

    let cm: ConfigMap = get(&b, ChildKind::ConfigMap, "post-stress");
    let text = cm.data.unwrap()[key].clone();
    // The profile's own account of its figures travels with it.
    assert!(text.starts_with(&StressProfile::SubmissionPop3.header()), "{text}");
    let plan: StressSpec = serde_yaml_ng::from_str(&text).unwrap();
    let profile = StressProfile::SubmissionPop3.spec().unwrap();
    assert_eq!(plan.scenarios, profile.scenarios, "the profile's scenarios, unchanged");
    // Targets: this cluster's Services, on the ports and TLS modes the profile asks for.
    let t = plan.targets.unwrap();
    let endpoint = |e: Option<EndpointSpec>| e.map(|e| (e.address, e.tls, e.verify));
    assert_eq!(
        endpoint(t.submissions),
        Some(("post-submission.mail.svc:4465".into(), TlsMode::Implicit, false))
    );
    assert_eq!(
        endpoint(t.submission),
        Some(("post-submission.mail.svc:587".into(), TlsMode::Starttls, false))
    );
    assert_eq!(endpoint(t.pop3), Some(("post-pop3.mail.svc:995".into(), TlsMode::Implicit, false)));
    // The profile's number of users, named as this cluster's test accounts.
    let users = plan.users.unwrap();
    assert_eq!(
        (users.template.as_str(), users.count),
        ("stress{:04}@example.net", profile.users.unwrap().count)
    );
    // The cluster's own SLO fields win; the rest are the profile's.
    assert_eq!(plan.slo.smtp_p95_ms, Some(200.0));
    assert_eq!(plan.slo.success_rate, profile.slo.success_rate);

    // Without a profile, the runner's defaults run over STARTTLS on the standard ports.
    let mut plain = mc.clone();
    plain.spec.stress.as_mut().unwrap().profile = None;
    let b = steady(&plain);
    let cm: ConfigMap = get(&b, ChildKind::ConfigMap, "post-stress");
    let plan: StressSpec = serde_yaml_ng::from_str(&cm.data.unwrap()[key]).unwrap();
    assert!(plan.scenarios.is_empty());
    let t = plan.targets.unwrap();
    assert_eq!(endpoint(t.pop3), Some(("post-pop3.mail.svc:110".into(), TlsMode::Starttls, false)));
}

#[test]
fn migration_holds_deployments_on_the_old_image() {
    let mc = fixture("full");
    let new = mc.spec.image.reference();
    let old = "registry.example.com/mailcluster:1.1.0".to_string();
    let ctx = BuildContext { migrated_image: Some(old.clone()), ..BuildContext::steady_state(&mc) };
    let b = build(&mc, &ctx).unwrap();
    assert_eq!(b.rollout, Rollout::HeldForMigration { running: old.clone(), wanted: new.clone() });
    for d in b.of_kind(ChildKind::Deployment) {
        let d: Deployment = d.to_typed().unwrap();
        // rspamd and its Redis run their own images, untouched by the schema.
        let expected = match d.metadata.name.as_deref() {
            Some("prod-rspamd") => "rspamd/rspamd:3.12",
            Some("prod-rspamd-redis") => "redis:7.4-alpine",
            _ => old.as_str(),
        };
        assert_eq!(container(&d).image.as_deref(), Some(expected));
    }
    let job: Job = get(&b, ChildKind::Job, &b.migration_job);
    let pod = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.containers[0].image.as_deref(), Some(new.as_str()));
    assert_eq!(
        pod.containers[0].args.as_ref().unwrap(),
        &[
            "migrate",
            "--config",
            "/etc/mailcluster/migrate.toml",
            "--domain",
            "example.com",
            "--domain",
            "example.org"
        ]
    );
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    // A domain added to the spec is a new Job (a Job's template is immutable); the
    // rollout does not wait for it once the image is migrated.
    let mut more = mc.clone();
    more.spec.domains.push("example.net".into());
    let again = build(&more, &BuildContext::steady_state(&more)).unwrap();
    assert_ne!(again.migration_job, b.migration_job);
    assert_eq!(again.rollout, Rollout::Current);

    // First install: no mail pod runs until the schema exists (rspamd, which
    // does not use it, starts meanwhile).
    let ctx = BuildContext { migrated_image: None, ..BuildContext::steady_state(&mc) };
    let b = build(&mc, &ctx).unwrap();
    assert!(matches!(b.rollout, Rollout::AwaitingFirstMigration { .. }));
    assert_eq!(names_of(&b, ChildKind::Deployment), ["prod-rspamd", "prod-rspamd-redis"]);
    assert_eq!(b.of_kind(ChildKind::HorizontalPodAutoscaler).count(), 0);
    assert!(b.get(ChildKind::Job, &b.migration_job).is_some());
    assert!(b.get(ChildKind::Service, "prod-smtp").is_some());

    // A different image gets a different Job (Job templates are immutable).
    let mut mc2 = mc.clone();
    mc2.spec.image.tag = "1.3.0".into();
    assert_ne!(steady(&mc2).migration_job, steady(&mc).migration_job);
}

#[test]
fn budget_caps_hpa_max_replicas_proportionally() {
    let mut mc = fixture("full");
    mc.spec.postgres.max_connections = 200;
    let b = steady(&mc);
    // 200 − 20 reserved − 6 jobs = 174 → 17 pods of 10; pop3 fixed 2 (+1 surge) = 3;
    // 14 left shared 21 : 9 : 9 (max+1) → 8, 3, 3 pods → maxReplicas 7, 2, 2.
    let caps: Vec<(String, i32)> = ["smtp", "submission", "imap"]
        .iter()
        .map(|p| {
            let h: HorizontalPodAutoscaler =
                get(&b, ChildKind::HorizontalPodAutoscaler, &format!("prod-{p}"));
            (p.to_string(), h.spec.unwrap().max_replicas)
        })
        .collect();
    assert_eq!(caps, [("smtp".into(), 7), ("submission".into(), 2), ("imap".into(), 2)]);
    assert!(b.budget.capped());
    assert!(b.budget.planned <= 174, "{}", b.budget.planned);
    assert_eq!(b.budget.requested, 420);
    assert!(b.warnings.iter().any(|w| w.contains("smtp maxReplicas 20→7")), "{:?}", b.warnings);

    // Not even minReplicas fit: invalid, nothing built.
    mc.spec.postgres.max_connections = 100;
    let err = build(&mc, &BuildContext::steady_state(&mc)).unwrap_err();
    assert!(err.to_string().contains("cannot hold"), "{err}");

    // Within budget: nothing capped.
    let b = steady(&fixture("full"));
    assert!(!b.budget.capped());
    assert!(b.warnings.is_empty(), "{:?}", b.warnings);
}

/// `spec.tuning` becomes the mail pods' sysctls, exactly those given and in a
/// fixed order; without it the pods carry none, and Jobs never do.
#[test]
fn tuning_renders_exactly_its_sysctls_and_none_without_it() {
    let sysctls_of = |b: &Built, name: &str| {
        let d: Deployment = get(b, ChildKind::Deployment, name);
        let pod = d.spec.unwrap().template.spec.unwrap();
        pod.security_context
            .unwrap()
            .sysctls
            .map(|s| s.into_iter().map(|s| (s.name, s.value)).collect::<Vec<_>>())
    };
    let mut mc = fixture("minimal");
    let b = steady(&mc);
    for name in names_of(&b, ChildKind::Deployment) {
        assert_eq!(sysctls_of(&b, &name), None, "{name}: no tuning, no sysctls");
    }
    mc.spec.tuning = Some(serde_json::from_value(serde_json::json!({})).unwrap());
    assert_eq!(sysctls_of(&steady(&mc), "mail-smtp"), None, "an empty section asks for nothing");

    mc.spec.tuning = Some(
        serde_json::from_value(serde_json::json!({
            "somaxconn": 8192,
            "ipLocalPortRange": "16384  65535",
            "tcpKeepaliveTime": 300,
            "tcpKeepaliveIntvl": 30,
            "tcpKeepaliveProbes": 5,
            "tcpFinTimeout": 15,
            "tcpRmem": "4096\t87380 6291456",
            "tcpWmem": "4096 65536 4194304",
        }))
        .unwrap(),
    );
    let b = steady(&mc);
    let want: Vec<(String, String)> = [
        ("net.ipv4.ip_local_port_range", "16384 65535"),
        ("net.ipv4.tcp_keepalive_time", "300"),
        ("net.ipv4.tcp_keepalive_intvl", "30"),
        ("net.ipv4.tcp_keepalive_probes", "5"),
        ("net.ipv4.tcp_fin_timeout", "15"),
        ("net.ipv4.tcp_rmem", "4096 87380 6291456"),
        ("net.ipv4.tcp_wmem", "4096 65536 4194304"),
        ("net.core.somaxconn", "8192"),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect();
    for name in names_of(&b, ChildKind::Deployment) {
        assert_eq!(sysctls_of(&b, &name).as_ref(), Some(&want), "{name}");
    }
    // The listeners' own keepalive on client sockets follows the sysctls.
    let config: ConfigMap = get(&b, ChildKind::ConfigMap, "mail-config");
    let smtp: toml::Table = toml::from_str(&config.data.unwrap()["smtp.toml"]).unwrap();
    assert_eq!(smtp["net"]["tcp_keepalive_secs"].as_integer(), Some(300));
    assert_eq!(smtp["net"]["tcp_keepalive_interval_secs"].as_integer(), Some(30));
    let job: Job = get(&b, ChildKind::Job, &b.migration_job);
    let job_pod = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(job_pod.security_context.unwrap().sysctls, None, "the migration Job serves no connections");

    mc.spec.tuning = Some(serde_json::from_value(serde_json::json!({"tcpFinTimeout": 20})).unwrap());
    let only = [("net.ipv4.tcp_fin_timeout".to_string(), "20".to_string())];
    assert_eq!(sysctls_of(&steady(&mc), "mail-imap").as_deref(), Some(&only[..]));
}

#[test]
fn tuning_values_the_kernel_would_refuse_are_invalid() {
    let problems = |tuning: serde_json::Value| {
        let mut mc = fixture("minimal");
        mc.spec.tuning = Some(serde_json::from_value(tuning).unwrap());
        match build(&mc, &BuildContext::steady_state(&mc)) {
            Ok(_) => String::new(),
            Err(e) => e.problems.join("\n"),
        }
    };
    for (tuning, needle) in [
        (serde_json::json!({"ipLocalPortRange": "60000 50000"}), "tuning.ipLocalPortRange \"60000 50000\""),
        (serde_json::json!({"ipLocalPortRange": "80 65535"}), "1024 <= LOW"),
        (serde_json::json!({"ipLocalPortRange": "16384"}), "must be \"LOW HIGH\""),
        (serde_json::json!({"ipLocalPortRange": "16384 70000"}), "HIGH <= 65535"),
        (serde_json::json!({"ipLocalPortRange": "a b"}), "must be \"LOW HIGH\""),
        (serde_json::json!({"ipLocalPortRange": "9000 12000"}), "contains ports the pods listen on: 10025"),
        (serde_json::json!({"ipLocalPortRange": "7000 7100"}), "listen on: 7025"),
        (serde_json::json!({"tcpRmem": "4096 87380"}), "tuning.tcpRmem \"4096 87380\" must be"),
        (serde_json::json!({"tcpWmem": "65536 4096 4194304"}), "tuning.tcpWmem"),
        (serde_json::json!({"tcpWmem": "0 4096 4194304"}), "1 <= MIN"),
        (serde_json::json!({"tcpRmem": "4096 87380 4294967296"}), "MAX <= 2147483647"),
        (
            serde_json::json!({"tcpKeepaliveTime": 0}),
            "tuning.tcpKeepaliveTime must be within 1..32767 (got 0)",
        ),
        (serde_json::json!({"tcpKeepaliveIntvl": 40000}), "tuning.tcpKeepaliveIntvl must be within"),
        (serde_json::json!({"tcpKeepaliveProbes": 128}), "tuning.tcpKeepaliveProbes must be within 1..127"),
        (serde_json::json!({"tcpFinTimeout": 0}), "tuning.tcpFinTimeout must be within 1..600"),
        (serde_json::json!({"somaxconn": 70000}), "tuning.somaxconn must be within 1..65535 (got 70000)"),
    ] {
        let all = problems(tuning.clone());
        assert!(all.contains(needle), "{tuning}: missing {needle:?} in:\n{all}");
    }
    // Every problem at once, like the rest of the spec's.
    let all = problems(serde_json::json!({"somaxconn": 0, "tcpFinTimeout": 0, "tcpRmem": "x"}));
    assert_eq!(all.lines().count(), 3, "{all}");
    // Within range, and clear of the listening ports on either side.
    for fine in [
        serde_json::json!({"ipLocalPortRange": "14191 65535", "somaxconn": 65535, "tcpKeepaliveProbes": 1}),
        serde_json::json!({"ipLocalPortRange": "1024 7024"}),
        serde_json::json!({"ipLocalPortRange": "10996 14189"}),
        serde_json::json!({"ipLocalPortRange": "10600 10900", "tcpRmem": "1 1 2147483647"}),
    ] {
        assert_eq!(problems(fine.clone()), "", "{fine}");
    }
}

#[test]
fn invalid_fixture_reports_every_problem() {
    let mc = fixture("invalid");
    let err = build(&mc, &BuildContext::steady_state(&mc)).unwrap_err();
    let all = err.problems.join("\n");
    for needle in [
        "\"bad domain\" is not a valid DNS name",
        "smtp.service.ports: imap is not a listener of smtp",
        "imap: autoscaling.minReplicas (5) exceeds maxReplicas (2)",
        "tls: set exactly one of secretName or issuerRef",
        "proxyProtocol.trustedCidrs is required",
        "stress.slo.successRate must be within 0..100",
    ] {
        assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
    }
}

#[test]
fn pure_build_is_deterministic() {
    let mc = fixture("full");
    let ctx = BuildContext::steady_state(&mc);
    assert_eq!(build(&mc, &ctx).unwrap(), build(&mc, &ctx).unwrap());
}

#[test]
fn render_prints_every_object() {
    let text =
        std::fs::read_to_string(format!("{}/tests/fixtures/full.yaml", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let out = mailcluster_operator::render(&text).unwrap();
    let mc = fixture("full");
    let n = steady(&mc).children.len();
    assert_eq!(out.matches("\n---\n").count() + usize::from(out.starts_with("---\n")), n);
    let bad = std::fs::read_to_string(format!("{}/tests/fixtures/invalid.yaml", env!("CARGO_MANIFEST_DIR")))
        .unwrap();
    assert!(mailcluster_operator::render(&bad).is_err());
}

#[test]
fn stress_users_given_by_count_are_this_clusters_test_accounts() {
    let mut mc = fixture("stress-profile");
    let plan_of = |mc: &MailCluster| -> StressSpec {
        let cm: ConfigMap = get(&steady(mc), ChildKind::ConfigMap, "post-stress");
        serde_yaml_ng::from_str(&cm.data.unwrap()["stress.yaml"]).unwrap()
    };
    // `users: {count: 7}`: seven of the cluster's own accounts, in its first domain
    // (the runner's default template names a domain the cluster does not serve).
    let stress = mc.spec.stress.as_mut().unwrap();
    stress.users = Some(serde_json::from_value(serde_json::json!({"count": 7})).unwrap());
    let users = plan_of(&mc).users.unwrap();
    assert_eq!((users.template.as_str(), users.count), ("stress{:04}@example.net", 7));
    // A template of the user's own is kept as written.
    let stress = mc.spec.stress.as_mut().unwrap();
    stress.users = Some(
        serde_json::from_value(serde_json::json!({"template": "load{}@example.net", "count": 3})).unwrap(),
    );
    let users = plan_of(&mc).users.unwrap();
    assert_eq!((users.template.as_str(), users.count), ("load{}@example.net", 3));
}

/// `spec.filter.rspamd`: its settings in the files of the pods that talk to
/// rspamd (smtp and submission scan, imap teaches it), its password from the
/// Secret into their environment only, and the NetworkPolicy's egress open to
/// its port.
#[test]
fn rspamd_reaches_the_pods_that_scan_and_learn() {
    let mut mc = fixture("full");
    mc.spec.filter = Some(
        serde_yaml_ng::from_str(
            "rspamd:\n  url: http://rspamd.mail.svc:11334\n  passwordSecretRef: {name: rspamd}\n  \
             failMode: closed\n  scanSubmission: true\n  timeoutMs: 1500\n",
        )
        .expect("filter parses"),
    );
    let b = steady(&mc);
    let cm: ConfigMap = get(&b, ChildKind::ConfigMap, "prod-config");
    let data = cm.data.unwrap();
    for key in ["smtp.toml", "submission.toml", "imap.toml"] {
        let r = server_loads(key, &data[key]).filter.rspamd;
        assert_eq!(r.url, "http://rspamd.mail.svc:11334", "{key}");
        assert_eq!(r.fail_mode, mailcluster_api::config::FailMode::Closed, "{key}");
        assert!(r.scan_submission, "{key}");
        assert_eq!(r.timeout_ms, 1500, "{key}");
        assert!(r.password.is_none(), "{key}: the password comes from the Secret, not the ConfigMap");
    }
    for key in ["pop3.toml", "migrate.toml"] {
        assert!(server_loads(key, &data[key]).filter.rspamd.url.is_empty(), "{key}");
    }
    let password = |name: &str| {
        let d: Deployment = get(&b, ChildKind::Deployment, name);
        container(&d).env.unwrap().into_iter().find(|e| e.name == "MAILCLUSTER_FILTER__RSPAMD__PASSWORD").map(
            |e| {
                let sel = e.value_from.unwrap().secret_key_ref.unwrap();
                (sel.name, sel.key)
            },
        )
    };
    for name in ["prod-smtp", "prod-submission", "prod-imap"] {
        assert_eq!(password(name), Some(("rspamd".to_string(), "password".to_string())), "{name}");
    }
    assert_eq!(password("prod-pop3"), None);

    let egress_ports = |mc: &MailCluster| -> Vec<i64> {
        let np = steady(mc).get(ChildKind::NetworkPolicy, "prod").expect("NetworkPolicy").object.data.clone();
        np["spec"]["egress"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["port"].as_i64().unwrap())
            .collect()
    };
    assert!(egress_ports(&mc).contains(&11334));
    // A URL without a port: HTTP's.
    mc.spec.filter.as_mut().unwrap().rspamd.as_mut().unwrap().url = Some("http://rspamd".into());
    assert!(egress_ports(&mc).contains(&80));
    mc.spec.filter = None;
    assert!(!egress_ports(&mc).contains(&11334));
}

/// `spec.filter.rspamd.deploy`: the operator runs the user's rspamd image and
/// a Redis of its own; the pods that scan and learn are pointed at its
/// Service with the password from the Secret the operator makes; passwords
/// never appear in a ConfigMap; each of the two takes connections only from
/// who needs it.
#[test]
fn rspamd_run_by_the_operator() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let mc = fixture("full");
    let b = steady(&mc);
    let ns = names::namespace(&mc);

    // The pods that talk to rspamd find it at its Service, with the generated password.
    let cm: ConfigMap = get(&b, ChildKind::ConfigMap, "prod-config");
    let data = cm.data.unwrap();
    for key in ["smtp.toml", "submission.toml", "imap.toml"] {
        assert_eq!(
            server_loads(key, &data[key]).filter.rspamd.url,
            format!("http://prod-rspamd.{ns}.svc:11334")
        );
    }
    for name in ["prod-smtp", "prod-submission", "prod-imap"] {
        let d: Deployment = get(&b, ChildKind::Deployment, name);
        let env = container(&d).env.unwrap();
        let sel = env
            .iter()
            .find(|e| e.name == "MAILCLUSTER_FILTER__RSPAMD__PASSWORD")
            .and_then(|e| e.value_from.clone())
            .and_then(|v| v.secret_key_ref)
            .unwrap_or_else(|| panic!("{name}: rspamd's password from a Secret"));
        assert_eq!((sel.name.as_str(), sel.key.as_str()), ("prod-rspamd", "password"), "{name}");
    }

    // rspamd: the user's image, the operator's files mounted one by one over
    // the image's configuration, the passwords included from the Secret.
    let d: Deployment = get(&b, ChildKind::Deployment, "prod-rspamd");
    let c = container(&d);
    assert_eq!(c.image.as_deref(), Some("rspamd/rspamd:3.12"));
    let mounts: Vec<(String, Option<String>)> =
        c.volume_mounts.unwrap().into_iter().map(|m| (m.mount_path, m.sub_path)).collect();
    for (path, key) in [
        ("/etc/rspamd/override.d/worker-controller.inc", "worker-controller.inc"),
        ("/etc/rspamd/local.d/redis.conf", "redis.conf"),
        ("/etc/rspamd/local.d/http_headers.conf", "http_headers.conf"),
    ] {
        assert!(mounts.contains(&(path.to_string(), Some(key.to_string()))), "{path}: {mounts:?}");
    }
    assert!(mounts.contains(&("/etc/mailcluster-rspamd".to_string(), None)), "{mounts:?}");
    let pod = d.spec.as_ref().unwrap().template.spec.clone().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    let secret = pod.volumes.unwrap().into_iter().find_map(|v| v.secret).expect("Secret volume");
    assert_eq!(secret.secret_name.as_deref(), Some("prod-rspamd"));
    let rcm: ConfigMap = get(&b, ChildKind::ConfigMap, "prod-rspamd");
    let files = rcm.data.unwrap();
    let controller = &files["worker-controller.inc"];
    assert!(controller.contains("bind_socket = \"*:11334\";"), "{controller}");
    assert!(controller.contains("count = 3;"), "workers: {controller}");
    assert!(controller.contains("secure_ip = [];"), "no password-free address: {controller}");
    assert!(controller.contains(".include \"/etc/mailcluster-rspamd/controller.inc\""), "{controller}");
    assert!(
        files["redis.conf"].contains("servers = \"prod-rspamd-redis:6379\";"),
        "{:?}",
        files["redis.conf"]
    );
    assert!(
        files.values().all(|f| !f.contains("password =") && !f.contains("requirepass")),
        "no password in the ConfigMap: {files:?}"
    );
    let svc: Service = get(&b, ChildKind::Service, "prod-rspamd");
    assert_eq!(svc.spec.unwrap().ports.unwrap()[0].port, 11334);

    // Its Redis: a password from the same Secret, no root, append-only file.
    let r: Deployment = get(&b, ChildKind::Deployment, "prod-rspamd-redis");
    let rc = container(&r);
    assert_eq!(rc.image.as_deref(), Some("redis:7.4-alpine"));
    let args = rc.args.unwrap();
    assert_eq!(args, ["/etc/mailcluster-redis/redis-server.conf", "--requirepass", "$(REDIS_PASSWORD)"]);
    assert!(files["redis-server.conf"].contains("appendonly yes\n"), "{:?}", files["redis-server.conf"]);
    let pw = rc.env.unwrap().into_iter().find(|e| e.name == "REDIS_PASSWORD").unwrap();
    let sel = pw.value_from.unwrap().secret_key_ref.unwrap();
    assert_eq!((sel.name.as_str(), sel.key.as_str()), ("prod-rspamd", "redis-password"));
    assert_eq!(rc.security_context.unwrap().run_as_non_root, Some(true));
    let svc: Service = get(&b, ChildKind::Service, "prod-rspamd-redis");
    assert_eq!(svc.spec.unwrap().ports.unwrap()[0].port, 6379);

    // Who may connect: the mail pods to rspamd, rspamd to its Redis.
    let from = |name: &str| {
        let np: NetworkPolicy = get(&b, ChildKind::NetworkPolicy, name);
        let spec = np.spec.unwrap();
        let rule = spec.ingress.unwrap().remove(0);
        let peer = rule.from.unwrap().remove(0).pod_selector.unwrap().match_labels.unwrap();
        let port = rule.ports.unwrap()[0].port.clone();
        (spec.pod_selector.unwrap().match_labels.unwrap(), peer, port)
    };
    let (target, peer, port) = from("prod-rspamd");
    assert_eq!(target[names::COMPONENT_LABEL], "rspamd");
    assert_eq!(peer.get("mailcluster.dev/role").map(String::as_str), Some("server"), "{peer:?}");
    assert_eq!(port, Some(IntOrString::Int(11334)));
    let (target, peer, port) = from("prod-rspamd-redis");
    assert_eq!(target[names::COMPONENT_LABEL], "rspamd-redis");
    assert_eq!(peer[names::COMPONENT_LABEL], "rspamd");
    assert_eq!(port, Some(IntOrString::Int(6379)));

    // Without `deploy` none of it is built.
    let mut plain = mc.clone();
    plain.spec.filter = None;
    let b = steady(&plain);
    for kind in [ChildKind::Deployment, ChildKind::Service, ChildKind::ConfigMap, ChildKind::NetworkPolicy] {
        assert!(names_of(&b, kind).iter().all(|n| !n.contains("rspamd")), "{kind:?}");
    }

    // Exactly one of url and deploy; deploy brings its own password.
    let mut both = mc.clone();
    both.spec.filter.as_mut().unwrap().rspamd.as_mut().unwrap().url = Some("http://rspamd:11334".into());
    assert!(build(&both, &BuildContext::steady_state(&both)).is_err());
    let mut neither = mc.clone();
    neither.spec.filter.as_mut().unwrap().rspamd.as_mut().unwrap().deploy = None;
    assert!(build(&neither, &BuildContext::steady_state(&neither)).is_err());
    let mut own_password = mc;
    own_password.spec.filter.as_mut().unwrap().rspamd.as_mut().unwrap().password_secret_ref =
        serde_yaml_ng::from_str("{name: mine}").unwrap();
    assert!(build(&own_password, &BuildContext::steady_state(&own_password)).is_err());
}
