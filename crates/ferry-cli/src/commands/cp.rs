//! `ferry cp HOST1:SRC HOST2:DST`: a third-party copy. This host logs in to both servers
//! (or starts both over ssh), asks the destination for a grant and the source to put with it
//! (or, pulled, the source for a read grant and the destination to get with it); the data goes
//! from one server to the other.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ferry_net::copy::{CopyConfig, CopyReport};
use ferry_units::units::format_bytes_2dp as human_bytes;

use super::transfer::{failure, policy_checksum, start_oneshot};
use crate::args::CpArgs;
use crate::config::cp_config;
use crate::error::usage;
use crate::progress::Progress;
use crate::remote::Remote;

pub async fn run(args: CpArgs, quiet: bool) -> Result<ExitCode> {
    let (src, dst, mut cfg) = resolve(&args).map_err(usage)?;
    let conn = &args.transfer.conn;
    let source_ssh = start_oneshot(&mut cfg.source, &src, conn, true).await?;
    let dest_ssh = start_oneshot(&mut cfg.dest, &dst, conn, true).await?;
    let json = args.transfer.output.json;
    if args.via_client {
        let result = via_client(&cfg, &src, &dst, json, quiet).await;
        for o in [source_ssh, dest_ssh].into_iter().flatten() {
            o.finish().await;
        }
        return result;
    }
    let progress = Arc::new(Progress::new(quiet || json));
    let copy = |cfg: CopyConfig, progress: Arc<Progress>| {
        let (src, dst) = (src.path.clone(), dst.path.clone());
        async move {
            match args.pull {
                true => ferry_net::copy::pull(&cfg, &src, &dst, progress).await,
                false => ferry_net::copy::copy(&cfg, &src, &dst, progress).await,
            }
        }
    };
    let mut result = copy(cfg.clone(), progress.clone()).await;
    // As put: the destination's policy registers another digest than the default this copy
    // was made with, and refused it before any data moved: copy again with the policy's.
    let chosen = args.transfer.checksum.is_some();
    if let Some(want) = policy_checksum(&result, chosen, cfg.source.opts.checksum) {
        if !quiet {
            eprintln!(
                "note: {}'s policy for {} registers {} digests: copying with --checksum {2}",
                dst.host,
                dst.path,
                ferry_core::digest::algo_name(want),
            );
        }
        cfg.source.opts.checksum = want;
        result = copy(cfg.clone(), progress.clone()).await;
    }
    progress.finish();
    for o in [source_ssh, dest_ssh].into_iter().flatten() {
        o.finish().await;
    }
    let report = result.map_err(refused_or_failed)?;
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

/// A copy's failure; a server that does not take part in third-party copies gets the way out.
fn refused_or_failed(e: ferry_net::SessionError) -> anyhow::Error {
    if e.to_string().contains("--third-party") {
        let hint = "or pass --via-client to move the data through this host on purpose".to_owned();
        let error = anyhow::Error::new(e).context("transfer failed");
        return anyhow::Error::new(crate::error::Hinted { error, hint });
    }
    failure(e)
}

/// `--via-client`: a get into a spool directory here, then a put from it, each resuming as
/// the plain commands do; the spool (named after the two remotes, so that a rerun finds it) is
/// removed once the put has stored everything. Always says that the data crosses this host.
async fn via_client(
    cfg: &CopyConfig,
    src: &Remote,
    dst: &Remote,
    json: bool,
    quiet: bool,
) -> Result<ExitCode> {
    let key = format!(
        "{}:{}\n{}:{}",
        src.server(),
        src.path,
        dst.server(),
        dst.path
    );
    let spool = crate::state::state_dir()?
        .join("via-client")
        .join(&ferry_core::digest::hex(blake3::hash(key.as_bytes()).as_bytes())[..16]);
    std::fs::create_dir_all(&spool)
        .with_context(|| format!("creating the spool directory {}", spool.display()))?;
    eprintln!(
        "ferry: --via-client: the data crosses this host, spooled in {}",
        spool.display()
    );
    let progress = Arc::new(Progress::new(quiet || json));
    let got = ferry_net::client::get(&cfg.source, &src.path, &spool, progress.clone()).await;
    progress.finish();
    let got = got.map_err(failure)?;
    if !got.is_success() {
        bail!(
            "fetching {} failed; run the same command again to resume",
            src.path
        );
    }
    let sources: Vec<_> = std::fs::read_dir(&spool)?
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with(".ferry-"))
        .map(|e| e.path())
        .collect();
    let progress = Arc::new(Progress::new(quiet || json));
    let put = ferry_net::client::put(&cfg.dest, &sources, &dst.path, progress.clone()).await;
    progress.finish();
    let put = put.map_err(failure)?;
    if put.is_success() {
        std::fs::remove_dir_all(&spool)
            .with_context(|| format!("removing the spool {}", spool.display()))?;
    }
    if json {
        let doc = serde_json::json!({ "direction": "copy via client", "get": got, "put": put });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else if !quiet {
        eprintln!("{}", super::transfer::summary_line(&got));
        eprintln!("{}", super::transfer::summary_line(&put));
    }
    Ok(if put.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Both remotes and the copy's configuration: each server reached and trusted as a put or
/// get would reach it, with its own token and pin where given.
fn resolve(args: &CpArgs) -> Result<(Remote, Remote, CopyConfig)> {
    if args.transfer.manifest.is_some() {
        bail!("--manifest is for put and get: the files of a copy are read on the source");
    }
    let mut src = Remote::parse(&args.source)
        .context("the first argument of cp is the source, HOST[:PORT]:PATH")?;
    let mut dst = Remote::parse(&args.dest)
        .context("the second argument of cp is the destination, HOST[:PORT]:PATH")?;
    let cfg = cp_config(&args.transfer, &args.servers, (&mut src, &mut dst))?;
    if args.via_client && !cfg.dest.stripe.is_empty() {
        bail!("--via-client puts into one host; a striped copy goes from server to servers");
    }
    if args.pull && !cfg.dest.stripe.is_empty() {
        bail!(
            "--pull runs a get on the destination's one host; a striped destination is pushed to"
        );
    }
    Ok((src, dst, cfg))
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
