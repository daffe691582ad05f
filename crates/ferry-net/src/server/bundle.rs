//! `ferry get --tar`: a tree (or the paths asked for below it) streamed as a tar that this
//! server writes. Members come in a stable order (each path asked for in name order, then
//! depth-first, names in byte order, a directory before its entries) and every regular file
//! is hashed as it is read and compared with the digest the catalog registered for it.
//!
//! A file's last chunk is held back until its digest is checked: a file whose bytes no longer
//! match (or that the catalog does not know) ends the stream with an `Error` naming it, before
//! its last bytes and before the end-of-archive blocks, so what the client has then is a
//! truncated tar that GNU tar reports as such, never a well-formed archive with bad bytes.
//! Memory per request is a few chunks (one being read, one held back, two queued).

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use ferry_catalog::Catalog;
use ferry_core::digest::{parse_algo, FileHasher};
use ferry_core::path::{join, normalize_remote, split_parent};
use ferry_core::root::{Kind, Meta};
use ferry_core::{FsError, Root};
use ferry_proto::{ErrorCode, Frame, MAX_TAR_DATA};
use tokio::sync::mpsc;

use super::access;
use super::state::ServerState;
use crate::error::SessionError;
use crate::transport::conn::send;
use crate::transport::stream::Stream;

const BLOCK: usize = 512;

/// Streams `rel` (already checked against the read scope `prefix`) as a tar in `TarData`
/// frames. `raw` is the path as the client wrote it, for messages. Returns the members sent.
pub(super) async fn serve(
    shared: &ServerState,
    stream: &mut Stream,
    catalog: Option<Arc<Catalog>>,
    (rel, prefix): (String, String),
    (raw, paths): (String, Vec<String>),
) -> Result<u64, SessionError> {
    let catalog = catalog.ok_or_else(|| {
        refuse(
            ErrorCode::BAD_REQUEST,
            "get --tar: this server keeps no catalog (it runs with --catalog none), so it cannot \
         check the members' digests; it refuses rather than send unchecked bytes"
                .to_owned(),
        )
    })?;
    let mut picks = Vec::with_capacity(paths.len());
    for p in &paths {
        let pick = normalize_remote(p)
            .map_err(|e| refuse(ErrorCode::BAD_REQUEST, format!("get --tar `{p}`: {e}")))?;
        picks.push(pick);
    }
    let scope = shared
        .root
        .scope(&prefix, false)
        .map_err(|e| fs_refused(&raw, e))?;
    let top = access::inside(&rel, &prefix).to_owned();
    let (tx, mut rx) = mpsc::channel::<Bytes>(2);
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_drop = StopOnDrop(stop.clone());
    let tarring = Tarring {
        catalog,
        scope,
        prefix,
        out: Vec::with_capacity(MAX_TAR_DATA),
        tx,
        stop,
        members: 0,
    };
    let job = tokio::task::spawn_blocking(move || tarring.run(&top, &raw, picks));
    while let Some(data) = rx.recv().await {
        send(stream, &Frame::TarData { data, last: false }).await?;
    }
    let members = job.await.map_err(|e| SessionError::Remote {
        code: ErrorCode::INTERNAL,
        message: format!("get --tar stopped: {e}"),
    })??;
    let end = Frame::TarData {
        data: Bytes::new(),
        last: true,
    };
    send(stream, &end).await?;
    Ok(members)
}

/// Tells the reading thread to stop when the session's future is dropped (its end).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn refuse(code: ErrorCode, message: String) -> SessionError {
    SessionError::Remote { code, message }
}

fn fs_refused(raw: &str, e: FsError) -> SessionError {
    refuse(e.code(), format!("get --tar `{raw}`: {e}"))
}

/// The reading thread: walks, reads, hashes and writes the tar into chunks for the session.
struct Tarring {
    catalog: Arc<Catalog>,
    scope: Root,
    prefix: String,
    /// Tar bytes not yet handed to the session (less than a chunk).
    out: Vec<u8>,
    tx: mpsc::Sender<Bytes>,
    stop: Arc<AtomicBool>,
    members: u64,
}

impl Tarring {
    fn run(mut self, top: &str, raw: &str, mut picks: Vec<String>) -> Result<u64, SessionError> {
        let meta = self.scope.lstat(top).map_err(|e| fs_refused(raw, e))?;
        if meta.kind != Kind::Dir {
            if !picks.is_empty() {
                let why = "PATHS name entries below a directory, and this is not one";
                return Err(refuse(
                    ErrorCode::BAD_REQUEST,
                    format!("get --tar `{raw}`: {why}"),
                ));
            }
            let name = split_parent(top).1.to_owned();
            self.entry(top, &name, meta)?;
        } else {
            if picks.is_empty() || picks.iter().any(String::is_empty) {
                picks = self.children(top, raw)?;
            }
            picks.sort();
            picks.dedup();
            let mut taken: Vec<&str> = Vec::new();
            for pick in &picks {
                // Inside a path already taken: its members are in the archive once.
                if taken.iter().any(|t| pick.starts_with(&format!("{t}/"))) {
                    continue;
                }
                taken.push(pick);
                let inner = join(top, pick);
                let meta = self
                    .scope
                    .lstat(&inner)
                    .map_err(|e| fs_refused(&join(raw, pick), e))?;
                self.entry(&inner, pick, meta)?;
            }
        }
        // The end of the archive: two zero blocks.
        self.write(&[0u8; 2 * BLOCK])?;
        self.flush()?;
        Ok(self.members)
    }

    /// The names in directory `inner`, in byte order; ferry's own partial files left out.
    fn children(&self, inner: &str, raw: &str) -> Result<Vec<String>, SessionError> {
        let listing = self.scope.read_dir(inner).map_err(|e| fs_refused(raw, e))?;
        let mut names: Vec<String> = listing
            .entries
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| !n.starts_with(".ferry-"))
            .collect();
        names.sort();
        Ok(names)
    }

    /// One entry, `inner` below the scope, named `name` in the archive; a directory with all
    /// it holds.
    fn entry(&mut self, inner: &str, name: &str, meta: Meta) -> Result<(), SessionError> {
        if self.stop.load(Ordering::Acquire) {
            return Err(SessionError::Closed("control"));
        }
        match meta.kind {
            Kind::Dir => {
                self.header(
                    &format!("{name}/"),
                    tar::EntryType::Directory,
                    0,
                    &meta,
                    None,
                )?;
                for child in self.children(inner, name)? {
                    let c_inner = join(inner, &child);
                    let c_name = join(name, &child);
                    let c_meta = self
                        .scope
                        .lstat(&c_inner)
                        .map_err(|e| fs_refused(&c_name, e))?;
                    self.entry(&c_inner, &c_name, c_meta)?;
                }
                Ok(())
            }
            Kind::Symlink => {
                let target = self
                    .scope
                    .read_link(inner)
                    .map_err(|e| fs_refused(name, e))?;
                self.header(name, tar::EntryType::Symlink, 0, &meta, Some(&target))
            }
            Kind::File => self.file(inner, name, meta),
            // FIFOs, sockets, devices: ferry never stores them; nothing to vouch for.
            Kind::Other => Ok(()),
        }
    }

    /// A regular file, its bytes checked against the catalog's digest as they are read.
    fn file(&mut self, inner: &str, name: &str, meta: Meta) -> Result<(), SessionError> {
        let path = join(&self.prefix, inner);
        let bad = |why: String| refuse(ErrorCode::IO, format!("get --tar: member `{name}`: {why}"));
        let object = match self.catalog.stat(&path) {
            Ok(Some(s)) => s.object,
            Ok(None) => {
                return Err(bad(
                    "not in the catalog, so its bytes cannot be checked".into()
                ))
            }
            Err(e) => return Err(bad(format!("the catalog failed: {e}"))),
        };
        let algo = parse_algo(&object.algo)
            .ok_or_else(|| bad(format!("registered with unknown digest `{}`", object.algo)))?;
        let mut file = self
            .scope
            .open_read(inner)
            .map_err(|e| fs_refused(name, e))?;
        let size = file.metadata().map_err(|e| bad(e.to_string()))?.len();
        if size != object.size {
            return Err(bad(format!(
                "{size} bytes on disk, {} registered: no longer the file stored",
                object.size
            )));
        }
        self.header(name, tar::EntryType::Regular, size, &meta, None)?;
        let mut hasher = FileHasher::new(algo);
        let mut held: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; MAX_TAR_DATA];
        let mut read = 0u64;
        loop {
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(bad(format!("reading: {e}"))),
            };
            read += n as u64;
            if read > size {
                return Err(bad("grew while being read".into()));
            }
            hasher.update(&buf[..n]);
            // The chunk before goes out; this one waits until the digest is known.
            let before = std::mem::replace(&mut held, buf[..n].to_vec());
            self.write(&before)?;
        }
        if read != size || hasher.finalize() != object.digest {
            return Err(bad(
                "its bytes no longer match the digest registered in the catalog".into(),
            ));
        }
        self.write(&held)?;
        let pad = (BLOCK - (size as usize % BLOCK)) % BLOCK;
        self.write(&[0u8; BLOCK][..pad])
    }

    /// A member's header (a GNU long-name entry first for a name or target over 100 bytes).
    fn header(
        &mut self,
        name: &str,
        ty: tar::EntryType,
        size: u64,
        meta: &Meta,
        link: Option<&str>,
    ) -> Result<(), SessionError> {
        if name.len() > 100 {
            self.long(tar::EntryType::GNULongName, name)?;
        }
        if let Some(l) = link.filter(|l| l.len() > 100) {
            self.long(tar::EntryType::GNULongLink, l)?;
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(ty);
        h.set_size(size);
        h.set_mode(meta.mode & 0o7777);
        h.set_mtime(u64::try_from(meta.mtime_ns.div_euclid(1_000_000_000)).unwrap_or(0));
        h.set_uid(0);
        h.set_gid(0);
        let old = h.as_old_mut();
        let n = name.len().min(100);
        old.name[..n].copy_from_slice(&name.as_bytes()[..n]);
        if let Some(l) = link {
            let n = l.len().min(100);
            old.linkname[..n].copy_from_slice(&l.as_bytes()[..n]);
        }
        h.set_cksum();
        self.members += 1;
        self.write(h.as_bytes())
    }

    /// A GNU `././@LongLink` entry carrying a long name or link target.
    fn long(&mut self, ty: tar::EntryType, text: &str) -> Result<(), SessionError> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(ty);
        let len = text.len() + 1;
        h.set_size(len as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        let tag = b"././@LongLink";
        h.as_old_mut().name[..tag.len()].copy_from_slice(tag);
        h.set_cksum();
        self.write(h.as_bytes())?;
        self.write(text.as_bytes())?;
        let pad = (BLOCK - (len % BLOCK)) % BLOCK;
        self.write(&[0u8; BLOCK][..pad + 1])
    }

    /// Appends tar bytes, handing each full chunk to the session.
    fn write(&mut self, mut bytes: &[u8]) -> Result<(), SessionError> {
        while !bytes.is_empty() {
            let room = MAX_TAR_DATA - self.out.len();
            let n = room.min(bytes.len());
            self.out.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.out.len() == MAX_TAR_DATA {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SessionError> {
        if self.out.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.out, Vec::with_capacity(MAX_TAR_DATA));
        self.tx
            .blocking_send(Bytes::from(chunk))
            .map_err(|_| SessionError::Closed("control"))
    }
}
