//! Every name CAPTF derives (CONTRACT.md "Object names", reference §7): the
//! state suffix and the names built on it, Jobs, Secrets, Leases and label
//! values. This is the only place such a name is built, and the only place
//! one is recognized again (chunk indexes, the lock holder's pod).

use std::num::NonZeroU32;

use sha2::{Digest, Sha256};

/// The three workload kinds that own state and run Jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Cluster,
    Machine,
    MachinePool,
}

impl Kind {
    /// The Kubernetes kind, as hashed into the suffix.
    pub const fn kind(self) -> &'static str {
        match self {
            Kind::Cluster => "TerraformCluster",
            Kind::Machine => "TerraformMachine",
            Kind::MachinePool => "TerraformMachinePool",
        }
    }

    /// The kind code `ks` of the names: `c`, `m` or `mp`.
    pub const fn short(self) -> &'static str {
        match self {
            Kind::Cluster => "c",
            Kind::Machine => "m",
            Kind::MachinePool => "mp",
        }
    }
}

/// The operation a runner Job performs: the one vocabulary of the Job name,
/// its `captf.io/op` label, the runner's `--op`, `status.activeJob.operation`
/// and the metrics' `op` label.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Apply,
    Destroy,
    Drift,
    Refresh,
    Restore,
    Plan,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Apply,
        Op::Destroy,
        Op::Drift,
        Op::Refresh,
        Op::Restore,
        Op::Plan,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Op::Apply => "apply",
            Op::Plan => "plan",
            Op::Destroy => "destroy",
            Op::Refresh => "refresh",
            Op::Drift => "drift",
            Op::Restore => "restore",
        }
    }

    /// The operation an `as_str` spelling names.
    pub fn parse(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.as_str() == s)
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The six lowercase hex characters that end a Job name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Hash6(String);

impl Hash6 {
    /// Accepts exactly six lowercase hex characters.
    pub fn new(hex: &str) -> Option<Hash6> {
        (hex.len() == 6 && hex.bytes().all(is_lower_hex)).then(|| Hash6(hex.to_owned()))
    }

    /// The first six hex characters of the SHA-256 of `data`.
    pub fn of(data: &[u8]) -> Hash6 {
        let mut hex = sha256_hex(data);
        hex.truncate(6);
        Hash6(hex)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A Job name is capped so that its pod name (`<job>-<5 chars>`), which is
/// also the pod's hostname and so the lock holder, fits in 63 characters.
pub const JOB_NAME_MAX: usize = 57;

/// Kubernetes object names (DNS subdomains) are at most this long.
const OBJECT_NAME_MAX: usize = 253;

/// Label values are at most this long.
const LABEL_VALUE_MAX: usize = 63;

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The first 16 hex characters of the SHA-256 of `s`.
fn hash16(s: &str) -> String {
    let mut hex = sha256_hex(s.as_bytes());
    hex.truncate(16);
    hex
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

/// The backend's `secret_suffix`: the first 16 hex of
/// `sha256("<namespace>/<Kind>/<name>")`, `-`, and the kind code. Never the
/// UID, so the state follows the object through a move; the kind code is
/// letters, so the suffix never ends in `-<digits>`, which the backend would
/// take for a chunk index.
pub fn suffix(namespace: &str, kind: Kind, name: &str) -> String {
    format!(
        "{}-{}",
        hash16(&format!("{namespace}/{}/{name}", kind.kind())),
        kind.short()
    )
}

/// The base state Secret, `tfstate-default-<suffix>`: chunk 0.
pub fn state_secret(suffix: &str) -> String {
    format!("tfstate-default-{suffix}")
}

/// The state chunk Secret of `index`: the base Secret for 0, else
/// `tfstate-default-<suffix>-part-<index>`.
pub fn state_chunk(suffix: &str, index: u32) -> String {
    chunk_name(state_secret(suffix), index)
}

/// The chunk index a Secret name stands for in the state of `suffix`, or None
/// when the name is not of that state's chunk set. Leading zeros are read as
/// the number they spell (`-part-01` is index 1, `-part-0` index 0), so a
/// second spelling of an index shows as a duplicate rather than slipping by;
/// an index too large for u64 reads as u64::MAX, which no chunk set reaches.
pub fn state_chunk_index(suffix: &str, secret_name: &str) -> Option<u64> {
    chunk_index(&state_secret(suffix), secret_name)
}

/// The state lock Lease, `lock-tfstate-default-<suffix>`.
pub fn state_lock_lease(suffix: &str) -> String {
    format!("lock-tfstate-default-{suffix}")
}

/// The base Secret of the backup set of `serial`,
/// `captf-state-backup-<suffix>-<serial>`.
pub fn backup_secret(suffix: &str, serial: u64) -> String {
    format!("captf-state-backup-{suffix}-{serial}")
}

/// A chunk of a backup set, with the same `-part-N` chunking as the state.
pub fn backup_chunk(suffix: &str, serial: u64, index: u32) -> String {
    chunk_name(backup_secret(suffix, serial), index)
}

/// The chunk index a Secret name stands for in a backup set (same rules as
/// [`state_chunk_index`]).
pub fn backup_chunk_index(suffix: &str, serial: u64, secret_name: &str) -> Option<u64> {
    chunk_index(&backup_secret(suffix, serial), secret_name)
}

fn chunk_name(base: String, index: u32) -> String {
    if index == 0 {
        base
    } else {
        format!("{base}-part-{index}")
    }
}

fn chunk_index(base: &str, name: &str) -> Option<u64> {
    let rest = name.strip_prefix(base)?;
    if rest.is_empty() {
        return Some(0);
    }
    let digits = rest.strip_prefix("-part-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(digits.bytes().fold(0u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

/// The object's run lease, `captf-run-<suffix>`.
pub fn run_lease(suffix: &str) -> String {
    format!("captf-run-{suffix}")
}

/// The cluster write lease, `captf-cluster-<first 16 hex of
/// sha256("<namespace>/<cluster name>")>`.
pub fn cluster_write_lease(namespace: &str, cluster_name: &str) -> String {
    format!(
        "captf-cluster-{}",
        hash16(&format!("{namespace}/{cluster_name}"))
    )
}

/// The runner Job name, `captf-<ks>-<name>-<op>-a<attempt>-<hash6>`. When that
/// would pass [`JOB_NAME_MAX`], `<name>` becomes the first 16 hex of
/// `sha256(name)`; the hashed form always fits (at most 52 characters).
pub fn job(kind: Kind, name: &str, op: Op, attempt: NonZeroU32, hash6: &Hash6) -> String {
    let build = |name: &str| {
        format!(
            "captf-{}-{name}-{}-a{attempt}-{}",
            kind.short(),
            op.as_str(),
            hash6.as_str()
        )
    };
    let full = build(name);
    if full.len() <= JOB_NAME_MAX {
        full
    } else {
        build(&hash16(name))
    }
}

/// The per-run Secret of a Job, `captf-run-<job name>`.
pub fn run_secret(job_name: &str) -> String {
    format!("captf-run-{job_name}")
}

/// The credentials of a Job run from the manager's namespace: a copy of
/// the object's mirror beside the Job, `captf-run-<job name>-creds`.
pub fn run_credentials(job_name: &str) -> String {
    format!("captf-run-{job_name}-creds")
}

/// The durable inputs Secret, `captf-inputs-<ks>-<name>`.
pub fn inputs_secret(kind: Kind, name: &str) -> String {
    shortened(&format!("captf-inputs-{}-", kind.short()), name)
}

/// The credentials mirror of an identity, `captf-creds-<identity>`.
pub fn credentials_mirror(identity: &str) -> String {
    shortened("captf-creds-", identity)
}

/// The plan key Secret, `captf-plankey-<ks>-<name>`.
pub fn plan_key(kind: Kind, name: &str) -> String {
    shortened(&format!("captf-plankey-{}-", kind.short()), name)
}

/// The saved plan between a plan Job and its approved apply,
/// `captf-plan-<ks>-<name>` (beside the plan key; CONTRACT.md names none).
pub fn plan_secret(kind: Kind, name: &str) -> String {
    shortened(&format!("captf-plan-{}-", kind.short()), name)
}

/// `<prefix><name>`, or `<prefix><first 16 hex of sha256(name)>` when that
/// would not be a valid object name length.
fn shortened(prefix: &str, name: &str) -> String {
    if prefix.len() + name.len() <= OBJECT_NAME_MAX {
        format!("{prefix}{name}")
    } else {
        format!("{prefix}{}", hash16(name))
    }
}

/// The runner ServiceAccount, RoleBinding and ClusterRole.
pub const RUNNER_RBAC: &str = "captf-runner";

/// The runner ServiceAccount, in the manager's namespace, of the destroys
/// run there for the objects of `namespace` (a namespace being deleted):
/// `captf-runner-<first 16 hex of sha256(namespace)>`. One per namespace,
/// so that it is bound in that namespace only.
pub fn away_runner(namespace: &str) -> String {
    format!("{RUNNER_RBAC}-{}", hash16(namespace))
}

/// The value of the owner-name and cluster-name labels: the name itself when
/// it fits a label value (63 characters), else the first 16 hex of its
/// SHA-256.
pub fn label_value(name: &str) -> String {
    if name.len() <= LABEL_VALUE_MAX {
        name.to_owned()
    } else {
        hash16(name)
    }
}

/// Whether the label value `value` may be the hashed form [`label_value`]
/// gives a name too long for a label (16 lowercase hex characters).
pub fn may_be_label_hash(value: &str) -> bool {
    value.len() == 16
        && value
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `hostname` (the part of a lock's `Who` after the last `@`) is a pod
/// of one of this object's own runner Jobs: anchored at both ends,
/// `captf-<ks>-<name or its hash>-(apply|plan|destroy|refresh|drift|restore)-a[1-9][0-9]*-[0-9a-f]{6}-[a-z0-9]{5}`.
///
/// The tail is read from the right, where every part has a fixed shape, and
/// the Job name it leaves must be exactly the one [`job`] builds for that op,
/// attempt and hash6. So the hashed form of the name is accepted only where
/// [`job`] would use it, and a pod of object `foo-apply` never passes for one
/// of `foo`.
pub fn is_own_runner_pod(kind: Kind, name: &str, hostname: &str) -> bool {
    let Some((job_name, pod_suffix)) = hostname.rsplit_once('-') else {
        return false;
    };
    if pod_suffix.len() != 5
        || !pod_suffix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return false;
    }
    let Some((rest, hash6)) = job_name.rsplit_once('-') else {
        return false;
    };
    let Some(hash6) = Hash6::new(hash6) else {
        return false;
    };
    let Some((rest, attempt)) = rest.rsplit_once('-') else {
        return false;
    };
    let Some(attempt) = parse_attempt(attempt) else {
        return false;
    };
    let Some((_, op)) = rest.rsplit_once('-') else {
        return false;
    };
    let Some(op) = Op::parse(op) else {
        return false;
    };
    job(kind, name, op, attempt, &hash6) == job_name
}

/// `a[1-9][0-9]*` as an attempt number; one too large to have been built is
/// not ours.
fn parse_attempt(s: &str) -> Option<NonZeroU32> {
    let digits = s.strip_prefix('a')?;
    if digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests;
