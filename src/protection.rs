//! The protection finalizer ([`PROTECTION`]) on the Secrets and Leases a
//! destroy or a restore needs, so that deleting a namespace cannot take an
//! object's state, backups, durable inputs or credentials before CAPTF has
//! done its part. [`protect`] marks an object about to be written;
//! [`protect_existing`] and [`unprotect`] change one in place, reading it
//! first so that the patch names the finalizer at the index it was read at.

use json_patch::jsonptr::PointerBuf;
use json_patch::{PatchOperation, RemoveOperation, TestOperation};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, Preconditions};
use kube::core::NamespaceResourceScope;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::keys::{PROTECTED_LABEL, PROTECTION};

/// Adds the finalizer and its label to an object about to be created or
/// replaced.
pub fn protect(meta: &mut ObjectMeta) {
    let finalizers = meta.finalizers.get_or_insert_default();
    if !finalizers.iter().any(|f| f == PROTECTION) {
        finalizers.push(PROTECTION.to_owned());
    }
    meta.labels
        .get_or_insert_default()
        .insert(PROTECTED_LABEL.to_owned(), "true".to_owned());
}

/// Whether `obj` carries the finalizer.
pub fn is_protected(obj: &impl Resource) -> bool {
    obj.finalizers().iter().any(|f| f == PROTECTION)
}

fn index_path(index: usize) -> PointerBuf {
    PointerBuf::from_tokens([
        "metadata".to_owned(),
        "finalizers".to_owned(),
        index.to_string(),
    ])
}

/// Adds the finalizer and label to the existing object `name`; nothing
/// when it is gone or protected already. `seen`: the object as a watch
/// last showed it, taken as read; when the patch finds it changed or gone
/// since, it is read live.
pub async fn protect_existing<K>(
    api: &Api<K>,
    name: &str,
    seen: Option<&K>,
) -> Result<(), kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
{
    if let Some(seen) = seen {
        match protect_as_read(api, name, seen).await {
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
            done => return done,
        }
    }
    let Some(obj) = api.get_opt(name).await? else {
        return Ok(());
    };
    protect_as_read(api, name, &obj).await
}

async fn protect_as_read<K>(api: &Api<K>, name: &str, obj: &K) -> Result<(), kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
{
    if is_protected(obj) {
        return Ok(());
    }
    // Guarded by the resourceVersion read: a list changed meanwhile fails
    // the write instead of losing another controller's finalizer.
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(PROTECTION.to_owned());
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "labels": {PROTECTED_LABEL: "true"},
        "resourceVersion": obj.resource_version(),
    }});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Removes the finalizer from `name`, tested at the index it was read at;
/// nothing when it is gone or not protected.
pub async fn unprotect<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(obj) = api.get_opt(name).await? else {
        return Ok(());
    };
    let Some(index) = obj.finalizers().iter().position(|f| f == PROTECTION) else {
        return Ok(());
    };
    let patch = json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: index_path(index),
            value: json!(PROTECTION),
        }),
        PatchOperation::Remove(RemoveOperation {
            path: index_path(index),
        }),
    ]);
    match api
        .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Unprotects and deletes `name` (with `params`' preconditions); one already
/// gone is fine.
pub async fn unprotect_and_delete<K>(
    api: &Api<K>,
    name: &str,
    params: &DeleteParams,
) -> Result<(), kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
{
    unprotect(api, name).await?;
    match api.delete(name, params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// An object as it was read: deleted only if it is still that object,
/// unchanged since.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsRead {
    pub name: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

impl AsRead {
    pub fn of(meta: &ObjectMeta) -> Option<AsRead> {
        Some(AsRead {
            name: meta.name.clone()?,
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
        })
    }
}

/// Deletes `read` if it is unchanged since it was read, then unprotects it:
/// the delete goes first, so that the precondition is checked against the
/// version read (unprotecting changes it). One gone already is fine; one
/// changed since fails with the API server's 409 Conflict, so the caller
/// reads it again before deciding anything.
pub async fn delete_as_read<K>(api: &Api<K>, read: &AsRead) -> Result<(), kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: read.uid.clone(),
            resource_version: read.resource_version.clone(),
        }),
        ..Default::default()
    };
    match api.delete(&read.name, &params).await {
        Ok(_) => unprotect(api, &read.name).await,
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protect_adds_the_finalizer_and_label_once() {
        let mut meta = ObjectMeta {
            finalizers: Some(vec!["other".into()]),
            ..Default::default()
        };
        protect(&mut meta);
        protect(&mut meta);
        assert_eq!(
            meta.finalizers.as_deref(),
            Some(&["other".to_owned(), PROTECTION.to_owned()][..])
        );
        assert_eq!(meta.labels.unwrap()[PROTECTED_LABEL], "true");
    }
}
