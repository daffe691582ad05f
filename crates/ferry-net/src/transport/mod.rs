//! How bytes travel: socket tuning (`tcp`), TLS with pinned identities (`tls`), one type for a
//! connection either way (`stream`), and frames over it (`conn`). Nothing here knows sessions.

pub(crate) mod conn;
pub(crate) mod stream;
pub mod tcp;
pub mod tls;
