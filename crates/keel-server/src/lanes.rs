//! Where connections run: on the *pool* or on the *poller*.
//!
//! - The **pool** is tokio's multi-thread runtime, one worker per core: the default
//!   (`poller off`). With the server on cores of its own it serves as much as the best lane
//!   or within 5% of it (BENCHMARKS.md, "Which lane serves connections"), and it is the only
//!   lane that grows with cores.
//! - The **poller** (`poller on`) is one thread (a current-thread tokio runtime) that serves
//!   every connection, like Redis's event loop, but does not sleep while requests keep
//!   coming: a spinner task keeps polling the sockets until none has had anything to read for
//!   `idle-poll-us`. A request then never has to wake a sleeping server thread and is never
//!   handed between threads, and commands never run at the same time, so commands on one hot
//!   key never conflict. It serves more where clients share the server's cores, or where
//!   unpipelined clients all hit one key; it tops out at what one thread does.
//!
//! An earlier `poller auto` moved connections between the two by measuring; on a 16-core
//! machine it trailed the better fixed lane in most cells, so it went (git history has it).
//!
//! A connection whose commands take a hot key's lock runs on the poller whatever the setting
//! (`hot.rs`, `Conn::lane`). A connection moves at a request boundary when its lane changes:
//! after it has written every reply and before it reads again, it hands its socket, its state
//! (`MULTI` queue, `WATCH` snapshot, bytes of a half-read request) and itself to the other
//! runtime. An idle connection moves when its next request arrives. Nothing is lost or
//! reordered: a connection is one task at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How often the spin is set from the load ([`spin_ns`]).
pub const TICK: Duration = Duration::from_millis(50);
/// Default `idle-poll-us`.
pub const IDLE_POLL_US_DEFAULT: u64 = 100;
/// At [`BUSY_SPIN_RATE`] commands per second or more, the spinner keeps polling at least this
/// long after the last request. A load that heavy stays hot, and the gaps in it are ones where
/// the client was held up, not pauses. A poller that parks in such a gap makes the next request
/// wait for its thread to wake, which on a VM can take milliseconds. Meanwhile the other
/// clients' requests queue behind it. At -P 1 with 50 clients the poller parked 1–2 times per
/// 1000 requests with the 100 µs default, and never with 2 ms.
pub const BUSY_SPIN: Duration = Duration::from_millis(2);
/// Commands per second (over one [`TICK`]) from which [`BUSY_SPIN`] applies: one every
/// 100 µs, the default `idle-poll-us`, so a load that would keep the poller spinning anyway.
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
/// 100 µs served 9% more INCR (median of five rounds, 18% in an earlier five; the
/// measurement is in commit b299f6f's message).
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
    /// The poller.
    On,
    /// The pool.
    Off,
}

impl PollerMode {
    /// The lane connections go to when this is set.
    fn first_lane(self) -> Lane {
        match self {
            PollerMode::Off => Lane::Pool,
            PollerMode::On => Lane::Poller,
        }
    }

    /// The setting's name.
    pub fn name(self) -> &'static str {
        match self {
            PollerMode::On => "on",
            PollerMode::Off => "off",
        }
    }
}

impl std::str::FromStr for PollerMode {
    type Err = String;
    fn from_str(s: &str) -> Result<PollerMode, String> {
        match s.to_ascii_lowercase().as_str() {
            "on" | "yes" => Ok(PollerMode::On),
            "off" | "no" => Ok(PollerMode::Off),
            "auto" => Err(
                "poller takes on or off: auto was removed (off, the worker pool, is the default)"
                    .into(),
            ),
            _ => Err(format!("poller takes on or off, not {s:?}")),
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

/// The two runtimes and the current lane.
pub struct Lanes {
    lane: AtomicU8,
    setting: AtomicU8,
    pool: Handle,
    poller: Handle,
    pub state: Arc<PollerState>,
    stop: CancellationToken,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub switches: AtomicU64,
    /// Connections that moved from one lane to the other.
    pub moves: AtomicU64,
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
        let state = Arc::new(PollerState {
            activity: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            wake: Notify::new(),
            idle_poll_ns: AtomicU64::new(idle_poll_us * 1000),
            spin_ns: AtomicU64::new(idle_poll_us * 1000),
            inline_log,
            replies_wait_for_fsync,
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
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
            poller,
            state,
            stop,
            thread: Mutex::new(Some(thread)),
            switches: AtomicU64::new(0),
            moves: AtomicU64::new(0),
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
        if self.setting.load(Relaxed) == PollerMode::On as u8 {
            PollerMode::On
        } else {
            PollerMode::Off
        }
    }

    /// `CONFIG SET poller`: every connection moves at its next request.
    pub fn set_setting(&self, setting: PollerMode) {
        self.setting.store(setting as u8, Relaxed);
        self.set_lane(setting.first_lane());
    }

    pub fn idle_poll_us(&self) -> u64 {
        self.state.idle_poll_ns.load(Relaxed) / 1000
    }

    /// Sets `idle-poll-us`; the spin follows at once, and [`Lanes::control`] raises it again
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

    /// Sets the poller's spin from the load every [`TICK`] ([`spin_ns`]), until `shutdown`.
    /// `commands` counts the commands served.
    pub async fn control(&self, shutdown: CancellationToken, commands: &AtomicU64) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last = Instant::now();
        let mut served = commands.load(Relaxed);
        let mut fsyncs = self.log_fsyncs();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let now = Instant::now();
            let secs = (now - last).as_secs_f64().max(1e-9);
            last = now;
            // CONFIG RESETSTAT may zero the count: that tick then counts nothing.
            let served_now = commands.load(Relaxed);
            let rate = served_now.saturating_sub(served) as f64 / secs;
            served = served_now;
            let fsyncs_now = self.log_fsyncs();
            self.state.spin_ns.store(
                spin_ns(
                    self.state.idle_poll_ns.load(Relaxed),
                    rate,
                    // Under `sync`, replies waited for fsyncs in this tick.
                    self.state.replies_wait_for_fsync && fsyncs_now != fsyncs,
                ),
                Relaxed,
            );
            fsyncs = fsyncs_now;
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
/// poll the sockets without blocking. The clock is read only on polls that found nothing: a
/// busy poller does not pay for it.
///
/// Under `sync` durability it also writes and fsyncs the log for the commits its passes
/// made, under `async` it writes the log (no fsync) for the replies that wait for it, and it
/// does not sleep while any of them still waits (the flusher thread may hold the log for a
/// moment).
async fn spin(state: Arc<PollerState>) {
    loop {
        let mut seen = state.activity.load(Relaxed);
        let mut idle_since = None;
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
                seen = activity;
                idle_since = None;
                continue;
            }
            // The first empty poll after work: idle from here.
            let since = *idle_since.get_or_insert_with(Instant::now);
            if nanos(since.elapsed()) >= state.spin_ns.load(Relaxed) {
                break;
            }
        }
        state.sleeping.store(true, Relaxed);
        state.wake.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn auto_is_refused_with_the_reason() {
        let err = "auto".parse::<PollerMode>().expect_err("auto is gone");
        assert!(err.contains("removed"), "{err}");
        assert_eq!("ON".parse::<PollerMode>(), Ok(PollerMode::On));
        assert_eq!("no".parse::<PollerMode>(), Ok(PollerMode::Off));
    }
}
