//! Compiles the protos with `protox` (a pure-Rust protobuf compiler) so building needs no system
//! `protoc`, then generates the tonic clients and servers with `tonic-prost-build`:
//!
//! - `proto/norsk/api/`: Norsk Manager's published API (`norsk.api.manager` and
//!   `norsk.api.common`, as `@norskvideo/norsk-api` 1.0.384 defines them);
//! - `proto/norsk/manager/v1/`: the API this project designed before the published one was
//!   known, still served by manager-sim and spoken by the operator until they move over;
//! - `proto/automanager/manager/extension/v1/`: our extension service for what the published API
//!   lacks (package `automanager.manager.extension.v1`), whose ids are the published API's own
//!   `norsk.api.common` types (used from [`api::common`], not generated twice).
//!
//! It also writes `published_registry.rs`: one decode-and-encode function per published message,
//! found by its full name, which the conformance tests use to put the package's own encodings
//! through our generated types.

use std::fmt::Write as _;

use heck::{ToSnakeCase, ToUpperCamelCase};
use prost_types::{DescriptorProto, FileDescriptorSet};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = "../../proto";
    println!("cargo:rerun-if-changed={proto_root}");

    let published = protox::compile(["norsk/api/manager.proto"], [proto_root])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("published_registry.rs"), registry(&published))?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Map entries encode in key order, so an encoding is the same on every run (and the same
        // as the package's own, which writes entries in insertion order).
        .btree_map(".")
        .compile_fds(published)?;

    let extension = protox::compile(
        ["automanager/manager/extension/v1/extension.proto"],
        [proto_root],
    )?;
    // A directory of its own: the set holds the published files it imports, which must not
    // be written over the code generated above (their types are used from `api::common`).
    let extension_dir = out_dir.join("extension");
    std::fs::create_dir_all(&extension_dir)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .btree_map(".")
        .extern_path(".norsk.api.common", "crate::api::common")
        .out_dir(&extension_dir)
        .compile_fds(extension)?;

    let v1 = protox::compile(["norsk/manager/v1/manager.proto"], [proto_root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // serde on every message lets manager-sim persist its world as JSON.
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        // A field added to the proto reads as its default from a state file
        // written before it existed.
        .message_attribute(".", "#[serde(default)]")
        .compile_fds(v1)?;
    Ok(())
}

/// `reencode(full_name, bytes)`: decode `bytes` as that published message with our generated
/// type and encode it again; `None` for a name that is not one of ours.
fn registry(fds: &FileDescriptorSet) -> String {
    let mut arms = String::new();
    let mut names = String::new();
    for file in &fds.file {
        let package = file.package();
        let Some(module) = package.strip_prefix("norsk.api.") else {
            continue;
        };
        for message in &file.message_type {
            visit(
                message,
                package,
                &format!("crate::api::{module}"),
                &mut |full, path| {
                    let _ = writeln!(arms, "        {full:?} => reencode_as::<{path}>(bytes),");
                    let _ = writeln!(names, "    {full:?},");
                },
            );
        }
    }
    format!(
        "/// Every message of the published API, by full name.\n\
         pub const MESSAGES: &[&str] = &[\n{names}];\n\n\
         /// Decodes `bytes` as the published message `type_name` with our generated type and\n\
         /// encodes it again; `None` when `type_name` is not a message of the published API.\n\
         pub fn reencode(type_name: &str, bytes: &[u8]) -> Option<Result<Vec<u8>, prost::DecodeError>> {{\n\
         \x20   Some(match type_name {{\n{arms}        _ => return None,\n    }})\n}}\n\n\
         fn reencode_as<M: prost::Message + Default>(bytes: &[u8]) -> Result<Vec<u8>, prost::DecodeError> {{\n\
         \x20   Ok(M::decode(bytes)?.encode_to_vec())\n}}\n"
    )
}

/// Calls `found(full name, Rust path)` for `message` and every message nested in it, skipping the
/// entries protoc makes for map fields (they are not types of their own in prost).
fn visit(message: &DescriptorProto, scope: &str, rust: &str, found: &mut dyn FnMut(&str, &str)) {
    if message.options.as_ref().is_some_and(|o| o.map_entry()) {
        return;
    }
    let full = format!("{scope}.{}", message.name());
    found(
        &full,
        &format!("{rust}::{}", message.name().to_upper_camel_case()),
    );
    let nested = format!("{rust}::{}", message.name().to_snake_case());
    for child in &message.nested_type {
        visit(child, &full, &nested, found);
    }
}
