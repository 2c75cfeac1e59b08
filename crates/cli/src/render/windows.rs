//! `get windows`: per bundle and voluntary reason, whether the bundle's own disruption windows
//! allow a move now and until when, or hold it and until when, in UTC and in the window's time
//! zone; and the moves the operator holds now, in its own words (its `DisruptionWindow` waits,
//! which also name the bands' windows from the operator's settings, unknown to the plugin).

use automanager_api::calendar::{Calendar, Permit, Window};
use automanager_api::{self as api, VoluntaryReason};
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::table;

const REASONS: [VoluntaryReason; 4] = [
    VoluntaryReason::Drain,
    VoluntaryReason::Consolidation,
    VoluntaryReason::Rebalance,
    VoluntaryReason::SpareRotation,
];

/// What a bundle's own windows say about one reason now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum WindowState {
    /// A window naming the reason is open.
    Allowed,
    /// Every window naming the reason is closed.
    Held,
    /// No window names the reason: the bundle does not restrict it.
    AnyTime,
    /// The windows cannot be read (the operator holds every voluntary move of the bundle and
    /// says why on the Bundle: `Stalled`, `InvalidSpec`).
    Invalid,
}

impl WindowState {
    fn as_str(self) -> &'static str {
        match self {
            WindowState::Allowed => "allowed",
            WindowState::Held => "held",
            WindowState::AnyTime => "any time",
            WindowState::Invalid => "invalid",
        }
    }
}

/// One bundle and reason.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowRow {
    pub namespace: String,
    pub bundle: String,
    /// `drain`, `consolidation`, `rebalance` or `spareRotation`.
    pub reason: String,
    pub state: WindowState,
    /// Allowed: when the open windows close. Held: when the next window opens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
    /// `until` on the wall clock of the window that decides it, with its zone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until_local: Option<String>,
    /// The IANA zone of that window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// Why the windows cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// A Migration the operator holds for a disruption window now, with its message (which names
/// the calendar that holds it: the bundle's, its job's band's, or both).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldMove {
    pub namespace: String,
    pub bundle: String,
    pub migration: String,
    pub message: String,
}

/// The answer of `get windows`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowsView {
    pub now: DateTime<Utc>,
    pub rows: Vec<WindowRow>,
    pub held: Vec<HeldMove>,
}

/// The rows of `bundles` at `now`, by namespace, name and reason; `migrations` are searched for
/// the moves the operator holds for a window (only those of the bundles shown).
pub fn view(
    bundles: &[api::Bundle],
    migrations: &[api::Migration],
    now: DateTime<Utc>,
) -> WindowsView {
    let mut sorted: Vec<&api::Bundle> = bundles.iter().collect();
    sorted.sort_by_key(|b| (b.metadata.namespace.clone(), b.metadata.name.clone()));
    let rows = sorted.iter().flat_map(|b| bundle_rows(b, now)).collect();
    let shown = |ns: &str, name: &str| {
        sorted.iter().any(|b| {
            b.metadata.namespace.as_deref() == Some(ns) && b.metadata.name.as_deref() == Some(name)
        })
    };
    let mut held: Vec<HeldMove> = migrations
        .iter()
        .filter_map(|m| {
            let s = m.status.as_ref()?;
            if s.phase != api::MigrationPhase::Pending {
                return None;
            }
            let c = api::find_condition(&s.conditions, "Queued")
                .filter(|c| c.is_true() && c.reason == "DisruptionWindow")?;
            let namespace = m.metadata.namespace.clone().unwrap_or_default();
            shown(&namespace, &m.spec.job.bundle).then(|| HeldMove {
                bundle: m.spec.job.bundle.clone(),
                migration: m.metadata.name.clone().unwrap_or_default(),
                message: c.message.clone(),
                namespace,
            })
        })
        .collect();
    held.sort_by(|a, b| {
        (&a.namespace, &a.bundle, &a.migration).cmp(&(&b.namespace, &b.bundle, &b.migration))
    });
    WindowsView { now, rows, held }
}

fn bundle_rows(b: &api::Bundle, now: DateTime<Utc>) -> Vec<WindowRow> {
    let row = |reason: VoluntaryReason, state| WindowRow {
        namespace: b.metadata.namespace.clone().unwrap_or_default(),
        bundle: b.metadata.name.clone().unwrap_or_default(),
        reason: reason.as_str().to_owned(),
        state,
        until: None,
        until_local: None,
        time_zone: None,
        problem: None,
    };
    let calendar = match b.spec.disruption_calendar() {
        Ok(c) => c,
        Err(e) => {
            return REASONS
                .iter()
                .map(|r| WindowRow {
                    problem: Some(e.to_string()),
                    ..row(*r, WindowState::Invalid)
                })
                .collect();
        }
    };
    REASONS
        .iter()
        .map(|r| {
            let (state, until) = match calendar.permit(*r, now) {
                Permit::Unrestricted => (WindowState::AnyTime, None),
                Permit::Open { until } => (WindowState::Allowed, Some(until)),
                Permit::Held { until } => (WindowState::Held, Some(until)),
            };
            let deciding = until.and_then(|u| deciding_window(&calendar, *r, now, u, state));
            WindowRow {
                until,
                until_local: until.zip(deciding).map(|(u, w)| {
                    u.with_timezone(&w.recurrence.time_zone())
                        .format("%Y-%m-%d %H:%M %Z")
                        .to_string()
                }),
                time_zone: deciding.map(|w| w.recurrence.time_zone().name().to_owned()),
                ..row(*r, state)
            }
        })
        .collect()
}

/// The window whose time `until` is: the one that opens then (held), or the open one that
/// closes then (allowed).
fn deciding_window(
    calendar: &Calendar,
    reason: VoluntaryReason,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
    state: WindowState,
) -> Option<&Window> {
    let covering = || calendar.windows().iter().filter(|w| w.covers(reason));
    let found = match state {
        WindowState::Held => covering().find(|w| {
            w.recurrence
                .next_opening(now)
                .is_some_and(|o| o.start == until)
        }),
        WindowState::Allowed => covering().find(|w| {
            w.recurrence
                .open_at(until - chrono::TimeDelta::seconds(1))
                .is_some_and(|o| o.end == until)
        }),
        _ => None,
    };
    found.or_else(|| covering().next())
}

/// The view as a table (a bundle whose windows restrict nothing takes one line), then the
/// moves the operator holds.
pub fn render(v: &WindowsView) -> String {
    if v.rows.is_empty() {
        return "No bundles.\n".into();
    }
    let mut body: Vec<Vec<String>> = Vec::new();
    for chunk in v
        .rows
        .chunk_by(|a, b| a.namespace == b.namespace && a.bundle == b.bundle)
    {
        let first = &chunk[0];
        let all = |s: WindowState| chunk.iter().all(|r| r.state == s);
        if all(WindowState::AnyTime) || all(WindowState::Invalid) {
            body.push(vec![
                first.namespace.clone(),
                first.bundle.clone(),
                "*".into(),
                first.state.as_str().into(),
                "-".into(),
                first
                    .problem
                    .clone()
                    .unwrap_or_else(|| "no disruption windows".into()),
            ]);
            continue;
        }
        for r in chunk {
            body.push(vec![
                r.namespace.clone(),
                r.bundle.clone(),
                r.reason.clone(),
                r.state.as_str().into(),
                r.until
                    .map(|u| u.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_else(|| "-".into()),
                r.until_local.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
    }
    let mut out = table(
        &[
            "NAMESPACE",
            "BUNDLE",
            "REASON",
            "NOW",
            "UNTIL (UTC)",
            "UNTIL (WINDOW'S ZONE)",
        ],
        &body,
    );
    out.push_str(&format!(
        "\nFrom each Bundle's own disruption.windows at {}. The bands' windows (bands.<band>.disruptionWindows in the operator's settings) apply too; the operator names them in the moves it holds:\n",
        v.now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    ));
    if v.held.is_empty() {
        out.push_str("  no move is held for a window now\n");
    }
    for h in &v.held {
        out.push_str(&format!(
            "  {}/{} migration/{}: {}\n",
            h.namespace, h.bundle, h.migration, h.message
        ));
    }
    out
}
