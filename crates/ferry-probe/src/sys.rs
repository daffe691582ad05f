//! Reading /proc and /sys beneath a configurable root (tests point it at a fake tree), and
//! recording what could not be read instead of failing.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// A file the probe wanted and could not read.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Unreadable {
    /// The absolute path as on a real system, e.g. `/proc/irq/38/smp_affinity_list`.
    pub path: String,
    /// What it would have told, e.g. `"IRQ affinity"`.
    pub what: String,
    pub error: String,
}

pub(crate) struct Sys {
    root: PathBuf,
    pub(crate) unreadable: Vec<Unreadable>,
}

impl Sys {
    pub(crate) fn new(root: &Path) -> Self {
        Sys {
            root: root.to_path_buf(),
            unreadable: Vec::new(),
        }
    }

    /// `"/proc/interrupts"` → `<root>/proc/interrupts`.
    pub(crate) fn path(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }

    /// The real-system path of a path beneath the root (for messages).
    pub(crate) fn display(&self, p: &Path) -> String {
        match p.strip_prefix(&self.root) {
            Ok(rel) => format!("/{}", rel.display()),
            Err(_) => p.display().to_string(),
        }
    }

    /// Reads a file that should exist; a failure is recorded as unreadable.
    pub(crate) fn read(&mut self, abs: &str, what: &str) -> Option<String> {
        let p = self.path(abs);
        self.read_path(&p, what)
    }

    pub(crate) fn read_path(&mut self, p: &Path, what: &str) -> Option<String> {
        match std::fs::read_to_string(p) {
            Ok(s) => Some(s),
            Err(e) => {
                self.unreadable.push(Unreadable {
                    path: self.display(p),
                    what: what.to_string(),
                    error: e.to_string(),
                });
                None
            }
        }
    }

    /// Reads a file that may well be absent (e.g. `speed` of a virtual NIC); failures are not
    /// recorded.
    pub(crate) fn read_opt(&self, p: &Path) -> Option<String> {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// Names in a directory, sorted; `None` (recorded) if it cannot be listed.
    pub(crate) fn list(&mut self, abs: &str, what: &str) -> Option<Vec<String>> {
        let p = self.path(abs);
        match std::fs::read_dir(&p) {
            Ok(rd) => {
                let mut v: Vec<String> = rd
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                Some(v)
            }
            Err(e) => {
                self.unreadable.push(Unreadable {
                    path: self.display(&p),
                    what: what.to_string(),
                    error: e.to_string(),
                });
                None
            }
        }
    }

    /// Names in a directory that may be absent, sorted; empty if it cannot be listed.
    pub(crate) fn list_opt(&self, p: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}
