//! Mailcluster API types: the `MailCluster` custom resource (spec and status), the
//! mail pod's configuration file, and the names shared by the operator, the server,
//! the stress runner and the CLI.
//!
//! This crate holds data types only — no network I/O, no reconcile logic — so every
//! component can depend on it without pulling in a client. (Reading the pod's
//! configuration file is the one read it does.)
#![forbid(unsafe_code)]

pub mod accounts;
pub mod cluster;
pub mod config;
pub mod stress;

pub use accounts::{
    MailAccount, MailAccountSpec, MailAccountStatus, MailDomain, MailDomainSpec, MailDomainStatus,
};
pub use cluster::*;

/// API group of every Mailcluster resource.
pub const GROUP: &str = "mailcluster.dev";
/// Served and stored version of `MailCluster`.
pub const VERSION: &str = "v1alpha1";

/// The one field manager under which the operator server-side-applies everything.
pub const FIELD_MANAGER: &str = "mailcluster-operator";
/// Field manager of the stress Job when it writes `status.lastStress`; separate from the
/// operator's so neither removes the other's fields on apply.
pub const STRESS_FIELD_MANAGER: &str = "mailcluster-stress";

/// Annotation whose (changed) value asks for one on-demand stress run.
pub const RUN_STRESS_ANNOTATION: &str = "mailcluster.dev/run-stress";
/// Label naming the `MailCluster` an object belongs to.
pub const CLUSTER_LABEL: &str = "mailcluster.dev/cluster";
/// Standard label values on every child object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "mailcluster-operator";
