//! `what-if`: the operator's admission answer for a Bundle, with the dry run's decisions.

use automanager_api as api;
use automanager_placement as pl;
use serde::{Deserialize, Serialize};

use super::Tree;
use super::trace::{ReplicaTrace, TraceView, replica_tree};

/// The operator's `/v1/what-if` answer: the admission result (`kind` ok / validationErrors /
/// noCapacity) and, from operators that send them, the dry run's decision per replica.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WhatIf {
    #[serde(flatten)]
    pub result: pl::AdmissionResult,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<pl::Decision>,
}

impl WhatIf {
    /// Whether the bundle would be admitted as it is.
    pub fn fits(&self) -> bool {
        self.result == pl::AdmissionResult::Ok
    }
}

/// The answer as text; `spec` is the bundle that was asked about (for field paths).
pub fn render(name: &str, answer: &WhatIf, spec: &api::BundleSpec, view: &TraceView) -> String {
    let mut root = match &answer.result {
        pl::AdmissionResult::Ok => Tree::new(format!(
            "Bundle {name}: fits. Every replica can be placed now (nothing was changed)."
        )),
        pl::AdmissionResult::ValidationErrors { errors } => {
            let mut t = Tree::new(format!(
                "Bundle {name}: invalid against the operator's pools and nodes ({} problem{})",
                errors.len(),
                if errors.len() == 1 { "" } else { "s" }
            ));
            for e in errors {
                t = t.leaf(format!("{}: {e}", crate::validate::field_path_of(e, spec)));
            }
            t
        }
        pl::AdmissionResult::NoCapacity { unplaceable } => {
            let mut t = Tree::new(format!(
                "Bundle {name}: no capacity. {} job placement{} would fail now",
                unplaceable.len(),
                if unplaceable.len() == 1 { "" } else { "s" }
            ));
            for u in unplaceable {
                t = t.leaf(format!(
                    "replica {} job {}: {}",
                    u.replica_index, u.job_name, u.reason
                ));
            }
            t
        }
    };
    if !answer.decisions.is_empty() {
        let mut dry = Tree::new("dry run, replica by replica (each sees the ones before it)");
        for d in &answer.decisions {
            let t = ReplicaTrace {
                replica: d.replica_index,
                decided_at: None,
                leader: None,
                recovery: false,
                decision: d.clone(),
                preempted: None,
            };
            dry = dry.child(replica_tree(&t, view));
        }
        root = root.child(dry);
    }
    root.render()
}
