//! The kinds of object the operator owns, and one built object ready to apply.
//!
//! Builders produce typed k8s-openapi objects (so the compiler checks field names) and
//! convert them to [`DynamicObject`] here, so apply and orphan deletion run one generic
//! path for built-in kinds and for CRD kinds (Certificate, ServiceMonitor) alike.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChildKind {
    ServiceAccount,
    Role,
    RoleBinding,
    ConfigMap,
    Service,
    Job,
    Deployment,
    HorizontalPodAutoscaler,
    PodDisruptionBudget,
    NetworkPolicy,
    CronJob,
    Certificate,
    ServiceMonitor,
}

impl ChildKind {
    /// Every kind, in apply order: identities and config before the workloads that
    /// mount them, the migration Job before Deployments.
    pub const ALL: [ChildKind; 13] = [
        ChildKind::ServiceAccount,
        ChildKind::Role,
        ChildKind::RoleBinding,
        ChildKind::ConfigMap,
        ChildKind::Certificate,
        ChildKind::Service,
        ChildKind::Job,
        ChildKind::Deployment,
        ChildKind::HorizontalPodAutoscaler,
        ChildKind::PodDisruptionBudget,
        ChildKind::NetworkPolicy,
        ChildKind::CronJob,
        ChildKind::ServiceMonitor,
    ];

    pub fn gvk(self) -> GroupVersionKind {
        let (g, v, k) = match self {
            ChildKind::ServiceAccount => ("", "v1", "ServiceAccount"),
            ChildKind::Role => ("rbac.authorization.k8s.io", "v1", "Role"),
            ChildKind::RoleBinding => ("rbac.authorization.k8s.io", "v1", "RoleBinding"),
            ChildKind::ConfigMap => ("", "v1", "ConfigMap"),
            ChildKind::Service => ("", "v1", "Service"),
            ChildKind::Job => ("batch", "v1", "Job"),
            ChildKind::Deployment => ("apps", "v1", "Deployment"),
            ChildKind::HorizontalPodAutoscaler => ("autoscaling", "v2", "HorizontalPodAutoscaler"),
            ChildKind::PodDisruptionBudget => ("policy", "v1", "PodDisruptionBudget"),
            ChildKind::NetworkPolicy => ("networking.k8s.io", "v1", "NetworkPolicy"),
            ChildKind::CronJob => ("batch", "v1", "CronJob"),
            ChildKind::Certificate => ("cert-manager.io", "v1", "Certificate"),
            ChildKind::ServiceMonitor => ("monitoring.coreos.com", "v1", "ServiceMonitor"),
        };
        GroupVersionKind::gvk(g, v, k)
    }

    pub fn plural(self) -> &'static str {
        match self {
            ChildKind::ServiceAccount => "serviceaccounts",
            ChildKind::Role => "roles",
            ChildKind::RoleBinding => "rolebindings",
            ChildKind::ConfigMap => "configmaps",
            ChildKind::Service => "services",
            ChildKind::Job => "jobs",
            ChildKind::Deployment => "deployments",
            ChildKind::HorizontalPodAutoscaler => "horizontalpodautoscalers",
            ChildKind::PodDisruptionBudget => "poddisruptionbudgets",
            ChildKind::NetworkPolicy => "networkpolicies",
            ChildKind::CronJob => "cronjobs",
            ChildKind::Certificate => "certificates",
            ChildKind::ServiceMonitor => "servicemonitors",
        }
    }

    pub fn api_resource(self) -> ApiResource {
        ApiResource::from_gvk_with_plural(&self.gvk(), self.plural())
    }

    /// Kinds from optional CRDs: applied (and listed for orphans) only when discovery
    /// finds them, so a cluster without cert-manager or Prometheus operator still works.
    pub fn is_optional_crd(self) -> bool {
        matches!(self, ChildKind::Certificate | ChildKind::ServiceMonitor)
    }
}

/// One object the operator wants to exist.
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    pub kind: ChildKind,
    pub object: DynamicObject,
}

impl Child {
    /// Converts a typed object (k8s-openapi or `serde_json::Value`) into a child.
    pub fn from_typed<T: Serialize>(kind: ChildKind, typed: &T) -> Result<Self, serde_json::Error> {
        let mut value = serde_json::to_value(typed)?;
        let gvk = kind.gvk();
        if let Some(obj) = value.as_object_mut() {
            obj.insert("apiVersion".into(), gvk.api_version().into());
            obj.insert("kind".into(), gvk.kind.clone().into());
        }
        Ok(Child { kind, object: serde_json::from_value(value)? })
    }

    pub fn name(&self) -> &str {
        self.object.metadata.name.as_deref().unwrap_or("")
    }

    /// Decodes the object back into a typed struct (tests, status).
    pub fn to_typed<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_value(serde_json::to_value(&self.object)?)
    }
}
