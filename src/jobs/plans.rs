//! The plan key and the saved plan of a TerraformCluster under Manual
//! approval (ref Appendix B "Plan key Secret"): `captf-plankey-<ks>-<name>`
//! holds 32 random bytes under `key`, made once and never rotated, and
//! `captf-plan-<ks>-<name>` the plan a plan Job saved, sealed with that key
//! by the runner (`crate::runner::saved`). Both are owned by the object and
//! deleted by cleanup; only plan and approved-apply Jobs mount the key.
//!
//! Building is pure; [`ensure`] is the I/O.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, PostParams};
use ring::rand::{SecureRandom, SystemRandom};

use super::{lost_race, owner_labels};
use crate::names::{self, Kind};

/// The data key of the plan key Secret, and the file the runner reads.
pub const KEY: &str = "key";
/// How many random bytes a plan key has.
pub const KEY_BYTES: usize = 32;

/// Who the Secrets are for.
pub struct Owner<'a> {
    pub kind: Kind,
    pub namespace: &'a str,
    pub name: &'a str,
    pub cluster_name: Option<&'a str>,
    pub owner: &'a OwnerReference,
}

fn secret(o: &Owner, name: String, data: BTreeMap<String, ByteString>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(o.namespace.to_owned()),
            labels: Some(owner_labels(o.kind, o.name, o.cluster_name)),
            owner_references: Some(vec![o.owner.clone()]),
            ..Default::default()
        },
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// The plan key Secret holding `key`.
pub fn key_secret(o: &Owner, key: [u8; KEY_BYTES]) -> Secret {
    secret(
        o,
        names::plan_key(o.kind, o.name),
        BTreeMap::from([(KEY.to_owned(), ByteString(key.to_vec()))]),
    )
}

/// The saved plan's Secret, empty until a plan Job saves into it.
pub fn plan_secret(o: &Owner) -> Secret {
    secret(o, names::plan_secret(o.kind, o.name), BTreeMap::new())
}

#[derive(Debug, thiserror::Error)]
pub enum PlanSecretsError {
    #[error("no random bytes for the plan key")]
    Random,
    #[error("creating {0}: {1}")]
    Create(String, kube::Error),
}

impl crate::error::Categorized for PlanSecretsError {
    fn category(&self) -> crate::error::Category {
        match self {
            PlanSecretsError::Random => crate::error::Category::Internal,
            PlanSecretsError::Create(_, e) => crate::error::kube_category(e),
        }
    }
}

/// Creates the plan key (fresh random bytes) and the saved plan's Secret
/// where they do not exist yet. An existing key is never replaced: a plan
/// saved under it must still open.
pub async fn ensure(secrets: &Api<Secret>, o: &Owner<'_>) -> Result<(), PlanSecretsError> {
    let mut key = [0u8; KEY_BYTES];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| PlanSecretsError::Random)?;
    for wanted in [key_secret(o, key), plan_secret(o)] {
        let name = wanted.metadata.name.clone().unwrap_or_default();
        match secrets.create(&PostParams::default(), &wanted).await {
            Ok(_) => {}
            Err(e) if lost_race(&e) => {}
            Err(e) => return Err(PlanSecretsError::Create(name, e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_secrets_are_the_objects() {
        let owner = OwnerReference {
            api_version: "infrastructure.cluster.x-k8s.io/v1alpha1".into(),
            kind: "TerraformCluster".into(),
            name: "prod".into(),
            uid: "u-1".into(),
            ..Default::default()
        };
        let o = Owner {
            kind: Kind::Cluster,
            namespace: "team-a",
            name: "prod",
            cluster_name: Some("prod"),
            owner: &owner,
        };
        let key = key_secret(&o, [9; KEY_BYTES]);
        assert_eq!(key.metadata.name.as_deref(), Some("captf-plankey-c-prod"));
        assert_eq!(key.data.as_ref().unwrap()[KEY].0, vec![9; KEY_BYTES]);
        let plan = plan_secret(&o);
        assert_eq!(plan.metadata.name.as_deref(), Some("captf-plan-c-prod"));
        assert!(plan.data.as_ref().unwrap().is_empty());
        for s in [&key, &plan] {
            assert_eq!(
                s.metadata.owner_references.as_deref(),
                Some(&[owner.clone()][..])
            );
            assert_eq!(
                s.metadata.labels.as_ref().unwrap()["captf.io/managed"],
                "true"
            );
            assert_eq!(s.metadata.namespace.as_deref(), Some("team-a"));
        }
    }
}
