//! Finding the operator's leader Pod, as the plugin's default way to its debugging API.
//!
//! The chart runs the operator as a Deployment whose Pods carry the chart's labels and whose
//! replicas elect a leader on a Lease named like the Deployment (the release's full name), its
//! holder identity being the leader Pod's name. Only the leader holds placement traces and the
//! live placement model, so the plugin port-forwards to that Pod, through the apiserver as
//! `kubectl port-forward` does, to the container port named `debug`. Nothing is exposed: the
//! port listens on the Pod's loopback by default, and port-forwarding needs RBAC `create` on
//! `pods/portforward` in the operator's namespace.
//!
//! This module is the pure part: which Pod, given the Pods and the Lease holder.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;

/// The labels of the chart's operator Pods.
pub const DEFAULT_SELECTOR: &str =
    "app.kubernetes.io/name=automanager,app.kubernetes.io/component=operator";

/// The Pod label naming the Helm release.
pub const RELEASE_LABEL: &str = "app.kubernetes.io/instance";

/// The container port of the debugging API in the chart's Pods.
pub const DEBUG_PORT_NAME: &str = "debug";

/// What the plugin needs of one operator Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorPod {
    pub name: String,
    /// The Helm release (`app.kubernetes.io/instance`).
    pub release: Option<String>,
    /// The Deployment owning the Pod (through its ReplicaSet), which names the Lease.
    pub deployment: Option<String>,
    /// Running and not being deleted.
    pub running: bool,
    /// The container port named `debug`, when the debugging API is on.
    pub debug_port: Option<u16>,
}

impl OperatorPod {
    /// Reads the fields above from a Pod.
    pub fn from_pod(pod: &Pod) -> OperatorPod {
        let meta = &pod.metadata;
        let labels = meta.labels.clone().unwrap_or_default();
        let deployment = meta.owner_references.iter().flatten().find_map(|o| {
            if o.kind != "ReplicaSet" {
                return None;
            }
            // A Deployment's ReplicaSet is `<deployment>-<pod-template-hash>`.
            let hash = labels.get("pod-template-hash")?;
            o.name.strip_suffix(&format!("-{hash}")).map(str::to_owned)
        });
        let running = meta.deletion_timestamp.is_none()
            && pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Running");
        let debug_port = pod.spec.iter().flat_map(|s| &s.containers).find_map(|c| {
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(DEBUG_PORT_NAME))
                .and_then(|p| u16::try_from(p.container_port).ok())
        });
        OperatorPod {
            name: meta.name.clone().unwrap_or_default(),
            release: labels.get(RELEASE_LABEL).cloned(),
            deployment,
            running,
            debug_port,
        }
    }
}

/// The operator Pods of one release, narrowed from everything the selector matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub name: Option<String>,
    pub pods: Vec<OperatorPod>,
}

impl Release {
    /// The Lease's name: the Deployment's (the chart names both after the release).
    pub fn lease_name(&self) -> Option<&str> {
        self.pods.iter().find_map(|p| p.deployment.as_deref())
    }
}

/// Where the debugging API is: a Pod and its port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub pod: String,
    pub port: u16,
}

/// Why the operator could not be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocateError {
    #[error(
        "no operator Pod in namespace {namespace} with labels {selector}: is AutoManager installed there? (--operator-namespace, --operator-selector)"
    )]
    NoPods { namespace: String, selector: String },
    #[error(
        "namespace {namespace} holds several AutoManager releases ({}): name one with --operator-release",
        releases.join(", ")
    )]
    SeveralReleases {
        namespace: String,
        releases: Vec<String>,
    },
    #[error("no operator Pod of release {release} in namespace {namespace}")]
    NoSuchRelease { namespace: String, release: String },
    #[error(
        "the debugging API of release {release} is off (its Pods have no container port named debug): helm upgrade {release} -n {namespace} --reset-then-reuse-values --set debug.enabled=true"
    )]
    DebugOff { namespace: String, release: String },
    #[error("{0}")]
    NoLeader(String),
}

/// The Pods of the release asked for (`release`), or of the only release there is.
pub fn release(
    namespace: &str,
    selector: &str,
    pods: Vec<OperatorPod>,
    release: Option<&str>,
) -> Result<Release, LocateError> {
    if pods.is_empty() {
        return Err(LocateError::NoPods {
            namespace: namespace.to_owned(),
            selector: selector.to_owned(),
        });
    }
    match release {
        Some(r) => {
            let pods: Vec<_> = pods
                .into_iter()
                .filter(|p| p.release.as_deref() == Some(r))
                .collect();
            if pods.is_empty() {
                return Err(LocateError::NoSuchRelease {
                    namespace: namespace.to_owned(),
                    release: r.to_owned(),
                });
            }
            Ok(Release {
                name: Some(r.to_owned()),
                pods,
            })
        }
        None => {
            let names: BTreeSet<Option<String>> = pods.iter().map(|p| p.release.clone()).collect();
            if names.len() > 1 {
                return Err(LocateError::SeveralReleases {
                    namespace: namespace.to_owned(),
                    releases: names
                        .into_iter()
                        .map(|n| n.unwrap_or_else(|| "(no release label)".into()))
                        .collect(),
                });
            }
            Ok(Release {
                name: names.into_iter().next().flatten(),
                pods,
            })
        }
    }
}

/// The Pod to ask: the Lease's holder (`holder`, `None` when there is no Lease: leader election
/// is off and the only running Pod acts). `avoid` lists Pods that already answered that they
/// do not lead.
pub fn target(
    namespace: &str,
    release: &Release,
    holder: Option<&str>,
    avoid: &[String],
) -> Result<Target, LocateError> {
    let release_name = release.name.clone().unwrap_or_else(|| "automanager".into());
    if release.pods.iter().all(|p| p.debug_port.is_none()) {
        return Err(LocateError::DebugOff {
            namespace: namespace.to_owned(),
            release: release_name,
        });
    }
    let running: Vec<&OperatorPod> = release
        .pods
        .iter()
        .filter(|p| p.running && !avoid.contains(&p.name))
        .collect();
    let pod = match holder {
        Some(h) => match running.iter().find(|p| p.name == h) {
            Some(p) => *p,
            None => {
                return Err(LocateError::NoLeader(format!(
                    "the leader Lease of release {release_name} names {h}, which is not a running operator Pod in namespace {namespace} (a new leader is being elected? try again in a few seconds)"
                )));
            }
        },
        None => match running.as_slice() {
            [only] => *only,
            [] => {
                return Err(LocateError::NoLeader(format!(
                    "no operator Pod of release {release_name} is running in namespace {namespace}"
                )));
            }
            several => {
                return Err(LocateError::NoLeader(format!(
                    "release {release_name} has no leader Lease yet and {} running Pods ({}); try again once one leads",
                    several.len(),
                    several
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        },
    };
    let port = pod.debug_port.ok_or_else(|| LocateError::DebugOff {
        namespace: namespace.to_owned(),
        release: release_name.clone(),
    })?;
    Ok(Target {
        pod: pod.name.clone(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, release: &str, running: bool, debug: Option<u16>) -> OperatorPod {
        OperatorPod {
            name: name.into(),
            release: Some(release.into()),
            deployment: Some(release.into()),
            running,
            debug_port: debug,
        }
    }

    #[test]
    fn the_lease_holder_is_asked() {
        let r = release(
            "ns",
            DEFAULT_SELECTOR,
            vec![
                pod("am-1", "am", true, Some(8082)),
                pod("am-2", "am", true, Some(8082)),
            ],
            None,
        )
        .expect("one release");
        assert_eq!(r.lease_name(), Some("am"));
        assert_eq!(
            target("ns", &r, Some("am-2"), &[]),
            Ok(Target {
                pod: "am-2".into(),
                port: 8082
            })
        );
    }

    #[test]
    fn a_holder_that_is_not_a_running_pod_is_no_leader() {
        let r = release(
            "ns",
            DEFAULT_SELECTOR,
            vec![
                pod("am-1", "am", true, Some(8082)),
                pod("am-2", "am", false, Some(8082)),
            ],
            None,
        )
        .expect("one release");
        let e = target("ns", &r, Some("am-2"), &[]).expect_err("not running");
        assert!(
            e.to_string().contains("names am-2, which is not a running"),
            "{e}"
        );
        let e = target("ns", &r, Some("am-1"), &["am-1".into()]).expect_err("avoided");
        assert!(matches!(e, LocateError::NoLeader(_)));
    }

    #[test]
    fn without_a_lease_the_only_running_pod_is_asked() {
        let r = release(
            "ns",
            DEFAULT_SELECTOR,
            vec![
                pod("am-1", "am", true, Some(9000)),
                pod("am-0", "am", false, Some(9000)),
            ],
            None,
        )
        .expect("one release");
        assert_eq!(
            target("ns", &r, None, &[]).map(|t| t.pod),
            Ok("am-1".into())
        );
    }

    #[test]
    fn several_releases_need_a_name_and_a_missing_debug_port_says_how_to_turn_it_on() {
        let pods = vec![
            pod("a-1", "team-a", true, Some(8082)),
            pod("b-1", "team-b", true, None),
        ];
        let e = release("ns", DEFAULT_SELECTOR, pods.clone(), None).expect_err("two");
        assert_eq!(
            e.to_string(),
            "namespace ns holds several AutoManager releases (team-a, team-b): name one with --operator-release"
        );
        let b = release("ns", DEFAULT_SELECTOR, pods.clone(), Some("team-b")).expect("b");
        let e = target("ns", &b, Some("b-1"), &[]).expect_err("debug off");
        assert!(e.to_string().contains("--set debug.enabled=true"), "{e}");
        assert!(matches!(
            release("ns", DEFAULT_SELECTOR, pods, Some("team-c")),
            Err(LocateError::NoSuchRelease { .. })
        ));
        assert!(matches!(
            release("ns", DEFAULT_SELECTOR, vec![], None),
            Err(LocateError::NoPods { .. })
        ));
    }

    #[test]
    fn a_pod_is_read_from_its_object() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "automanager-5d8c7b9f4-x2x9q",
                "labels": {"app.kubernetes.io/instance": "automanager", "pod-template-hash": "5d8c7b9f4"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "automanager-5d8c7b9f4", "uid": "u"}]
            },
            "spec": {"containers": [{"name": "operator", "ports": [
                {"name": "http", "containerPort": 8080}, {"name": "debug", "containerPort": 8082}]}]},
            "status": {"phase": "Running"}
        }))
        .expect("a pod");
        assert_eq!(
            OperatorPod::from_pod(&p),
            OperatorPod {
                name: "automanager-5d8c7b9f4-x2x9q".into(),
                release: Some("automanager".into()),
                deployment: Some("automanager".into()),
                running: true,
                debug_port: Some(8082),
            }
        );
    }
}
