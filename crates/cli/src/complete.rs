//! Completions for kubectl. kubectl (1.26 and later) completes `kubectl automanager …` by
//! running `kubectl_complete-automanager` from `PATH` with the words typed so far, the last
//! being the one to complete, and reads one candidate a line (`word<TAB>description`) then
//! `:<directive>`, cobra's protocol. `kubectl_complete-automanager` runs
//! `kubectl-automanager __complete "$@"`, which answers from the command line's own definition.

use clap::CommandFactory;

use crate::Cli;

/// cobra's `ShellCompDirectiveDefault`: the shell may complete file names.
const FILES: u8 = 0;
/// cobra's `ShellCompDirectiveNoFileComp`.
const NO_FILES: u8 = 4;

/// Candidates for the last of `words`, then the directive line.
pub fn complete(words: &[String]) -> String {
    let (partial, before) = match words.split_last() {
        Some((last, rest)) => (last.as_str(), rest),
        None => ("", &[][..]),
    };
    let mut root = Cli::command();
    root.build();
    let mut cmd = &root;
    let mut wants_value: Option<&clap::Arg> = None;
    for w in before {
        if let Some(arg) = wants_value.take() {
            let _ = arg;
            continue;
        }
        if let Some(arg) = flag(cmd, w) {
            if takes_value(arg) && !w.contains('=') {
                wants_value = Some(arg);
            }
            continue;
        }
        if let Some(sub) = cmd.find_subcommand(w) {
            cmd = sub;
        }
    }
    let mut out: Vec<String> = Vec::new();
    let directive = if let Some(arg) = wants_value {
        values(arg, partial, &mut out)
    } else if partial.starts_with('-') {
        for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
            if let Some(l) = a.get_long() {
                push(&mut out, &format!("--{l}"), &help, partial);
            }
            if let Some(s) = a.get_short() {
                push(&mut out, &format!("-{s}"), &help, partial);
            }
        }
        NO_FILES
    } else {
        for s in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let help = s.get_about().map(|h| h.to_string()).unwrap_or_default();
            push(&mut out, s.get_name(), &help, partial);
        }
        NO_FILES
    };
    let mut text: String = out.into_iter().map(|l| format!("{l}\n")).collect();
    text.push_str(&format!(":{directive}\n"));
    text
}

fn flag<'a>(cmd: &'a clap::Command, word: &str) -> Option<&'a clap::Arg> {
    if let Some(long) = word.strip_prefix("--") {
        let name = long.split('=').next().unwrap_or(long);
        return cmd.get_arguments().find(|a| a.get_long() == Some(name));
    }
    let short = word.strip_prefix('-')?.chars().next()?;
    cmd.get_arguments().find(|a| a.get_short() == Some(short))
}

fn takes_value(arg: &clap::Arg) -> bool {
    arg.get_num_args().is_some_and(|n| n.takes_values())
}

/// Values of a flag: its declared ones, `-o`'s formats, or files for file arguments.
fn values(arg: &clap::Arg, partial: &str, out: &mut Vec<String>) -> u8 {
    if arg.get_id() == "output" {
        for f in ["text", "wide", "json", "yaml", "name", "jsonpath="] {
            push(out, f, "", partial);
        }
        return NO_FILES;
    }
    let possible = arg.get_possible_values();
    if !possible.is_empty() {
        for v in possible.iter().filter(|v| !v.is_hide_set()) {
            let help = v.get_help().map(|h| h.to_string()).unwrap_or_default();
            push(out, v.get_name(), &help, partial);
        }
        return NO_FILES;
    }
    match arg
        .get_value_names()
        .and_then(|n| n.first())
        .map(|n| n.as_str())
    {
        Some("FILE") => FILES,
        _ => NO_FILES,
    }
}

fn push(out: &mut Vec<String>, word: &str, help: &str, partial: &str) {
    if !word.starts_with(partial) {
        return;
    }
    let help = help.lines().next().unwrap_or("");
    if help.is_empty() {
        out.push(word.to_owned());
    } else {
        out.push(format!("{word}\t{help}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn commands_then_flags_then_values() {
        let c = complete(&words(&["tr"]));
        assert!(c.starts_with("trace\t"), "{c}");
        assert!(c.ends_with(":4\n"), "{c}");
        let c = complete(&words(&[""]));
        for cmd in ["map", "what-if", "validate", "migrate"] {
            assert!(
                c.lines().any(|l| l.starts_with(&format!("{cmd}\t"))),
                "{cmd}: {c}"
            );
        }
        assert!(!c.contains("__complete"), "{c}");
        let c = complete(&words(&["drain", "n1", "--mo"]));
        assert!(c.starts_with("--mode\t"), "{c}");
        let c = complete(&words(&["drain", "n1", "--mode", ""]));
        assert!(c.contains("migrate") && c.contains("terminate"), "{c}");
        let c = complete(&words(&["map", "--con"]));
        assert!(c.starts_with("--context\t"), "{c}");
        let c = complete(&words(&["top", "-o", "j"]));
        assert_eq!(c, "json\njsonpath=\n:4\n");
        let c = complete(&words(&["validate", "-f", ""]));
        assert_eq!(c, ":0\n");
    }
}
