//! The HTTP endpoints: every route, good and bad input.

use std::sync::Arc;
use std::time::Duration;

use automanager_operator::http::{
    self, DebugApi, MAX_BODY_BYTES, OPENMETRICS_CONTENT_TYPE, Readiness,
};
use automanager_operator::metrics::Metrics;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use manager_client::ConnectionState;
use serde_json::{Value, json};
use tower::ServiceExt;

/// Knows one trace (`default/news`) and answers what-if with the bundle's name and replicas.
struct FakeDebug;

impl DebugApi for FakeDebug {
    fn trace(&self, namespace: &str, bundle: &str) -> Option<Value> {
        (namespace == "default" && bundle == "news")
            .then(|| json!({"bundle": "news", "replicas": []}))
    }

    fn what_if(&self, bundle: &automanager_api::Bundle) -> Value {
        json!({
            "result": "ok",
            "name": bundle.metadata.name,
            "replicas": bundle.spec.replicas,
        })
    }
}

fn app(readiness: Readiness, metrics: Metrics) -> axum::Router {
    http::router(metrics, readiness)
}

fn debug_app() -> axum::Router {
    http::debug_router(Arc::new(FakeDebug))
}

async fn call(router: axum::Router, req: Request<Body>) -> (StatusCode, String, String) {
    let resp = router.oneshot(req).await.unwrap_or_else(|e| match e {});
    let status = resp.status();
    let ctype = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    (status, ctype, body)
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap_or_default()
}

fn post(uri: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .unwrap_or_default()
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or(Value::Null)
}

const BUNDLE: &str = r#"{
  "apiVersion": "automanager.norsk.io/v1alpha1",
  "kind": "Bundle",
  "metadata": {"name": "news", "namespace": "default"},
  "spec": {
    "replicas": 2,
    "pools": ["aws-east"],
    "jobs": [{"jobName": "encode", "requirements": {"requiredCapacity": 10, "requiredCores": 4, "priorityBand": "gold"}}]
  }
}"#;

#[tokio::test]
async fn healthz_answers_ok() {
    let (status, _, body) = call(app(Readiness::new(), Metrics::new()), get("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "ok");
}

#[tokio::test]
async fn readyz_is_503_while_starting_and_reports_why() {
    let r = Readiness::new();
    r.set_caches_synced(true);
    let (status, _, body) = call(app(r, Metrics::new()), get("/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let v = json_of(&body);
    assert_eq!(v["ready"], false);
    assert_eq!(v["role"], "starting");
    assert_eq!(v["cachesSynced"], true);
}

#[tokio::test]
async fn readyz_is_503_until_caches_sync_even_for_the_leader() {
    let r = Readiness::new();
    r.set_leader(true);
    let (status, _, body) = call(app(r, Metrics::new()), get("/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json_of(&body)["leader"], true);
}

#[tokio::test]
async fn readyz_is_200_for_a_synced_leader_and_shows_the_manager_connection() {
    let r = Readiness::new();
    r.set_leader(true);
    r.set_caches_synced(true);
    r.set_manager_connection(ConnectionState::Ready, None);
    let (status, _, body) = call(app(r, Metrics::new()), get("/readyz")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        json_of(&body),
        json!({"ready": true, "reasons": [], "leader": true, "role": "leader", "cachesSynced": true, "managerConnection": "ready"})
    );
}

#[tokio::test]
async fn readyz_is_503_until_manager_has_been_reached_once_and_says_so() {
    let r = Readiness::new();
    r.set_leader(true);
    r.set_caches_synced(true);
    r.set_manager_connection(
        ConnectionState::TransientFailure,
        Some("Unavailable: connection refused".to_owned()),
    );
    let (status, _, body) = call(app(r.clone(), Metrics::new()), get("/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let v = json_of(&body);
    assert_eq!(v["managerConnection"], "transientFailure");
    assert_eq!(v["managerLastError"], "Unavailable: connection refused");
    assert_eq!(
        v["reasons"],
        json!([
            "Manager has not been reached yet (connection transientFailure: Unavailable: connection refused)"
        ])
    );
    r.set_manager_connection(ConnectionState::Ready, None);
    assert!(r.is_ready());
}

#[tokio::test]
async fn readyz_rides_out_a_manager_outage_within_the_grace_and_is_503_after_it() {
    let r = Readiness::with_manager_grace(Duration::from_millis(300));
    r.set_leader(false);
    r.set_caches_synced(true);
    r.set_manager_connection(ConnectionState::Ready, None);
    assert!(r.is_ready());
    let error = || Some("Manager sent nothing for 15s: the stream is stalled".to_owned());
    r.set_manager_connection(ConnectionState::TransientFailure, error());
    r.set_manager_connection(ConnectionState::Connecting, error());
    // Within the grace: still ready, and the JSON already says what is going on.
    let (status, _, body) = call(app(r.clone(), Metrics::new()), get("/readyz")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = json_of(&body);
    assert_eq!(v["managerUnreachableSeconds"], 0);
    assert_eq!(v["managerConnection"], "connecting");
    assert_eq!(v["managerLastError"], error().unwrap_or_default());
    // Past it (the grace counts from leaving `ready`, not from the last change).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (status, _, body) = call(app(r.clone(), Metrics::new()), get("/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let v = json_of(&body);
    let reasons = v["reasons"].to_string();
    assert!(
        reasons.contains("Manager unreachable for 0s, longer than manager.readinessGrace 0.3s")
            && reasons.contains("the stream is stalled"),
        "{reasons}"
    );
    assert_eq!(v["role"], "standby");
    // Back: ready at once, and the old error is gone.
    r.set_manager_connection(ConnectionState::Ready, error());
    let (status, _, body) = call(app(r, Metrics::new()), get("/readyz")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(json_of(&body).get("managerLastError").is_none(), "{body}");
    assert!(
        json_of(&body).get("managerUnreachableSeconds").is_none(),
        "{body}"
    );
}

#[tokio::test]
async fn readyz_is_200_for_a_synced_standby() {
    let r = Readiness::new();
    r.set_leader(false);
    r.set_caches_synced(true);
    r.set_manager_connection(ConnectionState::Ready, None);
    let (status, _, body) = call(app(r.clone(), Metrics::new()), get("/readyz")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_of(&body)["role"], "standby");
    assert_eq!(json_of(&body)["leader"], false);
    // Clones share state: losing the cache sync makes it unready again.
    r.set_caches_synced(false);
    assert!(!r.is_ready());
}

#[tokio::test]
async fn metrics_are_openmetrics_text() {
    let m = Metrics::new();
    m.placement_attempted();
    let (status, ctype, body) = call(app(Readiness::new(), m), get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ctype, OPENMETRICS_CONTENT_TYPE);
    assert!(body.contains("automanager_placements_attempted_total 1"));
    assert!(body.trim_end().ends_with("# EOF"));
}

#[tokio::test]
async fn trace_of_a_known_bundle_is_its_json() {
    let (status, ctype, body) = call(debug_app(), get("/debug/trace/default/news")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(ctype.starts_with("application/json"));
    assert_eq!(json_of(&body)["bundle"], "news");
}

#[tokio::test]
async fn trace_of_an_unknown_bundle_is_a_json_404() {
    let (status, ctype, body) = call(debug_app(), get("/debug/trace/default/nope")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(ctype.starts_with("application/json"));
    assert_eq!(
        json_of(&body)["error"],
        "no placement trace for bundle default/nope"
    );
}

#[tokio::test]
async fn trace_with_a_name_that_is_not_a_kubernetes_name_is_a_400() {
    let long = "a".repeat(300);
    for uri in [
        "/debug/trace/Default/news".to_owned(),
        format!("/debug/trace/default/{long}"),
        "/debug/trace/default/a%20b".to_owned(),
    ] {
        let (status, _, body) = call(debug_app(), get(&uri)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
        assert!(json_of(&body)["error"].is_string());
    }
}

#[tokio::test]
async fn what_if_returns_the_admission_result() {
    let (status, _, body) = call(debug_app(), post("/v1/what-if", BUNDLE)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        json_of(&body),
        json!({"result": "ok", "name": "news", "replicas": 2})
    );
}

#[tokio::test]
async fn what_if_accepts_yaml_with_a_yaml_content_type() {
    let yaml = "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: { name: clip, namespace: default }\nspec:\n  replicas: 1\n  pools: [aws-east]\n  jobs:\n    - jobName: encode\n      requirements: { requiredCapacity: 10, requiredCores: 4, priorityBand: bronze }\n";
    let req = Request::post("/v1/what-if")
        .header(header::CONTENT_TYPE, "application/yaml")
        .body(Body::from(yaml))
        .unwrap_or_default();
    let (status, _, body) = call(debug_app(), req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json_of(&body)["name"], "clip");
    let req = Request::post("/v1/what-if")
        .header(header::CONTENT_TYPE, "application/yaml")
        .body(Body::from("spec: [unclosed"))
        .unwrap_or_default();
    let (status, _, body) = call(debug_app(), req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        json_of(&body)["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not a Bundle as YAML"),
        "{body}"
    );
}

#[tokio::test]
async fn what_if_with_malformed_json_is_a_400_naming_the_position() {
    let (status, _, body) = call(debug_app(), post("/v1/what-if", "{\"spec\": ")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let msg = json_of(&body)["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        msg.contains("not a Bundle") && msg.contains("line 1"),
        "{msg}"
    );
}

#[tokio::test]
async fn what_if_with_json_that_is_not_a_bundle_is_a_400() {
    let (status, _, body) = call(
        debug_app(),
        post(
            "/v1/what-if",
            r#"{"metadata": {}, "spec": {"replicas": "two"}}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        json_of(&body)["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not a Bundle")
    );
}

#[tokio::test]
async fn what_if_with_an_oversized_body_is_a_413() {
    let big = vec![b' '; MAX_BODY_BYTES + 1];
    let (status, _, body) = call(debug_app(), post("/v1/what-if", big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        json_of(&body)["error"]
            .as_str()
            .unwrap_or_default()
            .contains("larger than")
    );
}

#[tokio::test]
async fn unknown_routes_are_a_json_404_and_wrong_methods_a_405() {
    let (status, _, body) = call(app(Readiness::new(), Metrics::new()), get("/nope")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json_of(&body)["error"], "no such route");
    let (status, _, body) = call(debug_app(), get("/nope")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json_of(&body)["error"], "no such route");
    let (status, _, _) = call(debug_app(), get("/v1/what-if")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn the_probe_port_serves_no_debugging_api_and_says_where_it_is() {
    for req in [
        get("/debug/trace/default/news"),
        post("/v1/what-if", BUNDLE),
    ] {
        let (status, _, body) = call(app(Readiness::new(), Metrics::new()), req).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(
            json_of(&body)["error"]
                .as_str()
                .unwrap_or_default()
                .contains("http.debugBindAddress"),
            "{body}"
        );
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, _, _) = call(debug_app(), get(path)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path} on the debug port");
    }
}

#[tokio::test]
async fn serve_binds_answers_and_stops_on_shutdown() {
    let listener = match http::bind(
        "127.0.0.1:0"
            .parse()
            .unwrap_or(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
    )
    .await
    {
        Ok(l) => l,
        Err(e) => panic!("bind: {e}"),
    };
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(http::serve_on(
        listener,
        app(Readiness::new(), Metrics::new()),
        async {
            let _ = rx.await;
        },
    ));
    // A minimal HTTP/1.1 exchange over a raw socket: no HTTP client dependency needed.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    .unwrap_or_else(|_| panic!("connect timed out"))
    .unwrap_or_else(|e| panic!("connect: {e}"));
    sock.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut resp = String::new();
    tokio::time::timeout(Duration::from_secs(10), sock.read_to_string(&mut resp))
        .await
        .unwrap_or_else(|_| panic!("read timed out"))
        .unwrap_or_else(|e| panic!("read: {e}"));
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.ends_with("ok"), "{resp}");
    let _ = tx.send(());
    let result = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap_or_else(|_| panic!("server did not stop"));
    assert!(matches!(result, Ok(Ok(()))));
}

#[tokio::test]
async fn serve_reports_an_address_in_use() {
    let first = http::bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = first.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let err = http::serve(addr, app(Readiness::new(), Metrics::new()), async {}).await;
    assert!(matches!(err, Err(http::HttpError::Bind { .. })), "{err:?}");
}

fn replica_app(readiness: Readiness, holder: Option<&'static str>) -> axum::Router {
    let lookup: http::LeaderLookup =
        Arc::new(move || Box::pin(async move { holder.map(str::to_owned) }));
    http::debug_router_for_replica(Arc::new(FakeDebug), readiness, lookup)
}

#[tokio::test]
async fn a_standby_names_the_leader_instead_of_answering() {
    let r = Readiness::new();
    r.set_leader(false);
    let app = replica_app(r, Some("automanager-7d9f-abcde"));
    for req in [
        get("/debug/trace/default/news"),
        post("/v1/what-if", BUNDLE),
    ] {
        let (status, _, body) = call(app.clone(), req).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let v = json_of(&body);
        assert_eq!(v["role"], "standby");
        assert_eq!(v["leader"], "automanager-7d9f-abcde");
        assert!(
            v["error"]
                .as_str()
                .unwrap_or_default()
                .ends_with("the leader is automanager-7d9f-abcde"),
            "{body}"
        );
    }
}

#[tokio::test]
async fn a_starting_replica_says_no_leader_is_known_yet() {
    let (status, _, body) = call(
        replica_app(Readiness::new(), None),
        get("/debug/trace/default/news"),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let v = json_of(&body);
    assert_eq!(v["role"], "starting");
    assert_eq!(v["leader"], Value::Null);
}

#[tokio::test]
async fn the_leader_answers_through_the_replica_router() {
    let r = Readiness::new();
    r.set_leader(true);
    let (status, _, body) = call(
        replica_app(r, Some("someone-else")),
        get("/debug/trace/default/news"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json_of(&body)["bundle"], "news");
}
