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

/// The CEL rule, and its message, that refuse at admission a `schedule` that can
/// never open because none of the months it names has a day of the month it names (`0 0 31 2 *`,
/// `0 0 30,31 2 *`, `0 0 31 4,6,9,11 *`). Judged only in the plain form: single numbers or
/// comma lists of them (months also by name) in both fields, a day of the week of `*` or `?`
/// (with a day of the week named, cron opens on either, so the pattern opens every week).
/// Ranges, steps and anything else pass here and are left to the operator, whose calendar
/// reads every pattern and reports one that never opens as `Stalled` `InvalidSpec` (a Bundle's
/// voluntary moves wait meanwhile). 29 February opens in leap years and is accepted. A single bounded regex: the
/// schedule is at most 128 characters, so the apiserver's cost estimate stays small.
pub const NEVER_OPENS_RULE: &str = r"!self.matches('^[ \t]*[0-9*,/-]+[ \t]+[0-9*,/-]+[ \t]+(31(,31)*[ \t]+(0?[2469]|11|[Ff][Ee][Bb]|[Aa][Pp][Rr]|[Jj][Uu][Nn]|[Ss][Ee][Pp]|[Nn][Oo][Vv])(,(0?[2469]|11|[Ff][Ee][Bb]|[Aa][Pp][Rr]|[Jj][Uu][Nn]|[Ss][Ee][Pp]|[Nn][Oo][Vv]))*|3[01](,3[01])*[ \t]+(0?2|[Ff][Ee][Bb])(,(0?2|[Ff][Ee][Bb]))*)[ \t]+[*?][ \t]*$')";
/// See [`NEVER_OPENS_RULE`]. The apiserver puts the field path first, so the message reads
/// `spec.disruption.windows[1].schedule: ...: schedule never opens: ...`.
pub const NEVER_OPENS_MESSAGE: &str = "schedule never opens: none of the months it names has a day of the month it names (such as 31 February or 31 April)";

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
    #[x_kube(validation = Rule::new(NEVER_OPENS_RULE).message(NEVER_OPENS_MESSAGE))]
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

    /// Schedules [`NEVER_OPENS_RULE`] refuses at admission (the e2e test against a real
    /// apiserver and the plugin's offline check hold the rule to this table).
    const REFUSED_AT_ADMISSION: &[&str] = &[
        "0 0 31 2 *",
        "0 0 30,31 2 *",
        "0 0 31 4,6,9,11 *",
        "0 0 31 2,4,6,9,11 *",
        "15 3 31 feb ?",
        "0 0 31 APR,Jun,sep,NOV *",
        "0 0 30 02 *",
        "0,30 */2 31,31 11 *",
    ];

    /// Schedules it lets through: they open, or only the operator's calendar can tell.
    const LEFT_TO_THE_OPERATOR: &[&str] = &[
        "0 0 29 2 *",
        "0 0 31 1-12 *",
        "*/5 * * * *",
        "0 0 31 2 MON",
        "0 0 30,31 2,3 *",
        "0 0 31 1,2 *",
        "0 0 30-31 2 *",
        "0 0 31 */2 *",
        "0 0 31 4-6/2 *",
        "@monthly",
    ];

    #[test]
    fn what_admission_refuses_the_calendar_says_never_opens() {
        use automanager_policy::calendar::{Recurrence, WindowError};
        for s in REFUSED_AT_ADMISSION {
            assert!(
                matches!(
                    Recurrence::parse(s, "1h", "UTC"),
                    Err(WindowError::NeverMatches { .. })
                ),
                "{s}: admission refuses it, so the calendar must say it never opens"
            );
        }
        // What passes admission is read by the calendar: these open, or (ranges and steps the
        // rule does not judge) the operator holds the moves and says why.
        let opens = |s: &str| Recurrence::parse(s, "1h", "UTC").is_ok();
        for s in ["0 0 29 2 *", "0 0 31 1-12 *", "*/5 * * * *", "0 0 31 2 MON"] {
            assert!(opens(s), "{s} opens");
        }
        for s in ["0 0 30-31 2 *", "0 0 31 4-6/2 *"] {
            assert!(
                matches!(
                    Recurrence::parse(s, "1h", "UTC"),
                    Err(WindowError::NeverMatches { .. })
                ),
                "{s}: never opens; the operator says so"
            );
        }
        assert_eq!(
            LEFT_TO_THE_OPERATOR
                .iter()
                .filter(|s| REFUSED_AT_ADMISSION.contains(s))
                .count(),
            0
        );
    }

    #[test]
    fn every_schedule_carries_the_never_opens_rule() {
        use kube::CustomResourceExt;
        for crd in [crate::Bundle::crd(), crate::HotSpareTarget::crd()] {
            let json = serde_json::to_string(&crd).unwrap();
            let rule = serde_json::to_string(NEVER_OPENS_RULE).unwrap();
            assert_eq!(
                json.matches(&rule).count(),
                1,
                "{}: one schedule field, one rule",
                crd.spec.names.kind
            );
        }
    }
}
