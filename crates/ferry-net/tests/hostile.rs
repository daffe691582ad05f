//! A server under hostile input (issue 5): absurd frame lengths, ten thousand connections,
//! slowloris, a petabyte offer, bad names in every place a path travels, and symlinks swapped
//! in under a running transfer.
//!
//! The server runs in this process, so each test can look at what the abuse cost it: the
//! largest single allocation (a counting global allocator), the resident set (`VmRSS`) and the
//! open file descriptors (`/proc/self/fd`), before and after. Each test ends by putting a real
//! file through the same server and reading it back from disk: surviving means still serving.
//! The tests share process-wide figures, so they run one at a time (`SERIAL`) even under a
//! harness that runs tests on threads.

// The `SERIAL` guard is held across awaits on purpose: each test owns its runtime, so the lock
// only ever waits for another test's thread, never for a task of its own runtime.
#![allow(clippy::await_holding_lock)]

mod util;

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_net::SessionError;
use ferry_proto::{Decision, ErrorCode, ExistingPolicy, FileId, Frame};
use util::*;

const SECRET: &[u8] = b"TOP-SECRET-outside-the-root-hostile-91c3";

// ---------------------------------------------------------------------------------------------
// what the abuse cost: allocations, memory, descriptors

/// Records the largest single allocation the process makes, so that a test can prove a claimed
/// length was never allocated (RSS alone cannot: untouched pages of a huge `Vec` are not
/// resident).
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to the system allocator unchanged; only a counter is updated.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// One test at a time: allocation, RSS and descriptor figures are process-wide.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Resource figures at the start of an abuse, to compare with afterwards.
struct Budget {
    fds: usize,
    rss_kib: u64,
}

impl Budget {
    fn start() -> Self {
        LARGEST.store(0, Ordering::Relaxed);
        Self {
            fds: fd_count(),
            rss_kib: rss_kib(),
        }
    }

    /// The largest allocation since `start` stayed below `max` bytes.
    fn assert_largest_below(&self, max: usize, what: &str) {
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            largest < max,
            "{what}: an allocation of {largest} bytes (limit {max})"
        );
    }

    /// Resident memory grew by less than `max_mib`.
    fn assert_rss_grew_less_than(&self, max_mib: u64, what: &str) {
        let now = rss_kib();
        let grown = now.saturating_sub(self.rss_kib) / 1024;
        assert!(
            grown < max_mib,
            "{what}: RSS grew by {grown} MiB ({} -> {now} KiB)",
            self.rss_kib
        );
    }

    /// Waits (bounded) for the descriptor count to come back within `slack` of the start.
    async fn assert_fds_return(&self, slack: usize, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let now = fd_count();
            if now <= self.fds + slack {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {now} descriptors open, {} at the start",
                self.fds
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// helpers

/// A real put through the server after the abuse, checked on disk: the server still serves.
/// BUSY is retried briefly, because the server frees a slot just after closing a socket.
async fn assert_still_serves(server: &TestServer, name: &str) {
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join(name);
    let content = bytes(300_000, name.len() as u64);
    write(&file, &content);
    let mut cfg = server.client();
    cfg.opts.streams = 2;
    let r = put_past_busy(&cfg, &file, 40, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(r.is_success(), "{:?}", r.errors);
    assert_eq!(std::fs::read(server.root.join(name)).unwrap(), content);
}

/// Offers one file on `c` and returns the receiver's decision about it.
async fn offer(c: &mut Raw, id: u64, path: &str, size: u64) -> Decision {
    c.send(&Frame::Offer {
        entries: vec![ferry_proto::OfferEntry {
            file: FileId(id),
            path: path.into(),
            size,
            mode: 0o644,
            mtime_ns: 1_600_000_000_000_000_000,
        }],
    })
    .await
    .unwrap();
    match c.expect(Duration::from_secs(10)).await {
        Frame::Decisions { mut entries } => {
            assert_eq!(entries.len(), 1);
            let e = entries.pop().unwrap();
            assert_eq!(e.file, FileId(id));
            e.decision
        }
        other => panic!("expected Decisions, got {other:?}"),
    }
}

/// A block of a file of `size` bytes (not the last one: no file digest).
fn partial_block(id: u64, path: &str, size: u64, offset: u64, data: &[u8]) -> Frame {
    let data = bytes::Bytes::copy_from_slice(data);
    Frame::Block(ferry_proto::Block {
        file: ferry_proto::FileMeta {
            id: FileId(id),
            path: path.into(),
            size,
            mode: 0o644,
            mtime_ns: 1_600_000_000_000_000_000,
        },
        offset,
        digest: xxhash_rust::xxh3::xxh3_128(&data),
        file_digest: None,
        early: false,
        data,
    })
}

/// Everything next to the server's root, the root's own contents excluded.
fn beside_root(server: &TestServer) -> Vec<String> {
    names(server.root.parent().unwrap())
        .into_iter()
        .filter(|n| n != "root" && !n.starts_with("root/"))
        .collect()
}

/// `libc::renameat2(RENAME_EXCHANGE)`: swaps two names atomically, as an attacker with write
/// access inside the root would to race the server.
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let a = std::ffi::CString::new(a.as_os_str().as_bytes()).unwrap();
    let b = std::ffi::CString::new(b.as_os_str().as_bytes()).unwrap();
    // SAFETY: both are valid NUL-terminated paths; the call reads them only.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A thread that keeps swapping each `(dir, link)` pair (`link` is a symlink leading out of the
/// root) until told to stop, bounded in rounds and time; it leaves every directory where it
/// found it. Returns how many swaps succeeded.
struct Racer {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<u64>>,
}

impl Racer {
    fn start(pairs: Vec<(PathBuf, PathBuf)>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut swaps = 0u64;
            for round in 0..200_000u64 {
                if flag.load(Ordering::Relaxed) || t0.elapsed() > Duration::from_secs(60) {
                    break;
                }
                let (dir, link) = &pairs[(round as usize) % pairs.len()];
                // Out, a moment for the server to trip over the link, and back.
                if exchange(dir, link).is_ok() {
                    swaps += 1;
                    std::thread::sleep(Duration::from_millis(1));
                    exchange(dir, link).expect("swap back");
                }
                std::thread::sleep(Duration::from_micros(300));
            }
            swaps
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// absurd lengths

/// Bytes of a frame whose header claims `len` and whose payload follows (possibly shorter).
fn with_length(ty: u8, len: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![ty];
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(payload);
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_frame_lengths_refused_without_allocating_them() {
    let _serial = serial();
    let server = TestServer::start().await;
    let budget = Budget::start();

    // The wire's length field is a u32 (`type u8 | len u32`): a client "claiming 2^64-1" sends
    // 0xff bytes, of which the server reads a header of type 0xff and length u32::MAX.
    let mut hello = bytes::BytesMut::new();
    hello_control(TOKEN).encode(&mut hello);
    let hello_payload = hello[ferry_proto::HEADER_LEN..].to_vec();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("u64::MAX as bytes", vec![0xff; 8]),
        ("type and u64::MAX length", {
            let mut b = vec![0x01];
            b.extend_from_slice(&u64::MAX.to_be_bytes());
            b
        }),
        ("all ones, 64 bytes", vec![0xff; 64]),
        (
            "hello of u32::MAX",
            with_length(0x01, u32::MAX, &hello_payload),
        ),
        (
            "hello one past MAX_HELLO",
            with_length(0x01, ferry_proto::handshake::MAX_HELLO + 1, &hello_payload),
        ),
        (
            "block of u32::MAX first",
            with_length(0x20, u32::MAX, &[0; 64]),
        ),
        (
            "block at the wire maximum first",
            with_length(0x20, ferry_proto::MAX_BLOCK_PAYLOAD, &[0; 64]),
        ),
    ];
    for (name, bytes) in cases {
        let mut raw = Raw::connect(server.addr).await;
        let _ = raw.send_bytes(&bytes).await;
        let (code, closed) = refusal(&mut raw, T).await;
        assert!(closed, "{name}: still open");
        assert_eq!(code, Some(ErrorCode::PROTOCOL), "{name}");
    }

    // After authentication: a request claiming u32::MAX, and (within a put session) a Block
    // claiming u32::MAX on the data connection and an oversized frame on control.
    let (mut c, _, _) = control(&server).await;
    c.send_bytes(&with_length(0x10, u32::MAX, b"/"))
        .await
        .unwrap();
    let (code, closed) = refusal(&mut c, T).await;
    assert!(closed && code == Some(ErrorCode::PROTOCOL), "{code:?}");
    drop(c);

    let (mut c, mut d) = raw_put(&server, "/").await;
    d.send_bytes(&with_length(0x20, u32::MAX, &[0; 64]))
        .await
        .unwrap();
    assert!(d.closed_within(T).await, "data connection still open");
    let (code, closed) = refusal(&mut c, T).await;
    assert!(closed, "control still open: {code:?}");
    drop((c, d));

    let (mut c, d) = raw_put(&server, "/").await;
    c.send_bytes(&with_length(0x35, u32::MAX, &[0; 64]))
        .await
        .unwrap();
    let (code, closed) = refusal(&mut c, T).await;
    assert!(closed && code == Some(ErrorCode::PROTOCOL), "{code:?}");
    drop((c, d));

    // Nothing near the claimed sizes was allocated: the largest allocation of the whole abuse
    // is far below even the 64 MiB wire maximum.
    budget.assert_largest_below(16 << 20, "absurd lengths");
    budget.assert_rss_grew_less_than(64, "absurd lengths");
    budget.assert_fds_return(4, "absurd lengths").await;
    assert_eq!(names(&server.root), Vec::<String>::new());
    assert_still_serves(&server, "after-lengths.bin").await;
    server.stop().await;
}

/// The server reads a data connection's frames with the wire's 64 MiB block limit, not the
/// session's block size: a peer that negotiated 64 KiB blocks makes it reserve 64 MiB per
/// stream just by announcing a large Block, which the session memory budget (`clamp` in
/// server.rs) never accounted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_header_beyond_the_session_block_size_allocates_nothing() {
    let _serial = serial();
    let server = TestServer::start().await;
    let (mut c, mut d) = raw_put(&server, "/").await; // 64 KiB blocks
    let budget = Budget::start();
    // A Block header at the wire maximum, then nothing: the server sits in read_frame.
    d.send_bytes(&with_length(0x20, ferry_proto::MAX_BLOCK_PAYLOAD, &[0; 64]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    budget.assert_largest_below(4 << 20, "oversized block header");
    drop(d);
    let (_, closed) = refusal(&mut c, T).await;
    assert!(closed);
    assert_still_serves(&server, "after-block-header.bin").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_larger_than_the_session_block_size_ends_the_session() {
    let _serial = serial();
    let server = TestServer::start().await;
    let (mut c, mut d) = raw_put(&server, "/").await; // 64 KiB blocks
    let whole = bytes(BLOCK as usize * 2, 3);
    let decisions = send_offered(
        &mut c,
        &mut d,
        raw_block(0, "big.bin", &whole, 0, whole.len()),
    )
    .await;
    assert_eq!(decisions[0].decision, Decision::Send);
    let (err, closed) = refusal_message(&mut c, T).await;
    assert!(closed, "control still open");
    let (code, message) = err.expect("an Error frame says why");
    assert_eq!(code, ErrorCode::PROTOCOL, "{message}");
    assert!(message.contains("block size"), "{message}");
    assert!(!server.root.join("big.bin").exists());
    assert_still_serves(&server, "after-big-block.bin").await;
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// ten thousand connections

/// Raises the soft descriptor limit as far as the hard one (and the hard one too, if allowed).
fn raise_nofile(want: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_max < want {
            let raised = libc::rlimit {
                rlim_cur: want,
                rlim_max: want,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return want;
            }
        }
        let soft = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &soft), 0);
    }
    lim.rlim_max
}

/// Connects from `127.0.0.<2 + i % 50>`: ten thousand connections from one source address
/// would take a third of its ephemeral ports (and linger in TIME_WAIT for other tests).
async fn connect_from(i: usize, addr: SocketAddr) -> tokio::net::TcpStream {
    let src = Ipv4Addr::new(127, 0, 0, 2 + (i % 50) as u8);
    let fut = async {
        let s = tokio::net::TcpSocket::new_v4()?;
        s.bind(SocketAddr::from((src, 0)))?;
        s.connect(addr).await
    };
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("connect in time")
        .expect("connect")
}

/// Waits (bounded, all at once) for each connection to be refused with BUSY or to stay
/// silently open (one the server took and waits on for a Hello). Returns the connections and
/// the counts (busy, open, anything else).
async fn classify(conns: Vec<Raw>) -> (Vec<Raw>, usize, usize, Vec<(Option<ErrorCode>, bool)>) {
    let (mut busy, mut open, mut other) = (0, 0, Vec::new());
    let mut kept = Vec::with_capacity(conns.len());
    let mut set = tokio::task::JoinSet::new();
    for mut raw in conns {
        set.spawn(async move {
            let r = refusal(&mut raw, Duration::from_secs(20)).await;
            (raw, r)
        });
    }
    while let Some(r) = set.join_next().await {
        let (raw, r) = r.unwrap();
        match r {
            (Some(ErrorCode::BUSY), true) => busy += 1,
            (None, false) => open += 1,
            x => other.push(x),
        }
        kept.push(raw);
    }
    (kept, busy, open, other)
}

/// A burst of connections faster than the server accepts them overflows its listen backlog
/// (128: `TcpListener::bind` in server.rs). With SYN cookies on, as on most Linux hosts, the
/// overflowing clients see an established connection the server never had: no BUSY, no
/// timeout, just silence until their own timeouts. Each of them should have been answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_burst_beyond_the_listen_backlog_is_answered() {
    const N: usize = 2_000;
    const CAP: usize = 64;
    let _serial = serial();
    raise_nofile(65_536);
    let server = TestServer::start_with(|c| {
        c.max_connections = CAP;
        c.handshake_timeout = Duration::from_secs(120);
    })
    .await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..N {
        let addr = server.addr;
        set.spawn(async move { connect_from(i, addr).await });
    }
    let mut conns = Vec::with_capacity(N);
    while let Some(s) = set.join_next().await {
        conns.push(Raw::from_stream(s.unwrap()));
    }
    let (kept, busy, open, other) = classify(conns).await;
    assert!(other.is_empty(), "{other:?}");
    assert_eq!(
        (busy, open),
        (N - CAP, CAP),
        "{} connections were never seen by the server",
        open.saturating_sub(CAP)
    );
    drop(kept);
    assert_still_serves(&server, "after-burst.bin").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_capped_with_busy_then_served() {
    const N: usize = 10_000;
    const CAP: usize = 64;
    // Below the server's listen backlog (128, see the ignored burst test), with a pause for
    // the server to accept each batch: a flood faster than that loses connections in the
    // kernel, which is a different test.
    const BATCH: usize = 100;
    let _serial = serial();
    // Each connection costs two descriptors while the server holds it, one after it refused.
    let limit = raise_nofile(65_536);
    assert!(
        limit as usize >= N + 2 * CAP + 1024,
        "RLIMIT_NOFILE is {limit}: too low to hold {N} connections"
    );
    // A long handshake timeout, so that the accepted connections hold their slots throughout.
    let server = TestServer::start_with(|c| {
        c.max_connections = CAP;
        c.handshake_timeout = Duration::from_secs(120);
    })
    .await;
    let budget = Budget::start();

    let mut held = Vec::with_capacity(N);
    for batch in 0..N / BATCH {
        let mut set = tokio::task::JoinSet::new();
        for i in batch * BATCH..(batch + 1) * BATCH {
            let addr = server.addr;
            set.spawn(async move { connect_from(i, addr).await });
        }
        while let Some(s) = set.join_next().await {
            held.push(Raw::from_stream(s.unwrap()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(held.len(), N);

    // Every connection is either one of the CAP the server took (silent: it waits for a
    // Hello) or refused with BUSY and closed.
    let (kept, busy, open, other) = classify(held).await;
    assert!(other.is_empty(), "neither held nor BUSY: {other:?}");
    assert_eq!(open, CAP, "connections the server holds");
    assert_eq!(busy, N - CAP);

    // While they are held, a legitimate client is told BUSY, clearly and retryably.
    let r = ferry_net::client::list(&server.client(), "/", &ferry_core::NoReporter).await;
    match &r {
        Err(e @ SessionError::Remote { code, .. }) => {
            assert_eq!(*code, ErrorCode::BUSY);
            assert!(e.is_retryable());
        }
        other => panic!("expected BUSY, got {other:?}"),
    }

    drop(kept);
    budget.assert_fds_return(8, "10k connections").await;
    budget.assert_rss_grew_less_than(256, "10k connections");
    assert_still_serves(&server, "after-10k.bin").await;
    budget
        .assert_fds_return(8, "10k connections, after a put")
        .await;
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// slowloris

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_dropped_after_the_handshake_timeout_while_a_transfer_succeeds() {
    let _serial = serial();
    let server = TestServer::start_with(|c| {
        c.handshake_timeout = Duration::from_secs(2);
        c.idle_timeout = Duration::from_secs(3);
    })
    .await;
    let budget = Budget::start();
    let addr = server.addr;

    // Silent; one byte of a Hello; a whole Hello dripped a byte every 250 ms (longer in total
    // than the handshake timeout); authenticated but silent; a put whose data never joins.
    let mut silent = Vec::new();
    let mut one_byte = Vec::new();
    for _ in 0..25 {
        silent.push(Raw::connect(addr).await);
        let mut r = Raw::connect(addr).await;
        r.send_bytes(&[0x01]).await.unwrap();
        one_byte.push(r);
    }
    let mut hello = bytes::BytesMut::new();
    hello_control(TOKEN).encode(&mut hello);
    let hello = hello.to_vec();
    let mut drips = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let hello = hello.clone();
        drips.spawn(async move {
            let mut raw = Raw::connect(addr).await;
            // Bounded by the Hello's length; the server cuts it off long before the end.
            for b in &hello {
                if raw.send_bytes(std::slice::from_ref(b)).await.is_err() {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            // Everything sent: the server must have dropped us regardless.
            refusal(&mut raw, Duration::from_secs(10)).await.1
        });
    }
    let mut authed = Vec::new();
    for _ in 0..3 {
        authed.push(control(&server).await.0);
    }
    let (mut never_joins, _, _) = control(&server).await;
    never_joins
        .send(&Frame::PutRequest {
            dest: "/nj/".into(),
            sources: 1,
            opts: raw_opts(ExistingPolicy::Fail),
        })
        .await
        .unwrap();
    assert!(matches!(never_joins.expect(T).await, Frame::Ready { .. }));

    // While all of them hang: a real transfer.
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    for i in 0..20 {
        write(&tree.join(format!("f{i}")), &bytes(i * 10_000, i as u64));
    }
    let r = ferry_net::client::put(
        &server.client(),
        std::slice::from_ref(&tree),
        "/in/",
        reporter(),
    )
    .await
    .unwrap();
    assert!(r.is_success(), "{:?}", r.errors);
    assert_eq!(r.files, 20);
    assert_eq!(snapshot(&tree), snapshot(&server.root.join("in/t")));

    // Each one is dropped by the server: the pre-Hello ones silently, the authenticated ones
    // with TIMEOUT.
    for raw in silent.iter_mut().chain(one_byte.iter_mut()) {
        let (code, closed) = refusal(raw, Duration::from_secs(10)).await;
        assert!(closed && code.is_none(), "{code:?} {closed}");
    }
    for raw in authed.iter_mut() {
        let (code, closed) = refusal(raw, Duration::from_secs(10)).await;
        assert!(closed, "authenticated silent connection still open");
        assert_eq!(code, Some(ErrorCode::TIMEOUT));
    }
    let (code, closed) = refusal(&mut never_joins, Duration::from_secs(10)).await;
    assert!(closed, "put without data connections still open");
    assert_eq!(code, Some(ErrorCode::TIMEOUT));
    while let Some(dropped) = drips.join_next().await {
        assert!(dropped.unwrap(), "dripping Hello never dropped");
    }
    drop((silent, one_byte, authed, never_joins));

    budget.assert_fds_return(4, "slowloris").await;
    budget.assert_rss_grew_less_than(64, "slowloris");
    assert_still_serves(&server, "after-slowloris.bin").await;
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// a petabyte offer

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn petabyte_offer_refused_up_front_and_nothing_preallocated() {
    let _serial = serial();
    let server = TestServer::start().await;
    let budget = Budget::start();
    let pb = 1u64 << 50;

    // 1 PB: refused at once, naming the path and both sizes; data sent anyway is dropped.
    let (mut c, mut d) = raw_put(&server, "/").await;
    match offer(&mut c, 0, "huge.bin", pb).await {
        Decision::Fail { code, message } => {
            assert_eq!(code, ErrorCode::NO_SPACE, "{message}");
            assert!(message.contains("huge.bin"), "{message}");
            assert!(message.contains(&pb.to_string()), "{message}");
            assert!(message.contains("available"), "{message}");
        }
        other => panic!("1 PB offer: {other:?}"),
    }
    let chunk = bytes(BLOCK as usize, 1);
    for i in 0..4u64 {
        let _ = d
            .send(&partial_block(
                0,
                "huge.bin",
                pb,
                i * u64::from(BLOCK),
                &chunk,
            ))
            .await;
    }
    drop((c, d));

    // A large file the disk could hold (1 GiB, or half of what is free): accepted, but no
    // space is reserved for it. Two blocks arrive, then the client stops.
    let stat = statvfs(&server.root);
    let big = (1u64 << 30).min(stat / 2);
    assert!(big > 4 * u64::from(BLOCK), "file system too full to test");
    let (mut c, mut d) = raw_put(&server, "/").await;
    assert_eq!(offer(&mut c, 1, "big.bin", big).await, Decision::Send);
    for i in 0..2u64 {
        d.send(&partial_block(
            1,
            "big.bin",
            big,
            i * u64::from(BLOCK),
            &chunk,
        ))
        .await
        .unwrap();
    }
    // The temporary file holds what arrived, not the announced size.
    let deadline = Instant::now() + T;
    let (temp, allocated) = loop {
        let found = temp_names(&server.root).into_iter().find_map(|n| {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(server.root.join(&n)).ok()?;
            (n.ends_with(".part") && m.len() >= 2 * u64::from(BLOCK)).then(|| (n, m.blocks() * 512))
        });
        if let Some(f) = found {
            break f;
        }
        assert!(Instant::now() < deadline, "the two blocks never landed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        allocated < 8 << 20,
        "{temp}: {allocated} bytes allocated on disk for 128 KiB received"
    );
    drop((c, d));

    budget.assert_largest_below(16 << 20, "petabyte offer");
    budget.assert_rss_grew_less_than(64, "petabyte offer");
    assert!(!server.root.join("huge.bin").exists());
    assert!(!server.root.join("big.bin").exists());
    assert!(temp_names(&server.root).iter().all(|n| !n.contains("huge")));
    budget.assert_fds_return(4, "petabyte offer").await;
    assert_still_serves(&server, "after-petabyte.bin").await;
    server.stop().await;
}

/// Bytes available to unprivileged writers on the file system holding `path`.
fn statvfs(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path and a zeroed struct for the kernel to fill.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(p.as_ptr(), &mut st), 0);
        st.f_bavail * st.f_frsize
    }
}

// ---------------------------------------------------------------------------------------------
// bad names

/// Names no path may be: refused wherever they travel.
fn bad_names() -> Vec<(&'static str, String)> {
    vec![
        ("nul", "a\0b".into()),
        ("nul in dir", "dir\0/x".into()),
        ("nul at end", "x\0".into()),
        ("dotdot", "..".into()),
        ("dotdot prefix", "../x".into()),
        ("dotdot inside", "a/../../x".into()),
        ("long name", "n".repeat(256)),
        ("long name in dir", format!("d/{}/x", "n".repeat(300))),
    ]
}

/// Longer than the wire's 4096-byte path limit: the server refuses the frame itself.
fn overlong() -> String {
    "d/".repeat(2100) + "x"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_refused_in_requests_and_offers() {
    let _serial = serial();
    let server = TestServer::start().await;
    write(&server.root.join("d/x"), b"inside");
    let before_root = snapshot(&server.root);
    let before_beside = beside_root(&server);
    let budget = Budget::start();

    // Requests: put destination, get source, list path. Each is refused with a code that
    // says why (a path refusal, or a malformed frame for one beyond the wire limit), and an
    // Error frame that names the problem.
    let mut requests = Vec::new();
    for (what, name) in bad_names().into_iter().chain([("overlong", overlong())]) {
        let opts = raw_opts(ExistingPolicy::Fail);
        requests.push((
            format!("put {what}"),
            Frame::PutRequest {
                dest: name.clone(),
                sources: 1,
                opts: opts.clone(),
            },
        ));
        requests.push((
            format!("get {what}"),
            Frame::GetRequest {
                src: name.clone(),
                opts,
            },
        ));
        requests.push((format!("list {what}"), Frame::ListRequest { path: name }));
    }
    for (what, request) in requests {
        let (mut c, _, _) = control(&server).await;
        c.send(&request).await.unwrap();
        let (err, closed) = refusal_message(&mut c, T).await;
        assert!(closed, "{what}: still open");
        let (code, message) = err.unwrap_or_else(|| panic!("{what}: closed without a reason"));
        assert!(
            matches!(code, ErrorCode::PERMISSION | ErrorCode::PROTOCOL),
            "{what}: {code} {message}"
        );
        assert!(!message.is_empty());
    }
    // Absolute and doubled slashes in a request are the user's way of naming a path under the
    // root: resolved beneath it, never against the server's own `/`.
    for path in ["/etc/passwd", "//etc//passwd"] {
        let r = ferry_net::client::list(&server.client(), path, &ferry_core::NoReporter).await;
        assert!(
            matches!(&r, Err(SessionError::Remote { code, .. }) if *code == ErrorCode::NOT_FOUND),
            "{path}: {r:?}"
        );
    }

    // Offers: a wire path must be plainly relative, so here absolute and empty components are
    // refused too. One session takes every bad name; each gets its own clear refusal.
    let (mut c, mut d) = raw_put(&server, "/").await;
    let mut offer_names = bad_names();
    offer_names.extend([
        ("absolute", "/etc/evil".to_owned()),
        ("empty component", "a//b".to_owned()),
        ("trailing slash", "a/".to_owned()),
        ("empty", String::new()),
        ("dot", "./x".to_owned()),
    ]);
    for (i, (what, name)) in offer_names.iter().enumerate() {
        match offer(&mut c, i as u64, name, 5).await {
            Decision::Fail { code, message } => {
                assert_eq!(code, ErrorCode::PERMISSION, "{what}: {message}");
                assert!(message.contains("path"), "{what}: {message}");
            }
            other => panic!("offer {what}: {other:?}"),
        }
    }
    // The session survives all of that and still stores a good file.
    let good = offer_names.len() as u64;
    let data = b"good".to_vec();
    send_offered(
        &mut c,
        &mut d,
        raw_block(good, "good.txt", &data, 0, data.len()),
    )
    .await;
    c.send(&Frame::Sent {
        files: good + 1,
        dirs: 0,
        symlinks: 0,
        bytes: 4,
    })
    .await
    .unwrap();
    let summary = loop {
        match c.expect(Duration::from_secs(10)).await {
            Frame::Complete(s) => break s,
            Frame::FileFailed { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!((summary.files, summary.failed), (1, good), "{summary:?}");
    drop((c, d));
    // An offer beyond the wire's path limit is a malformed frame: the session ends.
    let (mut c, d) = raw_put(&server, "/").await;
    c.send(&Frame::Offer {
        entries: vec![ferry_proto::OfferEntry {
            file: FileId(0),
            path: overlong(),
            size: 1,
            mode: 0o644,
            mtime_ns: 0,
        }],
    })
    .await
    .unwrap();
    let (code, closed) = refusal(&mut c, T).await;
    assert!(closed && code == Some(ErrorCode::PROTOCOL), "{code:?}");
    drop((c, d));

    // Nothing was created outside, nothing under a cut-short name: the root holds what it held
    // plus the one good file.
    let mut after = snapshot(&server.root);
    assert_eq!(
        std::fs::read(server.root.join("good.txt")).unwrap(),
        b"good"
    );
    after.remove("good.txt");
    assert_eq!(after, before_root);
    assert_eq!(beside_root(&server), before_beside);
    budget.assert_fds_return(4, "bad names").await;
    assert_still_serves(&server, "after-names.bin").await;
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// symlinks swapped in during a transfer

/// Regular files under `dir` (symlinks not followed, temporaries excluded), relative paths.
fn regular_files(dir: &Path) -> Vec<String> {
    names(dir)
        .into_iter()
        .filter(|n| {
            !n.rsplit('/').next().unwrap_or("").starts_with(".ferry-")
                && std::fs::symlink_metadata(dir.join(n)).is_ok_and(|m| m.is_file())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_swapped_into_put_destination_never_escapes() {
    let _serial = serial();
    let server = TestServer::start_in(fast_tempdir(), |_| {}).await;
    let outside = server.root.parent().unwrap().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let dest = server.root.join("dest");
    let sub = dest.join("sub");
    std::fs::create_dir_all(sub.join("d3")).unwrap();
    // Links that lead out, next to what they replace: absolute, and relative through `..`.
    let sub_link = dest.join(".swap-sub");
    std::os::unix::fs::symlink(&outside, &sub_link).unwrap();
    let deep_link = dest.join(".swap-d3");
    std::os::unix::fs::symlink("../../outside", &deep_link).unwrap();

    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("sub");
    let mut total = 0;
    for d in 0..40 {
        for f in 0..5 {
            write(
                &tree.join(format!("d{d}/f{f}")),
                &bytes(1000 + d * 100 + f, (d * 100 + f) as u64),
            );
            total += 1;
        }
    }
    let budget = Budget::start();
    let mut swaps = 0;
    let mut refused_somewhere = false;
    // At least three rounds, more (bounded) until the race has bitten at least once.
    for round in 0..12 {
        if round >= 3 && refused_somewhere {
            break;
        }
        // A clean destination each round, except for the directories the racer swaps.
        for e in std::fs::read_dir(&sub).unwrap() {
            let p = e.unwrap().path();
            if p.file_name().unwrap() != "d3" {
                std::fs::remove_dir_all(&p).unwrap();
            }
        }
        for e in std::fs::read_dir(sub.join("d3")).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        let racer = Racer::start(vec![
            (sub.clone(), sub_link.clone()),
            (sub.join("d3"), deep_link.clone()),
        ]);
        let mut cfg = server.client();
        cfg.opts.existing = ExistingPolicy::Overwrite;
        let r =
            ferry_net::client::put(&cfg, std::slice::from_ref(&tree), "/dest/", reporter()).await;
        swaps += racer.finish();
        match &r {
            Ok(rep) => {
                // Every file is stored or failed (directories that failed count too).
                assert!(rep.files <= total, "round {round}: {rep:?}");
                assert!(rep.files + rep.failed >= total, "round {round}: {rep:?}");
                // Every failure comes with a reason that names what it concerned.
                assert_eq!(rep.failed > 0, !rep.errors.is_empty(), "{:?}", rep.errors);
                for e in &rep.errors {
                    assert!(e.contains("sub"), "round {round}: {e}");
                }
                refused_somewhere |= rep.failed > 0;
            }
            // The request itself may be refused when it lands on a swapped `sub`; then it
            // says so.
            Err(SessionError::Remote { code, message }) => {
                assert!(
                    matches!(*code, ErrorCode::PERMISSION | ErrorCode::NOT_FOUND),
                    "round {round}: {code} {message}"
                );
                refused_somewhere = true;
            }
            Err(e) => panic!("round {round}: {e}"),
        }
        // What arrived is intact and where it belongs.
        assert!(std::fs::symlink_metadata(&sub).unwrap().is_dir());
        for rel in regular_files(&sub) {
            let want = std::fs::read(tree.join(&rel)).unwrap();
            assert_eq!(std::fs::read(sub.join(&rel)).unwrap(), want, "{rel}");
        }
        if let Ok(rep) = &r {
            assert_eq!(regular_files(&sub).len() as u64, rep.files, "round {round}");
        }
        assert_eq!(names(&outside), Vec::<String>::new(), "written outside");
    }
    assert!(swaps > 0, "the racer never swapped anything");
    eprintln!("{swaps} swaps; some entry refused: {refused_somewhere}");
    assert_eq!(
        beside_root(&server),
        vec!["outside".to_owned()],
        "something appeared beside the root"
    );
    budget.assert_fds_return(8, "put race").await;
    assert_still_serves(&server, "after-put-race.bin").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_swapped_into_get_source_never_leaks_a_secret() {
    let _serial = serial();
    let server = TestServer::start_in(fast_tempdir(), |_| {}).await;
    // Outside the root: files with the same names as inside, holding the secret.
    let outside = server.root.parent().unwrap().join("outside");
    for f in 0..10 {
        write(&outside.join(format!("f{f}")), SECRET);
    }
    let src = server.root.join("src");
    for d in 0..8 {
        for f in 0..30 {
            write(
                &src.join(format!("d{d}/f{f}")),
                &bytes(2000 + f * 10, (d * 10 + f) as u64),
            );
        }
    }
    let files_of = |dir: &Path| {
        let mut m = snapshot(dir);
        m.retain(|_, (kind, ..)| *kind == 'f');
        m
    };
    let reference = files_of(&src);
    let link_abs = server.root.join(".swap-abs");
    std::os::unix::fs::symlink(&outside, &link_abs).unwrap();
    let link_rel = server.root.join(".swap-rel");
    std::os::unix::fs::symlink("../outside", &link_rel).unwrap();
    let link_deep = src.join(".swap-deep");
    std::os::unix::fs::symlink("../../outside", &link_deep).unwrap();

    let budget = Budget::start();
    let mut swaps = 0;
    let mut failed = 0;
    let mut links = 0;
    // At least three rounds, more (bounded) until the race has visibly bitten: an entry
    // refused, or a swapped-in link sent as what it is (a link, never its target's content).
    for round in 0..12 {
        if round >= 3 && failed + links > 0 {
            break;
        }
        let got = tempfile::tempdir().unwrap();
        let racer = Racer::start(vec![
            (src.join("d2"), link_abs.clone()),
            (src.join("d5"), link_rel.clone()),
            (src.join("d7"), link_deep.clone()),
        ]);
        let r = ferry_net::client::get(&server.client(), "src", got.path(), reporter()).await;
        swaps += racer.finish();
        if let Ok(rep) = &r {
            failed += rep.failed;
        }
        // The secret never arrives, under any name.
        assert!(
            !any_file_contains(got.path(), SECRET),
            "round {round}: leaked"
        );
        links += names(got.path())
            .iter()
            .filter(|n| {
                std::fs::symlink_metadata(got.path().join(n)).is_ok_and(|m| m.is_symlink())
                    && !n.ends_with(".swap-deep")
            })
            .count() as u64;
        match &r {
            Ok(rep) => {
                for e in &rep.errors {
                    assert!(!e.is_empty());
                }
                // What did arrive is the real content of the same file.
                let base = if got.path().join("src").is_dir() {
                    got.path().join("src")
                } else {
                    got.path().to_path_buf()
                };
                // The racer renames d7 and the link `.swap-deep` into each other's place, so a
                // file may arrive under either name; its content is d7's, never the secret's.
                for rel in regular_files(&base) {
                    let got = blake3::hash(&std::fs::read(base.join(&rel)).unwrap())
                        .to_hex()
                        .to_string();
                    let want = |r: &str| reference.get(r).map(|(_, d, ..)| d.clone());
                    let swapped = rel.replacen(".swap-deep", "d7", 1);
                    assert!(
                        want(&rel) == Some(got.clone()) || want(&swapped) == Some(got),
                        "round {round}: {rel} arrived with content of no source file"
                    );
                }
            }
            Err(SessionError::Remote { code, message }) => {
                assert!(
                    matches!(*code, ErrorCode::PERMISSION | ErrorCode::NOT_FOUND),
                    "round {round}: {code} {message}"
                );
            }
            Err(e) => panic!("round {round}: {e}"),
        }
    }
    assert!(swaps > 0, "the racer never swapped anything");
    eprintln!("{swaps} swaps; {failed} entries refused; {links} swapped links arrived as links");
    // The source and the secret are as they were.
    assert_eq!(files_of(&src), reference);
    for f in 0..10 {
        assert_eq!(
            std::fs::read(outside.join(format!("f{f}"))).unwrap(),
            SECRET
        );
    }
    budget.assert_fds_return(8, "get race").await;
    assert_still_serves(&server, "after-get-race.bin").await;
    server.stop().await;
}
