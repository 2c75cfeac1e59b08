//! The operator's OCI image as `make image` writes it (AUTOMANAGER_IMAGE, set by
//! `make test-install`): unpacked with tar and gzip, every blob checked against its digest, the
//! config's user and entrypoint, no shell, statically linked binaries that run, and the
//! Dockerfile saying the same.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use automanager_e2e::repo_root;
use serde_json::Value;

const USER: &str = "65532:65532";
const ENTRYPOINT: &str = "/automanager-operator";

fn image() -> PathBuf {
    let path = std::env::var_os("AUTOMANAGER_IMAGE").map(PathBuf::from).expect(
        "AUTOMANAGER_IMAGE is not set: run `make test-install`, or `make image` and point it at dist/*.oci.tar",
    );
    assert!(path.is_file(), "{} does not exist", path.display());
    path
}

fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The blob of `digest`, checked against its sha256 and size.
fn blob(layout: &Path, descriptor: &Value) -> PathBuf {
    let digest = descriptor["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let path = layout.join("blobs/sha256").join(hex);
    let sum = sh(Command::new("sha256sum").arg(&path));
    assert_eq!(
        sum.split_whitespace().next(),
        Some(hex),
        "{digest} does not match its content"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        descriptor["size"].as_u64().unwrap(),
        "{digest}: size"
    );
    path
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Whether an ELF file names a program interpreter (PT_INTERP): a dynamically linked program.
fn has_interpreter(path: &Path) -> bool {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..4], b"\x7fELF", "{} is not ELF", path.display());
    assert_eq!(b[4], 2, "not a 64-bit ELF");
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let phoff = u64::from_le_bytes(b[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| u32_at(phoff + i * phentsize) == 3)
}

#[test]
fn the_image_is_non_root_shell_free_static_and_runs_the_operator() {
    let tar = image();
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    sh(Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&layout));

    assert_eq!(
        json(&layout.join("oci-layout"))["imageLayoutVersion"],
        "1.0.0"
    );
    let index = json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index:#}");
    let m = &manifests[0];
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        m["annotations"]["org.opencontainers.image.ref.name"],
        version
    );
    assert!(
        m["annotations"]["io.containerd.image.name"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/automanager-operator:{version}")),
        "{m:#}"
    );
    // The digest `make image` printed is the manifest's.
    let printed = std::fs::read_to_string(format!("{}.digest", tar.display())).unwrap();
    assert_eq!(printed.trim(), m["digest"].as_str().unwrap());

    let manifest = json(&blob(&layout, m));
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    let config = json(&blob(&layout, &manifest["config"]));
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(config["config"]["User"], USER, "{config:#}");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!([ENTRYPOINT])
    );
    assert!(config["config"]["Cmd"].is_null(), "{config:#}");
    assert_eq!(
        config["config"]["Labels"]["org.opencontainers.image.version"],
        version
    );

    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let layer = blob(&layout, &layers[0]);
    // The layer's diff id (the uncompressed tar's digest) is what the config records.
    let unpacked = dir.path().join("layer.tar");
    let raw = Command::new("gzip")
        .arg("-dc")
        .arg(&layer)
        .output()
        .unwrap();
    assert!(
        raw.status.success(),
        "gzip: {}",
        String::from_utf8_lossy(&raw.stderr)
    );
    std::fs::write(&unpacked, &raw.stdout).unwrap();
    let diff = sh(Command::new("sha256sum").arg(&unpacked));
    assert_eq!(
        config["rootfs"]["diff_ids"][0].as_str().unwrap(),
        format!("sha256:{}", diff.split_whitespace().next().unwrap())
    );

    // Exactly the two binaries, owned by root, executable by anyone, and nothing else: no
    // shell, no libc.
    let listing = sh(Command::new("tar")
        .args(["--numeric-owner", "-tvf"])
        .arg(&unpacked));
    let entries: Vec<Vec<&str>> = listing
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let names: Vec<&str> = entries.iter().map(|e| *e.last().unwrap()).collect();
    assert_eq!(names, ["automanager-operator", "manager-sim"], "{listing}");
    for e in &entries {
        assert_eq!(e[0], "-rwxr-xr-x", "{listing}");
        assert_eq!(e[1], "0/0", "{listing}");
    }
    let root = dir.path().join("rootfs");
    std::fs::create_dir_all(&root).unwrap();
    sh(Command::new("tar")
        .arg("-xf")
        .arg(&unpacked)
        .arg("-C")
        .arg(&root));
    for bin in ["automanager-operator", "manager-sim"] {
        assert!(
            !has_interpreter(&root.join(bin)),
            "{bin} is dynamically linked"
        );
    }
    // The entrypoint runs, alone, in an empty environment.
    let out = Command::new(root.join("automanager-operator"))
        .arg("--version")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("automanager-operator {version}")
    );
    let out = Command::new(root.join("manager-sim"))
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn the_dockerfile_builds_the_same_image() {
    let text = std::fs::read_to_string(repo_root().join("Dockerfile")).unwrap();
    let final_stage = text
        .rsplit_once("\nFROM ")
        .map(|(_, s)| s)
        .expect("a multi-stage Dockerfile");
    assert!(
        final_stage.starts_with("scratch"),
        "the final stage is not FROM scratch"
    );
    let lines: Vec<&str> = final_stage.lines().map(str::trim).collect();
    assert!(
        lines.contains(&format!("USER {USER}").as_str()),
        "{final_stage}"
    );
    assert!(
        lines.contains(&format!("ENTRYPOINT [\"{ENTRYPOINT}\"]").as_str()),
        "{final_stage}"
    );
    let mut copied: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("COPY "))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    copied.sort_unstable();
    assert_eq!(copied, ["/automanager-operator", "/manager-sim"]);
    // And make image puts the same user, entrypoint and files in.
    let mk = std::fs::read_to_string(repo_root().join("mk/install.mk")).unwrap();
    assert!(mk.contains(&format!("--user {USER}")));
    assert!(mk.contains(&format!("--entrypoint {ENTRYPOINT}")));
    for f in copied {
        assert!(
            mk.contains(&format!("={f}")),
            "make image does not put {f} in"
        );
    }
}
