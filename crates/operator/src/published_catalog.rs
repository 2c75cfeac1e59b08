//! Against Manager's published API the pools are ours, not Manager's: this keeps the port's
//! [`PoolCatalog`] equal to the cluster's PlacementPools (provider, region, zones, instance
//! types with their capacity), so CreateNode asks for what a pool declares and a node's
//! capacity is its instance type's. Manager reports no start latency there either: a pool's is
//! the one it declares (`startLatencySeconds`), as both its provisioning and its start delay.

use std::collections::BTreeMap;

use automanager_api::{LaunchTemplateRef, PlacementPool, PlacementPoolSpec, PoolKind, ScaleOut};
use futures::StreamExt;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use manager_client::proto::api::manager::{AwsLaunchTemplate, aws_launch_template};
use manager_client::proto::{InstanceType, Pool, ProviderKind, ScaleOut as ProtoScaleOut};
use manager_client::published::{CatalogPool, PoolCatalog, ZoneLaunch};

/// The catalog entry of the PlacementPool `name`.
pub fn catalog_pool(name: &str, spec: &PlacementPoolSpec) -> CatalogPool {
    let kind = match spec.kind {
        PoolKind::Aws => ProviderKind::Aws,
        PoolKind::Oci => ProviderKind::Oci,
        PoolKind::Cluster => ProviderKind::Cluster,
    };
    let scale_out = match spec.scale_out {
        ScaleOut::Elastic => ProtoScaleOut::Elastic,
        ScaleOut::Fixed => ProtoScaleOut::Fixed,
    };
    let start_latency_ms = spec
        .declared_start_latency()
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    CatalogPool {
        pool: Pool {
            name: name.to_owned(),
            kind: kind as i32,
            region: spec.region.clone(),
            zones: spec.zones.clone(),
            scale_out: scale_out as i32,
            instance_types: spec
                .candidate_instance_types
                .iter()
                .map(|t| InstanceType {
                    instance_type: t.instance_type.clone(),
                    // Capacities are whole units, far inside f64's exact range.
                    #[allow(clippy::cast_precision_loss)]
                    capacity: t.total_capacity as f64,
                    cores: t.total_cores,
                    capabilities: t.capabilities.clone(),
                })
                .collect(),
            can_stop: false,
            provision_delay_ms: start_latency_ms,
            start_delay_ms: start_latency_ms,
        },
        zone_launch: zone_launch(spec),
        default_launch: default_launch(spec),
    }
}

fn template(t: &LaunchTemplateRef) -> AwsLaunchTemplate {
    AwsLaunchTemplate {
        template: match (&t.id, &t.name) {
            (Some(id), _) => Some(aws_launch_template::Template::Id(id.clone())),
            (None, Some(name)) => Some(aws_launch_template::Template::Name(name.clone())),
            (None, None) => None,
        },
        version: t.version.clone().unwrap_or_default(),
    }
}

fn zone_launch(spec: &PlacementPoolSpec) -> BTreeMap<String, ZoneLaunch> {
    let aws = spec.aws.iter().flat_map(|a| &a.zone_launch_templates);
    let oci = spec.oci.iter().flat_map(|o| &o.zone_subnets);
    aws.map(|(z, t)| (z.clone(), ZoneLaunch::AwsTemplate(template(t))))
        .chain(oci.map(|(z, s)| (z.clone(), ZoneLaunch::OciSubnet(s.clone()))))
        .collect()
}

fn default_launch(spec: &PlacementPoolSpec) -> Option<ZoneLaunch> {
    let aws = spec.aws.as_ref().and_then(|a| a.launch_template.as_ref());
    let oci = spec.oci.as_ref().and_then(|o| o.subnet.as_ref());
    aws.map(|t| ZoneLaunch::AwsTemplate(template(t)))
        .or_else(|| oci.map(|s| ZoneLaunch::OciSubnet(s.clone())))
}

/// Keeps `catalog` equal to the PlacementPools until the watch ends (the process stops).
pub async fn follow_pools(client: kube::Client, catalog: PoolCatalog) {
    let pools: Api<PlacementPool> = Api::all(client);
    let mut events = watcher(pools, watcher::Config::default()).boxed();
    let mut seen = std::collections::BTreeSet::new();
    let mut relisting = std::collections::BTreeSet::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                let name = p.name_any();
                catalog.upsert(catalog_pool(&name, &p.spec));
                relisting.insert(name.clone());
                seen.insert(name);
            }
            Ok(watcher::Event::Delete(p)) => {
                let name = p.name_any();
                catalog.remove(&name);
                seen.remove(&name);
            }
            Ok(watcher::Event::Init) => relisting.clear(),
            Ok(watcher::Event::InitDone) => {
                // Pools deleted while the watch was down are gone from the relist.
                for gone in seen.difference(&relisting) {
                    catalog.remove(gone);
                }
                seen = std::mem::take(&mut relisting);
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching PlacementPools for the published API's pool catalog");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use automanager_api::{AwsLaunch, CandidateInstanceType, OciLaunch, PackingStrategy};

    fn spec(kind: PoolKind) -> PlacementPoolSpec {
        PlacementPoolSpec {
            kind,
            region: "eu-west-1".to_owned(),
            zones: vec!["a".to_owned(), "b".to_owned()],
            packing_strategy: PackingStrategy::default(),
            scale_out: ScaleOut::Elastic,
            candidate_instance_types: vec![CandidateInstanceType {
                instance_type: "m5.xlarge".to_owned(),
                total_capacity: 100,
                total_cores: 16,
                capabilities: vec!["gpu".to_owned()],
            }],
            max_nodes: None,
            consolidation: None,
            aws: None,
            oci: None,
            start_latency_seconds: None,
        }
    }

    #[test]
    fn a_pool_s_declared_start_latency_is_both_its_provisioning_and_its_start_delay() {
        let mut s = spec(PoolKind::Aws);
        s.start_latency_seconds = Some(6);
        let c = catalog_pool("east", &s);
        assert_eq!(
            (c.pool.provision_delay_ms, c.pool.start_delay_ms),
            (6_000, 6_000)
        );
    }

    #[test]
    fn a_pool_without_a_declared_start_latency_reports_none() {
        let c = catalog_pool("east", &spec(PoolKind::Aws));
        assert_eq!((c.pool.provision_delay_ms, c.pool.start_delay_ms), (0, 0));
    }

    #[test]
    fn an_aws_pool_launches_each_zone_with_its_template_and_the_rest_with_the_default() {
        let mut s = spec(PoolKind::Aws);
        s.aws = Some(AwsLaunch {
            launch_template: Some(LaunchTemplateRef {
                id: None,
                name: Some("encoders".to_owned()),
                version: None,
            }),
            zone_launch_templates: BTreeMap::from([(
                "b".to_owned(),
                LaunchTemplateRef {
                    id: Some("lt-b".to_owned()),
                    name: None,
                    version: Some("3".to_owned()),
                },
            )]),
        });
        let c = catalog_pool("east", &s);
        assert_eq!(c.pool.instance_types[0].capacity, 100.0);
        assert_eq!(c.pool.instance_types[0].capabilities, ["gpu"]);
        let by_id = AwsLaunchTemplate {
            template: Some(aws_launch_template::Template::Id("lt-b".to_owned())),
            version: "3".to_owned(),
        };
        let by_name = AwsLaunchTemplate {
            template: Some(aws_launch_template::Template::Name("encoders".to_owned())),
            version: String::new(),
        };
        assert_eq!(c.launch_in("b"), Some(&ZoneLaunch::AwsTemplate(by_id)));
        assert_eq!(c.launch_in("a"), Some(&ZoneLaunch::AwsTemplate(by_name)));
    }

    #[test]
    fn an_oci_pool_launches_each_availability_domain_in_its_subnet() {
        let mut s = spec(PoolKind::Oci);
        s.oci = Some(OciLaunch {
            subnet: None,
            zone_subnets: BTreeMap::from([("a".to_owned(), "ocid1.subnet.a".to_owned())]),
        });
        let c = catalog_pool("fra", &s);
        assert_eq!(
            c.launch_in("a"),
            Some(&ZoneLaunch::OciSubnet("ocid1.subnet.a".to_owned()))
        );
        assert_eq!(c.launch_in("b"), None);
    }
}
