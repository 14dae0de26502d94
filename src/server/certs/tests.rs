use std::time::SystemTime;

use k8s_openapi::api::admissionregistration::v1::ServiceReference;

use super::*;

fn at(from_now: Duration) -> UnixTime {
    UnixTime::since_unix_epoch(
        SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            + from_now,
    )
}

fn names() -> Vec<String> {
    service_names("captf-webhook-service", "captf-system")
}

#[test]
fn an_issued_pair_is_accepted_for_the_services_names_and_nothing_else_is() {
    let pair = issue(&names()).unwrap();
    assert_eq!(check(&pair, &names(), at(MARGIN)), Ok(()));

    let other_service = service_names("other", "captf-system");
    let err = check(&pair, &other_service, at(MARGIN)).unwrap_err();
    assert!(err.contains("other.captf-system.svc"), "{err}");

    let other = issue(&names()).unwrap();
    let cases = [
        (
            "a key of another pair",
            Pair {
                key: other.key.clone(),
                ..pair.clone()
            },
        ),
        (
            "another CA",
            Pair {
                ca: other.ca.clone(),
                ..pair.clone()
            },
        ),
        (
            "no certificate",
            Pair {
                cert: b"not PEM".to_vec(),
                ..pair.clone()
            },
        ),
        (
            "no CA",
            Pair {
                ca: Vec::new(),
                ..pair.clone()
            },
        ),
    ];
    for (what, broken) in cases {
        assert!(check(&broken, &names(), at(MARGIN)).is_err(), "{what}");
    }
}

#[test]
fn the_pair_is_kept_only_while_a_client_would_accept_it_a_margin_from_now() {
    // rcgen's certificates run to 4096; a client in 4097 refuses them.
    let pair = issue(&names()).unwrap();
    let far = Duration::from_secs(3000 * 365 * 24 * 3600);
    let err = check(&pair, &names(), at(far)).unwrap_err();
    assert!(err.to_lowercase().contains("expired"), "{err}");
}

fn webhook(
    name: &str,
    service: Option<(&str, &str)>,
    bundle: Option<&[u8]>,
) -> (String, WebhookClientConfig) {
    (
        name.to_string(),
        WebhookClientConfig {
            ca_bundle: bundle.map(|b| ByteString(b.to_vec())),
            service: service.map(|(name, namespace)| ServiceReference {
                name: name.into(),
                namespace: namespace.into(),
                ..Default::default()
            }),
            url: service
                .is_none()
                .then(|| "https://elsewhere.example".into()),
        },
    )
}

#[test]
fn the_ca_bundle_is_set_on_each_webhook_that_calls_the_service_where_it_differs() {
    let ours = Some(("captf-webhook-service", "captf-system"));
    let webhooks = [
        webhook("unset", ours, None),
        webhook("same", ours, Some(b"CA")),
        webhook("stale", ours, Some(b"OLD")),
        webhook(
            "other-namespace",
            Some(("captf-webhook-service", "elsewhere")),
            None,
        ),
        webhook("other-service", Some(("other", "captf-system")), None),
        webhook("by-url", None, None),
    ];
    let ops = ca_bundle_patch(&webhooks, "captf-webhook-service", "captf-system", b"CA");
    let got = serde_json::to_value(&ops).unwrap();
    let encoded = base64::engine::general_purpose::STANDARD.encode(b"CA");
    let want = serde_json::json!([
        { "op": "test", "path": "/webhooks/0/name", "value": "unset" },
        { "op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": encoded },
        { "op": "test", "path": "/webhooks/2/name", "value": "stale" },
        { "op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": encoded },
    ]);
    assert_eq!(got, want);
    assert!(
        ca_bundle_patch(
            &webhooks[1..2],
            "captf-webhook-service",
            "captf-system",
            b"CA"
        )
        .is_empty()
    );
}
