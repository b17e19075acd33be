//! TLS for the service listener: certificates from PEM files, ALPN
//! offering h2 and http/1.1, rustls with the ring provider.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Why the TLS listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file is unreadable or holds no certificate.
    #[error("tls_cert {path}: {message}")]
    Cert {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The key file is unreadable or holds no private key.
    #[error("tls_key {path}: {message}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// rustls refused the pair (e.g. the key does not match).
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Certificate chain and key files for the service listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Loads the files and builds an acceptor that offers h2 then http/1.1.
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    let certs = load_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|error| TlsError::Key {
        path: files.key.clone(),
        message: error.to_string(),
    })?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let error = |message: String| TlsError::Cert {
        path: path.to_owned(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| error(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(e.to_string()))?;
    if certs.is_empty() {
        return Err(error("no certificate in the file".to_owned()));
    }
    Ok(certs)
}
