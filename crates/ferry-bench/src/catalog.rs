//! Catalog mode (issue 39's catalog targets): a catalog of 1 or 10 million registered objects
//! on SQLite or PostgreSQL, a `ferry serve` (the release binary, loopback, TLS) started on it,
//! and through ferry-net's client (what `ferry stat`, `find` and `rm -r` call, one connection
//! per request as the CLI makes): `find --meta ATTR=VALUE` and `ATTR>N`, `stat` of random paths,
//! and `rm -r` of a directory of 100,000 files that exist on disk, against the targets
//! (100 ms, 5 ms, 10 s). Also the server's start on the full catalog (spawn to the first stat
//! answered), and the catalog's own share of each operation, timed in-process on the same
//! database. The bench records and reports; it asserts no timing.
//!
//! The fill is generated in the database ([`bulk_fill`]: the rows `Catalog::register_new`
//! writes, a million to a statement; a test compares the two), the metadata set with
//! `meta_set` itself. PostgreSQL is a throwaway cluster (`TestCluster`: fsync and
//! synchronous commits off) under `--work`, analyzed after the fill as autovacuum would.
//! `stat` is timed four ways: through the client (a new TCP and TLS connection each, as the
//! CLI makes for one path; and all in one kept catalog session), the TCP and TLS handshake alone, and `ferry stat` itself, a process each.

use std::fmt::Write as _;
use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferry_catalog::sql::{Arg, Database};
use ferry_catalog::{Avu, Catalog, Commit, Condition, Location, Query, TestCluster};
use ferry_net::tls::ClientTls;
use ferry_net::{catalog as cat, ClientConfig, Fingerprint, Security, ServerTrust};
use ferry_proto::{
    ChecksumAlgo, Compare, ExistingPolicy, FindCondition, FindRequest, TransferOpts,
};

use crate::runner::Server;

/// Files in one directory of the tree (and of the `rm -r` tree).
const PER_DIR: u64 = 1_000;
/// Directories of a top-level directory (`cat/aNN/bNNN/`): a million files each.
const DIRS_PER_TOP: u64 = 1_000;
/// One object in this many carries each attribute.
const TAG_EVERY: u64 = 1_000;
/// Values of the text attribute (`campaign=c0` … `c9`).
const CAMPAIGNS: u64 = 10;
/// The `rm -r` tree: this many directories of [`PER_DIR`] files.
const RM_DIRS: u64 = 100;
/// This server's name in the catalog (`--catalog-name`).
const SERVER: &str = "bench";
/// `ferry stat` processes timed (each a fork, an exec and a TLS client's set-up).
const CLI_STATS: usize = 100;
/// The ALPN id ferry's control connections speak (ferry-net's `tls::ALPN`).
const FERRY_ALPN: &[u8] = b"ferry/1";
/// The find limit: `ferry find`'s default.
const FIND_LIMIT: u32 = 1_000;

/// The targets, in milliseconds.
const FIND_TARGET_MS: f64 = 100.0;
const STAT_TARGET_MS: f64 = 5.0;
const RM_TARGET_MS: f64 = 10_000.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "sqlite" => Ok(Self::Sqlite),
            "postgres" | "postgresql" => Ok(Self::Postgres),
            other => bail!("--backends: {other:?} is neither sqlite nor postgres"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

/// What a catalog run does.
pub struct CatOptions {
    pub ferry: PathBuf,
    /// Catalogs, roots and the PostgreSQL cluster live here (on disk); emptied at the end.
    pub work: PathBuf,
    pub out: PathBuf,
    /// Catalog sizes (registered objects), e.g. 1,000,000.
    pub files: Vec<u64>,
    pub backends: Vec<Backend>,
    /// `rm -r` runs (each on a fresh 100,000-file tree) and server starts.
    pub runs: u32,
    /// `stat` samples, and `find` samples per query kind.
    pub stats: usize,
    pub finds: usize,
}

/// Parses `1M`, `10M`, `250k` or a plain count.
pub fn parse_count(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mul) = match t.chars().last() {
        Some('M' | 'm') => (&t[..t.len() - 1], 1_000_000),
        Some('k' | 'K') => (&t[..t.len() - 1], 1_000),
        _ => (t, 1),
    };
    let n: u64 = num
        .replace('_', "")
        .parse()
        .with_context(|| format!("--files: {s:?} is not a count (1M, 10M, 250k)"))?;
    if n == 0 {
        bail!("--files: counts start at 1");
    }
    Ok(n * mul)
}

/// Samples of one operation, in milliseconds.
struct Samples {
    backend: Backend,
    files: u64,
    op: String,
    target_ms: Option<f64>,
    ms: Vec<f64>,
    /// What the samples returned (rows found, objects removed), for the report.
    note: String,
}

impl Samples {
    fn quantile(&self, q: f64) -> f64 {
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        // Nearest rank.
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    }
}

/// Logical path of object `i` of the tree: `cat/aNN/bNNN/fNNN`, 1,000 to a directory.
fn object_path(i: u64) -> String {
    format!(
        "cat/a{:02}/b{:03}/f{:03}",
        i / (PER_DIR * DIRS_PER_TOP),
        (i / PER_DIR) % DIRS_PER_TOP,
        i % PER_DIR
    )
}

/// A cheap, fixed pseudo-random number of `i` (splitmix64): which paths to stat.
fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Multipliers of the object number for its size and digest: each a product with `i` that
/// stays far inside an `i64` for any catalog this bench makes (under 10^9 objects), so that
/// SQL computes the same numbers as Rust ([`bulk_fill`]).
const SIZE_MUL: u64 = 2_654_435_761;
const DIGEST_MUL: [u64; 4] = [2_654_435_761, 2_246_822_519, 3_266_489_917, 668_265_263];
/// Seconds of a year, and the mtimes' start (2025-01-01).
const YEAR_S: u64 = 31_536_000;
const MTIME_BASE_NS: i64 = 1_735_689_600_000_000_000;

/// What a put of object `i` at `path` would have registered: a size up to 16 MiB, an mtime
/// within a year, a 32-byte digest, each a fixed function of `i` that [`bulk_fill`]'s SQL
/// computes alike.
fn commit_of(root: &Path, path: String, i: u64) -> Commit {
    let mut digest = Vec::with_capacity(32);
    for (k, m) in DIGEST_MUL.iter().enumerate() {
        digest.extend_from_slice(&(i * m + k as u64).to_be_bytes());
    }
    Commit {
        physical: root.join(&path).display().to_string(),
        path,
        size: (i * SIZE_MUL) % (16 << 20),
        mtime_ns: MTIME_BASE_NS + ((i * 40_503) % YEAR_S) as i64 * 1_000_000_000,
        digest,
        algo: "blake3".into(),
        stored_by: "bench".into(),
    }
}

/// Objects one statement of [`bulk_fill`] generates (each its own transaction).
const BULK_TX: u64 = 1_000_000;

/// The objects' two secondary indexes, as the schema's first migration makes them: dropped
/// before a bulk fill of an empty catalog and made again after, one sort each instead of 10
/// million inserts at random places.
const SECONDARY_INDEXES: &str = "CREATE INDEX objects_mtime ON objects (mtime_ns);
CREATE INDEX objects_size ON objects (size)";

/// Registers objects `from..to` (their paths [`object_path`], their rows [`commit_of`]'s,
/// this server's replica of each good, under `root`) into an empty catalog, generated in the
/// database: the rows `Catalog::register_new` writes for the same commits (the test
/// `bulk_fill_writes_what_register_new_writes` compares them), a million to a statement,
/// where `register_new` binds 3,500 parameters a statement and ran at 7,000 objects/s.
/// The bench's fill only: the registrations it measures go through the catalog.
fn bulk_fill(
    location: &Location,
    root: &Path,
    from: u64,
    to: u64,
    mut progress: impl FnMut(u64),
) -> Result<()> {
    let mut db = Database::open(location)?;
    let pg = db.is_shared();
    let empty = db.one("SELECT COUNT(*) FROM objects", &[])?.int(0)? == 0;
    if !pg {
        // A gigabyte of page cache for the load (this connection only).
        db.batch("PRAGMA cache_size = -1000000")?;
    }
    if empty {
        db.batch("DROP INDEX objects_mtime; DROP INDEX objects_size")?;
    }
    // Every number below is an `i64` product of the object number: the same in both
    // dialects, and the same as `commit_of`.
    let objects = if pg {
        "INSERT INTO objects (path, size, mtime_ns, digest, algo, stored_by, stored_at)
         SELECT format('cat/a%s/b%s/f%s', lpad((i / 1000000)::text, 2, '0'),
                       lpad(((i / 1000) % 1000)::text, 3, '0'), lpad((i % 1000)::text, 3, '0')),
                (i * 2654435761) % 16777216,
                1735689600000000000 + ((i * 40503) % 31536000) * 1000000000,
                decode(lpad(to_hex(i * 2654435761), 16, '0')
                       || lpad(to_hex(i * 2246822519 + 1), 16, '0')
                       || lpad(to_hex(i * 3266489917 + 2), 16, '0')
                       || lpad(to_hex(i * 668265263 + 3), 16, '0'), 'hex'),
                'blake3', 'bench', CAST(?3 AS BIGINT)
         FROM generate_series(CAST(?1 AS BIGINT), CAST(?2 AS BIGINT) - 1) AS g (i)"
    } else {
        "WITH RECURSIVE n (i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2)
         INSERT INTO objects (path, size, mtime_ns, digest, algo, stored_by, stored_at)
         SELECT printf('cat/a%02d/b%03d/f%03d', i / 1000000, (i / 1000) % 1000, i % 1000),
                (i * 2654435761) % 16777216,
                1735689600000000000 + ((i * 40503) % 31536000) * 1000000000,
                unhex(printf('%016x%016x%016x%016x', i * 2654435761, i * 2246822519 + 1,
                             i * 3266489917 + 2, i * 668265263 + 3)),
                'blake3', 'bench', ?3
         FROM n"
    };
    let replicas = "INSERT INTO replicas (object, server, physical, state)
         SELECT id, CAST(?1 AS TEXT), CAST(?2 AS TEXT) || path, 'good' FROM objects
         WHERE id > ?3";
    let top = format!("{}/", root.display());
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as i64;
    let mut next = from;
    while next < to {
        let end = (next + BULK_TX).min(to);
        db.transaction(|db| {
            let last = db
                .one("SELECT COALESCE(MAX(id), 0) FROM objects", &[])?
                .int(0)?;
            let made = db.run(
                objects,
                &[Arg::Int(next as i64), Arg::Int(end as i64), Arg::Int(at)],
            )?;
            let placed = db.run(
                replicas,
                &[Arg::Text(SERVER), Arg::Text(&top), Arg::Int(last)],
            )?;
            if made != end - next || placed != made {
                bail!("bulk fill {next}..{end}: {made} objects, {placed} replicas");
            }
            Ok::<_, anyhow::Error>(())
        })?;
        next = end;
        progress(next);
    }
    if empty {
        db.batch(SECONDARY_INDEXES)?;
    }
    Ok(())
}

/// The whole run: every backend at every size.
pub fn run(o: &CatOptions) -> Result<String> {
    fs::create_dir_all(&o.work)?;
    let mut all = Vec::new();
    let mut notes = vec![format!("load at start: {}", loadavg())];
    for &backend in &o.backends {
        // One cluster per backend run, under --work; removed when it drops.
        let cluster = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => {
                std::env::set_var("TMPDIR", &o.work);
                Some(TestCluster::start().map_err(anyhow::Error::msg)?)
            }
        };
        for &files in &o.files {
            let dir = o.work.join(format!("{}-{files}", backend.name()));
            if dir.exists() {
                crate::data::remove_path(&dir)?;
            }
            fs::create_dir_all(dir.join("root"))?;
            let (location, arg) = match &cluster {
                None => {
                    let p = dir.join("catalog.sqlite");
                    (Location::Sqlite(p.clone()), p.display().to_string())
                }
                Some(c) => {
                    let url = c.database_url();
                    (Location::parse(&url)?, url)
                }
            };
            let r = one(
                o, backend, files, &dir, &location, &arg, &mut all, &mut notes,
            );
            if let Err(e) = &r {
                notes.push(format!("{} {files}: stopped: {e:#}", backend.name()));
                eprintln!("ferry-bench catalog: {} {files}: {e:#}", backend.name());
            }
            let size = du(&dir);
            if cluster.is_none() {
                notes.push(format!(
                    "{} {files}: catalog file {:.2} GB",
                    backend.name(),
                    size as f64 / 1e9
                ));
            }
            crate::data::remove_path(&dir)?;
        }
        drop(cluster);
    }
    notes.push(format!("load at end: {}", loadavg()));
    let report = report(o, &all, &notes);
    fs::write(o.out.join("summary.md"), &report)?;
    let mut csv = String::from("backend,files,op,sample,ms\n");
    for s in &all {
        for (i, ms) in s.ms.iter().enumerate() {
            let _ = writeln!(csv, "{},{},{},{i},{ms:.3}", s.backend.name(), s.files, s.op);
        }
    }
    fs::write(o.out.join("results.csv"), csv)?;
    Ok(report)
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn du(p: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(p) else { return 0 };
    rd.filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => du(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// One backend at one size: fill, start, measure.
#[allow(clippy::too_many_arguments)]
fn one(
    o: &CatOptions,
    backend: Backend,
    files: u64,
    dir: &Path,
    location: &Location,
    arg: &str,
    all: &mut Vec<Samples>,
    notes: &mut Vec<String>,
) -> Result<()> {
    let root = dir.join("root");
    let tag = |op: &str, target_ms: Option<f64>, ms: Vec<f64>, note: String| Samples {
        backend,
        files,
        op: op.to_owned(),
        target_ms,
        ms,
        note,
    };
    // The fill.
    let t0 = Instant::now();
    let catalog = Catalog::open(location, SERVER)?;
    bulk_fill(location, &root, 0, files, |n| {
        eprintln!(
            "ferry-bench catalog: {} {files}: {n} registered, {:.0} s",
            backend.name(),
            t0.elapsed().as_secs_f64()
        );
    })?;
    let registered = t0.elapsed();
    let t1 = Instant::now();
    for i in (0..files).filter(|i| i % TAG_EVERY == TAG_EVERY / 2) {
        let avu = Avu {
            attr: "campaign".into(),
            value: format!("c{}", (i / TAG_EVERY) % CAMPAIGNS),
            unit: String::new(),
        };
        catalog.meta_set(&object_path(i), &avu)?;
    }
    for i in (0..files).filter(|i| i % TAG_EVERY == TAG_EVERY / 4) {
        let avu = Avu {
            attr: "exposure".into(),
            value: format!("{}", (i / TAG_EVERY) % 1000),
            unit: "s".into(),
        };
        catalog.meta_set(&object_path(i), &avu)?;
    }
    let tagged = t1.elapsed();
    if backend == Backend::Postgres {
        // Statistics, as autovacuum gathers them after a large load.
        ferry_catalog::sql::Database::open(location)?.batch("ANALYZE")?;
    }
    notes.push(format!(
        "{} {files}: fill {:.0} s ({:.0} objects/s, generated in the database, {BULK_TX} to a \
         statement, indexes included), metadata {:.1} s ({} meta_set calls)",
        backend.name(),
        registered.as_secs_f64(),
        files as f64 / registered.as_secs_f64(),
        tagged.as_secs_f64(),
        2 * (files / TAG_EVERY)
    ));
    eprintln!(
        "ferry-bench catalog: {}",
        notes.last().expect("just pushed")
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Each backend and size its own logs (serve-RUN.out).
    let logs = o
        .out
        .join("logs")
        .join(format!("{}-{files}", backend.name()));
    fs::create_dir_all(&logs)?;
    let state = dir.join("state");
    fs::create_dir_all(&state)?;

    // Starts: spawn to the first stat answered, on the full catalog.
    let probe = object_path(files / 2);
    let mut starts = Vec::new();
    let mut server = None;
    for run in 0..o.runs.max(1) {
        drop(server.take());
        let t = Instant::now();
        let (s, cfg, fp) = serve(o, &root, &state, arg, &logs, run)?;
        rt.block_on(async {
            loop {
                match cat::stat(&cfg, &format!("/{probe}"), &ferry_core::NoReporter).await {
                    Ok(_) => return Ok(()),
                    Err(e) if t.elapsed() > Duration::from_secs(120) => {
                        bail!("the server answers no stat after 120 s: {e}")
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        })?;
        starts.push(ms(t.elapsed()));
        server = Some((s, cfg, fp));
    }
    all.push(tag(
        "server start (spawn to first stat answered)",
        None,
        starts,
        String::new(),
    ));
    let (_server, cfg, fingerprint) = server.expect("started above");

    // stat of random paths, through the server, then in-process.
    let picks: Vec<String> = (0..o.stats as u64)
        .map(|k| object_path(mix(k ^ 0x5747) % files))
        .collect();
    let mut wire = Vec::new();
    rt.block_on(async {
        for p in &picks {
            let t = Instant::now();
            let s = cat::stat(&cfg, &format!("/{p}"), &ferry_core::NoReporter).await?;
            wire.push(ms(t.elapsed()));
            if s.object.path != *p {
                bail!("stat {p} answered {}", s.object.path);
            }
        }
        Ok(())
    })?;
    all.push(tag(
        "stat (client, new TLS connection each)",
        Some(STAT_TARGET_MS),
        wire,
        String::new(),
    ));
    // The same stats in one kept catalog session (what `ferry stat a b c` and a tool asking
    // many questions make): one connection's set-up for all of them.
    let mut kept = Vec::new();
    let opened = rt.block_on(async {
        let mut session = cat::CatalogSession::new(&cfg, &ferry_core::NoReporter);
        for p in &picks {
            let t = Instant::now();
            let s = session.stat(&format!("/{p}")).await?;
            kept.push(ms(t.elapsed()));
            if s.object.path != *p {
                bail!("stat {p} answered {}", s.object.path);
            }
        }
        let opened = session.connections();
        session.close().await;
        Ok(opened)
    })?;
    all.push(tag(
        "stat (client, one kept catalog session)",
        Some(STAT_TARGET_MS),
        kept,
        format!("{opened} connection(s) for {} stats", picks.len()),
    ));
    // What of that is the connection's set-up: a TCP connect and a TLS handshake alone
    // (a new client configuration each, as each CLI process makes), no request.
    let fp: Fingerprint = fingerprint
        .parse()
        .map_err(|e| anyhow::anyhow!("the server's key {fingerprint}: {e:?}"))?;
    let mut setup = Vec::new();
    rt.block_on(async {
        for _ in &picks {
            let t = Instant::now();
            let tcp = tokio::net::TcpStream::connect(&cfg.server).await?;
            tcp.set_nodelay(true)?;
            let tls = ClientTls::with_alpn(Some(fp), FERRY_ALPN)?;
            let conn = tls
                .connector()
                .connect(ClientTls::server_name(), tcp)
                .await?;
            setup.push(ms(t.elapsed()));
            drop(conn);
        }
        Ok::<_, anyhow::Error>(())
    })?;
    all.push(tag(
        "TCP connect + TLS handshake alone (no request)",
        None,
        setup,
        String::new(),
    ));
    // `ferry stat` itself: a process each, what a user or a shell script sees.
    let mut cli = Vec::new();
    let client_state = state.join("client");
    for p in picks.iter().take(CLI_STATS) {
        let t = Instant::now();
        let out = Command::new(&o.ferry)
            .env("FERRY_STATE_DIR", &client_state)
            .env("XDG_CONFIG_HOME", state.join("config"))
            .env("FERRY_KNOWN_HOSTS", state.join("config/known_hosts"))
            .env("FERRY_TOKEN", &cfg.token)
            .arg("-q")
            .arg("stat")
            .arg("--server-fingerprint")
            .arg(&fingerprint)
            .arg(format!("{}:/{p}", cfg.server))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .context("running ferry stat")?;
        cli.push(ms(t.elapsed()));
        if !out.status.success() {
            bail!(
                "ferry stat {p}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    all.push(tag(
        "ferry stat (the CLI, a new process each)",
        Some(STAT_TARGET_MS),
        cli,
        String::new(),
    ));
    let mut local = Vec::new();
    for p in &picks {
        let t = Instant::now();
        let s = catalog.stat(p)?;
        local.push(ms(t.elapsed()));
        if s.is_none() {
            bail!("stat {p}: not registered");
        }
    }
    all.push(tag(
        "stat (catalog in-process: the server's own share)",
        None,
        local,
        String::new(),
    ));

    // find: one attribute, by text value and by number, under the root and under `cat`.
    let mut kinds: Vec<(String, String, FindCondition, Condition)> = Vec::new();
    for (under, label) in [("/", "root"), ("/cat", "cat/")] {
        for k in 0..o.finds {
            let value = format!("c{}", k as u64 % CAMPAIGNS);
            kinds.push((
                format!("find --meta campaign=cN under {label}"),
                under.to_owned(),
                FindCondition {
                    compare: Compare::Eq,
                    attr: "campaign".into(),
                    value: value.clone(),
                },
                Condition::Eq {
                    attr: "campaign".into(),
                    value,
                },
            ));
        }
        for k in 0..o.finds {
            let n = 900 + (k % 90) as u64;
            kinds.push((
                format!("find --meta 'exposure>N' under {label}"),
                under.to_owned(),
                FindCondition {
                    compare: Compare::Gt,
                    attr: "exposure".into(),
                    value: n.to_string(),
                },
                Condition::Gt {
                    attr: "exposure".into(),
                    n: n as f64,
                },
            ));
        }
    }
    let mut groups: Vec<FindGroup> = Vec::new();
    for (label, under, wire_cond, local_cond) in kinds {
        let t = Instant::now();
        let found = rt.block_on(cat::find(
            &cfg,
            FindRequest {
                under: under.clone(),
                conditions: vec![wire_cond],
                name: None,
                newer_ns: None,
                larger: None,
                limit: FIND_LIMIT,
            },
            &ferry_core::NoReporter,
        ))?;
        let w = ms(t.elapsed());
        let t = Instant::now();
        let here = catalog.find(&Query {
            under: Some(under.trim_start_matches('/').to_owned()),
            conditions: vec![local_cond],
            limit: FIND_LIMIT as usize + 1,
            ..Query::default()
        })?;
        let l = ms(t.elapsed());
        if here.len().min(FIND_LIMIT as usize) != found.objects.len() {
            bail!(
                "{label}: the server found {}, the catalog {}",
                found.objects.len(),
                here.len()
            );
        }
        match groups.iter_mut().find(|g| g.0 == label) {
            Some(g) => {
                g.1.push(w);
                g.2.push(l);
                g.3 += found.objects.len();
                g.4 |= found.more;
            }
            None => groups.push((label, vec![w], vec![l], found.objects.len(), found.more)),
        }
    }
    for (label, w, l, n, more) in groups {
        let count = w.len();
        let note = format!(
            "{:.0} objects found on average{}",
            n as f64 / count as f64,
            if more {
                ", some with more past the limit"
            } else {
                ""
            }
        );
        all.push(tag(
            &format!("{label} (client)"),
            Some(FIND_TARGET_MS),
            w,
            note.clone(),
        ));
        all.push(tag(&format!("{label} (catalog in-process)"), None, l, note));
    }

    // rm -r of 100,000 files that exist, through the server; then the catalog's share alone.
    let mut wire = Vec::new();
    let mut local = Vec::new();
    let mut removed = String::new();
    for run in 0..o.runs.max(1) {
        let top = format!("rm/r{run}");
        let tree = rm_tree(&root, &top)?;
        catalog.register_new(&tree)?;
        let t = Instant::now();
        let done = rt.block_on(cat::remove(
            &cfg,
            &format!("/{top}"),
            true,
            &ferry_core::NoReporter,
        ))?;
        wire.push(ms(t.elapsed()));
        if done.objects != tree.len() as u64 || root.join(&top).exists() {
            bail!(
                "rm -r {top}: {done:?}, the tree {}",
                if root.join(&top).exists() {
                    "still there"
                } else {
                    "gone"
                }
            );
        }
        removed = format!(
            "{} entries and {} objects removed each run",
            done.entries, done.objects
        );
        catalog.register_new(&tree)?;
        let t = Instant::now();
        let n = catalog.remove_prefix(&top)?;
        local.push(ms(t.elapsed()));
        if n != tree.len() as u64 {
            bail!("remove_prefix {top}: {n} objects");
        }
    }
    all.push(tag(
        "rm -r of 100,000 files (client: files and catalog)",
        Some(RM_TARGET_MS),
        wire,
        removed.clone(),
    ));
    all.push(tag(
        "rm -r of 100,000 objects (catalog in-process: remove_prefix alone)",
        None,
        local,
        removed,
    ));
    Ok(())
}

/// One kind of find's samples: its label, client and in-process times (ms), objects found in
/// all, and whether any had more past the limit.
type FindGroup = (String, Vec<f64>, Vec<f64>, usize, bool);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `RM_DIRS` directories of `PER_DIR` empty files under `root/top`, and their commits.
fn rm_tree(root: &Path, top: &str) -> Result<Vec<Commit>> {
    let mut commits = Vec::with_capacity((RM_DIRS * PER_DIR) as usize);
    for d in 0..RM_DIRS {
        let dir = format!("{top}/d{d:03}");
        fs::create_dir_all(root.join(&dir))?;
        for f in 0..PER_DIR {
            let path = format!("{dir}/f{f:03}");
            fs::File::create(root.join(&path))?;
            let mut c = commit_of(root, path, d * PER_DIR + f);
            c.size = 0;
            commits.push(c);
        }
    }
    Ok(commits)
}

/// `ferry serve` on `root` with the catalog `arg`, and a client pinned to its key.
fn serve(
    o: &CatOptions,
    root: &Path,
    state: &Path,
    arg: &str,
    logs: &Path,
    run: u32,
) -> Result<(Server, ClientConfig, String)> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let token_file = state.join("token");
    let log = logs.join(format!("serve-{run}.out"));
    let f = fs::File::create(&log)?;
    let mut c = Command::new(&o.ferry);
    c.env("FERRY_STATE_DIR", state)
        .env("XDG_CONFIG_HOME", state.join("config"))
        .arg("serve")
        .arg("--root")
        .arg(root)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--token-file")
        .arg(&token_file)
        .arg("--catalog")
        .arg(arg)
        .arg("--catalog-name")
        .arg(SERVER)
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .process_group(0);
    let mut server = Server {
        name: "ferry-serve".into(),
        child: c.spawn().context("starting ferry serve")?,
        log: log.clone(),
        own_log: None,
    };
    let t0 = Instant::now();
    let fingerprint = loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if let (Some(fp), Ok(token)) = (
            crate::host::fingerprint_of(&text),
            fs::read_to_string(&token_file),
        ) {
            if !token.trim().is_empty() {
                break fp;
            }
        }
        if let Ok(Some(st)) = server.child.try_wait() {
            bail!("ferry serve exited ({st}): {}", server.logs());
        }
        if t0.elapsed() > Duration::from_secs(120) {
            bail!("ferry serve printed no key in 120 s: {}", server.logs());
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let token = fs::read_to_string(&token_file)?.trim().to_owned();
    let fp: Fingerprint = fingerprint
        .parse()
        .map_err(|e| anyhow::anyhow!("the server's key {fingerprint}: {e:?}"))?;
    Ok((
        server,
        client(SocketAddr::from(([127, 0, 0, 1], port)), token, fp),
        fingerprint,
    ))
}

/// A client as the CLI's catalog commands make one: TLS, the server's key pinned.
fn client(addr: SocketAddr, token: String, fp: Fingerprint) -> ClientConfig {
    ClientConfig {
        server: addr.to_string(),
        token,
        opts: TransferOpts {
            streams: 1,
            block_size: 16 << 20,
            checksum: ChecksumAlgo::Blake3,
            existing: ExistingPolicy::Fail,
            tcp_window: 0,
            auto_start: 0,
            storage_threads: 0,
        },
        readers: 1,
        writers: 1,
        tune_storage: false,
        storage_from: "fixed",
        block_from: "fixed",
        connect_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
        corrupt_blocks: Vec::new(),
        retry_for: Duration::ZERO,
        security: Security::Tls(ServerTrust::Pinned(fp)),
        start_from: Default::default(),
        force_streams: None,
        stall_stream: None,
        drain_at_end: false,
        helpers: 0,
        modes: Default::default(),
        links: Default::default(),
        multipath: false,
        bind: Vec::new(),
        stripe: Vec::new(),
    }
}

/// summary.md: each operation's median and p99 against its target.
fn report(o: &CatOptions, all: &[Samples], notes: &[String]) -> String {
    let mut s = String::from("# Catalog at scale (issue 39)\n\n");
    let _ = writeln!(
        s,
        "Command: `{}`\n",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    let _ = writeln!(
        s,
        "Tree: `cat/aNN/bNNN/fNNN`, 1,000 files a directory; `campaign=c0..c9` on 1 in {TAG_EVERY} \
         objects, `exposure` (a number, 0-999) on another 1 in {TAG_EVERY}; finds with \
         `--limit {FIND_LIMIT}` (the CLI's default). Samples: {} stats, {} finds per kind, {} \
         starts and rm -r runs. Server: {} on loopback, TLS.\n",
        o.stats,
        o.finds,
        o.runs,
        o.ferry.display()
    );
    s.push_str("| backend | files | operation | n | median ms | p99 ms | max ms | target | |\n");
    s.push_str("|---|---:|---|---:|---:|---:|---:|---:|---|\n");
    for x in all {
        let (med, p99, max) = (x.quantile(0.5), x.quantile(0.99), x.quantile(1.0));
        let verdict = match x.target_ms {
            Some(t) if p99 <= t => "met (p99)".to_owned(),
            Some(t) if med <= t => "median met, p99 not".to_owned(),
            Some(_) => "MISSED".to_owned(),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {}{} | {} | {med:.2} | {p99:.2} | {max:.2} | {} | {verdict} |",
            x.backend.name(),
            x.files,
            x.op,
            if x.note.is_empty() {
                String::new()
            } else {
                format!(" ({})", x.note)
            },
            x.ms.len(),
            x.target_ms.map_or(String::new(), |t| format!("{t:.0} ms")),
        );
    }
    s.push('\n');
    for n in notes {
        let _ = writeln!(s, "- {n}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_paths() {
        assert_eq!(parse_count("1M").unwrap(), 1_000_000);
        assert_eq!(parse_count("250k").unwrap(), 250_000);
        assert_eq!(parse_count("1200").unwrap(), 1_200);
        assert!(parse_count("0").is_err());
        assert!(parse_count("x").is_err());
        assert_eq!(object_path(0), "cat/a00/b000/f000");
        assert_eq!(object_path(9_999_999), "cat/a09/b999/f999");
        assert_eq!(object_path(1_234_567), "cat/a01/b234/f567");
    }

    /// Everything a fill left that a reader sees, with the row ids and `stored_at` (a
    /// clock's) left out: the objects, each replica by its object's path, the indexes.
    fn rows(location: &Location) -> Vec<Vec<String>> {
        let mut db = Database::open(location).unwrap();
        let indexes = if db.is_shared() {
            "SELECT indexname, replace(indexdef, current_schema() || '.', '') FROM pg_indexes
             WHERE schemaname = current_schema() ORDER BY indexname"
        } else {
            "SELECT name, COALESCE(sql, '') FROM sqlite_master WHERE type = 'index'
             ORDER BY name"
        };
        let mut out = Vec::new();
        for mut r in db
            .rows(
                "SELECT path, size, mtime_ns, digest, algo, stored_by FROM objects ORDER BY path",
                &[],
            )
            .unwrap()
        {
            out.push(vec![
                r.text(0).unwrap(),
                r.int(1).unwrap().to_string(),
                r.int(2).unwrap().to_string(),
                format!("{:?}", r.blob(3).unwrap()),
                r.text(4).unwrap(),
                r.text(5).unwrap(),
            ]);
        }
        for mut r in db
            .rows(
                "SELECT o.path, r.server, r.physical, r.state FROM replicas r
                 JOIN objects o ON o.id = r.object ORDER BY o.path, r.server",
                &[],
            )
            .unwrap()
        {
            out.push((0..4).map(|i| r.text(i).unwrap()).collect());
        }
        let n = db
            .one("SELECT COUNT(*) FROM replicas", &[])
            .unwrap()
            .int(0)
            .unwrap();
        out.push(vec![format!("{n} replicas")]);
        for mut r in db.rows(indexes, &[]).unwrap() {
            out.push(vec![r.text(0).unwrap(), r.text(1).unwrap()]);
        }
        out
    }

    /// The same objects filled by `bulk_fill` and by `register_new` (two batches, across a
    /// top directory's boundary, the second onto a catalog that holds the first): the same
    /// rows and the same indexes.
    fn bulk_fill_matches_register_new(bulk: &Location, one: &Location) {
        let root = Path::new("/srv/bench root");
        let (a, b, c) = (998_700, 999_950, 1_001_234);
        Catalog::open(bulk, SERVER).unwrap();
        let mut seen = Vec::new();
        bulk_fill(bulk, root, a, b, |n| seen.push(n)).unwrap();
        bulk_fill(bulk, root, b, c, |n| seen.push(n)).unwrap();
        assert_eq!(seen, [b, c]);
        let cat = Catalog::open(one, SERVER).unwrap();
        for (from, to) in [(a, b), (b, c)] {
            let files: Vec<Commit> = (from..to)
                .map(|i| commit_of(root, object_path(i), i))
                .collect();
            cat.register_new(&files).unwrap();
        }
        let (x, y) = (rows(bulk), rows(one));
        assert_eq!(x.len(), y.len());
        for (p, q) in x.iter().zip(&y) {
            assert_eq!(p, q);
        }
        assert!(x.iter().any(|r| r[0] == "objects_size"), "{:?}", x.last());
        assert!(x.iter().any(|r| r == &[format!("{} replicas", c - a)]));
    }

    #[test]
    fn bulk_fill_writes_what_register_new_writes_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        bulk_fill_matches_register_new(
            &Location::Sqlite(dir.path().join("bulk.sqlite")),
            &Location::Sqlite(dir.path().join("one.sqlite")),
        );
    }

    #[test]
    fn bulk_fill_writes_what_register_new_writes_on_postgresql() {
        let Some(cluster) = ferry_netem::needs(
            "ferry_bench::catalog::tests::bulk_fill_writes_what_register_new_writes_on_postgresql",
            TestCluster::start(),
        ) else {
            return;
        };
        bulk_fill_matches_register_new(&cluster.database(), &cluster.database());
    }
}
