//! The object's resourceVersion through a pass. The pass reads the object
//! from a cache that may be behind (another manager's write, or this one's
//! own not yet seen); the status write carries the version the pass read,
//! moved on by the pass's own writes to the object, so that a pass decided
//! on an old object fails with a conflict and is run again on the new one,
//! instead of writing its status over a newer one (a settled Job's result
//! would be lost: the Job is marked bookkept already).

use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;

use super::Object;
use crate::controllers::workload::Workload;
use crate::controllers::{Context, Error};

/// The version of the object this pass's writes build on.
pub struct Version(Option<String>);

impl Version {
    pub fn read<K: Workload>(obj: &K) -> Version {
        Version(obj.meta().resource_version.clone())
    }

    pub fn get(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// A merge patch of the object, only onto the version this pass builds
    /// on: an unguarded one would move the version past another's write
    /// the pass never saw.
    pub async fn patch<K: Workload>(
        &mut self,
        ctx: &Context,
        o: &Object,
        mut patch: Value,
    ) -> Result<(), Error> {
        patch["metadata"]["resourceVersion"] = self.0.clone().into();
        let written = Api::<K>::namespaced(ctx.client.clone(), &o.namespace)
            .patch(&o.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(stale)?;
        self.0 = written.meta().resource_version.clone();
        Ok(())
    }
}

/// A write that found the object changed since the pass read it.
pub(super) fn stale(e: kube::Error) -> Error {
    match e {
        kube::Error::Api(ref r) if r.code == 409 => Error::Stale,
        e => Error::Kube(e),
    }
}
