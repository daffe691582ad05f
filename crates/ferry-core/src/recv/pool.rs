//! The writer pool: the threads that take frames off the data connections' queue and hand them
//! to the [`Receiver`], the receiving side's counterpart of the sender's reader pool. As there,
//! every thread is started at once and a [`Gate`] says how many take work, so a tuner can
//! change the count without starting or stopping threads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use ferry_proto::Frame;

use super::config::RecvError;
use super::receiver::Receiver;
use crate::gate::Gate;

/// Offers handed to the writers and not answered yet. While one is, a block that came ahead
/// of its file's offer may be waiting for exactly that answer, so a driver holds it instead of
/// refusing it. The driver counts an offer in ([`Deciding::queued`]) before it queues it; the
/// writer that answers it counts it out.
#[derive(Clone, Debug, Default)]
pub struct Deciding(Arc<AtomicU64>);

impl Deciding {
    /// An `Offer` frame is about to be queued for the writers.
    pub fn queued(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    fn answered(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }

    /// Offers queued and not answered yet.
    pub fn pending(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// A running writer pool (see [`Receiver::start`]).
pub struct WriterPool {
    threads: Vec<JoinHandle<()>>,
    writers: Arc<Gate>,
    written: Arc<AtomicU64>,
    deciding: Deciding,
    fatal: flume::Receiver<RecvError>,
}

/// What every writer thread shares.
struct WriterLoop {
    receiver: Arc<Receiver>,
    writers: Arc<Gate>,
    queue: flume::Receiver<Frame>,
    written: Arc<AtomicU64>,
    deciding: Deciding,
    fatal: flume::Sender<RecvError>,
    on_answered: Box<dyn Fn() + Send + Sync>,
}

impl Receiver {
    /// Starts the writer pool: `writers.max()` threads that take frames off `queue` and handle
    /// them, of which the gate lets the first `writers.active()` work. `on_answered` is called
    /// each time a writer has answered an offer (a driver may hold blocks that came ahead of
    /// theirs until then).
    ///
    /// Working writers leave once every sender of `queue` is gone and it is drained; parked
    /// ones once it is gone or the gate is closed ([`WriterPool::join`] closes it). A frame
    /// that breaks the protocol stops the writer that took it and is reported on
    /// [`WriterPool::fatal`]; the others go on until the driver ends the session.
    pub fn start(
        self: &Arc<Self>,
        writers: Arc<Gate>,
        queue: flume::Receiver<Frame>,
        on_answered: impl Fn() + Send + Sync + 'static,
    ) -> std::io::Result<WriterPool> {
        let (fatal_tx, fatal) = flume::bounded(1);
        let shared = Arc::new(WriterLoop {
            receiver: self.clone(),
            writers: writers.clone(),
            queue,
            written: Arc::default(),
            deciding: Deciding::default(),
            fatal: fatal_tx,
            on_answered: Box::new(on_answered),
        });
        let threads = (0..writers.max())
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("ferry-write-{i}"))
                    .spawn(move || shared.run(i))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(WriterPool {
            threads,
            writers,
            written: shared.written.clone(),
            deciding: shared.deciding.clone(),
            fatal,
        })
    }
}

impl WriterLoop {
    /// Writer `index`'s loop. Parked writers leave once the queue is closed; the working ones
    /// drain it.
    fn run(&self, index: u32) {
        while self
            .writers
            .wait_turn(index, || self.queue.is_disconnected())
        {
            let Ok(frame) = self.queue.recv() else { return };
            let n = match &frame {
                Frame::Block(b) => b.data.len() as u64,
                _ => 0,
            };
            let offer = matches!(frame, Frame::Offer { .. });
            let handled = self.receiver.handle(frame);
            if offer {
                self.deciding.answered();
            }
            if let Err(e) = handled {
                let _ = self.fatal.try_send(e);
                return;
            }
            if offer {
                (self.on_answered)();
            }
            self.written.fetch_add(n, Ordering::Relaxed);
        }
    }
}

impl WriterPool {
    /// The pool's gate (what the writer tuner turns).
    pub fn writers(&self) -> Arc<Gate> {
        self.writers.clone()
    }

    /// Block bytes the writers have handled so far (what the writer tuner measures).
    pub fn bytes_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Offers handed to the writers and not answered yet; the driver counts each in.
    pub fn deciding(&self) -> Deciding {
        self.deciding.clone()
    }

    /// Resolves with the first frame that broke the protocol: the session is over.
    pub fn fatal(&self) -> flume::Receiver<RecvError> {
        self.fatal.clone()
    }

    /// Closes the gate, so parked writers leave now rather than at their next recheck, and
    /// waits for every writer. The working ones leave once the queue is drained and closed:
    /// drop every sender of the queue first.
    pub fn join(self) {
        self.writers.close();
        for t in self.threads {
            let _ = t.join();
        }
    }
}
