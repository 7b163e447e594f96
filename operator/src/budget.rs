//! PostgreSQL connection budget.
//!
//! Every pod opens up to `postgres.poolSize` connections; PostgreSQL refuses
//! connections past `max_connections`, and when it does every pod's pool stalls at
//! once. So the operator plans the worst case before scaling allows it:
//!
//! ```text
//! Σ over protocols of poolSize × (maxReplicas + 1 surge pod during a rollout)
//! + migration Job pool + stress Job reserve
//! ≤ postgres.maxConnections − postgres.reservedConnections
//! ```
//!
//! When autoscaled protocols would not fit, their HPA `maxReplicas` are lowered in
//! proportion to what was asked (largest-remainder rounding, never below
//! `minReplicas`) and the result is reported in a condition and an event. Fixed replica
//! counts are never changed silently: if they alone do not fit, the spec is invalid.

use std::collections::BTreeMap;

use mailcluster_api::{MailCluster, Protocol};

use crate::build::pod_config::MIGRATION_POOL_SIZE;
use crate::validate::ValidationError;

/// Connections kept for a stress run (it seeds test accounts through the store).
pub const STRESS_POOL_SIZE: u32 = 4;
/// Extra pods a rolling update may add per Deployment (`maxSurge`).
pub const SURGE: i32 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolBudget {
    pub autoscaled: bool,
    pub min_replicas: i32,
    /// maxReplicas (or fixed replicas) the spec asks for.
    pub requested_max: i32,
    /// maxReplicas in force after capping.
    pub max_replicas: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub max_connections: u32,
    pub reserved: u32,
    /// Migration + stress Job connections.
    pub jobs: u32,
    pub pool_size: u32,
    /// Connections the spec as written could open at peak.
    pub requested: u64,
    /// Connections the capped plan can open at peak.
    pub planned: u64,
    pub protocols: BTreeMap<Protocol, ProtocolBudget>,
}

impl Budget {
    pub fn capped(&self) -> bool {
        self.protocols.values().any(|p| p.max_replicas < p.requested_max)
    }

    /// One line for conditions and events.
    pub fn summary(&self) -> String {
        let caps: Vec<String> = self
            .protocols
            .iter()
            .filter(|(_, b)| b.max_replicas < b.requested_max)
            .map(|(p, b)| format!("{} maxReplicas {}→{}", p.name(), b.requested_max, b.max_replicas))
            .collect();
        let head = format!(
            "PostgreSQL connections: {} planned of {} (maxConnections {} − reserved {})",
            self.planned,
            self.max_connections.saturating_sub(self.reserved),
            self.max_connections,
            self.reserved
        );
        if caps.is_empty() { head } else { format!("{head}; capped {}", caps.join(", ")) }
    }
}

/// Pods a Deployment can have at once: its maximum plus the rollout surge. A fixed
/// count of zero runs no pods and rolls none.
fn peak_pods(b: &ProtocolBudget, max: i32) -> u64 {
    if !b.autoscaled && max == 0 { 0 } else { u64::try_from(max + SURGE).unwrap_or(0) }
}

pub fn plan(mc: &MailCluster, stress_enabled: bool) -> Result<Budget, ValidationError> {
    let spec = &mc.spec;
    let pool = u64::from(spec.postgres.pool_size.max(1));
    let jobs = MIGRATION_POOL_SIZE + if stress_enabled { STRESS_POOL_SIZE } else { 0 };
    let available = u64::from(spec.postgres.max_connections)
        .saturating_sub(u64::from(spec.postgres.reserved_connections))
        .saturating_sub(u64::from(jobs));

    let mut protocols = BTreeMap::new();
    for p in spec.enabled_protocols() {
        let a = spec.autoscaling_for(p);
        let b = if a.enabled {
            ProtocolBudget {
                autoscaled: true,
                min_replicas: a.min_replicas,
                requested_max: a.max_replicas,
                max_replicas: a.max_replicas,
            }
        } else {
            let r = spec.protocol(p).replicas.unwrap_or(a.min_replicas).max(0);
            ProtocolBudget { autoscaled: false, min_replicas: r, requested_max: r, max_replicas: r }
        };
        protocols.insert(p, b);
    }
    let requested: u64 = protocols.values().map(|b| pool * peak_pods(b, b.requested_max)).sum();

    if requested > available {
        let fixed: u64 =
            protocols.values().filter(|b| !b.autoscaled).map(|b| peak_pods(b, b.requested_max)).sum();
        let pod_slots = available / pool;
        let Some(free_slots) = pod_slots.checked_sub(fixed) else {
            return Err(ValidationError::one(format!(
                "postgres.maxConnections {} cannot hold the fixed replica counts ({} pods × poolSize {})",
                spec.postgres.max_connections, fixed, pool
            )));
        };
        let asked: u64 =
            protocols.values().filter(|b| b.autoscaled).map(|b| peak_pods(b, b.requested_max)).sum();
        // Largest remainder: floor shares first, then one more slot each to the largest
        // fractional parts, so no slot the budget allows is wasted.
        let mut shares: Vec<(Protocol, u64, u64)> = protocols
            .iter()
            .filter(|(_, b)| b.autoscaled)
            .map(|(p, b)| {
                let want = peak_pods(b, b.requested_max) * free_slots;
                (*p, want / asked.max(1), want % asked.max(1))
            })
            .collect();
        let mut left = free_slots - shares.iter().map(|s| s.1).sum::<u64>();
        let mut order: Vec<usize> = (0..shares.len()).collect();
        order.sort_by(|a, b| shares[*b].2.cmp(&shares[*a].2));
        for i in order {
            if left == 0 {
                break;
            }
            shares[i].1 += 1;
            left -= 1;
        }
        let mut too_small = Vec::new();
        for (p, slots, _) in shares {
            let b = protocols.get_mut(&p).expect("share built from protocols");
            let max = i32::try_from(slots).unwrap_or(i32::MAX) - SURGE;
            b.max_replicas = max.min(b.requested_max);
            if b.max_replicas < b.min_replicas {
                too_small.push(format!("{} (minReplicas {})", p.name(), b.min_replicas));
            }
        }
        if !too_small.is_empty() {
            return Err(ValidationError::one(format!(
                "postgres.maxConnections {} (reserved {}, jobs {}) cannot hold minReplicas × poolSize {} for {}",
                spec.postgres.max_connections,
                spec.postgres.reserved_connections,
                jobs,
                pool,
                too_small.join(", ")
            )));
        }
    }
    let planned = protocols.values().map(|b| pool * peak_pods(b, b.max_replicas)).sum();
    Ok(Budget {
        max_connections: spec.postgres.max_connections,
        reserved: spec.postgres.reserved_connections,
        jobs,
        pool_size: spec.postgres.pool_size,
        requested,
        planned,
        protocols,
    })
}
