//! One way for the operator to ask for a move: every Migration it makes for itself (a drain, a
//! reclaim notice, consolidation, rebalancing, a co-located job following another) is built
//! here and created here, so what such a Migration carries (its job, target, purpose, owner)
//! and what a second ask after a restart does are decided once.

use std::collections::BTreeMap;

use automanager_api::{self as api, Migration, MigrationJobRef, MigrationSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};

use super::{Context, Error};

/// How the Migration is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveName {
    /// A stable name, so a restarted operator asks for the same object (and finds it there).
    Stable(String),
    /// A fresh name from this prefix (the apiserver's `generateName`), for moves that are
    /// never asked twice.
    Fresh(String),
}

/// A move the operator asks for (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct MoveRequest {
    namespace: String,
    name: MoveName,
    job: MigrationJobRef,
    target_node: Option<String>,
    strategy: Option<api::MigrationStrategy>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    owner: Option<OwnerReference>,
}

/// What came of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requested {
    /// The Migration was created, under this name.
    Created(String),
    /// A Migration of that stable name exists already (asked before a restart).
    Exists(String),
}

impl MoveRequest {
    /// A move of `job` (a job of a Bundle in `namespace`) under `name`, to wherever placement
    /// chooses, by the job's declared strategy.
    pub fn new(namespace: &str, name: MoveName, job: MigrationJobRef) -> Self {
        MoveRequest {
            namespace: namespace.to_owned(),
            name,
            job,
            target_node: None,
            strategy: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            owner: None,
        }
    }

    /// To this node.
    pub fn to(mut self, node: Option<String>) -> Self {
        self.target_node = node;
        self
    }

    /// By this strategy instead of the job's declared one.
    pub fn by(mut self, strategy: api::MigrationStrategy) -> Self {
        self.strategy = Some(strategy);
        self
    }

    /// With this label.
    pub fn label(mut self, key: &str, value: impl Into<String>) -> Self {
        self.labels.insert(key.to_owned(), value.into());
        self
    }

    /// With this annotation.
    pub fn annotate(mut self, key: &str, value: impl Into<String>) -> Self {
        self.annotations.insert(key.to_owned(), value.into());
        self
    }

    /// Owned by this object (deleted with it).
    pub fn owned_by(mut self, owner: Option<OwnerReference>) -> Self {
        self.owner = owner;
        self
    }

    /// The Migration object asked for.
    pub fn migration(&self) -> Migration {
        let (name, generate_name) = match &self.name {
            MoveName::Stable(n) => (Some(n.clone()), None),
            MoveName::Fresh(prefix) => (None, Some(prefix.clone())),
        };
        Migration {
            metadata: ObjectMeta {
                name,
                generate_name,
                namespace: Some(self.namespace.clone()),
                labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
                annotations: (!self.annotations.is_empty()).then(|| self.annotations.clone()),
                owner_references: self.owner.clone().map(|o| vec![o]),
                ..Default::default()
            },
            spec: MigrationSpec {
                job: self.job.clone(),
                target_node: self.target_node.clone(),
                strategy: self.strategy,
                abort: None,
            },
            status: None,
        }
    }
}

/// Asks for the move: creates its Migration. A stable name already taken is the same ask made
/// before (a restart), and is answered [`Requested::Exists`].
pub async fn request_move(ctx: &Context, req: &MoveRequest) -> Result<Requested, Error> {
    let mig = req.migration();
    match Api::<Migration>::namespaced(ctx.client.clone(), &req.namespace)
        .create(&PostParams::default(), &mig)
        .await
    {
        Ok(created) => Ok(Requested::Created(created.name_any())),
        Err(kube::Error::Api(e)) if e.code == 409 => match &req.name {
            MoveName::Stable(name) => Ok(Requested::Exists(name.clone())),
            MoveName::Fresh(_) => Err(kube::Error::Api(e).into()),
        },
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> MigrationJobRef {
        MigrationJobRef {
            bundle: "news".into(),
            replica: 1,
            job_name: "enc".into(),
        }
    }

    #[test]
    fn a_request_carries_its_job_target_strategy_purpose_and_owner() {
        let owner = OwnerReference {
            api_version: "automanager.norsk.io/v1alpha1".into(),
            kind: "ManagerNode".into(),
            name: "n1".into(),
            uid: "u".into(),
            ..Default::default()
        };
        let m = MoveRequest::new("live", MoveName::Stable("drain-n1-0000abcd".into()), job())
            .to(Some("n2".into()))
            .by(api::MigrationStrategy::Overlap)
            .label(api::PURPOSE_LABEL, "drain")
            .annotate(api::DRAIN_NODE_ANNOTATION, "n1")
            .owned_by(Some(owner.clone()))
            .migration();
        assert_eq!(m.metadata.name.as_deref(), Some("drain-n1-0000abcd"));
        assert_eq!(m.metadata.generate_name, None);
        assert_eq!(m.metadata.namespace.as_deref(), Some("live"));
        assert_eq!(
            m.labels().get(api::PURPOSE_LABEL).map(String::as_str),
            Some("drain")
        );
        assert_eq!(
            m.annotations()
                .get(api::DRAIN_NODE_ANNOTATION)
                .map(String::as_str),
            Some("n1")
        );
        assert_eq!(m.metadata.owner_references, Some(vec![owner]));
        assert_eq!(m.spec.job, job());
        assert_eq!(m.spec.target_node.as_deref(), Some("n2"));
        assert_eq!(m.spec.strategy, Some(api::MigrationStrategy::Overlap));
        assert!(m.spec.abort.is_none() && m.status.is_none());
    }

    #[test]
    fn a_fresh_name_is_a_prefix_and_a_bare_request_leaves_target_and_strategy_to_the_job() {
        let m =
            MoveRequest::new("live", MoveName::Fresh("news-rebalance-".into()), job()).migration();
        assert_eq!(m.metadata.name, None);
        assert_eq!(m.metadata.generate_name.as_deref(), Some("news-rebalance-"));
        assert_eq!(m.metadata.labels, None);
        assert_eq!(m.metadata.annotations, None);
        assert_eq!(m.spec.target_node, None);
        assert_eq!(m.spec.strategy, None);
    }
}
