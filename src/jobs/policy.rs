//! The effective Job policy (ref §1.2): the object's `spec.jobs` over its
//! cluster's `spec.defaults.jobs` over the built-in defaults. Pure.
//!
//! Between the object and its cluster's defaults, `resources` and the two
//! security contexts are taken whole; the context taken is then merged field
//! by field over the built-in hardened one, so that no user value drops a
//! default it does not set.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Capabilities, EnvVar, LocalObjectReference, PodSecurityContext, ResourceRequirements,
    SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::JobPolicy;
use crate::names::RUNNER_RBAC;
use crate::webhooks::rules::{DEFAULT_ACTIVE_DEADLINE_SECONDS, DEFAULT_LOCK_TIMEOUT_SECONDS};

pub const DEFAULT_SUCCESSFUL_JOBS_HISTORY_LIMIT: i32 = 3;
pub const DEFAULT_FAILED_JOBS_HISTORY_LIMIT: i32 = 3;
/// The group of the pod, so that a non-root image user reads the Secret
/// volumes (mode 0440) through it.
pub const RUNNER_GROUP: i64 = 65532;

/// A Job policy with every field resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSettings {
    pub successful_jobs_history_limit: i32,
    pub failed_jobs_history_limit: i32,
    pub active_deadline_seconds: i64,
    pub lock_timeout_seconds: i64,
    pub service_account_name: String,
    pub image_pull_secrets: Vec<LocalObjectReference>,
    pub resources: ResourceRequirements,
    /// Without the names that begin with `TF_` or `KUBE_`.
    pub env: Vec<EnvVar>,
    pub security_context: SecurityContext,
    pub pod_security_context: PodSecurityContext,
}

/// The effective policy of an object whose own policy is `own`, under its
/// cluster's `spec.defaults.jobs` (`None` for a TerraformCluster, which never
/// applies its own defaults to itself).
pub fn resolve(own: Option<&JobPolicy>, cluster_defaults: Option<&JobPolicy>) -> JobSettings {
    // The first policy that sets the field, object before defaults.
    fn pick<T>(
        own: Option<&JobPolicy>,
        defaults: Option<&JobPolicy>,
        field: impl Fn(&JobPolicy) -> Option<T>,
    ) -> Option<T> {
        own.and_then(&field).or_else(|| defaults.and_then(&field))
    }
    let (o, d) = (own, cluster_defaults);
    JobSettings {
        successful_jobs_history_limit: pick(o, d, |p| p.successful_jobs_history_limit)
            .unwrap_or(DEFAULT_SUCCESSFUL_JOBS_HISTORY_LIMIT),
        failed_jobs_history_limit: pick(o, d, |p| p.failed_jobs_history_limit)
            .unwrap_or(DEFAULT_FAILED_JOBS_HISTORY_LIMIT),
        // 0 means unset (ref §1.2), so it falls through to the next level.
        active_deadline_seconds: pick(o, d, |p| p.active_deadline_seconds.filter(|s| *s != 0))
            .unwrap_or(DEFAULT_ACTIVE_DEADLINE_SECONDS),
        lock_timeout_seconds: pick(o, d, |p| p.lock_timeout_seconds)
            .unwrap_or(DEFAULT_LOCK_TIMEOUT_SECONDS),
        service_account_name: pick(o, d, |p| p.service_account_name.clone())
            .unwrap_or_else(|| RUNNER_RBAC.to_owned()),
        image_pull_secrets: image_pull_secrets(o, d),
        resources: pick(o, d, |p| p.resources.clone()).unwrap_or_else(default_resources),
        env: merged_env(o, d)
            .into_iter()
            .filter(|var| !is_reserved_env(&var.name))
            .collect(),
        security_context: over_default_security_context(
            pick(o, d, |p| p.security_context.as_deref().cloned()).unwrap_or_default(),
        ),
        pod_security_context: over_default_pod_security_context(
            pick(o, d, |p| p.pod_security_context.as_deref().cloned()).unwrap_or_default(),
        ),
    }
}

/// `user` over [`default_security_context`], field by field: a user who sets
/// only `runAsUser` keeps the read-only root filesystem, the dropped
/// capabilities and the seccomp profile. `capabilities` is one field, so a
/// user value replaces the default drop-ALL whole (ref §1.2).
fn over_default_security_context(user: SecurityContext) -> SecurityContext {
    let default = default_security_context();
    SecurityContext {
        allow_privilege_escalation: user
            .allow_privilege_escalation
            .or(default.allow_privilege_escalation),
        capabilities: user.capabilities.or(default.capabilities),
        read_only_root_filesystem: user
            .read_only_root_filesystem
            .or(default.read_only_root_filesystem),
        seccomp_profile: user.seccomp_profile.or(default.seccomp_profile),
        ..user
    }
}

/// `user` over [`default_pod_security_context`], field by field: without
/// fsGroup a non-root user could not read the 0440 Secret volumes.
fn over_default_pod_security_context(user: PodSecurityContext) -> PodSecurityContext {
    let default = default_pod_security_context();
    PodSecurityContext {
        fs_group: user.fs_group.or(default.fs_group),
        seccomp_profile: user.seccomp_profile.or(default.seccomp_profile),
        ..user
    }
}

/// The names of the merged env entries that the Job never receives, in
/// order: those beginning with `TF_` or `KUBE_`.
pub fn dropped_env_names(
    own: Option<&JobPolicy>,
    cluster_defaults: Option<&JobPolicy>,
) -> Vec<String> {
    merged_env(own, cluster_defaults)
        .into_iter()
        .filter(|var| is_reserved_env(&var.name))
        .map(|var| var.name)
        .collect()
}

/// Names the Job sets itself or the runner controls.
fn is_reserved_env(name: &str) -> bool {
    name.starts_with("TF_") || name.starts_with("KUBE_")
}

/// The object's entries, then the defaults' entries whose names it does not
/// use.
fn merged_env(own: Option<&JobPolicy>, defaults: Option<&JobPolicy>) -> Vec<EnvVar> {
    let own = own.and_then(|p| p.env.as_deref()).unwrap_or_default();
    let defaults = defaults.and_then(|p| p.env.as_deref()).unwrap_or_default();
    let used: BTreeSet<&str> = own.iter().map(|var| var.name.as_str()).collect();
    own.iter()
        .chain(
            defaults
                .iter()
                .filter(|var| !used.contains(var.name.as_str())),
        )
        .cloned()
        .collect()
}

/// The union of both lists by name, the object's first.
fn image_pull_secrets(
    own: Option<&JobPolicy>,
    defaults: Option<&JobPolicy>,
) -> Vec<LocalObjectReference> {
    let mut seen = BTreeSet::new();
    [own, defaults]
        .into_iter()
        .flatten()
        .flat_map(|p| p.image_pull_secrets.as_deref().unwrap_or_default())
        .filter(|secret| seen.insert(secret.name.clone()))
        .cloned()
        .collect()
}

pub(super) fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        ..Default::default()
    }
}

pub(super) fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect()
}

/// Requests of cpu 250m and memory 512Mi, a memory limit of 2Gi and no CPU
/// limit, so a Job is never throttled.
pub fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(quantities(&[("cpu", "250m"), ("memory", "512Mi")])),
        limits: Some(quantities(&[("memory", "2Gi")])),
        ..Default::default()
    }
}

/// seccomp RuntimeDefault, all capabilities dropped, no privilege escalation,
/// a read-only root filesystem. runAsNonRoot is not defaulted: the image
/// decides its user.
pub fn default_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Default::default()
        }),
        read_only_root_filesystem: Some(true),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

/// seccomp RuntimeDefault and fsGroup 65532.
pub fn default_pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        fs_group: Some(RUNNER_GROUP),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
