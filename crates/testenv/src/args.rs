//! Command lines for etcd and kube-apiserver (pure: paths and ports in, arguments out).

use std::path::PathBuf;

use crate::Error;

/// The service-account issuer every token carries (what a real cluster would use).
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Where one control plane keeps its files, all under its own directory.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) root: PathBuf,
}

impl Layout {
    pub(crate) fn etcd_data(&self) -> PathBuf {
        self.root.join("etcd")
    }
    pub(crate) fn pki(&self) -> PathBuf {
        self.root.join("pki")
    }
    pub(crate) fn ca_cert(&self) -> PathBuf {
        self.pki().join("ca.crt")
    }
    pub(crate) fn ca_key(&self) -> PathBuf {
        self.pki().join("ca.key")
    }
    pub(crate) fn kubelet_client_cert(&self) -> PathBuf {
        self.pki().join("apiserver-kubelet-client.crt")
    }
    pub(crate) fn kubelet_client_key(&self) -> PathBuf {
        self.pki().join("apiserver-kubelet-client.key")
    }
    pub(crate) fn serving_cert(&self) -> PathBuf {
        self.pki().join("apiserver.crt")
    }
    pub(crate) fn serving_key(&self) -> PathBuf {
        self.pki().join("apiserver.key")
    }
    pub(crate) fn sa_key(&self) -> PathBuf {
        self.pki().join("sa.key")
    }
    pub(crate) fn sa_pub(&self) -> PathBuf {
        self.pki().join("sa.pub")
    }
    pub(crate) fn apiserver_cert_dir(&self) -> PathBuf {
        self.root.join("apiserver-certs")
    }
    pub(crate) fn kubeconfig(&self) -> PathBuf {
        self.root.join("kubeconfig")
    }
    pub(crate) fn kubectl_cache(&self) -> PathBuf {
        self.root.join("kubectl-cache")
    }
    pub(crate) fn etcd_log(&self) -> PathBuf {
        self.root.join("etcd.log")
    }
    pub(crate) fn apiserver_log(&self) -> PathBuf {
        self.root.join("kube-apiserver.log")
    }
}

/// Ports picked for one start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ports {
    pub(crate) etcd_client: u16,
    pub(crate) etcd_peer: u16,
    pub(crate) apiserver: u16,
}

pub(crate) fn etcd_url(ports: Ports) -> String {
    format!("http://127.0.0.1:{}", ports.etcd_client)
}

pub(crate) fn server_url(ports: Ports) -> String {
    format!("https://127.0.0.1:{}", ports.apiserver)
}

/// etcd: a single member listening on loopback only; fsync off because the data is thrown away.
pub(crate) fn etcd_args(layout: &Layout, ports: Ports) -> Vec<String> {
    let client = etcd_url(ports);
    let peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
    vec![
        "--name=testenv".into(),
        format!("--data-dir={}", layout.etcd_data().display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=testenv={peer}"),
        "--initial-cluster-state=new".into(),
        "--unsafe-no-fsync".into(),
    ]
}

/// Flags testenv sets itself and will not let a caller override: they decide what is bound,
/// where, and with which credentials.
const MANAGED_FLAGS: [&str; 14] = [
    "--bind-address",
    "--advertise-address",
    "--secure-port",
    "--etcd-servers",
    "--tls-cert-file",
    "--tls-private-key-file",
    "--client-ca-file",
    "--service-account-key-file",
    "--service-account-signing-key-file",
    "--cert-dir",
    "--insecure-port",
    "--insecure-bind-address",
    "--kubelet-client-certificate",
    "--kubelet-client-key",
];

/// Checks one extra apiserver flag: `--name` or `--name=value`, not one testenv manages.
pub(crate) fn validate_extra_flag(flag: &str) -> Result<(), Error> {
    let refuse = |reason| {
        Err(Error::InvalidFlag {
            flag: flag.to_owned(),
            reason,
        })
    };
    let Some(body) = flag.strip_prefix("--") else {
        return refuse("flags must be written as --name or --name=value");
    };
    let name = body.split('=').next().unwrap_or_default();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return refuse("flags must be written as --name or --name=value");
    }
    if MANAGED_FLAGS
        .iter()
        .any(|m| m.strip_prefix("--") == Some(name))
    {
        return refuse("testenv sets this flag itself (ports, loopback binding and certificates)");
    }
    Ok(())
}

/// kube-apiserver: loopback only, TLS with the generated certs, RBAC, no endpoint reconciler
/// (it would loop on errors about the loopback address). The ServiceAccount admission plugin
/// is off because no controller-manager creates the `default` ServiceAccount, so Pods could
/// not be created otherwise (controller-runtime's envtest does the same); a caller that runs a
/// controller-manager (tools/node) turns it back on with
/// `--enable-admission-plugins=ServiceAccount`, and then testenv's own disabling is left out
/// (the apiserver refuses a plugin named in both lists). `extra` comes last so a caller can
/// override any other default.
///
/// For a kubelet joined to this control plane (tools/node): the apiserver presents its own
/// client certificate (O=system:masters) to kubelets, and reaches them by their InternalIP
/// first, since a node's hostname need not resolve here.
pub(crate) fn apiserver_args(layout: &Layout, ports: Ports, extra: &[String]) -> Vec<String> {
    let mut args = vec![
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={}", ports.apiserver),
        format!("--etcd-servers={}", etcd_url(ports)),
        format!("--cert-dir={}", layout.apiserver_cert_dir().display()),
        format!("--tls-cert-file={}", layout.serving_cert().display()),
        format!("--tls-private-key-file={}", layout.serving_key().display()),
        format!("--client-ca-file={}", layout.ca_cert().display()),
        format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
        format!("--service-account-key-file={}", layout.sa_pub().display()),
        format!(
            "--service-account-signing-key-file={}",
            layout.sa_key().display()
        ),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--endpoint-reconciler-type=none".into(),
        "--authorization-mode=RBAC".into(),
        format!(
            "--kubelet-client-certificate={}",
            layout.kubelet_client_cert().display()
        ),
        format!(
            "--kubelet-client-key={}",
            layout.kubelet_client_key().display()
        ),
        "--kubelet-preferred-address-types=InternalIP,Hostname,InternalDNS,ExternalDNS,ExternalIP"
            .into(),
    ];
    if !enables_admission_plugin(extra, "ServiceAccount") {
        args.push("--disable-admission-plugins=ServiceAccount".into());
    }
    args.push("--allow-privileged=true".into());
    args.extend(extra.iter().cloned());
    args
}

/// Whether one of `extra` is `--enable-admission-plugins=...` naming `plugin`.
fn enables_admission_plugin(extra: &[String], plugin: &str) -> bool {
    extra.iter().any(|flag| {
        flag.strip_prefix("--enable-admission-plugins=")
            .is_some_and(|list| list.split(',').any(|p| p.trim() == plugin))
    })
}

/// Whether `path` is inside `root` (used to assert nothing is written elsewhere).
#[cfg(test)]
fn under(path: &str, root: &std::path::Path) -> bool {
    std::path::Path::new(path).starts_with(root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout() -> Layout {
        Layout {
            root: PathBuf::from("/tmp/te"),
        }
    }
    const PORTS: Ports = Ports {
        etcd_client: 1001,
        etcd_peer: 1002,
        apiserver: 1003,
    };

    #[test]
    fn etcd_listens_only_on_loopback_with_the_picked_ports() {
        let args = etcd_args(&layout(), PORTS);
        for a in args
            .iter()
            .filter(|a| a.contains("urls") || a.contains("cluster="))
        {
            assert!(a.contains("http://127.0.0.1:100"), "{a}");
        }
        assert!(args.contains(&"--listen-client-urls=http://127.0.0.1:1001".to_owned()));
        assert!(args.contains(&"--listen-peer-urls=http://127.0.0.1:1002".to_owned()));
        assert!(args.contains(&"--unsafe-no-fsync".to_owned()));
    }

    #[test]
    fn apiserver_binds_loopback_and_talks_to_our_etcd() {
        let args = apiserver_args(&layout(), PORTS, &[]);
        for want in [
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--secure-port=1003",
            "--etcd-servers=http://127.0.0.1:1001",
            "--endpoint-reconciler-type=none",
            "--authorization-mode=RBAC",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        ] {
            assert!(args.contains(&want.to_owned()), "missing {want}");
        }
    }

    #[test]
    fn every_file_the_apiserver_reads_or_writes_is_under_the_env_dir() {
        let root = layout().root;
        for a in apiserver_args(&layout(), PORTS, &[]) {
            if let Some((_, value)) = a.split_once('=')
                && value.starts_with('/')
            {
                assert!(under(value, &root), "{a}");
            }
        }
    }

    #[test]
    fn the_apiserver_reaches_kubelets_with_its_own_client_cert_by_internal_ip() {
        let args = apiserver_args(&layout(), PORTS, &[]);
        for want in [
            "--kubelet-client-certificate=/tmp/te/pki/apiserver-kubelet-client.crt",
            "--kubelet-client-key=/tmp/te/pki/apiserver-kubelet-client.key",
        ] {
            assert!(args.contains(&want.to_owned()), "missing {want}");
        }
        let types = args
            .iter()
            .find_map(|a| a.strip_prefix("--kubelet-preferred-address-types="))
            .unwrap();
        assert!(types.starts_with("InternalIP,"), "{types}");
    }

    #[test]
    fn service_account_admission_is_off_unless_a_caller_enables_it() {
        let disabled = "--disable-admission-plugins=ServiceAccount".to_owned();
        assert!(apiserver_args(&layout(), PORTS, &[]).contains(&disabled));
        let other = ["--enable-admission-plugins=NodeRestriction".to_owned()];
        assert!(apiserver_args(&layout(), PORTS, &other).contains(&disabled));
        let on = ["--enable-admission-plugins=NodeRestriction,ServiceAccount".to_owned()];
        let args = apiserver_args(&layout(), PORTS, &on);
        assert!(
            !args
                .iter()
                .any(|a| a.starts_with("--disable-admission-plugins"))
        );
        assert_eq!(args.last(), Some(&on[0]));
    }

    #[test]
    fn extra_flags_come_last_so_they_override_defaults() {
        let args = apiserver_args(&layout(), PORTS, &["--v=4".to_owned()]);
        assert_eq!(args.last().map(String::as_str), Some("--v=4"));
    }

    #[test]
    fn extra_flags_must_be_long_flags() {
        assert!(validate_extra_flag("--v=2").is_ok());
        assert!(validate_extra_flag("--feature-gates=Foo=true").is_ok());
        assert!(validate_extra_flag("--profiling").is_ok());
        for bad in ["v=2", "-v=2", "--", "--=x", "", "--bad name", "--a;b"] {
            assert!(validate_extra_flag(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn extra_flags_cannot_change_binding_ports_or_certificates() {
        for bad in [
            "--bind-address=0.0.0.0",
            "--secure-port=6443",
            "--etcd-servers=http://10.1.1.1:2379",
            "--tls-cert-file=/x",
            "--client-ca-file",
            "--kubelet-client-key=/x",
        ] {
            let err = validate_extra_flag(bad).unwrap_err().to_string();
            assert!(err.contains("testenv sets this flag itself"), "{err}");
        }
    }

    proptest! {
        #[test]
        fn validating_any_flag_never_panics(flag in ".{0,60}") {
            let _ = validate_extra_flag(&flag);
        }

        #[test]
        fn accepted_flags_never_name_a_managed_flag(flag in "--[a-z-]{1,30}(=[a-z0-9.:/]{0,20})?") {
            if validate_extra_flag(&flag).is_ok() {
                let name = flag.split('=').next().unwrap_or_default();
                prop_assert!(!MANAGED_FLAGS.contains(&name));
            }
        }
    }
}
