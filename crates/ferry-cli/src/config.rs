//! Second stage of argument handling: raw arguments become resolved settings (sizes parsed,
//! remotes split, the token found), with errors that say what to type instead. A command
//! resolves all its arguments here before it does anything ([`Transfer`], [`Listing`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ferry_core::filter::{Action, Filter};
use ferry_net::copy::CopyConfig;
use ferry_net::{ClientConfig, KnownHosts, Security, ServerTrust, StripeHost};
use ferry_proto::{ExistingPolicy, TransferOpts, MAX_BLOCK_DATA};
use ferry_units::units::{parse_duration, parse_size};

use crate::args::token_given;
use crate::args::{
    AuthArgs, ConnArgs, FilterArg, FilterArgs, GetArgs, LsArgs, PutArgs, ServerPairArgs, SyncArgs,
    TransferArgs, WaitArgs,
};
use crate::remote::{Remote, DEFAULT_PORT};

/// The client config file: a default token, per-host tokens, and endpoints of several hosts.
#[derive(Debug, Default, serde::Deserialize)]
struct ClientFile {
    token: Option<String>,
    #[serde(default)]
    hosts: std::collections::BTreeMap<String, HostEntry>,
    #[serde(default)]
    endpoints: std::collections::BTreeMap<String, EndpointEntry>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct HostEntry {
    token: Option<String>,
}

/// `[endpoints.NAME]`: one site's hosts that share a file system (`hosts = ["dtn1", ...]`),
/// used as `NAME:/path` in place of a host; a put or a get stripes over all of them.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointEntry {
    hosts: Vec<String>,
    token: Option<String>,
}

/// Hosts an endpoint has at most: each opens its own session and connections.
const MAX_ENDPOINT_HOSTS: usize = 64;

/// Reads the client config file: `--config` (which must exist) or the default location
/// (which may not). Returns where it was looked for, and what it held.
fn client_file(config: Option<&Path>) -> Result<(Option<PathBuf>, Option<ClientFile>)> {
    let path = config.map(Path::to_path_buf).or_else(default_config_path);
    let Some(p) = &path else {
        return Ok((None, None));
    };
    match std::fs::read_to_string(p) {
        Ok(text) => {
            let file: ClientFile =
                toml::from_str(&text).with_context(|| format!("reading {}", p.display()))?;
            Ok((path, Some(file)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && config.is_none() => Ok((path, None)),
        Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
    }
}

/// When the config file names `remote.host` as an endpoint (`[endpoints.NAME]`), points the
/// remote at the endpoint's first host and returns the others (`HOST:PORT`), for a put or a
/// get to stripe over. The endpoint's token, if it has one, becomes `auth`'s unless `--token` or
/// `FERRY_TOKEN` gave one: it comes before the per-host and default tokens. A remote over ssh,
/// or with a host no endpoint names, is left as it is.
pub fn resolve_endpoint(auth: &mut AuthArgs, remote: &mut Remote) -> Result<Vec<String>> {
    if remote.ssh_user.is_some() {
        return Ok(Vec::new());
    }
    let (_, Some(mut file)) = client_file(auth.config.as_deref())? else {
        return Ok(Vec::new());
    };
    let Some(entry) = file.endpoints.remove(&remote.host) else {
        return Ok(Vec::new());
    };
    let name = &remote.host;
    if entry.hosts.is_empty() || entry.hosts.len() > MAX_ENDPOINT_HOSTS {
        bail!("endpoint `{name}` needs between 1 and {MAX_ENDPOINT_HOSTS} hosts in `hosts`");
    }
    let mut servers = Vec::with_capacity(entry.hosts.len());
    for h in &entry.hosts {
        let (host, port) =
            host_port(h).with_context(|| format!("endpoint `{name}`: host `{h}`"))?;
        let server = Remote {
            host,
            port,
            path: String::new(),
            ssh_user: None,
        };
        if servers
            .iter()
            .any(|s: &Remote| s.server() == server.server())
        {
            bail!("endpoint `{name}` lists {} twice", server.server());
        }
        servers.push(server);
    }
    let first = servers.remove(0);
    remote.host = first.host;
    remote.port = first.port;
    if token_given(auth.token.as_deref()).is_none() {
        auth.token = entry.token;
    }
    Ok(servers.iter().map(Remote::server).collect())
}

/// `HOST`, `HOST:PORT`, `V6`, `[V6]` or `[V6]:PORT` as a host (brackets dropped) and a port,
/// 7070 unless given.
fn host_port(s: &str) -> Result<(String, u16)> {
    let s = s.trim();
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').context("missing `]`")?;
        match after {
            "" => (h, None),
            p => (
                h,
                Some(p.strip_prefix(':').context("expected `:PORT` after `]`")?),
            ),
        }
    } else {
        match s.rsplit_once(':') {
            // Several colons and no brackets: an IPv6 address without a port.
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            _ => (s, None),
        }
    };
    if host.is_empty() || host.contains(['/', ' ', '@']) {
        bail!("not a host name");
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse().ok().filter(|&p| p > 0).context("not a port")?,
    };
    Ok((host.to_owned(), port))
}

/// The token the config file gives `host` itself (`[hosts.HOST]`), if any: what a replica on
/// that host is fetched with, before the token given for the named server.
pub fn host_token(auth: &AuthArgs, host: &str) -> Result<Option<String>> {
    let (_, file) = client_file(auth.config.as_deref())?;
    Ok(file.and_then(|f| f.hosts.get(host).and_then(|h| h.token.clone())))
}

/// A server address as a catalog keeps it (`HOST:PORT`, `[V6]:PORT`) as a remote's host and
/// port.
pub fn address_host_port(address: &str) -> Result<(String, u16)> {
    host_port(address)
}

/// Where the client pins server keys: `$XDG_CONFIG_HOME/ferry/known_hosts`, else
/// `~/.config/ferry/known_hosts`.
pub fn default_known_hosts() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME") {
        return Some(PathBuf::from(x).join("ferry/known_hosts"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/ferry/known_hosts"))
}

/// How to protect and trust the connections to `server` (`host:port`).
pub fn security(conn: &ConnArgs, server: &str) -> Result<Security> {
    if conn.no_encrypt {
        if conn.server_fingerprint.is_some() {
            bail!("--server-fingerprint needs TLS; drop --no-encrypt");
        }
        return Ok(Security::Plaintext);
    }
    if let Some(fp) = &conn.server_fingerprint {
        return Ok(Security::Tls(ServerTrust::Pinned(fp.parse()?)));
    }
    let file = conn
        .known_hosts_file()
        .or_else(default_known_hosts)
        .context("no place for the known-hosts file: set HOME, or pass --known-hosts or --server-fingerprint")?;
    Ok(Security::Tls(ServerTrust::KnownHosts {
        file: KnownHosts::new(file),
        host: server.to_owned(),
    }))
}

pub fn default_config_path() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME") {
        return Some(PathBuf::from(x).join("ferry/config.toml"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/ferry/config.toml"))
}

/// Finds the token: `--token`/`FERRY_TOKEN`, else the config file (per host, then default).
pub fn resolve_token(auth: &AuthArgs, host: &str) -> Result<String> {
    if let Some(t) = token_given(auth.token.as_deref()) {
        return Ok(t);
    }
    let (path, file) = client_file(auth.config.as_deref())?;
    if let Some(file) = file {
        if let Some(t) = file
            .hosts
            .get(host)
            .and_then(|h| h.token.clone())
            .or(file.token)
        {
            return Ok(t);
        }
    }
    bail!(
        "no access token for {host}: pass --token, set FERRY_TOKEN, or put `token = \"...\"` in {}",
        path.map(|p| p.display().to_string())
            .unwrap_or_else(|| "the config file".into())
    )
}

/// `--streams`: `None` for `auto`, else the fixed count.
pub fn parse_streams(s: &str) -> Result<Option<u16>> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    match s.trim().parse::<u16>() {
        Ok(n @ 1..=256) => Ok(Some(n)),
        _ => bail!("--streams must be `auto` or a number between 1 and 256"),
    }
}

/// A client for sessions that move no files (`ls`, `probe net`): the token and trust of a
/// transfer, one stream, no retries.
pub fn control_config(
    auth: &AuthArgs,
    conn: &ConnArgs,
    remote: &Remote,
    idle_timeout: Duration,
) -> Result<ClientConfig> {
    Ok(ClientConfig {
        server: remote.server(),
        token: resolve_token(auth, &remote.host)?,
        opts: TransferOpts {
            streams: 1,
            block_size: 1 << 20,
            checksum: ferry_proto::ChecksumAlgo::Blake3,
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
        connect_timeout: Duration::from_secs(15),
        idle_timeout,
        corrupt_blocks: Vec::new(),
        retry_for: Duration::ZERO,
        security: security(conn, &remote.server())?,
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
    })
}

/// Storage threads when neither an option nor a disk profile says otherwise.
const DEFAULT_STORAGE: usize = ferry_net::DEFAULT_STORAGE_THREADS as usize;

/// Starts this end's storage threads (readers for a put, writers for a get) from
/// `ferry probe disk`'s profile of the file system `local` is on, unless they were fixed.
pub fn apply_disk_profile(cfg: &mut ClientConfig, state_dir: &Path, local: &Path, put: bool) {
    if !cfg.tune_storage {
        return;
    }
    let Some(p) = ferry_probe::disk::disk_profile_for(state_dir, local) else {
        return;
    };
    if put {
        cfg.readers = p.read_threads.clamp(1, 64) as usize;
    } else {
        cfg.writers = p.write_threads.clamp(1, 64) as usize;
    }
    cfg.storage_from = "disk profile";
    if cfg.block_from == "default" {
        if let Some(size) = p.request_size {
            cfg.opts.block_size = ferry_probe::disk::block_size_for(size);
            cfg.block_from = "disk profile";
        }
    }
}

/// ferry's block size without `--block-size` or a disk profile.
pub const DEFAULT_BLOCK: u64 = 8 << 20;

/// Starts an auto-tuned transfer from what the tuner settled on last time for this server.
pub fn apply_profile(cfg: &mut ClientConfig, profiles: &crate::profiles::Profiles, key: &str) {
    if !cfg.opts.is_auto() {
        return;
    }
    if let Some(e) = profiles.load(key) {
        let n = e.streams.clamp(1, u32::from(cfg.opts.streams)) as u16;
        cfg.opts.auto_start = n;
        cfg.start_from = ferry_net::StartFrom::Profile { settled: e.settled };
    } else if let Some(p) = ferry_probe::net::load_profiles(profiles.dir()).get(key) {
        // No transfer has tuned this route yet, but `ferry probe net` measured it.
        let n = p.streams.clamp(1, cfg.opts.streams);
        cfg.opts.auto_start = n;
        cfg.start_from = ferry_net::StartFrom::Probe;
    }
}

/// Opens ramp helpers for an auto-tuned transfer over a path an earlier transfer to the same
/// server measured (`ferry_net::ramp_helpers`); the first transfer to a server opens none.
pub fn apply_ramp_helpers(cfg: &mut ClientConfig, profiles: &crate::profiles::Profiles, key: &str) {
    if !cfg.opts.is_auto() || cfg.force_streams.is_some() {
        return;
    }
    let Some(p) = profiles.load_path(key) else {
        return;
    };
    let n = ferry_net::ramp_helpers(Duration::from_micros(p.rtt_us), p.bytes_per_s);
    cfg.helpers = n;
    cfg.opts.streams = cfg.opts.streams.saturating_add(n);
}

/// Takes the filter options out of `args`, as rules in command-line order; a bad pattern or
/// an unreadable `--filter-from` file is named in the error.
pub fn take_filter(args: &mut TransferArgs) -> Result<Filter> {
    let FilterArgs {
        exclude,
        include,
        filter_from: from,
        mut order,
    } = std::mem::take(&mut args.filter);
    if order.is_empty() {
        order.extend(exclude.into_iter().map(FilterArg::Exclude));
        order.extend(include.into_iter().map(FilterArg::Include));
        order.extend(from.into_iter().map(FilterArg::From));
    }
    let mut filter = Filter::default();
    for arg in order {
        match arg {
            FilterArg::Exclude(p) => filter.add(Action::Exclude, &p),
            FilterArg::Include(p) => filter.add(Action::Include, &p),
            FilterArg::From(f) => filter.add_file(&f),
        }?;
    }
    Ok(filter)
}

/// Turns transfer arguments into a client configuration for `remote`.
pub fn client_config(args: &TransferArgs, remote: &Remote) -> Result<ClientConfig> {
    // put and get take their filter out first (`take_filter`): only cp gets here with one.
    let f = &args.filter;
    if !(f.exclude.is_empty() && f.include.is_empty() && f.filter_from.is_empty()) {
        bail!("--exclude, --include and --filter-from work with put and get, not with cp");
    }
    let block = match &args.block_size {
        None => DEFAULT_BLOCK,
        Some(b) => {
            let block = parse_size(b)?;
            if !(4096..=u64::from(MAX_BLOCK_DATA)).contains(&block) {
                bail!("--block-size {b} is out of range (4K to 64M)");
            }
            block
        }
    };
    let tcp_window = match &args.tcp_window {
        None => 0,
        Some(w) => {
            let w = parse_size(w)?;
            if w == 0 || w > u64::from(u32::MAX / 2) {
                bail!("--tcp-window must be between 1 byte and 2G");
            }
            w as u32
        }
    };
    // Auto: open up to AUTO_MAX_STREAMS, start with the default (a profile may change that).
    let (streams, auto_start) = match parse_streams(&args.streams)? {
        None => (ferry_net::AUTO_MAX_STREAMS, ferry_net::DEFAULT_STREAMS),
        Some(n) => (n, 0),
    };
    let checksum = match &args.checksum {
        None => ferry_proto::ChecksumAlgo::Blake3,
        Some(name) => ferry_core::digest::parse_algo(name)
            .with_context(|| format!("--checksum {name}: use blake3, xxh3, sha256 or md5"))?,
    };
    let existing = if args.overwrite {
        ExistingPolicy::Overwrite
    } else if args.skip_existing {
        ExistingPolicy::Skip
    } else {
        ExistingPolicy::Fail
    };
    // An ssh-started session brings its own one-time token.
    let token = if remote.ssh_user.is_some() {
        String::new()
    } else {
        resolve_token(&args.auth, &remote.host)?
    };
    let (connect_timeout, retry_for) = waits(&args.wait)?;
    crate::pin::for_server(&remote.server());
    Ok(ClientConfig {
        server: remote.server(),
        token,
        opts: TransferOpts {
            streams,
            block_size: block as u32,
            checksum,
            existing,
            tcp_window,
            auto_start,
            // Set by `put`/`get`, which know whose pool a number is.
            storage_threads: 0,
        },
        readers: args.readers.unwrap_or(DEFAULT_STORAGE).clamp(1, 64),
        writers: args.writers.unwrap_or(DEFAULT_STORAGE).clamp(1, 64),
        // A number for either fixes this end's pool; the server tunes its own.
        tune_storage: args.readers.is_none() && args.writers.is_none(),
        storage_from: if args.readers.is_none() && args.writers.is_none() {
            "default"
        } else {
            "fixed"
        },
        block_from: if args.block_size.is_some() {
            "fixed"
        } else {
            "default"
        },
        connect_timeout,
        idle_timeout: Duration::from_secs(120),
        corrupt_blocks: Vec::new(),
        retry_for,
        security: security(&args.conn, &remote.server())?,
        start_from: Default::default(),
        force_streams: None,
        stall_stream: None,
        drain_at_end: false,
        helpers: 0,
        modes: Default::default(),
        links: Default::default(),
        multipath: args.multipath || !args.bind.is_empty(),
        bind: args.bind.clone(),
        stripe: args
            .stripe
            .iter()
            .map(|h| stripe_host(&args.conn, h))
            .collect::<Result<_>>()?,
    })
}

/// One `--stripe` host: its port defaults as a remote's does, and its key is its own, checked
/// against the known hosts (`--server-fingerprint` pins the destination server alone).
fn stripe_host(conn: &ConnArgs, host: &str) -> Result<StripeHost> {
    let host = host.trim();
    if host.is_empty() {
        bail!("--stripe: an empty host name");
    }
    let has_port = match host.rsplit_once(':') {
        Some((h, p)) => {
            !h.is_empty() && p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']'))
        }
        None => false,
    };
    let server = match (has_port, host.contains(':')) {
        (true, _) => host.to_owned(),
        (false, true) => format!("[{}]:{DEFAULT_PORT}", host.trim_matches(['[', ']'])),
        (false, false) => format!("{host}:{DEFAULT_PORT}"),
    };
    let unpinned = ConnArgs {
        server_fingerprint: None,
        ..conn.clone()
    };
    Ok(StripeHost {
        security: security(&unpinned, &server)?,
        server,
        token: None,
    })
}

/// `--connect-timeout` (at least a second) and `--retry-for`.
pub fn waits(args: &WaitArgs) -> Result<(Duration, Duration)> {
    let connect = parse_duration(&args.connect_timeout)
        .context("--connect-timeout")?
        .max(Duration::from_secs(1));
    let retry_for = parse_duration(&args.retry_for).context("--retry-for")?;
    Ok((connect, retry_for))
}

/// Which way a transfer's files go, and its local side.
pub enum Job {
    /// Local sources, sent to the remote path.
    Put(Vec<PathBuf>),
    /// A local tar archive, its members sent into the remote directory (`put --untar`).
    Untar(PathBuf),
    /// From the remote path to a local destination.
    Get(PathBuf),
}

/// A put or a get resolved from its arguments: everything the transfer runs from.
pub struct Transfer {
    pub remote: Remote,
    pub client: ClientConfig,
    pub job: Job,
    /// What of the job is sent (`--exclude`/`--include`/`--filter-from`).
    pub filter: Filter,
    pub json: bool,
    pub manifest: Option<PathBuf>,
    /// How to start a session over ssh, for `USER@HOST:PATH`.
    pub conn: ConnArgs,
    /// The token and config file given: a replica's host may have a token of its own there.
    pub auth: AuthArgs,
    /// `--checksum` given: a put under a policy with another algorithm is refused, not put
    /// again with the policy's.
    pub checksum_chosen: bool,
}

impl Transfer {
    /// `put SOURCES... DEST`: the last path is the remote; none of the others may look remote
    /// unless it exists locally.
    pub fn put(mut args: PutArgs) -> Result<Self> {
        let filter = take_filter(&mut args.transfer)?;
        let (dest, sources) = args.paths.split_last().context("nothing to send")?;
        let mut remote = Remote::parse(dest)
            .context("the last argument of put is the destination, HOST[:PORT]:PATH")?;
        let others = resolve_endpoint(&mut args.transfer.auth, &mut remote)?;
        if let Some(s) = sources
            .iter()
            .find(|s| Remote::looks_remote(s) && !Path::new(s).exists())
        {
            bail!("`{s}` looks remote; put sends local paths (use get to fetch)");
        }
        let mut client = client_config(&args.transfer, &remote)?;
        for h in &others {
            if !client.stripe.iter().any(|s| &s.server == h) {
                client.stripe.push(stripe_host(&args.transfer.conn, h)?);
            }
        }
        // A --writers number is the server's writers: asked of it (it caps them).
        client.opts.storage_threads = asked_threads(args.transfer.writers);
        // This process ends with the put (the demo, which hosts a server, leaves it off).
        client.drain_at_end = true;
        let job = match args.untar {
            true => untar_job(sources, &filter, &client)?,
            false => Job::Put(sources.iter().map(PathBuf::from).collect()),
        };
        Ok(Self::new(remote, client, (job, filter), args.transfer))
    }

    /// `get SOURCE DEST`.
    pub fn get(mut args: GetArgs) -> Result<Self> {
        let filter = take_filter(&mut args.transfer)?;
        let dest = match std::mem::take(&mut args.dest).as_slice() {
            [dest] => dest.clone(),
            _ => bail!("get takes one local destination (PATHS are for --tar)"),
        };
        let mut remote = Remote::parse(&args.remote)
            .context("the first argument of get is the source, HOST[:PORT]:PATH")?;
        // An endpoint's first host coordinates; the others serve blocks of large files.
        let others = resolve_endpoint(&mut args.transfer.auth, &mut remote)?;
        let mut client = client_config(&args.transfer, &remote)?;
        for h in &others {
            if !client.stripe.iter().any(|s| &s.server == h) {
                client.stripe.push(stripe_host(&args.transfer.conn, h)?);
            }
        }
        // A --readers number is the server's readers: asked of it (it caps them).
        client.opts.storage_threads = asked_threads(args.transfer.readers);
        if args.safe_links {
            client.links = ferry_core::recv::Links::InTree;
        }
        if args.keep_modes {
            client.modes = ferry_core::recv::Modes::Keep;
        }
        Ok(Self::new(
            remote,
            client,
            (Job::Get(dest), filter),
            args.transfer,
        ))
    }

    fn new(
        remote: Remote,
        client: ClientConfig,
        (job, filter): (Job, Filter),
        args: TransferArgs,
    ) -> Self {
        Self {
            remote,
            client,
            job,
            filter,
            json: args.output.json,
            manifest: args.manifest,
            conn: args.conn,
            auth: args.auth,
            checksum_chosen: args.checksum.is_some(),
        }
    }
}

/// `put --untar ARCHIVE REMOTE_DIR/`: one archive, sent whole.
fn untar_job(sources: &[String], filter: &Filter, client: &ClientConfig) -> Result<Job> {
    let [archive] = sources else {
        bail!("--untar sends one tar archive; name one file before the destination");
    };
    if !filter.is_empty() {
        bail!("--untar sends every member of the archive; --exclude/--include do not apply");
    }
    if !client.stripe.is_empty() {
        bail!("--untar is not striped yet; name one host");
    }
    Ok(Job::Untar(PathBuf::from(archive)))
}

/// A sync resolved from its arguments.
pub struct SyncJob {
    pub ends: SyncEnds,
    /// The sides named `USER@HOST:PATH`, whose sessions ssh starts (`ferry serve --oneshot`,
    /// which serves the sync's listings, transfer and removals while the ssh channel is open),
    /// source first; and how to reach them.
    pub ssh: [Option<Remote>; 2],
    pub conn: ConnArgs,
    /// Rules relative to the source's top.
    pub filter: Filter,
    pub opts: ferry_net::sync::SyncOpts,
    pub json: bool,
    /// `--digest` given: a put under a policy with another algorithm is refused, not run
    /// again with the policy's.
    pub checksum_chosen: bool,
}

/// Where a sync's two trees are.
pub enum SyncEnds {
    /// One local, the other on a server.
    One {
        client: Box<ClientConfig>,
        direction: ferry_net::sync::Direction,
    },
    /// Both on servers: a third-party copy from `src` to `dest`.
    Between {
        copy: Box<CopyConfig>,
        src: String,
        dest: String,
    },
}

impl SyncJob {
    /// One side local and the other on a server, or both on servers; a server is a running
    /// `ferry serve` or one ssh starts for the sync (`USER@HOST:PATH`).
    pub fn new(mut args: SyncArgs) -> Result<Self> {
        use ferry_net::sync::Direction;
        let filter = take_filter(&mut args.transfer)?;
        if args.transfer.skip_existing || args.transfer.manifest.is_some() {
            bail!("--skip-existing and --manifest are for put and get; sync replaces what differs");
        }
        let remote_src = Remote::looks_remote(&args.source) && !Path::new(&args.source).exists();
        let remote_dest = Remote::looks_remote(&args.dest) && !Path::new(&args.dest).exists();
        let (remote, direction) = match (remote_src, remote_dest) {
            (false, true) => {
                let remote = Remote::parse(&args.dest).context("the destination of sync")?;
                let dest = remote.path.clone();
                let src = PathBuf::from(&args.source);
                (remote, Direction::Put { src, dest })
            }
            (true, false) => {
                let remote = Remote::parse(&args.source).context("the source of sync")?;
                let src = remote.path.clone();
                let dest = PathBuf::from(&args.dest);
                (remote, Direction::Get { src, dest })
            }
            (true, true) => return Self::between(args, filter),
            (false, false) => {
                bail!("sync needs one side on a server, HOST[:PORT]:PATH (for two local trees, use rsync)")
            }
        };
        let ssh_remote = remote.ssh_user.is_some().then(|| remote.clone());
        let ssh = match direction {
            Direction::Put { .. } => [None, ssh_remote],
            Direction::Get { .. } => [ssh_remote, None],
        };
        let s = &args.servers;
        if s.dest_addr.is_some()
            || s.source_token.is_some()
            || s.dest_token.is_some()
            || s.source_fingerprint.is_some()
            || s.dest_fingerprint.is_some()
        {
            bail!("--dest-addr and --source-/--dest-token/-fingerprint are for a sync between two servers");
        }
        let mut client = client_config(&args.transfer, &remote)?;
        client.opts.storage_threads = match direction {
            Direction::Put { .. } => asked_threads(args.transfer.writers),
            Direction::Get { .. } => asked_threads(args.transfer.readers),
        };
        Ok(Self {
            ssh,
            conn: args.transfer.conn.clone(),
            ends: SyncEnds::One {
                client: Box::new(client),
                direction,
            },
            filter,
            opts: sync_opts(&args),
            json: args.transfer.output.json,
            checksum_chosen: args.transfer.checksum.is_some(),
        })
    }

    /// Both trees on running servers: a third-party copy between them, configured as cp's.
    fn between(args: SyncArgs, filter: Filter) -> Result<Self> {
        let src = Remote::parse(&args.source).context("the source of sync")?;
        let dest = Remote::parse(&args.dest).context("the destination of sync")?;
        let copy = copy_config(&args.transfer, &args.servers, (&src, &dest), "sync")?;
        let ssh = [
            src.ssh_user.is_some().then(|| src.clone()),
            dest.ssh_user.is_some().then(|| dest.clone()),
        ];
        Ok(Self {
            ssh,
            conn: args.transfer.conn.clone(),
            ends: SyncEnds::Between {
                copy: Box::new(copy),
                src: src.path,
                dest: dest.path,
            },
            filter,
            opts: sync_opts(&args),
            json: args.transfer.output.json,
            checksum_chosen: args.transfer.checksum.is_some(),
        })
    }
}

fn sync_opts(args: &SyncArgs) -> ferry_net::sync::SyncOpts {
    ferry_net::sync::SyncOpts {
        checksum: args.by_content,
        delete: args.delete,
        dry_run: args.dry_run,
    }
}

/// How this host reaches the two servers of a third-party copy (`cmd`: cp, or a sync between
/// servers): each as a put or get would, with its own token and pin where given.
pub fn copy_config(
    t: &TransferArgs,
    servers: &ServerPairArgs,
    (src, dst): (&Remote, &Remote),
    cmd: &str,
) -> Result<CopyConfig> {
    if t.conn.no_encrypt {
        bail!("a third-party copy always uses TLS: the source pins the destination's key");
    }
    if t.conn.server_fingerprint.is_some() {
        bail!("{cmd} talks to two servers: use --source-fingerprint and --dest-fingerprint");
    }
    let side = |remote: &Remote, token: Option<&String>, fingerprint: Option<&str>| {
        let mut args = t.clone();
        if let Some(token) = token {
            args.auth.token = Some(token.clone());
        }
        let mut cfg = client_config(&args, remote)?;
        if let Some(fp) = fingerprint {
            cfg.security = Security::Tls(ServerTrust::Pinned(fp.parse()?));
        }
        anyhow::Ok(cfg)
    };
    let source = side(
        src,
        servers.source_token.as_ref(),
        servers.source_fingerprint.as_deref(),
    );
    let dest = side(
        dst,
        servers.dest_token.as_ref(),
        servers.dest_fingerprint.as_deref(),
    );
    let (mut source, dest) = (source?, dest?);
    // `--stripe` names the destination's other hosts (they write the blocks the source
    // sends); a source endpoint's hosts are added by `cp_config` (the destination pulls).
    source.stripe.clear();
    if !dest.stripe.is_empty() && cmd != "cp" {
        bail!("{cmd} between two servers is not striped yet; drop --stripe");
    }
    // A --writers number is the destination's writers, as on a put; the source tunes its own
    // readers.
    source.opts.storage_threads = t.writers.map_or(0, |n| n.clamp(1, 256) as u16);
    Ok(CopyConfig {
        source,
        dest,
        dest_addr: servers.dest_addr.clone(),
    })
}

/// `cp`'s configuration: [`copy_config`], with an `[endpoints]` name on either side resolved
/// to its first host (its token, if it has one, that side's unless one was given). The
/// destination endpoint's other hosts, and `--stripe`, are the copy's stripe hosts; a source
/// endpoint's other hosts are the source's (the destination then pulls, `copy::copy`). Both
/// is refused: a copy stripes one side.
pub fn cp_config(
    t: &TransferArgs,
    servers: &ServerPairArgs,
    (src, dst): (&mut Remote, &mut Remote),
) -> Result<CopyConfig> {
    let endpoint = |remote: &mut Remote, token: &Option<String>| {
        let mut auth = t.auth.clone();
        let named = remote.host.clone();
        let others = resolve_endpoint(&mut auth, remote)?;
        let token = match (token, auth.token != t.auth.token) {
            (Some(given), _) => Some(given.clone()),
            (None, true) => auth.token,
            (None, false) => None,
        };
        anyhow::Ok((named, others, token))
    };
    let (named, source_others, source_token) = endpoint(src, &servers.source_token)?;
    let (_, others, dest_token) = endpoint(dst, &servers.dest_token)?;
    let dest_striped = !others.is_empty() || !t.stripe.is_empty();
    if !source_others.is_empty() && dest_striped {
        bail!(
            "endpoint `{named}` has {} hosts and the destination is striped too: cp stripes \
             its source (the destination pulls) or its destination (the source pushes), not \
             both yet; name one host of either",
            source_others.len() + 1
        );
    }
    let pair = ServerPairArgs {
        dest_addr: servers.dest_addr.clone(),
        source_token,
        dest_token,
        source_fingerprint: servers.source_fingerprint.clone(),
        dest_fingerprint: servers.dest_fingerprint.clone(),
    };
    let mut cfg = copy_config(t, &pair, (src, dst), "cp")?;
    for h in &others {
        if !cfg.dest.stripe.iter().any(|s| &s.server == h) {
            cfg.dest.stripe.push(stripe_host(&t.conn, h)?);
        }
    }
    if !cfg.dest.stripe.is_empty() && cfg.dest_addr.is_some() {
        bail!("--dest-addr names one host: a striped copy's source reaches every host by its name");
    }
    for h in &source_others {
        cfg.source.stripe.push(stripe_host(&t.conn, h)?);
    }
    if !cfg.source.stripe.is_empty() && cfg.dest_addr.is_some() {
        bail!(
            "--dest-addr is for a copy the source pushes; from endpoint `{named}` the \
             destination pulls, reaching each source host by its name"
        );
    }
    Ok(cfg)
}

/// An `ls` resolved from its arguments.
pub struct Listing {
    pub remote: Remote,
    pub client: ClientConfig,
    pub json: bool,
}

impl Listing {
    pub fn new(args: &LsArgs) -> Result<Self> {
        let (remote, client) = remote_client(
            &args.remote,
            "ls takes a remote directory, HOST[:PORT]:PATH",
            &args.auth,
            &args.conn,
            &args.wait,
        )?;
        Ok(Self {
            remote,
            client,
            json: args.output.json,
        })
    }
}

/// A remote path on a running `ferry serve` and the client that reaches it, for a command of
/// one request (ls, and the catalog commands): `what` is the usage said when `remote` is not
/// one.
pub fn remote_client(
    remote: &str,
    what: &str,
    auth: &AuthArgs,
    conn: &ConnArgs,
    wait: &WaitArgs,
) -> Result<(Remote, ClientConfig)> {
    let mut remote = Remote::parse(remote).with_context(|| what.to_owned())?;
    if remote.ssh_user.is_some() {
        bail!(
            "{} needs a running `ferry serve` (HOST[:PORT]:PATH); over ssh, use ssh itself",
            what.split(' ').next().unwrap_or("this")
        );
    }
    let mut auth = auth.clone();
    resolve_endpoint(&mut auth, &mut remote)?;
    let mut client = control_config(&auth, conn, &remote, Duration::from_secs(60))?;
    // The same waits and retries as a transfer.
    (client.connect_timeout, client.retry_for) = waits(wait)?;
    Ok((remote, client))
}

/// What a `--readers`/`--writers` number asks of the server's pool: 0 (the server chooses)
/// when none was given.
fn asked_threads(n: Option<usize>) -> u16 {
    n.map_or(0, |n| {
        n.clamp(1, usize::from(ferry_proto::MAX_STORAGE_THREADS)) as u16
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripe_hosts_take_the_default_port_and_their_own_key() {
        let conn = ConnArgs {
            server_fingerprint: Some("sha256:00".into()),
            known_hosts: Some(PathBuf::from("/nonexistent/known_hosts")),
            ..ConnArgs::default()
        };
        let names: Vec<String> = ["dtn2", "dtn3:7171", "::1", "[::1]:7000", " 10.0.0.4 "]
            .iter()
            .map(|h| stripe_host(&conn, h).unwrap().server)
            .collect();
        assert_eq!(
            names,
            [
                "dtn2:7070",
                "dtn3:7171",
                "[::1]:7070",
                "[::1]:7000",
                "10.0.0.4:7070"
            ]
        );
        // The destination's pin is not a stripe host's: each is checked by its known hosts.
        let h = stripe_host(&conn, "dtn2").unwrap();
        assert!(matches!(
            h.security,
            Security::Tls(ServerTrust::KnownHosts { ref host, .. }) if host == "dtn2:7070"
        ));
        assert!(stripe_host(&conn, " ").is_err());
    }

    #[test]
    fn endpoint_hosts_take_the_default_port() {
        let ok = |s: &str| host_port(s).unwrap();
        assert_eq!(ok("dtn1"), ("dtn1".into(), DEFAULT_PORT));
        assert_eq!(ok(" dtn1:7171 "), ("dtn1".into(), 7171));
        assert_eq!(ok("::1"), ("::1".into(), DEFAULT_PORT));
        assert_eq!(ok("[::1]"), ("::1".into(), DEFAULT_PORT));
        assert_eq!(ok("[fe80::1]:7000"), ("fe80::1".into(), 7000));
        for bad in [
            "",
            ":7070",
            "dtn1:0",
            "dtn1:x",
            "[::1",
            "[::1]7000",
            "a b",
            "u@h",
            "h/p",
        ] {
            assert!(host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8M").unwrap(), 8 << 20);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert!(parse_size("x").is_err());
        assert!(parse_size("3Q").is_err());
        assert_eq!(parse_duration("3m").unwrap(), Duration::from_secs(180));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("3 weeks").is_err());
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86_400)
        );
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(
            parse_duration(&format!("{}h", u64::MAX)).is_err(),
            "overflow is an error"
        );
        assert_eq!(parse_streams("auto").unwrap(), None);
        assert_eq!(parse_streams("AUTO").unwrap(), None);
        assert_eq!(parse_streams("8").unwrap(), Some(8));
        assert!(parse_streams("0").is_err());
        assert!(parse_streams("257").is_err());
        assert!(parse_streams("many").is_err());
    }
}
