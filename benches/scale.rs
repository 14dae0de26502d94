//! One manager over many objects at rest, against the real control plane.
//!
//! ```sh
//! cargo bench --bench scale
//! cargo bench --bench scale -- --objects 2000 --sync-period 30 --resyncs 10
//! ```
//!
//! `--objects` TerraformMachines (2,000 by default) and a tenth as many
//! TerraformClusters are created in a namespace whose identity lets no Job
//! start, each with a state written by hand in the backend's shape (a
//! module's worth of resources, 50 to 200 KiB compressed). Once every
//! object has read its state, the manager is left at rest for `--resyncs`
//! periods of `--sync-period` seconds. Printed:
//!
//! - API requests per object per resync, by verb and resource, read from
//!   the API server's own `apiserver_request_total` over the rest window,
//!   beside the same window measured before the manager started (what the
//!   control plane does by itself);
//! - the manager's resident set over the rest window (first, last, peak,
//!   and its growth per resync) against 64 MiB plus twice the largest
//!   state;
//! - the manager's CPU per pass at rest, and what a full resync of every
//!   object costs in CPU seconds;
//! - from writing a new serial into twenty states to their objects'
//!   status showing it (p50 and max).
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does
//! nothing: the bounded version is `tests/requests.rs`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use captf::api::{
    AllowedNamespaces, IdentityReference, SecretReference, TerraformCluster,
    TerraformClusterIdentity, TerraformClusterIdentitySpec, TerraformClusterSpec, TerraformMachine,
    TerraformMachineSpec, WorkspaceSpec,
};
use captf::names::{self, Kind};
use captf_testkit::manager::{Manager, install_crds, install_runner_role, metric_total};
use captf_testkit::scenario::{gzip, labels, noop, state_labels};
use captf_testkit::{controlplane, namespace};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

struct Options {
    objects: usize,
    sync_period: u64,
    resyncs: u64,
}

fn options() -> Options {
    let mut o = Options {
        objects: 2000,
        sync_period: 30,
        resyncs: 10,
    };
    let args: Vec<String> = std::env::args().collect();
    for pair in args.windows(2) {
        let value = pair[1].parse().ok();
        match (pair[0].as_str(), value) {
            ("--objects", Some(v)) => o.objects = v as usize,
            ("--sync-period", Some(v)) => o.sync_period = v,
            ("--resyncs", Some(v)) => o.resyncs = v,
            _ => {}
        }
    }
    o
}

/// A state as a module of `resources` instances leaves it: ids and
/// fingerprints that do not compress, attribute names and values that do.
fn state(serial: u64, resources: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut hex = |n: usize| {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b"0123456789abcdef"[(x % 16) as usize])
            })
            .collect::<String>()
    };
    let resources: Vec<_> = (0..resources)
        .map(|i| {
            json!({"mode": "managed", "type": "example_instance", "name": format!("node_{i}"),
                "provider": "provider[\"registry.opentofu.org/example/example\"]",
                "instances": [{"schema_version": 1, "attributes": {
                    "id": hex(32), "arn": format!("arn:example:instance/{}", hex(24)),
                    "fingerprint": hex(64), "ami": "ami-0123456789abcdef0",
                    "instance_type": "m5.large", "availability_zone": "eu-west-1a",
                    "private_ip": format!("10.0.{}.{}", i / 250, i % 250),
                    "tags": {"Name": format!("node-{i}"), "team": "platform", "env": "bench"},
                    "root_block_device": [{"volume_size": 50, "volume_type": "gp3",
                        "encrypted": true, "kms_key_id": hex(36)}]},
                    "sensitive_attributes": [], "private": hex(120)}]})
        })
        .collect();
    let doc = json!({"version": 4, "terraform_version": "1.12.6", "serial": serial,
        "lineage": format!("bench-{seed}"), "outputs": {"provider_id": {"value":
        format!("example:///{}", hex(16)), "type": "string"}}, "resources": resources});
    gzip(doc.to_string().as_bytes())
}

/// 50 to 200 KiB compressed, by object.
fn resources_of(i: usize) -> usize {
    // About 0.19 KiB compressed per resource.
    260 + (i * 37) % 780
}

async fn put_state(
    client: &kube::Client,
    ns: &str,
    kind: Kind,
    name: &str,
    cluster: &str,
    payload: Vec<u8>,
) {
    let suffix = names::suffix(ns, kind, name);
    let mut labels = state_labels(&suffix);
    labels.extend(captf::jobs::owner_labels(kind, name, Some(cluster)));
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(names::state_secret(&suffix)),
            labels: Some(labels),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("tfstate".into(), ByteString(payload))])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            &names::state_secret(&suffix),
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
}

/// `apiserver_request_total` by (verb, resource).
async fn api_requests(client: &kube::Client) -> BTreeMap<(String, String), f64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap();
    let mut by = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let label = |key: &str| {
            line.split(&format!("{key}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_owned()
        };
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let resource = match label("subresource").as_str() {
            "" => label("resource"),
            sub => format!("{}/{sub}", label("resource")),
        };
        *by.entry((label("verb"), resource)).or_default() += value;
    }
    by
}

fn delta(
    after: &BTreeMap<(String, String), f64>,
    before: &BTreeMap<(String, String), f64>,
) -> BTreeMap<(String, String), f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

fn observed(status: Option<&captf::api::WorkspaceStatus>) -> Option<i64> {
    status.and_then(|s| s.observed_state_serial)
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let o = options();
    let clusters_n = o.objects.div_ceil(10);
    let plane = controlplane::shared();
    let client = plane.client().await;
    install_crds(&client).await;
    install_runner_role(&client).await;
    let ns = namespace(&client, "bench-scale").await;
    let id = format!("id-{ns}");
    Api::<TerraformClusterIdentity>::all(client.clone())
        .create(
            &PostParams::default(),
            &TerraformClusterIdentity::new(
                &id,
                TerraformClusterIdentitySpec {
                    secret_ref: SecretReference {
                        name: "creds".into(),
                        namespace: ns.clone(),
                    },
                    allowed_namespaces: Some(AllowedNamespaces {
                        list: Some(vec!["elsewhere".into()]),
                        selector: None,
                    }),
                },
            ),
        )
        .await
        .unwrap();
    let workspace = || WorkspaceSpec {
        identity_ref: Some(IdentityReference { name: id.clone() }),
        ..noop(None)
    };

    // The states first, then the objects: each object's first pass reads
    // its state.
    let started = Instant::now();
    let mut largest = 0usize;
    let objects: Vec<(Kind, String, String)> = (0..clusters_n)
        .map(|c| (Kind::Cluster, format!("c-{c}"), format!("c-{c}")))
        .chain((0..o.objects).map(|m| (Kind::Machine, format!("m-{m}"), format!("c-{}", m / 10))))
        .collect();
    let states: Vec<_> = objects
        .iter()
        .enumerate()
        .map(|(i, (kind, name, cluster))| {
            let payload = state(1, resources_of(i), i as u64 + 1);
            largest = largest.max(payload.len());
            (*kind, name.clone(), cluster.clone(), payload)
        })
        .collect();
    let compressed: usize = states.iter().map(|s| s.3.len()).sum();
    futures::stream::iter(states)
        .map(|(kind, name, cluster, payload)| {
            let (client, ns) = (client.clone(), ns.clone());
            async move { put_state(&client, &ns, kind, &name, &cluster, payload).await }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    futures::stream::iter(objects.iter().cloned())
        .map(|(kind, name, cluster)| {
            let (client, ns, workspace) = (client.clone(), ns.clone(), workspace());
            async move {
                match kind {
                    Kind::Cluster => {
                        let mut c = TerraformCluster::new(
                            &name,
                            TerraformClusterSpec {
                                workspace,
                                ..Default::default()
                            },
                        );
                        c.metadata.labels = labels(&cluster);
                        Api::<TerraformCluster>::namespaced(client, &ns)
                            .create(&PostParams::default(), &c)
                            .await
                            .unwrap();
                    }
                    _ => {
                        let mut m = TerraformMachine::new(
                            &name,
                            TerraformMachineSpec {
                                workspace,
                                ..Default::default()
                            },
                        );
                        m.metadata.labels = labels(&cluster);
                        Api::<TerraformMachine>::namespaced(client, &ns)
                            .create(&PostParams::default(), &m)
                            .await
                            .unwrap();
                    }
                }
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let created = started.elapsed();

    // What the control plane does by itself over a window as long as the
    // rest window, before the manager starts.
    let window = Duration::from_secs(o.sync_period * o.resyncs);
    let baseline_before = api_requests(&client).await;
    tokio::time::sleep(window).await;
    let baseline = delta(&api_requests(&client).await, &baseline_before);

    let period = format!("--sync-period={}s", o.sync_period);
    let mut manager = Manager::start(plane, Path::new(MANAGER), &[&period]);
    let launched = Instant::now();
    manager.wait_ready().await;
    let machines = Api::<TerraformMachine>::namespaced(client.clone(), &ns);
    let clusters = Api::<TerraformCluster>::namespaced(client.clone(), &ns);
    loop {
        let params = ListParams::default();
        let m = machines.list(&params).await.unwrap().items;
        let c = clusters.list(&params).await.unwrap().items;
        let read = m
            .iter()
            .filter(|m| observed(m.status.as_ref().map(|s| &s.workspace)) == Some(1))
            .count()
            + c.iter()
                .filter(|c| observed(c.status.as_ref().map(|s| &s.workspace)) == Some(1))
                .count();
        if read == objects.len() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let caught_up = launched.elapsed();
    // One period for the passes of the catch-up to end.
    tokio::time::sleep(Duration::from_secs(o.sync_period)).await;

    let requests_before = api_requests(&client).await;
    let scrape_before = manager.metrics().await;
    let first = manager.usage();
    let (rss_first, cpu_before) = (first.rss_kib, first.cpu_seconds);
    let mut rss = vec![rss_first];
    let rest_started = Instant::now();
    while rest_started.elapsed() < window {
        tokio::time::sleep(Duration::from_secs(o.sync_period)).await;
        rss.push(manager.usage().rss_kib);
    }
    let last = manager.usage();
    let (rss_last, cpu_after) = (last.rss_kib, last.cpu_seconds);
    let at_rest = delta(&api_requests(&client).await, &requests_before);
    let scrape_after = manager.metrics().await;
    let passes = metric_total(&scrape_after, "controller_runtime_reconcile_total")
        - metric_total(&scrape_before, "controller_runtime_reconcile_total");
    let client_requests = metric_total(&scrape_after, "rest_client_requests_total")
        - metric_total(&scrape_before, "rest_client_requests_total");

    // A new serial in twenty states, to their objects' status.
    let mut latencies = Vec::new();
    for m in 0..20.min(o.objects) {
        let name = format!("m-{m}");
        let cluster = format!("c-{}", m / 10);
        let written = Instant::now();
        put_state(
            &client,
            &ns,
            Kind::Machine,
            &name,
            &cluster,
            state(2, resources_of(m), 7),
        )
        .await;
        loop {
            let seen = machines.get(&name).await.unwrap();
            if observed(seen.status.as_ref().map(|s| &s.workspace)) == Some(2) {
                latencies.push(written.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    latencies.sort();
    let peak = manager.usage().peak_kib;

    let n = objects.len() as f64;
    let resyncs = o.resyncs as f64;
    println!(
        "scale at rest: {} TerraformMachines and {clusters_n} TerraformClusters, --sync-period={}s, {} resyncs (the manager as cargo bench builds it)",
        o.objects, o.sync_period, o.resyncs
    );
    println!(
        "  states: {:.0} MiB compressed in all, largest {} KiB; created in {:.0} s; every state read {:.0} s after the manager started",
        compressed as f64 / (1024.0 * 1024.0),
        largest / 1024,
        created.as_secs_f64(),
        caught_up.as_secs_f64()
    );
    println!(
        "  API requests per object per resync (apiserver_request_total), at rest vs the control plane alone:"
    );
    let keys: std::collections::BTreeSet<_> = at_rest.keys().chain(baseline.keys()).collect();
    let (mut total, mut total_alone) = (0.0, 0.0);
    for key in keys {
        let with = at_rest.get(key).copied().unwrap_or(0.0);
        let alone = baseline.get(key).copied().unwrap_or(0.0);
        total += with;
        total_alone += alone;
        println!(
            "    {:<8} {:<40} {:>8.4} {:>8.4}",
            key.0,
            key.1,
            with / n / resyncs,
            alone / n / resyncs
        );
    }
    println!(
        "    {:<49} {:>8.4} {:>8.4}  (the manager's: {:.4}; its client counted {:.0} requests)",
        "all",
        total / n / resyncs,
        total_alone / n / resyncs,
        (total - total_alone).max(0.0) / n / resyncs,
        client_requests
    );
    let growth = (rss_last as f64 - rss_first as f64) / 1024.0 / resyncs;
    println!(
        "  manager RSS at rest: {} MiB first, {} MiB last ({growth:+.2} MiB per resync), samples {:?} MiB; peak {} MiB against a budget of {:.1} MiB (64 + twice the largest state)",
        rss_first / 1024,
        rss_last / 1024,
        rss.iter().map(|k| k / 1024).collect::<Vec<_>>(),
        peak / 1024,
        64.0 + 2.0 * largest as f64 / (1024.0 * 1024.0)
    );
    let cpu = cpu_after - cpu_before;
    println!(
        "  passes at rest: {passes:.0} ({:.2} per object per resync); manager CPU {cpu:.2} s: {:.0} µs per pass, {:.2} CPU s per resync of every object",
        passes / n / resyncs,
        cpu / passes.max(1.0) * 1e6,
        cpu / resyncs
    );
    if let (Some(p50), Some(max)) = (latencies.get(latencies.len() / 2), latencies.last()) {
        println!(
            "  state change to status: p50 {:.0} ms, max {:.0} ms over {} objects",
            p50.as_secs_f64() * 1000.0,
            max.as_secs_f64() * 1000.0,
            latencies.len()
        );
    }
    // The rows of `make bench`'s table.
    println!(
        "| scale ({} objects) | API requests per object per resync, the manager's | {:.4} | ≤ 0.1 |",
        objects.len(),
        (total - total_alone).max(0.0) / n / resyncs
    );
    println!(
        "| scale ({} objects) | manager RSS at rest, last (peak) | {} MiB ({} MiB) | ≤ {:.1} MiB |",
        objects.len(),
        rss_last / 1024,
        peak / 1024,
        64.0 + 2.0 * largest as f64 / (1024.0 * 1024.0)
    );
    println!(
        "| scale ({} objects) | RSS growth per resync at rest | {growth:+.2} MiB | 0 |",
        objects.len()
    );
    println!(
        "| scale ({} objects) | CPU for a resync of every object | {:.2} s | < 30 s |",
        objects.len(),
        cpu / resyncs
    );
    if let (Some(p50), Some(max)) = (latencies.get(latencies.len() / 2), latencies.last()) {
        println!(
            "| scale ({} objects) | state change to status, p50 (max) | {:.0} ms ({:.0} ms) | < 2000 ms |",
            objects.len(),
            p50.as_secs_f64() * 1000.0,
            max.as_secs_f64() * 1000.0
        );
    }
    manager.stop();
}
