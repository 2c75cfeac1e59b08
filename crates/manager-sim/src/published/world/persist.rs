//! The published world's part of `--state-dir`: its nodes (with their tags and where each is in
//! its life), stored jobs with their histories and instances, our extension's migrations, and
//! the faults that outlast a call (dead and partitioned zones, a `slow-provision` delay). The
//! published API's messages are kept as their protobuf encoding (hex), so the file reads back
//! exactly what Manager sent; the rest is plain JSON. What is not kept, as in our first API's
//! world: the job histories `job-history` prints, `reject-next` counts and migration behaviours.

use std::collections::{BTreeMap, BTreeSet};

use manager_proto::api::common::{NodeMetadata, RunningNodeMetadata};
use manager_proto::api::manager::{Job, JobHistoryEntry};
use manager_proto::extension::Migration;
use prost::Message;
use serde::{Deserialize, Serialize};

use super::ext::Power;
use super::{Node, PublishedWorld, StoredJob};
use crate::config::SimConfig;

/// The published world as the state dir keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct PersistedPublished {
    nodes: Vec<SavedNode>,
    jobs: Vec<SavedJob>,
    /// The last job hash handed out.
    hashes: i64,
    /// The provisioning delay `slow-provision` set.
    provision_delay_ms: Option<u64>,
    dead_zones: BTreeSet<String>,
    partitioned_zones: BTreeSet<String>,
    /// Our extension's migrations (encoded).
    migrations: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedNode {
    id: String,
    /// `NodeMetadata`, encoded.
    metadata: String,
    physical: bool,
    ready_at_ms: Option<i64>,
    /// `RunningNodeMetadata`, encoded.
    running: Option<String>,
    power: Power,
    notice: Option<(i64, String)>,
    start_delay_ms: u64,
    stop_delay_ms: u64,
    #[serde(default)]
    zone: String,
    #[serde(default)]
    partitioned: bool,
    #[serde(default = "listening")]
    job_socket: bool,
}

fn listening() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedJob {
    /// `Job`, encoded.
    job: String,
    /// `JobHistoryEntry`s, encoded.
    history: Vec<String>,
    /// Live instances: role → node.
    instances: BTreeMap<String, String>,
    /// Those not yet running: role → when they run.
    #[serde(default)]
    starting: BTreeMap<String, i64>,
}

fn hex(m: &impl Message) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let bytes = m.encode_to_vec();
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

fn unhex<M: Message + Default>(what: &str, text: &str) -> Result<M, String> {
    let bad = || format!("{what}: not an encoded message");
    if !text.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes = (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(bad)?;
    M::decode(bytes.as_slice()).map_err(|e| format!("{what}: {e}"))
}

impl PublishedWorld {
    /// What the state dir keeps of this world.
    pub(crate) fn persisted(&self) -> PersistedPublished {
        PersistedPublished {
            nodes: self
                .nodes
                .iter()
                .map(|(id, n)| SavedNode {
                    id: id.clone(),
                    metadata: hex(&n.meta),
                    physical: n.physical,
                    ready_at_ms: n.ready_at_ms,
                    running: n.running.as_ref().map(hex),
                    power: n.power,
                    notice: n.notice.clone(),
                    start_delay_ms: n.start_delay_ms,
                    stop_delay_ms: n.stop_delay_ms,
                    zone: n.zone.clone(),
                    partitioned: n.partitioned,
                    job_socket: n.job_socket,
                })
                .collect(),
            jobs: self
                .jobs
                .values()
                .map(|s| SavedJob {
                    job: hex(&s.job),
                    history: s.history.iter().map(hex).collect(),
                    instances: s.instances.clone(),
                    starting: s.starting.clone(),
                })
                .collect(),
            hashes: self.hashes,
            provision_delay_ms: self.chaos.provision_delay_ms,
            dead_zones: self.chaos.dead_zones.clone(),
            partitioned_zones: self.chaos.partitioned.clone(),
            migrations: self.ext_migrations().map(hex).collect(),
        }
    }

    /// The world `saved` describes, with the offers (and delays) of `config`'s pools; what
    /// cannot be read is said.
    pub(crate) fn restore(
        config: &SimConfig,
        saved: PersistedPublished,
        now_ms: i64,
    ) -> Result<PublishedWorld, String> {
        let mut world = PublishedWorld::new(config, now_ms);
        world.nodes.clear();
        for n in saved.nodes {
            let meta: NodeMetadata = unhex(&format!("node {}", n.id), &n.metadata)?;
            let running = match &n.running {
                Some(r) => Some(unhex::<RunningNodeMetadata>(&format!("node {}", n.id), r)?),
                None => None,
            };
            world.nodes.insert(
                n.id,
                Node {
                    meta,
                    physical: n.physical,
                    ready_at_ms: n.ready_at_ms,
                    running,
                    power: n.power,
                    notice: n.notice,
                    start_delay_ms: n.start_delay_ms,
                    stop_delay_ms: n.stop_delay_ms,
                    zone: n.zone,
                    partitioned: n.partitioned,
                    job_socket: n.job_socket,
                },
            );
        }
        for j in saved.jobs {
            let job: Job = unhex("a job", &j.job)?;
            let id = job
                .job_id
                .as_ref()
                .map(|i| i.job_id.clone())
                .unwrap_or_default();
            let history = j
                .history
                .iter()
                .map(|h| unhex::<JobHistoryEntry>(&format!("job {id}'s history"), h))
                .collect::<Result<Vec<_>, _>>()?;
            world.jobs.insert(
                id,
                StoredJob {
                    job,
                    history,
                    instances: j.instances,
                    starting: j.starting,
                },
            );
        }
        world.hashes = saved.hashes;
        if let Some(ms) = saved.provision_delay_ms {
            world
                .slow_provision(ms)
                .map_err(|e| format!("provisionDelayMs: {e}"))?;
        }
        world.chaos.dead_zones = saved.dead_zones;
        world.chaos.partitioned = saved.partitioned_zones;
        for m in &saved.migrations {
            let m: Migration = unhex("a migration", m)?;
            world.restore_migration(m);
        }
        // Building the world queued nothing anyone is waiting for.
        world.take_events();
        world.take_ext_events();
        Ok(world)
    }
}

#[cfg(test)]
mod tests {
    use manager_proto::api::common::{JobId, NodeId};
    use manager_proto::api::manager::CreateAwsNodeRequest;

    use super::*;

    #[test]
    fn a_world_read_back_from_its_state_shows_the_same_snapshot_and_keeps_its_faults() {
        let config = SimConfig::demo();
        let mut w = PublishedWorld::new(&config, 0);
        let node = |id: &str| CreateAwsNodeRequest {
            node_id: Some(NodeId {
                node_id: id.to_owned(),
            }),
            tags: BTreeMap::from([
                ("owner".to_owned(), "test".to_owned()),
                (
                    "automanager.norsk.io/zone".to_owned(),
                    "eu-west-1b".to_owned(),
                ),
            ]),
            region: "eu-west-1".to_owned(),
            instance_type: "m5.xlarge".to_owned(),
            ..Default::default()
        };
        w.create_aws_node(&node("up"), 0).expect("created");
        w.advance(1_000);
        w.create_aws_node(&node("starting"), 1_000)
            .expect("created");
        w.create_job(
            Job {
                job_id: Some(JobId {
                    job_id: "ns.b/0/enc".to_owned(),
                }),
                tags: BTreeMap::from([("bundle".to_owned(), "ns.b".to_owned())]),
                manager_configuration: "{\"bitrate\": 5}".to_owned(),
                ..Default::default()
            },
            1_000,
        )
        .expect("stored");
        w.start_job("ns.b/0/enc", "primary", "up", 1_000)
            .expect("started");
        w.start_job("ns.b/0/enc", "backup", "onprem-b1", 1_000)
            .expect("started");
        w.slow_provision(9_000).expect("slowed");
        w.kill_zone("fra-ad-2", false, 1_000).expect("killed");
        w.partition_zone("rack-a", false, 1_000).expect("cut");

        let text = serde_json::to_string(&w.persisted()).expect("written");
        let saved: PersistedPublished = serde_json::from_str(&text).expect("read");
        let mut back = PublishedWorld::restore(&config, saved, 1_100).expect("restored");
        assert_eq!(back.snapshot(), w.snapshot());
        assert_eq!(back.persisted(), w.persisted());
        assert!(back.take_events().is_empty());

        // The faults in force are still in force.
        back.create_aws_node(&node("later"), 2_000)
            .expect("created");
        back.advance(10_999);
        assert!(
            back.nodes["later"].ready_at_ms.is_some(),
            "slow-provision kept"
        );
        assert!(back.chaos.zone_dead("fra-ad-2"));
        assert_eq!(
            back.partition_zone("rack-a", true, 3_000)
                .expect("healed")
                .len(),
            2
        );
        // The next job hash follows the last one handed out.
        let hash = back
            .create_job(
                Job {
                    job_id: Some(JobId {
                        job_id: "ns.b/1/enc".to_owned(),
                    }),
                    ..Default::default()
                },
                3_000,
            )
            .expect("stored");
        assert_eq!(hash, w.hashes + 1);
    }

    #[test]
    fn a_damaged_state_is_refused_with_what_is_wrong() {
        let config = SimConfig::demo();
        let mut saved = PublishedWorld::new(&config, 0).persisted();
        saved.jobs.push(SavedJob {
            job: "zz".to_owned(),
            history: Vec::new(),
            instances: BTreeMap::new(),
            starting: BTreeMap::new(),
        });
        let err = PublishedWorld::restore(&config, saved, 0).expect_err("refused");
        assert!(err.contains("a job"), "{err}");
    }
}
