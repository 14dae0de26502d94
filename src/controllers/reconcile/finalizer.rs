//! The object's finalizer: added guarded by the resourceVersion read,
//! removed only at the index it was read at; and the last cleanup step
//! around the removal (its events, the object's series, the namespace
//! sweep). Besides the finalizer, a delete that spares a same-named
//! successor.

use json_patch::jsonptr::PointerBuf;
use json_patch::{PatchOperation, RemoveOperation, TestOperation};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::json;
use tracing::info;

use super::Object;
use super::plan::Note;
use super::record::record;
use crate::controllers::deletion::Why;
use crate::controllers::workload::Workload;
use crate::controllers::{Context, Error};
use crate::keys::finalizer;
use crate::protection;

/// The last cleanup step: the finalizer, the object's series, and the
/// namespace sweep.
pub(super) async fn release_finalizer<K: Workload>(
    ctx: &Context,
    obj: &K,
    o: &Object,
    why: Why,
) -> Result<(), Error> {
    let note = match why {
        Why::Destroyed => Some(Note::normal(
            "Destroyed",
            "the destroy succeeded and cleanup ran",
        )
        .once()),
        Why::Abandoned => Some(Note::warning(
            "InfrastructureAbandoned",
            format!(
                "{} names this object: cleaned up without a destroy; its infrastructure is left as it is",
                crate::keys::ABANDON
            ),
        )
        .once()),
        Why::NeverApplied => None,
    };
    // Only the pass that removed the finalizer tells of it: a pass that
    // started from a cache still showing the finalizer finds the object
    // gone and says nothing, so each event happens once.
    let removed = remove_finalizer(ctx, obj, o).await?;
    ctx.metrics.forget(K::KIND, &o.namespace, &o.name);
    if !removed {
        return Ok(());
    }
    if let Some(note) = note {
        record(ctx, obj, o, &note).await;
    }
    record(
        ctx,
        obj,
        o,
        &Note::normal(
            "FinalizerRemoved",
            format!("finalizer {} removed", finalizer(K::KIND)),
        )
        .once(),
    )
    .await;
    info!(namespace = %o.namespace, name = %o.name, "deleted ({})", match why {
        Why::Destroyed => "destroyed",
        Why::NeverApplied => "never applied",
        Why::Abandoned => "abandoned",
    });
    // The namespace may be empty now. The manager stopping is the only
    // way the ask is lost, and the periodic sweep covers that.
    let _ = ctx.sweeps.send(o.namespace.clone());
    Ok(())
}

/// Deletes `name` if present, its protection first; with `uid`, only that
/// very object (a same-named one created since is not ours).
pub(super) async fn delete_if_present<R>(
    api: &Api<R>,
    name: &str,
    uid: Option<String>,
) -> Result<(), Error>
where
    R: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match protection::unprotect_and_delete(api, name, &params).await {
        Ok(()) => Ok(()),
        // The precondition failed: not ours.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Adds the finalizer, guarded by the resourceVersion read.
pub async fn add_finalizer<K: Workload>(ctx: &Context, obj: &K, o: &Object) -> Result<(), Error> {
    let mut finalizers = obj.meta().finalizers.clone().unwrap_or_default();
    finalizers.push(finalizer(K::KIND).to_string());
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.meta().resource_version}});
    Api::<K>::namespaced(ctx.client.clone(), &o.namespace)
        .patch(&o.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::Kube)?;
    Ok(())
}

/// Removes the finalizer at the index it was read at, tested first, so
/// that a list changed meanwhile fails the write instead of removing
/// another controller's entry.
/// Whether this call removed it (false: already gone, or the object is).
async fn remove_finalizer<K: Workload>(ctx: &Context, obj: &K, o: &Object) -> Result<bool, Error> {
    let ours = finalizer(K::KIND);
    let Some(index) = obj.finalizers().iter().position(|f| f == ours) else {
        return Ok(false);
    };
    let index = index.to_string();
    let path = || PointerBuf::from_tokens(["metadata", "finalizers", index.as_str()]);
    let patch = json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: path(),
            value: json!(ours),
        }),
        PatchOperation::Remove(RemoveOperation { path: path() }),
    ]);
    match Api::<K>::namespaced(ctx.client.clone(), &o.namespace)
        .patch(&o.name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(Error::Kube(e)),
    }
}
