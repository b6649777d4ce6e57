//! TLS for the protocol: the server's certificate and key, the clients'
//! trusted CA, loaded from PEM files into rustls configurations. One home
//! for both sides, so the two agree on versions (TLS 1.2 and 1.3, rustls'
//! safe defaults) and on the crypto provider (ring).
//!
//! The protocol runs unchanged inside TLS: the same frames, the same
//! hello with its token and session secret, which TLS keeps off the
//! network in clear.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Why a TLS setting could not be used; each names the file and the step.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {what}")]
    File { path: PathBuf, what: String },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("{0:?} is not a name or address a certificate can be checked against")]
    ServerName(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file; at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |what: String| TlsError::File { path: path.to_owned(), what };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(format!("cannot read certificates: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into()));
    }
    Ok(certs)
}

/// The server side: the certificate chain (leaf first) and its private key
/// (PKCS#8, PKCS#1 or SEC1 PEM).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError::File { path: key.to_owned(), what: format!("no usable PEM private key: {e}") })?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    Ok(Arc::new(config))
}

/// The client side: servers are trusted if their certificate chains to a
/// CA in `ca` (a PEM file of one or more certificates) and names the host
/// the client connects to.
pub fn client_config(ca: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca)? {
        roots
            .add(cert)
            .map_err(|e| TlsError::File { path: ca.to_owned(), what: format!("not a usable CA certificate: {e}") })?;
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The name the server's certificate must carry for `addr` (HOST:PORT,
/// `[v6]:PORT`): a DNS name, or an IP address.
pub fn server_name(addr: &str) -> Result<ServerName<'static>, TlsError> {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => addr,
    };
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    ServerName::try_from(host.to_string()).map_err(|_| TlsError::ServerName(host.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_come_from_the_host_part() {
        assert_eq!(server_name("localhost:7420").unwrap(), ServerName::try_from("localhost").unwrap());
        assert_eq!(server_name("127.0.0.1:7420").unwrap(), ServerName::try_from("127.0.0.1").unwrap());
        assert_eq!(server_name("[::1]:7420").unwrap(), ServerName::try_from("::1").unwrap());
        assert!(server_name("bad name:1").is_err());
    }

    #[test]
    fn a_file_without_certificates_is_refused_with_its_name() {
        let dir = std::env::temp_dir().join(format!("interlock-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("empty.pem");
        std::fs::write(&f, "not pem").unwrap();
        let e = client_config(&f).unwrap_err().to_string();
        assert!(e.contains("empty.pem") && e.contains("no PEM certificate"), "{e}");
        let e = client_config(&dir.join("missing.pem")).unwrap_err().to_string();
        assert!(e.contains("missing.pem"), "{e}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
