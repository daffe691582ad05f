//! One function per subcommand.

mod demo;
mod probe;
mod serve;
mod token;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use ferry_net::{SessionError, TransferReport};

use crate::args::{Cli, Command, GetArgs, LsArgs, PutArgs, TransferArgs};
use crate::config::{apply_disk_profile, apply_profile, apply_ramp_helpers, client_config, Remote};
use crate::profiles::Profiles;

use crate::error::usage;
use crate::progress::{human_bytes, Progress};

pub async fn run(cli: Cli) -> Result<ExitCode> {
    let quiet = cli.quiet;
    match cli.command {
        Command::Serve(a) => serve::run(a, quiet).await,
        Command::Put(a) => put(a, quiet).await,
        Command::Get(a) => get(a, quiet).await,
        Command::Ls(a) => ls(a, quiet).await,
        Command::Demo(a) => demo::run(a, quiet).await,
        Command::Probe(c) => probe::run(c, quiet).await,
        Command::Token(c) => token::run(c, quiet),
    }
}

async fn put(args: PutArgs, quiet: bool) -> Result<ExitCode> {
    let (dest, sources) = args
        .paths
        .split_last()
        .context("nothing to send")
        .map_err(usage)?;
    let remote = Remote::parse(dest)
        .context("the last argument of put is the destination, HOST[:PORT]:PATH")
        .map_err(usage)?;
    if let Some(s) = sources
        .iter()
        .find(|s| Remote::looks_remote(s) && !std::path::Path::new(s).exists())
    {
        return Err(usage(anyhow::anyhow!(
            "`{s}` looks remote; put sends local paths (use get to fetch)"
        )));
    }
    let mut cfg = client_config(&args.transfer, &remote).map_err(usage)?;
    // This process ends with the put (the demo, which hosts a server, leaves it off).
    cfg.drain_at_end = true;
    warn_fixed_window(&cfg, quiet);
    let profile = profile_for(&mut cfg, &remote);
    ramp_helpers_for(&mut cfg, &remote, &profile);
    let sources: Vec<PathBuf> = sources.iter().map(PathBuf::from).collect();
    if let (Ok(dir), Some(first)) = (crate::state::state_dir(), sources.first()) {
        apply_disk_profile(&mut cfg, &dir, first, true);
    }
    let oneshot = start_oneshot(&mut cfg, &remote, &args.transfer.conn).await?;
    let progress = Arc::new(Progress::new(quiet || args.transfer.json));
    let result = ferry_net::client::put(&cfg, &sources, &remote.path, progress.clone()).await;
    progress.finish();
    if let Some(o) = oneshot {
        o.finish().await;
    }
    remember(&result, profile, quiet);
    finish(result, &args.transfer, quiet, &progress)
}

async fn get(args: GetArgs, quiet: bool) -> Result<ExitCode> {
    let remote = Remote::parse(&args.remote)
        .context("the first argument of get is the source, HOST[:PORT]:PATH")
        .map_err(usage)?;
    let mut cfg = client_config(&args.transfer, &remote).map_err(usage)?;
    if args.safe_links {
        cfg.links = ferry_core::recv::Links::InTree;
    }
    if args.keep_modes {
        cfg.modes = ferry_core::recv::Modes::Keep;
    }
    warn_fixed_window(&cfg, quiet);
    let profile = profile_for(&mut cfg, &remote);
    ramp_helpers_for(&mut cfg, &remote, &profile);
    if let Ok(dir) = crate::state::state_dir() {
        apply_disk_profile(&mut cfg, &dir, &args.dest, false);
    }
    let oneshot = start_oneshot(&mut cfg, &remote, &args.transfer.conn).await?;
    let progress = Arc::new(Progress::new(quiet || args.transfer.json));
    let result = ferry_net::client::get(&cfg, &remote.path, &args.dest, progress.clone()).await;
    progress.finish();
    if let Some(o) = oneshot {
        o.finish().await;
    }
    remember(&result, profile, quiet);
    finish(result, &args.transfer, quiet, &progress)
}

/// Starts an auto-tuned transfer from the stream count remembered for this server (daemons by
/// `host:port`, ssh sessions by `ssh:user@host`: their port changes every time). Returns
/// where to remember the result.
fn profile_for(cfg: &mut ferry_net::ClientConfig, remote: &Remote) -> Option<(Profiles, String)> {
    if !cfg.opts.is_auto() {
        return None;
    }
    let profiles = Profiles::default_location()?;
    let key = match remote.ssh_target() {
        Some(t) => format!("ssh:{t}"),
        None => remote.server(),
    };
    apply_profile(cfg, &profiles, &key);
    Some((profiles, key))
}

/// Ramp helpers for a transfer to a daemon over a remembered long path. Not for an ssh-started
/// `serve --oneshot`: it caps itself at 128 connections, of which an auto-tuned session is
/// granted an eighth (about 15), so helpers would only be refused after their handshakes.
fn ramp_helpers_for(
    cfg: &mut ferry_net::ClientConfig,
    remote: &Remote,
    profile: &Option<(Profiles, String)>,
) {
    if let (Some((profiles, key)), None) = (profile, remote.ssh_target()) {
        apply_ramp_helpers(cfg, profiles, key);
    }
}

/// Saves what the tuner settled on and what the path measured, for the next transfer to the
/// same server.
fn remember(
    result: &Result<TransferReport, SessionError>,
    profile: Option<(Profiles, String)>,
    quiet: bool,
) {
    let (Ok(report), Some((profiles, key))) = (result, profile) else {
        return;
    };
    if !report.is_success() {
        return;
    }
    let t = &report.tuning;
    let streams = t.worth_remembering().then_some((t.streams, t.settled));
    if let Err(e) = profiles.remember(&key, streams, path_measured(report)) {
        if !quiet {
            eprintln!("warning: cannot save the server's profile: {e:#}");
        }
    }
}

/// Bytes below which a transfer says too little about the path's rate to size the next transfer's
/// ramp helpers: most of it would be set-up and slow start.
const PATH_MIN_BYTES: u64 = 64 << 20;

/// The round trip (the data connections' smallest) and the rate of a transfer large enough to
/// tell, for the next transfer's ramp helpers. The rate is what the transfer held in its better
/// intervals (`Timeline::held_rate`), or its average (payload over wall time) where that is
/// higher or the timeline too short: a 100 MB put at 100 ms on the bed averages 80 MB/s over
/// a path that carries 118.
fn path_measured(report: &TransferReport) -> Option<(u64, u64)> {
    if report.bytes < PATH_MIN_BYTES || report.seconds <= 0.0 {
        return None;
    }
    let rtt_us = report
        .streams
        .iter()
        .filter_map(|s| s.tcp.as_ref().map(|t| t.min_rtt_us))
        .filter(|&r| r > 0)
        .min()?;
    let average = (report.bytes as f64 / report.seconds) as u64;
    let rate = report.timeline.held_rate().unwrap_or(0).max(average);
    Some((u64::from(rtt_us), rate))
}

/// For `USER@HOST:PATH`: starts `ferry serve --oneshot` over ssh and points `cfg` at it, pinned
/// to the key it announced on the (ssh-authenticated) channel.
async fn start_oneshot(
    cfg: &mut ferry_net::ClientConfig,
    remote: &Remote,
    conn: &crate::args::ConnArgs,
) -> Result<Option<crate::ssh::Oneshot>> {
    let Some(target) = remote.ssh_target() else {
        return Ok(None);
    };
    let wait = cfg.connect_timeout + std::time::Duration::from_secs(30);
    let o = crate::ssh::Oneshot::start(conn, &target, &remote.host, wait)
        .await
        .with_context(|| format!("starting a ferry session on {target} over ssh"))?;
    cfg.server = o.server.clone();
    cfg.token = o.token.clone();
    if let (ferry_net::Security::Tls(_), Some(fp)) = (&cfg.security, o.fingerprint) {
        cfg.security = ferry_net::Security::Tls(ferry_net::ServerTrust::Pinned(fp));
    }
    Ok(Some(o))
}

/// Fixed socket buffers are the mistake that made iRODS up to 100x slower at 100 ms RTT: say
/// plainly what the option does every time it is used.
fn warn_fixed_window(cfg: &ferry_net::ClientConfig, quiet: bool) {
    if cfg.opts.tcp_window > 0 && !quiet {
        eprintln!(
            "warning: --tcp-window fixes SO_SNDBUF/SO_RCVBUF at {} on both ends, which disables \
             the kernel's TCP autotuning for the data connections",
            human_bytes(u64::from(cfg.opts.tcp_window))
        );
    }
}

/// Prints the outcome of a transfer and chooses the exit code. Each failure is printed once:
/// those `progress` printed while the transfer ran are not repeated.
fn finish(
    result: Result<TransferReport, SessionError>,
    args: &TransferArgs,
    quiet: bool,
    progress: &Progress,
) -> Result<ExitCode> {
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            let retry = e.is_retryable();
            let unreached = e.is_unreached();
            let error = anyhow::Error::new(e).context("transfer failed");
            if unreached {
                // Never reached: more often a wrong host or port than a passing outage.
                let hint = "check the host and port (a remote is HOST[:PORT]:PATH, port 7070 by \
                            default) and that `ferry serve` runs there"
                    .to_owned();
                return Err(anyhow::Error::new(crate::error::Hinted { error, hint }));
            }
            if retry {
                let hint = "the problem may be temporary; run the same command again to resume: \
                            files already stored and verified blocks of partial files are kept"
                    .to_owned();
                return Err(anyhow::Error::new(crate::error::Hinted { error, hint }));
            }
            return Err(error);
        }
    };
    if let Some(path) = &args.manifest {
        let mut text = String::new();
        for (p, d) in &report.manifest {
            text.push_str(&format!("{d}  {p}\n"));
        }
        std::fs::write(path, text)
            .with_context(|| format!("writing manifest {}", path.display()))?;
    }
    for e in report.errors.iter().filter(|e| !progress.was_shown(e)) {
        eprintln!("error: {}", crate::output::clean(e));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if !quiet {
        eprintln!("{}", summary_line(&report));
    }
    if report.is_success() {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(1))
    }
}

pub fn summary_line(r: &TransferReport) -> String {
    let pool = |p: &ferry_net::Pool, what: &str| match p.threads {
        Some(n) => format!(", {n} {what}"),
        None => String::new(),
    };
    // A run that moved nothing (all skipped, say) was limited by nothing worth naming.
    let limited = if r.bytes == 0 {
        String::new()
    } else {
        format!(", limited by {}", r.tuning.bottleneck)
    };
    let mut s = format!(
        "{}: {} files, {} in {:.2} s = {:.1} MiB/s over {} streams ({}){}{}{limited}, {} verified",
        r.direction,
        r.files,
        human_bytes(r.bytes),
        r.seconds,
        r.mib_per_s,
        r.tuning.streams,
        r.tuning.mode,
        pool(&r.tuning.readers, "readers"),
        pool(&r.tuning.writers, "writers"),
        r.checksum
    );
    if r.skipped > 0 {
        s.push_str(&format!(", {} skipped", r.skipped));
    }
    if r.failed > 0 {
        s.push_str(&format!(", {} FAILED", r.failed));
    }
    if r.bad_blocks > 0 {
        s.push_str(&format!(", {} bad blocks re-sent", r.bad_blocks));
    }
    s
}

async fn ls(args: LsArgs, quiet: bool) -> Result<ExitCode> {
    let remote = Remote::parse(&args.remote)
        .context("ls takes a remote directory, HOST[:PORT]:PATH")
        .map_err(usage)?;
    if remote.ssh_user.is_some() {
        return Err(usage(anyhow::anyhow!(
            "ls needs a running `ferry serve` (HOST[:PORT]:PATH); over ssh, use ssh itself"
        )));
    }
    let mut cfg = crate::config::control_config(
        args.token.as_deref(),
        args.config.as_deref(),
        &args.conn,
        &remote,
        std::time::Duration::from_secs(60),
    )
    .map_err(usage)?;
    // The same waits and retries as a transfer.
    let duration = |s: &str, flag: &str| {
        crate::config::parse_duration(s)
            .with_context(|| flag.to_owned())
            .map_err(usage)
    };
    cfg.connect_timeout = duration(&args.connect_timeout, "--connect-timeout")?
        .max(std::time::Duration::from_secs(1));
    cfg.retry_for = duration(&args.retry_for, "--retry-for")?;
    let entries = ferry_net::client::list(&cfg, &remote.path, &Notices(quiet))
        .await
        .context("listing failed")?;
    if args.json {
        let v: Vec<_> = entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "name": e.name, "kind": format!("{:?}", e.kind).to_lowercase(),
                    "size": e.size, "mode": e.mode, "mtime_ns": e.mtime_ns,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for e in &entries {
            let kind = match e.kind {
                ferry_proto::EntryKind::Dir => 'd',
                ferry_proto::EntryKind::Symlink => 'l',
                ferry_proto::EntryKind::File => '-',
                ferry_proto::EntryKind::Other => '?',
            };
            let suffix = if kind == 'd' { "/" } else { "" };
            // A name is whatever the server sent: escaped, it cannot drive the terminal.
            println!(
                "{kind}{} {:>14} {} {}{suffix}",
                mode_string(e.mode),
                e.size,
                utc(e.mtime_ns),
                crate::output::clean(&e.name)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// For commands without a progress bar: warnings (such as a newly pinned server key) only.
struct Notices(bool);

impl ferry_core::Reporter for Notices {
    fn on_warning(&self, msg: &str) {
        if !self.0 {
            eprintln!("warning: {}", crate::output::clean(msg));
        }
    }

    fn on_retry(&self, attempt: u32, wait: std::time::Duration, error: &str) {
        if !self.0 {
            eprintln!(
                "warning: attempt {attempt} failed: {}; retrying in {} s",
                crate::output::clean(error),
                wait.as_secs()
            );
        }
    }
}

fn mode_string(mode: u32) -> String {
    let mut s = String::with_capacity(9);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// `YYYY-MM-DD HH:MM:SS` in UTC.
fn utc(ns: i64) -> String {
    ferry_probe::net::utc_text(ns.div_euclid(1_000_000_000), ' ')
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::utc(1_700_000_000_000_000_000), "2023-11-14 22:13:20");
        assert_eq!(super::mode_string(0o754), "rwxr-xr--");
    }
}
