//! The Cluster API reads of a pass (observe's share): the owner, the
//! Cluster, a machine's or pool's TerraformCluster, the bootstrap data and
//! the cluster's outputs. Nothing here writes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;

use super::cached;

use crate::api::TerraformCluster;
use crate::capi::objects::{Cluster, Machine, MachinePool};
use crate::capi::owners::{self, Owner};
use crate::controllers::workload::Workload;
use crate::controllers::{Context, Error};
use crate::keys::MANAGED_BY;
use crate::names::{self, Kind};
use crate::state::{Output, StateReadable};

/// What a pass read of Cluster API.
#[derive(Default)]
pub struct Capi {
    pub owner: Option<Owned>,
    /// The object's Cluster: a TerraformCluster's owner, a machine's or
    /// pool's by its cluster-name label.
    pub cluster: Option<Cluster>,
    /// A machine's or pool's TerraformCluster, through the Cluster's
    /// infrastructureRef.
    pub terraform_cluster: Option<TerraformCluster>,
    /// The bootstrap Secret's data, when it exists.
    pub bootstrap: Option<BTreeMap<String, Vec<u8>>>,
    /// The TerraformCluster's outputs: None when its state is not readable.
    pub cluster_outputs: Option<BTreeMap<String, Output>>,
}

/// The owner, as read.
pub enum Owned {
    Cluster(Cluster),
    Machine(Machine),
    Pool(MachinePool),
}

impl Capi {
    pub fn owner(&self) -> Option<Owner<'_>> {
        self.owner.as_ref().map(|o| match o {
            Owned::Cluster(c) => Owner::Cluster(c),
            Owned::Machine(m) => Owner::Machine(m),
            Owned::Pool(p) => Owner::Pool(p),
        })
    }

    pub fn machine(&self) -> Option<&Machine> {
        match &self.owner {
            Some(Owned::Machine(m)) => Some(m),
            _ => None,
        }
    }

    pub fn pool(&self) -> Option<&MachinePool> {
        match &self.owner {
            Some(Owned::Pool(p)) => Some(p),
            _ => None,
        }
    }
}

/// Whether something else than CAPTF manages the object (ref §8.1 step 1).
pub fn externally_managed(obj: &impl kube::Resource) -> bool {
    obj.meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MANAGED_BY))
}

/// Reads what the owners name. `inputs`: the role inputs are still built
/// (not a machine that was provisioned), so the bootstrap data and the
/// cluster's outputs are read too.
pub async fn read<K: Workload>(
    ctx: &Context,
    obj: &K,
    ns: &str,
    inputs: bool,
) -> Result<Capi, Error> {
    let w = &ctx.watches;
    let refs = obj.owner_references();
    let mut capi = Capi::default();
    let owned = |o: Option<Arc<Cluster>>| o.map(|o| (*o).clone());
    if let Some(r) = owners::owner_ref(K::KIND, refs) {
        capi.owner = match K::KIND {
            Kind::Cluster => owned(w.clusters.get(ns, &r.name)).map(Owned::Cluster),
            Kind::Machine => w
                .machines
                .get(ns, &r.name)
                .map(|m| Owned::Machine((*m).clone())),
            Kind::MachinePool => w
                .machine_pools
                .get(ns, &r.name)
                .map(|p| Owned::Pool((*p).clone())),
        };
    }
    if let Some(Owned::Cluster(c)) = &capi.owner {
        capi.cluster = Some(c.clone());
    }
    if K::KIND == Kind::Cluster {
        return Ok(capi);
    }
    let Some(cluster_name) = obj.cluster_name() else {
        return Ok(capi);
    };
    capi.cluster = owned(w.clusters.get(ns, cluster_name));
    let infra = capi
        .cluster
        .as_ref()
        .and_then(|c| c.spec.infrastructure_ref.as_ref())
        .filter(|r| r.api_group == crate::api::GROUP && r.kind == Kind::Cluster.kind());
    if let Some(infra) = infra {
        capi.terraform_cluster = w
            .terraform_clusters
            .get(&ObjectRef::new(&infra.name).within(ns))
            .map(|c| (*c).clone());
    }
    if !inputs {
        return Ok(capi);
    }
    let secret = match &capi.owner {
        Some(Owned::Machine(m)) => m.spec.bootstrap.as_ref(),
        Some(Owned::Pool(p)) => p.spec.template.spec.bootstrap.as_ref(),
        _ => None,
    }
    .and_then(|b| b.data_secret_name.as_deref())
    .filter(|n| !n.is_empty());
    // Read live: Cluster API's bootstrap Secrets carry no label of CAPTF's,
    // and only objects still building their inputs read them.
    if let Some(name) = secret {
        capi.bootstrap = Api::<Secret>::namespaced(ctx.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(Error::Kube)?
            .map(|s| {
                s.data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect()
            });
    }
    // An externally managed cluster has no state of CAPTF's to read.
    if let Some(tc) = capi
        .terraform_cluster
        .as_ref()
        .filter(|tc| !externally_managed(*tc))
    {
        let suffix = names::suffix(ns, Kind::Cluster, &tc.name_any());
        capi.cluster_outputs = match &cached::state(ctx, ns, &suffix, |_| true).await?.readable {
            StateReadable::Read(st) => Some(st.outputs.clone()),
            _ => None,
        };
    }
    Ok(capi)
}
