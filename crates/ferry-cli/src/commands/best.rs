//! `ferry get` of a registered file that has several replicas (issue 39): the named server's
//! catalog is asked where the good copies are (`Locate`: each replica with its server's
//! address), the copies are ranked by what this client measured of each path (its profiles),
//! and the first that delivers the registered bytes serves the get. A server that cannot be
//! reached, refuses, or sends bytes whose digest is not the registered one is passed over for
//! the next. docs/DESIGN.md, "The catalog"; SECURITY.md for whom a replica's address may
//! send this client to.
//!
//! A directory (not registered as an object), a server without a catalog, an ssh-started
//! session and `--no-replicas` get from the named server as any get does.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use ferry_net::catalog as cat;
use ferry_net::tls::Known;
use ferry_net::{ClientConfig, Security, ServerTrust, SessionError};
use ferry_proto::{CatalogStat, ExistingPolicy, ReplicaHealth};
use serde::Serialize;

use super::catalog::Notices;
use super::transfer::{finish, prepare, remember};
use crate::config::{address_host_port, apply_disk_profile, host_token, security, Job, Transfer};
use crate::profiles::Profiles;
use crate::progress::Progress;
use crate::remote::Remote;

/// Which copies a get may take.
pub enum Choice {
    /// The best measured good replica, then the others.
    Best,
    /// Only the replica of this server (its catalog name).
    Named(String),
}

/// One copy the get looked at, as `--json` reports it (`replicas.tried`).
#[derive(Clone, Debug, Serialize)]
pub struct Tried {
    /// The server's catalog name (empty for the named server when its catalog gives it no
    /// address).
    pub server: String,
    pub address: String,
    /// `served`, `failed` (tried, and why) or `skipped` (not tried, and why).
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub why: String,
    /// What this client last measured of the path to it (bytes a second), if anything.
    pub measured_bytes_per_s: Option<u64>,
    /// Where its server holds the file, when not at the path asked for (a `repl` to another
    /// path).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
}

/// A good replica with an address: where a get may fetch from.
#[derive(Clone, Debug)]
struct Candidate {
    server: String,
    address: String,
    rate: Option<u64>,
    /// The server the command named.
    named: bool,
    /// Where its server holds the file (`/…`): the replica's own path (a `repl` to another
    /// path), else the path the command named.
    path: String,
}

/// Runs `get` of `t` with replica selection; falls back to a plain get where the catalog has
/// nothing to choose from.
pub async fn run(t: Transfer, choice: Choice, quiet: bool) -> Result<ExitCode> {
    let Job::Get(dest) = &t.job else {
        bail!("replicas are chosen for a get only");
    };
    let dest = dest.clone();
    if t.remote.ssh_target().is_some() {
        return super::transfer::run(t, quiet).await;
    }
    let mut asking = t.client.clone();
    asking.retry_for = Duration::ZERO;
    let stat = match cat::locate(&asking, &t.remote.path, &Notices(quiet || t.json)).await {
        Ok(s) => s,
        Err(e) => {
            if let Choice::Named(name) = &choice {
                bail!(
                    "--replica {name}: the catalog of {} cannot say where its replicas are: {e}",
                    t.remote.server()
                );
            }
            // Not registered (a directory, say), no catalog, or not reached: a get from the
            // named server says what is wrong, if anything is.
            return super::transfer::run(t, quiet).await;
        }
    };
    let profiles = Profiles::default_location();
    let named = (t.remote.server(), t.remote.path.as_str());
    let (candidates, mut tried) = candidates(&stat, named, profiles.as_ref());
    let candidates = match &choice {
        Choice::Best => candidates,
        Choice::Named(name) => {
            let named: Vec<Candidate> = candidates
                .into_iter()
                .filter(|c| &c.server == name)
                .collect();
            if named.is_empty() {
                bail!(
                    "--replica {name}: no good replica of {} with an address is on a server of \
                     that name ({})",
                    t.remote.path,
                    listed(&stat)
                );
            }
            tried.retain(|r| &r.server == name);
            named
        }
    };
    fetch(&t, &dest, &stat, candidates, tried, quiet).await
}

/// The good replicas with an address, best first, and the others as skipped. Ranked by the
/// rate last measured on the path to each (`Profiles::load_path`), highest first; paths never
/// measured after them, the named server first among those. The named server is a candidate
/// even when its catalog gives it no address, unless a replica at its address is not good.
/// `named` is the server the command named and the path it named there.
fn candidates(
    stat: &CatalogStat,
    (named, asked): (String, &str),
    profiles: Option<&Profiles>,
) -> (Vec<Candidate>, Vec<Tried>) {
    let named = named.as_str();
    let path_of = |r: &ferry_proto::CatalogReplica| match r.path.is_empty() {
        true => asked.to_owned(),
        false => format!("/{}", r.path),
    };
    let rate = |a: &str| profiles.and_then(|p| p.load_path(a)).map(|p| p.bytes_per_s);
    let mut out: Vec<Candidate> = Vec::new();
    let mut skipped = Vec::new();
    let mut named_listed = false;
    for r in &stat.replicas {
        named_listed |= r.address == named;
        let skip = |why: String| Tried {
            server: r.server.clone(),
            address: r.address.clone(),
            outcome: "skipped",
            why,
            measured_bytes_per_s: rate(&r.address),
            path: shown(&path_of(r), asked),
        };
        if r.state != ReplicaHealth::Good {
            skipped.push(skip(format!("the catalog reports it {}", r.state.as_str())));
        } else if r.address.is_empty() {
            skipped.push(skip("the catalog has no address for its server".into()));
        } else if !out.iter().any(|c| c.address == r.address) {
            out.push(Candidate {
                server: r.server.clone(),
                address: r.address.clone(),
                rate: rate(&r.address),
                named: r.address == named,
                path: path_of(r),
            });
        }
    }
    if !named_listed {
        out.push(Candidate {
            server: String::new(),
            address: named.to_owned(),
            rate: rate(named),
            named: true,
            path: asked.to_owned(),
        });
    }
    // Measured paths first, fastest first; then the named server; the catalog's order else.
    out.sort_by_key(|c| (c.rate.is_none(), std::cmp::Reverse(c.rate), !c.named));
    (out, skipped)
}

fn listed(stat: &CatalogStat) -> String {
    let all: Vec<String> = stat
        .replicas
        .iter()
        .map(|r| format!("{} {}", r.server, r.state.as_str()))
        .collect();
    match all.is_empty() {
        true => "it has no replicas".into(),
        false => format!("replicas: {}", all.join(", ")),
    }
}

/// Tries each candidate in turn until one delivers the registered bytes.
async fn fetch(
    t: &Transfer,
    dest: &Path,
    stat: &CatalogStat,
    candidates: Vec<Candidate>,
    mut tried: Vec<Tried>,
    quiet: bool,
) -> Result<ExitCode> {
    let want = ferry_core::digest::hex(&stat.object.digest);
    // Where the file lands: inside an existing directory, else at `dest` itself.
    let name = t
        .remote
        .path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("");
    let target: PathBuf = match dest.is_dir() {
        true => dest.join(name),
        false => dest.to_owned(),
    };
    let mut wrote_bad = false;
    let asked = t.remote.path.as_str();
    for c in candidates {
        let mut cfg = match config_for(t, &c) {
            Ok(cfg) => cfg,
            Err(why) => {
                tried.push(outcome(&c, "skipped", why, asked));
                continue;
            }
        };
        if let Some(algo) = ferry_core::digest::parse_algo(&stat.object.algo) {
            cfg.opts.checksum = algo;
        }
        // A copy that failed its digest here is this get's own: the next one replaces it.
        if wrote_bad {
            cfg.opts.existing = ExistingPolicy::Overwrite;
        }
        let remote = Remote {
            host: String::new(),
            port: 0,
            path: c.path.clone(),
            ssh_user: None,
        };
        let remote = match address_host_port(&c.address) {
            Ok((host, port)) => Remote {
                host,
                port,
                ..remote
            },
            Err(e) => {
                tried.push(outcome(
                    &c,
                    "skipped",
                    format!("not an address: {e:#}"),
                    asked,
                ));
                continue;
            }
        };
        let profile = prepare(&mut cfg, &remote);
        if let Ok(dir) = crate::state::state_dir() {
            apply_disk_profile(&mut cfg, &dir, dest, false);
        }
        // A copy at another path lands where the named one would: under the name asked for.
        let into = match c.path == t.remote.path {
            true => dest,
            false => target.as_path(),
        };
        let progress = Arc::new(Progress::new(quiet || t.json));
        let result =
            ferry_net::client::get_filtered(&cfg, &c.path, &t.filter, into, progress.clone()).await;
        progress.finish();
        let report = match result {
            Ok(r) if r.is_success() => r,
            Ok(r) => {
                tried.push(outcome(&c, "failed", r.errors.join("; "), asked));
                continue;
            }
            Err(e) => {
                tried.push(outcome(&c, "failed", failed(&e), asked));
                continue;
            }
        };
        // A file skipped as existing (--skip-existing) was not fetched: nothing to compare.
        let got = report.manifest.first().map(|(_, d)| d.clone());
        if let Some(got) = got.filter(|g| *g != want) {
            wrote_bad = true;
            tried.push(outcome(
                &c,
                "failed",
                format!(
                    "its bytes have digest {}:{got}, not the registered {}:{want}",
                    stat.object.algo, stat.object.algo
                ),
                asked,
            ));
            continue;
        }
        tried.push(outcome(&c, "served", String::new(), asked));
        remember(&Ok(report.clone()), profile, quiet);
        if !quiet && !t.json && tried.len() > 1 {
            eprintln!("{}", summary(&tried));
        }
        let extra = ("replicas", serde_json::json!({ "tried": tried }));
        return finish(
            Ok(report),
            t.json,
            t.manifest.as_deref(),
            quiet,
            &progress,
            Some(extra),
        );
    }
    // What a failed digest left is not the file asked for.
    if wrote_bad {
        let _ = std::fs::remove_file(&target);
    }
    if t.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "replicas": { "tried": tried } }))?
        );
    }
    bail!(
        "get {} failed: no replica delivered the registered bytes ({})",
        t.remote.path,
        summary(&tried)
    )
}

/// The client for one candidate. The named server keeps the command's token and trust.
/// Another server is fetched from with its own token from the config file (`[hosts.HOST]`),
/// else the command's, over TLS, trusted by its own pin in the known hosts only: a host this
/// client has neither pinned nor configured is not contacted, so that a catalog's address
/// alone cannot make it send a token to a host it has never trusted (SECURITY.md).
fn config_for(t: &Transfer, c: &Candidate) -> Result<ClientConfig, String> {
    if c.named {
        return Ok(t.client.clone());
    }
    if matches!(t.client.security, Security::Plaintext) {
        return Err("another server's replica is fetched over TLS only (--no-encrypt)".into());
    }
    let (host, _) = address_host_port(&c.address).map_err(|e| format!("not an address: {e:#}"))?;
    let own = host_token(&t.auth, &host).map_err(|e| format!("{e:#}"))?;
    let unpinned = crate::args::ConnArgs {
        server_fingerprint: None,
        ..t.conn.clone()
    };
    let trust = security(&unpinned, &c.address).map_err(|e| format!("{e:#}"))?;
    if let Security::Tls(ServerTrust::KnownHosts { file, host: h }) = &trust {
        let known = file.lookup(h).map_err(|e| e.to_string())?;
        if known == Known::Unknown && own.is_none() {
            return Err(format!(
                "{} is not in this client's known hosts nor in its config file: a host is \
                 fetched from only once trusted (reach it once with `ferry ls {}:/`)",
                c.address, c.address
            ));
        }
    }
    let mut cfg = t.client.clone();
    cfg.server = c.address.clone();
    cfg.token = own.unwrap_or_else(|| t.client.token.clone());
    cfg.security = trust;
    cfg.stripe = Vec::new();
    Ok(cfg)
}

fn outcome(c: &Candidate, outcome: &'static str, why: String, asked: &str) -> Tried {
    Tried {
        server: c.server.clone(),
        address: c.address.clone(),
        outcome,
        why,
        measured_bytes_per_s: c.rate,
        path: shown(&c.path, asked),
    }
}

/// A replica's path as a report shows it: empty when it is the path asked for.
fn shown(path: &str, asked: &str) -> String {
    match path == asked {
        true => String::new(),
        false => path.to_owned(),
    }
}

fn failed(e: &SessionError) -> String {
    crate::output::clean(&e.to_string()).into_owned()
}

/// One line: each copy tried or skipped, and why.
fn summary(tried: &[Tried]) -> String {
    let each: Vec<String> = tried
        .iter()
        .map(|r| {
            let mut who = match r.server.is_empty() {
                true => r.address.clone(),
                false => format!("{} at {}", r.server, r.address),
            };
            if !r.path.is_empty() {
                who = format!("{who} {}", crate::output::clean(&r.path));
            }
            match r.why.is_empty() {
                true => format!("{who}: {}", r.outcome),
                false => format!("{who}: {} ({})", r.outcome, r.why),
            }
        })
        .collect();
    format!("replicas: {}", each.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::{CatalogObject, CatalogReplica};

    fn stat(replicas: &[(&str, &str, ReplicaHealth)]) -> CatalogStat {
        CatalogStat {
            object: CatalogObject {
                path: "f".into(),
                size: 1,
                mtime_ns: 0,
                digest: vec![1],
                algo: "blake3".into(),
                stored_by: String::new(),
                stored_at: 0,
            },
            replicas: replicas
                .iter()
                .map(|(server, address, state)| CatalogReplica {
                    server: (*server).into(),
                    physical: format!("/srv/{server}/f"),
                    state: *state,
                    address: (*address).into(),
                    path: String::new(),
                })
                .collect(),
            metadata: Vec::new(),
            policy: None,
        }
    }

    #[test]
    fn measured_paths_come_first_fastest_first_then_the_named_server() {
        let d = tempfile::tempdir().unwrap();
        let p = Profiles::new(d.path());
        p.remember("b:1", None, Some((100, 50_000_000))).unwrap();
        p.remember("c:1", None, Some((100, 90_000_000))).unwrap();
        let s = stat(&[
            ("a", "a:1", ReplicaHealth::Good),
            ("b", "b:1", ReplicaHealth::Good),
            ("c", "c:1", ReplicaHealth::Good),
            ("d", "d:1", ReplicaHealth::Good),
            ("e", "e:1", ReplicaHealth::Bad),
            ("f", "", ReplicaHealth::Good),
        ]);
        let (c, skipped) = candidates(&s, ("d:1".into(), "/f"), Some(&p));
        let order: Vec<&str> = c.iter().map(|c| c.server.as_str()).collect();
        assert_eq!(order, ["c", "b", "d", "a"]);
        assert!(c[2].named && !c[0].named);
        let why: Vec<(&str, &str)> = skipped
            .iter()
            .map(|t| (t.server.as_str(), t.why.as_str()))
            .collect();
        assert_eq!(
            why,
            [
                ("e", "the catalog reports it bad"),
                ("f", "the catalog has no address for its server")
            ]
        );
    }

    #[test]
    fn a_replica_at_a_path_of_its_own_is_fetched_there() {
        let mut s = stat(&[
            ("a", "a:1", ReplicaHealth::Good),
            ("b", "b:1", ReplicaHealth::Good),
        ]);
        s.replicas[1].path = "elsewhere/g".into();
        let (c, _) = candidates(&s, ("a:1".into(), "/f"), None);
        let paths: Vec<(&str, &str)> = c
            .iter()
            .map(|c| (c.server.as_str(), c.path.as_str()))
            .collect();
        assert_eq!(paths, [("a", "/f"), ("b", "/elsewhere/g")]);
        let shown = outcome(&c[1], "failed", "down".into(), "/f");
        assert_eq!(
            summary(&[shown]),
            "replicas: b at b:1 /elsewhere/g: failed (down)"
        );
    }

    #[test]
    fn the_named_server_is_tried_unless_its_catalog_reports_its_copy_bad() {
        let s = stat(&[("b", "b:1", ReplicaHealth::Good)]);
        let (c, _) = candidates(&s, ("a:1".into(), "/f"), None);
        let order: Vec<(&str, bool)> = c.iter().map(|c| (c.address.as_str(), c.named)).collect();
        assert_eq!(order, [("a:1", true), ("b:1", false)]);
        let s = stat(&[
            ("a", "a:1", ReplicaHealth::Stale),
            ("b", "b:1", ReplicaHealth::Good),
        ]);
        let (c, skipped) = candidates(&s, ("a:1".into(), "/f"), None);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].server, "b");
        assert_eq!(skipped[0].why, "the catalog reports it stale");
    }
}
