//! All file I/O of the engine goes through [`Disk`]: one narrow trait, so that tests can
//! swap in [`SimDisk`], which injects short writes, torn writes, fsync errors, a full disk
//! and power loss (everything not fsynced is lost) deterministically.
//!
//! The engine never retries a failed write or fsync: the first failure poisons the database
//! against writes (see `wal`), because after a failed fsync the kernel may have dropped the
//! dirty pages and nothing written since the last good fsync can be trusted.

use std::io;
use std::path::{Path, PathBuf};

mod os;
mod sim;

pub use os::OsDisk;
pub use sim::{Fault, SimDisk};

/// A whole file's bytes, from [`Disk::read_shared`]: in memory, or mapped.
pub struct FileBytes(Bytes);

enum Bytes {
    Owned(Vec<u8>),
    Mapped(os::Mapped),
}

impl From<Vec<u8>> for FileBytes {
    fn from(bytes: Vec<u8>) -> FileBytes {
        FileBytes(Bytes::Owned(bytes))
    }
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Bytes::Owned(bytes) => bytes,
            Bytes::Mapped(map) => map.bytes(),
        }
    }
}

impl std::fmt::Debug for FileBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileBytes({} bytes)", self.len())
    }
}

/// A file opened for appending. One thread appends at a time; another may `sync` meanwhile
/// (the log fsyncs in `async` mode without holding up the thread that writes it).
pub trait AppendFile: Send + Sync {
    /// Appends all of `buf`, or fails; after a failure the file's length is unknown.
    fn append(&self, buf: &[u8]) -> io::Result<()>;
    /// Makes everything appended before the call durable.
    fn sync(&self) -> io::Result<()>;
}

/// The file-system operations the engine uses, and nothing else.
pub trait Disk: Send + Sync + 'static {
    /// Creates a directory and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names of the files in `dir` (not paths), in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> bool;
    /// The whole content of a file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The whole content of a file that nobody changes while the result lives, for reading
    /// large files once (recovery): [`OsDisk`] maps it instead of copying it. By default,
    /// [`Disk::read`].
    fn read_shared(&self, path: &Path) -> io::Result<FileBytes> {
        self.read(path).map(FileBytes::from)
    }
    /// Creates (or truncates) `path` for appending.
    fn create(&self, path: &Path) -> io::Result<Box<dyn AppendFile>>;
    /// Opens an existing file for appending at its end.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>>;
    /// Cuts a file to `len` bytes and makes that durable.
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()>;
    /// Renames atomically (within one directory).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes an exclusive lock on `path` (created if missing) for as long as the returned
    /// guard lives; `None` if another holder has it.
    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn Send + Sync>>>;
}

/// Writes `bytes` to `dir/name` atomically: a temporary file, fsync, rename, fsync of the
/// directory. A crash leaves either the old file or the new one.
pub(crate) fn write_atomic(
    disk: &dyn Disk,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> io::Result<()> {
    let tmp: PathBuf = dir.join(format!("{name}.tmp"));
    let file = disk.create(&tmp)?;
    file.append(bytes)?;
    file.sync()?;
    drop(file);
    disk.rename(&tmp, &dir.join(name))?;
    disk.sync_dir(dir)
}
