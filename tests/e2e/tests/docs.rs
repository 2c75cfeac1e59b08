//! What the user documentation says that the repository can hold it to (no cluster; part of
//! `make test`): links and their anchors resolve, docs/ carries no run logs' commit hashes, the
//! licence is the one Cargo.toml and the image declare, the changelog keeps its format, and the
//! facts a few pages state about the chart, the job socket and the user roles are true.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use automanager_e2e::install::{chart_dir, documents};
use automanager_e2e::repo_root;
use serde_json::Value;

/// Pages other people keep: their links are not checked here (links into them are).
const NOT_CHECKED: [&str; 2] = ["docs/architecture.md", "docs/node.md"];

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The user-facing Markdown pages: README, CHANGELOG, BENCHMARKS, SECURITY and docs/*.md.
fn pages() -> Vec<String> {
    let mut out = vec![
        "README.md".to_owned(),
        "CHANGELOG.md".to_owned(),
        "BENCHMARKS.md".to_owned(),
        "SECURITY.md".to_owned(),
    ];
    for e in std::fs::read_dir(repo_root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            out.push(format!("docs/{}", p.file_name().unwrap().to_str().unwrap()));
        }
    }
    out.sort();
    out
}

/// Markdown with its fenced code blocks and inline code removed.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut in_code = false;
        for ch in line.chars() {
            if ch == '`' {
                in_code = !in_code;
            } else if !in_code {
                out.push(ch);
            }
        }
        out.push('\n');
    }
    out
}

/// The targets of inline links `[text](target)`.
fn links(text: &str) -> Vec<String> {
    let text = prose(text);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            let heading = line.trim_start_matches('#').replace('`', "");
            let mut s = slug(&heading);
            // Repeated headings get -1, -2, …
            let base = s.clone();
            let mut n = 1;
            while out.contains(&s) {
                s = format!("{base}-{n}");
                n += 1;
            }
            out.insert(s);
        }
    }
    out
}

#[test]
fn relative_links_and_their_anchors_resolve() {
    let mut broken = Vec::new();
    for page in pages() {
        if NOT_CHECKED.contains(&page.as_str()) {
            continue;
        }
        let text = read(&page);
        let dir = Path::new(&page).parent().unwrap().to_path_buf();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved: PathBuf = if path.is_empty() {
                PathBuf::from(&page)
            } else {
                dir.join(path)
            };
            let full = repo_root().join(&resolved);
            if !full.exists() {
                broken.push(format!("{page}: {target} (no {})", resolved.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let target_rel = resolved.to_string_lossy().replace("docs/../", "");
                if full.extension().is_some_and(|e| e == "md")
                    && !NOT_CHECKED.iter().any(|n| target_rel.ends_with(n))
                    && !anchors(&std::fs::read_to_string(&full).unwrap()).contains(anchor)
                {
                    broken.push(format!("{page}: {target} (no heading #{anchor})"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Run logs and the commits they were made on belong in BENCHMARKS.md, not in the docs.
#[test]
fn the_docs_carry_no_commit_hashes_or_lab_notes() {
    let mut found = Vec::new();
    for page in pages() {
        if !page.starts_with("docs/") || NOT_CHECKED.contains(&page.as_str()) {
            continue;
        }
        for (n, line) in read(&page).lines().enumerate() {
            for word in line.split(|c: char| !c.is_ascii_alphanumeric()) {
                let hexlike = (7..=40).contains(&word.len())
                    && word
                        .chars()
                        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
                    && word.chars().any(|c| c.is_ascii_digit())
                    && word.chars().any(|c| c.is_ascii_alphabetic());
                if hexlike && !line.contains("sha256") {
                    found.push(format!("{page}:{}: {word}", n + 1));
                }
            }
            for phrase in ["2-core machine", "this machine", "working tree"] {
                if line.contains(phrase) {
                    found.push(format!("{page}:{}: {phrase}", n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_licence_is_the_one_cargo_toml_and_the_image_declare() {
    let license = read("LICENSE");
    assert!(
        license.contains("Apache License") && license.contains("Version 2.0, January 2004"),
        "LICENSE is not the Apache License 2.0"
    );
    assert!(
        license.contains("END OF TERMS AND CONDITIONS"),
        "LICENSE is cut short"
    );
    assert!(read("Cargo.toml").contains("license = \"Apache-2.0\""));
    assert!(read("mk/install.mk").contains("org.opencontainers.image.licenses=Apache-2.0"));
}

#[test]
fn the_changelog_keeps_a_changelog() {
    let text = read("CHANGELOG.md");
    assert!(text.starts_with("# Changelog\n"));
    assert!(text.contains("keepachangelog.com"));
    assert!(
        text.contains("\n## [Unreleased]\n"),
        "no Unreleased section"
    );
    let kinds = [
        "Added",
        "Changed",
        "Deprecated",
        "Removed",
        "Fixed",
        "Security",
    ];
    for line in text.lines().filter(|l| l.starts_with("### ")) {
        assert!(
            kinds.contains(&&line[4..]),
            "not a Keep a Changelog section: {line}"
        );
    }
    for line in text.lines().filter(|l| l.starts_with("## ")) {
        let version = line[3..].split(" - ").next().unwrap();
        assert!(
            version.starts_with('[') && version.ends_with(']'),
            "{line}: versions are written [x.y.z] - date"
        );
        assert!(
            text.contains(&format!("\n{version}: ")),
            "{version} has no link at the end"
        );
    }
}

fn yaml(path: &Path) -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// docs/cli.md: the debugging API is off and on loopback by default, and no chart Service
/// exposes it, so the plugin reaches it through a port-forward.
#[test]
fn the_chart_serves_the_debugging_api_as_docs_cli_md_says() {
    let values = yaml(&chart_dir().join("values.yaml"));
    assert_eq!(values["debug"]["enabled"], false);
    assert_eq!(values["debug"]["address"], "127.0.0.1");
    assert_eq!(values["debug"]["port"], 8082);
    let templates = chart_dir().join("templates");
    let tests = std::fs::read_dir(templates.join("tests")).unwrap();
    for e in std::fs::read_dir(&templates).unwrap().chain(tests) {
        let p = e.unwrap().path();
        if p.is_dir() {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        if text.contains("kind: Service\n") {
            assert!(
                !text.contains("name: debug") && !text.contains(".Values.debug"),
                "{} now exposes the debugging port: update docs/cli.md",
                p.display()
            );
        }
    }
    let cli = read("docs/cli.md");
    assert!(cli.contains("kubectl -n automanager-system port-forward"));
    assert!(cli.contains("--operator-url http://127.0.0.1:8082"));
    assert!(cli.contains("--set debug.enabled=true"));
}

/// What the plugin finds the leader by (crates/cli/src/locate.rs) is what the chart renders:
/// the operator Pods' labels, a container port named `debug`, the Lease named like the
/// Deployment (the release's full name) and the Pod's name as the holder identity.
#[test]
fn the_chart_renders_what_the_plugin_finds_the_leader_by() {
    let helpers = read("deploy/helm/automanager/templates/_helpers.tpl");
    assert!(helpers.contains("app.kubernetes.io/name: {{ include \"automanager.name\" . }}"));
    assert!(helpers.contains("app.kubernetes.io/component: operator"));
    assert!(helpers.contains("app.kubernetes.io/instance: {{ .Release.Name }}"));
    assert!(helpers.contains("$_ := set $le \"leaseName\" (include \"automanager.fullname\" .)"));
    let values = yaml(&chart_dir().join("values.yaml"));
    assert!(values["nameOverride"].as_str().unwrap_or("").is_empty());
    let deployment = read("deploy/helm/automanager/templates/deployment.yaml");
    assert!(deployment.contains("name: {{ include \"automanager.fullname\" . }}"));
    assert!(
        deployment.contains("- name: debug\n              containerPort: {{ .Values.debug.port }}")
    );
    assert!(deployment.contains("- name: POD_NAME\n              valueFrom:\n                fieldRef:\n                  fieldPath: metadata.name"));
    let locate = read("crates/cli/src/locate.rs");
    assert!(locate.contains(
        "pub const DEFAULT_SELECTOR: &str =\n    \"app.kubernetes.io/name=automanager,app.kubernetes.io/component=operator\";"
    ) || locate.contains(
        "pub const DEFAULT_SELECTOR: &str = \"app.kubernetes.io/name=automanager,app.kubernetes.io/component=operator\";"
    ));
    assert!(locate.contains("pub const DEBUG_PORT_NAME: &str = \"debug\";"));
}

/// docs/job-socket.md: the role keys the worker in this repository registers.
#[test]
fn the_job_socket_roles_are_what_docs_job_socket_md_says() {
    let agent = read("crates/manager-sim/src/socket_agent.rs");
    assert!(agent.contains("pub const NORMAL_ROLE: &str = \"normal\";"));
    assert!(agent.contains("pub const TARGET_ROLE_PREFIX: &str = \"migrationTarget:\";"));
    let doc = read("docs/job-socket.md");
    assert!(doc.contains("| `normal` |"));
    assert!(doc.contains("`migrationTarget:<migrationId>`"));
}

/// docs/user-rbac.md names every ClusterRole deploy/rbac/user-roles.yaml defines, and only those.
#[test]
fn the_user_roles_are_the_ones_docs_user_rbac_md_names() {
    let roles = documents(&read("deploy/rbac/user-roles.yaml")).unwrap();
    let doc = read("docs/user-rbac.md");
    let named: BTreeSet<String> = doc
        .lines()
        .filter(|l| l.starts_with("| `automanager-"))
        .map(|l| l.split('`').nth(1).unwrap().to_owned())
        .collect();
    let defined: BTreeSet<String> = roles
        .iter()
        .map(|r| {
            assert_eq!(r["kind"], "ClusterRole");
            r["metadata"]["name"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(named, defined);
}

/// docs/multi-release.md's settings exist in the chart.
#[test]
fn the_multi_release_settings_are_chart_values() {
    let values = yaml(&chart_dir().join("values.yaml"));
    assert!(values["config"]["watchNamespaces"].is_array());
    assert_eq!(values["config"]["clusterScope"], true);
    assert_eq!(values["crds"]["install"], true);
    assert_eq!(values["crds"]["keep"], true);
    let doc = read("docs/multi-release.md");
    for key in [
        "config.watchNamespaces",
        "config.clusterScope",
        "crds.install",
    ] {
        assert!(
            doc.contains(key),
            "docs/multi-release.md does not mention {key}"
        );
    }
}
