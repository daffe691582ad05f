//! The sending side: walk the sources, read files in blocks, and queue frames for the streams.
//!
//! ```text
//!  walker ──jobs──▶ reader × R ──┐
//!    │                           ├──frames──▶ (driver) stream × N
//!    └────── Dir / Symlink ──────┘
//!  resend worker ◀── Resend requests from the receiver ──┘
//! ```
//! The walker streams jobs as it discovers files, so sending starts before the walk ends. A
//! reader takes a file and reads it in order, computing the file digest in the same pass; a
//! large BLAKE3 file is cut into segments that idle readers help read and hash (`segments`). Frames go into one bounded queue that every stream pulls from: any
//! stream carries any block of any file, and the bound is what limits memory.

//!
//! The code is laid out by concern; each module depends only on those above it:
//!
//! - `cut`: how long each block is (small at both ends of a transfer);
//! - `state`: the settings and the state the walker, the readers and the resend worker share;
//! - `reading`: reading a file in blocks, early or as its decision asks, and reading one again;
//! - `segments`: one large file read by several readers, its BLAKE3 merged from subtrees;
//! - `stripe`: a striped get's stripe host reading the blocks its client asks for;
//! - `walk`: walking the sources, offering files in batches, handing them to the readers;
//! - `sender`: the [`Sender`], which starts those threads, and its public API.

mod cut;
mod reading;
mod segments;
mod sender;
mod state;
mod stripe;
mod walk;

#[cfg(test)]
mod tests;

pub use cut::{MIN_CUT_BLOCK, TAIL_SPLIT};
pub use sender::Sender;
pub use state::{DigestCache, SenderConfig, Source, WalkTotals, EARLY_PER_STREAM};
pub use stripe::{ReadError, StripeReader, Wanted};
