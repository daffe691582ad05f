//! Helpers shared by the end-to-end tests (`mod util;` in each): a sandboxed environment per
//! test, a `ferry serve` child that is always killed (Drop) and waited for until it serves,
//! commands run with a deadline, JSON output read back, and std-only tree digests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufWriter, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ferry");

/// Default deadline for one client command.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(30);

/// Kills (SIGKILL) and reaps the child when dropped, so nothing outlives a panicking test.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("child already reaped")
    }

    pub fn pid(&self) -> u32 {
        self.0.as_ref().expect("child already reaped").id()
    }

    /// Fails the test if the child has already exited, with its status and the stderr it
    /// wrote to `stderr` (a file): a test that must interrupt a transfer cannot tell a put that
    /// was too fast from one that failed (a full disk, a refused login) otherwise.
    pub fn assert_running(&mut self, stderr: &std::path::Path, before: &str) {
        if let Some(status) = self.child().try_wait().expect("try_wait") {
            panic!(
                "the child ended ({status}) before it could be {before}; its stderr:\n{}",
                std::fs::read_to_string(stderr).unwrap_or_default()
            );
        }
    }

    /// Waits (bounded) for the child to exit on its own.
    pub fn wait_for(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child().try_wait().expect("try_wait") {
                self.0 = None;
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What a finished command did.
pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// The single JSON document on stdout (fails if there is anything else).
#[track_caller]
pub fn one_json(stdout: &str) -> serde_json::Value {
    let mut it = serde_json::Deserializer::from_str(stdout).into_iter::<serde_json::Value>();
    let v = it
        .next()
        .unwrap_or_else(|| panic!("no JSON on stdout: {stdout:?}"))
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout:?}"));
    assert!(
        it.next().is_none(),
        "more than one JSON document on stdout: {stdout:?}"
    );
    v
}

/// Field `k` of a JSON object, which must be an unsigned integer.
#[track_caller]
pub fn u64_field(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("`{k}` is not an unsigned integer in {v}"))
}

/// Asserts the exit code, showing everything the command printed when it differs.
#[track_caller]
pub fn assert_code(out: &Out, code: i32) {
    assert_eq!(out.code(), Some(code), "unexpected exit code\n{out:?}");
}

/// Runs `cmd` to completion with a deadline; on timeout the child is killed and the test fails.
pub fn run(cmd: &mut Command, timeout: Duration) -> Out {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawning ferry");
    let mut so = child.stdout.take().expect("stdout pipe");
    let mut se = child.stderr.take().expect("stderr pipe");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let mut guard = ChildGuard(Some(child));
    let Some(status) = guard.wait_for(timeout) else {
        drop(guard);
        panic!("{cmd:?} did not finish within {timeout:?}");
    };
    let stdout = String::from_utf8_lossy(&t_out.join().expect("stdout reader")).into_owned();
    let stderr = String::from_utf8_lossy(&t_err.join().expect("stderr reader")).into_owned();
    Out {
        status,
        stdout,
        stderr,
    }
}

/// A test's private world: temp dir, an empty HOME/XDG_CONFIG_HOME, a state dir.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ferry-e2e-")
            .tempdir()
            .expect("tempdir");
        let sb = Self { dir };
        fs::create_dir_all(sb.home()).unwrap();
        fs::create_dir_all(sb.xdg_config()).unwrap();
        sb
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        fs::create_dir_all(&p).unwrap();
        p
    }

    pub fn home(&self) -> PathBuf {
        self.path("home")
    }

    pub fn xdg_config(&self) -> PathBuf {
        self.path("xdg-config")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("state")
    }

    /// `ferry` with a clean environment: no token, no config, no state outside the sandbox.
    pub fn ferry(&self) -> Command {
        let mut c = Command::new(BIN);
        for v in [
            "FERRY_TOKEN",
            "FERRY_LOG",
            "FERRY_STATE_DIR",
            "FERRY_NO_PROGRESS",
            "FERRY_TCP_FASTOPEN",
            "XDG_STATE_HOME",
            "RUST_LOG",
        ] {
            c.env_remove(v);
        }
        c.env("HOME", self.home())
            .env("XDG_CONFIG_HOME", self.xdg_config())
            .env("FERRY_STATE_DIR", self.state_dir());
        c
    }

    /// `ferry serve --root ROOT --listen LISTEN [--token-file FILE]`, not yet spawned.
    pub fn serve_cmd(&self, root: &Path, listen: &str, token_file: Option<&Path>) -> Command {
        let mut cmd = self.ferry();
        cmd.arg("serve")
            .arg("--root")
            .arg(root)
            .arg("--listen")
            .arg(listen);
        if let Some(f) = token_file {
            cmd.arg("--token-file").arg(f);
        }
        cmd
    }

    /// `ferry` with `FERRY_TOKEN` set.
    pub fn client(&self, token: &str) -> Command {
        let mut c = self.ferry();
        c.env("FERRY_TOKEN", token);
        c
    }
}

pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

static SERVER_SEQ: AtomicU64 = AtomicU64::new(0);

/// A running `ferry serve`, killed when dropped.
pub struct Server {
    pub guard: ChildGuard,
    pub port: u16,
    pub root: PathBuf,
    pub token: String,
    pub stderr_path: PathBuf,
}

impl Server {
    /// Starts `ferry serve --root root --listen 127.0.0.1:PORT [--token-file f] extra...` and
    /// waits (≤ 5 s) for its "serving ... on ADDR" line. Without a token file the server uses
    /// the sandbox's `FERRY_STATE_DIR`.
    pub fn start(sb: &Sandbox, root: &Path, token_file: Option<&Path>, extra: &[&str]) -> Self {
        Self::start_with(sb, root, token_file, extra, |_| {})
    }

    /// [`Server::start`], with `prepare` applied to the command before it is spawned.
    pub fn start_with(
        sb: &Sandbox,
        root: &Path,
        token_file: Option<&Path>,
        extra: &[&str],
        prepare: impl Fn(&mut Command),
    ) -> Self {
        for attempt in 0..3 {
            let port = free_port();
            let n = SERVER_SEQ.fetch_add(1, Ordering::Relaxed);
            let stderr_path = sb.path(&format!("serve-{n}.log"));
            let log = fs::File::create(&stderr_path).unwrap();
            let listen = format!("127.0.0.1:{port}");
            let mut cmd = sb.serve_cmd(root, &listen, token_file);
            cmd.args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log);
            prepare(&mut cmd);
            let mut guard = ChildGuard(Some(cmd.spawn().expect("spawning ferry serve")));
            let text = match wait_serving(&mut guard, &stderr_path, &listen, Duration::from_secs(5))
            {
                Ok(text) => text,
                // Someone took the port in between: try another.
                Err(NotServing::Exited(_, text))
                    if text.contains("cannot listen") && attempt < 2 =>
                {
                    continue
                }
                Err(e) => panic!("{e}"),
            };
            // With --token-file the token is in the file; otherwise only its hash is kept, and
            // the first start prints it once (empty on later starts).
            let token = match token_file {
                Some(f) => fs::read_to_string(f)
                    .expect("token file after start")
                    .trim()
                    .to_owned(),
                None => text
                    .lines()
                    .find(|l| l.contains("new full-access token"))
                    .and_then(|l| l.rsplit(' ').next())
                    .unwrap_or_default()
                    .to_owned(),
            };
            return Self {
                guard,
                port,
                root: root.to_path_buf(),
                token,
                stderr_path,
            };
        }
        unreachable!("the loop returns or panics")
    }

    pub fn remote(&self, path: &str) -> String {
        format!("127.0.0.1:{}:{path}", self.port)
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Sends a signal with the `kill` command.
    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.guard.pid().to_string())
            .status()
            .expect("running kill");
        assert!(st.success(), "kill -{sig} failed");
    }
}

/// Why a `ferry serve` did not come up.
#[derive(Debug)]
pub enum NotServing {
    /// It exited, with this status, having printed this.
    Exited(ExitStatus, String),
    /// It printed this and was still not serving when the time ran out.
    TimedOut(Duration, String),
}

impl std::fmt::Display for NotServing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited(status, text) => write!(f, "ferry serve exited early ({status}):\n{text}"),
            Self::TimedOut(t, text) => {
                write!(f, "ferry serve not ready within {} s:\n{text}", t.as_secs())
            }
        }
    }
}

/// Waits (at most `timeout`) for the `ferry serve` in `guard`, whose stderr goes to `log`, to
/// print that it serves on `listen`; returns what it printed. If it exits first, it is reaped
/// (`guard` left empty).
pub fn wait_serving(
    guard: &mut ChildGuard,
    log: &Path,
    listen: &str,
    timeout: Duration,
) -> Result<String, NotServing> {
    let want = format!(" on {listen}");
    let deadline = Instant::now() + timeout;
    loop {
        let text = fs::read_to_string(log).unwrap_or_default();
        if text
            .lines()
            .any(|l| l.starts_with("ferry: serving ") && l.ends_with(&want))
        {
            return Ok(text);
        }
        if let Some(status) = guard.child().try_wait().unwrap() {
            guard.0 = None;
            return Err(NotServing::Exited(status, text));
        }
        if Instant::now() >= deadline {
            return Err(NotServing::TimedOut(timeout, text));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Fills a file with a cheap xorshift stream (incompressible, reproducible from the seed).
pub fn write_pattern(path: &Path, len: u64, seed: u64) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap();
    }
    let f = fs::File::create(path).unwrap();
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for chunk in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        w.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    w.flush().unwrap();
}

pub fn file_b3(path: &Path) -> String {
    let mut f = fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return h.finalize().to_hex().to_string();
        }
        h.update(&buf[..n]);
    }
}

pub fn file_md5(path: &Path) -> String {
    use md5::Digest;
    let mut f = fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut h = md5::Md5::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return h
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>();
        }
        h.update(&buf[..n]);
    }
}

#[derive(Debug, PartialEq, Eq, Clone)]
pub enum Entry {
    Dir,
    File { len: u64, b3: String },
    Symlink(PathBuf),
    Other,
}

/// Every entry under `root` (not `root` itself) by relative path, with a BLAKE3 of each file.
pub fn tree_digest(root: &Path) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let dir = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&rel)
        };
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let e = e.unwrap();
            let name = e.file_name().into_string().expect("utf-8 names");
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let p = root.join(&r);
            let m = fs::symlink_metadata(&p).unwrap();
            let entry = if m.is_dir() {
                stack.push(r.clone());
                Entry::Dir
            } else if m.file_type().is_symlink() {
                Entry::Symlink(fs::read_link(&p).unwrap())
            } else if m.is_file() {
                Entry::File {
                    len: m.len(),
                    b3: file_b3(&p),
                }
            } else {
                Entry::Other
            };
            out.insert(r, entry);
        }
    }
    out
}

/// Names in a directory (empty if it does not exist).
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// Every path under `root` (recursively), relative.
pub fn all_paths(root: &Path) -> Vec<String> {
    tree_digest(root).into_keys().collect()
}

pub fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o7777
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
