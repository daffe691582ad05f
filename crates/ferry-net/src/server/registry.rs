//! Sessions open to their data connections. A control connection registers its session once the
//! request is granted (`announce`, `gather`); a data connection finds it by identity and secret
//! (`find_session`) and joins through a channel, carrying its connection-cap permit.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ferry_proto::{Frame, SessionId, TransferOpts};
use subtle::ConstantTimeEq;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit as Permit};

use super::wire::closed_by_peer;
use crate::engine::{Joined, Joins};
use crate::error::SessionError;
use crate::transport::conn::send;
use crate::transport::stream::Stream;

/// A session as its control connection's `Hello` named it: its identity and secret.
#[derive(Clone, Copy)]
pub(super) struct Named {
    pub(super) session: SessionId,
    pub(super) secret: [u8; 32],
}

/// A session waiting for its data connections to join.
struct Pending {
    secret: [u8; 32],
    /// Data connections granted: a connection with an index beyond is refused on its own.
    streams: u16,
    /// A joining data connection travels with its connection-cap permit, so that it counts
    /// against the cap for as long as it is open, not just while it shakes hands.
    joins: mpsc::Sender<Joined>,
}

/// The sessions a server's data connections can join, and those about to be.
pub(super) struct Registry {
    pending: Mutex<HashMap<SessionId, Pending>>,
    /// Sessions named by a control connection's `Hello` that is still open, by how many: its
    /// data connections are waited for while it logs in and prepares (see `find_session`).
    opening: Mutex<HashMap<SessionId, usize>>,
    /// Told whenever a session opens to its data connections: a client sends their `Hello`
    /// alongside its control `Hello`, so one may arrive before its session is registered.
    registered: Notify,
    /// How long an announced session waits for its data connections.
    handshake_timeout: Duration,
    /// How long a data connection waits for a session no control connection has named.
    unknown_session_grace: Duration,
}

impl Registry {
    pub(super) fn new(handshake_timeout: Duration, unknown_session_grace: Duration) -> Self {
        Self {
            pending: Mutex::default(),
            opening: Mutex::default(),
            registered: Notify::new(),
            handshake_timeout,
            unknown_session_grace,
        }
    }
}

/// What a data connection's session says to it.
pub(super) enum Found {
    Join(mpsc::Sender<Joined>),
    /// Its index is beyond the session's grant.
    NotGranted(u16),
    /// Every granted connection has joined, or the secret is wrong.
    Refused,
    /// No control connection has named the session within the grace.
    Unknown,
}

/// A session named by an open control connection (`Registry::opening`), until it closes.
pub(super) struct Opening<'a>(&'a Registry, SessionId);

impl<'a> Opening<'a> {
    pub(super) fn enter(registry: &'a Registry, session: SessionId) -> Self {
        *registry
            .opening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(session)
            .or_insert(0) += 1;
        Self(registry, session)
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        {
            let mut opening = self.0.opening.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = opening.get_mut(&self.1) {
                *n -= 1;
                if *n == 0 {
                    opening.remove(&self.1);
                }
            }
        }
        // Its data connections, if any still wait, are refused now rather than at their
        // deadline (once their grace is over).
        self.0.registered.notify_waiters();
    }
}

/// The session a data connection names, once the session is open to its data connections (it
/// may not be yet: the client sends the data connections' `Hello` without waiting for the
/// control connection's `Welcome`); the caller bounds the wait. A session stays registered
/// while it runs, so a connection dialled beyond the grant is refused at once, not held.
///
/// A session that no open control connection has named is waited for only for
/// `unknown_session_grace` (its control connection may say its `Hello` a little later): a
/// connection for a made-up session gives its slot back then, not at the handshake deadline.
pub(super) async fn find_session(
    registry: &Registry,
    session: SessionId,
    secret: &[u8; 32],
    index: u16,
) -> Found {
    let grace = tokio::time::Instant::now() + registry.unknown_session_grace;
    loop {
        let registered = registry.registered.notified();
        tokio::pin!(registered);
        // Enabled before the look, so that a registration right after it is not missed.
        registered.as_mut().enable();
        {
            let pending = registry.pending.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = pending.get(&session) {
                return if !bool::from(p.secret.ct_eq(secret)) {
                    Found::Refused
                } else if index >= p.streams {
                    Found::NotGranted(p.streams)
                } else if p.joins.is_closed() {
                    Found::Refused
                } else {
                    Found::Join(p.joins.clone())
                };
            }
        }
        let named = registry
            .opening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&session);
        if named {
            registered.await;
        } else if tokio::time::timeout_at(grace, registered).await.is_err() {
            // One more look: registered just as the grace ended.
            let pending = registry.pending.lock().unwrap_or_else(|e| e.into_inner());
            let opening = registry.opening.lock().unwrap_or_else(|e| e.into_inner());
            if !pending.contains_key(&session) && !opening.contains_key(&session) {
                return Found::Unknown;
            }
        }
    }
}

/// Keeps a session open to its data connections while it lives.
pub(super) struct Unregister<'a>(&'a Registry, SessionId);

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        self.0
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

/// Opens the session to its data connections and announces its parameters (`Ready`); the
/// connections join through the returned channel until the guard is dropped.
pub(super) async fn announce<'a>(
    registry: &'a Registry,
    stream: &mut Stream,
    named: Named,
    opts: &TransferOpts,
) -> Result<(Joins, Unregister<'a>), SessionError> {
    let Named { session, secret } = named;
    let n = opts.streams as usize;
    let (tx, rx) = mpsc::channel(n);
    {
        let mut pending = registry.pending.lock().unwrap_or_else(|e| e.into_inner());
        // The client chose the identity; one already open is not taken over.
        if pending.contains_key(&session) {
            return Err(SessionError::Protocol(
                "a session with this identity is already open".into(),
            ));
        }
        pending.insert(
            session,
            Pending {
                secret,
                streams: opts.streams,
                joins: tx,
            },
        );
    }
    registry.registered.notify_waiters();
    let guard = Unregister(registry, session);
    send(
        stream,
        &Frame::Ready {
            streams: opts.streams,
            block_size: opts.block_size,
        },
    )
    .await?;
    let deadline = tokio::time::Instant::now() + registry.handshake_timeout;
    Ok((Joins::new(rx, n, deadline, opts.tcp_window), guard))
}

/// Announces the session's parameters and waits for all its data connections (a `get` and a
/// probe, whose server sends on them; a `put`'s server answers offers meanwhile instead). A
/// get's `offers` are written to the control connection meanwhile.
///
/// The returned guard keeps the session registered (closed to joins) while the caller runs it,
/// so that a connection dialled beyond the grant is refused at once rather than held.
pub(super) async fn gather<'a>(
    registry: &'a Registry,
    stream: &mut Stream,
    named: Named,
    opts: &TransferOpts,
    mut offers: Option<&flume::Receiver<Frame>>,
) -> Result<(Vec<Stream>, Vec<Permit>, Unregister<'a>), SessionError> {
    let (mut joins, guard) = announce(registry, stream, named, opts).await?;
    let deadline = joins.deadline();
    let mut slots: Vec<Option<Stream>> = (0..opts.streams).map(|_| None).collect();
    // A client that gives up (a data connection refused as busy, say) closes its control
    // connection: notice it, rather than hold what already joined until the deadline. Peeked
    // on the socket, never read: a client may already be sending frames that belong to the
    // engine (a get's decisions, or its error). Once bytes wait there a peek says nothing
    // more, so the connection's TCP state is checked instead.
    let mut watch_control = true;
    while !joins.complete() {
        let mut probe = [0u8; 1];
        let (index, s) = tokio::select! {
            j = joins.next() => j?,
            r = stream.tcp().peek(&mut probe), if watch_control => {
                match r {
                    Ok(0) | Err(_) => return Err(SessionError::Closed("control")),
                    Ok(_) => watch_control = false,
                }
                continue;
            }
            () = closed_by_peer(stream), if !watch_control => {
                return Err(SessionError::Closed("control"));
            }
            f = async move { offers.expect("polled only with offers").recv_async().await },
                if offers.is_some() =>
            {
                match f {
                    // Bounded like the joining: a client that reads nothing holds nothing.
                    Ok(frame) => tokio::time::timeout_at(deadline, send(stream, &frame))
                        .await
                        .map_err(|_| SessionError::Timeout("waiting for the client to read offers"))??,
                    Err(_) => offers = None,
                }
                continue;
            }
        };
        slots[index] = Some(s);
    }
    let data = slots.into_iter().flatten().collect();
    Ok((data, joins.into_permits(), guard))
}
