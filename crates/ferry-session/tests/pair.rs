//! A sender session against a receiver session in memory, with simulated time and a scheduler
//! that picks at random which pending event happens next: control frames in order per
//! direction, data frames in order per connection but in any order across connections,
//! endgame copies (duplicates), connections dialled beyond the server's grant refused with
//! whatever they carried lost, and data connections reset after the sender's early report.
//! A small model of each file side stands in for `ferry-core`: the sender's cuts every file
//! into blocks once the grant is in, the receiver's keeps byte ranges and completes a file
//! when it has them all.
//!
//! Whatever the schedule, the sender must end with `Complete`, every file must be completed
//! exactly once with the sender's bytes, and `Sent` must reach the receiver behind every offer.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_proto::{Block, CompleteSummary, FileId, FileMeta, Frame, SessionId};
use ferry_session::endgame::History;
use ferry_session::recv::{RecvAction, RecvPhase, RecvSession};
use ferry_session::send::{SendAction, SendConfig, SendSample, SendSession, StreamEnd, Totals};
use ferry_session::streams::StreamPlan;
use ferry_session::{ConnSample, HostSample, SAMPLE_EVERY};
use proptest::prelude::*;

/// A tiny deterministic generator for the scheduler's choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    /// File sizes in bytes.
    files: Vec<usize>,
    block: usize,
    /// Data connections dialled, and how many the server grants.
    conns: usize,
    granted: usize,
    /// A client's put: the sender waits for `Welcome` and `Ready`.
    awaiting: bool,
    early_tuned: bool,
    /// Reset one data connection once the receiver may leave early (it has sent `Complete`
    /// and has the sender's early `Tuned`): it closes its connections then.
    reset_after_report: bool,
}

/// One data connection in the model: frames written and not yet delivered, in order.
#[derive(Default)]
struct Link {
    in_flight: VecDeque<Frame>,
    /// Refused by the server (beyond the grant) or reset: delivers nothing more.
    dead: bool,
    /// Stopped by the driver (beyond the grant), not failed.
    stopped: bool,
    /// Its end was reported to the session.
    ended: bool,
    /// Bytes delivered so far.
    delivered: u64,
}

struct Pair {
    rng: Rng,
    now: Instant,
    next_sample: Instant,
    send: SendSession,
    recv: RecvSession,
    case: Case,
    data: Vec<Vec<u8>>,
    /// The sender's frame queue towards the data connections.
    queue: VecDeque<Frame>,
    /// The walker's offers, not yet written on the control connection.
    offers: VecDeque<Frame>,
    histories: Vec<History>,
    links: Vec<Link>,
    to_recv: VecDeque<Frame>,
    to_send: VecDeque<Frame>,
    /// The server's `Welcome` and `Ready`, for a client's put.
    handshake: VecDeque<Frame>,
    /// The receiver's model: bytes held per file and whether each byte is in.
    have: Vec<Vec<Option<u8>>>,
    completed: Vec<u32>,
    done: Vec<bool>,
    offers_seen: usize,
    sent_after_offers: Option<bool>,
    expected: Option<u64>,
    granted: bool,
    reset_done: bool,
    /// Frames sent again on connection 0 for a connection the server refused.
    resent: usize,
}

const SESSION: (SessionId, [u8; 32]) = (SessionId(7), [9; 32]);

impl Pair {
    fn new(case: Case) -> Self {
        let now = Instant::now();
        let mut rng = Rng(case.seed | 1);
        let data: Vec<Vec<u8>> = case
            .files
            .iter()
            .map(|&n| (0..n).map(|_| rng.next() as u8).collect())
            .collect();
        let plan = StreamPlan {
            block_size: case.block as u32,
            early_tuned: case.early_tuned,
            ..StreamPlan::default()
        };
        let send = SendSession::new(
            SendConfig {
                plan,
                conns: case.conns,
                rtt: Duration::from_millis(20),
                awaiting: case.awaiting.then_some(SESSION),
                readers: (4, 4),
            },
            now,
        );
        let recv = RecvSession::new(now, (4, 4, false), true);
        let mut handshake = VecDeque::new();
        if case.awaiting {
            handshake.push_back(Frame::Welcome {
                version: ferry_proto::PROTOCOL_VERSION,
                capabilities: ferry_proto::Capabilities::default(),
                session: SESSION.0,
                secret: SESSION.1,
            });
            handshake.push_back(Frame::Ready {
                streams: case.granted as u16,
                block_size: case.block as u32,
            });
        }
        // A walker that offers in a few frames, then is over.
        let offers = (0..3).map(|_| Frame::Offer { entries: vec![] }).collect();
        let links = (0..case.conns).map(|_| Link::default()).collect();
        let have = data.iter().map(|d| vec![None; d.len()]).collect();
        Self {
            rng,
            now,
            next_sample: now,
            send,
            recv,
            histories: (0..case.conns)
                .map(|_| History::new(!case.awaiting))
                .collect(),
            completed: vec![0; data.len()],
            done: vec![false; data.len()],
            data,
            queue: VecDeque::new(),
            offers,
            links,
            to_recv: VecDeque::new(),
            to_send: VecDeque::new(),
            handshake,
            have,
            offers_seen: 0,
            sent_after_offers: None,
            expected: None,
            granted: !case.awaiting,
            reset_done: false,
            resent: 0,
            case,
        }
    }

    /// The sender's file side: cuts every file into blocks.
    fn cut_all(&mut self) {
        for (i, d) in self.data.iter().enumerate() {
            let meta = FileMeta {
                id: FileId(i as u64),
                path: format!("f{i}"),
                size: d.len() as u64,
                mode: 0o644,
                mtime_ns: 0,
            };
            let mut offset = 0;
            loop {
                let end = (offset + self.case.block).min(d.len());
                let chunk = Bytes::copy_from_slice(&d[offset..end]);
                self.queue.push_back(Frame::Block(Block {
                    file: meta.clone(),
                    offset: offset as u64,
                    digest: ferry_proto::block_digest(&chunk),
                    file_digest: None,
                    early: false,
                    data: chunk,
                }));
                offset = end;
                if offset >= d.len() {
                    break;
                }
            }
        }
        self.send.walked(Some(Totals {
            files: self.data.len() as u64,
            bytes: self.data.iter().map(|d| d.len() as u64).sum(),
            ..Totals::default()
        }));
    }

    fn apply_send(&mut self) {
        while let Some(a) = self.send.poll_action() {
            match a {
                SendAction::Grant { .. } => self.granted = true,
                SendAction::ResendOnFirst(i) => {
                    let frames = self.histories[i].take_frames();
                    self.resent += frames.len();
                    self.links[0].in_flight.extend(frames);
                }
                SendAction::Copy { to, frame } => {
                    if !self.links[to].dead {
                        self.histories[to].begin(&frame);
                        self.histories[to].end();
                        self.links[to].in_flight.push_back(frame);
                    }
                }
                SendAction::StopFrom(i) => {
                    for l in &mut self.links[i..] {
                        l.dead = true;
                        l.stopped = true;
                    }
                }
                // The model reads the active count from the session, has no reader threads
                // and no memory to give back.
                SendAction::Streams(_) | SendAction::Readers(_) | SendAction::Drain => {}
                other => panic!("the model does not expect {other:?}"),
            }
        }
        while let Some(f) = self.send.poll_control(!self.offers.is_empty()) {
            self.to_recv.push_back(f);
        }
    }

    fn apply_recv(&mut self) {
        while let Some(a) = self.recv.poll_action() {
            match a {
                RecvAction::Expect { files, .. } => {
                    self.sent_after_offers = Some(self.offers_seen == 3);
                    self.expected = Some(files);
                }
                RecvAction::ToWriters(_) => self.offers_seen += 1,
                RecvAction::Writers(_) => {}
            }
        }
        let all = self.completed.iter().all(|&c| c > 0);
        if all && self.expected == Some(self.data.len() as u64) {
            self.recv.resolved();
        }
        if self.recv.phase() == RecvPhase::Finishing {
            self.to_send.push_back(Frame::Complete(CompleteSummary {
                files: self.data.len() as u64,
                ..CompleteSummary::default()
            }));
            self.recv.completed();
        }
    }

    /// The receiver's file side takes a data frame.
    fn deliver(&mut self, f: Frame) {
        let Frame::Block(b) = f else { return };
        assert_eq!(ferry_proto::block_digest(&b.data), b.digest);
        let i = b.file.id.0 as usize;
        for (k, byte) in b.data.iter().enumerate() {
            let slot = &mut self.have[i][b.offset as usize + k];
            assert!(slot.is_none_or(|s| s == *byte), "a copy disagrees");
            *slot = Some(*byte);
        }
        if !self.done[i] && self.have[i].iter().all(Option::is_some) {
            self.done[i] = true;
            self.completed[i] += 1;
        }
    }

    /// One event, chosen at random among those possible.
    fn step(&mut self) {
        self.now += Duration::from_micros(self.rng.below(3000) as u64);
        let mut choices: Vec<u8> = Vec::new();
        if !self.offers.is_empty() && self.send.may_offer() {
            choices.push(0);
        }
        if !self.to_recv.is_empty() {
            choices.push(1);
        }
        if !self.to_send.is_empty() || !self.handshake.is_empty() {
            choices.push(2);
        }
        if !self.queue.is_empty() {
            choices.push(3);
        }
        if self
            .links
            .iter()
            .any(|l| !l.dead && !l.in_flight.is_empty())
        {
            choices.push(4);
        }
        choices.push(5);
        match choices[self.rng.below(choices.len())] {
            0 => {
                let f = self.offers.pop_front().expect("checked");
                self.send.offered(64);
                self.to_recv.push_back(f);
                if self.offers.is_empty() && !self.send.walk_over() {
                    self.cut_all();
                }
            }
            1 => {
                let f = self.to_recv.pop_front().expect("checked");
                self.recv.handle_control(f);
            }
            2 => {
                let f = match self.handshake.pop_front() {
                    Some(f) => f,
                    None => self.to_send.pop_front().expect("checked"),
                };
                if matches!(f, Frame::Ready { .. }) {
                    // The server welcomed the connections it grants.
                    for h in &mut self.histories[..self.case.granted] {
                        h.confirm();
                    }
                }
                self.send.handle_control(f);
            }
            3 => self.write_one(),
            4 => {
                let live: Vec<usize> = (0..self.links.len())
                    .filter(|&i| !self.links[i].dead && !self.links[i].in_flight.is_empty())
                    .collect();
                let i = live[self.rng.below(live.len())];
                self.deliver_on(i);
            }
            _ => self.sample(),
        }
        self.judge_links();
        self.apply_send();
        self.apply_recv();
        if let Some(at) = self.send.poll_timeout() {
            if self.now >= at {
                self.send.handle_timeout(self.now);
            }
        }
    }

    /// A connection the tuner lets carry data takes the next frame from the queue.
    fn write_one(&mut self) {
        let active = self.send.active() as usize;
        let open: Vec<usize> = (0..self.links.len().min(active.max(1)))
            .filter(|&i| !self.links[i].dead)
            .collect();
        if open.is_empty() {
            return;
        }
        let i = open[self.rng.below(open.len())];
        let f = self.queue.pop_front().expect("checked");
        self.histories[i].begin(&f);
        self.histories[i].end();
        self.links[i].in_flight.push_back(f);
    }

    fn deliver_on(&mut self, i: usize) {
        // A connection beyond the grant reaches a server that refuses it: lost.
        if self.case.awaiting && i >= self.case.granted {
            self.links[i].dead = true;
            return;
        }
        let f = self.links[i].in_flight.pop_front().expect("checked");
        if let Frame::Block(b) = &f {
            self.links[i].delivered += b.data.len() as u64 + 128;
        }
        self.deliver(f);
    }

    /// Reports connections that died, and resets one after the early report if asked.
    fn judge_links(&mut self) {
        if self.case.reset_after_report
            && !self.reset_done
            && self.recv.may_leave()
            && self.case.granted > 1
        {
            self.reset_done = true;
            let i = self.case.granted - 1;
            self.links[i].dead = true;
        }
        for i in 0..self.links.len() {
            if self.links[i].dead && !self.links[i].ended {
                self.links[i].ended = true;
                let end = if self.links[i].stopped {
                    StreamEnd::Stopped
                } else {
                    StreamEnd::Failed {
                        welcomed: !self.histories[i].is_unwelcomed(),
                    }
                };
                self.send.stream_ended(self.now, i, end);
            }
        }
    }

    fn sample(&mut self) {
        if self.now < self.next_sample {
            self.now = self.next_sample;
        }
        self.next_sample = self.now + SAMPLE_EVERY;
        let conns: Vec<Option<ConnSample>> = self
            .links
            .iter()
            .map(|l| {
                let unacked = l.in_flight.iter().map(frame_len).sum();
                Some(ConnSample {
                    delivered: l.delivered,
                    unacked,
                    send_rate: 10 << 20,
                    ..ConnSample::default()
                })
            })
            .collect();
        let s = SendSample {
            queue_empty: self.queue.is_empty(),
            all_queued: self.send.walk_over(),
            found: (self.data.len() as u64, 0),
            bytes_read: 0,
        };
        let mut views: Vec<&mut History> = self.histories.iter_mut().collect();
        self.send.on_sample(
            self.now,
            &s,
            &conns,
            &mut views,
            HostSample::default,
            Default::default,
        );
        // A connection's frames are written whole: it then waits for more.
        for h in &mut self.histories {
            h.wait();
        }
    }
}

fn frame_len(f: &Frame) -> u64 {
    match f {
        Frame::Block(b) => b.data.len() as u64 + 128,
        _ => 128,
    }
}

/// Runs a case to its end and checks it; returns how many frames went again on connection 0
/// and whether a connection was reset after the early report.
fn run(case: Case) -> Result<(usize, bool), TestCaseError> {
    let mut p = Pair::new(case.clone());
    for _ in 0..200_000 {
        if p.send.outcome().is_some() {
            break;
        }
        p.step();
    }
    match p.send.outcome() {
        Some(Ok(_)) => {}
        other => return Err(TestCaseError::fail(format!("{case:?}: ended {other:?}"))),
    }
    prop_assert_eq!(p.sent_after_offers, Some(true), "Sent overtook an offer");
    for (i, d) in p.data.iter().enumerate() {
        prop_assert_eq!(
            p.completed[i],
            1,
            "file {} completed {} times",
            i,
            p.completed[i]
        );
        let got: Vec<u8> = p.have[i].iter().map(|b| b.expect("complete")).collect();
        prop_assert!(&got == d, "file {} differs", i);
    }
    Ok((p.resent, p.reset_done))
}

fn cases() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        prop::collection::vec(0usize..5000, 1..6),
        prop::sample::select(vec![256usize, 1024, 4096]),
        1usize..6,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(|(seed, files, block, conns, awaiting, early, reset)| {
            (1..=conns).prop_map(move |granted| Case {
                seed,
                files: files.clone(),
                block,
                conns,
                granted: if awaiting { granted } else { conns },
                awaiting,
                early_tuned: early,
                reset_after_report: reset,
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_file_arrives_once_and_identical_whatever_the_schedule(case in cases()) {
        run(case)?;
    }
}

/// The case the grant is about: five connections dialled, one granted, and every block the
/// other four carried lost with them.
#[test]
fn blocks_on_connections_beyond_the_grant_go_again_on_the_first() {
    let mut resent = 0;
    for seed in 1..50 {
        resent += run(Case {
            seed,
            files: vec![3000, 1, 0, 4096],
            block: 256,
            conns: 5,
            granted: 1,
            awaiting: true,
            early_tuned: true,
            reset_after_report: false,
        })
        .unwrap()
        .0;
    }
    assert!(
        resent > 0,
        "no schedule had a refused connection carry a block"
    );
}

/// A receiver that leaves early closes its connections once it has sent `Complete`; a block
/// still on its way resets one at the sender, which must not fail the session.
#[test]
fn a_reset_after_the_early_report_does_not_fail_a_complete_session() {
    let mut resets = 0;
    for seed in 1..50 {
        let case = Case {
            seed,
            files: vec![5000, 3000],
            block: 1024,
            conns: 3,
            granted: 3,
            awaiting: false,
            early_tuned: true,
            reset_after_report: true,
        };
        resets += usize::from(run(case).unwrap().1);
    }
    assert!(resets > 0, "no schedule reset a connection");
}
