//! Recycled block buffers.
//!
//! A block buffer is megabytes; the allocator serves such sizes with fresh `mmap`s, so every
//! block would cost thousands of page faults and the kernel zeroing each page (seen as
//! `clear_page_erms` at the top of a profile). Buffers are instead returned here when the last
//! `Bytes` slice of them is dropped and handed out again. The pool keeps as many bytes as were
//! ever in flight at once since it was last emptied (at least [`MAX_POOLED_BYTES`], at most
//! [`MOST_POOLED_BYTES`]): a smaller pool freed buffers that the next blocks then faulted in
//! afresh, and what was in flight was held anyway. A server empties it with [`release`] when
//! it has no session left, so an idle daemon does not sit on the memory of its last burst.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use bytes::Bytes;

/// Buffers smaller than this come from the allocator as usual: it recycles them cheaply.
const MIN_POOLED: usize = 256 << 10;
/// Memory the pool may always keep idle: eight default-sized blocks.
const MAX_POOLED_BYTES: usize = 64 << 20;
/// The most it keeps however much was in flight: a server session's default memory bound.
const MOST_POOLED_BYTES: usize = 1 << 30;

/// Bytes of pooled buffers handed out and not back yet, and their most since the pool was
/// last emptied: the pool keeps up to that much.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
/// Set by [`drain`]: buffers coming back are freed, not kept.
static DRAINING: AtomicBool = AtomicBool::new(false);
/// The most the pool keeps idle when the process has set it ([`set_idle_limit`]); else
/// `usize::MAX`, and the bounds above hold.
static IDLE_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Bounds what the pool keeps idle to `bytes`, whatever was in flight: for a long-lived
/// process whose transfers are many and slow (the service, whose links, not page faults, set
/// the pace), where the pool should not grow to its largest burst. `usize::MAX`: the default
/// bounds. With a bound, the allocator's mmap threshold is also fixed at the pool's smallest
/// buffer: glibc raises its own to the largest chunk freed and then serves blocks from its
/// arenas, which keep them when freed; fixed, a block the pool does not keep goes back to the
/// kernel (docs/bench/NOTEBOOK.md, "Issue 40: the service's p99 and memory").
pub fn set_idle_limit(bytes: usize) {
    IDLE_LIMIT.store(bytes, Ordering::Relaxed);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if bytes != usize::MAX {
        // SAFETY: mallopt takes no pointers; glibc serialises it with the main arena's lock.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MIN_POOLED as libc::c_int);
        }
    }
}

/// Gives every idle buffer back to the allocator.
pub fn release() {
    let idle = std::mem::take(&mut *POOL.lock().unwrap_or_else(|e| e.into_inner()));
    // The next burst learns its own size.
    PEAK.store(IN_FLIGHT.load(Ordering::Relaxed), Ordering::Relaxed);
    drop(idle);
}

/// Empties the pool and has the allocator return its free pages (`malloc_trim`), pooling on:
/// for a process that goes on between bursts (the service when no job runs), so that it does
/// not keep what its last burst had in flight.
pub fn trim() {
    release();
    malloc_trim();
}

fn malloc_trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; glibc serialises it with every arena's lock.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Gives the process's idle memory back to the kernel ahead of its exit, for a client whose
/// last blocks are on their way: from here on, buffers coming back are freed rather than
/// pooled, the pool is emptied and the allocator returns its free pages (`malloc_trim`).
///
/// Why: the kernel frees a process's pages inside its exit, and a client that moved 1 GiB held
/// ~280 MB (blocks in flight, the pool, the allocator's free lists): 22 ms of `exit_group`
/// after the last `Complete` had arrived. Done while the last bytes cross the network it
/// costs no wait (exit 3–13 ms; docs/bench/NOTEBOOK.md, "The first window"). Buffers taken later
/// still work, unpooled; a server never calls this.
pub fn drain() {
    {
        // Under the pool's lock, so no buffer comes back between the flag and the release.
        let _pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        DRAINING.store(true, Ordering::Relaxed);
    }
    release();
    malloc_trim();
}

/// Pools buffers again after a [`drain`]: a put that fails after its drain and retries in the
/// same process should not run its next attempt unpooled.
pub fn undrain() {
    DRAINING.store(false, Ordering::Relaxed);
}

/// Bytes the pool holds idle (for tests and reports).
pub fn idle_bytes() -> usize {
    let pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    pool.iter().map(Vec::capacity).sum()
}

/// An empty buffer with room for at least `cap` bytes, recycled when possible.
pub fn take(cap: usize) -> Vec<u8> {
    if cap >= MIN_POOLED {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = pool.iter().rposition(|b| b.capacity() >= cap) {
            let mut b = pool.swap_remove(i);
            b.clear();
            return b;
        }
    }
    Vec::with_capacity(cap)
}

/// Wraps a buffer as `Bytes` that returns it to the pool when the last slice is dropped.
pub fn freeze(buf: Vec<u8>) -> Bytes {
    if buf.capacity() < MIN_POOLED {
        return Bytes::from(buf);
    }
    let now = IN_FLIGHT.fetch_add(buf.capacity(), Ordering::Relaxed) + buf.capacity();
    PEAK.fetch_max(now, Ordering::Relaxed);
    Bytes::from_owner(Pooled(buf))
}

struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        IN_FLIGHT.fetch_sub(buf.capacity(), Ordering::Relaxed);
        let most = PEAK
            .load(Ordering::Relaxed)
            .clamp(MAX_POOLED_BYTES, MOST_POOLED_BYTES)
            .min(IDLE_LIMIT.load(Ordering::Relaxed));
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if DRAINING.load(Ordering::Relaxed) {
            drop(pool);
            return; // `buf` is freed here, outside the lock
        }
        let held: usize = pool.iter().map(Vec::capacity).sum();
        if held + buf.capacity() <= most {
            pool.push(buf);
        }
    }
}

// The pool's tests are in tests/pool.rs and tests/drain.rs: the pool is process-wide, so each
// needs a test binary of its own to assert exactly what comes back.
