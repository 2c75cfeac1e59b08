//! The plugin depends on `automanager-api` and pure crates only: not the operator, not Manager's
//! client or wire types (tonic, prost, axum), which the mapping crate keeps behind its `wire`
//! feature.

fn manifest(path: &str) -> String {
    let p = package_dir().join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn dependencies(toml: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps && !line.is_empty() && !line.starts_with('#') {
            out.push(line.to_owned());
        }
    }
    out
}

#[test]
fn the_plugin_depends_on_the_api_and_pure_crates_only() {
    let deps = dependencies(&manifest("Cargo.toml"));
    for forbidden in [
        "automanager-operator",
        "automanager-policy",
        "manager-client",
        "manager-proto",
        "tonic",
        "prost",
        "axum",
        "prometheus-client",
    ] {
        assert!(
            !deps.iter().any(|d| d.starts_with(&format!("{forbidden} "))),
            "the plugin depends on {forbidden}"
        );
    }
    assert!(
        deps.iter()
            .any(|d| d
                == "automanager-mapping = { path = \"../mapping\", default-features = false }"),
        "{deps:#?}"
    );
    let mapping = manifest("../mapping/Cargo.toml");
    // Manager's wire types (and prost, which encodes a job template) only with `wire`.
    assert!(mapping.contains("manager-proto = { path = \"../manager-proto\", optional = true }"));
    assert!(mapping.contains("prost = { workspace = true, optional = true }"));
    assert!(mapping.contains("wire = [\"dep:manager-proto\", \"dep:prost\"]"));
}

/// kube's rustls client picks the process's crypto provider from rustls's features, and
/// panics when none is enabled: the plugin must enable one itself now that nothing else pulls
/// one in.
#[test]
fn a_client_for_an_https_apiserver_can_be_built() {
    let url: http::Uri = "https://127.0.0.1:6443".parse().expect("a URL");
    let config = kube::Config::new(url);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        kube::Client::try_from(config).expect("a client");
    });
}

/// This package's directory, as cargo tells the running test: a test executable cargo finds
/// fresh may have been built in another checkout that shares the target dir, and the path
/// compiled into it would read that checkout's files.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
