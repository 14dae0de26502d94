//! The webhook over TLS on loopback: requests per second and p50/p99
//! latency of `POST /validate` (the real route: read and parse the
//! AdmissionReview, run the rules of `Webhooks::offline()`, i.e. every rule
//! that needs no API server, serialize the answer) next to a bare route on
//! the same server, same TLS and same listener, that reads the body and
//! answers fixed bytes. The ratio is what validation costs. Each case (a
//! CREATE and an UPDATE of each workload kind, every body allowed) runs
//! against /bare with the same body, connections and request count, and
//! against /json, which only checks that the body is JSON (serde_json,
//! nothing built): the least any route that reads the body must spend, so
//! /json ÷ /bare bounds what /validate ÷ /bare can reach.
//!
//! Then memory: one request at a time sent in process through the router
//! (no TLS), with a counting global allocator; the peak heap growth during
//! the request, the body itself included, is reported against the body's
//! size, for a realistic 3 MiB UPDATE, a hostile 3 MiB body (a 1.5M-element
//! array in spec.variables)
//! and UPDATEs whose objects hold just under the cap on JSON values in the
//! shapes that cost most to decode (dense variables, short annotations).
//!
//! ```sh
//! cargo bench --bench webhook
//! cargo bench --bench webhook -- --requests 10000 --connections 4 --rounds 7
//! ```
//!
//! Each round runs a case's three routes back to back (every other round in
//! reverse), and a ratio is taken within the round; the figures are the median over the rounds. This
//! machine's speed drifts over seconds, so a ratio of two medians taken
//! rounds apart moves as much with the machine as with the code.
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
use captf::server::webhook;
use captf::webhooks::decode::OBJECT_WEIGHT;
use captf::webhooks::handler::Webhooks;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use serde::de::IgnoredAny;
use serde_json::Value;
use tikv_jemallocator::Jemalloc;
use tokio::sync::watch;
use tokio_rustls::TlsConnector;
use tower::ServiceExt;

mod bodies;
use bodies::{at_the_cap, cases, dense_annotations, hostile_create, large_update};

/// The routes each case runs against, in this order.
const PATHS: [&str; 3] = ["/bare", "/json", "/validate"];

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
        requests: 10_000,
        connections: 4,
        rounds: 7,
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
    let service = router.clone();
    GROWTH.store(0, Ordering::SeqCst);
    PEAK.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let started = Instant::now();
    // The body is copied while counting, as the listener's receive buffer
    // holds it: the route keeps a one-frame body as it came, so the body
    // itself is part of what one request holds.
    let request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(Bytes::copy_from_slice(body)))
        .expect("a request");
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
        (
            "(e) UPDATE at the cap, short annotations",
            dense_annotations(),
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
/// per request of each route, one after another. It is the
/// rules' own cost, which the ratios over TLS compare with the listener's.
async fn in_process(router: &Router, cases: &[(&'static str, Bytes)]) {
    const N: u32 = 5_000;
    println!("in process (no TLS, no HTTP): µs per request");
    for (name, body) in cases {
        let mut per_path = Vec::new();
        for path in PATHS {
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
            "{name:<30} /bare {:>7.1} µs  /json {:>7.1} µs  /validate {:>7.1} µs",
            per_path[0], per_path[1], per_path[2]
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

    let router = webhook::router(Arc::new(Webhooks::offline()))
        .route(
            "/bare",
            post(|body: Bytes| async move {
                // Read the body like the real route, do nothing with it.
                std::hint::black_box(body);
                ([(header::CONTENT_TYPE, "application/json")], BARE_ANSWER)
            }),
        )
        .route(
            "/json",
            post(|body: Bytes| async move {
                // Parse the whole body as the real route does, build nothing.
                let parsed = serde_json::from_slice::<IgnoredAny>(&body);
                assert!(parsed.is_ok(), "the bench's bodies are JSON");
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
            for path in PATHS {
                round(port, &client_config, path, body, &warmup).await;
            }
        }

        let mut results: Vec<[Vec<Round>; 3]> = cases.iter().map(|_| Default::default()).collect();
        for i in 0..options.rounds {
            for ((name, body), per_path) in cases.iter().zip(&mut results) {
                // Every other round runs the routes in reverse, so that a
                // drift within a round does not always favour one route.
                let mut order: Vec<_> = PATHS.into_iter().zip(per_path.iter_mut()).collect();
                if i % 2 == 1 {
                    order.reverse();
                }
                for (path, rounds) in order {
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
        // Within each round, `of(route) / of(bare)`; the median over rounds.
        let ratio = |route: &[Round], bare: &[Round], of: fn(&Round) -> f64| {
            median(route.iter().zip(bare).map(|(r, b)| of(r) / of(b)).collect())
        };
        let rps: fn(&Round) -> f64 = |r| r.rps;
        let p50: fn(&Round) -> f64 = |r| r.p50.as_secs_f64();
        let p99: fn(&Round) -> f64 = |r| r.p99.as_secs_f64();
        println!(
            "median of {} rounds             body B |  /bare req/s  p50 \u{b5}s  p99 \u{b5}s | /json \u{f7}bare: thr   p99 | /validate req/s  p50 \u{b5}s  p99 \u{b5}s | \u{f7}bare: thr   p50   p99",
            options.rounds
        );
        for ((name, body), [bare, json, validate]) in cases.iter().zip(&results) {
            let (b, v) = (summary(bare), summary(validate));
            let json_ratios = (ratio(json, bare, rps), ratio(json, bare, p99));
            let ratios = (
                ratio(validate, bare, rps),
                ratio(validate, bare, p50),
                ratio(validate, bare, p99),
            );
            println!(
                "{name:<28} {:>9} | {:>11.0} {:>7.1} {:>7.1} | {:>15.2} {:>5.2} | {:>14.0} {:>7.1} {:>7.1} | {:>10.2} {:>5.2} {:>5.2}",
                body.len(),
                b.0,
                b.1,
                b.2,
                json_ratios.0,
                json_ratios.1,
                v.0,
                v.1,
                v.2,
                ratios.0,
                ratios.1,
                ratios.2
            );
            rows.push(format!(
                "| webhook | {name}: throughput, p99 ÷ bare (parse only: {:.2}, {:.2}) | {:.2}, {:.2} | ≥ 0.8, ≤ 1.5 |",
                json_ratios.0, json_ratios.1, ratios.0, ratios.2
            ));
        }
        // The rows of `make bench`'s table.
        for row in rows {
            println!("{row}");
        }
    });
    let _ = stop.send(true);
}
