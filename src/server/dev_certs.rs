//! Development certificates: a throw-away CA and the certificates it signs.
//!
//! Used for the local control plane of the tests and the demo (API server
//! serving certificate, admin client certificate) and for the webhook's
//! serving certificate when cert-manager is not there. Keys are generated
//! fresh every time and never committed.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

#[derive(Debug, thiserror::Error)]
pub enum DevCertError {
    #[error("generating a development certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// A PEM certificate and its PEM (PKCS#8) private key.
pub struct CertKey {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CertKey {
    // The key is a secret: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertKey").finish_non_exhaustive()
    }
}

/// A self-signed certificate authority held in memory.
pub struct DevCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl DevCa {
    pub fn generate(common_name: &str) -> Result<Self, DevCertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A serving certificate for the given DNS names and IP addresses.
    pub fn issue_server(
        &self,
        dns_names: &[&str],
        ips: &[IpAddr],
    ) -> Result<CertKey, DevCertError> {
        let mut params =
            CertificateParams::new(dns_names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.distinguished_name.push(
            DnType::CommonName,
            dns_names.first().copied().unwrap_or("captf"),
        );
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate: Kubernetes reads the user from the common name and
    /// the groups from the organizations.
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<CertKey, DevCertError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<CertKey, DevCertError> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_are_pem_and_debug_hides_the_key() {
        let ca = DevCa::generate("test-ca").unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let server = ca
            .issue_server(&["localhost"], &["127.0.0.1".parse().unwrap()])
            .unwrap();
        assert!(server.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(server.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let client = ca.issue_client("admin", &["system:masters"]).unwrap();
        assert!(!format!("{client:?}").contains("PRIVATE KEY"));
    }
}
