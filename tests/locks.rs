//! The state lock and the stale-lock decision against the real API server:
//! lock Leases written in the backend's shape, runner pods written by hand
//! (their phase set through the status subresource), and locks really taken
//! by OpenTofu's kubernetes backend.

use std::path::Path;
use std::process::Stdio;

use captf::keys::LOCK_INFO;
use captf::locks::{self, LockInfo, Verdict};
use captf::names::{self, Kind};
use captf_testkit::{controlplane, eventually, run_ok, tofu};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

/// The object every test asks about, each in a namespace of its own.
const OBJECT: &str = "foo";
/// A pod of one of `foo`'s own runner Jobs.
const OWN_POD: &str = "captf-m-foo-apply-a1-abc123-x7k2p";
const LOCK_ID: &str = "8f2b1c7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f";
const CREATED: &str = "2026-12-02T10:00:00.123456789Z";
const FINALIZER: &str = "test.captf.io/hold";

struct Env {
    client: Client,
    ns: String,
}

impl Env {
    async fn new(prefix: &str) -> Env {
        let client = controlplane::shared().client().await;
        let ns = captf_testkit::namespace(&client, prefix).await;
        Env { client, ns }
    }

    fn suffix(&self) -> String {
        names::suffix(&self.ns, Kind::Machine, OBJECT)
    }

    fn lease_name(&self) -> String {
        names::state_lock_lease(&self.suffix())
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn inspect(&self) -> Verdict {
        locks::inspect(&self.client, &self.ns, None, Kind::Machine, OBJECT)
            .await
            .unwrap()
    }

    /// Writes the lock Lease as the backend does: labels, the holder
    /// identity, the lock-info annotation. Replaces any earlier one.
    async fn write_lock(&self, holder: Option<&str>, lock_info: Option<&str>) {
        let name = self.lease_name();
        match self.leases().delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("deleting {name}: {e}"),
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some(
                    [
                        ("tfstate", "true"),
                        ("tfstateSecretSuffix", self.suffix().as_str()),
                        ("tfstateWorkspace", "default"),
                        ("app.kubernetes.io/managed-by", "opentf"),
                    ]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into(),
                ),
                annotations: lock_info.map(|i| [(LOCK_INFO.to_owned(), i.to_owned())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                ..Default::default()
            }),
        };
        self.leases()
            .create(&PostParams::default(), &lease)
            .await
            .unwrap();
    }

    async fn lock_held_by(&self, who: &str) {
        self.write_lock(Some(LOCK_ID), Some(&lock_info(who))).await;
    }

    /// A pod as a runner Job would have made it; no kubelet runs it, so
    /// its phase is whatever the test sets.
    async fn create_pod(&self, name: &str, finalizer: bool) {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                finalizers: finalizer.then(|| vec![FINALIZER.into()]),
                ..Default::default()
            },
            spec: Some(PodSpec {
                restart_policy: Some("Never".into()),
                containers: vec![Container {
                    name: "runner".into(),
                    image: Some("example.invalid/runner:1".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    async fn set_phase(&self, name: &str, phase: &str, reason: Option<&str>) {
        let status = json!({ "status": { "phase": phase, "reason": reason } });
        let pod = self
            .pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some(phase));
    }

    async fn wait_gone(&self, name: &str) {
        eventually(&format!("pod {name} to be gone"), || async {
            matches!(self.pods().get_opt(name).await, Ok(None)).then_some(())
        })
        .await;
    }

    fn alive(&self) -> Verdict {
        Verdict::Alive {
            lease: self.lease_name(),
            pod: OWN_POD.into(),
        }
    }

    fn stale(&self) -> Verdict {
        Verdict::Stale {
            lease: self.lease_name(),
            id: LOCK_ID.into(),
            pod: OWN_POD.into(),
        }
    }

    fn foreign(&self, who: &str) -> Verdict {
        Verdict::Foreign {
            lease: self.lease_name(),
            holder: who.into(),
            operation: Some("OperationTypeApply".into()),
            created: Some(CREATED.into()),
            id: LOCK_ID.into(),
        }
    }
}

/// The lock info as the backend marshals Go's `statemgr.LockInfo`.
fn lock_info(who: &str) -> String {
    json!({
        "ID": LOCK_ID,
        "Operation": "OperationTypeApply",
        "Info": "",
        "Who": who,
        "Version": "1.12.6",
        "Created": CREATED,
        "Path": "",
    })
    .to_string()
}

#[tokio::test]
async fn a_missing_or_released_lock_is_free() {
    let env = Env::new("locks-free").await;
    assert_eq!(env.inspect().await, Verdict::Free, "no Lease");
    // What the backend leaves after an unlock: the Lease, no holder, no
    // lock info.
    env.write_lock(None, None).await;
    assert_eq!(env.inspect().await, Verdict::Free, "a released Lease");
    env.write_lock(Some(""), None).await;
    assert_eq!(env.inspect().await, Verdict::Free, "an empty holder");
}

#[tokio::test]
async fn foreign_holders_are_never_stale() {
    let env = Env::new("locks-foreign").await;
    // Dead pods of every name below exist, so a pod lookup, were it made,
    // would call the lock stale.
    let holders = [
        "alice@laptop",
        // A pod of object foo-apply.
        "runner@captf-m-foo-apply-apply-a1-abc123-x7k2p",
        // This object's prefix without the full pattern.
        "runner@captf-m-foo-apply-a1-abc123",
        "runner@captf-m-foo-apply-a1-abc123-x7k2p1",
        "runner@captf-m-foo-apply-a0-abc123-x7k2p",
        // The pod's name, but no @.
        OWN_POD,
    ];
    for pod in [
        "captf-m-foo-apply-apply-a1-abc123-x7k2p",
        "captf-m-foo-apply-a1-abc123",
        "captf-m-foo-apply-a1-abc123-x7k2p1",
        "captf-m-foo-apply-a0-abc123-x7k2p",
        OWN_POD,
    ] {
        env.create_pod(pod, false).await;
        env.set_phase(pod, "Succeeded", None).await;
    }
    for who in holders {
        env.lock_held_by(who).await;
        assert_eq!(env.inspect().await, env.foreign(who), "{who}");
    }

    env.lock_held_by("alice@laptop").await;
    assert_eq!(
        env.inspect().await.message(),
        format!(
            "the state lock {} is held by alice@laptop (OperationTypeApply) since {CREATED}; it \
             is not one of this object's runner pods, so CAPTF never unlocks it: release it with \
             force-unlock {LOCK_ID} once the holder is gone",
            env.lease_name()
        )
    );
}

#[tokio::test]
async fn an_unparsable_lock_info_is_never_stale() {
    let env = Env::new("locks-garbage").await;
    // The holder named in the broken lock info is a dead own pod.
    env.create_pod(OWN_POD, false).await;
    env.set_phase(OWN_POD, "Failed", None).await;
    let unparsable = Verdict::Unparsable {
        lease: env.lease_name(),
        holder: LOCK_ID.into(),
    };
    for info in [
        Some("{not json".to_owned()),
        Some(format!(r#"{{"ID":7,"Who":"runner@{OWN_POD}"}}"#)),
        Some(format!(r#"["runner@{OWN_POD}"]"#)),
        None,
    ] {
        env.write_lock(Some(LOCK_ID), info.as_deref()).await;
        assert_eq!(env.inspect().await, unparsable, "{info:?}");
    }
}

#[tokio::test]
async fn an_own_pod_that_may_run_keeps_its_lock() {
    let env = Env::new("locks-alive").await;
    env.lock_held_by(&format!("runner@{OWN_POD}")).await;
    env.create_pod(OWN_POD, false).await;
    assert_eq!(env.inspect().await, env.alive(), "Pending");
    env.set_phase(OWN_POD, "Running", None).await;
    assert_eq!(env.inspect().await, env.alive(), "Running");
}

#[tokio::test]
async fn an_own_pod_that_succeeded_leaves_a_stale_lock() {
    let env = Env::new("locks-succeeded").await;
    env.lock_held_by(&format!("runner@{OWN_POD}")).await;
    env.create_pod(OWN_POD, false).await;
    env.set_phase(OWN_POD, "Running", None).await;
    env.set_phase(OWN_POD, "Succeeded", None).await;
    assert_eq!(env.inspect().await, env.stale());
}

#[tokio::test]
async fn an_evicted_own_pod_leaves_a_stale_lock() {
    let env = Env::new("locks-evicted").await;
    env.lock_held_by(&format!("@{OWN_POD}")).await;
    env.create_pod(OWN_POD, false).await;
    env.set_phase(OWN_POD, "Running", None).await;
    env.set_phase(OWN_POD, "Failed", Some("Evicted")).await;
    assert_eq!(env.inspect().await, env.stale());
}

#[tokio::test]
async fn a_gone_own_pod_leaves_a_stale_lock() {
    let env = Env::new("locks-gone").await;
    env.lock_held_by(&format!("runner@{OWN_POD}")).await;
    assert_eq!(env.inspect().await, env.stale(), "never created");
    env.create_pod(OWN_POD, false).await;
    env.set_phase(OWN_POD, "Running", None).await;
    assert_eq!(env.inspect().await, env.alive());
    env.pods()
        .delete(OWN_POD, &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone(OWN_POD).await;
    assert_eq!(env.inspect().await, env.stale(), "deleted");
}

#[tokio::test]
async fn a_terminating_own_pod_keeps_its_lock() {
    let env = Env::new("locks-terminating").await;
    env.lock_held_by(&format!("runner@{OWN_POD}")).await;
    env.create_pod(OWN_POD, true).await;
    env.set_phase(OWN_POD, "Running", None).await;
    env.pods()
        .delete(OWN_POD, &DeleteParams::default())
        .await
        .unwrap();
    let pod = env.pods().get(OWN_POD).await.unwrap();
    assert!(pod.metadata.deletion_timestamp.is_some(), "terminating");
    assert_eq!(env.inspect().await, env.alive());

    let release = json!({ "metadata": { "finalizers": null } });
    env.pods()
        .patch(OWN_POD, &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    env.wait_gone(OWN_POD).await;
    assert_eq!(env.inspect().await, env.stale(), "once gone");
}

/// A working directory with the slow module, initialized against the test
/// API server with the object's state suffix.
async fn tofu_workspace(env: &Env) -> tempfile::TempDir {
    let plane = controlplane::shared();
    let work = tempfile::tempdir().unwrap();
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/modules/slow-noop/main.tf");
    std::fs::copy(&module, work.path().join("main.tf")).unwrap();
    std::fs::create_dir(work.path().join("home")).unwrap();
    run_ok(
        tofu(
            work.path(),
            &work.path().join("home"),
            &[
                "init",
                "-no-color",
                &format!(
                    "-backend-config=config_path={}",
                    plane.kubeconfig().display()
                ),
                &format!("-backend-config=namespace={}", env.ns),
                &format!("-backend-config=secret_suffix={}", env.suffix()),
            ],
        ),
        "tofu init",
    )
    .await;
    work
}

const SLOW_APPLY: [&str; 4] = ["apply", "-auto-approve", "-no-color", "-var=message=locked"];

/// Waits for the lock to be held and returns the Lease's holder identity
/// and its parsed lock info.
async fn held_lock(env: &Env) -> (String, LockInfo) {
    let leases = env.leases();
    let name = env.lease_name();
    eventually("OpenTofu to hold the state lock", || async {
        let lease = leases.get_opt(&name).await.ok()??;
        let holder = lease.spec?.holder_identity.filter(|h| !h.is_empty())?;
        let info = lease.metadata.annotations?.remove(LOCK_INFO)?;
        Some((holder, LockInfo::parse(&info).unwrap()))
    })
    .await
}

#[tokio::test]
async fn a_lock_taken_by_opentofu_on_a_workstation_is_foreign() {
    let env = Env::new("locks-tofu").await;
    let work = tofu_workspace(&env).await;
    let apply = tofu(
        work.path(),
        &work.path().join("home"),
        &[&SLOW_APPLY[..], &["-var=sleep_seconds=8"]].concat(),
    )
    .spawn()
    .unwrap();

    let (holder, info) = held_lock(&env).await;
    assert_eq!(info.id.as_deref(), Some(holder.as_str()));
    assert_eq!(info.operation.as_deref(), Some("OperationTypeApply"));
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let who = info.who.clone().unwrap();
    assert!(who.ends_with(&format!("@{}", hostname.trim())), "{who}");
    let created = info.created.clone().unwrap();
    assert!(created.at.is_some(), "{created:?}");
    assert_eq!(
        env.inspect().await,
        Verdict::Foreign {
            lease: env.lease_name(),
            holder: who,
            operation: Some("OperationTypeApply".into()),
            created: Some(created.raw),
            id: holder,
        }
    );

    let out = apply.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "tofu apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(env.inspect().await, Verdict::Free, "released by the apply");
}

/// A runner's death, for real: OpenTofu runs with the hostname of one of the
/// object's runner pods (in a UTS namespace of its own, as in the pod), takes
/// the lock and is killed holding it. The lock is the pod's while the pod
/// runs, stale once it has ended, and the ID the verdict names is the one
/// force-unlock releases.
#[tokio::test]
async fn a_lock_left_by_a_killed_runner_is_stale_and_its_id_unlocks_it() {
    let env = Env::new("locks-killed").await;
    let work = tofu_workspace(&env).await;
    env.create_pod(OWN_POD, false).await;
    env.set_phase(OWN_POD, "Running", None).await;

    let home = work.path().join("home");
    let mut apply = tokio::process::Command::new("unshare");
    apply
        .args([
            "--uts",
            "sh",
            "-c",
            r#"hostname "$1" && shift && exec "$@""#,
            "sh",
            OWN_POD,
        ])
        .arg(controlplane::binary("tofu"))
        .args(SLOW_APPLY)
        .arg("-var=sleep_seconds=600")
        // Its own process group, so that the kill takes the provisioner's
        // sleep with it, as a container's death does.
        .process_group(0)
        .current_dir(work.path())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_INPUT", "0")
        .env("CHECKPOINT_DISABLE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut apply = apply.spawn().unwrap();

    let (holder, info) = held_lock(&env).await;
    assert_eq!(info.id.as_deref(), Some(holder.as_str()));
    assert_eq!(info.operation.as_deref(), Some("OperationTypeApply"));
    let who = info.who.clone().unwrap();
    assert!(who.ends_with(&format!("@{OWN_POD}")), "{who}");
    assert_eq!(
        env.inspect().await,
        Verdict::Alive {
            lease: env.lease_name(),
            pod: OWN_POD.into()
        }
    );

    // Killed, as by the OOM killer: no chance to unlock.
    let group = format!("-{}", apply.id().unwrap());
    run_ok(
        {
            let mut kill = tokio::process::Command::new("kill");
            kill.args(["-KILL", "--", &group]);
            kill
        },
        "kill the apply",
    )
    .await;
    apply.wait().await.unwrap();
    let lease = env.leases().get(&env.lease_name()).await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(holder.as_str()),
        "the killed apply still holds the lock"
    );
    env.set_phase(OWN_POD, "Failed", Some("OOMKilled")).await;
    let verdict = env.inspect().await;
    assert_eq!(
        verdict,
        Verdict::Stale {
            lease: env.lease_name(),
            id: holder.clone(),
            pod: OWN_POD.into(),
        }
    );

    let Verdict::Stale { id, .. } = verdict else {
        unreachable!()
    };
    run_ok(
        tofu(
            work.path(),
            &home,
            &["force-unlock", "-force", "-no-color", &id],
        ),
        "tofu force-unlock",
    )
    .await;
    assert_eq!(env.inspect().await, Verdict::Free, "force-unlocked");
}
