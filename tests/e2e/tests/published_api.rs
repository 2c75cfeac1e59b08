//! The operator speaking Manager's published API (`manager.api: published`) end to end: the
//! real apiserver, the manager-sim binary serving `norsk.api.manager.Manager`, the operator
//! binary, and the examples applied with kubectl. Every node and job the operator makes in
//! Manager carries its owner tag, jobs run under the `primary` role, and another client's job
//! in the same Manager is never touched. The sim serves the published API alone
//! (`--no-extension`): this is the operator's standard mode, which says what it cannot do.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use automanager_api::{Bundle, HotSpareTarget, JobState, Migration, MigrationPhase};
use automanager_e2e::scenario::{BundleView, show};
use automanager_e2e::stack::Stack;
use automanager_e2e::{examples_dir, repo_root};
use manager_client::proto::api::common::{JobId, service};
use manager_client::proto::api::manager::{Job, JobHistoryEntry};
use manager_client::published::{
    InstancePhase, PublishedClient, PublishedConfig, tags, timestamp_ms,
};

const OWNER: &str = "e2e-published";
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn examples_run_over_the_published_api_and_another_client_s_job_is_never_touched() {
    let sim_config = repo_root().join("deploy/demo/manager-sim.yaml");
    let stack = Stack::start_custom(&sim_config, &["--no-extension"], |c| {
        c.insert(
            "manager".into(),
            serde_json::json!({"url": c["manager"]["url"], "api": "published", "owner": OWNER}),
        );
        c.insert(
            "orphanSweep".into(),
            serde_json::json!({"interval": "1s", "grace": "1s"}),
        );
    })
    .await
    .expect("stack");

    // Another client of the same Manager, with a job under an id the operator would choose.
    let other = PublishedClient::connect(PublishedConfig::new(stack.sim_endpoint.clone()))
        .expect("another client");
    other.wait_ready(WAIT).await.expect("its snapshot");
    other
        .create_job(Job {
            job_id: Some(JobId {
                job_id: "default.news-gold/0/encode".to_owned(),
            }),
            tags: BTreeMap::from([(tags::OWNER.to_owned(), "someone-else".to_owned())]),
            ..Default::default()
        })
        .await
        .expect("a foreign job");

    // Two stored jobs of a Bundle no cluster has: one under this installation's owner tag (an
    // orphan, say after a restore: the sweep removes it), one under another's (never touched).
    for (id, owner, replica) in [
        ("default.gone/0/enc", OWNER, "0"),
        ("default.gone/1/enc", "someone-else", "1"),
    ] {
        other
            .create_job(Job {
                job_id: Some(JobId {
                    job_id: id.to_owned(),
                }),
                tags: BTreeMap::from([
                    (tags::OWNER.to_owned(), owner.to_owned()),
                    (tags::BUNDLE.to_owned(), "default.gone".to_owned()),
                    (tags::REPLICA.to_owned(), replica.to_owned()),
                    (tags::JOB.to_owned(), "enc".to_owned()),
                ]),
                ..Default::default()
            })
            .await
            .expect("a stored job");
    }

    let out = stack.env.apply_file(examples_dir()).await.unwrap();
    assert!(out.success(), "{}", out.stderr);
    for name in ["my-channel-1", "sports-silver", "preview-bronze"] {
        stack.expect_ready(name).await;
    }
    let b = stack.bundle("my-channel-1").await;
    assert_eq!(b.placed_replicas(), 2, "{}", show(&b));
    assert_eq!(b.pool_of(0, "encode"), Some("aws-east"), "{}", show(&b));
    assert_eq!(b.pool_of(1, "encode"), Some("oci-fra"), "{}", show(&b));
    for r in 0..2 {
        assert_eq!(b.state_of(r, "encode"), Some(JobState::Running));
        assert_eq!(b.node_of(r, "package"), b.node_of(r, "encode"));
    }
    // news-gold's first job would take the other client's id: it is refused, and says why,
    // rather than adopting or replacing that job.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let g = stack.bundle("news-gold").await;
        let said = g.status.as_ref().is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.message.contains("not this installation's"))
        });
        if said {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", show(&g));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let s = stack.bundle("sports-silver").await;
    assert_eq!(s.pool_of(0, "ingest"), Some("onprem"), "{}", show(&s));
    // sports-silver's encode job carries a template: Manager's stored job is that definition,
    // with the operator's id, tags and configuration stamped in.
    let stored = other.with_mirror(|m| {
        m.jobs
            .get("default.sports-silver/0/encode")
            .map(|j| j.job.clone())
    });
    let stored = stored.expect("sports-silver's encode job is stored");
    let images: Vec<String> = stored
        .services
        .iter()
        .filter_map(|s| match &s.container {
            Some(service::Container::Docker(d)) => d.container_url.as_ref().map(|u| u.url.clone()),
            None => None,
        })
        .collect();
    assert_eq!(
        images,
        ["registry.example.com/norsk/media:latest"],
        "{stored:?}"
    );
    assert_eq!(
        stored.services[0].restart,
        service::ServiceRestart::OnFailure as i32
    );
    assert!(tags::owned_by(&stored.tags, OWNER), "{stored:?}");

    // What Manager holds: the operator's nodes and jobs under its owner tag, each placed job
    // running under the role `primary` on the node the Bundle names.
    let encode_node = b.node_of(0, "encode").unwrap().to_owned();
    let (ours, foreign_nodes, primary_on_node) = other.with_mirror(|m| {
        let ours = m
            .jobs
            .values()
            .filter(|j| tags::owned_by(j.tags(), OWNER))
            .count();
        let foreign_nodes = m
            .nodes
            .values()
            .filter(|n| !n.physical && !tags::owned_by(&n.tags, OWNER))
            .count();
        let primary = m.jobs.values().any(|j| {
            tags::owned_by(j.tags(), OWNER)
                && j.instances
                    .get(tags::ROLE_NORMAL)
                    .is_some_and(|i| i.node_id == encode_node && i.phase == InstancePhase::Running)
        });
        (ours, foreign_nodes, primary)
    });
    assert!(
        ours >= 5,
        "the examples' jobs are stored jobs of ours ({ours})"
    );
    assert_eq!(
        foreign_nodes, 0,
        "every node the operator made carries its owner tag"
    );
    assert!(primary_on_node, "a primary instance on {encode_node}");

    // A reconnect (every published stream cut) is a whole new snapshot, and the operator acts
    // on none of it: after the reconnect, a new Bundle is the only thing Manager is asked for.
    let calls_before = stack.sim_calls().expect("call counts");
    let streams_before = calls_before
        .get("norsk.api.manager/EventStream")
        .copied()
        .unwrap_or(0);
    let snapshots_before = other.counters().snapshots.load(Ordering::Acquire);
    let cut_ms = wall_ms();
    let said = stack.chaos(&["cut-streams"]).expect("cut-streams");
    assert!(said.contains("published event streams"), "{said}");
    stack
        .wait_for(
            "the operator and the other client reconnected",
            WAIT,
            || async {
                let calls = stack.sim_calls()?;
                let streams = calls
                    .get("norsk.api.manager/EventStream")
                    .copied()
                    .unwrap_or(0);
                let other_back =
                    other.counters().snapshots.load(Ordering::Acquire) > snapshots_before;
                Ok((streams >= streams_before + 2 && other_back).then_some(()))
            },
        )
        .await
        .expect("both reconnect");
    automanager_e2e::apply(
        &stack,
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {name: barrier, namespace: default}\n\
         spec: {replicas: 1, pools: [onprem], jobs: [{jobName: probe, requirements: {requiredCapacity: 1, requiredCores: 1, priorityBand: bronze}}]}\n",
    )
    .await;
    stack.expect_ready("barrier").await;
    let spurious_actions = other.with_mirror(|m| {
        let started_or_stopped: usize = m
            .jobs
            .values()
            .filter(|j| tags::owned_by(j.tags(), OWNER))
            .filter(|j| {
                j.tags()
                    .get(tags::BUNDLE)
                    .is_none_or(|b| !b.ends_with(".barrier"))
            })
            .map(|j| {
                j.history
                    .iter()
                    .filter(|e| step_at(e).is_some_and(|at| at >= cut_ms))
                    .count()
            })
            .sum();
        let nodes_made = m
            .nodes
            .values()
            .filter(|n| {
                n.metadata
                    .as_ref()
                    .and_then(|md| md.created_at.as_ref())
                    .is_some_and(|t| timestamp_ms(t) >= cut_ms)
            })
            .count();
        started_or_stopped + nodes_made
    });
    assert_eq!(spurious_actions, 0, "a reconnect made the operator act");

    // What the published API cannot do is said where a user looks: a warm tier asked for, and
    // a Migration (there is no migration handshake).
    automanager_e2e::apply(
        &stack,
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: HotSpareTarget\nmetadata: {name: aws-east-warm}\n\
         spec: {pool: aws-east, targetCount: 0, warm: {count: 1}, spec: {instanceType: m5.xlarge, region: eu-west-1}}\n\
         ---\napiVersion: automanager.norsk.io/v1alpha1\nkind: Migration\n\
         metadata: {name: move-encode, namespace: default}\n\
         spec: {job: {bundle: my-channel-1, replica: 0, jobName: encode}, strategy: stopThenStart}\n",
    )
    .await;
    stack
        .wait_until::<HotSpareTarget>("aws-east-warm", "says the warm tier cannot be had", |t| {
            t.status.as_ref().is_some_and(|st| {
                st.conditions.iter().any(|c| {
                    c.type_ == "WarmTier"
                        && c.reason == "ManagerCannotStop"
                        && c.message.contains("published API")
                })
            })
        })
        .await;
    stack
        .expect_event("aws-east-warm", "WarmSparesUnavailable", &["StopNode"])
        .await;
    stack
        .wait_until::<Migration>("move-encode", "rejected for want of the handshake", |m| {
            m.status.as_ref().is_some_and(|st| {
                st.phase == MigrationPhase::Rejected
                    && st
                        .conditions
                        .iter()
                        .any(|c| c.reason == "ManagerCannotMigrate")
            })
        })
        .await;
    let after = stack.bundle("my-channel-1").await;
    assert_eq!(
        after.node_of(0, "encode"),
        Some(encode_node.as_str()),
        "nothing moved"
    );

    // A node dies: Manager reports its instances stopped with the node (JOB_STOPPED_NODE_STOPPED),
    // and the operator restarts the job elsewhere over the same API.
    stack
        .chaos(&["kill-node", &encode_node])
        .expect("kill-node");
    let recovered = stack
        .wait_until::<Bundle>("my-channel-1", "recovered off the killed node", |b| {
            b.node_of(0, "encode")
                .is_some_and(|n| n != encode_node.as_str())
                && b.state_of(0, "encode") == Some(JobState::Running)
        })
        .await;
    let moved_to = recovered
        .node_of(0, "encode")
        .unwrap_or_default()
        .to_owned();
    let running_there = other.with_mirror(|m| {
        m.jobs.values().any(|j| {
            tags::owned_by(j.tags(), OWNER)
                && j.instances
                    .get(tags::ROLE_NORMAL)
                    .is_some_and(|i| i.node_id == moved_to && i.phase == InstancePhase::Running)
        })
    });
    assert!(
        running_there,
        "Manager runs the recovered job on {moved_to}"
    );

    // Deleting Bundles (one running, one refused) stops and deletes their stored jobs, and never
    // the other client's.
    stack.delete::<Bundle>("news-gold").await;
    stack.delete::<Bundle>("preview-bronze").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (gone, foreign_kept) = other.with_mirror(|m| {
            (
                !m.jobs.values().any(|j| {
                    tags::owned_by(j.tags(), OWNER)
                        && j.tags().get(tags::BUNDLE).is_some_and(|b| {
                            b.ends_with(".news-gold") || b.ends_with(".preview-bronze")
                        })
                }),
                m.jobs.contains_key("default.news-gold/0/encode"),
            )
        });
        assert!(foreign_kept, "the other client's job is never deleted");
        if gone {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the deleted Bundles' stored jobs are still in Manager"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The orphan sweep removed the orphan of ours, and only that.
    stack
        .wait_for("the sweep removed the orphan", WAIT, || async {
            Ok(other
                .with_mirror(|m| !m.jobs.contains_key("default.gone/0/enc"))
                .then_some(()))
        })
        .await
        .expect("the orphan removed");
    let (foreign_gone_kept, foreign_history) = other.with_mirror(|m| {
        m.jobs
            .get("default.gone/1/enc")
            .map_or((false, 0), |j| (true, j.history.len()))
    });
    assert!(foreign_gone_kept, "the other installation's job is kept");
    assert_eq!(foreign_history, 1, "and never started or stopped");

    // The figures of `make test-manager-api`.
    let calls = stack.sim_calls().expect("call counts");
    let used = calls
        .iter()
        .filter(|(rpc, n)| rpc.starts_with("norsk.api.manager/") && **n > 0)
        .count();
    let foreign_touched = other.with_mirror(|m| {
        ["default.news-gold/0/encode", "default.gone/1/enc"]
            .iter()
            .map(|id| {
                m.jobs
                    .get(*id)
                    .map_or(1, |j| usize::from(j.history.len() != 1))
            })
            .sum::<usize>()
    });
    assert_eq!(
        foreign_touched, 0,
        "the other client's job has only its creation"
    );
    println!(
        "manager-api-e2e rpcs_used={used}/13 foreign_jobs_touched={foreign_touched} spurious_actions={spurious_actions}"
    );
    other.close().await;
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// When a history step that starts or stops an instance (or creates, updates or completes the
/// job) happened.
fn step_at(e: &JobHistoryEntry) -> Option<i64> {
    use manager_client::proto::api::manager::job_history_entry::HistoryEntry as H;
    let t = match e.history_entry.as_ref()? {
        H::JobCreated(x) => x.timestamp.as_ref(),
        H::JobUpdated(x) => x.timestamp.as_ref(),
        H::JobProvisioned(x) => x.timestamp.as_ref(),
        H::JobRunning(x) => x.timestamp.as_ref(),
        H::JobStopping(x) => x.timestamp.as_ref(),
        H::JobStopped(x) => x.timestamp.as_ref(),
        H::JobCompleted(x) => x.timestamp.as_ref(),
    };
    t.map(timestamp_ms)
}
