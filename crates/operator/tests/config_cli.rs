//! `automanager-operator config ...` as a person (or a Helm chart's CI) runs it.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_automanager-operator"))
        .args(args)
        // The operator's environment variables would be applied on top of the file.
        .env_remove("AUTOMANAGER_MANAGER_URL")
        .env_remove("AUTOMANAGER_CONFIG")
        .output()
        .unwrap_or_else(|e| panic!("running the operator binary: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn check_accepts_the_demo_settings() {
    let demo = package_dir().join("../../config/demo-operator.yaml");
    let out = run(&["config", "check", &demo.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).ends_with(": valid\n"));
}

#[test]
fn check_lists_every_problem_and_exits_2() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "manager: { url: \"https://h:1\", tokenFile: /nonexistent/token, tls: { caFile: /nonexistent/ca } }\npendingWindw: 60\nbands: { gold: { restartClearAfter: 0 } }\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let path = file.to_string_lossy().into_owned();
    let out = run(&["config", "check", &path]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    for line in [
        "pendingWindw: unknown key",
        "did you mean `pendingWindow`?",
        "bands.gold.restartClearAfter: must be between 1s and 86400s (got 0s)",
        "manager.tokenFile: cannot read /nonexistent/token",
        "manager.tls.caFile: cannot read /nonexistent/ca",
    ] {
        assert!(err.contains(line), "{line} missing from:\n{err}");
    }
    // Without the file checks only the settings' own problems remain; a flag still applies.
    let out = run(&[
        "config",
        "check",
        &path,
        "--no-file-checks",
        "--pending-window",
        "soon",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(!err.contains("/nonexistent/"), "{err}");
    assert!(
        err.contains("pendingWindow: must be a duration")
            && err.contains("(set by --pending-window / AUTOMANAGER_PENDING_WINDOW)"),
        "{err}"
    );
    let out = run(&["config", "check", "/nonexistent/settings.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read the settings file"));
}

#[test]
fn schema_prints_the_json_schema() {
    let out = run(&["config", "schema"]);
    assert_eq!(out.status.code(), Some(0));
    let schema: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON: {e}"));
    assert_eq!(
        schema.pointer(
            "/properties/bands/properties/gold/properties/restartClearAfter/x-duration/min"
        ),
        Some(&serde_json::json!("1s"))
    );
}

#[test]
fn docs_prints_or_rewrites_the_reference() {
    let out = run(&["config", "docs"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout),
        automanager_operator::config::reference::markdown()
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let page = dir.path().join("page.md");
    let (begin, end) = (
        automanager_operator::config::reference::BEGIN,
        automanager_operator::config::reference::END,
    );
    std::fs::write(&page, format!("# Page\n{begin}\nstale\n{end}\nafter\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    let out = run(&["config", "docs", "--write", &page.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let written = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{e}"));
    assert!(written.starts_with("# Page\n") && written.ends_with(&format!("{end}\nafter\n")));
    assert!(written.contains("`bands.<band>.restartClearAfter`") && !written.contains("stale"));
    let out = run(&["config", "docs", "--write", "/nonexistent/page.md"]);
    assert_ne!(out.status.code(), Some(0));
}

#[test]
fn the_charts_config_schema_is_the_settings_schema() {
    let schema = package_dir().join("../../deploy/helm/automanager/values.schema.json");
    let path = schema.display();
    let file = std::fs::read_to_string(&schema).unwrap_or_else(|e| panic!("{path}: {e}"));
    let committed: serde_json::Value =
        serde_json::from_str(&file).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(
        committed["properties"]["config"] == automanager_operator::config::chart_values_schema(),
        "the chart's config schema drifted from the operator's settings; run `make chart-schema`"
    );
    // The splice is stable: rewriting an up-to-date file changes nothing.
    let again = automanager_operator::config::splice_chart_values_schema(
        &file,
        &automanager_operator::config::chart_values_schema(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again, file);
}

#[test]
fn the_chart_schema_flag_rewrites_only_the_config_part() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("values.schema.json");
    std::fs::write(
        &file,
        "{\n  \"type\": \"object\",\n  \"properties\": {\n    \"zeta\": {\n      \"type\": \"string\"\n    },\n    \"config\": {\n      \"type\": \"object\"\n    },\n    \"alpha\": {\n      \"type\": \"integer\"\n    }\n  }\n}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let path = file.to_string_lossy().into_owned();
    let out = run(&["config", "schema", "--chart-values", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let written = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{e}"));
    // The hand-written order around it is kept.
    let (zeta, config, alpha) = (
        written.find("\"zeta\"").unwrap_or(usize::MAX),
        written.find("\"config\"").unwrap_or(usize::MAX),
        written.find("\"alpha\"").unwrap_or(usize::MAX),
    );
    assert!(zeta < config && config < alpha, "{written}");
    let v: serde_json::Value = serde_json::from_str(&written).unwrap_or_else(|e| panic!("{e}"));
    assert!(v["properties"]["config"]["properties"]["bands"].is_object());
    assert!(v["properties"]["config"]["properties"]["manager"].is_null());

    // A file without a config property is refused, and left alone.
    std::fs::write(&file, "{}\n").unwrap_or_else(|e| panic!("{e}"));
    let out = run(&["config", "schema", "--chart-values", &path]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no line"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap_or_default(), "{}\n");
}

/// This package's directory, as cargo tells the running test: a test executable cargo finds
/// fresh may have been built in another checkout that shares the target dir, and the path
/// compiled into it would read that checkout's files.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
