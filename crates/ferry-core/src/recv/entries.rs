//! Directories and symlinks: made as they come (a directory's metadata waits for the end, see
//! [`Receiver::finish`]).

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use ferry_proto::{ErrorCode, ExistingPolicy, Frame};

use super::receiver::Receiver;
use super::state::lock;
use crate::path::split_parent;
use crate::root;

impl Receiver {
    pub(super) fn handle_dir(&self, path: &str, mode: u32, mtime_ns: i64) {
        // An excluded one is still counted, as the sender counted it, so that completion is
        // detected.
        if !self.excluded(path, true) {
            self.make_dir(path, mode, mtime_ns);
        }
        self.counters.dirs.fetch_add(1, Ordering::Relaxed);
        self.check_complete();
    }

    fn make_dir(&self, path: &str, mode: u32, mtime_ns: i64) {
        match self
            .dest
            .map(path)
            .and_then(|rel| self.dir(&rel).map(|_| rel))
        {
            Ok(rel) => lock(&self.dir_meta).push((rel, mode, mtime_ns)),
            Err(e) => self.entry_failed(path, e.code(), format!("directory {path}: {e}")),
        }
    }

    pub(super) fn handle_symlink(&self, path: &str, target: &str, mtime_ns: i64) {
        if self.excluded(path, false) {
            // Not made, only counted (see `handle_dir`).
        } else if !self.config.links.allows(path, target) {
            self.entry_failed(
                path,
                ErrorCode::PERMISSION,
                format!("symlink {path} -> {target}: leaves the tree, not made (--safe-links)"),
            );
        } else if let Err(msg) = self.make_symlink(path, target, mtime_ns) {
            self.entry_failed(path, ErrorCode::IO, msg);
        }
        self.counters.symlinks.fetch_add(1, Ordering::Relaxed);
        self.check_complete();
    }

    /// A directory or symlink could not be made: counted, and the sender is told why.
    pub(super) fn entry_failed(&self, path: &str, code: ErrorCode, message: String) {
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        self.error(message.clone());
        let path = path.to_owned();
        let _ = self.control.send(Frame::EntryFailed {
            path,
            code,
            message,
        });
    }

    pub(super) fn make_symlink(
        &self,
        path: &str,
        target: &str,
        mtime_ns: i64,
    ) -> Result<(), String> {
        if target.is_empty() || target.contains('\0') {
            return Err(format!("symlink {path}: invalid target"));
        }
        let rel = self
            .dest
            .map(path)
            .map_err(|e| format!("symlink {path}: {e}"))?;
        let (dir_rel, name) = split_parent(&rel);
        let err = |e: &dyn std::fmt::Display| format!("symlink {rel}: {e}");
        let dir = self.dir(dir_rel).map_err(|e| err(&e))?;
        if let Ok(have) = root::lstat_in(&dir, name) {
            if have.kind == root::Kind::Symlink
                && link_target(&dir, name).as_deref() == Some(target)
            {
                // The same link (a re-run): complete, whatever the policy. Its own mtime is
                // brought in line so the copy is the same tree; failing that costs nothing.
                if have.mtime_ns != mtime_ns {
                    let _ = root::set_link_mtime(&dir, name, mtime_ns);
                }
                self.counters.skipped.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            match self.config.existing {
                ExistingPolicy::Skip => {
                    self.counters.skipped.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                ExistingPolicy::Fail => {
                    return Err(err(&"exists (use --overwrite or --skip-existing)"))
                }
                ExistingPolicy::Overwrite => {}
            }
        }
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        let temp = format!(".ferry-{:016x}-l{n}.part", self.config.tag);
        root::symlink_in(&dir, &temp, target).map_err(|e| err(&e))?;
        let _ = root::set_link_mtime(&dir, &temp, mtime_ns);
        let replace = self.config.existing == ExistingPolicy::Overwrite;
        if let Err(e) = root::rename_in(&dir, &temp, name, replace) {
            let _ = rustix::fs::unlinkat(&dir, temp.as_str(), rustix::fs::AtFlags::empty());
            return Err(err(&e));
        }
        Ok(())
    }
}

/// The target of symlink `name` in `dir`, if it is one with a UTF-8 target (the only kind
/// the wire carries, so the only kind that can equal an offered one).
fn link_target(dir: &OwnedFd, name: &str) -> Option<String> {
    rustix::fs::readlinkat(dir, name, Vec::new())
        .ok()?
        .into_string()
        .ok()
}
