//! The window calendar: when voluntary moves may happen, and when time-scoped spare tiers apply.
//!
//! A [`Recurrence`] is a cron pattern (five fields: minute hour day-of-month month day-of-week),
//! an IANA time zone and a duration: it is open from each time the pattern matches, in that
//! zone's wall clock, for the duration of real (elapsed) time. A [`Window`] is a recurrence and
//! the [`VoluntaryReason`]s it admits; a [`Calendar`] is a bundle's (or a band's) windows.
//!
//! The rules:
//!
//! - **A reason no window names is never held.** A calendar only restricts the reasons its
//!   windows list (a window listing none admits every reason), so declaring a window for
//!   consolidation leaves drains alone. An empty calendar holds nothing.
//! - **Outside every window that names the reason, the move waits**, and the answer says until
//!   when ([`Permit::Held`]): the next opening of any such window.
//! - **Recovery is never held.** It is not a [`VoluntaryReason`]: the type cannot ask.
//! - **Daylight saving.** Starts follow the `croner` crate (the Open Cron Pattern Specification,
//!   as Vixie cron): a start that falls in a spring-forward gap happens at the first minute after
//!   the gap on that day; a start in a repeated fall-back hour happens once, at its first
//!   occurrence. The duration is elapsed time, so a window across a change is as long as on any
//!   other day, and its wall-clock end moves by the change.
//! - **Overlapping windows join**: a move admitted now is admitted until the union of the open
//!   windows closes ([`Permit::Open::until`], looked ahead over a bounded number of openings).
//!
//! Pure: time is an argument; no clock, no I/O.

use std::collections::BTreeSet;
use std::str::FromStr;

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use crate::spares::{SpareSpecError, parse_max_age};
use crate::vocab::VoluntaryReason;

/// The shortest window.
pub const MIN_DURATION: TimeDelta = TimeDelta::minutes(1);

/// The longest window (a month of 31 days): longer is a calendar that holds nothing.
pub const MAX_DURATION: TimeDelta = TimeDelta::days(31);

/// The longest cron pattern accepted.
pub const MAX_SCHEDULE_LEN: usize = 128;

/// How far ahead a pattern must match at least once (a `29 2` pattern matches every four years,
/// plus a leap year skipped around a century).
const MATCH_HORIZON: TimeDelta = TimeDelta::days(366 * 9);

/// How many consecutive openings [`Calendar::permit`] follows to find where joined windows close.
const JOIN_LOOKAHEAD: usize = 64;

/// A window or schedule the calendar cannot work with; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("schedule {schedule:?} is not a five-field cron pattern: {problem}")]
    Schedule { schedule: String, problem: String },
    #[error("schedule {schedule:?} never matches a date (within nine years)")]
    NeverMatches { schedule: String },
    #[error("timeZone {0:?} is not an IANA time zone name such as Europe/Oslo or UTC")]
    TimeZone(String),
    #[error("duration `{value}` {problem}")]
    Duration { value: String, problem: String },
}

/// A cron pattern in a time zone, open for a duration from each match.
#[derive(Debug, Clone)]
pub struct Recurrence {
    schedule: String,
    cron: Cron,
    tz: Tz,
    duration: TimeDelta,
}

impl PartialEq for Recurrence {
    fn eq(&self, other: &Self) -> bool {
        self.schedule == other.schedule && self.tz == other.tz && self.duration == other.duration
    }
}

/// One opening of a recurrence: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Opening {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

impl Recurrence {
    /// Parses a pattern, a duration (`90m`, `5h30m`: Go's duration syntax, 1m to 31 days) and
    /// an IANA zone name. `@daily`-style nicknames are accepted; seconds and years are not.
    pub fn parse(schedule: &str, duration: &str, time_zone: &str) -> Result<Self, WindowError> {
        let schedule_err = |problem: String| WindowError::Schedule {
            schedule: schedule.chars().take(MAX_SCHEDULE_LEN).collect(),
            problem,
        };
        if schedule.len() > MAX_SCHEDULE_LEN {
            return Err(schedule_err(format!(
                "longer than {MAX_SCHEDULE_LEN} characters"
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(schedule)
            .map_err(|e| schedule_err(e.to_string()))?;
        let tz = Tz::from_str(time_zone).map_err(|_| {
            WindowError::TimeZone(time_zone.chars().take(MAX_SCHEDULE_LEN).collect())
        })?;
        let duration = parse_duration(duration)?;
        let r = Recurrence {
            schedule: schedule.to_owned(),
            cron,
            tz,
            duration,
        };
        // A pattern such as `0 0 31 2 *` parses but never opens: refuse it rather than hold
        // moves forever. Days no month has are told from the fields at once; searching years
        // for a match that never comes took a tenth of a second per pattern.
        if no_day_matches(&r.schedule) {
            return Err(WindowError::NeverMatches {
                schedule: r.schedule,
            });
        }
        // The probe starts at a fixed date so the answer does not depend on now.
        let probe = DateTime::<Utc>::from_timestamp(946_684_800, 0).unwrap_or_default();
        match r.next_start(probe, true) {
            Some(s) if s - probe <= MATCH_HORIZON => Ok(r),
            _ => Err(WindowError::NeverMatches {
                schedule: r.schedule,
            }),
        }
    }

    /// The pattern as written.
    pub fn schedule(&self) -> &str {
        &self.schedule
    }

    /// The time zone.
    pub fn time_zone(&self) -> Tz {
        self.tz
    }

    /// How long each opening lasts.
    pub fn duration(&self) -> TimeDelta {
        self.duration
    }

    /// The first start at or after `t` (`inclusive`) or strictly after it.
    pub fn next_start(&self, t: DateTime<Utc>, inclusive: bool) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), inclusive)
            .ok()
            .map(|s| s.with_timezone(&Utc))
    }

    /// The opening that contains `t` and started last, if `t` is inside one.
    pub fn open_at(&self, t: DateTime<Utc>) -> Option<Opening> {
        // Inside iff some start lies in (t - duration, t].
        let first = self.next_start(t - self.duration, false)?;
        if first > t {
            return None;
        }
        let last = self
            .cron
            .find_previous_occurrence(&t.with_timezone(&self.tz), true)
            .ok()
            .map(|s| s.with_timezone(&Utc))
            .filter(|s| *s >= first && *s <= t)
            .unwrap_or(first);
        Some(Opening {
            start: last,
            end: last + self.duration,
        })
    }

    /// The next opening that starts strictly after `t`.
    pub fn next_opening(&self, t: DateTime<Utc>) -> Option<Opening> {
        self.next_start(t, false).map(|start| Opening {
            start,
            end: start + self.duration,
        })
    }

    /// Whether the recurrence counts as active at `t` when it is applied `lead` early: from
    /// `lead` before each start to the end of that opening (a spare schedule is applied ahead
    /// by the pool's start latency so its spares run when the window opens; it ends on time).
    pub fn active_with_lead(&self, t: DateTime<Utc>, lead: TimeDelta) -> bool {
        // t in [s - lead, s + duration) <=> s in (t - duration, t + lead].
        self.next_start(t - self.duration, false)
            .is_some_and(|s| s <= t + lead.max(TimeDelta::zero()))
    }

    /// The next time after `t` at which [`Recurrence::active_with_lead`] may change.
    pub fn next_change_with_lead(
        &self,
        t: DateTime<Utc>,
        lead: TimeDelta,
    ) -> Option<DateTime<Utc>> {
        let lead = lead.max(TimeDelta::zero());
        let opens = self.next_start(t + lead, false).map(|s| s - lead);
        let closes = self
            .next_start(t - self.duration, false)
            .map(|s| s + self.duration)
            .filter(|e| *e > t);
        match (opens, closes) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .filter(|c| *c > t)
    }
}

/// Whether a five-field pattern (already parsed) names only days of the month that none of
/// its months has (`0 0 31 2 *`, `0 0 31 4,6,9,11 *`), so it can never match. Only a pattern
/// whose day of week is `*` or `?` (the day of month alone decides) with plain numbers,
/// ranges, steps and month names is judged; anything else answers `false` and is left to the
/// search.
fn no_day_matches(schedule: &str) -> bool {
    const MONTHS: [&str; 12] = [
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ];
    // The most days each month has (February in a leap year).
    const DAYS: [u32; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    let [_, _, dom, month, dow] = fields.as_slice() else {
        return false;
    };
    if !matches!(*dow, "*" | "?") || matches!(*dom, "*" | "?") {
        return false;
    }
    let (Some(days), Some(months)) = (
        field_values(dom, 1, 31, &[]),
        field_values(month, 1, 12, &MONTHS),
    ) else {
        return false;
    };
    !months.iter().any(|m| {
        let most = usize::try_from(*m - 1)
            .ok()
            .and_then(|i| DAYS.get(i))
            .copied()
            .unwrap_or(31);
        days.iter().any(|d| *d <= most)
    })
}

/// The values a cron field lists (`*`, `5`, `1-5`, `*/2`, `1-10/3`, comma lists; `names` for
/// values from `min`), or `None` for anything else.
fn field_values(field: &str, min: u32, max: u32, names: &[&str]) -> Option<BTreeSet<u32>> {
    let value = |v: &str| -> Option<u32> {
        let n = match v.parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                let i = names.iter().position(|x| x.eq_ignore_ascii_case(v))?;
                min + u32::try_from(i).ok()?
            }
        };
        (min..=max).contains(&n).then_some(n)
    };
    let mut out = BTreeSet::new();
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().ok().filter(|s| *s > 0)?),
            None => (part, 1),
        };
        let (lo, hi) = match range {
            "*" => (min, max),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                // `5/10` runs from 5 to the end, as cron reads it.
                None if step > 1 => (value(r)?, max),
                None => (value(r)?, value(r)?),
            },
        };
        if lo > hi {
            return None;
        }
        out.extend((lo..=hi).step_by(usize::try_from(step).ok()?));
    }
    Some(out)
}

fn parse_duration(value: &str) -> Result<TimeDelta, WindowError> {
    let err = |problem: String| WindowError::Duration {
        value: value.chars().take(32).collect(),
        problem,
    };
    let d = parse_max_age(value).map_err(|e| match e {
        SpareSpecError::InvalidMaxAge { problem, .. } => err(problem.to_owned()),
        other => err(other.to_string()),
    })?;
    if d > MAX_DURATION {
        return Err(err("is longer than 31 days (744h)".to_owned()));
    }
    debug_assert!(d >= MIN_DURATION);
    Ok(d)
}

/// A disruption window: a recurrence and the voluntary reasons it admits (none listed: all).
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub recurrence: Recurrence,
    pub reasons: BTreeSet<VoluntaryReason>,
}

impl Window {
    /// Parses a window; `reasons` empty admits every voluntary reason.
    pub fn parse(
        schedule: &str,
        duration: &str,
        time_zone: &str,
        reasons: &[VoluntaryReason],
    ) -> Result<Self, WindowError> {
        Ok(Window {
            recurrence: Recurrence::parse(schedule, duration, time_zone)?,
            reasons: reasons.iter().copied().collect(),
        })
    }

    /// Whether this window governs `reason`.
    pub fn covers(&self, reason: VoluntaryReason) -> bool {
        self.reasons.is_empty() || self.reasons.contains(&reason)
    }
}

/// May a voluntary move happen now?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// No window names the reason: the calendar does not restrict it.
    Unrestricted,
    /// A window for the reason is open; the joined open windows close at `until`.
    Open { until: DateTime<Utc> },
    /// Every window for the reason is closed; the next opens at `until`.
    Held { until: DateTime<Utc> },
}

impl Permit {
    /// Whether the move may go ahead now.
    pub fn allows(&self) -> bool {
        !matches!(self, Permit::Held { .. })
    }

    /// When a held move may go ahead.
    pub fn held_until(&self) -> Option<DateTime<Utc>> {
        match self {
            Permit::Held { until } => Some(*until),
            _ => None,
        }
    }
}

/// A bundle's (or a band's) disruption windows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Calendar {
    windows: Vec<Window>,
    /// Why the windows as written cannot be read, when they cannot.
    unreadable: Option<String>,
}

impl Calendar {
    pub fn new(windows: Vec<Window>) -> Self {
        Calendar {
            windows,
            unreadable: None,
        }
    }

    /// The calendar of windows that cannot be read (`why`): it fails closed, holding every
    /// voluntary move, since the protection they were meant to give is unknown. Dropping them
    /// instead would let a drain go at once.
    pub fn unreadable(why: impl Into<String>) -> Self {
        Calendar {
            windows: Vec::new(),
            unreadable: Some(why.into()),
        }
    }

    /// Why the windows cannot be read, for a calendar that holds everything because of it.
    pub fn unreadable_reason(&self) -> Option<&str> {
        self.unreadable.as_deref()
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty() && self.unreadable.is_none()
    }

    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    /// Whether a voluntary move for `reason` may happen at `t`, and until when either way.
    pub fn permit(&self, reason: VoluntaryReason, t: DateTime<Utc>) -> Permit {
        if self.unreadable.is_some() {
            // No opening is known: held for as long as a readable pattern may take to match
            // (a fixed spec, or a later look, ends it sooner).
            return Permit::Held {
                until: t + MATCH_HORIZON,
            };
        }
        let covering: Vec<&Recurrence> = self
            .windows
            .iter()
            .filter(|w| w.covers(reason))
            .map(|w| &w.recurrence)
            .collect();
        if covering.is_empty() {
            return Permit::Unrestricted;
        }
        let end_of_open_at = |at: DateTime<Utc>| {
            covering
                .iter()
                .filter_map(|r| r.open_at(at))
                .map(|o| o.end)
                .max()
        };
        match end_of_open_at(t) {
            Some(mut until) => {
                // Follow windows that open before the current one closes.
                for _ in 0..JOIN_LOOKAHEAD {
                    // A window starting exactly at `until` is open there too.
                    match end_of_open_at(until).filter(|e| *e > until) {
                        Some(e) => until = e,
                        None => break,
                    }
                }
                Permit::Open { until }
            }
            None => covering
                .iter()
                .filter_map(|r| r.next_opening(t))
                .map(|o| o.start)
                .min()
                // Every pattern matched within nine years when parsed; one that no longer
                // does (its zone's rules changed) holds for that long rather than forever.
                .map_or(
                    Permit::Held {
                        until: t + MATCH_HORIZON,
                    },
                    |until| Permit::Held { until },
                ),
        }
    }

    /// The next opening at or after `t` of a window covering `reason` (for `get` and what-if).
    pub fn next_window(&self, reason: VoluntaryReason, t: DateTime<Utc>) -> Option<Opening> {
        self.windows
            .iter()
            .filter(|w| w.covers(reason))
            .filter_map(|w| {
                w.recurrence
                    .open_at(t)
                    .or_else(|| w.recurrence.next_opening(t))
            })
            .min()
    }
}

/// Whose disruption windows a move answers to: its bundle's own (`spec.disruption.windows`)
/// or its job's band's (the operator's `bands.<band>.disruptionWindows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WindowSource {
    Bundle,
    Band(crate::vocab::PriorityBand),
}

/// How many times [`permit_all`] moves ahead to the next opening of a calendar that still holds,
/// looking for a time every calendar admits.
pub const JOINT_LOOKAHEAD: usize = 64;

/// Why [`permit_all`] holds a move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold<K> {
    /// The calendars that hold the move at the time asked about, in the order given.
    pub by: Vec<K>,
    /// The first time every calendar admits the move together; `None` when there is none
    /// within the look-ahead (their windows never meet: the move waits until one changes).
    pub until: Option<DateTime<Utc>>,
    /// When to ask again: `until`, or the furthest time the search reached.
    pub recheck: DateTime<Utc>,
}

/// Whether a voluntary move for `reason` may happen at `t` under several calendars at once (a
/// bundle's and its job's band's): only when each of them permits it. An empty calendar, or one
/// whose windows do not name the reason, does not restrict it. When held, the answer names the
/// calendars that hold it now and the first time all of them admit it.
pub fn permit_all<K: Clone>(
    calendars: &[(K, &Calendar)],
    reason: VoluntaryReason,
    t: DateTime<Utc>,
) -> Result<(), Hold<K>> {
    let holding = |at: DateTime<Utc>| -> Vec<(K, DateTime<Utc>)> {
        calendars
            .iter()
            .filter_map(|(k, c)| c.permit(reason, at).held_until().map(|u| (k.clone(), u)))
            .collect()
    };
    let now = holding(t);
    let Some(mut at) = now.iter().map(|(_, u)| *u).max() else {
        return Ok(());
    };
    let by: Vec<K> = now.into_iter().map(|(k, _)| k).collect();
    // Until `at`, the calendar with the latest opening holds the move throughout; from there,
    // follow whichever still holds.
    for _ in 0..JOINT_LOOKAHEAD {
        match holding(at).into_iter().map(|(_, u)| u).max() {
            None => {
                return Err(Hold {
                    by,
                    until: Some(at),
                    recheck: at,
                });
            }
            Some(u) => at = u.max(at + TimeDelta::seconds(1)),
        }
    }
    Err(Hold {
        by,
        until: None,
        recheck: at,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).single().unwrap()
    }

    fn oslo(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        chrono_tz::Europe::Oslo
            .with_ymd_and_hms(y, mo, d, h, mi, 0)
            .earliest()
            .unwrap()
            .with_timezone(&Utc)
    }

    fn rec(s: &str, d: &str, tz: &str) -> Recurrence {
        Recurrence::parse(s, d, tz).unwrap_or_else(|e| panic!("{e}"))
    }

    fn all_reasons() -> [VoluntaryReason; 4] {
        [
            VoluntaryReason::Drain,
            VoluntaryReason::Consolidation,
            VoluntaryReason::Rebalance,
            VoluntaryReason::SpareRotation,
        ]
    }

    #[test]
    fn parse_errors_name_the_field() {
        let cases: &[(&str, &str, &str, &str)] = &[
            ("0 18 * * FRI", "5h30m", "Europe/Oslo", ""),
            (
                "0 18 * * *",
                "5h30m",
                "Europe/Olso",
                "timeZone \"Europe/Olso\"",
            ),
            ("0 18 * *", "1h", "UTC", "not a five-field cron pattern"),
            ("0 0 18 * * *", "1h", "UTC", "not a five-field cron pattern"),
            ("61 * * * *", "1h", "UTC", "not a five-field cron pattern"),
            ("0 0 31 2 *", "1h", "UTC", "never matches"),
            ("0 0 30 2 *", "1h", "UTC", "never matches"),
            ("0 18 * * *", "0s", "UTC", "shorter than the 1m minimum"),
            ("0 18 * * *", "30s", "UTC", "shorter than the 1m minimum"),
            ("0 18 * * *", "745h", "UTC", "longer than 31 days"),
            ("0 18 * * *", "1d", "UTC", "unknown unit"),
            ("0 18 * * *", "", "UTC", "is empty"),
            ("", "1h", "UTC", "not a five-field cron pattern"),
        ];
        for (s, d, tz, want) in cases {
            match Recurrence::parse(s, d, tz) {
                Ok(_) => assert!(want.is_empty(), "{s} {d} {tz} was accepted"),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        !want.is_empty() && msg.contains(want),
                        "{s} {d} {tz}: {msg}"
                    );
                }
            }
        }
        // Leap days and nicknames are fine.
        rec("0 0 29 2 *", "1h", "UTC");
        rec("@daily", "1h", "UTC");
        rec("0 2 * * SUN", "744h", "America/New_York");
    }

    #[test]
    fn friday_evening_in_oslo_table() {
        // 12 spares from Friday 18:00 to 23:30 Europe/Oslo.
        let r = rec("0 18 * * FRI", "5h30m", "Europe/Oslo");
        // 2026-01-09 is a Friday (CET, UTC+1); 2026-06-05 a Friday in CEST (UTC+2).
        let cases = [
            (oslo(2026, 1, 9, 17, 59), None),
            (oslo(2026, 1, 9, 18, 0), Some(oslo(2026, 1, 9, 18, 0))),
            (oslo(2026, 1, 9, 23, 29), Some(oslo(2026, 1, 9, 18, 0))),
            (oslo(2026, 1, 9, 23, 30), None),
            (oslo(2026, 1, 10, 12, 0), None),
            (oslo(2026, 6, 5, 20, 0), Some(oslo(2026, 6, 5, 18, 0))),
        ];
        for (t, start) in cases {
            assert_eq!(r.open_at(t).map(|o| o.start), start, "at {t}");
        }
        assert_eq!(oslo(2026, 1, 9, 18, 0), utc(2026, 1, 9, 17, 0));
        assert_eq!(oslo(2026, 6, 5, 18, 0), utc(2026, 6, 5, 16, 0));
        assert_eq!(
            r.next_opening(oslo(2026, 1, 9, 23, 30)).map(|o| o.start),
            Some(oslo(2026, 1, 16, 18, 0))
        );
    }

    #[test]
    fn spring_forward_gap_table() {
        // Europe/Oslo, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
        let in_gap = rec("30 2 * * *", "1h", "Europe/Oslo");
        // The start in the gap happens at the first minute after it, that day.
        assert_eq!(
            in_gap.next_start(utc(2026, 3, 28, 12, 0), false),
            Some(utc(2026, 3, 29, 1, 0))
        );
        // The day before and after, 02:30 local as usual.
        assert_eq!(
            in_gap.next_start(utc(2026, 3, 27, 12, 0), false),
            Some(utc(2026, 3, 28, 1, 30))
        );
        assert_eq!(
            in_gap.next_start(utc(2026, 3, 29, 12, 0), false),
            Some(utc(2026, 3, 30, 0, 30))
        );
        // A window across the change lasts its full elapsed duration.
        let across = rec("0 1 * * *", "3h", "Europe/Oslo");
        let o = across.open_at(utc(2026, 3, 29, 2, 30)).unwrap();
        assert_eq!(
            (o.start, o.end),
            (utc(2026, 3, 29, 0, 0), utc(2026, 3, 29, 3, 0))
        );
        // ... which is 05:00 on the wall clock that day, 04:00 the day before.
        assert_eq!(
            o.end
                .with_timezone(&chrono_tz::Europe::Oslo)
                .format("%H:%M")
                .to_string(),
            "05:00"
        );
        let wide = rec("*/15 * * * *", "5m", "Europe/Oslo");
        // Interval patterns skip the starts inside the gap.
        assert_eq!(
            wide.next_start(utc(2026, 3, 29, 0, 50), false),
            Some(utc(2026, 3, 29, 1, 0))
        );
    }

    #[test]
    fn fall_back_overlap_table() {
        // Europe/Oslo, 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice
        // (00:30 UTC and 01:30 UTC).
        let fixed = rec("30 2 * * *", "20m", "Europe/Oslo");
        assert_eq!(
            fixed.next_start(utc(2026, 10, 24, 12, 0), false),
            Some(utc(2026, 10, 25, 0, 30))
        );
        // A fixed-time start happens once: the second 02:30 opens nothing.
        assert!(fixed.open_at(utc(2026, 10, 25, 0, 40)).is_some());
        assert!(fixed.open_at(utc(2026, 10, 25, 1, 40)).is_none());
        assert_eq!(
            fixed.next_start(utc(2026, 10, 25, 0, 30), false),
            Some(utc(2026, 10, 26, 1, 30))
        );
        // The elapsed duration again: 02:00 + 2h of real time ends at 03:00 on the wall clock.
        let across = rec("0 2 * * *", "2h", "Europe/Oslo");
        let o = across.open_at(utc(2026, 10, 25, 1, 30)).unwrap();
        assert_eq!(
            (o.start, o.end),
            (utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 2, 0))
        );
    }

    #[test]
    fn windows_that_cannot_be_read_hold_every_voluntary_move() {
        let t = utc(2026, 12, 7, 12, 0);
        let why = Recurrence::parse("0 0 31 2 *", "1h", "UTC").unwrap_err();
        assert!(why.to_string().contains("never matches"), "{why}");
        let c = Calendar::unreadable(why.to_string());
        assert!(!c.is_empty());
        assert_eq!(c.unreadable_reason(), Some(why.to_string().as_str()));
        for reason in [
            VoluntaryReason::Drain,
            VoluntaryReason::Consolidation,
            VoluntaryReason::Rebalance,
            VoluntaryReason::SpareRotation,
        ] {
            let p = c.permit(reason, t);
            assert!(!p.allows(), "{reason:?} is held");
            assert!(p.held_until().is_some_and(|u| u > t + TimeDelta::days(365)));
        }
        // Under several calendars at once, the unreadable one holds too.
        let open = Calendar::default();
        let held = permit_all(
            &[("bundle", &c), ("band", &open)],
            VoluntaryReason::Drain,
            t,
        );
        assert!(held.is_err_and(|h| h.by == ["bundle"]));
    }

    #[test]
    fn a_reason_no_window_names_is_never_held_and_recovery_cannot_ask() {
        let cal = Calendar::new(vec![
            Window::parse("0 2 * * *", "2h", "UTC", &[VoluntaryReason::Consolidation]).unwrap(),
        ]);
        let noon = utc(2026, 5, 5, 12, 0);
        assert_eq!(
            cal.permit(VoluntaryReason::Consolidation, noon),
            Permit::Held {
                until: utc(2026, 5, 6, 2, 0)
            }
        );
        for r in [
            VoluntaryReason::Drain,
            VoluntaryReason::Rebalance,
            VoluntaryReason::SpareRotation,
        ] {
            assert_eq!(cal.permit(r, noon), Permit::Unrestricted);
        }
        assert_eq!(
            cal.permit(VoluntaryReason::Consolidation, utc(2026, 5, 6, 3, 0)),
            Permit::Open {
                until: utc(2026, 5, 6, 4, 0)
            }
        );
        for r in all_reasons() {
            assert_eq!(Calendar::default().permit(r, noon), Permit::Unrestricted);
        }
    }

    #[test]
    fn a_window_listing_no_reason_admits_them_all_and_the_earliest_opening_wins() {
        let cal = Calendar::new(vec![
            Window::parse("0 22 * * *", "1h", "UTC", &[]).unwrap(),
            Window::parse("0 3 * * *", "1h", "UTC", &[VoluntaryReason::Rebalance]).unwrap(),
        ]);
        let noon = utc(2026, 5, 5, 12, 0);
        assert_eq!(
            cal.permit(VoluntaryReason::Drain, noon).held_until(),
            Some(utc(2026, 5, 5, 22, 0))
        );
        assert_eq!(
            cal.permit(VoluntaryReason::Rebalance, utc(2026, 5, 5, 23, 30))
                .held_until(),
            Some(utc(2026, 5, 6, 3, 0))
        );
        assert_eq!(
            cal.next_window(VoluntaryReason::Drain, noon),
            Some(Opening {
                start: utc(2026, 5, 5, 22, 0),
                end: utc(2026, 5, 5, 23, 0)
            })
        );
    }

    #[test]
    fn overlapping_and_adjacent_windows_join() {
        let cal = Calendar::new(vec![
            Window::parse("0 1 * * *", "2h", "UTC", &[]).unwrap(),
            Window::parse("0 3 * * *", "2h", "UTC", &[]).unwrap(),
            Window::parse("30 4 * * *", "1h", "UTC", &[]).unwrap(),
        ]);
        assert_eq!(
            cal.permit(VoluntaryReason::Drain, utc(2026, 5, 5, 1, 10)),
            Permit::Open {
                until: utc(2026, 5, 5, 5, 30)
            }
        );
        // A window longer than its period is always open; the look-ahead bounds the answer.
        let always = Calendar::new(vec![Window::parse("0 * * * *", "2h", "UTC", &[]).unwrap()]);
        let p = always.permit(VoluntaryReason::Drain, utc(2026, 5, 5, 1, 10));
        assert!(matches!(p, Permit::Open { until } if until > utc(2026, 5, 7, 0, 0)));
    }

    #[test]
    fn lead_applies_a_schedule_early_and_ends_it_on_time() {
        let r = rec("0 18 * * FRI", "5h30m", "Europe/Oslo");
        let lead = TimeDelta::minutes(4);
        let open = oslo(2026, 1, 9, 18, 0);
        assert!(!r.active_with_lead(open - TimeDelta::minutes(5), lead));
        assert!(r.active_with_lead(open - TimeDelta::minutes(4), lead));
        assert!(r.active_with_lead(oslo(2026, 1, 9, 23, 29), lead));
        assert!(!r.active_with_lead(oslo(2026, 1, 9, 23, 30), lead));
        assert_eq!(
            r.next_change_with_lead(oslo(2026, 1, 9, 12, 0), lead),
            Some(open - lead)
        );
        assert_eq!(
            r.next_change_with_lead(open, lead),
            Some(oslo(2026, 1, 9, 23, 30))
        );
    }

    #[test]
    fn two_calendars_admit_a_move_only_where_both_are_open() {
        let bundle = Calendar::new(vec![Window::parse("0 1 * * *", "4h", "UTC", &[]).unwrap()]);
        let band = Calendar::new(vec![
            Window::parse("0 3 * * *", "4h", "UTC", &[VoluntaryReason::Consolidation]).unwrap(),
        ]);
        let both = [("bundle", &bundle), ("band", &band)];
        let c = VoluntaryReason::Consolidation;
        // Noon: both hold; they meet at 03:00.
        assert_eq!(
            permit_all(&both, c, utc(2026, 5, 5, 12, 0)),
            Err(Hold {
                by: vec!["bundle", "band"],
                until: Some(utc(2026, 5, 6, 3, 0)),
                recheck: utc(2026, 5, 6, 3, 0),
            })
        );
        // 02:00: the bundle's window is open, the band's holds until 03:00.
        assert_eq!(
            permit_all(&both, c, utc(2026, 5, 6, 2, 0)).unwrap_err().by,
            vec!["band"]
        );
        assert_eq!(permit_all(&both, c, utc(2026, 5, 6, 4, 0)), Ok(()));
        // 06:00: the band's window is open, the bundle's closed at 05:00 and reopens at 01:00,
        // when the band's is closed: they meet at 03:00 the next day.
        assert_eq!(
            permit_all(&both, c, utc(2026, 5, 6, 6, 0)),
            Err(Hold {
                by: vec!["bundle"],
                until: Some(utc(2026, 5, 7, 3, 0)),
                recheck: utc(2026, 5, 7, 3, 0),
            })
        );
        // The band's window names consolidation only: a drain answers to the bundle alone.
        assert_eq!(
            permit_all(&both, VoluntaryReason::Drain, utc(2026, 5, 6, 2, 0)),
            Ok(())
        );
        // Empty calendars restrict nothing.
        let none = Calendar::default();
        assert_eq!(
            permit_all(
                &[("bundle", &none), ("band", &none)],
                c,
                utc(2026, 5, 6, 6, 0)
            ),
            Ok(())
        );
        assert_eq!(permit_all::<&str>(&[], c, utc(2026, 5, 6, 6, 0)), Ok(()));
    }

    #[test]
    fn calendars_whose_windows_never_meet_hold_with_no_time_and_a_later_recheck() {
        let night = Calendar::new(vec![Window::parse("0 1 * * *", "1h", "UTC", &[]).unwrap()]);
        let day = Calendar::new(vec![Window::parse("0 13 * * *", "1h", "UTC", &[]).unwrap()]);
        let t = utc(2026, 5, 5, 12, 0);
        let hold = permit_all(
            &[("night", &night), ("day", &day)],
            VoluntaryReason::Drain,
            t,
        )
        .unwrap_err();
        assert_eq!(hold.by, vec!["night", "day"]);
        assert_eq!(hold.until, None);
        assert!(hold.recheck > t + TimeDelta::days(7), "{}", hold.recheck);
    }

    fn arb_window() -> impl Strategy<Value = Window> {
        let schedules = prop_oneof![
            Just("0 18 * * FRI"),
            Just("30 2 * * *"),
            Just("*/20 * * * *"),
            Just("0 1 * * SUN"),
            Just("15 3 1 * *"),
            Just("0 */6 * * *"),
        ];
        let zones = prop_oneof![
            Just("UTC"),
            Just("Europe/Oslo"),
            Just("America/New_York"),
            Just("Australia/Lord_Howe"),
        ];
        let durations = prop_oneof![
            Just("1m"),
            Just("10m"),
            Just("90m"),
            Just("5h30m"),
            Just("30h")
        ];
        let reasons = proptest::sample::subsequence(all_reasons().to_vec(), 0..=2);
        (schedules, durations, zones, reasons)
            .prop_map(|(s, d, z, rs)| Window::parse(s, d, z, &rs).unwrap_or_else(|e| panic!("{e}")))
    }

    fn arb_reason() -> impl Strategy<Value = VoluntaryReason> {
        proptest::sample::select(all_reasons().to_vec())
    }

    #[test]
    fn impossible_days_are_told_from_the_fields_and_the_rest_is_left_to_the_search() {
        for never in [
            "0 0 31 2 *",
            "0 0 30 2 *",
            "0 0 31 4,6,9,11 *",
            "0 0 31 FEB ?",
            "0 0 30-31 feb *",
            "0 0 31 APR-JUN/2 *",
        ] {
            assert!(no_day_matches(never), "{never}");
            assert!(
                matches!(
                    Recurrence::parse(never, "1h", "UTC"),
                    Err(WindowError::NeverMatches { .. })
                ),
                "{never}"
            );
        }
        for may in [
            "0 0 29 2 *",
            "0 0 31 * *",
            "0 0 31 2 MON",
            "0 2 * * SAT",
            "0 0 L 2 *",
            "@daily",
            "0 0 31 1-12/2 *",
        ] {
            assert!(!no_day_matches(may), "{may}");
        }
    }

    proptest! {
        /// The quick answer never disagrees with the search it stands in for.
        #[test]
        fn the_quick_never_matches_answer_agrees_with_the_search(
            days in proptest::collection::btree_set(1u32..=31, 1..4),
            months in proptest::collection::btree_set(1u32..=12, 1..4),
        ) {
            let list = |s: &BTreeSet<u32>| s.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let schedule = format!("0 0 {} {} *", list(&days), list(&months));
            let cron = CronParser::builder()
                .seconds(Seconds::Disallowed)
                .year(Year::Disallowed)
                .build()
                .parse(&schedule)
                .unwrap();
            let probe = DateTime::<Utc>::from_timestamp(946_684_800, 0).unwrap_or_default();
            let found = cron
                .find_next_occurrence(&probe, true)
                .ok()
                .is_some_and(|s| s - probe <= MATCH_HORIZON);
            prop_assert_eq!(no_day_matches(&schedule), !found, "{}", schedule);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// On a fake clock stepping through two years (DST changes included): a held answer
        /// names a later time at which the move is admitted, an open answer a later close, and
        /// every time before a held answer's `until` is held too.
        #[test]
        fn held_until_is_the_first_admitted_time(
            windows in proptest::collection::vec(arb_window(), 1..4),
            reason in arb_reason(),
            start_min in 0i64..(2 * 365 * 24 * 60),
            probes in proptest::collection::vec(0.0f64..1.0, 1..4),
        ) {
            let cal = Calendar::new(windows);
            let t = utc(2026, 1, 1, 0, 0) + TimeDelta::minutes(start_min);
            match cal.permit(reason, t) {
                Permit::Unrestricted => {
                    prop_assert!(cal.windows().iter().all(|w| !w.covers(reason)));
                }
                Permit::Open { until } => {
                    prop_assert!(until > t);
                    // Still open a moment before it closes.
                    prop_assert!(cal.permit(reason, until - TimeDelta::seconds(1)).allows());
                }
                Permit::Held { until } => {
                    prop_assert!(until > t);
                    prop_assert!(cal.permit(reason, until).allows(), "not open at {until}");
                    for p in probes {
                        let span = (until - t).num_seconds();
                        let mid = t + TimeDelta::seconds((span as f64 * p) as i64);
                        if mid < until {
                            prop_assert!(!cal.permit(reason, mid).allows(), "open at {mid} before {until}");
                        }
                    }
                }
            }
        }

        /// Two calendars together: a move is admitted exactly when each calendar admits it;
        /// a held answer names exactly the calendars that hold, and its `until` is a time both
        /// admit with no such time between (probed).
        #[test]
        fn permit_all_is_each_calendar_admitting(
            first in proptest::collection::vec(arb_window(), 0..3),
            second in proptest::collection::vec(arb_window(), 0..3),
            reason in arb_reason(),
            start_min in 0i64..(2 * 365 * 24 * 60),
            probes in proptest::collection::vec(0.0f64..1.0, 1..4),
        ) {
            let (a, b) = (Calendar::new(first), Calendar::new(second));
            let t = utc(2026, 1, 1, 0, 0) + TimeDelta::minutes(start_min);
            let both = |at| a.permit(reason, at).allows() && b.permit(reason, at).allows();
            match permit_all(&[(0u8, &a), (1u8, &b)], reason, t) {
                Ok(()) => prop_assert!(both(t)),
                Err(hold) => {
                    prop_assert!(!both(t));
                    let expected: Vec<u8> = [(0u8, &a), (1u8, &b)]
                        .iter()
                        .filter(|(_, c)| !c.permit(reason, t).allows())
                        .map(|(k, _)| *k)
                        .collect();
                    prop_assert_eq!(&hold.by, &expected);
                    prop_assert!(hold.recheck > t);
                    if let Some(until) = hold.until {
                        prop_assert_eq!(until, hold.recheck);
                        prop_assert!(both(until), "not admitted at {}", until);
                        for p in probes {
                            let span = (until - t).num_seconds();
                            let mid = t + TimeDelta::seconds((span as f64 * p) as i64);
                            if mid < until {
                                prop_assert!(!both(mid), "admitted at {} before {}", mid, until);
                            }
                        }
                    }
                }
            }
        }

        /// The calendar's verdict is the plain definition: some covering window has a start in
        /// (t - duration, t], found by walking the starts one by one.
        #[test]
        fn permit_matches_walking_the_starts(
            window in arb_window(),
            start_min in 0i64..(2 * 365 * 24 * 60),
        ) {
            let t = utc(2026, 1, 1, 0, 0) + TimeDelta::minutes(start_min);
            let r = &window.recurrence;
            let mut s = r.next_start(t - r.duration() - TimeDelta::days(1), false);
            let mut inside = false;
            while let Some(x) = s {
                if x > t { break; }
                if x > t - r.duration() { inside = true; }
                s = r.next_start(x, false);
            }
            prop_assert_eq!(r.open_at(t).is_some(), inside);
        }

        /// A lead never shortens a schedule, and only moves its start earlier by the lead.
        #[test]
        fn a_lead_only_widens(
            window in arb_window(),
            start_min in 0i64..(365 * 24 * 60),
            lead_s in 0i64..900,
        ) {
            let t = utc(2026, 1, 1, 0, 0) + TimeDelta::minutes(start_min);
            let r = &window.recurrence;
            let lead = TimeDelta::seconds(lead_s);
            if r.open_at(t).is_some() {
                prop_assert!(r.active_with_lead(t, lead));
            }
            prop_assert_eq!(
                r.active_with_lead(t, lead),
                r.open_at(t).is_some() || r.next_start(t, false).is_some_and(|s| s <= t + lead)
            );
        }
    }
}
