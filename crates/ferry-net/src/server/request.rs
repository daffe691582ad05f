//! What a logged-in control connection asks for (list, put, get, remove, a catalog operation
//! or a network probe): checked
//! against the token's scopes, bounded by the server's limits, and made ready to run.

use std::sync::Arc;

use ferry_core::recv::{Destination, Links, Receiver, ReceiverConfig, StripeWriter};
use ferry_core::root::Kind;
use ferry_core::send::{DigestCache, Sender, SenderConfig, Source, StripeReader};
use ferry_core::{path, FsError, Root};
use ferry_proto::{
    Capabilities, ErrorCode, Frame, ListEntry, SessionId, TransferOpts, MAX_CONTROL_PAYLOAD,
    MAX_LIST_ENTRIES,
};
use tokio::sync::OwnedSemaphorePermit as Permit;

use super::access::{self, denied, Grant};
use super::catalog::{CatalogHook, ScopeDigests, SourceDigests};
use super::registry::{announce, gather, Named, Unregister};
use super::state::ServerState;
use super::wire::welcome_with;
use super::{catalog_ops, catalog_session, copy, measure, remove};
use crate::engine::{frame_queue, Joins, StreamPlan};
use crate::error::SessionError;
use crate::transport::conn::{expect_frame, send};
use crate::transport::stream::Stream;

/// The work a control connection asked for, ready to run.
pub(super) enum Work<'a> {
    /// Served within `prepare`: a listing, a probe, a grant held until its client left, or a
    /// third-party copy (its files and bytes).
    Done {
        what: &'static str,
        files: u64,
        bytes: u64,
    },
    /// A catalog request answered (or refused, `refused`: the refusal to send); with
    /// `session`, the connection may carry the next (`catalog_session`).
    Catalog {
        what: &'static str,
        files: u64,
        refused: Option<SessionError>,
        session: bool,
    },
    /// The data connections are still joining: the engine answers offers meanwhile, and the
    /// session stays open to them (`pending`) until all have joined or it ends.
    Put {
        receiver: Arc<Receiver>,
        control: flume::Receiver<Frame>,
        block_size: u32,
        /// Writers the client asked for (`TransferOpts::storage_threads`, capped): 0, ours.
        writers: u16,
        joins: Joins,
        pending: Unregister<'a>,
    },
    /// The sender started before the data connections joined: its first offers went out
    /// while they did.
    Get {
        sender: Sender,
        frames: flume::Receiver<Frame>,
        offers: flume::Receiver<Frame>,
        plan: StreamPlan,
        opts: TransferOpts,
        data: Vec<Stream>,
        permits: Vec<Permit>,
        /// Registered while the session runs (see `gather`).
        pending: Unregister<'a>,
    },
    /// A stripe host's part of a striped put: its data connections have joined.
    Stripe {
        writer: Arc<StripeWriter>,
        block_size: u32,
        data: Vec<Stream>,
        permits: Vec<Permit>,
        pending: Unregister<'a>,
    },
    /// A stripe host's part of a striped get: reads what the client fetches.
    StripeRead {
        reader: Arc<StripeReader>,
        data: Vec<Stream>,
        permits: Vec<Permit>,
        pending: Unregister<'a>,
    },
}

impl Work<'_> {
    fn done(what: &'static str) -> Self {
        Work::Done {
            what,
            files: 0,
            bytes: 0,
        }
    }
}

/// Welcomes the session, reads its one request and prepares it.
pub(super) async fn prepare<'a>(
    shared: &'a ServerState,
    stream: &mut Stream,
    grant: &Grant,
    session: SessionId,
    secret: [u8; 32],
    caps: Capabilities,
) -> Result<Work<'a>, SessionError> {
    let multipath = caps.has(Capabilities::MULTIPATH);
    let mut ours = Capabilities::ours();
    if multipath {
        ours = Capabilities(ours.0 | Capabilities::MULTIPATH);
    }
    if shared.config.stripe {
        ours = Capabilities(ours.0 | Capabilities::STRIPE | Capabilities::STRIPE_READ);
    }
    // A striped put's coordinator shares every partial copy; any server can be one.
    let whole = caps.has(Capabilities::STRIPE_WHOLE);
    if whole {
        ours = Capabilities(ours.0 | Capabilities::STRIPE_WHOLE);
    }
    // A striped get's coordinator sends a file's digest apart; any server can be one.
    if caps.has(Capabilities::STRIPE_DIGEST) {
        ours = Capabilities(ours.0 | Capabilities::STRIPE_DIGEST);
    }
    // A server bounded to one request a connection says so by leaving the bit out.
    if shared.config.catalog_session_requests == 0 {
        ours = Capabilities(ours.0 & !Capabilities::CATALOG_SESSION);
    }
    welcome_with(stream, session, secret, ours).await?;
    if multipath {
        send(stream, &paths(shared, stream)).await?;
    }
    let request = tokio::time::timeout(
        shared.config.idle_timeout,
        expect_frame(stream, MAX_CONTROL_PAYLOAD, "control"),
    )
    .await
    .map_err(|_| SessionError::Timeout("waiting for a request"))??;
    let named = Named { session, secret };
    if grant.reads_only() {
        read_grant_allows(grant, &request)?;
    }
    match request {
        Frame::ListRequest { path } => {
            let rel = resolve(shared, &path)?;
            let Some(prefix) = grant.read_scope(&rel) else {
                return Err(denied(grant, "list", &path));
            };
            let listed = async {
                let scope = shared.root.scope(prefix, false)?;
                list(&scope, stream, access::inside(&rel, prefix)).await
            };
            listed.await.map_err(|e| as_requested(e, &path))?;
            Ok(Work::done("list"))
        }
        Frame::PutRequest {
            dest,
            sources,
            opts,
        } => {
            // A stripe grant writes blocks into partial copies another server opened; it
            // never opens, decides or commits a file itself.
            if grant.stripe_only() {
                return Err(denied(grant, "put with a stripe grant into", &dest));
            }
            let put = prepare_put(shared, stream, grant, named, &dest, sources, opts);
            put.await.inspect(|w| {
                if let (true, Work::Put { receiver, .. }) = (whole, w) {
                    receiver.share_partials();
                }
            })
        }
        Frame::GetRequest { src, opts } => {
            prepare_get(shared, stream, grant, named, caps, &src, opts).await
        }
        Frame::StripeRequest { dest, opts } => {
            prepare_stripe(shared, stream, grant, named, &dest, opts).await
        }
        Frame::StripeRead { src, opts } => {
            prepare_stripe_read(shared, stream, grant, named, &src, opts).await
        }
        Frame::RemoveRequest { paths, more } => {
            let files = remove::serve(shared, stream, grant, (paths, more)).await?;
            Ok(Work::Done {
                what: "remove",
                files,
                bytes: 0,
            })
        }
        Frame::CatalogRequest(request) => {
            let what = request.name();
            // A tar is a stream of data: it keeps its connection to itself.
            let tar = matches!(request, ferry_proto::CatalogRequest::Tar { .. });
            let session = !tar
                && caps.has(Capabilities::CATALOG_SESSION)
                && ours.has(Capabilities::CATALOG_SESSION);
            match catalog_ops::serve(shared, stream, grant, request, caps).await {
                Ok(files) => Ok(Work::Catalog {
                    what,
                    files,
                    refused: None,
                    session,
                }),
                // The first request's own refusal leaves the session open, as a later one's.
                Err(e) if session && catalog_session::goes_on_after(&e) => Ok(Work::Catalog {
                    what,
                    files: 0,
                    refused: Some(e),
                    session,
                }),
                Err(e) => Err(e),
            }
        }
        probe @ Frame::ProbeRequest { .. } => {
            measure::serve(shared, stream, grant, named, probe).await?;
            Ok(Work::done("probe"))
        }
        Frame::GrantRequest { dest, existing } => {
            mint_for(shared, stream, grant, (&dest, "write to"), |g, rel| {
                g.third_party(rel, existing)
            })
            .await?;
            Ok(Work::done("grant"))
        }
        Frame::StripeGrantRequest { dest } => {
            copy::allowed(shared)?;
            stripes_allowed(shared)?;
            let asked = (dest.as_str(), "write to");
            mint_for(shared, stream, grant, asked, |g, rel| g.stripe_grant(rel)).await?;
            Ok(Work::done("stripe grant"))
        }
        Frame::ReadGrantRequest { src, stripe } => {
            if stripe {
                stripes_allowed(shared)?;
            }
            let asked = (src.as_str(), "read");
            mint_for(shared, stream, grant, asked, |g, rel| {
                g.read_grant(rel, stripe)
            })
            .await?;
            Ok(Work::done("read grant"))
        }
        Frame::CopyRequest(request) if request.pull => {
            copy::allowed(shared)?;
            let (files, bytes) = pull(shared, stream, grant, *request).await?;
            Ok(Work::Done {
                what: "copy",
                files,
                bytes,
            })
        }
        Frame::CopyRequest(request) => {
            copy::allowed(shared)?;
            let src = request.src.clone();
            // Checked now, so that a path out of scope is refused before anything is dialled;
            // opened again for each attempt.
            let (first, _) = source_of(shared, grant, &src)?;
            let mut request = *request;
            request.opts = clamp(shared, request.opts);
            let (only, filter) = match request.only {
                true => (true, copy::read_only(shared, stream).await?),
                false => (false, ferry_core::filter::Filter::default()),
            };
            if only {
                copy::contents_of(first)?;
            }
            let sources = || {
                let (source, _) = source_of(shared, grant, &src)?;
                let source = if only {
                    copy::contents_of(source)?
                } else {
                    source
                };
                Ok(vec![source])
            };
            let (files, bytes) = copy::copy(shared, stream, request, (sources, &filter)).await?;
            Ok(Work::Done {
                what: "copy",
                files,
                bytes,
            })
        }
        other => Err(SessionError::Protocol(format!(
            "unexpected {:?} as a request",
            other.frame_type()
        ))),
    }
}

/// Refuses what a read grant does not allow: it is good for one get of its path (a stripe
/// read grant: one stripe read session of it), and nothing else. The path itself is checked
/// as any get's is, against the grant's one read scope.
fn read_grant_allows(grant: &Grant, request: &Frame) -> Result<(), SessionError> {
    let allowed = match request {
        Frame::GetRequest { .. } => !grant.stripe_only(),
        Frame::StripeRead { .. } => grant.stripe_only(),
        _ => false,
    };
    if allowed {
        return Ok(());
    }
    let what = format!(
        "send a {} with a read grant for",
        request.frame_type().name()
    );
    Err(denied(
        grant,
        &what,
        grant.pinned_dest().unwrap_or_default(),
    ))
}

/// The destination's side of a pulled copy: `dest` checked against this session's write scope
/// and the path's checksum policy as a put's is (with the client's token: a grant pulls
/// nothing), the place it lands resolved once (a rerun resolves it again, as a put does), then
/// a get from the source into it (`copy::pull`) that records what it stores in the catalog as
/// a put would.
async fn pull(
    shared: &ServerState,
    stream: &mut Stream,
    grant: &Grant,
    mut request: ferry_proto::CopyRequest,
) -> Result<(u64, u64), SessionError> {
    if grant.pinned_dest().is_some() {
        return Err(denied(
            grant,
            "pull a copy with a grant into",
            &request.dest,
        ));
    }
    if request.only {
        return Err(SessionError::Remote {
            code: ErrorCode::BAD_REQUEST,
            message: "a pulled copy takes no chosen set of paths".into(),
        });
    }
    let raw = request.dest.clone();
    let rel = resolve(shared, &raw)?;
    let Some(prefix) = grant.write_scope(&rel).map(str::to_owned) else {
        return Err(denied(grant, "write to", &raw));
    };
    request.opts = clamp(shared, request.opts);
    if let Some(want) = shared
        .config
        .policies
        .for_path(&rel)
        .and_then(|p| p.checksum)
    {
        if request.opts.checksum != want {
            return Err(super::catalog::wrong_checksum(
                &shared.config.policies,
                &rel,
                want,
            ));
        }
    }
    let scope_prefix = prefix.clone();
    let open = || -> Result<Root, SessionError> {
        shared
            .root
            .scope(&prefix, true)
            .map_err(|e| as_requested(e.into(), &raw))
    };
    // Where it lands, found before anything is dialled (a bad destination is refused now).
    let shape = resolve_dest(&open()?, &raw, access::inside(&rel, &prefix).to_owned(), 1)
        .map_err(|e| as_requested(e, &raw))?;
    let (base, rename_top) = (shape.base, shape.rename_top);
    // The source chooses what its links point to: none may point out of the tree this copy
    // makes (its one top entry), as with a push's grant.
    let links = Links::InTree;
    let into = || -> Result<Destination, SessionError> {
        Ok(Destination {
            root: open()?.subroot("")?,
            base: base.clone(),
            rename_top: rename_top.clone(),
        })
    };
    let catalog = shared.config.catalog.clone();
    let setup = move |receiver: &Arc<Receiver>| {
        if let Some(catalog) = &catalog {
            receiver.set_known_digests(Arc::new(ScopeDigests {
                catalog: catalog.clone(),
                prefix: scope_prefix.clone(),
            }));
            receiver.set_commit_hook(Arc::new(CatalogHook {
                catalog: catalog.clone(),
                prefix: scope_prefix.clone(),
                token: grant.name.clone(),
                root: shared.config.root.clone(),
                policies: shared.config.policies.clone(),
            }));
        }
    };
    copy::pull(shared, stream, request, (into, &setup, links)).await
}

/// Mints the grant `scope` makes of this session's for `path` (a third-party copy's, a stripe
/// host's, or a pulled copy's read grant; `what` the grant does there, for a refusal): only
/// where copies are allowed, never with a grant, only within its scopes.
async fn mint_for(
    shared: &ServerState,
    stream: &mut Stream,
    grant: &Grant,
    (path, what): (&str, &str),
    scope: impl FnOnce(&Grant, &str) -> Option<Grant>,
) -> Result<(), SessionError> {
    copy::allowed(shared)?;
    if grant.pinned_dest().is_some() {
        return Err(denied(grant, "mint a grant with a grant for", path));
    }
    let rel = resolve(shared, path)?;
    let scope = scope(grant, &rel).ok_or_else(|| denied(grant, what, path))?;
    copy::mint(shared, stream, scope).await
}

/// Refuses a stripe session, or a stripe grant, on a server whose operator did not allow
/// striping.
fn stripes_allowed(shared: &ServerState) -> Result<(), SessionError> {
    if shared.config.stripe {
        return Ok(());
    }
    Err(SessionError::Remote {
        code: ErrorCode::DENIED,
        message: "this server takes no stripe sessions (serve --stripe)".into(),
    })
}

/// The data addresses a multipath client dials: the configured ones, else the address its
/// control connection reached.
fn paths(shared: &ServerState, stream: &Stream) -> Frame {
    let mut addrs = shared.config.paths.clone();
    if addrs.is_empty() {
        if let Ok(a) = stream.tcp().local_addr() {
            addrs.push(a.to_string());
        }
    }
    addrs.truncate(ferry_proto::MAX_PATHS);
    Frame::Paths { addrs }
}

/// Checks a put against the token's write scopes, opens the destination (so that a bad one is
/// refused before any data connection is opened) and announces the session.
async fn prepare_put<'a>(
    shared: &'a ServerState,
    stream: &mut Stream,
    grant: &Grant,
    named: Named,
    dest: &str,
    sources: u32,
    opts: TransferOpts,
) -> Result<Work<'a>, SessionError> {
    let rel = resolve(shared, dest)?;
    let Some(prefix) = grant.write_scope(&rel) else {
        return Err(denied(grant, "write to", dest));
    };
    let asked = dest.to_owned();
    // Everything the put touches is resolved beneath its scope's directory, so a
    // symlink stored inside the scope cannot lead a write out of it. A grant's scope is
    // the granted path itself (its parent when it names a file).
    let prefix = match grant.pinned_dest() {
        None => prefix.to_owned(),
        Some(_) => {
            granted_dir(shared, prefix, &rel, dest, sources).map_err(|e| as_requested(e, &asked))?
        }
    };
    let dest = shared
        .root
        .scope(&prefix, true)
        .map_err(SessionError::from)
        .and_then(|scope| {
            let inner = access::inside(&rel, &prefix).to_owned();
            resolve_dest(&scope, dest, inner, sources)
        })
        .map_err(|e| as_requested(e, &asked))?;
    let mut opts = clamp(shared, opts);
    // A policy's digest algorithm, refused before any data moves where the put's destination
    // is under it (files that reach such a prefix from a put above it: the commit hook).
    if let Some(want) = shared
        .config
        .policies
        .for_path(&rel)
        .and_then(|p| p.checksum)
    {
        if opts.checksum != want {
            return Err(super::catalog::wrong_checksum(
                &shared.config.policies,
                &rel,
                want,
            ));
        }
    }
    if let Some(existing) = grant.pinned_existing() {
        // What the client asked of the copy, not what the source sends.
        opts.existing = existing;
    }
    // Creating the destination may fail (not a directory, outside the root): find out
    // before any data connection is opened, and tell the client why.
    let (tx, control) = flume::unbounded();
    let config = ReceiverConfig {
        existing: opts.existing,
        checksum: opts.checksum,
        tag: named.session.0,
        block_size: opts.block_size,
        modes: shared.config.modes,
        // What a stored link points to is the writer's business: the server itself
        // never follows one out of the scope it was written in. A grant's writer is another
        // server: no link it stores may point out of the granted path.
        links: match grant.pinned_dest() {
            None => Links::Any,
            // Landing inside the granted directory itself: every entry is below it.
            Some(_) if dest.base.is_empty() && dest.rename_top.is_none() => Links::Below,
            // Landing as the granted path: the top entry is it.
            Some(_) => Links::InTree,
        },
    };
    let receiver = Receiver::new(dest, config, tx, shared.metrics.receiving())
        .map_err(|e| as_requested(e.into(), &asked))?;
    if let Some(catalog) = &shared.config.catalog {
        receiver.set_known_digests(Arc::new(ScopeDigests {
            catalog: catalog.clone(),
            prefix: prefix.clone(),
        }));
        receiver.set_commit_hook(Arc::new(CatalogHook {
            catalog: catalog.clone(),
            prefix: prefix.clone(),
            token: grant.name.clone(),
            root: shared.config.root.clone(),
            policies: shared.config.policies.clone(),
        }));
    }
    let (joins, pending) = announce(&shared.registry, stream, named, &opts).await?;
    Ok(Work::Put {
        receiver,
        control,
        block_size: opts.block_size,
        writers: opts.storage_threads,
        joins,
        pending,
    })
}

/// Checks a stripe session (a striped put's other hosts) against the server's setting and the
/// token's write scopes, then gathers its data connections. The destination is taken as a
/// directory, as the client names it (with a trailing `/`) to the coordinator too, so both map
/// a file's path to the same partial copy whatever exists there yet; nothing is created.
async fn prepare_stripe<'a>(
    shared: &'a ServerState,
    stream: &mut Stream,
    grant: &Grant,
    named: Named,
    dest: &str,
    opts: TransferOpts,
) -> Result<Work<'a>, SessionError> {
    stripes_allowed(shared)?;
    let rel = resolve(shared, dest)?;
    // A third-party grant is for one put by another server, not for striping; a stripe grant
    // is for a stripe session into exactly its path (`write_scope` checks that).
    let prefix = match (grant.pinned_dest(), grant.stripe_only()) {
        (None, _) | (Some(_), true) => grant.write_scope(&rel),
        (Some(_), false) => None,
    };
    let Some(prefix) = prefix else {
        return Err(denied(grant, "write to", dest));
    };
    let writer = shared
        .root
        .scope(prefix, false)
        .and_then(|scope| {
            Ok(Destination {
                root: scope.subroot("")?,
                base: access::inside(&rel, prefix).to_owned(),
                rename_top: None,
            })
        })
        .map_err(|e| as_requested(e.into(), dest))?;
    let opts = clamp(shared, opts);
    let writer = Arc::new(StripeWriter::new(writer, opts.block_size, opts.checksum));
    let (data, permits, pending) = gather(&shared.registry, stream, named, &opts, None).await?;
    Ok(Work::Stripe {
        writer,
        block_size: opts.block_size,
        data,
        permits,
        pending,
    })
}

/// Checks a stripe read session (a striped get's other hosts) against the server's setting
/// and the token's read scopes, as a get of `src` is, then gathers its data connections.
/// Nothing is walked or offered here: the client names each block it wants (`Fetch`) by the
/// path the coordinator offered, mapped beneath `src` as the coordinator's walk named it.
async fn prepare_stripe_read<'a>(
    shared: &'a ServerState,
    stream: &mut Stream,
    grant: &Grant,
    named: Named,
    src: &str,
    opts: TransferOpts,
) -> Result<Work<'a>, SessionError> {
    stripes_allowed(shared)?;
    let (source, _) = source_of(shared, grant, src)?;
    let opts = clamp(shared, opts);
    let reader = Arc::new(StripeReader::new(source, opts.block_size));
    let (data, permits, pending) = gather(&shared.registry, stream, named, &opts, None).await?;
    Ok(Work::StripeRead {
        reader,
        data,
        permits,
        pending,
    })
}

/// Checks a get against the token's read scopes, starts the sender (its first offers go out
/// while the data connections join) and gathers the data connections.
async fn prepare_get<'a>(
    shared: &'a ServerState,
    stream: &mut Stream,
    grant: &Grant,
    named: Named,
    caps: Capabilities,
    src: &str,
    opts: TransferOpts,
) -> Result<Work<'a>, SessionError> {
    let (source, top) = source_of(shared, grant, src)?;
    let opts = clamp(shared, opts);
    // The walk starts now and its offers go out while the data connections join: a
    // client that answers them meanwhile has its decisions here when they have.
    let plan = StreamPlan {
        tune_storage: shared.config.tune_storage,
        early_tuned: caps.has(Capabilities::EARLY_TUNED),
        helpers: ramp_helpers_asked(caps, &opts),
        // A multipath client spreads its connections over the paths it was told.
        paths: if caps.has(Capabilities::MULTIPATH) {
            u16::try_from(shared.config.paths.len().clamp(1, ferry_proto::MAX_PATHS)).unwrap_or(1)
        } else {
            1
        },
        ..StreamPlan::from_opts(&opts)
    };
    let (tx, frames) = frame_queue(&plan, opts.streams);
    let (ctl_tx, offers) = flume::unbounded();
    let config = SenderConfig {
        block_size: opts.block_size,
        streams: opts.streams,
        checksum: opts.checksum,
        readers: {
            let config = &shared.config;
            let (start, tune, most) = config.storage_pool(config.readers, opts.storage_threads);
            crate::autotune::storage_gate(start, tune, most)
        },
        corrupt_blocks: Vec::new(),
        digest_cache: Arc::new(match &shared.config.catalog {
            Some(catalog) => DigestCache::with_known(Arc::new(SourceDigests {
                catalog: catalog.clone(),
                top,
                name: source.name.clone(),
            })),
            None => DigestCache::default(),
        }),
    };
    let sender = Sender::start(vec![source], config, tx, ctl_tx, shared.metrics.sending());
    // The grant is this server's own: blocks are cut by it from the first.
    sender.grant(opts.block_size, opts.streams);
    if caps.has(Capabilities::STRIPE_DIGEST) {
        sender.digest_apart();
    }
    let gathered = gather(&shared.registry, stream, named, &opts, Some(&offers)).await;
    let (data, permits, pending) = match gathered {
        Ok(g) => g,
        Err(e) => {
            sender.close();
            return Err(e);
        }
    };
    Ok(Work::Get {
        sender,
        frames,
        offers,
        plan,
        opts,
        data,
        permits,
        pending,
    })
}

/// What a get (or a third-party copy from here) reads: `src` under the token's read scope,
/// confined beneath the prefix that grants it.
/// The source a get names, and its path under the root (for the catalog).
fn source_of(
    shared: &ServerState,
    grant: &Grant,
    src: &str,
) -> Result<(Source, String), SessionError> {
    let rel = resolve(shared, src)?;
    let Some(prefix) = grant.read_scope(&rel) else {
        return Err(denied(grant, "read", src));
    };
    let inner = access::inside(&rel, prefix).to_owned();
    let scope = shared
        .root
        .scope(prefix, false)
        .and_then(|scope| scope.lstat(&inner).map(|_| scope))
        .map_err(|e| as_requested(e.into(), src))?;
    let name = path::split_parent(&rel).1;
    let name = if name.is_empty() {
        "root".to_owned()
    } else {
        name.to_owned()
    };
    Ok((
        Source {
            root: scope,
            rel: inner,
            name,
        },
        rel,
    ))
}

/// A remote path as a path under the root: absolute paths from the root, relative ones from
/// the configured base.
pub(super) fn resolve(shared: &ServerState, raw: &str) -> Result<String, SessionError> {
    shared.resolve(raw)
}

/// A failure to find or open the path a request named, named as the client wrote it: the file
/// system names the component it stopped at (`no` for `/no/such`), which the client never typed.
fn as_requested(e: SessionError, raw: &str) -> SessionError {
    match e {
        SessionError::Fs(FsError::Io { cause, .. }) => SessionError::Fs(FsError::Io {
            path: raw.to_owned(),
            cause,
        }),
        SessionError::Fs(FsError::Escapes { .. }) => SessionError::Fs(FsError::Escapes {
            path: raw.to_owned(),
        }),
        other => other,
    }
}

/// The ramp helpers among a get's granted connections: those beyond the 16 an auto-tuned
/// client tunes, when the client says it means them so (`Capabilities::RAMP_HELPERS`). A client
/// without the bit has every connection tuned, as before.
fn ramp_helpers_asked(caps: Capabilities, opts: &TransferOpts) -> u16 {
    if !opts.is_auto() || !caps.has(Capabilities::RAMP_HELPERS) {
        return 0;
    }
    opts.streams.saturating_sub(ferry_proto::RAMP_HELPERS_FROM)
}

/// Lowers what a client asked for to what this server allows, keeping memory bounded.
pub(super) fn clamp(shared: &ServerState, mut opts: TransferOpts) -> TransferOpts {
    let config = &shared.config;
    opts.streams = opts.streams.clamp(1, config.max_streams.max(1));
    if opts.is_auto() {
        // An auto-tuned session opens connections it may never use. Beyond its starting count,
        // it gets at most an eighth of the free connection slots, so that a burst of clients
        // fills the cap with sessions, not with idle spares (32 clients × 16 would exceed 512).
        let spare = (shared.connections.available_permits() / 8) as u16;
        let floor = opts.auto_start.max(1);
        opts.streams = opts.streams.min(floor.max(spare)).max(1);
        opts.auto_start = opts.auto_start.min(opts.streams);
    }
    opts.storage_threads = opts
        .storage_threads
        .min(u16::try_from(config.max_storage_threads).unwrap_or(u16::MAX));
    // Frames in flight per session: one per stream, the writer queue and one per writer.
    let writers = config.storage_pool(config.writers, opts.storage_threads).0;
    let slots = u64::from(opts.streams) + 3 * writers.max(1) as u64;
    // Never below `MIN_GRANTED_BLOCK` (unless asked): a client's early blocks are cut to it.
    while u64::from(opts.block_size) * slots > config.session_memory
        && opts.block_size > ferry_proto::MIN_GRANTED_BLOCK
    {
        opts.block_size = (opts.block_size / 2).max(ferry_proto::MIN_GRANTED_BLOCK);
    }
    opts
}

/// The directory a third-party grant's put is confined beneath: the granted path when the
/// put lands inside it (an existing directory, a `/` at the end, several sources), else its
/// parent. Opened without following any link, like a token's prefix.
fn granted_dir(
    shared: &ServerState,
    prefix: &str,
    rel: &str,
    dest: &str,
    sources: u32,
) -> Result<String, SessionError> {
    let scope = shared.root.scope(prefix, true)?;
    let inner = access::inside(rel, prefix);
    let is_dir = match scope.lstat(inner) {
        // A link at the granted path would take the put wherever it points.
        Ok(m) if m.kind == Kind::Symlink => {
            return Err(SessionError::Remote {
                code: ErrorCode::PERMISSION,
                message: format!("`{dest}` is a symbolic link: a grant does not write through one"),
            })
        }
        Ok(m) => m.kind == Kind::Dir,
        Err(e) if e.is_not_found() => false,
        Err(e) => return Err(e.into()),
    };
    if is_dir || dest.ends_with('/') || sources > 1 || inner.is_empty() {
        Ok(rel.to_owned())
    } else {
        Ok(path::split_parent(rel).0.to_owned())
    }
}

/// Where a put lands: inside `dest` if it is a directory (or clearly meant as one), else
/// under the name `dest` itself, like `cp`.
fn resolve_dest(
    root: &Root,
    dest: &str,
    rel: String,
    sources: u32,
) -> Result<Destination, SessionError> {
    let is_dir = match root.lstat(&rel) {
        Ok(m) => m.kind == Kind::Dir,
        Err(e) if e.is_not_found() => false,
        Err(e) => return Err(e.into()),
    };
    let dest = if is_dir || dest.ends_with('/') || sources > 1 || rel.is_empty() {
        Destination {
            root: root.subroot("")?,
            base: rel,
            rename_top: None,
        }
    } else {
        let (parent, name) = path::split_parent(&rel);
        Destination {
            root: root.subroot("")?,
            base: parent.to_owned(),
            rename_top: Some(name.to_owned()),
        }
    };
    Ok(dest)
}

async fn list(root: &Root, stream: &mut Stream, rel: &str) -> Result<(), SessionError> {
    let rel = rel.to_owned();
    let meta = root.lstat(&rel)?;
    let entry = |name: String, m: ferry_core::root::Meta| ListEntry {
        name,
        kind: match m.kind {
            Kind::File => ferry_proto::EntryKind::File,
            Kind::Dir => ferry_proto::EntryKind::Dir,
            Kind::Symlink => ferry_proto::EntryKind::Symlink,
            Kind::Other => ferry_proto::EntryKind::Other,
        },
        size: m.size,
        mode: m.mode,
        mtime_ns: m.mtime_ns,
    };
    let mut entries = Vec::new();
    if meta.kind == Kind::Dir {
        for (name, _) in root.read_dir(&rel)?.entries {
            if let Ok(m) = root.lstat(&path::join(&rel, &name)) {
                entries.push(entry(name, m));
            }
        }
    } else {
        entries.push(entry(path::split_parent(&rel).1.to_owned(), meta));
    }
    for chunk in entries.chunks(MAX_LIST_ENTRIES) {
        send(
            stream,
            &Frame::ListEntries {
                entries: chunk.to_vec(),
            },
        )
        .await?;
    }
    send(stream, &Frame::ListEnd).await?;
    Ok(())
}
