//! A `RemoveRequest` (a sync's `--delete`): each path removed beneath the token's write scope,
//! as `rm` would remove a file, a symlink or an empty directory, and answered with `Removed`.
//! The scope's directory is opened without following a symlink anywhere in it and the path's
//! parent beneath it (`Root::scope`, `Root::remove`), so neither `..` nor a link leads a removal
//! out of the scope, and a final symlink is removed, never what it points to.

use ferry_core::{FsError, Root};
use ferry_proto::{ErrorCode, Frame, RemoveFailure, MAX_CONTROL_PAYLOAD};

use super::access::{self, Grant};
use super::request::resolve;
use super::state::ServerState;
use crate::error::SessionError;
use crate::transport::conn::{expect_frame, send};
use crate::transport::stream::Stream;

/// Serves `first` and the `RemoveRequest`s that follow it while each says `more`; returns how
/// many paths were removed in all.
pub(super) async fn serve(
    shared: &ServerState,
    stream: &mut Stream,
    grant: &Grant,
    first: (Vec<String>, bool),
) -> Result<u64, SessionError> {
    let (mut paths, mut more) = first;
    let mut total = 0u64;
    loop {
        let (removed, failures) = remove_all(shared, grant, &paths);
        total += u64::from(removed);
        send(stream, &Frame::Removed { removed, failures }).await?;
        if !more {
            return Ok(total);
        }
        let next = tokio::time::timeout(
            shared.config.idle_timeout,
            expect_frame(stream, MAX_CONTROL_PAYLOAD, "control"),
        )
        .await
        .map_err(|_| SessionError::Timeout("waiting for the next removal"))??;
        match next {
            Frame::RemoveRequest { paths: p, more: m } => (paths, more) = (p, m),
            other => {
                return Err(SessionError::Protocol(format!(
                    "unexpected {:?} after `more` removals were announced",
                    other.frame_type()
                )))
            }
        }
    }
}

/// Removes each path, counting those gone and naming why each other one is not.
fn remove_all(shared: &ServerState, grant: &Grant, paths: &[String]) -> (u16, Vec<RemoveFailure>) {
    let mut removed = 0u16;
    let mut failures = Vec::new();
    for (index, raw) in paths.iter().enumerate() {
        match remove_one(shared, grant, raw) {
            Ok(()) => removed += 1,
            Err((code, message)) => failures.push(RemoveFailure {
                index: index as u16,
                code,
                message,
            }),
        }
    }
    (removed, failures)
}

/// One path: in a write scope, not the scope itself, removed beneath the scope's directory.
fn remove_one(shared: &ServerState, grant: &Grant, raw: &str) -> Result<(), (ErrorCode, String)> {
    let fs = |e: FsError| (e.code(), format!("{raw}: {e}"));
    // A third-party grant may put one tree, nothing else.
    if grant.pinned_dest().is_some() {
        return Err(denied(grant, raw));
    }
    let rel = resolve(shared, raw).map_err(|e| (e.code(), format!("{raw}: {e}")))?;
    let Some(prefix) = grant.write_scope(&rel) else {
        return Err(denied(grant, raw));
    };
    let inner = access::inside(&rel, prefix);
    if inner.is_empty() {
        return Err((
            ErrorCode::BAD_REQUEST,
            format!("{raw}: is the top of a write scope (or the root), which is never removed"),
        ));
    }
    if let Some(catalog) = shared.config.catalog.as_ref() {
        let now = super::replicate::now_ns();
        match super::policy::retention_refusal(&shared.config.policies, catalog, &rel, false, now) {
            Ok(None) => {}
            Ok(Some(why)) => return Err((ErrorCode::DENIED, format!("{raw}: {why}"))),
            Err(e) => return Err((ErrorCode::IO, format!("{raw}: catalog: {e}"))),
        }
    }
    let scope: Root = match shared.root.scope(prefix, false) {
        Ok(s) => s,
        // No scope directory, nothing in it to remove.
        Err(FsError::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::NotFound => {
            return Ok(())
        }
        Err(e) => return Err(fs(e)),
    };
    match scope.remove(inner) {
        Ok(()) => Ok(()),
        // A parent that is gone took the path with it.
        Err(FsError::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(fs(e)),
    }
}

fn denied(grant: &Grant, raw: &str) -> (ErrorCode, String) {
    (
        ErrorCode::DENIED,
        format!(
            "permission denied: token `{}` may not remove `{raw}`",
            grant.name
        ),
    )
}
