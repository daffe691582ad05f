//! `ferry serve`: token management and the daemon's lifetime.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use std::sync::Arc;

use anyhow::{Context, Result};
use ferry_net::access::{self, Access, AccessList};
use ferry_net::{Identity, Server, ServerConfig};
use ferry_units::units::{format_bytes_2dp, parse_duration};

use crate::args::ServeArgs;
use crate::error::usage;
use crate::state;

pub async fn run(args: ServeArgs, quiet: bool) -> Result<ExitCode> {
    if args.oneshot {
        return oneshot(args).await;
    }
    let root = args
        .root
        .clone()
        .context("--root is required (or `root` in the --config file)")
        .map_err(usage)?;
    let state = state::state_dir().map_err(usage)?;
    let access = access_for(&args, &state, quiet)?;
    let (identity, created) = Identity::load_or_create(&state).map_err(|e| usage(e.into()))?;
    if !quiet {
        eprintln!(
            "ferry: TLS key {} in {}; clients can pin it with --server-fingerprint {}",
            if created { "created" } else { "loaded" },
            state.display(),
            identity.fingerprint()
        );
    }
    if !root.is_dir() {
        return Err(usage(anyhow::anyhow!(
            "--root {} is not a directory",
            root.display()
        )));
    }
    let listen = if args.listen.is_empty() {
        vec!["0.0.0.0:7070".to_owned()]
    } else {
        args.listen.clone()
    };
    let mut addrs = Vec::with_capacity(listen.len());
    for l in &listen {
        addrs.push(lookup(l).await?);
    }
    let mut config = ServerConfig::new(&root, String::new());
    config.access = Arc::new(access);
    config.tls = Some(identity);
    limits(&mut config, &args)?;
    config.catalog = open_catalog(
        args.catalog.as_deref(),
        args.catalog_name.as_deref(),
        &state,
        &root,
        quiet,
    )?;
    if config.catalog.is_none() && !config.policies.is_empty() {
        return Err(usage(anyhow::anyhow!(
            "the --config file's policies need a catalog (they are applied to what it \
             registers): drop `catalog = \"none\"` or the [[policy]] tables"
        )));
    }
    let catalog = config.catalog.clone();
    storage_from_profile(&mut config, &state, &root, quiet);
    if args.allow_plaintext {
        eprintln!(
            "ferry: warning: --allow-plaintext: clients that ask for plain TCP (--no-encrypt) are \
             served without encryption; their data and tokens can be read on the path"
        );
    }
    raise_open_files(config.max_connections);
    crate::pin::for_listen(&addrs);
    let server = Server::bind_all(&addrs, config)
        .await
        .with_context(|| format!("cannot listen on {}", listen.join(", ")))?;
    // Before the "serving" line, so that a reader of the log finds its address first.
    let metrics = match &args.metrics_listen {
        Some(addr) => Some(serve_metrics(addr, &server, quiet).await?),
        None => None,
    };
    let local = server.local_addrs()?;
    if let Some(catalog) = &catalog {
        let address = advertised(args.advertise.as_deref(), &local).map_err(usage)?;
        catalog
            .advertise(&address)
            .context("recording this server's address in the catalog")?;
        if !quiet && !address.is_empty() {
            eprintln!("ferry: catalog: this server's replicas are fetched from {address}");
        }
    }
    if !quiet {
        let on: Vec<String> = local.iter().map(ToString::to_string).collect();
        eprintln!("ferry: serving {} on {}", root.display(), on.join(", "));
        note_fast_open();
    }
    if let (Some(r), false) = (server.reconciled(), quiet) {
        if r.registered + r.dropped > 0 {
            eprintln!(
                "ferry: catalog: {} files an interrupted put had stored registered, {} intents dropped",
                r.registered, r.dropped
            );
        }
    }
    let report = server.scan_partials();
    if !quiet && (report.kept_files > 0 || report.removed_files > 0) {
        eprintln!(
            "ferry: interrupted transfers hold {} in {} files (kept for resume); removed {} in {} files older than {}",
            format_bytes_2dp(report.kept_bytes),
            report.kept_files,
            format_bytes_2dp(report.removed_bytes),
            report.removed_files,
            args.partial_max_age
        );
    }
    server.run(shutdown_signal()).await;
    if let Some(m) = metrics {
        m.abort();
    }
    if !quiet {
        eprintln!("ferry: stopped");
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts `--metrics-listen`'s plain HTTP listener; it ends when the server does.
async fn serve_metrics(
    addr: &str,
    server: &Server,
    quiet: bool,
) -> Result<tokio::task::JoinHandle<()>> {
    let at = lookup(addr).await?;
    let listener = tokio::net::TcpListener::bind(at)
        .await
        .with_context(|| format!("--metrics-listen {addr}: cannot listen"))?;
    if !quiet {
        eprintln!(
            "ferry: metrics at http://{}/metrics",
            listener.local_addr()?
        );
    }
    let view = server.metrics();
    let render = move || view.render();
    Ok(tokio::spawn(ferry_service::http::serve_metrics(
        listener,
        render,
        std::future::pending(),
    )))
}

/// Who may log in: the one token of `--token-file`, or the named tokens of the token file
/// (made with one full-access token on the first start).
fn access_for(args: &ServeArgs, state: &Path, quiet: bool) -> Result<Access> {
    if let Some(path) = &args.token_file {
        // One full-access token kept in a file, for scripts that need to read it back.
        let (token, _) = state::load_or_create_token(path).map_err(usage)?;
        return Ok(Access::Fixed(Arc::new(AccessList::single(
            "token-file",
            &token,
        ))));
    }
    let path = state::tokens_file(args.tokens.as_deref(), state);
    let _lock = state::create_and_lock(state)?;
    let file = access::load(&path).map_err(|e| usage(e.into()))?;
    if file.tokens.is_empty() {
        let token = access::add_token(&path, "default", vec![], vec![], false)
            .with_context(|| format!("creating the first token in {}", path.display()))?;
        // Shown once; only its hash is kept.
        eprintln!(
            "ferry: new full-access token `default` (shown once; only its hash is kept in {}): {token}",
            path.display()
        );
        eprintln!("ferry: manage tokens with `ferry token add|list|revoke`");
    } else if !quiet {
        eprintln!(
            "ferry: {} token(s) in {}",
            file.tokens.len(),
            path.display()
        );
    }
    Ok(Access::file(path))
}

/// The catalog `--catalog` names (`none`: no catalog), by default catalog.sqlite in the
/// state directory; its replicas are named `name`, by default after this host; its paths are
/// relative to `root`.
fn open_catalog(
    arg: Option<&str>,
    name: Option<&str>,
    state: &Path,
    root: &Path,
    quiet: bool,
) -> Result<Option<Arc<ferry_catalog::Catalog>>> {
    let location = match arg {
        Some("none") => return Ok(None),
        None | Some("state") => ferry_catalog::Location::Sqlite(state.join("catalog.sqlite")),
        Some(s) => ferry_catalog::Location::parse(s).map_err(|e| usage(e.into()))?,
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let host = match name {
        Some(name) => name,
        None if host.is_empty() => "localhost",
        None => &host,
    };
    // A location's password is never shown: `Location`'s Display hides it. A PostgreSQL
    // catalog's intents are kept in the state directory, beside this server's data.
    let intents = state.join("intents.sqlite");
    let catalog = ferry_catalog::Catalog::open_with_local_intents(&location, host, &intents)
        .with_context(|| format!("opening the catalog {location}"))?;
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_owned());
    match catalog.claim_root(&root.to_string_lossy()) {
        Ok(()) => {}
        // The state directory's catalog, kept for another root by another server of this
        // user: this one serves without, rather than mix two trees' paths.
        Err(e @ ferry_catalog::CatalogError::OtherRoot { .. }) if arg.is_none() => {
            eprintln!(
                "ferry: warning: no catalog: {e}; pass --catalog PATH to keep one for this root"
            );
            return Ok(None);
        }
        Err(e) => {
            return Err(usage(
                anyhow::Error::new(e).context(format!("the catalog {location}")),
            ))
        }
    }
    if !quiet {
        if location.is_shared() {
            eprintln!("ferry: catalog {location} (shared; this server's replicas are {host:?})");
        } else {
            eprintln!("ferry: catalog {location}");
        }
    }
    Ok(Some(Arc::new(catalog)))
}

/// The address the catalog keeps for this server (`--advertise`): as given (`none`: empty),
/// else the first address it listens on unless that is a wildcard, which says nothing of
/// where a client reaches it.
fn advertised(arg: Option<&str>, local: &[std::net::SocketAddr]) -> Result<String> {
    match arg.map(str::trim) {
        Some("none") => Ok(String::new()),
        Some(a) => {
            let port = a.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
            match port {
                Some((h, Ok(p)))
                    if p > 0
                        && !h.is_empty()
                        && !h.contains(['/', ' ', '@'])
                        && a.len() <= ferry_catalog::MAX_ADDRESS =>
                {
                    Ok(a.to_owned())
                }
                _ => anyhow::bail!("--advertise {a}: expected HOST:PORT (or `none`)"),
            }
        }
        None => Ok(local
            .first()
            .filter(|a| !a.ip().is_unspecified())
            .map(ToString::to_string)
            .unwrap_or_default()),
    }
}

/// The daemon's limits and policies from its options.
fn limits(config: &mut ServerConfig, args: &ServeArgs) -> Result<()> {
    config.allow_plaintext = args.allow_plaintext;
    config.third_party = args.third_party;
    config.stripe = args.stripe;
    if args.keep_modes {
        config.modes = ferry_core::recv::Modes::Keep;
    }
    config.max_connections = args.max_connections.max(1);
    config.max_streams = args.max_streams.max(1);
    config.max_unauthenticated_per_address = args.max_unauthenticated;
    config.max_sessions_per_token = args.max_sessions_per_token.max(1);
    if let Some(n) = args.max_storage_threads {
        config.max_storage_threads = n.clamp(1, usize::from(ferry_proto::MAX_STORAGE_THREADS));
    }
    config.idle_timeout = parse_duration(&args.idle_timeout)
        .context("--idle-timeout")
        .map_err(usage)?
        .max(Duration::from_secs(5));
    config.partial_max_age = parse_duration(&args.partial_max_age).map_err(|e| usage(e.into()))?;
    config.verify_rate = ferry_units::units::parse_size(&args.verify_rate)
        .with_context(|| format!("--verify-rate {}", args.verify_rate))
        .map_err(usage)?;
    config.policy_retry_max = parse_duration(&args.policy_retry_max)
        .with_context(|| format!("--policy-retry-max {}", args.policy_retry_max))
        .map_err(usage)?
        .max(Duration::from_secs(1));
    config.catalog_session_requests = args.catalog_session_requests;
    config.catalog_session_idle = parse_duration(&args.catalog_session_idle)
        .with_context(|| format!("--catalog-session-idle {}", args.catalog_session_idle))
        .map_err(usage)?
        .max(Duration::from_secs(1));
    config.policies = Arc::new(args.policies.clone());
    Ok(())
}

/// Sessions start their readers and writers where `ferry probe disk` found the root's file
/// system fastest, and tune them from there.
fn storage_from_profile(config: &mut ServerConfig, state: &Path, root: &Path, quiet: bool) {
    let Some(p) = ferry_probe::disk::disk_profile_for(state, root) else {
        return;
    };
    config.readers = p.read_threads.clamp(1, 64) as usize;
    config.writers = p.write_threads.clamp(1, 64) as usize;
    if !quiet {
        eprintln!(
            "ferry: storage threads from the disk profile of {} ({}): {} readers, {} writers",
            p.path.display(),
            p.measured_at,
            config.readers,
            config.writers
        );
    }
}

/// The host's setting as `probe host` reads it; only worth saying while ferry uses it.
fn note_fast_open() {
    let fast_open = ferry_probe::net::local_tcp_settings().fastopen;
    if let Some(v) = fast_open.filter(|v| v & 2 == 0 && ferry_net::tcp::fast_open()) {
        eprintln!(
            "ferry: note: this host refuses TCP Fast Open (net.ipv4.tcp_fastopen={v}), so \
             every client connection waits a round trip for its SYN before TLS; \
             `sysctl -w net.ipv4.tcp_fastopen={}` lets it start in the SYN",
            v | 3
        );
    }
}

/// Descriptors one connection may hold at once. A get's data connection holds three on the
/// server: its socket and the duplicates that the stream tuner and the connection's task keep
/// of it, for `TCP_INFO` and to reset it at the end (a 16-stream get of 256 MiB on loopback
/// peaked at 49 sockets above the idle server's, for 17 connections; a put at 17).
const FILES_PER_CONNECTION: u64 = 3;

/// Descriptors beyond the connections: the listener, the runtime, the state and log files,
/// and the files the sessions have open.
const FILES_SPARE: u64 = 64;

/// The highest soft limit asked for when the hard one is unlimited (Linux's default
/// `fs.nr_open`, above which the kernel refuses it).
const FILES_CEILING: u64 = 1 << 20;

/// Raises the soft limit on open files to the hard one. The usual soft limit is 1024 (shells,
/// systemd units), which a server at its default cap of 512 connections exceeds on gets alone,
/// and a refused `accept` drops clients that the cap would admit. Warns when even the hard
/// limit is below what `max_connections` may need.
fn raise_open_files(max_connections: usize) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(FILES_CEILING);
    let mut soft = limit.current.unwrap_or(u64::MAX);
    if soft < hard {
        let raised = Rlimit {
            current: Some(hard),
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            soft = hard;
        }
    }
    let need = max_connections as u64 * FILES_PER_CONNECTION + FILES_SPARE;
    if soft < need {
        eprintln!(
            "ferry: warning: the limit on open files is {soft}, below the {need} that \
             --max-connections {max_connections} may need ({FILES_PER_CONNECTION} per \
             connection): raise it (`LimitNOFILE=` in a systemd unit, `ulimit -Hn` in a shell) \
             or lower --max-connections"
        );
    }
}

async fn lookup(listen: &str) -> Result<std::net::SocketAddr> {
    tokio::net::lookup_host(listen)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .with_context(|| format!("--listen {listen}: not an address"))
        .map_err(usage)
}

/// How long `serve --oneshot` waits without a session before it gives up: the client connects
/// within seconds, and between retries waits at most 30 s.
const ONESHOT_IDLE: Duration = Duration::from_secs(120);

/// `serve --oneshot`: one client, started over ssh (see `crate::ssh`).
async fn oneshot(args: ServeArgs) -> Result<ExitCode> {
    let root = args.root.clone().unwrap_or_else(|| PathBuf::from("/"));
    // Relative paths are relative to the home directory, as with scp.
    let base = std::env::var_os("HOME")
        .map(PathBuf::from)
        .and_then(|h| h.strip_prefix(&root).ok().map(Path::to_path_buf))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let token = access::new_token();
    let identity = Identity::generate()?;
    let fingerprint = identity.fingerprint();
    let mut config = ServerConfig::new(&root, token.clone());
    config.tls = Some(identity);
    config.allow_plaintext = args.allow_plaintext;
    config.third_party = args.third_party;
    config.base = base;
    config.max_connections = args.max_connections.clamp(1, 128);
    config.max_streams = args.max_streams.max(1);
    config.idle_timeout = parse_duration(&args.idle_timeout)
        .context("--idle-timeout")
        .map_err(usage)?
        .max(Duration::from_secs(5));
    let listen = args
        .listen
        .first()
        .cloned()
        .unwrap_or_else(|| "0.0.0.0:0".into());
    let addr = lookup(&listen).await?;
    raise_open_files(config.max_connections);
    let server = Server::bind(addr, config)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let port = server.local_addr()?.port();
    // The address the ssh client reached us on (SSH_CONNECTION = "cip cport sip sport"): it
    // works even when the client knows this host only by an ssh alias.
    let ssh_addr = std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|v| v.split_whitespace().nth(2).map(str::to_owned))
        .unwrap_or_default();
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{} 1 addr={ssh_addr} port={port} token={token} fingerprint={fingerprint}",
            crate::ssh::ANNOUNCE
        )?;
        out.flush()?;
    }
    let idle = server.idle_probe();
    let done = async move {
        let stdin_closed = async {
            let mut stdin = tokio::io::stdin();
            let mut buf = [0u8; 256];
            loop {
                match tokio::io::AsyncReadExt::read(&mut stdin, &mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        let idle_out = async {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if idle.idle_for() > ONESHOT_IDLE {
                    return;
                }
            }
        };
        tokio::select! {
            _ = stdin_closed => {}
            _ = idle_out => {}
            _ = shutdown_signal() => {}
        }
    };
    server.run(done).await;
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGINT or SIGTERM.
pub(super) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::{advertised, limits};
    use clap::Parser;
    use ferry_net::ServerConfig;
    use std::time::Duration;

    /// `ferry serve`'s arguments as main parses them.
    fn serve_args(argv: &[&str]) -> crate::args::ServeArgs {
        let cli = crate::args::Cli::try_parse_from(argv).unwrap();
        let crate::args::Command::Serve(a) = cli.command else {
            panic!("not serve")
        };
        a
    }

    #[test]
    fn the_catalog_session_bounds_reach_the_servers_config() {
        let mut config = ServerConfig::new("/", "t");
        limits(&mut config, &serve_args(&["ferry", "serve", "--root", "/"])).unwrap();
        assert_eq!(config.catalog_session_requests, 10_000);
        assert_eq!(config.catalog_session_idle, Duration::from_secs(30));
        let args = serve_args(&[
            "ferry",
            "serve",
            "--root",
            "/",
            "--catalog-session-requests",
            "0",
            "--catalog-session-idle",
            "2m",
        ]);
        limits(&mut config, &args).unwrap();
        assert_eq!(config.catalog_session_requests, 0);
        assert_eq!(config.catalog_session_idle, Duration::from_secs(120));
        let args = serve_args(&[
            "ferry",
            "serve",
            "--root",
            "/",
            "--catalog-session-idle",
            "x",
        ]);
        let e = limits(&mut config, &args).unwrap_err();
        assert!(
            format!("{e:#}").contains("--catalog-session-idle x"),
            "{e:#}"
        );
    }

    #[test]
    fn the_advertised_address_is_given_or_the_first_specific_listen_address() {
        let local = [
            "127.0.0.1:7071".parse().unwrap(),
            "10.0.0.1:7071".parse().unwrap(),
        ];
        assert_eq!(advertised(None, &local).unwrap(), "127.0.0.1:7071");
        let wild = ["0.0.0.0:7070".parse().unwrap()];
        assert_eq!(advertised(None, &wild).unwrap(), "");
        assert_eq!(advertised(Some("none"), &local).unwrap(), "");
        assert_eq!(
            advertised(Some("dtn1.example.org:7070"), &wild).unwrap(),
            "dtn1.example.org:7070"
        );
        assert_eq!(advertised(Some("[::1]:7070"), &wild).unwrap(), "[::1]:7070");
        for bad in ["dtn1", "dtn1:0", ":7070", "dtn1:port", "a b:1"] {
            let e = advertised(Some(bad), &wild).unwrap_err();
            assert!(e.to_string().contains("HOST:PORT"), "{bad}: {e}");
        }
    }
}
