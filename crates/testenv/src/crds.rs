//! Waiting for CustomResourceDefinitions to be usable.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::{Error, TestEnv};

/// True when the CRD's `Established` and `NamesAccepted` conditions are both `True`.
pub fn crd_is_established(crd: &CustomResourceDefinition) -> bool {
    let conditions = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let is_true = |kind: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == kind && c.status == "True")
    };
    is_true("Established") && is_true("NamesAccepted")
}

impl TestEnv {
    /// Waits until every named CRD (`<plural>.<group>`) is Established and each served
    /// version lists the resource in discovery, so `kubectl apply` of a custom resource
    /// succeeds right after. Fails with [`Error::CrdsNotEstablished`] naming the laggards.
    pub async fn wait_for_crds_established<I, S>(
        &self,
        names: I,
        timeout: Duration,
    ) -> Result<(), Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let names: Vec<String> = names.into_iter().map(|n| n.as_ref().to_owned()).collect();
        let api: kube::Api<CustomResourceDefinition> = kube::Api::all(self.client());
        let deadline = Instant::now() + timeout;
        loop {
            let mut pending = Vec::new();
            for name in &names {
                let ready = match api.get_opt(name).await {
                    Ok(Some(crd)) => crd_is_established(&crd) && self.crd_served(&crd).await,
                    Ok(None) => false,
                    Err(e) => {
                        tracing::debug!(crd = %name, error = %e, "reading CRD");
                        false
                    }
                };
                if !ready {
                    pending.push(name.clone());
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::CrdsNotEstablished { pending, timeout });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn crd_served(&self, crd: &CustomResourceDefinition) -> bool {
        let client = self.client();
        for version in crd.spec.versions.iter().filter(|v| v.served) {
            let group_version = format!("{}/{}", crd.spec.group, version.name);
            match client.list_api_group_resources(&group_version).await {
                Ok(list)
                    if list
                        .resources
                        .iter()
                        .any(|r| r.name == crd.spec.names.plural) => {}
                _ => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionCondition, CustomResourceDefinitionStatus,
    };

    fn crd(conditions: &[(&str, &str)]) -> CustomResourceDefinition {
        CustomResourceDefinition {
            status: Some(CustomResourceDefinitionStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| CustomResourceDefinitionCondition {
                            type_: (*t).to_owned(),
                            status: (*s).to_owned(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn established_needs_both_established_and_names_accepted() {
        assert!(crd_is_established(&crd(&[
            ("NamesAccepted", "True"),
            ("Established", "True")
        ])));
        assert!(!crd_is_established(&crd(&[("Established", "True")])));
        assert!(!crd_is_established(&crd(&[
            ("NamesAccepted", "True"),
            ("Established", "False")
        ])));
    }

    #[test]
    fn a_crd_without_status_is_not_established() {
        assert!(!crd_is_established(&CustomResourceDefinition::default()));
        assert!(!crd_is_established(&crd(&[])));
    }
}
