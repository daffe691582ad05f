//! Who may do what: named tokens with path scopes, stored hashed, and a brake on guessing.
//!
//! The token file is TOML, one `[[token]]` table per token:
//!
//! ```toml
//! [[token]]
//! name = "alice"
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! read = ["/"]              # prefixes (relative to the server root) it may get and list
//! write = ["/incoming"]     # prefixes it may put into
//! read_only = false         # true: no writes at all, whatever `write` says
//! ```
//!
//! Only the SHA-256 of a token is stored. Tokens are 192 random bits made by `ferry token
//! add`, so a fast hash is enough: there is nothing to brute-force that a password hash's cost
//! would protect (that cost is for low-entropy passwords). The server re-reads the file when
//! anything `stat` says of it changes (inode, size, modification or change time to the
//! nanosecond), and always within a second of a change, so `ferry token revoke` takes effect
//! at the next login without a restart.

mod store;
mod token;

pub use store::{add_token, load, new_token, revoke_token, save, Access, FileStamp};
pub use token::{hash_token, inside, AccessError, AccessList, Grant, TokenEntry, TokenFile};

// The login brake lives with the other admission limits; named here too, where it always was.
pub use super::admission::{network_of, LoginBrake};

/// The refusal of an operation outside the token's scopes, naming what and where.
pub(crate) fn denied(grant: &Grant, what: &str, path: &str) -> crate::error::SessionError {
    crate::error::SessionError::Remote {
        code: ferry_proto::ErrorCode::DENIED,
        message: format!(
            "permission denied: token `{}` may not {what} `{path}`",
            grant.name
        ),
    }
}
