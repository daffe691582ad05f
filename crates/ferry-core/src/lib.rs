//! ferry's file side: everything that touches the file system, and nothing that touches the
//! network. The network driver (`ferry-net`) moves frames between a [`send::Sender`] on one
//! host and a [`recv::Receiver`] on the other. Each side runs its own file threads: the
//! sender's readers ([`send::Sender::start`]) and the receiver's writers
//! ([`recv::Receiver::start`]), each pool behind a [`gate::Gate`] that a tuner turns.

pub mod archive;
pub mod buf;
pub mod digest;
pub mod error;
pub mod filter;
pub mod gate;
pub mod partials;
pub mod path;
pub mod recv;
pub mod report;
pub mod root;
pub mod send;

pub use error::{FsError, PathError};
pub use report::{NoReporter, Reporter};
pub use root::Root;
