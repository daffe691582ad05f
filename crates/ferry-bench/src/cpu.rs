//! CPU time of the two ends of a host-mode run: the client's from wait4(2) (its own rusage,
//! threads included, nothing else's), a running server's from /proc/<pid>/stat before and after.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::runner::Outcome;

/// CPU seconds of a process from the fields of `/proc/<pid>/stat`: utime + stime of its threads,
/// plus cutime + cstime of the children it has waited for (an rsync daemon forks one per
/// connection and reaps it when the transfer ends; ferry serve uses threads only).
pub fn parse_proc_stat(text: &str, ticks_per_s: f64) -> Result<f64> {
    // The command name (field 2) is in parentheses and may itself hold spaces and ')'.
    let rest = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .context("/proc stat without a command name")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime field 14 … cstime field 17.
    if f.len() < 15 {
        bail!("/proc stat has {} fields after the name, want 15", f.len());
    }
    let mut ticks = 0u64;
    for (i, v) in f[11..15].iter().enumerate() {
        ticks += v
            .parse::<u64>()
            .with_context(|| format!("/proc stat field {}: {v:?}", i + 14))?;
    }
    if ticks_per_s <= 0.0 {
        bail!("clock ticks per second unknown");
    }
    Ok(ticks as f64 / ticks_per_s)
}

/// The kernel's clock ticks per second (USER_HZ), the unit of /proc's times.
pub fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no side effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// CPU seconds so far of the running process `pid` (see [`parse_proc_stat`]).
pub fn process_cpu_s(pid: u32) -> Result<f64> {
    let p = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {p}"))?;
    parse_proc_stat(&text, ticks_per_s())
}

/// Samples `pid`'s CPU time until it stops growing (two samples 100 ms apart agree) or `max`
/// passes: a server finishes its side (a get's last acknowledgements, closing files) just after
/// the client exits.
pub fn settled_cpu_s(pid: u32, max: Duration) -> Result<f64> {
    let t0 = Instant::now();
    let mut last = process_cpu_s(pid)?;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = process_cpu_s(pid)?;
        if now <= last || t0.elapsed() >= max {
            return Ok(now);
        }
        last = now;
    }
}

/// A client's result with its CPU seconds (user + system, from wait4's rusage).
pub struct Measured {
    pub outcome: Outcome,
    pub cpu_s: f64,
}

fn timeval_s(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

fn drain(mut r: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    })
}

/// Runs `cmd` (its own process group, killed after `timeout` or on the bench's stop) and
/// returns its output, wall time and CPU seconds.
pub fn run_measured(mut cmd: Command, timeout: Duration) -> Result<Measured> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let pid = child.id() as i32;
    let out = drain(child.stdout.take().context("no stdout")?);
    let err = drain(child.stderr.take().context("no stderr")?);
    let (tx, dog) = crate::runner::watchdog(pid, timeout);
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = loop {
        // SAFETY: wait4 on our own child; status and rusage point to live locals.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == -1 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        break r;
    };
    let wall = t0.elapsed();
    let _ = tx.send(());
    let timed_out = dog.join().unwrap_or(false);
    if r != pid {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    // The child is reaped: std's handle must not wait for it again (dropping it does not).
    drop(child);
    let exited = libc::WIFEXITED(status);
    let code = libc::WEXITSTATUS(status);
    Ok(Measured {
        outcome: Outcome {
            success: exited && code == 0 && !timed_out,
            code: if exited {
                format!("exit {code}")
            } else {
                "killed".into()
            },
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
            wall,
            timed_out,
        },
        cpu_s: timeval_s(ru.ru_utime) + timeval_s(ru.ru_stime),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_fields() {
        // A real line's shape (kernel 6.x), with a name that holds spaces and parentheses.
        let line = "4242 (ferry (x) y) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                    250 70 30 10 20 0 9 0 123456 1000000 500 18446744073709551615";
        assert_eq!(parse_proc_stat(line, 100.0).unwrap(), 3.6);
        assert_eq!(parse_proc_stat(line, 1000.0).unwrap(), 0.36);
        assert!(parse_proc_stat("4242 (ferry) S 1 2 3", 100.0).is_err());
        assert!(parse_proc_stat("no name here", 100.0).is_err());
        let bad = line.replace(" 250 ", " x ");
        assert!(parse_proc_stat(&bad, 100.0).is_err());
        assert!(parse_proc_stat(line, 0.0).is_err());
    }

    #[test]
    fn own_process_and_a_busy_child() {
        assert!(process_cpu_s(std::process::id()).unwrap() >= 0.0);
        assert!(process_cpu_s(999_999_999).is_err());
        // A child that spins ~0.3 s of CPU: wait4 counts it, the wall clock covers it.
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo done",
        ]);
        let m = run_measured(c, Duration::from_secs(60)).unwrap();
        assert!(m.outcome.success, "{}", m.outcome.stderr);
        assert_eq!(m.outcome.stdout.trim(), "done");
        assert!(m.cpu_s > 0.05, "{}", m.cpu_s);
        assert!(m.cpu_s <= m.outcome.wall.as_secs_f64() * 1.5 + 0.05);
        let mut c = Command::new("sh");
        c.args(["-c", "exit 3"]);
        let m = run_measured(c, Duration::from_secs(10)).unwrap();
        assert!(!m.outcome.success);
        assert_eq!(m.outcome.code, "exit 3");
        let mut c = Command::new("sleep");
        c.arg("30");
        let m = run_measured(c, Duration::from_millis(300)).unwrap();
        assert!(m.outcome.timed_out && !m.outcome.success);
        assert_eq!(m.outcome.code, "killed");
    }
}
