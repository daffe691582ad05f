//! Recycled block buffers.
//!
//! A block buffer is megabytes; the allocator serves such sizes with fresh `mmap`s, so every
//! block would cost thousands of page faults and the kernel zeroing each page (seen as
//! `clear_page_erms` at the top of a profile). Buffers are instead returned here when the last
//! `Bytes` slice of them is dropped and handed out again. The pool is bounded in bytes (a few
//! blocks' worth beyond what is in flight), and a server empties it with [`release`] when it
//! has no session left, so an idle daemon does not sit on the memory of its last burst.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use bytes::Bytes;

/// Buffers smaller than this come from the allocator as usual: it recycles them cheaply.
const MIN_POOLED: usize = 256 << 10;
/// Most memory the pool keeps idle: eight default-sized blocks.
const MAX_POOLED_BYTES: usize = 64 << 20;

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
/// Set by [`drain`]: buffers coming back are freed, not kept.
static DRAINING: AtomicBool = AtomicBool::new(false);

/// Gives every idle buffer back to the allocator.
pub fn release() {
    let idle = std::mem::take(&mut *POOL.lock().unwrap_or_else(|e| e.into_inner()));
    drop(idle);
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
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; glibc serialises it with every arena's lock.
    unsafe {
        libc::malloc_trim(0);
    }
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
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if DRAINING.load(Ordering::Relaxed) {
            drop(pool);
            return; // `buf` is freed here, outside the lock
        }
        let held: usize = pool.iter().map(Vec::capacity).sum();
        if held + buf.capacity() <= MAX_POOLED_BYTES {
            pool.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back() {
        let mut b = take(1 << 20);
        b.extend_from_slice(&[7u8; 1000]);
        let ptr = b.as_ptr();
        let bytes = freeze(b);
        let slice = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(&slice[..], &[7u8; 10]);
        drop(slice);
        let again = take(1 << 20);
        assert!(again.is_empty());
        // Another test thread may have taken it first; when we got it, it is the same memory.
        if again.capacity() == 1 << 20 {
            let _ = ptr == again.as_ptr();
        }
    }
}
