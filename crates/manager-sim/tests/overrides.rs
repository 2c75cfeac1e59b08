//! Manager's overrides file, as docs/manager-overrides.md shows it, applied by the `manager-sim`
//! binary to its pools and read back over Manager's own API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use manager_proto::manager_client::ManagerClient;
use manager_proto::{ListPoolsRequest, ProviderKind};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn root() -> PathBuf {
    package_dir().join("../..")
}

/// The first ```json block of the overrides doc: the shape people are told to write.
fn documented_example() -> String {
    let doc = std::fs::read_to_string(root().join("docs/manager-overrides.md")).unwrap();
    let start = doc.find("```json\n").expect("a json block") + "```json\n".len();
    let len = doc[start..].find("```").expect("closed");
    doc[start..start + len].to_owned()
}

fn serve(overrides: &Path) -> (Killed, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_manager-sim"))
        .args(["serve", "--no-job-socket", "--config"])
        .arg(root().join("deploy/demo/manager-sim.yaml"))
        .env("NORSK_MANAGER_OVERRIDES_FILE", overrides)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let child = Killed(child);
    if line.is_empty() {
        let mut err = String::new();
        for l in BufReader::new(stderr).lines() {
            err.push_str(&l.unwrap_or_default());
            err.push('\n');
        }
        return (child, String::new(), err);
    }
    let addr = line
        .trim()
        .strip_prefix("manager-sim listening on ")
        .expect(&line);
    (child, format!("http://{addr}"), String::new())
}

#[tokio::test]
async fn the_documented_file_retargets_the_sims_pools() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("manager-overrides.json");
    std::fs::write(&file, documented_example()).unwrap();
    let (_sim, url, err) = serve(&file);
    assert!(
        err.is_empty(),
        "the sim refused the documented file:\n{err}"
    );
    let mut client = ManagerClient::connect(url).await.unwrap();
    let pools = client
        .list_pools(ListPoolsRequest {})
        .await
        .unwrap()
        .into_inner()
        .pools;
    let east = pools.iter().find(|p| p.name == "aws-east").unwrap();
    assert_eq!(east.kind, ProviderKind::Aws as i32);
    assert_eq!(east.region, "eu-west-2");
    assert_eq!(east.zones, ["eu-west-2a", "eu-west-2b"]);
    assert_eq!(east.instance_types[0].instance_type, "m5.xlarge");
    let fra = pools.iter().find(|p| p.name == "oci-fra").unwrap();
    assert_eq!(fra.region, "eu-amsterdam-1");
    assert_eq!(fra.zones, ["eu-amsterdam-1-ad-1"]);
    let west = pools.iter().find(|p| p.name == "aws-west").unwrap();
    assert_eq!(
        west.region, "us-west-2",
        "pools not named keep their config"
    );
}

#[test]
fn a_bad_file_stops_the_sim_with_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("manager-overrides.json");
    std::fs::write(
        &file,
        r#"{"providers": {"aws-esat": {"region": "x"}, "onprem": {"cloud": "aws"}}}"#,
    )
    .unwrap();
    let (_sim, url, err) = serve(&file);
    assert!(url.is_empty(), "the sim must not serve");
    assert!(
        err.contains("providers.aws-esat: no provider config"),
        "{err}"
    );
    assert!(err.contains("providers.onprem.cloud"), "{err}");
    std::fs::write(&file, r#"{"providers": {"aws-east": {"regoin": "x"}}}"#).unwrap();
    let (_sim, url, err) = serve(&file);
    assert!(url.is_empty());
    assert!(err.contains("regoin"), "{err}");
}

/// This package's directory, as cargo tells the running test: a test executable cargo finds
/// fresh may have been built in another checkout that shares the target dir, and the path
/// compiled into it would read that checkout's files.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
