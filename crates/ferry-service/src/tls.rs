//! TLS for the HTTP API: the service's key and self-signed certificate made and kept as
//! `ferry serve` keeps its own (ferry-net's `Identity::load_or_create`, in the state
//! directory's `tls/`), and a client that pins the certificate's SHA-256 fingerprint, given
//! or remembered on first use in a known-hosts file, as ferry's clients pin servers.

use std::path::Path;
use std::sync::{Arc, Mutex};

use ferry_net::{Fingerprint, Identity, KnownHosts};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::error::ServiceError;

/// The name in the certificate (ferry's), which the client presents and never checks: the
/// fingerprint is what identifies the service.
const CERT_NAME: &str = "ferry.invalid";
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

/// How a client knows the service is the one it means.
#[derive(Clone, Debug)]
pub enum Trust {
    /// Only this certificate (`--service-fingerprint`, or what the service printed at start).
    Pinned(Fingerprint),
    /// What the known-hosts file pins for `host`; on first contact, what the service presents,
    /// then remembered there.
    KnownHosts { file: KnownHosts, host: String },
}

/// Checks the certificate against the pin, then the handshake's signature against it.
#[derive(Debug)]
struct PinVerifier {
    pin: Option<Fingerprint>,
    seen: Mutex<Option<Fingerprint>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = Fingerprint::of(end_entity);
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(got);
        match self.pin {
            Some(want) if want != got => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            )),
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

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
    let provider = provider();
    let verifier = Arc::new(PinVerifier {
        pin,
        seen: Mutex::new(None),
        provider: provider.clone(),
    });
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| ServiceError::Io {
            what: format!("connecting to the service at {addr}"),
            source,
        })?;
    let name = ServerName::try_from(CERT_NAME).map_err(tls_err)?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .map_err(|e| {
            let seen = *verifier.seen.lock().unwrap_or_else(|e| e.into_inner());
            match (pin, seen) {
                (Some(want), Some(got)) if want != got => ServiceError::Tls(format!(
                    "the service at {addr} presented {got}, not the pinned {want}: another \
                     service, or its key changed"
                )),
                _ => ServiceError::Tls(format!("handshake with the service at {addr}: {e}")),
            }
        })?;
    if let (Trust::KnownHosts { file, host }, None) = (trust, pin) {
        let seen = *verifier.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fp) = seen {
            file.add(host, fp).map_err(tls_err)?;
        }
    }
    Ok(stream)
}
