//! Reaching the operator's debugging API (`/debug/trace`, `/v1/what-if`).
//!
//! By default through the apiserver's service proxy:
//! `/api/v1/namespaces/<ns>/services/<service>:<port>/proxy/<path>`, so the plugin needs nothing
//! but the kubeconfig and RBAC `get` on `services/proxy` in the operator's namespace; no port is
//! exposed and no URL is typed. `--operator-url` talks to an operator directly instead (one
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
            OperatorEndpoint::ServiceProxy { .. } => "The debugging port is off by default: enable it in the operator's config (see docs/cli.md), or name another service with --operator-namespace, --operator-service and --operator-port.".into(),
            OperatorEndpoint::Direct(_) => "Check --operator-url (or AUTOMANAGER_OPERATOR_URL).".into(),
        }
    }
}

/// A client of the operator's debugging API.
pub struct OperatorClient {
    endpoint: OperatorEndpoint,
    kube: Option<kube::Client>,
    timeout: Duration,
}

/// The operator's answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl OperatorClient {
    /// Through the apiserver (`kube` is needed) or direct.
    pub fn new(endpoint: OperatorEndpoint, kube: Option<kube::Client>, timeout: Duration) -> Self {
        OperatorClient {
            endpoint,
            kube,
            timeout,
        }
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
                        .map_err(|e| unreachable(format!("the apiserver did not answer: {e}")))?;
                    read(res).await.map_err(unreachable)
                }
                OperatorEndpoint::Direct(base) => {
                    direct(base, method, path, body).await.map_err(unreachable)
                }
            }
        };
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(unreachable(format!(
                "no answer within {}",
                crate::error::humantime(self.timeout)
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hostport = base
        .strip_prefix("http://")
        .ok_or_else(|| format!("--operator-url must start with http:// (got {base:?})"))?
        .trim_end_matches('/');
    if hostport.is_empty() || hostport.contains('/') {
        return Err(format!(
            "--operator-url must be http://HOST:PORT with no path (got {base:?})"
        ));
    }
    let mut stream = tokio::net::TcpStream::connect(hostport)
        .await
        .map_err(|e| format!("connecting to {hostport}: {e}"))?;
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    stream.write_all(&body).await.map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    stream
        .take(MAX_ANSWER_BYTES as u64)
        .read_to_end(&mut buf)
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    parse_http_response(&buf)
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

/// The operator's own error shape: `{"error": "..."}`.
fn operator_error(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let obj = v.as_object()?;
    (obj.len() == 1)
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
            Duration::from_secs(1),
        );
        let e = c.failure(&Answer {
            status: 503,
            body: r#"{"kind":"Status","message":"no endpoints available for service \"automanager-operator\""}"#.into(),
        });
        let msg = e.to_string();
        assert!(msg.starts_with("cannot reach the operator through the apiserver's proxy to service automanager-system/automanager-operator port debug: no endpoints available"), "{msg}");
    }
}
