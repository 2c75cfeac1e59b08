//! Manager for the controller tier: the in-process manager-sim behind a [`ManagerPort`] that
//! records every call a pass makes, refuses the ones a test scripts (with the `tonic::Status`
//! Manager would answer), and can cut Manager off altogether: the Watch stream ends, every new
//! one and every call is UNAVAILABLE, so the mirror's connection fails as with an unreachable
//! Manager. It is the sim that answers everything else, so outcomes are Manager's own.

use std::sync::{Arc, Mutex, PoisonError};

use manager_client::port::{PortFuture, WatchStream};
use manager_client::{ManagerPort, proto};
use tokio::sync::watch;
use tonic::{Request, Status};

#[derive(Default)]
struct Script {
    calls: Vec<String>,
    /// (call name, answer), each used once, in order.
    faults: Vec<(String, Status)>,
}

/// The port, and the handle a test scripts it with (clones share everything).
#[derive(Clone)]
pub struct ScriptedManager {
    inner: Arc<dyn ManagerPort>,
    script: Arc<Mutex<Script>>,
    cut: watch::Sender<bool>,
}

impl ScriptedManager {
    pub fn new(inner: Arc<dyn ManagerPort>) -> Self {
        ScriptedManager {
            inner,
            script: Arc::default(),
            cut: watch::Sender::new(false),
        }
    }

    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every call so far as `Name detail` (e.g. `StartJob live.news/0/enc on onprem-a1`), in
    /// order; Watch is not listed.
    pub fn calls(&self) -> Vec<String> {
        self.script().calls.clone()
    }

    /// The calls so far that change something in Manager (every call but the `List…` reads).
    pub fn changes(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| !c.starts_with("List"))
            .collect()
    }

    /// The calls so far whose name is `name`.
    pub fn calls_named(&self, name: &str) -> Vec<String> {
        let prefix = format!("{name} ");
        (self.calls().into_iter())
            .filter(|c| c.starts_with(&prefix) || c == name)
            .collect()
    }

    /// Forgets the calls so far.
    pub fn clear_calls(&self) {
        self.script().calls.clear();
    }

    /// The next call named `name` (`CreateNode`, `StartJob`, …) is answered with `status`, once.
    pub fn refuse_next(&self, name: &str, status: Status) {
        self.script().faults.push((name.to_owned(), status));
    }

    /// Cuts Manager off (`true`) or lets it be reached again (`false`).
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }

    /// Records the call; its scripted answer, or UNAVAILABLE while cut off, if any.
    fn answer(&self, name: &str, detail: String) -> Option<Status> {
        let mut script = self.script();
        script
            .calls
            .push(format!("{name} {detail}").trim_end().to_owned());
        if *self.cut.borrow() {
            return Some(Status::unavailable("Manager is cut off by the test"));
        }
        let i = script.faults.iter().position(|(n, _)| n == name)?;
        Some(script.faults.remove(i).1)
    }
}

/// One unary operation: recorded, maybe refused, else the sim's answer.
macro_rules! unary {
    ($( $name:ident($req:ty) -> $resp:ty, $label:literal, |$r:ident| $detail:expr; )*) => {
        $( fn $name(&self, req: Request<$req>) -> PortFuture<'_, $resp> {
            let detail = { let $r = req.get_ref(); $detail };
            let refused = self.answer($label, detail);
            Box::pin(async move {
                match refused {
                    Some(status) => Err(status),
                    None => self.inner.$name(req).await,
                }
            })
        } )*
    };
}

impl ManagerPort for ScriptedManager {
    unary! {
        create_node(proto::CreateNodeRequest) -> proto::CreateNodeResponse, "CreateNode",
            |r| format!("in {}", r.pool);
        terminate_node(proto::TerminateNodeRequest) -> proto::TerminateNodeResponse,
            "TerminateNode", |r| r.node_id.clone();
        stop_node(proto::StopNodeRequest) -> proto::StopNodeResponse, "StopNode",
            |r| r.node_id.clone();
        start_node(proto::StartNodeRequest) -> proto::StartNodeResponse, "StartNode",
            |r| r.node_id.clone();
        list_nodes(proto::ListNodesRequest) -> proto::ListNodesResponse, "ListNodes",
            |_r| String::new();
        list_pools(proto::ListPoolsRequest) -> proto::ListPoolsResponse, "ListPools",
            |_r| String::new();
        register_bundle(proto::RegisterBundleRequest) -> proto::RegisterBundleResponse,
            "RegisterBundle", |r| r.bundle.as_ref().map(|b| b.bundle_id.clone()).unwrap_or_default();
        update_bundle(proto::RegisterBundleRequest) -> proto::RegisterBundleResponse,
            "UpdateBundle", |r| r.bundle.as_ref().map(|b| b.bundle_id.clone()).unwrap_or_default();
        delete_bundle(proto::DeleteBundleRequest) -> proto::DeleteBundleResponse,
            "DeleteBundle", |r| r.bundle_id.clone();
        start_job(proto::StartJobRequest) -> proto::StartJobResponse, "StartJob",
            |r| format!("{} on {}", r.job_id, r.node_id);
        stop_job(proto::StopJobRequest) -> proto::StopJobResponse, "StopJob",
            |r| r.job_id.clone();
        update_job_config(proto::UpdateJobConfigRequest) -> proto::UpdateJobConfigResponse,
            "UpdateJobConfig", |r| r.job_id.clone();
        migration_get_state(proto::NodeControllerMigrationGetState) -> proto::MigrationResponse,
            "MigrationGetState", |r| r.job_id.clone();
        migration_prepare_target(proto::NodeControllerMigrationPrepareTarget)
            -> proto::MigrationResponse, "MigrationPrepareTarget", |r| r.target_node_id.clone();
        migration_cutover(proto::NodeControllerMigrationCutover) -> proto::MigrationResponse,
            "MigrationCutover", |r| r.migration_id.clone();
        migration_abort(proto::NodeControllerMigrationAbort) -> proto::MigrationResponse,
            "MigrationAbort", |r| r.migration_id.clone();
    }

    fn watch(&self, req: Request<proto::WatchRequest>) -> PortFuture<'_, WatchStream> {
        Box::pin(async move {
            if *self.cut.borrow() {
                return Err(Status::unavailable("Manager is cut off by the test"));
            }
            let stream = self.inner.watch(req).await?.into_inner();
            // The stream ends with UNAVAILABLE once Manager is cut off.
            let mut cut = self.cut.subscribe();
            let ended = async move {
                let _ = cut.wait_for(|c| *c).await;
                Err(Status::unavailable("Manager is cut off by the test"))
            };
            let stream = futures::stream::select(stream, futures::stream::once(ended));
            Ok(tonic::Response::new(Box::pin(stream) as WatchStream))
        })
    }
}
