//! `ferry get HOST[:PORT]:PATH DEST`: fetch a remote file or tree (a registered file from the
//! best of its replicas, `best`); with `--tar`, the tree (or PATHS below it) as one tar
//! archive that the server writes.

use std::process::ExitCode;

use anyhow::{Context, Result};

use super::best::Choice;
use super::catalog::Notices;
use crate::args::GetArgs;
use crate::config::{remote_client, Transfer};
use crate::error::usage;

pub async fn run(args: GetArgs, quiet: bool) -> Result<ExitCode> {
    if args.tar {
        return tar(args, quiet).await;
    }
    let choice = match (&args.replica, args.no_replicas) {
        (_, true) => None,
        (Some(name), false) => Some(Choice::Named(name.clone())),
        (None, false) => Some(Choice::Best),
    };
    let transfer = Transfer::get(args).map_err(usage)?;
    match choice {
        Some(choice) => super::best::run(transfer, choice, quiet).await,
        None => super::transfer::run(transfer, quiet).await,
    }
}

/// `get --tar REMOTE [PATHS...] [-o FILE]`: one request, the archive streamed back.
async fn tar(args: GetArgs, quiet: bool) -> Result<ExitCode> {
    let t = &args.transfer;
    let what = "get --tar takes a remote file or directory, HOST[:PORT]:PATH";
    let (remote, cfg) =
        remote_client(&args.remote, what, &t.auth, &t.conn, &t.wait).map_err(usage)?;
    let mut paths = Vec::with_capacity(args.dest.len());
    for p in &args.dest {
        let p = p
            .to_str()
            .with_context(|| format!("{}: not UTF-8", p.display()))
            .map_err(usage)?;
        paths.push(p.to_owned());
    }
    let notices = Notices(quiet);
    let failed = || format!("get --tar {} failed", remote.path);
    match &args.tar_file {
        Some(file) => {
            let mut out = tokio::fs::File::create(file)
                .await
                .with_context(|| format!("cannot create {}", file.display()))?;
            ferry_net::catalog::get_tar(&cfg, &remote.path, paths, &mut out, &notices)
                .await
                .with_context(failed)?;
        }
        None => {
            let mut out = tokio::io::stdout();
            ferry_net::catalog::get_tar(&cfg, &remote.path, paths, &mut out, &notices)
                .await
                .with_context(failed)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
