//! Crash anywhere (issue 19, item 14): the manager is killed with SIGKILL
//! at seeded random moments, at least [`KILLS`] times, while 20 objects
//! apply, back up, re-apply changed inputs, restore, are created and are
//! deleted, and a new manager is started each time. At the end every
//! object is where it was asked to be, no decision ran two Jobs (one
//! deleted as stuck never ran), no backup set is partial, no state Secret
//! was lost, and no once-only event was published twice.
//!
//! `CAPTF_CRASH_SEED` replays a run (the seed is printed).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use captf::api::{TerraformCluster, TerraformMachine};
use captf::backups;
use captf::names::{self, Kind};
use captf_testkit::scenario::*;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

/// Kills over the run, at least.
const KILLS: usize = 50;
/// The manager lives this long (uniform, after it is ready) before a kill.
const LIFE_MS: (u64, u64) = (150, 2500);

/// The machines there from the start: m0..m4 restore, m5..m13 are
/// deleted; m14..m18 are created later. The cluster's variables change
/// (a machine's are immutable).
const MACHINES: usize = 14;
const RESTORED: std::ops::Range<usize> = 0..5;
const DELETED: std::ops::Range<usize> = 5..MACHINES;
const ADDED: std::ops::Range<usize> = MACHINES..19;

/// Each apply and destroy takes a few seconds, so that Jobs run across
/// several managers' lives.
fn slow() -> (&'static str, serde_json::Value) {
    ("sleep_seconds", json!(3))
}

/// SplitMix64: a seeded sequence of kill moments.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn between(&mut self, (low, high): (u64, u64)) -> u64 {
        low + self.next() % (high - low)
    }
}

struct Crasher {
    rng: Rng,
    kills: usize,
}

impl Crasher {
    /// Waits up to `secs` for `probe`, killing the manager at random
    /// moments meanwhile and starting a new one each time.
    async fn until<T>(
        &mut self,
        env: &mut Env,
        secs: u64,
        what: &str,
        mut probe: impl AsyncFnMut(&Env) -> Result<T, String>,
    ) -> T {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let kill_at = Instant::now() + Duration::from_millis(self.rng.between(LIFE_MS));
            while Instant::now() < kill_at {
                let missing = match probe(env).await {
                    Ok(v) => return v,
                    Err(missing) => missing,
                };
                assert!(
                    Instant::now() < deadline,
                    "timed out after {secs}s ({} kills) waiting for {what}: {missing}{}",
                    self.kills,
                    env.context()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.kill(env).await;
        }
    }

    async fn kill(&mut self, env: &mut Env) {
        env.manager.kill();
        self.kills += 1;
        env.manager = env.start_manager(&[]).await;
    }
}

const RESTORE: &str = "captf.io/restore-state";

/// New cluster inputs for `round`, and a restore of each restored
/// machine's current serial.
async fn ask_changes(env: &Env, round: usize, serials: &BTreeMap<usize, u64>) {
    let patch = json!({"spec": {"variables": {"greeting": format!("round-{round}")}}});
    env.api::<TerraformCluster>()
        .patch("c", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    for i in RESTORED {
        let patch = json!({"metadata": {"annotations": {RESTORE: serials[&i].to_string()}}});
        env.api::<TerraformMachine>()
            .patch(&machine(i), &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }
}

fn machine(i: usize) -> String {
    format!("m{i}")
}

/// Applied, and its newest backup is its observed serial; or what is not.
async fn at_rest<K: captf::controllers::workload::Workload>(
    env: &Env,
    name: &str,
) -> Result<u64, String> {
    let s = env
        .status::<K>(name)
        .await
        .ok_or(format!("{name}: no status"))?;
    if !applied(&s) {
        return Err(format!("{name}: not applied: {:?}", s.conditions));
    }
    let newest = s
        .state_backups
        .as_ref()
        .and_then(|b| b.first())
        .map(|b| b.serial);
    match (newest, s.observed_state_serial) {
        (Some(newest), Some(observed)) if newest == observed => Ok(newest as u64),
        _ => Err(format!(
            "{name}: newest backup {newest:?}, observed serial {:?}",
            s.observed_state_serial
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_anywhere_the_manager_loses_and_repeats_nothing() {
    let seed = std::env::var("CAPTF_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x00c0_ffee);
    eprintln!("CAPTF_CRASH_SEED={seed}");
    let mut crasher = Crasher {
        rng: Rng(seed),
        kills: 0,
    };
    let mut env = setup(MANAGER, "crash", &[("API_TOKEN", "t0ken-crash")], &[]).await;
    let jobs = JobsSeen::watch(&env);
    let started = Instant::now();

    // Apply and back up fifteen objects.
    env.cluster("c", NOOP, vars(&[("greeting", json!("one")), slow()]))
        .await;
    for i in 0..MACHINES {
        env.machine(&machine(i), "c", vars(&[("size", json!("small")), slow()]))
            .await;
    }
    let (cluster_first, first): (u64, BTreeMap<usize, u64>) = crasher
        .until(
            &mut env,
            600,
            "every object applied and backed up",
            async |env| {
                let cluster = at_rest::<TerraformCluster>(env, "c").await?;
                let mut serials = BTreeMap::new();
                for i in 0..MACHINES {
                    serials.insert(i, at_rest::<TerraformMachine>(env, &machine(i)).await?);
                }
                Ok((cluster, serials))
            },
        )
        .await;
    eprintln!(
        "applied and backed up after {} kills, {:.0}s",
        crasher.kills,
        started.elapsed().as_secs_f64()
    );

    // Round 0: new inputs for the cluster, a restore of the current serial
    // for some machines, others deleted, and new ones. Then rounds of new
    // cluster inputs and restores until the kills are done, so that each
    // kill lands while work is under way.
    for i in DELETED {
        env.delete::<TerraformMachine>(&machine(i)).await;
    }
    for i in ADDED {
        env.machine(&machine(i), "c", vars(&[("size", json!("small")), slow()]))
            .await;
    }
    let (mut cluster_serial, mut serials) = (cluster_first, first);
    let mut round = 0;
    while round == 0 || crasher.kills < KILLS {
        ask_changes(&env, round, &serials).await;
        (cluster_serial, serials) = crasher
            .until(
                &mut env,
                300,
                &format!("round {round}: the changes applied, the restores done, the deleted gone"),
                async |env| {
                    let cluster = at_rest::<TerraformCluster>(env, "c").await?;
                    if cluster <= cluster_serial {
                        return Err(format!("c: serial {cluster}, was {cluster_serial}"));
                    }
                    for i in ADDED {
                        at_rest::<TerraformMachine>(env, &machine(i)).await?;
                    }
                    let mut restored = BTreeMap::new();
                    for i in RESTORED {
                        let name = machine(i);
                        let serial = at_rest::<TerraformMachine>(env, &name).await?;
                        if serial <= serials[&i] {
                            let runs = jobs.named(&format!("captf-m-{name}-"));
                            return Err(format!(
                                "{name}: serial {serial}, was {}; Jobs {runs:?}",
                                serials[&i]
                            ));
                        }
                        let m = env
                            .api::<TerraformMachine>()
                            .get(&name)
                            .await
                            .map_err(|e| format!("{name}: {e}"))?;
                        if m.annotations().contains_key(RESTORE) {
                            return Err(format!("{name}: the restore annotation is still there"));
                        }
                        restored.insert(i, serial);
                    }
                    for i in DELETED {
                        if !env.gone::<TerraformMachine>(&machine(i)).await {
                            return Err(format!("{} is not gone", machine(i)));
                        }
                    }
                    Ok((cluster, restored))
                },
            )
            .await;
        eprintln!(
            "round {round} done after {} kills, {:.0}s",
            crasher.kills,
            started.elapsed().as_secs_f64()
        );
        round += 1;
    }

    // Every remaining object at rest, its state Secret there, every backup
    // set whole.
    let remaining: Vec<(Kind, String)> = std::iter::once((Kind::Cluster, "c".to_string()))
        .chain(RESTORED.chain(ADDED).map(|i| (Kind::Machine, machine(i))))
        .collect();
    within(&env, 240, "every remaining object at rest", || async {
        at_rest::<TerraformCluster>(&env, "c").await.ok()?;
        for i in RESTORED.chain(ADDED) {
            at_rest::<TerraformMachine>(&env, &machine(i)).await.ok()?;
        }
        Some(())
    })
    .await;
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for (kind, name) in &remaining {
        let suffix = env.suffix(*kind, name);
        assert!(
            secrets
                .iter()
                .any(|s| s.name_any() == names::state_secret(&suffix)),
            "{name}: its state Secret is gone"
        );
        let sets = backups::list(&secrets, &suffix);
        assert!(!sets.is_empty(), "{name}: no backup");
        assert!(
            sets.iter().all(|s| s.complete),
            "{name}: a partial backup set: {sets:?}"
        );
    }
    for i in DELETED {
        let suffix = env.suffix(Kind::Machine, &machine(i));
        assert!(
            env.state_secrets(&suffix).await.is_empty(),
            "{}: its state Secrets outlived it",
            machine(i)
        );
    }

    let events = Api::<Event>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    // A Job the manager deleted as stuck never ran a container: its per-run
    // Secret was never created (a kill between the two writes), and a
    // container could not start without it (ref §8.1 step 7). The object
    // then decides anew, at the same attempt, under a new name when its
    // inputs changed meanwhile (the cluster's outputs do here).
    let stuck: Vec<String> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("StuckJobDeleted"))
        .filter_map(|e| e.related.as_ref()?.name.clone())
        .collect();
    eprintln!("Jobs deleted as stuck: {stuck:?}");

    // No decision ran two Jobs: one Job per object, operation and attempt.
    let every: Vec<(Kind, String)> = remaining
        .iter()
        .cloned()
        .chain(DELETED.map(|i| (Kind::Machine, machine(i))))
        .collect();
    let mut decisions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (kind, name) in &every {
        let prefix = format!("captf-{}-{name}-", kind.short());
        for (job, _) in jobs.named(&prefix) {
            if stuck.contains(&job) {
                continue;
            }
            let Some(rest) = job.strip_prefix(&prefix) else {
                continue;
            };
            // <op>-a<attempt>-<hash>
            let decision = rest.rsplit_once('-').map_or(rest, |(d, _)| d);
            decisions
                .entry(format!("{name}/{decision}"))
                .or_default()
                .push(job);
        }
    }
    let twice: Vec<_> = decisions.iter().filter(|(_, j)| j.len() > 1).collect();
    assert!(twice.is_empty(), "decisions with two Jobs: {twice:?}");

    // Once-only events, each published once: per Job, per backed-up
    // serial, per restore, per destroy.
    let mut published: BTreeMap<(String, String, String, String), i32> = BTreeMap::new();
    for e in &events {
        let reason = e.reason.clone().unwrap_or_default();
        if ![
            "JobCreated",
            "JobSucceeded",
            "StateBackedUp",
            "StateRestored",
            "StateAdopted",
            "Destroyed",
            "FinalizerRemoved",
        ]
        .contains(&reason.as_str())
        {
            continue;
        }
        let about = e
            .regarding
            .as_ref()
            .and_then(|r| r.name.clone())
            .unwrap_or_default();
        // A note about a Job names it as the related object.
        let related = e
            .related
            .as_ref()
            .and_then(|r| r.name.clone())
            .unwrap_or_default();
        let count = e.series.as_ref().map_or(1, |s| s.count);
        *published
            .entry((about, reason, related, e.note.clone().unwrap_or_default()))
            .or_default() += count;
    }
    let repeated: Vec<_> = published.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "once-only events published more than once: {repeated:#?}"
    );
    for i in RESTORED {
        assert!(
            published
                .keys()
                .any(|(about, reason, ..)| *about == machine(i) && reason == "StateRestored"),
            "{}: no StateRestored",
            machine(i)
        );
    }
    eprintln!(
        "done after {} kills in {:.0}s",
        crasher.kills,
        started.elapsed().as_secs_f64()
    );
    env.manager.stop();
}
