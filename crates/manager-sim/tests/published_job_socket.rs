//! The published world's jobs speak the real job socket when the sim runs one: a started
//! instance's job is started on the socket, and a handover over our extension is relayed to the
//! source and target jobs there, each ask a command on the socket and each answer the job's own.

use std::collections::BTreeMap;
use std::time::Duration;

use manager_proto::api::common::{JobId, NodeId};
use manager_proto::api::manager::manager_client::ManagerClient;
use manager_proto::api::manager::{CreateAwsNodeRequest, Job, StartJobRequest};
use manager_proto::extension::manager_extension_client::ManagerExtensionClient;
use manager_proto::extension::watch_event::Event;
use manager_proto::extension::{
    Migration, MigrationCutoverRequest, MigrationGetStateRequest, MigrationPrepareTargetRequest,
    WatchRequest,
};
use manager_proto::{MigrationPhase, MigrationStrategy};
use manager_sim::{JobSocketConfig, Sim, SimConfig};
use tonic::transport::Channel;
use tonic::{Code, Streaming};

const WAIT: Duration = Duration::from_secs(20);
const JOB: &str = "default.b/0/enc";

fn id(node: &str) -> Option<NodeId> {
    Some(NodeId {
        node_id: node.to_owned(),
    })
}

fn job_id() -> Option<JobId> {
    Some(JobId {
        job_id: JOB.to_owned(),
    })
}

/// Starts the job under `role` on `node` once the node runs (the demo's aws pool starts a node
/// after its provisioning delay; until then a start is refused as a failed precondition).
async fn start_when_up(manager: &mut ManagerClient<Channel>, node: &str, role: &str) {
    tokio::time::timeout(WAIT, async {
        loop {
            let r = manager
                .start_job(StartJobRequest {
                    job_id: job_id(),
                    role: role.to_owned(),
                    node_id: id(node),
                })
                .await;
            match r {
                Ok(_) => return,
                Err(s) if s.code() == Code::FailedPrecondition => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(s) => panic!("{s}"),
            }
        }
    })
    .await
    .expect("started in time");
}

/// The next migration record the Watch sends whose phase is `phase`.
async fn phase(
    watch: &mut Streaming<manager_proto::extension::WatchEvent>,
    phase: MigrationPhase,
) -> Migration {
    tokio::time::timeout(WAIT, async {
        loop {
            let e = watch
                .message()
                .await
                .expect("a message")
                .expect("not the end");
            if let Some(Event::Migration(m)) = e.event {
                assert_ne!(m.phase, MigrationPhase::Aborted as i32, "{m:?}");
                if m.phase == phase as i32 {
                    return m;
                }
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{phase:?} in time"))
}

#[tokio::test]
async fn a_handover_over_our_extension_goes_through_the_job_socket() {
    let agent = Sim::socket_agent(JobSocketConfig::default())
        .await
        .expect("job socket");
    let sim = Sim::start_with_agent(SimConfig::demo(), agent.clone())
        .await
        .expect("sim");
    sim.run_published_job_socket(agent.clone());
    let mut manager = ManagerClient::connect(sim.endpoint())
        .await
        .expect("connect");
    let mut ext = ManagerExtensionClient::connect(sim.endpoint())
        .await
        .expect("connect");
    for node in ["src", "dst"] {
        manager
            .create_aws_node(CreateAwsNodeRequest {
                node_id: id(node),
                tags: BTreeMap::new(),
                region: "eu-west-1".to_owned(),
                instance_type: "m5.xlarge".to_owned(),
                ..Default::default()
            })
            .await
            .expect("created");
    }
    manager
        .create_job(Job {
            job_id: job_id(),
            ..Default::default()
        })
        .await
        .expect("job stored");
    start_when_up(&mut manager, "src", "primary").await;
    // The started instance's job is registered on the socket under its normal path once it
    // runs (after the sim's job start delay).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let key = loop {
        if let Some(key) = agent.instance_key(JOB, "src") {
            break key;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never registered on the socket"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(key.role, "normal");
    let mut watch = ext
        .watch(WatchRequest {})
        .await
        .expect("watch")
        .into_inner();
    ext.migration_get_state(MigrationGetStateRequest {
        migration_id: "m1".to_owned(),
        job_id: job_id(),
        source_role: "primary".to_owned(),
        strategy: MigrationStrategy::Handover as i32,
    })
    .await
    .expect("proposed");
    let m = phase(&mut watch, MigrationPhase::StateReceived).await;
    // Refused (and nothing changed) until the destination runs.
    tokio::time::timeout(WAIT, async {
        loop {
            let r = ext
                .migration_prepare_target(MigrationPrepareTargetRequest {
                    migration_id: "m1".to_owned(),
                    target_node_id: id("dst"),
                    target_role: "migration-target".to_owned(),
                    initial_state: m.source_state.clone(),
                })
                .await
                .expect("target asked for")
                .into_inner();
            if !r.target_rejected {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a target in time");
    phase(&mut watch, MigrationPhase::TargetReady).await;
    ext.migration_cutover(MigrationCutoverRequest {
        migration_id: "m1".to_owned(),
        payload: b"{}".to_vec(),
    })
    .await
    .expect("cut over");
    let done = phase(&mut watch, MigrationPhase::Completed).await;

    // Every ask crossed the socket (get-state, initial-state, cutover-ready, cutover-apply),
    // and the simulated job applied its participants.
    assert_eq!(agent.commands_sent(JOB), 4);
    assert_eq!(done.applied, ["input", "output"]);
    // The job goes on at the target, whose socket instance is the migration's target.
    let moved = agent
        .instance_key(JOB, "dst")
        .expect("the target on the socket");
    assert!(moved.role.starts_with("migrationTarget:"), "{moved:?}");
    assert!(agent.instance_key(JOB, "src").is_none(), "the source left");
}
