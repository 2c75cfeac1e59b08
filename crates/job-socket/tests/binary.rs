//! The conformance binary's own contract: one output line per input line, in order; bad
//! arguments are a usage error (exit 2), never a panic.

use std::io::Write;
use std::process::{Command, Stdio};

fn run(args: &[&str], stdin: &[u8]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_job-socket"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).expect("utf-8"),
    )
}

#[test]
fn each_input_line_gives_one_output_line_in_order() {
    let (code, out) = run(&["parse-path"], b"/instances/a/b\nnope\n/instances/%2F/x?q");
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "{\"jobId\":\"a\",\"role\":\"b\"}\nnull\n{\"jobId\":\"/\",\"role\":\"x\"}\n"
    );
    let (_, out) = run(&["encode-payload"], b"\n[1,2]\nnot json\n");
    assert_eq!(
        out,
        "\"bnVsbA==\"\n\"WzEsMl0=\"\n{\"error\":\"input is not valid JSON\"}\n"
    );
    let (_, out) = run(&["decode-payload"], b"\n!!\n");
    assert_eq!(out, "null\n{\"error\":\"input is not valid base64\"}\n");
    let (_, out) = run(
        &["parse-frame", "--from", "worker"],
        b"{\"type\":\"hello-ack\"}\n\xff\n",
    );
    assert_eq!(
        out,
        "{\"ok\":true,\"message\":{\"type\":\"hello-ack\"}}\n{\"ok\":false,\"reason\":\"frame is not valid JSON\"}\n"
    );
}

#[test]
fn empty_input_gives_no_output() {
    assert_eq!(
        run(&["parse-frame", "--from", "job"], b""),
        (0, String::new())
    );
}

#[test]
fn bad_arguments_are_a_usage_error() {
    for args in [
        &[][..],
        &["parse-frame"],
        &["parse-frame", "--from", "manager"],
        &["frobnicate"],
        &["parse-path", "x"],
    ] {
        assert_eq!(run(args, b"").0, 2, "{args:?}");
    }
}
