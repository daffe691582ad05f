//! `buf::drain` switches the process-wide pool off, so it has a test binary to itself.

use ferry_core::buf;

#[test]
fn after_drain_returned_buffers_are_freed_not_pooled() {
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
