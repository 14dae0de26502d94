//! The bounds of [`super::serve`], with real sockets, TLS and HTTP clients.

use std::sync::atomic::AtomicUsize;

use axum::body::Bytes;
use axum::routing::{get, post};
use http_body_util::{BodyExt, Full};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::sign::SingleCertAndKey;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::*;
use crate::server::dev_certs::DevCa;
use crate::server::tls;

const SHORT: Duration = Duration::from_millis(300);

/// The most requests the router had in flight at once.
#[derive(Default)]
struct Concurrency {
    now: AtomicUsize,
    most: AtomicUsize,
}

fn router(concurrency: Arc<Concurrency>) -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route(
            "/slow",
            get(move || async move {
                let now = concurrency.now.fetch_add(1, Ordering::SeqCst) + 1;
                concurrency.most.fetch_max(now, Ordering::SeqCst);
                sleep(Duration::from_millis(200)).await;
                concurrency.now.fetch_sub(1, Ordering::SeqCst);
                "slow"
            }),
        )
        .route("/echo", post(|body: Bytes| async move { body }))
}

struct Server {
    addr: SocketAddr,
    client: Arc<ClientConfig>,
    concurrency: Arc<Concurrency>,
    _stop: watch::Sender<bool>,
}

async fn start(limits: Limits, tls: bool) -> Server {
    let ca = DevCa::generate("connections-ca").unwrap();
    let pair = ca.issue_server(&["localhost"], &[]).unwrap();
    let key = tls::certified_key(
        pair.cert_pem.as_bytes(),
        pair.key_pem.as_bytes(),
        &tls::provider(),
    )
    .unwrap();
    let config = tls::server_config(Arc::new(SingleCertAndKey::from(key))).unwrap();
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap())
        .unwrap();
    let mut client = ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];

    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let (stop, stopped) = watch::channel(false);
    let concurrency = Arc::new(Concurrency::default());
    tokio::spawn(serve(
        "test",
        tcp,
        tls.then_some(config),
        router(concurrency.clone()),
        stopped,
        limits,
        Duration::from_secs(1),
    ));
    Server {
        addr,
        client: Arc::new(client),
        concurrency,
        _stop: stop,
    }
}

impl Server {
    async fn tls(&self) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        let name = "localhost".try_into().unwrap();
        TlsConnector::from(self.client.clone())
            .connect(name, tcp)
            .await
            .unwrap()
    }

    /// An HTTP/2 connection over TLS, and the task that drives it.
    async fn h2(
        &self,
    ) -> (
        hyper::client::conn::http2::SendRequest<Full<Bytes>>,
        tokio::task::JoinHandle<()>,
    ) {
        let io = TokioIo::new(self.tls().await);
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        (sender, driver)
    }
}

async fn get_on(
    sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    path: &str,
) -> StatusCode {
    let request = Request::get(format!("https://localhost{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status
}

/// Reads until the peer closes; what it sent before that.
async fn read_to_close(tcp: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut seen = Vec::new();
    timeout(within, tcp.read_to_end(&mut seen))
        .await
        .expect("the server closed the connection in time")
        .unwrap();
    seen
}

#[tokio::test]
async fn silent_sockets_past_the_cap_do_not_hold_up_a_handshake() {
    let server = start(Limits::SERVING, true).await;
    let mut silent = Vec::new();
    for _ in 0..Limits::SERVING.max_connections + 44 {
        silent.push(TcpStream::connect(server.addr).await.unwrap());
    }
    let answered = timeout(Duration::from_secs(3), async {
        let (mut sender, _driver) = server.h2().await;
        get_on(&mut sender, "/hello").await
    })
    .await
    .expect("a handshake and a request behind 300 silent sockets within 3 s");
    assert_eq!(answered, StatusCode::OK);
}

#[tokio::test]
async fn when_every_slot_is_in_use_a_new_connection_is_closed_and_the_others_go_on() {
    let limits = Limits {
        max_connections: 3,
        ..Limits::SERVING
    };
    let server = start(limits, true).await;
    let mut busy = Vec::new();
    for _ in 0..3 {
        let (mut sender, driver) = server.h2().await;
        assert_eq!(get_on(&mut sender, "/hello").await, StatusCode::OK);
        busy.push((sender, driver));
    }
    let mut refused = TcpStream::connect(server.addr).await.unwrap();
    assert!(
        read_to_close(&mut refused, Duration::from_secs(2))
            .await
            .is_empty()
    );
    for (sender, _) in &mut busy {
        assert_eq!(get_on(sender, "/hello").await, StatusCode::OK);
    }
}

#[tokio::test]
async fn request_headers_must_arrive_in_time() {
    let limits = Limits {
        header_read: SHORT,
        ..Limits::SERVING
    };
    let server = start(limits, false).await;
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let seen = read_to_close(&mut tcp, Duration::from_secs(3)).await;
    let seen = String::from_utf8_lossy(&seen);
    assert!(
        seen.is_empty() || seen.starts_with("HTTP/1.1 408"),
        "{seen}"
    );
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_gets_408() {
    let limits = Limits {
        request: SHORT,
        ..Limits::SERVING
    };
    let server = start(limits, false).await;
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten..")
        .await
        .unwrap();
    let seen = read_to_close(&mut tcp, Duration::from_secs(3)).await;
    let seen = String::from_utf8_lossy(&seen);
    assert!(seen.starts_with("HTTP/1.1 408"), "{seen}");
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed() {
    let limits = Limits {
        idle: SHORT,
        ..Limits::SERVING
    };
    let server = start(limits, true).await;
    let (mut sender, driver) = server.h2().await;
    // Back to back, longer together than the idle time: open while in flight.
    assert_eq!(get_on(&mut sender, "/slow").await, StatusCode::OK);
    assert_eq!(get_on(&mut sender, "/slow").await, StatusCode::OK);
    timeout(Duration::from_secs(3), driver)
        .await
        .expect("the server closed the idle connection")
        .unwrap();
}

#[tokio::test]
async fn an_http2_connection_gets_the_stream_limit() {
    let limits = Limits {
        max_streams: 4,
        ..Limits::SERVING
    };
    let server = start(limits, true).await;
    let (mut sender, _driver) = server.h2().await;
    // Streams opened before the server's SETTINGS arrive would be refused.
    assert_eq!(get_on(&mut sender, "/hello").await, StatusCode::OK);
    let requests: Vec<_> = (0..20)
        .map(|_| {
            let mut sender = sender.clone();
            tokio::spawn(async move { get_on(&mut sender, "/slow").await })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(server.concurrency.most.load(Ordering::SeqCst), 4);
}
