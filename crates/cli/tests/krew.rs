//! The krew manifest (deploy/plugin/automanager.krew.yaml, which scripts/dist-plugin.sh fills
//! in) is one krew accepts: its short description within krew's 50 characters, the binary and
//! the completion helper among the files it installs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

fn manifest() -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/plugin/automanager.krew.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_short_description_fits_krews_limit() {
    let m = manifest();
    let short = m["spec"]["shortDescription"]
        .as_str()
        .expect("spec.shortDescription");
    assert!(!short.trim().is_empty());
    assert!(
        short.chars().count() <= 50,
        "{} characters: {short:?}",
        short.chars().count()
    );
    assert!(
        m["spec"]["description"]
            .as_str()
            .is_some_and(|d| d.len() > short.len())
    );
}

#[test]
fn it_is_a_krew_plugin_installing_the_binary_and_its_completion_helper() {
    let m = manifest();
    assert_eq!(
        m["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(m["kind"], "Plugin");
    // kubectl runs a plugin named `automanager` as kubectl-automanager.
    assert_eq!(m["metadata"]["name"], "automanager");
    let platforms = m["spec"]["platforms"].as_array().expect("platforms");
    assert!(!platforms.is_empty());
    for p in platforms {
        assert_eq!(p["bin"], "kubectl-automanager");
        let files: Vec<&str> = p["files"]
            .as_array()
            .expect("files")
            .iter()
            .filter_map(|f| f["from"].as_str())
            .collect();
        for want in [
            "/kubectl-automanager",
            "/kubectl_complete-automanager",
            "/LICENSE",
        ] {
            assert!(files.iter().any(|f| f.ends_with(want)), "{want}: {files:?}");
        }
        assert_eq!(
            p["sha256"], "__SHA256__",
            "filled in by scripts/dist-plugin.sh"
        );
        let uri = p["uri"].as_str().expect("uri");
        assert!(
            uri.ends_with("-linux-amd64.tar.gz") && uri.contains("v__VERSION__"),
            "{uri}"
        );
    }
    // The helper it installs is the one in this directory.
    let helper = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/plugin/kubectl_complete-automanager");
    assert!(helper.exists(), "{}", helper.display());
}
