//! Certificates for `serve --dev` and for tests: a CA and serving certificates it signs.
//! Production certificates come from cert-manager or certs/gen-certs.sh instead.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

#[derive(Debug, thiserror::Error)]
#[error("generating a certificate: {0}")]
pub struct CertGenError(#[from] rcgen::Error);

/// A CA as PEM text: the certificate to trust and the key that signs.
#[derive(Clone)]
pub struct CertAuthority {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A serving certificate and its key, PEM.
#[derive(Clone)]
pub struct ServingPair {
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn new_ca(common_name: &str) -> Result<CertAuthority, CertGenError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(365);
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok(CertAuthority {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A serving certificate for `names` (DNS names or IP addresses), valid in
/// `[now + from, now + until]`; a negative `until` makes an expired one for tests.
pub fn issue_serving(
    ca: &CertAuthority,
    names: &[&str],
    from: Duration,
    until: Duration,
) -> Result<ServingPair, CertGenError> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names.clone())?;
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().cloned().unwrap_or_default(),
    );
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let now = OffsetDateTime::now_utc();
    params.not_before = now + from;
    params.not_after = now + until;
    sign(params, ca)
}

/// Signs `params` with the CA under a fresh key.
fn sign(params: CertificateParams, ca: &CertAuthority) -> Result<ServingPair, CertGenError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(ServingPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A client certificate (for the API server's side of mutual TLS in tests).
pub fn issue_client(ca: &CertAuthority, common_name: &str) -> Result<ServingPair, CertGenError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(30);
    sign(params, ca)
}
