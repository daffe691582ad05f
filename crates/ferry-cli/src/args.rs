//! Raw command-line arguments: parsing and validation only, no I/O. `config.rs` turns them
//! into something runnable.

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "ferry",
    version,
    about = "Move files and trees between hosts as fast as the path allows, verified end to end"
)]
pub struct Cli {
    /// Print nothing but errors (and --json output).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Log more (repeat for debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a server that clients put to and get from.
    Serve(ServeArgs),
    /// Send local files or trees to a server: `ferry put ./run42 dtn2:/incoming/`.
    Put(PutArgs),
    /// Fetch a file or tree from a server: `ferry get dtn2:/incoming/run42 ./copy/`.
    Get(GetArgs),
    /// Make DEST a copy of SOURCE, one or both on servers (rsync-style): send what is missing
    /// or differs by size and mtime (`--checksum`: by content), and with --delete remove what
    /// SOURCE lacks, once everything arrived: `ferry sync ./run42 dtn2:/mirror/run42 --delete`.
    Sync(Box<SyncArgs>),
    /// Copy between two servers, the data going from one to the other directly (a
    /// third-party copy): `ferry cp dtn1:/data/run42 dtn2:/incoming/`. Both servers run with
    /// --third-party; this host carries only control traffic.
    Cp(Box<CpArgs>),
    /// Make another server hold a replica of a registered file (-r: a tree), copied between
    /// the servers as cp does and registered as a replica of the same object:
    /// `ferry repl dtn1:/data/run42 -r --to dtn2`.
    Repl(Box<ReplArgs>),
    /// List a remote directory: names, sizes, mtimes.
    Ls(LsArgs),
    /// What the server's catalog knows of a file: size, mtime, digest, who stored it and
    /// when, its replicas and metadata.
    Stat(crate::catalog_args::StatArgs),
    /// Remove a remote file (-r: a directory and all in it) and its catalog entries.
    Rm(crate::catalog_args::RmArgs),
    /// Rename a remote file or directory within one server, its catalog entries with it.
    Mv(crate::catalog_args::MvArgs),
    /// Make a remote directory (-p: with its missing parents).
    Mkdir(crate::catalog_args::MkdirArgs),
    /// A remote file's metadata in the server's catalog: attribute, value, unit.
    #[command(subcommand)]
    Meta(crate::catalog_args::MetaCommand),
    /// Find files by metadata, name, age and size, from the server's catalog (the file system
    /// is never walked): `ferry find dtn2:/data --meta 'temp>40' --name '*.h5'`.
    Find(crate::catalog_args::FindArgs),
    /// Have the server re-read and re-hash what it holds under a path and compare it with its
    /// catalog (no data crosses the network); bad copies are marked. Exit 1 on any problem.
    Verify(crate::catalog_args::VerifyArgs),
    /// Start a local server on loopback, generate a data set, transfer and verify it, and print
    /// the throughput.
    Demo(DemoArgs),
    /// Measure what limits a transfer on this host: CPU, NICs, TCP settings, digest and
    /// AES-GCM speed (`host`), a file system's read/write behaviour (`disk PATH`), or the
    /// network path to a server (`net HOST[:PORT]`).
    #[command(subcommand)]
    Probe(ProbeCommand),
    /// Manage the server's access tokens: each has a name, path scopes, and is stored hashed.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Run the transfer service: a queue of jobs (put, get, copies between servers) run side
    /// by side, retried and resumed, behind an HTTP API with TLS and tokens.
    Service(crate::service_args::ServiceArgs),
    /// Queue a transfer on the service: `ferry submit /data/run42 dtn2:/incoming/`.
    Submit(crate::service_args::SubmitArgs),
    /// List the service's jobs (yours, or all for an admin token), newest first.
    Jobs(crate::service_args::JobsArgs),
    /// Show one job: files and bytes done, rate, ETA, attempts, the last error.
    Job(crate::service_args::JobArgs),
    /// Cancel a queued or running job.
    Cancel(crate::service_args::JobArgs),
    /// The service's links (its endpoints): latest measured rate, RTT, and whether the rate
    /// fell well below its recent median.
    Links(crate::service_args::LinksArgs),
    /// Write shell completions or the man page, generated from this command line's
    /// definition (what the Debian package ships; see scripts/deb.sh).
    #[command(subcommand, hide = true)]
    Generate(GenerateCommand),
}

impl Cli {
    /// Parses the command line as `Cli::try_parse` does, and notes which serve options it
    /// gave: those override a `--config` file, the others the file may set.
    pub fn parse_noting_given() -> Result<Self, clap::Error> {
        let matches = Self::command().try_get_matches()?;
        let mut cli = Self::from_arg_matches(&matches)?;
        if let (Command::Put(PutArgs { transfer: t, .. }), Some((_, m)))
        | (Command::Get(GetArgs { transfer: t, .. }), Some((_, m))) =
            (&mut cli.command, matches.subcommand())
        {
            t.filter.order = filter_order(m);
        }
        if let (Command::Sync(a), Some((_, m))) = (&mut cli.command, matches.subcommand()) {
            a.transfer.filter.order = filter_order(m);
        }
        if let (Command::Serve(a), Some(("serve", m))) = (&mut cli.command, matches.subcommand()) {
            a.given = m
                .ids()
                .filter(|id| m.value_source(id.as_str()) == Some(ValueSource::CommandLine))
                .map(|id| id.as_str().to_owned())
                .collect();
        }
        Ok(cli)
    }
}

/// Which files a put or get sends (rsync's filter rules).
#[derive(Args, Debug, Clone, Default)]
pub struct FilterArgs {
    /// Leave out what matches PATTERN, with rsync's rules: the first --exclude/--include
    /// that matches decides; a leading `/` anchors at the transfer root (`/dir/x` for a put of
    /// `dir`), else it matches at any depth; a trailing `/` matches directories only; `*` and
    /// `?` stop at `/`, `**` does not. An excluded directory is not entered. Repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub exclude: Vec<String>,
    /// Send what matches PATTERN, even if a later --exclude matches it too. Repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub include: Vec<String>,
    /// Read rules from FILE, one a line: `+ PATTERN` (include), `- PATTERN` (exclude), `!`
    /// (drop the rules so far), `merge FILE2` or `. FILE2` (FILE2's rules here); `#`/`;`
    /// comments and blank lines are ignored. `dir/***` matches dir and all below it.
    /// Repeatable.
    #[arg(long, value_name = "FILE")]
    pub filter_from: Vec<PathBuf>,
    /// --exclude, --include and --filter-from as they came on the command line, whose order
    /// decides (filled by [`Cli::parse_noting_given`]; empty, they are taken in that order).
    #[arg(skip)]
    pub order: Vec<FilterArg>,
}

/// One filter option, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterArg {
    Exclude(String),
    Include(String),
    From(PathBuf),
}

/// The filter options of a put or get in command-line order (clap keeps each option's values
/// apart, with their positions).
fn filter_order(m: &clap::ArgMatches) -> Vec<FilterArg> {
    let mut found: Vec<(usize, FilterArg)> = Vec::new();
    let mut note = |id: &str, make: &dyn Fn(&str) -> FilterArg| {
        if let (Some(values), Some(at)) = (m.get_many::<String>(id), m.indices_of(id)) {
            found.extend(at.zip(values.map(|v| make(v))));
        }
    };
    note("exclude", &|v| FilterArg::Exclude(v.to_owned()));
    note("include", &|v| FilterArg::Include(v.to_owned()));
    if let (Some(values), Some(at)) = (
        m.get_many::<PathBuf>("filter_from"),
        m.indices_of("filter_from"),
    ) {
        found.extend(at.zip(values.map(|v| FilterArg::From(v.clone()))));
    }
    found.sort_by_key(|(at, _)| *at);
    found.into_iter().map(|(_, f)| f).collect()
}

#[derive(Subcommand, Debug)]
pub enum GenerateCommand {
    /// bash, zsh and fish completions, as DIR/ferry.bash, DIR/_ferry and DIR/ferry.fish.
    Completions { dir: PathBuf },
    /// The man pages: DIR/ferry.1 and one per subcommand (ferry-serve.1, ...).
    Man { dir: PathBuf },
}

impl Command {
    /// The output format asked for, for the commands that print a report.
    pub fn output(&self) -> Option<&OutputArgs> {
        match self {
            Command::Put(a) => Some(&a.transfer.output),
            Command::Get(a) => Some(&a.transfer.output),
            Command::Cp(a) => Some(&a.transfer.output),
            Command::Repl(a) => Some(&a.transfer.output),
            Command::Sync(a) => Some(&a.transfer.output),
            Command::Ls(a) => Some(&a.output),
            Command::Stat(a) => Some(&a.reach.output),
            Command::Rm(a) => Some(&a.reach.output),
            Command::Mv(a) => Some(&a.reach.output),
            Command::Mkdir(a) => Some(&a.reach.output),
            Command::Meta(c) => Some(&c.reach().output),
            Command::Find(a) => Some(&a.reach.output),
            Command::Verify(a) => Some(&a.reach.output),
            Command::Demo(a) => Some(&a.output),
            Command::Probe(ProbeCommand::Host(a)) => Some(&a.output),
            Command::Probe(ProbeCommand::Disk(a)) => Some(&a.output),
            Command::Probe(ProbeCommand::Net(a)) => Some(&a.output),
            Command::Submit(a) => Some(&a.client.output),
            Command::Jobs(a) => Some(&a.client.output),
            Command::Job(a) | Command::Cancel(a) => Some(&a.client.output),
            Command::Links(a) => Some(&a.client.output),
            Command::Serve(_) | Command::Service(_) | Command::Token(_) | Command::Generate(_) => {
                None
            }
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a token and print it (once: only its hash is kept).
    Add(TokenAddArgs),
    /// Show the tokens: names and scopes, never secrets.
    List(TokenFileArgs),
    /// Delete a token; a running server refuses it from the next login on.
    Revoke(TokenRevokeArgs),
}

#[derive(Args, Debug)]
pub struct TokenFileArgs {
    /// Token file (default: tokens.toml in the server's state directory).
    #[arg(long)]
    pub tokens: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct TokenAddArgs {
    /// A name for the token (letters, digits, - _ . @): who or what uses it.
    pub name: String,
    /// Path prefix (under the server root) it may get and list; repeat for more. Default: all.
    #[arg(long = "read", value_name = "PREFIX")]
    pub read: Vec<String>,
    /// Path prefix it may put into; repeat for more. Default: all (unless --read-only).
    #[arg(long = "write", value_name = "PREFIX")]
    pub write: Vec<String>,
    /// No writes at all.
    #[arg(long, conflicts_with = "write")]
    pub read_only: bool,
    #[command(flatten)]
    pub file: TokenFileArgs,
}

#[derive(Args, Debug)]
pub struct TokenRevokeArgs {
    pub name: String,
    #[command(flatten)]
    pub file: TokenFileArgs,
}

/// The output format of a command that prints a report: text for people, or JSON.
#[derive(Args, Debug, Clone, Default)]
pub struct OutputArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Whom the client logs in as: the token, or where to find it.
#[derive(Args, Debug, Clone, Default)]
pub struct AuthArgs {
    /// Access token (else FERRY_TOKEN, else the config file).
    #[arg(long)]
    pub token: Option<String>,
    /// Client config file (default: $XDG_CONFIG_HOME/ferry/config.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// How long a client waits for a server, and keeps trying.
#[derive(Args, Debug, Clone)]
pub struct WaitArgs {
    /// How long to wait for a connection, e.g. 15s or 1m (a plain number is seconds).
    #[arg(long, default_value = "15s", value_name = "DURATION")]
    pub connect_timeout: String,
    /// Keep retrying, with backoff, after failures that a retry can fix (connection lost,
    /// server busy) for this long, e.g. 3m, 90s, 0 for never. Each retry resumes. A server
    /// that has not answered once is retried for a few seconds only; a name that does not
    /// resolve, not at all.
    #[arg(long, default_value = "3m", value_name = "DURATION")]
    pub retry_for: String,
}

/// How the client reaches and trusts a server.
#[derive(Args, Debug, Clone, Default)]
pub struct ConnArgs {
    /// Plain TCP instead of TLS: anyone on the path can read and change the data. Only works
    /// against a server started with --allow-plaintext.
    #[arg(long)]
    pub no_encrypt: bool,
    /// Accept only the server whose certificate has this SHA-256 fingerprint (printed by
    /// `ferry serve` at start), instead of trusting it on first use.
    #[arg(long, value_name = "sha256:HEX")]
    pub server_fingerprint: Option<String>,
    /// File of pinned server keys (default: $XDG_CONFIG_HOME/ferry/known_hosts).
    /// [env: FERRY_KNOWN_HOSTS]
    #[arg(long)]
    pub known_hosts: Option<PathBuf>,
    /// Command that reaches USER@HOST for ssh-started sessions, e.g. "ssh -p 2222 -i key".
    /// [env: FERRY_SSH] [default: ssh]
    #[arg(long, value_name = "COMMAND")]
    pub ssh: Option<String>,
    /// The ferry binary on the remote host, for ssh-started sessions.
    /// [env: FERRY_REMOTE_BIN] [default: ferry]
    #[arg(long, value_name = "PATH")]
    pub remote_ferry: Option<String>,
}

// The environment variables are read here, not by clap: clap counts an option set from the
// environment as given, and then shows it in the usage line of an error (`ferry get --token
// <TOKEN> <REMOTE> <DEST>`), as if it were required.

/// `name`'s value, unless unset or empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl ConnArgs {
    /// The ssh command: `--ssh`, else `FERRY_SSH`, else `ssh`.
    pub fn ssh_command(&self) -> String {
        self.ssh
            .clone()
            .or_else(|| env("FERRY_SSH"))
            .unwrap_or_else(|| "ssh".into())
    }

    /// The remote ferry binary: `--remote-ferry`, else `FERRY_REMOTE_BIN`, else `ferry`.
    pub fn remote_bin(&self) -> String {
        self.remote_ferry
            .clone()
            .or_else(|| env("FERRY_REMOTE_BIN"))
            .unwrap_or_else(|| "ferry".into())
    }

    /// The known-hosts file given: `--known-hosts`, else `FERRY_KNOWN_HOSTS`.
    pub fn known_hosts_file(&self) -> Option<PathBuf> {
        self.known_hosts
            .clone()
            .or_else(|| env("FERRY_KNOWN_HOSTS").map(PathBuf::from))
    }
}

/// The access token given: `--token`, else `FERRY_TOKEN`.
pub fn token_given(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_owned).or_else(|| env("FERRY_TOKEN"))
}

#[derive(Subcommand, Debug)]
pub enum ProbeCommand {
    /// CPUs, NUMA, NICs and IRQ affinity, TCP limits with advice, per-core digest and AES speed.
    Host(ProbeHostArgs),
    /// Read/write throughput against threads, request size and issue order; small-file create
    /// rate; fsync latency. Works in a temporary directory under PATH, removed afterwards.
    Disk(ProbeDiskArgs),
    /// Memory-to-memory throughput to a running `ferry serve` over ferry's own protocol,
    /// against stream count and socket buffer; says what limits it and saves the best setting
    /// as this endpoint's profile.
    Net(Box<ProbeNetArgs>),
}

#[derive(Args, Debug)]
#[command(mut_arg("token", |a| a.help(
    "Access token (else FERRY_TOKEN, else the config file); any token with a read scope"
)))]
pub struct ProbeNetArgs {
    /// The server, HOST[:PORT] (port 7070 by default; IPv6 as [::1]:7070).
    pub endpoint: String,
    /// Seconds each point sends (default 4; 2 with --quick; at most 30).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Seconds at the start of each point left out of its rate, for slow start (default: 1,
    /// or a quarter of --seconds if that is less).
    #[arg(long)]
    pub skip: Option<f64>,
    /// Runs per point; the median counts (default 3; 1 with --quick).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Streams 1 and 4, autotuning only, 2 s points, one run: for CI.
    #[arg(long, conflicts_with = "full")]
    pub quick: bool,
    /// Every stream count (1, 2, 4, 8, 16) for every socket buffer, even when adding streams
    /// stopped helping.
    #[arg(long)]
    pub full: bool,
    /// Fixed socket buffers to try besides autotuning, comma-separated (e.g. 4M,16M), or
    /// `none`. Each fixes SO_SNDBUF/SO_RCVBUF and so DISABLES TCP autotuning for its points.
    #[arg(long, default_value = "4M,16M")]
    pub windows: String,
    /// Most streams to try.
    #[arg(long, default_value_t = 16)]
    pub max_streams: u16,
    /// Measure the server sending to this host (default: this host sends, as for put).
    #[arg(long)]
    pub download: bool,
    /// Do not save the result as this endpoint's profile.
    #[arg(long)]
    pub no_save: bool,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub conn: ConnArgs,
}

#[derive(Args, Debug)]
pub struct ProbeHostArgs {
    /// Round-trip time the TCP advice is computed for, in milliseconds.
    #[arg(long, default_value_t = 100.0)]
    pub rtt_ms: f64,
    /// Rate to aim for, in Mbit/s (default: the fastest NIC that is up, else 10 Gbit/s).
    #[arg(long)]
    pub target_mbps: Option<f64>,
    /// Shorter speed measurements.
    #[arg(long)]
    pub quick: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct ProbeDiskArgs {
    /// Directory on the file system to measure.
    pub path: PathBuf,
    /// A short sweep (seconds instead of a minute).
    #[arg(long, conflicts_with = "full")]
    pub quick: bool,
    /// Every combination of threads, request size, issue order and I/O mode.
    #[arg(long)]
    pub full: bool,
    /// Most threads to try.
    #[arg(long)]
    pub max_threads: Option<usize>,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Do not save the result as this file system's profile (which transfers start from).
    #[arg(long)]
    pub no_save: bool,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Directory that every client path is confined to (with --oneshot: default /, relative
    /// paths from $HOME, as with scp).
    #[arg(long, required_unless_present_any = ["oneshot", "config"])]
    pub root: Option<PathBuf>,
    /// Address to listen on: control and data connections all use this one port. Default
    /// 0.0.0.0:7070; with --oneshot, an ephemeral port. Repeat it, one address per network
    /// card, to offer several network paths: a client with --multipath spreads its data
    /// connections over all of them.
    #[arg(long)]
    pub listen: Vec<String>,
    /// File holding the access token; created with a new random token (mode 0600) if absent.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Connections open at once before new ones are refused as busy.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Most data connections one session may open.
    #[arg(long, default_value_t = 64)]
    pub max_streams: u16,
    /// Connections from one address (IPv6: one /64) that have not logged in or joined their
    /// session; more are refused as busy. Never below --max-streams + 1, what one client dials.
    #[arg(long, default_value_t = 128)]
    pub max_unauthenticated: usize,
    /// Sessions one token may run at once; more are refused as busy.
    #[arg(long, default_value_t = 16)]
    pub max_sessions_per_token: usize,
    /// Most reader or writer threads one session may run: what a client's --writers (put) or
    /// --readers (get) may ask for, and how far the server's own tuning may grow a pool.
    /// Default: the host's cores, at least 16.
    #[arg(long, value_name = "N")]
    pub max_storage_threads: Option<usize>,
    /// End a session after this long without traffic (e.g. 120s, 2m; a plain number is
    /// seconds; at least 5s).
    #[arg(long, default_value = "120s", value_name = "DURATION")]
    pub idle_timeout: String,
    /// Remove partial files and resume journals of interrupted transfers untouched for this
    /// long (e.g. 24h, 7d is 168h). They are what a re-run resumes from.
    #[arg(long, default_value = "24h", value_name = "DURATION")]
    pub partial_max_age: String,
    /// Token file: named tokens with path scopes, stored hashed (`ferry token add`). Default:
    /// tokens.toml in the state directory; on first start one full-access token is made.
    #[arg(long, conflicts_with = "token_file")]
    pub tokens: Option<PathBuf>,
    /// Also accept clients without TLS (their --no-encrypt). Their data crosses the network
    /// readable and unprotected; TLS clients are still served with TLS.
    #[arg(long)]
    pub allow_plaintext: bool,
    /// Serve one client over an ssh channel and exit: bind an ephemeral port, print it with a
    /// one-time token and the certificate fingerprint on stdout, and stop when stdin closes
    /// (what `ferry put FILES USER@HOST:PATH` runs on the remote host).
    #[arg(long, conflicts_with_all = ["tokens", "token_file"])]
    pub oneshot: bool,
    /// Store setuid, setgid and world-writable bits as clients send them (cleared by default,
    /// as `cp` does without --preserve).
    #[arg(long)]
    pub keep_modes: bool,
    /// Take part in third-party copies (`ferry cp HOST1:SRC HOST2:DST`): mint grants that let
    /// another server put here for a client, and copy to another server when a client asks.
    /// Off by default: as a source, this server dials wherever its clients say.
    #[arg(long)]
    pub third_party: bool,
    /// Take stripe sessions: write blocks of a striped put into the partial copies another
    /// server on the same shared file system opened (`ferry put --stripe THIS_HOST`). Off by
    /// default: only a server that shares its file system with its peers needs it.
    #[arg(long)]
    pub stripe: bool,
    /// Serve the server's counters (sessions, bytes, files, refusals, connections) in
    /// Prometheus' text format at `http://ADDR/metrics`. Off by default. Plain HTTP without a
    /// token: the page says counts only, but bind it to loopback or a management network.
    #[arg(long, value_name = "ADDR", conflicts_with = "oneshot")]
    pub metrics_listen: Option<String>,
    /// Where every stored file is registered (size, mtime, digest, replicas, metadata): a
    /// SQLite file, created if missing, `state` (the default: catalog.sqlite in the state
    /// directory), `none`, or a PostgreSQL database that several servers share
    /// (`postgres://USER@HOST/DB?sslmode=verify-full&sslrootcert=CA.pem`, `postgresql://…`, or
    /// `host=/run/postgresql dbname=DB`; across a network TLS to that CA, or clear text only
    /// with `sslmode=disable`). A
    /// catalog serves one root per server; the default one kept for another root is left alone
    /// (with a warning) and this server runs without.
    #[arg(long, value_name = "PATH|URL|none", conflicts_with = "oneshot")]
    pub catalog: Option<String>,
    /// This server's name in the catalog's replicas (default: the host name). Servers that
    /// share a catalog need different names.
    #[arg(long, value_name = "NAME", conflicts_with = "oneshot")]
    pub catalog_name: Option<String>,
    /// Where clients reach this server (HOST:PORT), kept in the catalog beside its name so that
    /// `ferry get` can fetch this server's replicas from it. Default: the first --listen
    /// address unless it is a wildcard (0.0.0.0, [::]); `none`: no address.
    #[arg(long, value_name = "HOST:PORT|none", conflicts_with = "oneshot")]
    pub advertise: Option<String>,
    /// Bytes a second that `ferry verify` audits may read, all together (e.g. 256M, 1G; 0:
    /// unlimited), so that an audit cannot starve transfers.
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    pub verify_rate: String,
    /// The most catalog requests (stat, rm, mv, mkdir, meta, find, verify) one client
    /// connection carries, one after another; 0: one request a connection. Bounds how long one
    /// client holds a connection slot.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub catalog_session_requests: u32,
    /// How long a connection that carried a catalog request waits for the next before it
    /// ends (e.g. 30s; at least 1s).
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    pub catalog_session_idle: String,
    /// The longest wait between two tries of a replication a `[[policy]]` of the --config
    /// file owes (each failure doubles the wait from 1 s up to this).
    #[arg(long, default_value = "10m", value_name = "DURATION")]
    pub policy_retry_max: String,
    /// Read these options from a TOML file (keys as the long options, with `_` for `-`:
    /// `max_connections = 256`, `listen = ["10.0.0.1:7070"]`); options given here override it.
    /// Unknown keys are an error. The Debian package's service uses /etc/ferry/serve.toml.
    #[arg(long, value_name = "FILE", conflicts_with = "oneshot")]
    pub config: Option<PathBuf>,
    /// The log on stderr: `text` for people, `json` (one object a line) for log collectors.
    /// Each session logs one line (token, peer, what, bytes, seconds, rate, result).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// The options above given on the command line (clap's ids), filled by
    /// [`Cli::parse_noting_given`].
    #[arg(skip)]
    pub given: Vec<String>,
    /// The `[[policy]]` and `[peers.NAME]` tables of the --config file, checked.
    #[arg(skip)]
    pub policies: ferry_net::Policies,
}

/// How `ferry serve` writes its log.
#[derive(ValueEnum, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Options shared by put and get.
#[derive(Args, Debug, Clone)]
#[command(mut_arg("json", |a| a.help("Write a summary as JSON to stdout")))]
pub struct TransferArgs {
    /// Parallel TCP data connections: `auto` (measure and adapt during the transfer, starting
    /// from what worked last time for this server) or a fixed number.
    #[arg(long, default_value = "auto", value_name = "auto|N")]
    pub streams: String,
    /// Size of the blocks large files are cut into (e.g. 8M, 16MiB), 4 KiB to 64 MiB. Default:
    /// the request size `ferry probe disk` found best for the local file system (1-16 MiB),
    /// else 8 MiB.
    #[arg(long)]
    pub block_size: Option<String>,
    /// Fix SO_SNDBUF/SO_RCVBUF on the data connections (e.g. 16M). This DISABLES the kernel's
    /// TCP autotuning for them; leave it unset unless you have measured that it helps.
    #[arg(long)]
    pub tcp_window: Option<String>,
    /// End-to-end file digest: blake3, xxh3, sha256 or md5. BLAKE3 (the default) is a tree, so
    /// several readers read and hash one large file at once; with the others one reader reads
    /// each file in order, so a single file goes at most at one core's hash rate (md5 ~400
    /// MiB/s). Not given: blake3, or on a put the digest the server's policy for the
    /// destination registers (ferry puts again with it and says so).
    #[arg(long)]
    pub checksum: Option<String>,
    /// Replace files that exist at the destination.
    #[arg(long, conflicts_with = "skip_existing")]
    pub overwrite: bool,
    /// Leave files that exist at the destination alone.
    #[arg(long)]
    pub skip_existing: bool,
    /// Files read at once on the sending side. Default: from `ferry probe disk`'s profile of
    /// the file system, else 4, then tuned while the transfer runs; a number fixes it
    #[arg(long)]
    pub readers: Option<usize>,
    /// Threads writing on the receiving side. Default: like --readers; a number fixes it (on a
    /// put, the server's writers: asked of it, within its --max-storage-threads; a --readers
    /// number on a get likewise asks the server for its readers)
    #[arg(long)]
    pub writers: Option<usize>,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Write one line per file in `b3sum`/`md5sum` format (digest, two spaces, path).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Spread the data connections over every network path the server offers (its
    /// repeated --listen addresses). One round trip slower to start.
    #[arg(long)]
    pub multipath: bool,
    /// Local address the data connections leave from; repeat it, one per network card
    /// (connection i leaves from the i-th mod their number). Implies --multipath.
    #[arg(long, value_name = "IP")]
    pub bind: Vec<std::net::IpAddr>,
    /// Stripe over these other servers (HOST or HOST:PORT, comma-separated or repeated),
    /// which share the remote server's file system and run `serve --stripe`. In a put each
    /// writes blocks of the large files into the partial copies the destination server opened,
    /// which verifies and commits; in a get each reads blocks of the large files the source
    /// server offers, which still reads and hashes every file. In a cp, the destination's
    /// other hosts (`serve --stripe --third-party`): the source sends to all of them. Each
    /// host's key is checked against the known hosts.
    #[arg(long, value_name = "HOSTS", value_delimiter = ',')]
    pub stripe: Vec<String>,
    #[command(flatten)]
    pub filter: FilterArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub conn: ConnArgs,
}

#[derive(Args, Debug)]
pub struct PutArgs {
    /// Local files or directories, then the remote destination HOST[:PORT]:PATH (a running
    /// `ferry serve`) or USER@HOST:PATH (a session started over ssh).
    #[arg(required = true, num_args = 2..)]
    pub paths: Vec<String>,
    /// The one source is a tar archive: send its members into the destination directory, each
    /// stored and registered like a put file. The archive is read in place (a regular file,
    /// not a pipe), and one member outside the destination (absolute, `..`) refuses it all.
    #[arg(long)]
    pub untar: bool,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

#[derive(Args, Debug)]
pub struct GetArgs {
    /// Remote source HOST[:PORT]:PATH, or USER@HOST:PATH over ssh.
    pub remote: String,
    /// Local destination (a directory, or a new name). With --tar: paths below the remote
    /// source to put in the archive (none: all of it).
    #[arg(value_name = "DEST | PATHS", required_unless_present = "tar")]
    pub dest: Vec<PathBuf>,
    /// Write the remote tree (or PATHS below it) as a tar to stdout, or to -o FILE: the server
    /// writes it and checks each file against the digest its catalog registered; a file that
    /// fails the check fails the command (exit 1), naming it, and leaves a truncated archive.
    #[arg(long)]
    pub tar: bool,
    /// With --tar: write the archive to FILE instead of stdout.
    #[arg(short = 'o', value_name = "FILE", requires = "tar")]
    pub tar_file: Option<PathBuf>,
    /// Refuse symlinks whose target is absolute or climbs out of the tree being fetched: the
    /// server chooses what its links point to (SECURITY.md).
    #[arg(long)]
    pub safe_links: bool,
    /// Keep setuid, setgid and world-writable bits as the server has them (cleared by default).
    #[arg(long)]
    pub keep_modes: bool,
    /// Fetch a registered file from this replica (its server's name, as `ferry stat` shows
    /// it) and from no other; by default the best measured good replica is used, the others
    /// in turn when it fails.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["tar", "no_replicas"])]
    pub replica: Option<String>,
    /// Fetch from the named server only, never from another replica.
    #[arg(long, conflicts_with = "tar")]
    pub no_replicas: bool,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("checksum", |a| a.long("digest").help(
    "End-to-end file digest: blake3, xxh3, sha256 or md5 (put's and get's --checksum)"
)))]
#[command(mut_arg("json", |a| a.help(
    "Write the report as JSON to stdout (with --dry-run: what would be sent and deleted)"
)))]
pub struct SyncArgs {
    /// A local file or directory, HOST[:PORT]:PATH on a running `ferry serve`, or
    /// USER@HOST:PATH (a session ssh starts, as for put and get).
    pub source: String,
    /// Made a copy of SOURCE (its own name, created if missing): a remote as SOURCE, or a
    /// local path when SOURCE is remote. Both on servers (`ferry serve --third-party`): the changed
    /// files go from one to the other, never through this host. Filters are relative to
    /// SOURCE's top (`/x` is SOURCE/x).
    pub dest: String,
    /// Compare files by content (a digest on each end, files of the same size and mtime only;
    /// the others are sent) instead of size and mtime alone.
    #[arg(short = 'c', long = "checksum")]
    pub by_content: bool,
    /// Remove what DEST has and SOURCE has not (files and directories), once every file sent
    /// arrived and was verified; nothing after a failure. What the filters leave out is
    /// neither sent nor removed.
    #[arg(long)]
    pub delete: bool,
    /// Print what would be sent and deleted (stdout, one `send PATH` or `delete PATH` a
    /// line; --json: a list), and change nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    // Between two servers: each one's token, pin and address, as for cp.
    #[command(flatten)]
    pub servers: ServerPairArgs,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

/// How this host names the two servers of a third-party copy (cp, and sync between servers).
#[derive(Args, Debug, Clone, Default)]
pub struct ServerPairArgs {
    /// The destination's HOST:PORT as the source reaches it, when that differs from the
    /// address this host uses (another network, a data interface).
    #[arg(long, value_name = "HOST:PORT")]
    pub dest_addr: Option<String>,
    /// Token for the source server (else --token, FERRY_TOKEN or the config file's entry for
    /// its host).
    #[arg(long)]
    pub source_token: Option<String>,
    /// Token for the destination server (likewise).
    #[arg(long)]
    pub dest_token: Option<String>,
    /// Accept only a source whose certificate has this SHA-256 fingerprint.
    #[arg(long, value_name = "sha256:HEX")]
    pub source_fingerprint: Option<String>,
    /// Accept only a destination whose certificate has this fingerprint; the source is held
    /// to the same key.
    #[arg(long, value_name = "sha256:HEX")]
    pub dest_fingerprint: Option<String>,
}

#[derive(Args, Debug)]
pub struct CpArgs {
    /// Source on the first server, HOST[:PORT]:PATH (a `ferry serve --third-party`) or
    /// USER@HOST:PATH (a session started over ssh).
    pub source: String,
    /// Destination on the second server, HOST[:PORT]:PATH or USER@HOST:PATH.
    pub dest: String,
    #[command(flatten)]
    pub servers: ServerPairArgs,
    /// Move the data through this host on purpose (for servers without --third-party): fetch
    /// into a spool directory in the state directory (needs the space), then send it on. A
    /// rerun resumes both legs; the spool is removed once the copy is stored.
    #[arg(long, conflicts_with = "dest_addr")]
    pub via_client: bool,
    /// Let the destination fetch from the source (a get with the source's read grant) instead
    /// of the source sending to it: for a destination behind a firewall that lets it connect
    /// out only. A source endpoint of several hosts is always pulled, striped over them.
    #[arg(long, conflicts_with_all = ["dest_addr", "via_client"])]
    pub pull: bool,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

#[derive(Args, Debug)]
pub struct ReplArgs {
    /// A registered file (-r: a directory) on the source server, HOST[:PORT]:PATH.
    pub source: String,
    /// The server to hold the new replica: HOST[:PORT] (under the same path) or
    /// HOST[:PORT]:PATH.
    #[arg(long, value_name = "OTHER[:PATH]")]
    pub to: String,
    /// Replicate a directory: every file under it.
    #[arg(short, long)]
    pub recursive: bool,
    #[command(flatten)]
    pub servers: ServerPairArgs,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("json", |a| a.help("Print entries as JSON")))]
#[command(mut_arg("retry_for", |a| a.help(
    "Keep retrying after failures that a retry can fix, as put and get do"
)))]
pub struct LsArgs {
    /// Remote directory HOST[:PORT]:PATH.
    pub remote: String,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub conn: ConnArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("json", |a| a.help("Print the results as JSON to stdout")))]
pub struct DemoArgs {
    /// Size of the large file.
    #[arg(long, default_value = "1G")]
    pub file_size: String,
    /// Number of small files.
    #[arg(long, default_value_t = 10_000)]
    pub small_files: usize,
    /// Size of each small file.
    #[arg(long, default_value = "10K")]
    pub small_size: String,
    /// Work directory (default: a temporary directory, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[arg(long, default_value_t = 4)]
    pub streams: u16,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        super::Cli::command().debug_assert();
    }
}
