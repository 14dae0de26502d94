//! The runner's own calls to the API server: reading and writing the saved
//! plan's Secret, and releasing a stale lock that init itself cannot get
//! past. The runner reaches the API as the backend does, with the
//! pod's in-cluster credentials, or the kubeconfig the backend was given.
//! Every call has a short deadline.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

use crate::keys::LOCK_INFO;

/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("no API credentials: {0}")]
    Config(String),
    #[error("{0}")]
    Request(#[from] kube::Error),
    #[error("the request took longer than {}s", REQUEST_TIMEOUT.as_secs())]
    Timeout,
}

/// A client with the backend's credentials: `config_path=` names a
/// kubeconfig, otherwise the pod's in-cluster configuration.
pub async fn client(backend_config: &[String]) -> Result<kube::Client, ApiError> {
    let config = match backend_config
        .iter()
        .find_map(|kv| kv.strip_prefix("config_path="))
    {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|e| ApiError::Config(e.to_string()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| ApiError::Config(e.to_string()))?
        }
        None => Config::incluster().map_err(|e| ApiError::Config(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(ApiError::Request)
}

async fn timed<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, ApiError> {
    tokio::time::timeout(REQUEST_TIMEOUT, call)
        .await
        .map_err(|_| ApiError::Timeout)?
        .map_err(ApiError::Request)
}

/// The data of Secret `name`.
pub async fn secret_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, ByteString>>, ApiError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    Ok(timed(api.get(name)).await?.data)
}

/// Replaces the data of the existing Secret `name` (created by the manager
/// with its owner and labels, which stay).
pub async fn replace_secret_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    data: BTreeMap<String, ByteString>,
) -> Result<(), ApiError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut secret = timed(api.get(name)).await?;
    secret.data = Some(data);
    secret.string_data = None;
    timed(api.replace(name, &PostParams::default(), &secret)).await?;
    Ok(())
}

/// Releases the lock Lease `name` if it is still held under `id`, as the
/// backend's own unlock does: the holder cleared and the lock info removed,
/// the Lease kept. The write is guarded by the version read, so a lock taken
/// under another ID in between is never touched. Whether it released it.
pub async fn release_lock(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    id: &str,
) -> Result<bool, ApiError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let Some(mut lease) = timed(api.get_opt(name)).await? else {
        return Ok(false);
    };
    let spec = lease.spec.get_or_insert_default();
    if spec.holder_identity.as_deref() != Some(id) {
        return Ok(false);
    }
    spec.holder_identity = None;
    if let Some(annotations) = lease.metadata.annotations.as_mut() {
        annotations.remove(LOCK_INFO);
    }
    timed(api.replace(name, &PostParams::default(), &lease)).await?;
    Ok(true)
}
