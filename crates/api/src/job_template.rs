//! What Manager runs for a job: the job definition of Manager's published API (`norsk.api.manager`
//! `Job`: its services, Norsk Media version, service parameters, volumes and placement hints),
//! carried by a Bundle's job so the operator can store it in Manager.
//!
//! The operator stamps the job's id, tags, description and runtime configuration into it; those
//! are not part of the template. Names follow Kubernetes conventions (camelCase, `env`,
//! `image`); each field says which field of Manager's `Job` or `Service` it fills. Over our first
//! Manager API, which stores no job definitions, the template is carried and ignored.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most services in one job.
pub const MAX_SERVICES: usize = 16;
/// Most entries in each list of a template (volumes, ports, env, mounts, cpu set, dependsOn).
pub const MAX_TEMPLATE_LIST: usize = 64;

/// What Manager runs for a job (Manager's `Job`, less what the operator stamps in).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.services.all(s, self.services.filter(t, t.name == s.name).size() == 1)").message("service names must be unique within a job template").field_path(".services"))]
pub struct JobTemplate {
    /// The job's containers (Manager's `Job.services`).
    #[schemars(length(min = 1, max = 16))]
    pub services: Vec<ServiceTemplate>,
    /// The Norsk Media release the job runs (`Job.norsk_media_version`): `Recommended` (the
    /// API's default when absent), `Latest`, `PreviousRecommended` or `Lts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_version: Option<MediaVersion>,
    /// Parameters of the Norsk Media service itself (`Job.norsk_service_parameters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_parameters: Option<ServiceParameters>,
    /// Volumes the job's services may mount, by name (`Job.volumes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub volumes: Vec<String>,
    /// `Job.shape`, as Manager's API takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub shape: Option<String>,
    /// `Job.architecture`, as Manager's API takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub architecture: Option<String>,
    /// `Job.subnet`, as Manager's API takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub subnet: Option<String>,
    /// `Job.availabilityDomain`, as Manager's API takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub availability_domain: Option<String>,
}

/// One container of a job (Manager's `Service`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceTemplate {
    /// The service's name, unique within the job.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The container image (`Service.docker.container_url.url`).
    #[schemars(length(min = 1, max = 1024))]
    pub image: String,
    /// When Manager restarts the container (`Service.restart`); absent: `Never`, the API's
    /// default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<ServiceRestart>,
    /// Services of the same job this one starts after (`Service.dependsOn`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    pub depends_on: Vec<String>,
    /// The service's configuration, opaque to AutoManager (`Service.configuration`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub configuration: Option<String>,
    /// `Service.restart_count`, as Manager's API takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_count: Option<u32>,
    /// `Service.restart_period`, as Manager's API takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_period: Option<u32>,
    /// The container's command (`Service.command`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub command: Option<String>,
    /// Ports, environment, shared memory, CPU set and mounts (`Service.parameters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<ServiceParameters>,
}

/// When Manager restarts a service's container (Manager's `Service.ServiceRestart`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ServiceRestart {
    Never,
    OnFailure,
    Always,
}

/// A container's parameters (Manager's `ServiceParameters`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceParameters {
    /// Published ports (`port_mappings`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub ports: Vec<PortMapping>,
    /// Environment variables (`environment_variables`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub env: Vec<EnvVar>,
    /// `shared_memory_size`, as Manager's API takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_memory_size: Option<u64>,
    /// CPUs the container is pinned to (`cpu_set`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub cpu_set: Vec<u32>,
    /// Volumes of the job mounted into the container (`volume_mounts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub volume_mounts: Vec<VolumeMount>,
}

/// A published port (Manager's `PortMapping`). Without `hostPort` or `hostPortRange` the host
/// port is ephemeral.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.hostPort) || !has(self.hostPortRange)").message("a port has at most one of hostPort and hostPortRange"))]
pub struct PortMapping {
    /// The port inside the container.
    #[schemars(range(min = 1, max = 65535))]
    pub container_port: u32,
    /// `Any` (the API's default), `Udp` or `Tcp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<PortProtocol>,
    /// A specific host port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub host_port: Option<u32>,
    /// Any host port in a range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_port_range: Option<HostPortRange>,
    /// The host address to bind (`host_address`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub host_address: Option<String>,
    /// `group`, as Manager's API takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub group: Option<String>,
}

/// The transport of a published port (Manager's `ProtocolFamily`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PortProtocol {
    Any,
    Udp,
    Tcp,
}

/// A range of host ports, both ends included.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.min <= self.max").message("hostPortRange.min must not exceed hostPortRange.max"))]
pub struct HostPortRange {
    /// The lowest port of the range.
    #[schemars(range(min = 1, max = 65535))]
    pub min: u32,
    /// The highest port of the range.
    #[schemars(range(min = 1, max = 65535))]
    pub max: u32,
}

/// An environment variable.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    /// The variable's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Its value (empty when absent).
    #[serde(default)]
    #[schemars(length(max = 32768))]
    pub value: String,
}

/// A volume of the job mounted into a container (Manager's `VolumeMount`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    /// One of the template's `volumes`.
    #[schemars(length(min = 1, max = 253))]
    pub volume_name: String,
    /// Where it is mounted in the container.
    #[schemars(length(min = 1, max = 4096))]
    pub container_path: String,
    /// Mounted read-only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// Which Norsk Media release a job runs (Manager's `Version`): a release channel, not a number.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MediaVersion {
    /// The release Manager recommends (the API's default).
    Recommended,
    Latest,
    PreviousRecommended,
    /// The long-term-support release.
    Lts,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_template_reads_from_yaml_with_its_defaults() {
        let t: JobTemplate = serde_saphyr::from_str(
            "services:\n  - name: norsk\n    image: registry.example.com/norsk/media:1.0\n    restart: OnFailure\n    parameters:\n      ports: [{containerPort: 5001, protocol: Udp, hostPortRange: {min: 5000, max: 5100}}]\n      env: [{name: LOG, value: info}]\nmediaVersion: Lts\nvolumes: [media]\n",
        )
        .unwrap();
        assert_eq!(t.services.len(), 1);
        assert_eq!(t.services[0].restart, Some(ServiceRestart::OnFailure));
        let p = t.services[0].parameters.as_ref().unwrap();
        assert_eq!(
            p.ports[0].host_port_range,
            Some(HostPortRange {
                min: 5000,
                max: 5100
            })
        );
        assert_eq!(t.media_version, Some(MediaVersion::Lts));
        assert_eq!(t.volumes, ["media"]);
    }

    #[test]
    fn an_unknown_restart_policy_is_refused_by_name() {
        let e = serde_saphyr::from_str::<JobTemplate>(
            "services:\n  - name: a\n    image: b\n    restart: Sometimes\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("Sometimes"), "{e}");
    }
}
