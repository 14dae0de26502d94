//! The rules as the webhook server calls them: [`Webhooks`] implements
//! [`AdmissionHandler`]. It decodes the request, applies the pure rules of
//! [`super::validate`] and [`super::defaults`], and gathers from the API
//! server what the deletion and identity rules need (ref §1.4 rules 10, 12).
//! A lookup that fails denies the request: the webhook fails closed, like its
//! `failurePolicy: Fail`.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, ListParams, PostParams};
use kube::core::admission::{AdmissionResponse, Operation as AdmissionOperation};
use tracing::warn;

use super::objects::{Decoded, Decoder, defaults_patch};
use super::rules::{self, Violation};
use super::validate::{Lookup, Review, Verb, Verdict, validate};
use crate::api::{
    IdentityReference, SecretReference, TerraformCluster, TerraformClusterIdentity,
    TerraformMachine, TerraformMachinePool,
};
use crate::capi::objects::{Cluster, Machine};
use crate::capi::owners;
use crate::keys::{CLUSTER_NAME_LABEL, DELETE_FOR_MOVE};
use crate::names::Kind;
use crate::server::webhook::{AdmissionHandler, Field, ReviewRequest};

type Request<'a> = ReviewRequest<'a, Decoded>;

/// The validating and defaulting webhooks. Without a client, the rules that
/// need the API server deny what they cannot check.
#[derive(Clone)]
pub struct Webhooks {
    client: Option<kube::Client>,
}

impl Webhooks {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client: Some(client),
        }
    }

    /// Only the rules that need nothing but the request: for tests of the
    /// pure rules through the real handler.
    pub fn offline() -> Self {
        Self { client: None }
    }
}

fn verb(request: &Request<'_>) -> Option<Verb> {
    match request.operation {
        AdmissionOperation::Create => Some(Verb::Create),
        AdmissionOperation::Update => Some(Verb::Update),
        AdmissionOperation::Delete => Some(Verb::Delete),
        AdmissionOperation::Connect => None,
    }
}

/// The response for a verdict: the first violation's code, every
/// violation's message, and the warnings.
fn respond(request: &Request<'_>, verdict: Verdict) -> AdmissionResponse {
    let mut response = request.allow();
    if let Some(first) = verdict.violations.first() {
        let code = first.code();
        let message = verdict
            .violations
            .iter()
            .map(Violation::message)
            .collect::<Vec<_>>()
            .join("; ");
        response = response.deny(message);
        response.result.code = code;
        response.result.reason = if code == 403 { "Forbidden" } else { "Invalid" }.into();
    }
    if !verdict.warnings.is_empty() {
        response.warnings = Some(verdict.warnings);
    }
    response
}

impl AdmissionHandler for Webhooks {
    type Object = Decoded;
    type Decoder = Decoder;

    fn decoder(&self, kind: &str, field: Field, body: usize) -> Option<Decoder> {
        Decoder::of(kind, field, body)
    }

    async fn validate(&self, request: &Request<'_>) -> AdmissionResponse {
        let Some(verb) = verb(request) else {
            return request.allow();
        };
        let review = Review {
            verb,
            kind: &request.kind.kind,
            object: request.object.as_ref(),
            old_object: request.old_object.as_ref(),
            dry_run: request.dry_run,
        };
        let (mut verdict, lookup) = validate(&review);
        if verdict.violations.is_empty()
            && let Some(lookup) = lookup
            && let Err(violation) = self.look_up(request, lookup).await
        {
            verdict.violations.push(violation);
        }
        respond(request, verdict)
    }

    async fn mutate(&self, request: &Request<'_>) -> AdmissionResponse {
        let Some(object) = &request.object else {
            return request.allow();
        };
        let ops = match defaults_patch(&request.kind.kind, object) {
            Ok(ops) => ops,
            Err(violation) => {
                return respond(
                    request,
                    Verdict {
                        violations: vec![violation],
                        warnings: vec![],
                    },
                );
            }
        };
        if ops.is_empty() {
            return request.allow();
        }
        match request.allow().with_patch(json_patch::Patch(ops)) {
            Ok(response) => response,
            Err(e) => request
                .allow()
                .deny(format!("building the defaults patch: {e}")),
        }
    }
}

impl Webhooks {
    /// The rules that need the API server; `Err` is the refusal.
    async fn look_up(&self, request: &Request<'_>, lookup: Lookup) -> Result<(), Violation> {
        match lookup {
            Lookup::SecretReadable(secret) => self.identity_secret_readable(request, &secret).await,
            Lookup::IdentityUnused(identity) => self.identity_unused(&identity).await,
            Lookup::MachineDeletable(machine) => self.machine_deletable(&machine).await,
        }
    }

    fn client(&self, what: &str) -> Result<kube::Client, Violation> {
        self.client.clone().ok_or_else(|| {
            Violation::forbidden(
                "object",
                format!("cannot be checked: {what} needs the API server"),
                None,
            )
        })
    }

    /// Rule 12: on create, and when spec.secretRef changes, the requesting
    /// user must be allowed to get the Secret the identity names; otherwise
    /// an identity would hand out credentials its creator cannot read.
    async fn identity_secret_readable(
        &self,
        request: &Request<'_>,
        secret: &SecretReference,
    ) -> Result<(), Violation> {
        let user = &request.user_info;
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some("get".into()),
                    resource: Some("secrets".into()),
                    namespace: Some(secret.namespace.clone()),
                    name: Some(secret.name.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let client = self.client("the Secret access check")?;
        let answer = Api::<SubjectAccessReview>::all(client)
            .create(&PostParams::default(), &sar)
            .await
            .map_err(|e| lookup_failed("spec.secretRef", &e))?;
        if answer.status.is_some_and(|s| s.allowed) {
            Ok(())
        } else {
            Err(Violation::forbidden(
                "spec.secretRef",
                format!(
                    "the requesting user {} may not get this Secret, so may not hand it to an identity",
                    rules::echo(user.username.as_deref().unwrap_or("(unknown)"))
                ),
                Some(format!("{}/{}", secret.namespace, secret.name)),
            ))
        }
    }

    /// Rule 12: an identity cannot be deleted while an object resolves to it
    /// or a namespace still holds its credentials mirror.
    async fn identity_unused(&self, identity: &TerraformClusterIdentity) -> Result<(), Violation> {
        let name = identity.metadata.name.clone().unwrap_or_default();
        let mirrored = identity
            .status
            .as_ref()
            .and_then(|s| s.namespaces.clone())
            .unwrap_or_default();
        if !mirrored.is_empty() {
            return Err(Violation::forbidden(
                "metadata.name",
                format!(
                    "cannot be deleted while namespaces hold its credentials mirror: {}",
                    mirrored.join(", ")
                ),
                Some(rules::echo(&name)),
            ));
        }
        let client = self.client("the identity-in-use check")?;
        let list = ListParams::default();
        let failed = |e: kube::Error| lookup_failed("metadata.name", &e);
        let clusters = Api::<TerraformCluster>::all(client.clone())
            .list(&list)
            .await
            .map_err(failed)?;
        let machines = Api::<TerraformMachine>::all(client.clone())
            .list(&list)
            .await
            .map_err(failed)?;
        let pools = Api::<TerraformMachinePool>::all(client)
            .list(&list)
            .await
            .map_err(failed)?;

        let names = |r: Option<&IdentityReference>| r.map(|r| r.name.clone());
        let mut user = None;
        for cluster in &clusters {
            if names(cluster.spec.workspace.identity_ref.as_ref()).as_deref() == Some(&name) {
                user = Some(object_ref("TerraformCluster", &cluster.metadata));
            }
        }
        // A machine or pool without its own ref falls back to its cluster's
        // defaults.identityRef, then the cluster's identityRef. Its cluster
        // is any TerraformCluster of its namespace with the same
        // cluster-name label: counting every such cluster errs on the side
        // of keeping the identity.
        let fallback_uses = |meta: &kube::api::ObjectMeta| {
            let label = meta.labels.as_ref().and_then(|l| l.get(CLUSTER_NAME_LABEL));
            clusters.iter().any(|c| {
                c.metadata.namespace == meta.namespace
                    && label.is_some()
                    && c.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(CLUSTER_NAME_LABEL))
                        == label
                    && c.spec
                        .defaults
                        .as_ref()
                        .and_then(|d| d.identity_ref.as_ref())
                        .or(c.spec.workspace.identity_ref.as_ref())
                        .is_some_and(|r| r.name == name)
            })
        };
        for (kind, meta, own) in machines
            .iter()
            .map(|m| {
                (
                    "TerraformMachine",
                    &m.metadata,
                    m.spec.workspace.identity_ref.as_ref(),
                )
            })
            .chain(pools.iter().map(|p| {
                (
                    "TerraformMachinePool",
                    &p.metadata,
                    p.spec.workspace.identity_ref.as_ref(),
                )
            }))
        {
            let uses = match own {
                Some(r) => r.name == name,
                None => fallback_uses(meta),
            };
            if uses && user.is_none() {
                user = Some(object_ref(kind, meta));
            }
        }
        match user {
            Some(user) => Err(Violation::forbidden(
                "metadata.name",
                format!("cannot be deleted while {user} uses it"),
                Some(rules::echo(&name)),
            )),
            None => Ok(()),
        }
    }

    /// Rule 10: a TerraformMachine goes only with its Machine: deletion is
    /// allowed when it has no Machine owner, when the owning Machine that
    /// passes the owner checks is gone or deleting, or for a clusterctl move
    /// of a paused Cluster.
    async fn machine_deletable(&self, machine: &TerraformMachine) -> Result<(), Violation> {
        let owners: Vec<_> = machine
            .metadata
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.kind == "Machine" && o.api_version.starts_with("cluster.x-k8s.io/"))
            .collect();
        if owners.is_empty() {
            return Ok(());
        }
        let client = self.client("the Machine owner check")?;
        let namespace = machine.metadata.namespace.clone().unwrap_or_default();
        let name = machine.metadata.name.clone().unwrap_or_default();
        let machines: Api<Machine> = Api::namespaced(client.clone(), &namespace);

        if machine
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(DELETE_FOR_MOVE))
            && let Some(cluster) = machine
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(CLUSTER_NAME_LABEL))
        {
            let clusters: Api<Cluster> = Api::namespaced(client.clone(), &namespace);
            let paused = clusters
                .get_opt(cluster)
                .await
                .map_err(|e| lookup_failed("metadata.annotations", &e))?
                .is_some_and(|c| c.spec.paused == Some(true));
            if paused {
                return Ok(());
            }
        }
        for owner in owners {
            let Some(owning) = machines
                .get_opt(&owner.name)
                .await
                .map_err(|e| lookup_failed("metadata.ownerReferences", &e))?
            else {
                continue;
            };
            let label = machine
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(CLUSTER_NAME_LABEL))
                .map(String::as_str);
            let owner_ref = owners::points_back(
                Kind::Machine,
                &name,
                label,
                owner,
                owners::Owner::Machine(&owning),
            );
            if owner_ref.is_err() {
                continue;
            }
            if owning.metadata.deletion_timestamp.is_none() {
                return Err(Violation::forbidden(
                    "metadata.ownerReferences",
                    format!(
                        "a TerraformMachine is deleted with its Machine: delete Machine {} instead",
                        rules::echo(&owner.name)
                    ),
                    Some(rules::echo(&name)),
                ));
            }
        }
        Ok(())
    }
}

fn object_ref(kind: &str, meta: &kube::api::ObjectMeta) -> String {
    format!(
        "{kind} {}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

fn lookup_failed(path: &str, error: &kube::Error) -> Violation {
    warn!(%error, "an admission lookup failed; denying");
    Violation::forbidden(
        path,
        format!("could not be checked against the API server ({error}); try again"),
        None,
    )
}
