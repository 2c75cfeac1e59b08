//! The connection to the apiserver, made from kubectl's flags as kubectl makes it: kube's own
//! kubeconfig loader picks the context, cluster and user (`--kubeconfig`, `--context`,
//! `--cluster`, `--user`), then the flags that override single fields are applied to the
//! resulting [`kube::Config`] (`--server`, `--token`, `--certificate-authority`,
//! `--insecure-skip-tls-verify`, client certificates, impersonation, `--request-timeout`).
//!
//! Every failure to reach or authenticate to the apiserver names the server and the context
//! ([`Target`]), so a person with several clusters sees at once which one did not answer.

use std::fmt;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::GlobalArgs;
use crate::error::CliError;

/// The apiserver a command talks to and the kubeconfig context it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The server URL, as in the kubeconfig or `--server`.
    pub server: String,
    /// The context's name; `in-cluster` for the Pod's service account, `none` for `--server`
    /// without any kubeconfig.
    pub context: String,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (context {})", self.server, self.context)
    }
}

/// The client configuration and where it points.
#[derive(Clone)]
pub struct Connection {
    pub config: kube::Config,
    pub target: Target,
}

impl Connection {
    /// A kube client of this configuration.
    pub fn client(&self) -> Result<kube::Client, CliError> {
        client_of(self.config.clone(), &self.target)
    }
}

/// A kube client of `config`; a configuration kube cannot use (an unreadable certificate, a
/// failing credential plugin) is said with the server and context it was for.
pub fn client_of(config: kube::Config, target: &Target) -> Result<kube::Client, CliError> {
    kube::Client::try_from(config)
        .map_err(|e| CliError::Kubeconfig(format!("for {target}: {}", cause(&e))))
}

/// Loads the configuration as kubectl would from the global flags: the kubeconfig (its
/// current context unless `--context`; `--cluster`/`--user` replace the context's), else the
/// Pod's service account when the plugin runs in a cluster, else `--server` alone.
pub async fn load(g: &GlobalArgs) -> Result<Connection, CliError> {
    let options = KubeConfigOptions {
        context: g.context.clone(),
        cluster: g.cluster.clone(),
        user: g.user.clone(),
    };
    let kubeconfig = match &g.kubeconfig {
        // kube's message names the file.
        Some(path) => Ok(Kubeconfig::read_from(path).map_err(|e| CliError::Kubeconfig(cause(&e)))?),
        None => Kubeconfig::read(),
    };
    let (mut config, context) = match kubeconfig {
        Ok(kc) => {
            let context = options
                .context
                .clone()
                .or_else(|| kc.current_context.clone())
                .unwrap_or_else(|| "(none)".into());
            let config = kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| {
                    CliError::Kubeconfig(format!("for context {context}: {}", cause(&e)))
                })?;
            (config, context)
        }
        Err(read_error) => {
            let read_error = cause(&read_error);
            if let Some(server) = &g.server {
                (kube::Config::new(server_uri(server)?), "none".to_owned())
            } else if options.context.is_none()
                && options.cluster.is_none()
                && options.user.is_none()
            {
                let config = kube::Config::incluster().map_err(|e| {
                    CliError::Kubeconfig(format!(
                        "{read_error}; and not running in a cluster either ({})",
                        cause(&e)
                    ))
                })?;
                (config, "in-cluster".to_owned())
            } else {
                return Err(CliError::Kubeconfig(read_error));
            }
        }
    };
    apply_overrides(&mut config, g)?;
    let target = Target {
        server: server_text(&config.cluster_url),
        context,
    };
    Ok(Connection { config, target })
}

/// `--server` and the other flags that replace one field of the loaded configuration.
pub fn apply_overrides(config: &mut kube::Config, g: &GlobalArgs) -> Result<(), CliError> {
    if let Some(server) = &g.server {
        config.cluster_url = server_uri(server)?;
    }
    if let Some(token) = &g.token {
        let auth = &mut config.auth_info;
        auth.token = Some(token.clone().into());
        // kube prefers these to a token; the flag is meant to win, as with kubectl.
        auth.token_file = None;
        auth.username = None;
        auth.password = None;
        auth.exec = None;
        auth.auth_provider = None;
    }
    if g.insecure_skip_tls_verify && g.certificate_authority.is_some() {
        return Err(CliError::Kubeconfig(
            "--certificate-authority and --insecure-skip-tls-verify exclude each other (as with kubectl)".into(),
        ));
    }
    if let Some(path) = &g.certificate_authority {
        config.root_cert = Some(read_certificates(path)?);
        config.root_cert_file = None;
        config.accept_invalid_certs = false;
    }
    if g.insecure_skip_tls_verify {
        config.accept_invalid_certs = true;
    }
    if let Some(name) = &g.tls_server_name {
        config.tls_server_name = Some(name.clone());
    }
    if let Some(path) = &g.client_certificate {
        config.auth_info.client_certificate = Some(path.display().to_string());
        config.auth_info.client_certificate_data = None;
    }
    if let Some(path) = &g.client_key {
        config.auth_info.client_key = Some(path.display().to_string());
        config.auth_info.client_key_data = None;
    }
    if let Some(user) = &g.as_user {
        config.auth_info.impersonate = Some(user.clone());
    }
    if !g.as_group.is_empty() {
        config.auth_info.impersonate_groups = Some(g.as_group.clone());
    }
    if let Some(uid) = &g.as_uid {
        config.auth_info.impersonate_uid = Some(uid.clone());
    }
    match g.request_timeout.0 {
        Some(t) => {
            config.connect_timeout = Some(t);
            config.read_timeout = Some(t);
            config.write_timeout = Some(t);
            // The timeout counts from the request, not from when a pooled connection went idle.
            config.reset_reader_on_write = true;
        }
        // kubectl's 0: no timeout on requests; dialling keeps kube's own bound.
        None => {
            config.read_timeout = None;
            config.write_timeout = None;
        }
    }
    Ok(())
}

/// `--server` as kubectl takes it: a URL, or `host:port` meaning https.
fn server_uri(server: &str) -> Result<http::Uri, CliError> {
    let text = if server.contains("://") {
        server.to_owned()
    } else {
        format!("https://{server}")
    };
    text.parse::<http::Uri>()
        .map_err(|e| CliError::Kubeconfig(format!("--server {server:?} is not a URL: {e}")))
}

/// The URL as a person wrote it (without the `/` an empty path prints as).
fn server_text(uri: &http::Uri) -> String {
    let text = uri.to_string();
    match text.strip_suffix('/') {
        Some(t) if uri.path() == "/" => t.to_owned(),
        _ => text,
    }
}

/// The certificates (DER) of a PEM file, for `--certificate-authority`.
fn read_certificates(path: &std::path::Path) -> Result<Vec<Vec<u8>>, CliError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let pem = std::fs::read(path).map_err(|e| {
        CliError::Kubeconfig(format!("--certificate-authority {}: {e}", path.display()))
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            CliError::Kubeconfig(format!("--certificate-authority {}: {e}", path.display()))
        })?;
    if certs.is_empty() {
        return Err(CliError::Kubeconfig(format!(
            "--certificate-authority {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

/// A failed apiserver call as the message a person needs: the apiserver's own refusal as it
/// said it; failing to connect, to authenticate or to get an answer in time with the server
/// and the context.
pub fn api_error(target: &Target, e: kube::Error) -> CliError {
    match e {
        kube::Error::Api(s) if s.code == 401 => CliError::ApiUnauthorized {
            target: target.clone(),
            cause: if s.message.is_empty() {
                s.reason.clone()
            } else {
                s.message.clone()
            },
        },
        kube::Error::Api(s) => CliError::Api(format!(
            "the apiserver refused: {}",
            if s.message.is_empty() {
                s.reason.clone()
            } else {
                s.message.clone()
            }
        )),
        kube::Error::Auth(e) => CliError::ApiUnauthorized {
            target: target.clone(),
            cause: cause(&e),
        },
        kube::Error::SerdeError(e) => CliError::Api(format!(
            "the apiserver at {target} answered something this plugin does not understand: {e}"
        )),
        other => CliError::ApiUnreachable {
            target: target.clone(),
            cause: cause(&other),
        },
    }
}

/// An error and its sources as one line, without kube's type prefixes and without repeating
/// a message its wrapper already quotes: `client error (Connect): tcp connect error:
/// Connection refused (os error 111)`.
pub fn cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        let mut text = err.to_string();
        for prefix in ["ServiceError: ", "HyperError: ", "auth error: "] {
            if let Some(rest) = text.strip_prefix(prefix) {
                text = rest.to_owned();
            }
        }
        // A timeout from the client's own layers says only "elapsed" or similar.
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
            && !text.contains("timed out")
        {
            text = format!("timed out ({text})");
        }
        let repeated = parts.last().is_some_and(|p| p.ends_with(&text));
        if !repeated && !text.is_empty() {
            // The wrapper's message often ends with its source's: keep only the wrapper's own.
            if let Some(last) = parts.last_mut()
                && let Some(own) = last.strip_suffix(&format!(": {text}"))
            {
                *last = own.to_owned();
            }
            parts.push(text);
        }
        next = err.source();
    }
    parts.join(": ")
}

/// The timeout of one request to the apiserver or the operator (`--request-timeout`):
/// `None` is kubectl's `0`, no timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimeout(pub Option<Duration>);

impl RequestTimeout {
    /// Parses kubectl's `--request-timeout`: `0` (no timeout), a bare integer of seconds, or a
    /// Go duration such as `5s`, `1m`, `1m30s`, `1.5s`, `500ms`.
    pub fn parse(text: &str) -> Result<RequestTimeout, String> {
        let t = text.trim();
        if let Ok(secs) = t.parse::<i64>() {
            return match secs {
                0 => Ok(RequestTimeout(None)),
                s if s < 0 => Err(format!("`{text}` is negative")),
                s => Ok(RequestTimeout(Some(Duration::from_secs(s.unsigned_abs())))),
            };
        }
        let d = parse_go_duration(t).map_err(|e| {
            format!(
                "{e}: a timeout is 0 (none), a number of seconds, or a number with a unit (1s, 2m, 3h)"
            )
        })?;
        Ok(RequestTimeout((!d.is_zero()).then_some(d)))
    }
}

/// Go's `time.ParseDuration`, without negative values: `1h2m3.5s`, `250ms`, `10us`.
fn parse_go_duration(text: &str) -> Result<Duration, String> {
    if text.is_empty() {
        return Err("empty duration".into());
    }
    if text.starts_with('-') {
        return Err(format!("`{text}` is negative"));
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("`{text}` is not a duration"));
        }
        let n: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("`{text}` is not a duration"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(format!("`{text}` lacks a unit")),
            other => return Err(format!("`{text}` has unknown unit `{other}`")),
        };
        total += n * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| format!("`{text}` is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        g: GlobalArgs,
    }

    fn flags(args: &[&str]) -> GlobalArgs {
        Flags::try_parse_from(std::iter::once("kubectl-automanager").chain(args.iter().copied()))
            .expect("parses")
            .g
    }

    /// Two contexts on two clusters with two users, the second current.
    const KUBECONFIG: &str = r#"
apiVersion: v1
kind: Config
current-context: kind-b
clusters:
  - name: kind-a
    cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
  - name: kind-b
    cluster: {server: "https://10.0.0.2:6443", insecure-skip-tls-verify: true}
users:
  - name: alice
    user: {token: alice-token}
  - name: bob
    user: {token: bob-token}
contexts:
  - name: kind-a
    context: {cluster: kind-a, user: alice, namespace: team-a}
  - name: kind-b
    context: {cluster: kind-b, user: bob}
"#;

    fn kubeconfig() -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(f.path(), KUBECONFIG).expect("write");
        f
    }

    #[tokio::test]
    async fn the_current_context_or_the_one_named_with_its_cluster_and_user() {
        let f = kubeconfig();
        let path = f.path().to_str().expect("utf-8 path");
        let c = load(&flags(&["--kubeconfig", path])).await.expect("loads");
        assert_eq!(c.target.server, "https://10.0.0.2:6443");
        assert_eq!(c.target.context, "kind-b");
        assert_eq!(
            c.target.to_string(),
            "https://10.0.0.2:6443 (context kind-b)"
        );
        assert_eq!(c.config.default_namespace, "default");

        let c = load(&flags(&["--kubeconfig", path, "--context", "kind-a"]))
            .await
            .expect("loads");
        assert_eq!(c.target.server, "https://127.0.0.1:6443");
        assert_eq!(c.target.context, "kind-a");
        assert_eq!(c.config.default_namespace, "team-a");

        // --cluster and --user replace the context's.
        let c = load(&flags(&[
            "--kubeconfig",
            path,
            "--context",
            "kind-a",
            "--cluster",
            "kind-b",
            "--user",
            "bob",
        ]))
        .await
        .expect("loads");
        assert_eq!(c.target.server, "https://10.0.0.2:6443");
        assert_eq!(c.target.context, "kind-a");
        let serialized = serde_json::to_string(&c.config.auth_info).expect("json");
        assert!(serialized.contains("bob-token"), "{serialized}");

        let e = load(&flags(&["--kubeconfig", path, "--context", "nope"]))
            .await
            .err()
            .expect("no such context");
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[tokio::test]
    async fn single_fields_are_overridden_by_their_flags() {
        let f = kubeconfig();
        let path = f.path().to_str().expect("utf-8 path");
        let c = load(&flags(&[
            "--kubeconfig",
            path,
            "--server",
            "https://192.0.2.7:443",
            "--token",
            "flag-token",
            "--request-timeout",
            "5s",
            "--as",
            "carol",
            "--as-group",
            "oncall",
            "--tls-server-name",
            "api.example",
        ]))
        .await
        .expect("loads");
        assert_eq!(c.target.server, "https://192.0.2.7:443");
        assert_eq!(c.target.context, "kind-b");
        let auth = serde_json::to_string(&c.config.auth_info).expect("json");
        assert!(
            auth.contains("flag-token") && !auth.contains("bob-token"),
            "{auth}"
        );
        assert_eq!(c.config.read_timeout, Some(Duration::from_secs(5)));
        assert_eq!(c.config.connect_timeout, Some(Duration::from_secs(5)));
        assert_eq!(c.config.auth_info.impersonate.as_deref(), Some("carol"));
        assert_eq!(
            c.config.auth_info.impersonate_groups,
            Some(vec!["oncall".to_owned()])
        );
        assert_eq!(c.config.tls_server_name.as_deref(), Some("api.example"));

        // A bare host:port is https, as kubectl takes it; 0 is no timeout.
        let c = load(&flags(&[
            "--kubeconfig",
            path,
            "--server",
            "api.example:6443",
            "--request-timeout",
            "0",
        ]))
        .await
        .expect("loads");
        assert_eq!(c.target.server, "https://api.example:6443");
        assert_eq!(c.config.read_timeout, None);

        // Without any kubeconfig, --server alone.
        let missing = f.path().with_extension("missing");
        let e = load(&flags(&["--kubeconfig", missing.to_str().expect("utf-8")]))
            .await
            .err()
            .expect("no file");
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[tokio::test]
    async fn the_certificate_authority_flag_is_read_and_excludes_insecure() {
        let f = kubeconfig();
        let path = f.path().to_str().expect("utf-8 path");
        let e = load(&flags(&[
            "--kubeconfig",
            path,
            "--certificate-authority",
            path,
            "--insecure-skip-tls-verify",
        ]))
        .await
        .err()
        .expect("refused");
        assert!(e.to_string().contains("exclude each other"), "{e}");
        let e = load(&flags(&[
            "--kubeconfig",
            path,
            "--certificate-authority",
            path,
        ]))
        .await
        .err()
        .expect("not PEM");
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let c = load(&flags(&[
            "--kubeconfig",
            path,
            "--insecure-skip-tls-verify=false",
        ]))
        .await
        .expect("loads");
        // The kubeconfig's own setting stays when the flag says false.
        assert!(c.config.accept_invalid_certs);
    }

    #[tokio::test]
    async fn an_unreachable_apiserver_is_named_with_its_context() {
        // A port nothing listens on: bind one, learn its number, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let f = kubeconfig();
        let path = f.path().to_str().expect("utf-8 path");
        let server = format!("https://127.0.0.1:{port}");
        let c = load(&flags(&[
            "--kubeconfig",
            path,
            "--context",
            "kind-a",
            "--server",
            &server,
        ]))
        .await
        .expect("loads");
        let client = c.client().expect("client");
        let nodes: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let e = nodes.list(&Default::default()).await.expect_err("refused");
        let msg = api_error(&c.target, e).to_string();
        assert!(
            msg.starts_with(&format!(
                "cannot reach the apiserver at {server} (context kind-a): "
            )),
            "{msg}"
        );
        assert!(msg.to_lowercase().contains("refused"), "{msg}");
    }

    #[tokio::test]
    async fn an_apiserver_that_does_not_answer_in_time_is_named_with_its_context() {
        // Accepts connections (the kernel's backlog) and never answers.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let server = format!("http://{}", silent.local_addr().expect("addr"));
        let f = kubeconfig();
        let path = f.path().to_str().expect("utf-8 path");
        let c = load(&flags(&[
            "--kubeconfig",
            path,
            "--server",
            &server,
            "--request-timeout",
            "300ms",
        ]))
        .await
        .expect("loads");
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(c.client().expect("client"));
        let e = namespaces
            .list(&Default::default())
            .await
            .expect_err("no answer");
        let msg = api_error(&c.target, e).to_string();
        assert!(
            msg.starts_with(&format!(
                "cannot reach the apiserver at {server} (context kind-b): "
            )),
            "{msg}"
        );
        assert!(msg.contains("timed out"), "{msg}");
        drop(silent);
    }

    #[test]
    fn a_401_names_the_server_and_context() {
        let target = Target {
            server: "https://127.0.0.1:6443".into(),
            context: "kind-x".into(),
        };
        let status = kube::core::Status::failure("Unauthorized", "Unauthorized").with_code(401);
        let msg = api_error(&target, kube::Error::Api(Box::new(status))).to_string();
        assert_eq!(
            msg,
            "the apiserver at https://127.0.0.1:6443 (context kind-x) did not accept the credentials: Unauthorized"
        );
        let status = kube::core::Status::failure("forbidden: no", "Forbidden").with_code(403);
        let msg = api_error(&target, kube::Error::Api(Box::new(status))).to_string();
        assert_eq!(msg, "the apiserver refused: forbidden: no");
    }

    #[test]
    fn request_timeouts_parse_as_kubectl_takes_them() {
        let p = |t: &str| RequestTimeout::parse(t).map(|r| r.0);
        assert_eq!(p("0"), Ok(None));
        assert_eq!(p("0s"), Ok(None));
        assert_eq!(p("5"), Ok(Some(Duration::from_secs(5))));
        assert_eq!(p("5s"), Ok(Some(Duration::from_secs(5))));
        assert_eq!(p("1m"), Ok(Some(Duration::from_secs(60))));
        assert_eq!(p("1m30s"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(p("1.5s"), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(p("250ms"), Ok(Some(Duration::from_millis(250))));
        assert_eq!(p("2h"), Ok(Some(Duration::from_secs(7200))));
        for bad in ["", "-1", "-5s", "5x", "s", "1.2.3s", "soon"] {
            assert!(p(bad).is_err(), "{bad:?} parsed");
        }
    }
}
