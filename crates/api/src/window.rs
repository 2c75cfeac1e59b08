//! Time in the API: disruption windows (when voluntary moves may happen) and the recurrence they
//! share with spare schedules, a cron pattern in a time zone held open for a duration.
//!
//! The schema checks the shape (five fields or a `@daily`-style nickname, a Go duration between
//! 1m and 744h, a time-zone-shaped name, unique reasons); the operator parses each with the pure
//! calendar (`automanager_policy::calendar`) and reports what the schema cannot see (an unknown
//! zone, `0 0 31 2 *`) on the object's conditions.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

pub use automanager_policy::vocab::VoluntaryReason;

fn utc() -> String {
    "UTC".to_owned()
}

fn is_utc(s: &str) -> bool {
    s == "UTC"
}

/// The CEL rule every `schedule` field carries.
pub const SCHEDULE_RULE: &str = "self.matches('^\\\\s*(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[^\\\\s]+\\\\s+[^\\\\s]+\\\\s+[^\\\\s]+\\\\s+[^\\\\s]+\\\\s+[^\\\\s]+)\\\\s*$')";

/// The CEL rule, and its message, of every window `duration`: a Go duration from 1m to 744h.
pub const WINDOW_DURATION_RULE: &str = "self.matches('^([0-9]+(\\\\.[0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('1m') && duration(self) <= duration('744h')";
/// See [`WINDOW_DURATION_RULE`].
pub const WINDOW_DURATION_MESSAGE: &str =
    "duration must be between 1m and 744h, such as 2h or 5h30m";

/// The CEL rule, and its message, of every `timeZone`: the shape of an IANA name (the operator
/// checks the name itself).
pub const TIME_ZONE_RULE: &str = "self.matches('^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$')";
/// See [`TIME_ZONE_RULE`].
pub const TIME_ZONE_MESSAGE: &str =
    "timeZone must be an IANA time zone name such as Europe/Oslo or UTC";

/// When voluntary moves of a bundle may happen: from each time `schedule` matches, in
/// `timeZone`, for `duration`. Outside every window naming a reason, moves for that reason wait
/// (the Bundle's `DisruptionWindow` condition says until when); recovery from a failure is never
/// held.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionWindow {
    /// A five-field cron pattern (minute hour day-of-month month day-of-week, e.g.
    /// `0 2 * * SAT`) or `@daily`, `@weekly`, ... A start in a spring-forward gap happens at the
    /// first minute after it; a start in a repeated hour happens once.
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new(SCHEDULE_RULE).message("schedule must be a five-field cron pattern such as '0 2 * * SAT', or @daily, @weekly, @monthly"))]
    pub schedule: String,
    /// How long each window lasts (elapsed time, a Go duration such as `2h` or `5h30m`), 1m to
    /// 744h.
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new(WINDOW_DURATION_RULE).message(WINDOW_DURATION_MESSAGE))]
    pub duration: String,
    /// The IANA time zone the pattern is read in, e.g. `Europe/Oslo`. Default `UTC`.
    #[serde(default = "utc", skip_serializing_if = "is_utc")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new(TIME_ZONE_RULE).message(TIME_ZONE_MESSAGE))]
    pub time_zone: String,
    /// The voluntary reasons this window admits: `drain`, `consolidation`, `rebalance`,
    /// `spareRotation`. Empty: all of them. A reason no window names is not held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    #[x_kube(validation = Rule::new("self.all(r, self.filter(q, q == r).size() == 1)").message("reasons must be unique"))]
    pub reasons: Vec<VoluntaryReason>,
}

impl DisruptionWindow {
    /// The window as the calendar reads it.
    pub fn to_policy(
        &self,
    ) -> Result<automanager_policy::calendar::Window, automanager_policy::calendar::WindowError>
    {
        automanager_policy::calendar::Window::parse(
            &self.schedule,
            &self.duration,
            &self.time_zone,
            &self.reasons,
        )
    }
}

/// A calendar from a list of windows; the first that cannot be read is the error.
pub fn calendar(
    windows: &[DisruptionWindow],
) -> Result<automanager_policy::calendar::Calendar, automanager_policy::calendar::WindowError> {
    windows
        .iter()
        .map(DisruptionWindow::to_policy)
        .collect::<Result<Vec<_>, _>>()
        .map(automanager_policy::calendar::Calendar::new)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_window_reads_as_the_calendar_does_and_defaults_to_utc() {
        let w: DisruptionWindow = serde_json::from_str(
            r#"{"schedule":"0 2 * * SAT","duration":"2h","reasons":["consolidation"]}"#,
        )
        .unwrap();
        assert_eq!(w.time_zone, "UTC");
        let cal = calendar(std::slice::from_ref(&w)).unwrap();
        assert_eq!(cal.windows().len(), 1);
        let bad = DisruptionWindow {
            time_zone: "Mars/Olympus".into(),
            ..w
        };
        assert!(calendar(&[bad]).unwrap_err().to_string().contains("IANA"));
    }
}
