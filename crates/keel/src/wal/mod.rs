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
//! The first failed write or fsync poisons the log for good: every waiting committer and
//! every later commit gets the error, and nothing is retried (the kernel may have dropped the
//! dirty pages, so no later fsync could vouch for them). Recovery from the files is the only
//! way back.

pub(crate) mod format;
pub(crate) mod reader;

use std::cell::RefCell;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex};

use crate::Ts;
use crate::io::{AppendFile, Disk};
use crate::memory::Region;
use format::{FRAME_HEADER_BYTES, frame_bytes, segment_header, segment_name};

/// Ring size: larger than the largest frame, so one frame always fits.
const RING_BYTES: usize = 64 << 20;
const _: () = assert!(format::PAYLOAD_BYTES_MAX + FRAME_HEADER_BYTES < RING_BYTES);
const _: () = assert!(RING_BYTES.is_multiple_of(8));

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

/// The log failed; the database refuses writes from now on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the write-ahead log failed, so the database is read-only until restarted: {0}")]
pub struct LogFailed(pub String);

pub(crate) struct Shared {
    ring: Region,
    reserved: CachePadded<AtomicU64>,
    released: CachePadded<AtomicU64>,
    durable: CachePadded<AtomicU64>,
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    /// The flusher sleeps here; committers in `sync` mode and committers waiting for ring
    /// space wake it.
    wake: Mutex<bool>,
    wake_cv: Condvar,
    /// Committers waiting for durability (or ring space) sleep here.
    progress: Mutex<()>,
    progress_cv: Condvar,
    shutdown: AtomicBool,
    pub(crate) fsyncs: AtomicU64,
    pub(crate) frames: AtomicU64,
}

/// The write-ahead log of one database.
pub(crate) struct Log {
    shared: Arc<Shared>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    mode: Durability,
}

thread_local! {
    static ENCODE_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Log {
    /// Starts the log at `start_lsn`, appending to `segment` (already created, its header
    /// written and durable, holding data up to `start_lsn`).
    pub(crate) fn start(
        disk: Arc<dyn Disk>,
        dir: PathBuf,
        segment: Box<dyn AppendFile>,
        segment_first_lsn: u64,
        start_lsn: u64,
        mode: Durability,
        segment_bytes_target: u64,
    ) -> Log {
        assert!(start_lsn.is_multiple_of(8));
        let shared = Arc::new(Shared {
            ring: Region::new(RING_BYTES),
            reserved: CachePadded::new(AtomicU64::new(start_lsn)),
            released: CachePadded::new(AtomicU64::new(start_lsn)),
            durable: CachePadded::new(AtomicU64::new(start_lsn)),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            wake: Mutex::new(false),
            wake_cv: Condvar::new(),
            progress: Mutex::new(()),
            progress_cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            fsyncs: AtomicU64::new(0),
            frames: AtomicU64::new(0),
        });
        let flusher = Flusher {
            shared: Arc::clone(&shared),
            disk,
            dir,
            segment,
            segment_bytes: start_lsn - segment_first_lsn,
            segment_bytes_target,
            written: start_lsn,
            synced: start_lsn,
            last_sync: Instant::now(),
            mode,
        };
        let handle = std::thread::Builder::new()
            .name("keel-wal-flusher".into())
            .spawn(move || flusher.run())
            .expect("spawning the log flusher thread");
        Log {
            shared,
            flusher: Mutex::new(Some(handle)),
            mode,
        }
    }

    pub(crate) fn mode(&self) -> Durability {
        self.mode
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
        let s = &*self.shared;
        s.check()?;
        ENCODE_BUFFER.with(|buffer| {
            let mut payload = buffer.borrow_mut();
            payload.clear();
            format::encode_payload(&mut payload, ts, count, entries);
            let frame = frame_bytes(payload.len()) as u64;
            let lsn = s.reserved.fetch_add(frame, Ordering::AcqRel);
            let end = lsn + frame;
            while end > s.released.load(Ordering::Acquire) + RING_BYTES as u64 {
                s.check()?;
                s.kick();
                let mut guard = s.progress.lock();
                s.progress_cv.wait_for(&mut guard, Duration::from_millis(1));
            }
            // SAFETY: `[lsn, end)` is ours alone (reserved by the atomic add) and free (the
            // flusher released it), and the ring outlives this call.
            unsafe { s.fill(lsn, &payload) };
            Ok(end)
        })
    }

    /// Waits until the log is durable up to `end`.
    pub(crate) fn wait_durable(&self, end: u64) -> Result<(), LogFailed> {
        let s = &*self.shared;
        if s.durable.load(Ordering::Acquire) >= end {
            return Ok(());
        }
        s.kick();
        let mut guard = s.progress.lock();
        while s.durable.load(Ordering::Acquire) < end {
            s.check()?;
            s.progress_cv
                .wait_for(&mut guard, Duration::from_millis(10));
        }
        Ok(())
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
        let _guard = self.progress.lock();
        self.progress_cv.notify_all();
    }

    fn kick(&self) {
        let mut pending = self.wake.lock();
        if !*pending {
            *pending = true;
            self.wake_cv.notify_one();
        }
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

struct Flusher {
    shared: Arc<Shared>,
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    segment: Box<dyn AppendFile>,
    segment_bytes: u64,
    segment_bytes_target: u64,
    written: u64,
    synced: u64,
    last_sync: Instant,
    mode: Durability,
}

impl Flusher {
    fn run(mut self) {
        loop {
            let shutdown = self.shared.shutdown.load(Ordering::Acquire);
            let (ready, frames) = self.ready_end();
            if ready > self.written
                && let Err(e) = self.write(ready, frames)
            {
                return self.shared.fail("writing the log", &e);
            }
            let sync_due = match self.mode {
                Durability::Sync | Durability::None => true,
                Durability::Async { interval } => self.last_sync.elapsed() >= interval,
            };
            if self.written > self.synced
                && (sync_due || shutdown)
                && let Err(e) = self.sync()
            {
                return self.shared.fail("fsync of the log", &e);
            }
            if self.segment_bytes >= self.segment_bytes_target
                && self.synced == self.written
                && let Err(e) = self.rotate()
            {
                return self.shared.fail("starting a new log segment", &e);
            }
            if shutdown && self.written == self.shared.reserved.load(Ordering::Acquire) {
                return;
            }
            if ready == self.written {
                self.sleep();
            }
        }
    }

    fn sleep(&self) {
        let timeout = match self.mode {
            Durability::Async { interval } => interval.min(Duration::from_millis(5)),
            _ => Duration::from_millis(5),
        };
        let mut pending = self.shared.wake.lock();
        if !*pending {
            self.shared.wake_cv.wait_for(&mut pending, timeout);
        }
        *pending = false;
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
        // SAFETY: as above; zeroing before release keeps stale header words from looking
        // like filled frames on the next lap.
        unsafe {
            std::ptr::write_bytes(base.add(from), 0, first);
            std::ptr::write_bytes(base, 0, len - first);
        }
        s.frames.fetch_add(frames, Ordering::Relaxed);
        self.segment_bytes += len as u64;
        self.written = end;
        s.released.store(end, Ordering::Release);
        if !matches!(self.mode, Durability::Sync) {
            let _guard = s.progress.lock();
            s.progress_cv.notify_all();
        }
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.segment.sync()?;
        self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.synced = self.written;
        self.last_sync = Instant::now();
        self.shared.durable.store(self.synced, Ordering::Release);
        let _guard = self.shared.progress.lock();
        self.shared.progress_cv.notify_all();
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        let path = self.dir.join(segment_name(self.written));
        let mut file = self.disk.create(&path)?;
        file.append(&segment_header(self.written))?;
        file.sync()?;
        self.disk.sync_dir(&self.dir)?;
        self.segment = file;
        self.segment_bytes = 0;
        Ok(())
    }
}
