//! Redaction end to end (book: inside-the-job.md "Redaction"): secrets
//! seeded in an identity's credentials (an AWS credentials file, a
//! kubeconfig, a GCP service account key) and in a `spec.jobs.env`
//! secretKeyRef, leaked by a module (tests/modules/redaction) in every
//! escaped and encoded form through a failing apply, appear in none of the
//! object's status, the events, the pod's logs and the manager's log.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use captf::api::{IdentityReference, JobPolicy, Source, WorkspaceSpec};
use captf::runner::redact::encodings;
use captf_testkit::executor::test_module_image;
use captf_testkit::scenario::*;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, Pod, Secret, SecretKeySelector};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

/// The value of `aws_secret_access_key`: a space and characters every
/// escaping changes.
const INI_SECRET: &str = "Se3ded Ini/Secret+Key=\"q\"\\b&x?%";
const KUBE_TOKEN: &str = "seeded-kube-token.eyJzZWVkZWQiOnRydWV9.c2lnbmF0dXJl";
const KEY_ID: &str = "5eeded0123456789abcdef0123456789abcdef01";
const ENV_TOKEN: &str = "seeded-env-T0ken: with <html> & 'quotes'/+=";

/// A PEM whose body is 5 lines of base64 derived from `seed`: made up,
/// distinctive, and looking like a key.
fn pem(label: &str, seed: &str) -> String {
    let mut body = Vec::new();
    for i in 0..5 {
        body.extend_from_slice(&Sha256::digest(format!("{seed}-{i}")));
        body.extend_from_slice(&Sha256::digest(format!("{seed}+{i}")));
    }
    let encoded = STANDARD.encode(&body);
    let lines: Vec<&str> = encoded
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

struct Seeded {
    /// The credentials Secret's keys and files.
    files: Vec<(&'static str, String)>,
    /// Every seeded secret, bare.
    secrets: Vec<String>,
}

fn seeded() -> Seeded {
    let client_key = pem("EC PRIVATE KEY", "kubeconfig client key");
    let private_key = pem("PRIVATE KEY", "service account key");
    let ini = format!(
        "[default]\naws_access_key_id = AKIA5EEDEDACCESSKEY1\naws_secret_access_key = {INI_SECRET}\nregion = eu-west-1\n"
    );
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: seeded\n  cluster:\n    server: https://seeded.example:6443\n\
         users:\n- name: seeded\n  user:\n    token: {KUBE_TOKEN}\n    client-key-data: {}\n\
         contexts:\n- name: seeded\n  context:\n    cluster: seeded\n    user: seeded\ncurrent-context: seeded\n",
        STANDARD.encode(&client_key)
    );
    let key_json = serde_json::to_string_pretty(&json!({
        "type": "service_account",
        "project_id": "seeded-project",
        "private_key_id": KEY_ID,
        "private_key": private_key,
        "client_email": "seeded@seeded-project.iam.gserviceaccount.com",
        "token_uri": "https://oauth2.googleapis.com/token"
    }))
    .unwrap();
    Seeded {
        files: vec![
            ("aws_credentials", ini),
            ("kubeconfig", kubeconfig),
            ("sa_key_json", key_json),
        ],
        secrets: vec![
            ENV_TOKEN.into(),
            INI_SECRET.into(),
            "AKIA5EEDEDACCESSKEY1".into(),
            KUBE_TOKEN.into(),
            KEY_ID.into(),
            client_key,
            private_key,
        ],
    }
}

/// Every form a secret is leaked in: the runner's list, and independently
/// base64 and JSON.
fn leaked_forms(secret: &str) -> Vec<String> {
    let mut forms: Vec<String> = encodings::forms(secret.as_bytes())
        .into_iter()
        .map(|f| String::from_utf8(f).unwrap())
        .collect();
    forms.push(STANDARD.encode(secret));
    forms.push(URL_SAFE_NO_PAD.encode(secret));
    let json = Value::from(secret).to_string();
    forms.push(json[1..json.len() - 1].to_string());
    forms.retain(|f| !f.contains('\n'));
    forms.sort();
    forms.dedup();
    forms
}

/// What must not be found: each form of each secret, and each line of a
/// secret of several lines but its PEM armor.
fn needles(secrets: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for secret in secrets {
        out.extend(leaked_forms(secret));
        out.extend(
            secret
                .lines()
                .map(str::trim)
                .filter(|l| l.len() >= 8 && !l.starts_with("-----"))
                .map(str::to_string),
        );
    }
    out.sort();
    out.dedup();
    out
}

/// The file the module prints: each form on its own line, each secret as
/// it is, one inside a longer base64 text (as HTTP basic auth shows it),
/// and last an ` Error: ` line of the forms of the one-line secrets, which
/// the failure summary takes. Last, because the runtime keeps only the
/// last 8 KiB of a failed command's output for its error; with a leading
/// space, because it wraps no such line.
fn leak_file(secrets: &[String]) -> String {
    let forms: Vec<String> = secrets.iter().flat_map(|s| leaked_forms(s)).collect();
    let mut text = String::new();
    for form in &forms {
        text.push_str(&format!("form: {form}\n"));
    }
    for secret in secrets {
        text.push_str(secret);
        text.push('\n');
    }
    text.push_str(&format!(
        "Authorization: Basic {}\n",
        STANDARD.encode(format!("admin:{ENV_TOKEN}"))
    ));
    let short: Vec<String> = secrets
        .iter()
        .filter(|s| !s.contains('\n'))
        .flat_map(|s| leaked_forms(s))
        .collect();
    text.push_str(&format!("\n Error: seeded {}\n", short.join(" ")));
    text
}

/// Every string inside a JSON document, one per line.
fn strings(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s}\n"),
        Value::Array(items) => items.iter().map(strings).collect(),
        Value::Object(map) => map.values().map(strings).collect(),
        _ => String::new(),
    }
}

fn leaks<'a>(haystack: &str, needles: &'a [String]) -> Vec<&'a str> {
    needles
        .iter()
        .filter(|n| haystack.contains(n.as_str()))
        .map(String::as_str)
        .collect()
}

#[tokio::test]
async fn seeded_secrets_in_every_form_are_redacted_everywhere() {
    let seeded = seeded();
    let creds: Vec<(&str, &str)> = seeded.files.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let env = setup(MANAGER, "redact", &creds, &[]).await;
    let app = Secret {
        metadata: ObjectMeta {
            name: Some("app".into()),
            ..Default::default()
        },
        string_data: Some([("token".to_string(), ENV_TOKEN.to_string())].into()),
        ..Default::default()
    };
    env.secrets()
        .create(&PostParams::default(), &app)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let leak = dir.path().join("leak.txt");
    std::fs::write(&leak, leak_file(&seeded.secrets)).unwrap();

    let workspace = WorkspaceSpec {
        source: Source {
            image: test_module_image("redaction"),
            image_pull_policy: None,
        },
        identity_ref: Some(IdentityReference {
            name: env.identity.clone(),
        }),
        jobs: Some(JobPolicy {
            env: Some(vec![EnvVar {
                name: "SEEDED_ENV_TOKEN".into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: "app".into(),
                        key: "token".into(),
                        optional: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        variables: vars(&[("leak_file", json!(leak.display().to_string()))]),
        ..Default::default()
    };
    env.create_cluster("c", workspace).await;
    let status = within(&env, 240, "the failed apply", || async {
        env.cluster_status("c")
            .await
            .filter(|s| s.last_run.as_ref().is_some_and(|r| r.error.is_some()))
    })
    .await;
    let run = status.last_run.clone().unwrap();
    let summary = run
        .error
        .as_ref()
        .unwrap()
        .summary
        .clone()
        .unwrap_or_default();
    // The run got as far as leaking: the summary is the module's line.
    assert!(
        summary.contains("Error: seeded (sensitive) (sensitive)"),
        "{summary}{}",
        env.context()
    );
    let job = env
        .jobs()
        .await
        .into_iter()
        .find(|j| j.name_any() == run.job)
        .expect("the failed Job");
    let args = job.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap_or_default();
    assert!(
        args.contains(&"--secret-env=SEEDED_ENV_TOKEN".to_string()),
        "{args:?}"
    );
    // The runner's last event is sent before its pod ends.
    within(&env, 30, "the runner's RunFinished event", || async {
        (!env.events("RunFinished").await.is_empty()).then_some(())
    })
    .await;

    let pods = Api::<Pod>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={}", run.job)))
        .await
        .unwrap();
    let pod = pods.items.first().expect("the Job's pod").name_any();
    let pod_logs = container_logs(&env.executor.pod_dir(&env.ns, &pod));
    let events: Vec<Event> = Api::<Event>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let events = strings(&serde_json::to_value(&events).unwrap());
    let status_text = strings(&serde_json::to_value(&status).unwrap());
    let manager_log = env.manager.log();

    let needles = needles(&seeded.secrets);
    assert!(needles.len() > 60, "{} needles", needles.len());
    // The leak happened: the module printed every form.
    let leaked = std::fs::read_to_string(&leak).unwrap();
    assert!(leaks(&leaked, &needles).len() == needles.len());
    assert!(pod_logs.contains("(sensitive)"), "{pod_logs}");
    assert!(status_text.contains("(sensitive)"), "{status_text}");
    assert!(events.contains("(sensitive)"), "{events}");
    for (place, text) in [
        ("status", &status_text),
        ("events", &events),
        ("pod logs", &pod_logs),
        ("manager log", &manager_log),
    ] {
        let found = leaks(text, &needles);
        assert!(found.is_empty(), "in the {place}: {found:#?}\n---\n{text}");
    }
}

/// The logs of every container of a pod (`<container>.log` in its root).
fn container_logs(root: &Path) -> String {
    let mut logs = String::new();
    for entry in std::fs::read_dir(root).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            logs.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    assert!(!logs.is_empty(), "no container log in {}", root.display());
    logs
}
