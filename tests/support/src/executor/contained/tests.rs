use serde_json::json;

use super::*;

/// A pod spec with the security context `security`.
fn pod(security: serde_json::Value) -> PodSpec {
    serde_json::from_value(json!({ "containers": [], "securityContext": security })).unwrap()
}

fn container(c: serde_json::Value) -> Container {
    serde_json::from_value(c).unwrap()
}

#[test]
fn the_user_comes_from_the_container_then_the_pod_then_the_image() {
    let plain = json!({ "name": "c" });
    let cases = [
        (
            "nothing set: root",
            json!({}),
            plain.clone(),
            None,
            Ok((0, 0)),
        ),
        (
            "the image's",
            json!({}),
            plain.clone(),
            Some("65532:65532"),
            Ok((65532, 65532)),
        ),
        (
            "the image's uid alone",
            json!({}),
            plain.clone(),
            Some("1000"),
            Ok((1000, 0)),
        ),
        (
            "the pod's over the image's",
            json!({ "runAsUser": 7, "runAsGroup": 8 }),
            plain.clone(),
            Some("65532:65532"),
            Ok((7, 8)),
        ),
        (
            "the container's over the pod's",
            json!({ "runAsUser": 7 }),
            json!({ "name": "c", "securityContext": { "runAsUser": 9 } }),
            Some("65532:65532"),
            Ok((9, 65532)),
        ),
        (
            "a named user cannot be looked up",
            json!({}),
            plain.clone(),
            Some("nobody"),
            Err("not numeric"),
        ),
        (
            "runAsNonRoot refuses root",
            json!({ "runAsNonRoot": true }),
            plain.clone(),
            None,
            Err("runAsNonRoot"),
        ),
    ];
    for (what, security, c, image, want) in cases {
        let got = run_as(&pod(security), &container(c), image);
        match (got, want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{what}"),
            (Err(got), Err(want)) => assert!(got.contains(want), "{what}: {got}"),
            (got, want) => panic!("{what}: {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn a_port_is_found_by_number_or_by_name() {
    let c = container(json!({
        "name": "manager",
        "ports": [{ "name": "health", "containerPort": 9440 }, { "containerPort": 9443 }],
    }));
    assert_eq!(
        port_number(&c, &IntOrString::String("health".into())),
        Some(9440)
    );
    assert_eq!(port_number(&c, &IntOrString::Int(8080)), Some(8080));
    assert_eq!(
        port_number(&c, &IntOrString::String("metrics".into())),
        None
    );
    assert_eq!(port_number(&c, &IntOrString::Int(70000)), None);
}
