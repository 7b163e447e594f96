//! The CRD's CEL rules (`x-kubernetes-validations`), evaluated client-side with the
//! `kube-cel` interpreter (kube's `cel` feature) against the generated schema, with
//! the schema's defaults applied first as the apiserver does.

use kube::CustomResourceExt;
use kube::core::cel::{Validator, apply_defaults, compile_schema};
use mailcluster_api::MailCluster;
use serde_json::{Value, json};

fn schema() -> Value {
    let crd = MailCluster::crd();
    let v = &crd.spec.versions[0];
    serde_json::to_value(v.schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap()).unwrap()
}

fn object(spec_patch: Value) -> Value {
    let mut spec = json!({
        "image": {"tag": "1.0.0"},
        "domains": ["example.com"],
        "postgres": {"urlSecretRef": {"name": "db"}},
        "redis": {"urlSecretRef": {"name": "redis"}},
    });
    merge(&mut spec, spec_patch);
    json!({
        "apiVersion": "mailcluster.dev/v1alpha1",
        "kind": "MailCluster",
        "metadata": {"name": "mail", "namespace": "mail"},
        "spec": spec,
    })
}

fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

/// Messages of every failed rule (empty = valid).
fn check(obj: &Value, old: Option<&Value>) -> Vec<String> {
    let schema = schema();
    let obj = apply_defaults(&schema, obj);
    let old = old.map(|o| apply_defaults(&schema, o));
    match Validator::new().validate(&schema, &obj, old.as_ref()) {
        Ok(()) => Vec::new(),
        Err(errs) => errs.into_vec().iter().map(|e| e.to_string()).collect(),
    }
}

fn assert_rejected(obj: &Value, old: Option<&Value>, needle: &str) {
    let errs = check(obj, old);
    assert!(errs.iter().any(|e| e.contains(needle)), "expected {needle:?}, got {errs:?}");
}

#[test]
fn every_rule_compiles() {
    let compiled = compile_schema(&schema());
    let errs: Vec<String> = compiled.compilation_errors().iter().map(|e| e.to_string()).collect();
    assert!(errs.is_empty(), "{errs:?}");
}

#[test]
fn valid_objects_pass() {
    assert_eq!(check(&object(json!({})), None), Vec::<String>::new());
    let full = object(json!({
        "smtp": {"service": {"ports": [{"name": "smtp", "port": 2525}]}},
        "submission": {"service": {"ports": [{"name": "submission", "port": 587}, {"name": "submissions", "port": 465}]}},
        "autoscaling": {"minReplicas": 3, "maxReplicas": 3},
        "tls": {"issuerRef": {"name": "le"}},
        "proxyProtocol": {"enabled": true, "trustedCidrs": ["10.0.0.0/8"]},
        "stress": {"slo": {"successRate": 100.0}},
        "redis": {"keyPrefix": "a:"},
    }));
    assert_eq!(check(&full, None), Vec::<String>::new());
    // Unchanged immutable field on update.
    assert_eq!(check(&full, Some(&full)), Vec::<String>::new());
}

#[test]
fn min_replicas_must_not_exceed_max() {
    let o = object(json!({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}));
    assert_rejected(&o, None, "minReplicas must not exceed");
    let o = object(json!({"imap": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}));
    assert_rejected(&o, None, "minReplicas must not exceed");
    // Defaults (2..10) apply to the side left out.
    let o = object(json!({"autoscaling": {"minReplicas": 11}}));
    assert_rejected(&o, None, "minReplicas must not exceed");
}

#[test]
fn service_ports_must_be_unique() {
    let o = object(
        json!({"imap": {"service": {"ports": [{"name": "imap", "port": 143}, {"name": "imaps", "port": 143}]}}}),
    );
    assert_rejected(&o, None, "service ports must be unique");
    let o = object(
        json!({"imap": {"service": {"ports": [{"name": "imap", "port": 143}, {"name": "imap", "port": 144}]}}}),
    );
    assert_rejected(&o, None, "each listener may be listed once");
}

#[test]
fn slo_success_rate_is_a_percentage() {
    assert_rejected(&object(json!({"stress": {"slo": {"successRate": 120.5}}})), None, "0..100");
    assert_rejected(&object(json!({"stress": {"slo": {"successRate": -0.5}}})), None, "0..100");
    assert!(check(&object(json!({"stress": {"slo": {"successRate": 0.0}}})), None).is_empty());
}

#[test]
fn tls_needs_exactly_one_source() {
    assert_rejected(
        &object(json!({"tls": {"secretName": "x", "issuerRef": {"name": "le"}}})),
        None,
        "exactly one of tls.secretName or tls.issuerRef",
    );
    assert_rejected(&object(json!({"tls": {}})), None, "exactly one");
}

#[test]
fn proxy_protocol_needs_trusted_cidrs() {
    assert_rejected(&object(json!({"proxyProtocol": {"enabled": true}})), None, "trustedCidrs is required");
    assert!(check(&object(json!({"proxyProtocol": {"enabled": false}})), None).is_empty());
}

#[test]
fn domains_unique_and_pool_within_max() {
    assert_rejected(&object(json!({"domains": ["a.com", "a.com"]})), None, "domains must be unique");
    assert_rejected(
        &object(json!({"postgres": {"urlSecretRef": {"name": "db"}, "poolSize": 50, "maxConnections": 20}})),
        None,
        "poolSize must not exceed",
    );
}

#[test]
fn redis_key_prefix_is_immutable() {
    let old = object(json!({"redis": {"urlSecretRef": {"name": "r"}, "keyPrefix": "a:"}}));
    let changed = object(json!({"redis": {"urlSecretRef": {"name": "r"}, "keyPrefix": "b:"}}));
    assert_rejected(&changed, Some(&old), "redis.keyPrefix is immutable");
    let removed = object(json!({"redis": {"urlSecretRef": {"name": "r"}}}));
    assert_rejected(&removed, Some(&old), "redis.keyPrefix is immutable");
    // Changing anything else in redis is fine (secret rotation).
    let rotated = object(json!({"redis": {"urlSecretRef": {"name": "r2"}, "keyPrefix": "a:"}}));
    assert!(check(&rotated, Some(&old)).is_empty());
    // Transition rules do not apply on create.
    assert!(check(&changed, None).is_empty());
}
