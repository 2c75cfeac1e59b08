//! `job-socket`: the conformance binary. Reads one input per line on stdin and writes one JSON
//! value per line on stdout, in order (see `job_socket::conformance`).

use job_socket::conformance::{self, From};
use std::io::{Read, Write};
use std::process::ExitCode;

const USAGE: &str = "usage: job-socket <parse-frame --from job|worker | parse-path | encode-payload | decode-payload> < lines";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let op: Box<dyn Fn(&str) -> String> = match args.as_slice() {
        ["parse-frame", "--from", "job"] => Box::new(|l| conformance::parse_frame(From::Job, l)),
        ["parse-frame", "--from", "worker"] => {
            Box::new(|l| conformance::parse_frame(From::Worker, l))
        }
        ["parse-path"] => Box::new(conformance::parse_path),
        ["encode-payload"] => Box::new(conformance::encode_payload),
        ["decode-payload"] => Box::new(conformance::decode_payload),
        ["--help" | "-h"] => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().lock().read_to_end(&mut input) {
        eprintln!("job-socket: reading stdin: {e}");
        return ExitCode::FAILURE;
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in conformance::lines(&input) {
        if writeln!(out, "{}", op(&line)).is_err() {
            return ExitCode::FAILURE;
        }
    }
    if out.flush().is_err() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
