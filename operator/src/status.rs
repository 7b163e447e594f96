//! Status as a pure function of what reconcile saw and did.
//!
//! Conditions keep their `lastTransitionTime` while their status stays the same, so
//! `kubectl describe` shows when something actually changed, not when the operator
//! last looked; only a status change (True/False/Unknown) moves it.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Sysctl};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use mailcluster_api::{MailCluster, MailClusterStatus, Phase, Protocol, ProtocolStatus};

use crate::budget::Budget;
use crate::build::Rollout;

pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
pub const SLO_MET: &str = "SLOMet";
/// Present while `spec.tuning` gives the pods sysctls: False when a mail pod was
/// refused for one of them.
pub const SYSCTLS_ALLOWED: &str = "SysctlsAllowed";
/// The reason the kubelet gives a pod it refuses for its sysctls, and ours for
/// SysctlsAllowed False.
pub const SYSCTL_FORBIDDEN: &str = "SysctlForbidden";

/// A mail pod refused for the sysctls it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlRefusal {
    /// `pod NAME on node NODE`, or `Deployment NAME` when admission refused to
    /// create its pods.
    pub what: String,
    /// The refusal in its own words, which name the sysctl.
    pub message: String,
}

fn pod_sysctls(pod: &Pod) -> &[Sysctl] {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|c| c.sysctls.as_deref())
        .unwrap_or_default()
}

fn pod_phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// The pods among `pods` the kubelet refused for their sysctls (phase Failed,
/// reason SysctlForbidden), newest first. Only refusals that still speak for
/// the spec count: of pods carrying exactly the sysctls it asks for now (a pod
/// of an earlier tuning stays Failed until it is collected), on a node that has
/// not started a pod carrying them since (its kubelet was allowed the sysctl
/// meanwhile).
pub fn refused_pods(pods: &[Pod], wanted: &[Sysctl]) -> Vec<SysctlRefusal> {
    let node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
    let current: Vec<&Pod> = pods.iter().filter(|p| pod_sysctls(p) == wanted).collect();
    let mut started: BTreeMap<String, Time> = BTreeMap::new();
    for p in current.iter().filter(|p| pod_phase(p) == Some("Running")) {
        if let (Some(n), Some(t)) = (node(p), p.metadata.creation_timestamp.clone()) {
            let newest = started.entry(n).or_insert_with(|| t.clone());
            if t > *newest {
                *newest = t;
            }
        }
    }
    let mut refused: Vec<(&Pod, Option<String>)> = current
        .into_iter()
        .filter(|p| {
            pod_phase(p) == Some("Failed")
                && p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some(SYSCTL_FORBIDDEN)
        })
        .map(|p| (p, node(p)))
        .filter(|(p, n)| {
            // Kept unless its node started a pod carrying them after it.
            let started_since = n.as_ref().and_then(|n| started.get(n));
            started_since.is_none_or(|s| p.metadata.creation_timestamp.as_ref().is_some_and(|t| s <= t))
        })
        .collect();
    refused.sort_by(|(a, _), (b, _)| {
        b.metadata
            .creation_timestamp
            .cmp(&a.metadata.creation_timestamp)
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    refused
        .into_iter()
        .map(|(p, n)| {
            let name = p.metadata.name.as_deref().unwrap_or("?");
            let what = match n {
                Some(n) => format!("pod {name} on node {n}"),
                None => format!("pod {name}"),
            };
            let message = p.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default();
            SysctlRefusal { what, message }
        })
        .collect()
}

/// Admission's refusal to create a Deployment's pods for their sysctls (a
/// namespace whose PodSecurity level forbids them): its ReplicaFailure condition.
pub fn refused_creation(d: &Deployment) -> Option<SysctlRefusal> {
    let conditions = d.status.as_ref()?.conditions.as_ref()?;
    let failure = conditions.iter().find(|c| c.type_ == "ReplicaFailure" && c.status == "True")?;
    let message = failure.message.clone()?;
    message.contains("sysctl").then(|| SysctlRefusal {
        what: format!("Deployment {}", d.metadata.name.as_deref().unwrap_or("?")),
        message,
    })
}

/// SysctlsAllowed from what reconcile saw: the refusals, or why the pods could
/// not be read.
fn sysctl_condition(seen: &Result<Vec<SysctlRefusal>, String>) -> (&'static str, &'static str, String) {
    match seen {
        Err(e) => ("Unknown", "PodsUnreadable", format!("cannot list the mail pods: {e}")),
        Ok(refusals) => match refusals.first() {
            None => ("True", "NoneRefused", "no mail pod was refused for its sysctls".into()),
            Some(first) => {
                let more = match refusals.len() - 1 {
                    0 => String::new(),
                    n => format!(" ({n} more refused)"),
                };
                (
                    "False",
                    SYSCTL_FORBIDDEN,
                    format!(
                        "{}: {}{more}; allow the sysctl where it was refused (the kubelet's \
                         --allowed-unsafe-sysctls, the namespace's PodSecurity level) or take it out \
                         of spec.tuning",
                        first.what, first.message
                    ),
                )
            }
        },
    }
}

/// Observed replicas of one protocol's Deployment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replicas {
    /// What the Deployment asks for (`spec.replicas`, as the HPA set it).
    pub desired: i32,
    pub replicas: i32,
    pub ready: i32,
    pub updated: i32,
    /// The deployment controller has seen the current generation: until it has,
    /// the counts describe the previous spec (or, for a new Deployment, nothing).
    pub observed: bool,
}

impl Replicas {
    /// Every wanted pod runs the current spec and is ready, and no old pod is left.
    pub fn settled(&self) -> bool {
        self.observed
            && self.updated >= self.desired
            && self.ready >= self.desired
            && self.replicas == self.updated
    }
}

/// What reconcile ended with.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Children applied.
    Applied {
        budget: Budget,
        rollout: Rollout,
        replicas: BTreeMap<Protocol, Replicas>,
        migrated_image: Option<String>,
        warnings: Vec<String>,
        /// Mail pods refused for their sysctls, or why the pods could not be read
        /// (looked for only when the spec gives the pods sysctls).
        sysctl_refusals: Result<Vec<SysctlRefusal>, String>,
    },
    /// `spec.paused`: nothing applied.
    Paused,
    /// The spec is invalid: nothing applied until it changes.
    Invalid { message: String },
    /// Something outside the spec blocks progress (a missing Secret, a failed migration).
    Blocked { reason: String, message: String },
}

fn cond(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
    prev: &[Condition],
) -> Condition {
    let last = prev
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: last,
    }
}

/// SLOMet follows `status.lastStress` (written by the stress Job).
fn slo_condition(prev: &MailClusterStatus) -> (&'static str, &'static str, String) {
    match &prev.last_stress {
        None => ("Unknown", "NoStressRun", "no stress run has reported yet".into()),
        Some(r) => {
            let job = r.job.as_deref().unwrap_or("stress run");
            let p95: Vec<String> = r.p95_ms.iter().map(|(op, ms)| format!("{op} p95 {ms:.0}ms")).collect();
            let sep = if p95.is_empty() { "" } else { ", " };
            let figures = format!("success {:.2}%{sep}{}", r.success_rate, p95.join(", "));
            let saturated = if r.generator_saturated { " (load generator saturated)" } else { "" };
            match r.verdict.as_str() {
                "Pass" => ("True", "StressPassed", format!("{job} met every SLO: {figures}{saturated}")),
                "Fail" => ("False", "StressFailed", format!("{job} missed an SLO: {figures}{saturated}")),
                other => ("Unknown", "StressError", format!("{job} reported verdict {other:?}")),
            }
        }
    }
}

pub fn compute(mc: &MailCluster, outcome: &Outcome, now: &Time) -> MailClusterStatus {
    let prev = mc.status.clone().unwrap_or_default();
    let generation = mc.metadata.generation;
    let c = |t: &str, s: &str, r: &str, m: String| cond(t, s, r, m, generation, now, &prev.conditions);
    let mut st = MailClusterStatus {
        observed_generation: generation,
        last_stress: prev.last_stress.clone(),
        unmanaged_accounts: prev.unmanaged_accounts.clone(),
        migrated_image: prev.migrated_image.clone(),
        smtp: prev.smtp.clone(),
        submission: prev.submission.clone(),
        imap: prev.imap.clone(),
        pop3: prev.pop3.clone(),
        ..Default::default()
    };
    let (slo_s, slo_r, slo_m) = slo_condition(&prev);
    let slo = c(SLO_MET, slo_s, slo_r, slo_m);
    let keep = |t: &str, fallback: Condition| prev.condition(t).cloned().unwrap_or(fallback);
    let has_sysctls = !mc.spec.sysctls().is_empty();

    match outcome {
        Outcome::Applied { budget, rollout, replicas, migrated_image, warnings, sysctl_refusals } => {
            st.migrated_image = migrated_image.clone();
            let mut not_ready = Vec::new();
            let mut rolling = Vec::new();
            for p in Protocol::ALL {
                let slot = st.protocol_mut(p);
                let Some(b) = budget.protocols.get(&p) else {
                    *slot = None;
                    continue;
                };
                let r = replicas.get(&p).copied().unwrap_or_default();
                *slot = Some(ProtocolStatus {
                    replicas: r.replicas,
                    ready_replicas: r.ready,
                    max_replicas: Some(b.max_replicas),
                });
                let wants_pods = b.autoscaled || b.max_replicas > 0;
                if wants_pods && r.ready < 1 {
                    not_ready.push(p.name());
                }
                if !r.settled() {
                    rolling.push(p.name());
                }
            }
            let ready = if not_ready.is_empty() {
                c(READY, "True", "AllProtocolsServing", "every enabled protocol has ready pods".into())
            } else {
                c(READY, "False", "PodsNotReady", format!("no ready pods for {}", not_ready.join(", ")))
            };
            let progressing = match rollout {
                Rollout::AwaitingFirstMigration { wanted } => c(
                    PROGRESSING,
                    "True",
                    "MigrationRunning",
                    format!("waiting for the schema migration of {wanted}"),
                ),
                Rollout::HeldForMigration { running, wanted } => c(
                    PROGRESSING,
                    "True",
                    "MigrationRunning",
                    format!("pods stay on {running} until the schema migration of {wanted} completes"),
                ),
                Rollout::Current if !rolling.is_empty() => {
                    c(PROGRESSING, "True", "RollingOut", format!("rolling out {}", rolling.join(", ")))
                }
                Rollout::Current => c(PROGRESSING, "False", "Stable", "all pods run the current spec".into()),
            };
            let (sysctls_s, sysctls_r, sysctls_m) = sysctl_condition(sysctl_refusals);
            // Pods refused for a sysctl never serve: that outranks a cap.
            let degraded = if has_sysctls && sysctls_s == "False" {
                c(DEGRADED, "True", sysctls_r, sysctls_m.clone())
            } else if budget.capped() {
                c(DEGRADED, "True", "ConnectionBudgetCapped", budget.summary())
            } else if let Some(w) = warnings.first() {
                c(DEGRADED, "True", "Warning", w.clone())
            } else {
                c(DEGRADED, "False", "AsExpected", budget.summary())
            };
            st.phase = Some(match rollout {
                Rollout::AwaitingFirstMigration { .. } => Phase::Pending,
                Rollout::HeldForMigration { .. } => Phase::Migrating,
                Rollout::Current => Phase::Running,
            });
            st.conditions = vec![ready, progressing, degraded, slo];
            if has_sysctls {
                st.conditions.push(c(SYSCTLS_ALLOWED, sysctls_s, sysctls_r, sysctls_m));
            }
        }
        Outcome::Paused => {
            st.phase = Some(Phase::Paused);
            let ready = keep(READY, c(READY, "Unknown", "Paused", "spec.paused is true".into()));
            let progressing = c(
                PROGRESSING,
                "False",
                "Paused",
                "spec.paused is true: child objects are not changed".into(),
            );
            let degraded = keep(DEGRADED, c(DEGRADED, "False", "Paused", "spec.paused is true".into()));
            st.conditions = vec![ready, progressing, degraded, slo];
        }
        Outcome::Invalid { message } => {
            st.phase = Some(Phase::Degraded);
            let ready = keep(READY, c(READY, "False", "InvalidSpec", message.clone()));
            let progressing = c(PROGRESSING, "False", "InvalidSpec", "waiting for a corrected spec".into());
            let degraded = c(DEGRADED, "True", "InvalidSpec", message.clone());
            st.conditions = vec![ready, progressing, degraded, slo];
        }
        Outcome::Blocked { reason, message } => {
            st.phase = Some(Phase::Degraded);
            let ready = keep(READY, c(READY, "False", reason, message.clone()));
            let progressing = c(PROGRESSING, "False", reason, message.clone());
            let degraded = c(DEGRADED, "True", reason, message.clone());
            st.conditions = vec![ready, progressing, degraded, slo];
        }
    }
    // Nothing was looked at: what was last seen stands while the spec still asks
    // for sysctls.
    if has_sysctls
        && !matches!(outcome, Outcome::Applied { .. })
        && let Some(seen) = prev.condition(SYSCTLS_ALLOWED)
    {
        st.conditions.push(seen.clone());
    }
    st
}

/// Conditions whose status changed from `old` to `new` (for events).
pub fn transitions<'a>(old: Option<&MailClusterStatus>, new: &'a MailClusterStatus) -> Vec<&'a Condition> {
    new.conditions
        .iter()
        .filter(|c| {
            old.and_then(|o| o.condition(&c.type_))
                .is_none_or(|p| p.status != c.status || p.reason != c.reason)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
    use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::build::{BuildContext, build};

    #[test]
    fn a_deployment_is_settled_only_once_its_controller_has_caught_up() {
        let done = Replicas { desired: 2, replicas: 2, ready: 2, updated: 2, observed: true };
        assert!(done.settled());
        // Just created: the deployment controller has not written a status yet, so
        // every count is 0 — nothing is settled, not "0 of 0 ready".
        assert!(!Replicas { desired: 2, observed: false, ..Default::default() }.settled());
        // Counts of the previous generation.
        assert!(!Replicas { observed: false, ..done }.settled());
        // Scaled up by the HPA: the new pods are not ready yet.
        assert!(!Replicas { desired: 3, ..done }.settled());
        // Rolling: an old pod is still there beside the updated ones.
        assert!(!Replicas { replicas: 3, ..done }.settled());
    }

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + second).unwrap())
    }

    fn sysctls(pairs: &[(&str, &str)]) -> Vec<Sysctl> {
        pairs.iter().map(|(n, v)| Sysctl { name: n.to_string(), value: v.to_string() }).collect()
    }

    /// A mail pod as the kubelet left it.
    fn pod(
        name: &str,
        node: &str,
        created: i64,
        carries: &[Sysctl],
        phase: &str,
        reason: Option<&str>,
    ) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(at(created)),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                security_context: Some(PodSecurityContext {
                    sysctls: (!carries.is_empty()).then(|| carries.to_vec()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                reason: reason.map(Into::into),
                message: reason.map(|_| {
                    format!(
                        "Pod was rejected: forbidden sysctl: \"net.core.somaxconn\" not allowlisted ({name})"
                    )
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn refused_pods_are_those_of_the_current_sysctls_on_nodes_that_still_refuse_them() {
        let wanted = sysctls(&[("net.ipv4.tcp_fin_timeout", "15"), ("net.core.somaxconn", "8192")]);
        let earlier = sysctls(&[("net.core.somaxconn", "4096")]);
        let refused = Some(SYSCTL_FORBIDDEN);
        let pods = [
            pod("mail-smtp-a", "n1", 10, &wanted, "Failed", refused),
            pod("mail-smtp-b", "n1", 20, &wanted, "Failed", refused),
            // Refused for an earlier tuning: the spec no longer asks for it.
            pod("mail-smtp-c", "n1", 30, &earlier, "Failed", refused),
            // Failed for something else.
            pod("mail-imap-d", "n1", 40, &wanted, "Failed", Some("Evicted")),
            // n2 refused once, then its kubelet was allowed the sysctl and ran one.
            pod("mail-imap-e", "n2", 10, &wanted, "Failed", refused),
            pod("mail-imap-f", "n2", 50, &wanted, "Running", None),
            // n3 ran one before it refused one: still refusing.
            pod("mail-imap-g", "n3", 5, &wanted, "Running", None),
            pod("mail-imap-h", "n3", 15, &wanted, "Failed", refused),
            // A pod still to be started proves nothing about its node.
            pod("mail-smtp-i", "n1", 60, &wanted, "Pending", None),
        ];
        let found = refused_pods(&pods, &wanted);
        let what: Vec<&str> = found.iter().map(|r| r.what.as_str()).collect();
        assert_eq!(
            what,
            ["pod mail-smtp-b on node n1", "pod mail-imap-h on node n3", "pod mail-smtp-a on node n1"],
            "newest first"
        );
        assert!(found[0].message.contains("forbidden sysctl: \"net.core.somaxconn\""), "{found:?}");
        // Pods of a spec without sysctls carry none: a refusal of an earlier tuning
        // does not count against it.
        assert!(refused_pods(&pods, &[]).is_empty());
    }

    #[test]
    fn admission_refusing_to_create_pods_for_a_sysctl_is_a_refusal() {
        let deployment = |failure: Option<&str>| Deployment {
            metadata: ObjectMeta { name: Some("mail-smtp".into()), ..Default::default() },
            status: Some(DeploymentStatus {
                conditions: Some(
                    failure
                        .map(|message| DeploymentCondition {
                            type_: "ReplicaFailure".into(),
                            status: "True".into(),
                            reason: Some("FailedCreate".into()),
                            message: Some(message.into()),
                            ..Default::default()
                        })
                        .into_iter()
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let psa = "pods \"mail-smtp-7d9c-x2\" is forbidden: violates PodSecurity \"baseline:latest\": \
                   forbidden sysctls (net.core.somaxconn=8192)";
        assert_eq!(
            refused_creation(&deployment(Some(psa))),
            Some(SysctlRefusal { what: "Deployment mail-smtp".into(), message: psa.into() })
        );
        let quota = "pods \"mail-smtp-7d9c-x2\" is forbidden: exceeded quota: compute";
        assert_eq!(refused_creation(&deployment(Some(quota))), None, "not about sysctls");
        assert_eq!(refused_creation(&deployment(None)), None);
    }

    #[test]
    fn sysctls_allowed_is_there_only_with_tuning_and_says_what_was_refused() {
        let mut mc: MailCluster =
            serde_yaml_ng::from_str(include_str!("../tests/fixtures/minimal.yaml")).unwrap();
        let outcome = |mc: &MailCluster, seen: Result<Vec<SysctlRefusal>, String>| {
            let built = build(mc, &BuildContext::steady_state(mc)).unwrap();
            let ready = Replicas { desired: 2, replicas: 2, ready: 2, updated: 2, observed: true };
            Outcome::Applied {
                budget: built.budget,
                rollout: built.rollout,
                replicas: mc.spec.enabled_protocols().into_iter().map(|p| (p, ready)).collect(),
                migrated_image: Some(mc.spec.image.reference()),
                warnings: Vec::new(),
                sysctl_refusals: seen,
            }
        };
        let now = at(100);
        let types =
            |st: &MailClusterStatus| st.conditions.iter().map(|c| c.type_.clone()).collect::<Vec<_>>();

        // No tuning: no such condition, whatever was seen.
        let st = compute(&mc, &outcome(&mc, Ok(Vec::new())), &now);
        assert_eq!(types(&st), [READY, PROGRESSING, DEGRADED, SLO_MET]);

        mc.spec.tuning = Some(mailcluster_api::TuningSpec { somaxconn: Some(8192), ..Default::default() });
        let st = compute(&mc, &outcome(&mc, Ok(Vec::new())), &now);
        let allowed = st.condition(SYSCTLS_ALLOWED).expect("with tuning");
        assert_eq!((allowed.status.as_str(), allowed.reason.as_str()), ("True", "NoneRefused"));
        assert_eq!(st.condition(DEGRADED).unwrap().status, "False");

        let kubelet = "Pod was rejected: forbidden sysctl: \"net.core.somaxconn\" not allowlisted";
        let refusal = |what: &str| SysctlRefusal { what: what.into(), message: kubelet.into() };
        let seen = Ok(vec![refusal("pod mail-smtp-a on node n1"), refusal("pod mail-imap-b on node n2")]);
        mc.status = Some(st);
        let st = compute(&mc, &outcome(&mc, seen), &at(200));
        let allowed = st.condition(SYSCTLS_ALLOWED).unwrap();
        assert_eq!((allowed.status.as_str(), allowed.reason.as_str()), ("False", SYSCTL_FORBIDDEN));
        assert!(
            allowed.message.starts_with(&format!("pod mail-smtp-a on node n1: {kubelet} (1 more refused)")),
            "{}",
            allowed.message
        );
        assert_eq!(allowed.last_transition_time, at(200), "a change of status moves the time");
        let degraded = st.condition(DEGRADED).unwrap();
        assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", SYSCTL_FORBIDDEN));
        assert_eq!(degraded.message, allowed.message);

        // Paused: nothing looked at, the last word stands.
        mc.status = Some(st);
        mc.spec.paused = true;
        let st = compute(&mc, &Outcome::Paused, &at(300));
        assert_eq!(st.condition(SYSCTLS_ALLOWED), mc.status.as_ref().unwrap().condition(SYSCTLS_ALLOWED));
        mc.spec.paused = false;

        // Pods that could not be read: unknown, not allowed.
        let st = compute(&mc, &outcome(&mc, Err("pods is forbidden".into())), &at(400));
        let allowed = st.condition(SYSCTLS_ALLOWED).unwrap();
        assert_eq!((allowed.status.as_str(), allowed.reason.as_str()), ("Unknown", "PodsUnreadable"));
        assert_eq!(st.condition(DEGRADED).unwrap().status, "False");

        // Tuning taken out: the condition goes with it.
        mc.spec.tuning = None;
        let st = compute(&mc, &outcome(&mc, Ok(Vec::new())), &at(500));
        assert!(st.condition(SYSCTLS_ALLOWED).is_none());
    }
}
