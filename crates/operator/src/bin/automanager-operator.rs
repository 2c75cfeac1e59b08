//! `automanager-operator`: the AutoManager operator process.
//!
//! `automanager-operator config schema|docs|check` work with the settings file without starting
//! anything (see docs/operator-config.md).
//!
//! Loads and validates the config (exits 2 listing every problem), connects to Kubernetes and to
//! Manager, serves `/healthz`, `/readyz`, `/metrics` and the debugging API, takes part in leader
//! election and, while leader, runs the controllers. SIGTERM or Ctrl-C stops it cleanly; losing
//! the lease stops it too (exit 1), so a restarted process starts from a clean slate.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use automanager_operator::clock::SystemClock;
use automanager_operator::config::{ConfigOverrides, FileChecks, OperatorConfig, reference};
use automanager_operator::controllers::Context;
use automanager_operator::http::{self, Readiness};
use automanager_operator::leader::{LeaderElection, run_leader_election};
use automanager_operator::metrics::Metrics;
use automanager_operator::runtime::{DebugState, run_controllers};
use automanager_operator::settings::Settings;
use clap::{Parser, Subcommand};
use futures::FutureExt;
use tokio::sync::watch;

// jemalloc rather than glibc's malloc: the operator's heap is many small, long-lived objects
// (the mirror, reflector stores, placement reservations) that churn on every watch event, and
// glibc's per-thread arenas fragment under that pattern (docs/architecture.md, "Memory").
#[cfg(all(target_os = "linux", not(target_env = "musl")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser, Debug)]
#[command(
    name = "automanager-operator",
    version,
    about = "The AutoManager Kubernetes operator"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The operator's config file (YAML; see docs/operator-config.md). Without it every setting
    /// takes its default and `--manager-url` is required.
    #[arg(long, env = "AUTOMANAGER_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: ConfigOverrides,
    /// Log format.
    #[arg(long, env = "AUTOMANAGER_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// This replica's identity in leader election (default: hostname and pid).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Validate the settings (file, flags and environment, files they name included) and exit:
    /// 0 and `configuration is valid` when valid, 2 and every problem otherwise.
    #[arg(long)]
    check_config: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The settings file, without starting the operator.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Check a running operator, as the chart's `helm test` does: each `--url` answers 200 and
    /// a Pod of the release holds the `--lease`; retried until `--timeout`. Exit 0 when all
    /// hold, 1 otherwise.
    Probe(ProbeArgs),
}

#[derive(clap::Args, Debug)]
struct ProbeArgs {
    /// An http:// URL that must answer 200 (e.g. the metrics Service's /readyz); repeatable.
    #[arg(long)]
    url: Vec<String>,
    /// NAMESPACE/NAME of the leader Lease, read with the in-cluster (or kubeconfig) credentials.
    #[arg(long)]
    lease: Option<String>,
    /// The Lease's holder must start with this (the Deployment's Pods' prefix).
    #[arg(long, default_value = "")]
    holder_prefix: String,
    /// How long to keep trying.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// `automanager-operator probe`: every check passes within the deadline, or the last failures
/// are printed.
async fn probe(args: ProbeArgs) -> ExitCode {
    use automanager_operator::probe::{HttpTarget, ProbeError, get, lease};
    let mut targets = Vec::new();
    for url in &args.url {
        match HttpTarget::parse(url) {
            Ok(t) => targets.push((url.clone(), t)),
            Err(e) => {
                eprintln!("automanager-operator probe: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if targets.is_empty() && args.lease.is_none() {
        eprintln!("automanager-operator probe: nothing to check (give --url or --lease)");
        return ExitCode::from(2);
    }
    let deadline = tokio::time::Instant::now() + args.timeout;
    let mut client: Option<kube::Client> = None;
    loop {
        let mut failures: Vec<ProbeError> = Vec::new();
        let mut passed: Vec<String> = Vec::new();
        for (url, target) in &targets {
            match get(target, url, Duration::from_secs(5)).await {
                Ok(()) => passed.push(format!("{url}: 200")),
                Err(e) => failures.push(e),
            }
        }
        if let Some(name) = &args.lease {
            if client.is_none() {
                match kube::Config::infer().await.map(kube::Client::try_from) {
                    Ok(Ok(c)) => client = Some(c),
                    Ok(Err(e)) => failures.push(ProbeError::Lease {
                        lease: name.clone(),
                        reason: format!("connecting to Kubernetes: {e}"),
                    }),
                    Err(e) => failures.push(ProbeError::Lease {
                        lease: name.clone(),
                        reason: format!("no Kubernetes credentials: {e}"),
                    }),
                }
            }
            if let Some(c) = &client {
                match lease(c, name, &args.holder_prefix).await {
                    Ok(holder) => passed.push(format!("lease {name}: held by {holder}")),
                    Err(e) => failures.push(e),
                }
            }
        }
        if failures.is_empty() {
            for p in passed {
                println!("ok  {p}");
            }
            return ExitCode::SUCCESS;
        }
        if tokio::time::Instant::now() >= deadline {
            for p in passed {
                println!("ok  {p}");
            }
            for f in failures {
                println!("FAIL {f}");
            }
            return ExitCode::FAILURE;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print the settings' JSON Schema.
    Schema {
        /// Instead, write the schema of the Helm chart's `config` value into this
        /// `values.schema.json` (its `config` property is replaced, the rest kept as written).
        #[arg(long, value_name = "PATH")]
        chart_values: Option<PathBuf>,
    },
    /// Print the reference tables of docs/operator-config.md, or rewrite them in a file.
    Docs {
        /// Replace the generated part of this Markdown file (between its markers).
        #[arg(long, value_name = "PATH")]
        write: Option<PathBuf>,
    },
    /// Validate a settings file as the operator would load it (with the flags and environment
    /// below applied): exit 0 when valid, 2 listing every problem.
    Check {
        /// The settings file (YAML).
        file: PathBuf,
        #[command(flatten)]
        overrides: ConfigOverrides,
        /// Do not require the files the settings name (token, TLS) to exist, e.g. for a
        /// chart's settings checked away from the Pod that mounts them.
        #[arg(long)]
        no_file_checks: bool,
    },
}

/// `automanager-operator config ...`: what it prints goes to stdout, problems to stderr.
fn config_command(command: ConfigCommand) -> ExitCode {
    match command {
        ConfigCommand::Schema {
            chart_values: Some(path),
        } => {
            let fragment = automanager_operator::config::chart_values_schema();
            rewrite(&path, "the config schema into ", |file| {
                automanager_operator::config::splice_chart_values_schema(&file, &fragment)
            })
        }
        ConfigCommand::Schema { chart_values: None } => {
            match serde_json::to_string_pretty(&automanager_operator::config::schema()) {
                Ok(text) => {
                    println!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("automanager-operator: cannot render the schema: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        ConfigCommand::Docs { write: None } => {
            print!("{}", reference::markdown());
            ExitCode::SUCCESS
        }
        ConfigCommand::Docs { write: Some(path) } => rewrite(&path, "", |doc| {
            reference::splice(&doc, &reference::markdown())
        }),
        ConfigCommand::Check {
            file,
            overrides,
            no_file_checks,
        } => {
            let files = if no_file_checks {
                FileChecks::Skip
            } else {
                FileChecks::Check
            };
            match OperatorConfig::load_with(Some(&file), &overrides, files) {
                Ok(_) => {
                    println!("{}: valid", file.display());
                    ExitCode::SUCCESS
                }
                Err(errors) => {
                    eprintln!("{}: invalid configuration:\n{errors}", file.display());
                    ExitCode::from(2)
                }
            }
        }
    }
}

/// Rewrites the generated part of the file at `path` with `splice`, and says which file (after
/// `what`) it wrote or why it could not.
fn rewrite(
    path: &std::path::Path,
    what: &str,
    splice: impl FnOnce(String) -> Result<String, String>,
) -> ExitCode {
    let written = std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(splice)
        .and_then(|file| std::fs::write(path, file).map_err(|e| e.to_string()));
    match written {
        Ok(()) => {
            eprintln!("automanager-operator: wrote {what}{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("automanager-operator: {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Config(command)) => return config_command(command),
        Some(Command::Probe(args)) => {
            return match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(probe(args)),
                Err(e) => {
                    eprintln!("automanager-operator: cannot start the async runtime: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        None => {}
    }
    let config = match OperatorConfig::load(cli.config.as_deref(), &cli.overrides) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("automanager-operator: invalid configuration:\n{errors}");
            return ExitCode::from(2);
        }
    };
    if cli.check_config {
        println!("automanager-operator: configuration is valid");
        return ExitCode::SUCCESS;
    }
    init_tracing(&cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("automanager-operator: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config, cli.identity)) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = %e, "operator stopped");
            eprintln!("automanager-operator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// SIGTERM and SIGINT, registered when this is called (not when first awaited), so a signal
/// that arrives before the listening task first runs is not lost to the default action.
struct ShutdownSignals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    fn register() -> ShutdownSignals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            ShutdownSignals {
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        ShutdownSignals {}
    }

    /// Resolves on the next SIGTERM or SIGINT.
    async fn next(&mut self) {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! { _ = recv(&mut self.term) => {}, _ = recv(&mut self.int) => {} }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// How long the graceful shutdown may take after the first SIGTERM before the process exits
/// anyway: under the Pod's default `terminationGracePeriodSeconds` (30 s), so the operator, not
/// the kubelet's SIGKILL, says why it stopped.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(25);
/// The exit code when a second signal or [`SHUTDOWN_DEADLINE`] cut the graceful shutdown short.
const EXIT_SHUTDOWN_FORCED: i32 = 3;

/// `work`'s output, or `None` when `stopped` resolves first (a start-up stage must not outlive
/// a shutdown request).
async fn unless_stopped<T>(
    stopped: impl std::future::Future<Output = ()>,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        _ = stopped => None,
        out = work => Some(out),
    }
}

/// This replica's identity in leader election: the one given, else hostname and pid.
fn identity_or_default(identity: Option<String>) -> String {
    identity.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "localhost".into());
        format!("{host}-{}", std::process::id())
    })
}

/// The shutdown signal as a value: `true` once SIGTERM/SIGINT arrives. A second signal, or
/// [`SHUTDOWN_DEADLINE`] after the first, exits the process at once.
fn shutdown_on_signals() -> watch::Receiver<bool> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut signals = ShutdownSignals::register();
    tokio::spawn(async move {
        signals.next().await;
        tracing::info!("shutdown requested");
        let _ = stop_tx.send(true);
        // The graceful path waits for in-flight reconciles and calls; it must not hold the
        // process past the Pod's grace period (30 s by default), and a second signal means now.
        tokio::select! {
            _ = signals.next() => {
                tracing::warn!("second shutdown signal: exiting at once");
            }
            _ = tokio::time::sleep(SHUTDOWN_DEADLINE) => {
                tracing::error!(deadline = ?SHUTDOWN_DEADLINE, "graceful shutdown did not finish in time: exiting");
            }
        }
        std::process::exit(EXIT_SHUTDOWN_FORCED);
    });
    stop_rx
}

/// A future that resolves once `stop` turns true.
fn stopped(stop: &watch::Receiver<bool>) -> impl std::future::Future<Output = ()> + use<> {
    let mut rx = stop.clone();
    async move {
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// The Manager client the settings ask for: our first API, or the published one.
async fn connect_manager(
    config: &OperatorConfig,
    client: &kube::Client,
) -> anyhow::Result<manager_client::ManagerClient> {
    let manager_config = config
        .manager
        .client_config()
        .map_err(|e| anyhow::anyhow!("Manager settings: {e}"))?;
    let manager = match config.manager.api {
        automanager_operator::config::ManagerApi::V1 => {
            manager_client::ManagerClient::connect(manager_config).await
        }
        automanager_operator::config::ManagerApi::Published => {
            published_port(&config.manager, manager_config, client.clone())
        }
    };
    manager.map_err(|e| anyhow::anyhow!("Manager client: {e}"))
}

async fn run(config: OperatorConfig, identity: Option<String>) -> anyhow::Result<ExitCode> {
    let identity = identity_or_default(identity);
    let stop = shutdown_on_signals();

    // The one clock every decision reads (automanager_operator::clock).
    let clock = SystemClock::shared();
    let Some(kube_config) = unless_stopped(stopped(&stop), kube::Config::infer()).await else {
        return Ok(ExitCode::SUCCESS);
    };
    let kube_config = kube_config.map_err(|e| anyhow::anyhow!("connecting to Kubernetes: {e}"))?;
    // The election's client: it must renew the Lease whatever the fence says.
    let election_client = kube::Client::try_from(kube_config.clone())
        .map_err(|e| anyhow::anyhow!("connecting to Kubernetes: {e}"))?;
    let election = run_leader_election(
        election_client.clone(),
        &config.leader_election,
        identity.clone(),
        clock.clone(),
        stopped(&stop),
    )
    .await;
    // Everything else writes only while the lease is surely held (crate::fence).
    let client = kube::client::ClientBuilder::try_from(kube_config)
        .map_err(|e| anyhow::anyhow!("connecting to Kubernetes: {e}"))?
        .with_layer(&election.fence.layer())
        .build();
    let Some(manager) = unless_stopped(stopped(&stop), connect_manager(&config, &client)).await
    else {
        let _ = election.task.await;
        return Ok(ExitCode::SUCCESS);
    };
    let manager = manager?;
    manager.fence_writes(election.fence.for_manager());
    let replica = Replica::serve(
        &config,
        client,
        manager.clone(),
        clock,
        &identity,
        election_client,
        &stop,
    )?;
    let Replica {
        ctx,
        readiness,
        metrics,
        server,
        debug_server,
    } = replica;

    readiness.set_caches_synced(true);
    if !stand_by(&identity, &election, &manager, &readiness, &metrics, &stop).await {
        manager.close().await;
        let _ = election.task.await;
        return Ok(ExitCode::SUCCESS);
    }
    let lost = lead(ctx, &election.is_leader, &stop).await;
    manager.close().await;
    if lost {
        // The election and the HTTP server run until shutdown; a process that lost the lease
        // exits now instead, so its replacement starts from a clean slate.
        tracing::error!("lost leadership; exiting so a fresh process can stand by");
        return Ok(ExitCode::FAILURE);
    }
    let _ = election.task.await;
    let _ = server.await;
    if let Some(debug_server) = debug_server {
        let _ = tokio::task::spawn_blocking(move || debug_server.join()).await;
    }
    Ok(ExitCode::SUCCESS)
}

/// Stands by until this replica leads and Manager answers: true then, false when the process
/// is to stop instead (a shutdown, or the election ended).
async fn stand_by(
    identity: &str,
    election: &LeaderElection,
    manager: &manager_client::ManagerClient,
    readiness: &Readiness,
    metrics: &Metrics,
    stop: &watch::Receiver<bool>,
) -> bool {
    let mut is_leader = election.is_leader.clone();
    tracing::info!(identity = %identity, "waiting for leadership");
    readiness.set_leader(false);
    metrics.set_leader(false);
    tokio::select! {
        r = is_leader.wait_for(|l| *l) => { if r.is_err() { return false } }
        _ = stopped(stop) => return false,
    }
    readiness.set_leader(true);
    metrics.set_leader(true);
    tracing::info!(identity = %identity, "leading: starting controllers");
    if unless_stopped(stopped(stop), wait_for_manager(manager))
        .await
        .is_none()
    {
        tracing::info!("shutdown while waiting for Manager: controllers not started");
        return false;
    }
    true
}

/// What a replica runs whether it leads or stands by: the context the controllers will use,
/// readiness and metrics, and the HTTP servers.
struct Replica {
    ctx: Arc<Context>,
    readiness: Readiness,
    metrics: Metrics,
    server: tokio::task::JoinHandle<Result<(), http::HttpError>>,
    debug_server: Option<std::thread::JoinHandle<()>>,
}

impl Replica {
    fn serve(
        config: &OperatorConfig,
        client: kube::Client,
        manager: manager_client::ManagerClient,
        clock: automanager_operator::clock::SharedClock,
        identity: &str,
        election_client: kube::Client,
        stop: &watch::Receiver<bool>,
    ) -> anyhow::Result<Replica> {
        let metrics = Metrics::new();
        tokio::spawn(automanager_operator::runtime::follow_connection_state(
            manager.state(),
            metrics.clone(),
        ));
        let readiness = Readiness::with_manager_grace(config.manager.readiness_grace);
        // Manager's connection state is part of readiness.
        readiness.follow_manager(&manager);
        let ctx = Context::new(
            client,
            manager,
            Settings::from_config(config),
            metrics.clone(),
            clock,
            identity,
        );
        let server = tokio::spawn(http::serve(
            config.http.bind_address,
            http::router(metrics.clone(), readiness.clone()),
            stopped(stop),
        ));
        let debug_server = match config.http.debug_bind_address {
            None => None,
            Some(addr) => Some(spawn_debug_api(
                addr,
                config,
                election_client,
                ctx.clone(),
                readiness.clone(),
                stopped(stop),
            )?),
        };
        Ok(Replica {
            ctx,
            readiness,
            metrics,
            server,
            debug_server,
        })
    }
}

/// Waits up to 30 s for Manager; controllers start either way (and report Stalled until it
/// answers).
async fn wait_for_manager(manager: &manager_client::ManagerClient) {
    if manager.wait_ready(Duration::from_secs(30)).await.is_err() {
        tracing::warn!(
            "Manager is not reachable yet; controllers start and report Stalled until it is"
        );
    }
}

/// Runs the controllers until shutdown or until leadership is lost; returns whether it was
/// lost (and not a shutdown).
async fn lead(
    ctx: Arc<Context>,
    is_leader: &watch::Receiver<bool>,
    stop: &watch::Receiver<bool>,
) -> bool {
    let (lost_tx, lost_rx) = watch::channel(false);
    {
        let mut is_leader = is_leader.clone();
        tokio::spawn(async move {
            let _ = is_leader.wait_for(|l| !*l).await;
            let _ = lost_tx.send(true);
        });
    }
    let controllers_stop = {
        let stopped = stopped(stop);
        let mut lost = lost_rx.clone();
        async move {
            tokio::select! { _ = stopped => {}, _ = lost.wait_for(|l| *l) => {} }
        }
        .shared()
    };
    run_controllers(ctx, controllers_stop).await;
    *lost_rx.borrow() && !*stop.borrow()
}

/// The debugging API on its own port, on a thread and runtime of its own: its handlers read
/// in-memory snapshots only, and a what-if must answer while every worker of the main runtime
/// is busy with reconciles (a wave of thousands of bundles). A standby answers with the Lease's
/// holder, so a client can go to the leader.
fn spawn_debug_api(
    addr: std::net::SocketAddr,
    config: &OperatorConfig,
    election_client: kube::Client,
    ctx: Arc<Context>,
    readiness: Readiness,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(election_client, &config.leader_election.lease_namespace);
    let lease_name = config.leader_election.lease_name.clone();
    let lookup: http::LeaderLookup = Arc::new(move || {
        let leases = leases.clone();
        let name = lease_name.clone();
        Box::pin(async move {
            let read = tokio::time::timeout(Duration::from_secs(5), leases.get_opt(&name));
            match read.await {
                Ok(Ok(lease)) => lease?.spec?.holder_identity,
                _ => None,
            }
        })
    });
    let router = http::debug_router_for_replica(Arc::new(DebugState(ctx)), readiness, lookup);
    std::thread::Builder::new()
        .name("debug-api".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match runtime {
                Ok(rt) => {
                    if let Err(e) = rt.block_on(http::serve(addr, router, stop)) {
                        tracing::error!(error = %e, "debugging API stopped");
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "debugging API: cannot start its runtime")
                }
            }
        })
        .map_err(|e| anyhow::anyhow!("starting the debugging API's thread: {e}"))
}

/// The client over Manager's published API: its own connection and mirror, the pool catalog
/// kept from the PlacementPools, and the port that carries the operator's calls over them.
fn published_port(
    settings: &automanager_operator::config::ManagerConfig,
    connection: manager_client::ClientConfig,
    kube: kube::Client,
) -> Result<manager_client::ManagerClient, manager_client::ClientError> {
    use manager_client::published::{PoolCatalog, PublishedClient, PublishedConfig, PublishedPort};
    let mut published = PublishedConfig::new(connection.endpoint.clone());
    published.connection = connection.clone();
    let client = std::sync::Arc::new(PublishedClient::connect(published)?);
    let catalog = PoolCatalog::new();
    tokio::spawn(automanager_operator::published_catalog::follow_pools(
        kube,
        catalog.clone(),
    ));
    tracing::info!(owner = %settings.owner, "speaking Manager's published API");
    let port = PublishedPort::new(client, catalog, settings.owner.clone());
    manager_client::ManagerClient::over(std::sync::Arc::new(port), &connection)
}
