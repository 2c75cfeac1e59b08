//! Input checks shared by every command: one place that says what a
//! well-formed id, name, tag map or JSON payload is.

use std::collections::HashMap;

use crate::world::CommandError;

/// Longest id (node, job, bundle, migration) or free-form string accepted.
pub const MAX_ID_BYTES: usize = 253;
/// Longest job name.
pub const MAX_JOB_NAME_BYTES: usize = 63;
/// Largest JSON payload (config, migration state), as on the job socket.
pub const MAX_JSON_BYTES: usize = 64 * 1024;
/// Largest job template (an encoded published job definition) a bundle job may carry.
pub const MAX_TEMPLATE_BYTES: usize = 256 * 1024;
/// Most tags on a node or labels on a bundle.
pub const MAX_TAGS: usize = 32;
/// Longest tag / label key.
pub const MAX_TAG_KEY_BYTES: usize = 63;
/// Longest free-text reason.
pub const MAX_REASON_BYTES: usize = 1024;
/// Most replicas of a bundle.
pub const MAX_REPLICAS: u32 = 64;
/// Most jobs in one replica of a bundle.
pub const MAX_JOBS_PER_BUNDLE: usize = 64;
/// Most required capabilities of a job.
pub const MAX_CAPABILITIES: usize = 64;

fn invalid(msg: String) -> CommandError {
    CommandError::InvalidArgument(msg)
}

/// Shortens a peer-supplied string for inclusion in an error message.
pub fn excerpt(s: &str) -> String {
    const KEEP: usize = 64;
    if s.len() <= KEEP {
        return s.to_owned();
    }
    let mut end = KEEP;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

/// A non-empty printable string of at most [`MAX_ID_BYTES`].
pub fn id(field: &str, value: &str) -> Result<(), CommandError> {
    if value.is_empty() {
        return Err(invalid(format!("{field} must not be empty")));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(invalid(format!(
            "{field} is {} bytes, at most {MAX_ID_BYTES} allowed",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{field} {:?} contains control characters",
            excerpt(value)
        )));
    }
    Ok(())
}

/// A name made of `[A-Za-z0-9._-]` (so it can be a job id segment).
pub fn name(field: &str, value: &str, max: usize) -> Result<(), CommandError> {
    if value.is_empty() {
        return Err(invalid(format!("{field} must not be empty")));
    }
    if value.len() > max {
        return Err(invalid(format!(
            "{field} is {} bytes, at most {max} allowed",
            value.len()
        )));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(invalid(format!(
            "{field} {:?} may only contain letters, digits, '.', '_' and '-'",
            excerpt(value)
        )));
    }
    Ok(())
}

/// Tags or labels: bounded count, key and value sizes.
pub fn tags(field: &str, map: &HashMap<String, String>) -> Result<(), CommandError> {
    if map.len() > MAX_TAGS {
        return Err(invalid(format!(
            "{field} has {} entries, at most {MAX_TAGS} allowed",
            map.len()
        )));
    }
    for (k, v) in map {
        name(&format!("{field} key"), k, MAX_TAG_KEY_BYTES)?;
        if v.len() > MAX_ID_BYTES {
            return Err(invalid(format!(
                "{field} value for {k:?} is {} bytes, at most {MAX_ID_BYTES} allowed",
                v.len()
            )));
        }
    }
    Ok(())
}

/// Empty, or UTF-8 JSON of at most [`MAX_JSON_BYTES`].
pub fn json(field: &str, bytes: &[u8]) -> Result<(), CommandError> {
    if bytes.is_empty() {
        return Ok(());
    }
    if bytes.len() > MAX_JSON_BYTES {
        return Err(invalid(format!(
            "{field} is {} bytes, at most {MAX_JSON_BYTES} allowed",
            bytes.len()
        )));
    }
    serde_json::from_slice::<serde_json::Value>(bytes)
        .map(|_| ())
        .map_err(|e| invalid(format!("{field} is not UTF-8 JSON: {e}")))
}

/// Free text of bounded size.
pub fn reason(field: &str, value: &str) -> Result<(), CommandError> {
    if value.len() > MAX_REASON_BYTES {
        return Err(invalid(format!(
            "{field} is {} bytes, at most {MAX_REASON_BYTES} allowed",
            value.len()
        )));
    }
    Ok(())
}

/// A finite, non-negative quantity (capacity).
pub fn non_negative(field: &str, value: f64) -> Result<(), CommandError> {
    if !value.is_finite() || value < 0.0 {
        return Err(invalid(format!(
            "{field} must be a finite number >= 0, got {value}"
        )));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn empty_ids_are_invalid() {
        assert!(id("node_id", "").is_err());
    }

    #[test]
    fn huge_ids_are_invalid_and_the_message_is_short() {
        let big = "x".repeat(100_000);
        let Err(CommandError::InvalidArgument(msg)) = id("node_id", &big) else {
            panic!("expected InvalidArgument");
        };
        assert!(msg.len() < 200, "{msg}");
    }

    #[test]
    fn names_refuse_slashes_so_job_ids_stay_unambiguous() {
        assert!(name("bundle_id", "a/b", MAX_ID_BYTES).is_err());
        assert!(name("bundle_id", "a.b_c-9", MAX_ID_BYTES).is_ok());
    }

    #[test]
    fn negative_and_nan_capacity_are_invalid() {
        assert!(non_negative("c", -1.0).is_err());
        assert!(non_negative("c", f64::NAN).is_err());
        assert!(non_negative("c", f64::INFINITY).is_err());
        assert!(non_negative("c", 0.0).is_ok());
    }

    #[test]
    fn json_must_parse_and_fit() {
        assert!(json("config", b"").is_ok());
        assert!(json("config", b"{\"a\":1}").is_ok());
        assert!(json("config", b"{nope").is_err());
        assert!(json("config", &vec![b' '; MAX_JSON_BYTES + 1]).is_err());
        // deeply nested input is refused by serde_json's recursion limit, not a stack overflow
        let deep = "[".repeat(10_000);
        assert!(json("config", deep.as_bytes()).is_err());
    }

    #[test]
    fn excerpt_respects_char_boundaries() {
        let s = "é".repeat(100);
        assert!(excerpt(&s).contains("bytes"));
    }
}
