//! Compiles `proto/norsk/manager/v1/manager.proto` with `protox` (a pure-Rust
//! protobuf compiler) so building needs no system `protoc`, then generates the
//! tonic client and server with `tonic-prost-build`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = "../../proto";
    let file = "norsk/manager/v1/manager.proto";
    println!("cargo:rerun-if-changed={proto_root}/{file}");
    let fds = protox::compile([file], [proto_root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // serde on every message lets manager-sim persist its world as JSON.
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        // Added after state files were first written: those files still load.
        .field_attribute("Node.request_id", "#[serde(default)]")
        .compile_fds(fds)?;
    Ok(())
}
