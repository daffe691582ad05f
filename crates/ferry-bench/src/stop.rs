//! SIGINT, SIGTERM and SIGHUP stop a sweep cleanly. Killed outright, the bench left its
//! servers running inside the namespaces, the namespaces themselves and gigabytes of data in
//! /dev/shm, until the next bench reaped them. Now the handler only sets a flag; the client
//! being waited on is killed, the sweep unwinds (servers stopped, bed torn down, work removed)
//! and the runs measured so far are written out.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Installs the handler. Handlers are reset to the default on exec, so the servers and
/// clients the bench starts still die of SIGTERM as before. A signal that was ignored stays
/// ignored (a sweep under `nohup` must survive the hangup), and the handler is one-shot: a
/// second Ctrl-C kills a clean-up that hangs.
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: sigaction(2) with valid pointers; the handler does nothing but an atomic store.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
            // On failure the signal keeps its default action: the old behaviour, no worse.
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// An error to unwind with once a stop was asked for.
pub fn check() -> anyhow::Result<()> {
    if requested() {
        anyhow::bail!("interrupted by a signal");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_only_sets_the_flag() {
        // SAFETY: restoring SIGHUP's default before installing, whatever the test runner set.
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_DFL) };
        install();
        assert!(!requested());
        // SAFETY: raising a signal whose handler was just installed.
        unsafe { libc::raise(libc::SIGHUP) };
        assert!(requested());
        assert!(check().is_err());
        STOP.store(false, Ordering::SeqCst);
    }
}
