//! The reference (Node, `reference/cli.mjs`) and the `job-socket` binary run side by side over
//! every vector input; their stdout must be identical, and equal to the stored vectors (so stale
//! vectors are caught too). Skipped, saying why, only when `node` is absent or the reference's
//! `node_modules` cannot be installed (`make job-socket-reference` installs it with `npm ci`).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

#[derive(serde::Deserialize)]
struct Vectors {
    command: Vec<String>,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    input: String,
    output: String,
}

fn reference_dir() -> PathBuf {
    package_dir().join("reference")
}

/// Why the comparison cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    if Command::new("node")
        .arg("--version")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        return Some("`node` is not on PATH".to_owned());
    }
    let dir = reference_dir();
    if dir
        .join("node_modules/@norskvideo/ctl-product-template-schema/migration-socket.js")
        .exists()
    {
        return None;
    }
    let ok = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&dir)
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    (!ok).then(|| "`npm ci` in crates/job-socket/reference failed (no registry access?)".to_owned())
}

fn run(mut cmd: Command, stdin: &[u8]) -> String {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut sin = child.stdin.take().expect("stdin");
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || sin.write_all(&input));
    let out = child.wait_with_output().expect("wait");
    writer.join().expect("writer thread").expect("write stdin");
    assert!(out.status.success(), "{cmd:?} failed");
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

fn vector_files() -> Vec<(PathBuf, Vectors, String)> {
    let vectors = package_dir().join("vectors");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&vectors)
        .expect("vectors dir")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(files.len() >= 5, "expected the five vector files");
    files
        .into_iter()
        .map(|file| {
            let v: Vectors = serde_json::from_str(&std::fs::read_to_string(&file).expect("read"))
                .expect("parse");
            let stdin: String = v.cases.iter().map(|c| format!("{}\n", c.input)).collect();
            (file, v, stdin)
        })
        .collect()
}

fn binary(v: &Vectors, stdin: &str) -> String {
    let mut ours = Command::new(env!("CARGO_BIN_EXE_job-socket"));
    ours.args(&v.command);
    run(ours, stdin.as_bytes())
}

/// Runs without Node: the binary against the stored outputs.
#[test]
fn the_binary_prints_the_stored_reference_output_for_every_vector() {
    for (file, v, stdin) in vector_files() {
        let out = binary(&v, &stdin);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines.len(),
            v.cases.len(),
            "{}: a line per input",
            file.display()
        );
        for (c, o) in v.cases.iter().zip(lines) {
            assert_eq!(o, c.output, "{}: input {:?}", file.display(), c.input);
        }
    }
}

#[test]
fn reference_and_binary_print_the_same_lines_for_every_vector() {
    if let Some(why) = unavailable() {
        eprintln!("SKIPPED reference_and_binary_print_the_same_lines_for_every_vector: {why}");
        return;
    }
    for (file, v, stdin) in vector_files() {
        let mut node = Command::new("node");
        node.arg(reference_dir().join("cli.mjs")).args(&v.command);
        let (theirs, ours) = (run(node, stdin.as_bytes()), binary(&v, &stdin));
        let (theirs, ours): (Vec<&str>, Vec<&str>) =
            (theirs.lines().collect(), ours.lines().collect());
        assert_eq!(
            theirs.len(),
            v.cases.len(),
            "{}: reference printed a line per input",
            file.display()
        );
        assert_eq!(
            ours.len(),
            v.cases.len(),
            "{}: binary printed a line per input",
            file.display()
        );
        for ((c, t), o) in v.cases.iter().zip(&theirs).zip(&ours) {
            assert_eq!(t, o, "{}: input {:?}", file.display(), c.input);
            assert_eq!(
                *t,
                c.output,
                "{}: stored vector is stale for {:?}; rerun gen-vectors.mjs",
                file.display(),
                c.input
            );
        }
    }
}

/// This package's directory, as cargo tells the running test: a test executable cargo finds
/// fresh may have been built in another checkout that shares the target dir, and the path
/// compiled into it would read that checkout's files.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
