//! `proto/norsk/api` against the package it was transcribed from, `@norskvideo/norsk-api`
//! 1.0.384 (`reference/`, installed with `npm ci`):
//!
//! - the descriptors protox compiles from our protos equal the package's own tables: every
//!   message, field (number, name, kind, type, label, oneof, map key and value), enum value and
//!   RPC (path, request, response, streaming flags); a mutated copy of our protos is caught;
//! - a filled sample of every message, encoded by the package's classes, decodes with our
//!   generated type and encodes again to the same bytes, which the package decodes back to the
//!   same value.
//!
//! Node runs the package (`oracle.rs` says what happens without it).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use manager_proto::api::registry;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};
use serde_json::Value;

#[path = "../reference/oracle.rs"]
mod oracle;

use oracle::{reference_dir, unavailable};

/// The package directory cargo gives the running test (see `oracle::reference_dir`).
fn package_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

fn proto_root() -> PathBuf {
    package_dir().join("../../proto")
}

fn node(script: &str, arg: Option<&str>, stdin: Option<&[u8]>) -> (bool, String) {
    let mut cmd = Command::new("node");
    cmd.arg(script).args(arg).current_dir(reference_dir());
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn node");
    let mut sin = child.stdin.take().expect("stdin");
    let input = stdin.unwrap_or_default().to_vec();
    let writer = std::thread::spawn(move || sin.write_all(&input));
    let out = child.wait_with_output().expect("wait for node");
    writer.join().expect("writer thread").expect("write stdin");
    (
        out.status.success(),
        String::from_utf8(out.stdout).expect("utf-8 from node"),
    )
}

fn package_tables() -> Value {
    let (ok, out) = node("tables.cjs", None, None);
    assert!(ok, "node tables.cjs failed");
    serde_json::from_str(&out).expect("tables.cjs prints JSON")
}

fn compile(root: &Path) -> Result<FileDescriptorSet, String> {
    protox::compile(["norsk/api/manager.proto"], [root]).map_err(|e| format!("{e:?}"))
}

/// One line per fact the package's tables state: message (and its file), field, enum value, RPC.
fn facts_of_package(t: &Value) -> BTreeSet<String> {
    let mut facts = BTreeSet::new();
    for (name, m) in t["messages"].as_object().expect("messages") {
        facts.insert(format!(
            "message {name} in {}",
            m["file"].as_str().unwrap_or("?")
        ));
        for f in m["fields"].as_array().expect("fields") {
            let kind = f["kind"].as_str().unwrap_or("?");
            let shape = if kind == "map" {
                let map = &f["map"];
                format!(
                    "map<{}, {} {}>",
                    map["key"],
                    map["value_kind"].as_str().unwrap_or("?"),
                    plain(&map["value_type"])
                )
            } else {
                format!("{kind} {}", plain(&f["type"]))
            };
            facts.insert(field_fact(
                name,
                f["no"].as_u64().unwrap_or(0),
                f["name"].as_str().unwrap_or("?"),
                &shape,
                f["repeated"].as_bool().unwrap_or(false),
                f["oneof"].as_str(),
                f["optional"].as_bool().unwrap_or(false),
            ));
        }
    }
    for (name, e) in t["enums"].as_object().expect("enums") {
        for v in e["values"].as_array().expect("values") {
            facts.insert(format!("enum {name} {} = {}", plain(&v[1]), v[0]));
        }
    }
    for r in t["rpcs"].as_array().expect("rpcs") {
        facts.insert(rpc_fact(
            r["path"].as_str().unwrap_or("?"),
            r["request"].as_str().unwrap_or("?"),
            r["response"].as_str().unwrap_or("?"),
            r["client_streaming"].as_bool().unwrap_or(false),
            r["server_streaming"].as_bool().unwrap_or(false),
        ));
    }
    facts
}

fn plain(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

fn field_fact(
    message: &str,
    no: u64,
    name: &str,
    shape: &str,
    repeated: bool,
    oneof: Option<&str>,
    optional: bool,
) -> String {
    let mut s = format!("field {message} #{no} {name}: {shape}");
    if repeated {
        s.push_str(" repeated");
    }
    if let Some(o) = oneof {
        s.push_str(&format!(" oneof {o}"));
    }
    if optional {
        s.push_str(" optional");
    }
    s
}

fn rpc_fact(path: &str, req: &str, resp: &str, cs: bool, ss: bool) -> String {
    format!("rpc {path}({}{req}) -> {}{resp}", stream(cs), stream(ss))
}

fn stream(s: bool) -> &'static str {
    if s { "stream " } else { "" }
}

/// The same facts, read from the descriptors protox compiled from our protos.
fn facts_of_protos(fds: &FileDescriptorSet) -> BTreeSet<String> {
    let mut facts = BTreeSet::new();
    for file in &fds.file {
        let package = file.package();
        if !package.starts_with("norsk.api.") {
            continue;
        }
        let file_name = file
            .name()
            .strip_prefix("norsk/api/")
            .unwrap_or(file.name());
        for m in &file.message_type {
            message_facts(m, package, file_name, &mut facts);
        }
        for e in &file.enum_type {
            enum_facts(e, package, &mut facts);
        }
        for s in &file.service {
            for m in &s.method {
                facts.insert(rpc_fact(
                    &format!("/{package}.{}/{}", s.name(), m.name()),
                    m.input_type().trim_start_matches('.'),
                    m.output_type().trim_start_matches('.'),
                    m.client_streaming(),
                    m.server_streaming(),
                ));
            }
        }
    }
    facts
}

fn enum_facts(e: &prost_types::EnumDescriptorProto, scope: &str, facts: &mut BTreeSet<String>) {
    for v in &e.value {
        facts.insert(format!(
            "enum {scope}.{} {} = {}",
            e.name(),
            v.name(),
            v.number()
        ));
    }
}

fn message_facts(m: &DescriptorProto, scope: &str, file: &str, facts: &mut BTreeSet<String>) {
    if m.options.as_ref().is_some_and(|o| o.map_entry()) {
        return;
    }
    let full = format!("{scope}.{}", m.name());
    facts.insert(format!("message {full} in {file}"));
    for f in &m.field {
        let type_name = f.type_name().trim_start_matches('.');
        let map_entry = m.nested_type.iter().find(|n| {
            n.options.as_ref().is_some_and(|o| o.map_entry())
                && format!("{full}.{}", n.name()) == type_name
        });
        let shape = if let Some(entry) = map_entry {
            let key = &entry.field[0];
            let value = &entry.field[1];
            format!(
                "map<{}, {} {}>",
                key.r#type() as i32,
                kind_of(value.r#type()),
                type_of(value)
            )
        } else {
            format!("{} {}", kind_of(f.r#type()), type_of(f))
        };
        let oneof = f
            .oneof_index
            .filter(|_| !f.proto3_optional())
            .and_then(|i| m.oneof_decl.get(usize::try_from(i).ok()?))
            .map(|o| o.name());
        facts.insert(field_fact(
            &full,
            u64::try_from(f.number()).unwrap_or(0),
            f.name(),
            &shape,
            f.label() == Label::Repeated && map_entry.is_none(),
            oneof,
            f.proto3_optional(),
        ));
    }
    for n in &m.nested_type {
        message_facts(n, &full, file, facts);
    }
    for e in &m.enum_type {
        enum_facts(e, &full, facts);
    }
}

fn kind_of(t: Type) -> &'static str {
    match t {
        Type::Message | Type::Group => "message",
        Type::Enum => "enum",
        _ => "scalar",
    }
}

/// A scalar's type number (the package's tables use the descriptor's numbering), else the
/// full name of the message or enum.
fn type_of(f: &prost_types::FieldDescriptorProto) -> String {
    match f.r#type() {
        Type::Message | Type::Group | Type::Enum => {
            f.type_name().trim_start_matches('.').to_owned()
        }
        t => (t as i32).to_string(),
    }
}

/// What differs, one line each, empty when the two agree.
fn differences(package: &BTreeSet<String>, ours: &BTreeSet<String>) -> Vec<String> {
    package
        .difference(ours)
        .map(|f| format!("only in the package: {f}"))
        .chain(
            ours.difference(package)
                .map(|f| format!("only in proto/norsk/api: {f}")),
        )
        .collect()
}

#[test]
fn the_transcription_equals_the_package_tables() {
    if unavailable().is_some() {
        return;
    }
    let package = facts_of_package(&package_tables());
    let ours = facts_of_protos(&compile(&proto_root()).expect("proto/norsk/api compiles"));
    let diffs = differences(&package, &ours);
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
    // The published surface, counted, so a table that came back empty cannot pass.
    let count = |prefix: &str| package.iter().filter(|f| f.starts_with(prefix)).count();
    assert_eq!(count("message norsk.api.manager."), 48);
    assert_eq!(count("message norsk.api.common."), 38);
    assert_eq!(count("rpc /norsk.api.manager.Manager/"), 13);
    let enums: BTreeSet<&str> = package
        .iter()
        .filter_map(|f| f.strip_prefix("enum "))
        .filter_map(|f| f.split(' ').next())
        .collect();
    assert_eq!(enums.len(), 10, "{enums:?}");
}

/// Each edit a careless transcription could make, and a fact the comparison must then report.
const MUTATIONS: &[(&str, &str, &str, &str)] = &[
    (
        "manager.proto",
        "int32 pending_window_s = 1;",
        "int32 pending_window_s = 2;",
        "pending_window_s",
    ),
    (
        "manager.proto",
        "message StartJobRequest {\n  norsk.api.common.JobId job_id = 1;\n  string role = 2;",
        "message StartJobRequest {\n  norsk.api.common.JobId job_id = 1;\n  string rol = 2;",
        "StartJobRequest #2",
    ),
    (
        "manager.proto",
        "string instance_type = 4;",
        "bytes instance_type = 4;",
        "CreateAwsNodeRequest #4",
    ),
    (
        "manager.proto",
        "returns (stream EventStreamEvent)",
        "returns (EventStreamEvent)",
        "EventStream",
    ),
    (
        "manager.proto",
        "  rpc CompleteJob(norsk.api.common.JobId) returns (google.protobuf.Empty);\n",
        "",
        "CompleteJob",
    ),
    ("manager.proto", "LTS = 3;", "LTS = 4;", "LTS"),
    (
        "manager.proto",
        "map<string, string> tags = 2;\n  string ip_address = 3;",
        "map<string, bytes> tags = 2;\n  string ip_address = 3;",
        "PhysicalNode #2",
    ),
    (
        "shared/common.proto",
        "string job_id = 1;",
        "string job_id = 1;\n  string extra = 2;",
        "extra",
    ),
    (
        "shared/common.proto",
        "repeated uint32 cpu_set = 4;",
        "uint32 cpu_set = 4;",
        "cpu_set",
    ),
];

#[test]
fn a_mutated_transcription_is_caught() {
    if unavailable().is_some() {
        return;
    }
    let package = facts_of_package(&package_tables());
    for (file, from, to, named) in MUTATIONS {
        let dir = tempfile::tempdir().expect("tempdir");
        let api = dir.path().join("norsk/api");
        std::fs::create_dir_all(api.join("shared")).expect("mkdir");
        for f in ["manager.proto", "shared/common.proto"] {
            let text = std::fs::read_to_string(proto_root().join("norsk/api").join(f))
                .expect("read proto");
            let text = if f == *file {
                assert!(
                    text.contains(from),
                    "mutation {from:?} no longer applies to {f}"
                );
                text.replacen(from, to, 1)
            } else {
                text
            };
            std::fs::write(api.join(f), text).expect("write proto");
        }
        let fds = compile(dir.path()).expect("the mutated copy still compiles");
        let diffs = differences(&package, &facts_of_protos(&fds));
        assert!(
            diffs.iter().any(|d| d.contains(named)),
            "{file}: {from:?} -> {to:?} went unnoticed: {diffs:?}"
        );
    }
}

#[test]
fn every_published_message_has_our_generated_type() {
    if unavailable().is_some() {
        return;
    }
    let tables = package_tables();
    let package: BTreeSet<&str> = tables["messages"]
        .as_object()
        .expect("messages")
        .keys()
        .map(String::as_str)
        .collect();
    let ours: BTreeSet<&str> = registry::MESSAGES.iter().copied().collect();
    assert_eq!(package, ours);
}

#[test]
fn every_message_round_trips_byte_for_byte_with_the_package() {
    if unavailable().is_some() {
        return;
    }
    let (ok, out) = node("samples.cjs", Some("generate"), None);
    assert!(ok, "node samples.cjs generate failed");
    let mut samples: Vec<Value> = serde_json::from_str(&out).expect("samples are JSON");
    assert!(samples.len() >= 86, "{} samples", samples.len());
    let mut differ = Vec::new();
    for s in &mut samples {
        let ty = s["type"].as_str().expect("type").to_owned();
        let theirs = BASE64
            .decode(s["bytes"].as_str().expect("bytes"))
            .expect("base64");
        let ours = registry::reencode(&ty, &theirs)
            .unwrap_or_else(|| panic!("{ty}: no generated type"))
            .unwrap_or_else(|e| panic!("{ty} sample {}: {e}", s["sample"]));
        if ours != theirs {
            differ.push(format!("{ty} sample {}", s["sample"]));
        }
        s["ours"] = Value::String(BASE64.encode(&ours));
    }
    assert!(
        differ.is_empty(),
        "our encoding differs from the package's: {differ:?}"
    );
    let input = serde_json::to_vec(&samples).expect("JSON");
    let (ok, out) = node("samples.cjs", Some("verify"), Some(&input));
    assert!(ok, "the package read our encodings differently:\n{out}");
}
