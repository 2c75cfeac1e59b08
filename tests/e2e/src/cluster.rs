//! A real cluster on this machine, for tests that need the operator to run as a Pod: a testenv
//! control plane (ServiceAccount admission on, optionally an audit log), one node joined to it
//! by `tools/node/up.sh` (containerd, runc, the CNI bridge, kubelet, kube-proxy, scheduler,
//! controller-manager, CoreDNS, an OCI registry on a free loopback port), and the operator's
//! image and chart pushed to that registry by `tools/dist.sh` (what `make dist` runs), so
//! [`Cluster::install`] is a real `helm install oci://…` whose image the node's containerd pulls.
//!
//! ```no_run
//! # async fn demo() -> Result<(), automanager_e2e::SetupError> {
//! use automanager_e2e::cluster::Cluster;
//! let cluster = Cluster::start().await?; // root; the image from `make image`
//! let out = cluster.install("am", "automanager-system", &["--set", "managerSim.enabled=true"])?;
//! assert!(out.success(), "{}", out.stderr);
//! cluster.wait_rollout("automanager-system", "am-automanager").await?;
//! let leader = cluster.lease_holder("automanager-system", "am-automanager").await?;
//! # let _ = leader; Ok(()) }
//! ```
//!
//! Dropping the [`Cluster`] stops the node and undoes its host changes (`tools/node/down.sh`),
//! then the control plane, also when a test panics.
//!
//! **One node per machine.** The node's bridge, address ranges (tools/node/net.env) and the
//! kubelet's, scheduler's and proxy's ports are fixed, and kube-proxy owns the host's iptables
//! `KUBE-*` chains, so two nodes cannot run side by side: [`Cluster::start`] takes an exclusive
//! lock ([`NODE_LOCK`]) and waits for it, so test binaries that each start one run one after
//! another. The registry's port is picked free, and every directory is the cluster's own. A
//! node left behind by a test process that was killed is stopped at the next start.
//!
//! Needs root (network namespaces, mounts, iptables, cgroups) and the image archive of `make
//! image` (`AUTOMANAGER_IMAGE`, default `dist/automanager-operator-<version>.oci.tar`); the node's
//! binaries are built by `tools/node/build.sh` on first use (cached).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::install::{Helm, run};
use crate::{CommandOutput, SetupError, TestEnv, repo_root};

/// The machine-wide lock a running node holds.
pub const NODE_LOCK: &str = "/run/lock/automanager-node.lock";
/// How long [`Cluster::start`] waits for another test's node to stop.
pub const LOCK_WAIT: Duration = Duration::from_secs(3600);
/// The node's name.
pub const NODE_NAME: &str = "am-node";
/// The audit log's policy when [`ClusterBuilder::audit`] is on: who wrote what in
/// AutoManager's API group, Leases and Events.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
    resources:
      - group: automanager.norsk.io
      - group: coordination.k8s.io
        resources: [leases]
      - group: events.k8s.io
        resources: [events]
  - level: None
";

fn err(e: impl std::fmt::Display) -> SetupError {
    SetupError(e.to_string())
}

/// What `tools/dist.sh` pushed.
#[derive(Debug, Clone)]
pub struct Dist {
    /// `127.0.0.1:PORT/automanager-operator`.
    pub image_repository: String,
    /// `sha256:…`, as `make image` printed it.
    pub image_digest: String,
    /// `oci://127.0.0.1:PORT/charts/automanager`.
    pub chart: String,
    pub chart_version: String,
}

/// Options of a [`Cluster`].
#[derive(Debug, Clone, Default)]
pub struct ClusterBuilder {
    image: Option<PathBuf>,
    audit: bool,
}

impl ClusterBuilder {
    /// The image archive to push (default `AUTOMANAGER_IMAGE`, else `make image`'s).
    pub fn image(mut self, archive: impl Into<PathBuf>) -> Self {
        self.image = Some(archive.into());
        self
    }

    /// Have the apiserver write an audit log of every write to AutoManager's kinds, Leases and
    /// Events ([`Cluster::audit_events`]).
    pub fn audit(mut self, on: bool) -> Self {
        self.audit = on;
        self
    }

    pub async fn start(self) -> Result<Cluster, SetupError> {
        Cluster::start_with(self).await
    }
}

/// A control plane, one node and a registry holding the operator's image and chart.
pub struct Cluster {
    /// The control plane (admin kubeconfig: [`TestEnv::kubeconfig_path`]).
    pub env: TestEnv,
    /// `127.0.0.1:PORT`: the node's registry, plain HTTP.
    pub registry: String,
    /// The image and chart in it.
    pub dist: Dist,
    helm: Helm,
    node_dir: PathBuf,
    node_bin: PathBuf,
    audit_log: Option<PathBuf>,
    node_started: bool,
    // Dropped after the node is stopped (Drop) and after `env`: the lock goes last.
    dir: tempfile::TempDir,
    _lock: File,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("server", &self.env.server_url())
            .field("registry", &self.registry)
            .field("node_dir", &self.node_dir)
            .finish_non_exhaustive()
    }
}

/// The parent of every cluster's directory (`cluster-<pid>-<random>`).
fn clusters_parent() -> PathBuf {
    std::env::temp_dir().join("automanager-cluster")
}

fn default_image() -> PathBuf {
    if let Some(p) = std::env::var_os("AUTOMANAGER_IMAGE") {
        return PathBuf::from(p);
    }
    repo_root().join(format!(
        "dist/automanager-operator-{}.oci.tar",
        env!("CARGO_PKG_VERSION")
    ))
}

/// Takes [`NODE_LOCK`], waiting up to [`LOCK_WAIT`] for another holder.
fn take_lock() -> Result<File, SetupError> {
    let path = Path::new(NODE_LOCK);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| SetupError(format!("opening {NODE_LOCK}: {e}")))?;
    let deadline = Instant::now() + LOCK_WAIT;
    let mut said = false;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => {
                if !said {
                    eprintln!(
                        "[cluster] another node runs on this machine; waiting for {NODE_LOCK}"
                    );
                    said = true;
                }
                if Instant::now() > deadline {
                    return Err(SetupError(format!(
                        "{NODE_LOCK} was held for {LOCK_WAIT:?}: another node runs on this machine"
                    )));
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(SetupError(format!("locking {NODE_LOCK}: {e}")));
            }
        }
    }
}

/// Stops the nodes of cluster directories whose test process is gone (killed before its
/// Drop ran); the lock is held, so none of them is running a test.
fn sweep_dead_clusters() {
    let Ok(entries) = std::fs::read_dir(clusters_parent()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("cluster-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || testenv::process::is_running(pid) {
            continue;
        }
        let node = entry.path().join("node");
        if node.exists() {
            eprintln!(
                "[cluster] stopping the node a dead test (pid {pid}) left in {}",
                node.display()
            );
            let _ = Command::new(repo_root().join("tools/node/down.sh"))
                .arg("--dir")
                .arg(&node)
                .stdout(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; the registry binds it right after).
fn free_port() -> Result<u16, SetupError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(err)?;
    Ok(l.local_addr().map_err(err)?.port())
}

/// `KEY=VALUE` lines.
fn key_values(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

impl Cluster {
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// A cluster with the default options.
    pub async fn start() -> Result<Cluster, SetupError> {
        ClusterBuilder::default().start().await
    }

    async fn start_with(opts: ClusterBuilder) -> Result<Cluster, SetupError> {
        // SAFETY-free check of root: the node needs it for namespaces, mounts and iptables.
        let uid = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|l| l.split_whitespace().next().map(str::to_owned))
            })
            .unwrap_or_default();
        if uid != "0" {
            return Err(SetupError(
                "a cluster needs root (network namespaces, mounts, iptables, cgroups)".into(),
            ));
        }
        let image = opts.image.clone().unwrap_or_else(default_image);
        if !image.is_file() {
            return Err(SetupError(format!(
                "no image archive at {}: run `make image` (or set AUTOMANAGER_IMAGE)",
                image.display()
            )));
        }
        let lock = take_lock()?;
        sweep_dead_clusters();
        std::fs::create_dir_all(clusters_parent()).map_err(err)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("cluster-{}-", std::process::id()))
            .tempdir_in(clusters_parent())
            .map_err(err)?;

        let mut builder =
            TestEnv::builder().apiserver_arg("--enable-admission-plugins=ServiceAccount");
        let audit_log = if opts.audit {
            let policy = dir.path().join("audit-policy.yaml");
            std::fs::write(&policy, AUDIT_POLICY).map_err(err)?;
            let log = dir.path().join("audit.log");
            builder = builder
                .apiserver_arg(format!("--audit-policy-file={}", policy.display()))
                .apiserver_arg(format!("--audit-log-path={}", log.display()))
                .apiserver_arg("--audit-log-format=json");
            Some(log)
        } else {
            None
        };
        let env = builder
            .data_dir(dir.path().join("control-plane"))
            .start()
            .await?;

        // tools/node/up.sh finds the control plane through a testenv state file.
        let state_dir = dir.path().join("testenv");
        std::fs::create_dir_all(&state_dir).map_err(err)?;
        testenv::State {
            pid: std::process::id(),
            server_url: env.server_url().to_owned(),
            kubeconfig: env.kubeconfig_path().to_path_buf(),
            bin_dir: env.bin_dir().to_path_buf(),
            data_dir: env.dir().to_path_buf(),
            etcd_pid: env.etcd_pid(),
            apiserver_pid: env.apiserver_pid(),
        }
        .write(&state_dir.join("state.json"))?;

        let node_bin = {
            let out = run(Command::new(repo_root().join("tools/node/build.sh")), None)?;
            if !out.success() {
                return Err(SetupError(format!(
                    "tools/node/build.sh failed:\n{}",
                    out.stderr
                )));
            }
            PathBuf::from(out.stdout.trim())
        };
        let node_dir = dir.path().join("node");
        let port = free_port()?;
        let registry = format!("127.0.0.1:{port}");
        let mut cluster = Cluster {
            helm: Helm::on(&env)?,
            env,
            registry: registry.clone(),
            dist: Dist {
                image_repository: String::new(),
                image_digest: String::new(),
                chart: String::new(),
                chart_version: String::new(),
            },
            node_dir: node_dir.clone(),
            node_bin: node_bin.clone(),
            audit_log,
            node_started: false,
            dir,
            _lock: lock,
        };

        let mut up = Command::new(repo_root().join("tools/node/up.sh"));
        up.arg("--testenv")
            .arg(&state_dir)
            .arg("--dir")
            .arg(&node_dir)
            .env("NODE_REGISTRY_PORT", port.to_string())
            .env("NODE_NAME", NODE_NAME);
        cluster.node_started = true;
        let out = run(up, None)?;
        if !out.success() {
            return Err(SetupError(format!(
                "tools/node/up.sh failed:\n{}",
                tail(&out.stderr, 60)
            )));
        }

        let mut dist = Command::new(repo_root().join("tools/dist.sh"));
        dist.arg(&registry)
            .arg("--image")
            .arg(&image)
            .env("CRANE", node_bin.join("crane"))
            .env("HELM", crate::install::tool("helm")?);
        let out = run(dist, None)?;
        if !out.success() {
            return Err(SetupError(format!("tools/dist.sh failed:\n{}", out.stderr)));
        }
        let kv = key_values(&out.stdout);
        let get = |k: &str| {
            kv.get(k)
                .cloned()
                .ok_or_else(|| SetupError(format!("tools/dist.sh printed no {k}: {}", out.stdout)))
        };
        cluster.dist = Dist {
            image_repository: get("image_repository")?,
            image_digest: get("image_digest")?,
            chart: get("chart")?,
            chart_version: get("chart_version")?,
        };
        Ok(cluster)
    }

    /// helm against this cluster (its own cache and config).
    pub fn helm(&self) -> &Helm {
        &self.helm
    }

    /// The `--set` flags that point the chart at the pushed image.
    pub fn image_values(&self) -> Vec<String> {
        vec![
            "--set".into(),
            format!("image.repository={}", self.dist.image_repository),
            "--set".into(),
            format!("image.digest={}", self.dist.image_digest),
        ]
    }

    /// `helm install RELEASE oci://…/automanager --version V -n NAMESPACE --create-namespace`
    /// with [`Cluster::image_values`] and then `values` (more `--set`/`-f` flags). Does not wait.
    pub fn install(
        &self,
        release: &str,
        namespace: &str,
        values: &[&str],
    ) -> Result<CommandOutput, SetupError> {
        let mut args: Vec<String> = vec![
            "install".into(),
            release.into(),
            self.dist.chart.clone(),
            "--version".into(),
            self.dist.chart_version.clone(),
            "--plain-http".into(),
            "--namespace".into(),
            namespace.into(),
            "--create-namespace".into(),
        ];
        args.extend(self.image_values());
        args.extend(values.iter().map(|v| (*v).to_owned()));
        self.helm.run(&args)
    }

    /// `helm upgrade RELEASE oci://… --reset-then-reuse-values` with `values`. Does not wait.
    pub fn upgrade(
        &self,
        release: &str,
        namespace: &str,
        values: &[&str],
    ) -> Result<CommandOutput, SetupError> {
        let mut args: Vec<String> = vec![
            "upgrade".into(),
            release.into(),
            self.dist.chart.clone(),
            "--version".into(),
            self.dist.chart_version.clone(),
            "--plain-http".into(),
            "--namespace".into(),
            namespace.into(),
            "--reset-then-reuse-values".into(),
        ];
        args.extend(values.iter().map(|v| (*v).to_owned()));
        self.helm.run(&args)
    }

    /// `kubectl ARGS...` as the cluster's admin.
    pub async fn kubectl(&self, args: &[&str]) -> Result<CommandOutput, SetupError> {
        Ok(self.env.run_kubectl(args).await?)
    }

    /// `kubectl ARGS...`, failing unless it succeeds; its stdout.
    pub async fn kubectl_ok(&self, args: &[&str]) -> Result<String, SetupError> {
        let out = self.kubectl(args).await?;
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(SetupError(format!("kubectl {args:?}: {}", out.stderr)))
        }
    }

    /// `kubectl get ARGS... -o json`.
    pub async fn get_json(&self, args: &[&str]) -> Result<serde_json::Value, SetupError> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let text = self.kubectl_ok(&all).await?;
        serde_json::from_str(&text).map_err(err)
    }

    /// Polls `probe` until it returns `Some`; on timeout the error carries the last error, the
    /// Pods of every namespace and the node's recent kubelet log.
    pub async fn wait_for<T, F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        probe: F,
    ) -> Result<T, SetupError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>, SetupError>>,
    {
        match crate::poll_until(timeout, Duration::from_millis(250), probe).await {
            Ok(v) => Ok(v),
            Err(last_err) => Err(SetupError(format!(
                "timed out after {timeout:?} waiting for {what} ({last_err})\n{}",
                self.diagnostics().await
            ))),
        }
    }

    /// What a failed wait prints: every Pod, recent Events and the kubelet's last lines.
    pub async fn diagnostics(&self) -> String {
        let pods = self
            .kubectl(&["get", "pods", "-A", "-o", "wide"])
            .await
            .map(|o| o.stdout + &o.stderr)
            .unwrap_or_default();
        let events = self
            .kubectl(&["get", "events", "-A", "--sort-by=.lastTimestamp"])
            .await
            .map(|o| tail(&o.stdout, 30))
            .unwrap_or_default();
        format!(
            "pods:\n{pods}\nevents:\n{events}\nkubelet log tail:\n{}",
            tail(&self.node_log("kubelet"), 30)
        )
    }

    /// The log of one of the node's daemons (`kubelet`, `containerd`, `kube-proxy`,
    /// `kube-scheduler`, `kube-controller-manager`, `registry`, `forward`).
    pub fn node_log(&self, daemon: &str) -> String {
        std::fs::read_to_string(self.node_dir.join("logs").join(format!("{daemon}.log")))
            .unwrap_or_default()
    }

    /// Waits until Deployment `name` has rolled out: its generation observed, every replica
    /// updated, ready and available, and no Pod of an older ReplicaSet left.
    pub async fn wait_rollout(&self, namespace: &str, name: &str) -> Result<(), SetupError> {
        self.wait_for(
            &format!("deployment {namespace}/{name} to roll out"),
            Duration::from_secs(300),
            || async {
                let d = self
                    .get_json(&["deployment", name, "-n", namespace])
                    .await?;
                let want = d["spec"]["replicas"].as_i64().unwrap_or(1);
                let s = &d["status"];
                let done = s["observedGeneration"] == d["metadata"]["generation"]
                    && s["updatedReplicas"].as_i64() == Some(want)
                    && s["readyReplicas"].as_i64() == Some(want)
                    && s["availableReplicas"].as_i64() == Some(want)
                    && s["replicas"].as_i64() == Some(want);
                Ok(done.then_some(()))
            },
        )
        .await
    }

    /// The Pods matching `selector` (every Pod when empty) in `namespace`.
    pub async fn pods(
        &self,
        namespace: &str,
        selector: &str,
    ) -> Result<Vec<serde_json::Value>, SetupError> {
        let mut args = vec!["pods", "-n", namespace];
        if !selector.is_empty() {
            args.extend(["-l", selector]);
        }
        let list = self.get_json(&args).await?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// The holder of Lease `namespace/name` (a Pod name for the chart's operator).
    pub async fn lease_holder(&self, namespace: &str, name: &str) -> Result<String, SetupError> {
        let lease = self.get_json(&["lease", name, "-n", namespace]).await?;
        lease["spec"]["holderIdentity"]
            .as_str()
            .filter(|h| !h.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| SetupError(format!("lease {namespace}/{name} has no holder")))
    }

    /// SIGKILLs the process of `container` in Pod `namespace/pod` from the host, as a crash
    /// would: no SIGTERM, nothing released. The kubelet restarts it (the Pod's restartCount
    /// goes up by one).
    pub async fn kill_container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<(), SetupError> {
        let p = self.get_json(&["pod", pod, "-n", namespace]).await?;
        let id = p["status"]["containerStatuses"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == container))
            .and_then(|c| c["containerID"].as_str())
            .and_then(|id| id.strip_prefix("containerd://"))
            .ok_or_else(|| SetupError(format!("no running {container} in {namespace}/{pod}")))?
            .to_owned();
        let mut ctr = Command::new(self.node_bin.join("ctr"));
        ctr.arg("--address")
            .arg(self.node_dir.join("containerd/containerd.sock"))
            .args([
                "--namespace",
                "k8s.io",
                "tasks",
                "kill",
                "--signal",
                "SIGKILL",
                &id,
            ]);
        let out = run(ctr, None)?;
        if out.success() {
            Ok(())
        } else {
            Err(SetupError(format!(
                "ctr tasks kill {id} ({namespace}/{pod}): {}",
                out.stderr
            )))
        }
    }

    /// Kills Pod `namespace/pod` as a lost machine would: every container's process SIGKILLed
    /// from the host (nothing released, no shutdown), then the Pod object force-deleted so the
    /// kubelet does not start it again under the same name; its controller makes a new one.
    pub async fn kill_pod(&self, namespace: &str, pod: &str) -> Result<(), SetupError> {
        let p = self.get_json(&["pod", pod, "-n", namespace]).await?;
        let containers: Vec<String> = p["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| !c["state"]["running"].is_null())
            .filter_map(|c| c["name"].as_str().map(str::to_owned))
            .collect();
        for c in &containers {
            self.kill_container(namespace, pod, c).await?;
        }
        self.kubectl_ok(&[
            "delete",
            "pod",
            pod,
            "-n",
            namespace,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ])
        .await?;
        Ok(())
    }

    /// `kubectl port-forward -n NAMESPACE TARGET LOCAL:REMOTE` through the apiserver and the
    /// kubelet, on a free local port; stopped when the returned handle is dropped.
    pub async fn port_forward(
        &self,
        namespace: &str,
        target: &str,
        remote_port: u16,
    ) -> Result<PortForward, SetupError> {
        let mut last = String::new();
        for _ in 0..5 {
            let local = free_port()?;
            let log = self.dir.path().join(format!("port-forward-{local}.log"));
            let mut cmd = self.env.kubectl();
            cmd.args([
                "port-forward",
                "-n",
                namespace,
                target,
                &format!("{local}:{remote_port}"),
                "--address",
                "127.0.0.1",
            ])
            .stdout(File::create(&log).map_err(err)?)
            .stderr(File::create(log.with_extension("err")).map_err(err)?);
            let child = cmd.spawn().map_err(err)?;
            let mut pf = PortForward {
                local_port: local,
                child: Some(child),
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                let ready = std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .contains("Forwarding from");
                if ready {
                    return Ok(pf);
                }
                if let Some(Ok(Some(_))) = pf.child.as_mut().map(Child::try_wait) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            last = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
        }
        Err(SetupError(format!(
            "kubectl port-forward -n {namespace} {target} {remote_port}: {last}"
        )))
    }

    /// The audit log's events (JSON), when [`ClusterBuilder::audit`] was on.
    pub fn audit_events(&self) -> Result<Vec<serde_json::Value>, SetupError> {
        let path = self
            .audit_log
            .as_ref()
            .ok_or_else(|| SetupError("the cluster was started without an audit log".into()))?;
        let text = std::fs::read_to_string(path).map_err(err)?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(err))
            .collect()
    }

    /// The node's binaries (kubelet, containerd, ctr, crane, …).
    pub fn node_bin(&self) -> &Path {
        &self.node_bin
    }

    /// The node's state directory (its logs are in `logs/`).
    pub fn node_dir(&self) -> &Path {
        &self.node_dir
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.node_started {
            return;
        }
        let keep = std::env::var_os("AUTOMANAGER_CLUSTER_KEEP_LOGS").map(PathBuf::from);
        if let Some(to) = &keep {
            let _ = Command::new("cp")
                .arg("-r")
                .arg(self.node_dir.join("logs"))
                .arg(to)
                .status();
        }
        let status = Command::new(repo_root().join("tools/node/down.sh"))
            .arg("--dir")
            .arg(&self.node_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !status.as_ref().is_ok_and(|s| s.success()) {
            eprintln!(
                "[cluster] tools/node/down.sh --dir {} failed: {status:?}",
                self.node_dir.display()
            );
        }
    }
}

/// A running `kubectl port-forward`; killed on drop.
#[derive(Debug)]
pub struct PortForward {
    /// The port on 127.0.0.1 that reaches the Pod.
    pub local_port: u16,
    child: Option<Child>,
}

impl PortForward {
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.local_port)
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A plain HTTP GET of `url` (`http://127.0.0.1:PORT/PATH`), for a port-forward: the status
/// code and the body.
pub async fn http_get(url: &str) -> Result<(u16, String), SetupError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| SetupError(format!("{url}: not http://")))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(err)?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .map_err(err)?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map_err(err)?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| SetupError(format!("{url}: no HTTP status in {text:?}")))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok::<_, SetupError>((status, body))
    };
    tokio::time::timeout(Duration::from_secs(20), exchange)
        .await
        .map_err(|_| SetupError(format!("{url}: no answer within 20s")))?
}
