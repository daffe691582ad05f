//! What put and get share around the transfer itself: the remembered profile of the server
//! and of the local file system, the ssh-started session, and how the outcome is reported.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use ferry_net::{ClientConfig, SessionError, TransferReport};
use ferry_units::units::format_bytes_2dp as human_bytes;

use crate::args::ConnArgs;
use crate::config::{apply_disk_profile, apply_profile, apply_ramp_helpers, Job, Transfer};
use crate::error::Hinted;
use crate::profiles::Profiles;
use crate::progress::Progress;
use crate::remote::Remote;
use crate::ssh::Oneshot;

/// Runs a resolved put or get: starts from what earlier transfers learnt, reaches the server
/// (over ssh if asked), moves the files, remembers what this one learnt, reports.
pub async fn run(t: Transfer, quiet: bool) -> Result<ExitCode> {
    let Transfer {
        remote,
        client: mut cfg,
        job,
        filter,
        json,
        manifest,
        conn,
        auth: _,
        checksum_chosen,
    } = t;
    warn_fixed_window(&cfg, quiet);
    let profile = profile_for(&mut cfg, &remote);
    ramp_helpers_for(&mut cfg, &remote, &profile);
    let local = match &job {
        Job::Put(sources) => sources.first(),
        Job::Untar(archive) => Some(archive),
        Job::Get(dest) => Some(dest),
    };
    if let (Ok(dir), Some(local)) = (crate::state::state_dir(), local) {
        let sending = !matches!(job, Job::Get(_));
        apply_disk_profile(&mut cfg, &dir, local, sending);
    }
    let oneshot = start_oneshot(&mut cfg, &remote, &conn, false).await?;
    let progress = Arc::new(Progress::new(quiet || json));
    let mut result = transfer(&cfg, &job, &filter, &remote, &progress).await;
    // The server's policy registers another digest than the default this put was made with,
    // and refused it before any data moved: put again with the policy's (once).
    if let Some(want) = policy_checksum(&result, checksum_chosen, cfg.opts.checksum) {
        if !quiet {
            eprintln!(
                "note: {}'s policy for {} registers {} digests: putting with --checksum {2}",
                remote.host,
                remote.path,
                ferry_core::digest::algo_name(want),
            );
        }
        cfg.opts.checksum = want;
        result = transfer(&cfg, &job, &filter, &remote, &progress).await;
    }
    progress.finish();
    if let Some(o) = oneshot {
        o.finish().await;
    }
    remember(&result, profile, quiet);
    finish(result, json, manifest.as_deref(), quiet, &progress, None)
}

/// The digest algorithm to put again with: the one a server's policy registers, when it
/// refused `now` for it and the user chose none (`--checksum`, sync's `--digest`).
pub(super) fn policy_checksum<T>(
    result: &Result<T, SessionError>,
    chosen: bool,
    now: ferry_proto::ChecksumAlgo,
) -> Option<ferry_proto::ChecksumAlgo> {
    match (result, chosen) {
        (Err(e), false) => e.policy_checksum().filter(|&a| a != now),
        _ => None,
    }
}

/// One run of the job (each with its own retries).
async fn transfer(
    cfg: &ClientConfig,
    job: &Job,
    filter: &ferry_core::filter::Filter,
    remote: &Remote,
    progress: &Arc<Progress>,
) -> Result<TransferReport, SessionError> {
    match job {
        Job::Put(sources) => {
            let to = &remote.path;
            ferry_net::client::put_filtered(cfg, sources, filter, to, progress.clone()).await
        }
        Job::Untar(archive) => {
            let to = &remote.path;
            ferry_net::client::put_untar(cfg, archive, to, progress.clone()).await
        }
        Job::Get(dest) => {
            let from = &remote.path;
            ferry_net::client::get_filtered(cfg, from, filter, dest, progress.clone()).await
        }
    }
}

/// A transfer to `remote` starts from what earlier ones to it learnt (stream count, ramp
/// helpers); returns where to remember what this one learns.
pub(super) fn prepare(cfg: &mut ClientConfig, remote: &Remote) -> Option<(Profiles, String)> {
    let profile = profile_for(cfg, remote);
    ramp_helpers_for(cfg, remote, &profile);
    profile
}

/// Starts an auto-tuned transfer from the stream count remembered for this server (daemons by
/// `host:port`, ssh sessions by `ssh:user@host`: their port changes every time). Returns
/// where to remember the result.
fn profile_for(cfg: &mut ClientConfig, remote: &Remote) -> Option<(Profiles, String)> {
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
fn ramp_helpers_for(cfg: &mut ClientConfig, remote: &Remote, profile: &Option<(Profiles, String)>) {
    if let (Some((profiles, key)), None) = (profile, remote.ssh_target()) {
        apply_ramp_helpers(cfg, profiles, key);
    }
}

/// Saves what the tuner settled on and what the path measured, for the next transfer to the
/// same server.
pub(super) fn remember(
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
    if let Err(e) = profiles.remember(&key, streams, report.path_measured()) {
        if !quiet {
            eprintln!("warning: cannot save the server's profile: {e:#}");
        }
    }
}

/// For `USER@HOST:PATH`: starts `ferry serve --oneshot` over ssh and points `cfg` at it, pinned
/// to the key it announced on the (ssh-authenticated) channel.
pub(super) async fn start_oneshot(
    cfg: &mut ClientConfig,
    remote: &Remote,
    conn: &ConnArgs,
    third_party: bool,
) -> Result<Option<Oneshot>> {
    let Some(target) = remote.ssh_target() else {
        return Ok(None);
    };
    let wait = cfg.connect_timeout + std::time::Duration::from_secs(30);
    let o = Oneshot::start(conn, &target, &remote.host, wait, third_party)
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
fn warn_fixed_window(cfg: &ClientConfig, quiet: bool) {
    if cfg.opts.tcp_window > 0 && !quiet {
        eprintln!(
            "warning: --tcp-window fixes SO_SNDBUF/SO_RCVBUF at {} on both ends, which disables \
             the kernel's TCP autotuning for the data connections",
            human_bytes(u64::from(cfg.opts.tcp_window))
        );
    }
}

/// Prints the outcome of a transfer and chooses the exit code. Each failure is printed once:
/// those `progress` printed while the transfer ran are not repeated. `extra` (key, value) is
/// added to the `--json` report.
pub(super) fn finish(
    result: Result<TransferReport, SessionError>,
    json: bool,
    manifest: Option<&Path>,
    quiet: bool,
    progress: &Progress,
    extra: Option<(&str, serde_json::Value)>,
) -> Result<ExitCode> {
    let report = match result {
        Ok(r) => r,
        Err(e) => return Err(failure(e)),
    };
    if let Some(path) = manifest {
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
    if json {
        let mut v = serde_json::to_value(&report)?;
        if let (Some((key, value)), Some(o)) = (extra, v.as_object_mut()) {
            o.insert(key.to_owned(), value);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if !quiet {
        eprintln!("{}", summary_line(&report));
    }
    if report.is_success() {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(1))
    }
}

/// A transfer's failure as the user reads it, with a hint where one helps: a server never
/// reached is more often a wrong address than an outage; a retryable failure resumes when run
/// again.
pub(super) fn failure(e: SessionError) -> anyhow::Error {
    let retry = e.is_retryable();
    let unreached = e.is_unreached();
    let error = anyhow::Error::new(e).context("transfer failed");
    if unreached {
        let hint = "check the host and port (a remote is HOST[:PORT]:PATH, port 7070 by \
                    default) and that `ferry serve` runs there"
            .to_owned();
        return anyhow::Error::new(Hinted { error, hint });
    }
    if retry {
        let hint = "the problem may be temporary; run the same command again to resume: \
                    files already stored and verified blocks of partial files are kept"
            .to_owned();
        return anyhow::Error::new(Hinted { error, hint });
    }
    error
}

pub fn summary_line(r: &TransferReport) -> String {
    let pool = |p: &ferry_net::Pool, what: &str| match p.threads {
        Some(n) => format!(", {n} {what}"),
        None => String::new(),
    };
    // A run that moved nothing (all skipped, say) was limited by nothing worth naming.
    let limited = if r.bytes == 0 {
        String::new()
    } else if r.tuning.bottleneck == "source storage" && r.checksum != "blake3" {
        // Only BLAKE3 is a tree that several readers can hash one file with.
        format!(
            ", limited by source storage ({} reads each file on one thread)",
            r.checksum
        )
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
