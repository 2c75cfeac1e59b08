//! The Manager port: the operations the operator needs from Manager, whatever carries them.
//!
//! [`ManagerClient`](crate::ManagerClient) keeps the mirror, reconnects, fences writes and maps
//! errors; below it sits one [`ManagerPort`]. Two adapters exist: [`GrpcPort`], Manager's gRPC
//! API over a tonic channel (what the operator runs with), and [`InProcess`], any implementation
//! of the generated server trait called directly, which is how the controller tests run the
//! simulator without a socket (`manager_sim::SimHandle::service`). A Manager reached some other
//! way is one more adapter of this trait, in the manner of Karpenter's `CloudProvider`
//! interface.
//!
//! The requests and answers are Manager's own messages (`manager_proto`), and a refusal is a
//! [`tonic::Status`], so every adapter speaks the API's meaning of an error (see
//! docs/manager-api.md) and the client maps it once.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use manager_proto::manager_client::ManagerClient as GrpcClient;
use manager_proto::manager_server::Manager as ManagerService;
use manager_proto::{
    CreateNodeRequest, CreateNodeResponse, DeleteBundleRequest, DeleteBundleResponse,
    ListNodesRequest, ListNodesResponse, ListPoolsRequest, ListPoolsResponse, MigrationResponse,
    NodeControllerMigrationAbort, NodeControllerMigrationCutover, NodeControllerMigrationGetState,
    NodeControllerMigrationPrepareTarget, RegisterBundleRequest, RegisterBundleResponse,
    StartJobRequest, StartJobResponse, StartNodeRequest, StartNodeResponse, StopJobRequest,
    StopJobResponse, StopNodeRequest, StopNodeResponse, TerminateNodeRequest,
    TerminateNodeResponse, UpdateJobConfigRequest, UpdateJobConfigResponse, WatchRequest,
    WatchResponse,
};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::client::AuthInterceptor;

/// What a Manager can do beyond placing, starting and stopping jobs on nodes it makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManagerFeatures {
    /// StopNode/StartNode: a node kept stopped (a warm spare) and started again.
    pub warm_nodes: bool,
    /// The migration handshake (get state, prepare the target, cut over, abort).
    pub migration_handshake: bool,
}

impl ManagerFeatures {
    /// Everything (our first API, and manager-sim).
    pub const ALL: ManagerFeatures = ManagerFeatures {
        warm_nodes: true,
        migration_handshake: true,
    };
    /// Manager's published API alone.
    pub const STANDARD: ManagerFeatures = ManagerFeatures {
        warm_nodes: false,
        migration_handshake: false,
    };
}

/// What a port answers: Manager's response, or its refusal.
pub type PortResult<T> = Result<Response<T>, Status>;

/// One call in flight on a port.
pub type PortFuture<'a, T> = BoxFuture<'a, PortResult<T>>;

/// Manager's Watch stream as a port delivers it: a snapshot, then ordered deltas.
pub type WatchStream = BoxStream<'static, Result<WatchResponse, Status>>;

/// Declares the port's unary operations once, for the trait and for both adapters.
macro_rules! manager_port {
    ($( $(#[$doc:meta])* $name:ident($req:ty) -> $resp:ty; )*) => {
        /// The operations the operator needs from Manager (see the module docs). Each takes the
        /// request as Manager's API defines it; a deadline set on the request
        /// ([`Request::set_timeout`]) is passed on where the transport carries one.
        pub trait ManagerPort: Send + Sync + 'static {
            $( $(#[$doc])* fn $name(&self, req: Request<$req>) -> PortFuture<'_, $resp>; )*
            /// Watch: a snapshot, then ordered deltas from `resume_revision`.
            fn watch(&self, req: Request<WatchRequest>) -> PortFuture<'_, WatchStream>;
            /// What this Manager can do beyond the operations every Manager serves.
            fn features(&self) -> ManagerFeatures {
                ManagerFeatures::ALL
            }
        }

        impl ManagerPort for GrpcPort {
            $( fn $name(&self, req: Request<$req>) -> PortFuture<'_, $resp> {
                let mut c = self.0.clone();
                Box::pin(async move { c.$name(req).await })
            } )*

            fn watch(&self, req: Request<WatchRequest>) -> PortFuture<'_, WatchStream> {
                let mut c = self.0.clone();
                Box::pin(async move {
                    let r = c.watch(req).await?;
                    Ok(r.map(|s| Box::pin(s) as WatchStream))
                })
            }
        }

        impl<S: ManagerService> ManagerPort for InProcess<S> {
            $( fn $name(&self, req: Request<$req>) -> PortFuture<'_, $resp> {
                Box::pin(async move { self.0.$name(req).await })
            } )*

            fn watch(&self, req: Request<WatchRequest>) -> PortFuture<'_, WatchStream> {
                Box::pin(async move {
                    let r = self.0.watch(req).await?;
                    Ok(r.map(|s| Box::pin(s) as WatchStream))
                })
            }
        }
    };
}

manager_port! {
    /// CreateNode: the node in state STARTING.
    create_node(CreateNodeRequest) -> CreateNodeResponse;
    /// TerminateNode.
    terminate_node(TerminateNodeRequest) -> TerminateNodeResponse;
    /// StopNode: a started, empty node powers off (keeps its id and disk).
    stop_node(StopNodeRequest) -> StopNodeResponse;
    /// StartNode: a powered-off node starts again.
    start_node(StartNodeRequest) -> StartNodeResponse;
    /// ListNodes, straight from Manager.
    list_nodes(ListNodesRequest) -> ListNodesResponse;
    /// ListPools.
    list_pools(ListPoolsRequest) -> ListPoolsResponse;
    /// RegisterBundle (create or update).
    register_bundle(RegisterBundleRequest) -> RegisterBundleResponse;
    /// UpdateBundle (NOT_FOUND when it does not exist).
    update_bundle(RegisterBundleRequest) -> RegisterBundleResponse;
    /// DeleteBundle.
    delete_bundle(DeleteBundleRequest) -> DeleteBundleResponse;
    /// StartJob on a node, with a role.
    start_job(StartJobRequest) -> StartJobResponse;
    /// StopJob (idempotent), with a reason.
    stop_job(StopJobRequest) -> StopJobResponse;
    /// UpdateJobConfig.
    update_job_config(UpdateJobConfigRequest) -> UpdateJobConfigResponse;
    /// The migration handshake: propose.
    migration_get_state(NodeControllerMigrationGetState) -> MigrationResponse;
    /// The migration handshake: prepare the target.
    migration_prepare_target(NodeControllerMigrationPrepareTarget) -> MigrationResponse;
    /// The migration handshake: cut over.
    migration_cutover(NodeControllerMigrationCutover) -> MigrationResponse;
    /// The migration handshake: abort.
    migration_abort(NodeControllerMigrationAbort) -> MigrationResponse;
}

/// Manager's gRPC API over a tonic channel, with the bearer token on every call.
#[derive(Clone)]
pub struct GrpcPort(GrpcClient<InterceptedService<Channel, AuthInterceptor>>);

impl GrpcPort {
    pub(crate) fn new(client: GrpcClient<InterceptedService<Channel, AuthInterceptor>>) -> Self {
        GrpcPort(client)
    }
}

/// Any implementation of Manager's generated server trait, called in this process: no socket,
/// no encoding. Authentication and message-size limits are the transport's and do not apply.
pub struct InProcess<S>(Arc<S>);

impl<S: ManagerService> InProcess<S> {
    /// A port onto `service`.
    pub fn new(service: S) -> Self {
        InProcess(Arc::new(service))
    }

    /// The port, shared, as [`ManagerClient::over`](crate::ManagerClient::over) takes it.
    pub fn shared(service: S) -> Arc<dyn ManagerPort> {
        Arc::new(InProcess::new(service))
    }
}
