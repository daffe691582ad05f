//! How many threads of a pool may take work: the knob that the reader and writer tuners turn.
//!
//! The pool is started at its largest size once; a gate then lets threads `0..active` take
//! work and parks the rest. Changing the count is one store and a wake-up, with no thread
//! started or stopped mid-transfer, so a tuner can probe a neighbour and come back cheaply.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Threads `0..active()` of a pool may take work; the others wait.
#[derive(Debug)]
pub struct Gate {
    state: Mutex<State>,
    changed: Condvar,
    max: u32,
}

#[derive(Debug)]
struct State {
    active: u32,
    closed: bool,
}

/// How often a parked thread looks at its stop condition, for sessions that end without
/// [`Gate::close`] (a dropped queue): the pool still ends within this. Closing wakes parked
/// threads at once; waiting for this timer instead put the end of every transfer with parked
/// threads (auto-tuned pools, the default) on a 100 ms grid (the session joins its pool
/// before it returns).
const RECHECK: Duration = Duration::from_millis(100);

impl Gate {
    /// A gate for a pool of `max` threads (at least 1) letting `start` of them work.
    pub fn new(start: u32, max: u32) -> Self {
        let max = max.max(1);
        Self {
            state: Mutex::new(State {
                active: start.clamp(1, max),
                closed: false,
            }),
            changed: Condvar::new(),
            max,
        }
    }

    /// The pool's size: how many threads to start.
    pub fn max(&self) -> u32 {
        self.max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn active(&self) -> u32 {
        self.lock().active
    }

    /// Lets `n` threads work (clamped to 1..=max).
    pub fn set(&self, n: u32) {
        let n = n.clamp(1, self.max);
        let mut st = self.lock();
        if st.active != n {
            st.active = n;
            self.changed.notify_all();
        }
    }

    /// The work has ended: parked threads leave now instead of at their next recheck. Threads
    /// that may work are not affected (their own receive ends them).
    pub fn close(&self) {
        let mut st = self.lock();
        if !st.closed {
            st.closed = true;
            self.changed.notify_all();
        }
    }

    /// Blocks thread `index` until it may take work. A parked thread returns false once the
    /// gate is closed, or once `stop()` is true (checked every [`RECHECK`]). A thread that may
    /// work returns true at once without asking `stop`: its own receive tells it when the work
    /// has ended, exactly as without a gate.
    pub fn wait_turn(&self, index: u32, stop: impl Fn() -> bool) -> bool {
        let mut st = self.lock();
        loop {
            if index < st.active {
                return true;
            }
            if st.closed || stop() {
                return false;
            }
            st = self
                .changed
                .wait_timeout(st, RECHECK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn only_the_first_active_threads_pass_and_raising_wakes_the_rest() {
        let gate = Arc::new(Gate::new(2, 4));
        assert_eq!((gate.active(), gate.max()), (2, 4));
        let stop = Arc::new(AtomicBool::new(false));
        let passed = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let (g, s, p) = (gate.clone(), stop.clone(), passed.clone());
                std::thread::spawn(move || {
                    if g.wait_turn(i, || s.load(Ordering::Acquire)) {
                        p.fetch_add(1, Ordering::AcqRel);
                    }
                })
            })
            .collect();
        // Threads 0 and 1 pass; 2 and 3 wait (bounded: 100 polls of 10 ms).
        for _ in 0..100 {
            if passed.load(Ordering::Acquire) == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(passed.load(Ordering::Acquire), 2);
        gate.set(3);
        for _ in 0..100 {
            if passed.load(Ordering::Acquire) == 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(passed.load(Ordering::Acquire), 3);
        // The last one gives up when told to stop, without the gate being raised.
        stop.store(true, Ordering::Release);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(passed.load(Ordering::Acquire), 3);
    }

    #[test]
    fn counts_are_clamped() {
        let g = Gate::new(0, 0);
        assert_eq!((g.active(), g.max()), (1, 1));
        let g = Gate::new(9, 4);
        assert_eq!(g.active(), 4);
        g.set(0);
        assert_eq!(g.active(), 1);
        g.set(100);
        assert_eq!(g.active(), 4);
    }

    #[test]
    fn closing_releases_parked_threads_whose_stop_never_comes() {
        let gate = Arc::new(Gate::new(1, 3));
        let (tx, rx) = std::sync::mpsc::channel();
        let threads: Vec<_> = (0..3)
            .map(|i| {
                let (g, tx) = (gate.clone(), tx.clone());
                // `stop` is never true: only `close` can let a parked thread go.
                std::thread::spawn(move || tx.send((i, g.wait_turn(i, || false))).unwrap())
            })
            .collect();
        let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(first, (0, true));
        gate.close();
        let mut rest: Vec<_> = (0..2)
            .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
            .collect();
        rest.sort();
        assert_eq!(rest, vec![(1, false), (2, false)]);
        // The working thread is not stopped by closing: it still passes.
        assert!(gate.wait_turn(0, || true));
        for t in threads {
            t.join().unwrap();
        }
    }
}
