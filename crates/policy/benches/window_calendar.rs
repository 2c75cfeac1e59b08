//! `cargo bench -p automanager-policy --bench window_calendar`: how long the window calendar
//! takes to read windows and to answer "when does it next open" for any window, including
//! patterns that never open (refused at once) and rare ones (29 February). Prints one line per
//! case and a summary line; asserts answers, never times.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use automanager_policy::calendar::{Calendar, Recurrence, Window, WindowError};
use automanager_policy::vocab::VoluntaryReason;
use chrono::{DateTime, TimeZone, Utc};

/// 48 patterns no month has a day for, as a fleet of hostile or mistaken Bundles might carry.
fn never() -> Vec<String> {
    let mut v = Vec::new();
    for day in [30, 31] {
        v.push(format!("0 0 {day} 2 *"));
        v.push(format!("{} 3 {day} FEB ?", day % 60));
    }
    for m in [
        "4", "6", "9", "11", "APR", "JUN", "SEP", "NOV", "4,6", "9,11", "4-6/2", "apr,nov",
    ] {
        v.push(format!("0 1 31 {m} *"));
        v.push(format!("30 2 31 {m} ?"));
    }
    for h in 0..20 {
        v.push(format!("{h} {h} 30-31 2 *"));
    }
    v.truncate(48);
    v
}

/// 48 patterns that open, from every few minutes to once in four years.
fn opening() -> Vec<String> {
    let mut v = vec![
        "0 0 29 2 *".to_owned(),
        "0 2 * * SAT".to_owned(),
        "@daily".to_owned(),
    ];
    for h in 0..45 {
        v.push(format!("{} {} * * {}", h % 60, h % 24, h % 7));
    }
    v
}

fn time<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed())
}

fn main() {
    let now: DateTime<Utc> = Utc
        .with_ymd_and_hms(2026, 12, 7, 12, 0, 0)
        .single()
        .unwrap();
    let never = never();
    let (refused, read_never) = time(|| {
        never
            .iter()
            .map(|s| Recurrence::parse(s, "1h", "UTC"))
            .collect::<Vec<_>>()
    });
    assert_eq!(never.len(), 48);
    for (s, r) in never.iter().zip(&refused) {
        assert!(
            matches!(r, Err(WindowError::NeverMatches { .. })),
            "{s}: {r:?}"
        );
    }
    eprintln!("read 48 never-opening windows: {read_never:?} (all refused: never matches)");

    let opening = opening();
    let (windows, read_open) = time(|| {
        opening
            .iter()
            .map(|s| Window::parse(s, "1h", "Europe/Oslo", &[]).unwrap())
            .collect::<Vec<_>>()
    });
    eprintln!("read {} opening windows: {read_open:?}", windows.len());

    let (nexts, next_open) = time(|| {
        windows
            .iter()
            .map(|w| w.recurrence.next_opening(now).expect("opens"))
            .collect::<Vec<_>>()
    });
    assert!(nexts.iter().all(|o| o.start > now));
    eprintln!("next opening of each: {next_open:?}");

    let calendar = Calendar::new(windows);
    let (permit, permit_time) = time(|| calendar.permit(VoluntaryReason::Drain, now));
    eprintln!("one permit over all of them: {permit_time:?} ({permit:?})");

    let unreadable = Calendar::unreadable("schedule \"0 0 31 2 *\" never matches a date");
    assert!(!unreadable.permit(VoluntaryReason::Drain, now).allows());

    println!(
        "window_calendar never_open_48_ms={:.1} open_48_ms={:.1} next_opening_48_ms={:.1} permit_ms={:.1}",
        read_never.as_secs_f64() * 1e3,
        read_open.as_secs_f64() * 1e3,
        next_open.as_secs_f64() * 1e3,
        permit_time.as_secs_f64() * 1e3
    );
}
