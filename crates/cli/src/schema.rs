//! Offline checks of an object against the CRD's own OpenAPI schema (the one `crds/` holds,
//! generated from `crates/api`), as the apiserver runs them at create: types, required fields,
//! enums, bounds, patterns and unknown fields (the `jsonschema` crate), list-map and set
//! uniqueness (`x-kubernetes-list-type`), then, with the schema's defaults applied, the CEL rules
//! (`x-kubernetes-validations`, [`crate::cel`]). Each problem carries its field path and is
//! worded as the apiserver words it (`Invalid value: 17: spec.replicas in body should be less
//! than or equal to 16`), so a check written against `kubectl apply`'s message holds offline.

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
    by_kind: HashMap<String, KindSchema>,
}

struct KindSchema {
    validator: jsonschema::Validator,
    /// The schema as the CRD holds it (defaults, list types, CEL rules).
    raw: Value,
    rules: crate::cel::KindRules,
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
            let raw = schema.clone();
            let rules = crate::cel::KindRules::collect(&raw);
            if let Some(bad) = rules.unsupported.first() {
                return Err(format!(
                    "a CEL rule of the {kind} CRD does not compile: {bad}"
                ));
            }
            strictify(&mut schema);
            let validator = jsonschema::options()
                .should_validate_formats(false)
                .build(&schema)
                .map_err(|e| format!("the {kind} schema does not compile: {e}"))?;
            by_kind.insert(
                kind,
                KindSchema {
                    validator,
                    raw,
                    rules,
                },
            );
        }
        Ok(Schemas { by_kind })
    }

    /// Whether `kind` is one of ours.
    pub fn knows(&self, kind: &str) -> bool {
        self.by_kind.contains_key(kind)
    }

    /// How many CEL rules of `kind` are evaluated (transition rules are not).
    pub fn cel_rules(&self, kind: &str) -> usize {
        self.by_kind.get(kind).map_or(0, |k| k.rules.len())
    }

    /// Every problem of `object` (of kind `kind`): the schema's, the list types', then (when
    /// those pass, as the rules assume a well-typed object) the CEL rules', by field path.
    pub fn check(&self, kind: &str, object: &Value) -> Vec<FieldProblem> {
        let Some(k) = self.by_kind.get(kind) else {
            return vec![FieldProblem {
                path: "kind".into(),
                message: format!("{kind:?} is not an AutoManager kind"),
            }];
        };
        let mut out: Vec<FieldProblem> = k
            .validator
            .iter_errors(object)
            .flat_map(|e| apiserver_problems(&e))
            .collect();
        list_types(&k.raw, object, String::new(), &mut out);
        if out.is_empty() {
            let mut defaulted = object.clone();
            crate::cel::apply_defaults(&k.raw, &mut defaulted);
            out.extend(k.rules.check(&defaulted));
        }
        for p in &mut out {
            p.message = truncate(&p.message);
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out.dedup();
        out
    }
}

/// A schema error as the apiserver reports it: the field, then `Invalid value: …`,
/// `Required value`, `Unsupported value: …`, `Too long: …`, `Too many: …` or kubectl's
/// `unknown field "…"`.
fn apiserver_problems(e: &jsonschema::ValidationError<'_>) -> Vec<FieldProblem> {
    use jsonschema::error::ValidationErrorKind as K;
    let path = field_path(&e.instance_path().to_string());
    let instance: &Value = e.instance();
    let shown = instance.to_string();
    let in_body = |what: String| format!("Invalid value: {shown}: {path} in body {what}");
    let join = |parent: &str, child: &str| {
        if parent == "(object)" {
            child.to_owned()
        } else {
            format!("{parent}.{child}")
        }
    };
    let one = |message: String| {
        vec![FieldProblem {
            path: path.clone(),
            message,
        }]
    };
    match e.kind() {
        K::AdditionalProperties { unexpected } => unexpected
            .iter()
            .map(|u| FieldProblem {
                path: path.clone(),
                message: format!("unknown field {:?}", join(&path, u)),
            })
            .collect(),
        K::Required { property } => vec![FieldProblem {
            path: join(&path, property.as_str().unwrap_or_default()),
            message: "Required value".into(),
        }],
        K::Type { kind } => {
            let expected = match kind {
                jsonschema::error::TypeKind::Single(t) => t.to_string(),
                // `nullable` became a second type (see `strictify`); the CRD names one.
                jsonschema::error::TypeKind::Multiple(set) => set
                    .iter()
                    .map(|t| t.to_string())
                    .filter(|t| t != "null")
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            let actual = crate::cel::json_type(instance);
            one(format!(
                "Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""
            ))
        }
        K::Enum { options } => {
            let supported: Vec<String> = options
                .as_array()
                .map(|a| a.iter().map(Value::to_string).collect())
                .unwrap_or_default();
            one(format!(
                "Unsupported value: {shown}: supported values: {}",
                supported.join(", ")
            ))
        }
        K::Minimum { limit } => one(in_body(format!(
            "should be greater than or equal to {}",
            number(limit)
        ))),
        K::Maximum { limit } => one(in_body(format!(
            "should be less than or equal to {}",
            number(limit)
        ))),
        K::ExclusiveMinimum { limit } => {
            one(in_body(format!("should be greater than {}", number(limit))))
        }
        K::ExclusiveMaximum { limit } => {
            one(in_body(format!("should be less than {}", number(limit))))
        }
        K::MinItems { limit } => one(format!(
            "Invalid value: {}: {path} in body should have at least {limit} items",
            instance.as_array().map_or(0, Vec::len)
        )),
        K::MaxItems { limit } => one(format!(
            "Too many: {}: must have at most {limit} items",
            instance.as_array().map_or(0, Vec::len)
        )),
        K::MaxProperties { limit } => one(format!(
            "Too many: {}: must have at most {limit} items",
            instance.as_object().map_or(0, serde_json::Map::len)
        )),
        K::MaxLength { limit } => one(format!("Too long: may not be more than {limit} bytes")),
        K::MinLength { limit } => one(in_body(format!("should be at least {limit} chars long"))),
        K::Pattern { pattern } => one(in_body(format!("should match '{pattern}'"))),
        _ => one(e.to_string()),
    }
}

/// A bound as the apiserver prints it: `16`, not `16.0`.
fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => v.to_string(),
    }
}

/// `x-kubernetes-list-type: set` and `map` (with `x-kubernetes-list-map-keys`): an item (or an
/// item's keys) given twice is `Duplicate value`, as the apiserver says.
fn list_types(schema: &Value, value: &Value, path: String, out: &mut Vec<FieldProblem>) {
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let values = schema.get("additionalProperties").filter(|v| v.is_object());
            for (k, v) in map {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match props.and_then(|p| p.get(k)) {
                    Some(s) => list_types(s, v, child, out),
                    None => {
                        if let Some(s) = values {
                            list_types(s, v, format!("{path}[{k}]"), out);
                        }
                    }
                }
            }
        }
        Value::Array(items) => {
            let keys: Vec<&str> = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|k| k.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let identity = |item: &Value| -> Option<Value> {
                match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                    Some("set") => Some(item.clone()),
                    Some("map") => Some(Value::Object(
                        keys.iter()
                            .filter_map(|k| Some(((*k).to_owned(), item.get(*k)?.clone())))
                            .collect(),
                    )),
                    _ => None,
                }
            };
            let mut seen: Vec<Value> = Vec::new();
            for (i, item) in items.iter().enumerate() {
                if let Some(id) = identity(item) {
                    if seen.contains(&id) {
                        out.push(FieldProblem {
                            path: format!("{path}[{i}]"),
                            message: format!("Duplicate value: {id}"),
                        });
                    } else {
                        seen.push(id);
                    }
                }
                if let Some(s) = schema.get("items") {
                    list_types(s, item, format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
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
        assert_eq!(problems[0].path, "spec.jobs[0].requirements.priorityBand");
        assert_eq!(problems[0].message, "Required value");
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
