//! The validating webhook's decision for one AdmissionReview, without I/O:
//! the rules of CONTRACT.md "Webhooks" applied to the typed objects, each
//! decoded once, during the parse of the body or from its text
//! ([`super::objects`]).
//!
//! The rules that need the API server (an identity's SubjectAccessReview,
//! refusing to delete an identity in use or a machine whose Machine lives)
//! are gathered by the handler: [`validate`] names the [`Lookup`] it needs,
//! with the typed object it is about.

use std::borrow::Cow;

use super::decode::Field;
use super::objects::{Object, Reviewed, read};
use super::rules::{self, Violation};
use crate::api::{
    JobPolicy, SecretReference, TerraformCluster, TerraformClusterIdentity,
    TerraformClusterTemplate, TerraformMachine, TerraformMachinePool, TerraformMachinePoolTemplate,
    TerraformMachineTemplate, WorkspaceSpec,
};
use crate::image_ref::ImageRef;
use crate::keys::RESTORE_STATE;
use crate::names::Kind;

/// What the request does to the object (the AdmissionReview's operation;
/// not a Job's [`crate::names::Op`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Create,
    Update,
    Delete,
}

/// What the rules see of an AdmissionReview.
#[derive(Clone, Copy, Debug)]
pub struct Review<'a> {
    pub verb: Verb,
    pub kind: &'a str,
    pub object: Option<&'a Object<'a>>,
    pub old_object: Option<&'a Object<'a>>,
    pub dry_run: bool,
}

/// The answer: refused when any violation exists; warnings either way.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    pub warnings: Vec<String>,
}

impl Verdict {
    fn refuse(&mut self, violation: Option<Violation>) {
        self.violations.extend(violation);
    }
}

/// A check against the API server that the request still needs once the
/// verdict has no violation, with the decoded object it is about.
#[derive(Debug)]
pub enum Lookup {
    /// Rule 12: the requesting user may get the Secret a new or changed
    /// identity names.
    SecretReadable(SecretReference),
    /// Rule 12: the identity being deleted is not in use.
    IdentityUnused(Box<TerraformClusterIdentity>),
    /// Rule 10: the machine being deleted has no live Machine owner.
    MachineDeletable(Box<TerraformMachine>),
}

/// Applies every rule that needs nothing but the review itself, and names
/// the lookup that remains.
pub fn validate(review: &Review<'_>) -> (Verdict, Option<Lookup>) {
    let mut verdict = Verdict::default();
    match rules_of(review, &mut verdict) {
        Ok(lookup) => (verdict, lookup),
        Err(violation) => {
            verdict.violations.push(violation);
            (verdict, None)
        }
    }
}

fn rules_of(review: &Review<'_>, v: &mut Verdict) -> Result<Option<Lookup>, Violation> {
    match (review.verb, review.kind) {
        // Deletion rules need the API server: the handler looks them up.
        (Verb::Delete, "TerraformClusterIdentity") => {
            Ok(Some(Lookup::IdentityUnused(Box::new(deleted(review)?))))
        }
        (Verb::Delete, "TerraformMachine") => {
            Ok(Some(Lookup::MachineDeletable(Box::new(deleted(review)?))))
        }
        (Verb::Delete, _) => Ok(None),
        (_, "TerraformCluster") => typed(review, v, cluster),
        (_, "TerraformMachine") => typed(review, v, machine),
        (_, "TerraformMachinePool") => typed(review, v, machine_pool),
        (_, "TerraformClusterTemplate") => typed(review, v, cluster_template),
        (_, "TerraformMachineTemplate") => typed(review, v, machine_template),
        (_, "TerraformMachinePoolTemplate") => typed(review, v, machine_pool_template),
        (_, "TerraformClusterIdentity") => {
            let (new, old) = objects::<TerraformClusterIdentity>(review)?;
            identity(&new, v);
            // On create, and when spec.secretRef changes.
            let changed = old.is_none_or(|old| old.spec.secret_ref != new.spec.secret_ref);
            Ok(changed.then(|| Lookup::SecretReadable(new.spec.secret_ref.clone())))
        }
        (_, other) => Err(Violation::invalid(
            "kind",
            "is not a kind this webhook serves",
            Some(rules::echo(other)),
        )),
    }
}

type Rule<T> = fn(&T, Option<&T>, &Review<'_>, &mut Verdict);

/// Reads the new and old objects, then applies `rule`.
fn typed<T: Reviewed>(
    review: &Review<'_>,
    verdict: &mut Verdict,
    rule: Rule<T>,
) -> Result<Option<Lookup>, Violation> {
    let (object, old) = objects::<T>(review)?;
    rule(&object, old.as_deref(), review, verdict);
    Ok(None)
}

/// The new and old objects, each as defaulting leaves it. Read so, an object
/// stored without a default (created while the webhooks were not registered)
/// is not changed by the default the mutating webhook adds on its next
/// update, the manager's finalizer patch included.
fn objects<'a, T: Reviewed>(
    review: &Review<'a>,
) -> Result<(Cow<'a, T>, Option<Cow<'a, T>>), Violation> {
    let decode = |field, sent| {
        read::<T>(field, sent).map(|read| read.object).map_err(|e| {
            e.into_violation(|e| format!("does not match the {} schema: {e}", review.kind))
        })
    };
    let object = review
        .object
        .map(|raw| decode(Field::Object, raw))
        .transpose()?
        .ok_or_else(|| Violation::invalid("object", "is missing from the request", None))?;
    let old = review
        .old_object
        .map(|raw| decode(Field::OldObject, raw))
        .transpose()?;
    Ok((object, old))
}

/// The object a DELETE removes. Defaulting, which reads it too, changes only
/// `spec`; the deletion rules read its metadata and status.
fn deleted<T: Reviewed>(review: &Review<'_>) -> Result<T, Violation> {
    let sent = review
        .old_object
        .ok_or_else(|| Violation::invalid("oldObject", "is missing from the request", None))?;
    read::<T>(Field::OldObject, sent)
        .map(|read| read.object.into_owned())
        .map_err(|e| e.into_violation(|e| e.to_string()))
}

fn cluster(
    new: &TerraformCluster,
    old: Option<&TerraformCluster>,
    review: &Review<'_>,
    v: &mut Verdict,
) {
    workspace(
        "spec",
        &new.spec.workspace,
        old.map(|o| &o.spec.workspace),
        Kind::Cluster,
        v,
    );
    if let Some(jobs) = new.spec.defaults.as_ref().and_then(|d| d.jobs.as_ref()) {
        let old_jobs = old.and_then(|o| o.spec.defaults.as_ref()?.jobs.as_ref());
        job_policy("spec.defaults.jobs", jobs, old_jobs, v);
    }
    if new.spec.workspace.identity_ref.is_none() {
        v.refuse(Some(Violation::invalid(
            "spec.identityRef",
            "is required: a cluster's Jobs run with the credentials of a TerraformClusterIdentity",
            None,
        )));
    }
    if let Some(old) = old {
        let old_endpoint = old.spec.control_plane_endpoint.as_ref();
        if old_endpoint
            .and_then(|e| e.host.as_deref())
            .is_some_and(|h| !h.is_empty())
            && new.spec.control_plane_endpoint.as_ref() != old_endpoint
        {
            let shown = |e: Option<&crate::api::ApiEndpoint>| {
                e.map_or("unset".to_string(), |e| {
                    format!(
                        "{}:{}",
                        e.host.as_deref().unwrap_or(""),
                        e.port.unwrap_or(0)
                    )
                })
            };
            v.refuse(Some(Violation::invalid(
                "spec.controlPlaneEndpoint",
                format!(
                    "is immutable once its host is set (was {})",
                    shown(old_endpoint)
                ),
                Some(shown(new.spec.control_plane_endpoint.as_ref())),
            )));
        }
    }
    restore_state(
        new.metadata.annotations.as_ref(),
        old.map(|o| {
            (
                o.metadata.annotations.as_ref(),
                backups(o.status.as_ref().map(|s| &s.workspace)),
            )
        }),
        deleting(&new.metadata, old.map(|o| &o.metadata)),
        review,
        v,
    );
}

fn machine(
    new: &TerraformMachine,
    old: Option<&TerraformMachine>,
    review: &Review<'_>,
    v: &mut Verdict,
) {
    workspace(
        "spec",
        &new.spec.workspace,
        old.map(|o| &o.spec.workspace),
        Kind::Machine,
        v,
    );
    if let Some(old) = old {
        let (n, o) = (&new.spec.workspace, &old.spec.workspace);
        const RULE: &str =
            "is immutable: a machine is re-created, never re-applied with other inputs";
        v.refuse(rules::immutable("spec.source", &o.source, &n.source, RULE));
        v.refuse(rules::immutable(
            "spec.identityRef",
            &o.identity_ref,
            &n.identity_ref,
            RULE,
        ));
        v.refuse(rules::immutable(
            "spec.variables",
            &o.variables,
            &n.variables,
            RULE,
        ));
        v.refuse(rules::immutable(
            "spec.variablesFrom",
            &o.variables_from,
            &n.variables_from,
            RULE,
        ));
        v.refuse(rules::set_once(
            "spec.providerID",
            old.spec.provider_id.as_deref(),
            new.spec.provider_id.as_deref(),
        ));
    }
    restore_state(
        new.metadata.annotations.as_ref(),
        old.map(|o| {
            (
                o.metadata.annotations.as_ref(),
                backups(o.status.as_ref().map(|s| &s.workspace)),
            )
        }),
        deleting(&new.metadata, old.map(|o| &o.metadata)),
        review,
        v,
    );
}

fn machine_pool(
    new: &TerraformMachinePool,
    old: Option<&TerraformMachinePool>,
    review: &Review<'_>,
    v: &mut Verdict,
) {
    workspace(
        "spec",
        &new.spec.workspace,
        old.map(|o| &o.spec.workspace),
        Kind::MachinePool,
        v,
    );
    restore_state(
        new.metadata.annotations.as_ref(),
        old.map(|o| {
            (
                o.metadata.annotations.as_ref(),
                backups(o.status.as_ref().map(|s| &s.workspace)),
            )
        }),
        deleting(&new.metadata, old.map(|o| &o.metadata)),
        review,
        v,
    );
}

const TEMPLATE_SPEC: &str = "spec.template.spec";
const TEMPLATE_RULE: &str = "is immutable after creation: create a new template and point the ClusterClass or MachineDeployment at it";

fn template_immutable<T: PartialEq>(
    old: Option<&T>,
    new: &T,
    review: &Review<'_>,
    v: &mut Verdict,
) {
    // The ClusterClass controller checks a changed template with a
    // server-side dry run; that must pass for it to report the change.
    if let Some(old) = old
        && !review.dry_run
    {
        v.refuse(rules::immutable(TEMPLATE_SPEC, old, new, TEMPLATE_RULE));
    }
}

fn cluster_template(
    new: &TerraformClusterTemplate,
    old: Option<&TerraformClusterTemplate>,
    review: &Review<'_>,
    v: &mut Verdict,
) {
    let spec = &new.spec.template.spec;
    let old_spec = old.map(|o| &o.spec.template.spec);
    workspace(
        TEMPLATE_SPEC,
        &spec.workspace,
        old_spec.map(|s| &s.workspace),
        Kind::Cluster,
        v,
    );
    if let Some(jobs) = spec.defaults.as_ref().and_then(|d| d.jobs.as_ref()) {
        let old_jobs = old_spec.and_then(|s| s.defaults.as_ref()?.jobs.as_ref());
        job_policy("spec.template.spec.defaults.jobs", jobs, old_jobs, v);
    }
    template_immutable(old.map(|o| &o.spec.template.spec), spec, review, v);
}

fn machine_template(
    new: &TerraformMachineTemplate,
    old: Option<&TerraformMachineTemplate>,
    review: &Review<'_>,
    v: &mut Verdict,
) {
    let spec = &new.spec.template.spec;
    let old_spec = old.map(|o| &o.spec.template.spec.workspace);
    workspace(TEMPLATE_SPEC, &spec.workspace, old_spec, Kind::Machine, v);
    template_immutable(old.map(|o| &o.spec.template.spec), spec, review, v);
}

fn machine_pool_template(
    new: &TerraformMachinePoolTemplate,
    old: Option<&TerraformMachinePoolTemplate>,
    review: &Review<'_>,
    v: &mut Verdict,
) {
    let spec = &new.spec.template.spec;
    let old_spec = old.map(|o| &o.spec.template.spec.workspace);
    workspace(
        TEMPLATE_SPEC,
        &spec.workspace,
        old_spec,
        Kind::MachinePool,
        v,
    );
    template_immutable(old.map(|o| &o.spec.template.spec), spec, review, v);
}

fn identity(new: &TerraformClusterIdentity, v: &mut Verdict) {
    if let Some(allowed) = &new.spec.allowed_namespaces {
        v.refuse(rules::allowed_namespaces_not_empty(
            "spec.allowedNamespaces",
            allowed.list.is_some(),
            allowed.selector.is_some(),
        ));
    }
}

/// The rules for the fields every workload kind shares, under `path`; `old`
/// is the same spec before an UPDATE.
fn workspace(
    path: &str,
    spec: &WorkspaceSpec,
    old: Option<&WorkspaceSpec>,
    role: Kind,
    v: &mut Verdict,
) {
    if let Err(e) = ImageRef::parse(&spec.source.image) {
        v.refuse(Some(Violation::invalid(
            format!("{path}.source.image"),
            format!("must be an OCI image reference: it {e}"),
            Some(rules::echo(&spec.source.image)),
        )));
    }
    if let Some(jobs) = &spec.jobs {
        let old_jobs = old.and_then(|o| o.jobs.as_ref());
        job_policy(&format!("{path}.jobs"), jobs, old_jobs, v);
    }
    if let Some(variables) = &spec.variables {
        v.violations.extend(rules::variables(
            &format!("{path}.variables"),
            variables,
            role,
        ));
    }
    for (i, source) in spec.variables_from.iter().flatten().enumerate() {
        v.refuse(rules::variables_source_exactly_one(
            &format!("{path}.variablesFrom[{i}]"),
            source.config_map_ref.is_some(),
            source.secret_ref.is_some(),
        ));
    }
}

/// `old` is the policy at the same path before an UPDATE.
fn job_policy(path: &str, jobs: &JobPolicy, old: Option<&JobPolicy>, v: &mut Verdict) {
    v.refuse(rules::lock_timeout_below_deadline(
        path,
        jobs.lock_timeout_seconds,
        jobs.active_deadline_seconds,
    ));
    let container = format!("{path}.securityContext");
    if let Some(context) = &jobs.security_context {
        v.violations
            .extend(rules::security_context_hardened(&container, context));
    }
    let pod = format!("{path}.podSecurityContext");
    let strict = |policy: &JobPolicy| -> Vec<Violation> {
        let of_container = policy
            .security_context
            .iter()
            .flat_map(|c| rules::security_context_strict(&container, c));
        let of_pod = policy
            .pod_security_context
            .iter()
            .flat_map(|c| rules::pod_security_context_strict(&pod, c));
        of_container.chain(of_pod).collect()
    };
    // The stricter rules came after objects were admitted without them. A
    // value such an object already holds is not judged again on UPDATE, or
    // no update could pass until it changed (the manager's finalizer patch
    // included, and any update of a template, whose spec cannot change);
    // a value that is new or changed is.
    let stored = old.map(strict).unwrap_or_default();
    v.violations.extend(
        strict(jobs)
            .into_iter()
            .filter(|violation| !stored.contains(violation)),
    );
    if let Some(env) = &jobs.env {
        v.warnings
            .extend(rules::dropped_env_warnings(&format!("{path}.env"), env));
    }
}

type Annotations = std::collections::BTreeMap<String, String>;

fn backups(status: Option<&crate::api::WorkspaceStatus>) -> Vec<u64> {
    status
        .and_then(|s| s.state_backups.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|b| u64::try_from(b.serial).ok())
        .collect()
}

fn deleting(new: &kube::api::ObjectMeta, old: Option<&kube::api::ObjectMeta>) -> bool {
    new.deletion_timestamp.is_some() || old.is_some_and(|o| o.deletion_timestamp.is_some())
}

/// `old` is the previous annotations and the listed backup serials (UPDATE).
fn restore_state(
    new: Option<&Annotations>,
    old: Option<(Option<&Annotations>, Vec<u64>)>,
    deleting: bool,
    review: &Review<'_>,
    v: &mut Verdict,
) {
    let value = new.and_then(|a| a.get(RESTORE_STATE)).map(String::as_str);
    let (old_value, serials) = match (review.verb, old) {
        (Verb::Update, Some((annotations, serials))) => (
            Some(
                annotations
                    .and_then(|a| a.get(RESTORE_STATE))
                    .map(String::as_str),
            ),
            serials,
        ),
        _ => (None, Vec::new()),
    };
    v.refuse(rules::restore_state(value, old_value, &serials, deleting));
}

#[cfg(test)]
mod tests;
