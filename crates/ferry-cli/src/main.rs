//! The `ferry` binary: a thin layer over `ferry-net` and `ferry-core`. Arguments are parsed
//! (`args`), resolved (`config`), run (`commands`); the full error chain is printed once here.
//! Exit codes: 0 success, 1 the transfer failed, 2 usage or configuration error. With `--json`
//! a failure is a JSON object on stdout too (`{"error": {...}}`), so a script always gets JSON.
#![forbid(unsafe_code)]

/// `println!` that ends the process quietly when stdout's reader has gone (`ferry find ... |
/// head`), where std's panics. Defined before the modules so that it is theirs too.
macro_rules! println {
    () => {
        $crate::output::print_line(format_args!(""))
    };
    ($($t:tt)*) => {
        $crate::output::print_line(format_args!($($t)*))
    };
}

mod args;
mod catalog_args;
mod commands;
mod config;
mod error;
mod output;
mod pin;
mod profiles;
mod progress;
mod remote;
mod serve_config;
mod service_args;
mod ssh;
mod state;

use std::process::ExitCode;

use crate::error::{Hinted, UsageError};

/// Whether the command asked for JSON on stdout.
fn wants_json(cli: &args::Cli) -> bool {
    cli.command.output().is_some_and(|o| o.json)
}

/// The failure as the one JSON document on stdout: `{"error": {"message", "kind", "hint",
/// "exit_code"}}`, `kind` being `usage` (exit 2) or `failed` (exit 1).
fn print_json_error(message: &str, usage: bool, hint: Option<&str>, code: u8) {
    let v = serde_json::json!({
        "error": {
            "message": message,
            "kind": if usage { "usage" } else { "failed" },
            "hint": hint,
            "exit_code": code,
        }
    });
    println!("{v:#}");
}

/// The log on stderr: warnings by default, and for a server also its sessions (one line each,
/// from ferry-net at info); `-v` adds info, `-vv` debug, `FERRY_LOG` replaces the filter.
fn init_log(cli: &args::Cli) {
    let serve = match &cli.command {
        args::Command::Serve(a) => Some(a.log_format),
        args::Command::Service(_) => Some(args::LogFormat::Text),
        _ => None,
    };
    let level = match (cli.quiet, cli.verbose, serve.is_some()) {
        (true, _, _) => "error",
        (_, 0, true) => "warn,ferry_net=info,ferry=info",
        (_, 0, false) => "warn",
        (_, 1, _) => "info",
        _ => "debug",
    };
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("FERRY_LOG").unwrap_or_else(|_| level.into());
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if serve == Some(args::LogFormat::Json) {
        // Fields at the top level of each object, as collectors index them.
        log.json().flatten_event(true).init();
        return;
    }
    let ansi = std::env::var_os("NO_COLOR").is_none()
        && std::io::IsTerminal::is_terminal(&std::io::stderr());
    log.with_ansi(ansi).init();
}

fn main() -> ExitCode {
    let mut cli = match args::Cli::parse_noting_given() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            let asked_json = std::env::args_os().any(|a| a == "--json");
            let informational = matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            );
            if asked_json && !informational {
                let text = e.kind().as_str().unwrap_or("invalid arguments").to_owned();
                let rendered = e.render().to_string();
                let first = rendered
                    .lines()
                    .next()
                    .map(|l| l.trim_start_matches("error: ").to_owned())
                    .unwrap_or(text);
                print_json_error(&first, true, None, 2);
            }
            e.exit();
        }
    };
    let json = wants_json(&cli);
    // Before the log starts: the file may say how to write it.
    if let args::Command::Serve(a) = &mut cli.command {
        if let Err(e) = serve_config::apply(a) {
            eprintln!("error: {}", output::clean(&format!("{e:#}")));
            return ExitCode::from(2);
        }
    }
    init_log(&cli);

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
            let (message, usage, hint) = match e.downcast_ref::<UsageError>() {
                Some(u) => (
                    u.to_string(),
                    true,
                    u.0.downcast_ref::<Hinted>().map(|h| h.hint.clone()),
                ),
                None => (
                    format!("{e:#}"),
                    false,
                    e.downcast_ref::<Hinted>().map(|h| h.hint.clone()),
                ),
            };
            let code = if usage { 2 } else { 1 };
            // Messages carry names and text from the server: never raw to a terminal.
            eprintln!("error: {}", output::clean(&message));
            if let Some(h) = &hint {
                eprintln!("hint: {}", output::clean(h));
            }
            if json {
                print_json_error(&message, usage, hint.as_deref(), code);
            }
            ExitCode::from(code)
        }
    }
}
