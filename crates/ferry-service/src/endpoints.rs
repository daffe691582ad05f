//! The servers the service may reach and how: a TOML file in the state directory
//! (`endpoints.toml`), one `[[endpoint]]` a server, with the token the service logs in with
//! and, optionally, the certificate fingerprint it pins. A server with no fingerprint is
//! trusted on first use through the service's own known-hosts file, as the CLI does.

use std::path::{Path, PathBuf};

use ferry_net::{KnownHosts, Security, ServerTrust};
use serde::Deserialize;

use crate::error::ServiceError;

/// The endpoints file in the state directory.
pub const ENDPOINTS_FILE: &str = "endpoints.toml";
/// The service's memory of server keys, in the state directory.
pub const KNOWN_HOSTS_FILE: &str = "known_hosts";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, rename = "endpoint")]
    endpoints: Vec<Endpoint>,
}

/// One server as the service reaches it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// `host:port`, as jobs name it.
    pub server: String,
    pub token: String,
    /// `sha256:HEX` of the server's certificate; absent: trust on first use.
    pub fingerprint: Option<String>,
    /// Plain TCP (a server started with `--allow-plaintext`); anyone on the path reads the data.
    #[serde(default)]
    pub plaintext: bool,
}

/// The endpoints, read once at start (a restart picks up a change).
#[derive(Clone, Debug)]
pub struct Endpoints {
    list: Vec<Endpoint>,
    known_hosts: PathBuf,
}

impl Endpoints {
    /// Reads `path`; a missing file is no endpoints (jobs then fail with why).
    pub fn load(path: &Path, known_hosts: PathBuf) -> Result<Self, ServiceError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => {
                return Err(ServiceError::Io {
                    what: path.display().to_string(),
                    source,
                })
            }
        };
        let file: File = toml::from_str(&text)
            .map_err(|e| ServiceError::Invalid(format!("{}: {e}", path.display())))?;
        let list = Self::from_list(file.endpoints, known_hosts)?;
        Ok(list)
    }

    /// Endpoints given directly (tests, and a file already read); fingerprints are checked now.
    pub fn from_list(list: Vec<Endpoint>, known_hosts: PathBuf) -> Result<Self, ServiceError> {
        for e in &list {
            if let Some(fp) = &e.fingerprint {
                fp.parse::<ferry_net::Fingerprint>().map_err(|err| {
                    ServiceError::Invalid(format!("endpoint {}: {err}", e.server))
                })?;
            }
        }
        Ok(Self { list, known_hosts })
    }

    /// The servers named, in the file's order: the links the service keeps a history of.
    pub fn servers(&self) -> impl Iterator<Item = &str> {
        self.list.iter().map(|e| e.server.as_str())
    }

    /// Whether `server` is one of the endpoints.
    pub fn has(&self, server: &str) -> bool {
        self.list.iter().any(|e| e.server == server)
    }

    /// The token and the protection for `server`, or why the service cannot reach it.
    pub fn reach(&self, server: &str) -> Result<(String, Security), ServiceError> {
        let e = self
            .list
            .iter()
            .find(|e| e.server == server)
            .ok_or_else(|| {
                ServiceError::Invalid(format!(
                "the service has no endpoint for {server} (add it to {ENDPOINTS_FILE} with the \
                 token to log in with)"
            ))
            })?;
        let security = match (&e.fingerprint, e.plaintext) {
            (_, true) => Security::Plaintext,
            (Some(fp), false) => Security::Tls(ServerTrust::Pinned(
                fp.parse()
                    .map_err(|err| ServiceError::Invalid(format!("{err}")))?,
            )),
            (None, false) => Security::Tls(ServerTrust::KnownHosts {
                file: KnownHosts::new(self.known_hosts.clone()),
                host: server.to_owned(),
            }),
        };
        Ok((e.token.clone(), security))
    }
}
