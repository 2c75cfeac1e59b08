//! `validate`'s report as text.

use crate::validate::Report;

/// One line per object, one indented line per problem, then a count.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for o in &report.objects {
        let name = match &o.namespace {
            Some(ns) => format!("{ns}/{}", o.name),
            None => o.name.clone(),
        };
        let name = if name.is_empty() {
            "(no name)".to_owned()
        } else {
            name
        };
        if o.valid {
            out.push_str(&format!("{} {name}: valid ({})\n", o.kind, o.origin));
        } else {
            out.push_str(&format!(
                "{} {name}: {} problem{} ({})\n",
                nonempty(&o.kind),
                o.errors.len(),
                if o.errors.len() == 1 { "" } else { "s" },
                o.origin
            ));
            for e in &o.errors {
                out.push_str(&format!("  {}: {}\n", e.path, e.message));
            }
        }
    }
    for s in &report.skipped {
        out.push_str(&format!("skipped {s}: not an AutoManager object\n"));
    }
    for n in &report.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    let invalid = report.objects.iter().filter(|o| !o.valid).count();
    out.push_str(&format!(
        "{} object{} checked, {invalid} invalid\n",
        report.objects.len(),
        if report.objects.len() == 1 { "" } else { "s" }
    ));
    out
}

fn nonempty(s: &str) -> &str {
    if s.is_empty() { "object" } else { s }
}
