//! One module per subcommand; `run` picks it. What put and get share is in `transfer`; `cp` reuses its configuration and output.

mod best;
mod catalog;
mod cp;
mod demo;
mod generate;
mod get;
mod jobs;
mod ls;
mod probe;
mod put;
mod repl;
mod serve;
mod service;
mod sync;
mod token;
mod transfer;

use std::process::ExitCode;

use anyhow::Result;

use crate::args::{Cli, Command};

pub async fn run(cli: Cli) -> Result<ExitCode> {
    let quiet = cli.quiet;
    match cli.command {
        Command::Serve(a) => serve::run(a, quiet).await,
        Command::Put(a) => put::run(a, quiet).await,
        Command::Get(a) => get::run(a, quiet).await,
        Command::Sync(a) => sync::run(*a, quiet).await,
        Command::Cp(a) => cp::run(*a, quiet).await,
        Command::Repl(a) => repl::run(*a, quiet).await,
        Command::Ls(a) => ls::run(a, quiet).await,
        Command::Stat(a) => catalog::stat(a, quiet).await,
        Command::Rm(a) => catalog::rm(a, quiet).await,
        Command::Mv(a) => catalog::mv(a, quiet).await,
        Command::Mkdir(a) => catalog::mkdir(a, quiet).await,
        Command::Meta(c) => catalog::meta(c, quiet).await,
        Command::Find(a) => catalog::find(a, quiet).await,
        Command::Verify(a) => catalog::verify(a, quiet).await,
        Command::Demo(a) => demo::run(a, quiet).await,
        Command::Probe(c) => probe::run(c, quiet).await,
        Command::Token(c) => token::run(c, quiet),
        Command::Generate(c) => generate::run(c),
        Command::Service(a) => service::run(a, quiet).await,
        Command::Submit(a) => jobs::submit(a, quiet).await,
        Command::Jobs(a) => jobs::jobs(a).await,
        Command::Job(a) => jobs::job(a).await,
        Command::Cancel(a) => jobs::cancel(a, quiet).await,
        Command::Links(a) => jobs::links(a).await,
    }
}
