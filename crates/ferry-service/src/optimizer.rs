//! The link optimizer: how many jobs share a link at once, and how many streams a job starts
//! with, chosen from what the link delivered (the FTS optimizer's job, from ferry's own
//! measurements rather than a guess).
//!
//! Jobs on one link compete for it: one job of a tree of small files leaves the link idle
//! between its files' commits, two fill it, and past some count more jobs only add streams
//! that hurt (the lesson that stands: streams make up for windows, too many hurt). So the
//! limit climbs one job at a time while each count moves at least [`OptimizerConfig::gain`]
//! times what the one below moved, steps back when a count moves less than the one below,
//! and drops one when attempts fail. A count is judged only over a window in which the link
//! ran that many jobs all along; a queue too short to fill the limit says nothing of it.
//! Streams: ferry's own tuner settles each transfer's stream count; the link remembers the
//! total its transfers held, and a job starts from its share of that, so that jobs sharing a
//! link do not each start from a count meant for the whole link.
//!
//! Sans I/O: the scheduler feeds it bytes moved, jobs running and jobs ended, with the time;
//! it answers with limits and starting streams, and hands out each judged tuning for the
//! store to keep across restarts.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How the optimizer judges.
#[derive(Clone, Debug)]
pub struct OptimizerConfig {
    /// The most jobs at once on one link (`ferry service --per-server`).
    pub most_jobs: usize,
    /// The limit of a link with no history yet.
    pub first_jobs: usize,
    /// How long a job count is measured before it is judged.
    pub window: Duration,
    /// A count moves at least this many times what the one below moved before one more job
    /// is tried: a gain within the noise is not worth a job's streams.
    pub gain: f64,
    /// Above this fraction of attempts failing in a window, the limit drops by one.
    pub failure_fraction: f64,
    /// Windows a limit holds before the next count up is measured again (paths change).
    pub reprobe_after: u32,
    /// The most streams a job starts with.
    pub most_streams: u32,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            most_jobs: 8,
            first_jobs: 2,
            window: Duration::from_secs(30),
            gain: 1.1,
            failure_fraction: 0.2,
            reprobe_after: 20,
            most_streams: u32::from(ferry_net::AUTO_MAX_STREAMS),
        }
    }
}

/// What the optimizer knows of one link; kept in the store, shown by `GET /api/links`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkTuning {
    /// Jobs that may run on the link at once now.
    pub jobs: usize,
    /// Bytes per second the link moved with each job count measured (newer windows weigh
    /// half).
    pub rates: BTreeMap<usize, f64>,
    /// Streams the link's transfers held together once their tuner settled; 0: not known.
    pub streams: u32,
}

/// The bytes and jobs seen since a window opened.
#[derive(Debug, Default)]
struct Window {
    opened: Option<Instant>,
    bytes: u64,
    /// Whether the link ran its whole limit of jobs at every look.
    full: bool,
    ok: u32,
    failed: u32,
}

#[derive(Debug)]
struct Link {
    tuning: LinkTuning,
    window: Window,
    /// Windows judged since the limit last moved.
    steady: u32,
}

/// The optimizer of every link the service has run jobs on.
#[derive(Debug)]
pub struct Optimizer {
    cfg: OptimizerConfig,
    links: HashMap<String, Link>,
}

impl Optimizer {
    pub fn new(cfg: OptimizerConfig) -> Self {
        Self {
            cfg,
            links: HashMap::new(),
        }
    }

    /// Takes back what the store kept of `link`, within this configuration's bounds.
    pub fn restore(&mut self, link: &str, mut tuning: LinkTuning) {
        tuning.jobs = tuning.jobs.clamp(1, self.most_jobs());
        tuning
            .rates
            .retain(|k, v| *k >= 1 && v.is_finite() && *v >= 0.0);
        self.links.insert(
            link.to_owned(),
            Link {
                tuning,
                window: Window::default(),
                steady: 0,
            },
        );
    }

    fn most_jobs(&self) -> usize {
        self.cfg.most_jobs.max(1)
    }

    fn link(&mut self, link: &str) -> &mut Link {
        let first = self.cfg.first_jobs.clamp(1, self.most_jobs());
        self.links.entry(link.to_owned()).or_insert_with(|| Link {
            tuning: LinkTuning {
                jobs: first,
                ..LinkTuning::default()
            },
            window: Window::default(),
            steady: 0,
        })
    }

    /// Jobs that may run on `link` at once.
    pub fn limit(&self, link: &str) -> usize {
        match self.links.get(link) {
            Some(l) => l.tuning.jobs,
            None => self.cfg.first_jobs.clamp(1, self.most_jobs()),
        }
    }

    /// Every link it knows of.
    pub fn links(&self) -> Vec<String> {
        self.links.keys().cloned().collect()
    }

    /// What is known of `link`, if it ran anything.
    pub fn tuning(&self, link: &str) -> Option<&LinkTuning> {
        self.links.get(link).map(|l| &l.tuning)
    }

    /// Streams a job on `link` starts with when `sharing` jobs (itself included) run there:
    /// its share of what the link's transfers settled on. `None` before any settled.
    pub fn start_streams(&self, link: &str, sharing: usize) -> Option<u32> {
        let total = self.links.get(link)?.tuning.streams;
        if total == 0 {
            return None;
        }
        let share = total.div_ceil(sharing.max(1) as u32);
        Some(share.clamp(1, self.cfg.most_streams.max(1)))
    }

    /// Jobs on `link` moved `bytes` more.
    pub fn moved(&mut self, link: &str, bytes: u64) {
        let w = &mut self.link(link).window;
        if w.opened.is_some() {
            w.bytes = w.bytes.saturating_add(bytes);
        }
    }

    /// A job on `link` ended its attempt: `ok` unless it failed; `streams`: what its tuner
    /// settled on, if it did; `sharing`: the jobs that ran on the link meanwhile, itself
    /// included.
    pub fn ended(&mut self, link: &str, ok: bool, streams: Option<u32>, sharing: usize) {
        let most = self
            .cfg
            .most_streams
            .max(1)
            .saturating_mul(self.most_jobs() as u32);
        let l = self.link(link);
        if l.window.opened.is_some() {
            if ok {
                l.window.ok += 1;
            } else {
                l.window.failed += 1;
            }
        }
        if let Some(s) = streams.filter(|s| *s > 0) {
            let total = s.saturating_mul(sharing.max(1) as u32).min(most);
            l.tuning.streams = match l.tuning.streams {
                0 => total,
                // Newer weigh half, rounded up so that one stream is never rounded away.
                old => (old + total).div_ceil(2),
            };
        }
    }

    /// Looks at `link`, where `running` jobs run now. A window that has lasted its length is
    /// judged: the link's tuning is returned then, for the store, and the limit may have
    /// moved. An idle link closes its window.
    pub fn tick(&mut self, link: &str, running: usize, now: Instant) -> Option<LinkTuning> {
        let cfg = self.cfg.clone();
        let l = self.link(link);
        if running == 0 {
            l.window = Window::default();
            return None;
        }
        let Some(opened) = l.window.opened else {
            l.window = Window {
                opened: Some(now),
                full: true,
                ..Window::default()
            };
            return None;
        };
        l.window.full &= running >= l.tuning.jobs;
        let took = now.saturating_duration_since(opened);
        if took < cfg.window {
            return None;
        }
        let rate = l.window.bytes as f64 / took.as_secs_f64().max(1e-3);
        let w = std::mem::replace(
            &mut l.window,
            Window {
                opened: Some(now),
                full: true,
                ..Window::default()
            },
        );
        let before = l.tuning.jobs;
        judge(l, &cfg, &w, rate);
        if l.tuning.jobs != before {
            tracing::info!(
                link,
                from = before,
                to = l.tuning.jobs,
                rate = rate as u64,
                "optimizer: jobs on the link changed"
            );
        }
        Some(l.tuning.clone())
    }
}

/// Judges a closed window of `link` at `rate` bytes/s: may move its limit.
fn judge(link: &mut Link, cfg: &OptimizerConfig, w: &Window, rate: f64) {
    let most = cfg.most_jobs.max(1);
    let t = &mut link.tuning;
    let level = t.jobs;
    let attempts = w.ok + w.failed;
    if w.failed > 0 && f64::from(w.failed) > cfg.failure_fraction * f64::from(attempts) {
        t.jobs = level.saturating_sub(1).max(1);
        link.steady = 0;
        return;
    }
    if !w.full || w.bytes == 0 {
        // Fewer jobs than the limit ran: the rate says nothing of it. Nothing moved: the link
        // is down or stalled, and more jobs would only pile onto it.
        return;
    }
    let here = match t.rates.get(&level) {
        Some(old) => (old + rate) / 2.0,
        None => rate,
    };
    t.rates.insert(level, here);
    let below = level.checked_sub(1).and_then(|b| t.rates.get(&b)).copied();
    let above = t.rates.get(&(level + 1)).copied();
    link.steady += 1;
    let next = if below.is_some_and(|b| here < b) {
        level - 1 // one job more moved less than one fewer
    } else if level < most
        && ((below.is_none_or(|b| here >= b * cfg.gain)
            && above.is_none_or(|a| a >= here * cfg.gain))
            // Held long enough: measured again, the path may have changed.
            || link.steady >= cfg.reprobe_after)
    {
        level + 1
    } else {
        level
    };
    if next != level {
        t.jobs = next.clamp(1, most);
        link.steady = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> OptimizerConfig {
        OptimizerConfig {
            most_jobs: 6,
            first_jobs: 2,
            window: Duration::from_secs(10),
            gain: 1.1,
            failure_fraction: 0.2,
            reprobe_after: 4,
            most_streams: 64,
        }
    }

    /// Runs one full window on "l" at the current limit, moving `rate` bytes/s; returns the
    /// limit after it is judged.
    fn window(o: &mut Optimizer, t: &mut Instant, rate: f64) -> usize {
        let jobs = o.limit("l");
        o.tick("l", jobs, *t);
        for _ in 0..10 {
            *t += Duration::from_secs(1);
            o.moved("l", rate as u64);
            if o.tick("l", jobs, *t).is_some() {
                break;
            }
        }
        o.limit("l")
    }

    /// A link whose rate grows with jobs up to `best` and falls after: (jobs → bytes/s).
    fn curve(jobs: usize, best: usize) -> f64 {
        let j = jobs as f64;
        let b = best as f64;
        if j <= b {
            100.0 * j / b * 1e6
        } else {
            100.0 * (1.0 - 0.15 * (j - b)) * 1e6
        }
    }

    #[test]
    fn climbs_while_jobs_pay_then_holds_at_the_best_count() {
        let mut o = Optimizer::new(OptimizerConfig {
            reprobe_after: 1000,
            ..cfg()
        });
        let mut t = Instant::now();
        assert_eq!(o.limit("l"), 2);
        let mut seen = vec![2];
        for _ in 0..12 {
            let jobs = o.limit("l");
            seen.push(window(&mut o, &mut t, curve(jobs, 4)));
        }
        // 2 → 3 → 4 → 5 (worse than 4) → back to 4, and there it stays.
        assert_eq!(&seen[..5], &[2, 3, 4, 5, 4], "{seen:?}");
        assert!(seen[5..].iter().all(|&j| j == 4), "{seen:?}");
        assert_eq!(o.tuning("l").unwrap().jobs, 4);
        assert!(o.tuning("l").unwrap().rates.contains_key(&5));
    }

    #[test]
    fn a_link_that_one_job_fills_stays_where_more_do_not_pay() {
        let mut o = Optimizer::new(OptimizerConfig {
            reprobe_after: 1000,
            ..cfg()
        });
        let mut t = Instant::now();
        let mut seen = Vec::new();
        for _ in 0..8 {
            seen.push(window(&mut o, &mut t, 100e6)); // the same rate at any count
        }
        // 2 → 3 (tried: nothing below 2 is known) → 3 moves no more than 2: it holds.
        assert_eq!(seen[0], 3, "{seen:?}");
        assert!(seen.iter().all(|&j| j <= 3), "{seen:?}");
        assert_eq!(*seen.last().unwrap(), 3);
    }

    #[test]
    fn a_held_limit_is_measured_again_upward() {
        let mut o = Optimizer::new(cfg()); // reprobe after 4 windows
        let mut t = Instant::now();
        let mut seen = Vec::new();
        for _ in 0..14 {
            let jobs = o.limit("l");
            seen.push(window(&mut o, &mut t, curve(jobs, 3)));
        }
        // It settles at 3 and, every few windows, tries 4 again and comes back.
        assert!(seen.iter().all(|&j| (2..=4).contains(&j)), "{seen:?}");
        let tries = seen.windows(2).filter(|w| w[0] == 3 && w[1] == 4).count();
        assert!(tries >= 2, "{seen:?}");
    }

    #[test]
    fn failures_take_a_job_off_and_the_limit_never_leaves_its_bounds() {
        let mut o = Optimizer::new(cfg());
        let mut t = Instant::now();
        o.restore(
            "l",
            LinkTuning {
                jobs: 99,
                ..LinkTuning::default()
            },
        );
        assert_eq!(o.limit("l"), 6, "clamped to most_jobs");
        for want in [5, 4, 3, 2, 1, 1] {
            let jobs = o.limit("l");
            o.tick("l", jobs, t);
            o.ended("l", false, None, jobs);
            o.ended("l", true, None, jobs);
            t += Duration::from_secs(11);
            assert!(o.tick("l", jobs, t).is_some());
            assert_eq!(o.limit("l"), want);
        }
    }

    #[test]
    fn a_window_the_queue_did_not_fill_changes_nothing() {
        let mut o = Optimizer::new(cfg());
        let mut t = Instant::now();
        for _ in 0..5 {
            o.tick("l", 1, t); // one job runs under a limit of 2
            o.moved("l", 1 << 30);
            t += Duration::from_secs(11);
            o.tick("l", 1, t);
        }
        assert_eq!(o.limit("l"), 2);
        assert!(o.tuning("l").unwrap().rates.is_empty());
    }

    #[test]
    fn an_idle_link_closes_its_window() {
        let mut o = Optimizer::new(cfg());
        let mut t = Instant::now();
        o.tick("l", 2, t);
        o.moved("l", 1 << 30);
        t += Duration::from_secs(5);
        assert!(o.tick("l", 0, t).is_none());
        // Bytes while idle count nowhere; the next window starts empty.
        o.moved("l", 1 << 30);
        t += Duration::from_secs(6);
        assert!(
            o.tick("l", 2, t).is_none(),
            "a new window opened, not judged"
        );
        t += Duration::from_secs(10);
        let tuned = o.tick("l", 2, t).expect("judged");
        // Nothing moved in it: a dark link is not judged (more jobs would pile onto it).
        assert!(tuned.rates.is_empty());
        assert_eq!(tuned.jobs, 2);
    }

    #[test]
    fn a_job_starts_from_its_share_of_the_streams_the_link_settled_on() {
        let mut o = Optimizer::new(cfg());
        assert_eq!(o.start_streams("l", 1), None, "nothing settled yet");
        // A job alone settled on 8 streams.
        o.ended("l", true, Some(8), 1);
        assert_eq!(o.start_streams("l", 1), Some(8));
        assert_eq!(o.start_streams("l", 2), Some(4));
        assert_eq!(o.start_streams("l", 3), Some(3));
        assert_eq!(o.start_streams("l", 100), Some(1));
        // Two jobs at 2 each: 4 in all; newer weigh half: (8 + 4) / 2.
        o.ended("l", true, Some(2), 2);
        assert_eq!(o.tuning("l").unwrap().streams, 6);
        // Not settled, or zero: nothing learnt.
        o.ended("l", true, None, 1);
        o.ended("l", true, Some(0), 1);
        assert_eq!(o.tuning("l").unwrap().streams, 6);
        // Never more than a job may open.
        o.ended("l", true, Some(u32::MAX), 6);
        assert_eq!(o.start_streams("l", 1), Some(64));
    }

    #[test]
    fn a_restored_tuning_is_taken_within_bounds() {
        let mut o = Optimizer::new(cfg());
        let mut rates = BTreeMap::new();
        rates.insert(0, 5.0);
        rates.insert(3, f64::NAN);
        rates.insert(4, 7.0);
        o.restore(
            "l",
            LinkTuning {
                jobs: 0,
                rates,
                streams: 12,
            },
        );
        let t = o.tuning("l").unwrap();
        assert_eq!(t.jobs, 1);
        assert_eq!(t.rates.keys().copied().collect::<Vec<_>>(), vec![4]);
        assert_eq!(o.start_streams("l", 2), Some(6));
    }
}
