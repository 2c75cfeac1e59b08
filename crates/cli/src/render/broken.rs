//! `get broken`: the bundles that stopped being restarted, and why.

use automanager_api as api;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{age, table};

/// One Broken bundle.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BrokenRow {
    pub namespace: String,
    pub bundle: String,
    /// The Broken condition's reason (`RestartCeilingExceeded`).
    pub reason: String,
    /// The Broken condition's message.
    pub message: String,
    /// When the bundle became Broken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// The most restarts of one replica in the last hour.
    pub restarts_last_hour: i32,
}

/// The Broken bundles among `bundles`, by namespace and name.
pub fn rows(bundles: &[api::Bundle]) -> Vec<BrokenRow> {
    let mut out: Vec<BrokenRow> = bundles
        .iter()
        .filter_map(|b| {
            let s = b.status.as_ref()?;
            let cond = api::find_condition(&s.conditions, "Broken").filter(|c| c.is_true());
            if cond.is_none() && s.phase != api::BundlePhase::Broken {
                return None;
            }
            Some(BrokenRow {
                namespace: b.metadata.namespace.clone().unwrap_or_default(),
                bundle: b.metadata.name.clone().unwrap_or_default(),
                reason: cond.map(|c| c.reason.clone()).unwrap_or_default(),
                message: cond.map(|c| c.message.clone()).unwrap_or_default(),
                since: cond.map(|c| c.last_transition_time),
                restarts_last_hour: s
                    .replicas
                    .iter()
                    .map(|r| r.restarts_last_hour)
                    .max()
                    .unwrap_or(0),
            })
        })
        .collect();
    out.sort_by(|a, b| a.namespace.cmp(&b.namespace).then(a.bundle.cmp(&b.bundle)));
    out
}

/// The rows as a table, with the command that retries one.
pub fn render(rows: &[BrokenRow], now: DateTime<Utc>) -> String {
    if rows.is_empty() {
        return "No Broken bundles.\n".into();
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.namespace.clone(),
                r.bundle.clone(),
                r.since.map(|s| age(s, now)).unwrap_or_else(|| "-".into()),
                r.restarts_last_hour.to_string(),
                if r.reason.is_empty() {
                    "-".into()
                } else {
                    r.reason.clone()
                },
                r.message.clone(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "NAMESPACE",
            "BUNDLE",
            "BROKEN FOR",
            "RESTARTS/H",
            "REASON",
            "MESSAGE",
        ],
        &body,
    );
    out.push_str(
        "\nFix the cause, then retry one with: kubectl automanager retry BUNDLE -n NAMESPACE\n",
    );
    out
}
