//! Disruption windows of a band (`bands.<band>.disruptionWindows` in the operator's settings):
//! a voluntary move of the band's job waits, on the operator's clock, until the band's window
//! opens; recovery from a failure is never held.

use std::collections::BTreeMap;
use std::time::Duration;

use automanager_api::{self as api, Migration, MigrationPhase, PriorityBand};
use automanager_operator::config::{BandWindow, OperatorConfig};
use automanager_policy::vocab::VoluntaryReason;

use super::Tier;
use super::common::condition_of;

/// Silver jobs may be moved for `reasons` (none: all) from 14:00 UTC for an hour each day; the
/// tier's clock starts at 12:00 UTC.
pub(crate) fn silver_window(c: &mut OperatorConfig, reasons: Vec<VoluntaryReason>) {
    c.bands.silver.disruption_windows = vec![BandWindow {
        schedule: "0 14 * * *".into(),
        duration: "1h".into(),
        time_zone: "UTC".into(),
        reasons,
    }];
}

impl Tier {
    /// A Migration `name` of replica 0 of bundle `live/bundle`'s job `enc`, labelled as
    /// consolidation creates them.
    fn consolidation_migration(&self, name: &str, bundle: &str) {
        self.labelled_migration(name, bundle, api::PURPOSE_LABEL, "consolidation");
    }

    /// The same, with one label `key: value` (a drain's Migration carries the node's).
    fn labelled_migration(&self, name: &str, bundle: &str, key: &str, value: &str) {
        let mut m = Migration::new(
            name,
            serde_json::from_value(serde_json::json!({
                "job": {"bundle": bundle, "replica": 0, "jobName": "enc"},
            }))
            .unwrap(),
        );
        m.metadata.namespace = Some("live".into());
        m.metadata.labels = Some(BTreeMap::from([(key.to_owned(), value.to_owned())]));
        self.api.insert(&m);
    }
}

#[tokio::test]
async fn a_band_window_holds_a_consolidation_move_until_it_opens() {
    let t = Tier::start(|c| silver_window(c, vec![VoluntaryReason::Consolidation]))
        .await
        .with_example_pools()
        .await;
    t.running_bundle_moving_by("news", 1, "overlap").await;
    t.consolidation_migration("move", "news");
    t.migration_pass("move").await.expect("the finalizer pass");

    t.migration_pass("move").await.expect("the held pass");

    let status = t.migration_status("move");
    assert_eq!(status.phase, MigrationPhase::Pending);
    let (on, reason, message) = condition_of(&status.conditions, "Queued");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "DisruptionWindow"));
    assert_eq!(
        message,
        "waiting until 2026-03-01T14:00:00Z: the silver band's disruption windows (bands.silver.disruptionWindows in the operator's settings) hold consolidation moves of Bundle live/news's silver jobs until then"
    );
    let migration_calls = |t: &Tier| {
        (t.manager.calls().into_iter())
            .filter(|c| c.starts_with("Migration"))
            .count()
    };
    assert_eq!(migration_calls(&t), 0, "{:?}", t.manager.calls());

    // Still closed a minute before it opens.
    t.clock.advance(Duration::from_secs(2 * 3600 - 60));
    t.migration_pass("move").await.expect("a pass before 14:00");
    assert_eq!(t.migration_status("move").phase, MigrationPhase::Pending);
    assert_eq!(migration_calls(&t), 0, "{:?}", t.manager.calls());
    assert_eq!(
        t.events_with("DisruptionBlocked").await,
        1,
        "one Event per wait, not per pass: {:?}",
        t.events().await
    );

    t.clock.advance(Duration::from_secs(60));
    t.migration_until("move", MigrationPhase::Completed).await;
    assert!(migration_calls(&t) > 0, "{:?}", t.manager.calls());

    let status = t.migration_status("move");
    assert_eq!(
        condition_of(&status.conditions, "Queued").1,
        "Admitted",
        "{:?}",
        status.conditions
    );
}

#[tokio::test]
async fn a_band_window_for_another_reason_or_band_does_not_hold_the_move() {
    let t = Tier::start(|c| {
        silver_window(c, vec![VoluntaryReason::Drain]);
        c.bands.gold.disruption_windows = vec![BandWindow {
            schedule: "0 14 * * *".into(),
            duration: "1h".into(),
            time_zone: "UTC".into(),
            reasons: Vec::new(),
        }];
    })
    .await
    .with_example_pools()
    .await;
    t.running_bundle_moving_by("news", 1, "overlap").await;
    t.consolidation_migration("move", "news");
    t.migration_pass("move").await.expect("the finalizer pass");

    t.migration_until("move", MigrationPhase::Completed).await;
}

#[tokio::test]
async fn a_band_window_never_holds_a_recovery() {
    let t = Tier::start(|c| silver_window(c, Vec::new()))
        .await
        .with_example_pools()
        .await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    t.running("news").await;
    t.lose_node_of("news").await;

    t.bundle_pass("news").await.expect("the recovery");

    assert_eq!(
        t.manager.calls_named("StartJob").len(),
        2,
        "both silver jobs restart while the band's window is closed"
    );
}

#[tokio::test]
async fn a_band_window_holds_a_drains_move_and_a_bundle_window_adds_its_own_hold() {
    let t = Tier::start(|c| silver_window(c, vec![VoluntaryReason::Drain]))
        .await
        .with_example_pools()
        .await;
    t.running_bundle_moving_by("news", 1, "overlap").await;
    t.labelled_migration("drain-move", "news", api::DRAIN_NODE_LABEL, "n1");
    t.migration_pass("drain-move")
        .await
        .expect("the finalizer pass");

    t.migration_pass("drain-move").await.expect("the held pass");

    let status = t.migration_status("drain-move");
    assert_eq!(status.phase, MigrationPhase::Pending);
    let (_, reason, message) = condition_of(&status.conditions, "Queued");
    assert_eq!(reason, "DisruptionWindow");
    assert!(
        message.starts_with("waiting until 2026-03-01T14:00:00Z: the silver band's"),
        "{message}"
    );
    assert!(message.contains("hold drain moves"), "{message}");

    // The bundle's own window for drains opens only at 14:30: both calendars hold now, and
    // the move waits for the first time both admit it.
    t.api.edit::<api::Bundle>(Some("live"), "news", |b| {
        b.spec.disruption = Some(
            serde_json::from_value(serde_json::json!({
                "windows": [{"schedule": "30 14 * * *", "duration": "2h", "reasons": ["drain"]}],
            }))
            .unwrap(),
        );
    });
    t.migration_pass("drain-move")
        .await
        .expect("a pass with both");
    let message = condition_of(&t.migration_status("drain-move").conditions, "Queued").2;
    assert_eq!(
        message,
        "waiting until 2026-03-01T14:30:00Z: Bundle live/news's disruption windows (disruption.windows) and the silver band's disruption windows (bands.silver.disruptionWindows in the operator's settings) hold drain moves until then"
    );

    // 14:10: the band's window is open, the bundle's is not yet.
    t.clock.advance(Duration::from_secs(2 * 3600 + 600));
    t.migration_pass("drain-move")
        .await
        .expect("a pass at 14:10");
    let status = t.migration_status("drain-move");
    assert_eq!(status.phase, MigrationPhase::Pending);
    assert_eq!(
        condition_of(&status.conditions, "Queued").2,
        "waiting until 2026-03-01T14:30:00Z: Bundle live/news's disruption windows hold drain moves until then (disruption.windows)"
    );

    t.clock.advance(Duration::from_secs(20 * 60));
    t.migration_until("drain-move", MigrationPhase::Completed)
        .await;
}

#[tokio::test]
async fn a_bundle_window_that_never_opens_holds_its_moves_and_stalls_the_bundle() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.running_bundle_moving_by("news", 1, "overlap").await;
    // The apiserver refuses this window at admission now; one stored anyway (under an older
    // CRD, or a form its rule cannot judge) must not let a drain through as if the bundle had
    // no windows.
    t.api.edit::<api::Bundle>(Some("live"), "news", |b| {
        b.spec.disruption = Some(
            serde_json::from_value(serde_json::json!({
                "windows": [{"schedule": "0 0 31 2 *", "duration": "1h"}],
            }))
            .unwrap(),
        );
    });
    t.labelled_migration("drain-move", "news", api::DRAIN_NODE_LABEL, "n1");
    t.migration_pass("drain-move")
        .await
        .expect("the finalizer pass");
    t.migration_pass("drain-move").await.expect("the held pass");
    let status = t.migration_status("drain-move");
    assert_eq!(status.phase, MigrationPhase::Pending);
    let (_, reason, message) = condition_of(&status.conditions, "Queued");
    assert_eq!(reason, "DisruptionWindow");
    assert!(
        message.starts_with(
            "held: Bundle live/news's disruption windows (disruption.windows) cannot be read (schedule \"0 0 31 2 *\" never matches"
        ) && message.ends_with("every drain move waits until they are fixed"),
        "{message}"
    );
    assert!(
        !t.manager.calls().iter().any(|c| c.starts_with("Migration")),
        "{:?}",
        t.manager.calls()
    );

    // The bundle says why: Stalled, InvalidSpec, naming the window; its job still runs.
    t.bundle_pass("news").await.expect("the bundle's pass");
    let b = t
        .api
        .get::<api::Bundle>(Some("live"), "news")
        .expect("the bundle");
    let conditions = b
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let (on, reason, message) = condition_of(&conditions, "Stalled");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "InvalidSpec"));
    assert!(
        message.contains("0 0 31 2 *") && message.contains("held"),
        "{message}"
    );

    // A day later it is still held.
    t.clock.advance(Duration::from_secs(24 * 3600));
    t.migration_pass("drain-move").await.expect("a later pass");
    assert_eq!(
        t.migration_status("drain-move").phase,
        MigrationPhase::Pending
    );
}
