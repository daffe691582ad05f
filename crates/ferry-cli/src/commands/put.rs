//! `ferry put SOURCES... HOST[:PORT]:PATH`: send local files and trees.

use std::process::ExitCode;

use anyhow::Result;

use crate::args::PutArgs;
use crate::config::Transfer;
use crate::error::usage;

pub async fn run(args: PutArgs, quiet: bool) -> Result<ExitCode> {
    let transfer = Transfer::put(args).map_err(usage)?;
    super::transfer::run(transfer, quiet).await
}
