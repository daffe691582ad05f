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

/// Told of each batch the finalizer commits, on the finalizer's thread (a blocking call is
/// fine there; it delays only the batch's renames).
///
/// With a hook set, every batch is made durable with one `syncfs` (a lone file too), so that a
/// hook keeping its records on the same file system gets them durable with the batch's data
/// instead of paying a sync of its own.
pub trait CommitHook: Send + Sync {
    /// Before the batch's `syncfs` of the file system `dev` (its `st_dev`) and its renames:
    /// what the hook has written to that file system when it returns is durable before any
    /// file of the batch gets its final name. An error fails every file of the batch, so
    /// nothing is stored that the hook could not record.
    fn before_sync(&self, files: &[Stored], dev: u64) -> std::io::Result<()>;
    /// After the renamed ones (a subset, in order) are durable under their final names.
    fn after_rename(&self, files: &[Stored]);
}
