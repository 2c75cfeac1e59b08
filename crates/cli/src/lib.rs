//! # kubectl-automanager
//!
//! The kubectl plugin for AutoManager: what the person on call uses. Installed on `PATH` as
//! `kubectl-automanager`, it runs as `kubectl automanager <command>`:
//!
//! | command | what |
//! |---|---|
//! | `validate -f FILE [--pools FILE]` | offline checks with the operator's own code; no cluster |
//! | `what-if -f FILE` | the admission answer for a Bundle (the operator's engine on the pools and nodes the apiserver holds), with the dry run's trace |
//! | `trace BUNDLE [--replica R] [--job J]` | the recent placement decisions (from the bundle's PlacementHistory) as a tree |
//! | `top pools`, `top nodes` | capacity and cores in use, spares live/target |
//! | `get broken` | Broken bundles and why |
//! | `get windows [BUNDLE]` | per bundle and reason: moves allowed or held by its disruption windows, until when |
//! | `cordon`, `uncordon`, `drain NODE` | the ManagerNode spec a person would patch |
//! | `migrate BUNDLE/REPLICA/JOB`, `abort MIGRATION` | a Migration created or aborted |
//! | `retry BUNDLE` | the retry annotation |
//! | `completion SHELL` | shell completions |
//!
//! Exit codes are in [`error`]. The user guide is `docs/cli.md`.

pub mod actions;
pub mod cel;
pub mod complete;
pub mod connect;
pub mod dry_run;
pub mod engine;
pub mod error;
pub mod input;
pub mod jsonpath;
pub mod locate;
pub mod map;
pub mod operator;
pub mod progress;
pub mod render;
pub mod schema;
pub mod validate;

mod commands;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use commands::run;
pub use error::CliError;

/// How results are printed (`-o`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Output {
    /// Text for people.
    #[default]
    Text,
    /// Text with more detail.
    Wide,
    /// JSON, for scripts.
    Json,
    /// YAML.
    Yaml,
    /// `kind/name` of each object, one a line, as `kubectl get -o name` prints them.
    Name,
    /// A kubectl JSONPath template over the JSON output (`-o jsonpath='{.items[*].name}'`).
    JsonPath(String),
}

impl Output {
    /// Anything but text: data on stdout, progress on stderr.
    pub fn is_data(&self) -> bool {
        !matches!(self, Output::Text | Output::Wide)
    }

    /// Parses `-o`: `text`, `wide`, `json`, `yaml`, `name`, `jsonpath=TEMPLATE` (also
    /// `jsonpath='TEMPLATE'` with the quotes kept by the shell, as kubectl accepts it).
    pub fn parse(text: &str) -> Result<Output, String> {
        if let Some(template) = text.strip_prefix("jsonpath=") {
            let template = template
                .strip_prefix('\'')
                .and_then(|t| t.strip_suffix('\''))
                .unwrap_or(template);
            jsonpath::Template::parse(template)?;
            return Ok(Output::JsonPath(template.to_owned()));
        }
        match text {
            "text" => Ok(Output::Text),
            "wide" => Ok(Output::Wide),
            "json" => Ok(Output::Json),
            "yaml" => Ok(Output::Yaml),
            "name" => Ok(Output::Name),
            "jsonpath" => Err("jsonpath needs a template: -o jsonpath='{.metadata.name}'".into()),
            other => Err(format!(
                "unknown output format {other:?}: one of text, wide, json, yaml, name, jsonpath=TEMPLATE"
            )),
        }
    }
}

/// kubectl automanager: run and debug AutoManager from kubectl.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-automanager",
    bin_name = "kubectl automanager",
    version,
    about = "Run and debug AutoManager (Norsk's placement operator) from kubectl",
    long_about = "Run and debug AutoManager from kubectl: validate bundles offline, ask the operator \
                  what-if, read placement traces, see capacity, and cordon, drain, migrate and retry \
                  with the same objects a person would write.\n\nExit codes: 0 done, 1 failed or \
                  refused, 2 bad command line, 3 --wait timed out.",
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: the current one).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig cluster to use instead of the context's.
    #[arg(long, global = true)]
    pub cluster: Option<String>,
    /// The kubeconfig user to use instead of the context's.
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// The apiserver's address (replaces the cluster's); host:port means https.
    #[arg(short = 's', long, global = true, value_name = "URL")]
    pub server: Option<String>,
    /// A bearer token for the apiserver (replaces the user's credentials).
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// A PEM file of the certificate authorities that sign the apiserver's certificate.
    #[arg(long, global = true, value_name = "FILE")]
    pub certificate_authority: Option<PathBuf>,
    /// Do not check the apiserver's certificate (insecure), as kubectl's flag of that name.
    #[arg(
        long,
        global = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        action = clap::ArgAction::Set,
        value_parser = clap::value_parser!(bool)
    )]
    pub insecure_skip_tls_verify: bool,
    /// The server name to check the apiserver's certificate against.
    #[arg(long, global = true, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// A PEM client certificate for TLS authentication (with --client-key).
    #[arg(long, global = true, value_name = "FILE")]
    pub client_certificate: Option<PathBuf>,
    /// The PEM key of --client-certificate.
    #[arg(long, global = true, value_name = "FILE")]
    pub client_key: Option<PathBuf>,
    /// The namespace of Bundles and Migrations (default: the context's, else `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Act as this user (impersonation), as kubectl's --as.
    #[arg(long = "as", global = true, value_name = "USER")]
    pub as_user: Option<String>,
    /// Act as this group (impersonation; repeat for several), as kubectl's --as-group.
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub as_group: Vec<String>,
    /// Act with this UID (impersonation), as kubectl's --as-uid.
    #[arg(long = "as-uid", global = true, value_name = "UID")]
    pub as_uid: Option<String>,
    /// Output format: text, wide, json, yaml, name, or jsonpath=TEMPLATE.
    #[arg(short = 'o', long, global = true, value_parser = Output::parse, default_value = "text")]
    pub output: Output,
    /// The namespace the operator (its Helm release) runs in.
    #[arg(
        long,
        global = true,
        env = "AUTOMANAGER_OPERATOR_NAMESPACE",
        default_value = "automanager-system"
    )]
    pub operator_namespace: String,
    /// The Helm release of the operator, when several run in --operator-namespace.
    #[arg(
        long,
        global = true,
        env = "AUTOMANAGER_OPERATOR_RELEASE",
        value_name = "RELEASE"
    )]
    pub operator_release: Option<String>,
    /// The labels of the operator's Pods (the chart's).
    #[arg(
        long,
        global = true,
        env = "AUTOMANAGER_OPERATOR_SELECTOR",
        default_value = locate::DEFAULT_SELECTOR
    )]
    pub operator_selector: String,
    /// Reach the operator through the apiserver's proxy to this Service (one you created over
    /// the leader's debugging port) instead of port-forwarding to the leader Pod.
    #[arg(
        long,
        global = true,
        env = "AUTOMANAGER_OPERATOR_SERVICE",
        value_name = "SERVICE"
    )]
    pub operator_service: Option<String>,
    /// The port (name or number) of --operator-service.
    #[arg(
        long,
        global = true,
        env = "AUTOMANAGER_OPERATOR_PORT",
        default_value = "debug"
    )]
    pub operator_port: String,
    /// Talk to the operator at this URL instead of through the apiserver (an operator running
    /// outside any cluster, as `make demo` runs it), e.g. http://127.0.0.1:8080.
    #[arg(
        long,
        global = true,
        env = "AUTOMANAGER_OPERATOR_URL",
        value_name = "URL"
    )]
    pub operator_url: Option<String>,
    /// Say on standard error how the operator was reached (the Pod that answered).
    #[arg(short = 'v', long, global = true)]
    pub verbose: bool,
    /// How long to wait for one answer from the apiserver or the operator: 0 (no limit), a
    /// number of seconds, or a duration (5s, 1m), as kubectl's flag.
    #[arg(long, global = true, default_value = "30s", value_parser = connect::RequestTimeout::parse)]
    pub request_timeout: connect::RequestTimeout,
}

/// `--wait` and its bound.
#[derive(Debug, Args, Clone)]
pub struct WaitArgs {
    /// Follow the change until it finishes, showing its progress.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this long (exit code 3); the change itself goes on.
    #[arg(long, default_value = "5m", value_parser = error::parse_duration)]
    pub timeout: Duration,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check Bundles (and other AutoManager objects) offline, with the operator's own
    /// validation; exits 1 when anything is invalid. Needs no cluster.
    Validate {
        /// Files, directories or - (stdin) holding the objects.
        #[arg(short = 'f', long = "filename", required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// PlacementPools to check pool names and fit against (PlacementPools among -f count too).
        #[arg(long, value_name = "FILE")]
        pools: Vec<PathBuf>,
    },
    /// Whether a Bundle would be admitted now (ok, validation errors, or no capacity with the
    /// replica, job and reason), with the dry run's decisions: the operator's placement engine,
    /// run in the plugin on the PlacementPools and ManagerNodes the apiserver holds.
    WhatIf {
        /// The file holding the Bundle (or -).
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
        /// Ask the leader's debugging port instead (its live model; needs the chart's
        /// debug.enabled). Implied by --operator-url and --operator-service.
        #[arg(long)]
        from_operator: bool,
    },
    /// Explain a bundle's recent placement decisions, from its PlacementHistory: when and by
    /// which operator replica each was made, then the newest in full (pools tried and why each
    /// was left, rejections by reason, the node chosen for each job and why, soft rules broken).
    Trace {
        /// The Bundle.
        bundle: String,
        /// Only this replica.
        #[arg(long)]
        replica: Option<u32>,
        /// Only this job.
        #[arg(long)]
        job: Option<String>,
        /// Ask the leader's debugging port for its in-memory trace instead (needs the chart's
        /// debug.enabled). Implied by --operator-url and --operator-service.
        #[arg(long)]
        from_operator: bool,
    },
    /// Capacity and cores in use.
    Top {
        #[command(subcommand)]
        what: TopWhat,
    },
    /// The fleet as a picture: pools, zones and nodes with used and free capacity, each bundle
    /// replica as a mark (A0 = bundle A's replica 0), cordoned, draining and spare nodes marked.
    Map {
        /// Highlight this Bundle's replicas (NAME in --namespace, or NAMESPACE/NAME).
        #[arg(long)]
        bundle: Option<String>,
        /// Only this pool.
        #[arg(long)]
        pool: Option<String>,
    },
    /// List objects that need attention.
    Get {
        #[command(subcommand)]
        what: GetWhat,
    },
    /// Stop new placements on a node (running jobs stay): sets ManagerNode spec.cordoned.
    Cordon {
        /// The ManagerNode (or Manager's node id).
        node: String,
    },
    /// Allow placements on a node again.
    Uncordon {
        /// The ManagerNode (or Manager's node id).
        node: String,
    },
    /// Empty a node: cordon it, move (migrate) or end (terminate) its jobs, terminate it.
    Drain {
        /// The ManagerNode (or Manager's node id).
        node: String,
        /// migrate: move every job with a Migration first (drop-free); terminate: terminate the
        /// node, its jobs recover by band (bronze is dropped).
        #[arg(long, value_enum, default_value_t = DrainModeArg::Migrate)]
        mode: DrainModeArg,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Move one running job to another node: creates a Migration.
    Migrate {
        /// The job: BUNDLE/REPLICA/JOB, e.g. news-1/0/encode (the bundle is in --namespace).
        job: String,
        /// The target node (default: the placement engine picks one).
        #[arg(long = "to", value_name = "NODE")]
        to: Option<String>,
        /// The strategy (default: the job's declared one); only as safe or safer is accepted.
        #[arg(long, value_enum)]
        strategy: Option<StrategyArg>,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Abort a Migration while it is abortable (before the source stops its output).
    Abort {
        /// The Migration.
        migration: String,
        /// Why (recorded in its status and Events).
        #[arg(long, default_value = "aborted with kubectl automanager abort")]
        reason: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Retry a Broken bundle (sets the retry annotation to the current time).
    Retry {
        /// The Bundle.
        bundle: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `top` targets.
#[derive(Debug, Subcommand)]
pub enum TopWhat {
    /// Per pool: nodes, capacity and cores in use, spares live/target.
    Pools,
    /// Per node: capacity and cores in use, jobs, cordon/drain/spare/health.
    Nodes {
        /// Only this pool's nodes.
        #[arg(long)]
        pool: Option<String>,
    },
}

/// `get` targets.
#[derive(Debug, Subcommand)]
pub enum GetWhat {
    /// Broken bundles (restart ceiling exceeded) and why.
    Broken {
        /// In every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Per bundle and voluntary reason: whether its disruption windows allow moves now (until
    /// when) or hold them (until the next window opens), and the moves the operator holds.
    Windows {
        /// One bundle (in --namespace); all of the namespace's without it.
        bundle: Option<String>,
        /// In every namespace.
        #[arg(short = 'A', long, conflicts_with = "bundle")]
        all_namespaces: bool,
    },
}

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DrainModeArg {
    Migrate,
    Terminate,
}

/// `--strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StrategyArg {
    StopThenStart,
    Overlap,
    Handover,
}

impl StrategyArg {
    pub fn to_api(self) -> automanager_api::MigrationStrategy {
        match self {
            StrategyArg::StopThenStart => automanager_api::MigrationStrategy::StopThenStart,
            StrategyArg::Overlap => automanager_api::MigrationStrategy::Overlap,
            StrategyArg::Handover => automanager_api::MigrationStrategy::Handover,
        }
    }
}

impl DrainModeArg {
    pub fn to_api(self) -> automanager_api::DrainMode {
        match self {
            DrainModeArg::Migrate => automanager_api::DrainMode::Migrate,
            DrainModeArg::Terminate => automanager_api::DrainMode::Terminate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn wait_and_timeout_parse() {
        let cli = Cli::try_parse_from([
            "kubectl-automanager",
            "migrate",
            "news/0/encode",
            "--to",
            "n1",
            "--strategy",
            "stop-then-start",
            "--wait",
            "--timeout",
            "90s",
            "-o",
            "json",
        ])
        .expect("parses");
        let Command::Migrate { wait, strategy, .. } = cli.command else {
            panic!("migrate");
        };
        assert!(wait.wait);
        assert_eq!(wait.timeout, Duration::from_secs(90));
        assert_eq!(strategy, Some(StrategyArg::StopThenStart));
        assert_eq!(cli.global.output, Output::Json);
    }

    #[test]
    fn completions_name_the_plugin_and_its_commands() {
        let mut out = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "kubectl-automanager",
            &mut out,
        );
        let text = String::from_utf8_lossy(&out);
        for word in [
            "kubectl-automanager",
            "what-if",
            "trace",
            "drain",
            "--strategy",
        ] {
            assert!(text.contains(word), "{word} missing");
        }
    }

    #[test]
    fn kubectls_flags_go_before_or_after_the_command() {
        let flags = [
            "-n",
            "team-a",
            "-o",
            "json",
            "--context",
            "kind-a",
            "--cluster",
            "c",
            "--user",
            "u",
            "--server",
            "https://h:6443",
            "--token",
            "t",
            "--certificate-authority",
            "ca.pem",
            "--insecure-skip-tls-verify",
            "--request-timeout",
            "0",
            "--as-uid",
            "42",
        ];
        let before = std::iter::once("kubectl-automanager")
            .chain(flags)
            .chain(["top", "pools"]);
        let after = ["kubectl-automanager", "top", "pools"]
            .into_iter()
            .chain(flags);
        let between = ["kubectl-automanager", "top"]
            .into_iter()
            .chain(flags)
            .chain(["pools"]);
        for (how, args) in [
            ("before", before.collect::<Vec<_>>()),
            ("after", after.collect()),
            ("between", between.collect()),
        ] {
            let g = Cli::try_parse_from(&args).expect(how).global;
            assert_eq!(g.namespace.as_deref(), Some("team-a"), "{how}");
            assert_eq!(g.output, Output::Json, "{how}");
            assert_eq!(g.context.as_deref(), Some("kind-a"), "{how}");
            assert_eq!(g.cluster.as_deref(), Some("c"), "{how}");
            assert_eq!(g.user.as_deref(), Some("u"), "{how}");
            assert_eq!(g.server.as_deref(), Some("https://h:6443"), "{how}");
            assert_eq!(g.token.as_deref(), Some("t"), "{how}");
            assert_eq!(
                g.certificate_authority.as_deref(),
                Some(std::path::Path::new("ca.pem")),
                "{how}"
            );
            assert!(g.insecure_skip_tls_verify, "{how}");
            assert_eq!(g.request_timeout.0, None, "{how}");
            assert_eq!(g.as_uid.as_deref(), Some("42"), "{how}");
        }
        // The insecure flag takes a value only after `=`, as kubectl's.
        let cli = Cli::try_parse_from([
            "kubectl-automanager",
            "--insecure-skip-tls-verify=false",
            "cordon",
            "n1",
        ])
        .expect("parses");
        assert!(!cli.global.insecure_skip_tls_verify);
        let cli = Cli::try_parse_from([
            "kubectl-automanager",
            "--insecure-skip-tls-verify",
            "cordon",
            "n1",
        ])
        .expect("parses");
        assert!(cli.global.insecure_skip_tls_verify);
        assert!(matches!(cli.command, Command::Cordon { node } if node == "n1"));
        let cli = Cli::try_parse_from(["kubectl-automanager", "top", "pools"]).expect("parses");
        assert_eq!(
            cli.global.request_timeout.0,
            Some(Duration::from_secs(30)),
            "the default"
        );
    }

    #[test]
    fn a_bad_timeout_is_a_usage_error() {
        let e = Cli::try_parse_from(["kubectl-automanager", "retry", "b", "--timeout", "soon"])
            .expect_err("bad");
        assert_eq!(e.exit_code(), 2);
    }
}
