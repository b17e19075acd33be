//! TLS for the service listener: certificates from PEM files, ALPN
//! offering h2 and http/1.1, rustls with the ring provider.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::InconsistentKeys;
use tokio_rustls::TlsAcceptor;

/// Why the TLS listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file is unreadable, not PEM, holds no certificate or its first
    /// certificate is not X.509.
    #[error("tls_cert {path}: {message}")]
    Cert {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The key file is unreadable, not PEM, holds no usable private key, or the key does
    /// not match the certificate.
    #[error("tls_key {path}: {message}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// rustls refused the configuration for another reason.
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
///
/// `wharf serve` calls it before it accepts, and `wharf check` calls it too, so a config
/// that `check` passes names TLS files that `serve` can start with.
///
/// # Errors
///
/// Each file problem names its file: unreadable, not PEM, no certificate or private key in
/// it, a certificate that is not X.509, a key that is not RSA, ECDSA or EdDSA
/// ([`TlsError::Cert`], [`TlsError::Key`]); a key that does not match the certificate is
/// the key's ([`TlsError::Key`]).
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certified = certified_key(files, &provider)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The chain and its key, checked as `with_single_cert` checks them (the key parses, its
/// public half is the leaf's) but each failure blamed on its file: rustls reports a
/// mismatch as "keys may not be consistent: KeyMismatch", naming neither.
fn certified_key(files: &TlsFiles, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let certs = load_certs(&files.cert)?;
    let key_error = |message: String| TlsError::Key {
        path: files.key.clone(),
        message,
    };
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|error| {
        key_error(match error {
            // rustls reads no encrypted key, and finds none in such a file: say why.
            pem::Error::NoItemsFound if is_encrypted_key(&files.key) => {
                "an encrypted private key, which wharf cannot read (decrypt it, e.g. \
                 `openssl pkey -in key.pem -out plain-key.pem`)"
                    .to_owned()
            }
            pem::Error::NoItemsFound => format!("no private key in the file ({KEY_PEM})"),
            other => pem_message(other),
        })
    })?;
    let curve = unsupported_curve(key.secret_der());
    let key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|error| {
            let why = match (curve, error) {
                // rustls says only "failed to parse private key as RSA, ECDSA, or EdDSA".
                (Some(curve), _) => format!("a key on {curve}, which wharf's TLS cannot use"),
                (None, rustls::Error::General(why)) => why,
                (None, other) => other.to_string(),
            };
            key_error(format!(
                "not a usable private key: {why}; wharf takes {USABLE_KEYS}"
            ))
        })?;
    let certified = CertifiedKey::new(certs, key);
    match certified.keys_match() {
        // A key that cannot tell its public half: rustls accepts it too.
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => Err(key_error(
            format!("does not match the certificate in {}", files.cert.display()),
        )),
        Err(rustls::Error::InvalidCertificate(why)) => Err(TlsError::Cert {
            path: files.cert.clone(),
            message: format!("the first certificate is not a valid X.509 certificate: {why}"),
        }),
        Err(other) => Err(TlsError::Rustls(other)),
    }
}

/// Whether the file at `path` holds a PKCS#8 encrypted key (`ENCRYPTED PRIVATE KEY`).
fn is_encrypted_key(path: &Path) -> bool {
    const MARKER: &[u8] = b"-----BEGIN ENCRYPTED PRIVATE KEY-----";
    std::fs::read(path).is_ok_and(|bytes| bytes.windows(MARKER.len()).any(|w| w == MARKER))
}

/// The keys ring signs with (its RSA signing keys are 2048 to 4096 bits), for messages.
const USABLE_KEYS: &str =
    "RSA keys of 2048 to 4096 bits, ECDSA keys on P-256 or P-384, and Ed25519 keys";

/// The curve of a key that parses but that ring cannot sign with, found by the curve's
/// object identifier (DER-encoded, tag and length included) in the key's DER: both the
/// PKCS#8 and the SEC1 forms name the curve that way. OpenSSL makes such keys on request
/// (`ec_paramgen_curve:P-521` is a common pick for "strongest"), and rustls's refusal does
/// not name the curve. Scanned at each load (start-up, `wharf check`); only used if ring
/// refuses the key.
fn unsupported_curve(der: &[u8]) -> Option<&'static str> {
    const CURVES: [(&str, &[u8]); 8] = [
        ("P-521 (secp521r1)", &[6, 5, 0x2b, 0x81, 4, 0, 0x23]),
        ("P-224 (secp224r1)", &[6, 5, 0x2b, 0x81, 4, 0, 0x21]),
        ("secp256k1", &[6, 5, 0x2b, 0x81, 4, 0, 0x0a]),
        (
            "P-192 (prime192v1)",
            &[6, 8, 0x2a, 0x86, 0x48, 0xce, 0x3d, 3, 1, 1],
        ),
        ("brainpoolP256r1", &[6, 9, 0x2b, 0x24, 3, 3, 2, 8, 1, 1, 7]),
        (
            "brainpoolP384r1",
            &[6, 9, 0x2b, 0x24, 3, 3, 2, 8, 1, 1, 0x0b],
        ),
        (
            "brainpoolP512r1",
            &[6, 9, 0x2b, 0x24, 3, 3, 2, 8, 1, 1, 0x0d],
        ),
        ("Ed448", &[6, 3, 0x2b, 0x65, 0x71]),
    ];
    CURVES
        .iter()
        .find(|(_, oid)| der.windows(oid.len()).any(|w| w == *oid))
        .map(|(name, _)| *name)
}

/// What a key file must hold, for messages.
const KEY_PEM: &str = "PEM \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\" expected";

/// A PEM reading error in our words.
fn pem_message(error: pem::Error) -> String {
    match error {
        pem::Error::Io(error) => format!("cannot read: {error}"),
        other => format!("not valid PEM: {other}"),
    }
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let error = |message: String| TlsError::Cert {
        path: path.to_owned(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| error(pem_message(e)))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(pem_message(e)))?;
    if certs.is_empty() {
        return Err(error(
            "no certificate in the file (PEM \"CERTIFICATE\" blocks expected, leaf first)"
                .to_owned(),
        ));
    }
    Ok(certs)
}
