//! The TLS client configuration for `https://` upstreams.

use std::sync::Arc;

use tokio_rustls::TlsConnector;

/// A TLS connector trusting Mozilla's root certificates (webpki-roots, compiled in: no
/// certificate store is read at run time), with the ring provider and safe default protocol
/// versions, offering HTTP/1.1 by ALPN (the only protocol this crate speaks).
pub fn tls_connector() -> Result<TlsConnector, rustls::Error> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}
