//! Grants for third-party copies, minted by the destination server.
//!
//! A client that wants server A to put into this server asks this server, over its own logged-in
//! session, for a grant: a bearer credential for one put into one path, within the client's
//! write scope. A presents it as its token. The grant lives only in memory and only while the
//! client's minting session stays open (closing it revokes the grant); it must be used within a
//! time to live, by one session at a time, and is spent once a session with it completes. A
//! session that fails gives A the same time to log in again (its retry); a grant never leaves
//! this process, so a restart revokes every grant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_proto::CompleteSummary;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::access::Grant;

/// What every grant starts with; the client sees it as the token A presents.
pub(super) const PREFIX: &str = "ferry-grant:";

/// Grants one server holds at once (each is held by one open client session, which also
/// counts against its token's session cap; this bounds the table whatever the caps).
const MAX_GRANTS: usize = 4096;

/// What the session that used a grant tells the session that minted it.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Every file is stored: the receiver's summary, as it sent `Complete` to the source.
    Complete(CompleteSummary),
    /// The session ended without completing; the source may log in again within the time to
    /// live.
    Interrupted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Not in use; usable until `deadline`.
    Waiting {
        deadline: Instant,
    },
    InUse,
    Spent,
}

struct Entry {
    secret_hash: [u8; 32],
    scope: Grant,
    state: State,
    report: tokio::sync::mpsc::UnboundedSender<Outcome>,
    /// Dropped with the entry: a session using the grant ends when it is revoked.
    revoked: tokio::sync::watch::Sender<()>,
}

/// The grants this server has minted and not yet revoked.
#[derive(Clone)]
pub(super) struct Grants {
    table: Arc<Mutex<HashMap<u128, Entry>>>,
    ttl: Duration,
}

/// Why a grant cannot be minted.
#[derive(Debug)]
pub(super) enum MintError {
    Full,
}

/// Why a grant does not log in.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// Unknown, revoked, expired, spent, or not this secret: like a wrong token.
    Invalid,
    /// Another session uses it now (a source's retry before this server noticed that the
    /// session it replaces is gone): worth trying again shortly.
    InUse,
}

impl Grants {
    pub(super) fn new(ttl: Duration) -> Self {
        Self {
            table: Arc::default(),
            ttl,
        }
    }

    pub(super) fn ttl(&self) -> Duration {
        self.ttl
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u128, Entry>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mints a grant for `scope` (see [`Grant::third_party`]). Returns the credential and the
    /// minting side's handle: dropping it revokes the grant.
    pub(super) fn mint(&self, scope: Grant) -> Result<(String, Minted), MintError> {
        let mut id = [0u8; 16];
        let mut secret = [0u8; 32];
        getrandom::fill(&mut id).expect("the OS random source works");
        getrandom::fill(&mut secret).expect("the OS random source works");
        let id = u128::from_be_bytes(id);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut table = self.lock();
        if table.len() >= MAX_GRANTS {
            return Err(MintError::Full);
        }
        table.insert(
            id,
            Entry {
                secret_hash: Sha256::digest(secret).into(),
                scope,
                state: State::Waiting {
                    deadline: Instant::now() + self.ttl,
                },
                report: tx,
                revoked: tokio::sync::watch::channel(()).0,
            },
        );
        let token = format!("{PREFIX}{id:032x}.{}", ferry_core::digest::hex(&secret));
        let minted = Minted {
            grants: self.clone(),
            id,
            outcomes: rx,
        };
        Ok((token, minted))
    }

    /// Takes a grant up for one session: the scope it allows and the lease that reports the
    /// session's end (and its revocation).
    pub(super) fn redeem(&self, token: &str) -> Result<(Grant, Lease), Refused> {
        let (id, secret) = parse(token).ok_or(Refused::Invalid)?;
        let mut table = self.lock();
        let entry = table.get_mut(&id).ok_or(Refused::Invalid)?;
        let hash: [u8; 32] = Sha256::digest(secret).into();
        if !bool::from(hash.ct_eq(&entry.secret_hash)) {
            return Err(Refused::Invalid);
        }
        match entry.state {
            State::Waiting { deadline } if Instant::now() < deadline => {}
            State::InUse => return Err(Refused::InUse),
            _ => return Err(Refused::Invalid),
        }
        entry.state = State::InUse;
        let lease = Lease {
            grants: self.clone(),
            id,
            done: false,
            revoked: entry.revoked.subscribe(),
        };
        Ok((entry.scope.clone(), lease))
    }

    fn state(&self, id: u128) -> Option<State> {
        self.lock().get(&id).map(|e| e.state)
    }

    /// Ends a session that used grant `id`: spent if it completed, else usable again for the
    /// time to live. The minting session hears of it.
    fn end(&self, id: u128, outcome: Outcome) {
        let mut table = self.lock();
        let Some(entry) = table.get_mut(&id) else {
            return;
        };
        entry.state = match outcome {
            Outcome::Complete(_) => State::Spent,
            Outcome::Interrupted => State::Waiting {
                deadline: Instant::now() + self.ttl,
            },
        };
        let _ = entry.report.send(outcome);
    }
}

/// `ferry-grant:<32 hex id>.<64 hex secret>`.
fn parse(token: &str) -> Option<(u128, [u8; 32])> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('.')?;
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let id = u128::from_str_radix(id, 16).ok()?;
    let secret = ferry_core::digest::unhex32(secret)?;
    Some((id, secret))
}

/// The minting session's hold on its grant: what sessions using it report, and revocation
/// when dropped.
pub(super) struct Minted {
    grants: Grants,
    id: u128,
    outcomes: tokio::sync::mpsc::UnboundedReceiver<Outcome>,
}

impl Minted {
    /// The next report of a session that used the grant.
    pub(super) async fn outcome(&mut self) -> Option<Outcome> {
        self.outcomes.recv().await
    }

    /// Whether the grant can no longer be used: its time to live ran out while no session
    /// held it.
    pub(super) fn expired(&self) -> bool {
        match self.grants.state(self.id) {
            Some(State::Waiting { deadline }) => Instant::now() >= deadline,
            Some(State::InUse | State::Spent) => false,
            None => true,
        }
    }
}

impl Drop for Minted {
    fn drop(&mut self) {
        self.grants.lock().remove(&self.id);
    }
}

/// One session's use of a grant. Dropped without [`Lease::complete`], it reports the session
/// interrupted.
pub(super) struct Lease {
    grants: Grants,
    id: u128,
    done: bool,
    revoked: tokio::sync::watch::Receiver<()>,
}

impl Lease {
    /// Resolves once the grant is revoked (its minting session closed): the session using it
    /// ends then, whatever it was doing.
    pub(super) async fn revoked(&self) {
        let mut rx = self.revoked.clone();
        while rx.changed().await.is_ok() {}
    }

    pub(super) fn complete(mut self, summary: CompleteSummary) {
        self.done = true;
        self.grants.end(self.id, Outcome::Complete(summary));
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.done {
            self.grants.end(self.id, Outcome::Interrupted);
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("id", &self.id).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> Grant {
        Grant::full("alice")
            .third_party("in/x", ferry_proto::ExistingPolicy::Fail)
            .unwrap()
    }

    #[test]
    fn a_grant_is_good_for_one_session_at_a_time_and_spent_when_it_completes() {
        let grants = Grants::new(Duration::from_secs(60));
        let (token, minted) = grants.mint(scope()).unwrap();
        let (granted, lease) = grants.redeem(&token).unwrap();
        assert_eq!(granted.pinned_dest(), Some("in/x"));
        assert_eq!(
            grants.redeem(&token).err(),
            Some(Refused::InUse),
            "in use: no second session"
        );
        drop(lease);
        let (_, lease) = grants
            .redeem(&token)
            .expect("usable again after an interruption");
        lease.complete(CompleteSummary::default());
        assert_eq!(grants.redeem(&token).err(), Some(Refused::Invalid), "spent");
        assert!(!minted.expired());
        drop(minted);
        assert!(grants.lock().is_empty(), "revoked with its minting session");
    }

    #[test]
    fn a_grant_expires_unused_and_a_wrong_secret_is_refused() {
        let grants = Grants::new(Duration::ZERO);
        let (token, minted) = grants.mint(scope()).unwrap();
        assert!(minted.expired());
        assert!(grants.redeem(&token).is_err());
        let grants = Grants::new(Duration::from_secs(60));
        let (token, _minted) = grants.mint(scope()).unwrap();
        let mut wrong = token.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        assert_eq!(grants.redeem(&wrong).err(), Some(Refused::Invalid));
        assert!(grants.redeem("ferry-grant:zz").is_err());
        assert!(grants.redeem(&token).is_ok());
    }

    #[test]
    fn a_grant_allows_its_one_destination_only() {
        let g = scope();
        assert!(g.may_write("in/x"));
        assert!(
            !g.may_write("in/x/y"),
            "a put names exactly the granted path"
        );
        assert!(!g.may_write("in/y"));
        assert!(!g.may_read("in/x"));
        assert!(!g.may_read_something());
        assert!(
            g.third_party("in/x", ferry_proto::ExistingPolicy::Fail)
                .is_none(),
            "a grant mints no grants"
        );
    }

    #[test]
    fn a_read_grant_reads_its_one_path_and_lapses_with_its_token_scope() {
        let owner = Grant::full("alice");
        let g = owner.read_grant("data/run", false).unwrap();
        assert!(g.reads_only() && !g.stripe_only());
        assert!(g.may_read("data/run"));
        assert!(
            !g.may_read("data/run/x"),
            "a get names exactly the granted path"
        );
        assert!(!g.may_read("data/other"));
        assert!(!g.may_write("data/run"));
        assert!(!g.may_read_something(), "no probes");
        assert!(
            g.read_grant("data/run", true).is_none(),
            "a grant mints no grants"
        );
        assert!(g
            .third_party("data/run", ferry_proto::ExistingPolicy::Fail)
            .is_none());
        assert!(g.still_covered_by(&owner));
        let stripe = owner.read_grant("data/run", true).unwrap();
        assert!(stripe.reads_only() && stripe.stripe_only());
        // The minting token later lost the read scope (or never wrote there).
        let writer_only = scope();
        assert!(!g.still_covered_by(&writer_only));
        assert!(
            writer_only.read_grant("in/x", false).is_none(),
            "a grant mints no read grant"
        );
    }
}
