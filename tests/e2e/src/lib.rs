//! Shared set-up for the end-to-end suites: a real control plane with AutoManager's CRDs
//! installed, and the paths of the repository's `crds/` and `examples/`.
//!
//! Every suite starts its own [`testenv::TestEnv`]; dropping it stops etcd and the apiserver and
//! removes their directory, also when the test fails.

pub mod bench;
pub mod chaos;
pub mod cluster;
pub mod hostile_peers;
pub mod install;
pub mod plugin;
pub mod reliability;
pub mod rng;
pub mod sampler;
pub mod scenario;
pub mod stack;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use testenv::{CommandOutput, TestEnv};

/// The repository root, from the package directory cargo gives the running test or bench: an
/// executable cargo finds fresh may have been built in another checkout that shares the target
/// dir, and the path compiled into it would test that checkout.
pub fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from)
        .join("../..")
}

/// `crds/` in the repository.
pub fn crds_dir() -> PathBuf {
    repo_root().join("crds")
}

/// `examples/` in the repository.
pub fn examples_dir() -> PathBuf {
    repo_root().join("examples")
}

/// The names of every AutoManager CRD, as generated from the types.
pub fn crd_names() -> Vec<String> {
    automanager_api::crd::all()
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect()
}

/// Errors of the e2e set-up, with enough context to act on.
#[derive(Debug)]
pub struct SetupError(pub String);

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SetupError {}

impl From<testenv::Error> for SetupError {
    fn from(e: testenv::Error) -> Self {
        SetupError(e.to_string())
    }
}

/// Starts a control plane and installs AutoManager's CRDs with the built kubectl, waiting until
/// every one is Established.
pub async fn env_with_crds() -> Result<TestEnv, SetupError> {
    install_crds(TestEnv::start().await?).await
}

/// Installs AutoManager's CRDs on `env` with the built kubectl, waiting until every one is
/// Established.
pub async fn install_crds(env: TestEnv) -> Result<TestEnv, SetupError> {
    let out = env.apply_file(crds_dir()).await?;
    if !out.success() {
        return Err(SetupError(format!(
            "kubectl apply -f crds/ failed: {}",
            out.stderr
        )));
    }
    env.wait_for_crds_established(crd_names(), Duration::from_secs(60))
        .await?;
    Ok(env)
}

/// The `# expect: <substring>` header of an invalid example: the part of the apiserver's (or
/// kubectl's) error message the file must produce.
pub fn expected_error(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("# expect: "))
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The condition of `type_` in an object's `status.conditions` (JSON), or `null`.
pub fn condition<'a>(obj: &'a serde_json::Value, type_: &str) -> &'a serde_json::Value {
    static NULL: serde_json::Value = serde_json::Value::Null;
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&NULL)
}

/// Every Event (`events.k8s.io`) in the cluster, one line each: the object's name, the reason
/// and the note.
pub async fn events_table(stack: &stack::Stack) -> Result<String, SetupError> {
    let out = stack
        .env
        .run_kubectl([
            "get",
            "events.events.k8s.io",
            "-A",
            "-o",
            "custom-columns=NAME:.regarding.name,REASON:.reason,NOTE:.note",
        ])
        .await?;
    Ok(out.stdout)
}

/// `kubectl apply -f -` of `yaml` against the stack's cluster; panics with kubectl's error
/// (a test helper).
#[allow(clippy::expect_used)]
pub async fn apply(stack: &stack::Stack, yaml: &str) {
    let out = stack.env.apply_yaml(yaml).await.expect("kubectl runs");
    assert!(out.success(), "apply failed: {}", out.stderr);
}

/// `kubectl patch managernode NODE --type merge -p PATCH`, as a user cordons or drains,
/// retried until the operator has created the object; panics after 90 s (a test helper).
#[allow(clippy::expect_used)]
pub async fn patch_node(stack: &stack::Stack, node: &str, patch: &str) {
    stack
        .wait_for(
            &format!("patching ManagerNode {node}"),
            Duration::from_secs(90),
            || async {
                let out = stack
                    .env
                    .run_kubectl(["patch", "managernode", node, "--type", "merge", "-p", patch])
                    .await?;
                Ok(out.success().then_some(()))
            },
        )
        .await
        .expect("the ManagerNode can be patched");
}

/// `kubectl apply -f examples/pools.yaml`: the pools the demo config's Manager has.
pub async fn apply_example_pools(stack: &stack::Stack) -> Result<(), SetupError> {
    let out = stack
        .env
        .apply_file(examples_dir().join("pools.yaml"))
        .await?;
    if out.success() {
        Ok(())
    } else {
        Err(SetupError(format!(
            "applying examples/pools.yaml: {}",
            out.stderr
        )))
    }
}

/// Writes `deploy/demo/manager-sim.yaml` with `job_socket` as its `jobSocket:` section into
/// `dir`, and returns the file's path.
pub fn demo_sim_config_with_job_socket(
    dir: &Path,
    job_socket: &serde_json::Value,
) -> Result<PathBuf, SetupError> {
    let demo = std::fs::read_to_string(repo_root().join("deploy/demo/manager-sim.yaml"))
        .map_err(|e| SetupError(e.to_string()))?;
    let path = dir.join("manager-sim.yaml");
    std::fs::write(&path, format!("{demo}\njobSocket: {job_socket}\n"))
        .map_err(|e| SetupError(e.to_string()))?;
    Ok(path)
}

/// The `main` of a `harness = false` bench: runs `run` on a multi-threaded runtime and exits 1
/// with `<name> failed: <why>` on an error. (`cargo bench` passes `--bench`; other arguments, such
/// as a filter, are ignored.)
pub fn bench_main<F>(name: &str, run: impl FnOnce() -> F)
where
    F: std::future::Future<Output = Result<(), SetupError>>,
{
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run()) {
        eprintln!("{name} failed: {e}");
        std::process::exit(1);
    }
}

/// Polls `probe` every `every` until it returns `Some`; after `timeout`, `Err` with the last
/// error the probe gave (empty when it only ever answered `None`). The harnesses' `wait_for`
/// add what they can show about a failed wait.
pub async fn poll_until<T, F, Fut>(
    timeout: Duration,
    every: Duration,
    mut probe: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, SetupError>>,
{
    let deadline = std::time::Instant::now() + timeout;
    let mut last_err = String::new();
    loop {
        match probe().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = e.0,
        }
        if std::time::Instant::now() > deadline {
            return Err(last_err);
        }
        tokio::time::sleep(every).await;
    }
}
