//! The operator's HTTP endpoints (axum): health, readiness, metrics, and the debugging API.
//!
//! | Route | Answer |
//! |---|---|
//! | `GET /healthz` | `200 ok` while the process serves HTTP |
//! | `GET /readyz` | `200` when ready, `503` otherwise; JSON `{ready, reasons, leader, role, cachesSynced, managerConnection, managerUnreachableSeconds?, managerLastError?}` |
//! | `GET /metrics` | OpenMetrics text from [`Metrics::encode`] |
//!
//! The debugging API is served by [`debug_router`] on a listener of its own
//! (`http.debugBindAddress`, off unless set), so the port probes and Prometheus reach never
//! exposes it:
//!
//! | Route | Answer |
//! |---|---|
//! | `GET /debug/trace/{namespace}/{bundle}` | the bundle's full placement trace (JSON), `404` if none |
//! | `POST /v1/what-if` | a `Bundle` (JSON, or YAML with a YAML content type) in, the admission result against the live snapshot out, with the dry run's `decisions` |
//!
//! Only the leader holds the placement traces (of the decisions it made since it started; the
//! ones that outlive it are in each Bundle's PlacementHistory, which `kubectl automanager trace`
//! reads by default) and the live placement model. Served with
//! [`debug_router_for_replica`], a replica that does not lead (a standby, or one still starting)
//! answers every debugging route with `503` and `{"error", "role", "leader"}`, `leader` being
//! the Lease's holder (the leader Pod's name when run as a Pod), so a client that reached it
//! (`kubectl automanager` port-forwarding to a Pod) can go to the leader instead.
//!
//! Readiness: ready = (leader OR standby) AND caches synced AND Manager reachable, i.e. this
//! replica could do its work if it leads. "Standby" means leader election has reported at least
//! once and this replica does not hold the lease: a standby is ready so that rolling updates of
//! a two-replica Deployment proceed. Before the first report ([`Readiness::set_leader`]) the
//! role is `starting` and the replica is not ready. "Manager reachable" means the mirror has
//! synced with Manager at least once and the connection has not been out of `ready` for longer
//! than the grace period (`manager.readinessGrace`), so a stream cut that resumes in a second
//! does not flap the probe, while a Manager that is down, stalled (the client's Watch
//! deadlines), or refuses this replica's token makes it 503 with the reason in `reasons`. A
//! rolling update therefore stops at a new replica that cannot reach Manager instead of
//! replacing one that can. Liveness (`/healthz`) never looks at Manager: restarting the
//! operator would not bring Manager back.
//!
//! Every error answer is JSON `{"error": "..."}`. Request bodies are limited to
//! [`MAX_BODY_BYTES`]; a larger one gets `413`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::metrics::Metrics;
use manager_client::{ConnectionState, ManagerClient};

/// Largest request body accepted (`POST /v1/what-if`).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The content type of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Longest namespace or bundle name accepted in a path (a DNS subdomain's limit).
const MAX_NAME_LEN: usize = 253;

/// Answers from the operator's state, implemented by the runtime.
pub trait DebugApi: Send + Sync + 'static {
    /// The full placement trace of a bundle's last decisions, or `None` when there is none.
    fn trace(&self, namespace: &str, bundle: &str) -> Option<serde_json::Value>;
    /// The admission result (ok / validationErrors / noCapacity) for `bundle` against the live
    /// snapshot, without acting on it.
    fn what_if(&self, bundle: &automanager_api::Bundle) -> serde_json::Value;
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The server stopped with an I/O error.
    #[error("HTTP server failed: {0}")]
    Serve(#[source] std::io::Error),
}

const ROLE_STARTING: u8 = 0;
const ROLE_STANDBY: u8 = 1;
const ROLE_LEADER: u8 = 2;

/// The default of `manager.readinessGrace`.
pub const DEFAULT_MANAGER_GRACE: Duration = Duration::from_secs(30);

/// What readiness knows of the Manager connection.
#[derive(Debug)]
struct ManagerView {
    state: ConnectionState,
    /// Whether the mirror has ever synced.
    synced_once: bool,
    /// When the connection last left `ready`; `None` while ready and before the first sync.
    unreachable_since: Option<tokio::time::Instant>,
    last_error: Option<String>,
}

#[derive(Debug)]
struct ReadinessInner {
    role: AtomicU8,
    caches_synced: AtomicBool,
    manager: Mutex<ManagerView>,
    manager_grace: Duration,
}

/// What `/readyz` reports; shared between the runtime (which updates it) and the server.
/// Cheap to clone; clones share the same state.
#[derive(Clone, Debug)]
pub struct Readiness {
    inner: Arc<ReadinessInner>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

/// A point-in-time copy of [`Readiness`], as `/readyz` renders it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessReport {
    /// (leader OR standby) AND caches synced AND Manager reachable.
    pub ready: bool,
    /// Why not ready, one sentence each; empty when ready.
    pub reasons: Vec<String>,
    /// Whether this replica holds the lease.
    pub leader: bool,
    /// `starting`, `standby` or `leader`.
    pub role: &'static str,
    /// Whether the runtime's watch caches have synced.
    pub caches_synced: bool,
    /// Manager's connection state (`idle`, `connecting`, `ready`, `transientFailure`, `shutdown`).
    pub manager_connection: &'static str,
    /// Whole seconds since the connection left `ready`; absent while ready and before the first
    /// sync.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manager_unreachable_seconds: Option<u64>,
    /// Why the connection last failed (clipped to 256 characters), while it is not `ready`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manager_last_error: Option<String>,
}

/// Longest `managerLastError` shown.
const MAX_ERROR_CHARS: usize = 256;

impl Readiness {
    /// Starting: not leader, not standby, caches not synced, Manager `idle` (never synced), a
    /// grace of [`DEFAULT_MANAGER_GRACE`].
    pub fn new() -> Self {
        Self::with_manager_grace(DEFAULT_MANAGER_GRACE)
    }

    /// Like [`Readiness::new`], with `manager.readinessGrace`.
    pub fn with_manager_grace(grace: Duration) -> Self {
        Readiness {
            inner: Arc::new(ReadinessInner {
                role: AtomicU8::new(ROLE_STARTING),
                caches_synced: AtomicBool::new(false),
                manager: Mutex::new(ManagerView {
                    state: ConnectionState::Idle,
                    synced_once: false,
                    unreachable_since: None,
                    last_error: None,
                }),
                manager_grace: grace,
            }),
        }
    }

    /// Leader election's latest answer: `true` leader, `false` standby.
    pub fn set_leader(&self, leader: bool) {
        let role = if leader { ROLE_LEADER } else { ROLE_STANDBY };
        self.inner.role.store(role, Ordering::Release);
    }

    /// Whether the watch caches have synced.
    pub fn set_caches_synced(&self, synced: bool) {
        self.inner.caches_synced.store(synced, Ordering::Release);
    }

    /// Manager's connection state and, when it failed, why. The grace period runs from the
    /// moment the state leaves `ready`.
    pub fn set_manager_connection(&self, state: ConnectionState, last_error: Option<String>) {
        let mut m = self.manager();
        if state == ConnectionState::Ready {
            m.synced_once = true;
            m.unreachable_since = None;
        } else if m.synced_once && m.unreachable_since.is_none() {
            m.unreachable_since = Some(tokio::time::Instant::now());
        }
        m.state = state;
        m.last_error = last_error.map(|e| e.chars().take(MAX_ERROR_CHARS).collect());
    }

    /// Keeps the Manager connection current from `client` until the client shuts down.
    pub fn follow_manager(&self, client: &ManagerClient) -> tokio::task::JoinHandle<()> {
        let readiness = self.clone();
        let client = client.clone();
        let mut states = client.state();
        tokio::spawn(async move {
            loop {
                let state = *states.borrow_and_update();
                // The client records the error before it announces the failure.
                readiness.set_manager_connection(state, client.last_error());
                if state == ConnectionState::Shutdown || states.changed().await.is_err() {
                    return;
                }
            }
        })
    }

    fn manager(&self) -> std::sync::MutexGuard<'_, ManagerView> {
        self.inner
            .manager
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.report().ready
    }

    /// The current state.
    pub fn report(&self) -> ReadinessReport {
        let role = self.inner.role.load(Ordering::Acquire);
        let caches_synced = self.inner.caches_synced.load(Ordering::Acquire);
        let mut reasons = Vec::new();
        if role == ROLE_STARTING {
            reasons.push("leader election has not answered yet".to_owned());
        }
        if !caches_synced {
            reasons.push("the Kubernetes watch caches have not synced yet".to_owned());
        }
        let m = self.manager();
        let state = m.state.as_str();
        let error = m
            .last_error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        let down_for = m.unreachable_since.map(|since| since.elapsed());
        let grace = self.inner.manager_grace;
        if !m.synced_once {
            reasons.push(format!(
                "Manager has not been reached yet (connection {state}{error})"
            ));
        } else if let Some(down) = down_for.filter(|d| *d > grace) {
            reasons.push(format!(
                "Manager unreachable for {}s, longer than manager.readinessGrace {}s (connection {state}{error})",
                down.as_secs(),
                grace.as_secs_f64()
            ));
        }
        let connected = m.state == ConnectionState::Ready;
        ReadinessReport {
            ready: reasons.is_empty(),
            reasons,
            leader: role == ROLE_LEADER,
            role: match role {
                ROLE_LEADER => "leader",
                ROLE_STANDBY => "standby",
                _ => "starting",
            },
            caches_synced,
            manager_connection: state,
            manager_unreachable_seconds: down_for.map(|d| d.as_secs()),
            manager_last_error: m.last_error.clone().filter(|_| !connected),
        }
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    readiness: Readiness,
}

/// Health, readiness and metrics: the routes of `http.bindAddress`, for [`serve`] and tests.
pub fn router(metrics: Metrics, readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_handler))
        .fallback(not_found_here)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(AppState { metrics, readiness })
}

/// The debugging API: the routes of `http.debugBindAddress`, for [`serve`] and tests.
pub fn debug_router(debug: Arc<dyn DebugApi>) -> Router {
    Router::new()
        .route("/debug/trace/{namespace}/{bundle}", get(trace))
        .route("/v1/what-if", post(what_if))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(debug)
}

/// Who holds the leader Lease now (its holder identity), read when a standby is asked; `None`
/// when it cannot be told (no Lease yet, or the apiserver did not answer).
pub type LeaderLookup =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Option<String>> + Send>> + Send + Sync>;

/// [`debug_router`] for a replica that may not lead: while `readiness` says this replica is not
/// the leader, every route answers `503` with `{"error", "role", "leader"}` instead, `leader`
/// from `leader` (the Lease's holder).
pub fn debug_router_for_replica(
    debug: Arc<dyn DebugApi>,
    readiness: Readiness,
    leader: LeaderLookup,
) -> Router {
    debug_router(debug).layer(axum::middleware::from_fn_with_state(
        (readiness, leader),
        only_the_leader_answers,
    ))
}

async fn only_the_leader_answers(
    State((readiness, leader)): State<(Readiness, LeaderLookup)>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let report = readiness.report();
    if report.leader {
        return next.run(request).await;
    }
    let holder = leader().await;
    let error = match &holder {
        Some(h) => format!(
            "this replica is {} and holds no placement state; the leader is {h}",
            report.role
        ),
        None => format!(
            "this replica is {} and holds no placement state; no leader is known yet",
            report.role
        ),
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(json!({ "error": error, "role": report.role, "leader": holder })),
    )
        .into_response()
}

/// Binds `addr` (use port 0 for any free port).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, HttpError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind { addr, source })
}

/// Serves `app` ([`router`] or [`debug_router`]) on `addr` until `shutdown` completes, then
/// finishes in-flight requests and returns.
pub async fn serve(
    addr: SocketAddr,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HttpError> {
    let listener = bind(addr).await?;
    serve_on(listener, app, shutdown).await
}

/// Like [`serve`], on a listener already bound (e.g. by [`bind`], to learn the port first).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HttpError> {
    if let Ok(local) = listener.local_addr() {
        tracing::info!(addr = %local, "HTTP server listening");
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(HttpError::Serve)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": message.into() }))).into_response()
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> Response {
    let report = state.readiness.report();
    let status = if report.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(report)).into_response()
}

async fn metrics_handler(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
        state.metrics.encode(),
    )
        .into_response()
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

async fn trace(
    State(debug): State<Arc<dyn DebugApi>>,
    Path((namespace, bundle)): Path<(String, String)>,
) -> Response {
    if !valid_name(&namespace) || !valid_name(&bundle) {
        return error(
            StatusCode::BAD_REQUEST,
            "namespace and bundle must be Kubernetes names (lowercase letters, digits, '-', '.'; at most 253 characters)",
        );
    }
    match debug.trace(&namespace, &bundle) {
        Some(trace) => axum::Json(trace).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!("no placement trace for bundle {namespace}/{bundle}"),
        ),
    }
}

/// Whether the request says its body is YAML (`application/yaml`, `application/x-yaml`,
/// `text/yaml`); anything else is read as JSON.
fn is_yaml(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("yaml"))
}

async fn what_if(
    State(debug): State<Arc<dyn DebugApi>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let status = rejection.status();
            let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
                format!("request body larger than {MAX_BODY_BYTES} bytes")
            } else {
                rejection.body_text()
            };
            return error(status, message);
        }
    };
    let parsed = if is_yaml(&headers) {
        // One line, ending in the position (`... at line L, column C`), like the JSON answer.
        // Read into a JSON value first: a Bundle's job config is kept as JSON text, which only
        // serde_json's decoders capture (see `automanager_api::job_config`).
        let options = serde_saphyr::options! { with_snippet: false };
        serde_saphyr::from_slice_with_options::<serde_json::Value>(&body, options)
            .map_err(|e| format!("body is not a Bundle as YAML: {e}"))
            .and_then(|v| {
                serde_json::from_value::<automanager_api::Bundle>(v)
                    .map_err(|e| format!("body is not a Bundle as YAML: {e}"))
            })
    } else {
        serde_json::from_slice::<automanager_api::Bundle>(&body).map_err(|e| {
            format!(
                "body is not a Bundle as JSON (line {}, column {}): {e}",
                e.line(),
                e.column()
            )
        })
    };
    let bundle = match parsed {
        Ok(bundle) => bundle,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    // Admission runs placement over the live snapshot: keep it off the async workers.
    match tokio::task::spawn_blocking(move || debug.what_if(&bundle)).await {
        Ok(result) => axum::Json(result).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "what-if evaluation failed");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "what-if evaluation failed",
            )
        }
    }
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such route")
}

/// The probe port's 404, which points a debugging request at the port that serves it.
async fn not_found_here(uri: axum::http::Uri) -> Response {
    let path = uri.path();
    if path.starts_with("/debug/") || path.starts_with("/v1/") {
        return error(
            StatusCode::NOT_FOUND,
            "the debugging API (/debug/trace, /v1/what-if) is served on http.debugBindAddress, which is off unless set",
        );
    }
    not_found().await
}
