//! `spec.jobs[].config`: a job's runtime configuration, kept as the JSON text the apiserver holds.
//!
//! Why raw text and not a `serde_json::Value`: serde_json refuses input nested deeper than 128
//! levels while it builds values, and a watch decodes a whole object (a list: every object) at
//! once. One Bundle with a deeply nested config would make every list of Bundles undecodable and
//! stop the Bundle controller for everyone. A raw value is skipped over without recursion, so the
//! object always decodes; the operator then measures the depth ([`JobConfig::depth`]) and answers
//! a config deeper than [`MAX_JOB_CONFIG_DEPTH`] in the Bundle's status.
//!
//! The apiserver's managedFields must not mirror the nesting either (they are decoded with the
//! object): `jobs` is an atomic list, and the field is also marked `x-kubernetes-map-type: atomic`
//! so that server-side apply tracks a config as one value even if `jobs` becomes a keyed list.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// Deepest nesting of objects and arrays a job configuration may have (the top-level object is
/// level 1). Well under serde_json's 128, so every accepted config also parses as a value.
pub const MAX_JOB_CONFIG_DEPTH: usize = 64;

/// A job's runtime configuration: a JSON object, opaque to AutoManager.
#[derive(Clone)]
pub struct JobConfig(Box<RawValue>);

impl JobConfig {
    /// The configuration of a JSON value (for builders and tests).
    pub fn from_value(value: &serde_json::Value) -> Self {
        // A `Value` always serializes; the fallback keeps this total.
        JobConfig(
            serde_json::value::to_raw_value(value)
                .unwrap_or_else(|_| RawValue::from_string("{}".to_owned()).expect("valid JSON")),
        )
    }

    /// The configuration as JSON text, exactly as it was decoded.
    pub fn as_json(&self) -> &str {
        self.0.get()
    }

    /// How deeply objects and arrays nest (`{}` is 1, `{"a":[1]}` is 2, a scalar 0). A scan of
    /// the text that skips strings, so any depth is measured without recursion.
    pub fn depth(&self) -> usize {
        json_depth(self.as_json())
    }
}

/// The nesting depth of valid JSON text; see [`JobConfig::depth`].
fn json_depth(json: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in json.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

impl PartialEq for JobConfig {
    fn eq(&self, other: &Self) -> bool {
        self.as_json() == other.as_json()
    }
}

impl Eq for JobConfig {}

impl fmt::Debug for JobConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("JobConfig").field(&self.as_json()).finish()
    }
}

impl<'de> Deserialize<'de> for JobConfig {
    /// From serde_json (a slice, a string or a `Value`) only: other formats are read into a
    /// `serde_json::Value` first, as the operator's YAML inputs are.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(JobConfig)
    }
}

impl Serialize for JobConfig {
    /// As a value where it parses as one, so every format writes plain JSON data; a config too
    /// deep for that is written raw, which serde_json's writers copy as is.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match serde_json::from_str::<serde_json::Value>(self.as_json()) {
            Ok(value) => value.serialize(serializer),
            Err(_) => self.0.serialize(serializer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn depth_counts_objects_and_arrays_and_skips_strings() {
        for (text, depth) in [
            ("1", 0),
            ("{}", 1),
            (r#"{"a":[1,{"b":2}]}"#, 3),
            (r#"{"a":"{[{[\"]"}"#, 1),
            (r#"{"a":"\\","b":{}}"#, 2),
        ] {
            assert_eq!(json_depth(text), depth, "{text}");
        }
    }

    #[test]
    fn a_bundle_job_with_a_config_nested_past_serde_jsons_limit_still_decodes() {
        // 300 levels inside an object that is itself inside a few more, as in a watch event.
        let text = format!(
            r#"{{"type":"ADDED","object":{{"spec":{{"jobs":[{{"config":{{"a":{}}}}}]}}}}}}"#,
            nested(300)
        );
        #[derive(Deserialize)]
        struct Job {
            config: JobConfig,
        }
        #[derive(Deserialize)]
        struct Spec {
            jobs: Vec<Job>,
        }
        #[derive(Deserialize)]
        struct Obj {
            spec: Spec,
        }
        #[derive(Deserialize)]
        struct Event {
            object: Obj,
        }
        let event: Event = serde_json::from_str(&text).expect("decodes");
        let config = &event.object.spec.jobs[0].config;
        assert_eq!(config.depth(), 301);
        // Written back, it is the same text.
        assert_eq!(
            serde_json::to_string(config).expect("serializes"),
            config.as_json()
        );
        // The plain value decoder refuses the same text: what the raw value avoids.
        assert!(serde_json::from_str::<serde_json::Value>(&text).is_err());
    }

    #[test]
    fn decodes_from_a_value_and_compares_by_text() {
        let value = json!({"bitrate": 8000, "codec": {"name": "h264"}});
        let a: JobConfig = serde_json::from_value(value.clone()).expect("from a value");
        assert_eq!(a, JobConfig::from_value(&value));
        assert_eq!(a.depth(), 2);
        assert_eq!(serde_json::to_value(&a).expect("to a value"), value);
        assert_ne!(a, JobConfig::from_value(&json!({"bitrate": 8001})));
    }
}
