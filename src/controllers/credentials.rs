//! Credentials (ref §8.8 "Identity mirror", as far as the Job needs it): the
//! identity an object resolves to, whether it allows the object's namespace,
//! and the mirror Secret `captf-creds-<identity>` the Job mounts.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, PartialObjectMeta, Patch, PatchParams, PostParams,
};
use kube::core::{Selector, SelectorExt};
use sha2::{Digest, Sha256};

use super::Error;
use super::conditions::{CREDENTIALS_MIRRORED, Cond, IDENTITY_ALLOWED, Status};
use super::watches::Watches;
use crate::api::{AllowedNamespaces, TerraformCluster, TerraformClusterIdentity, WorkspaceSpec};
use crate::keys::{IDENTITY, MANAGED_LABEL, MIRRORED_LABEL, PROTECTION, SOURCE_HASH};
use crate::names;
use crate::protection;
use kube::core::PartialObjectMetaExt;
use kube::runtime::reflector::ObjectRef;

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

/// What a pass reads for the credentials: the identity, the namespace's
/// labels (read with the namespace), the identity's Secret (only when the
/// namespace is allowed) and the mirror's metadata (its data is the
/// source's, by its hash annotation). Shared with the watches, not copied:
/// the mirror lists every user of the namespace.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub name: Option<String>,
    pub identity: Option<Arc<TerraformClusterIdentity>>,
    pub namespace_labels: BTreeMap<String, String>,
    pub source: Option<Arc<Secret>>,
    pub mirror: Option<Arc<PartialObjectMeta<Secret>>>,
}

/// Gathers what [`decide`] needs: the identity and the mirror as watched,
/// the identity's Secret from its own watch. A mirror not seen is read
/// live: a Secret of that name without CAPTF's label is not watched, and
/// must be seen to be left alone. API errors are returned (transient).
pub async fn observe(
    watches: &Watches,
    client: &kube::Client,
    namespace: &str,
    namespace_labels: &BTreeMap<String, String>,
    identity: Option<&str>,
) -> Result<Observed, Error> {
    let Some(name) = identity else {
        return Ok(Observed::default());
    };
    let mut observed = Observed {
        name: Some(name.to_owned()),
        namespace_labels: namespace_labels.clone(),
        ..Default::default()
    };
    let Some(found) = watches.identities.get(&ObjectRef::new(name)) else {
        return Ok(observed);
    };
    if namespace_allowed(
        found.spec.allowed_namespaces.as_ref(),
        namespace,
        &observed.namespace_labels,
    ) {
        let source = &found.spec.secret_ref;
        observed.source = watches
            .identity_sources
            .get(&source.namespace, &source.name)
            .await
            .map_err(Error::Kube)?;
        let mirror = names::credentials_mirror(name);
        observed.mirror = match watches.managed_secrets.get(namespace, &mirror) {
            Some(seen) => Some(Arc::new(seen.to_meta().into_response_partial())),
            None => Api::<Secret>::namespaced(client.clone(), namespace)
                .get_metadata_opt(&mirror)
                .await
                .map_err(Error::Kube)?
                .map(Arc::new),
        };
    }
    observed.identity = Some(found);
    Ok(observed)
}

/// A write of the mirror: a create, a replace guarded by the
/// resourceVersion it was read at, or one more user added to an up to date
/// mirror.
#[derive(Clone, Debug, PartialEq)]
pub enum MirrorWrite {
    Create(Secret),
    Replace(Secret),
    AddUser { name: String, user: OwnerReference },
}

impl MirrorWrite {
    pub fn name(&self) -> String {
        match self {
            MirrorWrite::Create(s) | MirrorWrite::Replace(s) => s.name_any(),
            MirrorWrite::AddUser { name, .. } => name.clone(),
        }
    }
}

/// The outcome of resolving and mirroring an object's credentials.
#[derive(Clone, Debug, PartialEq)]
pub struct Credentials {
    /// The mirror Secret's identity, when the Job may start.
    pub identity: Option<String>,
    pub allowed: Cond,
    /// What the mirror is once `write` (if any) succeeds.
    pub mirrored: Cond,
    pub write: Option<MirrorWrite>,
}

/// A destroy needs the credentials as much as the state: the mirror goes
/// only with its last user's cleanup.
fn protected(mut secret: Secret) -> Secret {
    protection::protect(&mut secret.metadata);
    secret
}

fn pending(message: &str) -> Cond {
    Cond::new(
        CREDENTIALS_MIRRORED,
        Status::Unknown,
        "MirrorPending",
        message,
    )
}

fn refused(reason: &'static str, message: String) -> Credentials {
    Credentials {
        identity: None,
        allowed: Cond::new(IDENTITY_ALLOWED, Status::False, reason, message),
        mirrored: pending("waiting for an allowed identity"),
        write: None,
    }
}

/// Whether the identity allows the namespace, and the mirror write that
/// makes the mirror hold the identity's Secret with `owner` among its
/// users. A Secret of the mirror's name that is not a mirror is never
/// overwritten.
pub fn decide(o: &Observed, namespace: &str, owner: &OwnerReference) -> Credentials {
    let Some(name) = o.name.as_deref() else {
        return refused(
            "IdentityNotFound",
            "no identityRef: set spec.identityRef (or the cluster's)".into(),
        );
    };
    let Some(found) = &o.identity else {
        return refused(
            "IdentityNotFound",
            format!("TerraformClusterIdentity {name} not found"),
        );
    };
    if !namespace_allowed(
        found.spec.allowed_namespaces.as_ref(),
        namespace,
        &o.namespace_labels,
    ) {
        return refused(
            "NamespaceNotAllowed",
            format!("TerraformClusterIdentity {name} does not allow namespace {namespace}"),
        );
    }
    let source_ref = &found.spec.secret_ref;
    let Some(source) = &o.source else {
        return refused(
            "SecretNotFound",
            format!(
                "Secret {}/{} of TerraformClusterIdentity {name} not found",
                source_ref.namespace, source_ref.name
            ),
        );
    };
    let allowed = Cond::new(
        IDENTITY_ALLOWED,
        Status::True,
        "IdentityAllowed",
        format!("TerraformClusterIdentity {name} allows namespace {namespace}"),
    );
    let mirror = names::credentials_mirror(name);
    let data = source.data.clone().unwrap_or_default();
    let hash = source_hash(&data);
    let write = match o.mirror.as_deref() {
        None => Some(MirrorWrite::Create(protected(Secret {
            metadata: ObjectMeta {
                name: Some(mirror.clone()),
                namespace: Some(namespace.to_string()),
                labels: Some(BTreeMap::from([
                    (MANAGED_LABEL.to_string(), "true".to_string()),
                    (MIRRORED_LABEL.to_string(), "true".to_string()),
                ])),
                annotations: Some(BTreeMap::from([
                    (SOURCE_HASH.to_string(), hash),
                    (IDENTITY.to_string(), name.to_string()),
                ])),
                owner_references: Some(vec![owner.clone()]),
                ..Default::default()
            },
            data: Some(data),
            type_: Some("Opaque".into()),
            ..Default::default()
        }))),
        Some(seen) => {
            if seen.labels().get(MIRRORED_LABEL).map(String::as_str) != Some("true") {
                return Credentials {
                    identity: None,
                    allowed,
                    mirrored: Cond::new(
                        CREDENTIALS_MIRRORED,
                        Status::False,
                        "MirrorFailed",
                        format!(
                            "Secret {mirror} exists and is not a CAPTF credentials mirror; it is left alone"
                        ),
                    ),
                    write: None,
                };
            }
            let same_data = seen.annotations().get(SOURCE_HASH) == Some(&hash);
            let owned = seen.owner_references().iter().any(|o| o.uid == owner.uid);
            if same_data && protection::is_protected(seen) {
                // Only this user to add: a patch merged by uid, so the
                // objects of a namespace adding themselves at once never
                // conflict (a replace of the copy they read would, all but
                // one of them).
                (!owned).then(|| MirrorWrite::AddUser {
                    name: mirror.clone(),
                    user: owner.clone(),
                })
            } else {
                // The copy is made only for a write, which the mirror's
                // source changing makes rare.
                let mut secret = Secret {
                    metadata: seen.metadata.clone(),
                    data: Some(data),
                    type_: Some("Opaque".into()),
                    ..Default::default()
                };
                if !owned {
                    secret.owner_references_mut().push(owner.clone());
                }
                secret
                    .annotations_mut()
                    .insert(SOURCE_HASH.to_string(), hash);
                Some(MirrorWrite::Replace(protected(secret)))
            }
        }
    };
    Credentials {
        identity: Some(name.to_string()),
        allowed,
        mirrored: Cond::new(
            CREDENTIALS_MIRRORED,
            Status::True,
            "Mirrored",
            format!("Secret {mirror} holds the credentials"),
        ),
        write,
    }
}

/// The credentials of a destroy in a namespace being deleted, where the
/// identity's Secret may have gone with everything else: the mirror, as
/// last copied, is used (it is protected for exactly this). Any other
/// refusal stands.
pub fn last_copy(o: &Observed, decided: Credentials) -> Credentials {
    let (Some(name), Some(mirror)) = (o.name.as_deref(), o.mirror.as_ref()) else {
        return decided;
    };
    let ours = mirror
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MIRRORED_LABEL))
        .is_some_and(|v| v == "true");
    if decided.identity.is_some() || decided.allowed.reason != "SecretNotFound" || !ours {
        return decided;
    }
    let mirror = names::credentials_mirror(name);
    Credentials {
        identity: Some(name.to_owned()),
        mirrored: Cond::new(
            CREDENTIALS_MIRRORED,
            Status::True,
            "MirrorKept",
            format!(
                "the Secret of TerraformClusterIdentity {name} is gone; the destroy uses Secret {mirror} as last copied"
            ),
        ),
        write: None,
        ..decided
    }
}

/// Performs a mirror write. A conflict (409: another object of the
/// namespace created or changed the mirror first) is the caller's to tell
/// from a failure.
pub async fn write(client: &kube::Client, namespace: &str, w: &MirrorWrite) -> kube::Result<()> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match w {
        MirrorWrite::Create(s) => api.create(&PostParams::default(), s).await.map(drop),
        MirrorWrite::Replace(s) => api
            .replace(&s.name_any(), &PostParams::default(), s)
            .await
            .map(drop),
        // ownerReferences merge by uid in a strategic merge patch. A last
        // user's removal deletes the mirror only at the resourceVersion it
        // wrote, so a user added in between keeps it.
        MirrorWrite::AddUser { name, user } => {
            let patch = serde_json::json!({"metadata": {"ownerReferences": [user]}});
            api.patch(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
                .map(drop)
        }
    }
}

/// Removes the object `uid` from the users of every credentials mirror of
/// the namespace (ref §8.6 cleanup), and deletes a mirror it was the last
/// user of; returns the names of the deleted ones. Writes are guarded by
/// the resourceVersion read, and a conflict reads again.
pub async fn drop_user(
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
                // The last user: the protection goes in the same guarded
                // write, then the mirror, only as it was just written.
                secret
                    .metadata
                    .finalizers
                    .get_or_insert_default()
                    .retain(|f| f != PROTECTION);
                match api.replace(&name, &PostParams::default(), &secret).await {
                    Ok(written) => {
                        let precondition = kube::api::Preconditions {
                            resource_version: written.metadata.resource_version.clone(),
                            uid: None,
                        };
                        let params = DeleteParams {
                            preconditions: Some(precondition),
                            ..Default::default()
                        };
                        api.delete(&name, &params)
                            .await
                            .map(|_| removed.push(name.clone()))
                    }
                    Err(e) => Err(e),
                }
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
mod tests;
