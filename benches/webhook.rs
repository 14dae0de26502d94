//! The webhook over TLS on loopback: requests per second and p50/p99
//! latency of `POST /validate` (the real route: read and parse the
//! AdmissionReview, run the rules of `Webhooks::offline()`, i.e. every rule
//! that needs no API server, serialize the answer) next to a bare route on
//! the same server, same TLS and same listener, that reads the body and
//! answers fixed bytes. The ratio is what validation costs. Each case (a
//! CREATE and an UPDATE of each workload kind, every body allowed) runs
//! against /bare with the same body, connections and request count.
//!
//! Then memory: one request at a time sent in process through the router
//! (no TLS), with a counting global allocator; the peak heap growth during
//! the request is reported against the body's size, for a realistic 3 MiB
//! UPDATE, a hostile 3 MiB body (a 1.5M-element array in spec.variables)
//! and UPDATEs whose objects hold just under the cap on JSON values in the
//! shapes that cost most to decode.
//!
//! ```sh
//! cargo bench --bench webhook
//! cargo bench --bench webhook -- --requests 20000 --connections 4 --rounds 3
//! ```
//!
//! The server runs on a runtime with one worker thread and the client on
//! another, so that on a two-core machine each has a core. Every connection
//! is HTTP/2 (what the API server speaks to webhooks) and sends its requests
//! one after another; handshakes happen before the clock starts.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, header};
use axum::routing::post;
use captf::server::dev_certs::DevCa;
use captf::server::listeners::serve;
use captf::server::tls::{self, ReloadingCert};
use captf::server::webhook::{self, BODY_LIMIT};
use captf::webhooks::decode::{MAX_VALUES, OBJECT_WEIGHT};
use captf::webhooks::handler::Webhooks;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use serde_json::{Value, json};
use tikv_jemallocator::Jemalloc;
use tokio::sync::watch;
use tokio_rustls::TlsConnector;
use tower::ServiceExt;

const BARE_ANSWER: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"x","allowed":true}}"#;

/// The manager's allocator (jemalloc), counting the heap's growth while
/// [`COUNTING`] is on. Off (the throughput rounds), it costs one relaxed
/// load per call.
struct CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

static COUNTING: AtomicBool = AtomicBool::new(false);
/// Bytes allocated minus bytes freed since counting started (frees of older
/// blocks make it negative), and its highest value.
static GROWTH: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn grew(bytes: isize) {
    if COUNTING.load(Ordering::Relaxed) {
        let now = GROWTH.fetch_add(bytes, Ordering::Relaxed) + bytes;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

// SAFETY: every call goes to `Jemalloc` unchanged; the counting only reads
// sizes.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { Jemalloc.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size() as isize);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { Jemalloc.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { Jemalloc.dealloc(ptr, layout) };
        grew(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { Jemalloc.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            grew(new_size as isize - layout.size() as isize);
        }
        new
    }
}

struct Options {
    requests: usize,
    connections: usize,
    rounds: usize,
}

fn options() -> Options {
    let mut options = Options {
        requests: 20_000,
        connections: 4,
        rounds: 3,
    };
    let args: Vec<String> = std::env::args().collect();
    // cargo passes --bench; anything unknown is ignored.
    for pair in args.windows(2) {
        let value = pair[1].parse().ok();
        match (pair[0].as_str(), value) {
            ("--requests", Some(v)) => options.requests = v,
            ("--connections", Some(v)) => options.connections = v,
            ("--rounds", Some(v)) => options.rounds = v,
            _ => {}
        }
    }
    options
}

const GROUP_VERSION: &str = "infrastructure.cluster.x-k8s.io/v1alpha1";

/// `count` module variables, each value `value(i)`.
fn variables(count: usize, value: impl Fn(usize) -> Value) -> Value {
    let variables: serde_json::Map<String, Value> = (0..count)
        .map(|i| (format!("variable_{i:03}"), value(i)))
        .collect();
    Value::Object(variables)
}

fn short_values(count: usize, generation: u64) -> Value {
    variables(count, |i| {
        json!(format!("value-{i}-of-a-realistic-length-gen-{generation}"))
    })
}

/// An object of `kind` as the API server sends it: with managed fields, the
/// last-applied annotation, owner and labels, and `spec`.
fn object(kind: &str, name: &str, generation: u64, owner: (&str, &str), spec: Value) -> Value {
    json!({
        "apiVersion": GROUP_VERSION,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "clusters",
            "uid": "7a5c7a54-2b1f-4f52-a4b4-4a0f0c7e9f11",
            "resourceVersion": format!("{}", 41_000 + generation),
            "generation": generation,
            "creationTimestamp": "2025-06-01T10:00:00Z",
            "labels": {"cluster.x-k8s.io/cluster-name": "prod-eu-1", "team": "platform"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": spec.to_string()},
            "ownerReferences": [{"apiVersion": owner.0, "kind": owner.1, "name": name, "uid": "0f7d2f7e-8f5a-4a51-9a63-3c5f0b1d2e3a", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": GROUP_VERSION, "time": "2025-06-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:source": {"f:image": {}}, "f:variables": {}}}}]
        },
        "spec": spec
    })
}

/// The AdmissionReview around `object` (and `old` on UPDATE).
fn review(kind: &str, resource: &str, object: &Value, old: Option<&Value>) -> Bytes {
    let (operation, options) = match old {
        None => ("CREATE", "CreateOptions"),
        Some(_) => ("UPDATE", "UpdateOptions"),
    };
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "kind": kind},
            "resource": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "resource": resource},
            "requestKind": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "kind": kind},
            "requestResource": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1alpha1", "resource": resource},
            "name": object["metadata"]["name"],
            "namespace": "clusters",
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:capi-system:capi-controller-manager", "uid": "3c1f", "groups": ["system:serviceaccounts", "system:serviceaccounts:capi-system", "system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": options, "fieldManager": "kubectl"}
        }
    });
    Bytes::from(review.to_string())
}

fn cluster_spec(variables: Value) -> Value {
    json!({
        "source": {"image": "registry.example/infra/network-module:v1.4.2", "imagePullPolicy": "IfNotPresent"},
        "variables": variables,
        "identityRef": {"name": "platform-credentials"},
        "jobs": {"activeDeadlineSeconds": 3600, "lockTimeoutSeconds": 300, "env": [{"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"}]},
        "drift": {"intervalSeconds": 1800, "action": "Report"},
        "applyPolicy": "Automatic"
    })
}

fn cluster(generation: u64, variables: Value) -> Value {
    let owner = ("cluster.x-k8s.io/v1beta2", "Cluster");
    object(
        "TerraformCluster",
        "prod-eu-1",
        generation,
        owner,
        cluster_spec(variables),
    )
}

fn machine(provider_id: Option<&str>) -> Value {
    let mut spec = json!({
        "source": {"image": "registry.example/infra/vm-module:v2.0.1", "imagePullPolicy": "IfNotPresent"},
        "variables": short_values(16, 1),
        "variablesFrom": [{"configMapRef": {"name": "vm-sizes"}, "optional": false, "format": "JSON"}],
        "jobs": {"lockTimeoutSeconds": 120}
    });
    if let Some(id) = provider_id {
        spec["providerID"] = json!(id);
    }
    let owner = ("cluster.x-k8s.io/v1beta2", "Machine");
    object("TerraformMachine", "prod-eu-1-md-0-x7k2p", 1, owner, spec)
}

fn machine_pool(generation: u64, provider_ids: &[&str]) -> Value {
    let mut spec = json!({
        "source": {"image": "registry.example/infra/pool-module:v1.1.0", "imagePullPolicy": "IfNotPresent"},
        "variables": short_values(20, generation),
        "drift": {"intervalSeconds": 600, "action": "Report"}
    });
    if !provider_ids.is_empty() {
        spec["providerIDList"] = json!(provider_ids);
    }
    let owner = ("cluster.x-k8s.io/v1beta2", "MachinePool");
    object(
        "TerraformMachinePool",
        "prod-eu-1-pool-0",
        generation,
        owner,
        spec,
    )
}

/// A CREATE and an UPDATE of each workload kind, each of them allowed.
fn cases() -> Vec<(&'static str, Bytes)> {
    let (clusters, machines, pools) = (
        "terraformclusters",
        "terraformmachines",
        "terraformmachinepools",
    );
    let cluster_v1 = cluster(1, short_values(24, 1));
    let cluster_v2 = cluster(2, short_values(24, 2));
    let machine_old = machine(None);
    let machine_new = machine(Some("aws:///eu-west-1a/i-0abc"));
    let pool_v1 = machine_pool(1, &[]);
    let pool_v2 = machine_pool(2, &["aws:///eu-west-1a/i-1", "aws:///eu-west-1b/i-2"]);
    vec![
        (
            "TerraformCluster CREATE",
            review("TerraformCluster", clusters, &cluster_v1, None),
        ),
        (
            "TerraformCluster UPDATE",
            review("TerraformCluster", clusters, &cluster_v2, Some(&cluster_v1)),
        ),
        (
            "TerraformMachine CREATE",
            review("TerraformMachine", machines, &machine_old, None),
        ),
        (
            "TerraformMachine UPDATE",
            review(
                "TerraformMachine",
                machines,
                &machine_new,
                Some(&machine_old),
            ),
        ),
        (
            "TerraformMachinePool CREATE",
            review("TerraformMachinePool", pools, &pool_v1, None),
        ),
        (
            "TerraformMachinePool UPDATE",
            review("TerraformMachinePool", pools, &pool_v2, Some(&pool_v1)),
        ),
    ]
}

/// A realistic largest UPDATE: as many variables of long values (PEM-like
/// text of 6.5 KB) as fit the body limit in an object and its old version,
/// with the last-applied annotation (a second copy of the spec) in each.
fn large_update() -> Bytes {
    let pem = |i: usize, generation: u64| {
        let line: String = format!(
            "{i:04}{generation:02}{}",
            "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo".repeat(2)
        )
        .chars()
        .take(64)
        .collect();
        format!(
            "-----BEGIN CERTIFICATE-----\n{}-----END CERTIFICATE-----\n",
            format!("{line}\n").repeat(100)
        )
    };
    let build = |count: usize| {
        let old = cluster(7, variables(count, |i| json!(pem(i, 7))));
        let new = cluster(8, variables(count, |i| json!(pem(i, 8))));
        review("TerraformCluster", "terraformclusters", &new, Some(&old))
    };
    (1..=256)
        .rev()
        .map(build)
        .find(|body| body.len() <= BODY_LIMIT)
        .expect("one variable fits")
}

/// 3 MB of JSON that is 1.5M values: an array of zeros in spec.variables.
fn hostile_create() -> Bytes {
    let zeros = format!("[{}]", vec!["0"; 1_500_000].join(","));
    let spec = cluster_spec(json!({"list": "LIST"}));
    let object = object(
        "TerraformCluster",
        "prod-eu-1",
        1,
        ("cluster.x-k8s.io/v1beta2", "Cluster"),
        spec,
    );
    let body = review("TerraformCluster", "terraformclusters", &object, None);
    // Spliced in as text: a Value of it would be the very tree at stake.
    let body = String::from_utf8_lossy(&body).replacen("\"LIST\"", &zeros, 1);
    Bytes::from(body)
}

/// An UPDATE whose objects each hold just under [`MAX_VALUES`] in
/// `spec.variables.list`, as `values` (JSON text) repeated: the shapes that
/// cost most to decode per value counted.
fn at_the_cap(value: &str, counted: usize) -> Bytes {
    // The rest of each object counts fewer than 500.
    let list = format!("[{}]", vec![value; (MAX_VALUES - 500) / counted].join(","));
    let old = cluster(1, json!({"list": "LIST"}));
    let new = cluster(2, json!({"list": "LIST"}));
    let body = review("TerraformCluster", "terraformclusters", &new, Some(&old));
    // Spliced in as text into spec.variables (the annotation's copy of the
    // spec is escaped, so it does not match).
    Bytes::from(String::from_utf8_lossy(&body).replace("\"LIST\"", &list))
}

struct Round {
    rps: f64,
    p50: Duration,
    p99: Duration,
}

async fn connect(port: u16, config: Arc<ClientConfig>) -> SendRequest<Full<Bytes>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    // As Go's HTTP client, which the API server uses, does.
    tcp.set_nodelay(true).expect("TCP_NODELAY");
    let tls = TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").expect("a DNS name"), tcp)
        .await
        .expect("TLS handshake");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    sender
}

async fn round(
    port: u16,
    config: &Arc<ClientConfig>,
    path: &'static str,
    body: &Bytes,
    options: &Options,
) -> Round {
    let per_connection = options.requests / options.connections;
    let mut senders = Vec::new();
    for _ in 0..options.connections {
        senders.push(connect(port, config.clone()).await);
    }
    let started = Instant::now();
    let workers: Vec<_> = senders
        .into_iter()
        .map(|mut sender| {
            let body = body.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_connection);
                for _ in 0..per_connection {
                    let request = Request::post(format!("https://localhost:{port}{path}"))
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Full::new(body.clone()))
                        .expect("a request");
                    let sent = Instant::now();
                    let response = sender.send_request(request).await.expect("a response");
                    assert!(
                        response.status().is_success(),
                        "{path}: {}",
                        response.status()
                    );
                    response.into_body().collect().await.expect("a body");
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for worker in workers {
        latencies.extend(worker.await.expect("a worker"));
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Round {
        rps: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A whole response body.
async fn read_all<B>(body: B) -> Bytes
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    body.collect().await.expect("a body").to_bytes()
}

/// Sends `body` to `path` through `router` in process, one request alone:
/// the peak heap growth while it is served, the time it took, the answer.
async fn measure(router: &Router, path: &str, body: &Bytes) -> (isize, Duration, Value) {
    let request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.clone()))
        .expect("a request");
    let service = router.clone();
    GROWTH.store(0, Ordering::SeqCst);
    PEAK.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let response = service.oneshot(request).await.expect("a response");
    let answer = read_all(response.into_body()).await;
    let elapsed = started.elapsed();
    COUNTING.store(false, Ordering::SeqCst);
    let answer = serde_json::from_slice(&answer).expect("an AdmissionReview");
    (PEAK.load(Ordering::SeqCst), elapsed, answer)
}

/// The memory figures, and their rows for `make bench`'s table.
async fn memory(router: &Router) -> Vec<String> {
    let mut rows = Vec::new();
    println!(
        "memory: one request at a time, in process (no TLS); peak heap growth while it is served, \u{f7} body size (median of 3)"
    );
    let nested = format!("{}0{}", r#"{"a":"#.repeat(100), "}".repeat(100));
    let cases = [
        (
            "(a) TerraformCluster UPDATE, large variables",
            large_update(),
            true,
        ),
        (
            "(b) hostile CREATE, 1.5M-element array",
            hostile_create(),
            false,
        ),
        ("(c) UPDATE at the cap, zeros", at_the_cap("0", 1), true),
        (
            "(d) UPDATE at the cap, nested one-key objects",
            at_the_cap(&nested, 100 * (OBJECT_WEIGHT + 1) + 1),
            true,
        ),
    ];
    for (name, body, allowed) in cases {
        let mut runs = Vec::new();
        for _ in 0..3 {
            let (peak, elapsed, answer) = measure(router, "/validate", &body).await;
            assert_eq!(
                answer["response"]["allowed"], allowed,
                "{name}: {}",
                answer["response"]["status"]["message"]
            );
            runs.push((peak, elapsed));
        }
        runs.sort();
        let (peak, _) = runs[1];
        let elapsed = median(runs.iter().map(|r| r.1.as_secs_f64() * 1e3).collect());
        println!(
            "{name:<46} body {:>9} B  {:<7}  peak {:>10} B  {:>6.2}x body  {:>7.2} ms",
            body.len(),
            if allowed { "allowed" } else { "refused" },
            peak,
            peak as f64 / body.len() as f64,
            elapsed
        );
        rows.push(format!(
            "| webhook | peak heap of one request ÷ body, {} | {:.2} ({:.1} MB) | ≤ 3 |",
            &name[4..],
            peak as f64 / body.len() as f64,
            peak as f64 / 1e6
        ));
    }
    rows
}

/// Each case through the router in process, no TLS and no HTTP: the time
/// per request of `/validate` and of `/bare`, one after another. It is the
/// rules' own cost, which the ratios over TLS compare with the listener's.
async fn in_process(router: &Router, cases: &[(&'static str, Bytes)]) {
    const N: u32 = 5_000;
    println!("in process (no TLS, no HTTP): µs per request");
    for (name, body) in cases {
        let mut per_path = Vec::new();
        for path in ["/bare", "/validate"] {
            let started = Instant::now();
            for _ in 0..N {
                let request = Request::post(path)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body.clone()))
                    .expect("a request");
                let response = router.clone().oneshot(request).await.expect("a response");
                std::hint::black_box(response.into_body().collect().await.expect("a body"));
            }
            per_path.push(started.elapsed().as_secs_f64() * 1e6 / f64::from(N));
        }
        println!(
            "{name:<30} /bare {:>7.1} µs  /validate {:>7.1} µs",
            per_path[0], per_path[1]
        );
    }
}

fn main() {
    let options = options();
    let ca = DevCa::generate("bench-ca").expect("a CA");
    let pair = ca
        .issue_server(&["localhost"], &["127.0.0.1".parse().expect("an IP")])
        .expect("a serving certificate");
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("tls.crt"), &pair.cert_pem).expect("write tls.crt");
    std::fs::write(dir.path().join("tls.key"), &pair.key_pem).expect("write tls.key");

    let router = webhook::router(Arc::new(Webhooks::offline())).route(
        "/bare",
        post(|body: Bytes| async move {
            // Read the body like the real route, do nothing with it.
            std::hint::black_box(body);
            ([(header::CONTENT_TYPE, "application/json")], BARE_ANSWER)
        }),
    );
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("the server runtime");
    let (stop, stopped) = watch::channel(false);
    let port = server.block_on(async {
        let certs = ReloadingCert::load(dir.path().join("tls.crt"), dir.path().join("tls.key"))
            .expect("certificates");
        let config = tls::server_config(Arc::new(certs)).expect("a TLS configuration");
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = tcp.local_addr().expect("an address").port();
        tokio::spawn(serve("bench", tcp, Some(config), router.clone(), stopped));
        port
    });

    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).expect("the CA"))
        .expect("a root");
    let mut client_config = ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    client_config.alpn_protocols = vec![b"h2".to_vec()];
    let client_config = Arc::new(client_config);

    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the client runtime");
    let cases = cases();
    println!(
        "{} requests per round and route over {} HTTP/2 connections, {} rounds; /bare gets each case's body",
        options.requests, options.connections, options.rounds
    );
    client.block_on(async {
        // Memory first, while nothing else runs in the process.
        let mut rows = memory(&router).await;
        in_process(&router, &cases).await;

        // Every body must pass every rule, or the figures measure an early denial.
        let mut sender = connect(port, client_config.clone()).await;
        for (name, body) in &cases {
            let request = Request::post(format!("https://localhost:{port}/validate"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Full::new(body.clone()))
                .expect("a request");
            let response = sender.send_request(request).await.expect("a response");
            let answer = read_all(response.into_body()).await;
            let answer: Value = serde_json::from_slice(&answer).expect("an AdmissionReview");
            assert_eq!(
                answer["response"]["allowed"], true,
                "the {name} body is denied: {answer}"
            );
        }

        let warmup = Options {
            requests: options.requests / 10,
            ..options
        };
        for (_, body) in &cases {
            round(port, &client_config, "/bare", body, &warmup).await;
            round(port, &client_config, "/validate", body, &warmup).await;
        }

        let mut results: Vec<(Vec<Round>, Vec<Round>)> =
            cases.iter().map(|_| (Vec::new(), Vec::new())).collect();
        for i in 0..options.rounds {
            for ((name, body), (bare, validate)) in cases.iter().zip(&mut results) {
                for (path, rounds) in [("/bare", &mut *bare), ("/validate", &mut *validate)] {
                    let r = round(port, &client_config, path, body, &options).await;
                    println!(
                        "round {} {name:<28} {path:<10} {:>7.0} req/s  p50 {:>7.1} \u{b5}s  p99 {:>7.1} \u{b5}s",
                        i + 1,
                        r.rps,
                        r.p50.as_secs_f64() * 1e6,
                        r.p99.as_secs_f64() * 1e6
                    );
                    rounds.push(r);
                }
            }
        }
        let summary = |rounds: &[Round]| {
            (
                median(rounds.iter().map(|r| r.rps).collect()),
                median(rounds.iter().map(|r| r.p50.as_secs_f64() * 1e6).collect()),
                median(rounds.iter().map(|r| r.p99.as_secs_f64() * 1e6).collect()),
            )
        };
        println!(
            "median of {} rounds             body B |  /bare req/s  p50 \u{b5}s  p99 \u{b5}s | /validate req/s  p50 \u{b5}s  p99 \u{b5}s | \u{f7}bare: thr   p50   p99",
            options.rounds
        );
        for ((name, body), (bare, validate)) in cases.iter().zip(&results) {
            let (b, v) = (summary(bare), summary(validate));
            println!(
                "{name:<28} {:>9} | {:>11.0} {:>7.1} {:>7.1} | {:>14.0} {:>7.1} {:>7.1} | {:>10.2} {:>5.2} {:>5.2}",
                body.len(),
                b.0,
                b.1,
                b.2,
                v.0,
                v.1,
                v.2,
                v.0 / b.0,
                v.1 / b.1,
                v.2 / b.2
            );
            rows.push(format!(
                "| webhook | {name}: throughput, p99 ÷ bare | {:.2}, {:.2} | ≥ 0.8, ≤ 1.5 |",
                v.0 / b.0,
                v.2 / b.2
            ));
        }
        // The rows of `make bench`'s table.
        for row in rows {
            println!("{row}");
        }
    });
    let _ = stop.send(true);
}
