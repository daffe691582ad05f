//! TLS 1.3 on every connection, with server identity by pinned fingerprint rather than by a
//! certificate authority.
//!
//! Data transfer nodes rarely have certificates from a public CA, and asking admins to run one
//! is how tools end up deployed without encryption. ferry does what ssh does instead: the server
//! makes its own key and self-signed certificate on first start, and the client pins the
//! SHA-256 fingerprint of that certificate, either given on the command line
//! (`--server-fingerprint`) or remembered on first use in a known-hosts file. A changed
//! fingerprint is refused, never silently accepted.
//!
//! Only TLS 1.3 is offered; the cipher suites are rustls's with the aws-lc-rs provider, whose
//! AES-GCM runs at 3.1–3.6 GiB/s per core here (docs/bench/NOTEBOOK.md, "What encryption costs").

use std::fmt;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

/// The name every ferry server certificate carries and every client asks for. Identity comes
/// from the pinned fingerprint, so the name is a constant rather than the host's.
const CERT_NAME: &str = "ferry.invalid";

/// ALPN protocol id: a TLS endpoint that is not ferry fails the handshake instead of receiving
/// ferry frames.
const ALPN: &[u8] = b"ferry/1";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid {what} (PEM): {message}")]
    BadPem {
        path: PathBuf,
        what: &'static str,
        message: String,
    },
    #[error("cannot generate a server key: {0}")]
    Generate(String),
    #[error("TLS setup failed: {0}")]
    Setup(#[from] rustls::Error),
    #[error("`{0}` is not a fingerprint (expected sha256: followed by 64 hex digits)")]
    BadFingerprint(String),
    #[error("{path}:{line}: {message}")]
    KnownHosts {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// SHA-256 of a server certificate (DER).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub fn of(cert_der: &[u8]) -> Self {
        Self(Sha256::digest(cert_der).into())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Fingerprint {
    type Err = TlsError;

    /// Accepts `sha256:` + 64 hex digits, case-insensitive, with or without `:` between bytes
    /// (the form `openssl x509 -fingerprint -sha256` prints).
    fn from_str(s: &str) -> Result<Self, TlsError> {
        let bad = || TlsError::BadFingerprint(s.to_owned());
        let t = s.trim();
        let hexpart = t
            .strip_prefix("sha256:")
            .or_else(|| t.strip_prefix("SHA256:"))
            .unwrap_or(t);
        let digits: String = hexpart.chars().filter(|&c| c != ':').collect();
        ferry_core::digest::unhex32(&digits)
            .map(Self)
            .ok_or_else(bad)
    }
}

/// A server's key and self-signed certificate.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            cert: self.cert.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// A fresh ECDSA P-256 key and certificate, kept in memory only (tests, `serve --oneshot`).
    pub fn generate() -> Result<Self, TlsError> {
        let ck = rcgen::generate_simple_self_signed(vec![CERT_NAME.to_owned()])
            .map_err(|e| TlsError::Generate(e.to_string()))?;
        Ok(Self {
            cert: ck.cert.der().clone(),
            key: PrivateKeyDer::try_from(ck.signing_key.serialize_der())
                .map_err(|e| TlsError::Generate(e.to_string()))?,
        })
    }

    /// Loads `server-key.pem` and `server-cert.pem` from `dir`, creating both on first start.
    /// Two servers starting at once on one state directory take turns on its lock file
    /// (`.lock`, `flock`), so the second reads what the first wrote; each file is written under
    /// a temporary name and renamed, so a crash never leaves half a key or certificate.
    /// Returns whether it was created now.
    pub fn load_or_create(dir: &Path) -> Result<(Self, bool), TlsError> {
        let key_path = dir.join("server-key.pem");
        let cert_path = dir.join("server-cert.pem");
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| TlsError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let _lock = lock_dir(dir).map_err(io(&dir.join(".lock")))?;
        if key_path.exists() || cert_path.exists() {
            let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| TlsError::BadPem {
                path: key_path.clone(),
                what: "private key",
                message: e.to_string(),
            })?;
            let cert = CertificateDer::from_pem_file(&cert_path).map_err(|e| TlsError::BadPem {
                path: cert_path.clone(),
                what: "certificate",
                message: e.to_string(),
            })?;
            let id = Self { cert, key };
            // A key that does not match its certificate would only fail at the first client.
            id.server_config()?;
            return Ok((id, false));
        }
        let ck = rcgen::generate_simple_self_signed(vec![CERT_NAME.to_owned()])
            .map_err(|e| TlsError::Generate(e.to_string()))?;
        let write = |path: &Path, mode: u32, text: &str| -> Result<(), TlsError> {
            let temp = path.with_extension("pem.tmp");
            let _ = std::fs::remove_file(&temp);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&temp)
                .map_err(io(&temp))?;
            f.write_all(text.as_bytes()).map_err(io(&temp))?;
            f.sync_all().map_err(io(&temp))?;
            std::fs::rename(&temp, path).map_err(io(path))
        };
        // The certificate first: a key alone is what marks an identity as made.
        write(&cert_path, 0o644, &ck.cert.pem())?;
        write(&key_path, 0o600, &ck.signing_key.serialize_pem())?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        let id = Self {
            cert: ck.cert.der().clone(),
            key: PrivateKeyDer::try_from(ck.signing_key.serialize_der())
                .map_err(|e| TlsError::Generate(e.to_string()))?,
        };
        Ok((id, true))
    }

    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.cert)
    }
}

/// Holds an exclusive `flock` on `dir/.lock` until dropped (blocking while another process or
/// thread holds it).
pub fn lock_dir(dir: &Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(".lock"))?;
    loop {
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(f);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl Identity {
    pub(crate) fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_single_cert(vec![self.cert.clone()], self.key.clone_key())?;
        cfg.alpn_protocols = vec![ALPN.to_vec()];
        // Clients open several connections at once; tickets let the data connections resume
        // the control connection's TLS session instead of redoing the key exchange.
        cfg.send_tls13_tickets = 4;
        Ok(Arc::new(cfg))
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// How the client decides whether the server is the one it means.
#[derive(Clone, Debug)]
pub enum ServerTrust {
    /// Only this certificate (`--server-fingerprint`, or what `serve --oneshot` announced).
    Pinned(Fingerprint),
    /// Whatever the known-hosts file pins for `host`; on first contact, whatever the server
    /// presents, which is then remembered there (trust on first use, as ssh does).
    KnownHosts { file: KnownHosts, host: String },
}

/// Checks the server certificate against the pin, then the handshake signature against the
/// certificate's key (so a peer that merely replays the certificate fails).
#[derive(Debug)]
struct PinVerifier {
    /// `None` on first use: any certificate, recorded in `seen`.
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

/// A client TLS configuration for one session: every connection of the session shares it,
/// and with it the session-resumption cache.
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    verifier: Arc<PinVerifier>,
}

impl ClientTls {
    pub(crate) fn new(pin: Option<Fingerprint>) -> Result<Self, TlsError> {
        Self::with_alpn(pin, ALPN)
    }

    /// A client that speaks `alpn` (e.g. `http/1.1` to the transfer service's API) and trusts
    /// only the certificate `pin` names, or on first use (`None`) any, recorded in `seen`.
    pub fn with_alpn(pin: Option<Fingerprint>, alpn: &[u8]) -> Result<Self, TlsError> {
        let provider = provider();
        let verifier = Arc::new(PinVerifier {
            pin,
            seen: Mutex::new(None),
            provider: provider.clone(),
        });
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone())
            .with_no_client_auth();
        cfg.alpn_protocols = vec![alpn.to_vec()];
        Ok(Self {
            config: Arc::new(cfg),
            verifier,
        })
    }

    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.config.clone())
    }

    /// The name every ferry certificate carries; the fingerprint, not the name, is checked.
    pub fn server_name() -> ServerName<'static> {
        ServerName::try_from(CERT_NAME).expect("a valid DNS name")
    }

    pub(crate) fn pin(&self) -> Option<Fingerprint> {
        self.verifier.pin
    }

    /// The fingerprint the last handshake presented.
    pub fn seen(&self) -> Option<Fingerprint> {
        *self.verifier.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The client's memory of servers: one `HOST:PORT FINGERPRINT` per line, `#` comments.
///
/// Keyed by the address the user typed (not the resolved IP), like ssh's known_hosts, so a
/// server behind a changing DNS record keeps its pin.
#[derive(Debug, Clone)]
pub struct KnownHosts {
    path: PathBuf,
}

/// What the known-hosts file says about a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    Pinned {
        fingerprint: Fingerprint,
        line: usize,
    },
    Unknown,
}

impl KnownHosts {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn lookup(&self, host: &str) -> Result<Known, TlsError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Known::Unknown),
            Err(source) => {
                return Err(TlsError::Io {
                    path: self.path.clone(),
                    source,
                })
            }
        };
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let mut parts = l.split_whitespace();
            let (Some(h), Some(fp), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(TlsError::KnownHosts {
                    path: self.path.clone(),
                    line: line_no,
                    message: "expected `HOST:PORT sha256:FINGERPRINT`".into(),
                });
            };
            if h == host {
                let fingerprint = fp.parse().map_err(|e: TlsError| TlsError::KnownHosts {
                    path: self.path.clone(),
                    line: line_no,
                    message: e.to_string(),
                })?;
                return Ok(Known::Pinned {
                    fingerprint,
                    line: line_no,
                });
            }
        }
        Ok(Known::Unknown)
    }

    /// Appends a pin (creating the file and its directory). Appends are one `write` of one
    /// line, so two clients pinning at once cannot interleave within a line.
    pub fn add(&self, host: &str, fingerprint: Fingerprint) -> Result<(), TlsError> {
        let io = |source| TlsError::Io {
            path: self.path.clone(),
            source,
        };
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o644)
            .open(&self.path)
            .map_err(io)?;
        f.write_all(format!("{host} {fingerprint}\n").as_bytes())
            .map_err(io)?;
        f.sync_all().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_text_round_trip_and_forms() {
        let fp = Fingerprint::of(b"cert");
        let s = fp.to_string();
        assert!(s.starts_with("sha256:") && s.len() == 7 + 64);
        assert_eq!(s.parse::<Fingerprint>().unwrap(), fp);
        let colons: String =
            fp.0.iter()
                .map(|b| format!("{b:02X}"))
                .collect::<Vec<_>>()
                .join(":");
        assert_eq!(colons.parse::<Fingerprint>().unwrap(), fp);
        assert!("sha256:abc".parse::<Fingerprint>().is_err());
        assert!(format!("sha256:{}", "g".repeat(64))
            .parse::<Fingerprint>()
            .is_err());
    }

    #[test]
    fn identity_persists_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let (a, created) = Identity::load_or_create(dir.path()).unwrap();
        assert!(created);
        let (b, created) = Identity::load_or_create(dir.path()).unwrap();
        assert!(!created);
        assert_eq!(a.fingerprint(), b.fingerprint());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("server-key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "the key must not be readable by others");
    }

    /// Servers starting together on a fresh state directory: every one gets the same key, none
    /// reads a half-written file (before the lock, one of two failed on the certificate).
    #[test]
    fn servers_starting_together_share_one_identity() {
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("state");
            let prints: Vec<_> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..8)
                    .map(|_| {
                        s.spawn(|| Identity::load_or_create(&path).map(|(id, _)| id.fingerprint()))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let first = prints[0].as_ref().unwrap().to_string();
            for p in &prints {
                assert_eq!(p.as_ref().unwrap().to_string(), first);
            }
        }
    }

    #[test]
    fn corrupt_key_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        Identity::load_or_create(dir.path()).unwrap();
        std::fs::write(dir.path().join("server-key.pem"), "garbage").unwrap();
        let e = Identity::load_or_create(dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("server-key.pem"), "{e}");
    }

    #[test]
    fn known_hosts_lookup_add_and_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let kh = KnownHosts::new(dir.path().join("sub/known_hosts"));
        assert_eq!(kh.lookup("a:1").unwrap(), Known::Unknown);
        let fp = Fingerprint::of(b"x");
        kh.add("a:1", fp).unwrap();
        kh.add("b:2", Fingerprint::of(b"y")).unwrap();
        assert_eq!(
            kh.lookup("a:1").unwrap(),
            Known::Pinned {
                fingerprint: fp,
                line: 1
            }
        );
        assert_eq!(kh.lookup("a:2").unwrap(), Known::Unknown);
        std::fs::write(kh.path(), "# c\n\njunk\n").unwrap();
        let e = kh.lookup("a:1").unwrap_err().to_string();
        assert!(e.contains(":3:"), "{e}");
    }
}
