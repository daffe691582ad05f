//! Issue order of a disk measurement's requests, after XDD's `-serialordering`,
//! `-looseordering` and `-noordering`.
//!
//! A point cuts a file into `n` requests of `size` bytes; request `k` covers `[k·size,
//! (k+1)·size)`. `T` threads issue them:
//!
//! - **serial**: request `k` belongs to thread `k mod T`, and it is issued only after request
//!   `k − 1` has *completed*. Requests go in strict offset order with exactly one in flight:
//!   each thread waits its turn. This measures what ordering costs (a hand-off per request), and
//!   is what a device sees from one sequential stream.
//! - **loose**: threads take the next request from a shared cursor (an atomic counter over
//!   `0, 1, …, n − 1`) and issue it without waiting for anyone. Requests are *issued* in
//!   increasing offset order — globally by the cursor, and therefore per thread — but up to `T`
//!   are in flight and they complete in any order. This is how ferry's readers and writers work
//!   through a file's blocks.
//! - **none**: as loose, but the cursor walks a random permutation of the requests (a
//!   Fisher–Yates shuffle seeded per point, so runs repeat): random offsets, up to `T` in flight.
//!
//! Every mode issues every request at most once; a point stops early at its deadline or at the
//! first error.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How the threads of a point order their requests (see the module docs for exact definitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IssueOrder {
    Serial,
    Loose,
    None,
}

impl IssueOrder {
    pub const ALL: [IssueOrder; 3] = [IssueOrder::Serial, IssueOrder::Loose, IssueOrder::None];

    pub fn name(self) -> &'static str {
        match self {
            IssueOrder::Serial => "serial",
            IssueOrder::Loose => "loose",
            IssueOrder::None => "none",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == s)
    }
}

impl std::fmt::Display for IssueOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The offsets of `requests` requests of `size` bytes, in the order the cursor hands them out:
/// `0, size, 2·size, …` for serial and loose, a seeded random permutation of those for none.
pub fn request_offsets(order: IssueOrder, requests: usize, size: u64, seed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..requests as u64).map(|k| k * size).collect();
    if order == IssueOrder::None {
        let mut state = seed;
        for i in (1..v.len()).rev() {
            let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
    v
}

/// Which requests (indices into the offsets) thread `t` of `threads` issues under serial order:
/// `t, t + T, t + 2T, …`. Under loose and none it is decided at run time by the shared cursor.
pub fn serial_assignment(t: usize, threads: usize, requests: usize) -> Vec<usize> {
    (t..requests).step_by(threads.max(1)).collect()
}

/// What a run of requests did.
#[derive(Debug)]
pub(crate) struct RunOutcome {
    /// Requests that completed.
    pub requests: u64,
    pub elapsed: Duration,
    /// Stopped by the deadline before every request was issued.
    pub timed_out: bool,
    pub error: Option<io::Error>,
}

/// Runs the requests at `offsets` (in cursor order, see [`request_offsets`]) on `threads`
/// threads in the given order. `make_worker(t)` is called on thread `t` before the clock starts
/// (allocate buffers, open files there); the worker it returns is called once per request with
/// the request's offset. The clock stops when every thread is done; the point stops issuing at
/// `max_time` or at the first error.
pub(crate) fn run_requests<M, W>(
    order: IssueOrder,
    offsets: &[u64],
    threads: usize,
    max_time: Duration,
    make_worker: M,
) -> RunOutcome
where
    M: Fn(usize) -> io::Result<W> + Sync,
    W: FnMut(u64) -> io::Result<()>,
{
    let threads = threads.max(1);
    let n = offsets.len();
    let cursor = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let abort = AtomicBool::new(false);
    let timed_out = AtomicBool::new(false);
    let error: Mutex<Option<io::Error>> = Mutex::new(None);
    // Serial: the index of the request whose turn it is.
    let turn = Mutex::new(0usize);
    let turn_cv = Condvar::new();
    let barrier = Barrier::new(threads + 1);

    let fail = |e: io::Error| {
        let mut g = error.lock().unwrap();
        if g.is_none() {
            *g = Some(e);
        }
        abort.store(true, Ordering::SeqCst);
    };
    // Wakes serial waiters so that they see `abort`.
    let wake_all = || {
        let _g = turn.lock().unwrap();
        turn_cv.notify_all();
    };

    // The scope joins every thread before it returns the start time.
    let start = std::thread::scope(|s| {
        for t in 0..threads {
            let (cursor, done, abort, timed_out) = (&cursor, &done, &abort, &timed_out);
            let (turn, turn_cv, barrier) = (&turn, &turn_cv, &barrier);
            let (make_worker, fail, wake_all) = (&make_worker, &fail, &wake_all);
            s.spawn(move || {
                let worker = make_worker(t);
                barrier.wait();
                let mut worker = match worker {
                    Ok(w) => w,
                    Err(e) => {
                        fail(e);
                        wake_all();
                        return;
                    }
                };
                let deadline = Instant::now() + max_time;
                let expired = || {
                    let late = Instant::now() >= deadline;
                    if late {
                        timed_out.store(true, Ordering::SeqCst);
                        abort.store(true, Ordering::SeqCst);
                    }
                    late
                };
                match order {
                    IssueOrder::Serial => {
                        for k in serial_assignment(t, threads, n) {
                            {
                                let mut g = turn.lock().unwrap();
                                while *g != k && !abort.load(Ordering::SeqCst) {
                                    g = turn_cv.wait(g).unwrap();
                                }
                            }
                            if abort.load(Ordering::SeqCst) || expired() {
                                wake_all();
                                return;
                            }
                            let r = worker(offsets[k]);
                            if let Err(e) = r {
                                fail(e);
                                wake_all();
                                return;
                            }
                            done.fetch_add(1, Ordering::SeqCst);
                            let mut g = turn.lock().unwrap();
                            *g = k + 1;
                            turn_cv.notify_all();
                        }
                    }
                    IssueOrder::Loose | IssueOrder::None => loop {
                        if abort.load(Ordering::SeqCst) || expired() {
                            return;
                        }
                        let k = cursor.fetch_add(1, Ordering::SeqCst);
                        if k >= n {
                            return;
                        }
                        if let Err(e) = worker(offsets[k]) {
                            fail(e);
                            return;
                        }
                        done.fetch_add(1, Ordering::SeqCst);
                    },
                }
            });
        }
        barrier.wait();
        Instant::now()
    });
    let elapsed = start.elapsed();
    let requests = done.load(Ordering::SeqCst) as u64;
    RunOutcome {
        requests,
        elapsed,
        timed_out: timed_out.load(Ordering::SeqCst) && (requests as usize) < n,
        error: error.into_inner().unwrap(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI64;

    #[test]
    fn offsets_per_mode() {
        const M: u64 = 1 << 20;
        let serial = request_offsets(IssueOrder::Serial, 6, M, 1);
        assert_eq!(serial, vec![0, M, 2 * M, 3 * M, 4 * M, 5 * M]);
        assert_eq!(request_offsets(IssueOrder::Loose, 6, M, 1), serial);

        let none = request_offsets(IssueOrder::None, 64, M, 7);
        let mut sorted = none.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, request_offsets(IssueOrder::Loose, 64, M, 7));
        assert_ne!(none, sorted, "a shuffle of 64 is not the identity");
        assert_eq!(none, request_offsets(IssueOrder::None, 64, M, 7), "seeded");
        assert_ne!(none, request_offsets(IssueOrder::None, 64, M, 8));

        assert_eq!(serial_assignment(1, 3, 8), vec![1, 4, 7]);
        assert_eq!(serial_assignment(0, 1, 3), vec![0, 1, 2]);
        assert_eq!(serial_assignment(5, 8, 4), Vec::<usize>::new());
    }

    /// Runs a point with a worker that records `(thread, offset)` in issue order and the most
    /// requests ever in flight at once.
    fn record(order: IssueOrder, n: usize, threads: usize) -> (Vec<(usize, u64)>, i64, RunOutcome) {
        let offsets = request_offsets(order, n, 4096, 3);
        let log = Mutex::new(Vec::new());
        let in_flight = AtomicI64::new(0);
        let max_in_flight = AtomicI64::new(0);
        let out = run_requests(order, &offsets, threads, Duration::from_secs(10), |t| {
            let (log, in_flight, max_in_flight) = (&log, &in_flight, &max_in_flight);
            Ok(move |off: u64| {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                max_in_flight.fetch_max(now, Ordering::SeqCst);
                log.lock().unwrap().push((t, off));
                std::thread::sleep(Duration::from_micros(200));
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
        });
        (log.into_inner().unwrap(), max_in_flight.into_inner(), out)
    }

    #[test]
    fn serial_is_one_at_a_time_in_offset_order_round_robin() {
        let (log, max, out) = record(IssueOrder::Serial, 20, 4);
        assert_eq!(out.requests, 20);
        assert!(out.error.is_none() && !out.timed_out);
        assert_eq!(max, 1);
        let expect: Vec<(usize, u64)> = (0..20).map(|k| (k % 4, k as u64 * 4096)).collect();
        assert_eq!(log, expect);
    }

    #[test]
    fn loose_issues_in_increasing_offsets_and_overlaps() {
        let (log, max, out) = record(IssueOrder::Loose, 40, 4);
        assert_eq!(out.requests, 40);
        // Each request exactly once, and per thread increasing.
        let mut all: Vec<u64> = log.iter().map(|&(_, o)| o).collect();
        all.sort_unstable();
        assert_eq!(all, (0..40).map(|k| k * 4096).collect::<Vec<u64>>());
        for t in 0..4 {
            let mine: Vec<u64> = log.iter().filter(|l| l.0 == t).map(|l| l.1).collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "thread {t}: {mine:?}");
        }
        assert!(max > 1, "loose keeps several requests in flight");
    }

    #[test]
    fn none_is_random_and_complete() {
        let (log, _, out) = record(IssueOrder::None, 40, 2);
        assert_eq!(out.requests, 40);
        let issued: Vec<u64> = log.iter().map(|&(_, o)| o).collect();
        let mut sorted = issued.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..40).map(|k| k * 4096).collect::<Vec<u64>>());
        assert_ne!(issued, sorted);
    }

    #[test]
    fn stops_at_deadline_and_on_error() {
        for order in IssueOrder::ALL {
            let offsets = request_offsets(order, 1000, 4096, 1);
            let out = run_requests(order, &offsets, 3, Duration::from_millis(30), |_| {
                Ok(|_| {
                    std::thread::sleep(Duration::from_millis(2));
                    Ok(())
                })
            });
            assert!(out.timed_out, "{order}");
            assert!(
                out.requests > 0 && out.requests < 1000,
                "{order}: {}",
                out.requests
            );
            assert!(out.elapsed < Duration::from_secs(2));

            let out = run_requests(order, &offsets, 3, Duration::from_secs(10), |_| {
                let mut left = 5;
                Ok(move |_| {
                    left -= 1;
                    if left == 0 {
                        Err(io::Error::other("boom"))
                    } else {
                        Ok(())
                    }
                })
            });
            assert_eq!(out.error.unwrap().to_string(), "boom", "{order}");
            assert!(out.requests < 1000);

            let out = run_requests(order, &offsets, 2, Duration::from_secs(10), |t| {
                if t == 1 {
                    Err(io::Error::other("no worker"))
                } else {
                    Ok(|_| Ok(()))
                }
            });
            assert!(out.error.is_some(), "{order}");
        }
    }
}
