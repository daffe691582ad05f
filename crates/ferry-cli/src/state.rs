//! The state directory: where a server keeps its token file and TLS key, and a client the
//! profiles it learnt (stream counts, paths, file systems). Every command that reads or writes
//! there asks this module where it is, so the lookup order is written once.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The server's token file in the state directory, unless `--tokens` names another.
pub const TOKENS_FILE: &str = "tokens.toml";

/// Where the state lives when not told: `$FERRY_STATE_DIR`, else `$XDG_STATE_HOME/ferry`, else
/// `~/.local/state/ferry`.
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

/// The token file: `given`, else [`TOKENS_FILE`] in `state`.
pub fn tokens_file(given: Option<&Path>, state: &Path) -> PathBuf {
    given.map_or_else(|| state.join(TOKENS_FILE), Path::to_path_buf)
}

/// Creates `dir` if needed and holds its lock until the returned file is dropped: two servers
/// starting together on one state directory make one first token, not two.
pub fn create_and_lock(dir: &Path) -> Result<std::fs::File> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the state directory {}", dir.display()))?;
    ferry_net::tls::lock_dir(dir)
        .with_context(|| format!("locking the state directory {}", dir.display()))
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
