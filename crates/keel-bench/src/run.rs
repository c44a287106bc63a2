//! Runs a workload against a target: client threads, warm-up, the timed window, retries and
//! latency histograms.
//!
//! Each thread walks its pre-drawn [`Stream`] in batches of the worker's pipelining depth.
//! A batch's latency runs from its first attempt to its last commit, so retries after
//! aborts count in it; every transaction of the batch records that latency. Only
//! transactions that start inside the timed window are counted; warm-up is discarded.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;

use crate::target::Target;
use crate::workload::Stream;

/// Attempts of one batch before the run gives up on it. Conflicts resolve within a handful of
/// retries in practice; a transaction that keeps losing for this long means livelock.
pub const ATTEMPTS_MAX: u32 = 1_000_000;

/// Timing of one run.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Discarded warm-up before the timed window.
    pub warmup: Duration,
    /// The timed window.
    pub duration: Duration,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// Transactions committed inside the timed window.
    pub commits: u64,
    /// Aborts (each retried) inside the timed window.
    pub aborts: u64,
    /// The timed window's real length.
    pub elapsed: Duration,
    /// Commit latency in nanoseconds, including retries.
    pub latency_ns: Histogram<u64>,
    /// Transactions committed over the whole run, warm-up included.
    pub commits_total: u64,
    /// CPU time of this whole process (every thread, user and system) in the timed window:
    /// an embedded target's cost per transaction that holds on a shared machine.
    pub cpu: Duration,
}

impl Measurement {
    /// Committed transactions per second.
    pub fn txn_per_s(&self) -> f64 {
        self.commits as f64 / self.elapsed.as_secs_f64()
    }
    /// Aborts per second.
    pub fn aborts_per_s(&self) -> f64 {
        self.aborts as f64 / self.elapsed.as_secs_f64()
    }
    /// Process CPU microseconds per committed transaction.
    pub fn cpu_us_per_txn(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.commits.max(1) as f64
    }
    /// A latency percentile (0..=100) in microseconds.
    pub fn latency_us(&self, percentile: f64) -> f64 {
        self.latency_ns.value_at_percentile(percentile) as f64 / 1000.0
    }
}

const WARMUP: u8 = 0;
const TIMED: u8 = 1;
const STOP: u8 = 2;

fn histogram() -> Histogram<u64> {
    // 1 ns to 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// Runs one thread per stream against `target`. `tick` is called about every 100 ms with the
/// time elapsed since the start, for progress display.
pub fn run(
    target: &dyn Target,
    streams: &[Stream],
    timing: Timing,
    tick: &mut dyn FnMut(Duration),
) -> anyhow::Result<Measurement> {
    anyhow::ensure!(!streams.is_empty(), "a run needs at least one thread");
    let phase = AtomicU8::new(WARMUP);
    let start = Barrier::new(streams.len() + 1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(i, stream)| {
                let (phase, start) = (&phase, &start);
                scope.spawn(move || {
                    let worker = target.worker(i as u32);
                    start.wait();
                    client(worker?, stream, phase)
                })
            })
            .collect();
        start.wait();
        let begin = Instant::now();
        let timed_from = sleep_ticking(begin, timing.warmup, tick);
        phase.store(TIMED, Ordering::Release);
        let cpu_from = process_cpu();
        let timed_from = begin + timed_from;
        sleep_ticking(begin, timing.warmup + timing.duration, tick);
        phase.store(STOP, Ordering::Release);
        let elapsed = timed_from.elapsed();
        let cpu = process_cpu().saturating_sub(cpu_from);
        let mut total = Measurement {
            commits: 0,
            aborts: 0,
            elapsed,
            latency_ns: histogram(),
            commits_total: 0,
            cpu,
        };
        for h in handles {
            let m = match h.join() {
                Ok(m) => m?,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            total.commits += m.commits;
            total.aborts += m.aborts;
            total.commits_total += m.commits_total;
            total
                .latency_ns
                .add(&m.latency_ns)
                .context("merging latency histograms")?;
        }
        Ok(total)
    })
}

/// CPU time used so far by every thread of this process, user and system.
fn process_cpu() -> Duration {
    // SAFETY: `getrusage` fills the zeroed struct it is given; RUSAGE_SELF cannot fail.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// Sleeps until `until` after `begin`, calling `tick` now and then; returns the time reached.
fn sleep_ticking(begin: Instant, until: Duration, tick: &mut dyn FnMut(Duration)) -> Duration {
    loop {
        let now = begin.elapsed();
        tick(now);
        if now >= until {
            return now;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(100)));
    }
}

fn client(
    mut worker: Box<dyn crate::target::Worker + '_>,
    stream: &Stream,
    phase: &AtomicU8,
) -> anyhow::Result<Measurement> {
    let depth = worker.depth().max(1);
    let mut m = Measurement {
        commits: 0,
        aborts: 0,
        elapsed: Duration::ZERO,
        latency_ns: histogram(),
        commits_total: 0,
        cpu: Duration::ZERO,
    };
    let mut done = vec![false; depth];
    let mut next = 0usize;
    let n = stream.txns.len();
    anyhow::ensure!(n > 0, "empty stream");
    let mut batch = Vec::with_capacity(depth);
    loop {
        let now_phase = phase.load(Ordering::Acquire);
        if now_phase == STOP {
            return Ok(m);
        }
        batch.clear();
        for _ in 0..depth {
            batch.push(stream.txns[next]);
            next = (next + 1) % n;
        }
        done.fill(false);
        let began = Instant::now();
        let mut aborts = 0u64;
        let mut attempts = 0u32;
        loop {
            worker.attempt(stream, &batch, &mut done)?;
            let left = done.iter().filter(|d| !**d).count() as u64;
            if left == 0 {
                break;
            }
            aborts += left;
            attempts += 1;
            anyhow::ensure!(
                attempts < ATTEMPTS_MAX,
                "a transaction aborted {ATTEMPTS_MAX} times in a row"
            );
            backoff(attempts);
        }
        let latency = began.elapsed().as_nanos().max(1) as u64;
        m.commits_total += depth as u64;
        if now_phase == TIMED {
            m.commits += depth as u64;
            m.aborts += aborts;
            m.latency_ns
                .record_n(latency.min(m.latency_ns.high()), depth as u64)
                .context("recording a latency")?;
        }
    }
}

/// Waits a little before retrying: spin first, then yield, so the winner of a conflict can
/// finish its commit.
fn backoff(attempts: u32) {
    if attempts < 4 {
        for _ in 0..(16 << attempts) {
            std::hint::spin_loop();
        }
    } else if attempts < 16 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(u64::from(attempts.min(1000))));
    }
}
