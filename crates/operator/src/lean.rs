//! [`Lean`]: a watched object decoded without `metadata.managedFields`.
//!
//! The apiserver sends every object with its field-ownership records. For a Bundle whose status
//! the operator applies, they are about as large as the status itself, and decoding them builds
//! a `serde_json::Value` tree per manager on every watch event, only for the store to drop it
//! (no controller reads them). A profile of a 1,000-Bundle wave put that decoding among the
//! operator's largest costs. [`Lean`] skips the records while parsing (serde ignores an unknown
//! field without building it) and decodes the rest as the object's own type does.
//!
//! Why not a field filter on the apiserver side: a watch has no parameter that leaves
//! `managedFields` out. Why not a custom `ObjectMeta`: the resource types come from
//! `kube::CustomResource`, which fixes the metadata type, so the wrapper decodes `metadata`
//! itself and hands every other top-level field, unparsed ([`RawValue`]), to the object's own
//! `Deserialize`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// `K` decoded without `metadata.managedFields` (see the module docs). Serializes as `K`.
#[derive(Debug, Clone, PartialEq)]
pub struct Lean<K>(pub K);

impl<K> Lean<K> {
    /// The object.
    pub fn into_inner(self) -> K {
        self.0
    }
}

impl<K: Resource> Resource for Lean<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

impl<K: Serialize> Serialize for Lean<K> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// `ObjectMeta` without `managedFields`: the derive skips unknown keys without building them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl From<LeanMeta> for ObjectMeta {
    fn from(m: LeanMeta) -> Self {
        ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

impl<'de, K: Resource + DeserializeOwned> Deserialize<'de> for Lean<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(LeanVisitor(PhantomData))
    }
}

struct LeanVisitor<K>(PhantomData<K>);

impl<'de, K: Resource + DeserializeOwned> Visitor<'de> for LeanVisitor<K> {
    type Value = Lean<K>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Lean<K>, A::Error> {
        let mut meta: Option<LeanMeta> = None;
        // The other top-level fields, still as JSON text, parsed once by `K` below.
        let mut rest = String::from("{\"metadata\":{}");
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "metadata" {
                if meta.is_some() {
                    return Err(de::Error::duplicate_field("metadata"));
                }
                meta = Some(map.next_value()?);
                continue;
            }
            let value: Box<RawValue> = map.next_value()?;
            rest.push(',');
            rest.push_str(&serde_json::to_string(&key).map_err(de::Error::custom)?);
            rest.push(':');
            rest.push_str(value.get());
        }
        rest.push('}');
        let mut obj: K = serde_json::from_str(&rest).map_err(de::Error::custom)?;
        if let Some(m) = meta {
            *obj.meta_mut() = m.into();
        }
        Ok(Lean(obj))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use automanager_api::Bundle;

    fn bundle_json() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Bundle",
            "metadata": {
                "name": "b", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
                "generation": 3, "finalizers": ["automanager.norsk.io/bundle"],
                "labels": {"team": "video"},
                "annotations": {"a": "1"},
                "creationTimestamp": "2026-12-04T10:00:00Z",
                "managedFields": [
                    {"manager": "automanager", "operation": "Apply", "apiVersion": "automanager.norsk.io/v1alpha1",
                     "fieldsType": "FieldsV1", "subresource": "status",
                     "fieldsV1": {"f:status": {"f:phase": {}, "f:replicas": {}}}},
                    {"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:spec": {"f:replicas": {}}}}
                ]
            },
            "spec": {"replicas": 2, "pools": ["p"], "jobs": [{"jobName": "encode", "requirements": {"requiredCapacity": 5, "priorityBand": "silver"}}]},
            "status": {"phase": "Ready", "observedGeneration": 3}
        })
    }

    #[test]
    fn decodes_as_the_type_does_without_managed_fields() {
        let text = bundle_json().to_string();
        let full: Bundle = serde_json::from_str(&text).expect("full decode");
        assert_eq!(full.metadata.managed_fields.as_ref().map(Vec::len), Some(2));
        let Lean(lean) = serde_json::from_str::<Lean<Bundle>>(&text).expect("lean decode");
        let mut expected = full.clone();
        expected.metadata.managed_fields = None;
        assert_eq!(
            serde_json::to_value(&lean).expect("encode"),
            serde_json::to_value(&expected).expect("encode")
        );
        assert_eq!(lean.metadata.generation, Some(3));
        assert_eq!(lean.metadata.uid.as_deref(), Some("u-1"));
    }

    #[test]
    fn decodes_inside_a_watch_event_and_a_list() {
        let event = format!(r#"{{"type":"MODIFIED","object":{}}}"#, bundle_json());
        match serde_json::from_str::<kube::core::WatchEvent<Lean<Bundle>>>(&event) {
            Ok(kube::core::WatchEvent::Modified(Lean(b))) => {
                assert_eq!(b.metadata.name.as_deref(), Some("b"));
                assert!(b.metadata.managed_fields.is_none());
            }
            other => panic!("unexpected {other:?}"),
        }
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{"resourceVersion":"7"}},"items":[{}]}}"#,
            bundle_json()
        );
        let list: kube::core::ObjectList<Lean<Bundle>> =
            serde_json::from_str(&list).expect("list decode");
        assert_eq!(list.items.len(), 1);
    }

    #[test]
    fn a_job_config_nested_past_the_decoders_depth_limit_still_decodes() {
        // The operator answers such a Bundle itself (docs/api.md); the watch must deliver it.
        let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
        let mut v = bundle_json();
        v["spec"]["jobs"][0]["config"] = serde_json::json!({});
        let text = v
            .to_string()
            .replace(r#""config":{}"#, &format!(r#""config":{{"deep":{deep}}}"#));
        let full: Bundle = serde_json::from_str(&text).expect("full decode");
        let Lean(lean) = serde_json::from_str::<Lean<Bundle>>(&text).expect("lean decode");
        assert_eq!(
            serde_json::to_string(&lean.spec).expect("encode"),
            serde_json::to_string(&full.spec).expect("encode")
        );
    }

    #[test]
    fn a_malformed_object_is_an_error_naming_what_failed() {
        for bad in [
            r#"{"metadata": {"name": 5}}"#,
            r#"{"metadata": {}, "metadata": {}}"#,
            r#"{"metadata": {}, "spec": {"replicas": "two"}}"#,
            r#"[1, 2]"#,
        ] {
            let err = serde_json::from_str::<Lean<Bundle>>(bad).expect_err(bad);
            assert!(!err.to_string().is_empty());
        }
    }
}
