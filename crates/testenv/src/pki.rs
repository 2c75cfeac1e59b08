//! The certificates and keys one control plane needs, generated fresh for every start.
//!
//! All keys are ECDSA P-256: rcgen cannot generate RSA keys with its default (ring) backend,
//! and kube-apiserver accepts EC keys everywhere, including the service-account signing key
//! (tokens are then signed ES256). The service-account *public* key is written separately as
//! a `PUBLIC KEY` (SPKI) block, because `--service-account-key-file` only recognises EC
//! private keys in SEC1 form and would silently skip a PKCS#8 one.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Names the serving certificate is valid for: loopback, plus the in-cluster names of the
/// `kubernetes` Service (10.0.0.1 is its cluster IP in `--service-cluster-ip-range=10.0.0.0/24`).
pub(crate) const SERVING_NAMES: [&str; 7] = [
    "127.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "10.0.0.1",
];

/// PEM texts for one control plane.
pub(crate) struct Pki {
    pub(crate) ca_cert: String,
    /// The CA's private key, written so a local node (tools/node) can sign its own
    /// certificates (kubelet, kube-proxy, scheduler, controller-manager) with the same CA.
    pub(crate) ca_key: String,
    pub(crate) serving_cert: String,
    pub(crate) serving_key: String,
    pub(crate) admin_cert: String,
    pub(crate) admin_key: String,
    /// The client certificate kube-apiserver presents to kubelets (logs, exec, port-forward).
    pub(crate) kubelet_client_cert: String,
    pub(crate) kubelet_client_key: String,
    /// PKCS#8 private key for `--service-account-signing-key-file`.
    pub(crate) service_account_key: String,
    /// SPKI public key for `--service-account-key-file`.
    pub(crate) service_account_pub: String,
}

impl Pki {
    pub(crate) fn generate() -> Result<Self, rcgen::Error> {
        let mut ca_params = CertificateParams::default();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "automanager-testenv-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate()?;
        let ca_key_pem = ca_key.serialize_pem();
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;

        let mut serving_params = CertificateParams::new(SERVING_NAMES.map(String::from).to_vec())?;
        serving_params.distinguished_name = rcgen::DistinguishedName::new();
        serving_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        serving_params.use_authority_key_identifier_extension = true;
        let serving_key = KeyPair::generate()?;
        let serving_cert = serving_params.signed_by(&serving_key, &ca)?;

        // O=system:masters is bound to cluster-admin by the default RBAC policy.
        let mut admin_params = CertificateParams::default();
        admin_params.distinguished_name = rcgen::DistinguishedName::new();
        admin_params
            .distinguished_name
            .push(DnType::CommonName, "admin");
        admin_params
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        admin_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        admin_params.use_authority_key_identifier_extension = true;
        let admin_key = KeyPair::generate()?;
        let admin_cert = admin_params.signed_by(&admin_key, &ca)?;

        // What kubeadm gives the apiserver for its calls to kubelets: system:masters, so a
        // kubelet's webhook authorizer allows nodes/proxy, nodes/log and the like.
        let mut kubelet_client_params = CertificateParams::default();
        kubelet_client_params.distinguished_name = rcgen::DistinguishedName::new();
        kubelet_client_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver-kubelet-client");
        kubelet_client_params
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        kubelet_client_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        kubelet_client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        kubelet_client_params.use_authority_key_identifier_extension = true;
        let kubelet_client_key = KeyPair::generate()?;
        let kubelet_client_cert = kubelet_client_params.signed_by(&kubelet_client_key, &ca)?;

        let sa_key = KeyPair::generate()?;

        Ok(Pki {
            ca_cert: ca.pem(),
            ca_key: ca_key_pem,
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            admin_cert: admin_cert.pem(),
            admin_key: admin_key.serialize_pem(),
            kubelet_client_cert: kubelet_client_cert.pem(),
            kubelet_client_key: kubelet_client_key.serialize_pem(),
            service_account_key: sa_key.serialize_pem(),
            service_account_pub: sa_key.public_key_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_block(pem: &str, label: &str) -> bool {
        pem.starts_with(&format!("-----BEGIN {label}-----"))
            && pem.matches("-----BEGIN").count() == 1
    }

    #[test]
    fn every_artifact_is_one_pem_block_of_the_right_kind() {
        let pki = Pki::generate().unwrap();
        assert!(one_block(&pki.ca_cert, "CERTIFICATE"));
        assert!(one_block(&pki.serving_cert, "CERTIFICATE"));
        assert!(one_block(&pki.admin_cert, "CERTIFICATE"));
        assert!(one_block(&pki.serving_key, "PRIVATE KEY"));
        assert!(one_block(&pki.admin_key, "PRIVATE KEY"));
        assert!(one_block(&pki.ca_key, "PRIVATE KEY"));
        assert!(one_block(&pki.kubelet_client_cert, "CERTIFICATE"));
        assert!(one_block(&pki.kubelet_client_key, "PRIVATE KEY"));
        assert!(one_block(&pki.service_account_key, "PRIVATE KEY"));
        assert!(one_block(&pki.service_account_pub, "PUBLIC KEY"));
    }

    #[test]
    fn each_start_gets_fresh_keys() {
        let a = Pki::generate().unwrap();
        let b = Pki::generate().unwrap();
        assert_ne!(a.ca_cert, b.ca_cert);
        assert_ne!(a.service_account_key, b.service_account_key);
    }

    #[test]
    fn serving_names_cover_loopback_and_the_in_cluster_service_names() {
        for name in ["127.0.0.1", "localhost", "kubernetes.default.svc"] {
            assert!(SERVING_NAMES.contains(&name), "{name}");
        }
    }
}
