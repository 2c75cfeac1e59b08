//! What every controller's tests share: the Events a pass published, waiting for Manager (the
//! sim runs on its own clock: a node starts, a job runs, in moments), and the requeue a pass
//! answered.

use std::time::Duration;

use kube::runtime::controller::Action;
use manager_client::MirrorState;

use super::{BOUND, Tier};

impl Tier {
    /// Every Event published so far, once the queue is empty, as (reason, note), in order.
    pub(crate) async fn events(&self) -> Vec<(String, String)> {
        assert!(self.ctx.events.flush(BOUND).await, "Events published");
        let field = |c: &tier::apiserver::Call, f: &str| {
            c.body
                .get(f)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        (self.api.calls().iter())
            .filter(|c| c.path.ends_with("/events") || c.path.contains("/events/"))
            .filter(|c| c.is_write() && c.code < 400)
            .map(|c| (field(c, "reason"), field(c, "note")))
            .collect()
    }

    /// How many Events with `reason` were published so far.
    pub(crate) async fn events_with(&self, reason: &str) -> usize {
        (self.events().await.iter())
            .filter(|(r, _)| r == reason)
            .count()
    }

    /// Waits until `holds` is true of the mirror (Manager's world moves on its own clock).
    pub(crate) async fn until_mirror(&self, what: &str, holds: impl Fn(&MirrorState) -> bool) {
        let deadline = tokio::time::Instant::now() + BOUND;
        while !self.ctx.manager.mirror().read(&holds) {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the mirror is synced with Manager (`true`) or has lost it (`false`).
    pub(crate) async fn until_manager_ready(&self, ready: bool) {
        let deadline = tokio::time::Instant::now() + BOUND;
        while self.ctx.manager_ready() != ready {
            assert!(
                tokio::time::Instant::now() < deadline,
                "Manager never became {}",
                if ready { "ready" } else { "unavailable" }
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A condition of `conditions` as (status, reason, message); a missing one fails the test.
pub(crate) fn condition_of(
    conditions: &[automanager_api::Condition],
    type_: &str,
) -> (String, String, String) {
    let c = automanager_api::condition::find_condition(conditions, type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conditions:?}"));
    (
        format!("{:?}", c.status),
        c.reason.clone(),
        c.message.clone(),
    )
}

/// The requeue `after`, as a pass answers it.
pub(crate) fn requeue(after: Duration) -> Action {
    Action::requeue(after)
}

use super::tier;
