//! The scheduler: starts queued jobs side by side, higher priority first then older first,
//! as many at once against one server as the link optimizer allows (at most `per_server`),
//! each starting from its share of the streams the link settled on; writes the running jobs'
//! progress to the store (a few times a second, not per block, all of them in one transaction);
//! retries a failed attempt with exponential backoff up to `max_attempts`; stops a job that is
//! cancelled. A retry, or the run after a restart, is the same transfer again, which resumes
//! from ferry's partial files.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::history::{LinkSample, RateSample, Source};
use crate::job::{now_ms, Job, Kind, State};
use crate::notify::Notifier;
use crate::optimizer::{LinkTuning, Optimizer, OptimizerConfig};
use crate::runner::{Failure, JobReporter, Outcome, Runner};
use crate::store::{Ending, Store, TickWrite};

/// How many jobs run at once, and how failed attempts are retried.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The most jobs running at once against one server (the destination's; the source's for
    /// a get); the link optimizer chooses how many within it.
    pub per_server: usize,
    /// Jobs running at once in all.
    pub total: usize,
    /// Attempts a job gets before it fails for good (a restart after a crash counts one).
    pub max_attempts: u32,
    /// The wait before the second attempt; doubled for each after, up to `most_backoff`.
    pub first_backoff: Duration,
    pub most_backoff: Duration,
    /// How often a running job's counters are written to the store.
    pub progress_every: Duration,
    /// How the link optimizer judges (its `most_jobs` is `per_server`).
    pub optimizer: OptimizerConfig,
    /// A job whose service has not said it runs it for this long is queued again by another
    /// service sharing the queue; each service says so for its jobs a few times within it.
    pub stale_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_server: 8,
            total: 16,
            max_attempts: 5,
            first_backoff: Duration::from_secs(2),
            most_backoff: Duration::from_secs(300),
            progress_every: Duration::from_millis(500),
            optimizer: OptimizerConfig::default(),
            stale_after: STALE_AFTER,
        }
    }
}

/// [`Limits::stale_after`] by default: long beside a beat, a pause of the database or a
/// clock a little off between hosts.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// How often the queue is looked at with nothing else to wake it (a backoff ending, a
/// deadline passing).
const TICK: Duration = Duration::from_millis(500);
/// How often a running job's rate is sampled for its history.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// The most queued jobs looked at per pass.
const PASS: usize = 256;

struct Running {
    server: String,
    /// The job's driver; `None` while [`Scheduler::pass`] claims the job in the store (the
    /// entry holds its place against the limits, probes and a cancel meanwhile).
    task: Option<AbortHandle>,
    /// What each progress tick reads of the job; its driver holds it too.
    meter: Arc<Mutex<Meter>>,
}

/// A running job's counters as the progress ticks last wrote them.
struct Meter {
    reporter: Arc<JobReporter>,
    /// The bytes the optimizer was told of, and when: the progress rate's interval.
    told: (u64, Instant),
    /// The last rate sample's bytes and time.
    sampled: (u64, Instant),
    /// The attempt ended: its last writes are its driver's, not a tick's.
    ended: bool,
}

impl Meter {
    fn new(reporter: Arc<JobReporter>) -> Self {
        let now = Instant::now();
        Self {
            reporter,
            told: (0, now),
            sampled: (0, now),
            ended: false,
        }
    }
}

/// Locks a mutex that a panic elsewhere may have poisoned (what it guards stays usable).
fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A link reserved for a probe (see [`Scheduler::claim_link`]); dropping it frees the link
/// and lets the queue start what waited for it.
pub struct LinkClaim {
    scheduler: Arc<Scheduler>,
    link: String,
}

impl LinkClaim {
    pub fn link(&self) -> &str {
        &self.link
    }
}

impl Drop for LinkClaim {
    fn drop(&mut self) {
        self.scheduler.probing().remove(&self.link);
        self.scheduler.trim_if_idle();
        self.scheduler.wake();
    }
}

pub struct Scheduler {
    store: Arc<Store>,
    runner: Runner,
    limits: Limits,
    running: Mutex<HashMap<i64, Running>>,
    /// Links a probe measures now: no job starts on them meanwhile. Locked after `running`.
    probing: Mutex<HashSet<String>>,
    wake: Notify,
    /// Every byte any job moved, for `/metrics`.
    moved: Arc<AtomicU64>,
    /// Told of every job that ends.
    notifier: Option<Arc<Notifier>>,
    /// How many jobs share each link, and their streams. Locked after `running`.
    optimizer: Mutex<Optimizer>,
    /// Where the jobs' transfers run, if not on the runtime that drives them: the service
    /// gives them threads of a lower CPU priority than the API's ([`crate::service`]).
    bulk: std::sync::OnceLock<tokio::runtime::Handle>,
    /// Held by a progress tick from reading the jobs' counters to their write, and by a job's
    /// end while it takes its last counters: a tick's older counters never land after them.
    flushing: Mutex<()>,
}

/// Aborts a task when dropped: a transfer on the bulk runtime ends with the job's driver
/// (a cancel aborts the driver).
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Scheduler {
    pub fn new(store: Arc<Store>, runner: Runner, limits: Limits) -> Arc<Self> {
        Self::with_notifier(store, runner, limits, None)
    }

    /// [`Scheduler::new`], with `notifier` told of each job's end.
    pub fn with_notifier(
        store: Arc<Store>,
        runner: Runner,
        limits: Limits,
        notifier: Option<Arc<Notifier>>,
    ) -> Arc<Self> {
        let mut optimizer = Optimizer::new(OptimizerConfig {
            most_jobs: limits.per_server.max(1),
            ..limits.optimizer.clone()
        });
        match store.link_tunings() {
            Ok(kept) => {
                for (link, t) in kept {
                    optimizer.restore(&link, t);
                }
            }
            Err(e) => tracing::warn!("the links' kept tuning: {e}; starting afresh"),
        }
        Arc::new(Self {
            store,
            runner,
            limits,
            optimizer: Mutex::new(optimizer),
            running: Mutex::new(HashMap::new()),
            probing: Mutex::new(HashSet::new()),
            wake: Notify::new(),
            moved: Arc::default(),
            notifier,
            bulk: std::sync::OnceLock::new(),
            flushing: Mutex::new(()),
        })
    }

    /// Runs the jobs' transfers on `bulk` from now on (the drivers, and their store writes,
    /// stay where the scheduler runs). Set once; a second call is ignored.
    pub fn run_transfers_on(&self, bulk: tokio::runtime::Handle) {
        let _ = self.bulk.set(bulk);
    }

    /// One attempt of `job`'s transfer: on the bulk runtime when there is one, here otherwise.
    async fn attempt(
        self: &Arc<Self>,
        job: &Job,
        reporter: Arc<JobReporter>,
        streams: Option<u32>,
    ) -> Result<Outcome, Failure> {
        let Some(bulk) = self.bulk.get() else {
            return self.runner.run(job, reporter, streams).await;
        };
        let (me, job) = (self.clone(), job.clone());
        let task = bulk.spawn(async move { me.runner.run(&job, reporter, streams).await });
        let _abort = AbortOnDrop(task.abort_handle());
        task.await.unwrap_or_else(|e| {
            Err(Failure {
                message: format!("the transfer's task ended: {e}"),
                retryable: true,
            })
        })
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// How jobs reach their servers (the endpoints are the links of the path history).
    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    /// Bytes moved by all jobs since the service started.
    pub fn moved(&self) -> u64 {
        self.moved.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Jobs running now.
    pub fn running(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Running>> {
        locked(&self.running)
    }

    fn optimizer(&self) -> std::sync::MutexGuard<'_, Optimizer> {
        locked(&self.optimizer)
    }

    /// What the optimizer knows of `link`, if a job ran on it.
    pub fn link_tuning(&self, link: &str) -> Option<LinkTuning> {
        self.optimizer().tuning(link).cloned()
    }

    /// Shows the optimizer how many jobs run on each link now: windows that have lasted
    /// their length are judged, and what it learnt is kept in the store.
    fn optimize(&self) {
        let mut on: HashMap<String, usize> = HashMap::new();
        for r in self.lock().values() {
            *on.entry(r.server.clone()).or_default() += 1;
        }
        let now = Instant::now();
        let judged: Vec<(String, LinkTuning)> = {
            let mut o = self.optimizer();
            let mut links = o.links();
            links.extend(on.keys().cloned());
            links.sort();
            links.dedup();
            links
                .into_iter()
                .filter_map(|l| {
                    let running = on.get(&l).copied().unwrap_or(0);
                    o.tick(&l, running, now).map(|t| (l, t))
                })
                .collect()
        };
        for (link, t) in judged {
            if let Err(e) = self.store.save_link_tuning(&link, &t) {
                tracing::warn!("link {link}: keeping its tuning: {e}");
            }
        }
    }

    fn probing(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        locked(&self.probing)
    }

    /// Reserves `link` for a probe, or `None` while a job runs on it (or another probe does):
    /// a probe must not measure a path a transfer is using, nor slow that transfer. While the
    /// claim is held no job starts on the link.
    pub fn claim_link(self: &Arc<Self>, link: &str) -> Option<LinkClaim> {
        let running = self.lock();
        if running.values().any(|r| r.server == link) {
            return None;
        }
        if !self.probing().insert(link.to_owned()) {
            return None;
        }
        Some(LinkClaim {
            scheduler: self.clone(),
            link: link.to_owned(),
        })
    }

    /// Job `id` has ended (done, failed, cancelled): the notifications go out, in the
    /// background.
    pub fn ended(&self, id: i64) {
        let Some(n) = &self.notifier else {
            return;
        };
        match self.store.get(id) {
            Ok(Some(job)) => n.job_ended(job),
            Ok(None) => {}
            Err(e) => tracing::warn!("job {id}: reading it to notify its end: {e}"),
        }
    }

    /// `job` has ended, as the store read it back: the notifications go out, in the background.
    fn ended_as(&self, job: Job) {
        if let Some(n) = &self.notifier {
            n.job_ended(job);
        }
    }

    /// Looks at the queue now (a job was submitted).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Stops job `id` if it runs (the store already says cancelled): its transfer is dropped
    /// where it stands, its partial files stay for a later job to resume.
    pub fn stop(&self, id: i64) {
        if let Some(task) = self.lock().remove(&id).and_then(|r| r.task) {
            task.abort();
        }
        self.wake();
    }

    /// Runs the queue until `shutdown` resolves; then stops the running jobs and queues them
    /// again, so that the next start resumes them.
    pub async fn run(self: Arc<Self>, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let beat_every = self.limits.stale_after / 4;
        let mut beaten: Option<Instant> = None;
        let mut read: Option<Instant> = None;
        let ticker = tokio::spawn(self.clone().tick_progress());
        loop {
            // The store's calls on the blocking pool, here and in `drive`: a runtime worker
            // waiting on the store's lock or on its database holds up the API's requests
            // queued behind it (docs/bench/NOTEBOOK.md, "Issue 40: the service's p99 and memory").
            let me = self.clone();
            let beat = beaten.is_none_or(|t| t.elapsed() >= beat_every);
            let recent = read.is_some_and(|t| t.elapsed() < TICK);
            let started = Instant::now();
            let passed = tokio::task::spawn_blocking(move || {
                if beat {
                    if let Err(e) = me.beat() {
                        tracing::warn!("scheduler: the queue's heartbeat: {e}");
                    }
                }
                let read = me.pass(recent).unwrap_or_else(|e| {
                    tracing::warn!("scheduler: {e}");
                    true
                });
                me.optimize();
                read
            });
            if beat {
                beaten = Some(Instant::now());
            }
            if passed.await.unwrap_or(true) {
                read = Some(started);
            }
            tokio::select! {
                _ = &mut shutdown => break,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        }
        ticker.abort();
        let stopped: Vec<(i64, Running)> = self.lock().drain().collect();
        for (id, r) in stopped {
            if let Some(task) = r.task {
                task.abort();
            }
            let _ = self
                .store
                .retry_later(id, "the service stopped while the job ran", now_ms());
        }
    }

    /// Says this service still runs its jobs; queues again those of a service that has not
    /// said so within [`Limits::stale_after`]; stops those of its own that it no longer runs
    /// (cancelled through another service, or taken over after this one missed its beats).
    fn beat(&self) -> Result<(), crate::ServiceError> {
        let now = now_ms();
        self.store.beat(now)?;
        let bound = i64::try_from(self.limits.stale_after.as_millis()).unwrap_or(i64::MAX);
        let requeued = self.store.requeue_stale(now.saturating_sub(bound))?;
        if requeued > 0 {
            tracing::warn!("{requeued} job(s) of a service that stopped answering queued again");
        }
        let mine: Vec<i64> = self.lock().keys().copied().collect();
        for id in self.store.lost(&mine)? {
            self.stop(id);
        }
        Ok(())
    }

    /// Starts what the limits allow, in queue order; fails queued jobs whose deadline passed.
    /// With every slot taken and the queue read less than [`TICK`] ago (`recent`), reads
    /// nothing and says so (false): each submit wakes a pass, and under a burst of them each
    /// read a page of the queue under the store's lock to start nothing.
    fn pass(self: &Arc<Self>, recent: bool) -> Result<bool, crate::ServiceError> {
        if recent && self.lock().len() >= self.limits.total {
            return Ok(false);
        }
        let now = now_ms();
        for job in self.store.runnable(now, PASS)? {
            if job.deadline.is_some_and(|d| d.saturating_mul(1000) < now) {
                if self
                    .store
                    .expire(job.id, "its deadline passed before it could start")?
                {
                    self.ended(job.id);
                }
                continue;
            }
            let streams = {
                let mut running = self.lock();
                if running.len() >= self.limits.total {
                    break;
                }
                let on_server = running.values().filter(|r| r.server == job.server).count();
                let (limit, streams) = {
                    let o = self.optimizer();
                    let limit = o.limit(&job.server).min(self.limits.per_server.max(1));
                    (limit, o.start_streams(&job.server, on_server + 1))
                };
                if on_server >= limit || running.contains_key(&job.id) {
                    continue;
                }
                if self.probing().contains(&job.server) {
                    continue;
                }
                // Its place taken before the claim, the running jobs' lock let go for it: the
                // claim waits on the store's lock, and the progress tick, a job's end and
                // `/metrics` wait on this one.
                let reporter = Arc::new(JobReporter::new(self.moved.clone(), self.runner.pace));
                running.insert(
                    job.id,
                    Running {
                        server: job.server.clone(),
                        task: None,
                        meter: Arc::new(Mutex::new(Meter::new(reporter))),
                    },
                );
                streams
            };
            let claimed = self.store.start(job.id);
            let mut running = self.lock();
            let kept = matches!(claimed, Ok(true));
            match running.get_mut(&job.id) {
                Some(r) if kept => {
                    let meter = r.meter.clone();
                    let drive = self.clone().drive(job, streams, meter);
                    r.task = Some(tokio::spawn(drive).abort_handle());
                }
                Some(_) => {
                    running.remove(&job.id);
                }
                None if kept => {
                    // Stopped while it was claimed: a cancel, which has already marked the
                    // row (then this does nothing), or a stop for a job not (yet) running here.
                    // Given back if it is still this service's, as a stopped service does.
                    drop(running);
                    self.store
                        .retry_later(job.id, "stopped as it started", now_ms())?;
                }
                None => {}
            }
            claimed?;
        }
        Ok(true)
    }

    /// Every `progress_every` until aborted: the running jobs' counters and rate samples,
    /// written together ([`Scheduler::write_progress`]) on the blocking pool.
    async fn tick_progress(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.limits.progress_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || me.write_progress()).await;
        }
    }

    /// One progress tick: every running job's counters and rate since the last tick, a rate
    /// sample for each whose last is [`SAMPLE_EVERY`] old, all in one store call (one take
    /// of its lock, one transaction). A job no longer this service's is skipped there; the
    /// beat stops it.
    fn write_progress(&self) {
        let _flushing = locked(&self.flushing);
        let meters: Vec<(i64, String, Arc<Mutex<Meter>>)> = self
            .lock()
            .iter()
            .filter(|(_, r)| r.task.is_some())
            .map(|(&id, r)| (id, r.server.clone(), r.meter.clone()))
            .collect();
        let (now, t_ms) = (Instant::now(), now_ms());
        let mut writes = Vec::with_capacity(meters.len());
        let mut moved = Vec::with_capacity(meters.len());
        for (id, server, meter) in meters {
            let mut m = locked(&meter);
            if m.ended {
                continue;
            }
            let mut p = m.reporter.snapshot();
            let delta = p.bytes_done.saturating_sub(m.told.0);
            p.rate = delta as f64 / now.duration_since(m.told.1).as_secs_f64().max(1e-3);
            m.told = (p.bytes_done, now);
            let sample = (now.duration_since(m.sampled.1) >= SAMPLE_EVERY).then(|| {
                let s = rate_sample(p.bytes_done, m.sampled, now, t_ms);
                m.sampled = (p.bytes_done, now);
                s
            });
            moved.push((server, delta));
            writes.push(TickWrite {
                id,
                progress: p,
                sample,
            });
        }
        {
            let mut o = self.optimizer();
            for (server, delta) in &moved {
                o.moved(server, *delta);
            }
        }
        match self.store.progress_many(&writes) {
            Ok(skipped) if !skipped.is_empty() => {
                tracing::debug!("jobs {skipped:?} no longer run here: their progress not written");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("recording the running jobs' progress: {e}"),
        }
    }

    /// One attempt of `job`, its transfers starting from `streams` when the optimizer gives
    /// a start, counted in `meter` (the progress ticks write it), then its end recorded: done,
    /// failed, or queued again after a backoff.
    async fn drive(self: Arc<Self>, job: Job, streams: Option<u32>, meter: Arc<Mutex<Meter>>) {
        let started = Instant::now();
        let reporter = locked(&meter).reporter.clone();
        let result = self.attempt(&job, reporter, streams).await;
        let me = self.clone();
        let ended = move || me.conclude(job, result, &meter, started);
        let _ = tokio::task::spawn_blocking(ended).await;
    }

    /// The end of one attempt of `job`: its last counters and rate sample, its state and, done,
    /// its rate into its link's history, in one store call ([`Store::conclude`]: one take of
    /// its lock); the optimizer told of its last bytes; and, when no other job runs, the
    /// memory its transfers held given back.
    fn conclude(
        &self,
        job: Job,
        result: Result<Outcome, Failure>,
        meter: &Mutex<Meter>,
        started: Instant,
    ) {
        let (end, told, sampled) = {
            let _flushing = locked(&self.flushing);
            let mut m = locked(meter);
            m.ended = true;
            (m.reporter.snapshot(), m.told, m.sampled)
        };
        let last = TickWrite {
            id: job.id,
            progress: end,
            sample: Some(rate_sample(
                end.bytes_done,
                sampled,
                Instant::now(),
                now_ms(),
            )),
        };
        self.tell_optimizer(&job, &result, end.bytes_done.saturating_sub(told.0));
        // A done job's achieved rate, for its link's history. A copy between two servers is
        // left out (its bytes never crossed the service's link), as is a job that moved
        // nothing (a sync with nothing to do has no rate to speak of).
        let transfer = (job.kind != Kind::Cp && end.bytes_done > 0).then(|| LinkSample {
            t_ms: now_ms(),
            rate: end.bytes_done as f64 / started.elapsed().as_secs_f64().max(1e-3),
            rtt_ms: None,
            loss: None,
            source: Source::Transfer,
            job: Some(job.id),
        });
        let why;
        let ending = match &result {
            Ok(o) if o.errors.is_empty() => Ending::Final {
                state: State::Done,
                error: None,
            },
            Ok(o) => {
                why = format!("{} file(s) failed: {}", o.errors.len(), o.errors.join("; "));
                Ending::Final {
                    state: State::Failed,
                    error: Some(&why),
                }
            }
            // `job.attempts` is the count before this attempt started.
            Err(f) if f.retryable && job.attempts + 1 < self.limits.max_attempts => {
                let wait = self.backoff(job.attempts + 1);
                Ending::Retry {
                    error: &f.message,
                    not_before_ms: now_ms().saturating_add(wait.as_millis() as i64),
                }
            }
            Err(f) => Ending::Final {
                state: State::Failed,
                error: Some(&f.message),
            },
        };
        let read_back = self.notifier.is_some();
        let transfer = transfer.as_ref().map(|s| (job.server.as_str(), s));
        match self.store.conclude(&last, ending, transfer, read_back) {
            // Not ended here when cancelled meanwhile: the cancel told of it.
            Ok(c) => {
                if let Some(j) = c.job {
                    self.ended_as(j);
                }
            }
            Err(e) => tracing::warn!("job {}: recording its end: {e}", job.id),
        }
        let idle = {
            let mut running = self.lock();
            running.remove(&job.id);
            running.is_empty()
        };
        if idle {
            self.trim_if_idle();
        }
        self.wake();
    }

    /// With no job running and no probe measuring, gives back what the last jobs had in
    /// flight (`ferry_core::buf::trim`: the block-buffer pool and the allocator's free pages),
    /// as `ferry serve` does when its last session ends: a service idle between bursts holds
    /// its own memory, not that of its largest burst (docs/bench/NOTEBOOK.md, "Issue 40: the
    /// service's p99 and memory").
    fn trim_if_idle(&self) {
        if self.lock().is_empty() && self.probing().is_empty() {
            // Off the runtime's workers: `malloc_trim` walks every arena.
            match tokio::runtime::Handle::try_current() {
                Ok(h) => drop(h.spawn_blocking(ferry_core::buf::trim)),
                Err(_) => ferry_core::buf::trim(),
            }
        }
    }

    /// An attempt on `job`'s link ended: its last bytes, whether it failed, and the streams
    /// its tuner settled on while the jobs now on the link shared it.
    fn tell_optimizer(&self, job: &Job, result: &Result<Outcome, Failure>, last: u64) {
        let sharing = self
            .lock()
            .values()
            .filter(|r| r.server == job.server)
            .count();
        let mut o = self.optimizer();
        o.moved(&job.server, last);
        let streams = result.as_ref().ok().and_then(|r| r.streams);
        o.ended(&job.server, result.is_ok(), streams, sharing);
    }

    /// The wait after attempt `n` (1-based): `first_backoff` doubled each time, capped.
    fn backoff(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(20);
        self.limits
            .first_backoff
            .saturating_mul(1 << doublings)
            .min(self.limits.most_backoff)
    }
}

/// A rate sample at `bytes` taken `now` (`t_ms` in unix ms): the rate since `prev`, the last
/// sample's bytes and time.
fn rate_sample(bytes: u64, prev: (u64, Instant), now: Instant, t_ms: i64) -> RateSample {
    let dt = now.duration_since(prev.1).as_secs_f64().max(1e-3);
    RateSample {
        t_ms,
        bytes_done: bytes,
        rate: bytes.saturating_sub(prev.0) as f64 / dt,
    }
}
