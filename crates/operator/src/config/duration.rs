//! Durations in the settings: a number of seconds (`60`, `0.5`, as the TypeScript library
//! `@norskvideo/norsk-auto-manager` writes `pendingWindow: 60`), or a string with units that
//! humantime reads (`"500ms"`, `"90s"`, `"1m30s"`, `"1h"`, `"1d"`).
//!
//! In the schema a duration is a number or a string, marked with the `x-duration` keyword that
//! carries its range; the validator parses and range-checks it with [`check`].

use std::time::Duration;

use schemars::{Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serializer};
use serde_json::Value;

/// Longest duration read at all (each key has its own, smaller range): ten years.
const LONGEST: Duration = Duration::from_secs(10 * 365 * 86_400);

const FORMS: &str = "seconds (60, 0.5) or a number with a unit (500ms, 90s, 1m30s, 1h, 1d)";

/// A duration string: `"60"` and `"0.5"` are seconds; anything else goes to humantime.
pub fn parse_duration_str(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let shown: String = t.chars().take(32).collect();
    if t.is_empty() {
        return Err(format!("must be a duration: {FORMS}, not an empty string"));
    }
    if t.starts_with('-') {
        return Err("must not be negative".to_owned());
    }
    let parsed = if t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        t.parse::<f64>()
            .map_err(|_| format!("must be a duration: {FORMS}, not `{shown}`"))
            .and_then(seconds)?
    } else {
        humantime::parse_duration(t).map_err(|e| match e {
            humantime::DurationError::NumberOverflow => format!("`{shown}` is too long"),
            _ => format!("must be a duration: {FORMS}, not `{shown}`"),
        })?
    };
    if parsed > LONGEST {
        return Err(format!("`{shown}` is too long"));
    }
    Ok(parsed)
}

/// Seconds given as a number, to the millisecond.
fn seconds(f: f64) -> Result<Duration, String> {
    if f < 0.0 {
        Err("must not be negative".to_owned())
    } else if !f.is_finite() || f > LONGEST.as_secs_f64() {
        Err(format!("{f} seconds is too long"))
    } else {
        Ok(Duration::from_millis((f * 1000.0).round() as u64))
    }
}

/// A duration as written in the (YAML-parsed) settings.
pub(crate) fn from_value(v: &Value) -> Result<Duration, String> {
    match v {
        Value::Number(n) => match (n.as_u64(), n.as_f64()) {
            (Some(u), _) if u > LONGEST.as_secs() => Err(format!("{u} seconds is too long")),
            (Some(u), _) => Ok(Duration::from_secs(u)),
            (None, Some(f)) => seconds(f),
            (None, None) => Err(format!("must be a duration: {FORMS}, not {n}")),
        },
        Value::String(s) => parse_duration_str(s),
        other => Err(format!(
            "must be a duration: {FORMS}, not {}",
            super::schema::kind(other)
        )),
    }
}

/// How durations are written back (and shown as defaults): humantime's spelling, `1m 30s`.
pub(crate) fn format(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// `1s`, `86400s` or `250ms`: the spelling of ranges in error messages.
pub(crate) fn show(d: Duration) -> String {
    let ms = d.as_millis();
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{ms}ms")
    } else {
        format(d)
    }
}

pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(*d))
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    from_value(&Value::deserialize(d)?).map_err(serde::de::Error::custom)
}

/// `Option<Duration>` fields.
pub(crate) mod option {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::deserialize(d).map(Some)
    }
}

/// The schema of every duration; the field adds its range with
/// `extend("x-duration" = {"min": .., "max": .., "wholeSeconds": ..})`.
pub(crate) fn schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": ["number", "string"],
        "minimum": 0,
        "pattern": r"^\s*(\d+(\.\d+)?\s*[a-zA-Zµ]*\s*)+$",
        "x-duration": {}
    })
}

/// The range a duration field declares in its `x-duration` keyword.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Range {
    pub min: Option<Duration>,
    pub max: Option<Duration>,
    /// For Lease fields, which Kubernetes stores in whole seconds.
    pub whole_seconds: bool,
}

impl Range {
    /// Reads `{"min": "1s", "max": "1d", "wholeSeconds": true}`.
    pub(crate) fn from_keyword(v: &Value) -> Result<Range, String> {
        let bound = |key: &str| match v.get(key) {
            None => Ok(None),
            Some(b) => from_value(b)
                .map(Some)
                .map_err(|m| format!("x-duration {key}: {m}")),
        };
        Ok(Range {
            min: bound("min")?,
            max: bound("max")?,
            whole_seconds: v.get("wholeSeconds").and_then(Value::as_bool) == Some(true),
        })
    }

    /// Parses `v` and checks it against the range.
    pub(crate) fn check(&self, v: &Value) -> Result<Duration, String> {
        let d = from_value(v)?;
        if self.whole_seconds && d.subsec_nanos() != 0 {
            return Err(format!("must be whole seconds (got {})", show(d)));
        }
        let min = self.min.unwrap_or(Duration::ZERO);
        let max = self.max.unwrap_or(LONGEST);
        if d < min || d > max {
            return Err(format!(
                "must be between {} and {} (got {})",
                show(min),
                show(max),
                show(d)
            ));
        }
        Ok(d)
    }

    /// `1s to 1d` for the reference tables.
    pub(crate) fn describe(&self) -> String {
        let min = self.min.unwrap_or(Duration::ZERO);
        let mut s = match self.max {
            Some(max) => format!("{} to {}", format(min), format(max)),
            None => format!("at least {}", format(min)),
        };
        if self.whole_seconds {
            s.push_str(", whole seconds");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn strings_are_seconds_or_humantime() {
        let ok = |s: &str| parse_duration_str(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(ok("60"), Duration::from_secs(60));
        assert_eq!(ok("0.5"), Duration::from_millis(500));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("90s"), Duration::from_secs(90));
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("1m 30s"), Duration::from_secs(90));
        assert_eq!(ok("1h"), Duration::from_secs(3_600));
        assert_eq!(ok("1d"), Duration::from_secs(86_400));
        assert_eq!(ok(" 2s "), Duration::from_secs(2));
        assert_eq!(ok("1.5s"), Duration::from_millis(1_500));
        for bad in ["", "60x", "s", "1..5", "5 5", "abc"] {
            let e = parse_duration_str(bad).err().unwrap_or_default();
            assert!(e.contains("must be a duration"), "{bad}: {e}");
        }
        assert_eq!(
            parse_duration_str("-5s").err().as_deref(),
            Some("must not be negative")
        );
        for long in ["99999999999999999999999h", "11y", "999999999999"] {
            let e = parse_duration_str(long).err().unwrap_or_default();
            assert!(e.contains("too long"), "{long}: {e}");
        }
    }

    #[test]
    fn numbers_are_seconds_to_the_millisecond() {
        let v = |j: Value| from_value(&j);
        assert_eq!(v(serde_json::json!(60)), Ok(Duration::from_secs(60)));
        assert_eq!(v(serde_json::json!(0.25)), Ok(Duration::from_millis(250)));
        assert_eq!(v(serde_json::json!(0.0004)), Ok(Duration::ZERO));
        assert_eq!(v(serde_json::json!(-1)), Err("must not be negative".into()));
        assert!(v(serde_json::json!(u64::MAX)).is_err_and(|e| e.contains("too long")));
        assert!(v(serde_json::json!(1e27)).is_err_and(|e| e.contains("too long")));
        assert!(v(serde_json::json!(true)).is_err_and(|e| e.contains("not a boolean")));
    }

    #[test]
    fn ranges_bound_and_may_ask_for_whole_seconds() {
        let r = Range::from_keyword(&serde_json::json!({"min": "1s", "max": "1d"}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            r.check(&serde_json::json!(0)),
            Err("must be between 1s and 86400s (got 0s)".into())
        );
        assert_eq!(r.describe(), "1s to 1day");
        let w = Range::from_keyword(&serde_json::json!({"min": 3, "wholeSeconds": true}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            w.check(&serde_json::json!("1500ms"))
                .is_err_and(|e| e.contains("whole seconds"))
        );
        assert!(Range::from_keyword(&serde_json::json!({"min": "soon"})).is_err());
    }

    proptest! {
        #[test]
        fn any_string_parses_within_bounds_or_explains(s in "[0-9a-z.\\- ]{0,24}") {
            match parse_duration_str(&s) {
                Ok(d) => prop_assert!(d <= LONGEST),
                Err(m) => prop_assert!(!m.is_empty()),
            }
        }

        #[test]
        fn what_is_written_back_reads_the_same(ms in 0u64..10_000_000_000) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(parse_duration_str(&format(d)), Ok(d));
        }
    }
}
