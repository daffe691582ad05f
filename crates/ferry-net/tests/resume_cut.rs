//! Resume after a cut, with real files on loopback (issue 36's pair-harness clause; the
//! in-memory pair harness in ferry-session has no files): a put is cut after a random number
//! of bytes, the receiver's journals are read with ferry's own decoder, and a second put must
//! deliver every file once and identical while sending at most what the journals (and the
//! files already in place) did not hold, plus the two allowances the protocol needs (below).

use crate::util;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use util::*;

/// Every case (a cut put, the wait for the server to let go, the resume) ends within this.
const CASE_LIMIT: Duration = Duration::from_secs(20);
/// The cut put must notice the cut and end within this: never a hang.
const CUT_LIMIT: Duration = Duration::from_secs(8);
/// The server must let go of the cut session's files within this.
const SETTLE_LIMIT: Duration = Duration::from_secs(5);

/// A file size: empty, small (one block, never journaled), at the block edge, or several
/// blocks, aligned or not (journaled, so resumable). Weighted towards the resumable kind.
fn size() -> impl Strategy<Value = u64> {
    let b = u64::from(BLOCK);
    prop_oneof![
        1 => Just(0u64),
        1 => 1..=4096u64,
        1 => (b - 1)..=(b + 1),
        2 => (2..=32u64).prop_map(move |k| k * b),
        4 => (2..=32u64, 1..b).prop_map(move |(k, r)| k * b + r),
    ]
}

/// Sizes of the files, a content seed, and where the cut falls, in thousandths of the bytes
/// the client would send for the whole transfer: mostly past the early blocks of its first
/// round trip, so that the receiver has journaled something; sometimes after the end.
fn case() -> impl Strategy<Value = (Vec<u64>, u64, u64)> {
    (vec(size(), 1..=6), any::<u64>(), 100..=1000u64)
}

proptest! {
    // Each case is two real transfers: few cases, and a failure shrinks only a little.
    #![proptest_config(ProptestConfig {
        cases: 12,
        max_shrink_iters: 16,
        ..ProptestConfig::default()
    })]

    /// After a put cut at any point, a second put leaves (a) every file under its final
    /// name, identical to its source, once, and nothing else (no partial copy or journal), and
    /// (b) `total − held ≤ sent ≤ total − held + last + early`: `sent` the file data the
    /// second put sent (its reporter's `on_bytes`: first copies, not the endgame's second
    /// ones), `held` the bytes of the files already in place plus the union of the blocks
    /// their journals record, `last` and `early` the allowances explained in [`Allowance`].
    #[test]
    fn resume_after_a_cut_resends_at_most_what_the_journal_did_not_hold(
        (sizes, seed, permille) in case()
    ) {
        block_on(run(&sizes, seed, permille))?;
    }
}

/// A late cut in a tree with large files: the receiver holds well beyond the allowances, so
/// the property's bound is below the total and the resume must leave out what was held (a
/// random cut may come before anything was journaled, where the bound is the total).
#[test]
fn a_late_cut_is_resumed_from_what_the_journal_held() {
    let b = u64::from(BLOCK);
    let sizes = [40 * b + 1234, 24 * b, 100, 0, 9 * b + 1];
    let out = block_on(run(&sizes, 7, 800)).unwrap();
    assert!(
        out.held > out.allowed + 4 * b,
        "the cut left too little journaled to test anything: {out:?}"
    );
    assert!(out.sent < out.total, "{out:?}");
}

/// Runs a case on a runtime of its own, bounded by [`CASE_LIMIT`].
fn block_on(
    case: impl std::future::Future<Output = Result<Outcome, TestCaseError>>,
) -> Result<Outcome, TestCaseError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { tokio::time::timeout(CASE_LIMIT, case).await })
        .map_err(|_| TestCaseError::fail(format!("case over {CASE_LIMIT:?}")))?
}

/// What a case measured: file bytes in all, held after the cut, sent by the resume, and the
/// allowances (`last + early`).
#[derive(Debug)]
struct Outcome {
    total: u64,
    held: u64,
    sent: u64,
    allowed: u64,
}

/// Cuts a put of files of `sizes` after `permille` thousandths of its bytes, resumes it, and
/// checks (a) and (b) (see the property).
async fn run(sizes: &[u64], seed: u64, permille: u64) -> Result<Outcome, TestCaseError> {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    let sources: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| bytes(n as usize, seed.wrapping_add(i as u64)))
        .collect();
    for (i, data) in sources.iter().enumerate() {
        write(&tree.join(format!("f{i}")), data);
    }
    let total: u64 = sizes.iter().sum();

    // The cut: the client's bytes pass a relay that forwards `budget` of them, then closes
    // every connection. 8 KiB stands for the handshakes and frame headers.
    let budget = 1 + permille * (total + 8192) / 1000;
    let relay = CuttingRelay::start(server.addr, budget).await;
    let mut cfg = server.client();
    cfg.server = relay.addr.to_string();
    let first = tokio::time::timeout(
        CUT_LIMIT,
        ferry_net::client::put(&cfg, std::slice::from_ref(&tree), "/", reporter()),
    )
    .await;
    prop_assert!(
        first.is_ok(),
        "the cut put did not end within {CUT_LIMIT:?}"
    );
    let temps = settle(&server, &relay).await?;
    relay.stop();

    let held = holdings(&server.root, sizes, &temps)?;
    let held_total: u64 = held.iter().map(Holding::bytes).sum();

    // The resume: straight to the server, one stream and one reader (see `Allowance::early`).
    let mut cfg = server.client();
    cfg.opts.streams = 1;
    cfg.readers = 1;
    let counted = Arc::new(Counted::default());
    let report = ferry_net::client::put(&cfg, std::slice::from_ref(&tree), "/", counted.clone())
        .await
        .map_err(|e| TestCaseError::fail(format!("the resume failed: {e}")))?;
    prop_assert!(report.is_success(), "{:?}", report.errors);

    // (a) Every file once, under its final name, identical; nothing else, no partials.
    let mut expected: Vec<String> = (0..sizes.len()).map(|i| format!("t/f{i}")).collect();
    expected.push("t".into());
    expected.sort();
    prop_assert_eq!(names(&server.root), expected);
    for (i, data) in sources.iter().enumerate() {
        let got = std::fs::read(server.root.join(format!("t/f{i}"))).unwrap();
        prop_assert!(&got == data, "t/f{} differs from its source", i);
    }

    // (b) What was sent again. Every byte not held must go (else the accounting above missed
    // something the receiver trusted), and beyond those only the allowances.
    let sent = counted.bytes.load(Ordering::Relaxed);
    prop_assert!(
        sent >= total - held_total,
        "sent {sent} bytes of file data, less than the {} the journals did not hold ({held:?})",
        total - held_total
    );
    let allowance = Allowance::of(&held, sizes);
    let bound = total - held_total + allowance.last + allowance.early;
    prop_assert!(
        sent <= bound,
        "sent {sent} bytes of file data; {total} in all, {held_total} held ({held:?}), \
         allowed {allowance:?}: at most {bound}"
    );
    server.stop().await;
    Ok(Outcome {
        total,
        held: held_total,
        sent,
        allowed: allowance.last + allowance.early,
    })
}

/// What the receiver held of one file after the cut.
#[derive(Debug)]
enum Holding {
    /// Under its final name: the first put finished it.
    Whole(u64),
    /// The union of the blocks its journal records (start → end), empty without a journal.
    Journaled(BTreeMap<u64, u64>),
}

impl Holding {
    fn bytes(&self) -> u64 {
        match self {
            Holding::Whole(n) => *n,
            Holding::Journaled(r) => r.iter().map(|(s, e)| e - s).sum(),
        }
    }

    /// Held bytes within `[lo, hi)`.
    fn within(&self, lo: u64, hi: u64) -> u64 {
        let span = |s: u64, e: u64| e.min(hi).saturating_sub(s.max(lo));
        match self {
            Holding::Whole(n) => span(0, *n),
            Holding::Journaled(r) => r.iter().map(|(&s, &e)| span(s, e)).sum(),
        }
    }
}

/// The held bytes the protocol sends again anyway, each bounded tightly.
#[derive(Debug)]
struct Allowance {
    /// A file's last block always goes (it carries the file digest, and the receiver checks
    /// the whole file against it): the held bytes of each resumed file within its last block,
    /// which starts at most one block before its end.
    last: u64,
    /// Blocks read before their file's decision are sent early, from the file's start, before
    /// the receiver could say what it holds (a round trip saved per session). The sender stops
    /// once `EARLY_PER_STREAM` per stream went early, checking before each block, so with one
    /// stream and one reader at most that plus one block goes early in all: the held bytes
    /// within that prefix of any file, and no more than that prefix in all.
    early: u64,
}

impl Allowance {
    fn of(held: &[Holding], sizes: &[u64]) -> Self {
        let block = u64::from(BLOCK);
        let last = held
            .iter()
            .zip(sizes)
            .filter(|(h, _)| matches!(h, Holding::Journaled(_)))
            .map(|(h, &n)| h.within(n.saturating_sub(block), n))
            .sum();
        let prefix = ferry_core::send::EARLY_PER_STREAM + block;
        let early = held
            .iter()
            .map(|h| h.within(0, prefix))
            .sum::<u64>()
            .min(prefix);
        Self { last, early }
    }
}

/// What the server holds of each source file `t/f<i>`, read from its destination and, for
/// files not in place, from their journals with ferry's own decoder (`temps`: the temporary
/// files left).
fn holdings(root: &Path, sizes: &[u64], temps: &[String]) -> Result<Vec<Holding>, TestCaseError> {
    let mut journaled: BTreeMap<String, BTreeMap<u64, u64>> = BTreeMap::new();
    for name in temps.iter().filter(|n| n.ends_with(".journal")) {
        let raw = std::fs::read(root.join(name)).unwrap();
        // A header that does not decode makes the resume start from nothing: nothing held.
        let Ok(journal) = ferry_proto::journal::decode_journal(&raw) else {
            continue;
        };
        let file = journal
            .header
            .path
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_owned();
        let ranges = journaled.entry(file).or_default();
        for r in &journal.records {
            insert_range(ranges, r.offset, r.offset + u64::from(r.len));
        }
    }
    let mut out = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let name = format!("f{i}");
        if root.join("t").join(&name).exists() {
            prop_assert!(
                !journaled.contains_key(&name),
                "{name} is in place and still journaled"
            );
            out.push(Holding::Whole(n));
        } else {
            out.push(Holding::Journaled(
                journaled.remove(&name).unwrap_or_default(),
            ));
        }
    }
    prop_assert!(
        journaled.is_empty(),
        "journals of no source file: {journaled:?}"
    );
    Ok(out)
}

/// Adds `[s, e)` to a set of disjoint ranges, merging what it touches.
fn insert_range(ranges: &mut BTreeMap<u64, u64>, mut s: u64, mut e: u64) {
    let touching: Vec<(u64, u64)> = ranges
        .range(..=e)
        .filter(|(_, &end)| end >= s)
        .map(|(&a, &b)| (a, b))
        .collect();
    for (a, b) in touching {
        ranges.remove(&a);
        s = s.min(a);
        e = e.max(b);
    }
    ranges.insert(s, e);
}

/// Waits (bounded) until the cut session is over on the server: it closed every connection
/// the relay opened to it (having read all the relay forwarded: a session may start from
/// bytes still in its socket buffers after the cut), no session runs, only journaled partial
/// copies are left (`.ferry-<16 hex>.part` and `.journal`) and no journal is locked. Returns
/// the temporary files.
async fn settle(server: &TestServer, relay: &CuttingRelay) -> Result<Vec<String>, TestCaseError> {
    let root = &server.root;
    let t0 = tokio::time::Instant::now();
    loop {
        let closed = relay.open.load(Ordering::Acquire) == 0;
        let idle = server.idle.idle_for() > Duration::ZERO;
        let temps = temp_names(root);
        let settled = temps.iter().all(|n| {
            let base = n.rsplit('/').next().unwrap_or(n);
            if base.ends_with(".journal") {
                !locked(&root.join(n))
            } else {
                is_journaled_part(base)
            }
        });
        if closed && idle && settled {
            return Ok(temps);
        }
        prop_assert!(
            t0.elapsed() < SETTLE_LIMIT,
            "the cut session is not over: connections closed {closed}, no session {idle}, \
             temporary files {temps:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `.ferry-<16 hex>.part`: the stable name of a journaled partial copy.
fn is_journaled_part(name: &str) -> bool {
    name.strip_prefix(".ferry-")
        .and_then(|r| r.strip_suffix(".part"))
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether a session still holds the lock of this journal (receivers `flock` it).
fn locked(path: &Path) -> bool {
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: `f` is an open descriptor for the whole call; closing it drops our lock.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

/// Counts the file data a put sends (first copies only: the reporter is not told of the
/// endgame's second copies).
#[derive(Default)]
struct Counted {
    bytes: AtomicU64,
}

impl ferry_core::Reporter for Counted {
    fn on_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }
}

/// A loopback relay in front of the server that forwards the first `budget` bytes the client
/// sends (all its connections together), then closes every connection and refuses new ones:
/// a cut at an exact point of the byte stream. The server sees an end of stream after those
/// bytes, as from a client that died; the relay reads on until the server closes.
struct CuttingRelay {
    addr: SocketAddr,
    /// Connections accepted whose server side has not closed yet.
    open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CuttingRelay {
    async fn start(server: SocketAddr, budget: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let left = Arc::new(AtomicU64::new(budget));
        let (cut, _) = watch::channel(false);
        let cut = Arc::new(cut);
        let open = Arc::new(AtomicUsize::new(0));
        let counted = open.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                // Counted before its task starts, so that `open` is never 0 too early.
                counted.fetch_add(1, Ordering::AcqRel);
                let open = Open(counted.clone());
                conns.spawn(relay(client, server, left.clone(), cut.clone(), open));
                while conns.try_join_next().is_some() {}
            }
        });
        Self { addr, open, task }
    }

    /// Ends the relay and every connection through it.
    fn stop(self) {
        self.task.abort();
    }
}

/// One relayed connection in [`CuttingRelay::open`] until dropped.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Forwards one connection both ways until either side ends or the cut comes; after a cut,
/// ends the server side's stream and reads until the server closes (bounded).
async fn relay(
    client: TcpStream,
    server: SocketAddr,
    left: Arc<AtomicU64>,
    cut: Arc<watch::Sender<bool>>,
    _open: Open,
) {
    let mut was_cut = cut.subscribe();
    if *was_cut.borrow() {
        return;
    }
    let Ok(upstream) = TcpStream::connect(server).await else {
        return;
    };
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = upstream.into_split();
    let up = async {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n as u64,
            };
            let before = left
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| {
                    Some(l.saturating_sub(n))
                })
                .unwrap_or(0);
            let take = before.min(n) as usize;
            if sw.write_all(&buf[..take]).await.is_err() {
                break;
            }
            if before <= n {
                cut.send_replace(true);
                // Parked: the cut ends this connection with the others.
                std::future::pending::<()>().await;
            }
        }
        let _ = sw.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => return,
        _ = was_cut.wait_for(|c| *c) => {}
    }
    drop((cr, cw));
    let _ = sw.shutdown().await;
    let drain = async {
        let mut buf = vec![0u8; 64 << 10];
        while matches!(sr.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    let _ = tokio::time::timeout(SETTLE_LIMIT, drain).await;
}
