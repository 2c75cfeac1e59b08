//! The state file `testenv up` writes so `testenv env` and `testenv down` can find it,
//! and the shell lines that point a shell at a running control plane.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;

/// Largest state file accepted; a real one is a few hundred bytes.
const MAX_STATE_BYTES: u64 = 64 * 1024;

/// What a running `testenv up` publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct State {
    /// Pid of the `testenv up` process that owns the control plane.
    pub pid: u32,
    /// `https://127.0.0.1:PORT`.
    pub server_url: String,
    /// The kubeconfig to use.
    pub kubeconfig: PathBuf,
    /// Directory holding etcd, kube-apiserver and kubectl.
    pub bin_dir: PathBuf,
    /// The control plane's own directory (removed when it stops).
    pub data_dir: PathBuf,
    /// Pid of etcd.
    pub etcd_pid: u32,
    /// Pid of kube-apiserver.
    pub apiserver_pid: u32,
}

impl State {
    /// Parses a state file's text.
    pub fn parse(path: &Path, text: &str) -> Result<State, Error> {
        let state: State = serde_json::from_str(text).map_err(|e| Error::BadState {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        if state.pid == 0 || state.etcd_pid == 0 || state.apiserver_pid == 0 {
            return Err(Error::BadState {
                path: path.to_path_buf(),
                reason: "pids must be non-zero".into(),
            });
        }
        Ok(state)
    }

    /// Reads the state file at `path`; `Ok(None)` when there is none.
    pub fn read(path: &Path) -> Result<Option<State>, Error> {
        let len = match std::fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
        };
        if len > MAX_STATE_BYTES {
            return Err(Error::BadState {
                path: path.to_path_buf(),
                reason: format!("{len} bytes is too large for a state file"),
            });
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        State::parse(path, &text).map(Some)
    }

    /// Writes the state file atomically (a reader never sees half of it).
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::BadState {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text)
            .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }
}

/// Quotes `s` for a POSIX shell: bare when it is plainly safe, else single-quoted.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '/' | '.' | '_' | '-' | '+' | ',' | ':' | '@' | '%')
        });
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The lines a shell `eval`s to use a control plane: `KUBECONFIG`, and the built kubectl
/// first on `PATH` (the machine's own kubectl may be an older release).
pub fn export_lines(kubeconfig: &Path, bin_dir: &Path) -> String {
    format!(
        "export KUBECONFIG={}\nexport PATH={}:\"$PATH\"\n",
        shell_quote(&kubeconfig.to_string_lossy()),
        shell_quote(&bin_dir.to_string_lossy()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> State {
        State {
            pid: 10,
            server_url: "https://127.0.0.1:1234".into(),
            kubeconfig: "/d/kubeconfig".into(),
            bin_dir: "/b".into(),
            data_dir: "/d/testenv-1".into(),
            etcd_pid: 11,
            apiserver_pid: 12,
        }
    }

    #[test]
    fn a_written_state_reads_back_equal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        sample().write(&path).unwrap();
        assert_eq!(State::read(&path).unwrap(), Some(sample()));
    }

    #[test]
    fn no_state_file_means_nothing_running() {
        assert_eq!(
            State::read(Path::new("/nonexistent/state.json")).unwrap(),
            None
        );
    }

    #[test]
    fn malformed_state_is_an_error_naming_the_file() {
        for text in ["", "{", "[]", r#"{"pid": -1}"#, r#"{"pid": "x"}"#] {
            let err = State::parse(Path::new("/s.json"), text)
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("state file /s.json:"), "{err}");
        }
    }

    #[test]
    fn unknown_fields_and_zero_pids_are_rejected() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["extra"] = 1.into();
        assert!(State::parse(Path::new("/s"), &v.to_string()).is_err());
        let mut zero = sample();
        zero.etcd_pid = 0;
        let text = serde_json::to_string(&zero).unwrap();
        assert!(State::parse(Path::new("/s"), &text).is_err());
    }

    #[test]
    fn an_oversized_state_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, " ".repeat(100_000)).unwrap();
        assert!(matches!(State::read(&path), Err(Error::BadState { .. })));
    }

    #[test]
    fn plain_paths_are_not_quoted_and_others_are() {
        assert_eq!(shell_quote("/a/b-c_d.e"), "/a/b-c_d.e");
        assert_eq!(shell_quote("/a b"), "'/a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
    }

    #[test]
    fn export_lines_set_kubeconfig_and_put_the_bin_dir_first() {
        let text = export_lines(Path::new("/d/kubeconfig"), Path::new("/b in"));
        assert_eq!(
            text,
            "export KUBECONFIG=/d/kubeconfig\nexport PATH='/b in':\"$PATH\"\n"
        );
    }

    proptest! {
        #[test]
        fn parsing_arbitrary_text_never_panics(text in ".{0,200}") {
            let _ = State::parse(Path::new("/s"), &text);
        }

        #[test]
        fn quoted_text_holds_no_unquoted_specials(s in ".{0,40}") {
            let q = shell_quote(&s);
            // Either bare and made of safe characters, or one single-quoted word whose only
            // embedded quotes are the '\'' escape.
            if !q.starts_with('\'') {
                prop_assert!(!q.is_empty());
                prop_assert!(q.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%".contains(c)));
            } else {
                prop_assert!(q.ends_with('\''));
                let inner = &q[1..q.len() - 1];
                prop_assert_eq!(inner.replace(r"'\''", ""), s.replace('\'', ""));
            }
        }
    }
}
