//! The receiving side: verify each block, write it, and make each file appear under its final
//! name only once it is complete, verified and durable.
//!
//! Per file the receiver goes through these states:
//!
//! ```text
//!   (first frame of the file)
//!        │ exists & policy=skip ──▶ Skipped ─┐
//!        │ exists & policy=fail ──▶ Failed ──┤
//!        ▼                                   │
//!     Writing ── write error / sender gave up ──▶ Failed (temp removed)
//!        │ all bytes written, digest matches,    │
//!        │ mode and mtime set                    │
//!        ▼                                       │
//!    Finalizing ── (batched: syncfs, rename or link, fsync dir) ──▶ Done ──▶ resolved
//! ```
//!
//! Data lands in a hidden temporary file `.ferry-<session>-<id>.part` next to the final name,
//! or, for a file of one block where the file system allows and nothing is being replaced, in
//! an unnamed one (`O_TMPFILE`) that the finalizer links into place instead of renaming: one
//! directory operation instead of two, and nothing left by a crash. A file of one block gets
//! its file from the writer of that block, not with its decision. The file
//! digest of a file written from nothing, larger than 64 KiB, with BLAKE3 (the
//! default) and a block size that is a multiple of 1 KiB, is a tree: each writer hashes the
//! block it writes from memory, in any order, and the chaining values merge into the digest of
//! the whole ([`Blake3Tree`]). Other files (other algorithms, a copy resumed from proven blocks)
//! are hashed in offset order: a block that arrives in order is hashed from memory; a block
//! that arrives ahead of the cursor is written and hashed later by reading it back, which comes
//! from the page cache because it was just written.
//!
//! The writer that completes a file verifies it and sets its mode and mtime on its descriptor
//! (an unnamed file is made with its permission bits, so most need no `fchmod`). Durability is
//! grouped: the finalizer takes every file that is ready, makes the batch durable
//! with one `syncfs` (or one `fsync` for a lone file), renames (or links) each with
//! `RENAME_NOREPLACE` unless overwriting, then fsyncs each parent directory once. Many small files therefore share
//! one sync latency instead of paying one each in series. A [`CommitHook`] (a server's catalog)
//! is told of the batch before its sync (a batch's `syncfs` makes the hook's records on the
//! same file system durable too) and after the directory syncs; the files resolve only after
//! that, so a sender told a file is stored finds it recorded.
//!
//! The code is laid out by concern; each module depends only on those above it:
//!
//! - `policy`: which links and permission bits a receiver keeps;
//! - `config`: where files go, the session's settings, its limits and its errors;
//! - `state`: per-file state (the [`Receiver`]'s ledger: byte ranges written, slots);
//! - `receiver`: the [`Receiver`] and its public API;
//! - `resolving`: a file's end (failed, stored, skipped) and the session's completion;
//! - `deciding`: answering offers (existing files, free space);
//! - `opening`: a file's temporary copy and journal, and resuming from a partial one;
//! - `writing`: block writes, overlapping copies, the in-order digest;
//! - `commit`: what a receiver tells a catalog of the files it renames ([`CommitHook`]);
//! - `finalizing`: verifying a file, making it durable and renaming it into place;
//! - `entries`: directories and symlinks;
//! - `stripe`: a stripe host's writes into partial copies another server opened;
//! - `pool`: the writer threads that hand the receiver its frames ([`Receiver::start`]).

mod commit;
mod config;
mod deciding;
mod entries;
mod finalizing;
mod opening;
mod policy;
mod pool;
mod receiver;
mod resolving;
mod state;
mod stripe;
mod writing;

#[cfg(test)]
mod tests;

pub use commit::{CommitHook, Stored};
pub use config::{
    Destination, ReceiverConfig, RecvError, MAX_KEPT_ERRORS, MAX_OPEN_OFFERS, MAX_OPEN_OFFER_BYTES,
    OFFER_COST,
};
pub use policy::{stays_in_tree, Links, Modes};
pub use pool::{Deciding, WriterPool};
pub use receiver::Receiver;
pub use stripe::{for_stripe_host, StripeError, StripeWriter, WHOLE_MIN_SIZE};
