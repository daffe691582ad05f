//! The `ferry` binary: a thin layer over `ferry-net` and `ferry-core`. Arguments are parsed
//! (`args`), resolved (`config`), run (`commands`); the full error chain is printed once here.
//! Exit codes: 0 success, 1 the transfer failed, 2 usage or configuration error.
#![forbid(unsafe_code)]

mod args;
mod commands;
mod config;
mod profiles;
mod progress;
mod ssh;

use std::process::ExitCode;

use clap::Parser;

/// An error in what the user asked for (exit code 2), as opposed to a failed transfer (1).
#[derive(Debug)]
pub struct UsageError(pub anyhow::Error);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for UsageError {}

pub fn usage(e: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(UsageError(e))
}

/// A failure with advice for the user, printed after the error itself.
#[derive(Debug)]
pub struct Hinted {
    pub error: anyhow::Error,
    pub hint: String,
}

impl std::fmt::Display for Hinted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

impl std::error::Error for Hinted {}

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (_, 0) => "warn",
        (_, 1) => "info",
        _ => "debug",
    };
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("FERRY_LOG").unwrap_or_else(|_| level.into());
    let ansi = std::env::var_os("NO_COLOR").is_none()
        && std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            if let Some(u) = e.downcast_ref::<UsageError>() {
                eprintln!("error: {u}");
                return ExitCode::from(2);
            }
            eprintln!("error: {e:#}");
            if let Some(h) = e.downcast_ref::<Hinted>() {
                eprintln!("hint: {}", h.hint);
            }
            ExitCode::from(1)
        }
    }
}
