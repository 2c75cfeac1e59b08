//! What can go wrong, and the exit code each failure gives.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done (for `validate`: every object is valid; for `--wait`: the change finished well) |
//! | 1 | the answer is "no": invalid objects, a migration that ended Aborted / Failed, an admission that does not fit, a request the apiserver refused, a missing object, an unreachable operator or apiserver |
//! | 2 | the command line itself is wrong (clap's usage errors) |
//! | 3 | `--wait` timed out; the change may still finish |

use std::path::PathBuf;
use std::time::Duration;

/// Exit code: the answer is "no", or something failed.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code: `--wait` gave up before the change finished.
pub const EXIT_TIMEOUT: u8 = 3;

/// Every failure of the plugin, each with the message a person needs to act on.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file is larger than the plugin reads.
    #[error("{path} is larger than {max} bytes; split it into smaller files")]
    TooLarge { path: PathBuf, max: u64 },
    /// A file is not YAML or JSON, or holds something that is not an object.
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// The input holds nothing the command can use.
    #[error("{0}")]
    Input(String),
    /// The kubeconfig could not be loaded.
    #[error("cannot load the kubeconfig: {0}")]
    Kubeconfig(String),
    /// The apiserver answered with an error.
    #[error("{0}")]
    Api(String),
    /// The apiserver could not be reached, or did not answer in time.
    #[error("cannot reach the apiserver at {target}: {cause}")]
    ApiUnreachable {
        target: crate::connect::Target,
        cause: String,
    },
    /// The apiserver did not accept the credentials (401), or they could not be obtained (a
    /// failing credential plugin).
    #[error("the apiserver at {target} did not accept the credentials: {cause}")]
    ApiUnauthorized {
        target: crate::connect::Target,
        cause: String,
    },
    /// The named object does not exist.
    #[error("{kind} {name} not found{hint}")]
    NotFound {
        kind: &'static str,
        name: String,
        hint: String,
    },
    /// The operator's debugging endpoint could not be reached.
    #[error("cannot reach the operator {via}: {reason}\n{hint}")]
    OperatorUnreachable {
        via: String,
        reason: String,
        hint: String,
    },
    /// The operator answered with an error.
    #[error("the operator answered {status}: {message}")]
    Operator { status: u16, message: String },
    /// The answer is "no" (invalid objects, no capacity, a failed migration); details were printed.
    #[error("{0}")]
    Refused(String),
    /// `--wait` gave up.
    #[error("timed out after {} waiting for {what}{}", humantime(*after), last.as_deref().map(|l| format!(" (last seen: {l})")).unwrap_or_default())]
    Timeout {
        what: String,
        after: Duration,
        last: Option<String>,
    },
    /// Output could not be written or rendered.
    #[error("writing output: {0}")]
    Output(String),
    /// Standard output was closed by its reader (`| head`): nothing more to say.
    #[error("standard output was closed")]
    OutputClosed,
}

impl CliError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Timeout { .. } => EXIT_TIMEOUT,
            _ => EXIT_FAILURE,
        }
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            CliError::OutputClosed
        } else {
            CliError::Output(e.to_string())
        }
    }
}

/// `1m30s`, `45s`, `250ms`: a duration as a person writes it.
pub fn humantime(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

/// Parses `30s`, `5m`, `1h30m`, `500ms` or a plain number of seconds (for `--timeout`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| format!("`{text}` lacks a unit (ms, s, m or h)"))?;
        if digits == 0 {
            return Err(format!(
                "`{text}` is not a duration such as 30s, 5m or 1h30m"
            ));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("`{text}` has a number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            other => {
                return Err(format!(
                    "`{text}` has unknown unit `{other}` (use ms, s, m or h)"
                ));
            }
        };
        total = total.saturating_add(part);
        rest = &rest[unit_len..];
    }
    if total > Duration::from_secs(7 * 24 * 3600) {
        return Err(format!("`{text}` is longer than a week"));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_people_write_them() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("1000h").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
    }

    #[test]
    fn durations_print_as_people_read_them() {
        assert_eq!(humantime(Duration::from_millis(250)), "250ms");
        assert_eq!(humantime(Duration::from_secs(90)), "1m30s");
        assert_eq!(humantime(Duration::from_secs(3600)), "1h");
        assert_eq!(humantime(Duration::from_secs(0)), "0ms");
    }

    #[test]
    fn a_timeout_exits_with_its_own_code() {
        let e = CliError::Timeout {
            what: "migration default/m".into(),
            after: Duration::from_secs(5),
            last: Some("phase TargetReady".into()),
        };
        assert_eq!(e.exit_code(), EXIT_TIMEOUT);
        assert_eq!(
            e.to_string(),
            "timed out after 5s waiting for migration default/m (last seen: phase TargetReady)"
        );
        assert_eq!(CliError::Refused("no".into()).exit_code(), EXIT_FAILURE);
    }
}
