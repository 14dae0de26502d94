//! A destroy run from the manager's namespace, for an object whose own
//! namespace is being deleted: nothing can be created there any more (no
//! Job, no Secret, no Lease), but what CAPTF protected is still there and
//! can be updated. The Job, its per-run Secret, a copy of the object's
//! credentials mirror, the run lease and the cluster write lease go to the
//! manager's namespace; the runner acts as a ServiceAccount made there for
//! that one namespace, bound by the namespace's own protected RoleBinding
//! `captf-runner` to the same ClusterRole, so its rights are the same:
//! the object's namespace only.
//!
//! [`check`] and [`relocate`] are pure; [`ensure_rbac`] and
//! [`write_credentials`] do the I/O of a start.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ObjectMeta, PostParams};

use super::builder::{self, JobNotCreated};
use super::lost_race;
use super::rbac;
use crate::error::{Categorized, Category, kube_category};
use crate::keys::{MANAGED_LABEL, OWNER_NAMESPACE_LABEL, OWNER_UID_LABEL};
use crate::names::{self, RUNNER_RBAC};

/// What decides whether a destroy can run from the manager's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// The manager's namespace, when known.
    pub manager_namespace: Option<String>,
    pub namespace: String,
    /// The RoleBinding `captf-runner` of the object's namespace.
    pub binding: Binding,
    /// The object's Jobs run as this account (`captf-runner` unless
    /// `jobs.serviceAccountName` overrides it).
    pub service_account: String,
    /// The Job pulls its image with these Secrets of the object's
    /// namespace.
    pub image_pull_secrets: bool,
    /// The object runs with an identity, and its credentials mirror is
    /// still there to be copied.
    pub identity: Option<bool>,
}

/// The RoleBinding `captf-runner` of a namespace, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    Missing,
    /// Another roleRef than the ClusterRole `captf-runner`.
    Foreign,
    Ours,
}

impl Binding {
    pub fn of(found: Option<&RoleBinding>) -> Binding {
        match found {
            None => Binding::Missing,
            Some(b) if b.role_ref.kind == "ClusterRole" && b.role_ref.name == RUNNER_RBAC => {
                Binding::Ours
            }
            Some(_) => Binding::Foreign,
        }
    }
}

/// Why a destroy cannot run from the manager's namespace: the deletion is
/// then held.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the manager's namespace is not known")]
    NoManagerNamespace,
    #[error("it is the manager's own namespace")]
    ManagerNamespace,
    #[error("its RoleBinding {RUNNER_RBAC} is gone, and none can be created in it")]
    NoRoleBinding,
    #[error("its RoleBinding {RUNNER_RBAC} binds another role than ClusterRole {RUNNER_RBAC}")]
    ForeignRoleBinding,
    #[error(
        "the object's Jobs run as ServiceAccount {0} (jobs.serviceAccountName), whose own rights and cloud \
         credentials a runner in another namespace would not have"
    )]
    ServiceAccountOverride(String),
    #[error("the Job pulls its image with jobs.imagePullSecrets of that namespace, which are gone")]
    ImagePullSecrets,
    #[error("the credentials mirror of its identity is gone")]
    NoMirror,
}

/// Whether a destroy can run from the manager's namespace. Pure.
pub fn check(f: &Facts) -> Result<String, Refusal> {
    let away = f
        .manager_namespace
        .clone()
        .ok_or(Refusal::NoManagerNamespace)?;
    if away == f.namespace {
        return Err(Refusal::ManagerNamespace);
    }
    match f.binding {
        Binding::Missing => return Err(Refusal::NoRoleBinding),
        Binding::Foreign => return Err(Refusal::ForeignRoleBinding),
        Binding::Ours => {}
    }
    if f.service_account != RUNNER_RBAC {
        return Err(Refusal::ServiceAccountOverride(f.service_account.clone()));
    }
    if f.image_pull_secrets {
        return Err(Refusal::ImagePullSecrets);
    }
    if f.identity == Some(false) {
        return Err(Refusal::NoMirror);
    }
    Ok(away)
}

fn away_labels(namespace: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_LABEL.to_owned(), "true".to_owned()),
        (OWNER_NAMESPACE_LABEL.to_owned(), namespace.to_owned()),
    ])
}

/// Moves a built Job and its per-run Secret to the namespace `away`: no
/// owner reference (none can cross namespaces: the labels name the
/// object, its namespace and uid), the namespace's away runner account,
/// and the credentials copy beside the Job instead of the mirror. The
/// backend still writes into `namespace` (its `--backend-config`).
pub fn relocate(job: &mut Job, run_secret: &mut Secret, away: &str, namespace: &str, uid: &str) {
    let name = job.metadata.name.clone().unwrap_or_default();
    let creds = names::run_credentials(&name);
    job.metadata.namespace = Some(away.to_owned());
    job.metadata.owner_references = None;
    let labels = job.metadata.labels.get_or_insert_default();
    labels.insert(OWNER_NAMESPACE_LABEL.to_owned(), namespace.to_owned());
    labels.insert(OWNER_UID_LABEL.to_owned(), uid.to_owned());
    run_secret.metadata.namespace = Some(away.to_owned());
    run_secret
        .metadata
        .labels
        .get_or_insert_default()
        .insert(OWNER_NAMESPACE_LABEL.to_owned(), namespace.to_owned());
    let Some(pod) = job.spec.as_mut().and_then(|s| s.template.spec.as_mut()) else {
        return;
    };
    pod.service_account_name = Some(names::away_runner(namespace));
    for volume in pod.volumes.iter_mut().flatten() {
        if let Some(secret) = volume.secret.as_mut()
            && volume.name == builder::CREDENTIALS_VOLUME
        {
            secret.secret_name = Some(creds.clone());
        }
    }
    for container in &mut pod.containers {
        for from in container.env_from.iter_mut().flatten() {
            if let Some(secret) = from.secret_ref.as_mut() {
                secret.name = creds.clone();
            }
        }
        // No event can be recorded in a namespace being deleted.
        if let Some(args) = container.args.as_mut() {
            args.retain(|a| !a.starts_with("--events-for="));
        }
    }
}

/// The copy of the credentials mirror `mirror` beside the Job `job` in
/// `away`, owned by the Job so that it goes with it.
pub fn credentials(mirror: &Secret, job: &Job, namespace: &str) -> Result<Secret, JobNotCreated> {
    let mut copy = Secret {
        metadata: ObjectMeta {
            name: Some(names::run_credentials(
                job.metadata.name.as_deref().unwrap_or_default(),
            )),
            namespace: job.metadata.namespace.clone(),
            labels: Some(away_labels(namespace)),
            ..Default::default()
        },
        data: mirror.data.clone(),
        type_: mirror.type_.clone(),
        ..Default::default()
    };
    builder::own_run_secret(&mut copy, job)?;
    Ok(copy)
}

#[derive(Debug, thiserror::Error)]
pub enum AwayError {
    #[error("runner RBAC for a destroy from namespace {away}: {refusal}")]
    Refused { away: String, refusal: Refusal },
    #[error("runner RBAC for a destroy from another namespace: {0}")]
    Api(#[from] kube::Error),
}

impl Categorized for AwayError {
    fn category(&self) -> Category {
        match self {
            AwayError::Refused { .. } => Category::Invalid,
            AwayError::Api(e) => kube_category(e),
        }
    }
}

/// The away runner account of `namespace` in `away`, and its subject in
/// the namespace's RoleBinding (an update: the namespace takes no
/// creates).
pub async fn ensure_rbac(
    client: &kube::Client,
    namespace: &str,
    away: &str,
) -> Result<(), AwayError> {
    let account = names::away_runner(namespace);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(account.clone()),
            namespace: Some(away.to_owned()),
            labels: Some(away_labels(namespace)),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<ServiceAccount>::namespaced(client.clone(), away)
        .create(&PostParams::default(), &sa)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.is_already_exists() => {}
        Err(e) => return Err(e.into()),
    }
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), namespace);
    loop {
        let found = bindings.get_opt(RUNNER_RBAC).await?;
        let refusal = match Binding::of(found.as_ref()) {
            Binding::Missing => Some(Refusal::NoRoleBinding),
            Binding::Foreign => Some(Refusal::ForeignRoleBinding),
            Binding::Ours => None,
        };
        if let Some(refusal) = refusal {
            return Err(AwayError::Refused {
                away: away.to_owned(),
                refusal,
            });
        }
        let Some(found) = found else { return Ok(()) };
        let Some(updated) = rbac::with_subject(&found, away, &account) else {
            return Ok(());
        };
        match bindings
            .replace(RUNNER_RBAC, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if lost_race(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::JobPolicy;
    use crate::jobs::builder::JobRequest;
    use crate::jobs::inputs::{self, InputsRequest};
    use crate::jobs::policy;
    use crate::names::{Hash6, Kind, Op};
    use std::num::NonZeroU32;

    fn facts() -> Facts {
        Facts {
            manager_namespace: Some("captf-system".into()),
            namespace: "team-a".into(),
            binding: Binding::Ours,
            service_account: RUNNER_RBAC.into(),
            image_pull_secrets: false,
            identity: Some(true),
        }
    }

    #[test]
    fn when_a_destroy_can_run_from_the_managers_namespace() {
        let with = |change: &dyn Fn(&mut Facts)| {
            let mut f = facts();
            change(&mut f);
            check(&f)
        };
        let table: &[(&str, Result<String, Refusal>)] = &[
            ("as built", Ok("captf-system".into())),
            ("no manager namespace", Err(Refusal::NoManagerNamespace)),
            ("the manager's own", Err(Refusal::ManagerNamespace)),
            ("binding gone", Err(Refusal::NoRoleBinding)),
            ("binding foreign", Err(Refusal::ForeignRoleBinding)),
            (
                "override account",
                Err(Refusal::ServiceAccountOverride("cloud".into())),
            ),
            ("pull secrets", Err(Refusal::ImagePullSecrets)),
            ("mirror gone", Err(Refusal::NoMirror)),
            ("no identity", Ok("captf-system".into())),
        ];
        let changes: [&dyn Fn(&mut Facts); 9] = [
            &|_| {},
            &|f| f.manager_namespace = None,
            &|f| f.manager_namespace = Some("team-a".into()),
            &|f| f.binding = Binding::Missing,
            &|f| f.binding = Binding::Foreign,
            &|f| f.service_account = "cloud".into(),
            &|f| f.image_pull_secrets = true,
            &|f| f.identity = Some(false),
            &|f| f.identity = None,
        ];
        for ((what, want), change) in table.iter().zip(changes) {
            assert_eq!(&with(change), want, "{what}");
        }
    }

    #[test]
    fn the_binding_is_ours_only_with_the_runner_cluster_role() {
        let ours = rbac::role_binding("ns", &Default::default());
        assert_eq!(Binding::of(Some(&ours)), Binding::Ours);
        assert_eq!(Binding::of(None), Binding::Missing);
        let mut foreign = ours;
        foreign.role_ref.kind = "Role".into();
        assert_eq!(Binding::of(Some(&foreign)), Binding::Foreign);
    }

    #[test]
    fn relocated_jobs_run_in_the_managers_namespace_against_the_objects_state() {
        let settings = policy::resolve(None::<&JobPolicy>, None);
        let inputs = inputs::render(&InputsRequest {
            kind: Kind::Machine,
            namespace: "team-a",
            name: "w",
            cluster_name: Some("c"),
            image: "module:1",
            template: None,
            variables: None,
            sensitive: &[],
            role: &[],
        })
        .unwrap();
        let built = builder::build(&JobRequest {
            kind: Kind::Machine,
            namespace: "team-a",
            name: "w",
            uid: "uid-1",
            cluster_name: Some("c"),
            op: Op::Destroy,
            attempt: NonZeroU32::MIN,
            hash6: &Hash6::of(b"x"),
            image: "module:1",
            image_pull_policy: None,
            runner_image: "runner:1",
            settings: &settings,
            identity: Some("aws"),
            force_unlock: None,
            inputs: &inputs,
            restore: None,
            mode: builder::ApplyMode::Direct,
            events: true,
        });
        let (mut job, mut secret) = (built.job, built.run_secret);
        relocate(&mut job, &mut secret, "captf-system", "team-a", "uid-1");
        let name = job.metadata.name.clone().unwrap();
        assert_eq!(job.metadata.namespace.as_deref(), Some("captf-system"));
        assert_eq!(job.metadata.owner_references, None);
        let labels = job.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[OWNER_NAMESPACE_LABEL], "team-a");
        assert_eq!(labels[OWNER_UID_LABEL], "uid-1");
        assert_eq!(labels[MANAGED_LABEL], "true");
        assert_eq!(secret.metadata.namespace.as_deref(), Some("captf-system"));
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.service_account_name, Some(names::away_runner("team-a")));
        let creds = names::run_credentials(&name);
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == builder::CREDENTIALS_VOLUME)
            .unwrap();
        assert_eq!(
            volume.secret.as_ref().unwrap().secret_name,
            Some(creds.clone())
        );
        let from = pod.containers[0].env_from.as_ref().unwrap();
        assert_eq!(from[0].secret_ref.as_ref().unwrap().name, creds);
        // The backend still writes into the object's namespace.
        let args = pod.containers[0].args.clone().unwrap_or_default().join(" ");
        assert!(args.contains("--backend-config=namespace=team-a"), "{args}");
        // Nor can an event be recorded in a namespace being deleted.
        assert!(!args.contains("--events-for"), "{args}");
        let env = pod.containers[0].env.clone().unwrap_or_default();
        assert!(
            env.iter()
                .any(|e| e.name == "KUBE_NAMESPACE" && e.value.as_deref() == Some("team-a"))
        );
    }
}
