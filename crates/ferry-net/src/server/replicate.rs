//! The replicas a policy wants, made by the server itself: the catalog records what is owed in
//! the registration's own transaction (`ferry_catalog`'s `owed` table), and this task, in the
//! background of a running server, takes what is due, puts the committed file to the
//! policy's peers as a client would (the peer's key pinned, the peer's token), and records the
//! copy as `ferry repl` does (a record in this catalog when the peer keeps its own; in a
//! shared catalog the peer's registration is the replica). A try that fails is due again
//! after a backoff, with its reason kept for `stat`; a restart resumes from the table. The
//! put's own answer never waits for any of it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ferry_catalog::{Catalog, Owed, ReplicaState, Stat};
use ferry_core::digest::parse_algo;
use ferry_core::recv::{Links, Modes};
use ferry_core::send::Source;
use ferry_core::NoReporter;
use ferry_proto::{ChecksumAlgo, ExistingPolicy, ReplicaHealth, TransferOpts};
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::policy::Peer;
use super::state::ServerState;
use crate::client::{self, ClientConfig, Security, StartFrom};
use crate::tls::ServerTrust;

/// How often the table is asked what is due.
const TICK: Duration = Duration::from_secs(1);
/// The wait after a first failed try; it doubles with each, up to `policy_retry_max`.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// Runs until aborted (the server's shutdown): at most `policy_concurrency` paths at a time.
pub(super) async fn run(shared: Arc<ServerState>) {
    let Some(catalog) = shared.config.catalog.clone() else {
        return;
    };
    if !shared.config.policies.replicates() {
        return;
    }
    let most = shared.config.policy_concurrency.max(1);
    let mut running: HashSet<String> = HashSet::new();
    let mut ids: HashMap<tokio::task::Id, String> = HashMap::new();
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some(done) = tasks.join_next_with_id() => {
                let id = match done {
                    Ok((id, ())) => id,
                    Err(e) => {
                        warn!("policy: a replication task ended: {e}");
                        e.id()
                    }
                };
                if let Some(path) = ids.remove(&id) {
                    running.remove(&path);
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        if running.len() >= most {
            continue;
        }
        let c = catalog.clone();
        let limit = most + running.len();
        let due = match tokio::task::spawn_blocking(move || c.owed_due(now_ns(), limit)).await {
            Ok(Ok(due)) => due,
            Ok(Err(e)) => {
                warn!("policy: reading the replicas owed: {e}");
                continue;
            }
            Err(_) => continue,
        };
        for owed in due {
            if running.len() >= most {
                break;
            }
            if !running.insert(owed.path.clone()) {
                continue;
            }
            let path = owed.path.clone();
            let (shared, catalog) = (shared.clone(), catalog.clone());
            let handle = tasks.spawn(async move { settle(&shared, &catalog, owed).await });
            ids.insert(handle.id(), path);
        }
    }
}

/// One try for one path, and what the table keeps of it: met, or due again later with why.
async fn settle(shared: &ServerState, catalog: &Arc<Catalog>, owed: Owed) {
    let outcome = attempt(shared, catalog, &owed.path).await;
    let most = shared.config.policy_retry_max;
    let c = catalog.clone();
    let path = owed.path.clone();
    let written = tokio::task::spawn_blocking(move || match &outcome {
        Ok(()) => c.owed_met(&path),
        Err(why) => {
            let wait = backoff(owed.tries, most);
            let at = now_ns().saturating_add(i64::try_from(wait.as_nanos()).unwrap_or(i64::MAX));
            c.owed_later(&path, owed.tries.saturating_add(1), at, why)
        }
    })
    .await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(path = %owed.path, "policy: recording a replication: {e}"),
        Err(e) => warn!(path = %owed.path, "policy: recording a replication: {e}"),
    }
}

/// The wait before try `tries + 2`: 1 s doubled per failure, at most `most`.
pub(super) fn backoff(tries: u32, most: Duration) -> Duration {
    FIRST_RETRY
        .saturating_mul(1u32 << tries.min(20))
        .min(most.max(FIRST_RETRY))
}

/// Copies `path` to the policy's peers, in order, until its good replicas are as many as
/// wanted; `Err` says why they are not (each peer's reason).
async fn attempt(shared: &ServerState, catalog: &Arc<Catalog>, path: &str) -> Result<(), String> {
    let policies = &shared.config.policies;
    // A policy changed since (a restart with another config): nothing owed any more.
    let Some(policy) = policies.for_path(path).filter(|p| p.replicas > 1) else {
        return Ok(());
    };
    let Some(mut stat) = local_stat(catalog, path).await? else {
        // Removed since: nothing to copy.
        return Ok(());
    };
    let me = catalog.name().to_owned();
    match stat.replicas.iter().find(|r| r.server == me) {
        Some(r) if r.state == ReplicaState::Good => {}
        Some(r) => {
            return Err(format!(
                "this server's replica is {}: nothing good to copy (`ferry verify --repair` it)",
                r.state.as_str()
            ))
        }
        None => return Err("this server holds no replica to copy".into()),
    }
    let mut why = Vec::new();
    for name in &policy.to {
        if good(&stat) >= policy.replicas {
            break;
        }
        let Some(peer) = policies.peer(name) else {
            continue;
        };
        if let Err(e) = to_peer(shared, catalog, peer, &stat).await {
            why.push(format!("peer {} ({}): {e}", peer.name, peer.addr));
        }
        stat = match local_stat(catalog, path).await? {
            Some(s) => s,
            None => return Ok(()),
        };
    }
    let have = good(&stat);
    if have >= policy.replicas {
        info!(path, replicas = have, "policy: replicas made");
        return Ok(());
    }
    if why.is_empty() {
        why.push("the peers' copies are not registered good".into());
    }
    Err(why.join("; "))
}

/// One peer: a put of the committed file there (its own digest algorithm, replacing a
/// differing file, as `repl` does), then the peer's copy made known here.
async fn to_peer(
    shared: &ServerState,
    catalog: &Arc<Catalog>,
    peer: &Peer,
    stat: &Stat,
) -> Result<(), String> {
    let object = &stat.object;
    let path = object.path.clone();
    let checksum = parse_algo(&object.algo).unwrap_or(ChecksumAlgo::Blake3);
    let cfg = peer_config(shared, peer, checksum);
    let (parent, name) = ferry_core::path::split_parent(&path);
    let (parent, name) = (parent.to_owned(), name.to_owned());
    let root = &shared.root;
    let sources = || {
        let scope = root.scope(&parent, false)?;
        Ok(vec![Source {
            root: scope,
            rel: name.clone(),
            name: name.clone(),
        }])
    };
    let report = client::put_sources(&cfg, sources, &format!("/{path}"), Arc::new(NoReporter))
        .await
        .map_err(|e| e.to_string())?;
    if !report.is_success() {
        return Err(format!("the put failed: {}", report.errors.join("; ")));
    }
    // The peer's stat waits for its own registration; in a shared catalog that is the
    // replica, seen here at the next look.
    let theirs = crate::catalog::stat(&cfg, &format!("/{path}"), &NoReporter)
        .await
        .map_err(|e| format!("its catalog: {e}"))?;
    let o = &theirs.object;
    if (o.size, &o.digest, &o.algo) != (object.size, &object.digest, &object.algo) {
        return Err("its catalog registered other contents than this server's".into());
    }
    if catalog.is_shared() {
        return Ok(());
    }
    let me = catalog.name().to_owned();
    // Each with its path there: a replica the peer's catalog knows at another path.
    let copies: Vec<(String, String, String)> = theirs
        .replicas
        .iter()
        .filter(|r| r.state == ReplicaHealth::Good && r.server != me)
        .map(|r| {
            let at = r.path_or(&theirs.object.path).to_owned();
            (r.server.clone(), r.physical.clone(), at)
        })
        .collect();
    if copies.is_empty() {
        return Err("its catalog shows no good replica of its own".into());
    }
    let c = catalog.clone();
    tokio::task::spawn_blocking(move || {
        for (server, physical, at) in &copies {
            c.record_replicas(&path, false, server, physical, Some(at))?;
        }
        Ok::<_, ferry_catalog::CatalogError>(())
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("recording its copy here: {e}"))
}

async fn local_stat(catalog: &Arc<Catalog>, path: &str) -> Result<Option<Stat>, String> {
    let (c, p) = (catalog.clone(), path.to_owned());
    tokio::task::spawn_blocking(move || c.stat(&p))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("this server's catalog: {e}"))
}

fn good(stat: &Stat) -> u32 {
    let n = stat
        .replicas
        .iter()
        .filter(|r| r.state == ReplicaState::Good)
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A put to `peer` as a client's would be, from this server's reader pool, the peer's key
/// pinned; a few retries within the try (the table's backoff does the rest).
fn peer_config(shared: &ServerState, peer: &Peer, checksum: ChecksumAlgo) -> ClientConfig {
    let config = &shared.config;
    let (readers, tune_storage, _) = config.storage_pool(config.readers, 0);
    ClientConfig {
        server: peer.addr.clone(),
        token: peer.token.clone(),
        opts: TransferOpts {
            streams: 4,
            block_size: 8 << 20,
            checksum,
            existing: ExistingPolicy::Overwrite,
            tcp_window: 0,
            auto_start: 0,
            storage_threads: 0,
        },
        readers,
        writers: config.writers,
        tune_storage,
        storage_from: "default",
        block_from: "default",
        connect_timeout: config.handshake_timeout,
        idle_timeout: config.idle_timeout,
        corrupt_blocks: Vec::new(),
        retry_for: Duration::ZERO,
        security: Security::Tls(ServerTrust::Pinned(peer.fingerprint)),
        start_from: StartFrom::Default,
        force_streams: None,
        stall_stream: None,
        drain_at_end: false,
        helpers: 0,
        modes: Modes::default(),
        links: Links::Any,
        multipath: false,
        bind: Vec::new(),
        stripe: Vec::new(),
    }
}

pub(super) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
#[test]
fn backoff_doubles_up_to_its_bound() {
    let most = Duration::from_secs(60);
    assert_eq!(backoff(0, most), Duration::from_secs(1));
    assert_eq!(backoff(3, most), Duration::from_secs(8));
    assert_eq!(backoff(10, most), most);
    assert_eq!(backoff(u32::MAX, most), most);
}
