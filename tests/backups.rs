//! State backups on the test control plane: real OpenTofu states and
//! Terraform's chunked shape copied verbatim, idempotent retries, no partial
//! set after a refused create, pruning, and one suffix's backups only.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use captf::backups::{self, BackupDecision, BackupSet, Listed, Owner};
use captf::keys::{BACKUP_CHUNK, BACKUP_CHUNKS, BACKUP_DIGEST, BACKUP_SERIAL};
use captf::names::{self, Kind};
use captf::state::{self, StateReadable};
use captf_testkit::controlplane;
use captf_testkit::refusal::{self, Refusal};
use captf_testkit::{run_ok, tofu};
use flate2::Compression;
use flate2::write::GzEncoder;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

const MIB: usize = 1 << 20;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// The labels of the kubernetes backend's state Secrets.
fn backend_labels(suffix: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/managed-by".into(), "terraform".into()),
        ("tfstate".into(), "true".into()),
        ("tfstateSecretSuffix".into(), suffix.into()),
        ("tfstateWorkspace".into(), "default".into()),
    ])
}

/// Writes the state of `suffix` as Terraform does, `compressed` cut into
/// `piece`-byte chunks, replacing any earlier state Secrets.
async fn put_state(secrets: &Api<Secret>, suffix: &str, compressed: &[u8], piece: usize) -> usize {
    let old = secrets
        .list(&ListParams::default().labels(&state::label_selector(suffix)))
        .await
        .unwrap();
    for secret in old.items {
        secrets
            .delete(&secret.metadata.name.unwrap(), &DeleteParams::default())
            .await
            .unwrap();
    }
    let pieces: Vec<&[u8]> = compressed.chunks(piece).collect();
    for (index, bytes) in pieces.iter().enumerate() {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(names::state_chunk(suffix, index as u32)),
                labels: Some(backend_labels(suffix)),
                annotations: Some(BTreeMap::from([("encoding".into(), "gzip".into())])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                "tfstate".into(),
                ByteString(bytes.to_vec()),
            )])),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    pieces.len()
}

/// A version 4 state document of `serial` with one managed resource whose
/// attribute holds `filler` bytes that hardly compress.
fn state_document(serial: u64, filler: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ serial;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let blob: String = (0..filler)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            char::from(ALPHABET[(x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 58) as usize])
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "version": 4, "terraform_version": "1.12.6", "serial": serial,
        "lineage": "7c0e6e4e-1f0b-4b35-9d3a-5a5f5d1b2c3d",
        "outputs": {},
        "resources": [{
            "mode": "managed", "type": "terraform_data", "name": "r",
            "provider": "provider[\"terraform.io/builtin/terraform\"]",
            "instances": [{"schema_version": 0, "attributes": {"id": "x", "blob": blob}}]
        }]
    }))
    .unwrap()
}

struct Fixture {
    ns: String,
    client: kube::Client,
    secrets: Api<Secret>,
    /// A real object to own the backups, so that the garbage collector
    /// leaves them alone.
    owner: OwnerReference,
}

async fn setup(prefix: &str) -> Fixture {
    let client = controlplane::shared().client().await;
    let ns = captf_testkit::namespace(&client, prefix).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let map = maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("owner".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: map.metadata.uid.unwrap(),
        ..Default::default()
    };
    Fixture {
        secrets: Api::namespaced(client.clone(), &ns),
        ns,
        client,
        owner,
    }
}

impl Fixture {
    fn owner(&self) -> Owner<'_> {
        Owner {
            reference: self.owner.clone(),
            kind: Kind::Machine,
            name: "worker-0",
            cluster_name: Some("prod"),
        }
    }

    /// Reads the state of `suffix` and plans its backup.
    async fn plan(&self, suffix: &str) -> BackupSet {
        let snapshot = state::snapshot(&self.secrets, suffix).await.unwrap();
        let StateReadable::Read(read) = &snapshot.readable else {
            panic!("state of {suffix} unreadable: {:?}", snapshot.readable);
        };
        assert_eq!(
            backups::should_back_up(&snapshot.readable, None, 5, false),
            BackupDecision::Take {
                serial: read.serial
            }
        );
        backups::plan_backup(
            suffix,
            read,
            &snapshot.secrets,
            &self.owner(),
            Some("job-x"),
            Timestamp::now(),
        )
        .unwrap()
    }

    async fn tfstate(&self, name: &str) -> Vec<u8> {
        let secret = self.secrets.get(name).await.unwrap();
        secret.data.unwrap().remove("tfstate").unwrap().0
    }

    /// The backup Secrets of `suffix`, with their data.
    async fn listed(&self, suffix: &str) -> Vec<Secret> {
        let selector = format!("captf.io/state-backup=true,captf.io/state-backup-suffix={suffix}");
        self.secrets
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
    }

    async fn backup_names(&self, suffix: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .listed(suffix)
            .await
            .into_iter()
            .map(|s| s.metadata.name.unwrap())
            .collect();
        names.sort();
        names
    }
}

#[tokio::test]
async fn opentofu_state_is_backed_up_byte_identically() {
    let fx = setup("backups-tofu").await;
    let suffix = names::suffix(&fx.ns, Kind::Machine, "worker-0");
    let work = tempfile::tempdir().unwrap();
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/modules/state-single");
    std::fs::copy(module.join("main.tf"), work.path().join("main.tf")).unwrap();
    let home = work.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let config = format!(
        "-backend-config=config_path={}",
        controlplane::shared().kubeconfig().display()
    );
    let namespace = format!("-backend-config=namespace={}", fx.ns);
    let secret_suffix = format!("-backend-config=secret_suffix={suffix}");
    run_ok(
        tofu(
            work.path(),
            &home,
            &["init", "-no-color", &config, &namespace, &secret_suffix],
        ),
        "tofu init",
    )
    .await;
    run_ok(
        tofu(work.path(), &home, &["apply", "-auto-approve", "-no-color"]),
        "tofu apply",
    )
    .await;

    let set = fx.plan(&suffix).await;
    assert_eq!(set.secrets.len(), 1);
    backups::take(&fx.secrets, &set).await.unwrap();
    let source = fx.tfstate(&names::state_secret(&suffix)).await;
    let copy = fx.tfstate(&names::backup_secret(&suffix, set.serial)).await;
    assert_eq!(copy, source, "byte-identical");

    let infos = backups::list(&fx.listed(&suffix).await, &suffix);
    assert_eq!(infos.len(), 1);
    assert!(infos[0].complete);
    assert_eq!(infos[0].serial, set.serial);
    assert_eq!(infos[0].bytes, source.len() as u64);
    let status = backups::status_entries(&infos);
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].serial, set.serial as i64);

    // The observed serial is not backed up again.
    let again = state::read(&fx.secrets, &suffix).await.unwrap();
    assert_eq!(
        backups::should_back_up(&again, Some(set.serial as i64), 5, false),
        BackupDecision::Skip {
            reason: "unchanged"
        }
    );
}

#[tokio::test]
async fn three_chunk_state_is_backed_up_chunk_for_chunk_and_idempotently() {
    let fx = setup("backups-chunks").await;
    let suffix = names::suffix(&fx.ns, Kind::Machine, "worker-0");
    let compressed = gzip(&state_document(9, 3 * MIB));
    let count = put_state(&fx.secrets, &suffix, &compressed, MIB).await;
    assert_eq!(count, 3, "{} bytes compressed", compressed.len());

    let set = fx.plan(&suffix).await;
    let created = match backups::take(&fx.secrets, &set).await.unwrap() {
        backups::Taken::New(created) => created,
        other => panic!("not new: {other:?}"),
    };
    assert_eq!(created.len(), 3);
    // A second pass finds the set there with the same digest: not new.
    assert_eq!(
        backups::take(&fx.secrets, &set).await.unwrap(),
        backups::Taken::Already
    );

    let want: Vec<String> = (0..3).map(|i| names::backup_chunk(&suffix, 9, i)).collect();
    let mut sorted = want.clone();
    sorted.sort();
    assert_eq!(fx.backup_names(&suffix).await, sorted);
    for (index, name) in want.iter().enumerate() {
        let source = fx.tfstate(&names::state_chunk(&suffix, index as u32)).await;
        assert_eq!(fx.tfstate(name).await, source, "chunk {index}");
        let secret = fx.secrets.get(name).await.unwrap();
        let annotations = secret.metadata.annotations.unwrap();
        assert_eq!(annotations[BACKUP_CHUNK], index.to_string());
        assert_eq!(annotations[BACKUP_CHUNKS], "3");
        assert_eq!(annotations[BACKUP_SERIAL], "9");
        assert_eq!(annotations[BACKUP_DIGEST], set.digest);
        let refs = secret.metadata.owner_references.unwrap();
        assert_eq!(refs[0].uid, fx.owner.uid);
        assert_eq!(refs[0].controller, Some(false));
    }
    let infos = backups::list(&fx.listed(&suffix).await, &suffix);
    assert_eq!(infos.len(), 1);
    assert!(infos[0].complete);
    assert_eq!(infos[0].bytes, compressed.len() as u64);
}

impl Fixture {
    /// Refuses creating any Secret named `*-part-1` in the fixture's
    /// namespace, probed by a dry-run create of one.
    async fn refuse_part_1(&self) -> Refusal<impl AsyncFn() -> bool + use<>> {
        let probe = refusal::creating_secret(self.secrets.clone(), "probe-part-1");
        Refusal::install(
            &self.client,
            &self.ns,
            &["CREATE"],
            "secrets",
            "!object.metadata.name.endsWith('-part-1')",
            probe,
        )
        .await
    }
}

#[tokio::test]
async fn a_refused_chunk_leaves_no_partial_set() {
    let fx = setup("backups-refused").await;
    let suffix = names::suffix(&fx.ns, Kind::Machine, "worker-0");
    let compressed = gzip(&state_document(4, 3000));
    let piece = compressed.len().div_ceil(3);
    assert_eq!(put_state(&fx.secrets, &suffix, &compressed, piece).await, 3);
    let set = fx.plan(&suffix).await;
    assert_eq!(set.secrets.len(), 3);

    // A leftover of an earlier failed attempt at the same set.
    fx.secrets
        .create(&PostParams::default(), &set.secrets[2])
        .await
        .unwrap();
    // Chunk 0 is created, chunk 1 refused.
    let refusal = fx.refuse_part_1().await;

    let error = backups::take(&fx.secrets, &set).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&names::backup_chunk(&suffix, 4, 1)),
        "{error}"
    );
    assert_eq!(fx.backup_names(&suffix).await, Vec::<String>::new());

    // Once the create goes through, the next reconcile's attempt takes the
    // whole set.
    refusal.remove().await;
    backups::take(&fx.secrets, &set).await.unwrap();
    let infos = backups::list(&fx.listed(&suffix).await, &suffix);
    assert_eq!(infos.len(), 1);
    assert!(infos[0].complete);
}

#[tokio::test]
async fn prune_keeps_the_newest_and_touches_one_suffix_only() {
    let fx = setup("backups-prune").await;
    let mine = names::suffix(&fx.ns, Kind::Machine, "worker-0");
    let theirs = names::suffix(&fx.ns, Kind::Machine, "worker-1");
    for serial in [1, 2, 4, 7] {
        put_state(&fx.secrets, &mine, &gzip(&state_document(serial, 100)), MIB).await;
        backups::take(&fx.secrets, &fx.plan(&mine).await)
            .await
            .unwrap();
    }
    for serial in [1, 3] {
        put_state(
            &fx.secrets,
            &theirs,
            &gzip(&state_document(serial, 100)),
            200,
        )
        .await;
        backups::take(&fx.secrets, &fx.plan(&theirs).await)
            .await
            .unwrap();
    }
    let theirs_before = fx.backup_names(&theirs).await;
    // Theirs are chunked in 200-byte pieces: more Secrets than sets.
    assert!(theirs_before.len() > 2, "{theirs_before:?}");
    let prefix = format!("captf-state-backup-{theirs}-");
    assert!(theirs_before.iter().all(|n| n.starts_with(&prefix)));
    assert_eq!(
        fx.backup_names(&mine).await,
        [1, 2, 4, 7]
            .map(|s| names::backup_secret(&mine, s))
            .to_vec()
    );

    let secrets = fx.listed(&mine).await;
    let listed = Listed {
        infos: backups::list(&secrets, &mine),
        secrets,
    };
    let serials: Vec<u64> = listed.infos.iter().map(|b| b.serial).collect();
    assert_eq!(serials, vec![7, 4, 2, 1]);
    assert_eq!(backups::prune(&listed.infos, 0), Vec::<u64>::new());
    let doomed = backups::prune(&listed.infos, 2);
    assert_eq!(doomed, vec![2, 1]);
    let doomed = listed.of_serials(&mine, &doomed);
    backups::delete_sets(&fx.secrets, &doomed).await.unwrap();
    assert_eq!(
        fx.backup_names(&mine).await,
        [4, 7].map(|s| names::backup_secret(&mine, s)).to_vec()
    );
    assert_eq!(fx.backup_names(&theirs).await, theirs_before);
    // Deleting what is already gone is fine.
    backups::delete_sets(&fx.secrets, &doomed).await.unwrap();
}
