//! TLS for the admission port: rustls with a certificate that can be swapped at run time.
//! TLS 1.2 and 1.3 only; optional verification of the API server's client certificate.

use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: PathBuf },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("the certificate in {cert} does not match the key in {key}: {message}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        message: String,
    },
    #[error("the certificate in {path} expired or is not yet valid ({message})")]
    Expired { path: PathBuf, message: String },
    #[error("TLS setup: {0}")]
    Setup(String),
}

/// PEM bytes of a certificate chain and its key, as read from disk.
#[derive(Clone, PartialEq, Eq)]
pub struct PemPair {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

pub fn read_pair(cert: &Path, key: &Path) -> Result<PemPair, TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    Ok(PemPair {
        cert: read(cert)?,
        key: read(key)?,
    })
}

/// Parses and checks a pair: the key must sign for the certificate, and the
/// certificate must be valid at `now_unix` seconds.
pub fn certified_key(
    pair: &PemPair,
    cert_path: &Path,
    key_path: &Path,
    now_unix: i64,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pair.cert)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Invalid {
            path: cert_path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_path_buf(),
        });
    }
    check_validity(&certs[0], cert_path, now_unix)?;
    // The first PKCS#8, PKCS#1 or SEC1 key in the file, other sections skipped.
    let key = match PrivateKeyDer::from_pem_slice(&pair.key) {
        Ok(key) => key,
        Err(pem::Error::NoItemsFound) => {
            return Err(TlsError::NoKey {
                path: key_path.to_path_buf(),
            })
        }
        Err(e) => {
            return Err(TlsError::Invalid {
                path: key_path.to_path_buf(),
                message: e.to_string(),
            })
        }
    };
    let provider = default_provider();
    let signing_key =
        provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| TlsError::Invalid {
                path: key_path.to_path_buf(),
                message: e.to_string(),
            })?;
    let certified = CertifiedKey::new(certs, signing_key);
    certified.keys_match().map_err(|e| TlsError::Mismatch {
        cert: cert_path.to_path_buf(),
        key: key_path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(Arc::new(certified))
}

/// notBefore/notAfter of the leaf, read with x509-parser through rcgen's dependency tree.
fn check_validity(cert: &CertificateDer<'_>, path: &Path, now_unix: i64) -> Result<(), TlsError> {
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| TlsError::Invalid {
            path: path.to_path_buf(),
            message: format!("not an X.509 certificate: {e}"),
        })?;
    let validity = parsed.validity();
    let not_before = validity.not_before.timestamp();
    let not_after = validity.not_after.timestamp();
    if now_unix < not_before || now_unix > not_after {
        return Err(TlsError::Expired {
            path: path.to_path_buf(),
            message: format!(
                "valid from {} to {}",
                validity.not_before, validity.not_after
            ),
        });
    }
    Ok(())
}

/// Serves whatever certificate was stored last; the reloader swaps it.
#[derive(Debug)]
pub struct SwappableCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl SwappableCert {
    pub fn new(key: Arc<CertifiedKey>) -> Arc<SwappableCert> {
        Arc::new(SwappableCert {
            current: RwLock::new(key),
        })
    }

    pub fn swap(&self, key: Arc<CertifiedKey>) {
        match self.current.write() {
            Ok(mut guard) => *guard = key,
            Err(poisoned) => *poisoned.into_inner() = key,
        }
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The rustls configuration: TLS 1.2+, h2 and http/1.1, optional client verification.
pub fn server_config(
    cert: Arc<SwappableCert>,
    client_ca: Option<&[u8]>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let builder = match client_ca {
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| TlsError::Setup(format!("client CA: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| TlsError::Setup(format!("client CA: {e}")))?;
            }
            if roots.is_empty() {
                return Err(TlsError::Setup(
                    "client CA file holds no certificate".into(),
                ));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Setup(format!("client CA: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
