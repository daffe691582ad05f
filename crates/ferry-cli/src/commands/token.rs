//! `ferry token add|list|revoke`: the server's token file. Secrets are printed once, at
//! creation; the file keeps only their SHA-256.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use ferry_net::access;

use crate::args::{TokenCommand, TokenFileArgs};
use crate::error::usage;
use crate::state;

fn path_of(a: &TokenFileArgs) -> Result<PathBuf> {
    match &a.tokens {
        Some(p) => Ok(p.clone()),
        None => Ok(state::state_dir().map_err(usage)?.join(state::TOKENS_FILE)),
    }
}

pub fn run(cmd: TokenCommand, quiet: bool) -> Result<ExitCode> {
    match cmd {
        TokenCommand::Add(a) => {
            let path = path_of(&a.file)?;
            let token = access::add_token(&path, &a.name, a.read, a.write, a.read_only)
                .map_err(|e| usage(e.into()))?;
            if !quiet {
                eprintln!(
                    "ferry: token `{}` added to {} (only its hash is kept: copy it now)",
                    a.name,
                    path.display()
                );
            }
            // The secret is the command's output, so scripts can capture it.
            println!("{token}");
        }
        TokenCommand::List(a) => {
            let path = path_of(&a)?;
            let file = access::load(&path).map_err(|e| usage(e.into()))?;
            if file.tokens.is_empty() && !quiet {
                eprintln!("ferry: no tokens in {}", path.display());
            }
            for t in &file.tokens {
                let write = if t.read_only {
                    "read-only".to_owned()
                } else {
                    format!("write {}", t.write.join(","))
                };
                println!("{}\tread {}\t{write}", t.name, t.read.join(","));
            }
        }
        TokenCommand::Revoke(a) => {
            let path = path_of(&a.file)?;
            access::revoke_token(&path, &a.name).map_err(|e| usage(e.into()))?;
            if !quiet {
                eprintln!(
                    "ferry: token `{}` revoked; servers refuse it from their next login on",
                    a.name
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
