//! Records what `automanager_build_info` reports beside the version: the source revision and
//! the compiler.
//!
//! - revision: `AUTOMANAGER_REVISION` when the build sets it (release and image builds), else
//!   `git rev-parse --short=12 HEAD` of the checkout, else `unknown` (a source tarball);
//! - rustc: `rustc --version` of the compiler cargo runs (`RUSTC`).

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=AUTOMANAGER_REVISION");
    let revision = std::env::var("AUTOMANAGER_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(git_revision)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=AUTOMANAGER_REVISION={revision}");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=AUTOMANAGER_RUSTC={version}");
}

/// HEAD's short id, with the files that move when HEAD does watched (only those that exist: a
/// missing path would make cargo run this script on every build).
fn git_revision() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD", "--git-dir"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8(out.stdout).ok()?;
    let mut lines = text.lines();
    let revision = lines.next()?.trim().to_owned();
    let git_dir = Path::new(lines.next()?.trim()).to_owned();
    let head = git_dir.join("HEAD");
    if head.exists() {
        println!("cargo:rerun-if-changed={}", head.display());
        if let Ok(text) = std::fs::read_to_string(&head)
            && let Some(reference) = text.trim().strip_prefix("ref: ")
        {
            let file = git_dir.join(reference);
            if file.exists() {
                println!("cargo:rerun-if-changed={}", file.display());
            }
        }
        let packed = git_dir.join("packed-refs");
        if packed.exists() {
            println!("cargo:rerun-if-changed={}", packed.display());
        }
    }
    Some(revision)
}
