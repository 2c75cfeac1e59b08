//! `automanager.manager.extension.v1.ManagerExtension` over the published world: our extension,
//! served beside the published `Manager` on the same port (unless the sim runs without it).
//! The migration handshake asks the job nothing over a socket here: each ask gets the answer
//! of a cooperative job with nothing to hand over ([`crate::world::default_reply`]), as
//! [`crate::DefaultAgent`] answers for our first API, unless SimAdmin's
//! `SetMigrationBehaviour` scripted the job ([`super::PublishedWorld::answer_asks`]).

use manager_proto::extension::manager_extension_server::{
    ManagerExtension, ManagerExtensionServer,
};
use manager_proto::extension::{
    DescribeRequest, DescribeResponse, MigrationAbortRequest, MigrationCutoverRequest,
    MigrationGetStateRequest, MigrationPrepareTargetRequest, MigrationResponse, StartNodeRequest,
    StartNodeResponse, StopNodeRequest, StopNodeResponse, WatchEvent, WatchRequest, feature,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{EventStreamOf, PublishedService, STREAM_BACKLOG};
use crate::server::{lock, now_ms};

/// Our extension over a [`PublishedService`]'s world (cloning shares it).
#[derive(Clone, Debug)]
pub struct ExtensionService(PublishedService);

impl ExtensionService {
    /// The extension over `published`'s world.
    pub fn new(published: PublishedService) -> Self {
        ExtensionService(published)
    }

    /// The tonic server of this service.
    pub fn into_server(self) -> ManagerExtensionServer<Self> {
        ManagerExtensionServer::new(self)
    }
}

fn node(id: Option<manager_proto::api::common::NodeId>) -> String {
    id.map(|n| n.node_id).unwrap_or_default()
}

#[tonic::async_trait]
impl ManagerExtension for ExtensionService {
    type WatchStream = EventStreamOf<WatchEvent>;

    async fn describe(
        &self,
        _req: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        self.0.count_ext("Describe");
        Ok(Response::new(DescribeResponse {
            features: [
                feature::WARM_NODES,
                feature::MIGRATION_HANDSHAKE,
                feature::RECLAIM_NOTICES,
            ]
            .map(str::to_owned)
            .to_vec(),
            implementation: format!("manager-sim {}", env!("CARGO_PKG_VERSION")),
        }))
    }

    async fn stop_node(
        &self,
        req: Request<StopNodeRequest>,
    ) -> Result<Response<StopNodeResponse>, Status> {
        self.0.count_ext("StopNode");
        let id = node(req.into_inner().node_id);
        let n = self.0.apply(|w, now| w.stop_node_warm(&id, now))?;
        Ok(Response::new(StopNodeResponse { node: Some(n) }))
    }

    async fn start_node(
        &self,
        req: Request<StartNodeRequest>,
    ) -> Result<Response<StartNodeResponse>, Status> {
        self.0.count_ext("StartNode");
        let id = node(req.into_inner().node_id);
        let n = self.0.apply(|w, now| w.start_node_warm(&id, now))?;
        Ok(Response::new(StartNodeResponse { node: Some(n) }))
    }

    async fn migration_get_state(
        &self,
        req: Request<MigrationGetStateRequest>,
    ) -> Result<Response<MigrationResponse>, Status> {
        self.0.count_ext("MigrationGetState");
        let r = req.into_inner();
        self.0
            .apply(|w, now| w.ext_migration_get_state(&r, now))
            .map(|_| self.0.migration_now(&r.migration_id))
            .map(Response::new)
    }

    async fn migration_prepare_target(
        &self,
        req: Request<MigrationPrepareTargetRequest>,
    ) -> Result<Response<MigrationResponse>, Status> {
        self.0.count_ext("MigrationPrepareTarget");
        let r = req.into_inner();
        let answer = self
            .0
            .apply(|w, now| w.ext_migration_prepare_target(&r, now))?;
        Ok(Response::new(if answer.target_rejected {
            answer
        } else {
            self.0.migration_now(&r.migration_id)
        }))
    }

    async fn migration_cutover(
        &self,
        req: Request<MigrationCutoverRequest>,
    ) -> Result<Response<MigrationResponse>, Status> {
        self.0.count_ext("MigrationCutover");
        let r = req.into_inner();
        self.0
            .apply(|w, now| w.ext_migration_cutover(&r, now))
            .map(|_| self.0.migration_now(&r.migration_id))
            .map(Response::new)
    }

    async fn migration_abort(
        &self,
        req: Request<MigrationAbortRequest>,
    ) -> Result<Response<MigrationResponse>, Status> {
        self.0.count_ext("MigrationAbort");
        let r = req.into_inner();
        self.0
            .apply(|w, now| w.ext_migration_abort(&r, now))
            .map(Response::new)
    }

    async fn watch(
        &self,
        _req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.0.count_ext("Watch");
        let inner = &self.0.0;
        let mut w = lock(&inner.world);
        super::flush(inner, &mut w, now_ms());
        let snapshot = w.ext_snapshot();
        let (tx, rx) = mpsc::channel(snapshot.len() + STREAM_BACKLOG);
        for e in snapshot {
            // The channel was sized for the snapshot.
            let _ = tx.try_send(Ok(e));
        }
        lock(&inner.ext_streams).push(tx);
        drop(w);
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
