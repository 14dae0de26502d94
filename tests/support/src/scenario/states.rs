//! States, locks and objects written by hand: many machines, a state,
//! a lock held by someone, a backup waited for.

use super::*;

/// Creates `n` TerraformMachines `m-0`... of cluster `c` in `ns`, with the
/// identity `identity` (one that does not allow `ns` keeps them from ever
/// being applied), a few at a time.
pub async fn many_machines(client: &kube::Client, ns: &str, n: usize, identity: &str) {
    let api = Api::<TerraformMachine>::namespaced(client.clone(), ns);
    let spec = |i: usize| {
        let mut m = TerraformMachine::new(
            &format!("m-{i}"),
            TerraformMachineSpec {
                workspace: WorkspaceSpec {
                    identity_ref: Some(IdentityReference {
                        name: identity.into(),
                    }),
                    ..noop(None)
                },
                ..Default::default()
            },
        );
        m.metadata.labels = labels("c");
        m
    };
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &spec(i)).await.unwrap() }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

/// A state Secret written by hand, in the backend's shape.
pub async fn put_state(env: &Env, kind: Kind, name: &str, payload: &[u8]) {
    let suffix = env.suffix(kind, name);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(names::state_secret(&suffix)),
            labels: Some(state_labels(&suffix)),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "tfstate".to_string(),
            k8s_openapi::ByteString(payload.to_vec()),
        )])),
        ..Default::default()
    };
    let params = PatchParams::apply("test").force();
    env.secrets()
        .patch(
            &names::state_secret(&suffix),
            &params,
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
}

/// The labels the kubernetes backend puts on the state Secrets of `suffix`.
pub fn state_labels(suffix: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("tfstate".to_string(), "true".to_string()),
        ("tfstateSecretSuffix".to_string(), suffix.to_string()),
        ("tfstateWorkspace".to_string(), "default".to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "terraform".to_string(),
        ),
    ])
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A state whose compressed size is about `bytes`: one output holding
/// incompressible text.
pub fn big_state(bytes: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e3779b97f4a7c15;
    // 36 symbols: about 5.2 bits, two thirds of a byte, each once gzipped.
    let noise: String = (0..bytes * 3 / 2)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[(x % 36) as usize])
        })
        .collect();
    let doc = json!({"version": 4, "terraform_version": "1.12.6", "serial": 7, "lineage": "l-1",
        "outputs": {"noise": {"value": noise, "type": "string"}}, "resources": []});
    gzip(doc.to_string().as_bytes())
}

/// A machine's lock Lease written by hand in the backend's shape, held by
/// `who` (over the Lease an earlier run left, if any).
pub async fn put_lock(env: &Env, machine: &str, who: &str) -> Lease {
    let suffix = env.suffix(Kind::Machine, machine);
    let id = "4f2c1a9e-0b7d-4c55-9d21-7a6f3e8b1c00";
    let info = json!({"ID": id, "Operation": "OperationTypeApply", "Info": "", "Who": who,
        "Version": "1.12.6", "Created": "2026-12-02T10:00:00.000000000Z", "Path": ""});
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(names::state_lock_lease(&suffix)),
            annotations: Some(BTreeMap::from([(
                "app.terraform.io/lock-info".to_string(),
                info.to_string(),
            )])),
            // The backend labels every lock Lease it creates as it labels
            // the state Secrets.
            labels: Some(state_labels(&suffix)),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(id.into()),
            ..Default::default()
        }),
    };
    let params = PatchParams::apply("test").force();
    env.leases()
        .patch(
            &names::state_lock_lease(&suffix),
            &params,
            &Patch::Apply(&lease),
        )
        .await
        .unwrap()
}

/// Waits until the apply attempt `attempt` of an object is adopted and its
/// serial backed up; returns the state's serial.
pub async fn applied_and_backed_up<K: Workload>(env: &Env, name: &str, attempt: u32) -> u64 {
    let status = within(env, 240, "the apply adopted and backed up", || async {
        let s = env.status::<K>(name).await?;
        let run_ok = s
            .last_run
            .as_ref()
            .is_some_and(|r| r.job.contains(&format!("-apply-a{attempt}-")));
        let newest = s.state_backups.as_ref()?.first()?.serial;
        (applied(&s) && run_ok && s.observed_state_serial == Some(newest)).then_some(s)
    })
    .await;
    let serial = u64::try_from(status.observed_state_serial.unwrap()).unwrap();
    // The newest backup holds exactly the state Secret's bytes.
    let suffix = env.suffix(K::KIND, name);
    let state = env
        .secrets()
        .get(&names::state_secret(&suffix))
        .await
        .unwrap();
    let backup = env
        .secrets()
        .get(&names::backup_secret(&suffix, serial))
        .await
        .unwrap();
    assert_eq!(
        state.data.as_ref().unwrap()["tfstate"],
        backup.data.as_ref().unwrap()["tfstate"]
    );
    assert_eq!(
        backup
            .labels()
            .get("captf.io/state-backup")
            .map(String::as_str),
        Some("true")
    );
    let owner = env.api::<K>().get(name).await.unwrap();
    assert!(
        backup
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == owner.meta().uid.as_ref()),
        "a backup is owned by its object"
    );
    serial
}
