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
    active: Mutex<u32>,
    changed: Condvar,
    max: u32,
}

/// How often a parked thread looks at its stop condition: a pool whose session ended without
/// anyone raising the gate still ends within this.
const RECHECK: Duration = Duration::from_millis(100);

impl Gate {
    /// A gate for a pool of `max` threads (at least 1) letting `start` of them work.
    pub fn new(start: u32, max: u32) -> Self {
        let max = max.max(1);
        Self {
            active: Mutex::new(start.clamp(1, max)),
            changed: Condvar::new(),
            max,
        }
    }

    /// The pool's size: how many threads to start.
    pub fn max(&self) -> u32 {
        self.max
    }

    pub fn active(&self) -> u32 {
        *self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets `n` threads work (clamped to 1..=max).
    pub fn set(&self, n: u32) {
        let n = n.clamp(1, self.max);
        let mut a = self.active.lock().unwrap_or_else(|e| e.into_inner());
        if *a != n {
            *a = n;
            self.changed.notify_all();
        }
    }

    /// Blocks thread `index` until it may take work. A parked thread returns false once
    /// `stop()` is true (checked every [`RECHECK`]). A thread that may work returns true at
    /// once without asking `stop`: its own receive tells it when the work has ended, exactly as
    /// without a gate.
    pub fn wait_turn(&self, index: u32, stop: impl Fn() -> bool) -> bool {
        let mut a = self.active.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if index < *a {
                return true;
            }
            if stop() {
                return false;
            }
            a = self
                .changed
                .wait_timeout(a, RECHECK)
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
}
