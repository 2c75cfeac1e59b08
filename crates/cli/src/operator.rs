//! Reaching the operator's debugging API (`/debug/trace`, `/v1/what-if`).
//!
//! By default the plugin finds the leader Pod of the operator's release ([`crate::locate`]) and
//! port-forwards to its `debug` container port through the apiserver, as `kubectl
//! port-forward` does: nothing is exposed and no URL is typed; it needs RBAC `list` on pods,
//! `get` on leases and `create` on `pods/portforward` in the operator's namespace. A replica that
//! does not lead answers `503` naming the leader, and the plugin goes there instead.
//!
//! Two other routes: `--operator-service` goes through the apiserver's service proxy
//! (`/api/v1/namespaces/<ns>/services/<service>:<port>/proxy/<path>`) to a Service someone
//! created over the leader's debugging port; `--operator-url` talks to an operator directly (one
//! running outside any cluster, as in `make demo`).

use std::time::Duration;

use http_body_util::BodyExt;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::error::CliError;

/// Path segments are percent-encoded except for the unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Largest answer read from the operator (a full trace of a 16-replica bundle is far smaller).
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Where the operator's debugging API is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorEndpoint {
    /// The leader Pod of the release found by `selector` in `namespace`, by port-forward.
    Leader {
        namespace: String,
        release: Option<String>,
        selector: String,
    },
    /// The apiserver's proxy to a Service port.
    ServiceProxy {
        namespace: String,
        service: String,
        port: String,
    },
    /// A URL such as `http://127.0.0.1:8080`.
    Direct(String),
}

impl OperatorEndpoint {
    /// How the endpoint is described in messages.
    pub fn describe(&self) -> String {
        match self {
            OperatorEndpoint::Leader {
                namespace, release, ..
            } => match release {
                Some(r) => format!("by port-forward to the leader Pod of release {namespace}/{r}"),
                None => {
                    format!("by port-forward to the operator's leader Pod in namespace {namespace}")
                }
            },
            OperatorEndpoint::ServiceProxy {
                namespace,
                service,
                port,
            } => format!(
                "through the apiserver's proxy to service {namespace}/{service} port {port}"
            ),
            OperatorEndpoint::Direct(url) => format!("at {url}"),
        }
    }

    fn hint(&self) -> String {
        match self {
            OperatorEndpoint::Leader { .. } => "The plugin port-forwards to the leader Pod's debugging port (chart value debug.enabled); it needs RBAC list pods, get leases and create pods/portforward in the operator's namespace. See docs/cli.md.".into(),
            OperatorEndpoint::ServiceProxy { .. } => "The Service must lead to the leader Pod's debugging port (see docs/cli.md); leave --operator-service out to port-forward to the leader instead.".into(),
            OperatorEndpoint::Direct(_) => "Check --operator-url (or AUTOMANAGER_OPERATOR_URL).".into(),
        }
    }
}

/// The way the last answer came, for a person or a benchmark line (`leader-portforward`,
/// `service-proxy`, `direct`) and, by port-forward, the Pod that answered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Route {
    pub through: &'static str,
    pub pod: Option<String>,
}

/// A client of the operator's debugging API.
pub struct OperatorClient {
    endpoint: OperatorEndpoint,
    kube: Option<kube::Client>,
    /// `None`: no limit (`--request-timeout 0`).
    timeout: Option<Duration>,
    route: std::sync::Mutex<Route>,
    /// The apiserver the routes through it use, named when it cannot be reached.
    apiserver: Option<crate::connect::Target>,
}

/// The operator's answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl OperatorClient {
    /// Through the apiserver (`kube` is needed) or direct.
    pub fn new(
        endpoint: OperatorEndpoint,
        kube: Option<kube::Client>,
        timeout: Option<Duration>,
    ) -> Self {
        OperatorClient {
            endpoint,
            kube,
            timeout,
            route: std::sync::Mutex::new(Route::default()),
            apiserver: None,
        }
    }

    /// Names `target` (server and context) when the apiserver cannot be reached on the way to
    /// the operator.
    pub fn via_apiserver(mut self, target: crate::connect::Target) -> Self {
        self.apiserver = Some(target);
        self
    }

    /// A failed apiserver call on the way to the operator, as one line: the apiserver's own
    /// refusal, or which apiserver could not be reached.
    fn kube_failure(&self, e: kube::Error) -> String {
        match (&self.apiserver, e) {
            (Some(target), kube::Error::Api(s)) if s.code == 401 => {
                crate::connect::api_error(target, kube::Error::Api(s)).to_string()
            }
            (_, e @ kube::Error::Api(_)) => kube_message(e),
            (Some(target), e) => crate::connect::api_error(target, e).to_string(),
            (None, e) => format!(
                "the apiserver did not answer: {}",
                crate::connect::cause(&e)
            ),
        }
    }

    /// How the last answer came.
    pub fn route(&self) -> Route {
        self.route
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_route(&self, through: &'static str, pod: Option<String>) {
        *self
            .route
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Route { through, pod };
    }

    /// `GET /debug/trace/<namespace>/<bundle>` as JSON, `None` when the operator has no trace.
    pub async fn trace(
        &self,
        namespace: &str,
        bundle: &str,
    ) -> Result<Option<serde_json::Value>, CliError> {
        let path = format!(
            "/debug/trace/{}/{}",
            utf8_percent_encode(namespace, SEGMENT),
            utf8_percent_encode(bundle, SEGMENT)
        );
        let answer = self.call(http::Method::GET, &path, None).await?;
        match answer.status {
            200 => json(&answer).map(Some),
            404 if operator_error(&answer.body).is_some() => Ok(None),
            _ => Err(self.failure(&answer)),
        }
    }

    /// `POST /v1/what-if` with a Bundle as JSON.
    pub async fn what_if(&self, bundle: &serde_json::Value) -> Result<serde_json::Value, CliError> {
        let body = serde_json::to_vec(bundle).map_err(|e| CliError::Input(e.to_string()))?;
        let answer = self
            .call(http::Method::POST, "/v1/what-if", Some(body))
            .await?;
        match answer.status {
            200 => json(&answer),
            _ => Err(self.failure(&answer)),
        }
    }

    /// Finds the leader Pod, port-forwards to its debugging port and asks; a replica that
    /// answers that it does not lead names the leader, which is asked instead (once).
    #[allow(clippy::too_many_arguments)]
    async fn through_the_leader(
        &self,
        kube: &kube::Client,
        namespace: &str,
        release: Option<&str>,
        selector: &str,
        method: &http::Method,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Answer, CliError> {
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::api::core::v1::Pod;
        let unreachable = |reason: String| CliError::OperatorUnreachable {
            via: self.endpoint.describe(),
            reason,
            hint: self.endpoint.hint(),
        };
        let pods: kube::Api<Pod> = kube::Api::namespaced(kube.clone(), namespace);
        let listed = pods
            .list(&kube::api::ListParams::default().labels(selector))
            .await
            .map_err(|e| {
                unreachable(format!(
                    "listing the operator's Pods: {}",
                    self.kube_failure(e)
                ))
            })?;
        let found: Vec<_> = listed
            .items
            .iter()
            .map(crate::locate::OperatorPod::from_pod)
            .collect();
        let release = crate::locate::release(namespace, selector, found, release)
            .map_err(|e| unreachable(e.to_string()))?;
        let mut holder = match release.lease_name() {
            Some(lease) => {
                let leases: kube::Api<Lease> = kube::Api::namespaced(kube.clone(), namespace);
                leases
                    .get_opt(lease)
                    .await
                    .map_err(|e| {
                        unreachable(format!(
                            "reading the leader Lease {namespace}/{lease}: {}",
                            self.kube_failure(e)
                        ))
                    })?
                    .and_then(|l| l.spec?.holder_identity)
            }
            None => None,
        };
        let mut avoid: Vec<String> = Vec::new();
        loop {
            let target = crate::locate::target(namespace, &release, holder.as_deref(), &avoid)
                .map_err(|e| unreachable(e.to_string()))?;
            let answer = port_forward(&pods, &target, method, path, body)
                .await
                .map_err(|e| {
                    unreachable(format!(
                        "port-forward to pod {namespace}/{} port {}: {e}",
                        target.pod, target.port
                    ))
                })?;
            match standby_names_leader(&answer) {
                Some(leader) if avoid.is_empty() && leader != target.pod => {
                    avoid.push(target.pod);
                    holder = Some(leader);
                }
                _ => {
                    self.set_route("leader-portforward", Some(target.pod));
                    return Ok(answer);
                }
            }
        }
    }

    fn failure(&self, answer: &Answer) -> CliError {
        if let Some(message) = operator_error(&answer.body) {
            return CliError::Operator {
                status: answer.status,
                message,
            };
        }
        // Not the operator's JSON: the apiserver (no such service, no endpoints, dial failed)
        // or something in between.
        let reason = apiserver_message(&answer.body)
            .unwrap_or_else(|| format!("HTTP {}: {}", answer.status, first_line(&answer.body)));
        CliError::OperatorUnreachable {
            via: self.endpoint.describe(),
            reason,
            hint: self.endpoint.hint(),
        }
    }

    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, CliError> {
        let unreachable = |reason: String| CliError::OperatorUnreachable {
            via: self.endpoint.describe(),
            reason,
            hint: self.endpoint.hint(),
        };
        let fut = async {
            match &self.endpoint {
                OperatorEndpoint::Leader {
                    namespace,
                    release,
                    selector,
                } => {
                    let kube = self
                        .kube
                        .as_ref()
                        .ok_or_else(|| unreachable("no Kubernetes client".into()))?;
                    self.through_the_leader(
                        kube,
                        namespace,
                        release.as_deref(),
                        selector,
                        &method,
                        path,
                        body.as_deref(),
                    )
                    .await
                }
                OperatorEndpoint::ServiceProxy {
                    namespace,
                    service,
                    port,
                } => {
                    let kube = self
                        .kube
                        .as_ref()
                        .ok_or_else(|| unreachable("no Kubernetes client".into()))?;
                    let uri = format!(
                        "/api/v1/namespaces/{}/services/{}:{}/proxy{path}",
                        utf8_percent_encode(namespace, SEGMENT),
                        utf8_percent_encode(service, SEGMENT),
                        utf8_percent_encode(port, SEGMENT),
                    );
                    let req = request(method, &uri, body)?;
                    let res = kube
                        .send(req.map(kube::client::Body::from))
                        .await
                        .map_err(|e| unreachable(self.kube_failure(e)))?;
                    self.set_route("service-proxy", None);
                    read(res).await.map_err(unreachable)
                }
                OperatorEndpoint::Direct(base) => {
                    let answer = direct(base, method, path, body)
                        .await
                        .map_err(unreachable)?;
                    self.set_route("direct", None);
                    Ok(answer)
                }
            }
        };
        let Some(limit) = self.timeout else {
            return fut.await;
        };
        match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(unreachable(format!(
                "no answer within {}",
                crate::error::humantime(limit)
            ))),
        }
    }
}

fn request(
    method: http::Method,
    uri: &str,
    body: Option<Vec<u8>>,
) -> Result<http::Request<Vec<u8>>, CliError> {
    let mut b = http::Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::ACCEPT, "application/json");
    if body.is_some() {
        b = b.header(http::header::CONTENT_TYPE, "application/json");
    }
    b.body(body.unwrap_or_default())
        .map_err(|e| CliError::Input(format!("building the request to {uri}: {e}")))
}

async fn read(res: http::Response<kube::client::Body>) -> Result<Answer, String> {
    let status = res.status().as_u16();
    let limited = http_body_util::Limited::new(res.into_body(), MAX_ANSWER_BYTES);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// A plain HTTP/1.1 exchange with an operator reached directly (`--operator-url`).
async fn direct(
    base: &str,
    method: http::Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<Answer, String> {
    let hostport = base
        .strip_prefix("http://")
        .ok_or_else(|| format!("--operator-url must start with http:// (got {base:?})"))?
        .trim_end_matches('/');
    if hostport.is_empty() || hostport.contains('/') {
        return Err(format!(
            "--operator-url must be http://HOST:PORT with no path (got {base:?})"
        ));
    }
    let stream = tokio::net::TcpStream::connect(hostport)
        .await
        .map_err(|e| format!("connecting to {hostport}: {e}"))?;
    exchange(stream, hostport, &method, path, body.as_deref()).await
}

/// One request over a port-forward to `target` in the Pods' namespace.
async fn port_forward(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    target: &crate::locate::Target,
    method: &http::Method,
    path: &str,
    body: Option<&[u8]>,
) -> Result<Answer, String> {
    let mut forwarder = pods
        .portforward(&target.pod, &[target.port])
        .await
        .map_err(kube_message)?;
    let stream = forwarder
        .take_stream(target.port)
        .ok_or("the port-forward opened no stream")?;
    let errors = forwarder.take_error(target.port);
    let host = format!("127.0.0.1:{}", target.port);
    let answer = tokio::select! {
        a = exchange(stream, &host, method, path, body) => a,
        // The kubelet reports a port nothing listens on (or a Pod it cannot reach) here.
        Some(Some(e)) = async { match errors { Some(f) => Some(f.await), None => None } } => Err(e),
    };
    forwarder.abort();
    answer
}

/// Writes one HTTP/1.1 request on `stream` and reads the whole answer: up to its
/// Content-Length, the end of its chunks, or the end of the stream (a port-forward may stay open
/// after the operator has answered, so the length decides where possible).
async fn exchange<S>(
    mut stream: S,
    host: &str,
    method: &http::Method,
    path: &str,
    body: Option<&[u8]>,
) -> Result<Answer, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    stream.write_all(body).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if complete(&buf) {
            break;
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the answer: {e}"))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "the answer is larger than {MAX_ANSWER_BYTES} bytes"
            ));
        }
    }
    if buf.is_empty() {
        return Err("the connection closed without an answer".into());
    }
    parse_http_response(&buf)
}

/// Whether `raw` holds a whole HTTP/1.1 response (by Content-Length or the last chunk).
fn complete(raw: &[u8]) -> bool {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let body = &raw[end + 4..];
    for line in head.lines() {
        if let Some(v) = line.strip_prefix("content-length:") {
            return v.trim().parse::<usize>().is_ok_and(|n| body.len() >= n);
        }
        if line.starts_with("transfer-encoding:") && line.contains("chunked") {
            return body.ends_with(b"0\r\n\r\n");
        }
    }
    false
}

/// The leader a standby named in its `503` (see the operator's debugging API).
fn standby_names_leader(answer: &Answer) -> Option<String> {
    if answer.status != 503 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&answer.body).ok()?;
    v.get("role")?;
    v.get("leader")?.as_str().map(str::to_owned)
}

/// A kube error as one line.
fn kube_message(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

/// Status and body of a raw HTTP/1.1 response (chunked or not).
pub fn parse_http_response(raw: &[u8]) -> Result<Answer, String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("the answer is not HTTP")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("the answer has no HTTP status")?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body).ok_or("a malformed chunked answer")?
    } else {
        body.to_owned()
    };
    Ok(Answer { status, body })
}

fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let n = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if n == 0 {
            return Some(out);
        }
        out.push_str(after.get(..n)?);
        rest = after.get(n..)?.strip_prefix("\r\n")?;
    }
}

fn json(answer: &Answer) -> Result<serde_json::Value, CliError> {
    serde_json::from_str(&answer.body).map_err(|e| CliError::Operator {
        status: answer.status,
        message: format!("the answer is not JSON ({e}): {}", first_line(&answer.body)),
    })
}

/// The operator's own error shape: `{"error": "..."}`, or a replica that does not lead:
/// `{"error", "role", "leader"}`.
fn operator_error(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let obj = v.as_object()?;
    let standby = obj.len() == 3 && obj.contains_key("role") && obj.contains_key("leader");
    (obj.len() == 1 || standby)
        .then(|| obj.get("error")?.as_str().map(str::to_owned))
        .flatten()
}

/// The apiserver's `Status` message, if the body is one.
fn apiserver_message(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    (v["kind"] == "Status").then(|| v["message"].as_str().unwrap_or("").to_owned())
}

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("").trim();
    line.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_answers_parse_plain_and_chunked() {
        let a = parse_http_response(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}")
            .expect("plain");
        assert_eq!((a.status, a.body.as_str()), (404, "{}"));
        let a = parse_http_response(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .expect("chunked");
        assert_eq!(a.body, "abcde");
        assert!(parse_http_response(b"garbage").is_err());
        assert!(
            parse_http_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")
                .is_err()
        );
    }

    #[test]
    fn a_standby_names_the_leader() {
        let a = Answer {
            status: 503,
            body: r#"{"error":"this replica is standby and holds no placement state; the leader is am-2","role":"standby","leader":"am-2"}"#.into(),
        };
        assert_eq!(standby_names_leader(&a).as_deref(), Some("am-2"));
        assert_eq!(
            operator_error(&a.body).as_deref(),
            Some("this replica is standby and holds no placement state; the leader is am-2")
        );
        let none = Answer {
            status: 503,
            body: r#"{"error":"x","role":"starting","leader":null}"#.into(),
        };
        assert_eq!(standby_names_leader(&none), None);
    }

    #[test]
    fn an_answer_is_complete_by_its_length_or_last_chunk() {
        assert!(!complete(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n"));
        assert!(!complete(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nab"));
        assert!(complete(
            b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nabcd"
        ));
        assert!(!complete(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n"
        ));
        assert!(complete(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        ));
    }

    #[tokio::test]
    async fn an_exchange_over_a_stream_stops_at_the_content_length() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (client, mut server) = tokio::io::duplex(4096);
        let serve = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let n = server.read(&mut buf).await.unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]).into_owned();
            let _ = server
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{\"ok\":true}")
                .await;
            // The stream stays open, as a port-forward's may.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            request
        });
        let answer = exchange(
            client,
            "127.0.0.1:8082",
            &http::Method::GET,
            "/debug/trace/a/b",
            None,
        )
        .await
        .expect("an answer");
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (200, r#"{"ok":true}"#)
        );
        serve.abort();
    }

    #[test]
    fn the_operators_errors_are_told_from_the_apiservers() {
        assert_eq!(
            operator_error(r#"{"error": "no placement trace"}"#).as_deref(),
            Some("no placement trace")
        );
        assert_eq!(
            operator_error(r#"{"kind": "Status", "message": "x"}"#),
            None
        );
        assert_eq!(
            apiserver_message(r#"{"kind": "Status", "message": "services \"x\" not found"}"#)
                .as_deref(),
            Some("services \"x\" not found")
        );
    }

    #[test]
    fn an_unreachable_operator_names_the_way_it_was_tried() {
        let c = OperatorClient::new(
            OperatorEndpoint::ServiceProxy {
                namespace: "automanager-system".into(),
                service: "automanager-operator".into(),
                port: "debug".into(),
            },
            None,
            Some(Duration::from_secs(1)),
        );
        let e = c.failure(&Answer {
            status: 503,
            body: r#"{"kind":"Status","message":"no endpoints available for service \"automanager-operator\""}"#.into(),
        });
        let msg = e.to_string();
        assert!(msg.starts_with("cannot reach the operator through the apiserver's proxy to service automanager-system/automanager-operator port debug: no endpoints available"), "{msg}");
    }

    #[tokio::test]
    async fn an_unreachable_apiserver_on_the_way_is_named() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let server = format!("http://127.0.0.1:{port}");
        let kube = kube::Client::try_from(kube::Config::new(server.parse().expect("a URL")))
            .expect("client");
        let target = crate::connect::Target {
            server: server.clone(),
            context: "kind-x".into(),
        };
        for endpoint in [
            OperatorEndpoint::ServiceProxy {
                namespace: "automanager-system".into(),
                service: "automanager-operator".into(),
                port: "debug".into(),
            },
            OperatorEndpoint::Leader {
                namespace: "automanager-system".into(),
                release: None,
                selector: crate::locate::DEFAULT_SELECTOR.into(),
            },
        ] {
            let c = OperatorClient::new(endpoint, Some(kube.clone()), Some(Duration::from_secs(5)))
                .via_apiserver(target.clone());
            let msg = c
                .trace("default", "news")
                .await
                .expect_err("nothing listens")
                .to_string();
            assert!(
                msg.contains(&format!(
                    "cannot reach the apiserver at {server} (context kind-x): "
                )),
                "{msg}"
            );
        }
    }
}
