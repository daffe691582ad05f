//! Errors of the file side.

use std::io;

use ferry_proto::ErrorCode;

/// A relative path that must not be used.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum PathError {
    #[error("path is {0} bytes long, more than the limit")]
    TooLong(usize),
    #[error("path `{path}` has a component of {len} bytes, more than the limit of {max}")]
    NameTooLong {
        path: String,
        len: usize,
        max: usize,
    },
    #[error("path contains a NUL byte")]
    Nul,
    #[error("absolute path `{0}` is not allowed here")]
    Absolute(String),
    #[error("path `{0}` has an empty component")]
    EmptyComponent(String),
    #[error("path `{0}` has a `.` or `..` component")]
    DotComponent(String),
}

/// A failed file-system operation, with the path it concerned.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    // The cause is in the message and deliberately not a `#[source]`, so that printing the
    // error chain does not repeat it.
    #[error("{path}: {cause}")]
    Io { path: String, cause: io::Error },
    #[error("{path}: refused: resolves outside the transfer root")]
    Escapes { path: String },
    #[error(transparent)]
    Path(#[from] PathError),
    /// A tar archive that `put --untar` cannot send as its members.
    #[error(transparent)]
    Archive(#[from] crate::archive::ArchiveError),
}

impl FsError {
    pub fn io(path: impl Into<String>, source: impl Into<io::Error>) -> Self {
        let path = path.into();
        let source = source.into();
        // openat2 reports an escape through `..` or a symlink as EXDEV; say so in words.
        if source.raw_os_error() == Some(libc::EXDEV) {
            return Self::Escapes { path };
        }
        Self::Io {
            path,
            cause: source,
        }
    }

    /// The code to put on the wire when this error fails a file or a request.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Escapes { .. } | Self::Path(_) => ErrorCode::PERMISSION,
            Self::Archive(crate::archive::ArchiveError::Refused { .. }) => ErrorCode::PERMISSION,
            Self::Archive(_) => ErrorCode::IO,
            Self::Io { cause, .. } => match cause.kind() {
                io::ErrorKind::NotFound => ErrorCode::NOT_FOUND,
                io::ErrorKind::PermissionDenied => ErrorCode::PERMISSION,
                io::ErrorKind::AlreadyExists => ErrorCode::EXISTS,
                _ if cause.raw_os_error() == Some(libc::ENOSPC) => ErrorCode::NO_SPACE,
                _ if cause.raw_os_error() == Some(libc::ELOOP) => ErrorCode::PERMISSION,
                _ => ErrorCode::IO,
            },
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Io { cause, .. } if cause.kind() == io::ErrorKind::NotFound)
    }
}
