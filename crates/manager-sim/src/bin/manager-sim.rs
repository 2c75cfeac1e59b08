//! `manager-sim`: serve a simulated Norsk Manager, or inject faults into a
//! running one.
//!
//! ```text
//! manager-sim serve [--config FILE] [--listen ADDR] [--state-dir DIR] [--token T] [--no-job-socket]
//!                   [--no-extension]
//! manager-sim check-config FILE
//! manager-sim chaos kill-node ID        --addr http://127.0.0.1:PORT [--token T]
//! manager-sim chaos notice-node ID [--in SECONDS] [--reason R]
//! manager-sim chaos fail-job ID [--message M] [--role R]
//! manager-sim chaos reject-next N
//! manager-sim chaos cut-streams
//! manager-sim chaos slow-provision MS
//! manager-sim chaos partition-zone ZONE [--heal]
//! manager-sim chaos kill-zone ZONE [--revive]
//! manager-sim chaos migration-behaviour JOB_ID cooperative|refuse-state|slow-cutover MS|fail-participant ID|abort-at POINT
//! manager-sim chaos job-history JOB_ID
//! manager-sim calls                     --addr http://127.0.0.1:PORT [--token T]
//! ```
//!
//! `chaos job-history` injects nothing: it prints what the sim saw of a job
//! (instance starts with their roles, time without a running instance) as
//! one JSON object.
//!
//! Every fault reaches both of the sim's worlds: the one of our first API
//! (`norsk.manager.v1`, job ids `bundle/replica/job`) and the one of Manager's
//! published API (`norsk.api.manager`, job ids `namespace.name/replica/job`,
//! nodes under the ids their callers chose). A job or node id only one world
//! knows is that world's; a zone fault, `reject-next` and `slow-provision`
//! apply to both.
//!
//! `serve` runs the jobs over the real job socket (one listener on
//! 127.0.0.1:0 for every simulated node) unless `--no-job-socket`, which
//! falls back to the in-process cooperative agent.
//!
//! `serve` prints exactly one line `manager-sim listening on ADDR` on stdout
//! once the port is bound, so scripts can read the address.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use manager_proto::sim_admin_client::SimAdminClient;
use manager_proto::{
    CallCountsRequest, CutStreamsRequest, FailJobRequest, JobHistoryRequest, JobHistoryResponse,
    JobRole, KillNodeRequest, KillZoneRequest, MigrationBehaviour, NoticeNodeRequest,
    PartitionZoneRequest, RejectNextRequest, SetMigrationBehaviourRequest, SlowProvisionRequest,
};
use manager_sim::{AbortAt, JobBehaviour, Sim, SimSetup};

#[derive(Parser)]
#[command(
    name = "manager-sim",
    version,
    about = "A simulated Norsk Manager (gRPC) with fault injection"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Manager and SimAdmin gRPC services.
    Serve {
        /// YAML config (default: the built-in demo config, examples/demo.yaml).
        #[arg(long, env = "MANAGER_SIM_CONFIG")]
        config: Option<PathBuf>,
        /// Override the listen address.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Persist the world here so it survives a restart.
        #[arg(long, env = "MANAGER_SIM_STATE_DIR")]
        state_dir: Option<PathBuf>,
        /// Require this bearer token (overrides the config).
        #[arg(long, env = "MANAGER_SIM_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Realistic timings: nodes take 5 s to provision, jobs 1 s to
        /// start and 500 ms to stop (per-pool overrides still apply).
        #[arg(long)]
        realistic: bool,
        /// Answer migrations in process (a cooperative job with nothing to
        /// hand over) instead of over the real job socket.
        #[arg(long)]
        no_job_socket: bool,
        /// Serve Manager's published API without our extension service
        /// (automanager.manager.extension.v1): its calls answer UNIMPLEMENTED, as from a
        /// Manager that has only the published API.
        #[arg(long)]
        no_extension: bool,
    },
    /// Validate a config file and list every problem.
    CheckConfig {
        /// The file.
        config: PathBuf,
    },
    /// Inject a fault into a running sim (or read a job's history).
    Chaos {
        /// The sim's endpoint, e.g. http://127.0.0.1:6789.
        #[arg(
            long,
            global = true,
            env = "MANAGER_SIM_ADDR",
            default_value = "http://127.0.0.1:6789"
        )]
        addr: String,
        /// Bearer token, if the sim requires one.
        #[arg(long, global = true, env = "MANAGER_SIM_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[command(subcommand)]
        fault: Fault,
    },
    /// Print how many calls of each Manager RPC a running sim has served (the
    /// published API's as `norsk.api.manager/RPC`, our extension's as
    /// `automanager.manager.extension.v1/RPC`), then `mutating N`: the calls
    /// that asked Manager to change something.
    Calls {
        /// The sim's endpoint, e.g. http://127.0.0.1:6789.
        #[arg(
            long,
            env = "MANAGER_SIM_ADDR",
            default_value = "http://127.0.0.1:6789"
        )]
        addr: String,
        /// Bearer token, if the sim requires one.
        #[arg(long, env = "MANAGER_SIM_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
}

#[derive(Subcommand)]
enum Fault {
    /// Kill a node: its job instances fail, it is terminated at once.
    KillNode {
        /// Node id.
        id: String,
    },
    /// Announce that a node will be reclaimed (a Spot interruption): it is killed when the
    /// notice runs out.
    NoticeNode {
        /// Node id.
        id: String,
        /// Seconds until the node is taken (a Spot interruption gives 120).
        #[arg(long = "in", default_value_t = 120)]
        in_seconds: u64,
        /// Why, e.g. spot-interruption or maintenance.
        #[arg(long, default_value = "spot-interruption")]
        reason: String,
    },
    /// Make a job's running instance fail (over the published API: it stops with
    /// JOB_STOPPED_JOB_FAILED).
    FailJob {
        /// Job id (`bundle/replica/job`; over the published API `namespace.name/replica/job`).
        id: String,
        /// Failure detail.
        #[arg(long, default_value = "")]
        message: String,
        /// Over the published API: the role whose instance fails (default: every running
        /// instance of the job).
        #[arg(long, default_value = "")]
        role: String,
    },
    /// Refuse the next N job starts (0 clears). Over the published API the start is
    /// answered and its instance stops as failed before it ever runs.
    RejectNext {
        /// How many.
        n: u32,
    },
    /// Close every open Watch stream (and every published EventStream).
    CutStreams,
    /// Set every elastic pool's provisioning delay, for nodes created from now on.
    SlowProvision {
        /// Delay in milliseconds.
        ms: u64,
    },
    /// Partition a zone: its running nodes stop answering and their instances fail
    /// (over the published API: the nodes stop for HEALTH_PING_TIME_EXCEEDED); --heal
    /// brings them back, empty.
    PartitionZone {
        /// Zone name.
        zone: String,
        /// Heal instead.
        #[arg(long)]
        heal: bool,
    },
    /// Kill a zone: every node in it dies at once, starting ones too, and
    /// nodes that come up there die until it is revived (--revive).
    KillZone {
        /// Zone name.
        zone: String,
        /// End the outage instead.
        #[arg(long)]
        revive: bool,
    },
    /// Script how a job answers its job socket during a handover (replaces
    /// its earlier behaviour). Over the published API it is how the job answers
    /// our extension's migration handshake.
    MigrationBehaviour {
        /// Job id (`bundle/replica/job`; over the published API `namespace.name/replica/job`).
        job_id: String,
        #[command(subcommand)]
        behaviour: Behaviour,
    },
    /// Print what the sim saw of a job as JSON: every instance start with its
    /// role, and how long the job had no running instance. Injects nothing.
    JobHistory {
        /// Job id (`bundle/replica/job`; over the published API `namespace.name/replica/job`).
        job_id: String,
    },
}

#[derive(Subcommand)]
enum Behaviour {
    /// Answer everything (clears any switch).
    Cooperative,
    /// Answer get-state with state-refused.
    RefuseState,
    /// Wait MS milliseconds before stopping output at cutover.
    SlowCutover {
        /// Delay in milliseconds (at most 600000).
        ms: u64,
    },
    /// Report participant ID as failed in target-applied.
    FailParticipant {
        /// Participant id (e.g. output).
        id: String,
    },
    /// Abort from the job at POINT: get-state, state-given, initial-state,
    /// target-ready or cutover-ready.
    AbortAt {
        /// The point.
        point: String,
    },
}

impl Behaviour {
    fn into_proto(self) -> Result<MigrationBehaviour, String> {
        let mut b = JobBehaviour::default();
        match self {
            Behaviour::Cooperative => {}
            Behaviour::RefuseState => b.refuse_state = true,
            Behaviour::SlowCutover { ms } => b.cutover_delay_ms = ms,
            Behaviour::FailParticipant { id } => b.fail_participants = vec![id],
            Behaviour::AbortAt { point } => {
                let names: Vec<&str> = AbortAt::ALL.iter().map(|a| a.name()).collect();
                b.abort_at = Some(AbortAt::parse(&point).ok_or_else(|| {
                    format!("unknown abort point {point:?}; one of {}", names.join(", "))
                })?);
            }
        }
        b.validate().map_err(|e| e.to_string())?;
        Ok(b.to_proto())
    }
}

/// A job's history for people and scripts: roles by name, camelCase keys.
fn history_json(h: &JobHistoryResponse) -> serde_json::Value {
    let starts: Vec<serde_json::Value> = h
        .starts
        .iter()
        .map(|s| {
            serde_json::json!({
                "nodeId": s.node_id,
                "role": match s.role() {
                    JobRole::MigrationTarget => "migrationTarget",
                    _ => "normal",
                },
                "migrationId": s.migration_id,
                "atMs": s.at_ms,
            })
        })
        .collect();
    serde_json::json!({
        "starts": starts,
        "uncoveredMs": h.uncovered_ms,
        "gaps": h.gaps,
        "maxRunning": h.max_running,
        "running": h.running,
    })
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("manager-sim: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("manager-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Serve {
            config,
            listen,
            state_dir,
            token,
            realistic,
            no_job_socket,
            no_extension,
        } => {
            let SimSetup {
                sim: mut cfg,
                job_socket,
            } = match config {
                Some(path) => SimSetup::from_file(&path).map_err(|e| e.to_string())?,
                None => SimSetup {
                    sim: manager_sim::SimConfig::demo(),
                    job_socket: manager_sim::JobSocketConfig::default(),
                },
            };
            // Manager's own overrides file retargets provider configs: the sim's pools.
            let env = std::env::var(manager_sim::overrides::ENV_FILE).ok();
            if let Some(path) = manager_sim::overrides::locate(env.as_deref()) {
                let o = manager_sim::overrides::read(&path).map_err(|e| e.to_string())?;
                let changed = manager_sim::overrides::apply(&o, &mut cfg, &path)
                    .map_err(|e| e.to_string())?;
                tracing::info!(file = %path.display(), pools = ?changed, "applied Manager's overrides file");
            }
            if let Some(l) = listen {
                cfg.listen = l;
            }
            if state_dir.is_some() {
                cfg.state_dir = state_dir;
            }
            if token.is_some() {
                cfg.token = token;
            }
            if realistic {
                cfg.timing = manager_sim::config::TimingConfig::realistic();
            }
            // Both worlds' jobs speak the one job socket; without it the published world
            // answers its handshake in process, with the same rules.
            let rules = job_socket.behaviours.clone();
            let socket = if no_job_socket {
                None
            } else {
                Some(
                    Sim::socket_agent(job_socket)
                        .await
                        .map_err(|e| e.to_string())?,
                )
            };
            let agent: std::sync::Arc<dyn manager_sim::JobAgent> = match &socket {
                Some(s) => s.clone(),
                None => std::sync::Arc::new(manager_sim::DefaultAgent),
            };
            let options = manager_sim::SimOptions {
                extension: !no_extension,
            };
            let sim = Sim::start_with_options(cfg, agent, options)
                .await
                .map_err(|e| e.to_string())?;
            sim.set_published_behaviour_rules(rules);
            if let Some(s) = socket {
                sim.run_published_job_socket(s);
            }
            if let Some(addr) = sim.addr() {
                println!("manager-sim listening on {addr}");
            }
            let sigterm = async {
                #[cfg(unix)]
                {
                    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    {
                        Ok(mut s) => {
                            s.recv().await;
                        }
                        Err(_) => std::future::pending::<()>().await,
                    }
                }
                #[cfg(not(unix))]
                std::future::pending::<()>().await;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = sigterm => {}
            }
            sim.shutdown().await;
            Ok(())
        }
        Command::CheckConfig { config } => {
            SimSetup::from_file(&config).map_err(|e| e.to_string())?;
            println!("{}: ok", config.display());
            Ok(())
        }
        Command::Chaos { addr, token, fault } => chaos(addr, token, fault).await,
        Command::Calls { addr, token } => {
            let counts = admin_client(addr, token)
                .await?
                .call_counts(CallCountsRequest {})
                .await
                .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
                .into_inner();
            let mut calls: Vec<_> = counts.calls.into_iter().collect();
            calls.sort();
            for (rpc, n) in calls {
                println!("{rpc} {n}");
            }
            println!("mutating {}", counts.mutating);
            Ok(())
        }
    }
}

/// Adds the bearer token, when there is one, to every SimAdmin call.
#[derive(Clone)]
struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.0 {
            r.metadata_mut().insert("authorization", h.clone());
        }
        Ok(r)
    }
}

type AdminClient = SimAdminClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

/// A SimAdmin client of the sim at `addr`, sending `token` as a bearer token.
async fn admin_client(addr: String, token: Option<String>) -> Result<AdminClient, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(addr.clone())
        .map_err(|e| format!("bad --addr {addr:?}: {e}"))?
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(std::time::Duration::from_secs(10));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot reach {addr}: {e}"))?;
    let header = match &token {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse::<tonic::metadata::MetadataValue<_>>()
                .map_err(|_| "the token contains characters not allowed in a header".to_owned())?,
        ),
        None => None,
    };
    Ok(SimAdminClient::with_interceptor(channel, Bearer(header)))
}

async fn chaos(addr: String, token: Option<String>, fault: Fault) -> Result<(), String> {
    let mut client = admin_client(addr, token).await?;
    let resp = match fault {
        Fault::KillNode { id } => client.kill_node(KillNodeRequest { node_id: id }).await,
        Fault::NoticeNode {
            id,
            in_seconds,
            reason,
        } => {
            client
                .notice_node(NoticeNodeRequest {
                    node_id: id,
                    in_ms: in_seconds.saturating_mul(1000),
                    reason,
                })
                .await
        }
        Fault::FailJob { id, message, role } => {
            let mut req = tonic::Request::new(FailJobRequest {
                job_id: id,
                message,
            });
            if !role.is_empty() {
                let value = role
                    .parse()
                    .map_err(|_| "--role must be printable ASCII".to_owned())?;
                req.metadata_mut()
                    .insert(manager_sim::FAIL_JOB_ROLE_HEADER, value);
            }
            client.fail_job(req).await
        }
        Fault::RejectNext { n } => client.reject_next(RejectNextRequest { count: n }).await,
        Fault::CutStreams => client.cut_streams(CutStreamsRequest {}).await,
        Fault::SlowProvision { ms } => {
            client
                .slow_provision(SlowProvisionRequest { delay_ms: ms })
                .await
        }
        Fault::PartitionZone { zone, heal } => {
            client
                .partition_zone(PartitionZoneRequest { zone, heal })
                .await
        }
        Fault::KillZone { zone, revive } => {
            let r = client
                .kill_zone(KillZoneRequest { zone, revive })
                .await
                .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
                .into_inner();
            println!("{}", r.summary);
            return Ok(());
        }
        Fault::MigrationBehaviour { job_id, behaviour } => {
            let behaviour = Some(behaviour.into_proto()?);
            client
                .set_migration_behaviour(SetMigrationBehaviourRequest { job_id, behaviour })
                .await
        }
        Fault::JobHistory { job_id } => {
            let h = client
                .job_history(JobHistoryRequest { job_id })
                .await
                .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
                .into_inner();
            println!("{}", history_json(&h));
            return Ok(());
        }
    }
    .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    println!("{}", resp.into_inner().summary);
    Ok(())
}
