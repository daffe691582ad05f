//! `ferry serve`: token management and the daemon's lifetime.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ferry_net::{Server, ServerConfig};

use crate::args::ServeArgs;
use crate::usage;

/// Where the server keeps its token and state when not told: `$FERRY_STATE_DIR`, else
/// `$XDG_STATE_HOME/ferry`, else `~/.local/state/ferry`.
pub fn state_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("FERRY_STATE_DIR") {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return Ok(PathBuf::from(d).join("ferry"));
    }
    let home = std::env::var_os("HOME")
        .context("cannot find a state directory: set HOME or FERRY_STATE_DIR")?;
    Ok(PathBuf::from(home).join(".local/state/ferry"))
}

/// Reads the token in `path`, or creates the file (mode 0600) with a fresh random token.
/// Returns the token and whether it was created now.
pub fn load_or_create_token(path: &Path) -> Result<(String, bool)> {
    match std::fs::read_to_string(path) {
        Ok(t) => {
            let t = t.trim().to_owned();
            if t.is_empty() {
                bail!("token file {} is empty", path.display());
            }
            let mode = std::fs::metadata(path)?.permissions().mode();
            if mode & 0o077 != 0 {
                tracing::warn!(
                    "token file {} is readable by others (mode {:o}); chmod 600 it",
                    path.display(),
                    mode & 0o777
                );
            }
            Ok((t, false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            let mut bytes = [0u8; 24];
            getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no OS randomness: {e}"))?;
            let token = ferry_core::digest::hex(&bytes);
            // create_new: two servers started at once must not overwrite each other's token.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating token file {}", path.display()))?;
            writeln!(f, "{token}")?;
            f.sync_all()?;
            Ok((token, true))
        }
        Err(e) => Err(e).with_context(|| format!("reading token file {}", path.display())),
    }
}

pub async fn run(args: ServeArgs, quiet: bool) -> Result<ExitCode> {
    let (token_path, explicit) = match &args.token_file {
        Some(p) => (p.clone(), true),
        None => (state_dir().map_err(usage)?.join("token"), false),
    };
    let (token, created) = load_or_create_token(&token_path).map_err(usage)?;
    if !explicit && !quiet {
        eprintln!(
            "ferry: token and state in {}",
            token_path.parent().unwrap_or(Path::new(".")).display()
        );
    }
    if created && !explicit {
        // Shown once; afterwards it is only in the token file.
        eprintln!(
            "ferry: new access token (shown once, kept in {}): {token}",
            token_path.display()
        );
    }
    if !args.root.is_dir() {
        return Err(usage(anyhow::anyhow!(
            "--root {} is not a directory",
            args.root.display()
        )));
    }
    let addr = tokio::net::lookup_host(&args.listen)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .with_context(|| format!("--listen {}: not an address", args.listen))
        .map_err(usage)?;
    let mut config = ServerConfig::new(&args.root, token);
    config.max_connections = args.max_connections.max(1);
    config.max_streams = args.max_streams.max(1);
    config.idle_timeout = Duration::from_secs(args.idle_timeout.max(5));
    config.partial_max_age = crate::config::parse_duration(&args.partial_max_age).map_err(usage)?;
    let server = Server::bind(addr, config)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = server.local_addr()?;
    if !quiet {
        eprintln!("ferry: serving {} on {local}", args.root.display());
    }
    let report = server.scan_partials();
    if !quiet && (report.kept_files > 0 || report.removed_files > 0) {
        eprintln!(
            "ferry: interrupted transfers hold {} in {} files (kept for resume); removed {} in {} files older than {}",
            crate::progress::human_bytes(report.kept_bytes),
            report.kept_files,
            crate::progress::human_bytes(report.removed_bytes),
            report.removed_files,
            args.partial_max_age
        );
    }
    server.run(shutdown_signal()).await;
    if !quiet {
        eprintln!("ferry: stopped");
    }
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
