//! Write-ahead log: redo-only, one frame per committed transaction, written after validation
//! succeeds (nothing uncommitted or aborted is ever logged).
//!
//! Committers reserve log space with one atomic add on the tail LSN and copy their frame into
//! a shared in-memory ring in parallel (Deuteronomy). A frame becomes visible to the flusher
//! when its header word is stored (release) — the last thing its committer writes. One
//! flusher thread writes the contiguous run of ready frames to the current segment, fsyncs
//! (every batch in `sync` mode, every interval in `async` mode), publishes the durable LSN,
//! and zeroes and releases the ring space. In `sync` mode a committer waits for the durable
//! LSN to pass its frame: every commit that arrived during one fsync shares it (group commit).
//!
//! Waiting committers register in a waiter list and park; after each fsync the flusher
//! unparks exactly those it made durable, so they all become runnable at once instead of
//! taking turns on one mutex. An async committer (`Txn::commit_async`) registers its commit
//! timestamp instead: the flusher marks it finished in the oracle once durable and advances
//! the watermark, which wakes the committer's task. Before writing a batch in `sync` mode
//! the flusher gathers: while fewer committers wait than waited last time, and they keep
//! arriving, it waits a bounded moment (scaled by what an fsync costs) so that one fsync
//! covers them all (see `Gather`). A lone committer expects no company and never waits.
//!
//! A thread that runs an event loop (the server's poller) may flush instead, as Redis does:
//! a commit of its own that waits calls the thread's hook rather than waking the flusher,
//! and from its loop the thread writes and fsyncs the batch itself ([`Log::flush_here`]),
//! with no gather and no hand-off between threads. A round of writing runs under one lock,
//! whoever runs it. The flusher thread steps back while inline rounds keep coming and takes
//! over 5 ms after they stop, so nothing waits long on an event loop that stopped.
//!
//! In `async` mode commits do not wait, but a server must not reply before the log is written
//! to the OS (a kill -9 would lose what it acknowledged): [`Log::watch_written`] waits for the
//! `written` LSN, which the flusher thread, or an event loop flushing inline, advances with a
//! write and no fsync. There the flusher fsyncs outside the writer lock, so such a write
//! never waits for the disk.
//!
//! The first failed write or fsync poisons the log for good: every waiting committer and
//! every later commit gets the error, and nothing is retried (the kernel may have dropped the
//! dirty pages, so no later fsync could vouch for them). Recovery from the files is the only
//! way back.

pub(crate) mod format;
pub(crate) mod reader;

use std::cell::RefCell;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::Waker;
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex};

use crate::Ts;
use crate::concurrency::Oracle;
use crate::io::{AppendFile, Disk};
use crate::memory::Region;
use format::{FRAME_HEADER_BYTES, frame_bytes, segment_header, segment_name};

/// Ring size: larger than the largest frame, so one frame always fits.
const RING_BYTES: usize = 64 << 20;
// Writers get the ring a page at a time ([`Flusher::release`]), so a frame has one page less.
const _: () =
    assert!(format::PAYLOAD_BYTES_MAX + FRAME_HEADER_BYTES <= RING_BYTES - RING_PAGE_BYTES);
const _: () = assert!(RING_BYTES.is_multiple_of(8));

/// Bounds of the gather's quiet gap (see [`Gather::quiet`]).
const GATHER_QUIET_MIN: Duration = Duration::from_micros(10);
const GATHER_QUIET_MAX: Duration = Duration::from_micros(500);
/// The gather never waits longer than this, however slow fsyncs are.
const GATHER_MAX: Duration = Duration::from_millis(4);

/// When a commit is acknowledged relative to its log frame reaching the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Acknowledge after the commit's frame is fsynced (group commit shares fsyncs).
    Sync,
    /// Acknowledge at once; fsync at least every `interval`. A crash loses at most that
    /// window of commits, never part of one.
    Async {
        /// Longest time between fsyncs.
        interval: Duration,
    },
    /// Memory only: no files at all.
    None,
}

/// What [`Db::flush_log_here`](crate::Db::flush_log_here) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogFlush {
    /// How long it spent writing and fsyncing the log on the calling thread, mostly waiting
    /// for the disk (zero if it did not, and for a write without fsync under `async`: that
    /// is work, not a wait).
    pub took: Duration,
    /// Commits still wait for the log: call again soon.
    pub waiting: bool,
}

/// Resolves once the log is written to the operating system up to the point it was made at
/// ([`Db::log_written`](crate::Db::log_written)).
#[must_use = "a future does nothing unless awaited"]
pub struct LogWritten<'db> {
    /// `None`: nothing to wait for.
    log: Option<&'db Log>,
    end: u64,
}

impl<'db> LogWritten<'db> {
    /// Waits for everything appended to `log` so far; `None`: for nothing.
    pub(crate) fn new(log: Option<&'db Log>) -> LogWritten<'db> {
        LogWritten {
            end: log.map_or(0, Log::tail),
            log,
        }
    }
}

impl std::future::Future for LogWritten<'_> {
    type Output = Result<(), LogFailed>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let Some(log) = self.log else {
            return std::task::Poll::Ready(Ok(()));
        };
        if !log.watch_written(self.end, cx.waker()) {
            return std::task::Poll::Pending;
        }
        std::task::Poll::Ready(match log.written_lsn() >= self.end {
            true => Ok(()),
            false => Err(log
                .failed()
                .expect("a wait for the log ends early only on failure")),
        })
    }
}

/// The log failed; the database refuses writes from now on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the write-ahead log failed, so the database is read-only until restarted: {0}")]
pub struct LogFailed(pub String);

pub(crate) struct Shared {
    ring: Region,
    reserved: CachePadded<AtomicU64>,
    released: CachePadded<AtomicU64>,
    durable: CachePadded<AtomicU64>,
    /// The LSN up to which frames are written to the operating system: from there a crash
    /// of this process alone (kill -9) no longer loses them, though a crash of the machine
    /// still may until they are durable.
    written: CachePadded<AtomicU64>,
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    /// Set when the flusher has been asked to look again; it sleeps on `wake_cv` while
    /// clear. An atomic outside the mutex, so that a kick while one is already pending (the
    /// common case under load) costs one swap and no lock.
    wake_pending: AtomicBool,
    wake: Mutex<()>,
    wake_cv: Condvar,
    /// Committers waiting for durability, parked; the flusher unparks them.
    waiters: Mutex<Vec<Waiter>>,
    /// `waiters.len()`, readable without the lock (written under it).
    waiting: AtomicUsize,
    /// Tasks waiting until the log is written up to a point ([`Log::watch_written`]).
    written_waiters: Mutex<Vec<(u64, Waker)>>,
    /// `written_waiters.len()`, readable without the lock (written under it).
    written_waiting: AtomicUsize,
    /// The log's durability (also the flusher's and the database's).
    mode: Durability,
    /// While the flusher gathers: how many waiters it waits for (0 when not gathering). The
    /// committer whose registration reaches it wakes the flusher; the others need not.
    gather_target: AtomicUsize,
    /// Committers waiting for ring space sleep here.
    space: Mutex<()>,
    space_cv: Condvar,
    shutdown: AtomicBool,
    /// The highest LSN someone waits to see durable: in `async` mode the flusher fsyncs for
    /// it at once rather than at the end of the interval (a commit that asked for `sync`,
    /// a timestamp lease).
    sync_wanted: AtomicU64,
    pub(crate) fsyncs: AtomicU64,
    /// fsyncs run by a thread flushing inline.
    pub(crate) inline_fsyncs: AtomicU64,
    pub(crate) frames: AtomicU64,
    /// When a thread last flushed inline ([`Log::flush_here`]), in ns since `base`; 0: never.
    /// While that is recent the flusher thread leaves the log to it.
    inline_round_ns: AtomicU64,
    base: Instant,
    /// Where [`Wake::Finish`] waiters are marked finished.
    oracle: Option<Arc<Oracle>>,
}

/// Someone waiting until the log is durable up to `end`.
struct Waiter {
    end: u64,
    wake: Wake,
}

/// What the flusher does for a waiter once its frame is durable.
enum Wake {
    /// Unparks a committer's thread ([`Log::wait_durable`]).
    Thread(Thread),
    /// Wakes a task ([`Log::watch_durable`]).
    Task(Waker),
    /// Marks a commit timestamp finished in the oracle ([`Log::finish_when_durable`]): the
    /// commit is published without its committer having to run.
    Finish(Ts),
}

/// Where a starting log appends: `segment` (already created, its header written and
/// durable, holding data from `segment_first_lsn` up to `start_lsn`).
pub(crate) struct Tail {
    pub(crate) segment: Box<dyn AppendFile>,
    pub(crate) segment_first_lsn: u64,
    pub(crate) start_lsn: u64,
}

/// The write-ahead log of one database.
pub(crate) struct Log {
    shared: Arc<Shared>,
    /// What writes and fsyncs the log: the flusher thread, or a thread flushing inline
    /// ([`Log::flush_here`]), whichever holds the lock.
    writer: Arc<Mutex<Flusher>>,
    flusher: Mutex<Option<JoinHandle<()>>>,
}

thread_local! {
    static ENCODE_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Set on a thread that flushes the log itself ([`flush_inline_on_this_thread`]): called
    /// instead of waking the flusher thread when a commit on this thread starts waiting.
    static INLINE_FLUSH: RefCell<Option<Rc<dyn Fn()>>> = const { RefCell::new(None) };
}

/// Makes the calling thread flush the log itself under `sync` durability, as Redis's event
/// loop does: a commit on this thread that waits for the log (asynchronously: a task, or a
/// commit the flusher finishes) no longer wakes the flusher thread; `on_wait` is called
/// instead, and the thread promises to call [`Log::flush_here`] soon. The flusher thread
/// still writes whatever is left about 5–10 ms after the last inline round, so a missed call
/// costs latency, not a hang. A commit that parks its thread ([`Log::wait_durable`]) wakes
/// the flusher as always. `None` undoes it.
pub(crate) fn flush_inline_on_this_thread(on_wait: Option<Rc<dyn Fn()>>) {
    INLINE_FLUSH.with(|hook| *hook.borrow_mut() = on_wait);
}

/// Whether this thread flushes the log inline ([`flush_inline_on_this_thread`]).
fn has_inline_hook() -> bool {
    INLINE_FLUSH.with(|hook| hook.borrow().is_some())
}

/// Calls this thread's inline-flush hook; false if it has none.
fn call_inline_hook() -> bool {
    INLINE_FLUSH.with(|hook| match &*hook.borrow() {
        Some(hook) => {
            hook();
            true
        }
        None => false,
    })
}

impl Log {
    /// Starts the log at `tail.start_lsn`, appending to `tail.segment`.
    pub(crate) fn start(
        disk: Arc<dyn Disk>,
        dir: PathBuf,
        tail: Tail,
        mode: Durability,
        segment_bytes_target: u64,
        oracle: Option<Arc<Oracle>>,
    ) -> Log {
        let Tail {
            segment,
            segment_first_lsn,
            start_lsn,
        } = tail;
        assert!(start_lsn.is_multiple_of(8));
        let shared = Arc::new(Shared {
            ring: Region::sequential(RING_BYTES),
            reserved: CachePadded::new(AtomicU64::new(start_lsn)),
            released: CachePadded::new(AtomicU64::new(page_floor(start_lsn))),
            durable: CachePadded::new(AtomicU64::new(start_lsn)),
            written: CachePadded::new(AtomicU64::new(start_lsn)),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            wake_pending: AtomicBool::new(false),
            wake: Mutex::new(()),
            wake_cv: Condvar::new(),
            waiters: Mutex::new(Vec::new()),
            waiting: AtomicUsize::new(0),
            written_waiters: Mutex::new(Vec::new()),
            written_waiting: AtomicUsize::new(0),
            mode,
            gather_target: AtomicUsize::new(0),
            space: Mutex::new(()),
            space_cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            sync_wanted: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            inline_fsyncs: AtomicU64::new(0),
            frames: AtomicU64::new(0),
            inline_round_ns: AtomicU64::new(0),
            base: Instant::now(),
            oracle,
        });
        let flusher = Flusher {
            shared: Arc::clone(&shared),
            disk,
            dir,
            segment: Arc::from(segment),
            segment_bytes: start_lsn - segment_first_lsn,
            segment_bytes_target,
            written: start_lsn,
            synced: start_lsn,
            last_sync: Instant::now(),
            gather: Gather::new(),
            woken: Vec::new(),
            woken_written: Vec::new(),
            populated: 0,
        };
        let writer = Arc::new(Mutex::new(flusher));
        let thread_writer = Arc::clone(&writer);
        let thread_shared = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("keel-wal-flusher".into())
            .spawn(move || run_flusher(&thread_shared, &thread_writer))
            .expect("spawning the log flusher thread");
        Log {
            shared,
            writer,
            flusher: Mutex::new(Some(handle)),
        }
    }

    pub(crate) fn mode(&self) -> Durability {
        self.shared.mode
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Appends one commit's frame; returns the LSN just past it.
    pub(crate) fn append<'a>(
        &self,
        ts: Ts,
        count: usize,
        entries: impl Iterator<Item = (&'a [u8], format::Logged<'a>)> + Clone,
    ) -> Result<u64, LogFailed> {
        self.append_frame(ts, format::Kind::Commit, count, entries)
    }

    /// Appends a frame of any kind; returns the LSN just past it.
    pub(crate) fn append_frame<'a>(
        &self,
        ts: Ts,
        kind: format::Kind<'_>,
        count: usize,
        entries: impl Iterator<Item = (&'a [u8], format::Logged<'a>)> + Clone,
    ) -> Result<u64, LogFailed> {
        let s = &*self.shared;
        s.check()?;
        if s.shutdown.load(Ordering::Acquire) {
            // Nobody would write the frame: refuse rather than leave a waiter hanging.
            return Err(LogFailed("the log is closed".into()));
        }
        ENCODE_BUFFER.with(|buffer| {
            let mut payload = buffer.borrow_mut();
            payload.clear();
            format::encode_payload(&mut payload, ts, kind, count, entries);
            let frame = frame_bytes(payload.len()) as u64;
            let lsn = s.reserved.fetch_add(frame, Ordering::AcqRel);
            let end = lsn + frame;
            while end > s.released.load(Ordering::Acquire) + RING_BYTES as u64 {
                s.check()?;
                s.kick();
                let mut guard = s.space.lock();
                s.space_cv.wait_for(&mut guard, Duration::from_millis(1));
            }
            // SAFETY: `[lsn, end)` is ours alone (reserved by the atomic add) and free (the
            // flusher released it), and the ring outlives this call.
            unsafe { s.fill(lsn, &payload) };
            Ok(end)
        })
    }

    /// Waits until the log is durable up to `end`.
    ///
    /// Registers in the waiter list and parks; the flusher unparks it once `durable` passes
    /// `end` (or the log fails). Parking has a timeout so that a lost wakeup costs a little
    /// time, never a hang.
    pub(crate) fn wait_durable(&self, end: u64) -> Result<(), LogFailed> {
        let s = &*self.shared;
        if s.durable.load(Ordering::Acquire) >= end {
            return Ok(());
        }
        s.sync_wanted.fetch_max(end, Ordering::SeqCst);
        s.register(end, Wake::Thread(std::thread::current()));
        // Registered before this check: either we see the durable LSN (or the failure), or
        // the flusher, which publishes it before taking the list, sees us and unparks us.
        while s.durable.load(Ordering::Acquire) < end {
            s.check()?;
            std::thread::park_timeout(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Asks for `waker` to be woken once the log is durable up to `end` (or has failed).
    /// Returns whether it already is (then nothing is registered). The task polls again:
    /// this only registers.
    pub(crate) fn watch_durable(&self, end: u64, waker: &Waker) -> bool {
        let s = &*self.shared;
        if s.durable.load(Ordering::Acquire) >= end || s.failed.load(Ordering::Acquire) {
            return true;
        }
        s.sync_wanted.fetch_max(end, Ordering::SeqCst);
        s.register(end, Wake::Task(waker.clone()));
        // As in `wait_durable`: registered before this check, so either we see it or the
        // flusher sees us.
        s.durable.load(Ordering::Acquire) >= end || s.failed.load(Ordering::Acquire)
    }

    /// Hands commit `ts`, whose frame ends at `end`, to the flusher: once the frame is
    /// durable, the flusher marks `ts` finished in the oracle and advances the watermark, so
    /// the commit becomes visible without its committer running again. The committer keeps
    /// its slot and waits for the watermark ([`Oracle::watch`]). After a log failure `ts` is
    /// never finished: nobody may read what the disk does not hold.
    pub(crate) fn finish_when_durable(&self, end: u64, ts: Ts) {
        let s = &*self.shared;
        let oracle = s.oracle.as_ref().expect("a database log has the oracle");
        if s.durable.load(Ordering::Acquire) < end {
            s.sync_wanted.fetch_max(end, Ordering::SeqCst);
            s.register(end, Wake::Finish(ts));
        }
        // Durable already, or the flusher published `durable` past `end` and took the list
        // before we registered: finish it ourselves. Finishing twice is harmless (the same
        // store).
        if s.durable.load(Ordering::Acquire) >= end {
            oracle.finish(ts);
            oracle.advance();
        }
    }

    /// Under `sync`, writes and fsyncs on the calling thread whatever commits wait for, if
    /// the flusher thread is not doing so right now (see [`flush_inline_on_this_thread`]).
    /// Says how long that took, and whether commits still wait for the log afterwards (the
    /// flusher thread had the log, or more arrived), so that the caller keeps calling.
    pub(crate) fn flush_here(&self) -> LogFlush {
        let s = &*self.shared;
        match s.mode {
            Durability::Sync => {}
            Durability::Async { .. } => return self.write_here(),
            Durability::None => return LogFlush::default(),
        }
        if s.waiting.load(Ordering::SeqCst) == 0
            || s.failed.load(Ordering::Acquire)
            || s.shutdown.load(Ordering::Acquire)
        {
            return LogFlush::default();
        }
        let mut took = Duration::ZERO;
        if let Some(mut writer) = self.writer.try_lock() {
            // The same round as the flusher thread's, without the gather: what waits now is
            // what this thread's last pass committed.
            let started = Instant::now();
            let synced = writer.synced;
            let _ = writer.round(false);
            took = started.elapsed();
            if writer.synced != synced {
                s.inline_fsyncs.fetch_add(1, Ordering::Relaxed);
            }
            s.inline_round_ns
                .store(nanos_since(s.base), Ordering::Relaxed);
        }
        LogFlush {
            took,
            waiting: s.waiting.load(Ordering::SeqCst) != 0 && !s.failed.load(Ordering::Acquire),
        }
    }

    /// Under `async`, writes to the OS (no fsync) on the calling thread the frames that
    /// replies wait for ([`Log::watch_written`]), unless the flusher thread is writing at
    /// this moment. Says whether replies still wait (call again soon). `took` stays zero:
    /// writing to the page cache is work, not a wait for the disk.
    fn write_here(&self) -> LogFlush {
        let s = &*self.shared;
        if s.written_waiting.load(Ordering::SeqCst) == 0
            || s.failed.load(Ordering::Acquire)
            || s.shutdown.load(Ordering::Acquire)
        {
            return LogFlush::default();
        }
        self.try_write();
        LogFlush {
            took: Duration::ZERO,
            waiting: s.written_waiting.load(Ordering::SeqCst) != 0
                && !s.failed.load(Ordering::Acquire),
        }
    }

    /// Asks for `waker` to be woken once the log is written to the OS up to `end` (or has
    /// failed); returns whether it already is (then nothing is registered). On a thread
    /// that flushes the log inline ([`flush_inline_on_this_thread`]) it calls the thread's
    /// hook, and the thread writes from its loop ([`Log::flush_here`]); elsewhere it writes
    /// the log itself unless another thread is writing it, and then kicks the flusher
    /// thread. A frame before `end` that its committer is still filling goes out when that
    /// committer waits in turn, or at the flusher's next round (within 5 ms).
    pub(crate) fn watch_written(&self, end: u64, waker: &Waker) -> bool {
        let s = &*self.shared;
        if s.written.load(Ordering::SeqCst) >= end || s.failed.load(Ordering::Acquire) {
            return true;
        }
        // Off an event loop, write it here if nobody else is writing: the flusher thread may
        // be in an fsync, which can take hundreds of milliseconds.
        if !has_inline_hook()
            && self.try_write()
            && (s.written.load(Ordering::SeqCst) >= end || s.failed.load(Ordering::Acquire))
        {
            return true;
        }
        let mut waiters = s.written_waiters.lock();
        waiters.push((end, waker.clone()));
        s.written_waiting.store(waiters.len(), Ordering::SeqCst);
        drop(waiters);
        if !call_inline_hook() {
            s.kick();
        }
        // Registered before this check: either we see it, or the writer, which publishes
        // `written` before it looks for waiters, sees us.
        s.written.load(Ordering::SeqCst) >= end || s.failed.load(Ordering::Acquire)
    }

    /// Writes the filled frames (no fsync) unless another thread holds the writer; says
    /// whether it did.
    fn try_write(&self) -> bool {
        let Some(mut writer) = self.writer.try_lock() else {
            return false;
        };
        writer.write_ready();
        true
    }

    /// The LSN up to which the log is written to the OS.
    pub(crate) fn written_lsn(&self) -> u64 {
        self.shared.written.load(Ordering::Acquire)
    }

    /// Asks for the log to be durable up to `end` soon, without waiting: in `async` mode the
    /// flusher fsyncs for it before its interval is up.
    pub(crate) fn request_durable(&self, end: u64) {
        let s = &*self.shared;
        if s.durable.load(Ordering::Acquire) < end {
            s.sync_wanted.fetch_max(end, Ordering::SeqCst);
            s.kick();
        }
    }

    /// The LSN up to which the log is durable.
    pub(crate) fn durable_lsn(&self) -> u64 {
        self.shared.durable.load(Ordering::Acquire)
    }

    /// The LSN the next frame will get.
    pub(crate) fn tail(&self) -> u64 {
        self.shared.reserved.load(Ordering::Acquire)
    }

    /// Everything appended so far becomes durable; stops the flusher.
    pub(crate) fn close(&self) -> Result<(), LogFailed> {
        let Some(handle) = self.flusher.lock().take() else {
            return self.shared.check();
        };
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.kick();
        handle.join().expect("the log flusher does not panic");
        self.shared.check()
    }

    pub(crate) fn failed(&self) -> Option<LogFailed> {
        self.shared.check().err()
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Shared {
    pub(crate) fn check(&self) -> Result<(), LogFailed> {
        if self.failed.load(Ordering::Acquire) {
            let why = self.failure.lock().clone().unwrap_or_default();
            return Err(LogFailed(why));
        }
        Ok(())
    }

    fn fail(&self, what: &str, error: &io::Error) {
        let mut failure = self.failure.lock();
        if failure.is_none() {
            *failure = Some(format!("{what}: {error}"));
        }
        drop(failure);
        self.failed.store(true, Ordering::Release);
        self.wake_waiters(u64::MAX, &mut Vec::new());
        self.wake_written(u64::MAX, &mut Vec::new());
        if let Some(oracle) = &self.oracle {
            oracle.wake_watchers(u64::MAX);
        }
        self.wake_space_waiters();
    }

    /// Wakes the flusher (unless a wakeup is already pending).
    fn kick(&self) {
        if !self.wake_pending.swap(true, Ordering::SeqCst) {
            let _guard = self.wake.lock();
            self.wake_cv.notify_one();
        }
    }

    /// Adds a waiter for `end`, and wakes the flusher if it is idle or if this registration
    /// completes the batch it is gathering. On a thread that flushes inline it calls that
    /// thread's hook instead, unless the waiter parks the thread (which then cannot flush).
    fn register(&self, end: u64, wake: Wake) {
        let parks = matches!(wake, Wake::Thread(_));
        let mut waiters = self.waiters.lock();
        waiters.push(Waiter { end, wake });
        let waiting = waiters.len();
        self.waiting.store(waiting, Ordering::SeqCst);
        drop(waiters);
        if !parks && self.mode == Durability::Sync && call_inline_hook() {
            return;
        }
        // SeqCst pairs with the flusher's store of the target then load of `waiting`: if we
        // read a stale target (0) we kick, and otherwise the flusher counts us.
        if waiting >= self.gather_target.load(Ordering::SeqCst) {
            self.kick();
        }
    }

    /// Unparks every waiter whose frame ends at or before `durable` (every waiter, after a
    /// failure: `u64::MAX`). `woken` is scratch space, so the flusher allocates nothing per
    /// batch. Returns how many were registered before (woken and still waiting).
    fn wake_waiters(&self, durable: u64, woken: &mut Vec<Waiter>) -> usize {
        let mut waiters = self.waiters.lock();
        let registered = waiters.len();
        woken.extend(waiters.extract_if(.., |w| w.end <= durable));
        self.waiting.store(waiters.len(), Ordering::SeqCst);
        drop(waiters);
        // In log order, which is nearly commit-timestamp order: committers publish in
        // timestamp order, so the earliest should get a CPU first.
        woken.sort_unstable_by_key(|w| w.end);
        // Finish first and advance the watermark once, so that the tasks woken below find
        // their commits visible. Not after a failure (`durable` is then `u64::MAX`): those
        // frames may not be on disk.
        let durable_now = !self.failed.load(Ordering::Acquire);
        if let Some(oracle) = &self.oracle
            && durable_now
        {
            let mut finished = false;
            for w in woken.iter() {
                if let Wake::Finish(ts) = w.wake {
                    oracle.finish(ts);
                    finished = true;
                }
            }
            if finished {
                oracle.advance();
            }
        }
        // Outside the lock: the woken can register again at once.
        for w in woken.drain(..) {
            match w.wake {
                Wake::Thread(thread) => thread.unpark(),
                Wake::Task(waker) => waker.wake(),
                Wake::Finish(_) => {}
            }
        }
        registered
    }

    /// Wakes the tasks waiting for the log to be written up to `written` or less (all of
    /// them, after a failure: `u64::MAX`). `woken` is scratch space, as in
    /// [`Shared::wake_waiters`]: the poller writes once a pass.
    fn wake_written(&self, written: u64, woken: &mut Vec<(u64, Waker)>) {
        if self.written_waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut waiters = self.written_waiters.lock();
        woken.extend(waiters.extract_if(.., |(end, _)| *end <= written));
        self.written_waiting.store(waiters.len(), Ordering::SeqCst);
        drop(waiters);
        for (_, waker) in woken.drain(..) {
            waker.wake();
        }
    }

    fn wake_space_waiters(&self) {
        let _guard = self.space.lock();
        self.space_cv.notify_all();
    }

    fn word(&self, lsn: u64) -> &AtomicU64 {
        let offset = (lsn % RING_BYTES as u64) as usize;
        // SAFETY: `offset` is 8-aligned (LSNs are) and inside the ring; the ring is mapped
        // memory that lives as long as `self`.
        unsafe { AtomicU64::from_ptr(self.ring.start().as_ptr().add(offset).cast::<u64>()) }
    }

    /// Copies `payload` into the ring after the header, then publishes the header word.
    ///
    /// # Safety
    /// The caller owns `[lsn, lsn + frame_bytes(payload.len()))` of the ring.
    unsafe fn fill(&self, lsn: u64, payload: &[u8]) {
        let base = self.ring.start().as_ptr();
        let start = ((lsn + FRAME_HEADER_BYTES as u64) % RING_BYTES as u64) as usize;
        let first = payload.len().min(RING_BYTES - start);
        // SAFETY: both pieces lie inside the ring, in the caller's reserved range.
        unsafe {
            std::ptr::copy_nonoverlapping(payload.as_ptr(), base.add(start), first);
            std::ptr::copy_nonoverlapping(payload.as_ptr().add(first), base, payload.len() - first);
        }
        self.word(lsn)
            .store(format::frame_header(payload), Ordering::Release);
    }
}

/// How long the flusher gathers committers before an fsync in `sync` mode.
///
/// It waits for as many committers as were waiting when it last woke them: in a closed loop
/// they commit again, and with 64 committers on a few cores that takes about as long as an
/// fsync. Waiting for them costs them nothing (they were going to wait for the next fsync
/// anyway) and saves fsyncs, which also frees the CPU time spent waking and switching.
/// The wait stops early when nobody arrived for a while (whoever is missing is held up
/// elsewhere, and waiting longer would only add latency) and is bounded by a multiple of
/// what an fsync costs. A lone committer expects nobody, so it never waits.
struct Gather {
    /// How many committers to wait for: the waiters at the last wake-up, or, decaying
    /// slowly, more than that (a batch that missed a few must not shrink the next target).
    expected: usize,
    /// What an fsync costs (moving average).
    sync_cost: Duration,
}

impl Gather {
    fn new() -> Gather {
        Gather {
            expected: 0,
            sync_cost: Duration::ZERO,
        }
    }

    /// Learns from one fsync that took `took` and after which `registered` committers were
    /// waiting (the woken and those already waiting for the next one).
    fn after_sync(&mut self, took: Duration, registered: usize) {
        self.sync_cost = (self.sync_cost * 7 + took) / 8;
        let decayed = self.expected.saturating_sub(self.expected / 16 + 1);
        self.expected = registered.max(decayed);
    }

    /// The gather gives up when no committer arrived for this long.
    fn quiet(&self) -> Duration {
        (self.sync_cost * 2 / 5).clamp(GATHER_QUIET_MIN, GATHER_QUIET_MAX)
    }

    /// The gather never waits longer than this.
    fn patience(&self) -> Duration {
        (self.sync_cost * 2).min(GATHER_MAX)
    }
}

struct Flusher {
    shared: Arc<Shared>,
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    /// Appended under the writer's lock; in `async` mode fsynced outside it.
    segment: Arc<dyn AppendFile>,
    segment_bytes: u64,
    segment_bytes_target: u64,
    written: u64,
    synced: u64,
    last_sync: Instant,
    gather: Gather,
    /// Scratch for [`Shared::wake_waiters`] and [`Shared::wake_written`].
    woken: Vec<Waiter>,
    woken_written: Vec<(u64, Waker)>,
    /// Ring pages ([`RING_PAGE_BYTES`]) faulted in and not given back since, bit `i` for
    /// page `i`.
    populated: u64,
}

/// The ring is faulted in, given back and released to the writers this many bytes at a
/// time.
const RING_PAGE_BYTES: usize = 2 << 20;
const RING_PAGES: usize = RING_BYTES / RING_PAGE_BYTES;
const _: () = assert!(RING_BYTES.is_multiple_of(RING_PAGE_BYTES) && RING_PAGES <= 64);

/// The start of the ring page `lsn` falls in, as an LSN.
fn page_floor(lsn: u64) -> u64 {
    lsn - lsn % RING_PAGE_BYTES as u64
}
/// How far ahead of the writers the flusher faults in ring pages: far more than the
/// writers fill while it sleeps (at most 5 ms).
const RING_PAGES_AHEAD: usize = 2;

/// The flusher thread: gathers (in `sync` mode, without holding the writer, so that a thread
/// flushing inline is not kept out), then runs a round and sleeps until kicked.
fn run_flusher(shared: &Shared, writer: &Mutex<Flusher>) {
    let mode = shared.mode;
    loop {
        if shared.failed.load(Ordering::Acquire) {
            // A thread flushing inline failed; it has woken everyone.
            return;
        }
        let shutdown = shared.shutdown.load(Ordering::Acquire);
        let inline = shared.inline_round_ns.load(Ordering::Relaxed);
        if !shutdown && inline != 0 && nanos_since(shared.base) - inline < INLINE_LEASE_NS {
            // An event loop flushes the log itself, and goes on doing so while it has
            // commits: gathering and fsyncing here would only take the lock and a core from
            // it. Look again after a sleep; once it has stopped, the next round is ours.
            shared.wait_for_kick(Duration::from_nanos(INLINE_LEASE_NS));
            continue;
        }
        if mode == Durability::Sync && !shutdown {
            let plan = writer.lock().gather_plan();
            if let Some(plan) = plan {
                shared.gather(plan);
            }
        }
        let carry_on = match mode {
            Durability::Async { .. } if !shutdown => async_round(shared, writer),
            _ => writer.lock().round(shutdown),
        };
        if !carry_on {
            return;
        }
        let timeout = match mode {
            Durability::Async { interval } => interval.min(Duration::from_millis(5)),
            _ => Duration::from_millis(5),
        };
        shared.wait_for_kick(timeout);
    }
}

/// A flusher round in `async` mode: writes under the lock, but fsyncs outside it, so that a
/// thread writing the log for its replies ([`Log::flush_here`]) never waits for the disk.
/// Only starting a new segment fsyncs under the lock (once every `segment_bytes`), and only
/// what was written during the bulk fsync just before.
fn async_round(shared: &Shared, writer: &Mutex<Flusher>) -> bool {
    let due = {
        let mut w = writer.lock();
        if !w.write_ready() {
            return false;
        }
        // A full segment is fsynced under the lock before the next starts: fsync the bulk of
        // it here first, so that only what comes in meanwhile is left for then.
        let full = w.segment_bytes >= w.segment_bytes_target;
        (w.written > w.synced && (w.sync_due() || full))
            .then(|| (Arc::clone(&w.segment), w.written))
    };
    if let Some((segment, upto)) = due {
        let started = Instant::now();
        // Appends may go on meanwhile; this covers at least what was written up to `upto`.
        if let Err(e) = segment.sync() {
            shared.fail("fsync of the log", &e);
            return false;
        }
        writer.lock().synced_to(upto, started);
    }
    writer.lock().end_round(false)
}

/// How long after a thread's inline flush the flusher thread leaves the log to it.
const INLINE_LEASE_NS: u64 = 5_000_000;

fn nanos_since(base: Instant) -> u64 {
    u64::try_from(base.elapsed().as_nanos())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// How the gather waits: for `target` waiters, giving up after `quiet` without an arrival or
/// after `patience` in all.
#[derive(Debug, Clone, Copy)]
struct GatherPlan {
    target: usize,
    quiet: Duration,
    patience: Duration,
}

impl Shared {
    /// Sleeps until kicked or `timeout`, and consumes the kick.
    fn wait_for_kick(&self, timeout: Duration) {
        let mut guard = self.wake.lock();
        if !self.wake_pending.load(Ordering::SeqCst) {
            self.wake_cv.wait_for(&mut guard, timeout);
        }
        self.wake_pending.store(false, Ordering::SeqCst);
    }

    /// Waits, briefly, for more committers to join the next batch before it is written and
    /// fsynced, so that one fsync covers them all (see [`Gather`] for how long).
    fn gather(&self, plan: GatherPlan) {
        let GatherPlan {
            target,
            quiet,
            patience,
        } = plan;
        let mut last_arrival = Instant::now();
        let deadline = last_arrival + patience;
        self.gather_target.store(target, Ordering::SeqCst);
        let mut seen = self.waiting.load(Ordering::SeqCst);
        while seen < target && !self.shutdown.load(Ordering::Acquire) {
            let until = deadline.min(last_arrival + quiet);
            let now = Instant::now();
            if now >= until {
                break;
            }
            // Woken early only by the registration that completes the batch (or a kick
            // left over from before; the loop then just waits again).
            self.wait_for_kick(until - now);
            let waiting = self.waiting.load(Ordering::SeqCst);
            if waiting != seen {
                seen = waiting;
                last_arrival = Instant::now();
            }
        }
        self.gather_target.store(0, Ordering::SeqCst);
    }
}

impl Flusher {
    /// Writes the ready frames, fsyncs when due (waking whoever that made durable), rotates
    /// the segment when full. A failure poisons the log. Returns false once the flusher
    /// thread should end: the log failed, or it shut down with everything durable.
    fn round(&mut self, shutdown: bool) -> bool {
        if !self.write_ready() {
            return false;
        }
        if self.written > self.synced && (self.sync_due() || shutdown) && !self.sync_written() {
            return false;
        }
        self.end_round(shutdown)
    }

    /// Fsyncs what is written and not yet durable; false if that failed (the log is
    /// poisoned).
    fn sync_written(&mut self) -> bool {
        if self.written > self.synced
            && let Err(e) = self.sync()
        {
            self.shared.fail("fsync of the log", &e);
            return false;
        }
        true
    }

    /// Writes the contiguous run of filled frames; false if the log failed (now or before).
    fn write_ready(&mut self) -> bool {
        if self.shared.failed.load(Ordering::Acquire) {
            return false;
        }
        let (ready, frames) = self.ready_end();
        if ready > self.written
            && let Err(e) = self.write(ready, frames)
        {
            self.shared.fail("writing the log", &e);
            return false;
        }
        true
    }

    /// Whether what is written should be fsynced now.
    fn sync_due(&self) -> bool {
        match self.shared.mode {
            Durability::Sync | Durability::None => true,
            Durability::Async { interval } => {
                self.last_sync.elapsed() >= interval
                    || self.shared.sync_wanted.load(Ordering::SeqCst) > self.synced
            }
        }
    }

    /// The end of a round: starts a new segment once this one is full, faults in ring pages.
    /// Returns false once the flusher thread should end: the log failed, or it shut down
    /// with everything durable.
    fn end_round(&mut self, shutdown: bool) -> bool {
        if self.segment_bytes >= self.segment_bytes_target {
            // The full segment is made durable before the next one starts: recovery takes a
            // torn frame only at the end of the last segment.
            if !self.sync_written() {
                return false;
            }
            if let Err(e) = self.rotate() {
                self.shared.fail("starting a new log segment", &e);
                return false;
            }
        }
        if shutdown && self.written == self.shared.reserved.load(Ordering::Acquire) {
            return false;
        }
        self.populate_ahead();
        true
    }

    /// Faults in the ring pages the writers reach next (each lap: [`Flusher::release`] gives
    /// pages back behind the flusher), so that a commit does not stop for page faults while
    /// it holds a log slot.
    fn populate_ahead(&mut self) {
        let reserved = self.shared.reserved.load(Ordering::Acquire);
        let first = (reserved % RING_BYTES as u64) as usize / RING_PAGE_BYTES;
        for page in (first..=first + RING_PAGES_AHEAD).map(|p| p % RING_PAGES) {
            if self.populated & (1 << page) == 0 {
                self.shared
                    .ring
                    .populate(page * RING_PAGE_BYTES, RING_PAGE_BYTES);
                self.populated |= 1 << page;
            }
        }
    }

    /// How to gather before the next batch, if at all: not when a lone committer (or none)
    /// is expected, nor when nothing waits to be written.
    fn gather_plan(&self) -> Option<GatherPlan> {
        let target = self.gather.expected;
        if target < 2 || self.shared.reserved.load(Ordering::Acquire) == self.written {
            return None;
        }
        Some(GatherPlan {
            target,
            quiet: self.gather.quiet(),
            patience: self.gather.patience(),
        })
    }

    /// The end of the contiguous run of filled frames from `written`, and how many frames
    /// the run holds.
    fn ready_end(&self) -> (u64, u64) {
        let reserved = self.shared.reserved.load(Ordering::Acquire);
        let mut pos = self.written;
        let mut frames = 0;
        while pos < reserved {
            let word = self.shared.word(pos).load(Ordering::Acquire);
            if word == 0 {
                break;
            }
            pos += frame_bytes((word & 0xffff_ffff) as usize) as u64;
            frames += 1;
        }
        (pos, frames)
    }

    fn write(&mut self, end: u64, frames: u64) -> io::Result<()> {
        let s = &*self.shared;
        let base = s.ring.start().as_ptr();
        let from = (self.written % RING_BYTES as u64) as usize;
        let len = (end - self.written) as usize;
        let first = len.min(RING_BYTES - from);
        // SAFETY: frames in `[written, end)` are filled (their header words were loaded with
        // acquire) and nobody writes them until we release the space.
        let (a, b) = unsafe {
            (
                std::slice::from_raw_parts(base.add(from), first),
                std::slice::from_raw_parts(base, len - first),
            )
        };
        self.segment.append(a)?;
        if !b.is_empty() {
            self.segment.append(b)?;
        }
        s.frames.fetch_add(frames, Ordering::Relaxed);
        self.segment_bytes += len as u64;
        self.written = end;
        // SeqCst pairs with a watcher's registration then load (`Log::watch_written`).
        s.written.store(end, Ordering::SeqCst);
        s.wake_written(end, &mut self.woken_written);
        self.release();
        Ok(())
    }

    /// Hands the ring pages the log has now passed entirely back to the writers, for their
    /// next lap. Each goes back to the kernel first, which zeroes it (so that no stale header
    /// word looks like a filled frame on the next lap) and keeps none of it resident until
    /// [`Flusher::populate_ahead`] faults it in again ahead of the writers: the ring holds a
    /// few pages in memory, not all 64 MiB (at 632 000 keys, ~90 bytes a key). Only whole
    /// pages are released, so no writer can be in a page as it is given back.
    fn release(&mut self) {
        let s = &*self.shared;
        let passed = page_floor(self.written);
        let mut released = s.released.load(Ordering::Relaxed);
        if released >= passed {
            return; // still inside the page it last released up to
        }
        while released < passed {
            let page = (released % RING_BYTES as u64) as usize / RING_PAGE_BYTES;
            s.ring.discard(page * RING_PAGE_BYTES, RING_PAGE_BYTES);
            self.populated &= !(1 << page);
            released += RING_PAGE_BYTES as u64;
        }
        s.released.store(released, Ordering::Release);
        s.wake_space_waiters();
    }

    fn sync(&mut self) -> io::Result<()> {
        let started = Instant::now();
        self.segment.sync()?;
        self.synced_to(self.written, started);
        Ok(())
    }

    /// Publishes an fsync, begun at `started`, that made the log durable up to `upto`, and
    /// wakes whoever waited for that.
    fn synced_to(&mut self, upto: u64, started: Instant) {
        self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.synced = self.synced.max(upto);
        self.last_sync = Instant::now();
        let took = self.last_sync - started;
        self.shared.durable.store(self.synced, Ordering::Release);
        let registered = self.shared.wake_waiters(self.synced, &mut self.woken);
        self.gather.after_sync(took, registered);
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.segment = Arc::from(create_segment(&*self.disk, &self.dir, self.written)?);
        self.segment_bytes = 0;
        Ok(())
    }
}

/// Creates the log segment that starts at `first_lsn`, ready for appending. Atomically: the
/// header goes to a temporary file, which is fsynced and then renamed, so that a crash never
/// leaves a segment without a whole header (recovery would have to refuse it as damage).
/// Open removes a leftover temporary file.
pub(crate) fn create_segment(
    disk: &dyn Disk,
    dir: &std::path::Path,
    first_lsn: u64,
) -> io::Result<Box<dyn AppendFile>> {
    let name = segment_name(first_lsn);
    crate::io::write_atomic(disk, dir, &name, &segment_header(first_lsn))?;
    disk.open_append(&dir.join(name))
}

#[cfg(test)]
mod tests;
