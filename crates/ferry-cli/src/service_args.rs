//! Raw arguments of the transfer service's commands: `ferry service` (the daemon) and its
//! clients `submit`, `jobs`, `job`, `cancel` and `links`. Parsing only; the commands resolve them.

use std::path::PathBuf;

use clap::Args;

use crate::args::OutputArgs;

/// The service's port when `--listen` or `--service` names none.
pub const DEFAULT_SERVICE_PORT: u16 = 7080;

#[derive(Args, Debug)]
pub struct ServiceArgs {
    /// Address the HTTP API listens on (TLS), e.g. 0.0.0.0:7080.
    #[arg(long, default_value = "127.0.0.1:7080", value_name = "ADDR")]
    pub listen: std::net::SocketAddr,
    /// The service's state: its job database (jobs.db), TLS key (tls/), token file
    /// (tokens.toml), endpoints (endpoints.toml) and known hosts. Default: service/ in
    /// ferry's state directory.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// Where the job queue is: a PostgreSQL location (`postgres://USER:PASSWORD@HOST/DB`,
    /// `postgresql://…` or `host=… dbname=…` words; across a network TLS with
    /// `sslmode=verify-full&sslrootcert=CA.pem`, or `sslmode=disable`), a queue several
    /// services share, each
    /// running a job only one of them claimed; or a SQLite file. Default: jobs.db in --state.
    #[arg(long, value_name = "LOCATION")]
    pub store: Option<String>,
    /// This service's name among those sharing a queue: a restart queues again only the jobs
    /// its own name left running. Default: made from the host name at the first start and
    /// kept in --state (service-name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Local paths of put and get jobs are below this directory (as a server's paths are below
    /// its root); without it the service runs only copies between two servers.
    #[arg(long, value_name = "DIR")]
    pub local_root: Option<PathBuf>,
    /// Token file (default: tokens.toml in --state; `ferry token add --tokens FILE NAME`).
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// The servers jobs may reach, with the token and fingerprint for each (default:
    /// endpoints.toml in --state).
    #[arg(long, value_name = "FILE")]
    pub endpoints: Option<PathBuf>,
    /// A token name that may see and cancel every job, not only its own; repeat for more.
    #[arg(long = "admin", value_name = "NAME")]
    pub admins: Vec<String>,
    /// The most jobs running at once against one server: within it, the link optimizer
    /// adds a job while one more moves more, and takes one off when it moves less or fails.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub per_server: u16,
    /// Jobs running at once in all.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub max_jobs: u16,
    /// Attempts a job gets (with exponential backoff between them) before it fails.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_attempts: u32,
    /// Measure the path to each endpoint this often (e.g. 30m) with ferry's network probe,
    /// never while a job runs on it; the samples form each link's history. Default: off.
    #[arg(long, value_name = "DURATION")]
    pub probe_every: Option<String>,
    /// Each probe's sending time (100ms to 30s).
    #[arg(long, default_value = "2s", value_name = "DURATION")]
    pub probe_duration: String,
    /// Run this program when a job ends (done, failed or cancelled), as the service's user,
    /// with the job's JSON on stdin and FERRY_JOB_ID and FERRY_JOB_STATE in its environment.
    /// Not a shell command line: arguments go in --on-end-arg.
    #[arg(long, value_name = "PROGRAM")]
    pub on_end_command: Option<std::ffi::OsString>,
    /// An argument for --on-end-command; repeat for more.
    #[arg(long = "on-end-arg", value_name = "ARG", requires = "on_end_command")]
    pub on_end_args: Vec<std::ffi::OsString>,
    /// How long --on-end-command may run before it and what it started are killed.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub on_end_timeout: String,
    /// POST each ended job's JSON to this http:// or https:// URL (10 s a try, 3 tries).
    #[arg(long, value_name = "URL")]
    pub on_end_webhook: Option<String>,
    /// CA certificates (PEM) an https webhook must chain to (default: the system's).
    #[arg(long, value_name = "FILE", requires = "on_end_webhook")]
    pub on_end_webhook_ca: Option<PathBuf>,
}

/// How a client reaches the service and proves who it is.
#[derive(Args, Debug, Clone)]
pub struct ServiceClientArgs {
    /// The service, HOST:PORT (port 7080 if left out). [env: FERRY_SERVICE]
    #[arg(long, value_name = "HOST:PORT")]
    pub service: Option<String>,
    /// Access token (else FERRY_TOKEN).
    #[arg(long)]
    pub token: Option<String>,
    /// Accept only the service whose certificate has this fingerprint (printed by `ferry
    /// service` at start), instead of trusting it on first use.
    #[arg(long, value_name = "sha256:HEX")]
    pub service_fingerprint: Option<String>,
    /// File of pinned keys (default: $XDG_CONFIG_HOME/ferry/known_hosts). [env: FERRY_KNOWN_HOSTS]
    #[arg(long)]
    pub known_hosts: Option<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// Local files or trees (below the service's --local-root) or HOST[:PORT]:PATH on a server,
    /// then the destination: a put, a get or a copy between two servers, decided by which
    /// ends are remote.
    #[arg(required = true, num_args = 2.., value_name = "SRC... DST")]
    pub paths: Vec<String>,
    /// Leave alone what the destination has already: the same size (size), size and mtime
    /// (mtime, as ferry sync compares) or size, mtime and digest (checksum). Default: a plain
    /// transfer.
    #[arg(long, value_name = "size|mtime|checksum")]
    pub sync: Option<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i64,
    /// Do not start the job after this: a duration from now (30m, 2h) or unix seconds (@N).
    #[arg(long, value_name = "T")]
    pub deadline: Option<String>,
    /// A label to find the job by.
    #[arg(long, default_value = "")]
    pub label: String,
    #[command(flatten)]
    pub client: ServiceClientArgs,
}

#[derive(Args, Debug)]
pub struct JobsArgs {
    /// Show at most this many, newest first.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Show the list again every 2 s until none of its jobs is queued or running (or ctrl-c).
    #[arg(long, conflicts_with = "json")]
    pub watch: bool,
    #[command(flatten)]
    pub client: ServiceClientArgs,
}

#[derive(Args, Debug)]
pub struct LinksArgs {
    #[command(flatten)]
    pub client: ServiceClientArgs,
}

#[derive(Args, Debug)]
pub struct JobArgs {
    /// The job's id, as `ferry submit` printed it.
    pub id: i64,
    #[command(flatten)]
    pub client: ServiceClientArgs,
}
