//! `--sync size`: ferry sync's plan with size alone as the test of sameness (what FTS and
//! Globus call the lowest sync level). Both trees are listed with ferry-net's `local_tree`
//! and `remote_tree`; files of the same size at the destination are left out of the transfer
//! through the filter (`Filter::for_sync`), so neither end reads them; the rest go by a put or
//! get that replaces what is there. Nothing is removed.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use ferry_core::filter::Filter;
use ferry_core::send::Source;
use ferry_core::{FsError, Reporter, Root};
use ferry_net::sync::{local_tree, remote_tree, Tree};
use ferry_net::{ClientConfig, SessionError};
use ferry_proto::EntryKind;

use crate::location::name_of;

/// The files of `src` that `dest` holds with the same size, and whether nothing needs a
/// transfer at all (every file the same size, every directory there).
fn same_size(src: &Tree, dest: &Tree) -> (HashSet<String>, bool) {
    let mut unchanged = HashSet::new();
    let mut nothing = true;
    for (rel, s) in src {
        let d = dest.get(rel);
        match s.kind {
            EntryKind::File => {
                if d.is_some_and(|d| d.kind == EntryKind::File && d.size == s.size) {
                    unchanged.insert(rel.clone());
                } else {
                    nothing = false;
                }
            }
            EntryKind::Dir => nothing &= d.is_some_and(|d| d.kind == EntryKind::Dir),
            _ => nothing = false,
        }
    }
    (unchanged, nothing)
}

fn missing(name: &str) -> SessionError {
    let why = std::io::Error::from(std::io::ErrorKind::NotFound);
    FsError::io(name.to_owned(), why).into()
}

/// Makes `dest` on the server (the copy's own name) a copy of `rel` below `root` by size.
/// `cfg` replaces existing files (`ExistingPolicy::Overwrite`).
pub async fn put(
    cfg: &ClientConfig,
    root: &Path,
    rel: &str,
    dest: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<Vec<String>, SessionError> {
    if rel.is_empty() {
        return Err(missing("the local root itself"));
    }
    let src = local_tree(&root.join(rel), &Filter::default())?;
    if src.is_empty() {
        return Err(missing(rel));
    }
    let there = remote_tree(cfg, dest, &Filter::default(), reporter.as_ref()).await?;
    let (unchanged, nothing) = same_size(&src, &there);
    if nothing {
        return Ok(Vec::new());
    }
    let dest = dest.trim_end_matches('/');
    let (into, name) = match dest.rfind('/') {
        Some(i) => (dest[..=i].to_owned(), name_of(dest).to_owned()),
        None => ("./".to_owned(), dest.to_owned()),
    };
    // Opened below the local root, as a plain put's sources are.
    let sources = || -> Result<Vec<Source>, SessionError> {
        Ok(vec![Source {
            root: Root::open(root)?,
            rel: rel.to_owned(),
            name: name.clone(),
        }])
    };
    let filter = Filter::default().for_sync(unchanged);
    let r = ferry_net::client::put_sources_filtered(cfg, sources, &filter, &into, reporter).await?;
    Ok(r.errors)
}

/// Makes the local `dest` (its own name) a copy of `src` on the server by size.
pub async fn get(
    cfg: &ClientConfig,
    src: &str,
    dest: &Path,
    reporter: Arc<dyn Reporter>,
) -> Result<Vec<String>, SessionError> {
    let there = remote_tree(cfg, src, &Filter::default(), reporter.as_ref()).await?;
    if there.is_empty() {
        return Err(missing(src));
    }
    let here = local_tree(dest, &Filter::default())?;
    let (unchanged, nothing) = same_size(&there, &here);
    if nothing {
        return Ok(Vec::new());
    }
    let filter = Filter::default().for_sync(unchanged);
    let r = ferry_net::client::get_mirror(cfg, src, &filter, dest, reporter).await?;
    Ok(r.errors)
}
