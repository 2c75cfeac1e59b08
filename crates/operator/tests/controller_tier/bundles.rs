//! The Bundle pass's outcomes beyond a first placement: a refused start, Manager unreachable,
//! a bronze job dropped (and a silver one co-located with it restarted), the restart ceiling and the retry, restart counts clearing on the
//! clock, deletion, a status write refused as invalid.

use std::time::Duration;

use automanager_api::{self as api, Bundle, BundlePhase, JobState, PriorityBand};
use automanager_operator::controllers;
use automanager_operator::mapping;
use automanager_policy::vocab::ClearRestartsOn;
use http::Method;
use manager_client::proto;

use super::Tier;
use super::common::{condition_of, requeue};

const BUNDLES: &str = "/apis/automanager.norsk.io/v1alpha1/namespaces/live/bundles";
const HISTORIES: &str = "/apis/automanager.norsk.io/v1alpha1/namespaces/live/placementhistories";

impl Tier {
    /// Bundle `live/name`: one replica of `band` jobs `enc` and `pkg` (co-located) on onprem.
    pub(crate) fn pair_bundle(&self, name: &str, band: PriorityBand) {
        let mut b = Bundle::new(
            name,
            serde_json::from_value(serde_json::json!({
                "replicas": 1, "pools": ["onprem"],
                "jobs": [
                    {"jobName": "enc", "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": band.as_str()}},
                    {"jobName": "pkg", "requirements": {"requiredCapacity": 1, "requiredCores": 1, "priorityBand": band.as_str()}, "coLocateWith": ["enc"]}
                ],
            }))
            .unwrap(),
        );
        b.metadata.namespace = Some("live".into());
        self.api.insert(&b);
    }

    fn bundle_status(&self, name: &str) -> api::BundleStatus {
        self.stored_bundle(name).status.expect("a status")
    }

    /// The node replica 0 of bundle `name` runs on, by its status.
    fn node_of(&self, name: &str) -> String {
        self.bundle_status(name).replicas[0].jobs[0]
            .node_id
            .clone()
            .expect("placed")
    }

    /// Kills the node replica 0 of `name` runs on and waits until the mirror shows its jobs
    /// failed; answers the node.
    pub(crate) async fn lose_node_of(&self, name: &str) -> String {
        let node = self.node_of(name);
        self._sim
            .with_world(|w, now| w.kill_node(&node, now))
            .expect("killed");
        let id = mapping::bundle_id("live", name);
        self.until_mirror("the jobs failed", |m| {
            m.jobs_of_bundle(&id)
                .all(|j| j.state() == proto::JobState::Failed)
        })
        .await;
        self.sync_model();
        self.manager.clear_calls();
        node
    }

    /// Sets the retry annotation on bundle `name` to `value`.
    fn retry(&self, name: &str, value: &str) {
        self.api.edit::<Bundle>(Some("live"), name, |b| {
            b.metadata
                .annotations
                .get_or_insert_default()
                .insert(api::RETRY_ANNOTATION.to_owned(), value.to_owned());
        });
    }

    pub(crate) async fn running(&self, name: &str) {
        let id = mapping::bundle_id("live", name);
        self.until_mirror("the bundle's jobs run", |m| {
            m.jobs_of_bundle(&id)
                .all(|j| j.state() == proto::JobState::Running)
        })
        .await;
        self.sync_model();
    }
}

#[tokio::test]
async fn a_start_a_worker_refuses_rolls_the_replica_back_and_the_next_pass_places_it_whole() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t._sim.with_world(|w, _| w.reject_next(1));

    t.bundle_pass("news").await.expect("the refused pass");

    let starts = t.manager.calls_named("StartJob");
    let stops = t.manager.calls_named("StopJob");
    assert_eq!(
        (starts.len(), stops.len()),
        (2, 1),
        "{:?}",
        t.manager.calls()
    );
    assert_eq!(t.events_with("JobRejected").await, 1);
    assert_ne!(t.bundle_status("news").phase, BundlePhase::Ready);
    t.until_mirror("the rolled-back job stopped", |m| {
        m.jobs_of_bundle(&mapping::bundle_id("live", "news"))
            .all(|j| !j.state().holds_capacity())
    })
    .await;
    t.sync_model();

    t.bundle_pass("news").await.expect("the next pass");

    let status = t.bundle_status("news");
    assert_eq!(status.phase, BundlePhase::Ready, "{status:?}");
    let nodes: Vec<Option<String>> = status.replicas[0]
        .jobs
        .iter()
        .map(|j| j.node_id.clone())
        .collect();
    assert_eq!(nodes[0], nodes[1], "placed whole, on one node");
}

#[tokio::test]
async fn while_manager_is_unreachable_a_bundle_is_reconciling_and_looked_at_in_seconds() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.manager.set_cut(true);
    t.until_manager_ready(false).await;
    t.manager.clear_calls();

    let next = t.bundle_pass("news").await.expect("the pass");

    // An outage is waited out: Reconciling (kstatus InProgress), never Stalled (Failed).
    let conditions = t.bundle_status("news").conditions;
    let (on, reason, _) = condition_of(&conditions, "Reconciling");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "ManagerUnavailable")
    );
    assert_eq!(condition_of(&conditions, "Stalled").0, "False");
    assert_eq!(condition_of(&conditions, "Ready").0, "False");
    assert_eq!(next, requeue(Duration::from_secs(3)));
    assert!(t.manager.calls().is_empty(), "{:?}", t.manager.calls());
}

#[tokio::test]
async fn a_bronze_replica_whose_node_is_lost_is_dropped_and_stays_down_until_retried() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("cheap", PriorityBand::Bronze);
    t.bundle_pass("cheap").await.expect("the finalizer pass");
    t.bundle_pass("cheap").await.expect("the placing pass");
    t.running("cheap").await;
    t.lose_node_of("cheap").await;

    t.bundle_pass("cheap")
        .await
        .expect("the pass after the loss");
    t.bundle_pass("cheap").await.expect("a second pass");

    assert!(
        t.manager.calls_named("StartJob").is_empty(),
        "dropped, not restarted"
    );
    let states: Vec<JobState> = t.bundle_status("cheap").replicas[0]
        .jobs
        .iter()
        .map(|j| j.state)
        .collect();
    assert_eq!(states, [JobState::Dropped, JobState::Dropped]);
    assert_eq!(t.events_with("JobDropped").await, 2, "once per job");
    // Dropped by design: phase Degraded, Ready (its bands promise no more), and the Degraded
    // condition names what is down.
    let status = t.bundle_status("cheap");
    assert_eq!(status.phase, BundlePhase::Degraded);
    let (ready, why, _) = condition_of(&status.conditions, "Ready");
    assert_eq!((ready.as_str(), why.as_str()), ("True", "RunningWithDrops"));
    assert_eq!(condition_of(&status.conditions, "Stalled").0, "False");
    let (on, reason, message) = condition_of(&status.conditions, "Degraded");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "JobsDropped"));
    assert!(
        message.contains("replica 0 job enc") && message.contains("replica 0 job pkg"),
        "{message}"
    );

    t.retry("cheap", "1");
    t.bundle_pass("cheap").await.expect("the retried pass");

    assert_eq!(t.manager.calls_named("StartJob").len(), 2);
    let status = t.bundle_status("cheap");
    assert_eq!(status.last_retry.as_deref(), Some("1"));
    assert_eq!(t.events_with("Retry").await, 1);
    assert_eq!(condition_of(&status.conditions, "Degraded").0, "False");
}

#[tokio::test]
async fn a_replica_that_fails_past_its_restart_ceiling_is_broken_until_retried() {
    let t = Tier::start(|c| c.bands.silver.max_restarts_per_hour = 1)
        .await
        .with_example_pools()
        .await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    t.running("news").await;
    let first = t.lose_node_of("news").await;
    t.bundle_pass("news").await.expect("the recovery");
    assert_eq!(
        t.manager.calls_named("StartJob").len(),
        2,
        "one restart is allowed"
    );
    assert_eq!(t.bundle_status("news").replicas[0].restarts_last_hour, 1);
    t.running("news").await;
    let second = t.lose_node_of("news").await;
    assert_ne!(first, second);

    let next = t
        .bundle_pass("news")
        .await
        .expect("the pass past the ceiling");

    assert!(t.manager.calls_named("StartJob").is_empty());
    let status = t.bundle_status("news");
    assert_eq!(status.phase, BundlePhase::Broken);
    let (on, reason, message) = condition_of(&status.conditions, "Broken");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "RestartCeilingExceeded")
    );
    assert!(message.contains(api::RETRY_ANNOTATION), "{message}");
    assert_eq!(next, kube::runtime::controller::Action::await_change());
    assert_eq!(t.events_with("BundleBroken").await, 1);
    t.bundle_pass("news").await.expect("a pass while broken");
    assert!(
        t.manager.calls_named("StartJob").is_empty(),
        "no retries until asked"
    );

    t.retry("news", "again");
    t.bundle_pass("news").await.expect("the retried pass");

    assert_eq!(
        t.manager.calls_named("StartJob").len(),
        2,
        "asked: restarted"
    );
    assert_ne!(t.bundle_status("news").phase, BundlePhase::Broken);
}

#[tokio::test]
async fn a_restart_count_clears_once_the_replica_stayed_up_for_its_band_on_the_operators_clock() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    t.running("news").await;
    t.lose_node_of("news").await;
    let next = t.bundle_pass("news").await.expect("the recovery");
    assert_eq!(t.bundle_status("news").replicas[0].restarts_last_hour, 1);
    assert_eq!(
        next,
        requeue(Duration::from_secs(300)),
        "looked at again at the settled interval, before the count may clear (10 minutes)"
    );
    t.running("news").await;
    // The sim's clock stamped the new start; the operator's reads time through its own clock.
    let started_ms = t.ctx.manager.mirror().read(|m| {
        m.jobs_of_bundle(&mapping::bundle_id("live", "news"))
            .flat_map(|j| j.instances.iter().map(|i| i.started_at_ms))
            .max()
            .unwrap_or(0)
    });
    let ahead = started_ms - t.ctx.clock.now().timestamp_millis() + 11 * 60 * 1000;
    t.clock
        .advance(Duration::from_millis(u64::try_from(ahead.max(0)).unwrap()));

    t.bundle_pass("news")
        .await
        .expect("the pass after the clear");

    let status = t.bundle_status("news");
    assert_eq!(status.replicas[0].restarts_last_hour, 0, "{status:?}");
    assert_eq!(status.phase, BundlePhase::Ready);
}

/// `bands.<band>.clearRestartsOn: successfulRestart`, the TypeScript library's rule: the
/// restart that runs clears the count at the next pass (due at once), with no wait on the
/// clock; so with a ceiling of one restart a second loss is restarted again, where our rule
/// (the test above it) breaks the bundle.
#[tokio::test]
async fn under_the_librarys_rule_a_restart_that_runs_clears_the_count_and_a_second_loss_restarts() {
    let t = Tier::start(|c| {
        c.bands.silver.max_restarts_per_hour = 1;
        c.bands.silver.clear_restarts_on = ClearRestartsOn::SuccessfulRestart;
    })
    .await
    .with_example_pools()
    .await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    t.running("news").await;
    t.lose_node_of("news").await;

    let next = t.bundle_pass("news").await.expect("the recovery");

    assert_eq!(t.manager.calls_named("StartJob").len(), 2, "restarted");
    assert_eq!(t.bundle_status("news").replicas[0].restarts_last_hour, 1);
    assert_eq!(
        next,
        requeue(Duration::from_millis(50)),
        "looked at again at once: the count may clear as soon as the replica runs"
    );
    t.running("news").await;

    t.bundle_pass("news")
        .await
        .expect("the pass after the restart ran");

    let status = t.bundle_status("news");
    assert_eq!(status.replicas[0].restarts_last_hour, 0, "{status:?}");
    assert_eq!(status.phase, BundlePhase::Ready);

    t.lose_node_of("news").await;
    t.bundle_pass("news").await.expect("the second recovery");

    assert_eq!(
        t.manager.calls_named("StartJob").len(),
        2,
        "restarted again, not Broken"
    );
    let status = t.bundle_status("news");
    assert_ne!(status.phase, BundlePhase::Broken, "{status:?}");
    assert_eq!(status.replicas[0].restarts_last_hour, 1);
    assert_eq!(t.events_with("Restarted").await, 2, "one per recovery");
    assert_eq!(t.events_with("BundleBroken").await, 0);
}

/// A changed `spec.jobs[].config` is pushed to the running job (the library's
/// `onJobConfigUpdated`: Event `JobConfigUpdated`); one Manager refuses is said in a Warning
/// Event `JobConfigRejected` naming the job, Manager keeps the old one, and the next pass
/// pushes it again.
#[tokio::test]
async fn a_config_manager_refuses_is_a_job_config_rejected_event_and_one_it_takes_job_config_updated()
 {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    let tuned = |bitrate: u32| -> api::BundleSpec {
        serde_json::from_value(serde_json::json!({
            "replicas": 1, "pools": ["onprem"],
            "jobs": [{"jobName": "enc", "config": {"bitrate": bitrate},
                      "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": "silver"}}],
        }))
        .unwrap()
    };
    let mut b = Bundle::new("tuned", tuned(5000));
    b.metadata.namespace = Some("live".into());
    t.api.insert(&b);
    t.bundle_pass("tuned").await.expect("the finalizer pass");
    t.bundle_pass("tuned").await.expect("the placing pass");
    t.running("tuned").await;
    let job = "live.tuned/0/enc";
    let config_in_manager = || t._sim.with_world(|w, _| w.job(job).unwrap().config.clone());
    assert_eq!(config_in_manager(), br#"{"bitrate":5000}"#.to_vec());
    t.api
        .edit::<Bundle>(Some("live"), "tuned", |b| b.spec = tuned(8000));
    t.manager.refuse_next(
        "UpdateJobConfig",
        tonic::Status::failed_precondition("the job takes no runtime configuration"),
    );

    t.bundle_pass("tuned").await.expect("the refused push");

    assert_eq!(config_in_manager(), br#"{"bitrate":5000}"#.to_vec());
    t.events().await; // flushed
    let rejected = t.events_for("tuned", "JobConfigRejected");
    assert_eq!(rejected.len(), 1, "{:?}", t.events().await);
    assert!(
        rejected[0].contains(job) && rejected[0].contains("no runtime configuration"),
        "{rejected:?}"
    );
    assert_eq!(t.events_with("JobConfigUpdated").await, 0);

    t.bundle_pass("tuned").await.expect("the next pass");

    assert_eq!(config_in_manager(), br#"{"bitrate":8000}"#.to_vec());
    t.events().await;
    let updated = t.events_for("tuned", "JobConfigUpdated");
    assert_eq!(updated, [job.to_owned()]);
    assert_eq!(t.events_with("JobConfigRejected").await, 1, "said once");
}

#[tokio::test]
async fn a_deleted_bundle_stops_its_jobs_in_manager_then_lets_go() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    t.api.delete_path(&format!("{BUNDLES}/news"));
    t.manager.clear_calls();
    t.api.clear_calls();

    let b = t
        .api
        .get::<Bundle>(Some("live"), "news")
        .expect("held by its finalizer");
    controllers::reconcile_finalized(std::sync::Arc::new(b), t.ctx.clone())
        .await
        .expect("the cleanup pass");

    assert_eq!(
        t.manager.changes(),
        [format!(
            "DeleteBundle {}",
            mapping::bundle_id("live", "news")
        )]
    );
    assert_eq!(
        t.api.writes(),
        [
            format!("DELETE {HISTORIES}/news"),
            format!("PATCH {BUNDLES}/news")
        ],
        "its placement history goes with it"
    );
    assert!(t.api.get::<Bundle>(Some("live"), "news").is_none(), "gone");
    assert_eq!(t.events_with("Deleted").await, 1);
}

#[tokio::test]
async fn a_status_write_refused_as_invalid_is_the_passs_error_and_the_next_pass_writes_it() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.api
        .refuse_next(Method::PATCH, "/bundles/news/status", 422);

    let err = t.bundle_pass("news").await.expect_err("the refusal");

    assert!(
        matches!(&err, controllers::Error::Kube(kube::Error::Api(s)) if s.code == 422),
        "{err}"
    );
    t.running("news").await;
    t.bundle_pass("news").await.expect("the next pass");
    assert_eq!(t.bundle_status("news").phase, BundlePhase::Ready);
    assert_eq!(
        t.manager.calls_named("StartJob").len(),
        2,
        "the jobs started once: the next pass found them running"
    );
}

/// A silver job co-located with a bronze one whose node is lost: the bronze job is dropped, and
/// the silver one is restarted.
#[tokio::test]
async fn a_silver_job_colocated_with_a_dropped_bronze_job_is_restarted() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    let mut b = Bundle::new(
        "mixed",
        serde_json::from_value(serde_json::json!({
            "replicas": 1, "pools": ["onprem"],
            "jobs": [
                {"jobName": "enc", "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": "bronze"}},
                {"jobName": "pkg", "requirements": {"requiredCapacity": 1, "requiredCores": 1, "priorityBand": "silver"}, "coLocateWith": ["enc"]}
            ],
        }))
        .unwrap(),
    );
    b.metadata.namespace = Some("live".into());
    t.api.insert(&b);
    t.bundle_pass("mixed").await.expect("the finalizer pass");
    t.bundle_pass("mixed").await.expect("the placing pass");
    t.running("mixed").await;
    t.lose_node_of("mixed").await;

    t.bundle_pass("mixed")
        .await
        .expect("the pass after the loss");
    t.bundle_pass("mixed").await.expect("a second pass");

    let starts = t.manager.calls_named("StartJob");
    let jobs: Vec<(String, JobState)> = t.bundle_status("mixed").replicas[0]
        .jobs
        .iter()
        .map(|j| (j.job_name.clone(), j.state))
        .collect();
    assert_eq!(starts.len(), 1, "{starts:?} {jobs:?}");
    assert!(format!("{:?}", starts[0]).contains("/0/pkg"), "{starts:?}");
    assert_eq!(jobs[0], ("enc".to_owned(), JobState::Dropped));
    assert_ne!(jobs[1].1, JobState::Unplaceable, "{jobs:?}");
    let id = mapping::bundle_id("live", "mixed");
    t.until_mirror("pkg runs again", |m| {
        m.jobs_of_bundle(&id)
            .any(|j| j.job_name == "pkg" && j.state() == proto::JobState::Running)
    })
    .await;
}

/// `enc` fails alone while `pkg`, which declares `coLocateWith: [enc]`, keeps running: the
/// restart goes to `pkg`'s node (spread packing would pick an emptier one).
#[tokio::test]
async fn a_job_restarted_alone_joins_the_running_job_co_located_with_it() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    t.running("news").await;
    let node = t.node_of("news");
    let enc = mapping::bundle_id("live", "news") + "/0/enc";
    t._sim
        .with_world(|w, now| w.fail_job(&enc, "encoder crashed", now))
        .expect("failed");
    t.until_mirror("enc failed", |m| {
        m.jobs[&enc].state() == proto::JobState::Failed
    })
    .await;
    t.sync_model();

    t.bundle_pass("news").await.expect("the recovery pass");

    t.until_mirror("enc runs again", |m| {
        m.jobs[&enc].state() == proto::JobState::Running
    })
    .await;
    let on = t
        .ctx
        .manager
        .mirror()
        .read(|m| m.jobs[&enc].node_id.clone());
    assert_eq!(on, node, "restarted beside pkg");
}

impl Tier {
    /// The history of `live/name` once it satisfies `done`: its writer writes it on its own
    /// task after the pass, so it is waited for, through the apiserver.
    async fn history_once(
        &self,
        name: &str,
        done: impl Fn(&api::PlacementHistory) -> bool,
    ) -> api::PlacementHistory {
        tokio::time::timeout(super::BOUND, async {
            loop {
                let h = self.api.get::<api::PlacementHistory>(Some("live"), name);
                if let Some(h) = h.filter(|h| done(h)) {
                    return h;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the history written")
    }

    /// The Bundle controller as busy as the history's writer yields to: a pass of each of
    /// `bundles` (not stored) running.
    fn passes_running(&self, bundles: &[&str], running: bool) {
        for b in bundles {
            let b = kube::runtime::reflector::ObjectRef::<Bundle>::new(b).within("live");
            if running {
                self.ctx.state.begin_bundle_pass(&b);
            } else {
                let _ = self.ctx.state.end_bundle_pass(&b, || false);
            }
        }
    }
}

#[tokio::test]
async fn a_placement_and_its_recovery_are_kept_in_the_bundles_history_with_who_made_them() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    // The pass itself, without the tier's wait for the history's writer.
    let b = std::sync::Arc::new(t.stored_bundle("news"));
    controllers::reconcile_finalized(b, t.ctx.clone())
        .await
        .expect("the placing pass");
    t.running("news").await;
    let first = t.history_once("news", |_| true).await;
    assert_eq!(
        first.metadata.owner_references.unwrap_or_default()[0].name,
        "news",
        "owned by the bundle, so it goes with it"
    );
    let r0 = &first.spec.replicas[0];
    assert_eq!(r0.decisions.len(), 1);
    assert_eq!(r0.decisions[0].leader, "tier");
    assert_eq!(r0.decisions[0].outcome, api::PlacementOutcome::Placed);
    assert!(!r0.decisions[0].recovery);
    let placed_on = r0.decisions[0].nodes.clone();

    t.api.clear_calls();
    t.bundle_pass("news")
        .await
        .expect("a pass with no decision");
    assert!(
        !t.api
            .writes()
            .iter()
            .any(|w| w.contains("placementhistories")),
        "no decision, no write: {:?}",
        t.api.writes()
    );

    t.lose_node_of("news").await;
    let b = std::sync::Arc::new(t.stored_bundle("news"));
    controllers::reconcile_finalized(b, t.ctx.clone())
        .await
        .expect("the recovery pass");

    let after = t
        .history_once("news", |h| h.spec.replicas[0].decisions.len() == 2)
        .await;
    let r0 = &after.spec.replicas[0];
    let recovery = &r0.decisions[1];
    assert!(recovery.recovery);
    assert_eq!(recovery.outcome, api::PlacementOutcome::Placed);
    assert_ne!(recovery.nodes, placed_on, "elsewhere");
    let full = r0.last_trace.as_ref().expect("the newest in full");
    assert!(full.recovery);
    assert!(full.decision.is_some() && full.truncated.is_none());
}

#[tokio::test]
async fn a_history_waits_while_the_bundles_are_busy_and_goes_once_it_waited_its_bound() {
    use automanager_operator::controllers::bundle::history_writer::MAX_HOLD;
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    // Two passes of other bundles run: a quarter of the 8 slots (at least 2).
    let others = ["a", "b"];
    t.passes_running(&others, true);
    t.api.clear_calls();

    let b = std::sync::Arc::new(t.stored_bundle("news"));
    controllers::reconcile_finalized(b, t.ctx.clone())
        .await
        .expect("the placing pass");
    assert_eq!(
        t.api.writes(),
        [format!("PATCH {BUNDLES}/news/status")],
        "the pass wrote its status and left its history queued"
    );
    assert_eq!(t.ctx.history.pending(), 1);
    assert!(
        t.ctx
            .metrics
            .encode()
            .contains("automanager_placement_history_queued 1"),
        "the queue's gauge"
    );
    assert!(
        !t.ctx.history.idle(Duration::from_millis(300)).await,
        "still held while the Bundles are busy"
    );

    // Held for its bound: written while the Bundles are still busy.
    t.clock.advance(MAX_HOLD);
    let h = t.history_once("news", |_| true).await;
    assert_eq!(h.spec.replicas[0].decisions.len(), 1);
    assert!(t.ctx.history.idle(super::BOUND).await);
    assert!(
        t.ctx
            .metrics
            .encode()
            .contains("automanager_placement_history_queued 0")
    );
    t.passes_running(&others, false);
}

#[tokio::test]
async fn a_history_write_that_fails_is_tried_again_after_its_back_off_and_counted() {
    use automanager_operator::controllers::bundle::history_writer::RETRY_FIRST;
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.api.refuse_next(Method::POST, "/placementhistories", 500);

    let b = std::sync::Arc::new(t.stored_bundle("news"));
    controllers::reconcile_finalized(b, t.ctx.clone())
        .await
        .expect("the placing pass");
    tokio::time::timeout(super::BOUND, async {
        while t.api.refused().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the first write refused");
    assert_eq!(t.api.refused(), [format!("POST {HISTORIES} 500")]);
    assert_eq!(t.ctx.history.pending(), 1, "queued again, for later");
    assert!(
        t.ctx
            .metrics
            .encode()
            .contains("automanager_placement_history_write_failures_total 1")
    );

    t.clock.advance(RETRY_FIRST);
    let h = t.history_once("news", |_| true).await;
    assert_eq!(h.spec.replicas[0].decisions.len(), 1);
    assert!(t.ctx.history.idle(super::BOUND).await);
}
