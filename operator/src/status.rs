//! Status as a pure function of what reconcile saw and did.
//!
//! Conditions keep their `lastTransitionTime` while their status stays the same, so
//! `kubectl describe` shows when something actually changed, not when the operator
//! last looked; only a status change (True/False/Unknown) moves it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use mailcluster_api::{MailCluster, MailClusterStatus, Phase, Protocol, ProtocolStatus};

use crate::budget::Budget;
use crate::build::Rollout;

pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
pub const SLO_MET: &str = "SLOMet";

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

    match outcome {
        Outcome::Applied { budget, rollout, replicas, migrated_image, warnings } => {
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
            let degraded = if budget.capped() {
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
    use super::Replicas;

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
}
