//! Rules of the world model, one test per rule, and invariants under random
//! command sequences.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use manager_proto::{
    Bundle, BundleJob, CreateNodeRequest, JobRequirements, JobRole, JobState, MigrationParty,
    MigrationPhase, MigrationStrategy, NodeState, RejectionReason, StopReason, event,
};
use proptest::prelude::*;

use super::*;
use crate::config::{SimConfig, TimingConfig};

const HANDOVER: i32 = MigrationStrategy::Handover as i32;
const OVERLAP: i32 = MigrationStrategy::Overlap as i32;
const STOP_THEN_START: i32 = MigrationStrategy::StopThenStart as i32;

const TIMING: TimingConfig = TimingConfig {
    provision_delay_ms: 100,
    job_start_delay_ms: 10,
    job_stop_delay_ms: 10,
    start_delay_ms: Some(30),
    stop_delay_ms: Some(15),
};

fn world_with_log(log: usize) -> World {
    let cfg = SimConfig::from_yaml(
        r"
pools:
  - {name: e, kind: aws, region: r, zones: [z1, z2], scaleOut: elastic,
     instanceTypes: [{instanceType: small, capacity: 50, cores: 4}, {instanceType: gpu, capacity: 100, cores: 8, capabilities: [gpu]}]}
  - {name: f, kind: cluster, region: r, zones: [z1, z2], scaleOut: fixed, jobSocket: false,
     nodes: [{id: f1, zone: z1, capacity: 100, cores: 8}, {id: f2, zone: z2, capacity: 100, cores: 8}]}
",
    )
    .unwrap();
    World::new(&cfg.pools, TIMING, log, "ep".into(), 0)
}

fn world() -> World {
    world_with_log(100_000)
}

fn bundle(id: &str, replicas: u32, capacity: f64, cores: i32) -> Bundle {
    Bundle {
        bundle_id: id.into(),
        replicas,
        jobs: vec![BundleJob {
            job_name: "enc".into(),
            requirements: Some(JobRequirements {
                required_capacity: capacity,
                required_cores: cores,
                ..Default::default()
            }),
            config: Vec::new(),
            template: Vec::new(),
        }],
        ..Default::default()
    }
}

fn kinds(evs: &[Event]) -> Vec<&'static str> {
    evs.iter()
        .map(|e| match e.kind.as_ref().unwrap() {
            event::Kind::NodeStarting(_) => "NodeStarting",
            event::Kind::NodeStarted(_) => "NodeStarted",
            event::Kind::NodeStopped(_) => "NodeStopped",
            event::Kind::NodeTerminated(_) => "NodeTerminated",
            event::Kind::NodePoweringOff(_) => "NodePoweringOff",
            event::Kind::NodePoweredOff(_) => "NodePoweredOff",
            event::Kind::ReclaimNotice(_) => "ReclaimNotice",
            event::Kind::Inventory(_) => "Inventory",
            event::Kind::JobUpdated(_) => "JobUpdated",
            event::Kind::JobRejected(_) => "JobRejected",
            event::Kind::JobStopping(_) => "JobStopping",
            event::Kind::JobRemoved(_) => "JobRemoved",
            event::Kind::ConfigUpdated(_) => "ConfigUpdated",
            event::Kind::BundleUpdated(_) => "BundleUpdated",
            event::Kind::BundleDeleted(_) => "BundleDeleted",
            event::Kind::MigrationPhase(_) => "MigrationPhase",
        })
        .collect()
}

#[test]
fn declared_nodes_start_with_their_inventory() {
    let mut w = world();
    let evs = w.take_events();
    assert_eq!(
        kinds(&evs),
        ["NodeStarted", "Inventory", "NodeStarted", "Inventory"]
    );
    let inv = w.node("f1").unwrap().inventory.clone().unwrap();
    assert_eq!((inv.capacity, inv.cores), (100.0, 8));
    assert!(
        inv.capabilities.is_empty(),
        "jobSocket: false advertises no job socket"
    );
}

#[test]
fn an_elastic_node_is_started_only_after_the_provisioning_delay() {
    let mut w = world();
    let n = w
        .create_node(
            &CreateNodeRequest {
                pool: "e".into(),
                instance_type: "gpu".into(),
                ..Default::default()
            },
            0,
        )
        .unwrap();
    assert_eq!(n.state(), NodeState::Starting);
    w.advance(99);
    assert_eq!(w.node(&n.node_id).unwrap().state(), NodeState::Starting);
    w.advance(100);
    let node = w.node(&n.node_id).unwrap();
    assert_eq!(node.state(), NodeState::Started);
    let caps = &node.inventory.as_ref().unwrap().capabilities;
    assert_eq!(
        caps,
        &vec![
            "gpu".to_owned(),
            manager_proto::JOB_SOCKET_CAPABILITY.to_owned()
        ]
    );
}

fn started_elastic_node(w: &mut World) -> String {
    let n = w
        .create_node(
            &CreateNodeRequest {
                pool: "e".into(),
                ..Default::default()
            },
            0,
        )
        .unwrap();
    w.advance(100);
    n.node_id
}

#[test]
fn a_stopped_node_keeps_its_id_and_zone_holds_nothing_and_starts_after_the_start_delay() {
    let mut w = world();
    let id = started_elastic_node(&mut w);
    let zone = w.node(&id).unwrap().zone.clone();
    w.take_events();
    let n = w.stop_node(&id, 200).unwrap();
    assert_eq!(n.state(), NodeState::PoweringOff);
    assert!(n.inventory.is_none(), "a stopped worker advertises nothing");
    w.advance(214);
    assert_eq!(w.node(&id).unwrap().state(), NodeState::PoweringOff);
    w.advance(215);
    assert_eq!(w.node(&id).unwrap().state(), NodeState::PoweredOff);
    assert_eq!(
        kinds(&w.take_events()),
        ["NodePoweringOff", "NodePoweredOff"]
    );
    // No job lands on it.
    w.register_bundle(&bundle("b", 1, 10.0, 1), 300).unwrap();
    assert!(matches!(
        w.start_job("b/0/enc", &id, 0, 300),
        Ok(StartOutcome::Rejected {
            reason: RejectionReason::NodeNotReady,
            ..
        })
    ));
    // Stopping again changes nothing.
    w.take_events();
    w.stop_node(&id, 310).unwrap();
    assert!(w.take_events().is_empty());
    // Start: STARTING now, STARTED with its inventory after the pool's start delay.
    assert_eq!(w.start_node(&id, 400).unwrap().state(), NodeState::Starting);
    w.advance(429);
    assert_eq!(w.node(&id).unwrap().state(), NodeState::Starting);
    w.advance(430);
    let node = w.node(&id).unwrap();
    assert_eq!(
        (
            node.state(),
            node.zone.clone(),
            node.inventory.as_ref().map(|i| i.capacity)
        ),
        (NodeState::Started, zone, Some(50.0))
    );
    assert_eq!(
        kinds(&w.take_events()),
        ["NodeStarting", "NodeStarted", "Inventory"]
    );
    assert_eq!(
        w.start_job("b/0/enc", &id, 0, 431).unwrap(),
        StartOutcome::Accepted
    );
}

#[test]
fn stop_is_refused_for_cluster_pools_and_busy_nodes_and_start_for_running_ones_is_a_no_op() {
    let mut w = world();
    assert!(matches!(
        w.stop_node("f1", 0),
        Err(CommandError::FailedPrecondition(m)) if m.contains("cluster pool")
    ));
    let id = started_elastic_node(&mut w);
    w.register_bundle(&bundle("b", 1, 10.0, 1), 100).unwrap();
    w.start_job("b/0/enc", &id, 0, 100).unwrap();
    assert!(matches!(
        w.stop_node(&id, 101),
        Err(CommandError::FailedPrecondition(m)) if m.contains("hosts job instances")
    ));
    assert_eq!(w.start_node(&id, 102).unwrap().state(), NodeState::Started);
    assert!(matches!(
        w.stop_node("nope", 0),
        Err(CommandError::NotFound(_))
    ));
    w.kill_node(&id, 103).unwrap();
    assert!(matches!(
        w.start_node(&id, 104),
        Err(CommandError::FailedPrecondition(_))
    ));
    let pools = w.pools();
    let e = pools.iter().find(|p| p.name == "e").unwrap();
    let f = pools.iter().find(|p| p.name == "f").unwrap();
    assert_eq!((e.can_stop, e.start_delay_ms), (true, 30));
    assert!(!f.can_stop);
}

#[test]
fn a_noticed_node_is_killed_at_its_deadline() {
    let mut w = world();
    let id = started_elastic_node(&mut w);
    w.register_bundle(&bundle("b", 1, 10.0, 1), 100).unwrap();
    w.start_job("b/0/enc", &id, 0, 100).unwrap();
    w.advance(120);
    w.take_events();
    let n = w.notice_node(&id, 1000, "", 200).unwrap();
    assert_eq!(
        (n.reclaim_at_ms, n.reclaim_reason.as_str()),
        (1200, "spot-interruption")
    );
    assert_eq!(kinds(&w.take_events()), ["ReclaimNotice"]);
    w.advance(1199);
    assert_eq!(w.node(&id).unwrap().state(), NodeState::Started);
    w.advance(1200);
    assert_eq!(w.node(&id).unwrap().state(), NodeState::Terminated);
    assert_eq!(w.job("b/0/enc").unwrap().state(), JobState::Failed);
    assert!(w.notice_node(&id, 10, "", 1300).is_err());
    assert!(matches!(
        w.notice_node("f1", 86_400_001, "", 0),
        Err(CommandError::InvalidArgument(_))
    ));
}

#[test]
fn provider_defaults_give_stopped_nodes_tens_of_seconds_to_start() {
    use crate::config::PoolKind;
    assert_eq!(PoolKind::Aws.default_start_delay_ms(), 30_000);
    assert_eq!(PoolKind::Oci.default_start_delay_ms(), 40_000);
    assert!(!PoolKind::Cluster.can_stop());
    let cfg = SimConfig::from_yaml(
        r"
pools:
  - {name: a, kind: aws, region: r, zones: [z], scaleOut: elastic, instanceTypes: [{instanceType: s, capacity: 1, cores: 1}]}
  - {name: o, kind: oci, region: r, zones: [z], scaleOut: elastic, startDelayMs: 5, instanceTypes: [{instanceType: s, capacity: 1, cores: 1}]}
",
    )
    .unwrap();
    let w = World::new(&cfg.pools, TimingConfig::default(), 10, "ep".into(), 0);
    let delays: Vec<(String, u64)> = w
        .pools()
        .into_iter()
        .map(|p| (p.name, p.start_delay_ms))
        .collect();
    assert_eq!(delays, [("a".to_owned(), 30_000), ("o".to_owned(), 5)]);
}

#[test]
fn zones_are_assigned_round_robin_when_not_given() {
    let mut w = world();
    let zones: Vec<String> = (0..4)
        .map(|_| {
            w.create_node(
                &CreateNodeRequest {
                    pool: "e".into(),
                    ..Default::default()
                },
                0,
            )
            .unwrap()
            .zone
        })
        .collect();
    assert_eq!(zones, ["z1", "z2", "z1", "z2"]);
}

#[test]
fn a_bundle_expands_into_one_job_per_replica_and_job_name() {
    let mut w = world();
    let mut b = bundle("b", 2, 1.0, 1);
    b.jobs.push(BundleJob {
        job_name: "pkg".into(),
        requirements: Some(JobRequirements::default()),
        config: Vec::new(),
        template: Vec::new(),
    });
    let (stored, ids) = w.register_bundle(&b, 0).unwrap();
    assert_eq!(stored.generation, 1);
    assert_eq!(ids, ["b/0/enc", "b/0/pkg", "b/1/enc", "b/1/pkg"]);
    assert!(
        ids.iter()
            .all(|id| w.job(id).unwrap().state() == JobState::Pending)
    );
}

#[test]
fn shrinking_a_bundle_stops_and_removes_the_jobs_that_went_away() {
    let mut w = world();
    w.register_bundle(&bundle("b", 2, 1.0, 1), 0).unwrap();
    w.start_job("b/1/enc", "f1", JobRole::Normal as i32, 0)
        .unwrap();
    w.take_events();
    let (stored, ids) = w.register_bundle(&bundle("b", 1, 1.0, 1), 1).unwrap();
    assert_eq!(stored.generation, 2);
    assert_eq!(ids, ["b/0/enc"]);
    assert_eq!(
        kinds(&w.take_events()),
        ["BundleUpdated", "JobStopping", "JobUpdated", "JobRemoved"]
    );
    assert!(w.job("b/1/enc").is_none());
    assert_eq!(w.usage("f1"), (0.0, 0));
}

#[test]
fn registering_the_same_bundle_again_changes_nothing() {
    let mut w = world();
    w.register_bundle(&bundle("b", 1, 1.0, 1), 0).unwrap();
    w.take_events();
    let (stored, _) = w.register_bundle(&bundle("b", 1, 1.0, 1), 5).unwrap();
    assert_eq!(stored.generation, 1);
    assert!(w.take_events().is_empty());
}

#[test]
fn the_worker_refuses_starts_beyond_capacity_cores_or_capabilities() {
    let mut w = world();
    w.register_bundle(&bundle("big", 2, 60.0, 1), 0).unwrap();
    w.register_bundle(&bundle("cores", 1, 1.0, 9), 0).unwrap();
    let mut gpu = bundle("gpu", 1, 1.0, 1);
    if let Some(r) = gpu.jobs[0].requirements.as_mut() {
        r.required_capabilities = vec!["gpu".into()];
    }
    w.register_bundle(&gpu, 0).unwrap();
    assert_eq!(
        w.start_job("big/0/enc", "f1", 0, 0).unwrap(),
        StartOutcome::Accepted
    );
    let reason = |o: StartOutcome| match o {
        StartOutcome::Rejected { reason, .. } => reason,
        StartOutcome::Accepted => RejectionReason::Unspecified,
    };
    assert_eq!(
        reason(w.start_job("big/1/enc", "f1", 0, 0).unwrap()),
        RejectionReason::InsufficientCapacity
    );
    assert_eq!(
        reason(w.start_job("cores/0/enc", "f2", 0, 0).unwrap()),
        RejectionReason::InsufficientCores
    );
    assert_eq!(
        reason(w.start_job("gpu/0/enc", "f2", 0, 0).unwrap()),
        RejectionReason::MissingCapability
    );
    // the refusals were events, and nothing was reserved
    assert_eq!(w.usage("f2"), (0.0, 0));
}

#[test]
fn a_starting_node_is_not_ready() {
    let mut w = world();
    let n = w
        .create_node(
            &CreateNodeRequest {
                pool: "e".into(),
                ..Default::default()
            },
            0,
        )
        .unwrap();
    w.register_bundle(&bundle("b", 1, 1.0, 1), 0).unwrap();
    let o = w.start_job("b/0/enc", &n.node_id, 0, 0).unwrap();
    assert!(matches!(
        o,
        StartOutcome::Rejected {
            reason: RejectionReason::NodeNotReady,
            ..
        }
    ));
}

#[test]
fn reject_next_refuses_exactly_n_starts() {
    let mut w = world();
    w.register_bundle(&bundle("b", 1, 1.0, 1), 0).unwrap();
    w.reject_next(2);
    for _ in 0..2 {
        assert!(matches!(
            w.start_job("b/0/enc", "f1", 0, 0).unwrap(),
            StartOutcome::Rejected {
                reason: RejectionReason::InjectedFault,
                ..
            }
        ));
    }
    assert_eq!(
        w.start_job("b/0/enc", "f1", 0, 0).unwrap(),
        StartOutcome::Accepted
    );
}

#[test]
fn a_second_live_instance_of_the_same_role_is_a_failed_precondition() {
    let mut w = world();
    w.register_bundle(&bundle("b", 1, 1.0, 1), 0).unwrap();
    w.start_job("b/0/enc", "f1", 0, 0).unwrap();
    assert!(matches!(
        w.start_job("b/0/enc", "f2", 0, 0),
        Err(CommandError::FailedPrecondition(_))
    ));
}

#[test]
fn instances_go_starting_running_stopping_stopped_and_release_capacity() {
    let mut w = world();
    w.register_bundle(&bundle("b", 1, 30.0, 2), 0).unwrap();
    w.start_job("b/0/enc", "f1", 0, 0).unwrap();
    assert_eq!(w.job("b/0/enc").unwrap().state(), JobState::Starting);
    w.advance(10);
    assert_eq!(w.job("b/0/enc").unwrap().state(), JobState::Running);
    w.stop_job("b/0/enc", 0, 20).unwrap();
    assert_eq!(w.job("b/0/enc").unwrap().state(), JobState::Stopping);
    assert_eq!(
        w.usage("f1"),
        (30.0, 2),
        "stopping still holds its reservation"
    );
    w.advance(30);
    assert_eq!(w.job("b/0/enc").unwrap().state(), JobState::Stopped);
    assert_eq!(w.usage("f1"), (0.0, 0));
    // stopping again is a no-op
    w.take_events();
    w.stop_job("b/0/enc", 0, 40).unwrap();
    assert!(w.take_events().is_empty());
}

#[test]
fn a_job_handed_to_recovery_says_so_whether_it_was_running_or_already_stopped() {
    let reason_of = |w: &World| {
        w.job("b/0/enc")
            .and_then(|j| j.instances.first().map(|i| i.stop_reason))
            .unwrap_or_default()
    };
    let handed = StopReason::HandedToRecovery as i32;
    let mut w = world();
    w.register_bundle(&bundle("b", 1, 30.0, 2), 0).unwrap();
    w.start_job("b/0/enc", "f1", 0, 0).unwrap();
    w.advance(10);
    w.stop_job_with("b/0/enc", 0, handed, 20).unwrap();
    w.advance(30);
    assert_eq!(w.job("b/0/enc").unwrap().state(), JobState::Stopped);
    assert_eq!(reason_of(&w), handed);

    // Already stopped (by a plain stop): the reason is recorded, and the change is an event.
    let mut w = world();
    w.register_bundle(&bundle("b", 1, 30.0, 2), 0).unwrap();
    w.start_job("b/0/enc", "f1", 0, 0).unwrap();
    w.advance(10);
    w.stop_job("b/0/enc", 0, 20).unwrap();
    w.advance(30);
    assert_eq!(reason_of(&w), StopReason::Requested as i32);
    w.take_events();
    w.stop_job_with("b/0/enc", 0, handed, 40).unwrap();
    assert_eq!(reason_of(&w), handed);
    assert!(!w.take_events().is_empty());

    // Reasons that are Manager's own to give are refused.
    for r in [StopReason::NodeLost, StopReason::Migrated] {
        assert!(matches!(
            w.stop_job_with("b/0/enc", 0, r as i32, 50),
            Err(CommandError::InvalidArgument(_))
        ));
    }
}

#[test]
fn terminating_a_node_emits_stopping_for_every_hosted_job_then_terminated() {
    let mut w = world();
    w.register_bundle(&bundle("b", 3, 10.0, 1), 0).unwrap();
    for r in 0..3 {
        w.start_job(&format!("b/{r}/enc"), "f1", 0, 0).unwrap();
    }
    w.take_events();
    w.terminate_node("f1", 1).unwrap();
    let evs = w.take_events();
    assert_eq!(
        kinds(&evs).iter().filter(|k| **k == "JobStopping").count(),
        3
    );
    assert_eq!(kinds(&evs).last(), Some(&"NodeTerminated"));
    for r in 0..3 {
        let j = w.job(&format!("b/{r}/enc")).unwrap();
        assert_eq!(j.state(), JobState::Stopped);
        assert_eq!(j.instances[0].stop_reason(), StopReason::NodeTerminated);
    }
    // terminating again is a no-op
    w.terminate_node("f1", 2).unwrap();
    assert!(w.take_events().is_empty());
}

#[test]
fn a_partitioned_zone_loses_its_nodes_and_healing_brings_them_back() {
    let mut w = world();
    w.register_bundle(&bundle("b", 1, 10.0, 1), 0).unwrap();
    w.start_job("b/0/enc", "f1", 0, 0).unwrap();
    assert_eq!(w.partition_zone("z1", false, 1).unwrap(), ["f1"]);
    assert_eq!(w.node("f1").unwrap().state(), NodeState::Stopped);
    assert_eq!(w.job("b/0/enc").unwrap().state(), JobState::Failed);
    assert_eq!(w.partition_zone("z1", true, 2).unwrap(), ["f1"]);
    assert_eq!(w.node("f1").unwrap().state(), NodeState::Started);
    assert!(
        w.partition_zone("z1", true, 3).unwrap().is_empty(),
        "healing twice does nothing"
    );
}

fn create_in(w: &mut World, zone: &str, now: i64) -> String {
    w.create_node(
        &CreateNodeRequest {
            pool: "e".into(),
            zone: zone.into(),
            ..Default::default()
        },
        now,
    )
    .unwrap()
    .node_id
}

#[test]
fn a_killed_zone_loses_every_node_in_it_at_once_starting_ones_too() {
    let mut w = world();
    w.register_bundle(&bundle("b", 1, 10.0, 1), 0).unwrap();
    w.start_job("b/0/enc", "f1", 0, 0).unwrap();
    let up = create_in(&mut w, "z1", 0);
    w.advance(100);
    let starting = create_in(&mut w, "z1", 150);
    let elsewhere = create_in(&mut w, "z2", 150);
    w.take_events();
    let mut killed = w.kill_zone("z1", false, 160).unwrap();
    killed.sort();
    let mut want = vec!["f1".to_owned(), up.clone(), starting.clone()];
    want.sort();
    assert_eq!(killed, want);
    for id in &want {
        assert_eq!(w.node(id).unwrap().state(), NodeState::Terminated, "{id}");
    }
    assert_eq!(w.job("b/0/enc").unwrap().state(), JobState::Failed);
    assert_eq!(
        w.job("b/0/enc").unwrap().instances[0].stop_reason(),
        StopReason::NodeLost
    );
    assert_eq!(
        kinds(&w.take_events())
            .iter()
            .filter(|k| **k == "NodeTerminated")
            .count(),
        3,
        "one step"
    );
    // The other zone lives on; a node asked for in the dead zone never comes up.
    w.advance(260);
    assert_eq!(w.node(&elsewhere).unwrap().state(), NodeState::Started);
    let doomed = create_in(&mut w, "z1", 300);
    assert_eq!(w.node(&doomed).unwrap().state(), NodeState::Starting);
    w.advance(400);
    assert_eq!(w.node(&doomed).unwrap().state(), NodeState::Terminated);
    assert!(w.zone_dead("z1"));
    // Revived: nodes come up there again; the dead stay dead.
    assert!(w.kill_zone("z1", true, 500).unwrap().is_empty());
    let fresh = create_in(&mut w, "z1", 500);
    w.advance(600);
    assert_eq!(w.node(&fresh).unwrap().state(), NodeState::Started);
    assert_eq!(w.node(&up).unwrap().state(), NodeState::Terminated);
    assert!(!w.zone_dead("z1"));
}

#[test]
fn a_dead_zone_survives_a_restart() {
    let mut w = world();
    w.kill_zone("z1", false, 0).unwrap();
    let saved = w.persisted();
    let cfg_pools = w
        .pools
        .values()
        .map(|p| p.config.clone())
        .collect::<Vec<_>>();
    let mut back = World::restore(&cfg_pools, TIMING, 1000, saved, 10);
    let doomed = create_in(&mut back, "z1", 10);
    back.advance(200);
    assert_eq!(back.node(&doomed).unwrap().state(), NodeState::Terminated);
}

fn running_job(w: &mut World) {
    w.register_bundle(&bundle("b", 1, 10.0, 1), 0).unwrap();
    w.start_job("b/0/enc", "f1", 0, 0).unwrap();
    w.advance(10);
}

fn answer_all(w: &mut World, now: i64) {
    loop {
        let asks = w.take_asks();
        if asks.is_empty() {
            return;
        }
        for a in asks {
            let r = default_reply(&a);
            w.migration_reply(&a, r, now);
        }
    }
}

#[test]
fn a_migration_moves_the_job_and_stops_the_source() {
    let mut w = world();
    running_job(&mut w);
    w.migration_get_state("m", "b/0/enc", HANDOVER, 20).unwrap();
    answer_all(&mut w, 21);
    assert_eq!(
        w.migration("m").unwrap().phase(),
        MigrationPhase::StateReceived
    );
    w.migration_prepare_target("m", "f2", b"{\"pos\":1}", 22)
        .unwrap();
    assert_eq!(
        w.take_asks(),
        [JobAsk::InitialState {
            migration_id: "m".into(),
            job_id: "b/0/enc".into(),
            node_id: "f2".into(),
            payload: b"{\"pos\":1}".to_vec()
        }]
    );
    w.migration_reply(
        &JobAsk::InitialState {
            migration_id: "m".into(),
            job_id: "b/0/enc".into(),
            node_id: "f2".into(),
            payload: Vec::new(),
        },
        JobReply::TargetReady(b"1".to_vec()),
        23,
    );
    assert_eq!(w.usage("f2"), (10.0, 1), "the target holds capacity");
    w.migration_cutover("m", b"{}", 24).unwrap();
    answer_all(&mut w, 25);
    let m = w.migration("m").unwrap();
    assert_eq!(m.phase(), MigrationPhase::Completed);
    let job = w.job("b/0/enc").unwrap();
    assert_eq!((job.node_id.as_str(), job.instances.len()), ("f2", 1));
    assert_eq!(w.usage("f1"), (0.0, 0));
    assert_eq!(w.usage("f2"), (10.0, 1));
}

#[test]
fn a_target_that_completes_the_handover_before_its_start_timer_is_running() {
    let mut w = world();
    running_job(&mut w);
    w.migration_get_state("m", "b/0/enc", HANDOVER, 20).unwrap();
    answer_all(&mut w, 20);
    w.migration_prepare_target("m", "f2", b"null", 20).unwrap();
    // Every answer arrives before the target's start delay has passed.
    answer_all(&mut w, 20);
    w.migration_cutover("m", b"{}", 20).unwrap();
    answer_all(&mut w, 20);
    assert_eq!(w.migration("m").unwrap().phase(), MigrationPhase::Completed);
    let job = w.job("b/0/enc").unwrap();
    let [inst] = job.instances.as_slice() else {
        panic!("{job:?}");
    };
    assert_eq!(
        (inst.node_id.as_str(), inst.role(), inst.state()),
        ("f2", JobRole::Normal, JobState::Running)
    );
    w.advance(1000);
    assert_eq!(w.job("b/0/enc").unwrap().state(), JobState::Running);
}

#[test]
fn a_job_abort_between_asks_aborts_by_its_side_and_is_ignored_once_over() {
    let mut w = world();
    running_job(&mut w);
    w.migration_get_state("m", "b/0/enc", HANDOVER, 20).unwrap();
    answer_all(&mut w, 21);
    w.migration_job_abort("m", true, "changed my mind", 22);
    let m = w.migration("m").unwrap();
    assert_eq!(
        (m.phase(), m.aborted_by(), m.abort_reason.as_str()),
        (
            MigrationPhase::Aborted,
            MigrationParty::Source,
            "changed my mind"
        )
    );
    w.migration_job_abort("m", false, "late", 23);
    assert_eq!(
        w.migration("m").unwrap().aborted_by(),
        MigrationParty::Source
    );
    w.migration_job_abort("no-such", false, "x", 24);

    w.migration_get_state("m2", "b/0/enc", HANDOVER, 30)
        .unwrap();
    answer_all(&mut w, 30);
    w.migration_prepare_target("m2", "f2", b"null", 31).unwrap();
    answer_all(&mut w, 31);
    w.migration_job_abort("m2", false, &"x".repeat(5000), 32);
    let m = w.migration("m2").unwrap();
    assert_eq!(m.aborted_by(), MigrationParty::Target);
    assert!(m.abort_reason.len() < 200, "long reasons are cut");
    w.advance(100);
    assert_eq!(w.usage("f2"), (0.0, 0), "the target was stopped");
}

#[test]
fn a_refused_state_aborts_the_migration_with_no_target() {
    let mut w = world();
    running_job(&mut w);
    w.migration_get_state("m", "b/0/enc", HANDOVER, 20).unwrap();
    let ask = w.take_asks().remove(0);
    w.migration_reply(&ask, JobReply::StateRefused("busy".into()), 21);
    let m = w.migration("m").unwrap();
    assert_eq!(
        (m.phase(), m.aborted_by(), m.abort_reason.as_str()),
        (MigrationPhase::Aborted, MigrationParty::Source, "busy")
    );
    // a late answer to an aborted migration is ignored
    w.migration_reply(&ask, JobReply::State(b"null".to_vec()), 22);
    assert_eq!(w.migration("m").unwrap().phase(), MigrationPhase::Aborted);
}

#[test]
fn killing_the_source_aborts_its_migration_and_stops_the_target() {
    let mut w = world();
    running_job(&mut w);
    w.migration_get_state("m", "b/0/enc", HANDOVER, 20).unwrap();
    answer_all(&mut w, 21);
    w.migration_prepare_target("m", "f2", b"null", 22).unwrap();
    w.kill_node("f1", 23).unwrap();
    assert_eq!(w.migration("m").unwrap().phase(), MigrationPhase::Aborted);
    w.advance(100);
    assert_eq!(w.usage("f2"), (0.0, 0));
}

#[test]
fn migration_calls_out_of_order_are_failed_preconditions() {
    let mut w = world();
    running_job(&mut w);
    assert!(matches!(
        w.migration_cutover("nope", b"", 1),
        Err(CommandError::NotFound(_))
    ));
    w.migration_get_state("m", "b/0/enc", HANDOVER, 20).unwrap();
    assert!(matches!(
        w.migration_cutover("m", b"", 21),
        Err(CommandError::FailedPrecondition(_))
    ));
    assert!(matches!(
        w.migration_get_state("m", "b/0/enc", HANDOVER, 21),
        Err(CommandError::AlreadyExists(_))
    ));
    answer_all(&mut w, 22);
    assert!(
        matches!(
            w.migration_prepare_target("m", "f1", b"", 23),
            Err(CommandError::InvalidArgument(_))
        ),
        "target = source"
    );
}

/// The job's live instances as (node, role, state).
fn live(w: &World, job_id: &str) -> Vec<(String, JobRole, JobState)> {
    w.job(job_id)
        .unwrap()
        .instances
        .iter()
        .filter(|i| holds(i.state))
        .map(|i| (i.node_id.clone(), i.role(), i.state()))
        .collect()
}

fn roles_started(w: &World, job_id: &str) -> Vec<(String, JobRole)> {
    w.job_history(job_id, 0)
        .unwrap()
        .starts
        .iter()
        .map(|s| (s.node_id.clone(), s.role()))
        .collect()
}

#[test]
fn overlap_starts_the_target_then_promotes_it_and_stops_the_source_asking_the_job_nothing() {
    let mut w = world();
    running_job(&mut w);
    let m = w.migration_get_state("m", "b/0/enc", OVERLAP, 20).unwrap();
    assert_eq!(
        (m.phase(), m.strategy()),
        (MigrationPhase::StateReceived, MigrationStrategy::Overlap)
    );
    let (m, outcome) = w.migration_prepare_target("m", "f2", b"", 21).unwrap();
    assert_eq!(
        (m.phase(), outcome),
        (MigrationPhase::PreparingTarget, StartOutcome::Accepted)
    );
    assert_eq!(
        live(&w, "b/0/enc"),
        [
            ("f1".into(), JobRole::Normal, JobState::Running),
            ("f2".into(), JobRole::MigrationTarget, JobState::Starting)
        ]
    );
    w.advance(31);
    assert_eq!(
        w.migration("m").unwrap().phase(),
        MigrationPhase::TargetReady
    );
    assert!(
        matches!(
            w.start_job("b/0/enc", "f2", 0, 32),
            Err(CommandError::FailedPrecondition(_))
        ),
        "the source is still the job's live normal instance"
    );
    let m = w.migration_cutover("m", b"", 40).unwrap();
    assert_eq!(m.phase(), MigrationPhase::Completed);
    assert_eq!(
        live(&w, "b/0/enc"),
        [("f2".into(), JobRole::Normal, JobState::Running)]
    );
    assert_eq!(w.usage("f1"), (0.0, 0));
    assert_eq!(w.usage("f2"), (10.0, 1));
    assert!(w.take_asks().is_empty(), "the job was asked nothing");
    let h = w.job_history("b/0/enc", 100).unwrap();
    assert_eq!(
        roles_started(&w, "b/0/enc"),
        [
            ("f1".into(), JobRole::Normal),
            ("f2".into(), JobRole::MigrationTarget)
        ]
    );
    assert_eq!(h.starts[1].migration_id, "m");
    assert_eq!(
        (h.gaps, h.uncovered_ms, h.max_running, h.running),
        (0, 0, 2, 1),
        "always one instance running, two during the overlap"
    );
}

#[test]
fn stop_then_start_reserves_the_target_stops_the_source_then_starts_and_promotes_the_target() {
    let mut w = world();
    running_job(&mut w);
    let m = w
        .migration_get_state("m", "b/0/enc", STOP_THEN_START, 20)
        .unwrap();
    assert_eq!(m.phase(), MigrationPhase::StateReceived);
    let (m, outcome) = w.migration_prepare_target("m", "f2", b"", 21).unwrap();
    assert_eq!(
        (m.phase(), m.target_node_id.as_str(), outcome),
        (MigrationPhase::TargetReady, "f2", StartOutcome::Accepted),
        "prepared at once"
    );
    assert_eq!(
        live(&w, "b/0/enc"),
        [("f1".into(), JobRole::Normal, JobState::Running)],
        "prepared, not started"
    );
    assert_eq!(
        w.usage("f2"),
        (10.0, 1),
        "the target's capacity is reserved"
    );
    let m = w.migration_cutover("m", b"", 30).unwrap();
    assert_eq!(m.phase(), MigrationPhase::CuttingOver);
    assert_eq!(
        live(&w, "b/0/enc"),
        [("f1".into(), JobRole::Normal, JobState::Stopping)]
    );
    // The source stops; the target starts at once, as the migration target.
    w.advance(40);
    assert_eq!(
        live(&w, "b/0/enc"),
        [("f2".into(), JobRole::MigrationTarget, JobState::Starting)]
    );
    let job = w.job("b/0/enc").unwrap();
    assert_eq!(
        job.instances
            .iter()
            .find(|i| i.role() == JobRole::Normal)
            .map(|i| i.stop_reason()),
        Some(StopReason::Migrated)
    );
    assert!(
        matches!(
            w.start_job("b/0/enc", "f1", 0, 41),
            Err(CommandError::FailedPrecondition(_))
        ),
        "Manager owns the job until its target is promoted"
    );
    assert_eq!(
        w.usage("f2"),
        (10.0, 1),
        "the reservation became the instance's"
    );
    w.advance(50);
    assert_eq!(w.migration("m").unwrap().phase(), MigrationPhase::Completed);
    assert_eq!(
        live(&w, "b/0/enc"),
        [("f2".into(), JobRole::Normal, JobState::Running)]
    );
    assert_eq!(w.usage("f1"), (0.0, 0));
    assert!(w.take_asks().is_empty(), "the job was asked nothing");
    assert_eq!(
        roles_started(&w, "b/0/enc"),
        [
            ("f1".into(), JobRole::Normal),
            ("f2".into(), JobRole::MigrationTarget)
        ]
    );
    let h = w.job_history("b/0/enc", 100).unwrap();
    assert_eq!(
        (h.gaps, h.uncovered_ms, h.max_running),
        (1, 20, 1),
        "one instance at a time, with a gap from the source's stop (30) to the target's run (50)"
    );
}

#[test]
fn an_abort_before_cutover_leaves_only_the_source_running_for_every_strategy() {
    for (strategy, name) in [(OVERLAP, "overlap"), (STOP_THEN_START, "stopThenStart")] {
        let mut w = world();
        running_job(&mut w);
        w.migration_get_state("m", "b/0/enc", strategy, 20).unwrap();
        w.migration_prepare_target("m", "f2", b"", 21).unwrap();
        w.advance(31);
        assert_eq!(
            w.migration("m").unwrap().phase(),
            MigrationPhase::TargetReady,
            "{name}"
        );
        let m = w.migration_abort("m", "changed my mind", 32).unwrap();
        assert_eq!(
            (m.phase(), m.aborted_by()),
            (MigrationPhase::Aborted, MigrationParty::Controller)
        );
        w.advance(100);
        assert_eq!(
            live(&w, "b/0/enc"),
            [("f1".into(), JobRole::Normal, JobState::Running)],
            "{name}"
        );
        assert_eq!(
            w.usage("f2"),
            (0.0, 0),
            "{name}: target gone, reservation released"
        );
        assert_eq!(w.job_history("b/0/enc", 100).unwrap().gaps, 0, "{name}");
        assert!(w.take_asks().is_empty(), "{name}");
    }
}

#[test]
fn a_stop_then_start_target_refused_at_cutover_aborts_by_the_target() {
    let mut w = world();
    running_job(&mut w);
    w.migration_get_state("m", "b/0/enc", STOP_THEN_START, 20)
        .unwrap();
    w.migration_prepare_target("m", "f2", b"", 21).unwrap();
    w.reject_next(1);
    w.migration_cutover("m", b"", 22).unwrap();
    w.advance(40);
    let m = w.migration("m").unwrap();
    assert_eq!(
        (m.phase(), m.aborted_by()),
        (MigrationPhase::Aborted, MigrationParty::Target)
    );
    assert!(m.abort_reason.contains("refused"), "{}", m.abort_reason);
    assert!(
        live(&w, "b/0/enc").is_empty(),
        "past the point of no return"
    );
    assert_eq!(w.usage("f2"), (0.0, 0));
    // The job is the controller's again.
    assert_eq!(
        w.start_job("b/0/enc", "f1", 0, 41).unwrap(),
        StartOutcome::Accepted
    );
}

#[test]
fn a_stop_then_start_target_that_does_not_fit_is_refused_and_the_migration_waits() {
    let mut w = world();
    w.register_bundle(&bundle("big", 1, 60.0, 1), 0).unwrap();
    w.start_job("big/0/enc", "f2", 0, 0).unwrap();
    w.register_bundle(&bundle("b", 1, 50.0, 1), 0).unwrap();
    w.start_job("b/0/enc", "f1", 0, 0).unwrap();
    w.advance(10);
    w.migration_get_state("m", "b/0/enc", STOP_THEN_START, 20)
        .unwrap();
    let (m, outcome) = w.migration_prepare_target("m", "f2", b"", 21).unwrap();
    assert!(
        matches!(
            outcome,
            StartOutcome::Rejected {
                reason: RejectionReason::InsufficientCapacity,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(m.phase(), MigrationPhase::StateReceived);
    assert!(kinds(&w.take_events()).contains(&"JobRejected"));
}

#[test]
fn an_unknown_strategy_is_an_invalid_argument() {
    let mut w = world();
    running_job(&mut w);
    assert!(matches!(
        w.migration_get_state("m", "b/0/enc", 9, 20),
        Err(CommandError::InvalidArgument(_))
    ));
    assert!(w.migration("m").is_none());
}

#[test]
fn a_restart_resumes_overlap_and_stop_then_start_migrations_with_their_reservation() {
    let mut w = world();
    w.register_bundle(&bundle("b", 2, 10.0, 1), 0).unwrap();
    w.start_job("b/0/enc", "f1", 0, 0).unwrap();
    w.start_job("b/1/enc", "f1", 0, 0).unwrap();
    w.advance(10);
    w.migration_get_state("o", "b/0/enc", OVERLAP, 11).unwrap();
    w.migration_prepare_target("o", "f2", b"", 11).unwrap();
    w.migration_get_state("s", "b/1/enc", STOP_THEN_START, 11)
        .unwrap();
    w.migration_prepare_target("s", "f2", b"", 11).unwrap();
    let mut r = World::restore(&fixed_pools(), TIMING, 1000, w.persisted(), 12);
    assert_eq!(r.usage("f2"), (20.0, 2), "the target and the reservation");
    r.advance(30);
    assert_eq!(
        r.migration("o").unwrap().phase(),
        MigrationPhase::TargetReady
    );
    assert_eq!(
        r.migration("s").unwrap().phase(),
        MigrationPhase::TargetReady
    );
    r.migration_cutover("s", b"", 31).unwrap();
    r.migration_cutover("o", b"", 31).unwrap();
    // The source stops (at 41), then the target starts and runs (at 51).
    r.advance(41);
    r.advance(60);
    for id in ["o", "s"] {
        assert_eq!(r.migration(id).unwrap().phase(), MigrationPhase::Completed);
    }
    assert_eq!(r.usage("f2"), (20.0, 2));
    assert_eq!(r.usage("f1"), (0.0, 0));
}

#[test]
fn a_state_file_written_before_migrations_had_a_strategy_still_loads_as_handover() {
    let mut w = world();
    running_job(&mut w);
    w.migration_get_state("m", "b/0/enc", HANDOVER, 20).unwrap();
    let mut saved = serde_json::to_value(w.persisted()).unwrap();
    for m in saved["migrations"].as_array_mut().unwrap() {
        m.as_object_mut().unwrap().remove("strategy");
    }
    let saved: PersistedWorld = serde_json::from_value(saved).unwrap();
    let r = World::restore(&fixed_pools(), TIMING, 1000, saved, 30);
    let m = r.migration("m").unwrap();
    assert_eq!(m.strategy(), MigrationStrategy::Unspecified);
    assert_eq!(
        (m.phase(), m.abort_reason.as_str()),
        (MigrationPhase::Aborted, "manager restarted"),
        "an unset strategy is a handover waiting on its job"
    );
}

#[test]
fn the_history_of_a_job_never_started_is_not_found() {
    let mut w = world();
    w.register_bundle(&bundle("b", 1, 10.0, 1), 0).unwrap();
    assert!(matches!(
        w.job_history("b/0/enc", 0),
        Err(CommandError::NotFound(_))
    ));
    assert!(matches!(
        w.job_history("", 0),
        Err(CommandError::InvalidArgument(_))
    ));
}

#[test]
fn the_event_log_answers_resume_too_old_and_unknown() {
    let mut w = world_with_log(3);
    for i in 0..5 {
        w.register_bundle(&bundle(&format!("b{i}"), 1, 1.0, 1), 0)
            .unwrap();
    }
    let rev = w.revision();
    assert_eq!(w.events_after(rev, 10), Resume::Events(Vec::new()));
    assert_eq!(w.events_after(rev + 1, 10), Resume::Unknown);
    assert_eq!(w.events_after(1, 10), Resume::TooOld);
    let Resume::Events(evs) = w.events_after(rev - 2, 10) else {
        panic!()
    };
    assert_eq!(
        evs.iter().map(|e| e.revision).collect::<Vec<_>>(),
        [rev - 1, rev]
    );
}

#[test]
fn a_restored_world_equals_the_saved_one_and_finishes_pending_transitions() {
    let mut w = world();
    running_job(&mut w);
    w.register_bundle(&bundle("c", 1, 1.0, 1), 0).unwrap();
    w.start_job("c/0/enc", "f2", 0, 11).unwrap();
    let n = w
        .create_node(
            &CreateNodeRequest {
                pool: "e".into(),
                ..Default::default()
            },
            11,
        )
        .unwrap();
    let saved = w.persisted();
    let json = serde_json::to_string(&saved).unwrap();
    let back: PersistedWorld = serde_json::from_str(&json).unwrap();
    let cfg_pools = SimConfig::from_yaml(
        r"
pools:
  - {name: e, kind: aws, region: r, zones: [z1, z2], scaleOut: elastic,
     instanceTypes: [{instanceType: small, capacity: 50, cores: 4}]}
  - {name: f, kind: cluster, region: r, zones: [z1, z2], scaleOut: fixed, jobSocket: false,
     nodes: [{id: f1, zone: z1, capacity: 100, cores: 8}, {id: f2, zone: z2, capacity: 100, cores: 8}]}
",
    )
    .unwrap()
    .pools;
    let mut r = World::restore(&cfg_pools, TIMING, 100_000, back, 1000);
    assert_eq!(r.snapshot(), w.snapshot());
    assert_eq!(r.usage("f1"), w.usage("f1"));
    r.advance(2000);
    assert_eq!(r.job("c/0/enc").unwrap().state(), JobState::Running);
    assert_eq!(r.node(&n.node_id).unwrap().state(), NodeState::Started);
}

#[test]
fn malformed_commands_are_invalid_arguments() {
    let mut w = world();
    w.take_events();
    let bad = |r: Result<(), CommandError>| matches!(r, Err(CommandError::InvalidArgument(_)));
    assert!(bad(w
        .create_node(&CreateNodeRequest::default(), 0)
        .map(|_| ())));
    assert!(bad(w
        .create_node(
            &CreateNodeRequest {
                pool: "nope".into(),
                ..Default::default()
            },
            0
        )
        .map(|_| ())));
    assert!(
        bad(w
            .create_node(
                &CreateNodeRequest {
                    pool: "e".into(),
                    provider: 2,
                    ..Default::default()
                },
                0
            )
            .map(|_| ())),
        "oci in an aws pool"
    );
    assert!(bad(w
        .create_node(
            &CreateNodeRequest {
                pool: "e".into(),
                region: "x".into(),
                ..Default::default()
            },
            0
        )
        .map(|_| ())));
    assert!(bad(w
        .create_node(
            &CreateNodeRequest {
                pool: "e".into(),
                instance_type: "huge".into(),
                ..Default::default()
            },
            0
        )
        .map(|_| ())));
    assert!(bad(w
        .register_bundle(&bundle("b", 1, f64::NAN, 1), 0)
        .map(|_| ())));
    assert!(bad(w
        .register_bundle(&bundle("b/x", 1, 1.0, 1), 0)
        .map(|_| ())));
    let mut dup = bundle("b", 1, 1.0, 1);
    dup.jobs.push(dup.jobs[0].clone());
    assert!(bad(w.register_bundle(&dup, 0).map(|_| ())));
    let mut band = bundle("b", 1, 1.0, 1);
    if let Some(r) = band.jobs[0].requirements.as_mut() {
        r.priority_band = "platinum".into();
    }
    assert!(bad(w.register_bundle(&band, 0).map(|_| ())));
    assert!(bad(w.slow_provision(u64::MAX)));
    assert!(w.take_events().is_empty(), "refused commands emit nothing");
}

#[derive(Debug, Clone)]
enum Op {
    Create,
    Register(u8, u32, u8),
    Start(u8, u8),
    Stop(u8),
    Kill(u8),
    Advance(u8),
    PowerOff(u8),
    PowerOn(u8),
    Notice(u8, u8),
    /// Moves a job's migration on: propose (with strategy `s`), prepare, cut over or abort.
    Migrate(u8, u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Create),
        (0u8..3, 1u32..4, 0u8..70).prop_map(|(b, r, c)| Op::Register(b, r, c)),
        (any::<u8>(), any::<u8>()).prop_map(|(j, n)| Op::Start(j, n)),
        any::<u8>().prop_map(Op::Stop),
        any::<u8>().prop_map(Op::Kill),
        any::<u8>().prop_map(Op::Advance),
        any::<u8>().prop_map(Op::PowerOff),
        any::<u8>().prop_map(Op::PowerOn),
        (any::<u8>(), any::<u8>()).prop_map(|(n, ms)| Op::Notice(n, ms)),
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(j, n, s)| Op::Migrate(j, n, s)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn reservations_never_exceed_a_nodes_inventory_and_revisions_are_consecutive(ops in prop::collection::vec(op(), 1..80)) {
        let mut w = world();
        let mut now = 0;
        let mut last_rev = 0;
        for op in ops {
            let nodes: Vec<String> = w.nodes(None).into_iter().map(|n| n.node_id).collect();
            let jobs: Vec<String> = w.snapshot().jobs.into_iter().map(|j| j.job_id).collect();
            let pick = |v: &Vec<String>, i: u8| (!v.is_empty()).then(|| v[usize::from(i) % v.len()].clone());
            match op {
                Op::Create => { w.create_node(&CreateNodeRequest { pool: "e".into(), ..Default::default() }, now).unwrap(); }
                Op::Register(b, r, c) => { w.register_bundle(&bundle(&format!("b{b}"), r, f64::from(c), i32::from(c % 5)), now).unwrap(); }
                Op::Start(j, n) => if let (Some(j), Some(n)) = (pick(&jobs, j), pick(&nodes, n)) { let _ = w.start_job(&j, &n, 0, now); },
                Op::Stop(j) => if let Some(j) = pick(&jobs, j) { w.stop_job(&j, 0, now).unwrap(); },
                Op::Kill(n) => if let Some(n) = pick(&nodes, n) { w.kill_node(&n, now).unwrap(); },
                Op::Advance(ms) => { now += i64::from(ms); w.advance(now); }
                // Refusals (hosting jobs, a cluster pool, a terminated node) are fine here.
                Op::PowerOff(n) => if let Some(n) = pick(&nodes, n) { let _ = w.stop_node(&n, now); },
                Op::PowerOn(n) => if let Some(n) = pick(&nodes, n) { let _ = w.start_node(&n, now); },
                Op::Notice(n, ms) => if let Some(n) = pick(&nodes, n) { let _ = w.notice_node(&n, u64::from(ms), "", now); },
                Op::Migrate(j, n, s) => if let (Some(j), Some(n)) = (pick(&jobs, j), pick(&nodes, n)) {
                    let active = w.snapshot().migrations.into_iter().find(|m| m.job_id == j && !is_final(m.phase));
                    match (active, s % 4) {
                        (None, _) => { let _ = w.migration_get_state(&format!("m{now}-{j}"), &j, i32::from(s % 3) + 1, now); }
                        (Some(m), 0) => { w.migration_abort(&m.migration_id, "why not", now).unwrap(); }
                        (Some(m), 1 | 2) => { let _ = w.migration_prepare_target(&m.migration_id, &n, b"null", now); }
                        (Some(m), _) => { let _ = w.migration_cutover(&m.migration_id, b"null", now); }
                    }
                },
            }
            // Handover asks are answered cooperatively; the other strategies ask nothing.
            for ask in w.take_asks() {
                let handover = w.migration(ask.migration_id()).is_some_and(|m| strategy_of(m) == MigrationStrategy::Handover);
                prop_assert!(handover, "{ask:?}");
                let r = default_reply(&ask);
                w.migration_reply(&ask, r, now);
            }
            for ev in w.take_events() {
                prop_assert_eq!(ev.revision, last_rev + 1);
                last_rev = ev.revision;
            }
            for n in w.nodes(None) {
                let (cap, cores) = w.usage(&n.node_id);
                let inv = n.inventory.clone().unwrap_or_default();
                prop_assert!(cap <= inv.capacity + 1e-6, "{} holds {cap} of {}", n.node_id, inv.capacity);
                prop_assert!(cores <= inv.cores);
                if n.state != NodeState::Started as i32 && n.state != NodeState::Stopped as i32 {
                    prop_assert_eq!(cap, 0.0, "only started nodes hold work");
                }
            }
            for j in w.snapshot().jobs {
                let normal = j.instances.iter().find(|i| i.role == JobRole::Normal as i32);
                prop_assert_eq!(j.state, normal.map_or(JobState::Pending as i32, |i| i.state));
                for role in [JobRole::Normal as i32, JobRole::MigrationTarget as i32] {
                    prop_assert!(j.instances.iter().filter(|i| i.role == role).count() <= 1, "{j:?}");
                }
            }
            for m in w.snapshot().migrations.iter().filter(|m| m.phase == MigrationPhase::Completed as i32) {
                let j = w.job(&m.job_id);
                if let Some(j) = j.filter(|j| j.node_id == m.target_node_id) {
                    prop_assert!(j.instances.iter().all(|i| i.role == JobRole::Normal as i32 || !holds(i.state)), "{j:?}");
                }
            }
        }
    }
}

#[test]
fn updating_a_bundle_that_does_not_exist_is_not_found() {
    let mut w = world();
    assert!(matches!(
        w.update_bundle(&bundle("b", 1, 1.0, 1), 0),
        Err(CommandError::NotFound(_))
    ));
    w.register_bundle(&bundle("b", 1, 1.0, 1), 0).unwrap();
    let (stored, ids) = w.update_bundle(&bundle("b", 2, 1.0, 1), 1).unwrap();
    assert_eq!((stored.generation, ids.len()), (2, 2));
}

fn fixed_pools() -> Vec<crate::config::PoolConfig> {
    SimConfig::from_yaml(
        r"
pools:
  - {name: f, kind: cluster, region: r, zones: [z1, z2], scaleOut: fixed,
     nodes: [{id: f1, zone: z1, capacity: 100, cores: 8}, {id: f2, zone: z2, capacity: 100, cores: 8}]}
",
    )
    .unwrap()
    .pools
}

#[test]
fn a_restart_aborts_only_migrations_waiting_on_a_job() {
    let mut w = world();
    w.register_bundle(&bundle("b", 2, 10.0, 1), 0).unwrap();
    w.start_job("b/0/enc", "f1", 0, 0).unwrap();
    w.start_job("b/1/enc", "f1", 0, 0).unwrap();
    w.advance(10);
    w.migration_get_state("waits-on-job", "b/0/enc", HANDOVER, 11)
        .unwrap();
    w.migration_get_state("waits-on-controller", "b/1/enc", HANDOVER, 11)
        .unwrap();
    for ask in w.take_asks() {
        if ask.migration_id() == "waits-on-controller" {
            let r = default_reply(&ask);
            w.migration_reply(&ask, r, 12);
        }
    }
    let r = World::restore(&fixed_pools(), TIMING, 1000, w.persisted(), 100);
    assert_eq!(
        r.migration("waits-on-job").unwrap().phase(),
        MigrationPhase::Aborted
    );
    assert_eq!(
        r.migration("waits-on-job").unwrap().abort_reason,
        "manager restarted"
    );
    assert_eq!(
        r.migration("waits-on-controller").unwrap().phase(),
        MigrationPhase::StateReceived
    );
}

fn keyed(pool: &str, key: &str) -> CreateNodeRequest {
    CreateNodeRequest {
        pool: pool.into(),
        request_id: key.into(),
        tags: [("for".to_owned(), "r1".to_owned())].into_iter().collect(),
        ..Default::default()
    }
}

#[test]
fn a_repeated_create_node_request_id_makes_nothing_and_answers_with_the_first_node() {
    let mut w = world();
    w.take_events();
    let first = w.create_node(&keyed("e", "k1"), 0).unwrap();
    assert_eq!(first.request_id, "k1");
    assert_eq!(kinds(&w.take_events()), ["NodeStarting"]);
    let revision = w.revision();
    // The answer was lost; the caller asks again, before and after the node started.
    assert_eq!(w.create_node(&keyed("e", "k1"), 5).unwrap(), first);
    w.advance(200);
    w.take_events();
    let again = w.create_node(&keyed("e", "k1"), 300).unwrap();
    assert_eq!(again.node_id, first.node_id);
    assert_eq!(again.state(), NodeState::Started);
    assert!(w.take_events().is_empty());
    assert!(
        w.revision() > revision,
        "the start moved it, not the repeats"
    );
    let revision = w.revision();
    // Naming the zone and instance type the first call got is still the same request.
    let mut named = keyed("e", "k1");
    named.zone.clone_from(&first.zone);
    named.instance_type.clone_from(&first.instance_type);
    assert_eq!(w.create_node(&named, 300).unwrap().node_id, first.node_id);
    assert_eq!(w.revision(), revision);
    // Another key, or none, is another node.
    assert_ne!(
        w.create_node(&keyed("e", "k2"), 300).unwrap().node_id,
        first.node_id
    );
    let unkeyed = w.create_node(&keyed("e", ""), 300).unwrap();
    assert_eq!(unkeyed.request_id, "");
    assert_ne!(
        w.create_node(&keyed("e", ""), 300).unwrap().node_id,
        unkeyed.node_id
    );
    assert_eq!(
        w.snapshot().nodes.iter().filter(|n| n.pool == "e").count(),
        4
    );
}

#[test]
fn a_request_id_reused_for_another_request_is_already_exists_and_makes_nothing() {
    let mut w = world();
    let first = w.create_node(&keyed("e", "k1"), 0).unwrap();
    w.take_events();
    let other_zone = if first.zone == "z1" { "z2" } else { "z1" };
    let mut cases = vec![
        keyed("e", "k1"),
        keyed("e", "k1"),
        keyed("e", "k1"),
        keyed("f", "k1"),
    ];
    cases[0].zone = other_zone.into();
    cases[1].instance_type = "gpu".into();
    cases[2].tags.insert("for".into(), "r2".into());
    for req in cases {
        match w.create_node(&req, 1) {
            Err(CommandError::AlreadyExists(m)) => {
                assert!(m.contains("k1") && m.contains(&first.node_id), "{m}");
            }
            other => panic!("{req:?}: {other:?}"),
        }
    }
    assert!(w.take_events().is_empty());
    // A malformed key is refused like any malformed field.
    for bad in ["x".repeat(254), "a\nb".to_owned()] {
        assert!(matches!(
            w.create_node(&keyed("e", &bad), 1),
            Err(CommandError::InvalidArgument(m)) if m.contains("request_id")
        ));
    }
}

#[test]
fn request_ids_survive_a_restart_with_the_nodes_and_old_state_files_load() {
    let mut w = world();
    let first = w.create_node(&keyed("e", "k1"), 0).unwrap();
    let pools = SimConfig::from_yaml(
        r"
pools:
  - {name: e, kind: aws, region: r, zones: [z1, z2], scaleOut: elastic,
     instanceTypes: [{instanceType: small, capacity: 50, cores: 4}]}
",
    )
    .unwrap()
    .pools;
    let json = serde_json::to_string(&w.persisted()).unwrap();
    let mut r = World::restore(
        &pools,
        TIMING,
        1000,
        serde_json::from_str(&json).unwrap(),
        10,
    );
    assert_eq!(
        r.create_node(&keyed("e", "k1"), 20).unwrap().node_id,
        first.node_id
    );
    // A state file written before nodes carried a request_id.
    let mut old: serde_json::Value = serde_json::from_str(&json).unwrap();
    for n in old["nodes"].as_array_mut().unwrap() {
        n.as_object_mut().unwrap().remove("request_id");
    }
    let old: PersistedWorld = serde_json::from_value(old).unwrap();
    let mut r = World::restore(&pools, TIMING, 1000, old, 10);
    assert_eq!(r.node(&first.node_id).unwrap().request_id, "");
    assert_ne!(
        r.create_node(&keyed("e", "k1"), 20).unwrap().node_id,
        first.node_id
    );
}

#[test]
fn a_bundle_job_template_is_kept_as_given_and_an_oversized_one_is_refused() {
    let mut w = world();
    let mut b = bundle("t", 1, 1.0, 1);
    b.jobs[0].template = vec![0x3a, 0x02, 0x0a, 0x00];
    let (stored, _) = w.register_bundle(&b, 0).unwrap();
    assert_eq!(stored.jobs[0].template, b.jobs[0].template);
    b.jobs[0].template = vec![0; crate::validate::MAX_TEMPLATE_BYTES + 1];
    let e = w.register_bundle(&b, 0).unwrap_err().to_string();
    assert!(e.contains("template") && e.contains("at most"), "{e}");
}
