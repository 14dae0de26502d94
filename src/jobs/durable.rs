//! The durable inputs Secret `captf-inputs-<ks>-<name>` (ref §7, §8.6):
//! the rendered root and values of the newest apply Job started, written
//! when it starts. A destroy runs from it, so that what is destroyed is what
//! was applied, whatever the spec says by the time the object is deleted.
//!
//! Building and reading are pure; [`write`] and [`mark_applied`] are the
//! I/O.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

use super::inputs::RenderedInputs;
use super::{lost_race, owner_labels};
use crate::keys::{APPLIED, IDENTITY, IMAGE, IMAGE_DIGEST, INPUTS_HASH};
use crate::names::{self, Kind};
use crate::protection;

pub const MAIN_KEY: &str = "main.tf.json";
pub const TFVARS_KEY: &str = "terraform.tfvars.json";

/// What the durable inputs of an apply are made of.
pub struct Record<'a> {
    pub kind: Kind,
    pub namespace: &'a str,
    pub name: &'a str,
    pub cluster_name: Option<&'a str>,
    pub owner: OwnerReference,
    pub inputs: &'a RenderedInputs,
    pub image: &'a str,
    pub identity: Option<&'a str>,
}

/// The Secret recording `record`, owned by the object.
pub fn build(record: &Record) -> Secret {
    let mut annotations = BTreeMap::from([
        (IMAGE.to_owned(), record.image.to_owned()),
        (INPUTS_HASH.to_owned(), record.inputs.inputs_hash.clone()),
    ]);
    if let Some(identity) = record.identity {
        annotations.insert(IDENTITY.to_owned(), identity.to_owned());
    }
    let mut metadata = ObjectMeta {
        name: Some(names::inputs_secret(record.kind, record.name)),
        namespace: Some(record.namespace.to_owned()),
        labels: Some(owner_labels(record.kind, record.name, record.cluster_name)),
        annotations: Some(annotations),
        owner_references: Some(vec![record.owner.clone()]),
        ..Default::default()
    };
    protection::protect(&mut metadata);
    Secret {
        metadata,
        data: Some(BTreeMap::from([
            (
                MAIN_KEY.to_owned(),
                ByteString(record.inputs.main_tf_json.clone()),
            ),
            (
                TFVARS_KEY.to_owned(),
                ByteString(record.inputs.tfvars_json.clone()),
            ),
        ])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// The durable inputs read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub inputs: RenderedInputs,
    pub image: Option<String>,
    pub identity: Option<String>,
    pub applied: bool,
    /// The digest the successful apply ran (ref §8.9).
    pub digest: Option<String>,
}

/// Reads a durable inputs Secret; None when either data key or the inputs
/// hash is missing, so a damaged record is never half-used.
pub fn read(secret: &Secret) -> Option<Recorded> {
    let data = secret.data.as_ref()?;
    let annotations = secret.metadata.annotations.as_ref();
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).cloned();
    Some(Recorded {
        inputs: RenderedInputs {
            main_tf_json: data.get(MAIN_KEY)?.0.clone(),
            tfvars_json: data.get(TFVARS_KEY)?.0.clone(),
            inputs_hash: annotation(INPUTS_HASH)?,
        },
        image: annotation(IMAGE),
        identity: annotation(IDENTITY),
        applied: annotation(APPLIED).as_deref() == Some("true"),
        digest: annotation(IMAGE_DIGEST),
    })
}

/// Whether a Secret found under the durable inputs name is one CAPTF wrote
/// for this object (an owner reference to its uid): anything else is left
/// alone.
pub fn owned_by(secret: &Secret, uid: &str) -> bool {
    secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid)
}

#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    #[error("Secret {0} exists and was not written by CAPTF for this object; it is left alone")]
    Foreign(String),
    #[error("writing Secret {name}: {source}")]
    Api {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing Secret {0}: kept conflicting with other writers")]
    Contended(String),
}

impl crate::error::Categorized for DurableError {
    fn category(&self) -> crate::error::Category {
        match self {
            DurableError::Foreign(_) => crate::error::Category::Invalid,
            DurableError::Api { source, .. } => crate::error::kube_category(source),
            DurableError::Contended(_) => crate::error::Category::Transient,
        }
    }
}

/// Creates or rewrites the durable inputs, and returns them as written.
/// The applied marker survives a rewrite: once applied, always applied.
/// When the watch has not `seen` them, the create goes first: a first
/// apply then costs no read, and one that exists after all is read and
/// rewritten as any other.
pub async fn write(
    api: &Api<Secret>,
    secret: Secret,
    uid: &str,
    seen: bool,
) -> Result<Secret, DurableError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let api_error = |source| DurableError::Api {
        name: name.clone(),
        source,
    };
    let mut absent = !seen;
    for _ in 0..5 {
        let current = match std::mem::take(&mut absent) {
            true => None,
            false => api.get_opt(&name).await.map_err(api_error)?,
        };
        let result = match current {
            None => api.create(&PostParams::default(), &secret).await,
            Some(existing) => {
                if !owned_by(&existing, uid) {
                    return Err(DurableError::Foreign(name));
                }
                let mut next = secret.clone();
                next.metadata.resource_version = existing.metadata.resource_version.clone();
                if read(&existing).is_some_and(|r| r.applied) {
                    next.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(APPLIED.to_owned(), "true".to_owned());
                }
                api.replace(&name, &PostParams::default(), &next).await
            }
        };
        match result {
            Ok(written) => return Ok(written),
            Err(e) if lost_race(&e) => continue,
            Err(e) => return Err(api_error(e)),
        }
    }
    Err(DurableError::Contended(name))
}

/// Marks the durable inputs applied, when they exist, with the digest the
/// apply ran, or without one when it is unknown; returns them as written.
pub async fn mark_applied(
    api: &Api<Secret>,
    kind: Kind,
    name: &str,
    digest: Option<&str>,
) -> Result<Option<Secret>, kube::Error> {
    let patch =
        serde_json::json!({"metadata": {"annotations": {APPLIED: "true", IMAGE_DIGEST: digest}}});
    match api
        .patch(
            &names::inputs_secret(kind, name),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(inputs: &RenderedInputs) -> Record<'_> {
        Record {
            kind: Kind::Machine,
            namespace: "ns",
            name: "m1",
            cluster_name: Some("c1"),
            owner: OwnerReference {
                uid: "u1".into(),
                name: "m1".into(),
                ..Default::default()
            },
            inputs,
            image: "registry.example/mod:1",
            identity: Some("id"),
        }
    }

    fn inputs() -> RenderedInputs {
        RenderedInputs {
            main_tf_json: b"{\"module\":{}}".to_vec(),
            tfvars_json: b"{}".to_vec(),
            inputs_hash: "h2:ab".into(),
        }
    }

    #[test]
    fn built_then_read_gives_the_inputs_back() {
        let inputs = inputs();
        let secret = build(&record(&inputs));
        assert_eq!(secret.metadata.name.as_deref(), Some("captf-inputs-m-m1"));
        assert!(owned_by(&secret, "u1"));
        assert!(!owned_by(&secret, "u2"));
        let labels = secret.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get(super::super::MANAGED_LABEL).map(String::as_str),
            Some("true")
        );
        assert_eq!(
            labels
                .get(super::super::CLUSTER_NAME_LABEL)
                .map(String::as_str),
            Some("c1")
        );
        let recorded = read(&secret).unwrap();
        let want = Recorded {
            inputs,
            image: Some("registry.example/mod:1".into()),
            identity: Some("id".into()),
            applied: false,
            digest: None,
        };
        assert_eq!(recorded, want);
    }

    #[test]
    fn a_damaged_record_is_not_read() {
        let inputs = inputs();
        let whole = build(&record(&inputs));
        let mut no_main = whole.clone();
        no_main.data.as_mut().unwrap().remove(MAIN_KEY);
        let mut no_vars = whole.clone();
        no_vars.data.as_mut().unwrap().remove(TFVARS_KEY);
        let mut no_hash = whole.clone();
        no_hash
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(INPUTS_HASH);
        let mut no_data = whole;
        no_data.data = None;
        for damaged in [no_main, no_vars, no_hash, no_data] {
            assert_eq!(read(&damaged), None);
        }
    }

    #[test]
    fn the_applied_marker_reads_true_only_as_true() {
        let inputs = inputs();
        for (value, want) in [("true", true), ("false", false), ("yes", false)] {
            let mut secret = build(&record(&inputs));
            secret
                .metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(APPLIED.into(), value.into());
            assert_eq!(read(&secret).map(|r| r.applied), Some(want), "{value}");
        }
    }
}
