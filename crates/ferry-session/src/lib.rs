//! ferry's transfer session without I/O: the decisions of both ends of a transfer, as state
//! machines fed frames, completions and measurements with `now` passed in, and polled for what
//! to send and do. No tokio, sockets, files or clocks: `ferry-net` is the driver that moves
//! bytes between them and the world, and `ferry-core` the file side (the quinn-proto shape).
//!
//! - [`cut`]: how files are cut into blocks.
//! - [`streams`] and [`pools`]: how many connections carry data, and how many threads read
//!   or write, over [`tune`], the one online tuner.
//! - [`endgame`]: the last blocks sent again on idle connections.
//! - [`timeline`], [`load`]: what the session reports about itself.

pub mod cut;
pub mod endgame;
pub mod load;
pub mod pools;
pub mod sample;
pub mod streams;
pub mod timeline;
pub mod tune;

pub use sample::{ConnSample, HostSample, SAMPLE_EVERY};
pub use timeline::Timeline;

pub mod recv;
pub mod send;

/// Why a session failed, as far as the session can tell: the driver adds what only it knows
/// (I/O errors, timeouts), and keeps each data connection's own error for
/// [`Fault::Connection`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Fault {
    /// The peer failed the session and said why.
    #[error("{message} (remote error: {code})")]
    Remote {
        code: ferry_proto::ErrorCode,
        message: String,
    },
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A connection closed before the session was over.
    #[error("{0} connection closed")]
    Closed(&'static str),
    /// Data connection `i` failed, and its failure fails the session.
    #[error("data connection {0} failed")]
    Connection(usize),
    /// The server granted more data connections than could be opened.
    #[error("{opened} of the {granted} data connections granted could be opened")]
    TooFewConnections { opened: usize, granted: usize },
}
