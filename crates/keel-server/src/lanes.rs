//! Where connections run: on the *poller* or on the *pool*.
//!
//! - The **poller** is one thread (a current-thread tokio runtime) that serves every
//!   connection, like Redis's event loop, but does not sleep while requests keep coming: a
//!   spinner task keeps polling the sockets until none has had anything to read for
//!   `idle-poll-us`. A client's request then never has to wake a sleeping server thread, and
//!   no request is handed from one thread to another.
//! - The **pool** is tokio's multi-thread runtime, one worker per core. It does more work per
//!   second once one thread is not enough, but its workers hand tasks to each other and wake
//!   each other, which costs CPU that clients on the same cores would otherwise use.
//!
//! Neither is best everywhere. On 2 cores shared with `redis-benchmark`, unpipelined requests
//! leave the client saturated and the server slack, and the poller serves them ~10% faster than
//! the pool; pipelined ones keep one server thread busy while the client has slack, and the
//! pool serves them ~25% faster. Which one wins is not visible from load figures alone (a
//! poller 10% idle can still be the bottleneck), so with `poller auto` (the default) a
//! controller tries the other lane and keeps whichever served more commands per second:
//!
//! - from the poller it tries the pool when the poller is busy (under [`BUSY_IDLE`] idle), the
//!   load is pipelined ([`PIPELINED_DEPTH`] commands a read) and the machine has a share of a
//!   core idle ([`SPARE_CORES`]) for a second thread to use, and
//!   stays there only if the pool serves [`MARGIN`] more; failed trials back off from
//!   [`TRIAL_FIRST`] to [`BACKOFF_MAX`]. A poller that is not idle at all
//!   ([`SATURATED_IDLE`], [`SATURATED_TICKS`] ticks running) beside a spare core moves to the
//!   pool at once, without a trial: short bursts of pipelined load would be half over before
//!   a trial ends, and the probes below undo a wrong move;
//! - from the pool it probes the poller after [`PROBE_FIRST`] of busy time (doubling up to
//!   [`BACKOFF_MAX`] while probes fail; a due probe waits up to [`TRIAL_EXTRA_TICKS`] for
//!   a steady measure, then goes anyway) and stays there unless it serves [`MARGIN`] less,
//!   or, if the poller had no slack in the probe ([`SATURATED_IDLE`]), unless it serves less
//!   at all. No probe while the process uses [`PROBE_CPU_MAX`] cores or more: that load
//!   cannot fit on one thread. After [`QUIET_RESET`] without a command the next load is new,
//!   and the waits start over.
//!
//! Each measurement skips the tick in which connections move, then counts commands over
//! [`MEASURE_TICKS`] ticks; a measurement whose ticks differ by more than [`STEADY_SPREAD`]
//! saw the load change and decides nothing. Load figures are smoothed over a few ticks: `/proc` counts CPU
//! time in 10 ms steps.
//!
//! A connection moves at a request boundary: after it has written every reply and before it
//! reads again, it hands its socket, its state (`MULTI` queue, `WATCH` snapshot, bytes of a
//! half-read request) and itself to the other runtime. An idle connection moves when its next
//! request arrives. Nothing is lost or reordered: a connection is one task at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How often the controller samples.
pub const TICK: Duration = Duration::from_millis(50);
/// The poller is saturated while it is idle less than this share of a tick.
pub const SATURATED_IDLE: f64 = 0.05;
/// Ticks in a row a saturated poller, with a spare core beside it, waits before connections
/// move to the pool without a trial (the probes of the poller then check the move).
pub const SATURATED_TICKS: u32 = 2;
/// The poller is busy enough to try the pool while it is idle less than this share of the
/// time (smoothed).
pub const BUSY_IDLE: f64 = 0.2;
/// Idle CPU (in cores, over the machine, smoothed) the pool needs to be of use: without it a
/// second thread would only take time from the clients.
pub const SPARE_CORES: f64 = 0.25;
/// Ticks a measurement counts commands over, after the tick in which connections move.
pub const MEASURE_TICKS: usize = 4;
/// How much more the other lane must serve to be kept (trial), or how much less it may serve
/// and still be kept (probe of the poller, which is cheaper when it keeps up).
pub const MARGIN: f64 = 0.05;
/// A measurement counts only if its ticks' rates lie within this factor of each other: one
/// that spans a change of load (clients coming or going) compares nothing.
pub const STEADY_SPREAD: f64 = 1.3;
/// Ticks a trial of the pool may go on past [`MEASURE_TICKS`] while its ticks are not steady,
/// waiting for [`MEASURE_TICKS`] in a row that are. Pipelined loads that insert new keys are
/// jumpy for their first second (index growth, fresh memory), and a trial that gave up at
/// once sent them back to a poller serving them 15–20% less.
pub const TRIAL_EXTRA_TICKS: u32 = 8;
/// Wait after a failed trial of the pool before the next.
pub const TRIAL_FIRST: Duration = Duration::from_secs(1);
/// How long connections stay on the pool before the first probe of the poller.
pub const PROBE_FIRST: Duration = Duration::from_secs(2);
/// The longest wait between trials, or between probes.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// No probe while the process uses this many cores or more: a load like that cannot fit on
/// one thread, and sending it there would only stall it (on a large machine, badly).
pub const PROBE_CPU_MAX: f64 = 1.5;
/// After this long without a command, the next load is treated as new: trials and probes
/// start again from their first waits.
pub const QUIET_RESET: Duration = Duration::from_secs(1);
/// Commands per read on the poller (smoothed) from which a poller with slack may try the pool:
/// a pipelined load. An unpipelined one (one command a read) leaves the poller with slack only
/// because its clients cannot send faster, so a second thread cannot serve more (on 2 cores
/// the pool serves -P 1 ~10% less, and takes CPU from the clients). At -P 1 with 50 clients
/// the trials cost 3.6% of a 4-second INCR run (median of eight rounds against
/// `--poller on`). A saturated poller still moves, whatever the depth.
pub const PIPELINED_DEPTH: f64 = 1.5;
/// Weight of a new tick in the smoothed load figures.
const SMOOTHING: f64 = 0.3;
/// Default `idle-poll-us`.
pub const IDLE_POLL_US_DEFAULT: u64 = 100;
/// At [`BUSY_SPIN_RATE`] commands per second or more, the spinner keeps polling at least this
/// long after the last request. A load that heavy stays hot, and the gaps in it are ones where
/// the client was held up, not pauses. A poller that parks in such a gap makes the next request
/// wait for its thread to wake, which on a VM can take milliseconds. Meanwhile the other
/// clients' requests queue behind it. At -P 1 with 50 clients the poller parked 1–2 times per
/// 1000 requests with the 100 µs default, and never with 2 ms.
pub const BUSY_SPIN: Duration = Duration::from_millis(2);
/// Commands per second (over one controller tick) from which [`BUSY_SPIN`] applies: one
/// every 100 µs, the default `idle-poll-us`, so a load that would keep the poller spinning
/// anyway.
pub const BUSY_SPIN_RATE: f64 = 10_000.0;

/// How long the spinner keeps polling after the last request: `idle-poll-us`, raised to
/// [`BUSY_SPIN`] under a load of [`BUSY_SPIN_RATE`] or more unless `replies_wait_for_fsync`.
/// An `idle-poll-us` of 0 (no spinning) is kept.
///
/// Under `sync` durability the gaps in a busy load are fsyncs, not a client held up: every
/// connection waits for the log. A poller spinning through those gaps took a core from the
/// flusher thread and from the clients (measured before the poller flushed the log itself;
/// with inline fsyncs a raised spin measured 0.96 and 1.03, no better). At -P 1 with 50 clients
/// on 2 cores it left the client waiting for a core 10% of the time; keeping the spin at
/// 100 µs served 9% more INCR (median of five rounds, 18% in an earlier five; BENCHMARKS.md).
/// A load that fsynced nothing in the last tick (reads only) has no such gaps: its replies do
/// not wait for the log, and it spins as under `async`.
fn spin_ns(idle_poll_ns: u64, commands_per_s: f64, replies_wait_for_fsync: bool) -> u64 {
    if idle_poll_ns != 0 && commands_per_s >= BUSY_SPIN_RATE && !replies_wait_for_fsync {
        idle_poll_ns.max(nanos(BUSY_SPIN))
    } else {
        idle_poll_ns
    }
}
/// Under `sync`, the poller flushes the log inline after a pass that read nothing, or after
/// this many passes in a row that did (see `spin`). Flushing after every pass blocked a
/// busy poller in fsyncs it could have overlapped with work: `MSET` -P 1 served 11% less
/// than with the flusher thread. Waiting for a drained pass alone would let a stream of
/// reads hold writers for up to the flusher thread's 5 ms.
pub const INLINE_FLUSH_BUSY_PASSES: u32 = 16;
/// Largest `idle-poll-us`.
pub const IDLE_POLL_US_MAX: u64 = 1_000_000;

/// Where connections run (`poller` setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollerMode {
    /// Move between the poller and the pool as load demands.
    Auto,
    /// Always the poller.
    On,
    /// Always the pool.
    Off,
}

impl PollerMode {
    /// The lane connections go to when this is set.
    fn first_lane(self) -> Lane {
        match self {
            PollerMode::Off => Lane::Pool,
            PollerMode::Auto | PollerMode::On => Lane::Poller,
        }
    }

    /// The setting's name.
    pub fn name(self) -> &'static str {
        match self {
            PollerMode::Auto => "auto",
            PollerMode::On => "on",
            PollerMode::Off => "off",
        }
    }
}

impl std::str::FromStr for PollerMode {
    type Err = String;
    fn from_str(s: &str) -> Result<PollerMode, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(PollerMode::Auto),
            "on" | "yes" => Ok(PollerMode::On),
            "off" | "no" => Ok(PollerMode::Off),
            _ => Err(format!("poller takes auto, on or off, not {s:?}")),
        }
    }
}

/// One of the two runtimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Poller,
    Pool,
}

impl Lane {
    pub fn name(self) -> &'static str {
        match self {
            Lane::Poller => "poller",
            Lane::Pool => "pool",
        }
    }
}

/// What the poller thread and its connections share.
pub struct PollerState {
    /// Nanoseconds the poller was idle: parked (counted when it wakes), or spinning with
    /// nothing to read.
    idle_ns: AtomicU64,
    /// While parked: when it parked, in ns since `base`, plus one; 0 while awake.
    parked_since: AtomicU64,
    base: Instant,
    /// Reads by connections on the poller; the spinner watches it.
    activity: AtomicU64,
    /// The spinner has stopped and waits for `wake`.
    sleeping: AtomicBool,
    wake: Notify,
    /// The `idle-poll-us` setting.
    idle_poll_ns: AtomicU64,
    /// How long the spinner polls after the last request now ([`spin_ns`]).
    spin_ns: AtomicU64,
    /// The database whose log the poller writes itself ([`keel::Db::flush_log_here`]) once
    /// its loop has drained the sockets, as Redis does: under `sync` it also fsyncs (the
    /// replies wait for that), under `async` it only writes (the replies wait for the write,
    /// [`keel::Db::log_written`]). `None` without a log.
    inline_log: Option<&'static keel::Db>,
    /// Durability is `sync`: replies wait for fsyncs.
    replies_wait_for_fsync: bool,
}

impl PollerState {
    fn since_base(&self) -> u64 {
        nanos(self.base.elapsed()) + 1
    }

    /// Idle nanoseconds so far, counting a park still going on.
    fn idle_now(&self) -> u64 {
        let idle = self.idle_ns.load(Relaxed);
        match self.parked_since.load(Relaxed) {
            0 => idle,
            since => idle + self.since_base().saturating_sub(since),
        }
    }

    /// Called by a connection on the poller for each read.
    #[inline]
    pub fn active(&self) {
        self.activity.fetch_add(1, Relaxed);
        if self.idle_poll_ns.load(Relaxed) != 0 {
            self.wake_spinner();
        }
    }

    /// Wakes the spinner if it sleeps. Only the poller thread runs the spinner and calls
    /// this, so the check cannot race the spinner going to sleep.
    #[inline]
    fn wake_spinner(&self) {
        if self.sleeping.load(Relaxed) {
            self.sleeping.store(false, Relaxed);
            self.wake.notify_one();
        }
    }
}

/// The two runtimes, the current lane and the controller's view.
pub struct Lanes {
    lane: AtomicU8,
    setting: AtomicU8,
    pool: Handle,
    pool_workers: usize,
    poller: Handle,
    pub state: Arc<PollerState>,
    stop: CancellationToken,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub switches: AtomicU64,
    /// Connections that moved from one lane to the other.
    pub moves: AtomicU64,
    /// The last tick's samples, in thousandths, for `INFO`.
    pub poller_idle_permille: AtomicU64,
    pub spare_millicores: AtomicU64,
    pub process_millicores: AtomicU64,
}

impl Lanes {
    /// Starts the poller thread; the pool is the runtime this is called on. `inline_log`:
    /// the database whose log the poller writes itself, if it has one (under `sync` replies
    /// then wait for fsyncs: see `spin_ns`).
    pub fn start(
        setting: PollerMode,
        idle_poll_us: u64,
        inline_log: Option<&'static keel::Db>,
    ) -> std::io::Result<Lanes> {
        let replies_wait_for_fsync =
            inline_log.is_some_and(|db| db.durability() == keel::Durability::Sync);
        let pool = Handle::current();
        let pool_workers = pool.metrics().num_workers();
        let state = Arc::new(PollerState {
            idle_ns: AtomicU64::new(0),
            parked_since: AtomicU64::new(0),
            base: Instant::now(),
            activity: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            wake: Notify::new(),
            idle_poll_ns: AtomicU64::new(idle_poll_us * 1000),
            spin_ns: AtomicU64::new(idle_poll_us * 1000),
            inline_log,
            replies_wait_for_fsync,
        });
        let (parked, unparked) = (state.clone(), state.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_park(move || parked.parked_since.store(parked.since_base(), Relaxed))
            .on_thread_unpark(move || {
                let since = unparked.parked_since.swap(0, Relaxed);
                if since != 0 {
                    let slept = unparked.since_base().saturating_sub(since);
                    unparked.idle_ns.fetch_add(slept, Relaxed);
                }
            })
            .build()?;
        let poller = runtime.handle().clone();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let spinner = state.clone();
        let thread = std::thread::Builder::new()
            .name("keel-poller".into())
            .spawn(move || {
                if spinner.inline_log.is_some() {
                    // A commit or a reply here that waits for the log wakes the spinner,
                    // which writes it, instead of the flusher thread.
                    let woken = spinner.clone();
                    keel::Db::flush_log_inline_on_this_thread(Some(std::rc::Rc::new(move || {
                        woken.wake_spinner()
                    })));
                }
                runtime.spawn(spin(spinner));
                runtime.block_on(stopped.cancelled());
                // Connections still here are dropped (closed) with the runtime.
                runtime.shutdown_background();
            })?;
        Ok(Lanes {
            lane: AtomicU8::new(setting.first_lane() as u8),
            setting: AtomicU8::new(setting as u8),
            pool,
            pool_workers,
            poller,
            state,
            stop,
            thread: Mutex::new(Some(thread)),
            switches: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            poller_idle_permille: AtomicU64::new(1000),
            spare_millicores: AtomicU64::new(0),
            process_millicores: AtomicU64::new(0),
        })
    }

    /// Where connections should run now.
    #[inline]
    pub fn lane(&self) -> Lane {
        if self.lane.load(Relaxed) == Lane::Poller as u8 {
            Lane::Poller
        } else {
            Lane::Pool
        }
    }

    fn set_lane(&self, lane: Lane) {
        if self.lane.swap(lane as u8, Relaxed) != lane as u8 {
            self.switches.fetch_add(1, Relaxed);
            tracing::debug!(lane = lane.name(), "connections move");
        }
    }

    /// The runtime of `lane`.
    pub fn handle(&self, lane: Lane) -> &Handle {
        match lane {
            Lane::Poller => &self.poller,
            Lane::Pool => &self.pool,
        }
    }

    pub fn setting(&self) -> PollerMode {
        match self.setting.load(Relaxed) {
            0 => PollerMode::Auto,
            1 => PollerMode::On,
            _ => PollerMode::Off,
        }
    }

    /// `CONFIG SET poller`: `on`/`off` move every connection at its next request; `auto`
    /// hands the choice back to the controller, starting from the poller.
    pub fn set_setting(&self, setting: PollerMode) {
        self.setting.store(setting as u8, Relaxed);
        self.set_lane(setting.first_lane());
    }

    pub fn idle_poll_us(&self) -> u64 {
        self.state.idle_poll_ns.load(Relaxed) / 1000
    }

    /// Sets `idle-poll-us`; the spin follows at once, and the controller raises it again
    /// under load ([`BUSY_SPIN`]).
    pub fn set_idle_poll_us(&self, us: u64) {
        self.state.idle_poll_ns.store(us * 1000, Relaxed);
        self.state.spin_ns.store(us * 1000, Relaxed);
    }

    /// How long the spinner polls after the last request now, in microseconds.
    pub fn spin_us(&self) -> u64 {
        self.state.spin_ns.load(Relaxed) / 1000
    }

    /// The log's fsyncs so far, where replies wait for them (`sync`); 0 otherwise, where
    /// the count decides nothing.
    fn log_fsyncs(&self) -> u64 {
        match self.state.inline_log {
            Some(db) if self.state.replies_wait_for_fsync => db.stats().log_fsyncs,
            _ => 0,
        }
    }

    /// Stops the poller thread and waits for it (connections still on it are closed).
    pub fn stop(&self) {
        self.stop.cancel();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }

    /// Samples every [`TICK`] and moves connections as [`Policy`] decides, until `shutdown`.
    /// `commands` counts the commands served.
    pub async fn control(&self, shutdown: CancellationToken, commands: &AtomicU64) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut policy = Policy::new(Instant::now(), self.lane());
        let mut last = Instant::now();
        let mut idle = self.state.idle_now();
        let mut cpu = CpuTicks::machine_idle();
        let mut used = CpuTicks::process_used();
        let mut served = commands.load(Relaxed);
        let mut fsyncs = self.log_fsyncs();
        let mut reads = self.state.activity.load(Relaxed);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let now = Instant::now();
            let elapsed = now - last;
            let wall = nanos(elapsed).max(1) as f64;
            // CONFIG RESETSTAT may zero the count: that tick then counts nothing.
            let served_now = commands.load(Relaxed);
            let tick_commands = served_now.saturating_sub(served);
            served = served_now;
            let reads_now = self.state.activity.load(Relaxed);
            let tick_reads = reads_now.saturating_sub(reads);
            reads = reads_now;
            let idle_now = self.state.idle_now();
            let poller_idle = (idle_now.saturating_sub(idle) as f64 / wall).min(1.0);
            let cpu_now = CpuTicks::machine_idle();
            let used_now = CpuTicks::process_used();
            // Without /proc (not Linux), assume a core is spare and the process is light.
            let spare = match (cpu, cpu_now) {
                (Some(a), Some(b)) => b.cores_since(a, wall),
                _ => 1.0,
            };
            let process_cores = match (used, used_now) {
                (Some(a), Some(b)) => b.cores_since(a, wall),
                _ => 0.0,
            };
            used = used_now;
            self.process_millicores
                .store((process_cores * 1000.0) as u64, Relaxed);
            // `idle_now` can read a little low when the poller wakes as it is read.
            (last, idle, cpu) = (now, idle_now.max(idle), cpu_now);
            self.poller_idle_permille
                .store((poller_idle * 1000.0) as u64, Relaxed);
            self.spare_millicores
                .store((spare * 1000.0) as u64, Relaxed);
            let fsyncs_now = self.log_fsyncs();
            let sample = Sample {
                now,
                poller_idle,
                spare_cores: spare,
                process_cores,
                commands: tick_commands,
                reads: tick_reads,
                elapsed,
                pool_workers: self.pool_workers,
            };
            self.state.spin_ns.store(
                spin_ns(
                    self.state.idle_poll_ns.load(Relaxed),
                    sample.rate(),
                    // Under `sync`, replies waited for fsyncs in this tick.
                    self.state.replies_wait_for_fsync && fsyncs_now != fsyncs,
                ),
                Relaxed,
            );
            fsyncs = fsyncs_now;
            // After CONFIG SET (or with auto off) start from where connections are now.
            if self.setting() != PollerMode::Auto || policy.lane != self.lane() {
                policy = Policy::new(now, self.lane());
                if self.setting() != PollerMode::Auto {
                    continue;
                }
            }
            if let Some(lane) = policy.step(sample) {
                self.set_lane(lane);
            }
        }
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Keeps the poller thread awake while its connections are busy: yielding makes the runtime
/// poll the sockets without blocking. Also counts the idle time of those polls. The clock is
/// read only on polls that found nothing: a busy poller does not pay for it.
///
/// Under `sync` durability it also writes and fsyncs the log for the commits its passes
/// made, under `async` it writes the log (no fsync) for the replies that wait for it, and it
/// does not sleep while any of them still waits (the flusher thread may hold the log for a
/// moment).
async fn spin(state: Arc<PollerState>) {
    loop {
        let mut seen = state.activity.load(Relaxed);
        let mut idle_since = Instant::now();
        let mut prev = idle_since;
        let mut busy = false;
        let mut busy_passes = 0u32;
        loop {
            tokio::task::yield_now().await;
            let activity = state.activity.load(Relaxed);
            // Flush once the sockets are drained (a pass that read nothing), as Redis does at
            // the end of its pass; while reads keep coming, every
            // [`INLINE_FLUSH_BUSY_PASSES`] passes.
            let flush = match state.inline_log {
                Some(db) => {
                    busy_passes += u32::from(activity != seen);
                    if activity == seen || busy_passes >= INLINE_FLUSH_BUSY_PASSES {
                        busy_passes = 0;
                        db.flush_log_here()
                    } else {
                        keel::LogFlush::default()
                    }
                }
                None => keel::LogFlush::default(),
            };
            if activity != seen || flush.waiting {
                // Time spent waiting for the disk is idle time, as it is for Redis in its
                // fsync: a poller blocked there is not short of CPU, and the pool would not
                // serve these commits any sooner. (On an empty poll, the gap below counts
                // it.)
                state.idle_ns.fetch_add(nanos(flush.took), Relaxed);
                seen = activity;
                busy = true;
                continue;
            }
            let now = Instant::now();
            if busy {
                // The first empty poll after work: idle from here.
                busy = false;
                idle_since = now;
                state.idle_ns.fetch_add(nanos(flush.took), Relaxed);
            } else {
                state.idle_ns.fetch_add(nanos(now - prev), Relaxed);
            }
            prev = now;
            if nanos(now - idle_since) >= state.spin_ns.load(Relaxed) {
                break;
            }
        }
        state.sleeping.store(true, Relaxed);
        state.wake.notified().await;
    }
}

/// A clock tick of `/proc`'s CPU times: the kernel reports in USER_HZ, 100 on every Linux ABI
/// keel runs on.
const TICK_NS: f64 = 10_000_000.0;

/// A count of `/proc` CPU-time ticks: the machine's idle time or this process's use.
#[derive(Debug, Clone, Copy)]
struct CpuTicks(u64);

impl CpuTicks {
    /// The machine's idle time (idle + iowait), from `/proc/stat`.
    fn machine_idle() -> Option<CpuTicks> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let line = text.lines().next()?.strip_prefix("cpu ")?;
        let fields: Vec<u64> = line
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        Some(CpuTicks(
            fields.get(3)? + fields.get(4).copied().unwrap_or(0),
        ))
    }

    /// This process's CPU time (utime + stime), from `/proc/self/stat`.
    fn process_used() -> Option<CpuTicks> {
        let text = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = &text[text.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(CpuTicks(utime + stime))
    }

    /// Cores, on average, between `earlier` and this sample, `wall_ns` apart.
    fn cores_since(self, earlier: CpuTicks, wall_ns: f64) -> f64 {
        (self.0.saturating_sub(earlier.0) as f64 * TICK_NS) / wall_ns
    }
}

/// One tick's measurements.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub now: Instant,
    /// Share of the tick the poller was idle (0..=1).
    pub poller_idle: f64,
    /// Idle cores on the machine, on average over the tick.
    pub spare_cores: f64,
    /// Cores this process used, on average over the tick.
    pub process_cores: f64,
    /// Commands served in the tick.
    pub commands: u64,
    /// Reads by connections on the poller in the tick.
    pub reads: u64,
    /// How long the tick was.
    pub elapsed: Duration,
    pub pool_workers: usize,
}

impl Sample {
    /// Commands per second over the tick.
    fn rate(&self) -> f64 {
        self.commands as f64 / self.elapsed.as_secs_f64().max(1e-3)
    }

    /// Commands per read on the poller over the tick, if it read anything.
    fn depth(&self) -> Option<f64> {
        (self.reads > 0).then(|| self.commands as f64 / self.reads as f64)
    }
}

/// A lane's commands per second over [`MEASURE_TICKS`] ticks.
struct Measured {
    rate: f64,
    /// The poller's mean idle share over those ticks.
    idle: f64,
    /// The ticks' rates lie within [`STEADY_SPREAD`] of each other.
    steady: bool,
}

/// What the controller is doing.
#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Settled on a lane.
    Steady,
    /// Trying `lane` (just moved there) against `before`, the rate measured on the other lane.
    Trial { before: f64 },
}

/// The controller's decisions, apart from the clock and the measurements so that tests can
/// drive it.
#[derive(Debug)]
pub struct Policy {
    lane: Lane,
    state: State,
    /// Time with commands flowing since the lane was entered (or a probe was put off): an
    /// idle server makes no probe due.
    busy: Duration,
    /// Time without a command, running.
    quiet: Duration,
    /// Commands per second and the poller's idle share, of the ticks since the lane was
    /// entered (the first skipped).
    ticks: Vec<(f64, f64)>,
    /// Earliest next trial of the pool, and the wait after the next failed one.
    next_trial: Instant,
    trial_backoff: Duration,
    /// Wait on the pool before the next probe of the poller.
    probe_backoff: Duration,
    idle: f64,
    spare: f64,
    process_cores: f64,
    /// Commands per read on the poller, smoothed over the ticks that read.
    depth: f64,
    /// Ticks in a row the poller was saturated.
    saturated: u32,
    /// Ticks the current trial went on past [`MEASURE_TICKS`] for want of a steady measure,
    /// or a due probe waited for one.
    extra_ticks: u32,
    /// Connections are on the pool after a move on saturation that no measurement has
    /// confirmed yet.
    unproven: bool,
}

impl Policy {
    pub fn new(now: Instant, lane: Lane) -> Policy {
        Policy {
            lane,
            state: State::Steady,
            busy: Duration::ZERO,
            quiet: Duration::ZERO,
            ticks: Vec::with_capacity(MEASURE_TICKS + 1),
            next_trial: now,
            trial_backoff: TRIAL_FIRST,
            probe_backoff: PROBE_FIRST,
            idle: 1.0,
            saturated: 0,
            extra_ticks: 0,
            unproven: false,
            spare: 0.0,
            process_cores: 0.0,
            depth: 1.0,
        }
    }

    /// The lane to move to, if any.
    pub fn step(&mut self, s: Sample) -> Option<Lane> {
        if s.commands == 0 {
            self.quiet += s.elapsed;
            if self.quiet >= QUIET_RESET {
                // Whatever load comes next is new: no backoff learned from the last one.
                self.trial_backoff = TRIAL_FIRST;
                self.probe_backoff = PROBE_FIRST;
                self.next_trial = s.now;
                self.busy = Duration::ZERO;
            }
        } else {
            if self.quiet >= QUIET_RESET {
                // The figures smoothed over the pause say nothing about the new load.
                (self.idle, self.spare, self.process_cores) =
                    (s.poller_idle, s.spare_cores, s.process_cores);
                self.depth = s.depth().unwrap_or(1.0);
            }
            self.quiet = Duration::ZERO;
            self.busy += s.elapsed;
        }
        self.idle += (s.poller_idle - self.idle) * SMOOTHING;
        self.spare += (s.spare_cores - self.spare) * SMOOTHING;
        self.process_cores += (s.process_cores - self.process_cores) * SMOOTHING;
        if let Some(depth) = s.depth() {
            self.depth += (depth - self.depth) * SMOOTHING;
        }
        self.ticks.push((s.rate(), s.poller_idle));
        // The first tick on a lane is the move itself.
        let measured = (self.ticks.len() > MEASURE_TICKS).then(|| {
            let last = &self.ticks[self.ticks.len() - MEASURE_TICKS..];
            let (lo, hi) = last.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &(r, _)| {
                (lo.min(r), hi.max(r))
            });
            let n = MEASURE_TICKS as f64;
            Measured {
                rate: last.iter().map(|t| t.0).sum::<f64>() / n,
                idle: last.iter().map(|t| t.1).sum::<f64>() / n,
                steady: lo > 0.0 && hi <= lo * STEADY_SPREAD,
            }
        });
        if self.ticks.len() > MEASURE_TICKS {
            self.ticks.remove(0);
        }
        // A poller with no idle time at all, and a core idle beside it, needs no trial.
        if self.lane == Lane::Poller
            && self.state == State::Steady
            && s.poller_idle < SATURATED_IDLE
            && s.spare_cores >= SPARE_CORES
        {
            self.saturated += 1;
        } else {
            self.saturated = 0;
        }
        if self.saturated >= SATURATED_TICKS && s.pool_workers >= 2 && s.now >= self.next_trial {
            // Unmeasured: check it sooner than a move a trial has confirmed.
            self.probe_backoff = PROBE_FIRST / 2;
            self.unproven = true;
            return Some(self.enter(Lane::Pool, State::Steady));
        }
        let Measured { rate, idle, steady } = measured?;
        match (self.lane, self.state) {
            (Lane::Poller, State::Steady) => {
                let pool_may_help = s.pool_workers >= 2
                    && steady
                    && self.idle < BUSY_IDLE
                    && self.spare >= SPARE_CORES
                    && self.depth >= PIPELINED_DEPTH
                    && s.now >= self.next_trial;
                pool_may_help.then(|| self.enter(Lane::Pool, State::Trial { before: rate }))
            }
            (Lane::Pool, State::Steady) => {
                let due = self.busy >= self.probe_backoff;
                if !due {
                    return None;
                }
                if !steady && self.extra_ticks < TRIAL_EXTRA_TICKS {
                    // Wait a little for a steady measure, but not for ever: a load the pool
                    // serves jumpily may be jumpy because of the pool (pops of one key
                    // conflicting on two threads), and one that never settled was never
                    // probed, so it stayed on the pool at a fraction of the poller's rate.
                    self.extra_ticks += 1;
                    return None;
                }
                if self.process_cores >= PROBE_CPU_MAX {
                    // Too busy for one thread: look again after another wait.
                    self.busy = Duration::ZERO;
                    return None;
                }
                Some(self.enter(Lane::Poller, State::Trial { before: rate }))
            }
            (Lane::Pool, State::Trial { before }) => {
                if !steady && self.extra_ticks < TRIAL_EXTRA_TICKS {
                    // Not settled yet: measure over the next ticks instead.
                    self.extra_ticks += 1;
                    return None;
                }
                tracing::debug!(pool = rate, poller = before, steady, "trial of the pool");
                // Kept only if it serves more under a steady load; a trial that never
                // settles counts as failed too, so that a jumpy load is not tried on and on.
                if steady && rate >= before * (1.0 + MARGIN) {
                    // The pool serves more: stay, and probe the poller after the first wait.
                    self.probe_backoff = PROBE_FIRST;
                    self.unproven = false;
                    self.state = State::Steady;
                    return None;
                }
                self.next_trial = s.now + self.trial_backoff;
                self.trial_backoff = (self.trial_backoff * 2).min(BACKOFF_MAX);
                Some(self.enter(Lane::Poller, State::Steady))
            }
            (Lane::Poller, State::Trial { before }) => {
                tracing::debug!(
                    poller = rate,
                    pool = before,
                    idle,
                    steady,
                    "probe of the poller"
                );
                if !steady {
                    // No verdict, but back off as after a failed probe: a load too jumpy to
                    // measure on the poller is one the pool absorbs, and each probe costs
                    // the ticks it spends on the slower lane.
                    self.probe_backoff = (self.probe_backoff * 2).min(BACKOFF_MAX);
                    return Some(self.enter(Lane::Pool, State::Steady));
                }
                // A poller with slack serves its load more cheaply than the pool, so it may
                // serve a little less and still be kept. One with none is the bottleneck:
                // it is kept only if it serves as much. (At -P 16 on 2 cores, a probe right
                // after the move can measure the poller a few percent above what it keeps
                // up: 5% in its favour kept it where the pool serves 13% more.)
                let margin = if idle < SATURATED_IDLE { 0.0 } else { MARGIN };
                if rate >= before * (1.0 - margin) {
                    if self.unproven {
                        // The move on saturation was no gain: it counts as a failed trial.
                        self.next_trial = s.now + self.trial_backoff;
                        self.trial_backoff = (self.trial_backoff * 2).min(BACKOFF_MAX);
                    } else {
                        // The pool had won a trial, so the load has changed: start over.
                        self.trial_backoff = TRIAL_FIRST;
                        self.next_trial = s.now + TRIAL_FIRST;
                    }
                    self.unproven = false;
                    self.state = State::Steady;
                    return None;
                }
                self.unproven = false;
                self.probe_backoff = (self.probe_backoff * 2).min(BACKOFF_MAX);
                Some(self.enter(Lane::Pool, State::Steady))
            }
        }
    }

    fn enter(&mut self, lane: Lane, state: State) -> Lane {
        self.saturated = 0;
        self.extra_ticks = 0;
        self.lane = lane;
        self.state = state;
        self.busy = Duration::ZERO;
        self.ticks.clear();
        lane
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A load that the poller serves at `poller` commands/s and the pool at `pool`, with the
    /// poller's idle share and the machine's spare cores it leaves while on the poller.
    #[derive(Clone, Copy)]
    struct World {
        poller: f64,
        pool: f64,
        idle: f64,
        spare: f64,
        process: f64,
        workers: usize,
        /// Commands per read.
        depth: f64,
    }

    impl World {
        /// A pipelined load (16 commands a read).
        fn new(poller: f64, pool: f64, idle: f64, spare: f64) -> World {
            World {
                poller,
                pool,
                idle,
                spare,
                process: 1.0,
                workers: 2,
                depth: 16.0,
            }
        }
    }

    /// Drives `p` for `ticks` ticks; returns the ticks spent on each lane and the moves.
    struct Run {
        policy: Policy,
        lane: Lane,
        now: Instant,
        moves: Vec<(Instant, Lane)>,
    }

    impl Run {
        fn new(lane: Lane) -> Run {
            let now = Instant::now();
            Run {
                policy: Policy::new(now, lane),
                lane,
                now,
                moves: Vec::new(),
            }
        }

        /// When connections moved to `lane`, and the gaps between those moves.
        fn moves_to(&self, lane: Lane) -> (Vec<Instant>, Vec<Duration>) {
            let at: Vec<_> = self
                .moves
                .iter()
                .filter(|m| m.1 == lane)
                .map(|m| m.0)
                .collect();
            let gaps = at.windows(2).map(|w| w[1] - w[0]).collect();
            (at, gaps)
        }

        /// Runs `w` one tick at a time until connections leave the lane they are on.
        fn until_moved(&mut self, w: World) {
            let lane = self.lane;
            while self.lane == lane {
                self.run(w, 1);
            }
        }

        /// Ticks on the poller and on the pool.
        fn run(&mut self, w: World, ticks: u32) -> (u32, u32) {
            let mut on = (0, 0);
            for _ in 0..ticks {
                self.now += TICK;
                let (rate, idle) = match self.lane {
                    Lane::Poller => {
                        on.0 += 1;
                        (w.poller, w.idle)
                    }
                    Lane::Pool => {
                        on.1 += 1;
                        (w.pool, 1.0)
                    }
                };
                let commands = (rate * TICK.as_secs_f64()) as u64;
                let sample = Sample {
                    now: self.now,
                    poller_idle: idle,
                    spare_cores: w.spare,
                    process_cores: w.process,
                    commands,
                    reads: match self.lane {
                        Lane::Poller => (commands as f64 / w.depth) as u64,
                        Lane::Pool => 0,
                    },
                    elapsed: TICK,
                    pool_workers: w.workers,
                };
                if let Some(lane) = self.policy.step(sample) {
                    self.lane = lane;
                    self.moves.push((self.now, lane));
                }
            }
            on
        }
    }

    fn ticks(d: Duration) -> u32 {
        u32::try_from(d.as_millis() / TICK.as_millis()).expect("short")
    }

    #[test]
    fn a_client_bound_load_stays_on_the_poller() {
        // Unpipelined on 2 cores: the client takes its core, nothing is spare.
        let mut r = Run::new(Lane::Poller);
        let (_, pool) = r.run(
            World::new(60_000.0, 52_000.0, 0.08, 0.05),
            ticks(BACKOFF_MAX * 4),
        );
        assert_eq!((pool, r.moves.len()), (0, 0), "{:?}", r.moves);
        // Nor with a spare core while the poller has slack.
        let (_, pool) = r.run(
            World::new(60_000.0, 52_000.0, 0.5, 1.0),
            ticks(BACKOFF_MAX * 4),
        );
        assert_eq!((pool, r.moves.len()), (0, 0));
        // Nor with a one-worker pool.
        let w = World {
            workers: 1,
            ..World::new(60_000.0, 90_000.0, 0.0, 1.0)
        };
        assert_eq!(r.run(w, ticks(BACKOFF_MAX * 4)).1, 0);
    }

    #[test]
    fn an_unpipelined_load_on_a_poller_with_slack_is_not_tried_on_the_pool() {
        // -P 1 on 2 cores: the poller 10% idle, a share of a core spare now and then. Were
        // it tried, the pool would win: the depth alone keeps it on the poller.
        let mut r = Run::new(Lane::Poller);
        let w = World {
            depth: 1.0,
            ..World::new(60_000.0, 70_000.0, 0.1, 0.4)
        };
        let (_, pool) = r.run(w, ticks(BACKOFF_MAX * 2));
        assert_eq!((pool, r.moves.len()), (0, 0), "{:?}", r.moves);
        // Saturated, it still moves.
        let w = World { idle: 0.0, ..w };
        r.until_moved(w);
        assert_eq!(r.lane, Lane::Pool);
        // Pipelined, with slack, it is tried.
        let mut r = Run::new(Lane::Poller);
        let w = World { depth: 16.0, ..w };
        let w = World { idle: 0.1, ..w };
        r.until_moved(w);
        assert_eq!(r.lane, Lane::Pool);
    }

    #[test]
    fn a_load_the_pool_serves_better_moves_there_and_stays() {
        // Pipelined on 2 cores: the poller is busy, a core is partly idle, the pool wins.
        let mut r = Run::new(Lane::Poller);
        let start = r.now;
        let w = World::new(400_000.0, 520_000.0, 0.1, 0.4);
        let (poller, pool) = r.run(w, ticks(Duration::from_secs(120)));
        let first = r.moves.first().expect("moved");
        assert_eq!(first.1, Lane::Pool);
        assert!(
            first.0 - start < Duration::from_secs(1),
            "{:?}",
            first.0 - start
        );
        // Probes of the poller fail and back off: 2, 4, 8, 16, 30, 30 ... seconds.
        assert!(
            pool > poller * 15,
            "{poller} ticks on the poller, {pool} on the pool"
        );
        let (probes, gaps) = r.moves_to(Lane::Poller);
        assert!((4..=9).contains(&probes.len()), "{probes:?}");
        assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
        assert!(
            gaps.iter().all(|g| *g <= BACKOFF_MAX + TICK * 8),
            "{gaps:?}"
        );
    }

    #[test]
    fn a_saturated_poller_beside_a_spare_core_moves_without_a_trial() {
        let mut r = Run::new(Lane::Poller);
        let start = r.now;
        r.run(World::new(400_000.0, 520_000.0, 0.0, 0.6), SATURATED_TICKS);
        assert_eq!(r.moves, vec![(start + TICK * SATURATED_TICKS, Lane::Pool)]);
        // Probes (after 1 s, 2 s, 4 s) confirm it: the pool stays.
        let (poller, pool) = r.run(
            World::new(400_000.0, 520_000.0, 0.0, 0.6),
            ticks(Duration::from_secs(10)),
        );
        assert_eq!(r.lane, Lane::Pool);
        assert_eq!(r.moves.len(), 7, "three probes: {:?}", r.moves);
        assert!(
            pool > poller * 10,
            "{poller} ticks on the poller, {pool} on the pool"
        );
    }

    #[test]
    fn a_busy_poller_the_pool_cannot_beat_keeps_its_connections() {
        // Busy and a core is idle, but the pool is no faster (say, a lock-bound load).
        let mut r = Run::new(Lane::Poller);
        let (poller, pool) = r.run(
            World::new(100_000.0, 99_000.0, 0.02, 0.6),
            ticks(Duration::from_secs(120)),
        );
        // Moves on saturation cost a probe's wait each, but fewer and fewer.
        assert!(
            poller > pool * 8,
            "{poller} ticks on the poller, {pool} on the pool"
        );
        let (_, gaps) = r.moves_to(Lane::Pool);
        assert!(
            gaps.windows(2).all(|g| g[1] >= g[0]),
            "trials back off: {gaps:?}"
        );
        assert!(
            gaps.last().expect("several trials") >= &BACKOFF_MAX,
            "{gaps:?}"
        );
    }

    #[test]
    fn a_probe_keeps_a_saturated_poller_only_if_it_serves_as_much() {
        // Pipelined: the poller has no slack and serves 3% less than the pool. A probe
        // returns to the pool, every time.
        let mut r = Run::new(Lane::Pool);
        let (poller, pool) = r.run(
            World::new(504_000.0, 520_000.0, 0.01, 0.4),
            ticks(Duration::from_secs(60)),
        );
        assert_eq!(r.lane, Lane::Pool);
        assert!(r.moves_to(Lane::Poller).0.len() >= 3, "{:?}", r.moves);
        assert!(
            pool > poller * 8,
            "{poller} on the poller, {pool} on the pool"
        );
        // With slack, the same 3% less keeps it: it serves the load more cheaply.
        let mut r = Run::new(Lane::Pool);
        r.run(
            World::new(504_000.0, 520_000.0, 0.3, 0.4),
            ticks(Duration::from_secs(60)),
        );
        assert_eq!(r.lane, Lane::Poller, "{:?}", r.moves);
    }

    #[test]
    fn no_probe_while_the_process_uses_more_than_one_thread_can() {
        let mut r = Run::new(Lane::Pool);
        let big = World {
            process: 6.0,
            ..World::new(100_000.0, 600_000.0, 0.0, 8.0)
        };
        r.run(big, ticks(BACKOFF_MAX * 3));
        assert!(r.moves.is_empty(), "{:?}", r.moves);
        // The load drops to what one thread serves as well: the next probe stays.
        let light = World {
            process: 0.3,
            ..World::new(30_000.0, 30_000.0, 0.7, 1.5)
        };
        let (poller, _) = r.run(light, ticks(BACKOFF_MAX * 2));
        assert_eq!(r.moves.len(), 1, "{:?}", r.moves);
        assert_eq!(r.lane, Lane::Poller);
        assert!(poller > 0);
    }

    #[test]
    fn a_measurement_across_a_change_of_load_decides_nothing() {
        let busy = World::new(400_000.0, 520_000.0, 0.1, 0.4);
        // Rates that jump between ticks (clients coming and going): no trial at all.
        let mut r = Run::new(Lane::Poller);
        for i in 0..ticks(Duration::from_secs(60)) {
            let rate = if i % 2 == 0 { 400_000.0 } else { 150_000.0 };
            r.run(
                World {
                    poller: rate,
                    ..busy
                },
                1,
            );
        }
        assert!(r.moves.is_empty(), "{:?}", r.moves);
        // A trial during which the clients leave: judged once the pool's ticks settle at
        // the lower rate, and back to the poller.
        let mut r = Run::new(Lane::Poller);
        r.until_moved(busy);
        r.run(busy, 2);
        r.run(
            World {
                pool: 50_000.0,
                ..busy
            },
            MEASURE_TICKS as u32 + TRIAL_EXTRA_TICKS,
        );
        assert_eq!(r.lane, Lane::Poller, "{:?}", r.moves);
        // A trial whose ticks never settle: back to the poller after the extra ticks.
        let mut r = Run::new(Lane::Poller);
        r.until_moved(busy);
        let moved = r.now;
        for i in 0.. {
            let pool = if i % 2 == 0 { 520_000.0 } else { 250_000.0 };
            r.run(World { pool, ..busy }, 1);
            if r.lane == Lane::Poller {
                break;
            }
        }
        assert_eq!(
            r.now - moved,
            TICK * (1 + MEASURE_TICKS as u32 + TRIAL_EXTRA_TICKS)
        );
    }

    #[test]
    fn a_trial_waits_out_a_jumpy_start() {
        // The pool's first ticks jump (an index growing, fresh memory faulted in), then it
        // serves 30% more than the poller: it is kept.
        let busy = World::new(400_000.0, 520_000.0, 0.1, 0.4);
        let mut r = Run::new(Lane::Poller);
        r.until_moved(busy);
        for pool in [300_000.0, 700_000.0, 350_000.0] {
            r.run(World { pool, ..busy }, 1);
        }
        r.run(busy, ticks(Duration::from_secs(1)));
        assert_eq!(r.lane, Lane::Pool, "{:?}", r.moves);
        assert_eq!(r.moves.len(), 1, "{:?}", r.moves);
    }

    #[test]
    fn a_pool_that_never_settles_is_still_probed() {
        // Pops of one key on the pool: its two threads conflict and the rate jumps from
        // tick to tick; the poller serves twice as much, steadily. The move to the pool
        // (on saturation) is undone by a probe once due, however jumpy the pool.
        let pops = World::new(140_000.0, 70_000.0, 0.0, 0.6);
        let mut r = Run::new(Lane::Poller);
        r.until_moved(pops);
        assert_eq!(r.lane, Lane::Pool);
        for i in 0..ticks(Duration::from_secs(10)) {
            let pool = if i % 2 == 0 { 40_000.0 } else { 100_000.0 };
            r.run(World { pool, ..pops }, 1);
        }
        assert_eq!(r.lane, Lane::Poller, "{:?}", r.moves);
        // The saturated poller still tries the pool now and then, each time after a longer
        // wait, and each try is undone by the next probe.
        let (_, on_pool) = r.run(pops, ticks(Duration::from_secs(60)));
        assert!(
            on_pool < ticks(Duration::from_secs(6)),
            "{on_pool} ticks on the pool: {:?}",
            r.moves
        );
        let (_, gaps) = r.moves_to(Lane::Pool);
        assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
    }

    #[test]
    fn probes_that_find_the_poller_jumpy_back_off() {
        // Pipelined, on the pool: on the poller the rate jumps from tick to tick, so no
        // probe gets a verdict. Each still costs its ticks there: they must grow apart.
        let mut r = Run::new(Lane::Pool);
        let steady = World::new(400_000.0, 520_000.0, 0.1, 0.4);
        for i in 0..ticks(Duration::from_secs(120)) {
            let poller = if i % 2 == 0 { 400_000.0 } else { 250_000.0 };
            r.run(World { poller, ..steady }, 1);
        }
        let (probes, gaps) = r.moves_to(Lane::Poller);
        assert!((4..=9).contains(&probes.len()), "{probes:?}");
        assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
        assert_eq!(r.lane, Lane::Pool);
    }

    #[test]
    fn idle_time_makes_no_probe_due() {
        let burst = World::new(400_000.0, 520_000.0, 0.0, 0.6);
        let idle = World::new(0.0, 0.0, 1.0, 1.8);
        let mut r = Run::new(Lane::Poller);
        r.run(burst, ticks(Duration::from_secs(10)));
        assert_eq!(r.lane, Lane::Pool);
        // Short bursts between pauses (a benchmark's separate runs): each is too short to
        // be probed, however long the pauses.
        let settled = r.moves.len();
        for _ in 0..10 {
            r.run(idle, ticks(Duration::from_secs(3)));
            r.run(burst, ticks(PROBE_FIRST) - 4);
        }
        assert_eq!(r.moves.len(), settled, "{:?}", &r.moves[settled..]);
    }

    #[test]
    fn a_new_load_after_a_pause_is_judged_on_its_own_figures() {
        // Idle for a while (the smoothed figures say "idle poller"), then a load the pool
        // serves better: the trial starts as soon as a measurement exists.
        let mut r = Run::new(Lane::Poller);
        r.run(
            World::new(0.0, 0.0, 1.0, 1.8),
            ticks(Duration::from_secs(5)),
        );
        let start = r.now;
        r.run(
            World::new(400_000.0, 520_000.0, 0.1, 0.4),
            MEASURE_TICKS as u32 + 1,
        );
        assert_eq!(r.moves.len(), 1, "{:?}", r.moves);
        assert_eq!(r.moves[0].1, Lane::Pool);
        assert!(r.moves[0].0 <= start + TICK * (MEASURE_TICKS as u32 + 1));
    }

    #[test]
    fn when_the_load_changes_the_lane_follows() {
        let mut r = Run::new(Lane::Poller);
        r.run(
            World::new(400_000.0, 520_000.0, 0.1, 0.4),
            ticks(Duration::from_secs(60)),
        );
        assert_eq!(r.lane, Lane::Pool);
        // Now unpipelined: the poller serves more, and the next probe keeps it.
        r.run(
            World::new(60_000.0, 52_000.0, 0.08, 0.05),
            ticks(BACKOFF_MAX * 2),
        );
        assert_eq!(r.lane, Lane::Poller);
        let settled = r.moves.len();
        r.run(
            World::new(60_000.0, 52_000.0, 0.08, 0.05),
            ticks(BACKOFF_MAX * 2),
        );
        assert_eq!(r.moves.len(), settled, "and stays");
        // Pipelined again: back to the pool within a trial.
        r.run(
            World::new(400_000.0, 520_000.0, 0.1, 0.4),
            ticks(Duration::from_secs(3)),
        );
        assert_eq!(r.lane, Lane::Pool);
    }

    #[test]
    fn a_busy_load_spins_longer_unless_spinning_is_off_or_replies_wait_for_fsync() {
        let default = IDLE_POLL_US_DEFAULT * 1000;
        let busy = nanos(BUSY_SPIN);
        assert_eq!(spin_ns(default, 0.0, false), default);
        assert_eq!(spin_ns(default, BUSY_SPIN_RATE - 1.0, false), default);
        assert_eq!(spin_ns(default, BUSY_SPIN_RATE, false), busy);
        assert_eq!(spin_ns(default, 500_000.0, false), busy);
        // Longer settings stay; 0 means no spinning at all, whatever the load.
        assert_eq!(spin_ns(busy * 3, 500_000.0, false), busy * 3);
        assert_eq!(spin_ns(0, 500_000.0, false), 0);
        // Under `sync` the gaps are fsyncs, and the setting stays as it is.
        assert_eq!(spin_ns(default, 500_000.0, true), default);
        assert_eq!(spin_ns(busy * 3, 500_000.0, true), busy * 3);
        assert_eq!(spin_ns(0, 500_000.0, true), 0);
    }

    #[test]
    fn proc_readers_parse_this_machine() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let idle = CpuTicks::machine_idle().expect("/proc/stat");
        let start = CpuTicks::process_used().expect("/proc/self/stat");
        // Burn CPU until the process's ticks move: they would not if the wrong field were
        // read. (Slow machines only make this take longer.)
        let began = Instant::now();
        let mut x = 0u64;
        while CpuTicks::process_used().expect("again").0 < start.0 + 5 {
            for i in 0..1_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
            assert!(
                began.elapsed() < Duration::from_secs(60),
                "CPU time never moved"
            );
        }
        assert!(CpuTicks::machine_idle().expect("again").0 >= idle.0);
    }
}
