//! ferry's network driver over tokio: the server daemon, the client, and the engine that runs a
//! transfer between a `ferry_core` sender and receiver across one control and N data
//! connections, all on one server port.

pub mod client;
mod conn;
mod engine;
pub mod error;
pub mod server;
pub mod tcp;

pub use client::{ClientConfig, TransferReport};
pub use engine::StreamReport;
pub use error::SessionError;
pub use server::{Server, ServerConfig};
