//! The shipped alerts (config/prometheus/rules.yaml) under the real
//! Prometheus rule engine (promtool), fed from real scrapes of a manager
//! that ran a real scenario against the real control plane: each alert
//! fires on the situation it names, and none fires on the healthy manager.
//!
//! One manager: a healthy cluster and machines, scraped once they have
//! applied and passed a drift check; then, at once, the drift of the
//! cluster, failing applies, a stale lock and a failing destroy, a corrupt
//! state, and a machine whose state and inputs are near their limits,
//! scraped once every one shows in the metrics. promtool's files are left
//! in `$CARGO_TARGET_TMPDIR/alerts` for a look.

#[path = "alerts/cases.rs"]
mod cases;
#[path = "alerts/scrape.rs"]
mod scrape;

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use captf::api::{IdentityReference, TerraformCluster, TerraformMachine, WorkspaceSpec};
use captf::names::Kind;
use captf_testkit::scenario::*;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use cases::{CLUSTER, MACHINE, Rules};
use scrape::Scrape;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

#[tokio::test]
async fn each_alert_fires_on_its_situation_and_none_on_a_healthy_manager() {
    let env = setup(MANAGER, "alerts", &[], &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let world = dir.path().join("world");
    std::fs::write(&world, "one").unwrap();
    let gate = dir.path().join("gate");
    std::fs::write(&gate, "").unwrap();

    // Healthy: a cluster checked for drift every 15 s (its module reads
    // `world`), a machine, and a machine whose destroy will fail while
    // `gate` exists.
    env.cluster("c", NOOP, vars(&[("drift_file", json!(world))]))
        .await;
    env.api::<TerraformCluster>()
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"drift": {"intervalSeconds": 15}}})),
        )
        .await
        .unwrap();
    env.machine("ok", "c", None).await;
    env.machine("gate", "c", vars(&[("destroy_gate", json!(gate))]))
        .await;
    for m in ["ok", "gate"] {
        within(&env, 240, &format!("machine {m} applied"), || async {
            env.machine_status(m).await.filter(applied)
        })
        .await;
    }
    within(&env, 240, "cluster c applied and checked", || async {
        env.cluster_status("c")
            .await
            .filter(|s| applied(s) && condition(s, "DriftDetected") == Some(("False", "NoDrift")))
    })
    .await;
    let drift_success = [("kind", CLUSTER), ("name", "c"), ("op", "drift")];
    let healthy = within(&env, 60, "the drift success in the metrics", || async {
        let s = Scrape::parse(env.manager.metrics().await);
        s.value("captf_last_success_timestamp_seconds", &drift_success)
            .is_some()
            .then_some(s)
    })
    .await;

    // Everything goes wrong at once.
    std::fs::write(&world, "two").unwrap();
    // A lock on gate's state held by one of its own runner pods, which does
    // not exist: stale, so its destroy force-unlocks it, then fails while
    // `gate` exists. (A lock without a state, before any apply, would
    // fail the Job's init instead.)
    put_lock(&env, "gate", "runner@captf-m-gate-apply-a9-abcdef-zzzzz").await;
    env.delete::<TerraformMachine>("gate").await;
    for i in 0..3 {
        env.machine(&format!("fail-{i}"), "c", vars(&[("fail", json!(true))]))
            .await;
    }
    // The identity of these two allows another namespace only, so no Job
    // ever starts and their states stay as written.
    let denied = format!("denied-{}", env.ns);
    env.identity_allowing(&denied, "elsewhere").await;
    let workspace = |variables| WorkspaceSpec {
        identity_ref: Some(IdentityReference {
            name: denied.clone(),
        }),
        ..noop(variables)
    };
    put_state(&env, Kind::Machine, "bad", b"\x1f\x8b\x08\x00garbage").await;
    env.create_machine("bad", "c", workspace(None)).await;
    put_state(&env, Kind::Machine, "big", &big_state(940 * 1024)).await;
    let message = "x".repeat(950_000);
    env.create_machine("big", "c", workspace(vars(&[("message", json!(message))])))
        .await;

    let bad = within(&env, 300, "every situation in the metrics", || async {
        let s = Scrape::parse(env.manager.metrics().await);
        let failed = |op| [("kind", MACHINE), ("op", op), ("result", "failed")];
        let big = [("kind", MACHINE), ("name", "big")];
        let ready = s.value("captf_jobs_total", &failed("apply")) >= Some(3.0)
            && s.value("captf_jobs_total", &failed("destroy")).is_some()
            && s.value("captf_drift_detected", &[("kind", CLUSTER), ("name", "c")]) == Some(1.0)
            && s.value(
                "captf_state_read_errors_total",
                &[("kind", MACHINE), ("reason", "corrupt")],
            )
            .is_some()
            && s.value("captf_lock_force_unlocks_total", &[("kind", MACHINE)])
                .is_some()
            && s.value("captf_state_bytes", &big).is_some()
            && s.value("captf_inputs_bytes", &big).is_some();
        ready.then_some(s)
    })
    .await;

    promtool(&healthy, &bad, &env.ns);
}

/// Writes the rule file and one unit-test file per alert plus the healthy
/// one, and runs `promtool check rules` and `promtool test rules`.
fn promtool(healthy: &Scrape, bad: &Scrape, ns: &str) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/prometheus/rules.yaml");
    let rule: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    // promtool reads plain rule files: the PrometheusRule's spec.
    let groups = json!({"groups": rule["spec"]["groups"]});
    let rules = Rules(
        groups["groups"][0]["rules"]
            .as_array()
            .expect("the rules of the first group")
            .clone(),
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("alerts");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // JSON is YAML, and leaves no doubt about which scalars are strings.
    let write = |name: &str, doc: &serde_json::Value| {
        let file = dir.join(name);
        std::fs::write(&file, serde_json::to_string_pretty(doc).unwrap()).unwrap();
        file
    };
    let rule_file = write("rules.yaml", &groups);
    std::fs::write(dir.join("healthy.txt"), &healthy.text).unwrap();
    std::fs::write(dir.join("situations.txt"), &bad.text).unwrap();
    run(
        &dir,
        &[
            OsStr::new("check"),
            OsStr::new("rules"),
            rule_file.as_os_str(),
        ],
    );

    let cases = cases::cases(bad, ns);
    let mut tested: Vec<&str> = cases.iter().map(|c| c.alert).collect();
    tested.sort();
    let mut shipped = rules.names();
    shipped.sort();
    assert_eq!(tested, shipped, "one case per shipped alert");
    let mut files = vec![write("healthy.test.yaml", &cases::healthy(healthy, &rules))];
    for case in &cases {
        files.push(write(
            &format!("{}.test.yaml", case.alert),
            &case.document(&rules),
        ));
    }
    let mut args = vec![OsStr::new("test"), OsStr::new("rules")];
    args.extend(files.iter().map(|f| f.as_os_str()));
    run(&dir, &args);
}

fn run(dir: &Path, args: &[&OsStr]) {
    let out = Command::new(captf_testkit::controlplane::binary("promtool"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {args:?} failed ({}); its files are in {}:\n{text}",
        out.status,
        dir.display()
    );
    println!("promtool {args:?}:\n{text}");
}
