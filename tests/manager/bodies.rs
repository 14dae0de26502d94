//! Bad, oversized and endless bodies are refused while serving goes on.

use super::*;

/// A body of `total` bytes with no declared length, in 64 KiB chunks.
struct Endless {
    left: usize,
}

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(64 * 1024);
        self.left -= n;
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(vec![b' '; n])))))
    }
}

/// The manager's peak resident memory, from /proc.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn bad_and_oversized_bodies_are_refused_and_serving_goes_on() {
    const TEN_MIB: usize = 10 * 1024 * 1024;
    let plane = controlplane::shared();
    captf_testkit::manager::install_crds(&plane.client().await).await;
    let ca = DevCa::generate("webhook-ca").unwrap();
    let certs = CertDir::new(&serving_pair(&ca));
    let mut manager = Manager::start(plane.manager_kubeconfig(), certs.path(), &[]);
    manager.wait_ready().await;
    let h1 = trusting(&[&ca], &[b"http/1.1"]);
    let h2 = trusting(&[&ca], &[b"h2"]);

    // A malformed body, then a good request on the same keep-alive connection.
    let mut conn = Conn::open(tls(manager.webhook, h1.clone()).await, false).await;
    let (status, body) = conn
        .send(post(
            manager.webhook,
            "/validate",
            full("{\"kind\": \"AdmissionRev"),
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.starts_with("not an admission.k8s.io/v1 AdmissionReview"),
        "{text}"
    );
    let (status, body) = conn
        .send(post(
            manager.webhook,
            "/validate",
            full(admission_review("after-bad")),
        ))
        .await;
    assert_answered(status, &body, "after-bad");

    // 10 MiB with its length declared: refused before it is read.
    let mut conn = Conn::open(tls(manager.webhook, h2.clone()).await, true).await;
    let (status, _) = conn
        .send(post(
            manager.webhook,
            "/validate",
            full(vec![b' '; TEN_MIB]),
        ))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    // 10 MiB streamed with no length, eight at once: each is refused once
    // past 3 MiB, so the peak memory grows by far less than 80 MiB.
    let peak_before = peak_rss_kib(manager.child.id());
    let mut sends = Vec::new();
    for _ in 0..8 {
        let config = h2.clone();
        let port = manager.webhook;
        sends.push(tokio::spawn(async move {
            let mut conn = Conn::open(tls(port, config).await, true).await;
            conn.send(post(port, "/mutate", Endless { left: TEN_MIB }.boxed()))
                .await
                .0
        }));
    }
    for send in sends {
        assert_eq!(send.await.unwrap(), StatusCode::PAYLOAD_TOO_LARGE);
    }
    let grown_kib = peak_rss_kib(manager.child.id()).saturating_sub(peak_before);
    assert!(grown_kib < 48 * 1024, "peak memory grew by {grown_kib} KiB");

    // The server goes on serving.
    let mut conn = Conn::open(tls(manager.webhook, h2).await, true).await;
    let (status, body) = conn
        .send(post(
            manager.webhook,
            "/mutate",
            full(admission_review("after-big")),
        ))
        .await;
    assert_answered(status, &body, "after-big");
    assert!(manager.exited().is_none(), "{}", manager.log());
}
