//! Who may do what: named tokens with path scopes, stored hashed, and a brake on guessing.
//!
//! The token file is TOML, one `[[token]]` table per token:
//!
//! ```toml
//! [[token]]
//! name = "alice"
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! read = ["/"]              # prefixes (relative to the server root) it may get and list
//! write = ["/incoming"]     # prefixes it may put into
//! read_only = false         # true: no writes at all, whatever `write` says
//! ```
//!
//! Only the SHA-256 of a token is stored. Tokens are 192 random bits made by `ferry token
//! add`, so a fast hash is enough: there is nothing to brute-force that a password hash's cost
//! would protect (that cost is for low-entropy passwords). The server re-reads the file when
//! its modification time changes, so `ferry token revoke` takes effect at the next login
//! without a restart.

use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ferry_core::path;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("token `{0}` already exists (revoke it first, or pick another name)")]
    Exists(String),
    #[error("no token named `{0}`")]
    NoSuchToken(String),
    #[error("{0}")]
    Invalid(String),
}

/// One token as stored: its name, the hash of its secret, and its scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub name: String,
    /// Lower-case hex SHA-256 of the token.
    pub sha256: String,
    #[serde(default = "everything")]
    pub read: Vec<String>,
    #[serde(default = "everything")]
    pub write: Vec<String>,
    #[serde(default)]
    pub read_only: bool,
}

fn everything() -> Vec<String> {
    vec!["/".into()]
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    #[serde(default, rename = "token")]
    pub tokens: Vec<TokenEntry>,
}

/// What an authenticated client may touch: normalised prefixes, relative to the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub name: String,
    read: Vec<String>,
    write: Vec<String>,
}

impl Grant {
    /// A token that may read and write everything under the root.
    pub fn full(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            read: vec![String::new()],
            write: vec![String::new()],
        }
    }

    fn from_entry(e: &TokenEntry) -> Result<Self, AccessError> {
        let norm = |v: &[String]| -> Result<Vec<String>, AccessError> {
            v.iter()
                .map(|p| {
                    path::normalize_remote(p).map_err(|err| {
                        AccessError::Invalid(format!("token `{}`: prefix `{p}`: {err}", e.name))
                    })
                })
                .collect()
        };
        Ok(Self {
            name: e.name.clone(),
            read: norm(&e.read)?,
            write: if e.read_only {
                Vec::new()
            } else {
                norm(&e.write)?
            },
        })
    }

    /// `rel` is a normalised path (no leading `/`, no `..`).
    pub fn may_read(&self, rel: &str) -> bool {
        self.read.iter().any(|p| under(rel, p))
    }

    /// Whether any read scope is granted (what a network probe needs: it touches no path).
    pub fn may_read_something(&self) -> bool {
        !self.read.is_empty()
    }

    pub fn may_write(&self, rel: &str) -> bool {
        self.write.iter().any(|p| under(rel, p))
    }

    /// The read prefix that covers `rel` (the widest, when several do): the directory its
    /// operation is confined beneath.
    pub fn read_scope(&self, rel: &str) -> Option<&str> {
        widest(&self.read, rel)
    }

    /// The write prefix that covers `rel` (the widest, when several do).
    pub fn write_scope(&self, rel: &str) -> Option<&str> {
        widest(&self.write, rel)
    }
}

fn widest<'a>(prefixes: &'a [String], rel: &str) -> Option<&'a str> {
    prefixes
        .iter()
        .filter(|p| under(rel, p))
        .min_by_key(|p| p.len())
        .map(String::as_str)
}

/// `rel` (covered by `prefix`) as a path inside `prefix`.
pub fn inside<'a>(rel: &'a str, prefix: &str) -> &'a str {
    if prefix.is_empty() {
        rel
    } else {
        rel[prefix.len()..].trim_start_matches('/')
    }
}

/// Whether `rel` is `prefix` or inside it, by whole path components (`/data2` is not in `/data`).
fn under(rel: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || rel == prefix
        || (rel.len() > prefix.len()
            && rel.starts_with(prefix)
            && rel.as_bytes()[prefix.len()] == b'/')
}

pub fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A parsed token list, ready to check logins against.
#[derive(Clone, Debug, Default)]
pub struct AccessList {
    entries: Vec<([u8; 32], Grant)>,
}

impl AccessList {
    /// One full-access token, kept in memory (tests, `serve --oneshot`, `--token-file`).
    pub fn single(name: &str, token: &str) -> Self {
        Self {
            entries: vec![(hash_token(token), Grant::full(name))],
        }
    }

    pub fn from_file(file: &TokenFile) -> Result<Self, AccessError> {
        let mut entries = Vec::with_capacity(file.tokens.len());
        for e in &file.tokens {
            let hash = ferry_core::digest::unhex32(&e.sha256).ok_or_else(|| {
                AccessError::Invalid(format!("token `{}`: sha256 must be 64 hex digits", e.name))
            })?;
            entries.push((hash, Grant::from_entry(e)?));
        }
        Ok(Self { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The grant of the token, comparing against every entry in constant time so the time
    /// taken says nothing about which entry (or how much of one) matched.
    pub fn authenticate(&self, token: &str) -> Option<Grant> {
        let h = hash_token(token);
        let mut found = None;
        for (hash, grant) in &self.entries {
            if bool::from(hash.ct_eq(&h)) && found.is_none() {
                found = Some(grant.clone());
            }
        }
        found
    }
}

/// Where the server gets its tokens from.
#[derive(Debug)]
pub enum Access {
    Fixed(Arc<AccessList>),
    /// A token file, re-read when its modification time changes.
    File {
        path: PathBuf,
        cache: Mutex<Option<(SystemTime, Arc<AccessList>)>>,
    },
}

impl Access {
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self::File {
            path: path.into(),
            cache: Mutex::new(None),
        }
    }

    /// The current list. A file that has become unreadable or invalid is an error (every login
    /// fails, and the server logs why) rather than a fallback to the last good list, so a
    /// revoked token cannot keep working because of a typo elsewhere in the file.
    pub fn current(&self) -> Result<Arc<AccessList>, AccessError> {
        match self {
            Self::Fixed(l) => Ok(l.clone()),
            Self::File { path, cache } => {
                let mtime =
                    std::fs::metadata(path)
                        .and_then(|m| m.modified())
                        .map_err(|source| AccessError::Io {
                            path: path.clone(),
                            source,
                        })?;
                let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((t, list)) = c.as_ref() {
                    if *t == mtime {
                        return Ok(list.clone());
                    }
                }
                let list = Arc::new(AccessList::from_file(&load(path)?)?);
                *c = Some((mtime, list.clone()));
                Ok(list)
            }
        }
    }
}

/// Reads a token file; a missing file is an empty list.
pub fn load(path: &Path) -> Result<TokenFile, AccessError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TokenFile::default()),
        Err(source) => {
            return Err(AccessError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    toml::from_str(&text).map_err(|e| AccessError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Writes a token file atomically (temp file, fsync, rename), mode 0600.
pub fn save(path: &Path, file: &TokenFile) -> Result<(), AccessError> {
    let io = |source| AccessError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let text = format!(
        "# ferry tokens: managed by `ferry token add|list|revoke`. Only hashes are stored.\n{}",
        toml::to_string(file).map_err(|e| AccessError::Invalid(e.to_string()))?
    );
    let tmp = path.with_extension("toml.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(())
}

/// A new random token: 24 bytes from the OS, hex.
pub fn new_token() -> String {
    let mut b = [0u8; 24];
    getrandom::fill(&mut b).expect("the OS random source works");
    ferry_core::digest::hex(&b)
}

/// Adds a token named `name` to the file and returns its secret (shown once, never stored).
pub fn add_token(
    path: &Path,
    name: &str,
    read: Vec<String>,
    write: Vec<String>,
    read_only: bool,
) -> Result<String, AccessError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
    {
        return Err(AccessError::Invalid(format!(
            "`{name}`: token names are letters, digits and - _ . @"
        )));
    }
    let mut file = load(path)?;
    if file.tokens.iter().any(|t| t.name == name) {
        return Err(AccessError::Exists(name.to_owned()));
    }
    let token = new_token();
    let entry = TokenEntry {
        name: name.to_owned(),
        sha256: ferry_core::digest::hex(&hash_token(&token)),
        read: if read.is_empty() { everything() } else { read },
        write: if write.is_empty() {
            everything()
        } else {
            write
        },
        read_only,
    };
    // Refuse a bad prefix now rather than at the first login.
    Grant::from_entry(&entry)?;
    file.tokens.push(entry);
    save(path, &file)?;
    Ok(token)
}

pub fn revoke_token(path: &Path, name: &str) -> Result<(), AccessError> {
    let mut file = load(path)?;
    let before = file.tokens.len();
    file.tokens.retain(|t| t.name != name);
    if file.tokens.len() == before {
        return Err(AccessError::NoSuchToken(name.to_owned()));
    }
    save(path, &file)
}

/// Slows down guessing: after [`LoginBrake::FREE`] failures from one address, or
/// [`LoginBrake::FREE_NET`] from its network (IPv4 /24, IPv6 /64, so that rotating source
/// addresses does not help), each further attempt must wait twice as long as the last (1 s,
/// 2 s, … up to 5 min), and attempts inside the wait are refused without even checking the
/// token, so opening many connections in parallel does not help either. A successful login
/// clears nothing: a client holding one valid token must not earn free guesses at others.
/// Quiet entries are forgotten. Time is passed in, so the policy is tested without sleeping.
#[derive(Debug, Default)]
pub struct LoginBrake {
    by_addr: HashMap<IpAddr, Failures>,
    by_net: HashMap<IpAddr, Failures>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

/// The network an address is counted in as well: its /24 (IPv4) or /64 (IPv6).
pub fn network_of(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let [x, y, z, _] = a.octets();
            IpAddr::from([x, y, z, 0])
        }
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => network_of(IpAddr::V4(v4)),
            None => IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(a) & !((1u128 << 64) - 1),
            )),
        },
    }
}

impl LoginBrake {
    /// Failures allowed from one address before waits start: enough for a user fixing a typo.
    pub const FREE: u32 = 5;
    /// Failures allowed from one network (a site's hosts behind one /24 or /64 together).
    pub const FREE_NET: u32 = 20;
    const MAX_WAIT: Duration = Duration::from_secs(300);
    const FORGET: Duration = Duration::from_secs(3600);
    /// Entries remembered at most per table; beyond that the oldest are dropped, so a flood
    /// from many addresses cannot grow the tables without bound.
    const MAX_ADDRS: usize = 10_000;

    fn wait_for(count: u32, free: u32) -> Duration {
        if count < free {
            return Duration::ZERO;
        }
        let exp = (count - free).min(16);
        Duration::from_secs(1u64 << exp).min(Self::MAX_WAIT)
    }

    fn wait_in(
        table: &mut HashMap<IpAddr, Failures>,
        key: IpAddr,
        free: u32,
        now: Instant,
    ) -> Duration {
        let Some(f) = table.get(&key).copied() else {
            return Duration::ZERO;
        };
        if now.saturating_duration_since(f.last) > Self::FORGET {
            table.remove(&key);
            return Duration::ZERO;
        }
        (f.last + Self::wait_for(f.count, free)).saturating_duration_since(now)
    }

    /// `Err(wait)` if `addr` must wait before its next attempt.
    pub fn check(&mut self, addr: IpAddr, now: Instant) -> Result<(), Duration> {
        let wait = Self::wait_in(&mut self.by_addr, addr, Self::FREE, now).max(Self::wait_in(
            &mut self.by_net,
            network_of(addr),
            Self::FREE_NET,
            now,
        ));
        if wait.is_zero() {
            Ok(())
        } else {
            Err(wait)
        }
    }

    pub fn failed(&mut self, addr: IpAddr, now: Instant) {
        Self::count(&mut self.by_addr, addr, now);
        Self::count(&mut self.by_net, network_of(addr), now);
    }

    fn count(table: &mut HashMap<IpAddr, Failures>, key: IpAddr, now: Instant) {
        if table.len() >= Self::MAX_ADDRS && !table.contains_key(&key) {
            table.retain(|_, f| now.saturating_duration_since(f.last) <= Self::FORGET);
            if table.len() >= Self::MAX_ADDRS {
                if let Some(oldest) = table.iter().min_by_key(|(_, f)| f.last) {
                    let k = *oldest.0;
                    table.remove(&k);
                }
            }
        }
        let f = table.entry(key).or_insert(Failures {
            count: 0,
            last: now,
        });
        f.count = f.count.saturating_add(1);
        f.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_whole_components() {
        assert!(under("data/x", "data"));
        assert!(under("data", "data"));
        assert!(!under("data2/x", "data"));
        assert!(!under("dat", "data"));
        assert!(under("anything", ""));
    }

    #[test]
    fn scopes_and_read_only() {
        let e = TokenEntry {
            name: "a".into(),
            sha256: "0".repeat(64),
            read: vec!["/pub".into(), "shared/".into()],
            write: vec!["/incoming".into()],
            read_only: false,
        };
        let g = Grant::from_entry(&e).unwrap();
        assert!(g.may_read("pub/x") && g.may_read("shared/y/z") && !g.may_read("incoming"));
        assert!(g.may_write("incoming/run1") && !g.may_write("pub/x"));
        let ro = Grant::from_entry(&TokenEntry {
            read_only: true,
            ..e.clone()
        })
        .unwrap();
        assert!(!ro.may_write("incoming/run1") && ro.may_read("pub/x"));
        let bad = TokenEntry {
            read: vec!["../etc".into()],
            ..e
        };
        assert!(Grant::from_entry(&bad).is_err());
    }

    #[test]
    fn add_authenticate_revoke_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let t1 = add_token(&path, "alice", vec!["/a".into()], vec![], true).unwrap();
        let t2 = add_token(&path, "bob", vec![], vec![], false).unwrap();
        assert!(matches!(
            add_token(&path, "alice", vec![], vec![], false),
            Err(AccessError::Exists(_))
        ));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&t1) && !text.contains(&t2), "secrets stored");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0);
        let access = Access::file(&path);
        let list = access.current().unwrap();
        let alice = list.authenticate(&t1).unwrap();
        assert_eq!(alice.name, "alice");
        assert!(alice.may_read("a/b") && !alice.may_read("b") && !alice.may_write("a"));
        assert_eq!(list.authenticate(&t2).unwrap().name, "bob");
        assert!(list.authenticate("nope").is_none());
        // Revocation is seen without a restart (mtime changes; force it in case the clock is
        // coarse).
        revoke_token(&path, "alice").unwrap();
        let later = SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert!(access.current().unwrap().authenticate(&t1).is_none());
        assert!(access.current().unwrap().authenticate(&t2).is_some());
        assert!(matches!(
            revoke_token(&path, "alice"),
            Err(AccessError::NoSuchToken(_))
        ));
    }

    #[test]
    fn broken_token_file_is_an_error_not_a_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, "[[token]]\nname = 1\n").unwrap();
        let e = Access::file(&path).current().unwrap_err().to_string();
        assert!(e.contains("tokens.toml"), "{e}");
    }

    #[test]
    fn login_brake_doubles_waits_and_forgets() {
        let mut b = LoginBrake::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let t0 = Instant::now();
        for i in 0..LoginBrake::FREE {
            assert!(b.check(ip, t0).is_ok(), "attempt {i} is free");
            b.failed(ip, t0);
        }
        assert_eq!(b.check(ip, t0), Err(Duration::from_secs(1)));
        assert!(b.check(other, t0).is_ok(), "other addresses are not slowed");
        let t1 = t0 + Duration::from_secs(1);
        assert!(b.check(ip, t1).is_ok());
        b.failed(ip, t1);
        assert_eq!(b.check(ip, t1), Err(Duration::from_secs(2)));
        // Waits are capped.
        let mut t = t1;
        for _ in 0..40 {
            b.failed(ip, t);
            t += Duration::from_millis(1);
        }
        assert!(b.check(ip, t).unwrap_err() <= Duration::from_secs(300));
        // A long quiet period forgets.
        assert!(b.check(ip, t + Duration::from_secs(7200)).is_ok());
    }

    #[test]
    fn login_brake_counts_networks_too() {
        let v6 = |n: u128| IpAddr::V6(std::net::Ipv6Addr::from(n));
        let mut b = LoginBrake::default();
        let t0 = Instant::now();
        // Rotating addresses inside one /24 is braked once the network has failed enough.
        for i in 0..LoginBrake::FREE_NET {
            let ip = IpAddr::from([127, 0, 0, (i + 1) as u8]);
            assert!(b.check(ip, t0).is_ok(), "attempt {i} is free");
            b.failed(ip, t0);
        }
        assert!(b.check(IpAddr::from([127, 0, 0, 200]), t0).is_err());
        assert!(b.check(IpAddr::from([127, 0, 1, 1]), t0).is_ok());
        // IPv6: the /64 counts; another /64 does not.
        for i in 0..LoginBrake::FREE_NET {
            let ip = v6(0x2001_0db8_0000_0001_0000_0000_0000_0000u128 + u128::from(i));
            b.failed(ip, t0);
        }
        let same = v6(0x2001_0db8_0000_0001_ffff_0000_0000_0001u128);
        let other = v6(0x2001_0db8_0000_0002_0000_0000_0000_0001u128);
        assert!(b.check(same, t0).is_err());
        assert!(b.check(other, t0).is_ok());
        // An IPv4-mapped address is its IPv4 network.
        assert_eq!(
            network_of("::ffff:127.0.0.9".parse().unwrap()),
            IpAddr::from([127, 0, 0, 0])
        );
    }

    #[test]
    fn login_brake_table_is_bounded() {
        let mut b = LoginBrake::default();
        let t0 = Instant::now();
        for i in 0..(LoginBrake::MAX_ADDRS as u32 + 500) {
            b.failed(
                IpAddr::from(i.to_be_bytes()),
                t0 + Duration::from_micros(i as u64),
            );
        }
        assert!(b.by_addr.len() <= LoginBrake::MAX_ADDRS);
        assert!(b.by_net.len() <= LoginBrake::MAX_ADDRS);
    }
}
