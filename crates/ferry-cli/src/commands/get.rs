//! `ferry get HOST[:PORT]:PATH DEST`: fetch a remote file or tree.

use std::process::ExitCode;

use anyhow::Result;

use crate::args::GetArgs;
use crate::config::Transfer;
use crate::error::usage;

pub async fn run(args: GetArgs, quiet: bool) -> Result<ExitCode> {
    let transfer = Transfer::get(args).map_err(usage)?;
    super::transfer::run(transfer, quiet).await
}
