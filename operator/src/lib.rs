//! The Mailcluster operator: reconciles a `MailCluster` into the objects that run it.
//!
//! Reconcile is a pipeline: [`reconcile`] dereferences Secrets and the
//! migration Job, [`validate`] checks the spec, [`build::build`] turns the resource into
//! every child object as a pure function, and the reconciler server-side-applies them,
//! deletes orphans by label and writes status. `build` needs no client, so it is tested
//! from YAML fixtures and exposed to the CLI as [`render`].
#![forbid(unsafe_code)]

pub mod accounts;
pub mod budget;
pub mod build;
pub mod children;
pub mod crd;
pub mod dns_check;
pub mod domain_keys;
pub mod image;
pub mod keys;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod reconcile;
pub mod render;
pub mod runtime;
pub mod status;
pub mod validate;

pub use crd::{crd_files, crd_yaml};
pub use render::render;
pub use runtime::{OperatorOptions, run, run_with};
