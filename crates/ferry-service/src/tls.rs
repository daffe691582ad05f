//! TLS for the HTTP API: the service's key and self-signed certificate made and kept as
//! `ferry serve` keeps its own (ferry-net's `Identity::load_or_create`, in the state
//! directory's `tls/`), and a client that pins the certificate's SHA-256 fingerprint, given
//! or remembered on first use in a known-hosts file, as ferry's clients pin servers.

use std::path::Path;
use std::sync::Arc;

use ferry_net::tls::ClientTls;
use ferry_net::{Fingerprint, Identity};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::ServiceError;

const ALPN: &[u8] = b"http/1.1";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn tls_err(e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Tls(e.to_string())
}

/// The service's TLS configuration and the fingerprint clients pin, from `dir` (created on
/// first start).
pub fn server_config(dir: &Path) -> Result<(Arc<rustls::ServerConfig>, Fingerprint), ServiceError> {
    let (id, _) = Identity::load_or_create(dir).map_err(tls_err)?;
    let cert = CertificateDer::from_pem_file(dir.join("server-cert.pem")).map_err(tls_err)?;
    let key = PrivateKeyDer::from_pem_file(dir.join("server-key.pem")).map_err(tls_err)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .map_err(tls_err)?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok((Arc::new(cfg), id.fingerprint()))
}

/// How a client knows the service is the one it means: as ferry's clients know servers, a
/// pinned fingerprint or the known-hosts file (trust on first use).
pub use ferry_net::ServerTrust as Trust;

/// Opens a TLS connection to `addr` that only the trusted certificate completes; a first
/// contact through known hosts records the certificate it met.
pub async fn connect(
    addr: &str,
    trust: &Trust,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, ServiceError> {
    let pin = match trust {
        Trust::Pinned(fp) => Some(*fp),
        Trust::KnownHosts { file, host } => match file.lookup(host).map_err(tls_err)? {
            ferry_net::tls::Known::Pinned { fingerprint, .. } => Some(fingerprint),
            ferry_net::tls::Known::Unknown => None,
        },
    };
    let tls = ClientTls::with_alpn(pin, ALPN).map_err(tls_err)?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| ServiceError::Io {
            what: format!("connecting to the service at {addr}"),
            source,
        })?;
    // Requests and answers are small and a kept connection carries many: no Nagle wait on
    // a write's second segment for the peer's delayed ACK.
    let _ = tcp.set_nodelay(true);
    let stream = tls
        .connector()
        .connect(ClientTls::server_name(), tcp)
        .await
        .map_err(|e| match (pin, tls.seen()) {
            (Some(want), Some(got)) if want != got => ServiceError::Tls(format!(
                "the service at {addr} presented {got}, not the pinned {want}: another \
                     service, or its key changed"
            )),
            _ => ServiceError::Tls(format!("handshake with the service at {addr}: {e}")),
        })?;
    if let (Trust::KnownHosts { file, host }, None) = (trust, pin) {
        if let Some(fp) = tls.seen() {
            file.add(host, fp).map_err(tls_err)?;
        }
    }
    Ok(stream)
}
