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
    assert_eq!(
        m["annotations"]["io.containerd.image.name"],
        format!("automanager-operator:{version}"),
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

    // Exactly the two binaries, owned by root, executable by anyone, and their SBOMs, readable
    // by anyone: no shell, no libc.
    let listing = sh(Command::new("tar")
        .args(["--numeric-owner", "-tvf"])
        .arg(&unpacked));
    let entries: Vec<Vec<&str>> = listing
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let names: Vec<&str> = entries.iter().map(|e| *e.last().unwrap()).collect();
    assert_eq!(names, IMAGE_FILES, "{listing}");
    for e in &entries {
        let name = *e.last().unwrap();
        let mode = if name.ends_with('/') {
            "drwxr-xr-x"
        } else if name.starts_with("sbom/") {
            "-rw-r--r--"
        } else {
            "-rwxr-xr-x"
        };
        assert_eq!(e[0], mode, "{listing}");
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

    // Each SBOM is a CycloneDX document of its binary, every component a crate of Cargo.lock
    // at its locked version.
    let lock = locked_crates();
    for (bin, sbom) in [
        ("automanager-operator", "sbom/automanager-operator.cdx.json"),
        ("manager-sim", "sbom/manager-sim.cdx.json"),
    ] {
        let doc = json(&root.join(sbom));
        assert_eq!(doc["bomFormat"], "CycloneDX", "{sbom}");
        assert_eq!(doc["specVersion"], "1.5", "{sbom}");
        assert_eq!(doc["metadata"]["component"]["name"], bin, "{sbom}");
        let tools = doc["metadata"]["tools"].to_string();
        assert!(tools.contains("cargo-cyclonedx"), "{sbom}: made by {tools}");
        let components = doc["components"].as_array().expect("components");
        let mut seen = std::collections::BTreeSet::new();
        for c in components {
            let purl = c["purl"].as_str().unwrap_or_default();
            let Some(rest) = purl.strip_prefix("pkg:cargo/") else {
                continue;
            };
            let (name, version) = rest
                .split(['?', '#'])
                .next()
                .unwrap()
                .split_once('@')
                .unwrap_or_else(|| panic!("{sbom}: a purl without a version: {purl}"));
            assert!(
                lock.contains(&(name.to_owned(), version.to_owned())),
                "{sbom}: {name} {version} is not in Cargo.lock"
            );
            seen.insert(name.to_owned());
        }
        for wanted in ["tokio", "tonic", "prost"] {
            assert!(seen.contains(wanted), "{sbom} does not list {wanted}");
        }
        if bin == "automanager-operator" {
            for wanted in ["kube-client", "k8s-openapi", "tikv-jemallocator"] {
                assert!(seen.contains(wanted), "{sbom} does not list {wanted}");
            }
        }
    }
}

/// What `make image` puts in the image, as `tar -tv` lists its layer.
const IMAGE_FILES: [&str; 5] = [
    "automanager-operator",
    "manager-sim",
    "sbom/",
    "sbom/automanager-operator.cdx.json",
    "sbom/manager-sim.cdx.json",
];

/// Every (name, version) of Cargo.lock.
fn locked_crates() -> std::collections::BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(repo_root().join("Cargo.lock")).unwrap();
    let mut out = std::collections::BTreeSet::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_owned());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            out.insert((n, v.trim_matches('"').to_owned()));
        }
    }
    out
}

/// The image's config, from the archive.
fn image_config(tar: &Path, dir: &Path) -> Value {
    let layout = dir.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    sh(Command::new("tar")
        .arg("-xf")
        .arg(tar)
        .arg("-C")
        .arg(&layout));
    let index = json(&layout.join("index.json"));
    let manifest = json(&blob(&layout, &index["manifests"][0]));
    json(&blob(&layout, &manifest["config"]))
}

/// The Dockerfile gives the same image config as `make image`: BuildKit's own converter
/// (`tools/dockerfile-config`, dockerfile2llb) computes the Dockerfile's final stage without
/// building it, with the build arguments `make image` used, and its user, entrypoint, command,
/// labels, environment, platform and files must be those of the archive.
#[test]
fn the_dockerfile_builds_the_same_image() {
    let tar = image();
    let dir = tempfile::tempdir().unwrap();
    let config = image_config(&tar, dir.path());
    let c = &config["config"];
    let revision = c["Labels"]["org.opencontainers.image.revision"]
        .as_str()
        .unwrap()
        .to_owned();
    let tool = automanager_e2e::install::tool("dockerfile-config").unwrap();
    let out = sh(Command::new(tool)
        .arg("--build-arg")
        .arg(format!("VERSION={}", env!("CARGO_PKG_VERSION")))
        .arg("--build-arg")
        .arg(format!("REVISION={revision}"))
        .arg(repo_root().join("Dockerfile")));
    let docker: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(docker["user"], c["User"], "user");
    assert_eq!(docker["user"], USER);
    assert_eq!(docker["entrypoint"], c["Entrypoint"], "entrypoint");
    assert_eq!(docker["entrypoint"], serde_json::json!([ENTRYPOINT]));
    let no_cmd = |v: &Value| v.is_null() || v.as_array().is_some_and(Vec::is_empty);
    assert!(no_cmd(&docker["cmd"]) && no_cmd(&c["Cmd"]), "{docker:#}");
    assert_eq!(docker["labels"], c["Labels"], "labels");
    let env = |v: &Value| v.as_array().cloned().unwrap_or_default();
    assert_eq!(env(&docker["env"]), env(&c["Env"]), "environment");
    assert_eq!(docker["os"], config["os"]);
    assert_eq!(docker["architecture"], config["architecture"]);
    let files: Vec<&str> = IMAGE_FILES
        .iter()
        .filter(|f| !f.ends_with('/'))
        .copied()
        .collect();
    let copies: Vec<String> = docker["copies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().trim_start_matches('/').to_owned())
        .collect();
    assert_eq!(
        copies, files,
        "the Dockerfile's final stage copies other files"
    );
    // And the SBOMs are made by the same script, at the same version.
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).unwrap();
    let script = std::fs::read_to_string(repo_root().join("tools/sbom.sh")).unwrap();
    let pinned = script
        .lines()
        .find_map(|l| l.strip_prefix("version="))
        .expect("tools/sbom.sh pins a version");
    assert!(dockerfile.contains(&format!("--version {pinned} cargo-cyclonedx")));
    assert!(dockerfile.contains("RUN tools/sbom.sh /sbom"));
}
