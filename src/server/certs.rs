//! The webhook's serving certificate without cert-manager: `captf-manager
//! certs`, the init container of the self-signed install (the chart with
//! `certManager.enabled=false`, and `config/default`).
//!
//! One CA and serving certificate live in the Secret
//! `captf-webhook-service-cert` of the manager's namespace, so that every
//! manager pod, old and new during a rollout, serves the same pair. A new
//! pair is issued when the Secret is missing, or when what it holds would
//! not be accepted 30 days from now for the Service's names. The CA becomes
//! the caBundle of each webhook that calls the Service, and the pair is
//! written into the manager container's certificate directory.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, TestOperation};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tracing::info;

use crate::error::{Categorized, Category};
use crate::server::dev_certs::{DevCa, DevCertError};
use crate::server::tls;

/// The keys of the Secret, as cert-manager writes them.
const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";
const CA: &str = "ca.crt";

/// How long from now a kept pair must still be accepted.
const MARGIN: Duration = Duration::from_secs(30 * 24 * 3600);

/// How often a write that lost a race with another pod's is tried again.
const ATTEMPTS: usize = 5;

/// The objects `certs` keeps in step.
#[derive(Clone, Debug, clap::Args, PartialEq, Eq)]
pub struct CertsArgs {
    /// The Secret of the manager's namespace that holds the CA and the pair.
    #[arg(long, default_value = "captf-webhook-service-cert")]
    pub secret: String,
    /// The webhook's Service in the manager's namespace.
    #[arg(long, default_value = "captf-webhook-service")]
    pub service: String,
    #[arg(long, default_value = "captf-validating-webhook-configuration")]
    pub validating_webhook_configuration: String,
    #[arg(long, default_value = "captf-mutating-webhook-configuration")]
    pub mutating_webhook_configuration: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("$POD_NAMESPACE is not set: the Secret and Service are in the manager's namespace")]
    NoNamespace,
    #[error(transparent)]
    Connect(#[from] super::ServerError),
    #[error(transparent)]
    Generate(#[from] DevCertError),
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("the Secret {0} kept changing under this writer")]
    Contended(String),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl Categorized for CertsError {
    fn category(&self) -> Category {
        match self {
            CertsError::NoNamespace => Category::Invalid,
            CertsError::Connect(e) => e.category(),
            CertsError::Generate(_) | CertsError::Write { .. } => Category::Internal,
            CertsError::Api { .. } | CertsError::Contended(_) => Category::Transient,
        }
    }
}

fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> CertsError {
    let what = what.into();
    move |source| CertsError::Api { what, source }
}

/// A CA and the serving certificate and key it signed, as PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Pair {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub ca: Vec<u8>,
}

impl std::fmt::Debug for Pair {
    // The key is a secret: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair").finish_non_exhaustive()
    }
}

/// The names a client calls the Service by.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// The pair a Secret holds, if it has all three keys.
fn pair_of(data: &BTreeMap<String, ByteString>) -> Option<Pair> {
    let get = |key: &str| data.get(key).map(|b| b.0.clone());
    Some(Pair {
        cert: get(CERT)?,
        key: get(KEY)?,
        ca: get(CA)?,
    })
}

/// Whether a client that trusts only the pair's CA would accept its
/// certificate for each of `names` at `at`, and its key matches it: the
/// reason why not.
pub fn check(pair: &Pair, names: &[String], at: UnixTime) -> Result<(), String> {
    let provider = tls::provider();
    tls::certified_key(&pair.cert, &pair.key, &provider)?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&pair.ca) {
        let ca = ca.map_err(|e| format!("ca.crt: {e}"))?;
        roots.add(ca).map_err(|e| format!("ca.crt: {e}"))?;
    }
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| format!("ca.crt: {e}"))?;
    let chain = CertificateDer::pem_slice_iter(&pair.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls.crt: {e}"))?;
    let (leaf, intermediates) = chain.split_first().ok_or("tls.crt: no certificate")?;
    for name in names {
        let server_name =
            ServerName::try_from(name.as_str()).map_err(|e| format!("{name}: {e}"))?;
        verifier
            .verify_server_cert(leaf, intermediates, &server_name, &[], at)
            .map_err(|e| format!("tls.crt for {name}: {e}"))?;
    }
    Ok(())
}

/// A new CA and a serving certificate for `names`.
pub fn issue(names: &[String]) -> Result<Pair, DevCertError> {
    let ca = DevCa::generate("captf-webhook-ca")?;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let serving = ca.issue_server(&names, &[])?;
    Ok(Pair {
        cert: serving.cert_pem.into_bytes(),
        key: serving.key_pem.into_bytes(),
        ca: ca.cert_pem().as_bytes().to_vec(),
    })
}

/// The patch that sets `bundle` as the caBundle of each webhook in
/// `webhooks` (name, client config) that calls `service` in `namespace`,
/// where it differs; each change tested against the webhook's name at its
/// index, so a configuration changed since it was read refuses the patch.
pub fn ca_bundle_patch(
    webhooks: &[(String, WebhookClientConfig)],
    service: &str,
    namespace: &str,
    bundle: &[u8],
) -> Vec<PatchOperation> {
    let encoded = base64::engine::general_purpose::STANDARD.encode(bundle);
    let mut ops = Vec::new();
    for (index, (name, config)) in webhooks.iter().enumerate() {
        let calls_us = config
            .service
            .as_ref()
            .is_some_and(|s| s.name == service && s.namespace == namespace);
        if !calls_us || config.ca_bundle.as_ref().is_some_and(|b| b.0 == bundle) {
            continue;
        }
        let at = |field: &[&str]| {
            PointerBuf::from_tokens(
                ["webhooks".to_string(), index.to_string()]
                    .into_iter()
                    .chain(field.iter().map(|f| f.to_string())),
            )
        };
        ops.push(PatchOperation::Test(TestOperation {
            path: at(&["name"]),
            value: serde_json::Value::String(name.clone()),
        }));
        ops.push(PatchOperation::Add(AddOperation {
            path: at(&["clientConfig", "caBundle"]),
            value: serde_json::Value::String(encoded.clone()),
        }));
    }
    ops
}

/// Keeps the Secret, the webhooks' caBundle and the certificate directory
/// in step (see the module's documentation).
pub async fn run(
    client: kube::Client,
    args: &CertsArgs,
    cert_dir: &Path,
    cert_name: &str,
    key_name: &str,
) -> Result<(), CertsError> {
    let namespace = std::env::var("POD_NAMESPACE").map_err(|_| CertsError::NoNamespace)?;
    let names = service_names(&args.service, &namespace);
    let pair = kept_pair(&client, &namespace, &args.secret, &names).await?;
    let bundle = Bundle {
        client: &client,
        service: &args.service,
        namespace: &namespace,
        ca: &pair.ca,
    };
    bundle
        .set::<ValidatingWebhookConfiguration>(&args.validating_webhook_configuration)
        .await?;
    bundle
        .set::<MutatingWebhookConfiguration>(&args.mutating_webhook_configuration)
        .await?;
    write_file(&cert_dir.join(cert_name), &pair.cert)?;
    write_file(&cert_dir.join(key_name), &pair.key)?;
    info!(dir = %cert_dir.display(), "serving certificate written");
    Ok(())
}

/// A webhook configuration's webhooks, as (name, client config).
trait Webhooks {
    fn client_configs(&self) -> Vec<(String, WebhookClientConfig)>;
}

impl Webhooks for ValidatingWebhookConfiguration {
    fn client_configs(&self) -> Vec<(String, WebhookClientConfig)> {
        let webhooks = self.webhooks.iter().flatten();
        webhooks
            .map(|w| (w.name.clone(), w.client_config.clone()))
            .collect()
    }
}

impl Webhooks for MutatingWebhookConfiguration {
    fn client_configs(&self) -> Vec<(String, WebhookClientConfig)> {
        let webhooks = self.webhooks.iter().flatten();
        webhooks
            .map(|w| (w.name.clone(), w.client_config.clone()))
            .collect()
    }
}

/// The pair of the Secret, issued (and the Secret created or replaced) when
/// it is missing or not usable. A write that loses a race with another
/// pod's reads again and keeps the winner's pair.
async fn kept_pair(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    names: &[String],
) -> Result<Pair, CertsError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("Secret {namespace}/{name}");
    for _ in 0..ATTEMPTS {
        let current = secrets.get_opt(name).await.map_err(api(&what))?;
        let held = current.as_ref().and_then(|s| pair_of(s.data.as_ref()?));
        let at = UnixTime::since_unix_epoch(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                + MARGIN,
        );
        let reason = match &held {
            Some(pair) => match check(pair, names, at) {
                Ok(()) => {
                    info!(secret = %what, "keeping the serving certificate");
                    return Ok(pair.clone());
                }
                Err(reason) => reason,
            },
            None => "missing".to_string(),
        };
        info!(secret = %what, %reason, "issuing a serving certificate");
        let pair = issue(names)?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                resource_version: current
                    .as_ref()
                    .and_then(|s| s.metadata.resource_version.clone()),
                ..current
                    .as_ref()
                    .map(|s| s.metadata.clone())
                    .unwrap_or_default()
            },
            // A Secret's type cannot change.
            type_: current
                .as_ref()
                .and_then(|s| s.type_.clone())
                .or_else(|| Some("kubernetes.io/tls".into())),
            data: Some(BTreeMap::from([
                (CERT.to_string(), ByteString(pair.cert.clone())),
                (KEY.to_string(), ByteString(pair.key.clone())),
                (CA.to_string(), ByteString(pair.ca.clone())),
            ])),
            ..Default::default()
        };
        let written = match current {
            None => secrets.create(&PostParams::default(), &secret).await,
            Some(_) => secrets.replace(name, &PostParams::default(), &secret).await,
        };
        match written {
            Ok(_) => return Ok(pair),
            // Another pod wrote first: take its pair.
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => return Err(api(&what)(e)),
        }
    }
    Err(CertsError::Contended(what))
}

/// The CA to set as the caBundle of the webhooks that call the Service.
struct Bundle<'a> {
    client: &'a kube::Client,
    service: &'a str,
    namespace: &'a str,
    ca: &'a [u8],
}

impl Bundle<'_> {
    /// Sets it in the configuration `name`, retrying when the
    /// configuration changed between the read and the patch.
    async fn set<K>(&self, name: &str) -> Result<(), CertsError>
    where
        K: Webhooks
            + kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned,
    {
        let configurations: Api<K> = Api::all(self.client.clone());
        let what = format!("{} {name}", K::kind(&()));
        for _ in 0..ATTEMPTS {
            let configuration = configurations.get(name).await.map_err(api(&what))?;
            let ops = ca_bundle_patch(
                &configuration.client_configs(),
                self.service,
                self.namespace,
                self.ca,
            );
            if ops.is_empty() {
                return Ok(());
            }
            let patch = Patch::<()>::Json(json_patch::Patch(ops));
            match configurations
                .patch(name, &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => {
                    info!(configuration = %what, "caBundle set");
                    return Ok(());
                }
                // A test failed: the configuration changed; read it again.
                Err(kube::Error::Api(status)) if status.code == 422 || status.code == 409 => {
                    continue;
                }
                Err(e) => return Err(api(&what)(e)),
            }
        }
        Err(CertsError::Contended(what))
    }
}

/// Writes `contents` to `path` through a temporary file, readable by the
/// owner only.
fn write_file(path: &Path, contents: &[u8]) -> Result<(), CertsError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let error = |source| CertsError::Write {
        path: path.display().to_string(),
        source,
    };
    let partial = path.with_extension("partial");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .map_err(error)?;
    file.write_all(contents).map_err(error)?;
    file.sync_all().map_err(error)?;
    std::fs::rename(&partial, path).map_err(error)
}

#[cfg(test)]
mod tests;
