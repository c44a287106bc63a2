//! [`SimDisk`]: an in-memory [`Disk`] that remembers which bytes are durable, so that a test
//! can cut the power ([`SimDisk::crash`]) and inject faults ([`Fault`]) at exact operations.
//!
//! Model: every file has `durable` content (what survives a crash) and `current` content
//! (what reads see). `sync` copies current to durable. Directory operations (create, rename,
//! remove) are durable only after `sync_dir` of that directory; a crash undoes the others.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{AppendFile, Disk};

/// A fault to inject into the next matching operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The next append writes only its first `n` bytes, then fails.
    ShortWrite(usize),
    /// The next fsync of a file fails (nothing becomes durable).
    SyncError,
    /// Appends fail with "no space left on device" once the disk holds this many bytes in
    /// all, until [`SimDisk::clear_faults`].
    FullAt(u64),
}

#[derive(Default, Clone)]
struct SimFile {
    current: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Default)]
struct State {
    /// File contents by inode number.
    inodes: BTreeMap<u64, SimFile>,
    /// The directory entries reads see.
    names: BTreeMap<PathBuf, u64>,
    /// The directory entries a crash leaves (updated per directory by `sync_dir`).
    durable_names: BTreeMap<PathBuf, u64>,
    next_inode: u64,
    faults: VecDeque<Fault>,
    full_at: Option<u64>,
    dirs: BTreeMap<PathBuf, ()>,
    locks: std::collections::BTreeSet<PathBuf>,
    ops: u64,
    /// Incremented by every crash; handles from before it are dead.
    epoch: u64,
}

impl State {
    fn file(&mut self, path: &Path) -> io::Result<&mut SimFile> {
        let inode = *self.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(self
            .inodes
            .get_mut(&inode)
            .expect("names point at live inodes"))
    }

    fn used(&self) -> u64 {
        let live: std::collections::BTreeSet<u64> = self.names.values().copied().collect();
        live.iter()
            .map(|inode| self.inodes[inode].current.len() as u64)
            .sum()
    }
}

/// An in-memory disk with durability tracking and fault injection. Clones share state.
///
/// A handle belongs to one "boot" of the simulated machine: after [`SimDisk::crash`], every
/// operation through an older handle fails (the process that held it is dead), so a database
/// still running on it cannot touch what survived. [`SimDisk::reboot`] gives a live handle.
#[derive(Clone, Default)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
    epoch: u64,
    /// Fsyncs wait while held ([`SimDisk::hold_syncs`]).
    syncs_held: Arc<(Mutex<SyncGate>, parking_lot::Condvar)>,
}

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDisk")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct SyncGate {
    held: bool,
    /// Fsyncs waiting at the gate now.
    waiting: usize,
}

impl SimDisk {
    /// An empty disk.
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    /// Queues a fault for the next matching operation.
    pub fn inject(&self, fault: Fault) {
        let mut state = self.state.lock();
        match fault {
            Fault::FullAt(bytes) => state.full_at = Some(bytes),
            other => state.faults.push_back(other),
        }
    }

    /// Removes queued faults and frees the "full disk".
    pub fn clear_faults(&self) {
        let mut state = self.state.lock();
        state.faults.clear();
        state.full_at = None;
    }

    /// A handle for the machine as it is now (after any crash).
    pub fn reboot(&self) -> SimDisk {
        SimDisk {
            state: Arc::clone(&self.state),
            epoch: self.state.lock().epoch,
            syncs_held: Arc::clone(&self.syncs_held),
        }
    }

    /// Makes every fsync (of a file) wait until [`SimDisk::release_syncs`]: a disk whose
    /// flushes take as long as the test likes.
    pub fn hold_syncs(&self) {
        self.syncs_held.0.lock().held = true;
    }

    /// Lets held and later fsyncs go on.
    pub fn release_syncs(&self) {
        self.syncs_held.0.lock().held = false;
        self.syncs_held.1.notify_all();
    }

    /// How many fsyncs are held at this moment ([`SimDisk::hold_syncs`]).
    pub fn syncs_waiting(&self) -> usize {
        self.syncs_held.0.lock().waiting
    }

    fn wait_for_syncs(&self) {
        let (gate, released) = &*self.syncs_held;
        let mut gate = gate.lock();
        gate.waiting += 1;
        while gate.held {
            released.wait(&mut gate);
        }
        gate.waiting -= 1;
    }

    fn live(&self) -> io::Result<parking_lot::MutexGuard<'_, State>> {
        let state = self.state.lock();
        if state.epoch != self.epoch {
            return Err(io::Error::other(
                "simulated machine crashed; this handle is dead",
            ));
        }
        Ok(state)
    }

    /// Power loss: the directories go back to their last synced entries and every file to
    /// its last synced content; every existing handle dies.
    pub fn crash(&self) {
        let mut state = self.state.lock();
        state.epoch += 1;
        state.locks.clear();
        state.names = state.durable_names.clone();
        let live: std::collections::BTreeSet<u64> = state.names.values().copied().collect();
        state.inodes.retain(|inode, _| live.contains(inode));
        for file in state.inodes.values_mut() {
            file.current = file.durable.clone();
        }
        state.faults.clear();
        state.full_at = None;
    }

    /// Process death without power loss, or power loss where the disk happened to have
    /// written everything (including a half-finished write): every byte written so far
    /// survives, synced or not; every existing handle dies.
    pub fn crash_keep_written(&self) {
        let mut state = self.state.lock();
        state.epoch += 1;
        state.locks.clear();
        state.durable_names = state.names.clone();
        for file in state.inodes.values_mut() {
            file.durable = file.current.clone();
        }
        state.faults.clear();
        state.full_at = None;
    }

    /// Bytes currently stored, over all files.
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().used()
    }

    /// Flips one byte of a file (current and durable content), to simulate media damage.
    pub fn corrupt(&self, path: &Path, offset: usize) {
        let mut state = self.state.lock();
        let file = state.file(path).expect("corrupting a file that exists");
        file.current[offset] ^= 0xff;
        if offset < file.durable.len() {
            file.durable[offset] ^= 0xff;
        }
    }

    /// Operations performed so far (for choosing fault points).
    pub fn ops(&self) -> u64 {
        self.state.lock().ops
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

struct SimAppend {
    disk: SimDisk,
    path: PathBuf,
}

impl AppendFile for SimAppend {
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        let mut state = self.disk.live()?;
        state.ops += 1;
        let used = state.used();
        let short = match state.faults.front() {
            Some(Fault::ShortWrite(n)) => {
                let n = *n;
                state.faults.pop_front();
                Some(n.min(buf.len()))
            }
            _ => None,
        };
        let room = state.full_at.map(|full| full.saturating_sub(used) as usize);
        let file = state.file(&self.path)?;
        if let Some(n) = short {
            file.current.extend_from_slice(&buf[..n]);
            return Err(io::Error::other("injected short write"));
        }
        if let Some(room) = room
            && room < buf.len()
        {
            file.current.extend_from_slice(&buf[..room]);
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        file.current.extend_from_slice(buf);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.disk.wait_for_syncs();
        let mut state = self.disk.live()?;
        state.ops += 1;
        if state.faults.front() == Some(&Fault::SyncError) {
            state.faults.pop_front();
            return Err(io::Error::other("injected fsync error"));
        }
        let file = state.file(&self.path)?;
        file.durable = file.current.clone();
        Ok(())
    }
}

impl Disk for SimDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.live()?;
        for d in dir.ancestors() {
            state.dirs.insert(d.to_path_buf(), ());
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = self.live()?;
        if !state.dirs.contains_key(dir) {
            return Err(not_found(dir));
        }
        Ok(state
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn exists(&self, path: &Path) -> bool {
        let state = self.state.lock();
        state.names.contains_key(path) || state.dirs.contains_key(path)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut state = self.live()?;
        Ok(state.file(path)?.current.clone())
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        let mut state = self.live()?;
        state.ops += 1;
        if !path.parent().is_some_and(|d| state.dirs.contains_key(d)) {
            return Err(not_found(path));
        }
        let inode = state.next_inode;
        state.next_inode += 1;
        state.inodes.insert(inode, SimFile::default());
        state.names.insert(path.to_path_buf(), inode);
        Ok(Box::new(SimAppend {
            disk: self.clone(),
            path: path.to_path_buf(),
        }))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        if !self.live()?.names.contains_key(path) {
            return Err(not_found(path));
        }
        Ok(Box::new(SimAppend {
            disk: self.clone(),
            path: path.to_path_buf(),
        }))
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut state = self.live()?;
        state.ops += 1;
        let file = state.file(path)?;
        file.current.truncate(len as usize);
        file.durable = file.current.clone();
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.live()?;
        state.ops += 1;
        let inode = state.names.remove(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.live()?;
        state.ops += 1;
        state
            .names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.live()?;
        state.ops += 1;
        let present: Vec<(PathBuf, u64)> = state
            .names
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        state.durable_names.retain(|p, _| p.parent() != Some(dir));
        state.durable_names.extend(present);
        Ok(())
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn Send + Sync>>> {
        let mut state = self.live()?;
        if !state.locks.insert(path.to_path_buf()) {
            return Ok(None);
        }
        Ok(Some(Box::new(SimLock {
            disk: self.clone(),
            path: path.to_path_buf(),
        })))
    }
}

struct SimLock {
    disk: SimDisk,
    path: PathBuf,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        if let Ok(mut state) = self.disk.live() {
            state.locks.remove(&self.path);
        }
    }
}
