//! How a simulated job answers the job socket during a handover: the
//! behaviour switches tests and the operator's end-to-end runs script
//! (refuse state, slow cutover, fail a participant, abort at a phase), and
//! the `jobSocket:` section of the sim's YAML. Pure: no I/O.
//!
//! A job's behaviour comes from, in order: the last
//! `SimAdmin.SetMigrationBehaviour` for that job id, else the first
//! `jobSocket.behaviours` rule whose `job` pattern matches the job id, else
//! cooperative.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Longest scripted cutover delay (10 minutes): longer is a typo, and the
/// relay's answer timeout would fire first anyway.
pub const MAX_CUTOVER_DELAY_MS: u64 = 600_000;
/// Most participants a behaviour may fail.
pub const MAX_FAILED_PARTICIPANTS: usize = 64;
/// Longest participant id.
pub const MAX_PARTICIPANT_BYTES: usize = 253;
/// Most rules in `jobSocket.behaviours`.
pub const MAX_RULES: usize = 1024;
/// Longest job pattern.
pub const MAX_PATTERN_BYTES: usize = 512;
/// Default wait for a job's answer before the relay aborts the migration.
pub const DEFAULT_ANSWER_TIMEOUT_MS: u64 = 30_000;

/// Where a simulated job sends its own `abort` frame instead of (or right
/// after) its normal answer. Named after the frame that triggers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AbortAt {
    /// Source, on `get-state`: abort instead of `state` (phase awaiting-state).
    GetState,
    /// Source, right after sending `state` (phase state-given).
    StateGiven,
    /// Target, on `initial-state`: abort instead of `target-ready`
    /// (phase awaiting-target-ready).
    InitialState,
    /// Target, right after sending `target-ready` (phase target-ready).
    TargetReady,
    /// Source, on `cutover-ready`: abort instead of stopping output
    /// (phase awaiting-source-stop).
    CutoverReady,
}

impl AbortAt {
    /// Every abort point, in handover order.
    pub const ALL: [AbortAt; 5] = [
        AbortAt::GetState,
        AbortAt::StateGiven,
        AbortAt::InitialState,
        AbortAt::TargetReady,
        AbortAt::CutoverReady,
    ];

    /// The CLI / YAML name.
    pub fn name(self) -> &'static str {
        match self {
            AbortAt::GetState => "get-state",
            AbortAt::StateGiven => "state-given",
            AbortAt::InitialState => "initial-state",
            AbortAt::TargetReady => "target-ready",
            AbortAt::CutoverReady => "cutover-ready",
        }
    }

    /// Parses a CLI / YAML name.
    pub fn parse(name: &str) -> Option<AbortAt> {
        AbortAt::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// One job's switches. The default is a cooperative job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct JobBehaviour {
    /// Answer `get-state` with `state-refused`.
    pub refuse_state: bool,
    /// Wait this long before answering `cutover-ready` (a slow cutover).
    pub cutover_delay_ms: u64,
    /// Participants the target reports in `target-applied.failed`.
    pub fail_participants: Vec<String>,
    /// Send a job-side `abort` here.
    pub abort_at: Option<AbortAt>,
}

/// Why a behaviour was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BehaviourError {
    /// A value out of range or malformed.
    #[error("invalid migration behaviour: {0}")]
    Invalid(String),
    /// The sim's jobs do not speak the job socket (the in-process agent).
    #[error(
        "this sim's jobs do not speak the job socket (started with --no-job-socket or Sim::start); migration behaviours need the socket agent"
    )]
    Unsupported,
}

impl JobBehaviour {
    /// Checks ranges and ids.
    pub fn validate(&self) -> Result<(), BehaviourError> {
        if self.cutover_delay_ms > MAX_CUTOVER_DELAY_MS {
            return Err(BehaviourError::Invalid(format!(
                "cutoverDelayMs {} exceeds {MAX_CUTOVER_DELAY_MS}",
                self.cutover_delay_ms
            )));
        }
        if self.fail_participants.len() > MAX_FAILED_PARTICIPANTS {
            return Err(BehaviourError::Invalid(format!(
                "{} failed participants, at most {MAX_FAILED_PARTICIPANTS}",
                self.fail_participants.len()
            )));
        }
        for p in &self.fail_participants {
            if p.is_empty() || p.len() > MAX_PARTICIPANT_BYTES || p.chars().any(char::is_control) {
                return Err(BehaviourError::Invalid(format!(
                    "participant id must be 1-{MAX_PARTICIPANT_BYTES} bytes without control characters, got {:?}",
                    crate::validate::excerpt(p)
                )));
            }
        }
        Ok(())
    }

    /// What the target reports in `target-applied` for a job whose
    /// participants are `participants`: `(applied, failed)`. A failed
    /// participant the job does not have is still reported failed (the
    /// switch names what to fail; it must show up).
    pub fn apply_outcome(&self, participants: &[&str]) -> (Vec<String>, Vec<String>) {
        let applied = participants
            .iter()
            .filter(|p| !self.fail_participants.iter().any(|f| f == *p))
            .map(|p| (*p).to_owned())
            .collect();
        let mut failed = self.fail_participants.clone();
        failed.sort();
        failed.dedup();
        (applied, failed)
    }
}

/// A `jobSocket.behaviours` entry: a job id pattern and its switches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BehaviourRule {
    /// Job id pattern; `*` matches any run of characters (including `/`),
    /// e.g. `flaky/*` or `*/encode`.
    pub job: String,
    /// Answer `get-state` with `state-refused`.
    #[serde(default)]
    pub refuse_state: bool,
    /// Wait this long before answering `cutover-ready`.
    #[serde(default)]
    pub cutover_delay_ms: u64,
    /// Participants the target reports failed.
    #[serde(default)]
    pub fail_participants: Vec<String>,
    /// Send a job-side `abort` here.
    #[serde(default)]
    pub abort_at: Option<AbortAt>,
}

impl BehaviourRule {
    /// A rule giving `behaviour` to jobs matching `job`.
    pub fn new(job: impl Into<String>, behaviour: JobBehaviour) -> Self {
        BehaviourRule {
            job: job.into(),
            refuse_state: behaviour.refuse_state,
            cutover_delay_ms: behaviour.cutover_delay_ms,
            fail_participants: behaviour.fail_participants,
            abort_at: behaviour.abort_at,
        }
    }

    /// The switches.
    pub fn behaviour(&self) -> JobBehaviour {
        JobBehaviour {
            refuse_state: self.refuse_state,
            cutover_delay_ms: self.cutover_delay_ms,
            fail_participants: self.fail_participants.clone(),
            abort_at: self.abort_at,
        }
    }
}

/// The `jobSocket:` section of the sim's YAML (read by
/// [`crate::SimSetup`]); used when the sim's jobs speak the job socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct JobSocketConfig {
    /// How long the relay waits for a job's answer before it aborts the
    /// migration on the job's behalf (default 30 s).
    pub answer_timeout_ms: u64,
    /// Per-job switches by job id pattern; the first match wins.
    pub behaviours: Vec<BehaviourRule>,
    /// Jobs run as external processes (see [`crate::exec`]); the first match wins. Jobs
    /// matching none are simulated.
    pub exec: Vec<crate::exec::ExecRule>,
}

impl Default for JobSocketConfig {
    fn default() -> Self {
        JobSocketConfig {
            answer_timeout_ms: DEFAULT_ANSWER_TIMEOUT_MS,
            behaviours: Vec::new(),
            exec: Vec::new(),
        }
    }
}

impl JobSocketConfig {
    /// Every problem, at once.
    pub fn problems(&self) -> Vec<String> {
        let mut errs = Vec::new();
        if self.answer_timeout_ms == 0 || self.answer_timeout_ms > 3_600_000 {
            errs.push("jobSocket.answerTimeoutMs must be 1..=3600000".to_owned());
        }
        if self.behaviours.len() > MAX_RULES {
            errs.push(format!("jobSocket.behaviours: at most {MAX_RULES} rules"));
        }
        for (i, r) in self.behaviours.iter().enumerate() {
            if r.job.is_empty() || r.job.len() > MAX_PATTERN_BYTES {
                errs.push(format!(
                    "jobSocket.behaviours[{i}]: job pattern must be 1-{MAX_PATTERN_BYTES} bytes"
                ));
            }
            if let Err(e) = r.behaviour().validate() {
                errs.push(format!("jobSocket.behaviours[{i}]: {e}"));
            }
        }
        if self.exec.len() > crate::exec::MAX_EXEC_RULES {
            errs.push(format!(
                "jobSocket.exec: at most {} rules",
                crate::exec::MAX_EXEC_RULES
            ));
        }
        for (i, r) in self.exec.iter().enumerate() {
            errs.extend(r.problems(i));
        }
        errs
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of
/// characters. Linear-time greedy matching with one backtrack point, so a
/// hostile pattern cannot blow up.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(c) if Some(c) == t.get(ti) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p.get(pi..)
        .is_some_and(|rest| rest.iter().all(|c| *c == '*'))
}

impl AbortAt {
    /// From the proto enum value; `Ok(None)` for UNSPECIFIED (never).
    pub fn from_proto(value: i32) -> Result<Option<AbortAt>, BehaviourError> {
        use manager_proto::JobAbortPoint as P;
        match P::try_from(value) {
            Ok(P::Unspecified) => Ok(None),
            Ok(P::GetState) => Ok(Some(AbortAt::GetState)),
            Ok(P::StateGiven) => Ok(Some(AbortAt::StateGiven)),
            Ok(P::InitialState) => Ok(Some(AbortAt::InitialState)),
            Ok(P::TargetReady) => Ok(Some(AbortAt::TargetReady)),
            Ok(P::CutoverReady) => Ok(Some(AbortAt::CutoverReady)),
            Err(_) => Err(BehaviourError::Invalid(format!(
                "unknown abort_at value {value}"
            ))),
        }
    }

    /// The proto enum.
    pub fn to_proto(abort_at: Option<AbortAt>) -> manager_proto::JobAbortPoint {
        use manager_proto::JobAbortPoint as P;
        match abort_at {
            None => P::Unspecified,
            Some(AbortAt::GetState) => P::GetState,
            Some(AbortAt::StateGiven) => P::StateGiven,
            Some(AbortAt::InitialState) => P::InitialState,
            Some(AbortAt::TargetReady) => P::TargetReady,
            Some(AbortAt::CutoverReady) => P::CutoverReady,
        }
    }
}

impl JobBehaviour {
    /// From `SimAdmin.SetMigrationBehaviour` (unset = cooperative), validated.
    pub fn from_proto(
        m: Option<&manager_proto::MigrationBehaviour>,
    ) -> Result<JobBehaviour, BehaviourError> {
        let Some(m) = m else {
            return Ok(JobBehaviour::default());
        };
        let b = JobBehaviour {
            refuse_state: m.refuse_state,
            cutover_delay_ms: m.cutover_delay_ms,
            fail_participants: m.fail_participants.clone(),
            abort_at: AbortAt::from_proto(m.abort_at)?,
        };
        b.validate()?;
        Ok(b)
    }

    /// The proto view.
    pub fn to_proto(&self) -> manager_proto::MigrationBehaviour {
        manager_proto::MigrationBehaviour {
            refuse_state: self.refuse_state,
            cutover_delay_ms: self.cutover_delay_ms,
            fail_participants: self.fail_participants.clone(),
            abort_at: AbortAt::to_proto(self.abort_at) as i32,
        }
    }

    /// A one-line description for people.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.refuse_state {
            parts.push("refuses state".to_owned());
        }
        if self.cutover_delay_ms > 0 {
            parts.push(format!("stops output after {} ms", self.cutover_delay_ms));
        }
        if !self.fail_participants.is_empty() {
            parts.push(format!("fails {}", self.fail_participants.join(", ")));
        }
        if let Some(a) = self.abort_at {
            parts.push(format!("aborts at {}", a.name()));
        }
        if parts.is_empty() {
            "cooperative".to_owned()
        } else {
            parts.join("; ")
        }
    }
}

/// Per-job overrides plus the configured rules.
#[derive(Debug, Clone, Default)]
pub struct Behaviours {
    rules: Vec<BehaviourRule>,
    overrides: BTreeMap<String, JobBehaviour>,
}

impl Behaviours {
    /// From the configured rules.
    pub fn new(rules: Vec<BehaviourRule>) -> Self {
        Behaviours {
            rules,
            overrides: BTreeMap::new(),
        }
    }

    /// Replaces the configured rules (the overrides stay).
    pub fn set_rules(&mut self, rules: Vec<BehaviourRule>) {
        self.rules = rules;
    }

    /// Replaces the job's behaviour. An explicit cooperative one also wins
    /// over the rules, so a test can make one matching job behave.
    pub fn set(&mut self, job_id: &str, behaviour: JobBehaviour) -> Result<(), BehaviourError> {
        behaviour.validate()?;
        crate::validate::id("job_id", job_id)
            .map_err(|e| BehaviourError::Invalid(e.to_string()))?;
        self.overrides.insert(job_id.to_owned(), behaviour);
        Ok(())
    }

    /// The job's behaviour now.
    pub fn get(&self, job_id: &str) -> JobBehaviour {
        if let Some(b) = self.overrides.get(job_id) {
            return b.clone();
        }
        self.rules
            .iter()
            .find(|r| glob_match(&r.job, job_id))
            .map(BehaviourRule::behaviour)
            .unwrap_or_default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_star_matches_any_run_including_slashes() {
        assert!(glob_match("flaky/*", "flaky/0/encode"));
        assert!(glob_match("*/encode", "b/12/encode"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(!glob_match("flaky/*", "steady/0/encode"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
    }

    #[test]
    fn an_override_wins_over_rules_and_the_first_matching_rule_wins() {
        let refuse = JobBehaviour {
            refuse_state: true,
            ..Default::default()
        };
        let slow = JobBehaviour {
            cutover_delay_ms: 50,
            ..Default::default()
        };
        let mut b = Behaviours::new(vec![
            BehaviourRule::new("b/*", refuse.clone()),
            BehaviourRule::new("*", slow.clone()),
        ]);
        assert_eq!(b.get("b/0/x"), refuse);
        assert_eq!(b.get("c/0/x"), slow);
        b.set("b/0/x", JobBehaviour::default()).unwrap();
        assert_eq!(b.get("b/0/x"), JobBehaviour::default());
        assert_eq!(b.get("b/1/x"), refuse);
    }

    #[test]
    fn out_of_range_behaviours_are_refused() {
        let mut b = Behaviours::default();
        let too_slow = JobBehaviour {
            cutover_delay_ms: MAX_CUTOVER_DELAY_MS + 1,
            ..Default::default()
        };
        assert!(matches!(
            b.set("j", too_slow),
            Err(BehaviourError::Invalid(_))
        ));
        let bad_id = JobBehaviour {
            fail_participants: vec![String::new()],
            ..Default::default()
        };
        assert!(b.set("j", bad_id).is_err());
        let many = JobBehaviour {
            fail_participants: (0..=MAX_FAILED_PARTICIPANTS)
                .map(|i| i.to_string())
                .collect(),
            ..Default::default()
        };
        assert!(b.set("j", many).is_err());
        assert!(b.set("", JobBehaviour::default()).is_err());
    }

    #[test]
    fn failed_participants_leave_applied_and_are_reported_sorted_once() {
        let b = JobBehaviour {
            fail_participants: vec!["output".into(), "extra".into(), "output".into()],
            ..Default::default()
        };
        let (applied, failed) = b.apply_outcome(&["input", "output"]);
        assert_eq!(applied, vec!["input"]);
        assert_eq!(failed, vec!["extra", "output"]);
    }

    #[test]
    fn the_proto_form_round_trips_and_unknown_abort_points_are_refused() {
        for a in AbortAt::ALL.map(Some).into_iter().chain([None]) {
            let b = JobBehaviour {
                refuse_state: true,
                cutover_delay_ms: 7,
                fail_participants: vec!["p".into()],
                abort_at: a,
            };
            assert_eq!(JobBehaviour::from_proto(Some(&b.to_proto())).unwrap(), b);
        }
        assert_eq!(
            JobBehaviour::from_proto(None).unwrap(),
            JobBehaviour::default()
        );
        let bad = manager_proto::MigrationBehaviour {
            abort_at: 99,
            ..Default::default()
        };
        assert!(JobBehaviour::from_proto(Some(&bad)).is_err());
        let slow = manager_proto::MigrationBehaviour {
            cutover_delay_ms: u64::MAX,
            ..Default::default()
        };
        assert!(JobBehaviour::from_proto(Some(&slow)).is_err());
    }

    #[test]
    fn abort_points_round_trip_by_name() {
        for a in AbortAt::ALL {
            assert_eq!(AbortAt::parse(a.name()), Some(a));
        }
        assert_eq!(AbortAt::parse("cutover-apply"), None);
    }

    #[test]
    fn the_yaml_section_lists_every_problem() {
        let cfg: JobSocketConfig = serde_saphyr::from_str(
            "answerTimeoutMs: 0\nbehaviours:\n  - {job: '', cutoverDelayMs: 99999999}\n  - {job: 'a/*', abortAt: state-given, failParticipants: [x]}\n",
        )
        .unwrap();
        let p = cfg.problems().join("\n");
        assert!(p.contains("answerTimeoutMs"), "{p}");
        assert!(p.contains("behaviours[0]: job pattern"), "{p}");
        assert!(
            p.contains("behaviours[0]: invalid migration behaviour"),
            "{p}"
        );
        assert!(!p.contains("behaviours[1]"), "{p}");
        assert_eq!(
            cfg.behaviours.get(1).and_then(|r| r.abort_at),
            Some(AbortAt::StateGiven)
        );
        assert!(
            serde_saphyr::from_str::<JobSocketConfig>("behaviours: [{job: a, refuse: true}]")
                .is_err()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn a_pattern_without_stars_matches_only_itself(p in "[a-z/0-9]{0,12}", t in "[a-z/0-9]{0,12}") {
            prop_assert_eq!(glob_match(&p, &t), p == t);
        }

        #[test]
        fn star_prefix_suffix_matches_what_it_should(pre in "[a-z/]{0,6}", mid in "[a-z/*]{0,6}", suf in "[a-z/]{0,6}") {
            let text = format!("{pre}{mid}{suf}");
            let pattern = format!("{pre}*{suf}");
            prop_assert!(glob_match(&pattern, &text));
            prop_assert!(glob_match("*", &text));
        }

        #[test]
        fn matching_never_panics_on_any_input(p in ".{0,40}", t in ".{0,40}") {
            let _ = glob_match(&p, &t);
        }
    }
}
