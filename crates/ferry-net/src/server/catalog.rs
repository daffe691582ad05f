//! The server's side of the catalog: the commit hook that registers every file a put stores,
//! in the same step as its rename, and the reconciliation of what a crash left at start.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_catalog::{Catalog, CatalogError, Commit, Reconciled};
use ferry_core::digest::{algo_name, KnownDigests};
use ferry_core::path::join;
use ferry_core::recv::{CommitHook, Stored};
use ferry_proto::ChecksumAlgo;
use tracing::warn;

/// Registers the files of one put session: their paths are relative to the session's scope
/// (`prefix`, relative to the server's root), the catalog's are relative to the root.
pub(super) struct CatalogHook {
    pub(super) catalog: Arc<Catalog>,
    pub(super) prefix: String,
    /// The token that logged in: who stored the files.
    pub(super) token: String,
    pub(super) root: PathBuf,
    /// The server's policies: a retained object is not overwritten with other contents.
    pub(super) policies: Arc<super::policy::Policies>,
}

impl CatalogHook {
    fn commits(&self, files: &[Stored]) -> Vec<Commit> {
        files
            .iter()
            .map(|f| {
                let path = join(&self.prefix, &f.path);
                Commit {
                    physical: self.root.join(&path).to_string_lossy().into_owned(),
                    path,
                    size: f.size,
                    mtime_ns: f.mtime_ns,
                    digest: f.digest.clone(),
                    algo: algo_name(f.algo).to_owned(),
                    stored_by: self.token.clone(),
                }
            })
            .collect()
    }
}

/// Why the order is durable: the intents are written before the batch's `syncfs`, into a
/// SQLite file (the embedded catalog's, or beside a PostgreSQL catalog the server's own intents
/// file in its state directory: no round trip to the database on the put's path), so when that
/// file shares the batch's file system the one flush puts them on disk with the batch's data,
/// before any rename (a killed process loses nothing in any case: SQLite has handed them to the
/// kernel). A file elsewhere, or a lone file's batch (an `fsync`, not a `syncfs`), syncs its
/// intents itself. The renames are then durable (their directories synced) before the files
/// are queued for registration, and an intent is cleared only after its registration has
/// committed (in PostgreSQL, then the local file); a crash at any point leaves each renamed
/// file either registered or with its intent, which [`reconcile`] registers at the next start
/// (with any intents an older build left in PostgreSQL).
impl CommitHook for CatalogHook {
    fn before_sync(&self, files: &[Stored], syncfs: Option<u64>) -> std::io::Result<()> {
        let commits = self.commits(files);
        self.not_retained(&commits)?;
        self.right_checksum(&commits)?;
        let done = if syncfs.is_some() && self.catalog.device() == syncfs {
            self.catalog.intend_unsynced(&commits)
        } else {
            self.catalog.intend(&commits)
        };
        done.map_err(|e| std::io::Error::other(format!("catalog: {e}")))
    }

    fn after_rename(&self, files: &[Stored]) {
        // The files are stored; their intents stay until the catalog's thread registers them.
        self.catalog.register_later(self.commits(files));
    }
}

impl CatalogHook {
    /// Refuses the batch when one of its files is under a policy's digest algorithm and was
    /// put with another: the catalog registers what the policy names or nothing.
    fn right_checksum(&self, commits: &[Commit]) -> std::io::Result<()> {
        for c in commits {
            let Some(want) = self.policies.for_path(&c.path).and_then(|p| p.checksum) else {
                continue;
            };
            if c.algo != algo_name(want) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    wrong_checksum_said(&self.policies, &c.path, want),
                ));
            }
        }
        Ok(())
    }

    /// Refuses the batch when one of its files would replace, with other contents, an
    /// object a retention policy still keeps (`put --overwrite`): the hook's error fails the
    /// batch, so nothing retained is replaced. The same contents again are no change.
    fn not_retained(&self, commits: &[Commit]) -> std::io::Result<()> {
        if self.policies.is_empty() {
            return Ok(());
        }
        let now = super::replicate::now_ns();
        for c in commits {
            if self
                .policies
                .for_path(&c.path)
                .and_then(|p| p.retain)
                .is_none()
            {
                continue;
            }
            let Some(s) = self
                .catalog
                .stat(&c.path)
                .map_err(|e| std::io::Error::other(format!("catalog: {e}")))?
            else {
                continue;
            };
            let o = &s.object;
            if (o.size, &o.digest, &o.algo) == (c.size, &c.digest, &c.algo) {
                continue;
            }
            let why = super::policy::retention_refusal(
                &self.policies,
                &self.catalog,
                &c.path,
                false,
                now,
            )
            .map_err(|e| std::io::Error::other(format!("catalog: {e}")))?;
            if let Some(why) = why {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("overwriting /{}: {why}", c.path),
                ));
            }
        }
        Ok(())
    }
}

/// A put under a policy's digest algorithm with another, refused with what to do: the
/// message begins with the algorithm (`checksum_policy`), so a client whose user left the
/// choice to ferry puts again with it.
pub(super) fn wrong_checksum(
    policies: &super::policy::Policies,
    rel: &str,
    want: ChecksumAlgo,
) -> crate::error::SessionError {
    crate::error::SessionError::Remote {
        code: ferry_proto::ErrorCode::CHECKSUM_POLICY,
        message: format!(
            "{}: {}",
            algo_name(want),
            wrong_checksum_said(policies, rel, want)
        ),
    }
}

fn wrong_checksum_said(
    policies: &super::policy::Policies,
    rel: &str,
    want: ChecksumAlgo,
) -> String {
    let prefix = policies.for_path(rel).map_or("", |p| p.prefix.as_str());
    format!(
        "/{rel}: the policy for /{prefix} registers {name} digests; put with --checksum {name}",
        name = algo_name(want)
    )
}

/// A put's receiver proves a file already here by its registered digest, not by reading it:
/// its wire paths are relative to the session's scope (`prefix`), as [`CatalogHook`]'s are.
pub(super) struct ScopeDigests {
    pub(super) catalog: Arc<Catalog>,
    pub(super) prefix: String,
}

impl KnownDigests for ScopeDigests {
    fn known(&self, path: &str, size: u64, mtime_ns: i64, algo: ChecksumAlgo) -> Option<Vec<u8>> {
        lookup(
            &self.catalog,
            &join(&self.prefix, path),
            size,
            mtime_ns,
            algo,
        )
    }
}

/// A get's sender, the same: its wire paths start with the source's `name` (none for a
/// directory sent as its contents), which is `top` under the root.
pub(super) struct SourceDigests {
    pub(super) catalog: Arc<Catalog>,
    pub(super) top: String,
    pub(super) name: String,
}

impl KnownDigests for SourceDigests {
    fn known(&self, path: &str, size: u64, mtime_ns: i64, algo: ChecksumAlgo) -> Option<Vec<u8>> {
        let below = if self.name.is_empty() {
            path
        } else if path == self.name {
            ""
        } else {
            path.strip_prefix(self.name.as_str())?.strip_prefix('/')?
        };
        lookup(&self.catalog, &join(&self.top, below), size, mtime_ns, algo)
    }
}

/// A catalog that cannot answer is no reason to fail a comparison: the file is read instead.
fn lookup(
    catalog: &Catalog,
    path: &str,
    size: u64,
    mtime_ns: i64,
    algo: ChecksumAlgo,
) -> Option<Vec<u8>> {
    catalog
        .known_digest(path, size, mtime_ns, algo_name(algo))
        .unwrap_or_else(|e| {
            warn!("catalog: looking up the digest of {path}: {e}");
            None
        })
}

/// Logs a queued registration that failed: its files stay stored with their intents, the
/// catalog tries the registration again on its own (and takes no new intents, so no new files,
/// until it succeeds); a crash meanwhile leaves them to the next start's reconciliation.
pub(super) fn log_register_errors(catalog: &Catalog) {
    catalog.on_register_error(Box::new(|e, files| {
        warn!(
            files,
            "catalog: registering stored files (tried again): {e}"
        );
    }));
}

/// Settles the intents a crash left: a file under its final name with the size (and the
/// mtime, to the second) it was sent with is registered, any other intent dropped. Looks at
/// those files only, never walks the tree.
pub(super) fn reconcile(catalog: &Catalog, root: &Path) -> Result<Reconciled, CatalogError> {
    catalog.reconcile(|c| {
        std::fs::symlink_metadata(root.join(&c.path)).is_ok_and(|m| {
            m.is_file() && m.len() == c.size && m.mtime() == c.mtime_ns.div_euclid(1_000_000_000)
        })
    })
}
