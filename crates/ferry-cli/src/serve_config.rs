//! `ferry serve --config FILE`: the server's options in a TOML file, for a daemon whose unit
//! file should not carry them. Keys are the long options with `_` for `-`; an option given on
//! the command line overrides the file's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use ferry_units::units::parse_duration;

use crate::args::{LogFormat, ServeArgs};

/// The file's keys: every option of `ferry serve` but `--oneshot` (a server started over ssh
/// has no file) and `--config` itself, plus the tables no option has: `[[policy]]` and
/// `[peers.NAME]`. Unknown keys are refused, so a misspelt limit is an
/// error at start, not a default that silently applies.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct ServeFile {
    root: Option<PathBuf>,
    listen: Option<Vec<String>>,
    token_file: Option<PathBuf>,
    tokens: Option<PathBuf>,
    max_connections: Option<usize>,
    max_streams: Option<u16>,
    max_unauthenticated: Option<usize>,
    max_sessions_per_token: Option<usize>,
    max_storage_threads: Option<usize>,
    idle_timeout: Option<String>,
    partial_max_age: Option<String>,
    allow_plaintext: Option<bool>,
    keep_modes: Option<bool>,
    third_party: Option<bool>,
    stripe: Option<bool>,
    metrics_listen: Option<String>,
    catalog: Option<String>,
    catalog_name: Option<String>,
    advertise: Option<String>,
    verify_rate: Option<String>,
    catalog_session_requests: Option<u32>,
    catalog_session_idle: Option<String>,
    policy_retry_max: Option<String>,
    log_format: Option<LogFormat>,
    /// Declarative policies per path prefix (docs/DESIGN.md, "Policies").
    policy: Option<Vec<PolicyTable>>,
    /// The servers policies copy to, by name.
    peers: Option<BTreeMap<String, PeerTable>>,
}

/// One `[[policy]]`: a prefix and what it wants.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct PolicyTable {
    prefix: String,
    replicas: Option<u32>,
    #[serde(default)]
    to: Vec<String>,
    retain: Option<String>,
    checksum: Option<String>,
}

/// One `[peers.NAME]`: where it is, its key, and a token that may write there.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct PeerTable {
    addr: String,
    fingerprint: String,
    token_file: PathBuf,
}

/// Reads `args.config`, if given, into `args` wherever the command line left an option unset.
/// Relative paths in the file are taken from the file's directory, as the file's author sees
/// them, not from wherever the server was started.
pub fn apply(args: &mut ServeArgs) -> Result<()> {
    let Some(path) = args.config.clone() else {
        return Ok(());
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("--config {}: cannot read it", path.display()))?;
    let file: ServeFile = toml::from_str(&text).map_err(|e| {
        // toml's own rendering spans lines (a source excerpt); one line says it as well.
        let line = e
            .span()
            .map(|s| text[..s.start].matches('\n').count() + 1)
            .map_or_else(String::new, |n| format!("line {n}: "));
        anyhow::anyhow!("--config {}: {line}{}", path.display(), e.message().trim())
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    merge(args, file, base).with_context(|| format!("--config {}", path.display()))
}

/// The file's values into `args`, except where the command line gave the option.
fn merge(args: &mut ServeArgs, file: ServeFile, base: &Path) -> Result<()> {
    let given: Vec<String> = args.given.clone();
    let unset = |id: &str| !given.iter().any(|g| g == id);
    let from_file = |p: PathBuf| base.join(p);
    if file.tokens.is_some() && file.token_file.is_some() {
        bail!("`tokens` and `token_file` exclude each other: a server has one kind of token file");
    }
    // Which token file is one choice: one named on the command line replaces the file's.
    if unset("tokens") && unset("token_file") {
        args.tokens = file.tokens.map(from_file);
        args.token_file = file.token_file.map(from_file);
    }
    set(
        &mut args.root,
        file.root.map(from_file).map(Some),
        unset("root"),
    );
    set(&mut args.listen, file.listen, unset("listen"));
    set(
        &mut args.max_connections,
        file.max_connections,
        unset("max_connections"),
    );
    set(
        &mut args.max_streams,
        file.max_streams,
        unset("max_streams"),
    );
    let n = unset("max_unauthenticated");
    set(&mut args.max_unauthenticated, file.max_unauthenticated, n);
    let n = unset("max_sessions_per_token");
    set(
        &mut args.max_sessions_per_token,
        file.max_sessions_per_token,
        n,
    );
    let threads = file.max_storage_threads.map(Some);
    set(
        &mut args.max_storage_threads,
        threads,
        unset("max_storage_threads"),
    );
    set(
        &mut args.idle_timeout,
        file.idle_timeout,
        unset("idle_timeout"),
    );
    set(
        &mut args.partial_max_age,
        file.partial_max_age,
        unset("partial_max_age"),
    );
    set(
        &mut args.allow_plaintext,
        file.allow_plaintext,
        unset("allow_plaintext"),
    );
    set(&mut args.keep_modes, file.keep_modes, unset("keep_modes"));
    set(
        &mut args.third_party,
        file.third_party,
        unset("third_party"),
    );
    set(&mut args.stripe, file.stripe, unset("stripe"));
    set(
        &mut args.metrics_listen,
        file.metrics_listen.map(Some),
        unset("metrics_listen"),
    );
    // `none`, `state` and a PostgreSQL location stay as written; a path is from the file's
    // directory.
    let catalog = file.catalog.map(|c| match c.as_str() {
        "none" | "state" => c,
        db if ferry_catalog::Location::names_a_database(db) => c,
        path => from_file(PathBuf::from(path))
            .to_string_lossy()
            .into_owned(),
    });
    set(&mut args.catalog, catalog.map(Some), unset("catalog"));
    set(
        &mut args.catalog_name,
        file.catalog_name.map(Some),
        unset("catalog_name"),
    );
    set(
        &mut args.advertise,
        file.advertise.map(Some),
        unset("advertise"),
    );
    set(
        &mut args.verify_rate,
        file.verify_rate,
        unset("verify_rate"),
    );
    set(
        &mut args.catalog_session_requests,
        file.catalog_session_requests,
        unset("catalog_session_requests"),
    );
    set(
        &mut args.catalog_session_idle,
        file.catalog_session_idle,
        unset("catalog_session_idle"),
    );
    set(
        &mut args.policy_retry_max,
        file.policy_retry_max,
        unset("policy_retry_max"),
    );
    set(&mut args.log_format, file.log_format, unset("log_format"));
    args.policies = policies(file.policy.unwrap_or_default(), file.peers, base)?;
    Ok(())
}

/// The file's policies and peers, checked: each peer's token read from its file (relative
/// to the config's directory), fingerprint and durations parsed, then the set as a whole
/// ([`ferry_net::Policies::new`]: known peers, enough of them, clean prefixes).
fn policies(
    tables: Vec<PolicyTable>,
    peers: Option<BTreeMap<String, PeerTable>>,
    base: &Path,
) -> Result<ferry_net::Policies> {
    let mut checked_peers = Vec::new();
    for (name, p) in peers.unwrap_or_default() {
        let fingerprint = p
            .fingerprint
            .parse::<ferry_net::Fingerprint>()
            .map_err(|e| anyhow::anyhow!("[peers.{name}] fingerprint: {e}"))?;
        let token_path = base.join(&p.token_file);
        let token = std::fs::read_to_string(&token_path)
            .with_context(|| format!("[peers.{name}] token_file {}", token_path.display()))?
            .trim()
            .to_owned();
        checked_peers.push(ferry_net::Peer {
            name,
            addr: p.addr,
            fingerprint,
            token,
        });
    }
    let mut list = Vec::with_capacity(tables.len());
    for t in tables {
        let at = |what: &str| format!("[[policy]] `{}`: {what}", t.prefix);
        let retain = match &t.retain {
            Some(r) => Some(parse_duration(r).with_context(|| at("retain"))?),
            None => None,
        };
        let checksum = match &t.checksum {
            Some(c) => Some(ferry_core::digest::parse_algo(c).ok_or_else(|| {
                anyhow::anyhow!(at(&format!(
                    "checksum `{c}` is none of blake3, xxh3, sha256, md5"
                )))
            })?),
            None => None,
        };
        list.push(ferry_net::Policy {
            prefix: t.prefix,
            replicas: t.replicas.unwrap_or(1),
            to: t.to,
            retain,
            checksum,
        });
    }
    Ok(ferry_net::Policies::new(checked_peers, list)?)
}

fn set<T>(field: &mut T, value: Option<T>, unset: bool) {
    if let (Some(v), true) = (value, unset) {
        *field = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parsed(argv: &[&str]) -> ServeArgs {
        // As main parses it, so that `given` is filled the same way.
        let cli = crate::args::Cli::try_parse_from(argv).unwrap();
        let crate::args::Command::Serve(mut a) = cli.command else {
            panic!("not serve")
        };
        a.given = argv
            .iter()
            .filter_map(|s| s.strip_prefix("--"))
            .map(|s| s.replace('-', "_"))
            .collect();
        a
    }

    #[test]
    fn the_command_line_wins_and_paths_are_from_the_files_directory() {
        let mut a = parsed(&[
            "ferry",
            "serve",
            "--config",
            "f",
            "--max-streams",
            "8",
            "--listen",
            "[::1]:1",
        ]);
        let file: ServeFile = toml::from_str(
            "root = \"data\"\nmax_streams = 4\nmax_connections = 9\nlisten = [\"127.0.0.1:1\"]\n\
             log_format = \"json\"\nthird_party = true\nstripe = true\ncatalog = \"cat.sqlite\"\n\
             metrics_listen = \"127.0.0.1:9464\"\n",
        )
        .unwrap();
        merge(&mut a, file, Path::new("/etc/ferry")).unwrap();
        assert_eq!(a.root.as_deref(), Some(Path::new("/etc/ferry/data")));
        assert_eq!(a.max_streams, 8);
        assert_eq!(a.max_connections, 9);
        assert_eq!(a.listen, vec!["[::1]:1".to_owned()]);
        assert_eq!(a.log_format, LogFormat::Json);
        assert!(a.third_party);
        assert!(a.stripe);
        assert_eq!(a.catalog.as_deref(), Some("/etc/ferry/cat.sqlite"));
        assert_eq!(a.metrics_listen.as_deref(), Some("127.0.0.1:9464"));
        let mut a = parsed(&["ferry", "serve", "--root", "/"]);
        merge(
            &mut a,
            toml::from_str("catalog = \"none\"").unwrap(),
            Path::new("/x"),
        )
        .unwrap();
        assert_eq!(a.catalog.as_deref(), Some("none"));
        let mut a = parsed(&["ferry", "serve", "--root", "/"]);
        merge(
            &mut a,
            toml::from_str("catalog = \"postgres://ferry@db/cat\"\ncatalog_name = \"ferry2\"\n")
                .unwrap(),
            Path::new("/x"),
        )
        .unwrap();
        assert_eq!(a.catalog.as_deref(), Some("postgres://ferry@db/cat"));
        assert_eq!(a.catalog_name.as_deref(), Some("ferry2"));
        // Kept as written even where `serve` then refuses it (clear text across a network, a
        // scheme it does not know), so that the refusal names what the file says.
        for db in ["host=db.example dbname=cat", "mysql://db/cat"] {
            let mut a = parsed(&["ferry", "serve", "--root", "/"]);
            let file = toml::from_str(&format!("catalog = \"{db}\"\n")).unwrap();
            merge(&mut a, file, Path::new("/x")).unwrap();
            assert_eq!(a.catalog.as_deref(), Some(db));
        }
        let mut a = parsed(&["ferry", "serve", "--root", "/"]);
        let file = toml::from_str("advertise = \"dtn1.example.org:7070\"\n").unwrap();
        merge(&mut a, file, Path::new("/x")).unwrap();
        assert_eq!(a.advertise.as_deref(), Some("dtn1.example.org:7070"));
    }

    #[test]
    fn catalog_session_bounds_from_the_file_unless_given() {
        let file = || {
            toml::from_str::<ServeFile>(
                "catalog_session_requests = 50\ncatalog_session_idle = \"5s\"\n",
            )
            .unwrap()
        };
        let mut a = parsed(&["ferry", "serve", "--root", "/"]);
        merge(&mut a, file(), Path::new("/x")).unwrap();
        assert_eq!(
            (a.catalog_session_requests, a.catalog_session_idle.as_str()),
            (50, "5s")
        );
        let mut a = parsed(&[
            "ferry",
            "serve",
            "--root",
            "/",
            "--catalog-session-requests",
            "7",
        ]);
        merge(&mut a, file(), Path::new("/x")).unwrap();
        assert_eq!(
            (a.catalog_session_requests, a.catalog_session_idle.as_str()),
            (7, "5s")
        );
    }

    #[test]
    fn verify_rate_from_the_file_unless_given() {
        let file = || toml::from_str::<ServeFile>("verify_rate = \"64M\"\n").unwrap();
        let mut a = parsed(&["ferry", "serve", "--root", "/"]);
        assert_eq!(a.verify_rate, "256M");
        merge(&mut a, file(), Path::new("/x")).unwrap();
        assert_eq!(a.verify_rate, "64M");
        let mut a = parsed(&["ferry", "serve", "--root", "/", "--verify-rate", "0"]);
        merge(&mut a, file(), Path::new("/x")).unwrap();
        assert_eq!(a.verify_rate, "0");
    }

    #[test]
    fn policies_and_peers_from_the_file_and_their_mistakes_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.token"), "secret\n").unwrap();
        let fp = format!("sha256:{}", "ab".repeat(32));
        let text = |policy: &str| {
            format!(
                "[[policy]]\n{policy}\n\n[peers.siteB]\naddr = \"127.0.0.1:7071\"\n\
                 fingerprint = \"{fp}\"\ntoken_file = \"b.token\"\n"
            )
        };
        let merged = |policy: &str| {
            let mut a = parsed(&["ferry", "serve", "--root", "/"]);
            let file: ServeFile = toml::from_str(&text(policy)).unwrap();
            merge(&mut a, file, dir.path()).map(|()| a)
        };
        let a = merged(
            "prefix = \"raw/\"\nreplicas = 2\nto = [\"siteB\"]\nretain = \"30d\"\n\
             checksum = \"sha256\"",
        )
        .unwrap();
        let p = a.policies.for_path("raw/x").unwrap();
        assert_eq!(p.prefix, "raw");
        assert_eq!(p.replicas, 2);
        assert_eq!(p.retain, Some(std::time::Duration::from_secs(30 * 86_400)));
        assert_eq!(p.checksum, Some(ferry_proto::ChecksumAlgo::Sha256));
        let peer = a.policies.peer("siteB").unwrap();
        assert_eq!(
            (peer.addr.as_str(), peer.token.as_str()),
            ("127.0.0.1:7071", "secret")
        );
        assert_eq!(peer.fingerprint.to_string(), fp);
        for (policy, says) in [
            ("prefix = \"raw\"\nreplicas = 2\nto = [\"siteC\"]", "siteC"),
            (
                "prefix = \"raw\"\nreplicas = 3\nto = [\"siteB\"]",
                "at most 2",
            ),
            ("prefix = \"../up\"\nreplicas = 1", "../up"),
            ("prefix = \"raw\"\nchecksum = \"crc32\"", "crc32"),
            ("prefix = \"raw\"\nretain = \"forever\"", "retain"),
        ] {
            let e = format!("{:#}", merged(policy).unwrap_err());
            assert!(e.contains(says), "{policy}: {e}");
        }
    }

    #[test]
    fn unknown_keys_and_two_token_files_are_refused() {
        let e = toml::from_str::<ServeFile>("max_conections = 3\n").unwrap_err();
        assert!(e.to_string().contains("max_conections"), "{e}");
        let mut a = parsed(&["ferry", "serve", "--root", "/"]);
        let both: ServeFile = toml::from_str("tokens = \"a\"\ntoken_file = \"b\"\n").unwrap();
        let e = merge(&mut a, both, Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("exclude each other"), "{e}");
    }
}
