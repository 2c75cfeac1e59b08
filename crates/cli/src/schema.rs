//! Offline checks of an object against the CRD's own OpenAPI schema (the one `crds/` holds,
//! generated from `crates/api`): types, required fields, enums, bounds, patterns and unknown
//! fields, each reported with its field path. The apiserver runs the same schema at
//! `kubectl apply`; its CEL rules (`x-kubernetes-validations`) are not evaluated here, but the
//! ones about a bundle's jobs, pools and rules are the checks `validate` runs with the
//! placement engine's own validation anyway.

use std::collections::HashMap;

use automanager_api as api;
use serde_json::Value;

/// Longest message kept for one problem (a schema message may quote a whole list).
const MAX_MESSAGE_CHARS: usize = 240;

/// One problem, with the field it is about (`spec.jobs[0].requirements.requiredCapacity`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FieldProblem {
    pub path: String,
    pub message: String,
}

/// The schema validators of every AutoManager kind.
pub struct Schemas {
    by_kind: HashMap<String, jsonschema::Validator>,
}

impl Schemas {
    /// Compiles the schema of every CRD `crates/api` defines.
    pub fn load() -> Result<Schemas, String> {
        let mut by_kind = HashMap::new();
        for crd in api::crd::all() {
            let kind = crd.spec.names.kind.clone();
            let schema = crd
                .spec
                .versions
                .iter()
                .find(|v| v.name == api::VERSION)
                .and_then(|v| v.schema.as_ref())
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .ok_or_else(|| format!("the {kind} CRD has no {} schema", api::VERSION))?;
            let mut schema = serde_json::to_value(schema).map_err(|e| e.to_string())?;
            // The CRD schema describes spec and status; the envelope is the apiserver's.
            if let Some(Value::Object(props)) = schema.get_mut("properties") {
                props.insert("apiVersion".into(), serde_json::json!({"type": "string"}));
                props.insert("kind".into(), serde_json::json!({"type": "string"}));
                props.insert("metadata".into(), serde_json::json!({"type": "object"}));
            }
            strictify(&mut schema);
            let validator = jsonschema::options()
                .should_validate_formats(false)
                .build(&schema)
                .map_err(|e| format!("the {kind} schema does not compile: {e}"))?;
            by_kind.insert(kind, validator);
        }
        Ok(Schemas { by_kind })
    }

    /// Whether `kind` is one of ours.
    pub fn knows(&self, kind: &str) -> bool {
        self.by_kind.contains_key(kind)
    }

    /// Every schema problem of `object` (of kind `kind`), in document order.
    pub fn check(&self, kind: &str, object: &Value) -> Vec<FieldProblem> {
        let Some(validator) = self.by_kind.get(kind) else {
            return vec![FieldProblem {
                path: "kind".into(),
                message: format!("{kind:?} is not an AutoManager kind"),
            }];
        };
        let mut out: Vec<FieldProblem> = validator
            .iter_errors(object)
            .map(|e| FieldProblem {
                path: field_path(&e.instance_path().to_string()),
                message: truncate(&e.to_string()),
            })
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out.dedup();
        out
    }
}

/// Makes the OpenAPI schema say what the apiserver enforces:
/// - `nullable: true` allows `null` (JSON Schema spells it as a type);
/// - an object schema with `properties` refuses other keys, as strict field validation
///   (kubectl's default) does, unless it preserves unknown fields.
fn strictify(schema: &mut Value) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if obj.get("nullable") == Some(&Value::Bool(true))
        && let Some(Value::String(t)) = obj.get("type").cloned()
    {
        obj.insert("type".into(), serde_json::json!([t, "null"]));
    }
    let preserves = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if obj.contains_key("properties") && !obj.contains_key("additionalProperties") && !preserves {
        obj.insert("additionalProperties".into(), Value::Bool(false));
    }
    for key in ["properties", "patternProperties"] {
        if let Some(Value::Object(props)) = obj.get_mut(key) {
            for v in props.values_mut() {
                strictify(v);
            }
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(v) = obj.get_mut(key) {
            strictify(v);
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(list)) = obj.get_mut(key) {
            for v in list {
                strictify(v);
            }
        }
    }
}

/// `/spec/jobs/0/jobName` → `spec.jobs[0].jobName`.
pub fn field_path(pointer: &str) -> String {
    let mut out = String::new();
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&segment);
        }
    }
    if out.is_empty() {
        "(object)".into()
    } else {
        out
    }
}

fn truncate(s: &str) -> String {
    match s.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bundle(spec: Value) -> Value {
        json!({"apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Bundle",
               "metadata": {"name": "b", "namespace": "default"}, "spec": spec})
    }

    fn good_spec() -> Value {
        json!({"replicas": 2, "pools": ["aws-east"],
               "jobs": [{"jobName": "encode", "requirements": {"requiredCapacity": 8, "priorityBand": "gold"}}]})
    }

    #[test]
    fn a_good_bundle_has_no_schema_problem() {
        let s = Schemas::load().expect("schemas compile");
        assert_eq!(s.check("Bundle", &bundle(good_spec())), vec![]);
    }

    #[test]
    fn bounds_patterns_enums_and_unknown_fields_are_reported_with_their_path() {
        let s = Schemas::load().expect("schemas compile");
        let mut spec = good_spec();
        spec["replicas"] = json!(40);
        spec["jobs"][0]["jobName"] = json!("Encode");
        spec["jobs"][0]["requirements"]["priorityBand"] = json!("platinum");
        spec["jobs"][0]["requirements"]["requiredCapacity"] = json!("lots");
        spec["replicaz"] = json!(1);
        let problems = s.check("Bundle", &bundle(spec));
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert!(paths.contains(&"spec.replicas"), "{problems:?}");
        assert!(paths.contains(&"spec.jobs[0].jobName"), "{problems:?}");
        assert!(
            paths.contains(&"spec.jobs[0].requirements.priorityBand"),
            "{problems:?}"
        );
        assert!(
            paths.contains(&"spec.jobs[0].requirements.requiredCapacity"),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.path == "spec" && p.message.contains("replicaz")),
            "{problems:?}"
        );
    }

    #[test]
    fn a_missing_required_field_names_its_parent() {
        let s = Schemas::load().expect("schemas compile");
        let mut spec = good_spec();
        spec["jobs"][0]["requirements"]
            .as_object_mut()
            .expect("object")
            .remove("priorityBand");
        let problems = s.check("Bundle", &bundle(spec));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].path, "spec.jobs[0].requirements");
        assert!(problems[0].message.contains("priorityBand"));
    }

    #[test]
    fn pointers_become_field_paths() {
        assert_eq!(field_path("/spec/jobs/0/jobName"), "spec.jobs[0].jobName");
        assert_eq!(field_path(""), "(object)");
        assert_eq!(
            field_path("/metadata/annotations/a~1b"),
            "metadata.annotations.a/b"
        );
    }
}
