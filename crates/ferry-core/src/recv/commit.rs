//! What a receiver tells of the files it stores, so that a catalog can register each in the
//! same step as its rename, without this crate knowing of any database.

use ferry_proto::ChecksumAlgo;

/// A file a receiver is about to rename into place, or has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Its final path, relative to the destination's root.
    pub path: String,
    pub size: u64,
    pub mtime_ns: i64,
    /// The digest the sender sent and the receiver verified.
    pub digest: Vec<u8>,
    pub algo: ChecksumAlgo,
}

/// Told of each batch the finalizer commits, on the finalizer's threads (a blocking call is
/// fine there; it delays only the batch's renames): `before_sync` on the one that syncs,
/// `after_rename` on the one that names, so a batch's `after_rename` may overlap the next
/// batch's `before_sync`.
pub trait CommitHook: Send + Sync {
    /// Before the batch's sync and its renames. `syncfs`: the file system (its `st_dev`) the
    /// batch's `syncfs` flushes, so that what the hook has written there by its return is
    /// durable before any file gets its final name; `None` when the batch is a lone file,
    /// synced with an `fsync` of its own (a `syncfs` would flush every other writer's data on
    /// a busy file system), so the hook makes its records durable itself. An error fails
    /// every file of the batch, so nothing is stored that the hook could not record.
    fn before_sync(&self, files: &[Stored], syncfs: Option<u64>) -> std::io::Result<()>;
    /// After the renamed ones (a subset, in order) are durable under their final names.
    fn after_rename(&self, files: &[Stored]);
}
