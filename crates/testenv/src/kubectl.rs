//! Running the built kubectl against a [`TestEnv`].

use std::ffi::OsStr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;

use crate::{Error, TestEnv};

/// The longest one kubectl invocation may take before it is killed.
pub const KUBECTL_TIMEOUT: Duration = Duration::from_secs(120);

/// What a kubectl run printed and how it ended.
#[derive(Debug, Clone)]
pub struct CommandOutput {
    /// Exit status.
    pub status: ExitStatus,
    /// Standard output (lossily decoded).
    pub stdout: String,
    /// Standard error (lossily decoded).
    pub stderr: String,
}

impl CommandOutput {
    /// True when kubectl exited with status 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }
}

impl TestEnv {
    /// Runs `kubectl ARGS...`, capturing its output; a non-zero exit is *not* an error here
    /// (tests often expect a rejection), only failing to run it or a timeout is.
    pub async fn run_kubectl<I, S>(&self, args: I) -> Result<CommandOutput, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.run_kubectl_with_stdin(args, None).await
    }

    /// `kubectl apply -f PATH` (a file, a directory, or a URL kubectl accepts).
    pub async fn apply_file(&self, path: impl AsRef<Path>) -> Result<CommandOutput, Error> {
        let path = path.as_ref();
        self.run_kubectl([OsStr::new("apply"), OsStr::new("-f"), path.as_os_str()])
            .await
    }

    /// `kubectl apply -f -` with `yaml` on standard input.
    pub async fn apply_yaml(&self, yaml: &str) -> Result<CommandOutput, Error> {
        self.run_kubectl_with_stdin(["apply", "-f", "-"], Some(yaml.as_bytes()))
            .await
    }

    /// `kubectl apply ARGS...` (for example `["--server-side", "-f", "crds/"]`).
    pub async fn kubectl_apply<I, S>(&self, args: I) -> Result<CommandOutput, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut all = vec![OsStr::new("apply").to_os_string()];
        all.extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self.run_kubectl(all).await
    }

    async fn run_kubectl_with_stdin<I, S>(
        &self,
        args: I,
        stdin: Option<&[u8]>,
    ) -> Result<CommandOutput, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<_> = args
            .into_iter()
            .map(|a| a.as_ref().to_os_string())
            .collect();
        let shown = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let mut cmd = self.kubectl_async();
        cmd.args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        let run = async {
            let mut child = cmd.spawn().map_err(|e| Error::io("starting kubectl", e))?;
            if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
                pipe.write_all(input)
                    .await
                    .map_err(|e| Error::io("writing kubectl's standard input", e))?;
                // Dropping the pipe closes it, so kubectl sees end of input.
            }
            child
                .wait_with_output()
                .await
                .map_err(|e| Error::io(format!("running kubectl {shown}"), e))
        };
        let out = tokio::time::timeout(KUBECTL_TIMEOUT, run)
            .await
            .map_err(|_| Error::KubectlTimeout {
                args: shown.clone(),
                timeout: KUBECTL_TIMEOUT,
            })??;
        let output = CommandOutput {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        tracing::debug!(args = %shown, status = %output.status, "kubectl finished");
        Ok(output)
    }
}
