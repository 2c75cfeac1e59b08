//! Property: however the sim's events reach the mirror — delayed, cut off,
//! resumed, duplicated, or replaced by a snapshot when the log is too short —
//! the mirror ends equal to the sim's own world.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use manager_client::{MirrorChange, MirrorState, SnapshotData};
use manager_proto::{
    Bundle, BundleJob, CreateNodeRequest, Event, JobRequirements, JobRole, SnapshotReason,
};
use manager_sim::config::TimingConfig;
use manager_sim::world::{JobAsk, Resume, World, default_reply};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    CreateNode(u8),
    Register {
        bundle: u8,
        replicas: u32,
        capacity: u8,
    },
    DeleteBundle(u8),
    Start {
        job: u8,
        node: u8,
        target: bool,
    },
    Stop(u8),
    Terminate(u8),
    Kill(u8),
    Fail(u8),
    Config(u8),
    Partition {
        zone: bool,
        heal: bool,
    },
    Migrate {
        job: u8,
        node: u8,
        step: u8,
    },
    AnswerAsk,
    Advance(u8),
    // delivery side
    Deliver(u8),
    Duplicate,
    Reconnect,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => any::<u8>().prop_map(Op::CreateNode),
        3 => (0u8..4, 1u32..4, 0u8..80).prop_map(|(bundle, replicas, capacity)| Op::Register { bundle, replicas, capacity }),
        1 => (0u8..4).prop_map(Op::DeleteBundle),
        5 => (any::<u8>(), any::<u8>(), any::<bool>()).prop_map(|(job, node, target)| Op::Start { job, node, target }),
        2 => any::<u8>().prop_map(Op::Stop),
        1 => any::<u8>().prop_map(Op::Terminate),
        1 => any::<u8>().prop_map(Op::Kill),
        1 => any::<u8>().prop_map(Op::Fail),
        1 => any::<u8>().prop_map(Op::Config),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(zone, heal)| Op::Partition { zone, heal }),
        3 => (any::<u8>(), any::<u8>(), 0u8..4).prop_map(|(job, node, step)| Op::Migrate { job, node, step }),
        3 => Just(Op::AnswerAsk),
        3 => any::<u8>().prop_map(Op::Advance),
        5 => any::<u8>().prop_map(Op::Deliver),
        1 => Just(Op::Duplicate),
        1 => Just(Op::Reconnect),
    ]
}

fn pools() -> Vec<manager_sim::config::PoolConfig> {
    manager_sim::SimConfig::from_yaml(
        r"
pools:
  - {name: e, kind: aws, region: r, zones: [z1, z2], scaleOut: elastic,
     instanceTypes: [{instanceType: t, capacity: 100, cores: 8, capabilities: [gpu]}]}
  - {name: f, kind: cluster, region: r, zones: [z1, z2], scaleOut: fixed,
     nodes: [{id: f1, zone: z1, capacity: 100, cores: 8}, {id: f2, zone: z2, capacity: 50, cores: 4}]}
",
    )
    .unwrap()
    .pools
}

fn pick<T: Clone>(items: &[T], i: u8) -> Option<T> {
    if items.is_empty() {
        None
    } else {
        items.get(usize::from(i) % items.len()).cloned()
    }
}

struct Client {
    mirror: MirrorState,
    /// Events sent on the current stream but not yet applied.
    in_flight: Vec<Event>,
    applied: Vec<Event>,
}

impl Client {
    fn reconnect(&mut self, world: &World) {
        self.in_flight.clear();
        let mut out = Vec::new();
        match world.events_after(self.mirror.revision, usize::MAX) {
            Resume::Events(evs) => self.in_flight = evs,
            Resume::TooOld | Resume::Unknown => {
                let s = world.snapshot();
                self.mirror.replace(
                    SnapshotData {
                        epoch: s.epoch,
                        revision: s.revision,
                        reason: SnapshotReason::RevisionTooOld,
                        nodes: s.nodes,
                        jobs: s.jobs,
                        bundles: s.bundles,
                        migrations: s.migrations,
                    },
                    &mut out,
                );
                assert!(matches!(out.last(), Some(MirrorChange::Resynced { .. })));
            }
        }
    }

    fn deliver(&mut self, n: usize) {
        let n = n.min(self.in_flight.len());
        let mut out = Vec::new();
        for ev in self.in_flight.drain(..n) {
            self.applied.push(ev.clone());
            self.mirror.apply_event(ev, &mut out);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_interleaving_of_delivery_converges_on_the_sims_state(
        ops in prop::collection::vec(op(), 1..120),
        log_capacity in prop_oneof![Just(8usize), Just(64), Just(100_000)],
    ) {
        let timing = TimingConfig { provision_delay_ms: 10, job_start_delay_ms: 5, job_stop_delay_ms: 5, start_delay_ms: None, stop_delay_ms: None };
        let mut world = World::new(&pools(), timing, log_capacity, "epoch".into(), 0);
        let mut now = 0i64;
        let mut asks: Vec<JobAsk> = Vec::new();
        let mut client = Client { mirror: MirrorState::default(), in_flight: Vec::new(), applied: Vec::new() };
        client.reconnect(&world);
        let mut migration_seq = 0u32;

        for op in ops {
            world.advance(now);
            let nodes: Vec<String> = world.nodes(None).into_iter().map(|n| n.node_id).collect();
            let jobs: Vec<String> = world.snapshot().jobs.into_iter().map(|j| j.job_id).collect();
            match op {
                Op::CreateNode(z) => {
                    let zone = match z % 3 { 0 => "", 1 => "z1", _ => "z2" };
                    world.create_node(&CreateNodeRequest { pool: "e".into(), zone: zone.into(), ..Default::default() }, now).unwrap();
                }
                Op::Register { bundle, replicas, capacity } => {
                    let b = Bundle {
                        bundle_id: format!("b{bundle}"),
                        replicas,
                        jobs: vec![BundleJob {
                            job_name: "j".into(),
                            requirements: Some(JobRequirements { required_capacity: f64::from(capacity), required_cores: i32::from(capacity % 4), ..Default::default() }),
                            config: Vec::new(),
                            template: Vec::new(),
                        }],
                        ..Default::default()
                    };
                    world.register_bundle(&b, now).unwrap();
                }
                Op::DeleteBundle(b) => { let _ = world.delete_bundle(&format!("b{b}"), now); }
                Op::Start { job, node, target } => {
                    if let (Some(j), Some(n)) = (pick(&jobs, job), pick(&nodes, node)) {
                        let role = if target { JobRole::MigrationTarget } else { JobRole::Normal };
                        let _ = world.start_job(&j, &n, role as i32, now);
                    }
                }
                Op::Stop(j) => { if let Some(j) = pick(&jobs, j) { world.stop_job(&j, JobRole::Normal as i32, now).unwrap(); } }
                Op::Terminate(n) => { if let Some(n) = pick(&nodes, n) { world.terminate_node(&n, now).unwrap(); } }
                Op::Kill(n) => { if let Some(n) = pick(&nodes, n) { world.kill_node(&n, now).unwrap(); } }
                Op::Fail(j) => { if let Some(j) = pick(&jobs, j) { let _ = world.fail_job(&j, "boom", now); } }
                Op::Config(j) => { if let Some(j) = pick(&jobs, j) { world.update_job_config(&j, b"{\"x\":1}", now).unwrap(); } }
                Op::Partition { zone, heal } => { world.partition_zone(if zone { "z1" } else { "z2" }, heal, now).unwrap(); }
                Op::Migrate { job, node, step } => {
                    if let Some(j) = pick(&jobs, job) {
                        let active = world.snapshot().migrations.into_iter().find(|m| m.job_id == j && m.phase < 6);
                        match (active, step) {
                            (None, _) => { migration_seq += 1; let _ = world.migration_get_state(&format!("m{migration_seq}"), &j, i32::from(step % 4), now); }
                            (Some(m), 0) => { let _ = world.migration_abort(&m.migration_id, "why not", now); }
                            (Some(m), 1 | 2) => { if let Some(n) = pick(&nodes, node) { let _ = world.migration_prepare_target(&m.migration_id, &n, b"null", now); } }
                            (Some(m), _) => { let _ = world.migration_cutover(&m.migration_id, b"{}", now); }
                        }
                    }
                }
                Op::AnswerAsk => {
                    if !asks.is_empty() {
                        let ask = asks.remove(0);
                        world.migration_reply(&ask, default_reply(&ask), now);
                    }
                }
                Op::Advance(ms) => { now += i64::from(ms); world.advance(now); }
                Op::Deliver(n) => client.deliver(usize::from(n % 16)),
                Op::Duplicate => {
                    // a stale or replayed event must not change anything
                    if let Some(ev) = client.applied.last().cloned() {
                        let before = client.mirror.clone();
                        let mut out = Vec::new();
                        client.mirror.apply_event(ev, &mut out);
                        prop_assert_eq!(&before, &client.mirror);
                        prop_assert!(out.is_empty());
                    }
                }
                Op::Reconnect => client.reconnect(&world),
            }
            asks.extend(world.take_asks());
            // new events go onto the current stream
            client.in_flight.extend(world.take_events());
        }
        client.deliver(usize::MAX);
        client.reconnect(&world);
        client.deliver(usize::MAX);

        let s = world.snapshot();
        prop_assert_eq!(client.mirror.revision, s.revision);
        prop_assert_eq!(client.mirror.nodes.values().cloned().collect::<Vec<_>>(), s.nodes);
        prop_assert_eq!(client.mirror.jobs.values().cloned().collect::<Vec<_>>(), s.jobs);
        prop_assert_eq!(client.mirror.bundles.values().cloned().collect::<Vec<_>>(), s.bundles);
        prop_assert_eq!(client.mirror.migrations.values().cloned().collect::<Vec<_>>(), s.migrations);
    }
}
