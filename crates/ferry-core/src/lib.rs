//! ferry's file side: everything that touches the file system, and nothing that touches the
//! network. The network driver (`ferry-net`) moves frames between a [`send::Sender`] on one
//! host and a [`recv::Receiver`] on the other.

pub mod buf;
pub mod digest;
pub mod error;
pub mod gate;
pub mod partials;
pub mod path;
pub mod recv;
pub mod report;
pub mod root;
pub mod send;
pub mod stats;

pub use error::{FsError, PathError};
pub use report::{NoReporter, Reporter};
pub use root::Root;
