//! Credentials (ref §8.8 "Identity mirror", as far as the Job needs it): the
//! identity an object resolves to, whether it allows the object's namespace,
//! and the mirror Secret `captf-creds-<identity>` the Job mounts.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::core::{Selector, SelectorExt};
use sha2::{Digest, Sha256};

use super::Error;
use super::conditions::{CREDENTIALS_MIRRORED, Cond, IDENTITY_ALLOWED, Status};
use crate::api::{AllowedNamespaces, TerraformCluster, TerraformClusterIdentity, WorkspaceSpec};
use crate::jobs::MANAGED_LABEL;
use crate::names;

const MIRRORED_LABEL: &str = "captf.io/mirrored";
const SOURCE_HASH: &str = "captf.io/source-hash";
const IDENTITY_ANNOTATION: &str = "captf.io/identity";

/// The identity an object resolves to (ref §1.3): its own identityRef; for a
/// machine or pool, then its cluster's spec.defaults.identityRef, then the
/// cluster's identityRef.
pub fn identity_name<'a>(
    own: &'a WorkspaceSpec,
    cluster: Option<&'a TerraformCluster>,
) -> Option<&'a str> {
    own.identity_ref
        .as_ref()
        .or_else(|| {
            cluster
                .and_then(|c| c.spec.defaults.as_ref())
                .and_then(|d| d.identity_ref.as_ref())
        })
        .or_else(|| cluster.and_then(|c| c.spec.workspace.identity_ref.as_ref()))
        .map(|r| r.name.as_str())
}

/// Whether `allowed` lets a namespace with these labels use the identity:
/// unset allows none, the list and the selector are ORed, and an empty
/// selector allows every namespace.
pub fn namespace_allowed(
    allowed: Option<&AllowedNamespaces>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(allowed) = allowed else { return false };
    if allowed
        .list
        .as_ref()
        .is_some_and(|l| l.iter().any(|n| n == namespace))
    {
        return true;
    }
    allowed
        .selector
        .as_ref()
        .is_some_and(|s| selector_matches(s, labels))
}

fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    // A selector that cannot be converted (an unknown operator) matches
    // nothing rather than everything.
    match Selector::try_from(selector.clone()) {
        Ok(s) => s.matches(labels),
        Err(_) => false,
    }
}

/// The hash of a source Secret's data, recorded on the mirror so a rewrite
/// happens only when the data changed.
pub fn source_hash(data: &BTreeMap<String, ByteString>) -> String {
    let mut h = Sha256::new();
    for (k, v) in data {
        h.update((k.len() as u64).to_be_bytes());
        h.update(k.as_bytes());
        h.update((v.0.len() as u64).to_be_bytes());
        h.update(&v.0);
    }
    format!("{:x}", h.finalize())
}

/// The outcome of resolving and mirroring an object's credentials.
pub struct Credentials {
    /// The mirror Secret's identity, when the Job may start.
    pub identity: Option<String>,
    pub allowed: Cond,
    pub mirrored: Cond,
}

fn pending(message: &str) -> Cond {
    Cond::new(
        CREDENTIALS_MIRRORED,
        Status::Unknown,
        "MirrorPending",
        message,
    )
}

/// Resolves the identity and writes the mirror. API errors while reading
/// the identity are returned (IdentityCheckFailed is transient).
pub async fn ensure(
    client: &kube::Client,
    namespace: &str,
    identity: Option<&str>,
    owner: OwnerReference,
) -> Result<Credentials, Error> {
    let Some(identity) = identity else {
        return Ok(Credentials {
            identity: None,
            allowed: Cond::new(
                IDENTITY_ALLOWED,
                Status::False,
                "IdentityNotFound",
                "no identityRef: set spec.identityRef (or the cluster's)",
            ),
            mirrored: pending("waiting for an allowed identity"),
        });
    };
    let identities: Api<TerraformClusterIdentity> = Api::all(client.clone());
    let Some(found) = identities.get_opt(identity).await.map_err(Error::Kube)? else {
        return Ok(Credentials {
            identity: None,
            allowed: Cond::new(
                IDENTITY_ALLOWED,
                Status::False,
                "IdentityNotFound",
                format!("TerraformClusterIdentity {identity} not found"),
            ),
            mirrored: pending("waiting for an allowed identity"),
        });
    };
    let ns = Api::<Namespace>::all(client.clone())
        .get(namespace)
        .await
        .map_err(Error::Kube)?;
    let labels = ns.metadata.labels.unwrap_or_default();
    if !namespace_allowed(found.spec.allowed_namespaces.as_ref(), namespace, &labels) {
        return Ok(Credentials {
            identity: None,
            allowed: Cond::new(
                IDENTITY_ALLOWED,
                Status::False,
                "NamespaceNotAllowed",
                format!("TerraformClusterIdentity {identity} does not allow namespace {namespace}"),
            ),
            mirrored: pending("waiting for an allowed identity"),
        });
    }
    let source_ref = &found.spec.secret_ref;
    let source = Api::<Secret>::namespaced(client.clone(), &source_ref.namespace)
        .get_opt(&source_ref.name)
        .await
        .map_err(Error::Kube)?;
    let Some(source) = source else {
        return Ok(Credentials {
            identity: None,
            allowed: Cond::new(
                IDENTITY_ALLOWED,
                Status::False,
                "SecretNotFound",
                format!(
                    "Secret {}/{} of TerraformClusterIdentity {identity} not found",
                    source_ref.namespace, source_ref.name
                ),
            ),
            mirrored: pending("waiting for an allowed identity"),
        });
    };
    let allowed = Cond::new(
        IDENTITY_ALLOWED,
        Status::True,
        "IdentityAllowed",
        format!("TerraformClusterIdentity {identity} allows namespace {namespace}"),
    );
    let mirrored = match mirror(client, namespace, identity, source, owner).await {
        Ok(()) => Cond::new(
            CREDENTIALS_MIRRORED,
            Status::True,
            "Mirrored",
            format!(
                "Secret {} holds the credentials",
                names::credentials_mirror(identity)
            ),
        ),
        Err(why) => {
            return Ok(Credentials {
                identity: None,
                allowed,
                mirrored: Cond::new(CREDENTIALS_MIRRORED, Status::False, "MirrorFailed", why),
            });
        }
    };
    Ok(Credentials {
        identity: Some(identity.to_string()),
        allowed,
        mirrored,
    })
}

/// Creates or refreshes the mirror; the error is the condition message. A
/// Secret of that name that is not a mirror is never overwritten.
async fn mirror(
    client: &kube::Client,
    namespace: &str,
    identity: &str,
    source: Secret,
    owner: OwnerReference,
) -> Result<(), String> {
    let name = names::credentials_mirror(identity);
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let data = source.data.unwrap_or_default();
    let hash = source_hash(&data);
    for _ in 0..3 {
        let existing = api
            .get_opt(&name)
            .await
            .map_err(|e| format!("reading Secret {name}: {e}"))?;
        let result = match existing {
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(namespace.to_string()),
                        labels: Some(BTreeMap::from([
                            (MANAGED_LABEL.to_string(), "true".to_string()),
                            (MIRRORED_LABEL.to_string(), "true".to_string()),
                        ])),
                        annotations: Some(BTreeMap::from([
                            (SOURCE_HASH.to_string(), hash.clone()),
                            (IDENTITY_ANNOTATION.to_string(), identity.to_string()),
                        ])),
                        owner_references: Some(vec![owner.clone()]),
                        ..Default::default()
                    },
                    data: Some(data.clone()),
                    type_: Some("Opaque".into()),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &secret).await.map(drop)
            }
            Some(mut secret) => {
                let labels = secret.metadata.labels.get_or_insert_default();
                if labels.get(MIRRORED_LABEL).map(String::as_str) != Some("true") {
                    return Err(format!(
                        "Secret {name} exists and is not a CAPTF credentials mirror; it is left alone"
                    ));
                }
                let annotations = secret.metadata.annotations.get_or_insert_default();
                let same_data = annotations.get(SOURCE_HASH) == Some(&hash);
                let owners = secret.metadata.owner_references.get_or_insert_default();
                let owned = owners.iter().any(|o| o.uid == owner.uid);
                if same_data && owned {
                    return Ok(());
                }
                if !owned {
                    owners.push(owner.clone());
                }
                annotations.insert(SOURCE_HASH.to_string(), hash.clone());
                secret.data = Some(data.clone());
                api.replace(&name, &PostParams::default(), &secret)
                    .await
                    .map(drop)
            }
        };
        match result {
            Ok(()) => return Ok(()),
            // Another object of the namespace wrote it in between: read again.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(format!("writing Secret {name}: {e}")),
        }
    }
    Err(format!(
        "writing Secret {name}: kept conflicting with other writers"
    ))
}

/// Removes the object `uid` from the users of every credentials mirror of
/// the namespace (ref §8.6 cleanup), and deletes a mirror it was the last
/// user of; returns the names of the deleted ones. Writes are guarded by
/// the resourceVersion read, and a conflict reads again.
pub async fn release(
    client: &kube::Client,
    namespace: &str,
    uid: &str,
) -> Result<Vec<String>, kube::Error> {
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    let mut removed = Vec::new();
    let mirrors = api
        .list(&ListParams::default().labels(&format!("{MIRRORED_LABEL}=true")))
        .await?;
    for mirror in mirrors.items {
        let name = mirror.name_any();
        let mut current = Some(mirror);
        while let Some(mut secret) = current.take() {
            let owners = secret.metadata.owner_references.get_or_insert_default();
            let before = owners.len();
            owners.retain(|o| o.uid != uid);
            let result = if owners.len() == before {
                Ok(())
            } else if owners.is_empty() {
                let precondition = kube::api::Preconditions {
                    resource_version: secret.metadata.resource_version.clone(),
                    uid: None,
                };
                let params = DeleteParams {
                    preconditions: Some(precondition),
                    ..Default::default()
                };
                api.delete(&name, &params)
                    .await
                    .map(|_| removed.push(name.clone()))
            } else {
                api.replace(&name, &PostParams::default(), &secret)
                    .await
                    .map(drop)
            };
            match result {
                Ok(()) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(kube::Error::Api(e)) if e.code == 409 => current = api.get_opt(&name).await?,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

/// A non-blocking owner reference, so the mirror goes once its last user
/// is gone.
pub fn user_reference(
    api_version: String,
    kind: String,
    name: String,
    uid: String,
) -> OwnerReference {
    OwnerReference {
        api_version,
        kind,
        name,
        uid,
        controller: None,
        block_owner_deletion: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ClusterDefaults, IdentityReference, TerraformClusterSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn ident(n: &str) -> Option<IdentityReference> {
        Some(IdentityReference { name: n.into() })
    }

    #[test]
    fn identity_resolution_order() {
        let own = WorkspaceSpec {
            identity_ref: ident("own"),
            ..Default::default()
        };
        let none = WorkspaceSpec::default();
        let mut cluster = TerraformCluster::new(
            "c",
            TerraformClusterSpec {
                workspace: WorkspaceSpec {
                    identity_ref: ident("cluster"),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        assert_eq!(identity_name(&own, Some(&cluster)), Some("own"));
        assert_eq!(identity_name(&none, Some(&cluster)), Some("cluster"));
        cluster.spec.defaults = Some(ClusterDefaults {
            identity_ref: ident("defaults"),
            ..Default::default()
        });
        assert_eq!(identity_name(&none, Some(&cluster)), Some("defaults"));
        assert_eq!(identity_name(&none, None), None);
    }

    #[test]
    fn allowed_namespaces() {
        let labels = BTreeMap::from([("team".to_string(), "a".to_string())]);
        let list = AllowedNamespaces {
            list: Some(vec!["ns1".into()]),
            selector: None,
        };
        let every = AllowedNamespaces {
            list: None,
            selector: Some(LabelSelector::default()),
        };
        let team_b = AllowedNamespaces {
            list: Some(vec!["ns9".into()]),
            selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "team".into(),
                    operator: "In".into(),
                    values: Some(vec!["b".into()]),
                }]),
                match_labels: None,
            }),
        };
        let bad = AllowedNamespaces {
            list: None,
            selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "team".into(),
                    operator: "Near".into(),
                    values: None,
                }]),
                match_labels: None,
            }),
        };
        let table = [
            (None, "ns1", false),
            (Some(&list), "ns1", true),
            (Some(&list), "ns2", false),
            (Some(&every), "anything", true),
            (Some(&team_b), "ns1", false),
            (Some(&team_b), "ns9", true),
            (Some(&bad), "ns1", false),
        ];
        for (allowed, ns, want) in table {
            assert_eq!(
                namespace_allowed(allowed, ns, &labels),
                want,
                "{allowed:?} {ns}"
            );
        }
    }

    #[test]
    fn source_hash_sees_every_key_and_byte() {
        let a = BTreeMap::from([("k".to_string(), ByteString(b"v".to_vec()))]);
        let b = BTreeMap::from([("k".to_string(), ByteString(b"w".to_vec()))]);
        let c = BTreeMap::from([("kv".to_string(), ByteString(Vec::new()))]);
        assert_ne!(source_hash(&a), source_hash(&b));
        assert_ne!(source_hash(&a), source_hash(&c));
        assert_eq!(source_hash(&a), source_hash(&a.clone()));
    }
}
