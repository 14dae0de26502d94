//! TLS for the webhook and metrics listeners.
//!
//! [`ReloadingCert`] serves the certificate and key files as they are now:
//! every handshake reads both files (a few KiB, from a tmpfs in a pod) and
//! parses them again only when their bytes changed. Comparing content rather
//! than inode and mtime also catches a rewrite within one timestamp tick.
//! Kubelet rotates a mounted Secret by writing a new `..<timestamp>`
//! directory and swapping the `..data` symlink, so the next handshake after
//! a rotation gets the new certificate without a restart. Files that do not
//! parse, or a key that does not match its certificate (a rotation seen
//! half-way), leave the previous pair in use.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::error::{Categorized, Category};
use crate::server::dev_certs::{DevCa, DevCertError};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
    #[error("building the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error(transparent)]
    DevCert(#[from] DevCertError),
}

impl Categorized for TlsError {
    fn category(&self) -> Category {
        match self {
            // The files may yet appear (a Secret mounted late).
            TlsError::Read { .. } => Category::Transient,
            TlsError::Parse { .. } => Category::Invalid,
            TlsError::Config(_) | TlsError::DevCert(_) => Category::Internal,
        }
    }
}

/// The crypto provider of every listener: ring, like the rest of the crate.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server configuration for HTTP/2 and HTTP/1.1 with the given certificates.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Parses a PEM certificate chain and a PEM private key that must match it.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if chain.is_empty() {
        return Err("certificate: no PEM certificate found".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("private key: {e}"))?;
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(|e| e.to_string())?;
    // from_der lets a key through whose public half it cannot compute; a
    // pair is only served once it is known to match.
    certified.keys_match().map_err(|e| e.to_string())?;
    Ok(certified)
}

/// A certificate signed by a throw-away CA, for a listener with no
/// certificate files (the metrics endpoint of the Go manager does the same).
pub fn self_signed(dns_names: &[&str]) -> Result<Arc<dyn ResolvesServerCert>, TlsError> {
    let ca = DevCa::generate("captf-self-signed")?;
    let ips = [
        std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::Ipv6Addr::LOCALHOST.into(),
    ];
    let pair = ca.issue_server(dns_names, &ips)?;
    let key = certified_key(
        pair.cert_pem.as_bytes(),
        pair.key_pem.as_bytes(),
        &provider(),
    )
    .map_err(|reason| TlsError::Parse {
        path: PathBuf::from("(generated)"),
        reason,
    })?;
    Ok(Arc::new(SingleCertAndKey::from(key)))
}

/// A certificate and key read from files and read again when they change.
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<Loaded>,
}

struct Loaded {
    key: Arc<CertifiedKey>,
    /// The files' bytes as last read, whether they parsed or not, so that
    /// broken files are not parsed again on every handshake.
    seen: (Vec<u8>, Vec<u8>),
}

impl fmt::Debug for ReloadingCert {
    // Never print the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Reads the pair once; fails when it cannot be served now.
    pub fn load(cert_path: PathBuf, key_path: PathBuf) -> Result<Self, TlsError> {
        let provider = provider();
        let seen = read_files(&cert_path, &key_path)?;
        let key = parse_pair(&cert_path, &seen, &provider)?;
        info!(
            cert = %cert_path.display(),
            sha256 = %fingerprint(&key),
            "serving certificate loaded"
        );
        Ok(Self {
            cert_path,
            key_path,
            provider,
            state: Mutex::new(Loaded {
                key: Arc::new(key),
                seen,
            }),
        })
    }

    /// The pair to serve now: the files' current content when it is a valid
    /// pair, else the last valid one.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let now = match read_files(&self.cert_path, &self.key_path) {
            Ok(now) => now,
            // Missing for a moment (a rotation done by delete and re-create):
            // keep serving, look again at the next handshake.
            Err(e) => {
                warn!("{e}; keeping the previous serving certificate");
                return self.lock().key.clone();
            }
        };
        let mut state = self.lock();
        if now == state.seen {
            return state.key.clone();
        }
        match parse_pair(&self.cert_path, &now, &self.provider) {
            Ok(key) => {
                info!(
                    cert = %self.cert_path.display(),
                    sha256 = %fingerprint(&key),
                    "serving certificate reloaded"
                );
                state.key = Arc::new(key);
            }
            Err(e) => warn!("{e}; keeping the previous serving certificate"),
        }
        state.seen = now;
        state.key.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        // The state is replaced whole, never left half-updated by a panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read_files(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    Ok((read(cert_path)?, read(key_path)?))
}

fn parse_pair(
    cert_path: &Path,
    (cert_pem, key_pem): &(Vec<u8>, Vec<u8>),
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    certified_key(cert_pem, key_pem, provider).map_err(|reason| TlsError::Parse {
        path: cert_path.to_path_buf(),
        reason,
    })
}

/// The SHA-256 of the leaf certificate, to tell certificates apart in logs.
fn fingerprint(key: &CertifiedKey) -> String {
    key.cert
        .first()
        .map(|leaf| {
            Sha256::digest(leaf.as_ref())
                .iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(tempfile::TempDir);

    /// A directory laid out as kubelet lays out a mounted Secret.
    impl Dir {
        fn new() -> Self {
            Self(tempfile::tempdir().unwrap())
        }

        fn publish(&self, stamp: &str, cert: &str, key: &str) {
            let root = self.0.path();
            let data = root.join(stamp);
            std::fs::create_dir(&data).unwrap();
            std::fs::write(data.join("tls.crt"), cert).unwrap();
            std::fs::write(data.join("tls.key"), key).unwrap();
            let tmp = root.join("..data_tmp");
            std::os::unix::fs::symlink(stamp, &tmp).unwrap();
            std::fs::rename(&tmp, root.join("..data")).unwrap();
            for name in ["tls.crt", "tls.key"] {
                let link = root.join(name);
                if link.symlink_metadata().is_err() {
                    std::os::unix::fs::symlink(format!("..data/{name}"), link).unwrap();
                }
            }
        }

        fn cert(&self) -> ReloadingCert {
            ReloadingCert::load(self.0.path().join("tls.crt"), self.0.path().join("tls.key"))
                .unwrap()
        }
    }

    fn issue(ca: &str) -> crate::server::dev_certs::CertKey {
        DevCa::generate(ca)
            .unwrap()
            .issue_server(&["localhost"], &[])
            .unwrap()
    }

    fn der(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec()
    }

    fn served(cert: &ReloadingCert) -> Vec<u8> {
        cert.current().cert[0].to_vec()
    }

    #[test]
    fn a_kubelet_rotation_is_served_and_broken_files_are_not() {
        let dir = Dir::new();
        let (first, second, third) = (issue("ca-1"), issue("ca-2"), issue("ca-3"));
        dir.publish("..2025_01_01_00_00_00.1", &first.cert_pem, &first.key_pem);
        let cert = dir.cert();
        assert_eq!(served(&cert), der(&first.cert_pem));

        dir.publish("..2025_01_01_00_00_00.2", &second.cert_pem, &second.key_pem);
        assert_eq!(served(&cert), der(&second.cert_pem));

        // Half-written: the certificate is cut short.
        let cut = &third.cert_pem[..third.cert_pem.len() / 2];
        dir.publish("..2025_01_01_00_00_00.3", cut, &third.key_pem);
        assert_eq!(served(&cert), der(&second.cert_pem));

        // A key of another pair.
        dir.publish("..2025_01_01_00_00_00.4", &third.cert_pem, &first.key_pem);
        assert_eq!(served(&cert), der(&second.cert_pem));

        dir.publish("..2025_01_01_00_00_00.5", &third.cert_pem, &third.key_pem);
        assert_eq!(served(&cert), der(&third.cert_pem));
    }

    #[test]
    fn files_replaced_in_place_are_seen_too() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (issue("ca-1"), issue("ca-2"));
        let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&crt, &first.cert_pem).unwrap();
        std::fs::write(&key, &first.key_pem).unwrap();
        let cert = ReloadingCert::load(crt.clone(), key.clone()).unwrap();
        // Certificate first, key later, as a non-atomic writer does it.
        std::fs::write(&crt, &second.cert_pem).unwrap();
        assert_eq!(served(&cert), der(&first.cert_pem));
        std::fs::write(&key, &second.key_pem).unwrap();
        assert_eq!(served(&cert), der(&second.cert_pem));
    }

    #[test]
    fn loading_fails_clearly_without_usable_files() {
        let dir = tempfile::tempdir().unwrap();
        let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let err = ReloadingCert::load(crt.clone(), key.clone()).unwrap_err();
        assert!(matches!(err, TlsError::Read { .. }), "{err}");
        let pair = issue("ca");
        std::fs::write(&crt, "not a certificate").unwrap();
        std::fs::write(&key, &pair.key_pem).unwrap();
        let err = ReloadingCert::load(crt, key).unwrap_err();
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
        assert!(!err.to_string().contains("PRIVATE KEY"), "{err}");
    }
}
