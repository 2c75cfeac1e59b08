//! Migrations through the real sim over gRPC and real WebSockets: the four
//! `NodeControllerMigration*` calls drive simulated jobs that speak the job
//! socket through the real listener and the real job client SDK (handover),
//! or move jobs without a word to them (overlap, stop-then-start), also
//! between workers that run no job socket listener.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use job_socket::phase::Phase;
use manager_proto::manager_client::ManagerClient;
use manager_proto::sim_admin_client::SimAdminClient;
use manager_proto::{
    Bundle, BundleJob, JOB_SOCKET_CAPABILITY, Job, JobHistoryRequest, JobHistoryResponse,
    JobRequirements, JobRole, JobState, ListNodesRequest, Migration, MigrationBehaviour,
    MigrationParty, MigrationPhase, MigrationStrategy, NodeControllerMigrationAbort,
    NodeControllerMigrationCutover, NodeControllerMigrationGetState,
    NodeControllerMigrationPrepareTarget, RegisterBundleRequest, SetMigrationBehaviourRequest,
    StartJobRequest,
};
use manager_sim::behaviour::BehaviourRule;
use manager_sim::{AbortAt, JobBehaviour, JobSocketConfig, Sim, SimConfig, SimHandle, SocketAgent};
use tonic::transport::Channel;

/// Upper bound for anything to settle; never reached when things work.
const WAIT: Duration = Duration::from_secs(10);

const CONFIG: &str = r"
timing: {provisionDelayMs: 10, jobStartDelayMs: 5, jobStopDelayMs: 5}
pools:
  - name: dc
    kind: cluster
    region: lon
    zones: [a, b]
    scaleOut: fixed
    nodes:
      - {id: dc-a, zone: a, capacity: 100, cores: 64}
      - {id: dc-b, zone: b, capacity: 100, cores: 64}
  - name: legacy
    kind: cluster
    region: lon
    zones: [a]
    scaleOut: fixed
    jobSocket: false
    nodes:
      - {id: old-1, zone: a, capacity: 100, cores: 64}
      - {id: old-2, zone: a, capacity: 100, cores: 64}
";

struct Rig {
    sim: SimHandle,
    agent: Arc<SocketAgent>,
    manager: ManagerClient<Channel>,
    admin: SimAdminClient<Channel>,
}

async fn rig(rules: Vec<BehaviourRule>) -> Rig {
    let agent = SocketAgent::start(JobSocketConfig {
        answer_timeout_ms: 10_000,
        behaviours: rules,
        ..JobSocketConfig::default()
    })
    .await
    .unwrap();
    assert!(agent.listener_addr().ip().is_loopback());
    connect(SimConfig::from_yaml(CONFIG).unwrap(), agent).await
}

/// A sim with `config` whose jobs are on `agent`'s socket, and clients.
async fn connect(config: SimConfig, agent: Arc<SocketAgent>) -> Rig {
    let sim = Sim::start_with_agent(config, agent.clone()).await.unwrap();
    Rig {
        manager: ManagerClient::connect(sim.endpoint()).await.unwrap(),
        admin: SimAdminClient::connect(sim.endpoint()).await.unwrap(),
        sim,
        agent,
    }
}

async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn phase(m: &Migration) -> MigrationPhase {
    MigrationPhase::try_from(m.phase).unwrap()
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap()
}

impl Rig {
    fn job(&self, id: &str) -> Job {
        self.sim.with_world(|w, _| w.job(id).cloned()).unwrap()
    }

    fn migration(&self, id: &str) -> Migration {
        self.sim
            .with_world(|w, _| w.migration(id).cloned())
            .unwrap()
    }

    async fn until_phase(&self, id: &str, want: MigrationPhase) -> Migration {
        eventually(&format!("{id} to reach {want:?}"), || {
            let m = self.migration(id);
            (phase(&m) == want).then_some(m)
        })
        .await
    }

    async fn until_final(&self, id: &str) -> Migration {
        eventually(&format!("{id} to end"), || {
            let m = self.migration(id);
            matches!(
                phase(&m),
                MigrationPhase::Completed | MigrationPhase::Aborted
            )
            .then_some(m)
        })
        .await
    }

    /// Registers bundle `bundle` (one job `enc`), starts replica 0 on
    /// `node` and waits until its job is connected to the socket.
    async fn running_job(&mut self, bundle: &str, node: &str) -> String {
        let b = Bundle {
            bundle_id: bundle.into(),
            replicas: 1,
            jobs: vec![BundleJob {
                job_name: "enc".into(),
                requirements: Some(JobRequirements {
                    required_capacity: 1.0,
                    required_cores: 1,
                    required_capabilities: vec![],
                    priority_band: "gold".into(),
                }),
                config: Vec::new(),
                template: Vec::new(),
            }],
            ..Default::default()
        };
        self.manager
            .register_bundle(RegisterBundleRequest { bundle: Some(b) })
            .await
            .unwrap();
        let job_id = format!("{bundle}/0/enc");
        let r = self
            .manager
            .start_job(StartJobRequest {
                job_id: job_id.clone(),
                node_id: node.into(),
                role: JobRole::Normal as i32,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.accepted, "{r:?}");
        eventually("the job to run", || {
            (self.job(&job_id).state == JobState::Running as i32).then_some(())
        })
        .await;
        if !node.starts_with("old-") {
            let agent = self.agent.clone();
            let j = job_id.clone();
            eventually("the job to connect to its socket", || {
                agent
                    .instance_status(&j, "normal")
                    .filter(|s| s.connected)
                    .map(|_| ())
            })
            .await;
        }
        job_id
    }

    async fn get_state(&mut self, mid: &str, job_id: &str) -> Migration {
        let m = self.propose(mid, job_id, MigrationStrategy::Handover).await;
        assert_eq!(phase(&m), MigrationPhase::Proposed);
        m
    }

    async fn propose(&mut self, mid: &str, job_id: &str, strategy: MigrationStrategy) -> Migration {
        self.manager
            .migration_get_state(NodeControllerMigrationGetState {
                migration_id: mid.into(),
                job_id: job_id.into(),
                strategy: strategy as i32,
            })
            .await
            .unwrap()
            .into_inner()
            .migration
            .unwrap()
    }

    async fn abort(&mut self, mid: &str, reason: &str) -> Migration {
        self.manager
            .migration_abort(NodeControllerMigrationAbort {
                migration_id: mid.into(),
                reason: reason.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .migration
            .unwrap()
    }

    /// Every instance start the sim saw, as (node, role).
    async fn roles_started(&mut self, job_id: &str) -> Vec<(String, JobRole)> {
        self.history(job_id)
            .await
            .starts
            .iter()
            .map(|s| (s.node_id.clone(), s.role()))
            .collect()
    }

    async fn history(&mut self, job_id: &str) -> JobHistoryResponse {
        self.admin
            .job_history(JobHistoryRequest {
                job_id: job_id.into(),
            })
            .await
            .unwrap()
            .into_inner()
    }

    async fn prepare(&mut self, mid: &str, node: &str, state: &[u8]) -> Result<(), tonic::Status> {
        let r = self
            .manager
            .migration_prepare_target(NodeControllerMigrationPrepareTarget {
                migration_id: mid.into(),
                target_node_id: node.into(),
                initial_state: state.to_vec(),
            })
            .await?
            .into_inner();
        assert!(!r.target_rejected, "{r:?}");
        Ok(())
    }

    async fn cutover(&mut self, mid: &str, payload: &[u8]) -> Result<Migration, tonic::Status> {
        Ok(self
            .manager
            .migration_cutover(NodeControllerMigrationCutover {
                migration_id: mid.into(),
                payload: payload.to_vec(),
            })
            .await?
            .into_inner()
            .migration
            .unwrap())
    }

    /// Proposes, prepares the target with the source's state, and waits
    /// until the target is ready.
    async fn until_target_ready(&mut self, mid: &str, job_id: &str, target: &str) -> Migration {
        self.get_state(mid, job_id).await;
        let m = self.until_phase(mid, MigrationPhase::StateReceived).await;
        self.prepare(mid, target, &m.source_state).await.unwrap();
        self.until_phase(mid, MigrationPhase::TargetReady).await
    }

    /// Runs a handover to its end, reacting to each phase the way a
    /// controller does; returns the final migration.
    async fn drive(&mut self, mid: &str, job_id: &str, target: &str) -> Migration {
        self.drive_with(MigrationStrategy::Handover, mid, job_id, target)
            .await
    }

    /// [`Rig::drive`] with any strategy.
    async fn drive_with(
        &mut self,
        strategy: MigrationStrategy,
        mid: &str,
        job_id: &str,
        target: &str,
    ) -> Migration {
        self.propose(mid, job_id, strategy).await;
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut prepared = false;
        let mut cut = false;
        loop {
            let m = self.migration(mid);
            match phase(&m) {
                MigrationPhase::Completed | MigrationPhase::Aborted => return m,
                // A job may abort between our read and the call: errors are fine.
                MigrationPhase::StateReceived if !prepared => {
                    prepared = true;
                    let _ = self.prepare(mid, target, &m.source_state).await;
                }
                MigrationPhase::TargetReady if !cut => {
                    cut = true;
                    let _ = self.cutover(mid, &m.target_ready_payload).await;
                }
                _ => {}
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{mid} hung in {m:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn set_behaviour(&mut self, job_id: &str, b: &JobBehaviour) {
        self.admin
            .set_migration_behaviour(SetMigrationBehaviourRequest {
                job_id: job_id.into(),
                behaviour: Some(b.to_proto()),
            })
            .await
            .unwrap();
    }

    /// Exactly one live (starting, running or stopping) instance: the
    /// normal one, RUNNING on `node`.
    async fn one_running_instance_on(&self, job_id: &str, node: &str) {
        let what = format!("{job_id} to run only on {node}");
        eventually(&what, || {
            let job = self.job(job_id);
            // Stopped and failed instances stay listed; they hold nothing.
            let live: Vec<_> = job
                .instances
                .iter()
                .filter(|i| {
                    [JobState::Starting, JobState::Running, JobState::Stopping]
                        .iter()
                        .any(|s| i.state == *s as i32)
                })
                .collect();
            let [only] = live.as_slice() else {
                return None;
            };
            (only.role == JobRole::Normal as i32
                && only.state == JobState::Running as i32
                && only.node_id == node
                && job.node_id == node)
                .then_some(())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_handover_runs_over_the_real_job_socket_and_can_run_again() {
    let mut rig = rig(Vec::new()).await;
    let job_id = rig.running_job("b", "dc-a").await;

    rig.get_state("m1", &job_id).await;
    let m = rig.until_phase("m1", MigrationPhase::StateReceived).await;
    let state = json(&m.source_state);
    let position = state["position"].as_f64().expect("a position in the state");
    // The source's side of the socket moved too.
    let src = rig.agent.instance_status(&job_id, "normal").unwrap();
    assert_eq!(src.migration.unwrap().phase, Phase::StateGiven);

    rig.prepare("m1", "dc-b", &m.source_state).await.unwrap();
    let job = rig.job(&job_id);
    let target = job
        .instances
        .iter()
        .find(|i| i.role == JobRole::MigrationTarget as i32)
        .expect("a target instance");
    assert_eq!(
        (target.node_id.as_str(), target.migration_id.as_str()),
        ("dc-b", "m1")
    );
    let m = rig.until_phase("m1", MigrationPhase::TargetReady).await;
    assert_eq!(
        json(&m.target_ready_payload)["resumeFrom"].as_f64(),
        Some(position)
    );
    let tgt = rig
        .agent
        .instance_status(&job_id, "migrationTarget:m1")
        .unwrap();
    assert!(tgt.connected);
    assert_eq!(tgt.migration.unwrap().phase, Phase::TargetReady);

    rig.cutover("m1", &m.target_ready_payload).await.unwrap();
    let m = rig.until_final("m1").await;
    assert_eq!(phase(&m), MigrationPhase::Completed, "{m:?}");
    assert!(json(&m.source_stopped_payload)["stoppedAtMs"].is_number());
    assert_eq!(m.applied, vec!["input", "output"]);
    assert!(m.failed.is_empty());
    assert!(m.skew_ms >= 0.0 && m.skew_ms.is_finite());
    rig.one_running_instance_on(&job_id, "dc-b").await;
    let tgt = rig
        .agent
        .instance_status(&job_id, "migrationTarget:m1")
        .unwrap();
    assert_eq!(tgt.migration.unwrap().phase, Phase::Applied);
    // The old source's socket is gone with its instance.
    eventually("the source's socket to be forgotten", || {
        rig.agent
            .instance_status(&job_id, "normal")
            .is_none()
            .then_some(())
    })
    .await;

    // The former target is now the source of the next handover.
    let m = rig.drive("m2", &job_id, "dc-a").await;
    assert_eq!(phase(&m), MigrationPhase::Completed, "{m:?}");
    rig.one_running_instance_on(&job_id, "dc-a").await;
    assert!(
        rig.agent.commands_sent(&job_id) >= 8,
        "two handovers of four commands"
    );
    assert_eq!(
        rig.roles_started(&job_id).await,
        [
            ("dc-a".into(), JobRole::Normal),
            ("dc-b".into(), JobRole::MigrationTarget),
            ("dc-a".into(), JobRole::MigrationTarget)
        ]
    );
    rig.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_and_stop_then_start_move_a_job_between_workers_without_a_job_socket() {
    let mut rig = rig(Vec::new()).await;
    for (strategy, bundle, gaps, max_running) in [
        (MigrationStrategy::Overlap, "over", 0, 2),
        (MigrationStrategy::StopThenStart, "sts", 1, 1),
    ] {
        let job_id = rig.running_job(bundle, "old-1").await;
        let m = rig.drive_with(strategy, bundle, &job_id, "old-2").await;
        assert_eq!(phase(&m), MigrationPhase::Completed, "{m:?}");
        assert_eq!(m.strategy(), strategy);
        rig.one_running_instance_on(&job_id, "old-2").await;
        assert_eq!(rig.agent.commands_sent(&job_id), 0, "{strategy:?}");
        assert_eq!(
            rig.roles_started(&job_id).await,
            [
                ("old-1".into(), JobRole::Normal),
                ("old-2".into(), JobRole::MigrationTarget)
            ],
            "{strategy:?}: the target wears the migration target role"
        );
        let h = rig.history(&job_id).await;
        assert_eq!(
            (h.gaps, h.max_running, h.running),
            (gaps, max_running, 1),
            "{strategy:?}: {h:?}"
        );
        if strategy == MigrationStrategy::Overlap {
            assert_eq!(
                h.uncovered_ms, 0,
                "an overlap never leaves the job without a running instance"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_and_stop_then_start_say_nothing_to_a_job_with_a_socket_even_when_aborted() {
    let mut rig = rig(Vec::new()).await;
    for (strategy, bundle) in [
        (MigrationStrategy::Overlap, "over"),
        (MigrationStrategy::StopThenStart, "sts"),
    ] {
        let job_id = rig.running_job(bundle, "dc-a").await;
        let m = rig.propose(bundle, &job_id, strategy).await;
        assert_eq!(phase(&m), MigrationPhase::StateReceived, "nothing asked");
        rig.prepare(bundle, "dc-b", b"").await.unwrap();
        rig.until_phase(bundle, MigrationPhase::TargetReady).await;
        let m = rig.abort(bundle, "not now").await;
        assert_eq!(phase(&m), MigrationPhase::Aborted);
        rig.one_running_instance_on(&job_id, "dc-a").await;
        assert_eq!(rig.agent.commands_sent(&job_id), 0, "{strategy:?}");
        let src = rig.agent.instance_status(&job_id, "normal").unwrap();
        assert!(
            src.connected && src.migration.is_none(),
            "{strategy:?}: {src:?}"
        );

        // Moved for real this time; the promoted target speaks the socket as the normal instance.
        let again = format!("{bundle}-2");
        let m = rig.drive_with(strategy, &again, &job_id, "dc-b").await;
        assert_eq!(phase(&m), MigrationPhase::Completed, "{m:?}");
        rig.one_running_instance_on(&job_id, "dc-b").await;
        assert_eq!(rig.agent.commands_sent(&job_id), 0, "{strategy:?}");
        let agent = rig.agent.clone();
        eventually(
            "the promoted target to connect as the normal instance",
            || {
                let key = agent.instance_key(&job_id, "dc-b")?;
                agent
                    .instance_status(&job_id, &key.role)
                    .filter(|s| s.connected && key.role == "normal")
                    .map(|_| ())
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_state_ends_the_migration_with_no_target() {
    let mut rig = rig(Vec::new()).await;
    let job_id = rig.running_job("b", "dc-a").await;
    rig.set_behaviour(
        &job_id,
        &JobBehaviour {
            refuse_state: true,
            ..Default::default()
        },
    )
    .await;
    rig.get_state("m1", &job_id).await;
    let m = rig.until_final("m1").await;
    assert_eq!(phase(&m), MigrationPhase::Aborted);
    assert_eq!(m.aborted_by, MigrationParty::Source as i32);
    assert!(m.abort_reason.contains("refuse"), "{m:?}");
    assert!(m.target_node_id.is_empty());
    let err = rig.prepare("m1", "dc-b", b"null").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    rig.one_running_instance_on(&job_id, "dc-a").await;
    let src = rig.agent.instance_status(&job_id, "normal").unwrap();
    assert_eq!(src.migration.unwrap().phase, Phase::Refused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_can_abort_at_every_abortable_point_and_then_migrate_again() {
    // Behaviours from the config's rules this time: one bundle per point.
    let rules = AbortAt::ALL
        .iter()
        .map(|a| {
            BehaviourRule::new(
                format!("{}/*", a.name()),
                JobBehaviour {
                    abort_at: Some(*a),
                    ..Default::default()
                },
            )
        })
        .collect();
    let mut rig = rig(rules).await;
    for at in AbortAt::ALL {
        let job_id = rig.running_job(at.name(), "dc-a").await;
        let mid = format!("abort-{}", at.name());
        let m = rig.drive(&mid, &job_id, "dc-b").await;
        assert_eq!(phase(&m), MigrationPhase::Aborted, "{at:?}: {m:?}");
        let by = match at {
            AbortAt::GetState | AbortAt::StateGiven | AbortAt::CutoverReady => {
                MigrationParty::Source
            }
            AbortAt::InitialState | AbortAt::TargetReady => MigrationParty::Target,
        };
        assert_eq!(m.aborted_by, by as i32, "{at:?}: {m:?}");
        assert!(m.abort_reason.contains(at.name()), "{at:?}: {m:?}");
        // The target (if any) is stopped; the source keeps running.
        rig.one_running_instance_on(&job_id, "dc-a").await;
        let src = rig.agent.instance_status(&job_id, "normal").unwrap();
        assert!(src.connected, "{at:?}");
        assert_eq!(src.migration.unwrap().phase, Phase::Aborted, "{at:?}");

        // Made cooperative, the same job hands over.
        rig.set_behaviour(&job_id, &JobBehaviour::default()).await;
        let m = rig
            .drive(&format!("again-{}", at.name()), &job_id, "dc-b")
            .await;
        assert_eq!(phase(&m), MigrationPhase::Completed, "{at:?}: {m:?}");
        rig.one_running_instance_on(&job_id, "dc-b").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_cutover_completes_late_and_a_controller_abort_reaches_the_jobs() {
    let mut rig = rig(Vec::new()).await;
    let job_id = rig.running_job("b", "dc-a").await;
    rig.set_behaviour(
        &job_id,
        &JobBehaviour {
            cutover_delay_ms: 300,
            ..Default::default()
        },
    )
    .await;
    let m = rig.until_target_ready("m1", &job_id, "dc-b").await;
    let m = rig.cutover("m1", &m.target_ready_payload).await.unwrap();
    assert_eq!(phase(&m), MigrationPhase::CuttingOver);
    // The source has not stopped its output yet: the delay is still running.
    assert_eq!(phase(&rig.migration("m1")), MigrationPhase::CuttingOver);
    let m = rig.until_final("m1").await;
    assert_eq!(phase(&m), MigrationPhase::Completed, "{m:?}");
    rig.one_running_instance_on(&job_id, "dc-b").await;

    // A very slow cutover aborted by the controller: the job is told, does
    // not answer, and keeps running.
    rig.set_behaviour(
        &job_id,
        &JobBehaviour {
            cutover_delay_ms: 600_000,
            ..Default::default()
        },
    )
    .await;
    let m = rig.until_target_ready("m2", &job_id, "dc-a").await;
    rig.cutover("m2", &m.target_ready_payload).await.unwrap();
    let key = rig.agent.instance_key(&job_id, "dc-b").unwrap();
    eventually("the source to be asked to stop", || {
        let s = rig.agent.instance_status(&job_id, &key.role)?;
        (s.migration?.phase == Phase::AwaitingSourceStop).then_some(())
    })
    .await;
    let m = rig.abort("m2", "operator gave up").await;
    assert_eq!(phase(&m), MigrationPhase::Aborted);
    assert_eq!(m.aborted_by, MigrationParty::Controller as i32);
    let s = rig.agent.instance_status(&job_id, &key.role).unwrap();
    assert_eq!(s.migration.unwrap().phase, Phase::Aborted);
    assert!(s.connected);
    rig.one_running_instance_on(&job_id, "dc-b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_participant_is_reported_and_the_handover_still_completes() {
    let mut rig = rig(Vec::new()).await;
    let job_id = rig.running_job("b", "dc-a").await;
    rig.admin
        .set_migration_behaviour(SetMigrationBehaviourRequest {
            job_id: job_id.clone(),
            behaviour: Some(MigrationBehaviour {
                fail_participants: vec!["output".into()],
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let m = rig.drive("m1", &job_id, "dc-b").await;
    assert_eq!(phase(&m), MigrationPhase::Completed, "{m:?}");
    assert_eq!(m.applied, vec!["input"]);
    let [failed] = m.failed.as_slice() else {
        panic!("{m:?}");
    };
    assert_eq!(failed.id, "output");
    assert!(failed.reason.contains("simulated"), "{failed:?}");
    rig.one_running_instance_on(&job_id, "dc-b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_job_socket_capability_cannot_take_part_in_a_handover() {
    let mut rig = rig(Vec::new()).await;
    let nodes = rig
        .manager
        .list_nodes(ListNodesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nodes;
    for n in &nodes {
        let caps = &n.inventory.as_ref().unwrap().capabilities;
        let has = caps.iter().any(|c| c == JOB_SOCKET_CAPABILITY);
        assert_eq!(has, !n.node_id.starts_with("old-"), "{n:?}");
    }
    // As the target: the target job has no listener, the target side aborts.
    let job_id = rig.running_job("b", "dc-a").await;
    let m = rig.drive("m1", &job_id, "old-1").await;
    assert_eq!(phase(&m), MigrationPhase::Aborted, "{m:?}");
    assert_eq!(m.aborted_by, MigrationParty::Target as i32);
    assert!(m.abort_reason.contains("no job socket listener"), "{m:?}");
    rig.one_running_instance_on(&job_id, "dc-a").await;
    // As the source: its job never had a socket.
    let legacy = rig.running_job("c", "old-1").await;
    assert!(rig.agent.instance_key(&legacy, "old-1").is_none());
    let m = rig.drive("m2", &legacy, "dc-a").await;
    assert_eq!(phase(&m), MigrationPhase::Aborted, "{m:?}");
    assert_eq!(m.aborted_by, MigrationParty::Source as i32);
    rig.one_running_instance_on(&legacy, "old-1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_behaviour_requests_are_refused_and_the_in_process_agent_refuses_them_all() {
    let mut rig = rig(Vec::new()).await;
    for (job_id, b) in [
        (
            "b/0/enc",
            MigrationBehaviour {
                abort_at: 42,
                ..Default::default()
            },
        ),
        (
            "b/0/enc",
            MigrationBehaviour {
                fail_participants: vec![String::new()],
                ..Default::default()
            },
        ),
        ("", MigrationBehaviour::default()),
    ] {
        let err = rig
            .admin
            .set_migration_behaviour(SetMigrationBehaviourRequest {
                job_id: job_id.into(),
                behaviour: Some(b),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    }
    // Unset = cooperative; the job need not exist yet.
    rig.admin
        .set_migration_behaviour(SetMigrationBehaviourRequest {
            job_id: "later/0/enc".into(),
            behaviour: None,
        })
        .await
        .unwrap();

    let plain = Sim::start(SimConfig::from_yaml(CONFIG).unwrap())
        .await
        .unwrap();
    let mut admin = SimAdminClient::connect(plain.endpoint()).await.unwrap();
    let err = admin
        .set_migration_behaviour(SetMigrationBehaviourRequest {
            job_id: "b/0/enc".into(),
            behaviour: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_from_the_state_dir_running_jobs_reconnect_and_hand_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = SimConfig::from_yaml(CONFIG).unwrap();
    config.state_dir = Some(dir.path().to_owned());
    let job_id = {
        let agent = SocketAgent::start(JobSocketConfig::default())
            .await
            .unwrap();
        let mut rig = connect(config.clone(), agent).await;
        let job_id = rig.running_job("b", "dc-a").await;
        rig.sim.shutdown().await;
        job_id
    };
    // A new sim and a new listener: the restored job is registered at once.
    let agent = SocketAgent::start(JobSocketConfig::default())
        .await
        .unwrap();
    let mut rig = connect(config, agent).await;
    eventually("the restored job to connect", || {
        rig.agent
            .instance_status(&job_id, "normal")
            .filter(|s| s.connected)
            .map(|_| ())
    })
    .await;
    let m = rig.drive("m1", &job_id, "dc-b").await;
    assert_eq!(phase(&m), MigrationPhase::Completed, "{m:?}");
    rig.one_running_instance_on(&job_id, "dc-b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_silent_past_the_answer_timeout_is_aborted_for() {
    let agent = SocketAgent::start(JobSocketConfig {
        answer_timeout_ms: 200,
        behaviours: vec![BehaviourRule::new(
            "b/*",
            JobBehaviour {
                cutover_delay_ms: 600_000,
                ..Default::default()
            },
        )],
        ..JobSocketConfig::default()
    })
    .await
    .unwrap();
    let mut rig = connect(SimConfig::from_yaml(CONFIG).unwrap(), agent).await;
    let job_id = rig.running_job("b", "dc-a").await;
    let m = rig.drive("m1", &job_id, "dc-b").await;
    assert_eq!(phase(&m), MigrationPhase::Aborted, "{m:?}");
    assert_eq!(m.aborted_by, MigrationParty::Source as i32);
    assert!(
        m.abort_reason.contains("did not answer within 200 ms"),
        "{m:?}"
    );
    rig.one_running_instance_on(&job_id, "dc-a").await;
}

#[tokio::test]
async fn an_invalid_job_socket_config_is_refused_with_every_problem() {
    let err = SocketAgent::start(JobSocketConfig {
        answer_timeout_ms: 0,
        behaviours: vec![BehaviourRule::new(
            "",
            JobBehaviour {
                cutover_delay_ms: u64::MAX,
                ..Default::default()
            },
        )],
        ..JobSocketConfig::default()
    })
    .await
    .unwrap_err();
    let text = err.to_string();
    for needle in ["answerTimeoutMs", "job pattern", "cutoverDelayMs"] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    let err = Sim::start_with_job_socket(
        SimConfig::from_yaml(CONFIG).unwrap(),
        JobSocketConfig {
            answer_timeout_ms: 0,
            behaviours: Vec::new(),
            ..JobSocketConfig::default()
        },
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("answerTimeoutMs"), "{err}");
}
