//! The block buffer pool is process-wide, and the library's own tests take buffers from it in
//! parallel, so this test has a binary to itself: what it takes back is what it gave.

use ferry_core::buf;

#[test]
fn buffers_come_back() {
    assert_eq!(buf::idle_bytes(), 0, "nothing else here uses the pool");
    let mut b = buf::take(1 << 20);
    b.extend_from_slice(&[7u8; 1000]);
    let ptr = b.as_ptr();
    let bytes = buf::freeze(b);
    let slice = bytes.slice(10..20);
    drop(bytes);
    // A slice still holds the buffer: it is not back yet, and a take gets other memory.
    assert_eq!(buf::idle_bytes(), 0, "back while a slice still holds it");
    let other = buf::take(1 << 20);
    assert_ne!(
        other.as_ptr(),
        ptr,
        "handed out while a slice still reads it"
    );
    drop(other);
    assert_eq!(&slice[..], &[7u8; 10]);
    drop(slice);
    // The last slice gone, the same memory comes back, empty.
    assert!(buf::idle_bytes() >= 1 << 20, "not returned to the pool");
    let again = buf::take(1 << 20);
    assert!(again.is_empty());
    assert_eq!(again.as_ptr(), ptr, "the buffer was not recycled");
    assert_eq!(buf::idle_bytes(), 0);
    // Small buffers are left to the allocator.
    drop(buf::freeze(buf::take(4096)));
    assert_eq!(buf::idle_bytes(), 0);
}

/// More in flight than the pool's floor (64 MiB): all of it is kept when it comes back, so
/// the next burst reuses it instead of faulting fresh pages in; `release` empties the pool and
/// forgets the burst.
#[test]
fn the_pool_keeps_what_was_in_flight() {
    const BLOCK: usize = 16 << 20;
    // 160 MiB in flight at once.
    let held: Vec<_> = (0..10).map(|_| buf::freeze(buf::take(BLOCK))).collect();
    drop(held);
    assert!(
        buf::idle_bytes() >= 10 * BLOCK,
        "{} idle after 160 MiB in flight",
        buf::idle_bytes()
    );
    buf::release();
    assert_eq!(buf::idle_bytes(), 0);
    // One block at a time: the burst is small, the floor holds (64 MiB).
    for _ in 0..10 {
        drop(buf::freeze(buf::take(BLOCK)));
    }
    assert!(buf::idle_bytes() <= 64 << 20, "{}", buf::idle_bytes());
    buf::release();
}
