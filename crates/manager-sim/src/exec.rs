//! Jobs run as external processes, the way a real worker starts a job's container: the
//! configured command is `exec`ed with the two reserved variables of the job-socket contract,
//! `NORSK_WORKER_WS_URL` (the instance's socket URL) and `NORSK_WORKER_TOKEN`, and is killed
//! when the worker stops the instance. A job author runs their own job (the TypeScript or Rust
//! example in `examples/job-socket/`) under the sim this way, through real handovers.
//!
//! Configured in the `jobSocket:` section:
//!
//! ```yaml
//! jobSocket:
//!   exec:
//!     - job: 'default.news-*/*'          # job id pattern, `*` matches any run
//!       command: [node, examples/job-socket/dist/job.js]
//!       env: {JOB_LOG_LEVEL: debug}      # optional, beside the two reserved names
//!       logDir: /tmp/jobs                # optional: <jobId>.<role>.log per process
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;

use job_socket::InstanceKey;
use serde::{Deserialize, Serialize};

use crate::behaviour::{MAX_PATTERN_BYTES, glob_match};

/// The reserved variable holding the instance's socket URL.
pub const ENV_URL: &str = "NORSK_WORKER_WS_URL";
/// The reserved variable holding the instance's token.
pub const ENV_TOKEN: &str = "NORSK_WORKER_TOKEN";
/// Most exec rules.
pub const MAX_EXEC_RULES: usize = 64;

/// Run the jobs matching `job` as this command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRule {
    /// Job id pattern (`*` matches any run of characters).
    pub job: String,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// More environment for the process (not the reserved names).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Where each process's stdout and stderr go (`<jobId>.<role>.log`, `/` as `_`); absent:
    /// discarded.
    #[serde(default)]
    pub log_dir: Option<PathBuf>,
}

impl ExecRule {
    /// Problems of rule `i`, each naming its field.
    pub fn problems(&self, i: usize) -> Vec<String> {
        let mut errs = Vec::new();
        if self.job.is_empty() || self.job.len() > MAX_PATTERN_BYTES {
            errs.push(format!(
                "jobSocket.exec[{i}].job: a pattern of 1-{MAX_PATTERN_BYTES} bytes"
            ));
        }
        if self.command.first().is_none_or(|c| c.is_empty()) {
            errs.push(format!(
                "jobSocket.exec[{i}].command: the program to run is missing"
            ));
        }
        for k in self.env.keys() {
            if k == ENV_URL || k == ENV_TOKEN {
                errs.push(format!(
                    "jobSocket.exec[{i}].env.{k}: reserved; the worker sets it per instance"
                ));
            } else if k.is_empty() || k.contains('=') || k.contains('\0') {
                errs.push(format!(
                    "jobSocket.exec[{i}].env: {k:?} is not an environment variable name"
                ));
            }
        }
        errs
    }
}

/// The running processes, one per job-socket instance.
#[derive(Debug, Default)]
pub struct ExecJobs {
    rules: Vec<ExecRule>,
    running: Mutex<HashMap<InstanceKey, tokio::process::Child>>,
}

impl ExecJobs {
    /// From the configured rules.
    pub fn new(rules: Vec<ExecRule>) -> Self {
        ExecJobs {
            rules,
            running: Mutex::new(HashMap::new()),
        }
    }

    /// The rule for `job_id`, if one matches (the first).
    pub fn rule_for(&self, job_id: &str) -> Option<&ExecRule> {
        self.rules.iter().find(|r| glob_match(&r.job, job_id))
    }

    /// Starts the instance's process (replacing one left for the same instance).
    pub fn spawn(
        &self,
        rule: &ExecRule,
        key: &InstanceKey,
        url: &str,
        token: &str,
    ) -> Result<(), String> {
        let Some((program, args)) = rule.command.split_first() else {
            return Err("no command".into());
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(&rule.env)
            .env(ENV_URL, url)
            .env(ENV_TOKEN, token)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        match &rule.log_dir {
            Some(dir) => {
                let name = format!("{}.{}.log", key.job_id, key.role).replace(['/', ':'], "_");
                let path = dir.join(name);
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| format!("opening {}: {e}", path.display()))?;
                let err = file.try_clone().map_err(|e| e.to_string())?;
                cmd.stdout(file).stderr(err);
            }
            None => {
                cmd.stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null());
            }
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {program}: {e}"))?;
        tracing::info!(job_id = %key.job_id, role = %key.role, pid = child.id(), %program, "job process started");
        let old = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), child);
        drop(old); // kill_on_drop
        Ok(())
    }

    /// Stops the instance's process, as a worker stops a job's container.
    pub fn stop(&self, key: &InstanceKey) {
        let child = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        if let Some(mut child) = child {
            tracing::info!(job_id = %key.job_id, role = %key.role, "job process stopped");
            let _ = child.start_kill();
        }
    }

    /// How many processes run.
    pub fn running(&self) -> usize {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(job: &str, command: &[&str]) -> ExecRule {
        ExecRule {
            job: job.into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::new(),
            log_dir: None,
        }
    }

    #[test]
    fn rules_match_by_pattern_first_wins() {
        let jobs = ExecJobs::new(vec![rule("a.*/*", &["one"]), rule("*", &["two"])]);
        assert_eq!(
            jobs.rule_for("a.news/0/enc").map(|r| &r.command[0][..]),
            Some("one")
        );
        assert_eq!(
            jobs.rule_for("b.x/0/y").map(|r| &r.command[0][..]),
            Some("two")
        );
    }

    #[test]
    fn bad_rules_are_named() {
        let mut r = rule("", &[]);
        r.env.insert(ENV_TOKEN.into(), "x".into());
        r.env.insert("A=B".into(), "x".into());
        let errs = r.problems(2);
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert!(errs[0].starts_with("jobSocket.exec[2].job"));
        assert!(errs.iter().any(|e| e.contains("reserved")));
    }

    #[tokio::test]
    async fn a_process_gets_the_reserved_variables_and_is_stopped() {
        let dir = tempfile::tempdir().expect("dir");
        let mut r = rule(
            "*",
            &[
                "sh",
                "-c",
                "echo \"$NORSK_WORKER_WS_URL $NORSK_WORKER_TOKEN $EXTRA\"; sleep 30",
            ],
        );
        r.env.insert("EXTRA".into(), "more".into());
        r.log_dir = Some(dir.path().to_owned());
        let jobs = ExecJobs::new(vec![r.clone()]);
        let key = InstanceKey::new("ns.b/0/enc", "normal");
        jobs.spawn(&r, &key, "ws://127.0.0.1:1/instances/x/normal", "tok")
            .expect("spawns");
        assert_eq!(jobs.running(), 1);
        let log = dir.path().join("ns.b_0_enc.normal.log");
        let mut text = String::new();
        for _ in 0..100 {
            text = std::fs::read_to_string(&log).unwrap_or_default();
            if !text.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(text.trim(), "ws://127.0.0.1:1/instances/x/normal tok more");
        jobs.stop(&key);
        assert_eq!(jobs.running(), 0);
    }
}
