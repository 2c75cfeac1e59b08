//! `testenv`: a real Kubernetes control plane on loopback for tests and demos — this
//! project's equivalent of controller-runtime's envtest.
//!
//! [`TestEnv::start`] runs the Go-built `etcd` and `kube-apiserver` (release [`K8S_RELEASE`],
//! built by `make control-plane` into a cache outside the checkout) in a fresh directory,
//! waits until the apiserver is ready, and hands back a [`kube::Client`], an admin kubeconfig
//! and a `kubectl` of the same release. Dropping the [`TestEnv`] stops both processes and
//! removes the directory, also when a test panics.
//!
//! ```no_run
//! # async fn demo() -> Result<(), testenv::Error> {
//! let env = testenv::TestEnv::start().await?;
//! let out = env.apply_file("crds/").await?;
//! assert!(out.success(), "{}", out.stderr);
//! env.wait_for_crds_established(["bundles.automanager.norsk.io"], std::time::Duration::from_secs(30))
//!     .await?;
//! let client = env.client();
//! # let _ = client; Ok(()) }
//! ```
//!
//! Choices made where the issue left room:
//! - **Nothing leaks.** Children get `PR_SET_PDEATHSIG=SIGKILL` (see [`process`]), so they die
//!   with the test process even on SIGKILL; directories of dead owners (`testenv-<pid>-*`) are
//!   swept at the next start. Everything binds `127.0.0.1` only; flags that would change
//!   binding, ports or certificates are refused ([`Error::InvalidFlag`]).
//! - **Ports**: picked by binding `127.0.0.1:0`; if another process grabs one in between
//!   (the log says "address already in use"), the whole start is retried with new ports.
//! - **Keys** are ECDSA P-256, including the service-account signing key (tokens are ES256);
//!   `--service-account-key-file` gets the public key as SPKI, which the apiserver reads for EC keys.
//! - **Ready** means `/readyz` answers `ok` *and* the `default` namespace exists, so a test can
//!   create namespaced objects at once.
//! - There is no controller-manager or scheduler (as in envtest): Pods are never scheduled,
//!   ServiceAccounts get no tokens automatically, garbage collection does not run. The
//!   ServiceAccount admission plugin is disabled so Pods can still be created.
//! - Linux only (`/proc`, `prctl`).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod args;
mod bins;
mod crds;
mod error;
mod kubeconfig;
mod kubectl;
mod logs;
mod pki;
pub mod process;
mod state;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use args::SERVICE_ACCOUNT_ISSUER;
pub use bins::{BIN_DIR_ENV, BINARIES, K8S_RELEASE, cache_bin_dir, check_bin_dir, default_bin_dir};
pub use crds::crd_is_established;
pub use error::Error;
pub use kubectl::{CommandOutput, KUBECTL_TIMEOUT};
pub use state::{State, export_lines, shell_quote};

use args::{Layout, Ports};
use process::{Signal, Supervised};

/// How long [`TestEnvBuilder::start`] waits for readiness unless told otherwise. Generous:
/// a cold start takes ~2 s, but CI machines are shared.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long each process gets between SIGTERM and SIGKILL unless told otherwise.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Starts attempted when a picked port turns out to be taken.
const START_ATTEMPTS: u32 = 3;
/// Log lines quoted in start-up errors.
const LOG_TAIL_LINES: usize = 25;

/// Environment variable that lets control-plane tests skip (instead of fail) when the
/// binaries are missing.
pub const SKIP_ENV: &str = "AUTOMANAGER_SKIP_CONTROL_PLANE";

/// For tests that need the binaries: `Ok(true)` when they are present, `Ok(false)` when they
/// are missing and `AUTOMANAGER_SKIP_CONTROL_PLANE=1` asks to skip, and the "run `make
/// control-plane`" error otherwise — a missing control plane must fail a test run, not pass it.
pub fn control_plane_available() -> Result<bool, Error> {
    availability(
        default_bin_dir().and_then(|dir| check_bin_dir(&dir)),
        std::env::var(SKIP_ENV).ok().as_deref(),
    )
}

fn availability(check: Result<(), Error>, skip: Option<&str>) -> Result<bool, Error> {
    match check {
        Ok(()) => Ok(true),
        Err(_) if skip == Some("1") => Ok(false),
        Err(e) => Err(e),
    }
}

/// Options for a [`TestEnv`]; [`TestEnv::builder`] gives the defaults.
#[derive(Debug, Clone)]
pub struct TestEnvBuilder {
    bin_dir: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    apiserver_args: Vec<String>,
    startup_timeout: Duration,
    shutdown_grace: Duration,
}

impl Default for TestEnvBuilder {
    fn default() -> Self {
        TestEnvBuilder {
            bin_dir: None,
            data_dir: None,
            apiserver_args: Vec::new(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }
}

impl TestEnvBuilder {
    /// Use the binaries in `dir` instead of `$AUTOMANAGER_K8S_BIN` or the cache.
    pub fn bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = Some(dir.into());
        self
    }

    /// Create the control plane's own directory inside `parent` (default: the system temp dir's
    /// `automanager-testenv/`). The directory is named `testenv-<pid>-<random>` and removed on drop.
    pub fn data_dir(mut self, parent: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(parent.into());
        self
    }

    /// Add one kube-apiserver flag (`--name=value`), after the defaults so it can override them.
    pub fn apiserver_arg(mut self, flag: impl Into<String>) -> Self {
        self.apiserver_args.push(flag.into());
        self
    }

    /// Add several kube-apiserver flags.
    pub fn apiserver_args<I, S>(mut self, flags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.apiserver_args
            .extend(flags.into_iter().map(Into::into));
        self
    }

    /// How long to wait for `/readyz` (default [`DEFAULT_STARTUP_TIMEOUT`]).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// How long each process gets between SIGTERM and SIGKILL (default [`DEFAULT_SHUTDOWN_GRACE`]).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Starts etcd and kube-apiserver and waits until the apiserver is ready.
    pub async fn start(self) -> Result<TestEnv, Error> {
        for flag in &self.apiserver_args {
            args::validate_extra_flag(flag)?;
        }
        let bin_dir = match &self.bin_dir {
            Some(dir) => dir.clone(),
            None => default_bin_dir()?,
        };
        check_bin_dir(&bin_dir)?;
        let parent = match &self.data_dir {
            Some(dir) => dir.clone(),
            None => std::env::temp_dir().join("automanager-testenv"),
        };
        std::fs::create_dir_all(&parent)
            .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
        sweep_stale_dirs(&parent);

        let mut attempt = 1;
        loop {
            match self.start_once(&bin_dir, &parent).await {
                Err(e) if e.is_port_clash() && attempt < START_ATTEMPTS => {
                    tracing::warn!(attempt, error = %e, "a picked port was taken; retrying with new ports");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(&self, bin_dir: &Path, parent: &Path) -> Result<TestEnv, Error> {
        let started = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix(&format!("testenv-{}-", std::process::id()))
            .tempdir_in(parent)
            .map_err(|e| Error::io(format!("creating a directory in {}", parent.display()), e))?;
        let layout = Layout {
            root: dir.path().to_path_buf(),
        };
        // From here on, dropping `processes` stops whatever was started and removes `dir`.
        let mut processes = Processes {
            apiserver: None,
            etcd: None,
            dir: Some(dir),
            grace: self.shutdown_grace,
        };

        let pki = pki::Pki::generate()?;
        write_pki(&layout, &pki)?;
        let ports = pick_ports()?;
        let server_url = args::server_url(ports);

        let mut etcd = Command::new(bin_dir.join("etcd"));
        etcd.args(args::etcd_args(&layout, ports));
        // etcd reads its flags from ETCD_* variables too; a stray one must not change ours.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ETCD_") {
                etcd.env_remove(key);
            }
        }
        processes.etcd = Some(Mutex::new(spawn_logged(
            etcd,
            "etcd",
            &layout.root,
            &layout.etcd_log(),
        )?));

        let apiserver_args = args::apiserver_args(&layout, ports, &self.apiserver_args);
        let mut apiserver = Command::new(bin_dir.join("kube-apiserver"));
        apiserver.args(&apiserver_args);
        processes.apiserver = Some(Mutex::new(spawn_logged(
            apiserver,
            "kube-apiserver",
            &layout.root,
            &layout.apiserver_log(),
        )?));

        let kubeconfig_text =
            kubeconfig::render(&server_url, &pki.ca_cert, &pki.admin_cert, &pki.admin_key);
        let kubeconfig_path = layout.kubeconfig();
        write_file(&kubeconfig_path, &kubeconfig_text, 0o600)?;
        let config = kube_config(&kubeconfig_text).await?;
        install_crypto_provider();
        let client = kube::Client::try_from(config.clone())?;

        let mut env = TestEnv {
            layout,
            bin_dir: bin_dir.to_path_buf(),
            apiserver_args,
            apiserver_restarts: AtomicU32::new(0),
            server_url,
            etcd_url: args::etcd_url(ports),
            kubeconfig_path,
            config,
            client,
            startup: Duration::ZERO,
            processes,
        };
        env.wait_ready(self.startup_timeout).await?;
        env.startup = started.elapsed();
        tracing::info!(
            server = %env.server_url,
            dir = %env.layout.root.display(),
            startup_ms = env.startup.as_millis() as u64,
            "control plane ready"
        );
        Ok(env)
    }
}

/// A running etcd + kube-apiserver on loopback. Dropping it stops both and removes its directory.
pub struct TestEnv {
    layout: Layout,
    bin_dir: PathBuf,
    /// kube-apiserver's command line, to start it again on the same ports and etcd.
    apiserver_args: Vec<String>,
    /// How many times it was restarted (each run keeps its own log).
    apiserver_restarts: AtomicU32,
    server_url: String,
    etcd_url: String,
    kubeconfig_path: PathBuf,
    config: kube::Config,
    client: kube::Client,
    startup: Duration,
    // Last, so it is dropped after the client: fields drop in declaration order.
    processes: Processes,
}

// Tests share one env across tasks (`Arc<TestEnv>`); keep that possible.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<TestEnv>();
};

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("server_url", &self.server_url)
            .field("etcd_url", &self.etcd_url)
            .field("dir", &self.layout.root)
            .field("bin_dir", &self.bin_dir)
            .finish_non_exhaustive()
    }
}

impl TestEnv {
    /// Options: bin dir, data dir, extra apiserver flags, timeouts.
    pub fn builder() -> TestEnvBuilder {
        TestEnvBuilder::default()
    }

    /// Starts a control plane with the default options.
    pub async fn start() -> Result<TestEnv, Error> {
        TestEnvBuilder::default().start().await
    }

    /// A client authenticated as `admin` (`O=system:masters`), default namespace `default`.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The client configuration, for callers that build their own client or run an operator in-process.
    pub fn kube_config(&self) -> kube::Config {
        self.config.clone()
    }

    /// The admin kubeconfig (certificates embedded).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// `https://127.0.0.1:PORT`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// `http://127.0.0.1:PORT` of etcd.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The directory holding etcd, kube-apiserver and kubectl.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The control plane's own directory (data, certificates, logs `etcd.log` and
    /// `kube-apiserver.log`); removed on drop.
    pub fn dir(&self) -> &Path {
        &self.layout.root
    }

    /// Pid of kube-apiserver.
    pub fn apiserver_pid(&self) -> u32 {
        self.processes
            .apiserver
            .as_ref()
            .map_or(0, |p| lock(p).pid())
    }

    /// Pid of etcd.
    pub fn etcd_pid(&self) -> u32 {
        self.processes.etcd.as_ref().map_or(0, |p| lock(p).pid())
    }

    /// Time from [`TestEnvBuilder::start`] to ready.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Pauses (`SIGSTOP`) kube-apiserver: it keeps its connections and answers nothing until
    /// [`TestEnv::resume_apiserver`]. etcd keeps running.
    pub fn pause_apiserver(&self) -> Result<(), Error> {
        self.signal_apiserver(Signal::Stop)
    }

    /// Resumes (`SIGCONT`) a paused kube-apiserver.
    pub fn resume_apiserver(&self) -> Result<(), Error> {
        self.signal_apiserver(Signal::Cont)
    }

    fn signal_apiserver(&self, signal: Signal) -> Result<(), Error> {
        let pid = self.apiserver_pid();
        process::send_signal(pid, signal).map_err(|e| {
            Error::io(
                format!("sending {signal:?} to kube-apiserver (pid {pid})"),
                e,
            )
        })
    }

    /// Kills kube-apiserver (`SIGKILL`: no graceful shutdown) and starts it again with the same
    /// flags, on the same port and the same etcd (which keeps running, so nothing stored is
    /// lost), then waits until it is ready again. The kubeconfig stays valid. The previous
    /// run's log is kept as `kube-apiserver.<n>.log`.
    pub async fn restart_apiserver(&self, timeout: Duration) -> Result<(), Error> {
        let Some(slot) = &self.processes.apiserver else {
            return Err(Error::io(
                "restarting kube-apiserver".to_owned(),
                std::io::Error::other("it was never started"),
            ));
        };
        let n = self.apiserver_restarts.fetch_add(1, Ordering::SeqCst) + 1;
        let log = self.layout.apiserver_log();
        {
            let mut old = lock(slot);
            old.kill()
                .map_err(|e| Error::io(format!("killing kube-apiserver (pid {})", old.pid()), e))?;
            let kept = self.layout.root.join(format!("kube-apiserver.{n}.log"));
            std::fs::rename(&log, &kept)
                .map_err(|e| Error::io(format!("keeping {}", log.display()), e))?;
            let mut cmd = Command::new(self.bin_dir.join("kube-apiserver"));
            cmd.args(&self.apiserver_args);
            *old = spawn_logged(cmd, "kube-apiserver", &self.layout.root, &log)?;
        }
        self.wait_ready(timeout).await
    }

    /// Fails with [`Error::ProcessDied`] if etcd or kube-apiserver has exited.
    pub fn check_processes(&self) -> Result<(), Error> {
        for process in [&self.processes.etcd, &self.processes.apiserver]
            .into_iter()
            .flatten()
        {
            let mut p = lock(process);
            if let Some(status) = p.exited() {
                return Err(Error::ProcessDied {
                    process: p.name,
                    pid: p.pid(),
                    status,
                });
            }
        }
        Ok(())
    }

    /// Stops kube-apiserver, then etcd, and removes the directory, reporting any failure
    /// (dropping does the same silently).
    pub fn stop(mut self) -> Result<(), Error> {
        self.processes.shutdown()
    }

    /// A `kubectl` of the same release as the apiserver, with `KUBECONFIG` set, the bin dir
    /// first on `PATH`, and its discovery cache inside [`TestEnv::dir`].
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.bin_dir.join("kubectl"));
        cmd.env("KUBECONFIG", &self.kubeconfig_path)
            .env("PATH", path_with_first(&self.bin_dir))
            .env("KUBECACHEDIR", self.layout.kubectl_cache())
            .stdin(Stdio::null());
        cmd
    }

    /// [`TestEnv::kubectl`] as a tokio command (killed if the future is dropped).
    pub fn kubectl_async(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::from(self.kubectl());
        cmd.kill_on_drop(true);
        cmd
    }

    async fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let namespaces: kube::Api<Namespace> = kube::Api::all(self.client.clone());
        loop {
            for process in [&self.processes.etcd, &self.processes.apiserver]
                .into_iter()
                .flatten()
            {
                let mut p = lock(process);
                if let Some(status) = p.exited() {
                    let log = if p.name == "etcd" {
                        self.layout.etcd_log()
                    } else {
                        self.layout.apiserver_log()
                    };
                    return Err(Error::ExitedEarly {
                        process: p.name,
                        status,
                        log_tail: logs::read_tail(&log, LOG_TAIL_LINES),
                    });
                }
            }
            let probe = async {
                let req = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                let body = self
                    .client
                    .request_text(req)
                    .await
                    .map_err(|e| e.to_string())?;
                if body.trim() != "ok" {
                    return Err(format!("/readyz answered {body:?}"));
                }
                // Created by a post-start controller, possibly just after /readyz turns ok.
                match namespaces.get_opt("default").await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err("namespace default not created yet".to_owned()),
                    Err(e) => Err(e.to_string()),
                }
            };
            let last_error = match tokio::time::timeout(Duration::from_secs(5), probe).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e,
                Err(_) => "/readyz did not answer within 5s".to_owned(),
            };
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    timeout,
                    last_error,
                    apiserver_log: logs::read_tail(&self.layout.apiserver_log(), LOG_TAIL_LINES),
                    etcd_log: logs::read_tail(&self.layout.etcd_log(), LOG_TAIL_LINES),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The processes and directory of one start; dropping it cleans up, whatever state start-up reached.
struct Processes {
    apiserver: Option<Mutex<Supervised>>,
    etcd: Option<Mutex<Supervised>>,
    dir: Option<tempfile::TempDir>,
    grace: Duration,
}

impl Processes {
    fn shutdown(&mut self) -> Result<(), Error> {
        let started = Instant::now();
        let mut first_error = None;
        // The apiserver first, so it does not log a storm of etcd errors while stopping.
        for process in [self.apiserver.take(), self.etcd.take()]
            .into_iter()
            .flatten()
        {
            let mut p = process
                .into_inner()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Err(e) = p.stop(self.grace) {
                first_error.get_or_insert(Error::io(
                    format!("stopping {} (pid {})", p.name, p.pid()),
                    e,
                ));
            }
        }
        if let Some(dir) = self.dir.take() {
            let path = dir.path().to_path_buf();
            if let Err(e) = dir.close() {
                first_error.get_or_insert(Error::io(format!("removing {}", path.display()), e));
            }
        }
        tracing::debug!(
            shutdown_ms = started.elapsed().as_millis() as u64,
            "control plane stopped"
        );
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "cleaning up the control plane");
        }
    }
}

fn lock(m: &Mutex<Supervised>) -> MutexGuard<'_, Supervised> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn spawn_logged(
    mut cmd: Command,
    name: &'static str,
    cwd: &Path,
    log: &Path,
) -> Result<Supervised, Error> {
    let out = std::fs::File::create(log)
        .map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
    let err = out
        .try_clone()
        .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
    cmd.current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let child = process::spawn_tied(cmd).map_err(|e| Error::io(format!("starting {name}"), e))?;
    tracing::debug!(process = name, pid = child.id(), "started");
    Ok(Supervised::new(name, child))
}

fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), Error> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    file.write_all(text.as_bytes())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

fn write_pki(layout: &Layout, pki: &pki::Pki) -> Result<(), Error> {
    let dir = layout.pki();
    std::fs::create_dir(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    write_file(&layout.ca_cert(), &pki.ca_cert, 0o644)?;
    write_file(&layout.ca_key(), &pki.ca_key, 0o600)?;
    write_file(
        &layout.kubelet_client_cert(),
        &pki.kubelet_client_cert,
        0o644,
    )?;
    write_file(&layout.kubelet_client_key(), &pki.kubelet_client_key, 0o600)?;
    write_file(&layout.serving_cert(), &pki.serving_cert, 0o644)?;
    write_file(&layout.serving_key(), &pki.serving_key, 0o600)?;
    write_file(&layout.sa_key(), &pki.service_account_key, 0o600)?;
    write_file(&layout.sa_pub(), &pki.service_account_pub, 0o644)
}

/// Three distinct free loopback ports. All three listeners are held at once so they differ;
/// another process may still take one before etcd or the apiserver binds it (then we retry).
fn pick_ports() -> Result<Ports, Error> {
    let bind = || {
        std::net::TcpListener::bind(("127.0.0.1", 0))
            .map_err(|e| Error::io("picking a free loopback port", e))
    };
    let (a, b, c) = (bind()?, bind()?, bind()?);
    let port = |l: &std::net::TcpListener| {
        l.local_addr()
            .map(|addr| addr.port())
            .map_err(|e| Error::io("picking a free loopback port", e))
    };
    Ok(Ports {
        etcd_client: port(&a)?,
        etcd_peer: port(&b)?,
        apiserver: port(&c)?,
    })
}

async fn kube_config(kubeconfig_text: &str) -> Result<kube::Config, Error> {
    let kubeconfig =
        Kubeconfig::from_yaml(kubeconfig_text).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))
}

/// kube's rustls client needs a process-wide crypto provider; install ring unless the
/// program already chose one (then theirs is used).
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// `PATH` with `first` in front, so the built kubectl wins over the machine's.
fn path_with_first(first: &Path) -> std::ffi::OsString {
    let rest = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(first.to_path_buf()).chain(std::env::split_paths(&rest));
    // join_paths fails only if a directory contains ':'; then the bin dir alone still works.
    std::env::join_paths(dirs).unwrap_or_else(|_| first.as_os_str().to_owned())
}

/// Removes `testenv-<pid>-*` directories in `parent` whose owner is gone (a test process
/// that was SIGKILLed cannot clean up after itself; its children died with it).
fn sweep_stale_dirs(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = stale_owner(&name.to_string_lossy()) else {
            continue;
        };
        if pid != std::process::id() && !process::is_running(pid) {
            let path = entry.path();
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    tracing::info!(dir = %path.display(), pid, "removed the directory of a dead testenv")
                }
                Err(e) => {
                    tracing::warn!(dir = %path.display(), error = %e, "cannot remove a stale testenv directory")
                }
            }
        }
    }
}

/// The owner pid in a `testenv-<pid>-<random>` directory name.
fn stale_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("testenv-")?;
    let (pid, random) = rest.split_once('-')?;
    if random.is_empty() {
        return None;
    }
    pid.parse().ok().filter(|p| *p > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_is_read_from_our_directory_names_only() {
        assert_eq!(stale_owner("testenv-1234-AbC12"), Some(1234));
        assert_eq!(stale_owner("testenv-1234-"), None);
        assert_eq!(stale_owner("testenv-x-abc"), None);
        assert_eq!(stale_owner("testenv-0-abc"), None);
        assert_eq!(stale_owner("other-1234-abc"), None);
        assert_eq!(stale_owner("testenv-99999999999-abc"), None);
    }

    #[test]
    fn directories_of_dead_owners_are_swept_and_live_ones_kept() {
        let parent = tempfile::tempdir().unwrap();
        let dead = parent.path().join(format!("testenv-{}-dead", u32::MAX - 1));
        let live = parent
            .path()
            .join(format!("testenv-{}-live", std::process::id()));
        let unrelated = parent.path().join("keep-me");
        for d in [&dead, &live, &unrelated] {
            std::fs::create_dir(d).unwrap();
        }
        sweep_stale_dirs(parent.path());
        assert!(!dead.exists());
        assert!(live.exists());
        assert!(unrelated.exists());
    }

    #[test]
    fn missing_binaries_fail_tests_unless_skipping_is_asked_for() {
        let missing = || {
            Err(Error::BinariesMissing {
                dir: "/x".into(),
                missing: "etcd".into(),
            })
        };
        assert!(matches!(availability(Ok(()), None), Ok(true)));
        assert!(matches!(availability(Ok(()), Some("1")), Ok(true)));
        assert!(matches!(availability(missing(), Some("1")), Ok(false)));
        let err = availability(missing(), None).unwrap_err().to_string();
        assert!(err.contains("run `make control-plane`"), "{err}");
        for not_one in ["0", "", "yes", "true"] {
            assert!(
                availability(missing(), Some(not_one)).is_err(),
                "{not_one:?}"
            );
        }
    }

    #[test]
    fn picked_ports_are_distinct() {
        let p = pick_ports().unwrap();
        assert_ne!(p.etcd_client, p.etcd_peer);
        assert_ne!(p.etcd_peer, p.apiserver);
        assert_ne!(p.etcd_client, p.apiserver);
    }

    #[test]
    fn the_bin_dir_comes_first_on_path() {
        let path = path_with_first(Path::new("/opt/k8s/bin"));
        let first = std::env::split_paths(&path).next();
        assert_eq!(first, Some(PathBuf::from("/opt/k8s/bin")));
    }

    #[tokio::test]
    async fn a_missing_bin_dir_fails_fast_with_the_make_target_to_run() {
        let err = TestEnv::builder()
            .bin_dir("/nonexistent/automanager/bin")
            .start()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::BinariesMissing { .. }));
        let msg = err.to_string();
        assert!(msg.contains("run `make control-plane`"), "{msg}");
        assert!(msg.contains("etcd, kube-apiserver, kubectl"), "{msg}");
    }

    #[tokio::test]
    async fn a_managed_apiserver_flag_is_refused_before_anything_starts() {
        let err = TestEnv::builder()
            .bin_dir("/nonexistent")
            .apiserver_arg("--bind-address=0.0.0.0")
            .start()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidFlag { .. }), "{err}");
    }
}
