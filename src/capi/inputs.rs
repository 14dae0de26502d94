//! The role inputs of ref §9.3, from the Cluster API objects observe read.
//! Pure. The common inputs and the rendering are `jobs::inputs`.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use super::autoscaling::Autoscaling;
use super::objects::{Cluster, ClusterNetwork, Machine, MachinePool};
use crate::api::ApiEndpoint;
use crate::controllers::conditions::{self, Cond, Status};
use crate::jobs::inputs::Input;
use crate::keys::CONTROL_PLANE_LABEL;

/// The endpoint-source record (ref §8.8): who set the cluster's endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointSource {
    User,
    Module,
}

impl EndpointSource {
    pub const fn as_str(self) -> &'static str {
        match self {
            EndpointSource::User => "user",
            EndpointSource::Module => "module",
        }
    }

    pub fn parse(value: &str) -> Option<EndpointSource> {
        match value {
            "user" => Some(EndpointSource::User),
            "module" => Some(EndpointSource::Module),
            _ => None,
        }
    }
}

/// A usable endpoint: a host and a port.
pub fn valid_endpoint(e: Option<&ApiEndpoint>) -> Option<(&str, i32)> {
    let e = e?;
    let host = e.host.as_deref().filter(|h| !h.is_empty())?;
    let port = e.port.filter(|p| (1..=65535).contains(p))?;
    Some((host, port))
}

/// What the cluster role renders from.
pub struct ClusterFacts<'a> {
    pub cluster: &'a Cluster,
    /// The TerraformCluster's own `spec.controlPlaneEndpoint`.
    pub own_endpoint: Option<&'a ApiEndpoint>,
    pub source: Option<EndpointSource>,
    /// The durable inputs last rendered `control_plane_initialized = true`.
    pub initialized_before: bool,
}

/// The cluster role's inputs, and the endpoint source to record when none
/// is recorded yet and a user set a valid endpoint.
pub fn cluster(f: &ClusterFacts) -> (Vec<Input>, Option<EndpointSource>) {
    let spec = &f.cluster.spec;
    let endpoint = match f.source {
        Some(EndpointSource::Module) => None,
        _ => valid_endpoint(spec.control_plane_endpoint.as_ref())
            .or_else(|| valid_endpoint(f.own_endpoint)),
    };
    let record = (f.source.is_none() && endpoint.is_some()).then_some(EndpointSource::User);
    let initialized = f.cluster.control_plane_initialized();
    let inputs = vec![
        Input::nullable(
            "control_plane_endpoint",
            "object({host=string,port=number})",
            endpoint.map_or(
                Value::Null,
                |(host, port)| json!({ "host": host, "port": port }),
            ),
        ),
        Input::nullable(
            "kubernetes_version",
            "string",
            spec.topology
                .as_ref()
                .and_then(|t| t.version.clone())
                .map_or(Value::Null, Value::from),
        ),
        Input::new(
            "control_plane_initialized",
            "bool",
            (initialized || f.initialized_before).into(),
        ),
        Input::nullable(
            "cluster_network",
            "object({pods=list(string),services=list(string),service_domain=string,api_server_port=number})",
            cluster_network(spec.cluster_network.as_ref()),
        ),
    ];
    (inputs, record)
}

/// Null only when every attribute is unset; otherwise all four keys.
fn cluster_network(n: Option<&ClusterNetwork>) -> Value {
    let Some(n) = n else {
        return Value::Null;
    };
    let blocks = |r: &Option<super::objects::NetworkRanges>| {
        r.as_ref()
            .and_then(|r| r.cidr_blocks.clone())
            .unwrap_or_default()
    };
    let (pods, services) = (blocks(&n.pods), blocks(&n.services));
    if pods.is_empty()
        && services.is_empty()
        && n.service_domain.is_none()
        && n.api_server_port.is_none()
    {
        return Value::Null;
    }
    json!({
        "pods": pods,
        "services": services,
        "service_domain": n.service_domain,
        "api_server_port": n.api_server_port,
    })
}

/// The bootstrap data a machine or pool is handed: standard padded base64
/// of the Secret's `value`, and its `format`.
pub struct BootstrapData {
    pub base64: String,
    pub format: String,
}

/// The bootstrap data from the Secret `name` names (`data`: its data, None
/// when the Secret is not found); WaitingForBootstrapData until it exists.
pub fn bootstrap(
    name: Option<&str>,
    data: Option<&BTreeMap<String, Vec<u8>>>,
) -> Result<BootstrapData, Cond> {
    let wait = |message: String| {
        Cond::new(
            conditions::DEPENDENCIES_READY,
            Status::Unknown,
            "WaitingForBootstrapData",
            message,
        )
    };
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Err(wait("the bootstrap dataSecretName is not set yet".into()));
    };
    let Some(value) = data.and_then(|d| d.get("value")) else {
        return Err(wait(format!(
            "bootstrap Secret {name} is not found or has no value"
        )));
    };
    let format = data
        .and_then(|d| d.get("format"))
        .and_then(|f| std::str::from_utf8(f).ok())
        .filter(|f| !f.is_empty())
        .unwrap_or("cloud-config");
    Ok(BootstrapData {
        base64: STANDARD.encode(value),
        format: format.to_owned(),
    })
}

fn captf_cluster_outputs(exports: &Value) -> Input {
    Input::nullable("captf_cluster_outputs", "any", exports.clone())
}

fn bootstrap_inputs(b: &BootstrapData) -> [Input; 2] {
    [
        Input::sensitive("bootstrap_data", "string", b.base64.clone().into()),
        Input::new("bootstrap_format", "string", b.format.clone().into()),
    ]
}

fn text(v: &Option<String>) -> Value {
    v.clone().map_or(Value::Null, Value::from)
}

/// The machine role's inputs.
pub fn machine(m: &Machine, bootstrap: &BootstrapData, exports: &Value) -> Vec<Input> {
    let control_plane = m
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL));
    let mut inputs = vec![
        captf_cluster_outputs(exports),
        Input::new(
            "machine_name",
            "string",
            m.metadata.name.clone().unwrap_or_default().into(),
        ),
        Input::nullable("failure_domain", "string", text(&m.spec.failure_domain)),
        Input::nullable("kubernetes_version", "string", text(&m.spec.version)),
        Input::new("control_plane", "bool", control_plane.into()),
    ];
    inputs.extend(bootstrap_inputs(bootstrap));
    inputs
}

/// What a pool's inputs take from the pool itself.
pub struct PoolFacts {
    pub autoscaling: Autoscaling,
    /// The TerraformMachinePool's `status.replicas`: what the module last
    /// reported.
    pub observed_replicas: Option<i32>,
}

/// The pool role's inputs. `cluster_failure_domains`: the names of the
/// cluster state's `failure_domains` output.
pub fn pool(
    p: &MachinePool,
    pool: &PoolFacts,
    bootstrap: &BootstrapData,
    exports: &Value,
    cluster_failure_domains: &[String],
) -> Vec<Input> {
    let template = &p.spec.template;
    let replicas = Input::new(
        "replicas",
        "number",
        pool.autoscaling
            .replicas(p.spec.replicas, pool.observed_replicas)
            .into(),
    );
    // An autoscaled count follows the instances the module reports; a
    // change of it alone is no reason to apply (ref §9.2).
    let replicas = match pool.autoscaling.on() {
        true => replicas.unhashed(),
        false => replicas,
    };
    let mut inputs = vec![
        captf_cluster_outputs(exports),
        Input::new(
            "machinepool_name",
            "string",
            p.metadata.name.clone().unwrap_or_default().into(),
        ),
        replicas,
        Input::new(
            "failure_domains",
            "list(string)",
            json!(p.spec.failure_domains.clone().unwrap_or_default()),
        ),
        Input::new(
            "cluster_failure_domains",
            "list(string)",
            json!(cluster_failure_domains),
        ),
        Input::nullable("kubernetes_version", "string", text(&template.spec.version)),
        Input::new(
            "node_labels",
            "map(string)",
            json!(
                template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.labels.clone())
                    .unwrap_or_default()
            ),
        ),
        Input::new(
            "autoscaling",
            "object({enabled=bool,min=number,max=number})",
            pool.autoscaling.input(),
        ),
    ];
    inputs.extend(bootstrap_inputs(bootstrap));
    inputs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::objects::{
        Bootstrap, ClusterCondition, ClusterInitialization, ClusterSpec, ClusterStatus,
        MachinePoolSpec, MachineSpec, NetworkRanges, Topology,
    };

    fn endpoint(host: &str, port: i32) -> ApiEndpoint {
        ApiEndpoint {
            host: Some(host.into()),
            port: Some(port),
        }
    }

    fn value<'a>(inputs: &'a [Input], name: &str) -> &'a Value {
        &inputs.iter().find(|i| i.name == name).unwrap().value
    }

    #[test]
    fn the_cluster_endpoint_input_prefers_the_cluster_then_the_object_and_never_after_the_module() {
        let mut c = Cluster::new("c", ClusterSpec::default());
        let own = endpoint("own.example", 6443);
        let half = ApiEndpoint {
            host: Some("half".into()),
            port: None,
        };
        let facts = |c: &Cluster, own, source| {
            let (inputs, record) = cluster(&ClusterFacts {
                cluster: c,
                own_endpoint: own,
                source,
                initialized_before: false,
            });
            (value(&inputs, "control_plane_endpoint").clone(), record)
        };
        assert_eq!(facts(&c, None, None), (Value::Null, None));
        assert_eq!(facts(&c, Some(&half), None), (Value::Null, None));
        assert_eq!(
            facts(&c, Some(&own), None),
            (
                json!({"host": "own.example", "port": 6443}),
                Some(EndpointSource::User)
            )
        );
        c.spec.control_plane_endpoint = Some(endpoint("capi.example", 443));
        assert_eq!(
            facts(&c, Some(&own), Some(EndpointSource::User)),
            (json!({"host": "capi.example", "port": 443}), None)
        );
        assert_eq!(
            facts(&c, Some(&own), Some(EndpointSource::Module)),
            (Value::Null, None)
        );
    }

    #[test]
    fn the_cluster_role_reads_version_initialization_and_network() {
        let mut c = Cluster::new("c", ClusterSpec::default());
        let render = |c: &Cluster, before| {
            cluster(&ClusterFacts {
                cluster: c,
                own_endpoint: None,
                source: None,
                initialized_before: before,
            })
            .0
        };
        let inputs = render(&c, false);
        let names: Vec<_> = inputs.iter().map(|i| i.name).collect();
        assert_eq!(names, crate::names::Kind::Cluster.inputs());
        assert_eq!(value(&inputs, "kubernetes_version"), &Value::Null);
        assert_eq!(value(&inputs, "control_plane_initialized"), &json!(false));
        assert_eq!(value(&inputs, "cluster_network"), &Value::Null);
        // Latched: true once rendered true, whatever the Cluster says now.
        assert_eq!(
            value(&render(&c, true), "control_plane_initialized"),
            &json!(true)
        );
        c.spec.topology = Some(Topology {
            version: Some("v1.36.3+rke2r1".into()),
        });
        c.spec.cluster_network = Some(ClusterNetwork {
            pods: Some(NetworkRanges {
                cidr_blocks: Some(vec!["10.0.0.0/16".into()]),
            }),
            ..Default::default()
        });
        // Without a controlPlaneRef Cluster API sets only the condition.
        c.status = Some(ClusterStatus {
            conditions: Some(vec![ClusterCondition {
                type_: "ControlPlaneInitialized".into(),
                status: "True".into(),
            }]),
            ..Default::default()
        });
        assert_eq!(
            value(&render(&c, false), "control_plane_initialized"),
            &json!(true)
        );
        c.status = Some(ClusterStatus {
            initialization: Some(ClusterInitialization {
                control_plane_initialized: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
        let inputs = render(&c, false);
        assert_eq!(
            value(&inputs, "kubernetes_version"),
            &json!("v1.36.3+rke2r1")
        );
        assert_eq!(value(&inputs, "control_plane_initialized"), &json!(true));
        assert_eq!(
            value(&inputs, "cluster_network"),
            &json!({"pods": ["10.0.0.0/16"], "services": [], "service_domain": null, "api_server_port": null})
        );
        // Every attribute unset is null, even with empty lists.
        c.spec.cluster_network = Some(ClusterNetwork {
            services: Some(NetworkRanges {
                cidr_blocks: Some(vec![]),
            }),
            ..Default::default()
        });
        assert_eq!(value(&render(&c, false), "cluster_network"), &Value::Null);
    }

    #[test]
    fn bootstrap_data_is_padded_base64_of_value_and_waits_for_the_secret() {
        let data = BTreeMap::from([("value".to_string(), b"ab".to_vec())]);
        let b = bootstrap(Some("s"), Some(&data)).unwrap();
        assert_eq!(
            (b.base64.as_str(), b.format.as_str()),
            ("YWI=", "cloud-config")
        );
        let ignition = BTreeMap::from([
            ("value".to_string(), b"{}".to_vec()),
            ("format".to_string(), b"ignition".to_vec()),
        ]);
        assert_eq!(
            bootstrap(Some("s"), Some(&ignition)).unwrap().format,
            "ignition"
        );
        for (name, data) in [
            (None, Some(&data)),
            (Some(""), Some(&data)),
            (Some("s"), None),
        ] {
            let e = bootstrap(name, data).err().unwrap();
            assert_eq!(
                (e.reason, e.status),
                ("WaitingForBootstrapData", Status::Unknown)
            );
        }
    }

    #[test]
    fn machine_and_pool_inputs_are_exactly_the_roles() {
        let b = BootstrapData {
            base64: "YWI=".into(),
            format: "cloud-config".into(),
        };
        let mut m = Machine::new(
            "m",
            MachineSpec {
                bootstrap: Some(Bootstrap {
                    data_secret_name: Some("s".into()),
                }),
                version: Some("v1.36.3".into()),
                ..Default::default()
            },
        );
        let exports = json!({"network": "n"});
        let inputs = machine(&m, &b, &exports);
        let mut names: Vec<_> = inputs.iter().map(|i| i.name).collect();
        names.sort_unstable();
        let mut want = crate::names::Kind::Machine.inputs().to_vec();
        want.push("captf_cluster_outputs");
        want.sort_unstable();
        assert_eq!(names, want);
        assert_eq!(value(&inputs, "control_plane"), &json!(false));
        assert_eq!(value(&inputs, "failure_domain"), &Value::Null);
        assert_eq!(value(&inputs, "captf_cluster_outputs"), &exports);
        assert!(
            inputs
                .iter()
                .find(|i| i.name == "bootstrap_data")
                .unwrap()
                .sensitive
        );
        m.metadata.labels = Some(BTreeMap::from([(
            CONTROL_PLANE_LABEL.into(),
            String::new(),
        )]));
        assert_eq!(
            value(&machine(&m, &b, &exports), "control_plane"),
            &json!(true)
        );

        let mut p = MachinePool::new("p", MachinePoolSpec::default());
        let off = PoolFacts {
            autoscaling: Autoscaling::Off,
            observed_replicas: Some(4),
        };
        let inputs = pool(&p, &off, &b, &exports, &["fd-a".into()]);
        let mut names: Vec<_> = inputs.iter().map(|i| i.name).collect();
        names.sort_unstable();
        let mut want = crate::names::Kind::MachinePool.inputs().to_vec();
        want.push("captf_cluster_outputs");
        want.sort_unstable();
        assert_eq!(names, want);
        assert_eq!(value(&inputs, "replicas"), &json!(1));
        assert_eq!(value(&inputs, "failure_domains"), &json!([]));
        assert_eq!(value(&inputs, "cluster_failure_domains"), &json!(["fd-a"]));
        assert_eq!(value(&inputs, "node_labels"), &json!({}));
        let replicas = |inputs: &[Input]| inputs.iter().find(|i| i.name == "replicas").cloned();
        assert!(!replicas(&inputs).unwrap().unhashed);
        // Autoscaled: the module's count within the bounds, not hashed.
        p.spec.replicas = Some(2);
        let on = PoolFacts {
            autoscaling: Autoscaling::On { min: 1, max: 3 },
            observed_replicas: Some(4),
        };
        let inputs = pool(&p, &on, &b, &exports, &[]);
        let r = replicas(&inputs).unwrap();
        assert_eq!((r.value, r.unhashed), (json!(3), true));
        assert_eq!(
            value(&inputs, "autoscaling"),
            &json!({"enabled": true, "min": 1, "max": 3})
        );
    }
}
