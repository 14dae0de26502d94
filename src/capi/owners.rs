//! Who owns a workload object (ref §8.1 step 2, §3 DependenciesReady): a
//! TerraformCluster's Cluster, a TerraformMachine's controlling Machine, a
//! TerraformMachinePool's MachinePool, and for a machine or pool the Cluster
//! named by its cluster-name label and that Cluster's TerraformCluster.
//! Pure: observe reads what these name, [`check`] decides.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::objects::{Cluster, ContractRef, Machine, MachinePool};
use crate::controllers::conditions::{self, Cond, Status};
use crate::names::Kind;

/// The Cluster API group of the owners.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";

/// The kind of the owner a workload kind waits for.
pub const fn owner_kind(kind: Kind) -> &'static str {
    match kind {
        Kind::Cluster => "Cluster",
        Kind::Machine => "Machine",
        Kind::MachinePool => "MachinePool",
    }
}

/// The owner reference that names the object's owner: of the owner kind in
/// Cluster API's group; a machine's must be its controller.
pub fn owner_ref(kind: Kind, refs: &[OwnerReference]) -> Option<&OwnerReference> {
    refs.iter().find(|r| {
        r.kind == owner_kind(kind)
            && r.api_version.split('/').next() == Some(CAPI_GROUP)
            && (kind != Kind::Machine || r.controller == Some(true))
    })
}

/// The owner, as read through [`owner_ref`].
#[derive(Clone, Copy, Debug)]
pub enum Owner<'a> {
    Cluster(&'a Cluster),
    Machine(&'a Machine),
    Pool(&'a MachinePool),
}

impl Owner<'_> {
    fn uid(&self) -> Option<&str> {
        match self {
            Owner::Cluster(c) => c.metadata.uid.as_deref(),
            Owner::Machine(m) => m.metadata.uid.as_deref(),
            Owner::Pool(p) => p.metadata.uid.as_deref(),
        }
    }

    /// The reference back to the object, and the cluster the owner is in.
    fn points_at(&self) -> (Option<&ContractRef>, Option<&str>) {
        match self {
            Owner::Cluster(c) => (
                c.spec.infrastructure_ref.as_ref(),
                c.metadata.name.as_deref(),
            ),
            Owner::Machine(m) => (
                m.spec.infrastructure_ref.as_ref(),
                Some(m.spec.cluster_name.as_str()),
            ),
            Owner::Pool(p) => (
                p.spec.template.spec.infrastructure_ref.as_ref(),
                Some(p.spec.cluster_name.as_str()),
            ),
        }
    }
}

/// Whether `infra` names the object `kind`/`name` of CAPTF's group.
pub fn names_object(infra: Option<&ContractRef>, kind: Kind, name: &str) -> bool {
    infra.is_some_and(|r| {
        r.api_group == crate::api::GROUP && r.kind == kind.kind() && r.name == name
    })
}

/// What observe found for the check.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    pub kind: Kind,
    pub name: &'a str,
    /// The object's cluster-name label.
    pub cluster_label: Option<&'a str>,
    pub owner_refs: &'a [OwnerReference],
    /// The owner [`owner_ref`] names; None when it is not found.
    pub owner: Option<Owner<'a>>,
    /// A machine's or pool's Cluster, by its cluster-name label.
    pub cluster: Option<&'a Cluster>,
    /// That Cluster's TerraformCluster was found.
    pub terraform_cluster: bool,
}

/// Why the owners keep a Job from starting: DependenciesReady with the
/// reason. A deletion proceeds whatever it says.
pub fn check(f: &Facts) -> Result<(), Cond> {
    let owner_kind = owner_kind(f.kind);
    let Some(reference) = owner_ref(f.kind, f.owner_refs) else {
        // One reason per kind (ref §8.1 step 2), Unknown: waiting never
        // makes Ready False.
        let (reason, message) = match f.kind {
            Kind::Cluster => ("WaitingForOwner", "waiting for a Cluster to own the object"),
            Kind::Machine => (
                "WaitingForOwnerMachine",
                "waiting for the controlling Machine's owner reference",
            ),
            Kind::MachinePool => (
                "WaitingForOwnerMachinePool",
                "waiting for the MachinePool's owner reference",
            ),
        };
        return Err(waiting(Status::Unknown, reason, message));
    };
    let Some(owner) = f.owner else {
        return Err(waiting(
            Status::False,
            "OwnerNotFound",
            format!("{owner_kind} {} is not found", reference.name),
        ));
    };
    points_back(f.kind, f.name, f.cluster_label, reference, owner)?;
    if f.kind == Kind::Cluster {
        return Ok(());
    }
    let cluster_name = f.cluster_label.unwrap_or_default();
    let Some(cluster) = f.cluster else {
        return Err(waiting(
            Status::False,
            "OwnerNotFound",
            format!("Cluster {cluster_name} is not found"),
        ));
    };
    let infra = cluster.spec.infrastructure_ref.as_ref();
    if !infra.is_some_and(|r| r.api_group == crate::api::GROUP && r.kind == Kind::Cluster.kind()) {
        return Err(waiting(
            Status::False,
            "ClusterNotTerraform",
            format!("the infrastructure of Cluster {cluster_name} is not a TerraformCluster"),
        ));
    }
    if !f.terraform_cluster {
        return Err(waiting(
            Status::False,
            "OwnerNotFound",
            format!(
                "TerraformCluster {} of Cluster {cluster_name} is not found",
                infra.map(|r| r.name.as_str()).unwrap_or_default()
            ),
        ));
    }
    Ok(())
}

/// The owner checks of OwnerMismatch (ref §3): `owner`, named by
/// `reference`, refers to the object `kind`/`name` in its
/// infrastructureRef, has the reference's UID, and is in the cluster of the
/// object's cluster-name label.
pub fn points_back(
    kind: Kind,
    name: &str,
    cluster_label: Option<&str>,
    reference: &OwnerReference,
    owner: Owner<'_>,
) -> Result<(), Cond> {
    let owner_kind = owner_kind(kind);
    let (infra, owner_cluster) = owner.points_at();
    let mismatch = |why: &str| {
        waiting(
            Status::False,
            "OwnerMismatch",
            format!("{owner_kind} {} {why}", reference.name),
        )
    };
    if !names_object(infra, kind, name) {
        return Err(mismatch(&format!(
            "does not refer to this {} in its infrastructureRef",
            kind.kind()
        )));
    }
    if owner.uid() != Some(reference.uid.as_str()) {
        return Err(mismatch("has another UID than the owner reference"));
    }
    // A Cluster owns a TerraformCluster without a label; where there is
    // one, it must agree.
    let label_ok = match (kind, cluster_label) {
        (Kind::Cluster, None) => true,
        (_, label) => label.is_some() && label == owner_cluster,
    };
    if !label_ok {
        return Err(mismatch(
            "is in another cluster than the object's cluster-name label",
        ));
    }
    Ok(())
}

fn waiting(status: Status, reason: &'static str, message: impl Into<String>) -> Cond {
    Cond::new(conditions::DEPENDENCIES_READY, status, reason, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::objects::{ClusterSpec, MachinePoolSpec, MachineSpec};

    fn reference(kind: &str, name: &str, uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: None,
        }
    }

    fn infra(kind: Kind, name: &str) -> Option<ContractRef> {
        Some(ContractRef {
            api_group: crate::api::GROUP.into(),
            kind: kind.kind().into(),
            name: name.into(),
        })
    }

    fn cluster(name: &str, uid: &str, infra_name: &str) -> Cluster {
        let mut c = Cluster::new(
            name,
            ClusterSpec {
                infrastructure_ref: infra(Kind::Cluster, infra_name),
                ..Default::default()
            },
        );
        c.metadata.uid = Some(uid.into());
        c
    }

    fn machine(name: &str, uid: &str, cluster: &str, infra_name: &str) -> Machine {
        let mut m = Machine::new(
            name,
            MachineSpec {
                cluster_name: cluster.into(),
                infrastructure_ref: infra(Kind::Machine, infra_name),
                ..Default::default()
            },
        );
        m.metadata.uid = Some(uid.into());
        m
    }

    fn reason(r: Result<(), Cond>) -> Option<(&'static str, Status)> {
        r.err().map(|c| (c.reason, c.status))
    }

    #[test]
    fn a_terraform_cluster_needs_a_cluster_that_refers_back() {
        let c = cluster("c", "u1", "tc");
        let other = cluster("c", "u1", "elsewhere");
        let refs = [reference("Cluster", "c", "u1", true)];
        let wrong_uid = [reference("Cluster", "c", "u2", true)];
        fn facts<'a>(
            refs: &'a [OwnerReference],
            owner: Option<Owner<'a>>,
            label: Option<&'a str>,
        ) -> Facts<'a> {
            Facts {
                kind: Kind::Cluster,
                name: "tc",
                cluster_label: label,
                owner_refs: refs,
                owner,
                cluster: None,
                terraform_cluster: false,
            }
        }
        let cases = [
            (
                facts(&[], None, None),
                Some(("WaitingForOwner", Status::Unknown)),
            ),
            (
                facts(&refs, None, None),
                Some(("OwnerNotFound", Status::False)),
            ),
            (facts(&refs, Some(Owner::Cluster(&c)), None), None),
            (facts(&refs, Some(Owner::Cluster(&c)), Some("c")), None),
            (
                facts(&refs, Some(Owner::Cluster(&c)), Some("d")),
                Some(("OwnerMismatch", Status::False)),
            ),
            (
                facts(&refs, Some(Owner::Cluster(&other)), None),
                Some(("OwnerMismatch", Status::False)),
            ),
            (
                facts(&wrong_uid, Some(Owner::Cluster(&c)), None),
                Some(("OwnerMismatch", Status::False)),
            ),
        ];
        for (i, (f, want)) in cases.into_iter().enumerate() {
            assert_eq!(reason(check(&f)), want, "case {i}");
        }
    }

    #[test]
    fn a_terraform_machine_needs_its_controlling_machine_and_a_terraform_cluster() {
        let m = machine("m", "mu", "c", "tm");
        let in_other_cluster = machine("m", "mu", "d", "tm");
        let c = cluster("c", "cu", "tc");
        let mut not_terraform = cluster("c", "cu", "tc");
        not_terraform.spec.infrastructure_ref = Some(ContractRef {
            api_group: "infrastructure.cluster.x-k8s.io".into(),
            kind: "DockerCluster".into(),
            name: "tc".into(),
        });
        let controller = [reference("Machine", "m", "mu", true)];
        let not_controller = [reference("Machine", "m", "mu", false)];
        let control_plane = [OwnerReference {
            api_version: "controlplane.cluster.x-k8s.io/v1beta2".into(),
            kind: "KubeadmControlPlane".into(),
            name: "cp".into(),
            uid: "cpu".into(),
            controller: Some(false),
            block_owner_deletion: None,
        }];
        struct Case<'a> {
            refs: &'a [OwnerReference],
            owner: Option<&'a Machine>,
            cluster: Option<&'a Cluster>,
            label: Option<&'a str>,
            terraform_cluster: bool,
            want: Option<(&'static str, Status)>,
        }
        let ok = Case {
            refs: &controller,
            owner: Some(&m),
            cluster: Some(&c),
            label: Some("c"),
            terraform_cluster: true,
            want: None,
        };
        let cases = [
            Case {
                refs: &[],
                want: Some(("WaitingForOwnerMachine", Status::Unknown)),
                ..ok
            },
            Case {
                refs: &control_plane,
                want: Some(("WaitingForOwnerMachine", Status::Unknown)),
                ..ok
            },
            Case {
                refs: &not_controller,
                want: Some(("WaitingForOwnerMachine", Status::Unknown)),
                ..ok
            },
            Case {
                owner: None,
                want: Some(("OwnerNotFound", Status::False)),
                ..ok
            },
            Case {
                owner: Some(&in_other_cluster),
                want: Some(("OwnerMismatch", Status::False)),
                ..ok
            },
            Case {
                label: None,
                want: Some(("OwnerMismatch", Status::False)),
                ..ok
            },
            Case {
                cluster: None,
                want: Some(("OwnerNotFound", Status::False)),
                ..ok
            },
            Case {
                cluster: Some(&not_terraform),
                want: Some(("ClusterNotTerraform", Status::False)),
                ..ok
            },
            Case {
                terraform_cluster: false,
                want: Some(("OwnerNotFound", Status::False)),
                ..ok
            },
            ok,
        ];
        for (i, case) in cases.into_iter().enumerate() {
            let f = Facts {
                kind: Kind::Machine,
                name: "tm",
                cluster_label: case.label,
                owner_refs: case.refs,
                owner: case.owner.map(Owner::Machine),
                cluster: case.cluster,
                terraform_cluster: case.terraform_cluster,
            };
            assert_eq!(reason(check(&f)), case.want, "case {i}");
        }
    }

    #[test]
    fn a_pool_is_found_through_its_machine_pool_template() {
        let mut p = MachinePool::new(
            "mp",
            MachinePoolSpec {
                cluster_name: "c".into(),
                ..Default::default()
            },
        );
        p.metadata.uid = Some("pu".into());
        let c = cluster("c", "cu", "tc");
        let refs = [reference("MachinePool", "mp", "pu", true)];
        fn f<'a>(p: &'a MachinePool, c: &'a Cluster, refs: &'a [OwnerReference]) -> Facts<'a> {
            Facts {
                kind: Kind::MachinePool,
                name: "tp",
                cluster_label: Some("c"),
                owner_refs: refs,
                owner: Some(Owner::Pool(p)),
                cluster: Some(c),
                terraform_cluster: true,
            }
        }
        assert_eq!(
            reason(check(&f(&p, &c, &refs))),
            Some(("OwnerMismatch", Status::False))
        );
        p.spec.template.spec.infrastructure_ref = infra(Kind::MachinePool, "tp");
        assert_eq!(reason(check(&f(&p, &c, &refs))), None);
        let other = [reference("Machine", "m", "mu", true)];
        let waiting = Facts {
            owner_refs: &other,
            owner: None,
            ..f(&p, &c, &refs)
        };
        assert_eq!(
            reason(check(&waiting)),
            Some(("WaitingForOwnerMachinePool", Status::Unknown))
        );
    }
}
