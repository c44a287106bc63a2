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
//! the pool; pipelined ones saturate one server thread while the client has slack, and the pool
//! serves them ~25% faster. So with `poller auto` (the default) a controller watches both and
//! moves connections:
//!
//! - to the pool when the poller is saturated (under [`SATURATED_IDLE`] of its time idle for
//!   [`SATURATED_TICKS`] ticks in a row) and the machine has a core's share idle
//!   ([`SPARE_CORES`]) for a second thread to use;
//! - back to the poller on a probe: after a while on the pool ([`PROBE_FIRST`], doubling up
//!   to [`PROBE_MAX`] each time the poller saturates again soon after), connections go back,
//!   and stay if the poller keeps up. No probe while the process uses [`PROBE_CPU_MAX`] cores
//!   or more: that load cannot fit on one thread.
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
/// The poller counts as saturated while it is idle less than this share of a tick.
pub const SATURATED_IDLE: f64 = 0.05;
/// Ticks in a row the poller must be saturated before connections move to the pool.
pub const SATURATED_TICKS: u32 = 2;
/// Idle CPU (in cores, over the machine) the pool needs to be of use: without it a second
/// thread would only take time from the clients.
pub const SPARE_CORES: f64 = 0.25;
/// How long connections stay on the pool before the first probe of the poller.
pub const PROBE_FIRST: Duration = Duration::from_secs(2);
/// The longest wait between probes.
pub const PROBE_MAX: Duration = Duration::from_secs(30);
/// No probe while the process uses this many cores or more: a load like that cannot fit on
/// one thread, and sending it there would only stall it (on a large machine, badly).
pub const PROBE_CPU_MAX: f64 = 1.5;
/// A poller stint shorter than this that ends saturated counts as a failed probe.
const PROBE_HELD: Duration = Duration::from_secs(10);
/// Default `idle-poll-us`.
pub const IDLE_POLL_US_DEFAULT: u64 = 100;
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
    idle_poll_ns: AtomicU64,
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
        // Only the poller thread runs the spinner and these connections, so this check
        // cannot race the spinner going to sleep.
        if self.sleeping.load(Relaxed) && self.idle_poll_ns.load(Relaxed) != 0 {
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
    /// Starts the poller thread; the pool is the runtime this is called on.
    pub fn start(setting: PollerMode, idle_poll_us: u64) -> std::io::Result<Lanes> {
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
                runtime.spawn(spin(spinner));
                runtime.block_on(stopped.cancelled());
                // Connections still here are dropped (closed) with the runtime.
                runtime.shutdown_background();
            })?;
        let lane = match setting {
            PollerMode::Off => Lane::Pool,
            PollerMode::Auto | PollerMode::On => Lane::Poller,
        };
        Ok(Lanes {
            lane: AtomicU8::new(lane as u8),
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
        self.set_lane(match setting {
            PollerMode::Off => Lane::Pool,
            PollerMode::Auto | PollerMode::On => Lane::Poller,
        });
    }

    pub fn idle_poll_us(&self) -> u64 {
        self.state.idle_poll_ns.load(Relaxed) / 1000
    }

    pub fn set_idle_poll_us(&self, us: u64) {
        self.state.idle_poll_ns.store(us * 1000, Relaxed);
    }

    /// Stops the poller thread and waits for it (connections still on it are closed).
    pub fn stop(&self) {
        self.stop.cancel();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }

    /// Samples every [`TICK`] and moves connections as [`Policy`] decides, until `shutdown`.
    pub async fn control(&self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut policy = Policy::new(Instant::now(), self.lane());
        let mut last = Instant::now();
        let mut idle = self.state.idle_now();
        let mut cpu = CpuIdle::read();
        let mut used = ProcessCpu::read();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let now = Instant::now();
            let wall = nanos(now - last).max(1) as f64;
            let idle_now = self.state.idle_now();
            let poller_idle = (idle_now.saturating_sub(idle) as f64 / wall).min(1.0);
            let cpu_now = CpuIdle::read();
            let used_now = ProcessCpu::read();
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
            // After CONFIG SET (or with auto off) start from where connections are now.
            if self.setting() != PollerMode::Auto || policy.lane != self.lane() {
                policy = Policy::new(now, self.lane());
                if self.setting() != PollerMode::Auto {
                    continue;
                }
            }
            let sample = Sample {
                now,
                poller_idle,
                spare_cores: spare,
                process_cores,
                pool_workers: self.pool_workers,
            };
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
async fn spin(state: Arc<PollerState>) {
    loop {
        let mut seen = state.activity.load(Relaxed);
        let mut idle_since = Instant::now();
        let mut prev = idle_since;
        let mut busy = false;
        loop {
            tokio::task::yield_now().await;
            let activity = state.activity.load(Relaxed);
            if activity != seen {
                seen = activity;
                busy = true;
                continue;
            }
            let now = Instant::now();
            if busy {
                // The first empty poll after work: idle from here.
                busy = false;
                idle_since = now;
            } else {
                state.idle_ns.fetch_add(nanos(now - prev), Relaxed);
            }
            prev = now;
            if nanos(now - idle_since) >= state.idle_poll_ns.load(Relaxed) {
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

/// Idle CPU time of the whole machine, from `/proc/stat`.
#[derive(Debug, Clone, Copy)]
struct CpuIdle {
    /// idle + iowait, in clock ticks.
    ticks: u64,
}

impl CpuIdle {
    fn read() -> Option<CpuIdle> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let line = text.lines().next()?.strip_prefix("cpu ")?;
        let fields: Vec<u64> = line
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        Some(CpuIdle {
            ticks: fields.get(3)? + fields.get(4).copied().unwrap_or(0),
        })
    }

    /// Idle cores, on average, between `earlier` and this sample, `wall_ns` apart.
    fn cores_since(self, earlier: CpuIdle, wall_ns: f64) -> f64 {
        (self.ticks.saturating_sub(earlier.ticks) as f64 * TICK_NS) / wall_ns
    }
}

/// CPU time this process has used, from `/proc/self/stat`.
#[derive(Debug, Clone, Copy)]
struct ProcessCpu {
    /// utime + stime, in clock ticks.
    ticks: u64,
}

impl ProcessCpu {
    fn read() -> Option<ProcessCpu> {
        let text = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = &text[text.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(ProcessCpu {
            ticks: utime + stime,
        })
    }

    /// Cores used, on average, between `earlier` and this sample, `wall_ns` apart.
    fn cores_since(self, earlier: ProcessCpu, wall_ns: f64) -> f64 {
        (self.ticks.saturating_sub(earlier.ticks) as f64 * TICK_NS) / wall_ns
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
    pub pool_workers: usize,
}

/// The controller's decisions, apart from the clock and the measurements so that tests can
/// drive it.
#[derive(Debug)]
pub struct Policy {
    lane: Lane,
    /// When the current lane was entered.
    since: Instant,
    saturated: u32,
    /// How long the next stint on the pool lasts before probing the poller.
    backoff: Duration,
    /// The current stint on the poller is a probe.
    probing: bool,
    /// The process's CPU use, smoothed over about five ticks.
    process_cores: f64,
}

impl Policy {
    pub fn new(now: Instant, lane: Lane) -> Policy {
        Policy {
            lane,
            since: now,
            saturated: 0,
            backoff: PROBE_FIRST,
            probing: false,
            process_cores: 0.0,
        }
    }

    /// The lane to move to, if any.
    pub fn step(&mut self, s: Sample) -> Option<Lane> {
        self.process_cores += (s.process_cores - self.process_cores) * 0.2;
        match self.lane {
            Lane::Poller => {
                let pool_helps = s.pool_workers >= 2 && s.spare_cores >= SPARE_CORES;
                if s.poller_idle < SATURATED_IDLE && pool_helps {
                    self.saturated += 1;
                } else {
                    self.saturated = 0;
                }
                if self.saturated < SATURATED_TICKS {
                    return None;
                }
                // A probe that saturated soon failed: wait longer before the next. Otherwise
                // the load has changed since the last move: start over.
                self.backoff = if self.probing && s.now.duration_since(self.since) < PROBE_HELD {
                    (self.backoff * 2).min(PROBE_MAX)
                } else {
                    PROBE_FIRST
                };
                self.enter(Lane::Pool, s.now)
            }
            Lane::Pool => {
                if s.now.duration_since(self.since) < self.backoff {
                    return None;
                }
                if self.process_cores >= PROBE_CPU_MAX {
                    // Too busy for one thread: look again after another backoff.
                    self.since = s.now;
                    return None;
                }
                self.enter(Lane::Poller, s.now)
            }
        }
    }

    fn enter(&mut self, lane: Lane, now: Instant) -> Option<Lane> {
        self.probing = lane == Lane::Poller;
        self.lane = lane;
        self.since = now;
        self.saturated = 0;
        Some(lane)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_probe_while_the_process_uses_more_than_one_thread_can() {
        let t0 = Instant::now();
        let mut p = Policy::new(t0, Lane::Pool);
        let busy = |now| Sample {
            process_cores: 6.0,
            ..sample(now, 1.0, 8.0)
        };
        let mut now = t0;
        for _ in 0..(PROBE_MAX.as_millis() / TICK.as_millis() * 3) {
            now += TICK;
            assert_eq!(p.step(busy(now)), None, "a 6-core load stays on the pool");
        }
        // The load drops to what one thread can serve: the next probe goes ahead.
        let mut probed = false;
        for _ in 0..(PROBE_MAX.as_millis() / TICK.as_millis() * 2) {
            now += TICK;
            if p.step(sample(now, 1.0, 8.0)) == Some(Lane::Poller) {
                probed = true;
                break;
            }
        }
        assert!(probed);
    }

    #[test]
    fn proc_readers_parse_this_machine() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let idle = CpuIdle::read().expect("/proc/stat");
        let start = ProcessCpu::read().expect("/proc/self/stat");
        // Burn CPU until the process's ticks move: they would not if the wrong field were
        // read. (Slow machines only make this take longer.)
        let began = Instant::now();
        let mut x = 0u64;
        while ProcessCpu::read().expect("again").ticks < start.ticks + 5 {
            for i in 0..1_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
            assert!(
                began.elapsed() < Duration::from_secs(60),
                "CPU time never moved"
            );
        }
        assert!(CpuIdle::read().expect("again").ticks >= idle.ticks);
    }

    fn sample(now: Instant, poller_idle: f64, spare_cores: f64) -> Sample {
        Sample {
            now,
            poller_idle,
            spare_cores,
            process_cores: 1.0,
            pool_workers: 2,
        }
    }

    #[test]
    fn a_saturated_poller_with_a_spare_core_moves_to_the_pool() {
        let t0 = Instant::now();
        let mut p = Policy::new(t0, Lane::Poller);
        assert_eq!(
            p.step(sample(t0 + TICK, 0.01, 0.6)),
            None,
            "one tick is not enough"
        );
        assert_eq!(p.step(sample(t0 + TICK * 2, 0.01, 0.6)), Some(Lane::Pool));
    }

    #[test]
    fn the_poller_stays_when_it_keeps_up_or_nothing_is_spare() {
        let t0 = Instant::now();
        let mut p = Policy::new(t0, Lane::Poller);
        for i in 1..100 {
            // Slack on the poller (client-bound), or no idle core for a second thread.
            let s = if i % 2 == 0 {
                sample(t0 + TICK * i, 0.12, 0.6)
            } else {
                sample(t0 + TICK * i, 0.0, 0.1)
            };
            assert_eq!(p.step(s), None, "tick {i}");
        }
        let mut one = Policy::new(t0, Lane::Poller);
        for i in 1..10 {
            let s = Sample {
                pool_workers: 1,
                ..sample(t0 + TICK * i, 0.0, 1.0)
            };
            assert_eq!(one.step(s), None, "a one-worker pool is no better");
        }
    }

    #[test]
    fn probes_back_off_while_the_poller_keeps_saturating() {
        let t0 = Instant::now();
        let mut p = Policy::new(t0, Lane::Poller);
        let mut now = t0;
        let mut stints = Vec::new();
        for _ in 0..8 {
            // Saturate the poller until it moves.
            loop {
                now += TICK;
                if p.step(sample(now, 0.0, 0.8)) == Some(Lane::Pool) {
                    break;
                }
            }
            let left = now;
            // Then count how long the pool lasts before the probe.
            loop {
                now += TICK;
                if p.step(sample(now, 0.0, 0.8)) == Some(Lane::Poller) {
                    break;
                }
            }
            stints.push(now - left);
        }
        assert!(stints[0] >= PROBE_FIRST && stints[0] < PROBE_FIRST + TICK * 2);
        assert!(stints.windows(2).all(|w| w[1] >= w[0]), "{stints:?}");
        assert!(stints.last().unwrap() >= &PROBE_MAX, "{stints:?}");
        assert!(stints.iter().all(|s| *s <= PROBE_MAX + TICK), "{stints:?}");
    }

    #[test]
    fn a_probe_that_keeps_up_stays_and_the_backoff_starts_over() {
        let t0 = Instant::now();
        let mut p = Policy::new(t0, Lane::Poller);
        let mut now = t0;
        // Three failed probes grow the backoff.
        for _ in 0..3 {
            while p.step(sample(now, 0.0, 0.8)) != Some(Lane::Pool) {
                now += TICK;
            }
            while p.step(sample(now, 0.0, 0.8)) != Some(Lane::Poller) {
                now += TICK;
            }
        }
        assert!(p.backoff > PROBE_FIRST);
        // The load drops: the poller keeps up for a long time.
        for _ in 0..(PROBE_HELD.as_millis() / TICK.as_millis() + 2) {
            now += TICK;
            assert_eq!(p.step(sample(now, 0.3, 0.8)), None);
        }
        // Load returns: move to the pool, and the next probe comes after the first backoff.
        now += TICK;
        assert_eq!(p.step(sample(now, 0.0, 0.8)), None);
        now += TICK;
        assert_eq!(p.step(sample(now, 0.0, 0.8)), Some(Lane::Pool));
        assert_eq!(p.backoff, PROBE_FIRST);
    }
}
