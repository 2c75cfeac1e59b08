//! Where the Go-built control-plane binaries live.
//!
//! `tools/control-plane/build.sh` caches them outside the checkout, keyed by release, at
//! `${AUTOMANAGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/automanager}/k8s-<release>/bin`;
//! `AUTOMANAGER_K8S_BIN` overrides that. The lookup here mirrors the script exactly.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::Error;

/// The Kubernetes release the binaries are built from (and `k8s-openapi`'s feature matches).
pub const K8S_RELEASE: &str = "v1.35.4";
/// Environment variable naming a directory that holds `etcd`, `kube-apiserver` and `kubectl`.
pub const BIN_DIR_ENV: &str = "AUTOMANAGER_K8S_BIN";
/// The three binaries a bin dir must hold.
pub const BINARIES: [&str; 3] = ["etcd", "kube-apiserver", "kubectl"];

/// The cache bin dir `build.sh` writes to, from the values of `AUTOMANAGER_CACHE`,
/// `XDG_CACHE_HOME` and `HOME`; empty values count as unset, as `${VAR:-default}` does.
pub fn cache_bin_dir(
    automanager_cache: Option<&OsStr>,
    xdg_cache_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Option<PathBuf> {
    let set = |v: Option<&OsStr>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    let cache = set(automanager_cache)
        .or_else(|| set(xdg_cache_home).map(|x| x.join("automanager")))
        .or_else(|| set(home).map(|h| h.join(".cache").join("automanager")))?;
    Some(cache.join(format!("k8s-{K8S_RELEASE}")).join("bin"))
}

/// The bin dir to use when the caller gave none: `AUTOMANAGER_K8S_BIN`, else the cache.
pub fn default_bin_dir() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    cache_bin_dir(
        std::env::var_os("AUTOMANAGER_CACHE").as_deref(),
        std::env::var_os("XDG_CACHE_HOME").as_deref(),
        std::env::var_os("HOME").as_deref(),
    )
    .ok_or(Error::NoBinDir)
}

/// Checks that `dir` holds all three binaries as executable files.
pub fn check_bin_dir(dir: &Path) -> Result<(), Error> {
    let missing: Vec<&str> = BINARIES
        .iter()
        .copied()
        .filter(|name| !is_executable(&dir.join(name)))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::BinariesMissing {
            dir: dir.to_path_buf(),
            missing: missing.join(", "),
        })
    }
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<&OsStr> {
        Some(OsStr::new(s))
    }

    #[test]
    fn automanager_cache_wins_over_xdg_and_home() {
        assert_eq!(
            cache_bin_dir(os("/c"), os("/x"), os("/h")),
            Some(PathBuf::from("/c/k8s-v1.35.4/bin"))
        );
    }

    #[test]
    fn xdg_cache_home_wins_over_home() {
        assert_eq!(
            cache_bin_dir(None, os("/x"), os("/h")),
            Some(PathBuf::from("/x/automanager/k8s-v1.35.4/bin"))
        );
    }

    #[test]
    fn home_is_the_last_resort() {
        assert_eq!(
            cache_bin_dir(None, None, os("/h")),
            Some(PathBuf::from("/h/.cache/automanager/k8s-v1.35.4/bin"))
        );
    }

    #[test]
    fn empty_variables_count_as_unset() {
        assert_eq!(
            cache_bin_dir(os(""), os(""), os("/h")),
            Some(PathBuf::from("/h/.cache/automanager/k8s-v1.35.4/bin"))
        );
        assert_eq!(cache_bin_dir(os(""), None, os("")), None);
    }

    #[test]
    fn missing_binaries_are_named_with_the_make_target_to_run() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("etcd"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            dir.path().join("etcd"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        // Present but not executable counts as missing.
        std::fs::write(dir.path().join("kubectl"), "").unwrap();
        let err = check_bin_dir(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, Error::BinariesMissing { ref missing, .. } if missing == "kube-apiserver, kubectl")
        );
        assert!(msg.contains("run `make control-plane`"), "{msg}");
        assert!(msg.contains("AUTOMANAGER_K8S_BIN"), "{msg}");
    }

    #[test]
    fn a_complete_bin_dir_passes() {
        let dir = tempfile::tempdir().unwrap();
        for name in BINARIES {
            std::fs::write(dir.path().join(name), "").unwrap();
            std::fs::set_permissions(
                dir.path().join(name),
                std::fs::Permissions::from_mode(0o755),
            )
            .unwrap();
        }
        assert!(check_bin_dir(dir.path()).is_ok());
    }
}
