//! TLS for the client listener (`--tls-cert`, `--tls-key`), with rustls: TLS 1.2 and 1.3, HTTP/1.1
//! over it. The files are read once at start-up; a renewed certificate takes a restart.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// The acceptor for the certificate chain in `cert` and its private key in `key` (both PEM).
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            format!(
                "cannot read a PEM certificate chain from {}: {e}",
                cert.display()
            )
        })?;
    if chain.is_empty() {
        return Err(format!("{} holds no certificate", cert.display()));
    }
    let private_key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("cannot read a PEM private key from {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, private_key)
        .map_err(|e| {
            format!(
                "the key {} does not go with the certificate {}: {e}",
                key.display(),
                cert.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
