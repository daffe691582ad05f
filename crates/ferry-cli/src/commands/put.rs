//! `ferry put SOURCES... HOST[:PORT]:PATH`: send local files and trees.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use super::transfer::{self, Job};
use crate::args::PutArgs;
use crate::config::{client_config, Remote};
use crate::error::usage;

pub async fn run(args: PutArgs, quiet: bool) -> Result<ExitCode> {
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
    let sources: Vec<PathBuf> = sources.iter().map(PathBuf::from).collect();
    transfer::run(cfg, &remote, Job::Put(sources), &args.transfer, quiet).await
}
