//! Deletion end to end (book: terraform-state.md "State on deletion"; ref
//! §8.6): the destroy, its retries, the cleanup, held deletions and their
//! ways out, and the namespace sweep. Each test has its own namespace,
//! manager and executor.

use std::time::Duration;

use captf::api::{IdentityReference, TerraformCluster, TerraformMachine, WorkspaceSpec};
use captf::names::{self, Kind};
use captf_testkit::refusal::Refusal;
use captf_testkit::scenario::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::jiff::SignedDuration;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");
const ABANDON: &str = "captf.io/abandon-infrastructure";

mod held;
mod sweep;

/// Cluster `c` and its machine `m` (with `variables`) applied, the
/// machine's state backed up; returns the machine.
async fn applied_pair(env: &Env, variables: Option<captf::api::Variables>) -> TerraformMachine {
    env.cluster("c", NOOP, None).await;
    env.machine("m", "c", variables).await;
    applied_and_backed_up::<TerraformMachine>(env, "m", 1).await;
    within(env, 240, "the cluster applied", || async {
        env.cluster_status("c").await.filter(applied)
    })
    .await;
    env.api::<TerraformMachine>().get("m").await.unwrap()
}

/// Cluster `c` and its machine `m` under an identity that does not allow
/// the namespace: nothing of them ever applies.
async fn never_applying_pair(env: &Env) {
    let elsewhere = format!("elsewhere-{}", env.ns);
    env.identity_allowing(&elsewhere, "elsewhere").await;
    let workspace = WorkspaceSpec {
        identity_ref: Some(IdentityReference { name: elsewhere }),
        ..noop(None)
    };
    env.create_cluster("c", workspace.clone()).await;
    env.create_machine("m", "c", workspace).await;
}

/// How often an event happened: the recorder folds repeats into a series.
fn occurrences(events: &[Event]) -> i32 {
    events
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

/// Waits until the object had an event `reason` (it may be written just
/// after the object went) and asserts it happened exactly once.
async fn once(env: &Env, reason: &str, kind: Kind, name: &str) -> Event {
    let what = format!("{reason} about {name}");
    let events = within(env, 30, &what, || async {
        let events = env.events_about(reason, kind, name).await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(occurrences(&events), 1, "{reason} about {name}: {events:?}");
    events.into_iter().next().unwrap()
}

/// How often `reason` happened to an object.
async fn happened(env: &Env, reason: &str, kind: Kind, name: &str) -> i32 {
    occurrences(&env.events_about(reason, kind, name).await)
}

/// Waits until the machine `m`'s deletion is held, with `state_reason` on
/// StateReadable and a way out named in the message.
async fn held(env: &Env, state_reason: &str) {
    let status = within(env, 90, "the deletion held", || async {
        env.machine_status("m").await.filter(|s| {
            condition(s, "Deleting") == Some(("True", "DeletionHeld"))
                && condition(s, "StateReadable") == Some(("False", state_reason))
        })
    })
    .await;
    let message = condition_message(&status, "Deleting").unwrap();
    assert!(message.starts_with("deletion held:"), "{message}");
    assert!(
        message.to_lowercase().contains("restore") && message.contains(ABANDON),
        "no way out named: {message}"
    );
}

/// After a held machine `m` stood for a while: no destroy Job, and every
/// Secret it may need is still there.
async fn nothing_destroyed(env: &Env, backup: &str) {
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(env.jobs_named("captf-m-m-destroy-").await.is_empty());
    assert!(!env.gone::<TerraformMachine>("m").await);
    for name in [backup.to_string(), names::inputs_secret(Kind::Machine, "m")] {
        assert!(
            env.secrets().get_opt(&name).await.unwrap().is_some(),
            "{name} was deleted"
        );
    }
    let event = once(env, "DeletionHeld", Kind::Machine, "m").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
}

/// The object's own leftovers are gone: state Secrets, lock Lease, durable
/// inputs, run lease.
async fn cleaned_up(env: &Env, kind: Kind, name: &str) {
    let suffix = env.suffix(kind, name);
    assert_eq!(env.state_secrets(&suffix).await, Vec::<String>::new());
    for lease in [names::state_lock_lease(&suffix), names::run_lease(&suffix)] {
        assert!(
            env.leases().get_opt(&lease).await.unwrap().is_none(),
            "{lease} is left"
        );
    }
    let inputs = names::inputs_secret(kind, name);
    assert!(
        env.secrets().get_opt(&inputs).await.unwrap().is_none(),
        "{inputs} is left"
    );
}

/// The newest backup's chunk 0 of a machine `m` being deleted.
async fn newest_backup(env: &Env) -> String {
    let status = env.machine_status("m").await.unwrap();
    let serial = status
        .state_backups
        .as_ref()
        .and_then(|b| b.first())
        .expect("a backup")
        .serial;
    names::backup_secret(
        &env.suffix(Kind::Machine, "m"),
        u64::try_from(serial).unwrap(),
    )
}

#[tokio::test]
async fn deleting_an_applied_machine_destroys_then_cleans_up() {
    let env = setup(MANAGER, "del-applied", &[], &[]).await;
    let machine = applied_pair(&env, None).await;
    let uid = machine.meta().uid.clone().unwrap();
    let suffix = env.suffix(Kind::Machine, "m");
    let backups = env.backup_secrets(&suffix).await;
    assert!(!backups.is_empty());
    let statuses = Statuses::watch::<TerraformMachine>(&env, "m");
    let jobs = JobsSeen::watch(&env);

    env.delete::<TerraformMachine>("m").await;
    env.wait_gone::<TerraformMachine>(240, "m").await;
    within(&env, 10, "the watch saw the deletion", || async {
        statuses.deleted().then_some(())
    })
    .await;

    // One destroy, init then destroy, whose success is the last status.
    let destroyed = jobs.destroys(Kind::Machine, "m");
    assert_eq!(destroyed.len(), 1, "{destroyed:?}");
    let runs = statuses.runs("-destroy-");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].job, destroyed[0].0);
    assert!(
        runs[0].job.starts_with("captf-m-m-destroy-a1-"),
        "{}",
        runs[0].job
    );
    assert_eq!(steps(&runs[0]), ["init", "destroy"]);
    let last = statuses.last().unwrap();
    assert_eq!(
        condition(&last, "ApplyJobSucceeded"),
        Some(("True", "DestroySucceeded")),
        "{last:?}"
    );
    assert!(
        statuses
            .all()
            .iter()
            .any(|s| condition(s, "Deleting") == Some(("True", "Deleting")))
    );
    // Each of its Jobs (the apply, the destroy) was created and succeeded.
    let all = jobs.named("captf-m-m-").len() as i32;
    assert_eq!(happened(&env, "JobCreated", Kind::Machine, "m").await, all);
    assert_eq!(
        happened(&env, "JobSucceeded", Kind::Machine, "m").await,
        all
    );

    cleaned_up(&env, Kind::Machine, "m").await;
    for reason in ["DeletionStarted", "Destroyed", "FinalizerRemoved"] {
        once(&env, reason, Kind::Machine, "m").await;
    }
    // The backups go with the object, through the garbage collector.
    within(&env, 60, "the backups collected", || async {
        env.backup_secrets(&suffix).await.is_empty().then_some(())
    })
    .await;
    for backup in &backups {
        assert!(
            env.secrets().get_opt(backup).await.unwrap().is_none(),
            "{backup}"
        );
    }
    // The cluster still uses the mirror, the runner account and its state.
    let mirror = env
        .secrets()
        .get(&names::credentials_mirror(&env.identity))
        .await
        .unwrap();
    assert!(
        !mirror.owner_references().iter().any(|o| o.uid == uid),
        "{:?}",
        mirror.owner_references()
    );
    assert!(env.events("MirrorRemoved").await.is_empty());
    assert!(
        !env.state_secrets(&env.suffix(Kind::Cluster, "c"))
            .await
            .is_empty()
    );
    assert!(
        env.api::<TerraformCluster>()
            .get("c")
            .await
            .unwrap()
            .meta()
            .deletion_timestamp
            .is_none()
    );
    let bindings = Api::<RoleBinding>::namespaced(env.client.clone(), &env.ns);
    assert!(
        bindings
            .get_opt(names::RUNNER_RBAC)
            .await
            .unwrap()
            .is_some(),
        "the sweep took a busy namespace's RoleBinding"
    );
    let cluster_run_lease = names::run_lease(&env.suffix(Kind::Cluster, "c"));
    assert!(
        env.leases()
            .get_opt(&cluster_run_lease)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn deleting_a_never_applied_machine_removes_it_at_once() {
    let env = setup(MANAGER, "del-never", &[], &[]).await;
    never_applying_pair(&env).await;
    within(
        &env,
        60,
        "the machine refused its identity, with its finalizer",
        || async {
            let status = env.machine_status("m").await?;
            let refused = condition(&status, "IdentityAllowed").is_some_and(|(s, _)| s == "False");
            let finalized = env
                .finalizers::<TerraformMachine>("m")
                .await
                .contains(&finalizer(Kind::Machine));
            (refused && finalized).then_some(())
        },
    )
    .await;

    env.delete::<TerraformMachine>("m").await;
    env.wait_gone::<TerraformMachine>(30, "m").await;
    assert!(env.jobs().await.is_empty());
    assert!(env.events("JobCreated").await.is_empty());
    once(&env, "FinalizerRemoved", Kind::Machine, "m").await;
    assert!(
        env.events_about("Destroyed", Kind::Machine, "m")
            .await
            .is_empty()
    );
}

/// Cleanup deletes a state Secret or lock Lease only as it was read: one
/// written since is refused with a conflict and kept (the next pass reads it
/// again), and the protection finalizer comes off only once the delete is
/// accepted.
#[tokio::test]
async fn cleanup_deletes_a_state_secret_only_as_it_was_read() {
    use captf::protection::{self, AsRead};
    let client = captf_testkit::controlplane::shared().client().await;
    let ns = captf_testkit::namespace(&client, "del-asread").await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client, &ns);
    let mut secret = k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("tfstate-default-x".into()),
            ..Default::default()
        },
        data: Some([("tfstate".to_string(), ByteString(b"one".to_vec()))].into()),
        ..Default::default()
    };
    protection::protect(&mut secret.metadata);
    let read = secrets.create(&Default::default(), &secret).await.unwrap();
    let as_read = AsRead::of(&read.metadata).unwrap();
    // A new state written after the read.
    secrets
        .patch(
            "tfstate-default-x",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"tfstate": "dHdv"}})),
        )
        .await
        .unwrap();
    let refused = protection::delete_as_read(&secrets, &as_read).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 409),
        "{refused:?}"
    );
    let kept = secrets.get("tfstate-default-x").await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_none());
    assert!(protection::is_protected(&kept));

    // As read now, it goes, finalizer and all; gone, it is fine again.
    let as_read = AsRead::of(&kept.metadata).unwrap();
    protection::delete_as_read(&secrets, &as_read)
        .await
        .unwrap();
    assert!(
        secrets
            .get_opt("tfstate-default-x")
            .await
            .unwrap()
            .is_none()
    );
    protection::delete_as_read(&secrets, &as_read)
        .await
        .unwrap();
}

/// A lock its holder still has is never deleted with the object: the
/// cleanup waits, saying who holds it, and finishes once it is released.
#[tokio::test]
async fn a_foreign_lock_holds_the_cleanup_until_it_is_released() {
    let env = setup(MANAGER, "del-locked", &[], &[]).await;
    // Never applied: cleanup is due at once on deletion, and nothing else
    // takes the lock.
    never_applying_pair(&env).await;
    within(&env, 60, "the machine has its finalizer", || async {
        env.finalizers::<TerraformMachine>("m")
            .await
            .contains(&finalizer(Kind::Machine))
            .then_some(())
    })
    .await;
    let lease = put_lock(&env, "m", "alice@laptop").await;

    env.delete::<TerraformMachine>("m").await;
    let status = within(&env, 60, "the cleanup held on the lock", || async {
        env.machine_status("m")
            .await
            .filter(|s| condition(s, "Deleting") == Some(("True", "DeletionHeld")))
    })
    .await;
    let message = condition_message(&status, "Deleting").unwrap();
    assert!(
        message.contains("alice@laptop") && message.contains(&lease.name_any()),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now = env.leases().get(&lease.name_any()).await.unwrap();
    assert_eq!(
        now.metadata.resource_version, lease.metadata.resource_version,
        "the held lock was touched"
    );
    assert!(!env.gone::<TerraformMachine>("m").await);
    once(&env, "DeletionHeld", Kind::Machine, "m").await;

    // Released (as force-unlock leaves it: the Lease without a holder).
    env.leases()
        .patch(
            &lease.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": null}})),
        )
        .await
        .unwrap();
    env.wait_gone::<TerraformMachine>(90, "m").await;
    cleaned_up(&env, Kind::Machine, "m").await;
}

/// No backups are taken while an object is being deleted (book:
/// terraform-state.md "State backups"): a cluster held by its machine gets
/// a new state serial, and no pass backs it up or counts it observed.
#[tokio::test]
async fn no_backup_is_taken_while_deleting() {
    use std::io::{Read, Write};
    let env = setup(MANAGER, "del-nobackup", &[], &["--sync-period=2s"]).await;
    applied_pair(&env, None).await;
    let suffix = names::suffix(&env.ns, Kind::Cluster, "c");
    let observed = within(&env, 60, "the cluster's state backed up", || async {
        let s = env.cluster_status("c").await?;
        let serial = s.observed_state_serial?;
        s.state_backups
            .iter()
            .flatten()
            .any(|b| b.serial == serial)
            .then_some(serial)
    })
    .await;
    env.delete::<TerraformCluster>("c").await;
    within(&env, 20, "the cluster's deletion blocked", || async {
        env.cluster_status("c")
            .await
            .filter(|s| condition(s, "DeletionBlocked") == Some(("True", "DependentsExist")))
    })
    .await;

    // The state moves on by hand to a serial no backup has.
    let base = names::state_secret(&suffix);
    let secret = env.secrets().get(&base).await.unwrap();
    let mut document = String::new();
    flate2::read::GzDecoder::new(secret.data.as_ref().unwrap()["tfstate"].0.as_slice())
        .read_to_string(&mut document)
        .unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&document).unwrap();
    let next = observed + 1;
    doc["serial"] = json!(next);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(doc.to_string().as_bytes()).unwrap();
    let bytes = gz.finish().unwrap();
    env.secrets()
        .patch(
            &base,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"tfstate": ByteString(bytes)}})),
        )
        .await
        .unwrap();
    within(&env, 30, "the new serial read", || async {
        env.cluster_status("c").await.filter(|s| {
            condition_message(s, "StateReadable")
                .is_some_and(|m| m.contains(&format!("serial {next}")))
        })
    })
    .await;
    env.more_passes(Kind::Cluster, "c", 3).await;
    let status = env.cluster_status("c").await.unwrap();
    assert_eq!(
        status.observed_state_serial,
        Some(observed),
        "{}",
        env.context()
    );
    let next_backup = names::backup_secret(&suffix, u64::try_from(next).unwrap());
    assert!(
        env.secrets().get_opt(&next_backup).await.unwrap().is_none(),
        "{next_backup} was taken while deleting"
    );
    let backed_up = env.events("StateBackedUp").await;
    assert!(
        backed_up.iter().all(|e| !e
            .note
            .as_deref()
            .is_some_and(|n| n.contains(&format!("serial {next} ")))),
        "serial {next} was backed up while deleting"
    );
}
