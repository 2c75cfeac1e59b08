//! What the install suites share: the Go-built tools (helm, the kstatus checker, the Argo CD
//! health runner), the chart, helm runs against a [`TestEnv`], and kubeconfigs that hold a
//! ServiceAccount's TokenRequest token.

use std::ffi::OsStr;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{CommandOutput, SetupError, TestEnv, repo_root};

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    repo_root().join("deploy/helm/automanager")
}

/// The namespace the suites install the chart into.
pub const RELEASE_NAMESPACE: &str = "automanager-system";
/// The release name the suites use; the chart's objects are then named `am-automanager`.
pub const RELEASE: &str = "am";
/// The chart's full name for [`RELEASE`]: the name of its ServiceAccount, roles and Lease.
pub const FULLNAME: &str = "am-automanager";
/// The one value the chart requires (no image is published for anyone): the suites' image.
pub const IMAGE_VALUES: &[&str] = &[
    "--set",
    "image.repository=registry.example.com/automanager-operator",
];

/// The path of a tool of `tools/<name>`, built (and cached outside the checkout) by
/// `tools/go-tool.sh` if it is not yet; `make install-tools` builds them all up front.
pub fn tool(name: &str) -> Result<PathBuf, SetupError> {
    let out = Command::new(repo_root().join("tools/go-tool.sh"))
        .arg(name)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| SetupError(format!("running tools/go-tool.sh {name}: {e}")))?;
    if !out.status.success() {
        return Err(SetupError(format!(
            "tools/go-tool.sh {name} failed ({})",
            out.status
        )));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Runs `cmd`, feeding `stdin` when given, and captures what it printed.
pub fn run(mut cmd: Command, stdin: Option<&[u8]>) -> Result<CommandOutput, SetupError> {
    let shown = format!("{cmd:?}");
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd
        .spawn()
        .map_err(|e| SetupError(format!("starting {shown}: {e}")))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input)
            .map_err(|e| SetupError(format!("writing to {shown}: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| SetupError(format!("running {shown}: {e}")))?;
    Ok(CommandOutput {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// helm, with its cache, config and data in a directory of its own and, when given, a
/// control plane's kubeconfig.
pub struct Helm {
    bin: PathBuf,
    home: tempfile::TempDir,
    kubeconfig: Option<PathBuf>,
}

impl Helm {
    /// helm with no cluster (lint, template).
    pub fn offline() -> Result<Helm, SetupError> {
        Ok(Helm {
            bin: tool("helm")?,
            home: tempfile::tempdir().map_err(|e| SetupError(e.to_string()))?,
            kubeconfig: None,
        })
    }

    /// helm against `env`'s control plane.
    pub fn on(env: &TestEnv) -> Result<Helm, SetupError> {
        Ok(Helm {
            kubeconfig: Some(env.kubeconfig_path().to_path_buf()),
            ..Helm::offline()?
        })
    }

    /// The command, environment set, arguments still to add.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        let home = self.home.path();
        cmd.env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env_remove("HELM_NAMESPACE");
        match &self.kubeconfig {
            Some(k) => cmd.env("KUBECONFIG", k),
            None => cmd.env("KUBECONFIG", home.join("no-cluster")),
        };
        cmd
    }

    /// `helm ARGS...`.
    pub fn run<I, S>(&self, args: I) -> Result<CommandOutput, SetupError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command();
        cmd.args(args);
        run(cmd, None)
    }

    /// `helm template am CHART -n automanager-system` with [`IMAGE_VALUES`], then `ARGS...`;
    /// fails on an error.
    pub fn template(&self, chart: &Path, args: &[&str]) -> Result<String, SetupError> {
        let mut all: Vec<&OsStr> = vec![
            OsStr::new("template"),
            OsStr::new(RELEASE),
            chart.as_os_str(),
            OsStr::new("--namespace"),
            OsStr::new(RELEASE_NAMESPACE),
        ];
        all.extend(IMAGE_VALUES.iter().map(OsStr::new));
        all.extend(args.iter().map(OsStr::new));
        let out = self.run(all)?;
        if !out.success() {
            return Err(SetupError(format!(
                "helm template {args:?} failed:\n{}",
                out.stderr
            )));
        }
        Ok(out.stdout)
    }
}

/// The documents of a multi-document YAML stream, empty ones left out.
pub fn documents(yaml: &str) -> Result<Vec<serde_json::Value>, SetupError> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(yaml).map_err(|e| SetupError(format!("rendered YAML: {e}")))?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}

/// The first document of `kind` (and `name`, when given).
pub fn find<'a>(
    docs: &'a [serde_json::Value],
    kind: &str,
    name: Option<&str>,
) -> Result<&'a serde_json::Value, SetupError> {
    docs.iter()
        .find(|d| d["kind"] == kind && name.is_none_or(|n| d["metadata"]["name"] == n))
        .ok_or_else(|| SetupError(format!("no {kind} {name:?} in the rendered chart")))
}

/// A kubeconfig for `env`'s apiserver that authenticates as ServiceAccount `sa` of `ns`, with
/// a token from the TokenRequest API (`kubectl create token`), written into `dir`.
pub async fn service_account_kubeconfig(
    env: &TestEnv,
    ns: &str,
    sa: &str,
    dir: &Path,
) -> Result<PathBuf, SetupError> {
    let out = env
        .run_kubectl(["create", "token", sa, "-n", ns, "--duration", "2h"])
        .await?;
    if !out.success() {
        return Err(SetupError(format!(
            "kubectl create token {sa} -n {ns}: {}",
            out.stderr
        )));
    }
    let token = out.stdout.trim().to_owned();
    let admin = std::fs::read_to_string(env.kubeconfig_path())
        .map_err(|e| SetupError(format!("reading the admin kubeconfig: {e}")))?;
    let mut config: serde_json::Value =
        serde_saphyr::from_str(&admin).map_err(|e| SetupError(e.to_string()))?;
    config["users"] = serde_json::json!([{"name": sa, "user": {"token": token}}]);
    config["contexts"][0]["context"]["user"] = serde_json::Value::from(sa);
    let path = dir.join(format!("{sa}.kubeconfig"));
    std::fs::write(
        &path,
        serde_json::to_string(&config).map_err(|e| SetupError(e.to_string()))?,
    )
    .map_err(|e| SetupError(e.to_string()))?;
    Ok(path)
}

/// `kubectl auth can-i ARGS... --as=system:serviceaccount:NS:SA`: whether the answer is yes.
pub async fn can_i(env: &TestEnv, ns: &str, sa: &str, args: &[&str]) -> Result<bool, SetupError> {
    let who = format!("--as=system:serviceaccount:{ns}:{sa}");
    let mut all = vec!["auth", "can-i"];
    all.extend_from_slice(args);
    all.push(&who);
    let out = env.run_kubectl(&all).await?;
    match out.stdout.trim() {
        "yes" => Ok(true),
        "no" => Ok(false),
        other => Err(SetupError(format!(
            "kubectl auth can-i {args:?}: {other} {}",
            out.stderr
        ))),
    }
}
