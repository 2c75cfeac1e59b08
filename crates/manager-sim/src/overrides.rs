//! Manager's overrides file, honoured by the sim for its pools.
//!
//! Manager reads a JSON file, `/var/data/manager-overrides.json` or the file named by
//! `NORSK_MANAGER_OVERRIDES_FILE`, that overrides the cloud, region, availability-zone and
//! instance-type fields of its provider configs, so an operator can retarget a provider without
//! rebuilding Manager's container. The sim's provider configs are its pools, so the file is
//! applied to them by name, before the sim serves. The shape (docs/manager-overrides.md):
//!
//! ```json
//! {
//!   "providers": {
//!     "aws-east": {
//!       "cloud": "aws",
//!       "region": "eu-west-2",
//!       "availabilityZones": ["eu-west-2a", "eu-west-2b"],
//!       "instanceType": "m5.2xlarge"
//!     }
//!   }
//! }
//! ```
//!
//! Every field is optional. `instanceType` is the type `CreateNode` provisions when the call
//! names none; it must be one of the pool's instance types. A name that is no pool, an unknown
//! key, `cloud` on an on-prem (`cluster`) pool, or zones that leave a declared node outside its
//! pool are errors: a typo must not silently leave the old value in force.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{PoolKind, SimConfig};

/// Where Manager looks when `NORSK_MANAGER_OVERRIDES_FILE` is not set.
pub const DEFAULT_PATH: &str = "/var/data/manager-overrides.json";
/// The variable naming another file.
pub const ENV_FILE: &str = "NORSK_MANAGER_OVERRIDES_FILE";
/// Largest overrides file read.
pub const MAX_BYTES: u64 = 1024 * 1024;

/// The file.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Overrides {
    /// Per provider config (pool) name.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderOverride>,
}

/// What one provider config's fields become.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderOverride {
    /// `aws` or `oci`.
    #[serde(default)]
    pub cloud: Option<Cloud>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub availability_zones: Option<Vec<String>>,
    #[serde(default)]
    pub instance_type: Option<String>,
}

/// The clouds a provider config can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cloud {
    Aws,
    Oci,
}

/// Why the file could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum OverridesError {
    #[error("cannot read the overrides file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the overrides file {path} is larger than {MAX_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("the overrides file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("the overrides file {path} cannot be applied:\n  - {}", .problems.join("\n  - "))]
    Invalid {
        path: PathBuf,
        problems: Vec<String>,
    },
}

/// The file Manager would read: `$NORSK_MANAGER_OVERRIDES_FILE`, else the default path if it
/// exists. `env` is the variable's value.
pub fn locate(env: Option<&str>) -> Option<PathBuf> {
    match env {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => Path::new(DEFAULT_PATH)
            .is_file()
            .then(|| PathBuf::from(DEFAULT_PATH)),
    }
}

/// Reads and parses `path`.
pub fn read(path: &Path) -> Result<Overrides, OverridesError> {
    let meta = std::fs::metadata(path).map_err(|source| OverridesError::Read {
        path: path.to_owned(),
        source,
    })?;
    if meta.len() > MAX_BYTES {
        return Err(OverridesError::TooLarge {
            path: path.to_owned(),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|source| OverridesError::Read {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| OverridesError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Applies `overrides` to the pools of `config`, or lists every problem and changes nothing.
/// Returns the names of the pools changed.
pub fn apply(
    overrides: &Overrides,
    config: &mut SimConfig,
    path: &Path,
) -> Result<Vec<String>, OverridesError> {
    let mut next = config.pools.clone();
    let mut problems = Vec::new();
    let known: Vec<String> = next.iter().map(|p| p.name.clone()).collect();
    for (name, o) in &overrides.providers {
        let at = format!("providers.{name}");
        let Some(pool) = next.iter_mut().find(|p| &p.name == name) else {
            problems.push(format!(
                "{at}: no provider config (pool) of this name; known: {}",
                known.join(", ")
            ));
            continue;
        };
        if let Some(cloud) = o.cloud {
            if pool.kind == PoolKind::Cluster {
                problems.push(format!(
                    "{at}.cloud: {name} is an on-prem cluster pool; its cloud cannot be changed"
                ));
            } else {
                pool.kind = match cloud {
                    Cloud::Aws => PoolKind::Aws,
                    Cloud::Oci => PoolKind::Oci,
                };
            }
        }
        if let Some(region) = &o.region {
            if region.is_empty() || region.len() > 63 {
                problems.push(format!("{at}.region: 1 to 63 characters"));
            } else {
                pool.region = region.clone();
            }
        }
        if let Some(zones) = &o.availability_zones {
            if zones.is_empty() || zones.iter().any(|z| z.is_empty() || z.len() > 63) {
                problems.push(format!(
                    "{at}.availabilityZones: at least one zone, each 1 to 63 characters"
                ));
            } else if let Some(n) = pool.nodes.iter().find(|n| !zones.contains(&n.zone)) {
                problems.push(format!(
                    "{at}.availabilityZones: declared node {} is in zone {}, which the override leaves out",
                    n.id, n.zone
                ));
            } else {
                pool.zones = zones.clone();
            }
        }
        if let Some(t) = &o.instance_type {
            match pool
                .instance_types
                .iter()
                .position(|x| &x.instance_type == t)
            {
                Some(i) => {
                    // The first type is what CreateNode provisions when asked for none.
                    let chosen = pool.instance_types.remove(i);
                    pool.instance_types.insert(0, chosen);
                }
                None => problems.push(format!(
                    "{at}.instanceType: {t} is not one of the pool's instance types ({})",
                    pool.instance_types
                        .iter()
                        .map(|x| x.instance_type.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
    }
    if !problems.is_empty() {
        return Err(OverridesError::Invalid {
            path: path.to_owned(),
            problems,
        });
    }
    config.pools = next;
    Ok(overrides.providers.keys().cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo() -> SimConfig {
        SimConfig::demo()
    }

    #[test]
    fn an_override_changes_only_the_named_fields_of_the_named_pool() {
        let mut c = demo();
        let before = c.clone();
        let o: Overrides = serde_json::from_str(
            r#"{"providers": {"aws-east": {"region": "eu-west-2", "availabilityZones": ["eu-west-2a"]}}}"#,
        )
        .expect("parses");
        let changed = apply(&o, &mut c, Path::new("f.json")).expect("applies");
        assert_eq!(changed, ["aws-east"]);
        let p = c.pools.iter().find(|p| p.name == "aws-east").expect("pool");
        assert_eq!(p.region, "eu-west-2");
        assert_eq!(p.zones, ["eu-west-2a"]);
        let b = before
            .pools
            .iter()
            .find(|p| p.name == "aws-east")
            .expect("pool");
        assert_eq!(p.kind, b.kind);
        assert_eq!(p.instance_types, b.instance_types);
        assert_eq!(
            c.pools
                .iter()
                .filter(|p| p.name != "aws-east")
                .collect::<Vec<_>>(),
            before
                .pools
                .iter()
                .filter(|p| p.name != "aws-east")
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn every_problem_is_listed_and_nothing_is_applied() {
        let mut c = demo();
        let before = c.clone();
        let cluster = c
            .pools
            .iter()
            .find(|p| p.kind == PoolKind::Cluster)
            .expect("a cluster pool")
            .name
            .clone();
        let text = format!(
            r#"{{"providers": {{"nope": {{}}, "{cluster}": {{"cloud": "aws", "availabilityZones": ["elsewhere"]}}, "aws-east": {{"instanceType": "z9.huge", "region": ""}}}}}}"#
        );
        let o: Overrides = serde_json::from_str(&text).expect("parses");
        let Err(OverridesError::Invalid { problems, .. }) = apply(&o, &mut c, Path::new("f.json"))
        else {
            panic!("must fail");
        };
        assert_eq!(problems.len(), 5, "{problems:#?}");
        assert!(problems.iter().any(|p| p.starts_with("providers.nope:")));
        assert_eq!(c, before);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = serde_json::from_str::<Overrides>(r#"{"providers": {"a": {"regoin": "x"}}}"#)
            .expect_err("typo");
        assert!(e.to_string().contains("regoin"), "{e}");
        assert!(serde_json::from_str::<Overrides>(r#"{"provider": {}}"#).is_err());
    }

    #[test]
    fn the_variable_wins_over_the_default_path() {
        assert_eq!(locate(Some("/x/o.json")), Some(PathBuf::from("/x/o.json")));
    }
}
