//! Manager's view → the machine's events: a table of every mapping, and a model of Manager
//! (`docs/manager-api.md`) the controller's loop is run against under random timing.

use super::*;
use crate::migration::test_clock::{at, t0};
use crate::migration::{Action, MigrationError, happy_path};
use InstanceRole as R;
use InstanceState as I;
use ManagerPhase as M;
use MigrationPhase as P;
use MigrationStrategy as S;
use proptest::prelude::*;

fn machine_in(strategy: MigrationStrategy, phase: MigrationPhase) -> MigrationMachine {
    let placed = happy_path(strategy)
        .iter()
        .position(|p| *p == phase)
        .zip(
            happy_path(strategy)
                .iter()
                .position(|p| *p == P::PlacingTarget),
        )
        .is_some_and(|(i, placing)| i > placing);
    MigrationMachine::resume(
        strategy,
        phase,
        t0(),
        Some("src".into()),
        placed.then(|| "dst".to_owned()),
    )
}

fn record(phase: ManagerPhase) -> ManagerRecord {
    ManagerRecord {
        phase,
        source_state: b"{\"pos\":1}".to_vec(),
        target_ready_payload: b"\"ready\"".to_vec(),
        summary: HandoverSummary {
            applied: vec!["output".into()],
            failed: Vec::new(),
            skew_ms: Some(2.0),
        },
        aborted_by: ManagerParty::Unknown,
        abort_reason: String::new(),
    }
}

fn inst(node: &str, role: InstanceRole, state: InstanceState) -> Instance {
    Instance {
        node: node.into(),
        role,
        state,
    }
}

fn seen(record: Option<ManagerRecord>, instances: Vec<Instance>) -> Observed {
    Observed {
        user_abort: None,
        record,
        instances,
        target_node: NodeReadiness::Started,
    }
}

fn source_running() -> Vec<Instance> {
    vec![inst("src", R::Normal, I::Running)]
}

fn look(strategy: MigrationStrategy, phase: MigrationPhase, o: &Observed) -> Next {
    next(
        &machine_in(strategy, phase),
        o,
        at(1),
        &PhaseTimeouts::default(),
    )
}

fn ev(e: MigrationEvent) -> Next {
    Next::Event(e)
}

fn empty_cutover() -> Next {
    Next::Resend(ManagerCall::Cutover {
        payload: Payload::new(),
    })
}

/// strategy, machine phase, Manager's phase, the job's instances → what is due.
type Row = (S, P, Option<M>, Vec<Instance>, Next);

#[test]
fn every_manager_phase_maps_to_the_machines_event_per_strategy_and_phase() {
    let prepare = |initial_state: &[u8]| {
        Next::Resend(ManagerCall::PrepareTarget {
            node: "dst".into(),
            initial_state: initial_state.to_vec(),
        })
    };
    let summary = record(M::Completed).summary;
    let source_stopped = vec![inst("src", R::Normal, I::Stopped)];
    let source_stopping = vec![inst("src", R::Normal, I::Stopping)];
    #[rustfmt::skip]
    let table: Vec<Row> = vec![
        // handover
        (S::Handover, P::Proposing, None, source_running(), Next::Wait),
        (S::Handover, P::Proposing, Some(M::Proposed), source_running(), Next::Wait),
        (S::Handover, P::Proposing, Some(M::StateReceived), source_running(),
            ev(MigrationEvent::StateReceived { payload: b"{\"pos\":1}".to_vec() })),
        (S::Handover, P::PlacingTarget, Some(M::StateReceived), source_running(), Next::PlaceTarget),
        (S::Handover, P::StartingTarget, Some(M::StateReceived), source_running(), prepare(b"{\"pos\":1}")),
        (S::Handover, P::StartingTarget, Some(M::PreparingTarget), source_running(), Next::Wait),
        (S::Handover, P::StartingTarget, Some(M::TargetReady), source_running(),
            ev(MigrationEvent::TargetReady { payload: b"\"ready\"".to_vec() })),
        (S::Handover, P::StartingTarget, Some(M::CuttingOver), source_running(),
            ev(MigrationEvent::TargetReady { payload: b"\"ready\"".to_vec() })),
        (S::Handover, P::StartingTarget, Some(M::Completed), Vec::new(),
            ev(MigrationEvent::TargetReady { payload: b"\"ready\"".to_vec() })),
        (S::Handover, P::CutoverReady, Some(M::TargetReady), source_running(),
            Next::Resend(ManagerCall::Cutover { payload: b"\"ready\"".to_vec() })),
        (S::Handover, P::CutoverReady, Some(M::CuttingOver), source_running(), Next::Wait),
        (S::Handover, P::CutoverReady, Some(M::Completed), Vec::new(), ev(MigrationEvent::SourceStoppedOutput)),
        (S::Handover, P::CutoverApply, Some(M::Completed), Vec::new(), ev(MigrationEvent::TargetApplied { summary })),
        // overlap
        (S::Overlap, P::PlacingTarget, None, source_running(), Next::PlaceTarget),
        (S::Overlap, P::PlacingTarget, Some(M::StateReceived), source_running(), Next::PlaceTarget),
        (S::Overlap, P::StartingTarget, Some(M::StateReceived), source_running(), prepare(b"")),
        (S::Overlap, P::StartingTarget, Some(M::PreparingTarget), source_running(), Next::Wait),
        (S::Overlap, P::StartingTarget, Some(M::TargetReady), source_running(), ev(MigrationEvent::TargetRunning)),
        (S::Overlap, P::StoppingSource, Some(M::TargetReady), source_running(), empty_cutover()),
        (S::Overlap, P::StoppingSource, Some(M::Completed), Vec::new(), ev(MigrationEvent::SourceStopped)),
        // stopThenStart
        (S::StopThenStart, P::PlacingTarget, Some(M::StateReceived), source_running(), Next::PlaceTarget),
        (S::StopThenStart, P::PreparingTarget, Some(M::StateReceived), source_running(), prepare(b"")),
        (S::StopThenStart, P::PreparingTarget, Some(M::TargetReady), source_running(), ev(MigrationEvent::TargetPrepared)),
        (S::StopThenStart, P::StoppingSource, Some(M::TargetReady), source_running(), empty_cutover()),
        (S::StopThenStart, P::StoppingSource, Some(M::CuttingOver), source_stopping, Next::Wait),
        (S::StopThenStart, P::StoppingSource, Some(M::CuttingOver), source_stopped.clone(), ev(MigrationEvent::SourceStopped)),
        (S::StopThenStart, P::StoppingSource, Some(M::Completed), Vec::new(), ev(MigrationEvent::SourceStopped)),
        (S::StopThenStart, P::StartingTarget, Some(M::CuttingOver), source_stopped, Next::Wait),
        (S::StopThenStart, P::StartingTarget, Some(M::Completed), Vec::new(), ev(MigrationEvent::TargetRunning)),
    ];
    for (strategy, phase, manager, instances, want) in table {
        let o = seen(manager.map(record), instances);
        assert_eq!(
            look(strategy, phase, &o),
            want,
            "{strategy:?} {phase:?} with Manager in {manager:?}"
        );
    }
}

#[test]
fn a_handover_resumed_in_starting_target_after_manager_completed_it_ends_completed() {
    // The operator sent the cutover and was killed before it wrote the phase: Manager finished
    // the handover alone, and the new operator resumes from the phase in status.
    let mut machine = machine_in(S::Handover, P::StartingTarget);
    let o = seen(Some(record(M::Completed)), Vec::new());
    for look in 0..10 {
        if machine.is_ended() {
            break;
        }
        match next(&machine, &o, at(1 + look), &PhaseTimeouts::default()) {
            Next::Event(e) => {
                machine
                    .apply(e, at(1 + look))
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            // A cutover resent to a finished migration: Manager refuses it, which changes
            // nothing (see `answer`).
            Next::Resend(_) => {}
            other => panic!("look {look}: {other:?} in {:?}", machine.phase()),
        }
    }
    assert_eq!(machine.phase(), P::Completed);
}

#[test]
fn a_target_node_still_starting_is_waited_for_and_one_gone_fails_the_target() {
    for (strategy, phase) in [
        (S::StopThenStart, P::PreparingTarget),
        (S::Overlap, P::StartingTarget),
        (S::Handover, P::StartingTarget),
    ] {
        let mut o = seen(Some(record(M::StateReceived)), source_running());
        o.target_node = NodeReadiness::Starting;
        assert_eq!(look(strategy, phase, &o), Next::Wait, "{strategy:?}");
        o.target_node = NodeReadiness::Unavailable;
        assert_eq!(
            look(strategy, phase, &o),
            ev(MigrationEvent::TargetFailed {
                reason: "target node dst is not available".into()
            }),
            "{strategy:?}"
        );
    }
}

#[test]
fn manager_aborts_map_to_who_aborted() {
    let aborted = |by: ManagerParty, reason: &str| ManagerRecord {
        aborted_by: by,
        abort_reason: reason.into(),
        ..record(M::Aborted)
    };
    let refused = ManagerRecord {
        source_state: Vec::new(),
        ..aborted(ManagerParty::Source, "mid-ad-break")
    };
    #[rustfmt::skip]
    let table: Vec<(S, P, ManagerRecord, Vec<Instance>, MigrationEvent)> = vec![
        (S::Handover, P::Proposing, refused,
            source_running(), MigrationEvent::StateRefused { reason: "mid-ad-break".into() }),
        (S::Handover, P::Proposing, aborted(ManagerParty::Source, "gave state, then quit"),
            source_running(), MigrationEvent::AbortRequested { by: AbortBy::Source, reason: "gave state, then quit".into() }),
        (S::Handover, P::CutoverReady, aborted(ManagerParty::Source, "x"),
            source_running(), MigrationEvent::AbortRequested { by: AbortBy::Source, reason: "x".into() }),
        (S::Overlap, P::StartingTarget, aborted(ManagerParty::Target, "refused"),
            source_running(), MigrationEvent::AbortRequested { by: AbortBy::Target, reason: "refused".into() }),
        (S::StopThenStart, P::StoppingSource, aborted(ManagerParty::Target, "no room"),
            Vec::new(), MigrationEvent::AbortRequested { by: AbortBy::Target, reason: "no room".into() }),
        (S::Overlap, P::StartingTarget, aborted(ManagerParty::Manager, "the target instance stopped"),
            source_running(), MigrationEvent::TargetFailed { reason: "the target instance stopped".into() }),
        (S::Overlap, P::StartingTarget, aborted(ManagerParty::Manager, "the source instance stopped"),
            vec![inst("src", R::Normal, I::Failed)], MigrationEvent::SourceFailed { reason: "the source instance stopped".into() }),
        // Manager's own stop-then-start cutover stopped the source: the target is what failed.
        (S::StopThenStart, P::StartingTarget, aborted(ManagerParty::Manager, "a participant's node went away"),
            vec![inst("src", R::Normal, I::Stopped)], MigrationEvent::TargetFailed { reason: "a participant's node went away".into() }),
        (S::Overlap, P::PlacingTarget, aborted(ManagerParty::Controller, ""),
            source_running(), MigrationEvent::AbortRequested { by: AbortBy::Operator, reason: "aborted in Manager".into() }),
    ];
    for (strategy, phase, r, instances, want) in table {
        let o = seen(Some(r), instances);
        assert_eq!(
            look(strategy, phase, &o),
            ev(want),
            "{strategy:?} {phase:?}"
        );
    }
}

#[test]
fn a_user_abort_a_timeout_and_a_waypoint_come_before_anything_manager_says() {
    let mut o = seen(Some(record(M::Aborted)), source_running());
    o.user_abort = Some("changed my mind".into());
    assert_eq!(
        look(S::Overlap, P::TargetRunning, &o),
        ev(MigrationEvent::AbortRequested {
            by: AbortBy::User,
            reason: "changed my mind".into()
        })
    );
    o.user_abort = None;
    let late = next(
        &machine_in(S::Overlap, P::StartingTarget),
        &o,
        at(61),
        &PhaseTimeouts::default(),
    );
    assert_eq!(late, ev(MigrationEvent::PhaseTimedOut));
    assert_eq!(
        look(S::Overlap, P::TargetRunning, &o),
        ev(MigrationEvent::Proceed)
    );
    assert_eq!(look(S::Overlap, P::Pending, &o), Next::Wait);
    assert_eq!(look(S::Overlap, P::Completed, &o), Next::Wait);
}

#[test]
fn refused_calls_abort_or_fail_only_when_they_were_the_machines_own() {
    let propose = ManagerCall::Propose {
        strategy: S::Overlap,
    };
    let prepare = ManagerCall::PrepareTarget {
        node: "dst".into(),
        initial_state: Vec::new(),
    };
    let cutover = ManagerCall::Cutover {
        payload: Vec::new(),
    };
    let refused = CallOutcome::Refused("job x is not RUNNING".into());
    let full = CallOutcome::WorkerRefused {
        node_not_ready: false,
        message: "needs 40 capacity, 12.5 free".into(),
    };
    let starting = CallOutcome::WorkerRefused {
        node_not_ready: true,
        message: "node dst is NODE_STATE_STARTING".into(),
    };
    assert_eq!(
        answer(&propose, &refused, false),
        Some(MigrationEvent::AbortRequested {
            by: AbortBy::Operator,
            reason: "Manager refused the migration: job x is not RUNNING".into()
        })
    );
    assert_eq!(answer(&propose, &CallOutcome::Done, false), None);
    assert_eq!(
        answer(&prepare, &full, false),
        Some(MigrationEvent::TargetFailed {
            reason: "needs 40 capacity, 12.5 free".into()
        })
    );
    assert_eq!(
        answer(&prepare, &full, true),
        answer(&prepare, &full, false),
        "a worker's refusal stands however the call was sent"
    );
    assert_eq!(answer(&prepare, &starting, false), None);
    assert!(answer(&prepare, &refused, false).is_some());
    assert_eq!(answer(&prepare, &refused, true), None, "the mirror lagged");
    assert_eq!(answer(&cutover, &refused, false), None);
}

#[test]
fn a_resumed_handover_in_target_ready_takes_its_payload_from_managers_record() {
    let from_status = |strategy, phase| {
        MigrationMachine::resume(
            strategy,
            phase,
            at(5),
            Some("src".into()),
            Some("dst".into()),
        )
    };
    let with = resume(
        from_status(S::Handover, P::TargetReady),
        Some(&record(M::TargetReady)),
    );
    assert_eq!((with.phase(), with.entered_at()), (P::TargetReady, at(5)));
    let t = with
        .next(MigrationEvent::Proceed, at(6))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        t.actions,
        vec![Action::CutOver {
            payload: b"\"ready\"".to_vec()
        }]
    );
    let without = resume(from_status(S::Handover, P::TargetReady), None);
    let t = without
        .next(MigrationEvent::Proceed, at(6))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.phase, P::Aborted);
    let other = from_status(S::Overlap, P::StoppingSource);
    assert_eq!(resume(other.clone(), Some(&record(M::TargetReady))), other);
}

// ---- the controller's loop against a model of Manager ----

/// Manager as `docs/manager-api.md` describes it, for one job on "src" and one target "dst".
#[derive(Clone, Debug)]
struct ModelManager {
    strategy: Option<MigrationStrategy>,
    record: Option<ManagerRecord>,
    instances: Vec<Instance>,
    /// The roles instances were started with, in order.
    starts: Vec<InstanceRole>,
}

impl ModelManager {
    fn new() -> Self {
        ModelManager {
            strategy: None,
            record: None,
            instances: vec![inst("src", R::Normal, I::Running)],
            starts: vec![R::Normal],
        }
    }

    fn phase(&self) -> Option<ManagerPhase> {
        self.record.as_ref().map(|r| r.phase)
    }

    fn set_phase(&mut self, phase: ManagerPhase) {
        if let Some(r) = &mut self.record {
            r.phase = phase;
        }
    }

    fn instance(&mut self, role: InstanceRole) -> Option<&mut Instance> {
        self.instances
            .iter_mut()
            .find(|i| i.role == role && i.state.holds())
    }

    fn start_target(&mut self) {
        self.instances
            .push(inst("dst", R::MigrationTarget, I::Starting));
        self.starts.push(R::MigrationTarget);
    }

    fn promote(&mut self) {
        self.instances
            .retain(|i| !(i.role == R::Normal && i.node == "src"));
        for i in &mut self.instances {
            if i.role == R::MigrationTarget && i.state.holds() {
                i.role = R::Normal;
            }
        }
        self.set_phase(M::Completed);
    }

    fn call(&mut self, c: &ManagerCall) -> CallOutcome {
        let refused = || CallOutcome::Refused("wrong phase".into());
        match c {
            ManagerCall::Propose { strategy } => {
                let source_runs = self
                    .instances
                    .iter()
                    .any(|i| i.role == R::Normal && i.state == I::Running);
                if self.record.is_some() || !source_runs {
                    return refused();
                }
                self.strategy = Some(*strategy);
                self.record = Some(ManagerRecord {
                    phase: if *strategy == S::Handover {
                        M::Proposed
                    } else {
                        M::StateReceived
                    },
                    source_state: Vec::new(),
                    target_ready_payload: Vec::new(),
                    summary: HandoverSummary::default(),
                    aborted_by: ManagerParty::Unknown,
                    abort_reason: String::new(),
                });
                CallOutcome::Done
            }
            ManagerCall::PrepareTarget { node, .. } => {
                if self.phase() != Some(M::StateReceived) || node != "dst" {
                    return refused();
                }
                if self.strategy == Some(S::StopThenStart) {
                    self.set_phase(M::TargetReady);
                } else {
                    self.start_target();
                    self.set_phase(M::PreparingTarget);
                }
                CallOutcome::Done
            }
            ManagerCall::Cutover { .. } => {
                if self.phase() != Some(M::TargetReady) {
                    return refused();
                }
                match self.strategy {
                    Some(S::Overlap) => self.promote(),
                    Some(S::StopThenStart) => {
                        if let Some(s) = self.instance(R::Normal) {
                            s.state = I::Stopping;
                        }
                        self.set_phase(M::CuttingOver);
                    }
                    _ => self.set_phase(M::CuttingOver),
                }
                CallOutcome::Done
            }
            ManagerCall::Abort { reason } => {
                if self.phase() == Some(M::Completed) {
                    return refused();
                }
                if let Some(r) = &mut self.record
                    && r.phase != M::Aborted
                {
                    r.phase = M::Aborted;
                    r.aborted_by = ManagerParty::Controller;
                    r.abort_reason.clone_from(reason);
                }
                if let Some(t) = self.instance(R::MigrationTarget) {
                    t.state = I::Stopped;
                }
                CallOutcome::Done
            }
            ManagerCall::StopInstance { role, node } => {
                if let Some(i) = self
                    .instances
                    .iter_mut()
                    .find(|i| i.role == *role && i.node == *node && i.state.holds())
                {
                    i.state = I::Stopped;
                }
                CallOutcome::Done
            }
        }
    }

    /// One thing Manager (its timers, the job) does by itself; false when nothing is pending.
    fn tick(&mut self) -> bool {
        if let Some(i) = self.instances.iter_mut().find(|i| i.state == I::Starting) {
            i.state = I::Running;
        } else if let Some(i) = self.instances.iter_mut().find(|i| i.state == I::Stopping) {
            i.state = I::Stopped;
        } else {
            let target_runs = self
                .instances
                .iter()
                .any(|i| i.role == R::MigrationTarget && i.state == I::Running);
            let source_holds = self
                .instances
                .iter()
                .any(|i| i.role == R::Normal && i.node == "src" && i.state.holds());
            let has_target = self.instances.iter().any(|i| i.role == R::MigrationTarget);
            match (self.strategy, self.phase()) {
                (Some(S::Handover), Some(M::Proposed)) => {
                    if let Some(r) = &mut self.record {
                        r.phase = M::StateReceived;
                        r.source_state = b"{\"pos\":1}".to_vec();
                    }
                }
                (Some(S::Handover), Some(M::PreparingTarget)) if target_runs => {
                    if let Some(r) = &mut self.record {
                        r.phase = M::TargetReady;
                        r.target_ready_payload = b"\"ready\"".to_vec();
                    }
                }
                (Some(S::Overlap), Some(M::PreparingTarget)) if target_runs => {
                    self.set_phase(M::TargetReady);
                }
                (Some(S::Handover), Some(M::CuttingOver)) => self.promote(),
                (Some(S::StopThenStart), Some(M::CuttingOver)) if target_runs => self.promote(),
                (Some(S::StopThenStart), Some(M::CuttingOver)) if !source_holds && !has_target => {
                    self.start_target();
                }
                _ => return false,
            }
        }
        true
    }

    fn observed(&self) -> Observed {
        Observed {
            user_abort: None,
            record: self.record.clone(),
            instances: self.instances.clone(),
            target_node: NodeReadiness::Started,
        }
    }

    fn running(&self) -> usize {
        self.instances
            .iter()
            .filter(|i| i.state == I::Running)
            .count()
    }
}

/// How the run went.
struct Run {
    machine: MigrationMachine,
    manager: ModelManager,
    /// Fewest and most instances running at any look, once the migration had started.
    least_running: usize,
    most_running: usize,
    recovered: bool,
}

/// Runs the controller's loop (look → event → act → answer) against the model. `ticks[i]` is
/// how many things Manager does before look `i`; `stale[i]` makes look `i` see the previous
/// look's view (a lagging mirror); `fault` breaks something at a look.
fn run(
    strategy: MigrationStrategy,
    ticks: &[u8],
    stale: &[bool],
    fault: Option<(usize, Fault)>,
) -> Run {
    let mut machine = MigrationMachine::new(strategy, Some("src".into()), t0());
    let mut manager = ModelManager::new();
    let mut out = Run {
        machine: machine.clone(),
        manager: manager.clone(),
        least_running: usize::MAX,
        most_running: 0,
        recovered: false,
    };
    let mut queue = vec![MigrationEvent::Start];
    let mut previous = manager.observed();
    let mut clock = 0;
    for look in 0..400 {
        if machine.is_ended() {
            break;
        }
        for _ in 0..ticks.get(look % ticks.len().max(1)).copied().unwrap_or(1) {
            manager.tick();
        }
        if let Some((when, f)) = fault
            && when == look
        {
            f.inject(&mut manager);
        }
        let fresh = manager.observed();
        let mut o = if stale
            .get(look % stale.len().max(1))
            .copied()
            .unwrap_or(false)
        {
            previous.clone()
        } else {
            fresh.clone()
        };
        previous = fresh;
        // After a while, only time passes: timeouts end whatever is stuck.
        if look > 300 {
            clock += 100;
            o = manager.observed();
        }
        let step = match queue.pop() {
            Some(e) => Next::Event(e),
            None => next(&machine, &o, at(clock), &PhaseTimeouts::default()),
        };
        let event = match step {
            Next::Event(e) => e,
            Next::PlaceTarget => MigrationEvent::TargetPlaced { node: "dst".into() },
            Next::Resend(c) => {
                let outcome = manager.call(&c);
                if let Some(e) = answer(&c, &outcome, true) {
                    queue.push(e);
                }
                continue;
            }
            Next::Wait => {
                manager.tick();
                continue;
            }
        };
        let t = match machine.apply(event, at(clock)) {
            Ok(t) => t,
            Err(MigrationError::NotAbortable { .. }) => continue,
            Err(e) => panic!("{strategy:?} in {:?}: {e}", machine.phase()),
        };
        for a in &t.actions {
            if let Some(c) = a.call() {
                let outcome = manager.call(&c);
                if let Some(e) = answer(&c, &outcome, false) {
                    queue.push(e);
                }
            }
            if matches!(a, Action::RecoverByBand { .. }) {
                out.recovered = true;
            }
        }
        let running = manager.running();
        out.least_running = out.least_running.min(running);
        out.most_running = out.most_running.max(running);
    }
    out.machine = machine;
    out.manager = manager;
    out
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The target instance fails.
    TargetDies,
    /// The source instance fails.
    SourceDies,
    /// A user aborts.
    UserAborts,
}

impl Fault {
    fn inject(self, manager: &mut ModelManager) {
        let aborted = |manager: &mut ModelManager, reason: &str| {
            if let Some(r) = &mut manager.record
                && !matches!(r.phase, M::Completed | M::Aborted)
            {
                r.phase = M::Aborted;
                r.aborted_by = ManagerParty::Manager;
                r.abort_reason = reason.into();
            }
        };
        match self {
            Fault::TargetDies => {
                if let Some(t) = manager.instance(R::MigrationTarget) {
                    t.state = I::Failed;
                    aborted(manager, "the target instance stopped");
                }
            }
            Fault::SourceDies => {
                let src = manager
                    .instances
                    .iter_mut()
                    .find(|i| i.node == "src" && i.state == I::Running);
                if let Some(s) = src {
                    s.state = I::Failed;
                    aborted(manager, "the source instance stopped");
                }
            }
            Fault::UserAborts => {
                manager.call(&ManagerCall::Abort {
                    reason: "changed my mind".into(),
                });
            }
        }
    }
}

fn arb_strategy() -> impl Strategy<Value = MigrationStrategy> {
    prop_oneof![Just(S::StopThenStart), Just(S::Overlap), Just(S::Handover)]
}

fn arb_fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        Just(Fault::TargetDies),
        Just(Fault::SourceDies),
        Just(Fault::UserAborts)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// However Manager's timing goes and however far the mirror lags, every strategy completes
    /// through Manager's calls alone: the target is started once, as a migration target, and
    /// promoted; overlap never leaves the job without a running instance, stop-then-start never
    /// runs two.
    #[test]
    fn the_loop_completes_every_strategy_against_managers_model(
        strategy in arb_strategy(),
        ticks in prop::collection::vec(0u8..3, 1..8),
        stale in prop::collection::vec(any::<bool>(), 1..8),
    ) {
        let r = run(strategy, &ticks, &stale, None);
        prop_assert_eq!(r.machine.phase(), P::Completed, "{:?}: {:?}", strategy, r.manager);
        prop_assert_eq!(&r.manager.starts, &vec![R::Normal, R::MigrationTarget]);
        let live: Vec<Instance> = r.manager.instances.iter().filter(|i| i.state.holds()).cloned().collect();
        prop_assert_eq!(live, vec![inst("dst", R::Normal, I::Running)]);
        match strategy {
            S::Overlap => prop_assert!(r.least_running >= 1, "{}", r.least_running),
            S::StopThenStart => prop_assert!(r.most_running <= 1, "{}", r.most_running),
            S::Handover => {}
        }
    }

    /// A fault at any point ends the migration with the job on at most one instance: the source
    /// (aborted), the promoted target (completed), or none, left to the Bundle controller (handed
    /// to its band's recovery, or failed on its own) — never an instance and a recovery at once.
    #[test]
    fn a_fault_at_any_look_leaves_exactly_one_instance(
        strategy in arb_strategy(),
        ticks in prop::collection::vec(0u8..3, 1..8),
        stale in prop::collection::vec(any::<bool>(), 1..4),
        when in 0usize..30,
        fault in arb_fault(),
    ) {
        let r = run(strategy, &ticks, &stale, Some((when, fault)));
        prop_assert!(r.machine.is_ended(), "{:?} stuck in {:?}: {:?}", strategy, r.machine.phase(), r.manager);
        let live = r.manager.instances.iter().filter(|i| i.state.holds()).count();
        let failed_on_its_own = r.manager.instances.iter().any(|i| i.role == R::Normal && i.state == I::Failed);
        let why = format!("{:?} ended {:?} with {:?} (recovered: {})", strategy, r.machine.phase(), r.manager.instances, r.recovered);
        prop_assert!(live + usize::from(r.recovered) <= 1, "{}", why);
        prop_assert!(live > 0 || r.recovered || failed_on_its_own, "{}", why);
        prop_assert!(r.manager.starts.iter().skip(1).all(|role| *role == R::MigrationTarget));
    }
}
