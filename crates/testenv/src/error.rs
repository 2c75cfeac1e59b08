//! The one error type of the crate: every message says what to do next.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// Everything that can go wrong while starting, using or stopping a [`crate::TestEnv`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bin dir does not hold all of etcd, kube-apiserver and kubectl.
    #[error(
        "control-plane binaries not found in {dir}: missing {missing}; run `make control-plane` \
         (builds etcd, kube-apiserver and kubectl {release} into the cache, ~4 min cold) \
         or point {env} at a directory that has them",
        dir = dir.display(),
        release = crate::K8S_RELEASE,
        env = crate::BIN_DIR_ENV
    )]
    BinariesMissing {
        /// The directory that was searched.
        dir: PathBuf,
        /// Comma-separated names of the missing binaries.
        missing: String,
    },

    /// Neither the override variable nor any variable that locates the cache is set.
    #[error(
        "cannot locate the control-plane binaries: none of {env}, AUTOMANAGER_CACHE, XDG_CACHE_HOME \
         or HOME is set; run `make control-plane` and set {env} to the directory it prints",
        env = crate::BIN_DIR_ENV
    )]
    NoBinDir,

    /// An extra apiserver flag was malformed or tried to change something testenv manages.
    #[error("invalid extra kube-apiserver flag {flag:?}: {reason}")]
    InvalidFlag {
        /// The flag as given.
        flag: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// A file-system or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What testenv was doing.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Certificate or key generation failed.
    #[error("generating certificates: {0}")]
    Certificates(#[from] rcgen::Error),

    /// A control-plane process exited while testenv was waiting for it to become ready.
    #[error("{process} exited during start-up ({status}); last lines of its log:\n{log_tail}")]
    ExitedEarly {
        /// `etcd` or `kube-apiserver`.
        process: &'static str,
        /// Its exit status.
        status: ExitStatus,
        /// The last lines of its log.
        log_tail: String,
    },

    /// A control-plane process died after start-up.
    #[error("{process} (pid {pid}) is no longer running ({status})")]
    ProcessDied {
        /// `etcd` or `kube-apiserver`.
        process: &'static str,
        /// Its pid.
        pid: u32,
        /// Its exit status.
        status: ExitStatus,
    },

    /// `/readyz` did not answer `ok` in time.
    #[error(
        "kube-apiserver did not become ready within {timeout:?} (last answer: {last_error})\n\
         --- last lines of the kube-apiserver log ---\n{apiserver_log}\n\
         --- last lines of the etcd log ---\n{etcd_log}"
    )]
    NotReady {
        /// The start-up timeout that passed.
        timeout: Duration,
        /// The last error or non-`ok` answer seen while polling.
        last_error: String,
        /// Tail of the apiserver log.
        apiserver_log: String,
        /// Tail of the etcd log.
        etcd_log: String,
    },

    /// The kubeconfig testenv wrote could not be turned into a client.
    #[error("building a kube client from the generated kubeconfig: {0}")]
    Kubeconfig(String),

    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),

    /// A kubectl invocation did not finish in time.
    #[error("kubectl {args} did not finish within {timeout:?}")]
    KubectlTimeout {
        /// The arguments, space-joined.
        args: String,
        /// The time allowed.
        timeout: Duration,
    },

    /// Some CRDs were not Established (and served) within the timeout.
    #[error("CRDs not established within {timeout:?}: {}", pending.join(", "))]
    CrdsNotEstablished {
        /// Names of the CRDs still pending.
        pending: Vec<String>,
        /// The time allowed.
        timeout: Duration,
    },

    /// A state file written by `testenv up` could not be read.
    #[error("state file {path}: {reason}", path = path.display())]
    BadState {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// True when a retry with fresh ports may succeed (someone took a port we picked).
    pub(crate) fn is_port_clash(&self) -> bool {
        match self {
            Error::ExitedEarly { log_tail, .. } => crate::logs::mentions_port_clash(log_tail),
            Error::NotReady {
                apiserver_log,
                etcd_log,
                ..
            } => {
                crate::logs::mentions_port_clash(apiserver_log)
                    || crate::logs::mentions_port_clash(etcd_log)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    fn exited(log_tail: &str) -> Error {
        Error::ExitedEarly {
            process: "etcd",
            status: ExitStatus::from_raw(256),
            log_tail: log_tail.into(),
        }
    }

    #[test]
    fn a_start_that_lost_a_port_is_retried_and_other_failures_are_not() {
        assert!(exited("listen tcp 127.0.0.1:2379: bind: address already in use").is_port_clash());
        assert!(!exited("unknown flag: --nope").is_port_clash());
        let not_ready = |apiserver_log: &str, etcd_log: &str| Error::NotReady {
            timeout: Duration::from_secs(1),
            last_error: String::new(),
            apiserver_log: apiserver_log.into(),
            etcd_log: etcd_log.into(),
        };
        assert!(not_ready("", "bind: address already in use").is_port_clash());
        assert!(!not_ready("slow", "slow").is_port_clash());
        assert!(!Error::NoBinDir.is_port_clash());
    }

    #[test]
    fn an_early_exit_quotes_the_log() {
        let msg = exited("line one\nline two").to_string();
        assert!(msg.starts_with("etcd exited during start-up"), "{msg}");
        assert!(msg.ends_with("line one\nline two"), "{msg}");
    }
}
