//! `automanager-operator probe`: what the chart's `helm test` Pod runs (the image has no shell
//! and no curl). It asks an HTTP endpoint (the metrics Service's `/readyz`) and reads the
//! leader Lease, and succeeds when the endpoint answers 200 and a Pod of the release holds an
//! unexpired Lease. Both are retried until a deadline, since a test may start a moment before
//! the Service's endpoints or the first election settle.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Why one check failed (retried until the deadline, then reported).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProbeError {
    #[error("{0}: not an http://HOST[:PORT]/PATH URL")]
    BadUrl(String),
    #[error("{0}: want NAMESPACE/NAME")]
    BadLease(String),
    #[error("{url}: {reason}")]
    Http { url: String, reason: String },
    #[error("{url}: answered {status}, want 200")]
    Status { url: String, status: u16 },
    #[error("lease {lease}: {reason}")]
    Lease { lease: String, reason: String },
}

/// An `http://` URL, split for a plain HTTP/1.1 GET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTarget {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl HttpTarget {
    /// Parses `http://HOST[:PORT][/PATH]` (port 80 and path `/` by default; IPv6 in brackets).
    pub fn parse(url: &str) -> Result<HttpTarget, ProbeError> {
        let bad = || ProbeError::BadUrl(url.to_owned());
        let rest = url.strip_prefix("http://").ok_or_else(bad)?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(bad)?;
            match after.strip_prefix(':') {
                Some(p) => (host, p.parse::<u16>().map_err(|_| bad())?),
                None if after.is_empty() => (host, 80u16),
                None => return Err(bad()),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad())?),
                None => (authority, 80u16),
            }
        };
        if host.is_empty() || host.contains(['@', ' ']) || port == 0 {
            return Err(bad());
        }
        Ok(HttpTarget {
            host: host.to_owned(),
            port,
            path: path.to_owned(),
        })
    }

    fn connect_to(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The status code of an HTTP/1.x response's first line.
pub fn status_code(response: &str) -> Option<u16> {
    let line = response.lines().next()?;
    let mut words = line.split_whitespace();
    if !words.next()?.starts_with("HTTP/1.") {
        return None;
    }
    words.next()?.parse().ok()
}

/// Whether `spec` says a Pod whose name starts with `holder_prefix` holds the Lease at
/// `now_secs` (Unix seconds): the holder's name, or why not.
pub fn lease_holder(
    spec: Option<&LeaseSpec>,
    holder_prefix: &str,
    now_secs: i64,
) -> Result<String, String> {
    let spec = spec.ok_or("it has no spec yet")?;
    let holder = spec
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
        .ok_or("nobody holds it")?;
    if !holder.starts_with(holder_prefix) {
        return Err(format!(
            "held by {holder}, not a Pod of this release ({holder_prefix}…)"
        ));
    }
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .ok_or_else(|| format!("held by {holder}, never renewed"))?
        .0
        .as_second();
    let expires = renewed.saturating_add(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
    if expires < now_secs {
        return Err(format!(
            "held by {holder}, expired {}s ago",
            now_secs - expires
        ));
    }
    Ok(holder.to_owned())
}

/// One GET of `target`; `Ok` on a 200.
pub async fn get(target: &HttpTarget, url: &str, timeout: Duration) -> Result<(), ProbeError> {
    let http = |reason: String| ProbeError::Http {
        url: url.to_owned(),
        reason,
    };
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(target.connect_to())
            .await
            .map_err(|e| http(format!("connecting: {e}")))?;
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: automanager-probe\r\nConnection: close\r\n\r\n",
            target.path,
            target.connect_to()
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| http(format!("sending: {e}")))?;
        // The status line is all that is read; a healthy answer is a few bytes.
        let mut buf = vec![0u8; 1024];
        let mut len = 0;
        while len < buf.len() && !buf[..len].contains(&b'\n') {
            let n = stream
                .read(&mut buf[len..])
                .await
                .map_err(|e| http(format!("reading: {e}")))?;
            if n == 0 {
                break;
            }
            len += n;
        }
        let text = String::from_utf8_lossy(&buf[..len]);
        match status_code(&text) {
            Some(200) => Ok(()),
            Some(status) => Err(ProbeError::Status {
                url: url.to_owned(),
                status,
            }),
            None => Err(http("no HTTP status line in the answer".into())),
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(http(format!("no answer within {timeout:?}"))))
}

/// Reads Lease `namespace/name` with the in-cluster (or kubeconfig) credentials; the holder's
/// name when a Pod starting with `holder_prefix` holds it.
pub async fn lease(
    client: &kube::Client,
    lease: &str,
    holder_prefix: &str,
) -> Result<String, ProbeError> {
    let (namespace, name) = lease
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
        .ok_or_else(|| ProbeError::BadLease(lease.to_owned()))?;
    let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), namespace);
    let err = |reason: String| ProbeError::Lease {
        lease: lease.to_owned(),
        reason,
    };
    let object = api.get(name).await.map_err(|e| err(e.to_string()))?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    lease_holder(object.spec.as_ref(), holder_prefix, now).map_err(err)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    #[test]
    fn urls_split_into_host_port_and_path() {
        let t = HttpTarget::parse("http://am-metrics.ns.svc:8080/readyz").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("am-metrics.ns.svc", 8080, "/readyz")
        );
        let t = HttpTarget::parse("http://host").unwrap();
        assert_eq!((t.port, t.path.as_str()), (80, "/"));
        let t = HttpTarget::parse("http://[fd00::1]:81/x?y=1").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("fd00::1", 81));
        assert_eq!(t.connect_to(), "[fd00::1]:81");
        for bad in [
            "https://h:1/",
            "http://:80/",
            "http://h:0/",
            "http://h:x/",
            "http://u@h/",
            "h:80",
        ] {
            assert!(HttpTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_status_comes_from_the_first_line() {
        assert_eq!(status_code("HTTP/1.1 200 OK\r\n\r\nok"), Some(200));
        assert_eq!(
            status_code("HTTP/1.0 503 Service Unavailable\r\n"),
            Some(503)
        );
        assert_eq!(status_code("SSH-2.0-x\r\n"), None);
        assert_eq!(status_code(""), None);
    }

    const NOW: i64 = 1_800_000_000;

    fn spec(holder: Option<&str>, renewed_secs_ago: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: Some(MicroTime(
                k8s_openapi::jiff::Timestamp::from_second(NOW - renewed_secs_ago).unwrap(),
            )),
            lease_duration_seconds: Some(duration),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_lease_counts_only_when_a_pod_of_the_release_holds_it_unexpired() {
        let prefix = "am-automanager-";
        assert_eq!(
            lease_holder(
                Some(&spec(Some("am-automanager-7d-x1"), 2, 15)),
                prefix,
                NOW
            ),
            Ok("am-automanager-7d-x1".into())
        );
        let expired = lease_holder(
            Some(&spec(Some("am-automanager-7d-x1"), 60, 15)),
            prefix,
            NOW,
        );
        assert!(expired.unwrap_err().contains("expired 45s ago"));
        let foreign = lease_holder(Some(&spec(Some("laptop-1234"), 1, 15)), prefix, NOW);
        assert!(foreign.unwrap_err().contains("not a Pod of this release"));
        assert!(lease_holder(Some(&spec(None, 1, 15)), prefix, NOW).is_err());
        assert!(lease_holder(Some(&spec(Some(""), 1, 15)), prefix, NOW).is_err());
        assert!(lease_holder(None, prefix, NOW).is_err());
        let never = LeaseSpec {
            holder_identity: Some("am-automanager-x".into()),
            ..LeaseSpec::default()
        };
        assert!(
            lease_holder(Some(&never), prefix, NOW)
                .unwrap_err()
                .contains("never renewed")
        );
    }
}
