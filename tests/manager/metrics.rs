//! `/metrics` behind a token review, and the insecure diagnostics listener.

use super::*;

async fn get_metrics(port: u16, token: Option<&str>) -> (StatusCode, String) {
    let mut conn = Conn::open(tls(port, trusting_anything()).await, false).await;
    let mut request = Request::get(format!("https://localhost:{port}/metrics"));
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let (status, body) = conn.send(request.body(full(Bytes::new())).unwrap()).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The TokenReviews the API server has answered, from its own metrics.
async fn token_reviews(client: &kube::Client) -> f64 {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{") && l.contains("resource=\"tokenreviews\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn metrics_need_a_token_whose_user_may_get_metrics() {
    let plane = controlplane::shared();
    captf_testkit::manager::install_crds(&plane.client().await).await;
    let client = plane.client().await;
    let ns = captf_testkit::namespace(&client, "metrics").await;
    let ca = DevCa::generate("webhook-ca").unwrap();
    let certs = CertDir::new(&serving_pair(&ca));
    let mut manager = Manager::start(plane.manager_kubeconfig(), certs.path(), &[]);
    manager.wait_ready().await;

    let (status, _) = get_metrics(manager.diagnostics, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = get_metrics(manager.diagnostics, Some("not-a-token")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("scraper".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "expirationSeconds": 600}
    }))
    .unwrap();
    let issued: TokenRequest = accounts
        .create_subresource("token", "scraper", &PostParams::default(), &request)
        .await
        .unwrap();
    let token = issued
        .status
        .and_then(|s| s.token)
        .expect("an issued token");

    let (status, _) = get_metrics(manager.diagnostics, Some(&token)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let role_name = format!("{ns}-metrics-reader");
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": role_name},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    }))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": ns}]
    }))
    .unwrap();
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    roles.create(&PostParams::default(), &role).await.unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    // The API server's RBAC cache takes a moment to see the binding.
    let deadline = Instant::now() + TIMEOUT;
    let body = loop {
        let (status, body) = get_metrics(manager.diagnostics, Some(&token)).await;
        if status == StatusCode::OK {
            break body;
        }
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(Instant::now() < deadline, "the binding never took effect");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let build_info = body
        .lines()
        .find(|l| l.starts_with("captf_build_info{"))
        .unwrap_or_else(|| panic!("no captf_build_info in\n{body}"));
    assert!(
        build_info.contains("contract=\"v1alpha1\"") && build_info.ends_with(" 1"),
        "{build_info}"
    );
    assert!(
        !manager.log().contains(&token),
        "the token must never be logged"
    );

    // The verdict is kept for a while: scrapes in a row cost no more reviews.
    let reviews_before = token_reviews(&client).await;
    for _ in 0..10 {
        let (status, _) = get_metrics(manager.diagnostics, Some(&token)).await;
        assert_eq!(status, StatusCode::OK);
    }
    let reviews = token_reviews(&client).await - reviews_before;
    assert!(reviews <= 1.0, "{reviews} TokenReviews for 10 scrapes");

    let _ = bindings.delete(&role_name, &DeleteParams::default()).await;
    let _ = roles.delete(&role_name, &DeleteParams::default()).await;
}

#[tokio::test]
async fn insecure_diagnostics_serve_plain_http_without_a_token() {
    let plane = controlplane::shared();
    captf_testkit::manager::install_crds(&plane.client().await).await;
    let ca = DevCa::generate("webhook-ca").unwrap();
    let certs = CertDir::new(&serving_pair(&ca));
    let mut manager = Manager::start(
        plane.manager_kubeconfig(),
        certs.path(),
        &["--insecure-diagnostics"],
    );
    manager.wait_ready().await;
    let (status, body) = plain_get(manager.diagnostics, "/metrics").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("captf_build_info{"), "{body}");
}
