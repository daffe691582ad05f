//! `buf::drain` switches the process-wide pool off, and `buf::set_idle_limit` bounds it, so
//! they have a test binary to themselves.

use ferry_core::buf;

/// The pool is the process's: one test at a time.
static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn after_drain_returned_buffers_are_freed_not_pooled() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut b = buf::take(1 << 20);
    b.extend_from_slice(&[1u8; 4096]);
    drop(buf::freeze(b));
    assert!(
        buf::idle_bytes() >= 1 << 20,
        "the pool keeps a returned buffer"
    );
    // A block still on its way when the drain comes back later.
    let mut late = buf::take(2 << 20);
    late.extend_from_slice(&[2u8; 4096]);
    let late = buf::freeze(late);
    buf::drain();
    assert_eq!(buf::idle_bytes(), 0);
    drop(late);
    assert_eq!(
        buf::idle_bytes(),
        0,
        "a buffer returned after the drain is freed"
    );
    // Buffers still work, unpooled.
    let mut again = buf::take(1 << 20);
    again.extend_from_slice(&[3u8; 10]);
    let again = buf::freeze(again);
    assert_eq!(&again[..], &[3u8; 10]);
    drop(again);
    assert_eq!(buf::idle_bytes(), 0);
    // A retry in the same process pools again.
    buf::undrain();
    drop(buf::freeze(buf::take(1 << 20)));
    assert!(buf::idle_bytes() >= 1 << 20);
}

/// The service's bound: what comes back beyond the limit is freed, whatever was in flight;
/// `trim` empties the pool and it pools again after.
#[test]
fn an_idle_limit_bounds_the_pool_and_trim_empties_it() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    buf::undrain();
    buf::release();
    buf::set_idle_limit(2 << 20);
    let held: Vec<_> = (0..4).map(|_| buf::freeze(buf::take(1 << 20))).collect();
    drop(held);
    let idle = buf::idle_bytes();
    assert!(
        (1 << 20..=2 << 20).contains(&idle),
        "{idle} idle, the limit 2 MiB"
    );
    buf::trim();
    assert_eq!(buf::idle_bytes(), 0);
    drop(buf::freeze(buf::take(1 << 20)));
    assert!(buf::idle_bytes() >= 1 << 20, "pools again after a trim");
    buf::set_idle_limit(usize::MAX);
    buf::release();
}
