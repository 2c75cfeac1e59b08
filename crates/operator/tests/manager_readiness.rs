//! `/readyz` over a real Manager connection, built from the operator's settings as the binary
//! builds it: a manager-sim whose Watch streams stall (accepted, never answered) makes the
//! replica unready once the client's deadline and `manager.readinessGrace` have passed, with
//! the reason in the JSON; when Manager answers again the replica is ready again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use automanager_operator::config::OperatorConfig;
use automanager_operator::http::{self, Readiness};
use automanager_operator::metrics::Metrics;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use manager_client::ManagerClient;
use manager_sim::{Sim, SimConfig};
use serde_json::Value;
use tower::ServiceExt;

async fn readyz(readiness: &Readiness) -> (StatusCode, Value) {
    let req = Request::get("/readyz").body(Body::empty()).unwrap();
    let resp = http::router(Metrics::new(), readiness.clone())
        .oneshot(req)
        .await
        .unwrap();
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}

/// Polls `/readyz` until it answers `want` and `also` holds of the JSON; the last JSON.
async fn readyz_until(
    readiness: &Readiness,
    want: StatusCode,
    also: impl Fn(&Value) -> bool,
    within: Duration,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let (status, body) = readyz(readiness).await;
        if status == want && also(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "not {want} within {within:?}: {body:#}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn readyz_becomes(readiness: &Readiness, want: StatusCode, within: Duration) -> Value {
    readyz_until(readiness, want, |_| true, within).await
}

#[tokio::test]
async fn a_stalled_manager_makes_the_leader_unready_after_the_grace_and_a_recovered_one_ready() {
    let sim = Sim::start(SimConfig::demo()).await.unwrap();
    let config = OperatorConfig::from_yaml_str(&format!(
        "manager:\n  url: {}\n  syncTimeout: 1s\n  heartbeatInterval: 100ms\n  idleTimeout: 1s\n  readinessGrace: 500ms\n",
        sim.endpoint()
    ))
    .unwrap();
    let manager = ManagerClient::connect(config.manager.client_config().unwrap())
        .await
        .unwrap();
    let readiness = Readiness::with_manager_grace(config.manager.readiness_grace);
    readiness.follow_manager(&manager);
    readiness.set_caches_synced(true);
    readiness.set_leader(true);
    readyz_becomes(&readiness, StatusCode::OK, Duration::from_secs(10)).await;

    // Manager keeps the stream open and stops answering.
    sim.stall_watches(true);
    let stalled_at = Instant::now();
    let body = readyz_becomes(
        &readiness,
        StatusCode::SERVICE_UNAVAILABLE,
        Duration::from_secs(10),
    )
    .await;
    // Not before the idle deadline (1 s) plus the grace (0.5 s).
    assert!(
        stalled_at.elapsed() >= Duration::from_millis(1400),
        "{body:#}"
    );
    assert_ne!(body["managerConnection"], "ready", "{body:#}");
    let reasons = body["reasons"].to_string();
    assert!(
        reasons.contains("longer than manager.readinessGrace 0.5s")
            && reasons.contains("not even a heartbeat"),
        "{body:#}"
    );
    assert!(
        body["managerUnreachableSeconds"].as_u64().is_some(),
        "{body:#}"
    );
    assert_eq!(body["leader"], true);

    sim.stall_watches(false);
    let body = readyz_becomes(&readiness, StatusCode::OK, Duration::from_secs(10)).await;
    assert_eq!(body["managerConnection"], "ready");
    assert_eq!(body["reasons"], Value::Array(Vec::new()));
    manager.close().await;
}

#[tokio::test]
async fn a_manager_never_reached_keeps_a_new_replica_unready() {
    // Nothing listens on port 1: the connection never gets to `ready`.
    let config = OperatorConfig::from_yaml_str("manager:\n  url: http://127.0.0.1:1\n").unwrap();
    let manager = ManagerClient::connect(config.manager.client_config().unwrap())
        .await
        .unwrap();
    let readiness = Readiness::with_manager_grace(config.manager.readiness_grace);
    readiness.follow_manager(&manager);
    readiness.set_caches_synced(true);
    readiness.set_leader(false);
    let body = readyz_becomes(
        &readiness,
        StatusCode::SERVICE_UNAVAILABLE,
        Duration::from_secs(1),
    )
    .await;
    assert!(
        body["reasons"]
            .to_string()
            .contains("Manager has not been reached yet"),
        "{body:#}"
    );
    manager.close().await;
    readyz_until(
        &readiness,
        StatusCode::SERVICE_UNAVAILABLE,
        |body| body["managerConnection"] == "shutdown",
        Duration::from_secs(1),
    )
    .await;
}
