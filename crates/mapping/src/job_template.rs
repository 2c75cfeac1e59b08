//! A Bundle job's template as Manager's published API stores a job (`norsk.api.manager.Job`),
//! and the bytes the operator's Manager port carries it in.
//!
//! The port speaks our first API's messages, where a bundle job carries the template as the
//! encoded published `Job` (`BundleJob.template`); the published port decodes it and stamps in
//! the job's id, tags, description and configuration. Only template fields are set here, so the
//! same template always encodes to the same bytes and a registered bundle compares equal to
//! the one asked for.

use automanager_api::job_template as t;
use manager_proto::api::common::{
    self as common, ContainerUrl, DockerContainer, EnvironmentVariable, HostPortRange,
    HostPortSpecific, OptionalInt64, PortMapping, ProtocolFamily, Service, port_mapping, service,
};
use manager_proto::api::manager::{Job, Version};
use prost::Message;

/// The published `Job` a template describes (no id, tags, description or configuration).
pub fn published_job(template: &t::JobTemplate) -> Job {
    Job {
        services: template.services.iter().map(service_of).collect(),
        norsk_media_version: match template.media_version {
            None | Some(t::MediaVersion::Recommended) => Version::Recommended,
            Some(t::MediaVersion::Latest) => Version::Latest,
            Some(t::MediaVersion::PreviousRecommended) => Version::PreviousRecommended,
            Some(t::MediaVersion::Lts) => Version::Lts,
        } as i32,
        norsk_service_parameters: template.service_parameters.as_ref().map(parameters_of),
        volumes: template.volumes.clone(),
        shape: template.shape.clone().unwrap_or_default(),
        architecture: template.architecture.clone().unwrap_or_default(),
        subnet: template.subnet.clone().unwrap_or_default(),
        availability_domain: template.availability_domain.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// The bytes a port's bundle job carries: the encoded published `Job`; empty without a template.
pub fn template_bytes(template: Option<&t::JobTemplate>) -> Vec<u8> {
    template
        .map(|t| published_job(t).encode_to_vec())
        .unwrap_or_default()
}

fn service_of(s: &t::ServiceTemplate) -> Service {
    Service {
        name: s.name.clone(),
        container: Some(service::Container::Docker(DockerContainer {
            container_url: Some(ContainerUrl {
                url: s.image.clone(),
            }),
        })),
        restart: match s.restart {
            None | Some(t::ServiceRestart::Never) => common::service::ServiceRestart::Never,
            Some(t::ServiceRestart::OnFailure) => common::service::ServiceRestart::OnFailure,
            Some(t::ServiceRestart::Always) => common::service::ServiceRestart::Always,
        } as i32,
        depends_on: s.depends_on.clone(),
        configuration: s.configuration.clone().unwrap_or_default(),
        restart_count: s.restart_count.unwrap_or_default(),
        restart_period: s.restart_period.unwrap_or_default(),
        command: s.command.clone().unwrap_or_default(),
        parameters: s.parameters.as_ref().map(parameters_of),
    }
}

fn parameters_of(p: &t::ServiceParameters) -> common::ServiceParameters {
    common::ServiceParameters {
        port_mappings: p.ports.iter().map(port_of).collect(),
        environment_variables: p
            .env
            .iter()
            .map(|e| EnvironmentVariable {
                name: e.name.clone(),
                value: e.value.clone(),
            })
            .collect(),
        shared_memory_size: p.shared_memory_size.map(|value| OptionalInt64 { value }),
        cpu_set: p.cpu_set.clone(),
        volume_mounts: p
            .volume_mounts
            .iter()
            .map(|m| common::VolumeMount {
                volume_name: m.volume_name.clone(),
                container_path: m.container_path.clone(),
                read_only: m.read_only,
            })
            .collect(),
    }
}

fn port_of(p: &t::PortMapping) -> PortMapping {
    let host_port = match (p.host_port, p.host_port_range) {
        (Some(port), _) => port_mapping::HostPort::Specific(HostPortSpecific { port }),
        (None, Some(r)) => port_mapping::HostPort::Range(HostPortRange {
            min_port: r.min,
            max_port: r.max,
        }),
        (None, None) => port_mapping::HostPort::Ephemeral(common::HostPortEphemeral {}),
    };
    PortMapping {
        container_port: p.container_port,
        protocol: match p.protocol {
            None | Some(t::PortProtocol::Any) => ProtocolFamily::Any,
            Some(t::PortProtocol::Udp) => ProtocolFamily::Udp,
            Some(t::PortProtocol::Tcp) => ProtocolFamily::Tcp,
        } as i32,
        host_port: Some(host_port),
        host_address: p.host_address.clone().unwrap_or_default(),
        group: p.group.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn template() -> t::JobTemplate {
        serde_json::from_value(serde_json::json!({
            "services": [{
                "name": "norsk",
                "image": "registry.example.com/norsk/media:1.0",
                "restart": "Always",
                "dependsOn": ["db"],
                "parameters": {
                    "ports": [
                        {"containerPort": 5001, "protocol": "Udp", "hostPortRange": {"min": 5000, "max": 5100}},
                        {"containerPort": 8080, "hostPort": 80},
                        {"containerPort": 9000}
                    ],
                    "env": [{"name": "LOG", "value": "info"}],
                    "sharedMemorySize": 1048576,
                    "cpuSet": [0, 1],
                    "volumeMounts": [{"volumeName": "media", "containerPath": "/media", "readOnly": true}]
                }
            }],
            "mediaVersion": "Lts",
            "volumes": ["media"],
            "shape": "VM.Standard.E4.Flex"
        }))
        .unwrap()
    }

    #[test]
    fn every_template_field_lands_in_its_published_field() {
        let job = published_job(&template());
        let s = &job.services[0];
        assert_eq!(s.name, "norsk");
        assert_eq!(
            s.container,
            Some(service::Container::Docker(DockerContainer {
                container_url: Some(ContainerUrl {
                    url: "registry.example.com/norsk/media:1.0".into()
                })
            }))
        );
        assert_eq!(s.restart, common::service::ServiceRestart::Always as i32);
        assert_eq!(s.depends_on, ["db"]);
        let p = s.parameters.as_ref().unwrap();
        assert_eq!(
            p.port_mappings[0].host_port,
            Some(port_mapping::HostPort::Range(HostPortRange {
                min_port: 5000,
                max_port: 5100
            }))
        );
        assert_eq!(p.port_mappings[0].protocol, ProtocolFamily::Udp as i32);
        assert_eq!(
            p.port_mappings[1].host_port,
            Some(port_mapping::HostPort::Specific(HostPortSpecific {
                port: 80
            }))
        );
        assert_eq!(
            p.port_mappings[2].host_port,
            Some(port_mapping::HostPort::Ephemeral(
                common::HostPortEphemeral {}
            ))
        );
        assert_eq!(p.shared_memory_size, Some(OptionalInt64 { value: 1048576 }));
        assert_eq!(p.cpu_set, [0, 1]);
        assert!(p.volume_mounts[0].read_only);
        assert_eq!(job.norsk_media_version, Version::Lts as i32);
        assert_eq!(job.volumes, ["media"]);
        assert_eq!(job.shape, "VM.Standard.E4.Flex");
        // What the operator stamps is left to it.
        assert!(job.job_id.is_none() && job.tags.is_empty() && job.description.is_empty());
    }

    #[test]
    fn the_bytes_decode_to_the_same_job_and_are_the_same_every_time() {
        let bytes = template_bytes(Some(&template()));
        assert_eq!(
            Job::decode(bytes.as_slice()).unwrap(),
            published_job(&template())
        );
        assert_eq!(bytes, template_bytes(Some(&template())));
        assert!(template_bytes(None).is_empty());
    }
}
