//! The CEL rule that refuses a window or spare schedule that never opens
//! (`automanager_api::window::NEVER_OPENS_RULE`), evaluated with the CEL interpreter `validate`
//! uses, agrees with the operator's calendar: every schedule it refuses, the calendar says never
//! opens, so admission never refuses a schedule that would open. What it lets through the
//! calendar reads (tests/e2e/tests/crds_and_examples.rs holds the apiserver to the same table).

use std::sync::Arc;

use automanager_api::calendar::{Recurrence, WindowError};
use automanager_api::window::NEVER_OPENS_RULE;

/// Whether the rule admits `schedule`.
fn admitted(program: &cel::Program, schedule: &str) -> bool {
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("self", cel::Value::String(Arc::new(schedule.to_owned())));
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(b)) => b,
        other => panic!("{schedule:?}: the rule gave {other:?}"),
    }
}

fn never_opens(schedule: &str) -> bool {
    matches!(
        Recurrence::parse(schedule, "1h", "UTC"),
        Err(WindowError::NeverMatches { .. })
    )
}

#[test]
fn what_admission_refuses_the_calendar_says_never_opens() {
    let program = cel::Program::compile(NEVER_OPENS_RULE).expect("the rule compiles");
    // (schedule, refused at admission, opens by the calendar)
    let table = [
        ("0 0 31 2 *", true, false),
        ("0 0 30,31 2 *", true, false),
        ("0 0 31 4,6,9,11 *", true, false),
        ("0 0 31 2,4,6,9,11 *", true, false),
        ("15 3 31 feb ?", true, false),
        ("0 0 31 APR,Jun,sep,NOV *", true, false),
        ("0 0 30 02 *", true, false),
        ("0,30 */2 31,31 11 *", true, false),
        ("\t0 0 31 2 *  ", true, false),
        // 29 February opens in leap years.
        ("0 0 29 2 *", false, true),
        ("0 0 29,30 2 *", false, true),
        ("0 0 31 1-12 *", false, true),
        ("*/5 * * * *", false, true),
        ("0 0 31 1,2 *", false, true),
        ("0 0 30,31 2,3 *", false, true),
        ("0 0 30 4,6,9,11 *", false, true),
        // A day of the week named: cron opens on either, so this opens every Monday.
        ("0 0 31 2 MON", false, true),
        ("@monthly", false, true),
        // Ranges and steps the rule does not judge: the operator's calendar does.
        ("0 0 30-31 2 *", false, false),
        ("0 0 31 4-6/2 *", false, false),
    ];
    let mut failures = Vec::new();
    for (schedule, refused, opens) in table {
        if admitted(&program, schedule) == refused {
            failures.push(format!(
                "{schedule:?}: refused {}, expected {refused}",
                !refused
            ));
        }
        if never_opens(schedule) == opens {
            failures.push(format!("{schedule:?}: the calendar opens it: {}", !opens));
        }
        if refused && !never_opens(schedule) {
            failures.push(format!(
                "{schedule:?}: refused, but the calendar would open it"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
