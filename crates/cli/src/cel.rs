//! The CRDs' CEL rules (`x-kubernetes-validations`), evaluated offline with the `cel` crate
//! (cel-rust), as the apiserver evaluates them at create: each rule runs with `self` bound to
//! the value at its schema node (every element of a list, every value of a map), after the
//! schema's defaults are applied; a rule that is false gives its `message` at its node's field
//! path (plus its `fieldPath`), worded as the apiserver words it
//! (`spec.jobs[0]: Invalid value: "object": a job cannot list itself in coLocateWith`).
//!
//! Transition rules (those reading `oldSelf`) hold only between an object and its update, so
//! they are left out: `validate` sees one version of each object.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use crate::schema::FieldProblem;

/// One step from a schema node to a child.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Property(String),
    Items,
    Values,
}

/// One rule, compiled.
struct Rule {
    source: String,
    message: Option<String>,
    message_expression: Option<cel::Program>,
    field_path: Option<String>,
    reason: Option<String>,
    program: cel::Program,
}

/// The rules of one kind's schema, by the schema path they are attached to.
#[derive(Default)]
pub struct KindRules {
    at: Vec<(Vec<Step>, Vec<Rule>)>,
    /// Rules this interpreter cannot compile, with why (none in this project's CRDs: a test
    /// holds that).
    pub unsupported: Vec<String>,
    /// Transition rules, not evaluated offline.
    pub transition: usize,
}

impl KindRules {
    /// Collects every rule of `schema` (a CRD version's `openAPIV3Schema`).
    pub fn collect(schema: &Value) -> KindRules {
        let mut rules = KindRules::default();
        walk(schema, &mut Vec::new(), &mut rules);
        rules
    }

    /// How many rules are evaluated.
    pub fn len(&self) -> usize {
        self.at.iter().map(|(_, r)| r.len()).sum()
    }

    /// Whether no rule is evaluated.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every rule that `object` (defaults applied) breaks.
    pub fn check(&self, object: &Value) -> Vec<FieldProblem> {
        let mut out = Vec::new();
        for (path, rules) in &self.at {
            let mut found = Vec::new();
            values_at(object, path, String::new(), &mut found);
            for (field, value) in found {
                let bound = to_cel(value);
                for rule in rules {
                    if let Some(p) = evaluate(rule, &bound, &field, value) {
                        out.push(p);
                    }
                }
            }
        }
        out
    }
}

fn walk(schema: &Value, path: &mut Vec<Step>, rules: &mut KindRules) {
    let Some(obj) = schema.as_object() else {
        return;
    };
    if let Some(Value::Array(list)) = obj.get("x-kubernetes-validations") {
        let mut compiled = Vec::new();
        for r in list {
            let source = r["rule"].as_str().unwrap_or_default().to_owned();
            if mentions_old_self(&source) {
                rules.transition += 1;
                continue;
            }
            let program = match cel::Program::compile(&source) {
                Ok(p) => p,
                Err(e) => {
                    rules.unsupported.push(format!("{source}: {e}"));
                    continue;
                }
            };
            let message_expression = r["messageExpression"]
                .as_str()
                .and_then(|m| cel::Program::compile(m).ok());
            compiled.push(Rule {
                source,
                message: r["message"].as_str().map(str::to_owned),
                message_expression,
                field_path: r["fieldPath"].as_str().map(str::to_owned),
                reason: r["reason"].as_str().map(str::to_owned),
                program,
            });
        }
        if !compiled.is_empty() {
            rules.at.push((path.clone(), compiled));
        }
    }
    if let Some(Value::Object(props)) = obj.get("properties") {
        for (name, child) in props {
            path.push(Step::Property(name.clone()));
            walk(child, path, rules);
            path.pop();
        }
    }
    if let Some(items) = obj.get("items") {
        path.push(Step::Items);
        walk(items, path, rules);
        path.pop();
    }
    if let Some(values) = obj.get("additionalProperties").filter(|v| v.is_object()) {
        path.push(Step::Values);
        walk(values, path, rules);
        path.pop();
    }
}

/// Whether a rule reads `oldSelf` (as an identifier, not inside a longer name).
fn mentions_old_self(rule: &str) -> bool {
    rule.match_indices("oldSelf").any(|(i, _)| {
        let before = rule[..i].chars().next_back();
        let after = rule[i + "oldSelf".len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

/// The values at `path` in `value`, each with its field path (`spec.jobs[1]`).
fn values_at<'a>(
    value: &'a Value,
    path: &[Step],
    field: String,
    out: &mut Vec<(String, &'a Value)>,
) {
    let Some((step, rest)) = path.split_first() else {
        out.push((field, value));
        return;
    };
    match (step, value) {
        (Step::Property(name), Value::Object(map)) => {
            if let Some(v) = map.get(name).filter(|v| !v.is_null()) {
                let f = if field.is_empty() {
                    name.clone()
                } else {
                    format!("{field}.{name}")
                };
                values_at(v, rest, f, out);
            }
        }
        (Step::Items, Value::Array(items)) => {
            for (i, v) in items.iter().enumerate() {
                values_at(v, rest, format!("{field}[{i}]"), out);
            }
        }
        (Step::Values, Value::Object(map)) => {
            for (k, v) in map {
                values_at(v, rest, format!("{field}[{k}]"), out);
            }
        }
        _ => {}
    }
}

/// JSON as CEL sees a Kubernetes object: whole numbers are `int`, as the apiserver's
/// `integer` schema type makes them.
pub fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => cel::Value::Int(i),
            None => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(a) => cel::Value::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(m) => {
            let map: HashMap<String, cel::Value> =
                m.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            cel::Value::from(map)
        }
    }
}

/// The JSON type of `v` as the apiserver names it in messages.
pub fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn evaluate(rule: &Rule, bound: &cel::Value, field: &str, raw: &Value) -> Option<FieldProblem> {
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("self", bound.clone());
    let path = match &rule.field_path {
        Some(fp) => format!("{field}{fp}"),
        None => field.to_owned(),
    };
    let path = if path.is_empty() {
        "(object)".to_owned()
    } else {
        path
    };
    let message = || -> String {
        rule.message_expression
            .as_ref()
            .and_then(|p| match p.execute(&ctx) {
                Ok(cel::Value::String(s)) => Some(s.to_string()),
                _ => None,
            })
            .or_else(|| rule.message.clone())
            .unwrap_or_else(|| format!("failed rule: {}", rule.source))
    };
    match rule.program.execute(&ctx) {
        Ok(cel::Value::Bool(true)) => None,
        Ok(cel::Value::Bool(false)) => {
            let m = message();
            let text = match rule.reason.as_deref() {
                Some("FieldValueRequired") => format!("Required value: {m}"),
                Some("FieldValueForbidden") => format!("Forbidden: {m}"),
                Some("FieldValueDuplicate") => format!("Duplicate value: {m}"),
                _ => format!("Invalid value: \"{}\": {m}", json_type(raw)),
            };
            Some(FieldProblem {
                path,
                message: text,
            })
        }
        // A rule that does not evaluate to a bool, or fails (a key absent without `has()`),
        // is reported the way the apiserver reports it, rather than passed over.
        Ok(other) => Some(FieldProblem {
            path,
            message: format!(
                "Invalid value: \"{}\": rule {:?} evaluated to {other:?}, not a bool",
                json_type(raw),
                rule.source
            ),
        }),
        Err(e) => Some(FieldProblem {
            path,
            message: format!(
                "Invalid value: \"{}\": rule {:?} could not be evaluated: {e}",
                json_type(raw),
                rule.source
            ),
        }),
    }
}

/// Fills in the schema's `default`s where `value` leaves a field out, as the apiserver does
/// before it validates (so rules see what will be stored).
pub fn apply_defaults(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = schema.get("properties") {
                for (name, prop) in props {
                    if !map.contains_key(name)
                        && let Some(d) = prop.get("default")
                    {
                        map.insert(name.clone(), d.clone());
                    }
                    if let Some(v) = map.get_mut(name) {
                        apply_defaults(prop, v);
                    }
                }
            }
            if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
                let named: Vec<String> = schema
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().cloned().collect())
                    .unwrap_or_default();
                for (k, v) in map.iter_mut() {
                    if !named.contains(k) {
                        apply_defaults(values, v);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for v in items {
                    apply_defaults(item_schema, v);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "x-kubernetes-validations": [{"rule": "self.metadata.name.size() <= 5", "message": "name too long"}],
            "properties": {
                "metadata": {"type": "object"},
                "spec": {
                    "type": "object",
                    "properties": {
                        "replicas": {"type": "integer", "default": 1},
                        "budget": {"type": "integer"},
                        "jobs": {"type": "array", "items": {
                            "type": "object",
                            "x-kubernetes-validations": [
                                {"rule": "!has(self.with) || !(self.name in self.with)", "message": "no self reference", "fieldPath": ".with"},
                                {"rule": "self.name == oldSelf.name", "message": "immutable"}
                            ],
                            "properties": {"name": {"type": "string"}, "with": {"type": "array", "items": {"type": "string"}}}
                        }},
                        "maxAge": {"type": "string", "x-kubernetes-validations": [
                            {"rule": "duration(self) >= duration('1m')", "message": "at least 1m"}]}
                    },
                    "x-kubernetes-validations": [{"rule": "!has(self.budget) || self.budget <= self.replicas", "message": "budget above replicas"}]
                }
            }
        })
    }

    fn check(object: Value) -> Vec<FieldProblem> {
        let s = schema();
        let rules = KindRules::collect(&s);
        assert!(rules.unsupported.is_empty(), "{:?}", rules.unsupported);
        assert_eq!(rules.transition, 1);
        let mut object = object;
        apply_defaults(&s, &mut object);
        rules.check(&object)
    }

    #[test]
    fn rules_hold_at_their_node_with_defaults_applied() {
        let ok = json!({"metadata": {"name": "a"}, "spec": {"budget": 1, "jobs": [{"name": "x", "with": ["y"]}], "maxAge": "2h"}});
        assert_eq!(check(ok), vec![]);
        let bad = json!({"metadata": {"name": "abcdef"}, "spec": {"budget": 2, "jobs": [{"name": "x"}, {"name": "y", "with": ["y"]}], "maxAge": "30s"}});
        let problems = check(bad);
        let by_path: Vec<(&str, &str)> = problems
            .iter()
            .map(|p| (p.path.as_str(), p.message.as_str()))
            .collect();
        assert!(
            by_path.contains(&("(object)", "Invalid value: \"object\": name too long")),
            "{by_path:?}"
        );
        assert!(
            by_path.contains(&("spec", "Invalid value: \"object\": budget above replicas")),
            "{by_path:?}"
        );
        assert!(
            by_path.contains(&(
                "spec.jobs[1].with",
                "Invalid value: \"object\": no self reference"
            )),
            "{by_path:?}"
        );
        assert!(
            by_path.contains(&("spec.maxAge", "Invalid value: \"string\": at least 1m")),
            "{by_path:?}"
        );
        assert_eq!(problems.len(), 4, "{by_path:?}");
    }

    #[test]
    fn old_self_is_told_from_longer_names() {
        assert!(mentions_old_self("self.a == oldSelf.a"));
        assert!(!mentions_old_self("self.oldSelfish == 1"));
    }
}
