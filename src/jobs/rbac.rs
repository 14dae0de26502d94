//! The runner's ServiceAccount and RoleBinding in each namespace (book:
//! inside-the-job.md "ServiceAccount and RBAC"; ref §7, §8.6).
//!
//! Jobs run as `captf-runner`, which the manager creates, or as an override
//! account the user labels `captf.io/runner=true`. The RoleBinding
//! `captf-runner` binds every account in use to the ClusterRole
//! `captf-runner` (config/rbac/runner_clusterrole.yaml). Here subjects are
//! only added; pruning them is the namespace sweep's.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, PostParams};

use super::lost_race;
use crate::error::{Categorized, Category, kube_category};
use crate::keys::{MANAGED_LABEL, RUNNER_LABEL};
use crate::names::RUNNER_RBAC;
use crate::protection;

/// How many times a RoleBinding write that lost a race is retried. Every
/// round has a winner, so a writer always gets through while there are no
/// more concurrent writers than this: the manager's reconciles of one
/// namespace (10 workers for each of three kinds by default) stay below it.
const WRITE_ATTEMPTS: usize = 64;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

fn managed_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_LABEL.to_owned(), "true".to_owned())])
}

/// The default runner account of `namespace`.
pub fn service_account(namespace: &str) -> ServiceAccount {
    ServiceAccount {
        metadata: ObjectMeta {
            name: Some(RUNNER_RBAC.into()),
            namespace: Some(namespace.into()),
            labels: Some(managed_labels()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The RoleBinding of `namespace` for the accounts named `subjects`,
/// protected: a destroy run from the manager's namespace while this one is
/// being deleted needs it, and none can be created then.
pub fn role_binding(namespace: &str, subjects: &BTreeSet<String>) -> RoleBinding {
    let mut metadata = ObjectMeta {
        name: Some(RUNNER_RBAC.into()),
        namespace: Some(namespace.into()),
        labels: Some(managed_labels()),
        ..Default::default()
    };
    protection::protect(&mut metadata);
    RoleBinding {
        metadata,
        role_ref: role_ref(),
        subjects: Some(
            subjects
                .iter()
                .map(|name| subject(namespace, name))
                .collect(),
        ),
    }
}

fn role_ref() -> RoleRef {
    RoleRef {
        api_group: Some(RBAC_GROUP.into()),
        kind: "ClusterRole".into(),
        name: RUNNER_RBAC.into(),
    }
}

pub(crate) fn subject(namespace: &str, name: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(namespace.into()),
        ..Default::default()
    }
}

/// Whether the user opted `sa` in as a runner account.
pub fn opted_in(sa: &ServiceAccount) -> bool {
    sa.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(RUNNER_LABEL))
        .is_some_and(|value| value == "true")
}

/// Why an override account cannot run Jobs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RbacRefusal {
    #[error("ServiceAccount {name} named in jobs.serviceAccountName does not exist")]
    Missing { name: String },
    #[error(
        "ServiceAccount {name} named in jobs.serviceAccountName lacks the label {RUNNER_LABEL}=true"
    )]
    NotLabelled { name: String },
}

impl RbacRefusal {
    /// The RunnerRBACReady reason.
    pub const REASON: &'static str = "ServiceAccountNotOptedIn";
}

impl Categorized for RbacRefusal {
    fn category(&self) -> Category {
        Category::Invalid
    }
}

/// Whether the account `name`, as `found` in the namespace, may run Jobs:
/// `captf-runner` always may (the manager creates it), any other account
/// only when it exists and is opted in.
pub fn check_override(name: &str, found: Option<&ServiceAccount>) -> Result<(), RbacRefusal> {
    if name == RUNNER_RBAC {
        return Ok(());
    }
    match found {
        None => Err(RbacRefusal::Missing { name: name.into() }),
        Some(sa) if !opted_in(sa) => Err(RbacRefusal::NotLabelled { name: name.into() }),
        Some(_) => Ok(()),
    }
}

/// `binding` with the account `account` of `namespace` added to its
/// subjects and protected, or None when it is both already.
pub(crate) fn with_subject(
    binding: &RoleBinding,
    namespace: &str,
    account: &str,
) -> Option<RoleBinding> {
    let wanted = subject(namespace, account);
    let subjects = binding.subjects.as_deref().unwrap_or_default();
    let present = subjects.iter().any(|s| {
        s.kind == wanted.kind
            && s.name == wanted.name
            && s.namespace == wanted.namespace
            && s.api_group.as_deref().unwrap_or_default().is_empty()
    });
    if present && protection::is_protected(binding) {
        return None;
    }
    let mut updated = binding.clone();
    protection::protect(&mut updated.metadata);
    if !present {
        updated.subjects.get_or_insert_default().push(wanted);
    }
    Some(updated)
}

#[derive(Debug, thiserror::Error)]
pub enum RbacError {
    #[error(transparent)]
    NotOptedIn(#[from] RbacRefusal),
    #[error(
        "RoleBinding {RUNNER_RBAC} exists with roleRef {kind} {name}, not ClusterRole {RUNNER_RBAC}; delete it to let the manager recreate it"
    )]
    ForeignRoleBinding { kind: String, name: String },
    #[error("runner RBAC: {0}")]
    Api(#[from] kube::Error),
}

impl RbacError {
    /// The RunnerRBACReady reason.
    pub const fn reason(&self) -> &'static str {
        match self {
            RbacError::NotOptedIn(_) => RbacRefusal::REASON,
            RbacError::ForeignRoleBinding { .. } | RbacError::Api(_) => "RBACFailed",
        }
    }
}

impl Categorized for RbacError {
    fn category(&self) -> Category {
        match self {
            RbacError::NotOptedIn(refusal) => refusal.category(),
            RbacError::ForeignRoleBinding { .. } => Category::Invalid,
            RbacError::Api(error) => kube_category(error),
        }
    }
}

/// Whether the watches show the runner RBAC of `namespace` in place for
/// the default account: `captf-runner` exists and the RoleBinding is ours,
/// protected and binds it. Then a Job start writes and reads nothing for
/// RBAC; anything else goes to [`ensure`], which reads afresh.
pub fn in_place(
    namespace: &str,
    service_account: &str,
    account_seen: bool,
    binding: Option<&RoleBinding>,
) -> bool {
    service_account == RUNNER_RBAC
        && account_seen
        && binding.is_some_and(|b| {
            b.role_ref == role_ref() && with_subject(b, namespace, service_account).is_none()
        })
}

/// Makes `service_account` able to run Jobs in `namespace`: creates
/// `captf-runner` when it is missing (an existing one is kept as it is),
/// refuses an override that is not opted in, then adds the account to the
/// RoleBinding.
pub async fn ensure(
    client: &kube::Client,
    namespace: &str,
    service_account: &str,
) -> Result<(), RbacError> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    if service_account == RUNNER_RBAC {
        let created = accounts
            .create(&PostParams::default(), &self::service_account(namespace))
            .await;
        match created {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(e) => return Err(e.into()),
        }
    } else {
        check_override(
            service_account,
            accounts.get_opt(service_account).await?.as_ref(),
        )?;
    }

    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), namespace);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let written = match bindings.get_opt(RUNNER_RBAC).await? {
            None => {
                let wanted = role_binding(namespace, &BTreeSet::from([service_account.to_owned()]));
                bindings.create(&PostParams::default(), &wanted).await
            }
            Some(found) => {
                if found.role_ref != role_ref() {
                    return Err(RbacError::ForeignRoleBinding {
                        kind: found.role_ref.kind,
                        name: found.role_ref.name,
                    });
                }
                let Some(updated) = with_subject(&found, namespace, service_account) else {
                    return Ok(());
                };
                // Carries the read resourceVersion: a concurrent change makes
                // this a Conflict instead of losing that change's subject.
                bindings
                    .replace(RUNNER_RBAC, &PostParams::default(), &updated)
                    .await
            }
        };
        match written {
            Ok(_) => return Ok(()),
            Err(e) if attempt < WRITE_ATTEMPTS && lost_race(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(labels: &[(&str, &str)]) -> ServiceAccount {
        ServiceAccount {
            metadata: ObjectMeta {
                name: Some("custom".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn default_objects() {
        let account = service_account("ns");
        assert_eq!(account.metadata.name.as_deref(), Some("captf-runner"));
        assert_eq!(account.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(account.metadata.labels, Some(managed_labels()));
        assert!(
            !opted_in(&account),
            "the default account needs no opt-in label"
        );

        let binding = role_binding("ns", &BTreeSet::from(["b".into(), "a".into()]));
        assert_eq!(binding.metadata.name.as_deref(), Some("captf-runner"));
        let mut protected = managed_labels();
        protected.insert("captf.io/protected".into(), "true".into());
        assert_eq!(binding.metadata.labels, Some(protected));
        assert_eq!(
            binding.metadata.finalizers.as_deref(),
            Some(&["captf.io/protection".to_owned()][..])
        );
        assert_eq!(
            binding.role_ref,
            RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: "captf-runner".into(),
            }
        );
        let subjects: Vec<_> = binding
            .subjects
            .unwrap()
            .into_iter()
            .map(|s| (s.kind, s.name, s.namespace.unwrap(), s.api_group))
            .collect();
        assert_eq!(
            subjects,
            [
                ("ServiceAccount".into(), "a".into(), "ns".into(), None),
                ("ServiceAccount".into(), "b".into(), "ns".into(), None),
            ]
        );
    }

    #[test]
    fn overrides_must_exist_and_opt_in() {
        let labelled = sa(&[("captf.io/runner", "true")]);
        let wrong_value = sa(&[("captf.io/runner", "yes")]);
        let other_label = sa(&[("captf.io/managed", "true")]);
        let table: &[(&str, Option<&ServiceAccount>, Result<(), RbacRefusal>)] = &[
            ("captf-runner", None, Ok(())),
            ("captf-runner", Some(&other_label), Ok(())),
            ("custom", Some(&labelled), Ok(())),
            (
                "custom",
                None,
                Err(RbacRefusal::Missing {
                    name: "custom".into(),
                }),
            ),
            (
                "custom",
                Some(&wrong_value),
                Err(RbacRefusal::NotLabelled {
                    name: "custom".into(),
                }),
            ),
            (
                "custom",
                Some(&other_label),
                Err(RbacRefusal::NotLabelled {
                    name: "custom".into(),
                }),
            ),
            (
                "custom",
                Some(&ServiceAccount::default()),
                Err(RbacRefusal::NotLabelled {
                    name: "custom".into(),
                }),
            ),
        ];
        for (name, found, want) in table {
            assert_eq!(check_override(name, *found), *want, "{name} {found:?}");
        }
        let refusal = check_override("custom", None).unwrap_err();
        assert_eq!(refusal.category(), Category::Invalid);
        let error = RbacError::from(refusal);
        assert_eq!(error.reason(), "ServiceAccountNotOptedIn");
        assert!(error.to_string().contains("custom"), "{error}");
    }

    #[test]
    fn subjects_are_added_once() {
        let binding = role_binding("ns", &BTreeSet::from(["captf-runner".into()]));
        assert_eq!(with_subject(&binding, "ns", "captf-runner"), None);
        let added = with_subject(&binding, "ns", "custom").unwrap();
        let names: Vec<_> = added
            .subjects
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, ["captf-runner", "custom"]);
        assert_eq!(with_subject(&added, "ns", "custom"), None);
        // The same name in another namespace, or as a User, is not this
        // account.
        let mut foreign = binding.clone();
        foreign.subjects = Some(vec![
            subject("other", "custom"),
            Subject {
                api_group: Some(RBAC_GROUP.into()),
                kind: "User".into(),
                name: "custom".into(),
                namespace: None,
            },
        ]);
        assert_eq!(
            with_subject(&foreign, "ns", "custom")
                .unwrap()
                .subjects
                .unwrap()
                .len(),
            3
        );
        // A binding made before protection existed gains it, once.
        let mut unprotected = binding.clone();
        unprotected.metadata.finalizers = None;
        let protected = with_subject(&unprotected, "ns", "captf-runner").unwrap();
        assert!(protection::is_protected(&protected));
        assert_eq!(protected.subjects, binding.subjects);
        assert_eq!(with_subject(&protected, "ns", "captf-runner"), None);
        let mut empty = binding;
        empty.subjects = None;
        assert_eq!(
            with_subject(&empty, "ns", "x")
                .unwrap()
                .subjects
                .unwrap()
                .len(),
            1
        );
    }

    /// The shipped ClusterRole grants exactly the book's table.
    #[test]
    fn shipped_cluster_role_matches_the_book() {
        use k8s_openapi::api::rbac::v1::ClusterRole;
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/rbac/runner_clusterrole.yaml"
        );
        let role: ClusterRole =
            serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(role.metadata.name.as_deref(), Some(RUNNER_RBAC));
        let rules: Vec<(Vec<String>, Vec<String>, Vec<String>)> = role
            .rules
            .unwrap()
            .into_iter()
            .map(|r| (r.api_groups.unwrap(), r.resources.unwrap(), r.verbs))
            .collect();
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            rules,
            [
                (
                    strings(&[""]),
                    strings(&["secrets"]),
                    strings(&["get", "list", "create", "update", "delete"])
                ),
                (
                    strings(&["coordination.k8s.io"]),
                    strings(&["leases"]),
                    strings(&["get", "create", "update"])
                ),
                (
                    strings(&["events.k8s.io"]),
                    strings(&["events"]),
                    strings(&["create"])
                ),
            ]
        );
    }

    #[test]
    fn in_place_only_when_the_watches_show_all_of_it() {
        let ours = role_binding("ns", &BTreeSet::from([RUNNER_RBAC.to_owned()]));
        let other_subject = role_binding("ns", &BTreeSet::from(["someone".to_owned()]));
        let mut foreign = ours.clone();
        foreign.role_ref.name = "admin".into();
        let mut unprotected = ours.clone();
        unprotected.metadata.finalizers = None;
        for (account, seen, binding, expected) in [
            (RUNNER_RBAC, true, Some(&ours), true),
            (RUNNER_RBAC, false, Some(&ours), false),
            (RUNNER_RBAC, true, None, false),
            (RUNNER_RBAC, true, Some(&other_subject), false),
            (RUNNER_RBAC, true, Some(&foreign), false),
            (RUNNER_RBAC, true, Some(&unprotected), false),
            // An override account is always checked afresh.
            ("custom", true, Some(&ours), false),
        ] {
            assert_eq!(
                in_place("ns", account, seen, binding),
                expected,
                "{account} {seen} {binding:?}"
            );
        }
    }
}
