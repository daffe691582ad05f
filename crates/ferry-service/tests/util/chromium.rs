//! Headless Chromium driven over the DevTools protocol on `--remote-debugging-pipe`: JSON
//! messages ended by a NUL byte, commands in on the child's fd 3, answers and events out on
//! its fd 4. No WebDriver, no new crates; every wait has a deadline, and the browser is
//! killed and its profile removed when the handle drops, a failed test included.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Whether the browser is here (scripts/deps.sh installs Debian's `chromium`).
pub fn present() -> Result<(), String> {
    if Path::new(CHROMIUM).is_file() {
        Ok(())
    } else {
        Err(format!(
            "{CHROMIUM} is missing (scripts/deps.sh installs it)"
        ))
    }
}

pub struct Browser {
    child: Child,
    profile: tempfile::TempDir,
    to: File,
    from: mpsc::Receiver<Value>,
    next: u64,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two new descriptors, owned from here on.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both are open and owned by no one else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    /// Starts Chromium with a fresh profile, trusting certificates with the key whose
    /// SubjectPublicKeyInfo hashes to `spki_sha256_b64` (and only those).
    pub fn start(spki_sha256_b64: &str) -> Self {
        let profile = tempfile::tempdir().unwrap();
        let (child_in, to) = pipe();
        let (from, child_out) = pipe();
        let (cin, cout) = (child_in.as_raw_fd(), child_out.as_raw_fd());
        let log = File::create(profile.path().join("stderr.log")).unwrap();
        // Chromium's own temporary files (shared memory with --disable-dev-shm-usage) go in
        // the profile, so that they are removed with it.
        let tmp = profile.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let mut cmd = Command::new(CHROMIUM);
        cmd.env("TMPDIR", &tmp);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-pipe",
            "--window-size=1280,1000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!(
            "--ignore-certificate-errors-spki-list={spki_sha256_b64}"
        ))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
        // SAFETY: only async-signal-safe calls (setpgid, fcntl, dup2) between fork and exec.
        // Its own process group, so that Drop ends its helper processes too. The ends are
        // first copied above 10 so that placing one on 3 cannot close the other.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setpgid(0, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let a = libc::fcntl(cin, libc::F_DUPFD_CLOEXEC, 10);
                let b = libc::fcntl(cout, libc::F_DUPFD_CLOEXEC, 10);
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("starting chromium");
        drop((child_in, child_out));
        let (tx, rx) = mpsc::channel();
        let mut from = File::from(from);
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 64 * 1024];
            while let Ok(n @ 1..) = from.read(&mut chunk) {
                buf.extend_from_slice(&chunk[..n]);
                while let Some(end) = buf.iter().position(|&b| b == 0) {
                    let msg: Vec<u8> = buf.drain(..=end).collect();
                    if let Ok(v) = serde_json::from_slice::<Value>(&msg[..end]) {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Self {
            child,
            profile,
            to: File::from(to),
            from: rx,
            next: 0,
        }
    }

    /// One command, on a page's session or the browser's; its `result`, or its error.
    pub fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).expect("writing to chromium");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self.from.recv_timeout(left).unwrap_or_else(|e| {
                panic!(
                    "{method}: no answer from chromium ({e}); {}",
                    self.log_tail()
                )
            });
            if v["id"] == json!(id) {
                assert!(v.get("error").is_none(), "{method}: {}", v["error"]);
                return v["result"].clone();
            }
        }
    }

    /// A new tab, attached in flat mode: the session id its commands carry.
    pub fn open_tab(&mut self) -> String {
        let t = self.call(None, "Target.createTarget", json!({"url": "about:blank"}));
        let a = self.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": t["targetId"], "flatten": true}),
        );
        a["sessionId"].as_str().unwrap().to_string()
    }

    /// Evaluates `expr` in the page (a promise awaited) and returns its value as JSON.
    pub fn eval(&mut self, session: &str, expr: &str) -> Value {
        let r = self.call(
            Some(session),
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("evaluating {expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Polls `expr` every 100 ms until it is neither null nor false, at most `within`.
    pub fn wait_for(&mut self, session: &str, expr: &str, within: Duration) -> Value {
        let t0 = Instant::now();
        loop {
            let v = self.eval(session, expr);
            if !v.is_null() && v != json!(false) {
                return v;
            }
            if t0.elapsed() > within {
                let page = self.eval(session, "location.href + ' ' + document.body?.innerText");
                panic!("waited {within:?} for {expr}; the page: {page}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The page as a PNG.
    pub fn screenshot(&mut self, session: &str) -> Vec<u8> {
        let r = self.call(
            Some(session),
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap()
    }

    fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.profile.path().join("stderr.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        format!(
            "chromium's stderr, last lines:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let group = i32::try_from(self.child.id()).unwrap_or(0);
        // SAFETY: signals to the process group this Browser made (setpgid at its start).
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its helpers (zygote, renderers) are gone before the profile is removed, or one could
        // write into it meanwhile and leave it behind. Bounded: 5 s.
        let deadline = Instant::now() + Duration::from_secs(5);
        // SAFETY: signal 0 only asks whether a process of the group is left.
        while unsafe { libc::kill(-group, 0) } == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
    }
}

/// `--ignore-certificate-errors-spki-list`'s form of a certificate (DER): the base64 of the
/// SHA-256 of its SubjectPublicKeyInfo.
pub fn spki_pin(cert: &[u8]) -> String {
    let (_, cert, _) = tlv(cert);
    let (_, mut tbs, _) = tlv(cert);
    // tbsCertificate: [0] version (optional), serial, signature, issuer, validity, subject, spki.
    if tbs[0] == 0xa0 {
        tbs = tlv(tbs).2;
    }
    for _ in 0..5 {
        tbs = tlv(tbs).2;
    }
    let (whole, _, _) = tlv(tbs);
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(whole))
}

/// One DER element at the start of `d`: (the element whole, its content, what follows).
fn tlv(d: &[u8]) -> (&[u8], &[u8], &[u8]) {
    let (len, head) = match d[1] {
        n if n < 0x80 => (n as usize, 2),
        n => {
            let k = (n & 0x7f) as usize;
            let len = d[2..2 + k].iter().fold(0usize, |a, &b| a << 8 | b as usize);
            (len, 2 + k)
        }
    };
    (&d[..head + len], &d[head..head + len], &d[head + len..])
}
