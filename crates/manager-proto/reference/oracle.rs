//! Finding the published-API oracle (this directory, run under Node) from a test of any crate
//! under `crates/`; each test includes this file with `#[path]`.
//!
//! Without `node`, or without registry access for `npm ci`, a test says why and passes, except
//! in CI (`CI` set), where that is a failure.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// This directory, found from the package directory cargo gives the running test (not the
/// path compiled in: an executable built in another checkout that shares the target dir would
/// read that checkout's files).
pub fn reference_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../manager-proto/reference")
}

/// Why the oracle cannot run here, if it cannot (installing it with `npm ci` first when its
/// `node_modules` is missing); panics instead in CI.
pub fn unavailable() -> Option<String> {
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let installed = reference_dir()
        .join("node_modules/@norskvideo/norsk-api/lib/manager_pb.js")
        .exists()
        && reference_dir().join("node_modules/@grpc/grpc-js").exists();
    let why = if !node {
        Some("`node` is not on PATH".to_owned())
    } else if installed {
        None
    } else {
        let ok = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(reference_dir())
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        (!ok).then(|| {
            "`npm ci` in crates/manager-proto/reference failed (no registry access?)".to_owned()
        })
    };
    if let Some(why) = &why {
        assert!(std::env::var_os("CI").is_none(), "in CI: {why}");
        eprintln!("skipped: {why}");
    }
    why
}
