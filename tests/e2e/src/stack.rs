//! The whole product on one machine, as a user runs it: a real control plane with the CRDs,
//! the `manager-sim` binary (the gRPC Manager), and the `automanager-operator` binary.
//!
//! Binaries are built once per test process with the cargo that runs the tests, into the same
//! target directory. Every process is killed and every directory removed when the [`Stack`]
//! drops, also when a test fails.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{SetupError, TestEnv, env_with_crds, repo_root};

/// Which of Manager's APIs a [`Stack`]'s operator speaks and its sim serves, chosen for every
/// Stack of a test process by `AUTOMANAGER_E2E_MANAGER_API`: `published` (Manager's published
/// API with our extension, the default), `published-standard` (the published API alone, the
/// sim started with `--no-extension`: the operator's standard mode) or `v1` (our first API).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManagerApi {
    V1,
    Published,
    PublishedStandard,
}

/// The environment variable that chooses [`ManagerApi`].
pub const MANAGER_API_ENV: &str = "AUTOMANAGER_E2E_MANAGER_API";

impl ManagerApi {
    /// The API chosen by [`MANAGER_API_ENV`] (unset: [`ManagerApi::Published`]); panics on a
    /// value it does not know, so a misspelt lane does not quietly run the default.
    pub fn from_env() -> ManagerApi {
        match std::env::var(MANAGER_API_ENV) {
            Err(_) => ManagerApi::Published,
            Ok(v) => ManagerApi::parse(&v).unwrap_or_else(|| {
                panic!("{MANAGER_API_ENV}={v:?}: expected v1, published or published-standard")
            }),
        }
    }

    pub fn parse(v: &str) -> Option<ManagerApi> {
        match v.trim() {
            "v1" => Some(ManagerApi::V1),
            "" | "published" => Some(ManagerApi::Published),
            "published-standard" => Some(ManagerApi::PublishedStandard),
            _ => None,
        }
    }

    /// Whether the operator speaks the published API.
    pub fn published(self) -> bool {
        self != ManagerApi::V1
    }

    /// Whether Manager has pools of its own (our first API's ListPools), so a PlacementPool
    /// can be unknown to it. The published API has none: every pool is the operator's own.
    pub fn lists_pools(self) -> bool {
        self == ManagerApi::V1
    }

    /// Whether Manager terminates a physical (fixed pool) node a drain asks it to: our first
    /// API does; over the published API the node is its owner's, so a drain leaves it up.
    pub fn terminates_physical_nodes(self) -> bool {
        self == ManagerApi::V1
    }

    /// Whether the Manager serves what 1.0.384 lacks (warm nodes, the migration handshake,
    /// reclaim notices): our first API does, the published one only with our extension.
    pub fn extended(self) -> bool {
        self != ManagerApi::PublishedStandard
    }
}

/// The installation owner the stack's operator tags its Manager objects with over the
/// published API (the operator's default `manager.owner`).
pub const OWNER: &str = "automanager";

/// A client of the sim at `endpoint` seeing Manager as the stack's operator does, over `api`:
/// our first API's client, or the published client under the operator's port (the operator's
/// owner; its pools as the sim's own pool records describe them). Either way its mirror holds
/// the operator's nodes and jobs in the same terms, so checks read them alike.
pub async fn manager_view(
    endpoint: &str,
    api: ManagerApi,
) -> Result<manager_client::ManagerClient, SetupError> {
    manager_view_with(manager_client::ClientConfig::new(endpoint), api).await
}

/// [`manager_view`] with a client configuration of the caller's (its endpoint is the sim's),
/// e.g. a bench's larger change buffer.
pub async fn manager_view_with(
    config: manager_client::ClientConfig,
    api: ManagerApi,
) -> Result<manager_client::ManagerClient, SetupError> {
    use manager_client::ManagerClient;
    use manager_client::published::{CatalogPool, PoolCatalog, PublishedClient, PublishedConfig};
    let endpoint = config.endpoint.clone();
    let connected = if api.published() {
        // The pools: the sim serves our first API beside the published one, and its ListPools
        // is its configuration's pools.
        let v1 = ManagerClient::connect(config.clone())
            .await
            .map_err(|e| SetupError(format!("connecting to the sim: {e}")))?;
        let pools = v1.list_pools().await;
        v1.close().await;
        let catalog = PoolCatalog::new();
        for pool in pools.map_err(|e| SetupError(format!("the sim's pools: {e}")))? {
            catalog.upsert(CatalogPool {
                pool,
                ..Default::default()
            });
        }
        let mut published = PublishedConfig::new(endpoint);
        published.connection = config.clone();
        let client = PublishedClient::connect(published)
            .map_err(|e| SetupError(format!("connecting to the sim: {e}")))?;
        let port = manager_client::published::PublishedPort::new(
            std::sync::Arc::new(client),
            catalog,
            OWNER,
        );
        ManagerClient::over(std::sync::Arc::new(port), &config)
    } else {
        ManagerClient::connect(config).await
    };
    connected.map_err(|e| SetupError(format!("connecting to the sim: {e}")))
}

/// The binaries the stack runs.
pub struct Binaries {
    pub operator: PathBuf,
    pub sim: PathBuf,
}

/// What `cargo build` selects to build as `cargo test --workspace` does: every member, with
/// dev-dependencies active. Cargo resolves features per selection, so a narrower `-p` build
/// after that run resolves them differently and compiles the workspace and part of its
/// dependencies again (about two minutes of a cold `make test`); this one finds them fresh.
pub const AS_WORKSPACE_TESTS: [&str; 4] = ["--workspace", "--bins", "--tests", "--examples"];

/// Whether cargo sets `key` for the crate it compiles or the test it runs (The Cargo Book,
/// "Environment variables Cargo sets for crates").
fn set_by_cargo_for_tests(key: &str) -> bool {
    key.starts_with("CARGO_PKG_")
        || key.starts_with("CARGO_BIN_EXE_")
        || [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_MANIFEST_LINKS",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
            "OUT_DIR",
        ]
        .contains(&key)
}

/// Builds what `narrow` names with the cargo that runs the tests, in the same profile as the
/// test executable, and returns that profile's target directory.
///
/// In the test profile it builds [`AS_WORKSPACE_TESTS`] instead, which includes `narrow`'s
/// targets. A test executable under `<target>/release` was built by `cargo bench` or `cargo
/// test --release`, both in the `bench` profile: building `narrow` in that profile too (its
/// output directory is also `release`) lets it share the dependencies just compiled, where
/// `--release` would rebuild those dependencies in the `release` profile on every run, and the
/// next `cargo bench` rebuild them back.
pub fn cargo_build(narrow: &[&str]) -> Result<PathBuf, SetupError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // The test executable lives in <target>/<profile>/deps/.
    let exe = std::env::current_exe().map_err(|e| SetupError(e.to_string()))?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| SetupError("no target dir".into()))?
        .to_path_buf();
    let mut cmd = Command::new(&cargo);
    cmd.arg("build");
    // What cargo sets for a test executable describes the test's package, not the build's.
    // Build scripts that declare them (`rerun-if-env-changed`, as ring's does for
    // CARGO_MANIFEST_DIR and CARGO_PKG_NAME) would otherwise see them change and rebuild
    // everything above them.
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(set_by_cargo_for_tests) {
            cmd.env_remove(&key);
        }
    }
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.args(narrow).args(["--profile", "bench"]);
    } else {
        cmd.args(AS_WORKSPACE_TESTS);
    }
    let status = cmd
        .current_dir(repo_root())
        .status()
        .map_err(|e| SetupError(format!("running {cargo} build: {e}")))?;
    if !status.success() {
        return Err(SetupError(format!(
            "cargo build for {narrow:?} failed ({status})"
        )));
    }
    Ok(profile_dir)
}

/// Builds `automanager-operator` and `manager-sim` (once per process) and returns their paths.
pub fn binaries() -> Result<&'static Binaries, SetupError> {
    static BINS: OnceLock<Result<Binaries, String>> = OnceLock::new();
    BINS.get_or_init(|| {
        // Binaries built beforehand, so a run tests exactly those (say while the tree is being
        // edited by others): `AUTOMANAGER_E2E_BIN_DIR` names their directory.
        let profile_dir = match std::env::var_os("AUTOMANAGER_E2E_BIN_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => cargo_build(&["--bins", "-p", "automanager-operator", "-p", "manager-sim"])
                .map_err(|e| e.0)?,
        };
        // A bench can run a build of the operator kept from another revision, to time old
        // against new on the same stack.
        let operator = std::env::var_os("AUTOMANAGER_OPERATOR_BIN")
            .map_or_else(|| profile_dir.join("automanager-operator"), PathBuf::from);
        let bins = Binaries {
            operator,
            sim: profile_dir.join("manager-sim"),
        };
        for b in [&bins.operator, &bins.sim] {
            if !b.exists() {
                return Err(format!("{} was not built", b.display()));
            }
        }
        Ok(bins)
    })
    .as_ref()
    .map_err(|e| SetupError(e.clone()))
}

/// A child process killed (and reaped) on drop.
pub struct Proc {
    pub name: &'static str,
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The exit status, once the process has exited (None while it runs or was never started).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Stops the process: SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = testenv::process::send_signal(child.id(), testenv::process::Signal::Term);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the process at once (SIGKILL): no shutdown, no lease release, nothing flushed.
    pub fn kill9(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Pauses (`SIGSTOP`) or resumes (`SIGCONT`) the process, with kill(1): `signal` is `STOP`
    /// or `CONT`.
    pub fn pause_signal(&self, signal: &str) -> Result<(), SetupError> {
        let pid = self
            .pid()
            .ok_or_else(|| SetupError(format!("{} is not running", self.name)))?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .map_err(|e| SetupError(format!("kill -{signal}: {e}")))?;
        if status.success() {
            Ok(())
        } else {
            Err(SetupError(format!(
                "kill -{signal} {pid} failed ({status})"
            )))
        }
    }

    /// The process's log so far (stdout and stderr).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Where a failing test's process logs are copied before its stack's directory goes:
/// `AUTOMANAGER_E2E_KEEP_LOGS=DIR`.
pub const KEEP_LOGS_ENV: &str = "AUTOMANAGER_E2E_KEEP_LOGS";

/// Copies the log at `log` into `AUTOMANAGER_E2E_KEEP_LOGS`'s directory, when it is set, as
/// `<stack directory>-<file>` (the stack's directory, a unique temporary one, tells two stacks'
/// logs apart).
pub fn keep_log(log: &Path) {
    let Some(dir) = std::env::var_os(KEEP_LOGS_ENV).map(PathBuf::from) else {
        return;
    };
    let name = |p: Option<&std::ffi::OsStr>| {
        p.map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    };
    let to = dir.join(format!(
        "{}-{}",
        name(log.parent().and_then(Path::file_name)),
        name(log.file_name())
    ));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::copy(log, &to)) {
        Ok(_) => eprintln!("kept {} as {}", log.display(), to.display()),
        Err(e) => eprintln!("could not keep {}: {e}", log.display()),
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
        if std::thread::panicking() {
            keep_log(&self.log);
        }
    }
}

/// The running product.
pub struct Stack {
    /// The API the operator speaks and the sim serves ([`ManagerApi::from_env`], unless the
    /// test's config names one).
    pub api: ManagerApi,
    pub operator: Proc,
    pub sim: Proc,
    /// `http://127.0.0.1:PORT` of the simulated Manager.
    pub sim_endpoint: String,
    /// How the sim was started (its config file and extra arguments), for [`Stack::restart_sim`].
    sim_config: PathBuf,
    sim_args: Vec<String>,
    /// How many times the sim was restarted (each run keeps its own log).
    sim_restarts: u32,
    /// `http://127.0.0.1:PORT` of the operator's HTTP server (health, readiness, metrics).
    pub operator_http: String,
    /// `http://127.0.0.1:PORT` of the operator's debugging API (`/debug/trace`, `/v1/what-if`).
    pub operator_debug_http: String,
    pub config_path: PathBuf,
    /// The kubeconfig the operator runs with (the control plane's admin one unless the stack
    /// was started with another, e.g. a ServiceAccount's token).
    pub operator_kubeconfig: PathBuf,
    pub dir: tempfile::TempDir,
    // Dropped last: the processes above talk to it.
    pub env: TestEnv,
}

/// A free loopback port (free when asked; another process may take it before it is bound).
pub fn free_port() -> Result<u16, SetupError> {
    let [port] = free_ports::<1>()?;
    Ok(port)
}

/// `N` distinct free loopback ports. Every listener is held until all are picked: two ports
/// asked for one after the other can be the same one, since the kernel may hand a port it just
/// got back to the next `bind(0)`.
pub fn free_ports<const N: usize>() -> Result<[u16; N], SetupError> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| SetupError(e.to_string()))?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener
            .local_addr()
            .map_err(|e| SetupError(e.to_string()))?
            .port();
    }
    Ok(ports)
}

/// The demo's manager-sim config (deploy/demo/manager-sim.yaml) with simulated jobs that wait
/// ten minutes for an answer, written into `dir`: a cutover held by `slow-cutover` then lasts as
/// long as a test asks however loaded the machine is (the sim's default answer timeout, 30 s,
/// would otherwise abort it first).
pub fn patient_sim_config(dir: &Path) -> Result<PathBuf, SetupError> {
    let demo = std::fs::read_to_string(repo_root().join("deploy/demo/manager-sim.yaml"))
        .map_err(|e| SetupError(format!("reading the demo's manager-sim config: {e}")))?;
    let config = dir.join("manager-sim.yaml");
    std::fs::write(
        &config,
        format!("{demo}\njobSocket: {{answerTimeoutMs: 600000}}\n"),
    )
    .map_err(|e| SetupError(e.to_string()))?;
    Ok(config)
}

/// Starts `manager-sim serve` and waits for its `listening on` line.
pub fn start_sim(
    dir: &Path,
    config: &Path,
    state_dir: Option<&Path>,
    extra_args: &[&str],
) -> Result<(Proc, String), SetupError> {
    let bins = binaries()?;
    let log = dir.join("manager-sim.log");
    let mut cmd = Command::new(&bins.sim);
    cmd.arg("serve").arg("--config").arg(config);
    if let Some(s) = state_dir {
        cmd.arg("--state-dir").arg(s);
    }
    cmd.args(extra_args);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).map_err(|e| SetupError(e.to_string()))?)
        .spawn()
        .map_err(|e| SetupError(format!("starting manager-sim: {e}")))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| SetupError("no stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let mut proc = Proc {
        name: "manager-sim",
        child: Some(child),
        log,
    };
    let endpoint = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(addr) = line.strip_prefix("manager-sim listening on ") {
                    break format!("http://{}", addr.trim());
                }
            }
            _ => {
                proc.stop(Duration::from_secs(1));
                return Err(SetupError(format!(
                    "manager-sim exited before listening:\n{}",
                    proc.log_text()
                )));
            }
        }
    };
    // Keep draining stdout so the sim never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok((proc, endpoint))
}

impl Stack {
    /// Control plane + CRDs + manager-sim (deploy/demo/manager-sim.yaml) + operator.
    pub async fn start() -> Result<Stack, SetupError> {
        Self::start_with(|_| {}).await
    }

    /// Like [`Stack::start`], letting the test adjust the operator's config (its top-level mapping).
    pub async fn start_with(
        adjust: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
    ) -> Result<Stack, SetupError> {
        Self::start_custom(
            &repo_root().join("deploy/demo/manager-sim.yaml"),
            &[],
            adjust,
        )
        .await
    }

    /// Like [`Stack::start_with`], with another manager-sim config.
    pub async fn start_custom(
        sim_config: &Path,
        sim_args: &[&str],
        adjust: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
    ) -> Result<Stack, SetupError> {
        binaries()?;
        let env = env_with_crds().await?;
        Self::start_on(env, sim_config, sim_args, None, adjust).await
    }

    /// Like [`Stack::start_custom`], on a control plane the caller set up (its CRDs installed),
    /// with the operator using `operator_kubeconfig` instead of the admin one when given.
    pub async fn start_on(
        env: TestEnv,
        sim_config: &Path,
        sim_args: &[&str],
        operator_kubeconfig: Option<PathBuf>,
        adjust: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
    ) -> Result<Stack, SetupError> {
        binaries()?;
        let dir = tempfile::Builder::new()
            .prefix("automanager-e2e-")
            .tempdir()
            .map_err(|e| SetupError(e.to_string()))?;
        let chosen = ManagerApi::from_env();
        let mut sim_args: Vec<String> = sim_args.iter().map(|a| (*a).to_owned()).collect();
        if chosen == ManagerApi::PublishedStandard && !sim_args.iter().any(|a| a == NO_EXTENSION) {
            sim_args.push(NO_EXTENSION.to_owned());
        }
        let args: Vec<&str> = sim_args.iter().map(String::as_str).collect();
        let (sim, sim_endpoint) = start_sim(dir.path(), sim_config, None, &args)?;
        let [http_port, debug_port] = free_ports()?;
        let mut config: serde_json::Map<String, serde_json::Value> = serde_saphyr::from_str(&format!(
            "manager: {{url: \"{sim_endpoint}\"}}\nhttp: {{bindAddress: \"127.0.0.1:{http_port}\", debugBindAddress: \"127.0.0.1:{debug_port}\"}}\nleaderElection: {{enabled: true, leaseNamespace: default}}\nstatusWriteInterval: 100ms\n"
        ))
        .map_err(|e| SetupError(e.to_string()))?;
        adjust(&mut config);
        let api = choose_api(&mut config, chosen, &sim_args);
        let config_path = dir.path().join("operator.yaml");
        std::fs::write(
            &config_path,
            serde_saphyr::to_string(&config).map_err(|e| SetupError(e.to_string()))?,
        )
        .map_err(|e| SetupError(e.to_string()))?;
        let mut stack = Stack {
            api,
            operator: Proc {
                name: "automanager-operator",
                child: None,
                log: dir.path().join("operator.log"),
            },
            sim,
            sim_endpoint,
            sim_config: sim_config.to_path_buf(),
            sim_args,
            sim_restarts: 0,
            operator_http: format!("http://127.0.0.1:{http_port}"),
            operator_debug_http: format!("http://127.0.0.1:{debug_port}"),
            config_path,
            operator_kubeconfig: operator_kubeconfig
                .unwrap_or_else(|| env.kubeconfig_path().to_path_buf()),
            dir,
            env,
        };
        stack.start_operator()?;
        stack.wait_operator_ready(Duration::from_secs(60)).await?;
        Ok(stack)
    }

    /// (Re)starts the operator process with the stack's config; the log is appended to.
    pub fn start_operator(&mut self) -> Result<(), SetupError> {
        let child = spawn_operator(
            &self.config_path,
            &self.operator_kubeconfig,
            &self.operator.log,
        )?;
        self.operator.child = Some(child);
        Ok(())
    }

    /// Starts a second operator replica beside the stack's own: the same config with its own
    /// HTTP ports, authenticating with `kubeconfig`. Returns the process and its HTTP base URL.
    pub fn start_replica(
        &self,
        name: &'static str,
        kubeconfig: &Path,
    ) -> Result<(Proc, String), SetupError> {
        let text = std::fs::read_to_string(&self.config_path)
            .map_err(|e| SetupError(format!("reading the operator config: {e}")))?;
        let mut config: serde_json::Map<String, serde_json::Value> =
            serde_saphyr::from_str(&text).map_err(|e| SetupError(e.to_string()))?;
        let [http_port, debug_port] = free_ports()?;
        let http = format!("127.0.0.1:{http_port}");
        // The debugging port only when the stack's own operator has one (a default install
        // has none).
        let debug = config
            .get("http")
            .and_then(|h| h.get("debugBindAddress"))
            .is_some();
        let mut listeners = serde_json::json!({"bindAddress": http});
        if debug {
            listeners["debugBindAddress"] = format!("127.0.0.1:{debug_port}").into();
        }
        config.insert("http".into(), listeners);
        let path = self.dir.path().join(format!("operator-{name}.yaml"));
        std::fs::write(
            &path,
            serde_saphyr::to_string(&config).map_err(|e| SetupError(e.to_string()))?,
        )
        .map_err(|e| SetupError(e.to_string()))?;
        let log = self.dir.path().join(format!("operator-{name}.log"));
        let child = spawn_operator(&path, kubeconfig, &log)?;
        Ok((
            Proc {
                name,
                child: Some(child),
                log,
            },
            format!("http://{http}"),
        ))
    }

    /// Kills the sim (SIGKILL: nothing flushed beyond its last periodic state write) and starts
    /// it again with the same config and arguments, so on the same `--listen` address when the
    /// stack was started with one. With `wipe_state_dir`, that directory is emptied first: the
    /// sim comes back as a Manager that lost its state. The old run's log is kept beside the
    /// new one.
    pub fn restart_sim(&mut self, wipe_state_dir: Option<&Path>) -> Result<(), SetupError> {
        self.sim.kill9();
        self.sim_restarts += 1;
        let kept = self
            .dir
            .path()
            .join(format!("manager-sim.{}.log", self.sim_restarts));
        let _ = std::fs::rename(&self.sim.log, kept);
        if let Some(dir) = wipe_state_dir {
            std::fs::remove_dir_all(dir)
                .map_err(|e| SetupError(format!("wiping {}: {e}", dir.display())))?;
        }
        let args: Vec<&str> = self.sim_args.iter().map(String::as_str).collect();
        let (sim, endpoint) = start_sim(self.dir.path(), &self.sim_config, None, &args)?;
        if endpoint != self.sim_endpoint {
            return Err(SetupError(format!(
                "the restarted sim listens on {endpoint}, not {} (start it with --listen)",
                self.sim_endpoint
            )));
        }
        self.sim = sim;
        Ok(())
    }

    /// Waits until the operator's `/readyz` answers 200.
    pub async fn wait_operator_ready(&mut self, timeout: Duration) -> Result<(), SetupError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok((200, _)) = self.http_get("/readyz").await {
                return Ok(());
            }
            if !self.operator.running() {
                return Err(SetupError(format!(
                    "the operator exited:\n{}",
                    self.operator.log_text()
                )));
            }
            if Instant::now() > deadline {
                return Err(SetupError(format!(
                    "the operator was not ready within {timeout:?}:\n{}",
                    self.operator.log_text()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A plain HTTP/1.1 GET against the operator (no client library needed for loopback).
    pub async fn http_get(&self, path: &str) -> Result<(u16, String), SetupError> {
        http_request(&self.operator_http, "GET", path, None).await
    }

    /// A GET against the operator's debugging API.
    pub async fn debug_get(&self, path: &str) -> Result<(u16, String), SetupError> {
        http_request(&self.operator_debug_http, "GET", path, None).await
    }

    /// A POST with a JSON body against the operator's debugging API.
    pub async fn debug_post(&self, path: &str, body: &str) -> Result<(u16, String), SetupError> {
        http_request(&self.operator_debug_http, "POST", path, Some(body)).await
    }

    /// `manager-sim chaos <args>` against the stack's sim.
    pub fn chaos(&self, args: &[&str]) -> Result<String, SetupError> {
        let bins = binaries()?;
        let out = Command::new(&bins.sim)
            .arg("chaos")
            .arg("--addr")
            .arg(&self.sim_endpoint)
            .args(args)
            .output()
            .map_err(|e| SetupError(e.to_string()))?;
        if !out.status.success() {
            return Err(SetupError(format!(
                "chaos {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `manager-sim calls` against the stack's sim: calls served per Manager RPC, and
    /// `mutating`, those that asked Manager to change something.
    pub fn sim_calls(&self) -> Result<std::collections::BTreeMap<String, u64>, SetupError> {
        let bins = binaries()?;
        let out = Command::new(&bins.sim)
            .args(["calls", "--addr", &self.sim_endpoint])
            .output()
            .map_err(|e| SetupError(e.to_string()))?;
        if !out.status.success() {
            return Err(SetupError(format!(
                "manager-sim calls failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                l.split_once(' ')
                    .and_then(|(k, v)| Some((k.to_owned(), v.trim().parse().ok()?)))
                    .ok_or_else(|| SetupError(format!("manager-sim calls printed {l:?}")))
            })
            .collect()
    }

    /// How many nodes the operator asked the sim to create so far, in the stack's API
    /// (`CreateNode`; over the published API `CreateAwsNode` and `CreateOciNode`).
    pub fn node_creates(&self) -> Result<u64, SetupError> {
        let calls = self.sim_calls()?;
        let names: &[&str] = if self.api.published() {
            &[
                "norsk.api.manager/CreateAwsNode",
                "norsk.api.manager/CreateOciNode",
            ]
        } else {
            &["CreateNode"]
        };
        Ok(names.iter().filter_map(|n| calls.get(*n)).sum())
    }

    /// Manager's nodes as the stack's operator sees them, in the stack's API (a fresh client's
    /// first snapshot): node id to its record, which carries its creation time.
    pub async fn manager_nodes(
        &self,
    ) -> Result<std::collections::BTreeMap<String, manager_client::proto::Node>, SetupError> {
        let client = manager_view(&self.sim_endpoint, self.api).await?;
        let ready = client.wait_ready(Duration::from_secs(30)).await;
        let nodes = client.mirror().read(|m| m.nodes.clone());
        client.close().await;
        ready.map_err(|e| SetupError(format!("the sim's snapshot: {e}")))?;
        Ok(nodes.into_iter().collect())
    }

    /// `kubectl get <what> -o json`, parsed.
    pub async fn get_json(&self, args: &[&str]) -> Result<serde_json::Value, SetupError> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let out = self.env.run_kubectl(all).await?;
        if !out.success() {
            return Err(SetupError(format!("kubectl get {args:?}: {}", out.stderr)));
        }
        serde_json::from_str(&out.stdout).map_err(|e| SetupError(e.to_string()))
    }

    /// Polls `probe` until it returns `Some`, or fails with the last value and the operator's log.
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
        let last_err = match crate::poll_until(timeout, Duration::from_millis(200), probe).await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let log = self.operator.log_text();
        let tail: Vec<&str> = log
            .lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        Err(SetupError(format!(
            "timed out after {timeout:?} waiting for {what} ({last_err})\noperator log tail:\n{}",
            tail.join("\n")
        )))
    }

    /// Waits for a bundle to be Ready with none of its jobs on `node`; returns the bundle.
    /// A moved bundle is Ready before and after its move and its status follows Manager's events
    /// asynchronously, so waiting for the phase alone can read the status from before the move.
    pub async fn wait_bundle_ready_off(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        timeout: Duration,
    ) -> Result<serde_json::Value, SetupError> {
        self.wait_for(
            &format!("bundle {ns}/{name} Ready with no job on {node}"),
            timeout,
            || async move {
                let b = self.get_json(&["bundle", name, "-n", ns]).await?;
                let on_node = b["status"]["replicas"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|r| r["jobs"].as_array().into_iter().flatten())
                    .any(|j| j["nodeId"] == node);
                Ok((b["status"]["phase"] == "Ready" && !on_node).then_some(b))
            },
        )
        .await
    }

    /// Waits for a bundle's `status.phase` to be `phase`; returns the bundle.
    pub async fn wait_bundle_phase(
        &self,
        ns: &str,
        name: &str,
        phase: &str,
        timeout: Duration,
    ) -> Result<serde_json::Value, SetupError> {
        self.wait_for(
            &format!("bundle {ns}/{name} phase {phase}"),
            timeout,
            || async move {
                let b = self.get_json(&["bundle", name, "-n", ns]).await?;
                Ok((b["status"]["phase"] == phase).then_some(b))
            },
        )
        .await
    }
}

/// The sim's argument that leaves our extension out.
const NO_EXTENSION: &str = "--no-extension";

/// Sets `manager.api` in the operator's config to `chosen`'s unless the test named one itself,
/// and returns the API the stack then runs: a test that names its API (the published API's own
/// suites) keeps it whatever the environment says.
fn choose_api(
    config: &mut serde_json::Map<String, serde_json::Value>,
    chosen: ManagerApi,
    sim_args: &[String],
) -> ManagerApi {
    let manager = config
        .entry("manager")
        .or_insert_with(|| serde_json::json!({}));
    let Some(manager) = manager.as_object_mut() else {
        return chosen;
    };
    let extended = !sim_args.iter().any(|a| a == NO_EXTENSION);
    match manager.get("api").and_then(serde_json::Value::as_str) {
        Some("published") if extended => ManagerApi::Published,
        Some("published") => ManagerApi::PublishedStandard,
        Some(_) => ManagerApi::V1,
        None => {
            // Named even for v1, so the stack runs what was chosen whatever the operator's
            // own default is.
            let name = if chosen.published() {
                "published"
            } else {
                "v1"
            };
            manager.insert("api".into(), name.into());
            if chosen.published() && extended {
                ManagerApi::Published
            } else if chosen.published() {
                ManagerApi::PublishedStandard
            } else {
                ManagerApi::V1
            }
        }
    }
}

/// Starts the operator binary with `config` and `kubeconfig`, appending its output to `log`.
fn spawn_operator(config: &Path, kubeconfig: &Path, log: &Path) -> Result<Child, SetupError> {
    let bins = binaries()?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| SetupError(e.to_string()))?;
    let err = out.try_clone().map_err(|e| SetupError(e.to_string()))?;
    Command::new(&bins.operator)
        .arg("--config")
        .arg(config)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,automanager_operator=debug")
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| SetupError(format!("starting the operator: {e}")))
}

/// A plain HTTP/1.1 GET against `base` (`http://host:port`).
pub async fn http_get_at(base: &str, path: &str) -> Result<(u16, String), SetupError> {
    http_request(base, "GET", path, None).await
}

/// A plain HTTP/1.1 request on a fresh loopback connection (`Connection: close`) to `base`
/// (`http://HOST:PORT`); the status code and the body.
pub async fn http_request(
    base: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String), SetupError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hostport = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(hostport)
        .await
        .map_err(|e| SetupError(e.to_string()))?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| SetupError(e.to_string()))?;
    let mut buf = Vec::new();
    stream
        .read_to_end(&mut buf)
        .await
        .map_err(|e| SetupError(e.to_string()))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, dechunk(&body)))
}

/// Undoes `Transfer-Encoding: chunked` when present (axum streams some bodies).
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let Some((size, after)) = rest.split_once("\r\n") else {
            return body.to_owned();
        };
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            return body.to_owned();
        };
        if n == 0 {
            return out;
        }
        if after.len() < n {
            return body.to_owned();
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
}
