//! `ferry cp HOST1:SRC HOST2:DST`: a third-party copy. This host logs in to both servers
//! (or starts both over ssh), asks the destination for a grant and the source to put with it;
//! the data goes from one server to the other.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ferry_net::copy::{CopyConfig, CopyReport};
use ferry_net::{ClientConfig, Security, ServerTrust};
use ferry_units::units::format_bytes_2dp as human_bytes;

use super::transfer::{failure, start_oneshot};
use crate::args::{CpArgs, TransferArgs};
use crate::config::client_config;
use crate::error::usage;
use crate::progress::Progress;
use crate::remote::Remote;

pub async fn run(args: CpArgs, quiet: bool) -> Result<ExitCode> {
    let (src, dst, mut cfg) = resolve(&args).map_err(usage)?;
    let conn = &args.transfer.conn;
    let source_ssh = start_oneshot(&mut cfg.source, &src, conn, true).await?;
    let dest_ssh = start_oneshot(&mut cfg.dest, &dst, conn, true).await?;
    let json = args.transfer.output.json;
    let progress = Arc::new(Progress::new(quiet || json));
    let result = ferry_net::copy::copy(&cfg, &src.path, &dst.path, progress.clone()).await;
    progress.finish();
    for o in [source_ssh, dest_ssh].into_iter().flatten() {
        o.finish().await;
    }
    let report = result.map_err(failure)?;
    for e in report.errors.iter().filter(|e| !progress.was_shown(e)) {
        eprintln!("error: {}", crate::output::clean(e));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if !quiet {
        eprintln!("{}", summary_line(&report));
    }
    Ok(if report.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Both remotes and the copy's configuration: each server reached and trusted as a put or
/// get would reach it, with its own token and pin where given.
fn resolve(args: &CpArgs) -> Result<(Remote, Remote, CopyConfig)> {
    let t = &args.transfer;
    if t.conn.no_encrypt {
        bail!("a third-party copy always uses TLS: the source pins the destination's key");
    }
    if t.conn.server_fingerprint.is_some() {
        bail!("cp talks to two servers: use --source-fingerprint and --dest-fingerprint");
    }
    if t.manifest.is_some() {
        bail!("--manifest is for put and get: the files of a copy are read on the source");
    }
    let src = Remote::parse(&args.source)
        .context("the first argument of cp is the source, HOST[:PORT]:PATH")?;
    let dst = Remote::parse(&args.dest)
        .context("the second argument of cp is the destination, HOST[:PORT]:PATH")?;
    let source = side(
        t,
        &src,
        args.source_token.as_ref(),
        args.source_fingerprint.as_deref(),
    );
    let dest = side(
        t,
        &dst,
        args.dest_token.as_ref(),
        args.dest_fingerprint.as_deref(),
    );
    let (mut source, dest) = (source?, dest?);
    // A --writers number is the destination's writers, as on a put; the source tunes its own
    // readers.
    source.opts.storage_threads = t.writers.map_or(0, |n| n.clamp(1, 256) as u16);
    Ok((
        src,
        dst,
        CopyConfig {
            source,
            dest,
            dest_addr: args.dest_addr.clone(),
        },
    ))
}

/// How this host reaches one of the servers: as a put or get would, with the server's own
/// token and pin where given.
fn side(
    t: &TransferArgs,
    remote: &Remote,
    token: Option<&String>,
    fingerprint: Option<&str>,
) -> Result<ClientConfig> {
    let mut args = t.clone();
    if let Some(token) = token {
        args.auth.token = Some(token.clone());
    }
    let mut cfg = client_config(&args, remote)?;
    if let Some(fp) = fingerprint {
        cfg.security = Security::Tls(ServerTrust::Pinned(fp.parse()?));
    }
    Ok(cfg)
}

pub fn summary_line(r: &CopyReport) -> String {
    let tuning = &r.source_report["tuning"];
    let streams = tuning["streams"].as_u64().unwrap_or(0);
    let mode = tuning["mode"].as_str().unwrap_or("?");
    let limited = match tuning["bottleneck"].as_str() {
        Some(b) if r.bytes > 0 && b != "none" => format!(", limited by {b}"),
        _ => String::new(),
    };
    let checksum = r.source_report["checksum"].as_str().unwrap_or("?");
    let mut s = format!(
        "copy {} -> {}: {} files, {} in {:.2} s = {:.1} MiB/s over {streams} streams ({mode}){limited}, {checksum} verified, confirmed by the destination",
        r.source,
        r.destination,
        r.files,
        human_bytes(r.bytes),
        r.seconds,
        r.mib_per_s,
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
