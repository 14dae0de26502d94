//! DependenciesReady's Cluster API part and the role inputs (ref §8.1 step
//! 2, §9.3): the owners, the cluster's infrastructure and exports, the
//! bootstrap data. Pure, over what [`super::owners`] read.

use serde_json::Value;

use super::owners::{Capi, externally_managed};
use crate::capi::autoscaling::{self, WriteBack};
use crate::capi::inputs::PoolFacts;
use crate::capi::inputs::{self, ClusterFacts, EndpointSource};
use crate::capi::objects::MachinePool;
use crate::capi::owners::{self, Facts};
use crate::controllers::conditions::{self, Cond, Status};
use crate::controllers::workload::Workload;
use crate::jobs::durable::Recorded;
use crate::jobs::inputs::Input;
use crate::keys::{ENDPOINT_SOURCE, REPLICAS_MANAGED_BY};
use crate::names::Kind;
use crate::outputs::decode::{self, Outputs};
use crate::state::Output;

/// The role inputs, and the endpoint source a cluster records now.
pub struct Role {
    pub inputs: Vec<Input>,
    pub record_endpoint_source: Option<EndpointSource>,
    /// A pool's AutoscalingActive.
    pub autoscaling: Option<Cond>,
    /// What a pool writes back to its MachinePool (by name), when anything.
    pub write_back: Option<(String, WriteBack)>,
}

/// The role inputs of `obj`, or the DependenciesReady that keeps a Job from
/// starting.
/// `observed_replicas`: a pool's replicas as its state's outputs report.
pub fn role<K: Workload>(
    obj: &K,
    capi: &Capi,
    durable: Option<&Recorded>,
    observed_replicas: Option<i32>,
) -> Result<Role, Cond> {
    let name = obj.meta().name.as_deref().unwrap_or_default();
    owners::check(&Facts {
        kind: K::KIND,
        name,
        cluster_label: obj.cluster_name(),
        owner_refs: obj.meta().owner_references.as_deref().unwrap_or_default(),
        owner: capi.owner(),
        cluster: capi.cluster.as_ref(),
        terraform_cluster: capi.terraform_cluster.is_some(),
    })?;
    let Some(cluster) = capi.cluster.as_ref() else {
        // check() found it.
        return Err(waiting("OwnerNotFound", "the Cluster is not found".into()));
    };
    if K::KIND == Kind::Cluster {
        let source = obj
            .meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(ENDPOINT_SOURCE))
            .and_then(|v| EndpointSource::parse(v));
        let (inputs, record) = inputs::cluster(&ClusterFacts {
            cluster,
            own_endpoint: obj.own_endpoint(),
            source,
            initialized_before: durable.is_some_and(rendered_initialized),
        });
        return Ok(Role {
            inputs,
            record_endpoint_source: record,
            autoscaling: None,
            write_back: None,
        });
    }
    let provisioned = cluster
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.infrastructure_provisioned)
        .unwrap_or(false);
    if !provisioned {
        return Err(Cond::new(
            conditions::DEPENDENCIES_READY,
            Status::Unknown,
            "WaitingForClusterInfrastructure",
            format!(
                "the infrastructure of Cluster {} is not provisioned yet",
                obj.cluster_name().unwrap_or_default()
            ),
        ));
    }
    let external = capi
        .terraform_cluster
        .as_ref()
        .is_some_and(externally_managed);
    let exports = match external {
        true => Value::Object(Default::default()),
        false => exports(capi.cluster_outputs.as_ref())?,
    };
    let mut pool_role = None;
    let inputs = match (capi.machine(), capi.pool()) {
        (Some(m), _) => {
            let b = m.spec.bootstrap.as_ref();
            let bootstrap = inputs::bootstrap(
                b.and_then(|b| b.data_secret_name.as_deref()),
                capi.bootstrap.as_ref(),
            )?;
            inputs::machine(m, &bootstrap, &exports)
        }
        (_, Some(p)) => {
            let b = p.spec.template.spec.bootstrap.as_ref();
            let bootstrap = inputs::bootstrap(
                b.and_then(|b| b.data_secret_name.as_deref()),
                capi.bootstrap.as_ref(),
            )?;
            let domains = cluster_failure_domains(capi, external);
            let facts = PoolFacts {
                autoscaling: autoscaling::read(p.metadata.annotations.as_ref()),
                observed_replicas,
            };
            let inputs = inputs::pool(p, &facts, &bootstrap, &exports, &domains);
            pool_role = Some(pool_autoscaling(p, &facts));
            inputs
        }
        // check() found the owner of the kind.
        _ => return Err(waiting("OwnerNotFound", "the owner is not found".into())),
    };
    let (autoscaling, write_back) = pool_role.unzip();
    Ok(Role {
        inputs,
        record_endpoint_source: None,
        autoscaling,
        write_back: write_back.flatten(),
    })
}

/// A pool's AutoscalingActive and its write-back to the MachinePool.
fn pool_autoscaling(p: &MachinePool, f: &PoolFacts) -> (Cond, Option<(String, WriteBack)>) {
    let managed_by = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REPLICAS_MANAGED_BY))
        .map(String::as_str);
    let cond = autoscaling::condition(&f.autoscaling, managed_by);
    let write_back = autoscaling::write_back(
        &f.autoscaling,
        managed_by,
        p.spec.replicas,
        f.observed_replicas,
    );
    let name = p.metadata.name.clone().unwrap_or_default();
    (cond, (!write_back.is_empty()).then_some((name, write_back)))
}

fn waiting(reason: &'static str, message: String) -> Cond {
    Cond::new(
        conditions::DEPENDENCIES_READY,
        Status::False,
        reason,
        message,
    )
}

/// The cluster's `exports` output, verbatim (null is `{}`); machines and
/// pools wait while it is not readable or breaks the contract.
fn exports(outputs: Option<&std::collections::BTreeMap<String, Output>>) -> Result<Value, Cond> {
    let wait = |why: String| {
        Cond::new(
            conditions::DEPENDENCIES_READY,
            Status::Unknown,
            "WaitingForClusterExports",
            format!("the cluster's exports: {why}"),
        )
    };
    let outputs = outputs.ok_or_else(|| wait("the cluster's state is not readable yet".into()))?;
    if !outputs.contains_key("exports") {
        return Err(wait("not in the cluster's state yet".into()));
    }
    let decoded = Outputs::of(outputs).map_err(|p| wait(p.to_string()))?;
    decode::exports(&decoded).map_err(|p| wait(p.to_string()))
}

/// The names in the cluster state's `failure_domains` output (the
/// status's for an externally managed cluster).
fn cluster_failure_domains(capi: &Capi, external: bool) -> Vec<String> {
    let domains = match external {
        true => capi
            .terraform_cluster
            .as_ref()
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.failure_domains.clone())
            .unwrap_or_default(),
        false => capi
            .cluster_outputs
            .as_ref()
            .and_then(|o| Outputs::of(o).ok())
            .and_then(|o| decode::failure_domains(&o).ok())
            .unwrap_or_default(),
    };
    domains.into_iter().map(|d| d.name).collect()
}

/// The durable inputs rendered `control_plane_initialized = true`.
fn rendered_initialized(d: &Recorded) -> bool {
    serde_json::from_slice::<Value>(&d.inputs.tfvars_json)
        .ok()
        .and_then(|v| v.get("control_plane_initialized")?.as_bool())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use serde_json::json;

    use super::*;
    use crate::api::{TerraformCluster, TerraformMachine, TerraformMachineSpec};
    use crate::capi::objects::{
        Bootstrap, Cluster, ClusterInitialization, ClusterSpec, ClusterStatus, ContractRef,
        Machine, MachineSpec,
    };
    use crate::controllers::reconcile::owners::Owned;
    use crate::keys::{CLUSTER_NAME_LABEL, MANAGED_BY};

    fn infra(kind: Kind, name: &str) -> Option<ContractRef> {
        Some(ContractRef {
            api_group: crate::api::GROUP.into(),
            kind: kind.kind().into(),
            name: name.into(),
        })
    }

    /// A TerraformMachine `tm` owned by Machine `m` of Cluster `c`, whose
    /// infrastructure is provisioned as `provisioned` says.
    fn world(provisioned: bool) -> (TerraformMachine, Capi) {
        let mut tm = TerraformMachine::new("tm", TerraformMachineSpec::default());
        tm.metadata.labels = Some(BTreeMap::from([(CLUSTER_NAME_LABEL.into(), "c".into())]));
        tm.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Machine".into(),
            name: "m".into(),
            uid: "mu".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        let mut m = Machine::new(
            "m",
            MachineSpec {
                cluster_name: "c".into(),
                bootstrap: Some(Bootstrap {
                    data_secret_name: Some("boot".into()),
                }),
                infrastructure_ref: infra(Kind::Machine, "tm"),
                ..Default::default()
            },
        );
        m.metadata.uid = Some("mu".into());
        let mut c = Cluster::new(
            "c",
            ClusterSpec {
                infrastructure_ref: infra(Kind::Cluster, "tc"),
                ..Default::default()
            },
        );
        c.status = Some(ClusterStatus {
            initialization: Some(ClusterInitialization {
                infrastructure_provisioned: Some(provisioned),
                ..Default::default()
            }),
            ..Default::default()
        });
        let capi = Capi {
            owner: Some(Owned::Machine(m)),
            cluster: Some(c),
            terraform_cluster: Some(TerraformCluster::new("tc", Default::default())),
            bootstrap: Some(BTreeMap::from([("value".into(), b"data".to_vec())])),
            cluster_outputs: Some(BTreeMap::from([(
                "exports".into(),
                Output::sensitive_json(r#"{"vpc":"v-1"}"#),
            )])),
        };
        (tm, capi)
    }

    fn reason(r: Result<Role, Cond>) -> Result<Value, &'static str> {
        r.map(|role| {
            role.inputs
                .into_iter()
                .find(|i| i.name == "captf_cluster_outputs")
                .map(|i| i.value)
                .unwrap_or_default()
        })
        .map_err(|c| c.reason)
    }

    #[test]
    fn a_machine_waits_for_its_clusters_infrastructure_exports_and_bootstrap_data() {
        let (tm, capi) = world(true);
        assert_eq!(
            reason(role(&tm, &capi, None, None)),
            Ok(json!({"vpc": "v-1"}))
        );

        let (tm, capi) = world(false);
        assert_eq!(
            reason(role(&tm, &capi, None, None)),
            Err("WaitingForClusterInfrastructure")
        );

        let (tm, mut capi) = world(true);
        capi.cluster_outputs = None;
        assert_eq!(
            reason(role(&tm, &capi, None, None)),
            Err("WaitingForClusterExports")
        );
        capi.cluster_outputs = Some(BTreeMap::new());
        assert_eq!(
            reason(role(&tm, &capi, None, None)),
            Err("WaitingForClusterExports")
        );
        capi.cluster_outputs = Some(BTreeMap::from([(
            "exports".into(),
            Output::sensitive_json(r#"{"ratio":0.5}"#),
        )]));
        assert_eq!(
            reason(role(&tm, &capi, None, None)),
            Err("WaitingForClusterExports")
        );
        capi.cluster_outputs = Some(BTreeMap::from([(
            "exports".into(),
            Output::sensitive_json("null"),
        )]));
        assert_eq!(reason(role(&tm, &capi, None, None)), Ok(json!({})));
        // An externally managed cluster has no state of CAPTF's: `{}`.
        capi.cluster_outputs = None;
        capi.terraform_cluster
            .as_mut()
            .unwrap()
            .metadata
            .annotations = Some(BTreeMap::from([(MANAGED_BY.into(), "x".into())]));
        assert_eq!(reason(role(&tm, &capi, None, None)), Ok(json!({})));

        let (tm, mut capi) = world(true);
        capi.bootstrap = None;
        assert_eq!(
            reason(role(&tm, &capi, None, None)),
            Err("WaitingForBootstrapData")
        );
    }
}
