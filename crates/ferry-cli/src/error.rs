//! The two kinds of failure the binary tells apart: a usage error (exit code 2) and a failure
//! with advice (a hint printed after it). Every command returns them; `main` reports them.

/// An error in what the user asked for (exit code 2), as opposed to a failed transfer (1).
#[derive(Debug)]
pub struct UsageError(pub anyhow::Error);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for UsageError {}

pub fn usage(e: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(UsageError(e))
}

/// A failure with advice for the user, printed after the error itself.
#[derive(Debug)]
pub struct Hinted {
    pub error: anyhow::Error,
    pub hint: String,
}

impl std::fmt::Display for Hinted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

impl std::error::Error for Hinted {}
