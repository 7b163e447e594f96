//! `status.lastStress` is written with a merge patch on the status subresource.

use std::collections::BTreeMap;

use http::{Method, Request, Response};
use kube::client::Body;
use mailcluster_api::stress::LastStress;
use mailcluster_stress::kube_report::report_to_cluster;

#[tokio::test]
async fn patches_last_stress_on_the_status_subresource() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "default");
    let last = LastStress {
        started_at: "2026-01-01T00:00:00+00:00".into(),
        finished_at: "2026-01-01T00:05:00+00:00".into(),
        verdict: "Fail".into(),
        success_rate: 99.5,
        p95_ms: BTreeMap::from([("deliver".to_string(), 88.5), ("fetch-body".to_string(), 12.0)]),
        generator_saturated: true,
        job: Some("stress-nightly-123".into()),
    };
    let sent = last.clone();
    let call = tokio::spawn(async move { report_to_cluster(client, "mail", "prod", &sent).await });

    let (req, send) = tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request())
        .await
        .expect("request in time")
        .expect("a request");
    assert_eq!(req.method(), Method::PATCH);
    assert_eq!(req.uri().path(), "/apis/mailcluster.dev/v1alpha1/namespaces/mail/mailclusters/prod/status");
    assert_eq!(
        req.headers().get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/merge-patch+json")
    );
    let body = req.into_body().collect_bytes().await.expect("body");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json body");
    assert_eq!(
        v,
        serde_json::json!({"status": {"lastStress": {
            "startedAt": "2026-01-01T00:00:00+00:00",
            "finishedAt": "2026-01-01T00:05:00+00:00",
            "verdict": "Fail",
            "successRate": 99.5,
            "p95Ms": {"deliver": 88.5, "fetch-body": 12.0},
            "generatorSaturated": true,
            "job": "stress-nightly-123"
        }}})
    );
    let reply = serde_json::json!({
        "apiVersion": "mailcluster.dev/v1alpha1", "kind": "MailCluster",
        "metadata": {"name": "prod", "namespace": "mail"},
        "status": {"lastStress": v["status"]["lastStress"]}
    });
    send.send_response(
        Response::builder().body(Body::from(serde_json::to_vec(&reply).expect("ser"))).expect("resp"),
    );
    call.await.expect("join").expect("patch ok");
}

#[tokio::test]
async fn api_error_is_reported() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "default");
    let call =
        tokio::spawn(async move { report_to_cluster(client, "mail", "gone", &LastStress::default()).await });
    let (_req, send) = handle.next_request().await.expect("a request");
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "mailclusters.mailcluster.dev \"gone\" not found", "reason": "NotFound", "code": 404});
    send.send_response(
        Response::builder()
            .status(404)
            .body(Body::from(serde_json::to_vec(&status).expect("ser")))
            .expect("resp"),
    );
    let err = call.await.expect("join").expect_err("404 is an error");
    assert!(format!("{err:#}").contains("gone"), "{err:#}");
}
