//! The end of a transfer: blocks that a slow data connection still holds are sent again on an
//! idle one.
//!
//! Why: a connection carries each block at its own share of the path, and once the sender has
//! read everything, the transfer lasts as long as its slowest connection takes to empty. At
//! long RTT one connection's share can stay small for a second (BBR raises its estimate by a
//! quarter per eight round trips, and a flow in ProbeRTT sends four segments per round trip):
//! in 2 of 14 puts of 1 GiB at 100 ms on the bed, the last 2 % took 0.8–1.0 s instead of
//! 0.17 s, carried by two connections with windows of 70 segments while the others were idle.
//! Cutting the last blocks small ([`crate::cut::TAIL_SPLIT`]) shortens that, but only a
//! second copy on an idle connection removes it. The receiver keeps byte ranges: it writes a
//! copy's bytes where it does not have them all yet and counts each range once, so a copy
//! costs only bandwidth, and is sent only while the path has room for it (or to get past a
//! stuck connection).
//!
//! Sans-I/O: the driver hands in what the kernel says about each connection and the time.
//!
//! ```text
//! per connection (History):  begin(block) ─▶ outstanding ─prune: TCP has it─▶ forgotten
//! per session (Endgame):     armed (everything read and queued, the queue empty)
//!                            ∧ some connection idle (flushed, waiting, nothing outstanding)
//!                              ─▶ outstanding blocks of each late or stuck connection,
//!                                 each (file, offset, length) once per session, cut into
//!                                 pieces dealt to the idle connections
//! ```
//! A connection is late when its outstanding bytes would take longer than two round trips
//! (plus [`LATE_FLOOR`]) at its current rate while the path has room (it carries, over the
//! last round trip, less than half its best rate since the endgame was armed); it is stuck
//! when it has delivered nothing for four round trips (plus [`STALLED_AFTER`]) while holding
//! blocks, which also catches a connection that sends nothing at all. Once the receiver has
//! everything it says `Complete`, and the sender resets connections still writing copies
//! nobody needs (`engine::send_stream`).

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use ferry_proto::{Block, FileId, Frame};

/// Bytes a connection may hold above what its TCP socket reports as not yet acknowledged: its
/// write buffer (256 KiB) and what TLS has encrypted but not yet handed to the socket (rustls
/// holds up to 64 KiB), with room to spare. Overestimating only sends a block twice.
pub const UNSEEN_SLACK: u64 = 384 << 10;

/// Added to two round trips before a connection's backlog counts as late: at short RTTs,
/// connections ending a few milliseconds apart are the normal end, not a straggler.
pub const LATE_FLOOR: Duration = Duration::from_millis(100);

/// Added to four round trips before a block counts as stuck, whatever the rate says.
pub const STALLED_AFTER: Duration = Duration::from_millis(200);

/// The shortest span over which the path's rate is measured (at least one round trip).
const RATE_WINDOW: Duration = Duration::from_millis(100);

/// Most block bytes one connection remembers: memory stays bounded even when the kernel does
/// not say what it holds. Blocks beyond it are forgotten oldest first (they cannot be sent
/// again, which only costs the endgame's help for them).
pub const HISTORY_CAP: u64 = 16 << 20;

/// Frame bytes counted per block on top of its data (header, file metadata, digests): an
/// approximation well inside [`UNSEEN_SLACK`].
const BLOCK_OVERHEAD: u64 = 128;

/// A block handed to a connection, and where it ends in what the connection carried.
struct Sent {
    end: u64,
    len: u64,
    block: Block,
}

/// What one data connection was given and may not yet have delivered. Its task records each
/// frame before writing it ([`History::begin`], [`History::end`]); the driver prunes it.
#[derive(Default)]
pub struct History {
    /// Bytes of frames written to the connection, counted when their write ends: while a
    /// large frame is under way, part of it may be in the kernel already, and counting it
    /// whole from the start would let blocks before it look delivered too early.
    written: u64,
    /// The frame being written, if any: its size.
    writing: Option<u64>,
    /// Flushed and waiting for a frame: nothing of it is left outside the kernel.
    waiting: bool,
    blocks: VecDeque<Sent>,
    held: u64,
    /// Bytes the peer had when that count last moved (or when nothing was outstanding), and
    /// when: a connection holding blocks whose count stands still is stuck.
    progress: (u64, Option<Instant>),
    /// Whether the server has yet to welcome the connection. Until it has, nothing is
    /// forgotten: what TCP delivered to a server that then refuses the connection was never
    /// received.
    unwelcomed: bool,
    /// Frames other than blocks given to it before its `Welcome` (directories, symlinks,
    /// failures): lost with it if the server refuses it.
    unwelcomed_other: Vec<Frame>,
}

impl History {
    /// `confirmed`: the connection was welcomed before it carried anything.
    pub fn new(confirmed: bool) -> Self {
        Self {
            unwelcomed: !confirmed,
            ..Self::default()
        }
    }

    /// Bytes of the frames it remembers (a small frame counted as [`BLOCK_OVERHEAD`]).
    pub fn held(&self) -> u64 {
        self.held + BLOCK_OVERHEAD * self.unwelcomed_other.len() as u64
    }

    /// Whether the server has yet to welcome the connection.
    pub fn is_unwelcomed(&self) -> bool {
        self.unwelcomed
    }

    /// The server welcomed the connection: what TCP delivered, it has.
    pub fn confirm(&mut self) {
        self.unwelcomed = false;
        self.unwelcomed_other = Vec::new();
    }

    /// Every frame the connection was given and may not have delivered, for a connection the
    /// server refused: they go again on another.
    pub fn take_frames(&mut self) -> Vec<Frame> {
        self.held = 0;
        let mut frames = std::mem::take(&mut self.unwelcomed_other);
        frames.extend(self.blocks.drain(..).map(|s| Frame::Block(s.block)));
        frames
    }

    /// A frame is about to be written; `len` is its size on the wire (or close to it).
    pub fn begin(&mut self, frame: &Frame) {
        let len = match frame {
            Frame::Block(b) => b.data.len() as u64 + BLOCK_OVERHEAD,
            // Directory, symlink and failure frames are small and not sent twice: the
            // receiver's handling of them is not meant to run twice.
            _ => BLOCK_OVERHEAD,
        };
        self.writing = Some(len);
        self.waiting = false;
        if self.unwelcomed && !matches!(frame, Frame::Block(_)) {
            self.unwelcomed_other.push(frame.clone());
        }
        if let Frame::Block(block) = frame {
            self.blocks.push_back(Sent {
                end: self.written + len,
                len,
                block: block.clone(),
            });
            self.held += len;
            while self.held > HISTORY_CAP {
                self.pop_front();
            }
        }
    }

    /// The frame begun last has been written (to the connection's buffers).
    pub fn end(&mut self) {
        self.written += self.writing.take().unwrap_or(0);
    }

    /// The connection has flushed its buffers and waits for a frame (or is parked).
    pub fn wait(&mut self) {
        self.waiting = true;
    }

    /// Forgets the blocks that have reached the peer: `unacked` is what the kernel holds of
    /// this connection (not yet sent, or sent and not yet acknowledged); `None` when it cannot
    /// say, and then nothing is kept, since nothing could be judged late.
    fn prune(&mut self, unacked: Option<u64>) {
        if self.unwelcomed {
            return;
        }
        let Some(unacked) = unacked else {
            self.blocks.clear();
            self.held = 0;
            return;
        };
        // A connection waiting for work has flushed: all it holds is in the kernel.
        let slack = if self.waiting { 0 } else { UNSEEN_SLACK };
        let horizon = self.written.saturating_sub(unacked.saturating_add(slack));
        // The frame being written ends beyond `written`, so it is always kept.
        while self.blocks.front().is_some_and(|b| b.end <= horizon) {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some(b) = self.blocks.pop_front() {
            self.held -= b.len;
        }
    }

    /// Waiting for work with nothing outstanding: the connection could carry a copy now.
    fn is_idle(&self) -> bool {
        self.waiting && self.blocks.is_empty()
    }
}

/// What the driver knows about one data connection at a tick.
pub struct Conn<'a> {
    pub history: &'a mut History,
    /// Bytes its socket holds unsent or unacknowledged (`None`: `TCP_INFO` failed).
    pub unacked: Option<u64>,
    /// Its current sending rate, bytes per second (0 when unknown).
    pub rate: u64,
    /// Bytes it has delivered so far (`TcpInfo::delivered`).
    pub delivered: u64,
    /// Whether it takes frames from the queue (the stream tuner may park it).
    pub active: bool,
}

/// What one tick decided: blocks to send again, and the idle connections to carry them.
/// Cut and assigned by [`Copies::pieces`], after the driver has let go of the histories.
#[derive(Default)]
pub struct Copies {
    blocks: Vec<Block>,
    to: Vec<usize>,
}

impl Copies {
    /// Each block cut into as many pieces as there are idle connections (see [`slices`]),
    /// the pieces dealt to them in turn: (connection, frame).
    pub fn pieces(&self) -> impl Iterator<Item = (usize, Frame)> + '_ {
        let ways = self.to.len();
        self.blocks
            .iter()
            .flat_map(move |b| slices(b, ways))
            .zip(self.to.iter().copied().cycle())
            .map(|(f, i)| (i, f))
    }
}

/// The session's endgame: which blocks went out a second time, and the path's rate since it
/// was armed.
#[derive(Default)]
pub struct Endgame {
    /// (file, offset, length) of every block copied: a piece of a copy starts where its
    /// block does but is shorter, so a stuck copy can itself be copied, in smaller pieces.
    copied: HashSet<(FileId, u64, u64)>,
    blocks: u64,
    bytes: u64,
    /// The highest rate the path carried (bytes per second, all connections, over a round
    /// trip) since it was armed: about what it carries while every connection has work.
    full: f64,
    /// (time, bytes delivered on all connections) over the last round trip.
    samples: VecDeque<(Instant, u64)>,
}

impl Endgame {
    /// One tick: prunes every history and, when `armed` (everything is read and queued, the
    /// queue is empty), says which blocks to send again and which idle connections take
    /// them. Each block (file, offset, length) is copied at most once per session.
    pub fn tick(
        &mut self,
        now: Instant,
        rtt: Duration,
        armed: bool,
        conns: &mut [Conn<'_>],
    ) -> Copies {
        for c in conns.iter_mut() {
            c.history.prune(c.unacked);
            let h = &mut *c.history;
            if h.blocks.is_empty() || h.progress.0 != c.delivered || h.progress.1.is_none() {
                h.progress = (c.delivered, Some(now));
            }
        }
        // What the path carries now, over the last round trip (at least `RATE_WINDOW`).
        let total = conns
            .iter()
            .map(|c| c.delivered)
            .fold(0, u64::saturating_add);
        let window = rtt.max(RATE_WINDOW);
        self.samples.push_back((now, total));
        while self
            .samples
            .get(1)
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) >= window)
        {
            self.samples.pop_front();
        }
        let rate = self.samples.front().and_then(|&(t, base)| {
            let span = now.saturating_duration_since(t);
            (span >= window / 2).then(|| total.saturating_sub(base) as f64 / span.as_secs_f64())
        });
        let mut out = Copies::default();
        if !armed {
            return out;
        }
        if let Some(r) = rate {
            self.full = self.full.max(r);
        }
        // Only a connection with nothing of its own outstanding takes copies: one holding
        // blocks would be carrying its own, or delaying its own behind them.
        out.to = conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.active && c.history.is_idle())
            .map(|(i, _)| i)
            .collect();
        if out.to.is_empty() {
            return out;
        }
        // Copies only help while the path has room. Judged by each connection's own rate
        // instead, with 16 connections at 100 ms, copies went out as soon as one connection
        // was idle (0.7-25 MB per 1 GiB put) and the puts ended no sooner: the copies competed
        // with the originals for a path the other connections still filled.
        let room = rate.is_some_and(|r| r < self.full / 2.0);
        let late_after = rtt * 2 + LATE_FLOOR;
        let stuck_after = rtt * 4 + STALLED_AFTER;
        for (i, c) in conns.iter().enumerate() {
            if c.history.blocks.is_empty() {
                continue;
            }
            let backlog = Duration::from_secs_f64(c.history.held as f64 / c.rate.max(1) as f64);
            // Only while the path has room, however far behind a connection's own rate says
            // it is: that rate is an estimate (pacing, or window per round trip). Under 0.1 %
            // loss at 100 ms, connections above the 8 the tuner held read 0.18-0.22 MB/s with
            // 0.7-5 MB each, and had windows of 360-500 segments when the same put ended.
            // Copying whatever looked twice as slow as the path needed for everything sent
            // 3-22 MB again per 1 GiB put and left the median where it was (+0.9%, 8 pairs).
            let late = room && backlog > late_after;
            // Nothing delivered for that long while holding blocks: stuck, room or not.
            let stuck = c
                .history
                .progress
                .1
                .is_some_and(|t| now.saturating_duration_since(t) > stuck_after);
            if !late && !stuck {
                continue;
            }
            let before = out.blocks.len();
            for Sent { block, .. } in &c.history.blocks {
                let len = block.data.len() as u64;
                if self.copied.insert((block.file.id, block.offset, len)) {
                    self.blocks += 1;
                    self.bytes += len;
                    out.blocks.push(block.clone());
                }
            }
            if out.blocks.len() > before {
                tracing::debug!(
                    connection = i,
                    held = c.history.held,
                    rate = c.rate,
                    late,
                    stuck,
                    path_rate = rate.unwrap_or(0.0) as u64,
                    full = self.full as u64,
                    blocks = out.blocks.len() - before,
                    "endgame: copying what a connection holds"
                );
            }
        }
        out
    }

    /// Blocks and data bytes sent a second time so far.
    pub fn copied(&self) -> (u64, u64) {
        (self.blocks, self.bytes)
    }
}

/// The smallest piece a copy is cut into ([`crate::cut::MIN_CUT_BLOCK`]).
const MIN_SLICE: usize = crate::cut::MIN_CUT_BLOCK as usize;

/// A block's copy, cut into up to `ways` pieces of at least [`MIN_SLICE`] (whole 64 KiB
/// multiples) so that every idle connection can carry part of it: a put ended 0.44 s after a
/// 5.5 MB block was copied whole for one idle connection. Each piece is a block of its own, with its
/// own digest; only the piece that ends the file carries the file's digest. The receiver keeps
/// byte ranges, so pieces and the whole original may arrive in any order.
fn slices(block: &Block, ways: usize) -> impl Iterator<Item = Frame> + '_ {
    let len = block.data.len();
    let piece = len
        .div_ceil(ways.max(1))
        .next_multiple_of(64 << 10)
        .max(MIN_SLICE)
        .min(len.max(1));
    (0..len.max(1)).step_by(piece).map(move |at| {
        let data = block.data.slice(at..(at + piece).min(len));
        let end = at + data.len() == len;
        Frame::Block(Block {
            file: block.file.clone(),
            offset: block.offset + at as u64,
            digest: ferry_proto::block_digest(&data),
            file_digest: if end { block.file_digest.clone() } else { None },
            // A copy means what its block meant to the receiver.
            early: block.early,
            data,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use ferry_proto::FileMeta;

    fn block(file: u64, offset: u64, len: usize) -> Frame {
        Frame::Block(Block {
            file: FileMeta {
                id: FileId(file),
                path: format!("f{file}"),
                size: 1 << 30,
                mode: 0o644,
                mtime_ns: 0,
            },
            offset,
            digest: 0,
            early: false,
            file_digest: None,
            data: Bytes::from(vec![0u8; len]),
        })
    }

    fn write(h: &mut History, f: &Frame) {
        h.begin(f);
        h.end();
    }

    /// A history holding `n` blocks of 1 MiB of file `file`.
    fn holding(file: u64, n: u64) -> History {
        let mut h = History::default();
        for i in 0..n {
            write(&mut h, &block(file, i * MIB as u64, MIB));
        }
        h
    }

    const RTT: Duration = Duration::from_millis(100);
    const MIB: usize = 1 << 20;

    #[test]
    fn blocks_the_kernel_has_acknowledged_are_forgotten_and_the_rest_kept() {
        let mut h = holding(1, 8);
        // The socket holds 2 MiB: with the slack, the last three blocks may not have arrived.
        h.prune(Some(2 * MIB as u64));
        assert_eq!(h.blocks.len(), 3);
        assert_eq!(h.held, 3 * (MIB as u64 + BLOCK_OVERHEAD));
        h.prune(Some(0));
        assert_eq!(
            h.blocks.len(),
            1,
            "within the slack, the last block is kept"
        );
        assert!(!h.is_idle());
        h.wait();
        h.prune(Some(0));
        assert!(
            h.is_idle(),
            "flushed, and the kernel holds nothing: all delivered"
        );
    }

    #[test]
    fn a_block_being_written_is_never_forgotten() {
        let mut h = History::default();
        h.begin(&block(1, 0, 8 * MIB));
        h.prune(Some(0));
        assert_eq!(h.blocks.len(), 1);
        h.end();
        h.prune(Some(0));
        assert_eq!(h.blocks.len(), 1, "it may still be in the write buffer");
        h.wait();
        h.prune(Some(0));
        assert!(h.is_idle(), "flushed and nothing in the socket: delivered");
    }

    #[test]
    fn a_connection_whose_kernel_cannot_be_asked_keeps_nothing() {
        let mut h = holding(1, 1);
        h.prune(None);
        assert!(h.blocks.is_empty());
    }

    #[test]
    fn memory_stays_under_the_cap_whatever_the_kernel_says() {
        let h = holding(1, 64);
        assert!(h.held <= HISTORY_CAP);
        assert_eq!(
            h.blocks.len() as u64,
            HISTORY_CAP / (MIB as u64 + BLOCK_OVERHEAD)
        );
    }

    #[test]
    fn only_blocks_are_copied() {
        let mut h = History::default();
        write(&mut h, &Frame::Skipped { file: FileId(3) });
        assert!(
            h.blocks.is_empty(),
            "a small frame leaves nothing to send again"
        );
        assert_eq!(h.written, BLOCK_OVERHEAD);
    }

    /// Connections as the driver sees them, ticked every 25 ms: each delivers at its `rate`
    /// while it holds blocks, and its socket holds everything it was given.
    struct Path {
        t0: Instant,
        ms: u64,
        conns: Vec<(History, u64, u64, bool)>, // history, rate (bytes/s), delivered, active
        eg: Endgame,
        /// A connection whose delivered count stands still whatever its rate says.
        frozen: Option<usize>,
    }

    impl Path {
        fn new(conns: Vec<(History, u64)>) -> Self {
            Self {
                t0: Instant::now(),
                ms: 0,
                conns: conns.into_iter().map(|(h, r)| (h, r, 0, true)).collect(),
                eg: Endgame::default(),
                frozen: None,
            }
        }

        /// Connection `i` has delivered what it held and waits for work.
        fn drain(&mut self, i: usize) {
            let h = &mut self.conns[i].0;
            h.blocks.clear();
            h.held = 0;
            h.wait();
        }

        /// Runs `ms` of 25-ms ticks; returns the connection each piece of a copy went to.
        fn run(&mut self, ms: u64, armed: bool) -> Vec<usize> {
            let mut out = Vec::new();
            for _ in 0..ms / 25 {
                self.ms += 25;
                let now = self.t0 + Duration::from_millis(self.ms);
                let frozen = self.frozen;
                let mut conns: Vec<Conn<'_>> = self
                    .conns
                    .iter_mut()
                    .enumerate()
                    .map(|(i, (h, rate, delivered, active))| {
                        if !h.is_idle() && frozen != Some(i) {
                            *delivered += *rate / 40;
                        }
                        Conn {
                            unacked: Some(h.held),
                            rate: *rate,
                            delivered: *delivered,
                            active: *active,
                            history: h,
                        }
                    })
                    .collect();
                let copies = self.eg.tick(now, RTT, armed, &mut conns);
                out.extend(copies.pieces().map(|(i, _)| i));
            }
            out
        }
    }

    #[test]
    fn a_slow_connections_backlog_goes_out_again_once_the_path_has_room() {
        // A fast connection (115 MB/s) and a slow one (6.25 MB/s, 50 Mbit/s) holding 4 MiB.
        let mut p = Path::new(vec![
            (holding(1, 4), 6_250_000),
            (holding(2, 4), 115_000_000),
        ]);
        assert!(
            p.run(300, false).is_empty(),
            "not armed: the queue still has work"
        );
        assert!(
            p.run(200, true).is_empty(),
            "armed, but no connection is idle"
        );
        p.drain(1);
        // The path's rate over the last round trip falls below half its best; the slow
        // connection's 4 MiB would take 0.67 s at its rate.
        let copies = p.run(200, true);
        assert_eq!(copies, vec![1; 4], "whole, to the one idle connection");
        assert_eq!(p.eg.copied(), (4, 4 * MIB as u64));
        assert!(p.run(500, true).is_empty(), "each block is copied once");
    }

    #[test]
    fn a_backlog_is_not_copied_while_the_others_still_fill_the_path() {
        // 16 connections at 7.8 MB/s (1 Gbit/s shared), each holding 3 MiB (0.4 s at its
        // rate); one by one they finish.
        let mut p = Path::new((0..16).map(|i| (holding(i, 3), 7_800_000)).collect());
        p.run(200, true);
        for i in 0..8 {
            p.drain(i);
            assert!(
                p.run(100, true).is_empty(),
                "{} of 16 still sending",
                15 - i
            );
        }
        // Fewer than half are left: the path has room, and their backlogs go out again, each
        // block cut in four so that the nine idle connections share them.
        p.drain(8);
        let copies = p.run(200, true);
        assert_eq!(p.eg.copied(), (7 * 3, 7 * 3 * MIB as u64));
        assert_eq!(copies.len(), 7 * 3 * 4);
    }

    #[test]
    fn connections_ending_together_are_left_alone() {
        // The last connection holds 4 MiB at 31 MB/s: 0.13 s, within 2 × 100 ms + 100 ms.
        let mut p = Path::new(vec![
            (holding(1, 4), 31_250_000),
            (holding(2, 4), 94_000_000),
        ]);
        p.run(200, true);
        p.drain(1);
        assert!(p.run(400, true).is_empty());
    }

    #[test]
    fn a_parked_connection_is_not_counted_as_idle() {
        let mut p = Path::new(vec![(holding(1, 4), 1_000_000), (History::default(), 0)]);
        p.conns[1].0.wait();
        p.conns[1].3 = false;
        assert!(p.run(2000, true).is_empty());
    }

    #[test]
    fn a_connection_that_delivers_nothing_is_copied_however_busy_the_path() {
        // Its write never returns; the kernel holds nothing of it and its rate looks high,
        // while another connection still fills the path and a third waits idle.
        let mut stuck = History::default();
        stuck.begin(&block(1, 0, 256 << 10));
        let mut p = Path::new(vec![
            (stuck, 125_000_000),
            (holding(2, 8), 125_000_000),
            (History::default(), 0),
        ]);
        p.frozen = Some(0);
        p.conns[2].0.wait();
        // Stuck after 4 × 100 ms + 200 ms without delivering anything (seen from the first
        // tick, at 25 ms).
        assert!(p.run(600, true).is_empty());
        assert_eq!(p.run(50, true), vec![2], "to the idle connection");
    }

    #[test]
    fn a_connection_holding_blocks_of_its_own_takes_no_copies() {
        // Connection 0 is stuck; connection 1 has flushed and waits, but its socket still
        // holds a block; connection 2 is idle. Only 2 may carry the copy.
        let mut stuck = History::default();
        stuck.begin(&block(1, 0, 256 << 10));
        let mut waiting = holding(2, 1);
        waiting.wait();
        let mut p = Path::new(vec![
            (stuck, 125_000_000),
            (waiting, 1_000),
            (History::default(), 0),
        ]);
        p.frozen = Some(0);
        p.conns[2].0.wait();
        let copies = p.run(1000, true);
        assert!(!copies.is_empty());
        assert!(copies.iter().all(|&i| i == 2), "{copies:?}");
    }

    #[test]
    fn blocks_before_a_frame_being_written_stay_until_the_kernel_has_them() {
        let mut h = holding(1, 2);
        // An 8 MiB block is under way, 2 MiB of it already in the kernel with the 2 MiB
        // before it: nothing before it counts as delivered.
        h.begin(&block(1, 2 * MIB as u64, 8 * MIB));
        h.prune(Some(4 * MIB as u64));
        assert_eq!(h.blocks.len(), 3);
        h.end();
        h.wait();
        h.prune(Some(8 * MIB as u64));
        assert_eq!(
            h.blocks.len(),
            1,
            "flushed, the kernel holds only the last 8 MiB"
        );
    }

    #[test]
    fn a_connection_that_looks_far_behind_is_not_copied_while_the_path_is_full() {
        // One connection's rate reads 0.34 MB/s with 5 MiB held (15 s), while eight others
        // fill the path and one waits idle: its rate is only an estimate, and it still moves.
        let mut conns = vec![(holding(1, 5), 340_000), (History::default(), 0)];
        conns.extend((2..10).map(|i| (holding(i, 8), 15_600_000)));
        let mut p = Path::new(conns);
        p.conns[1].0.wait();
        assert!(p.run(1000, true).is_empty());
    }

    #[test]
    fn a_copy_is_cut_for_the_idle_connections_and_keeps_the_file_digest_at_the_end() {
        let data = Bytes::from(
            (0..(5 << 20) + 12_345)
                .map(|i| i as u8)
                .collect::<Vec<u8>>(),
        );
        let whole = Block {
            file: FileMeta {
                id: FileId(9),
                path: "f".into(),
                size: (1 << 30) + data.len() as u64,
                mode: 0o644,
                mtime_ns: 0,
            },
            offset: 1 << 30,
            digest: ferry_proto::block_digest(&data),
            file_digest: Some(Bytes::from_static(b"file digest")),
            early: true,
            data: data.clone(),
        };
        for ways in [0, 1, 3, 8, 64] {
            let pieces: Vec<Block> = slices(&whole, ways)
                .map(|f| match f {
                    Frame::Block(b) => b,
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(pieces.len(), ways.clamp(1, 21), "{ways} ways");
            let mut at = whole.offset;
            for (k, p) in pieces.iter().enumerate() {
                assert_eq!(p.offset, at, "contiguous");
                assert_eq!(p.digest, ferry_proto::block_digest(&p.data));
                let last = k + 1 == pieces.len();
                assert_eq!(p.file_digest.is_some(), last, "only the end carries it");
                if !last {
                    assert!(p.data.len() >= MIN_SLICE && p.data.len() % (64 << 10) == 0);
                }
                at += p.data.len() as u64;
            }
            assert_eq!(at, whole.offset + data.len() as u64);
        }
        let empty = Block {
            data: Bytes::new(),
            ..whole
        };
        assert_eq!(
            slices(&empty, 4).count(),
            1,
            "an empty block stays one frame"
        );
    }
}
