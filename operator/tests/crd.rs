//! The checked-in CRD matches the types. Regenerate with
//! `UPDATE_CRDS=1 cargo test -p mailcluster-operator --test crd`.

use std::path::PathBuf;

fn crd_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds/mailclusters.mailcluster.dev.yaml")
}

/// The MailDomain and MailAccount CRDs, each in its own file next to the MailCluster's.
#[test]
fn every_crd_file_is_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds");
    for (file, generated) in mailcluster_operator::crd_files() {
        let path = dir.join(&file);
        if std::env::var_os("UPDATE_CRDS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "{} is out of date; run `UPDATE_CRDS=1 cargo test -p mailcluster-operator --test crd`",
            path.display()
        );
    }
}

#[test]
fn store_kinds_have_status_columns_and_cluster_refs() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    for (file, text) in mailcluster_operator::crd_files().into_iter().skip(1) {
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(crd.spec.group, "mailcluster.dev", "{file}");
        assert_eq!(crd.spec.scope, "Namespaced", "{file}");
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v.subresources.as_ref().unwrap().status.is_some(), "{file}: status subresource");
        let cols: Vec<&str> =
            v.additional_printer_columns.as_ref().unwrap().iter().map(|c| c.name.as_str()).collect();
        assert!(cols.contains(&"Ready") && cols.contains(&"Cluster"), "{file}: {cols:?}");
        let spec = &v
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap()
            .properties
            .as_ref()
            .unwrap()["spec"];
        assert!(spec.required.as_ref().unwrap().contains(&"clusterRef".to_string()), "{file}");
    }
}

#[test]
fn crd_file_has_not_drifted() {
    let generated = mailcluster_operator::crd_yaml();
    let path = crd_path();
    if std::env::var_os("UPDATE_CRDS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "{} is out of date; run `UPDATE_CRDS=1 cargo test -p mailcluster-operator --test crd`",
        path.display()
    );
}

#[test]
fn crd_shape() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let text = mailcluster_operator::crd_yaml();
    let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(crd.metadata.name.as_deref(), Some("mailclusters.mailcluster.dev"));
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.short_names, Some(vec!["mc".to_string()]));
    let v = &crd.spec.versions[0];
    assert_eq!(v.name, "v1alpha1");
    assert!(v.subresources.as_ref().unwrap().status.is_some(), "status subresource");
    let cols: Vec<&str> =
        v.additional_printer_columns.as_ref().unwrap().iter().map(|c| c.name.as_str()).collect();
    assert_eq!(cols, ["Ready", "Phase", "SMTP", "IMAP", "Stress", "Age"]);
    let json = serde_json::to_string(&crd).unwrap();
    for rule in [
        "self.minReplicas <= self.maxReplicas",
        "self.all(p, self.filter(q, q.port == p.port).size() == 1)",
        "self.slo.successRate >= 0.0 && self.slo.successRate <= 100.0",
        "oldSelf.keyPrefix",
        "has(self.secretName) != has(self.issuerRef)",
    ] {
        assert!(json.contains(rule), "rule {rule:?} missing from CRD");
    }
    // Conditions merge by type so the stress Job and the operator can each own entries.
    assert!(json.contains(r#""x-kubernetes-list-map-keys":["type"]"#));
}
