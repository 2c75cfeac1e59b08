//! Completions for kubectl. kubectl (1.26 and later) completes `kubectl automanager …` by
//! running `kubectl_complete-automanager` from `PATH` with the words typed so far, the last
//! being the one to complete, and reads one candidate a line (`word<TAB>description`) then
//! `:<directive>`, cobra's protocol. `kubectl_complete-automanager` runs
//! `kubectl-automanager __complete "$@"`.
//!
//! Commands, flags and fixed values come from the command line's own definition; the names of
//! objects from the apiserver, as kubectl completes its own: Bundles and Migrations in the
//! namespace of `-n` (else the context's), ManagerNodes, PlacementPools and Namespaces, and
//! contexts, clusters and users from the kubeconfig. Flags may come anywhere, before the
//! command or after it, as the command itself takes them; the connection flags among the
//! words (`--context`, `--kubeconfig`, `--server`, …) are the ones the lookup uses.
//!
//! cobra's `clap_complete` counterpart (its `unstable-dynamic` engine) speaks the shells'
//! protocols, not kubectl's, so the plugin answers kubectl itself.

use std::time::Duration;

use clap::{CommandFactory, Parser};

use crate::error::CliError;
use crate::{Cli, GlobalArgs};

/// cobra's `ShellCompDirectiveDefault`: the shell may complete file names.
const FILES: u8 = 0;
/// cobra's `ShellCompDirectiveNoSpace`: the candidate is not finished (`news/`).
const NO_SPACE: u8 = 2;
/// cobra's `ShellCompDirectiveNoFileComp`.
const NO_FILES: u8 = 4;

/// How long a lookup may take when `--request-timeout` is not among the words: a TAB that
/// hangs is worse than one that offers nothing.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the names of an argument come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Bundles in the namespace.
    Bundles,
    /// `BUNDLE/REPLICA/JOB` of `migrate`, one segment at a time.
    JobRef,
    ManagerNodes,
    PlacementPools,
    /// Migrations in the namespace that have not ended (the ones `abort` can stop).
    Migrations,
    Namespaces,
    /// Kubeconfig contexts, clusters and users.
    Contexts,
    Clusters,
    Users,
}

/// What the word being completed is, found from the words before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// What has been typed of it (after a `--flag=`).
    pub partial: String,
    /// Put before every candidate (the `--flag=` of `--flag=value`).
    pub prefix: String,
    /// Candidates known without asking anyone: commands, flags, fixed values.
    pub fixed: Vec<(String, String)>,
    /// Names to look up.
    pub source: Option<Source>,
    /// cobra's directive.
    pub directive: u8,
    /// The global flags among the words, with their values: the command line the lookup
    /// connects with.
    pub globals: Vec<String>,
}

/// Reads the words as the command line would: flags before or after the command, values
/// attached (`-nteam`, `--namespace=team`, `-ojson`) or separate.
pub fn plan(words: &[String]) -> Plan {
    let (partial, before) = match words.split_last() {
        Some((last, rest)) => (last.as_str(), rest),
        None => ("", &[][..]),
    };
    let mut root = Cli::command();
    root.build();
    let mut cmd = &root;
    let mut positional = 0usize;
    let mut pending: Option<&clap::Arg> = None;
    let mut only_positionals = false;
    let mut globals: Vec<String> = Vec::new();
    for w in before {
        if let Some(arg) = pending.take() {
            if arg.is_global_set() {
                globals.push(w.clone());
            }
            continue;
        }
        if only_positionals {
            positional += 1;
            continue;
        }
        if w == "--" {
            only_positionals = true;
            continue;
        }
        if let Some(long) = w.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (long, None),
            };
            if let Some(arg) = cmd.get_arguments().find(|a| a.get_long() == Some(name)) {
                if arg.is_global_set() {
                    globals.push(w.clone());
                }
                if value.is_none() && needs_value(arg) {
                    pending = Some(arg);
                }
            }
            continue;
        }
        if let Some(shorts) = w.strip_prefix('-').filter(|s| !s.is_empty()) {
            // A cluster of short flags; the first that takes a value takes the rest of the
            // word, or the next word when nothing follows it.
            for (i, ch) in shorts.char_indices() {
                let Some(arg) = cmd.get_arguments().find(|a| a.get_short() == Some(ch)) else {
                    break;
                };
                if arg.is_global_set() && i == 0 {
                    globals.push(w.clone());
                }
                if needs_value(arg) {
                    if i + ch.len_utf8() == shorts.len() {
                        pending = Some(arg);
                    }
                    break;
                }
            }
            continue;
        }
        match cmd.find_subcommand(w) {
            Some(sub) if cmd.has_subcommands() => {
                cmd = sub;
                positional = 0;
            }
            _ => positional += 1,
        }
    }
    if pending.is_some_and(clap::Arg::is_global_set) {
        // The flag whose value is being completed has none yet to parse.
        globals.pop();
    }
    let mut plan = Plan {
        partial: partial.to_owned(),
        prefix: String::new(),
        fixed: Vec::new(),
        source: None,
        directive: NO_FILES,
        globals,
    };
    if let Some(arg) = pending {
        values(arg, &mut plan);
    } else if let Some((name, value)) = partial.strip_prefix("--").and_then(|l| l.split_once('=')) {
        if let Some(arg) = cmd.get_arguments().find(|a| a.get_long() == Some(name)) {
            plan.prefix = format!("--{name}=");
            plan.partial = value.to_owned();
            values(arg, &mut plan);
        }
    } else if partial.starts_with('-') {
        for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            let help = help_line(a.get_help());
            if let Some(l) = a.get_long() {
                plan.fixed.push((format!("--{l}"), help.clone()));
            }
            if let Some(s) = a.get_short() {
                plan.fixed.push((format!("-{s}"), help));
            }
        }
    } else if cmd.has_subcommands() {
        for s in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            plan.fixed
                .push((s.get_name().to_owned(), help_line(s.get_about())));
        }
    } else if let Some(arg) = cmd.get_positionals().nth(positional) {
        values(arg, &mut plan);
    }
    plan
}

/// Whether the flag takes the next word as its value (`--insecure-skip-tls-verify` takes
/// one only after `=`).
fn needs_value(arg: &clap::Arg) -> bool {
    arg.get_num_args()
        .is_some_and(|n| n.takes_values() && n.min_values() > 0)
}

fn help_line(help: Option<&clap::builder::StyledStr>) -> String {
    help.map(|h| h.to_string())
        .and_then(|h| h.lines().next().map(str::to_owned))
        .unwrap_or_default()
}

/// The values of a flag or positional argument: fixed ones, names to look up, or files.
fn values(arg: &clap::Arg, plan: &mut Plan) {
    let id = arg.get_id().as_str();
    if id == "output" {
        for f in ["text", "wide", "json", "yaml", "name", "jsonpath="] {
            plan.fixed.push((f.to_owned(), String::new()));
        }
        return;
    }
    let possible = arg.get_possible_values();
    if !possible.is_empty() {
        for v in possible.iter().filter(|v| !v.is_hide_set()) {
            plan.fixed
                .push((v.get_name().to_owned(), help_line(v.get_help())));
        }
        return;
    }
    plan.source = match id {
        "bundle" => Some(Source::Bundles),
        // `trace --job` is a job of the bundle; `migrate`'s positional the whole reference.
        "job" if arg.is_positional() => Some(Source::JobRef),
        "node" | "to" => Some(Source::ManagerNodes),
        "pool" => Some(Source::PlacementPools),
        "migration" => Some(Source::Migrations),
        "namespace" | "operator_namespace" => Some(Source::Namespaces),
        "context" => Some(Source::Contexts),
        "cluster" => Some(Source::Clusters),
        "user" => Some(Source::Users),
        _ => None,
    };
    if plan.source.is_none()
        && arg
            .get_value_names()
            .and_then(|n| n.first())
            .is_some_and(|n| n.as_str() == "FILE")
    {
        plan.directive = FILES;
    }
}

/// Only the global flags, to parse the ones found among the words.
#[derive(Debug, Parser)]
#[command(no_binary_name = true)]
struct Globals {
    #[command(flatten)]
    g: GlobalArgs,
}

/// Candidates for the last of `words`, then the directive line. Names that need the
/// apiserver are looked up with the connection flags among the words; when that fails the
/// reason goes to standard error (which the shell hides, as cobra's) and no names are offered.
pub async fn complete(words: &[String]) -> String {
    let mut plan = plan(words);
    let mut candidates = std::mem::take(&mut plan.fixed);
    if let Some(source) = plan.source {
        match lookup(source, &plan).await {
            Ok((names, directive)) => {
                candidates.extend(names);
                plan.directive |= directive;
            }
            Err(e) => {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "completion: {e}");
            }
        }
    }
    let mut text = String::new();
    for (word, help) in candidates {
        if !word.starts_with(&plan.partial) {
            continue;
        }
        text.push_str(&plan.prefix);
        text.push_str(&word);
        if !help.is_empty() {
            text.push('\t');
            text.push_str(&help);
        }
        text.push('\n');
    }
    text.push_str(&format!(":{}\n", plan.directive));
    text
}

type Names = Vec<(String, String)>;

async fn lookup(source: Source, plan: &Plan) -> Result<(Names, u8), CliError> {
    let g = Globals::try_parse_from(&plan.globals)
        .map_err(|e| CliError::Input(e.to_string()))?
        .g;
    let explicit = plan
        .globals
        .iter()
        .any(|w| w.starts_with("--request-timeout"));
    let bound = if explicit {
        g.request_timeout.0
    } else {
        Some(LOOKUP_TIMEOUT)
    };
    let work = names(source, &g, &plan.partial);
    match bound {
        Some(limit) => tokio::time::timeout(limit, work).await.map_err(|_| {
            CliError::Input(format!(
                "no answer within {}",
                crate::error::humantime(limit)
            ))
        })?,
        None => work.await,
    }
}

async fn names(source: Source, g: &GlobalArgs, partial: &str) -> Result<(Names, u8), CliError> {
    use automanager_api as api;
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, ListParams};

    if matches!(source, Source::Contexts | Source::Clusters | Source::Users) {
        return Ok((kubeconfig_names(g, source)?, 0));
    }
    let conn = crate::connect::load(g).await?;
    let client = conn.client()?;
    let namespace = g
        .namespace
        .clone()
        .unwrap_or_else(|| conn.config.default_namespace.clone());
    let err = |e| crate::connect::api_error(&conn.target, e);
    let lp = ListParams::default();
    fn plain<K: Clone>(list: kube::core::ObjectList<kube::core::PartialObjectMeta<K>>) -> Names {
        list.items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .map(|n| (n, String::new()))
            .collect()
    }
    let found = match source {
        Source::Bundles => plain(
            Api::<api::Bundle>::namespaced(client, &namespace)
                .list_metadata(&lp)
                .await
                .map_err(err)?,
        ),
        Source::ManagerNodes => plain(
            Api::<api::ManagerNode>::all(client)
                .list_metadata(&lp)
                .await
                .map_err(err)?,
        ),
        Source::PlacementPools => plain(
            Api::<api::PlacementPool>::all(client)
                .list_metadata(&lp)
                .await
                .map_err(err)?,
        ),
        Source::Namespaces => plain(
            Api::<Namespace>::all(client)
                .list_metadata(&lp)
                .await
                .map_err(err)?,
        ),
        Source::Migrations => {
            use api::MigrationPhase as P;
            Api::<api::Migration>::namespaced(client, &namespace)
                .list(&lp)
                .await
                .map_err(err)?
                .items
                .into_iter()
                .filter_map(|m| {
                    let phase = m.status.as_ref().map(|s| s.phase).unwrap_or_default();
                    let ended = matches!(
                        phase,
                        P::Completed | P::Aborted | P::Refused | P::Rejected | P::Failed
                    );
                    let name = m.metadata.name?;
                    (!ended).then(|| (name, format!("{phase:?}")))
                })
                .collect()
        }
        Source::JobRef => {
            let bundles: Api<api::Bundle> = Api::namespaced(client, &namespace);
            let mut parts = partial.splitn(3, '/');
            let (bundle, replica) = (parts.next(), parts.next());
            let Some(bundle) = bundle.filter(|_| replica.is_some()) else {
                // First the bundle, then its replica, then its job: each ends with `/`.
                let names = plain(bundles.list_metadata(&lp).await.map_err(err)?)
                    .into_iter()
                    .map(|(n, _)| (format!("{n}/"), String::new()))
                    .collect();
                return Ok((names, NO_SPACE));
            };
            let Some(b) = bundles.get_opt(bundle).await.map_err(err)? else {
                return Ok((Vec::new(), 0));
            };
            let jobs: Vec<&str> = b.spec.jobs.iter().map(|j| j.job_name.as_str()).collect();
            let replicas = u32::try_from(b.spec.replicas).unwrap_or(0);
            return Ok(job_refs(bundle, replicas, &jobs, partial));
        }
        Source::Contexts | Source::Clusters | Source::Users => Vec::new(),
    };
    Ok((found, 0))
}

/// The next segment of `BUNDLE/REPLICA/JOB` after `partial` (which has at least one `/`):
/// the replicas as `news/0/`, or, after a replica, the jobs as `news/0/encode`.
pub fn job_refs(bundle: &str, replicas: u32, jobs: &[&str], partial: &str) -> (Names, u8) {
    let segments: Vec<&str> = partial.split('/').collect();
    if segments.len() <= 2 {
        let names = (0..replicas)
            .map(|r| (format!("{bundle}/{r}/"), String::new()))
            .collect();
        return (names, NO_SPACE);
    }
    let replica = segments[1];
    let names = jobs
        .iter()
        .map(|j| (format!("{bundle}/{replica}/{j}"), String::new()))
        .collect();
    (names, 0)
}

/// Context, cluster or user names of the kubeconfig, read by kube's loader.
fn kubeconfig_names(g: &GlobalArgs, source: Source) -> Result<Names, CliError> {
    let kc = match &g.kubeconfig {
        Some(path) => kube::config::Kubeconfig::read_from(path),
        None => kube::config::Kubeconfig::read(),
    }
    .map_err(|e| CliError::Kubeconfig(crate::connect::cause(&e)))?;
    Ok(match source {
        Source::Contexts => kc
            .contexts
            .into_iter()
            .map(|c| {
                let about = c
                    .context
                    .map(|x| match x.namespace {
                        Some(ns) => format!("cluster {}, namespace {ns}", x.cluster),
                        None => format!("cluster {}", x.cluster),
                    })
                    .unwrap_or_default();
                (c.name, about)
            })
            .collect(),
        Source::Clusters => kc
            .clusters
            .into_iter()
            .map(|c| {
                let about = c.cluster.and_then(|x| x.server).unwrap_or_default();
                (c.name, about)
            })
            .collect(),
        _ => kc
            .auth_infos
            .into_iter()
            .map(|u| (u.name, String::new()))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| (*s).to_owned()).collect()
    }

    async fn complete_words(w: &[&str]) -> String {
        complete(&words(w)).await
    }

    #[tokio::test]
    async fn commands_then_flags_then_values() {
        let c = complete_words(&["tr"]).await;
        assert!(c.starts_with("trace\t"), "{c}");
        assert!(c.ends_with(":4\n"), "{c}");
        let c = complete_words(&[""]).await;
        for cmd in ["map", "what-if", "validate", "migrate"] {
            assert!(
                c.lines().any(|l| l.starts_with(&format!("{cmd}\t"))),
                "{cmd}: {c}"
            );
        }
        assert!(!c.contains("__complete"), "{c}");
        let c = complete_words(&["drain", "n1", "--mo"]).await;
        assert!(c.starts_with("--mode\t"), "{c}");
        let c = complete_words(&["drain", "n1", "--mode", ""]).await;
        assert!(c.contains("migrate") && c.contains("terminate"), "{c}");
        let c = complete_words(&["map", "--con"]).await;
        assert!(c.starts_with("--context\t"), "{c}");
        let c = complete_words(&["top", "-o", "j"]).await;
        assert_eq!(c, "json\njsonpath=\n:4\n");
        let c = complete_words(&["validate", "-f", ""]).await;
        assert_eq!(c, ":0\n");
        let c = complete_words(&["map", "--request-t"]).await;
        assert!(c.starts_with("--request-timeout\t"), "{c}");
        let c = complete_words(&["--output=y"]).await;
        assert_eq!(c, "--output=yaml\n:4\n");
    }

    #[test]
    fn flags_before_the_command_and_attached_values_are_read_as_the_command_reads_them() {
        for ws in [
            &["-n", "team", "-o", "json", "trace", ""][..],
            &["-nteam", "-ojson", "trace", ""],
            &["--namespace=team", "--output", "json", "trace", ""],
            &["trace", "-n", "team", ""],
            &["--context", "kind-a", "trace", ""],
            &["--insecure-skip-tls-verify", "trace", ""],
            &["--request-timeout", "2s", "-v", "trace", ""],
        ] {
            let p = plan(&words(ws));
            assert_eq!(p.source, Some(Source::Bundles), "{ws:?}");
            assert!(p.fixed.is_empty(), "{ws:?}: {:?}", p.fixed);
        }
        let p = plan(&words(&[
            "-n",
            "team",
            "-o",
            "json",
            "--context=c",
            "get",
            "windows",
            "",
        ]));
        assert_eq!(p.source, Some(Source::Bundles));
        assert_eq!(p.globals, ["-n", "team", "-o", "json", "--context=c"]);
        // The connection flags among the words are parsed as the command would.
        let g = Globals::try_parse_from(&p.globals).expect("parses").g;
        assert_eq!(g.namespace.as_deref(), Some("team"));
        assert_eq!(g.context.as_deref(), Some("c"));
        let p = plan(&words(&[
            "-nteam",
            "trace",
            "x",
            "--server",
            "https://h:1",
            "--job",
            "",
        ]));
        assert_eq!(p.source, None);
        assert_eq!(p.globals, ["-nteam", "--server", "https://h:1"]);
        // Subcommands after leading flags.
        let p = plan(&words(&["-n", "team", "-o", "json", "t"]));
        assert!(p.fixed.iter().any(|(w, _)| w == "trace"), "{:?}", p.fixed);
        assert!(p.fixed.iter().any(|(w, _)| w == "top"), "{:?}", p.fixed);
    }

    #[test]
    fn each_argument_names_where_its_values_come_from() {
        let source = |ws: &[&str]| plan(&words(ws)).source;
        assert_eq!(source(&["-n", ""]), Some(Source::Namespaces));
        assert_eq!(
            source(&["trace", "--namespace", ""]),
            Some(Source::Namespaces)
        );
        assert_eq!(source(&["-o", "json", "-n", ""]), Some(Source::Namespaces));
        assert_eq!(source(&["trace", ""]), Some(Source::Bundles));
        assert_eq!(source(&["trace", "news", ""]), None);
        assert_eq!(source(&["retry", ""]), Some(Source::Bundles));
        assert_eq!(source(&["map", "--bundle", ""]), Some(Source::Bundles));
        assert_eq!(source(&["map", "--pool", ""]), Some(Source::PlacementPools));
        assert_eq!(
            source(&["top", "nodes", "--pool", ""]),
            Some(Source::PlacementPools)
        );
        for cmd in ["cordon", "uncordon", "drain"] {
            assert_eq!(source(&[cmd, ""]), Some(Source::ManagerNodes), "{cmd}");
        }
        assert_eq!(
            source(&["migrate", "news/0/enc", "--to", ""]),
            Some(Source::ManagerNodes)
        );
        assert_eq!(source(&["migrate", ""]), Some(Source::JobRef));
        assert_eq!(source(&["abort", ""]), Some(Source::Migrations));
        assert_eq!(source(&["--context", ""]), Some(Source::Contexts));
        assert_eq!(source(&["top", "--cluster", ""]), Some(Source::Clusters));
        assert_eq!(source(&["top", "--user", ""]), Some(Source::Users));
        let p = plan(&words(&["--namespace=te"]));
        assert_eq!(p.source, Some(Source::Namespaces));
        assert_eq!(
            (p.prefix.as_str(), p.partial.as_str()),
            ("--namespace=", "te")
        );
    }

    #[test]
    fn a_job_reference_completes_one_segment_at_a_time() {
        let (names, d) = job_refs("news", 2, &["enc", "pkg"], "news/");
        assert_eq!(
            names.iter().map(|n| n.0.as_str()).collect::<Vec<_>>(),
            ["news/0/", "news/1/"]
        );
        assert_eq!(d, NO_SPACE);
        let (names, d) = job_refs("news", 2, &["enc", "pkg"], "news/1/");
        assert_eq!(
            names.iter().map(|n| n.0.as_str()).collect::<Vec<_>>(),
            ["news/1/enc", "news/1/pkg"]
        );
        assert_eq!(d, 0);
    }

    #[tokio::test]
    async fn contexts_come_from_the_kubeconfig_of_the_words() {
        let f = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(
            f.path(),
            "apiVersion: v1\nkind: Config\nclusters: [{name: c1, cluster: {server: 'https://h:1'}}]\nusers: [{name: u1, user: {}}]\ncontexts: [{name: kind-a, context: {cluster: c1, user: u1, namespace: team}}, {name: kind-b, context: {cluster: c1, user: u1}}]\n",
        )
        .expect("write");
        let path = f.path().to_str().expect("utf-8");
        let c = complete_words(&["--kubeconfig", path, "top", "--context", "kind-"]).await;
        assert_eq!(
            c,
            "kind-a\tcluster c1, namespace team\nkind-b\tcluster c1\n:4\n"
        );
        let c = complete_words(&["--kubeconfig", path, "--cluster", ""]).await;
        assert_eq!(c, "c1\thttps://h:1\n:4\n");
    }
}
