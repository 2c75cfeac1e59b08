//! The admin kubeconfig: certificates embedded, so the file works from anywhere.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// Renders a kubeconfig with one cluster (`testenv`), one user (`admin`, the client cert with
/// `O=system:masters`) and one current context using namespace `default`.
pub(crate) fn render(
    server_url: &str,
    ca_pem: &str,
    client_cert_pem: &str,
    client_key_pem: &str,
) -> String {
    let b64 = |s: &str| STANDARD.encode(s.as_bytes());
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: {server_url}
    certificate-authority-data: {ca}
users:
- name: admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: testenv
  context:
    cluster: testenv
    user: admin
    namespace: default
current-context: testenv
preferences: {{}}
",
        ca = b64(ca_pem),
        cert = b64(client_cert_pem),
        key = b64(client_key_pem),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_reads_back_the_server_context_and_credentials() {
        let text = render("https://127.0.0.1:4321", "CA", "CERT", "KEY");
        let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("testenv"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:4321"));
        assert_eq!(
            cluster.certificate_authority_data.as_deref(),
            Some(STANDARD.encode("CA").as_str())
        );
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(
            user.client_certificate_data.as_deref(),
            Some(STANDARD.encode("CERT").as_str())
        );
        let ctx = kc.contexts[0].context.as_ref().unwrap();
        assert_eq!(ctx.namespace.as_deref(), Some("default"));
        assert_eq!(ctx.user.as_deref(), Some("admin"));
    }
}
