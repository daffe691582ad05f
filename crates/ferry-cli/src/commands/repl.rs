//! `ferry repl HOST1:PATH --to HOST2[:PATH]`: a third-party copy that leaves a known replica
//! (`ferry_net::repl`). Both servers run with --third-party; the token needs read at the
//! source and write at the destination, as for cp.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use ferry_net::repl::{ReplError, ReplReport};

use super::cp::summary_line;
use super::transfer::failure;
use crate::args::ReplArgs;
use crate::config::copy_config;
use crate::error::usage;
use crate::progress::Progress;
use crate::remote::Remote;

pub async fn run(args: ReplArgs, quiet: bool) -> Result<ExitCode> {
    let (src, dst) = remotes(&args).map_err(usage)?;
    let cfg = copy_config(&args.transfer, &args.servers, (&src, &dst), "repl").map_err(usage)?;
    let json = args.transfer.output.json;
    let progress = Arc::new(Progress::new(quiet || json));
    let result =
        ferry_net::repl::repl(&cfg, &src.path, &dst.path, args.recursive, progress.clone()).await;
    progress.finish();
    let report = match result {
        Ok(r) => r,
        Err(ReplError::Session(e)) => return Err(failure(e)),
        Err(e @ ReplError::Refused(_)) => {
            return Err(anyhow::Error::new(e).context(format!("repl {} failed", src.path)))
        }
    };
    for e in report.copy.errors.iter().filter(|e| !progress.was_shown(e)) {
        eprintln!("error: {}", crate::output::clean(e));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if !quiet {
        eprintln!("{}", summary_line(&report.copy));
        if report.copy.is_success() {
            eprintln!("{}", crate::output::clean(&replica_line(&report)));
        }
        for n in &report.notes {
            eprintln!("note: {}", crate::output::clean(n));
        }
    }
    Ok(if report.copy.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// What became of the new replica in the catalogs.
fn replica_line(r: &ReplReport) -> String {
    if r.shared_catalog {
        format!(
            "replica of {} registered on {} in the catalog both servers share",
            r.path, r.copy.destination
        )
    } else if r.dest_server.is_empty() {
        format!("{} holds no registered file: nothing to record", r.path)
    } else {
        format!(
            "replica of {} registered on {} as {}; the source's catalog records it ({} objects)",
            r.path, r.copy.destination, r.dest_server, r.recorded
        )
    }
}

/// The source, and the destination: `--to` names a server (the same path there) or a remote.
fn remotes(args: &ReplArgs) -> Result<(Remote, Remote)> {
    if args.transfer.manifest.is_some() {
        anyhow::bail!("--manifest is for put and get: repl copies from the source's catalog");
    }
    let src = Remote::parse(&args.source)
        .context("repl takes a registered file or directory, HOST[:PORT]:PATH")?;
    let mut dst = match Remote::parse_endpoint(&args.to) {
        Ok(server) => server,
        Err(_) => Remote::parse(&args.to).context("--to takes HOST[:PORT] or HOST[:PORT]:PATH")?,
    };
    if Remote::parse_endpoint(&args.to).is_ok() {
        dst.path = src.path.clone();
    }
    if src.ssh_user.is_some() || dst.ssh_user.is_some() {
        anyhow::bail!("repl needs running `ferry serve --third-party` servers (HOST[:PORT]:PATH)");
    }
    Ok((src, dst))
}
