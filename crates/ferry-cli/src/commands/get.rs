//! `ferry get HOST[:PORT]:PATH DEST`: fetch a remote file or tree.

use std::process::ExitCode;

use anyhow::{Context, Result};

use super::transfer::{self, Job};
use crate::args::GetArgs;
use crate::config::{client_config, Remote};
use crate::error::usage;

pub async fn run(args: GetArgs, quiet: bool) -> Result<ExitCode> {
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
    transfer::run(cfg, &remote, Job::Get(args.dest), &args.transfer, quiet).await
}
