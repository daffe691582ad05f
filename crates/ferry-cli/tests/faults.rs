//! Fault injection, end to end: the real `ferry` binary against a real `ferry serve`, with the
//! faults a data transfer node meets in practice — a server killed with SIGKILL, connections
//! black-holed or reset in the middle of a transfer (on the ferry-netem WAN bed), random loss on
//! a long path, a destination file system that fills up, a source file that changes while it is
//! sent, 32 clients at once against one server, and a server host that stops allowing TCP Fast
//! Open while a client still holds its cookies.
//!
//! Every process is a child killed on drop, every wait is bounded, beds and mounts are torn down
//! on drop (also on panic). The tests run one at a time (a shared lock): they move hundreds of
//! MiB and measure timings on a 2-core machine, where running them side by side would make both
//! the numbers and the wall time worse. Each prints what it measured (`--nocapture` shows it).
//! Tests that need root, network namespaces or `mount` say why and return when they cannot run,
//! or fail when `CI` is set (`ferry_netem::needs`).

mod util;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_netem::{needs, BedConfig, Host, Regime, TestBed};
use serde_json::Value;
use util::*;
// The shared helper under the name these tests were written with.
use util::u64_field as u64_of;

const MIB: u64 = 1 << 20;

static SERIAL: Mutex<()> = Mutex::new(());

/// Held for the whole of a test: these tests run one at a time, across threads (`cargo test`)
/// and across processes (`cargo nextest` runs each test in its own process), through a mutex
/// and an advisory lock on this test binary itself, which every one of those processes runs
/// and which exists anyway: a lock file of its own would be left behind in the temp dir. A
/// panicking test does not block the others (poisoning is ignored; the file lock goes with the
/// process's fd).
struct Serial {
    _file: Option<fs::File>,
    _guard: MutexGuard<'static, ()>,
}

fn serial() -> Serial {
    use std::os::fd::AsRawFd;
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = std::env::current_exe().expect("the test binary's path");
    // Read-only: an executable being run cannot be opened for writing, and flock needs neither.
    let file = fs::File::open(&path).ok();
    if let Some(f) = &file {
        // Bounded: after 2 minutes go ahead rather than wait on (the numbers may then suffer),
        // well before nextest's own limit (3 minutes) would end a test still waiting.
        let deadline = Instant::now() + Duration::from_secs(120);
        // SAFETY: flock on an fd we own, with valid flags.
        while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if Instant::now() >= deadline {
                eprintln!(
                    "faults: {} still locked after 2 min; going ahead",
                    path.display()
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Serial {
        _file: file,
        _guard: guard,
    }
}

/// The lock that keeps these tests apart leaves nothing in the temp dir (it once left
/// `ferry-cli-faults-tests.lock` there after every run) and still excludes another process.
#[test]
fn serial_lock_leaves_no_file_and_excludes_other_processes() {
    use std::os::unix::fs::MetadataExt;
    let held = serial();
    let exe = std::env::current_exe().unwrap();
    let locked = held
        ._file
        .as_ref()
        .expect("the lock is held")
        .metadata()
        .unwrap();
    let exe_meta = fs::metadata(&exe).unwrap();
    assert_eq!(
        (locked.dev(), locked.ino()),
        (exe_meta.dev(), exe_meta.ino()),
        "the lock is held on a file of its own, which would stay behind"
    );
    // Another process (flock(1)) cannot take the lock while this test holds it.
    let other = Command::new("flock")
        .args(["-n", "-s"])
        .arg(&exe)
        .arg("true")
        .status()
        .expect("running flock(1)");
    assert!(!other.success(), "another process took the lock");
}

// ---------------------------------------------------------------------------------------------
// helpers

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A `ferry serve` on a given address (so that it can be restarted on the same port), in the
/// host's namespace or in a bed's server namespace; killed (SIGKILL) when dropped.
struct Serve {
    guard: ChildGuard,
    listen: String,
    log: PathBuf,
    token: String,
}

impl Serve {
    /// Starts the server with the sandbox's token file and waits (≤ 10 s) for its "serving"
    /// line; an early exit (e.g. "cannot listen") is an `Err` with its log.
    fn try_start(
        sb: &Sandbox,
        root: &Path,
        listen: &str,
        bed: Option<&TestBed>,
        extra: &[&str],
    ) -> Result<Self, String> {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let log = sb.path(&format!("faults-serve-{n}.log"));
        let token_file = sb.path("token");
        let mut cmd = sb.serve_cmd(root, listen, Some(&token_file));
        cmd.args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        let child = match bed {
            Some(b) => b.spawn_in(Host::Server, cmd),
            None => cmd.spawn(),
        }
        .expect("spawning ferry serve");
        let mut guard = ChildGuard(Some(child));
        wait_serving(&mut guard, &log, listen, Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        let token = fs::read_to_string(&token_file)
            .expect("token file after start")
            .trim()
            .to_owned();
        Ok(Self {
            guard,
            listen: listen.to_owned(),
            log,
            token,
        })
    }

    fn start(
        sb: &Sandbox,
        root: &Path,
        listen: &str,
        bed: Option<&TestBed>,
        extra: &[&str],
    ) -> Self {
        Self::try_start(sb, root, listen, bed, extra).unwrap_or_else(|e| panic!("{e}"))
    }

    fn remote(&self, path: &str) -> String {
        format!("{}:{path}", self.listen)
    }

    fn pid(&self) -> u32 {
        self.guard.pid()
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A client running in the background, its output going to files (no pipe can fill up).
struct Bg {
    guard: ChildGuard,
    out: PathBuf,
    err: PathBuf,
    what: String,
}

fn spawn_bg(sb: &Sandbox, mut cmd: Command, bed: Option<&TestBed>) -> Bg {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let (out, err) = (
        sb.path(&format!("faults-client-{n}.out")),
        sb.path(&format!("faults-client-{n}.err")),
    );
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap());
    let child = match bed {
        Some(b) => b.spawn_in(Host::Client, cmd),
        None => cmd.spawn(),
    }
    .expect("spawning ferry");
    Bg {
        guard: ChildGuard(Some(child)),
        out,
        err,
        what,
    }
}

impl Bg {
    fn running(&mut self) -> bool {
        match self.guard.0.as_mut() {
            Some(c) => c.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Waits (bounded) for the exit; on timeout the child is killed and the test fails.
    fn wait(mut self, timeout: Duration) -> Out {
        let Some(status) = self.guard.wait_for(timeout) else {
            panic!(
                "{} did not finish within {timeout:?}\n--- stderr ---\n{}",
                self.what,
                self.stderr()
            );
        };
        Out {
            status,
            stdout: fs::read_to_string(&self.out).unwrap_or_default(),
            stderr: self.stderr(),
        }
    }
}

/// Bytes the last attempt wrote to its data connections (frames, headers included).
fn wire_bytes(v: &Value) -> u64 {
    v["streams"]
        .as_array()
        .unwrap_or_else(|| panic!("no streams in {v}"))
        .iter()
        .map(|s| s["bytes"].as_u64().expect("streams[].bytes"))
        .sum()
}

/// What an interrupted transfer left in `dir`: temporary files and their journals.
#[derive(Debug, Default)]
struct Leftovers {
    names: Vec<String>,
    /// Sum of the sizes of `.ferry-*.part` files (their largest written offset: an upper bound
    /// of what arrived, since blocks are written at their offsets).
    part_bytes: u64,
    /// The (last) `.part` file.
    part: Option<PathBuf>,
    /// Blocks (offset → length) the `.journal` files record as written and verified, records
    /// deduplicated by offset; not checked against the data (the server does that on resume).
    journal: BTreeMap<u64, u64>,
    /// Their total length.
    journaled: u64,
}

fn leftovers(dir: &Path) -> Leftovers {
    let mut l = Leftovers::default();
    for n in names(dir) {
        if !n.starts_with(".ferry-") {
            continue;
        }
        let p = dir.join(&n);
        if n.ends_with(".part") {
            l.part_bytes += fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            l.part = Some(p);
        } else if n.ends_with(".journal") {
            l.journal
                .extend(journal_blocks(&fs::read(&p).unwrap_or_default()));
        }
        l.names.push(n);
    }
    l.journaled = l.journal.values().sum();
    l
}

/// The blocks a resume journal records (layout in docs/PROTOCOL.md: header = magic 8,
/// version 2, body_len 2, body, crc 8; then 37-byte records tag 1, offset 8, len 4, digest 16,
/// crc 8).
fn journal_blocks(j: &[u8]) -> BTreeMap<u64, u64> {
    let mut blocks = BTreeMap::new();
    if j.len() < 12 || &j[..8] != b"FERRYJNL" {
        return blocks;
    }
    let body_len = u16::from_be_bytes([j[10], j[11]]) as usize;
    let mut at = 12 + body_len + 8;
    while at + 37 <= j.len() {
        let r = &j[at..at + 37];
        if r[0] != 1 {
            break;
        }
        let offset = u64::from_be_bytes(r[1..9].try_into().unwrap());
        let len = u32::from_be_bytes(r[9..13].try_into().unwrap());
        blocks.insert(offset, u64::from(len));
        at += 37;
    }
    blocks
}

/// Data below the part file's size that the journal does not record but that is in the part
/// file intact, byte for byte as in `source` (compared in 64 KiB granules): data that had
/// arrived and that a resume nevertheless sends again. Holes (blocks still on the wire at the
/// interruption) and blocks whose write was cut short do not count. Returns (bytes, runs of
/// intact granules).
fn intact_unjournaled(left: &Leftovers, source: &Path) -> (u64, u64) {
    let Some(part) = &left.part else {
        return (0, 0);
    };
    let (part, src) = (
        fs::File::open(part).unwrap(),
        fs::File::open(source).unwrap(),
    );
    let end = left.part_bytes.min(src.metadata().unwrap().len());
    // The part file outside every journal record: blocks are cut to any length (smaller at
    // both ends of a transfer), so the gaps are found from the records, not from block sizes.
    let mut gaps = Vec::new();
    let mut at = 0;
    for (&offset, &len) in &left.journal {
        if offset > at {
            gaps.push((at, offset.min(end)));
        }
        at = at.max(offset + len);
    }
    if at < end {
        gaps.push((at, end));
    }
    let (mut bytes, mut runs) = (0, 0);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (start, stop) in gaps {
        let mut offset = start;
        let mut in_run = false;
        while offset < stop {
            let len = GRANULE.min(stop - offset);
            a.resize(len as usize, 0);
            b.resize(len as usize, 0);
            src.read_exact_at(&mut b, offset).unwrap();
            let same = part.read_exact_at(&mut a, offset).is_ok() && a == b;
            if same {
                bytes += len;
                runs += u64::from(!in_run);
            }
            in_run = same;
            offset += len;
        }
    }
    (bytes, runs)
}

/// The unit in which `intact_unjournaled` compares unrecorded data with the source.
const GRANULE: u64 = 64 << 10;

/// How far the server got with `name` in `dir`: the final file's size once it exists, else
/// the size of the temporary files.
fn received(dir: &Path, name: &str) -> u64 {
    match fs::metadata(dir.join(name)) {
        Ok(m) => m.len(),
        Err(_) => leftovers(dir).part_bytes,
    }
}

/// A netem bed, or None (after saying why; a failure under CI) when this machine cannot run one.
fn bed_or_skip(test: &str, config: BedConfig) -> Option<TestBed> {
    needs(test, ferry_netem::can_run())?;
    Some(TestBed::up(config).unwrap_or_else(|e| panic!("{test}: bed did not come up: {e:#}")))
}

fn bed_config(rtt_ms: u64, rate_bps: Option<u64>, loss: f64) -> BedConfig {
    BedConfig {
        rtt: Duration::from_millis(rtt_ms),
        rate_bps,
        loss,
        mtu: 9000,
        regime: Regime::Default,
        queue_bytes: None,
        initial_window: None,
        fast_open: false,
    }
}

/// Where ferry serve listens inside a bed.
fn bed_listen(bed: &TestBed) -> String {
    format!("{}:7070", bed.server_addr())
}

/// A tmpfs mounted for one test, unmounted when dropped (lazily if something still holds it).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Self, String> {
        fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mounting a tmpfs needs root: mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self(at.to_path_buf()))
    }

    fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .expect("running mount");
        assert!(st.success(), "remount size={size} failed");
    }

    /// Bytes an unprivileged writer may still use (statvfs `f_bavail` via `stat -f`), the
    /// figure the server's offer-time check reads.
    fn available(&self) -> u64 {
        let out = Command::new("stat")
            .args(["-f", "-c", "%S %a"])
            .arg(&self.0)
            .output()
            .expect("running stat -f");
        let t = String::from_utf8_lossy(&out.stdout);
        let v: Vec<u64> = t.split_whitespace().map(|x| x.parse().unwrap()).collect();
        v[0] * v[1]
    }

    /// Bytes in use on the file system (statvfs via `stat -f`).
    fn used(&self) -> u64 {
        let out = Command::new("stat")
            .args(["-f", "-c", "%S %b %f"])
            .arg(&self.0)
            .output()
            .expect("running stat -f");
        let t = String::from_utf8_lossy(&out.stdout);
        let v: Vec<u64> = t.split_whitespace().map(|x| x.parse().unwrap()).collect();
        v[0] * (v[1] - v[2])
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn fd_count(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A `/proc/PID/status` field in KiB (VmRSS, VmHWM).
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn mib(b: u64) -> f64 {
    b as f64 / MIB as f64
}

// ---------------------------------------------------------------------------------------------
// 1. kill -9 the server in the middle of a 1 GiB put

/// The most bytes below a partial copy's size that can be missing when its session dies: a
/// block may be arriving on each stream, waiting in the queue between the connections and the
/// writers (two frames per writer, `engine::drive_receiver`), or being written by each writer,
/// while a later block is already written; plus the last block, which always goes again.
/// (Without the queue the bound was 72 MiB, and a kill caught 77 MiB missing.)
fn unwritten_bound(streams: u64, block: u64, headers: u64) -> i64 {
    let writers = 4; // ferry serve's receiver threads (ServerConfig::writers)
    let queued = 2 * writers;
    ((streams + writers + queued) * block + block + headers) as i64
}

/// Starts the server again on the same root and port. The old listening socket died with the
/// process; allow a few tries in case the port is briefly unavailable.
fn restart_on(sb: &Sandbox, root: &Path, listen: &str) -> Serve {
    let mut tries = 0;
    loop {
        match Serve::try_start(sb, root, listen, None, &[]) {
            Ok(s) => break s,
            Err(e) if e.contains("cannot listen") && tries < 25 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("restart on {listen}: {e}"),
        }
    }
}

/// What the re-run after the server's SIGKILL sent again (its report `v`, for a file of
/// `size` bytes of which the server kept `left`, `intact` of it whole but not journaled),
/// against the bounds: a block per stream and one more, plus headers.
fn resent_after_kill9(v: &Value, size: u64, left: &Leftovers, intact: u64, took: Duration) {
    let sent2 = wire_bytes(v);
    let block = u64_of(v, "block_size");
    let streams = v["streams"].as_array().unwrap().len() as u64;
    let resent_ub = sent2 as i64 - (size - left.part_bytes) as i64;
    let beyond_journal = sent2 as i64 - (size - left.journaled) as i64;
    let redundant = beyond_journal + intact as i64;
    let headers = 64 << 10;
    let bound = (streams * block + block + headers) as i64;
    let bound_ub = unwritten_bound(streams, block, headers);
    let m = |b: i64| b as f64 / MIB as f64;
    eprintln!(
        "kill9: re-run took {:?} ({} attempt(s)), wrote {sent2} bytes ({:.1} MiB) to the wire; \
         sent again: exactly {redundant} bytes ({:.2} MiB; bound {:.2} MiB = {streams} streams \
         x {} MiB + 1 block + headers), upper bound vs the part size {resent_ub} bytes \
         ({:.2} MiB); beyond what the journal proved {beyond_journal} bytes",
        took,
        u64_of(v, "attempts"),
        mib(sent2),
        m(redundant),
        m(bound),
        block / MIB,
        m(resent_ub)
    );
    assert_eq!(block, 8 * MIB, "the session kept 8 MiB blocks");
    assert!(
        redundant <= bound,
        "the re-run sent {redundant} bytes that were already on the server (bound {bound})"
    );
    assert!(
        resent_ub <= bound_ub,
        "upper bound of bytes sent again {resent_ub} > {bound_ub}"
    );
    // The journal's proven blocks are not sent again; the last block always is (file digest).
    assert!(
        beyond_journal <= (block + headers) as i64,
        "the re-run sent {beyond_journal} bytes beyond what the journal did not prove"
    );
}

/// The server is SIGKILLed halfway through a 1 GiB put (4 streams, 8 MiB blocks). The client
/// (`--retry-for 0`) fails with a hint to re-run; the server is restarted on the same root and
/// port; the same put completes byte-identical and sends again little of what had arrived.
///
/// How "sent again" is measured. The first client cannot report what it wrote (it fails with
/// the server), so the measure is taken on the server's side, between the kill and the re-run:
///
/// - `part` = the `.part` file's size, the largest offset written: an upper bound of what
///   arrived. `resent_ub = sum(streams.bytes of the re-run) − (size − part)` is then an upper
///   bound of the bytes sent again; it also counts holes below the largest offset (blocks
///   still on the wire or cut short by the kill), which had not arrived at all.
/// - exact: the blocks below `part` that the journal does not record are compared with the
///   source; those intact had arrived although unproven (killed between the write and the
///   journal append). `redundant = sent − (size − journaled − intact)`: the bytes the re-run
///   sent that were already on the server's disk, frame headers included.
///
/// `redundant` must be at most streams × block size + one block (the last block always goes
/// again: it carries the file digest) + 64 KiB of frame headers; and nothing the journal
/// proved may be sent again beyond the last block. `resent_ub` is reported and held to the
/// structural bound [`unwritten_bound`].
#[test]
fn kill9_server_mid_put_resumes_after_restart() {
    let _serial = serial();
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let size: u64 = 1 << 30;
    let file = sb.path("src/big.bin");
    let t = Instant::now();
    write_pattern(&file, size, 101);
    eprintln!(
        "kill9: wrote {} MiB source in {:?}",
        size / MIB,
        t.elapsed()
    );

    let listen = format!("127.0.0.1:{}", free_port());
    let mut srv = Serve::start(&sb, &root, &listen, None, &[]);
    let token = srv.token.clone();
    let put = || {
        let mut c = sb.client(&token);
        c.args([
            "put",
            "--streams",
            "4",
            "--block-size",
            "8M",
            "--retry-for",
            "0",
            "--json",
        ])
        .arg(&file)
        .arg(format!("{listen}:/big.bin"));
        c
    };

    let mut c1 = spawn_bg(&sb, put(), None);
    let t1 = Instant::now();
    let mid = wait_until(Duration::from_secs(60), || {
        received(&root, "big.bin") >= size * 45 / 100 || !c1.running()
    });
    assert!(mid, "the put made no progress in 60 s: {}", c1.stderr());
    assert!(
        c1.running() && !root.join("big.bin").exists(),
        "the put finished before the server could be killed"
    );
    srv.guard.child().kill().expect("SIGKILL the server");
    srv.guard
        .wait_for(Duration::from_secs(5))
        .expect("killed server reaped");
    let killed_after = t1.elapsed();
    let left = leftovers(&root);
    let (intact, intact_runs) = intact_unjournaled(&left, &file);
    let holes = left.part_bytes.saturating_sub(left.journaled + intact);
    eprintln!(
        "kill9: server SIGKILLed {killed_after:?} into the put; left {:?}: part file {:.1} MiB, \
         journal proves {:.1} MiB ({} blocks), {intact_runs} runs of data intact but not \
         journaled ({:.1} MiB), {:.1} MiB below the part size missing or cut short",
        left.names,
        mib(left.part_bytes),
        mib(left.journaled),
        left.journal.len(),
        mib(intact),
        mib(holes)
    );

    let out1 = c1.wait(Duration::from_secs(30));
    assert_code(&out1, 1);
    assert!(
        out1.stderr.contains("resume"),
        "the failed put says a re-run resumes:\n{out1:?}"
    );
    assert!(
        !root.join("big.bin").exists(),
        "nothing under the final name"
    );
    assert!(
        left.part_bytes > 0 && left.part_bytes < size && left.journaled > 0,
        "a journaled partial copy is kept: {left:?}"
    );
    assert!(left.journaled <= left.part_bytes);

    // Same root, same port.
    let srv2 = restart_on(&sb, &root, &listen);
    assert!(
        wait_until(Duration::from_secs(5), || srv2
            .log()
            .contains("kept for resume")),
        "the restarted server reports the partial copy it keeps:\n{}",
        srv2.log()
    );

    let t2 = Instant::now();
    let out2 = run(&mut put(), Duration::from_secs(90));
    assert_code(&out2, 0);
    let v = one_json(&out2.stdout);
    assert_eq!(
        file_b3(&root.join("big.bin")),
        file_b3(&file),
        "byte-identical"
    );
    assert_eq!(
        names(&root),
        ["big.bin"],
        "temporary files and journal removed"
    );

    resent_after_kill9(&v, size, &left, intact, t2.elapsed());
}

// ---------------------------------------------------------------------------------------------
// 2. connections black-holed, or reset, in the middle of a transfer (netem bed)

const BED_FILE: u64 = 200 * MIB;

/// A put of `file` from the bed's client to `dest` on its server.
fn bed_put(sb: &Sandbox, srv: &Serve, file: &Path, dest: &str, retry_for: &str) -> Command {
    let mut c = sb.client(&srv.token);
    c.args(["put", "--json", "--retry-for", retry_for])
        .arg(file)
        .arg(srv.remote(dest));
    c
}

/// At RTT 20 ms and 200 Mbit/s, every packet is dropped for 5 s after ~30% of a 200 MiB put.
/// The same client process finishes (exit 0), byte-identical. Reported: the time from the end
/// of the outage until the server writes new data, and the total wall time minus a clean run's
/// time minus the 5 s outage.
#[test]
fn blackhole_5s_mid_transfer_same_process_finishes() {
    let _serial = serial();
    let test = "blackhole_5s_mid_transfer_same_process_finishes";
    let Some(bed) = bed_or_skip(test, bed_config(20, Some(200_000_000), 0.0)) else {
        return;
    };
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let file = sb.path("src/big.bin");
    write_pattern(&file, BED_FILE, 202);
    let srv = Serve::start(&sb, &root, &bed_listen(&bed), Some(&bed), &[]);

    // A clean run first: what the transfer costs on this link without a fault.
    let t = Instant::now();
    let mut cmd = bed_put(&sb, &srv, &file, "/clean.bin", "0");
    let clean = run(
        bed.enter(Host::Client, &mut cmd).unwrap(),
        Duration::from_secs(120),
    );
    let clean_wall = t.elapsed();
    assert_code(&clean, 0);
    assert_eq!(file_b3(&root.join("clean.bin")), file_b3(&file));

    let mut c = spawn_bg(&sb, bed_put(&sb, &srv, &file, "/big.bin", "2m"), Some(&bed));
    let t0 = Instant::now();
    let started = wait_until(Duration::from_secs(60), || {
        received(&root, "big.bin") >= BED_FILE * 30 / 100 || !c.running()
    });
    assert!(
        started && c.running(),
        "no 30% mid-transfer point: {}",
        c.stderr()
    );
    let at_on = received(&root, "big.bin");
    bed.set_blackhole(true);
    let on_at = t0.elapsed();
    std::thread::sleep(Duration::from_secs(5));
    let at_off = received(&root, "big.bin");
    bed.set_blackhole(false);
    let lifted = Instant::now();
    let moved = wait_until(Duration::from_secs(60), || {
        received(&root, "big.bin") > at_off || !c.running()
    });
    let resume_latency = lifted.elapsed();
    let out = c.wait(Duration::from_secs(120));
    let wall = t0.elapsed();
    assert_code(&out, 0);
    assert_eq!(
        file_b3(&root.join("big.bin")),
        file_b3(&file),
        "byte-identical"
    );
    let v = one_json(&out.stdout);
    let attempts = u64_of(&v, "attempts");
    let overhead = wall.as_secs_f64() - clean_wall.as_secs_f64() - 5.0;
    let retrans: u64 = v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["tcp"]["total_retrans"].as_u64())
        .sum();
    eprintln!(
        "blackhole: clean run {clean_wall:?}; outage from {on_at:?} at {:.1} MiB received \
         ({:.1} MiB by its end); server wrote new data {resume_latency:?} after the outage \
         ended; faulted run {wall:?} = clean + 5 s + {overhead:.2} s; attempts {attempts}; \
         TCP retransmits of the last attempt {retrans}",
        mib(at_on),
        mib(at_off)
    );
    assert!(
        moved,
        "no progress within 60 s of the outage ending ({:.1} MiB on the server)",
        mib(received(&root, "big.bin"))
    );
    // Each stream's retransmission timer doubles through the outage, so its first try after the
    // link returns comes up to one outage length plus one timeout later (measured here: 3.4–4.8 s
    // after a 5 s outage); then a whole block must arrive before the file grows. On a loaded
    // 2-core runner the bed's forwarder shares the cores with the rest of the suite, which
    // stretches both. 20 s bounds that with room and still tells TCP's own recovery from the
    // session's 120 s idle timeout, which a transfer that waited on it would show.
    assert!(
        resume_latency < Duration::from_secs(20),
        "took {resume_latency:?} to resume after a 5 s outage (clean run {clean_wall:?})"
    );
    assert!(
        wait_until(Duration::from_secs(5), || names(&root)
            == ["big.bin", "clean.bin"]),
        "temporary files left: {:?}",
        names(&root)
    );
}

/// Mid-transfer, every connection of the client is destroyed with `ss -K` in the client
/// namespace (the kernel resets them). The client reconnects (attempts ≥ 2) and resumes; the
/// result is byte-identical. What was sent again is measured as in the kill -9 test, from what
/// the server held just after the reset (before the client's first retry, 1 s later): exactly
/// (bytes already on the server's disk that the last attempt sent anyway) and as an upper
/// bound (the last attempt's wire bytes minus what lies beyond the temporary file's size).
#[test]
fn reset_connections_mid_transfer_reconnects_and_resumes() {
    let _serial = serial();
    let test = "reset_connections_mid_transfer_reconnects_and_resumes";
    let Some(bed) = bed_or_skip(test, bed_config(20, Some(200_000_000), 0.0)) else {
        return;
    };
    let Some(_) = needs(
        test,
        ferry_netem::find_in_path("ss").ok_or("no `ss` (iproute2) in PATH"),
    ) else {
        return;
    };
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let file = sb.path("src/big.bin");
    write_pattern(&file, BED_FILE, 203);
    let srv = Serve::start(&sb, &root, &bed_listen(&bed), Some(&bed), &[]);
    let server = bed.server_addr().to_string();

    let mut c = spawn_bg(&sb, bed_put(&sb, &srv, &file, "/big.bin", "2m"), Some(&bed));
    let t0 = Instant::now();
    let started = wait_until(Duration::from_secs(60), || {
        received(&root, "big.bin") >= BED_FILE * 30 / 100 || !c.running()
    });
    assert!(
        started && c.running(),
        "no 30% mid-transfer point: {}",
        c.stderr()
    );
    let kill = bed
        .command(Host::Client, "ss")
        .args(["-K", "-t", "-n", "dst", &server])
        .output()
        .expect("running ss -K");
    let killed_at = t0.elapsed();
    let kstdout = String::from_utf8_lossy(&kill.stdout).into_owned();
    let kstderr = String::from_utf8_lossy(&kill.stderr).into_owned();
    let killed = kstdout.lines().filter(|l| l.contains(&server)).count();
    let still = bed
        .command(Host::Client, "ss")
        .args(["-t", "-n", "-H", "state", "established", "dst", &server])
        .output()
        .expect("running ss");
    let still = String::from_utf8_lossy(&still.stdout).lines().count();
    let destroyed = if !kill.status.success() || killed == 0 || kstderr.contains("not supported") {
        Err(format!(
            "`ss -K` did not destroy any socket (kernel without CONFIG_INET_DIAG_DESTROY?): \
             status {}, stdout {kstdout:?}, stderr {kstderr:?}",
            kill.status
        ))
    } else {
        Ok(())
    };
    let Some(()) = needs(test, destroyed) else {
        return;
    };
    // Before the client's first retry (1 s): what the server holds after the reset.
    std::thread::sleep(Duration::from_millis(500));
    let left = leftovers(&root);
    let (intact, _) = intact_unjournaled(&left, &file);

    let out = c.wait(Duration::from_secs(120));
    let wall = t0.elapsed();
    assert_code(&out, 0);
    assert_eq!(
        file_b3(&root.join("big.bin")),
        file_b3(&file),
        "byte-identical"
    );
    let v = one_json(&out.stdout);
    let attempts = u64_of(&v, "attempts");
    let sent = wire_bytes(&v);
    let block = u64_of(&v, "block_size");
    let streams = v["streams"].as_array().unwrap().len() as u64;
    // As in the kill -9 test: an upper bound against the part size, and the exact bytes that
    // were already on the server's disk (journaled, or intact though unjournaled).
    let resent_ub = sent as i64 - (BED_FILE - left.part_bytes) as i64;
    let beyond_journal = sent as i64 - (BED_FILE - left.journaled) as i64;
    let redundant = beyond_journal + intact as i64;
    eprintln!(
        "reset: ss -K destroyed {killed} sockets {killed_at:?} into the put ({still} still \
         established right after); server then held part {:.1} MiB, journal {:.1} MiB, intact \
         unjournaled {:.1} MiB; client finished after {wall:?} in {attempts} attempts; last \
         attempt wrote {:.1} MiB; sent again: exactly {redundant} bytes, upper bound vs the \
         part size {resent_ub} bytes ({:.1} MiB)",
        mib(left.part_bytes),
        mib(left.journaled),
        mib(intact),
        mib(sent),
        resent_ub as f64 / MIB as f64
    );
    assert_eq!(still, 0, "every connection was destroyed");
    assert!(attempts >= 2, "the client reconnected: attempts {attempts}");
    assert!(
        left.journaled > 0,
        "the reset session kept a journaled partial copy: {left:?}"
    );
    let headers = 64 << 10;
    let bound = (streams * block + block + headers) as i64;
    assert!(
        redundant <= bound,
        "after the reset the client sent {redundant} bytes that were on the server (bound {bound})"
    );
    assert!(resent_ub <= unwritten_bound(streams, block, headers));
    assert!(beyond_journal <= (block + headers) as i64);
    assert_eq!(names(&root), ["big.bin"], "no temporary files left");
}

// ---------------------------------------------------------------------------------------------
// 3. random loss on a long path

/// 1% random loss each way at 50 ms RTT, 1 Gbit/s: a tree of 20 files of 1–8 MiB and one of
/// 64 MiB arrives byte-identical.
#[test]
fn one_percent_loss_at_50ms_tree_arrives_identical() {
    let _serial = serial();
    let test = "one_percent_loss_at_50ms_tree_arrives_identical";
    let Some(bed) = bed_or_skip(test, bed_config(50, Some(1_000_000_000), 0.01)) else {
        return;
    };
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let tree = sb.path("src/tree");
    let mut total = 0;
    for i in 0..20u64 {
        let len = ((i % 8) + 1) * MIB + i * 1013;
        let sub = if i % 3 == 0 { "a/" } else { "" };
        write_pattern(&tree.join(format!("{sub}f{i:02}.bin")), len, 300 + i);
        total += len;
    }
    write_pattern(&tree.join("big64.bin"), 64 * MIB, 399);
    total += 64 * MIB;
    let srv = Serve::start(&sb, &root, &bed_listen(&bed), Some(&bed), &[]);
    // Loss hurts some congestion controls far more than others: say which one ran.
    let cc = bed
        .command(Host::Client, "cat")
        .arg("/proc/sys/net/ipv4/tcp_congestion_control")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();

    let mut cmd = bed_put(&sb, &srv, &tree, "/", "2m");
    let t = Instant::now();
    let out = run(
        bed.enter(Host::Client, &mut cmd).unwrap(),
        Duration::from_secs(180),
    );
    let wall = t.elapsed();
    let stats = bed.stats();
    assert_code(&out, 0);
    assert_eq!(
        tree_digest(&root.join("tree")),
        tree_digest(&tree),
        "tree identical"
    );
    let v = one_json(&out.stdout);
    let retrans: u64 = v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["tcp"]["total_retrans"].as_u64())
        .sum();
    eprintln!(
        "loss: {:.1} MiB in 21 files in {wall:?} = {:.1} MiB/s, {} attempt(s), congestion \
         control {cc}; TCP retransmits {retrans}; the bed dropped {} of {} packets \
         client->server and {} of {} back",
        mib(total),
        mib(total) / wall.as_secs_f64(),
        u64_of(&v, "attempts"),
        stats.client_to_server.drop_loss,
        stats.client_to_server.rx_packets,
        stats.server_to_client.drop_loss,
        stats.server_to_client.rx_packets
    );
    assert_eq!(u64_of(&v, "files"), 21);
    assert!(
        stats.client_to_server.drop_loss > 0,
        "the bed did drop packets"
    );
    // The timeline counts what reached the server per 250 ms (acknowledged, or selectively
    // acknowledged past a hole): all of the data but the last, partial interval, and not more
    // than the data plus TLS and framing. That interval is a quarter second of the link and a
    // late sample (25 ms apart). One more interval of the link is allowed for the holes still
    // open at the last sample: when the count was the cumulative acknowledgment alone, it
    // lagged by whole intervals under this loss (38 MB, 1.2 Gbit/s, after 20 MB).
    if u64_of(&v, "attempts") == 1 {
        let acked: u64 = v["timeline"]["bytes"]
            .as_array()
            .expect("a timeline")
            .iter()
            .map(|b| b.as_u64().unwrap())
            .sum();
        let per_ms = 1_000_000_000 / 8 / 1000;
        let tail = per_ms * (250 + 25 + 250);
        // Above: segments held past a hole count as full-sized (`tcpi_sacked` × MSS), and a
        // busy sender writes shorter ones, so the figure runs a few percent high under load
        // (157.6 MB for 153.3 MB with other tests beside it); double counting would be 2×.
        assert!(
            acked + tail >= total && acked <= total + total / 20,
            "{acked} of {total} (the unrecorded tail may hold {tail}); timeline {}",
            v["timeline"]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 4. the destination file system fills up

/// The server's root is a 96 MiB tmpfs; a 150 MiB put is refused when it is offered, with the
/// numbers, before a byte is written: nothing is created on the destination. After the file
/// system grows to 400 MiB, the same put completes byte-identical. (The disk filling while a
/// file is written is the next test.)
#[test]
fn destination_full_fails_clearly_then_succeeds_with_space() {
    let _serial = serial();
    let test = "destination_full_fails_clearly_then_succeeds_with_space";
    let sb = Sandbox::new();
    let Some(mnt) = needs(test, Tmpfs::mount(&sb.path("small"), "96m")) else {
        return;
    };
    let root = mnt.0.clone();
    let size = 150 * MIB;
    let file = sb.path("src/big.bin");
    write_pattern(&file, size, 404);
    let listen = format!("127.0.0.1:{}", free_port());
    let srv = Serve::start(&sb, &root, &listen, None, &[]);
    let put = || {
        let mut c = sb.client(&srv.token);
        c.args(["put", "--retry-for", "0"])
            .arg(&file)
            .arg(srv.remote("/big.bin"));
        c
    };

    let used_before = mnt.used();
    let available_before = mnt.available();
    let out = run(&mut put(), Duration::from_secs(60));
    eprintln!("enospc at the offer: client said:\n{}", out.stderr.trim());
    assert_code(&out, 1);
    // The offer-time check, with its numbers: the file's size and what the file system had.
    let want =
        format!("big.bin: no space: the file is {size} bytes, the destination file system has ");
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains(&want))
        .unwrap_or_else(|| panic!("no offer-time refusal ({want}...):\n{out:?}"));
    let available: u64 = line[line.find(&want).unwrap() + want.len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {line:?}"));
    assert_eq!(available, available_before, "{line}");
    assert!(
        line.ends_with(&format!("{available} bytes available")),
        "{line}"
    );
    // Refused before a byte was written: nothing at all was created.
    assert_eq!(
        names(&root),
        Vec::<String>::new(),
        "created on a refused offer"
    );
    assert_eq!(mnt.used(), used_before, "space used by a refused offer");

    mnt.resize("400m");
    let out = run(&mut put(), Duration::from_secs(60));
    assert_code(&out, 0);
    assert_eq!(
        file_b3(&root.join("big.bin")),
        file_b3(&file),
        "byte-identical"
    );
    assert_eq!(names(&root), ["big.bin"]);
    eprintln!(
        "enospc: after remount size=400m the put completed: {}",
        out.stderr.trim()
    );
    drop(srv); // before the unmount
}

/// Fills what is left of a file system with one file, written until `ENOSPC`; returns its
/// size. Real writes, not a sparse length: tmpfs charges only the pages written.
fn fill(path: &Path) -> u64 {
    use std::io::Write;
    let mut f = fs::File::create(path).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    let mut written = 0u64;
    // Bounded: a file system larger than 64 GiB is not what this is for.
    while written < 64 << 30 {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    written
}

/// Stops the put `c` (caught `writing` into `dest`), fills the disk with `filler` and lets the
/// put go on. Returns how much of the large file was written before, and what the filler took.
fn fill_while_stopped(c: &mut Bg, writing: bool, dest: &Path, filler: &Path) -> (u64, u64) {
    // SIGSTOP: the put can send nothing more until the disk is full.
    let stop = Command::new("kill")
        .args(["-STOP", &c.guard.pid().to_string()])
        .status()
        .unwrap();
    assert!(stop.success());
    assert!(
        writing && c.running(),
        "the put was not caught writing: {}",
        c.stderr()
    );
    let before = received(dest, "z-big.bin");
    let filled = fill(filler);
    let cont = Command::new("kill")
        .args(["-CONT", &c.guard.pid().to_string()])
        .status()
        .unwrap();
    assert!(cont.success());
    (before, filled)
}

/// How the put that ran out of space reported it: exit 1, one file stored, the other failed
/// with the write's own error, printed once, and nothing of it left in `dest`.
fn enospc_reported(out: &Out, dest: &Path) {
    let dest = dest.to_path_buf();
    assert_code(out, 1);
    let v = one_json(&out.stdout);
    // One file stored, one failed, with the write's own error: the file and the full disk.
    assert_eq!((u64_of(&v, "files"), u64_of(&v, "failed")), (1, 1), "{v}");
    assert_eq!(
        v["errors"],
        serde_json::json!(["writing tree/z-big.bin: No space left on device (os error 28)"]),
        "{v}"
    );
    let errors: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(
        errors,
        ["error: writing tree/z-big.bin: No space left on device (os error 28)"],
        "{}",
        out.stderr
    );
    assert!(
        !dest.join("z-big.bin").exists(),
        "a file under its final name"
    );
    assert_eq!(
        names(&dest),
        ["a-small.bin"],
        "leftovers of the failed file"
    );
}

/// The offer fits, then something else takes the space while the file is being written: on a
/// 320 MiB tmpfs, a put of a tree (a small file, then a 200 MiB one) is stopped (SIGSTOP)
/// once the small file is in place and the large one's temporary file exists; a filler file
/// takes every free byte; the put continues. It fails on the large file with the write's own
/// error (no space left on device, naming the file), nothing appears under a final name but
/// the small file, and the large file's partial copy is removed, giving its space back. Once
/// the filler is gone, the same put completes: the small file is skipped as complete and the
/// tree is byte-identical.
#[test]
fn destination_fills_while_writing_fails_clearly_then_resumes_with_space() {
    let _serial = serial();
    let test = "destination_fills_while_writing_fails_clearly_then_resumes_with_space";
    let sb = Sandbox::new();
    let Some(mnt) = needs(test, Tmpfs::mount(&sb.path("small"), "320m")) else {
        return;
    };
    let root = mnt.0.clone();
    let dest = root.join("tree");
    let src = sb.path("src/tree");
    let (small, big) = (src.join("a-small.bin"), src.join("z-big.bin"));
    write_pattern(&small, MIB, 406);
    write_pattern(&big, 200 * MIB, 407);
    let listen = format!("127.0.0.1:{}", free_port());
    let srv = Serve::start(&sb, &root, &listen, None, &[]);
    let put = || {
        let mut c = sb.client(&srv.token);
        c.args([
            "put",
            "--retry-for",
            "0",
            "--streams",
            "1",
            "--block-size",
            "1M",
            "--json",
        ])
        .arg(&src)
        .arg(srv.remote("/"));
        c
    };

    let mut c = spawn_bg(&sb, put(), None);
    let writing = wait_until(Duration::from_secs(30), || {
        (dest.join("a-small.bin").exists() && leftovers(&dest).part.is_some()) || !c.running()
    });
    let filler = sb.path("small/filler");
    let (before, filled) = fill_while_stopped(&mut c, writing, &dest, &filler);
    let out = c.wait(Duration::from_secs(60));
    let t = Instant::now();
    // The failed file's temporary file is removed when it fails; its blocks are freed when the
    // session's last handle on it closes, a moment after the client has its answer.
    let given_back = wait_until(Duration::from_secs(10), || {
        names(&dest).iter().all(|n| !n.starts_with(".ferry-")) && mnt.used() <= filled + 2 * MIB
    });
    eprintln!(
        "enospc while writing: {:.1} MiB of the large file written when the filler took \
         {:.1} MiB; put exit {:?}; space given back {given_back} after {:?}: {:.1} MiB used, \
         root {:?}; client said:\n{}",
        mib(before),
        mib(filled),
        out.code(),
        t.elapsed(),
        mib(mnt.used()),
        names(&dest),
        out.stderr.trim()
    );
    assert!(
        before < 200 * MIB,
        "the large file was complete before the disk filled"
    );
    enospc_reported(&out, &dest);
    assert!(
        given_back,
        "the failed file's space was not given back: {:.1} MiB used, the filler holds {:.1} MiB",
        mib(mnt.used()),
        mib(filled)
    );

    fs::remove_file(&filler).unwrap();
    let out = run(&mut put(), Duration::from_secs(60));
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(
        u64_of(&v, "skipped"),
        1,
        "the complete small file is skipped: {v}"
    );
    assert_eq!(tree_digest(&dest), tree_digest(&src), "byte-identical");
    assert_eq!(names(&dest), ["a-small.bin", "z-big.bin"]);
    drop(srv); // before the unmount
}

// ---------------------------------------------------------------------------------------------
// 5. a source file that changes while it is sent

/// How the source is changed while it is being sent.
#[derive(Clone, Copy, Debug)]
enum Change {
    /// 1 MiB appended at the end.
    Append,
    /// The first 1 MiB (already sent) rewritten in place: same size, a mix if not detected.
    RewriteSentRegion,
    /// Cut to half its size (below what has been read so far is not required).
    Truncate,
}

/// A 300 MiB file sent in 1 MiB blocks over one stream; once ~30 MiB have arrived the source
/// changes. The put fails saying the file changed, and the server holds no file under that
/// name (or, should one appear, it equals the final source exactly — never a mix). A re-run
/// stores the new version byte-identical.
fn source_change_is_detected(change: Change, says_changed: bool) {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let size = 300 * MIB;
    let file = sb.path("src/big.bin");
    write_pattern(&file, size, 505);
    let old_b3 = file_b3(&file);
    let listen = format!("127.0.0.1:{}", free_port());
    let srv = Serve::start(&sb, &root, &listen, None, &[]);
    let put = || {
        let mut c = sb.client(&srv.token);
        c.args([
            "put",
            "--block-size",
            "1M",
            "--streams",
            "1",
            "--retry-for",
            "0",
        ])
        .arg(&file)
        .arg(srv.remote("/big.bin"));
        c
    };

    let mut c = spawn_bg(&sb, put(), None);
    let mid = wait_until(Duration::from_secs(60), || {
        received(&root, "big.bin") >= 30 * MIB || !c.running()
    });
    assert!(mid, "no progress in 60 s: {}", c.stderr());
    assert!(
        c.running(),
        "the put finished before the source could be changed"
    );
    let at = received(&root, "big.bin");
    let f = fs::OpenOptions::new().write(true).open(&file).unwrap();
    let mut patch = vec![0u8; MIB as usize];
    for (i, b) in patch.iter_mut().enumerate() {
        *b = (i as u8) ^ 0x5a;
    }
    match change {
        Change::Append => f.write_all_at(&patch, size).unwrap(),
        Change::RewriteSentRegion => f.write_all_at(&patch, 0).unwrap(),
        Change::Truncate => f.set_len(size / 2).unwrap(),
    }
    drop(f);
    let still_running = c.running();
    let new_b3 = file_b3(&file);
    assert_ne!(old_b3, new_b3);

    let out = c.wait(Duration::from_secs(60));
    let stored = root.join("big.bin");
    eprintln!(
        "{change:?}: source changed with {:.1} MiB on the server (client still running: \
         {still_running}); put exit {:?}; root {:?}; client said:\n{}",
        mib(at),
        out.code(),
        names(&root),
        out.stderr.trim()
    );
    if stored.exists() {
        // Only acceptable if what is stored is exactly the final source.
        assert_eq!(
            file_b3(&stored),
            new_b3,
            "a mix of two versions was stored under the final name"
        );
    } else {
        assert_code(&out, 1);
        assert!(
            !says_changed || out.stderr.contains("changed"),
            "the failure says the file changed:\n{out:?}"
        );
    }
    assert!(
        names(&root)
            .iter()
            .all(|n| n == "big.bin" || n.starts_with(".ferry-")),
        "{:?}",
        names(&root)
    );

    // A re-run stores the new version.
    let mut again = put();
    if stored.exists() {
        again.arg("--overwrite");
    }
    let out = run(&mut again, Duration::from_secs(60));
    assert_code(&out, 0);
    assert_eq!(
        file_b3(&stored),
        new_b3,
        "the re-run stores the new version"
    );
    assert_eq!(names(&root), ["big.bin"]);
}

#[test]
fn source_appended_while_sent_is_detected() {
    let _serial = serial();
    source_change_is_detected(Change::Append, true);
}

/// A source cut short while it is read: not stored, exit 1, and a re-run stores the new
/// version. (What the message says is checked in the ignored test below.)
#[test]
fn source_truncated_while_sent_is_not_stored() {
    let _serial = serial();
    source_change_is_detected(Change::Truncate, false);
}

/// The message for a source cut short while it is read should say that the file changed (as
/// for appends and rewrites) and that a re-run sends it; it says "reading big.bin: unexpected
/// end of file".
#[test]
fn source_truncated_while_sent_says_it_changed() {
    let _serial = serial();
    source_change_is_detected(Change::Truncate, true);
}

#[test]
fn source_rewritten_while_sent_is_detected() {
    let _serial = serial();
    source_change_is_detected(Change::RewriteSentRegion, true);
}

// ---------------------------------------------------------------------------------------------
// 6. 32 clients at once

/// A small tree: a few files of 1–20 KiB, one in a subdirectory, an empty file, and one
/// 16 MiB file.
fn client_tree(dir: &Path, seed: u64) {
    for j in 0..6u64 {
        let sub = if j % 2 == 0 { "sub/" } else { "" };
        write_pattern(
            &dir.join(format!("{sub}s{j}.dat")),
            1024 + (seed * 7 + j) * 3001 % 19_000,
            seed * 100 + j,
        );
    }
    fs::write(dir.join("empty"), b"").unwrap();
    write_pattern(&dir.join("big.bin"), 16 * MIB, seed * 100 + 99);
}

/// What one burst of clients did to the server.
struct Burst {
    wall: Duration,
    peak_fds: usize,
    fds_after: usize,
    settle: Duration,
    rss_after_kib: u64,
}

/// Runs 16 puts (of `src/pNN` to `/<put_dest>/`) and 16 gets (of `/pub/gNN` to `<get_dest>/`)
/// at once, checks every result byte-identical, then waits (≤ 5 s) for the server's fds to
/// come back to `fd0` (+2).
fn burst(
    sb: &Sandbox,
    srv: &Serve,
    root: &Path,
    put_dest: &str,
    get_dest: &str,
    fd0: usize,
) -> Burst {
    let pid = srv.pid();
    let t = Instant::now();
    let mut clients = Vec::new();
    for i in 0..16 {
        let mut put = sb.client(&srv.token);
        put.args(["put", "--retry-for", "60s", "-q"])
            .arg(sb.path(&format!("src/p{i:02}")))
            .arg(srv.remote(&format!("/{put_dest}/")));
        clients.push((format!("put p{i:02}"), spawn_bg(sb, put, None)));
        let mut get = sb.client(&srv.token);
        get.args(["get", "--retry-for", "60s", "-q"])
            .arg(srv.remote(&format!("/pub/g{i:02}")))
            .arg(format!("{}/", sb.path(get_dest).display()));
        clients.push((format!("get g{i:02}"), spawn_bg(sb, get, None)));
    }
    // Sample the server while they run.
    let mut peak_fds = 0;
    let deadline = Instant::now() + Duration::from_secs(180);
    while clients.iter_mut().any(|(_, c)| c.running()) && Instant::now() < deadline {
        peak_fds = peak_fds.max(fd_count(pid));
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut failures = Vec::new();
    for (what, c) in clients {
        let left = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
        let out = c.wait(left);
        if out.code() != Some(0) {
            failures.push(format!("{what}: {out:?}"));
        }
    }
    let wall = t.elapsed();
    assert!(
        failures.is_empty(),
        "failed clients:\n{}",
        failures.join("\n")
    );
    for i in 0..16 {
        assert_eq!(
            tree_digest(&root.join(format!("{put_dest}/p{i:02}"))),
            tree_digest(&sb.path(&format!("src/p{i:02}"))),
            "put p{i:02}"
        );
        assert_eq!(
            tree_digest(&sb.path(&format!("{get_dest}/g{i:02}"))),
            tree_digest(&root.join(format!("pub/g{i:02}"))),
            "get g{i:02}"
        );
    }
    let t_settle = Instant::now();
    wait_until(Duration::from_secs(5), || fd_count(pid) <= fd0 + 2);
    Burst {
        wall,
        peak_fds,
        fds_after: fd_count(pid),
        settle: t_settle.elapsed(),
        rss_after_kib: status_kib(pid, "VmRSS"),
    }
}

/// The trees for 32 clients (16 to put, 16 on the server to get) and a server, with its fd
/// count and resident size (KiB) once it is idle.
fn thirty_two_setup(sb: &Sandbox) -> (PathBuf, Serve, usize, u64) {
    let root = sb.mkdir("root");
    let t = Instant::now();
    for i in 0..16u64 {
        client_tree(&root.join(format!("pub/g{i:02}")), 1000 + i);
        client_tree(&sb.path(&format!("src/p{i:02}")), 2000 + i);
    }
    eprintln!("clients32: made 32 trees in {:?}", t.elapsed());
    let listen = format!("127.0.0.1:{}", free_port());
    let srv = Serve::start(sb, &root, &listen, None, &[]);
    std::thread::sleep(Duration::from_millis(300));
    let (fd0, rss0) = (fd_count(srv.pid()), status_kib(srv.pid(), "VmRSS"));
    (root, srv, fd0, rss0)
}

fn report_burst(b: &Burst, fd0: usize, rss0: u64, hwm: u64) {
    let kib = |k: u64| k as f64 / 1024.0;
    eprintln!(
        "clients32: 32 clients done in {:?}; server fds {fd0} before, peak {} while running, {} \
         after ({:?} to settle); RSS {:.1} MiB before, peak {:.1} MiB, {:.1} MiB after (growth \
         {:.1} MiB)",
        b.wall,
        b.peak_fds,
        b.fds_after,
        b.settle,
        kib(rss0),
        kib(hwm),
        kib(b.rss_after_kib),
        kib(b.rss_after_kib) - kib(rss0)
    );
}

/// 16 puts and 16 gets at once against one server process: all succeed byte-identical; the
/// server's open file descriptors come back to their baseline (+2).
///
/// Its resident memory is reported and its growth held to 256 MiB + 128 MiB, a guard against
/// gross leaks (32 sessions holding their ~100 MiB each would be GiBs): the server keeps idle
/// block buffers for reuse up to `MAX_POOLED_BYTES` = 256 MiB (crates/ferry-core/src/buf.rs),
/// which one burst of 32 sessions fills (253–263 MiB of growth measured), and the allocator
/// keeps some freed memory too (after 8 bursts in a row the total levels off at 385–410 MiB).
/// The tighter bound (200 MiB) is in
/// `server_rss_growth_after_32_clients_is_under_200mib`, ignored as a bug.
#[test]
fn thirty_two_clients_at_once_all_identical_and_fds_return() {
    let _serial = serial();
    let sb = Sandbox::new();
    let (root, srv, fd0, rss0) = thirty_two_setup(&sb);
    let b = burst(&sb, &srv, &root, "in", "got", fd0);
    report_burst(&b, fd0, rss0, status_kib(srv.pid(), "VmHWM"));
    assert!(
        b.fds_after <= fd0 + 2,
        "server fds {} did not come back to {fd0} (+2) within 5 s",
        b.fds_after
    );
    assert!(
        b.peak_fds > fd0 + 32,
        "the clients overlapped (peak fds {})",
        b.peak_fds
    );
    let growth = b.rss_after_kib.saturating_sub(rss0);
    assert!(
        growth < (256 + 128) * 1024,
        "server RSS grew by {:.1} MiB, more than its buffer pool's cap (256 MiB) + 128 MiB",
        growth as f64 / 1024.0
    );
    assert!(!srv.log().contains("panicked"), "{}", srv.log());
}

/// The memory requirement: after 32 clients at once, the idle server's resident size
/// is less than 200 MiB above where it started. It is not: the buffer pool alone keeps up to
/// 256 MiB (254–255 MiB measured after one burst, ~385–410 MiB after several bursts as the
/// allocator keeps more), and never gives it back while the server idles.
#[test]
fn server_rss_growth_after_32_clients_is_under_200mib() {
    let _serial = serial();
    let sb = Sandbox::new();
    let (root, srv, fd0, rss0) = thirty_two_setup(&sb);
    let b = burst(&sb, &srv, &root, "in", "got", fd0);
    // Idle for a while: memory that is going to be released has been by then.
    std::thread::sleep(Duration::from_secs(2));
    let rss = status_kib(srv.pid(), "VmRSS");
    report_burst(&b, fd0, rss0, status_kib(srv.pid(), "VmHWM"));
    eprintln!("clients32: RSS 2 s later {:.1} MiB", rss as f64 / 1024.0);
    assert!(
        rss.saturating_sub(rss0) < 200 * 1024,
        "server RSS grew by {:.1} MiB (limit 200 MiB)",
        rss.saturating_sub(rss0) as f64 / 1024.0
    );
}

/// `ferry probe net` across the emulated WAN (50 ms, 200 Mbit/s): short and bounded, it sees the
/// bed's RTT and a rate the link can carry, explains the limit, and saves the profile.
#[test]
fn probe_net_on_the_bed_sees_the_rtt_and_the_rate() {
    let _serial = serial();
    let test = "probe_net_on_the_bed_sees_the_rtt_and_the_rate";
    let Some(bed) = bed_or_skip(test, bed_config(50, Some(200_000_000), 0.0)) else {
        return;
    };
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let srv = Serve::start(&sb, &root, &bed_listen(&bed), Some(&bed), &[]);
    let endpoint = bed_listen(&bed);
    let mut cmd = sb.client(&srv.token);
    cmd.args(["probe", "net", "--quick", "--json", "--seconds", "3"])
        .arg(&endpoint);
    let out = run(
        bed.enter(Host::Client, &mut cmd).unwrap(),
        Duration::from_secs(90),
    );
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    let rtt = v["rtt_idle_ms"].as_f64().unwrap();
    assert!(
        (49.0..56.0).contains(&rtt),
        "idle RTT {rtt} ms on a 50 ms bed: {v}"
    );
    let best = v["best"]["rate_mbps"].as_f64().unwrap();
    // The link carries 200 Mbit/s of frames; a 2 s measurement after slow start gets most of it.
    // Above it by as much as the emulator itself is held to (`ferry-netem` tests: within 5% of
    // its cap): the probe counts bytes as the receiver reads them, so a read that a busy host
    // delays past the window's first edge counts bytes that arrived before it (206.5 once in
    // CI, with four streams).
    assert!(
        (60.0..=210.0).contains(&best),
        "best {best} Mbit/s on a 200 Mbit/s link: {v}"
    );
    assert!(
        v["explanation"].as_array().is_some_and(|e| !e.is_empty()),
        "{v}"
    );
    let profiles: Value = serde_json::from_slice(
        &fs::read(sb.state_dir().join("net-profiles.json")).expect("profile saved"),
    )
    .unwrap();
    assert!(profiles[endpoint.as_str()]["streams"].as_u64().unwrap() >= 1);
}

// ---------------------------------------------------------------------------------------------
// 7. hosts that allow TCP Fast Open, and one that stops allowing it

/// The client host's count of SYNs whose data the server did not acknowledge
/// (`TcpExt: TCPFastOpenActiveFail` in its `/proc/net/netstat`).
fn client_fast_open_refused(bed: &TestBed) -> u64 {
    let out = bed
        .command(Host::Client, "cat")
        .arg("/proc/net/netstat")
        .output()
        .expect("reading /proc/net/netstat");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut ext = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (ext.next().unwrap_or(""), ext.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "TCPFastOpenActiveFail")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no TCPFastOpenActiveFail in /proc/net/netstat:\n{text}"))
}

/// Whether each data connection of a put opened with its TLS hello in the SYN.
fn fast_opened(v: &Value) -> Vec<bool> {
    v["streams"]
        .as_array()
        .expect("streams in the report")
        .iter()
        .map(|s| s["tcp"]["fast_open"].as_bool().expect("tcp.fast_open"))
        .collect()
}

/// On a 20 ms bed whose hosts allow TCP Fast Open (`net.ipv4.tcp_fastopen=3`), the second put
/// opens every data connection with data in its SYN: the first put's control connection
/// fetched the server's cookie (its data connections, dialled after the control handshake on
/// first contact, may already have used it).
/// When the server's host then turns it off (the kernel's default, 1), the client still holds
/// cookies and sends data in its SYNs, which the server's kernel ignores: the put must not
/// notice beyond the round trip it no longer saves. Every put arrives byte-identical.
#[test]
fn fast_open_saves_the_syn_round_trip_and_falls_back_when_refused() {
    let _serial = serial();
    let test = "fast_open_saves_the_syn_round_trip_and_falls_back_when_refused";
    let config = BedConfig {
        fast_open: true,
        ..bed_config(20, Some(1_000_000_000), 0.0)
    };
    let Some(bed) = bed_or_skip(test, config) else {
        return;
    };
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let file = sb.path("src/fo.bin");
    write_pattern(&file, 8 * MIB + 333, 801);
    let want = file_b3(&file);
    let srv = Serve::start(&sb, &root, &bed_listen(&bed), Some(&bed), &[]);
    let put = |dest: &str| -> Value {
        let mut cmd = sb.client(&srv.token);
        cmd.args(["put", "--json", "--streams", "4"])
            .arg(&file)
            .arg(srv.remote(dest));
        let out = run(
            bed.enter(Host::Client, &mut cmd).unwrap(),
            Duration::from_secs(60),
        );
        assert_code(&out, 0);
        assert_eq!(
            file_b3(&root.join(dest.trim_start_matches('/'))),
            want,
            "{dest}"
        );
        one_json(&out.stdout)
    };
    let sysctl = |host: Host, value: &str| {
        let out = bed
            .command(host, "sysctl")
            .args(["-n", "net.ipv4.tcp_fastopen"])
            .output()
            .expect("running sysctl");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            value,
            "{host:?}"
        );
    };
    sysctl(Host::Client, "3");
    sysctl(Host::Server, "3");

    let first = put("/a.bin");
    eprintln!(
        "first put (cookies fetched): fast open {:?}",
        fast_opened(&first)
    );
    let second = put("/b.bin");
    let opened = fast_opened(&second);
    eprintln!("second put: fast open {opened:?}");
    assert!(
        !opened.is_empty() && opened.iter().all(|&o| o),
        "every data connection of the second put should open with data in its SYN: {opened:?}"
    );

    let off = bed
        .command(Host::Server, "sysctl")
        .args(["-q", "-w", "net.ipv4.tcp_fastopen=1"])
        .status()
        .expect("running sysctl");
    assert!(off.success());
    let refused_before = client_fast_open_refused(&bed);
    let third = put("/c.bin");
    let opened = fast_opened(&third);
    let refused = client_fast_open_refused(&bed) - refused_before;
    eprintln!(
        "server's Fast Open off: fast open {opened:?}, SYNs whose data was refused {refused}"
    );
    assert!(
        !opened.is_empty() && opened.iter().all(|&o| !o),
        "a server host without Fast Open accepts no data in SYNs: {opened:?}"
    );
    // The client did send its hellos in SYNs (it holds cookies), and the server ignored them.
    assert!(
        refused >= opened.len() as u64,
        "{refused} refused SYNs with data for {} data connections",
        opened.len()
    );
}
