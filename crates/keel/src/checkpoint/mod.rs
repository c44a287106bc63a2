//! Checkpoints and the manifest.
//!
//! A checkpoint is every live key's newest version at one snapshot timestamp, written from an
//! MVCC snapshot while transactions run (writers never stop). It records `replay_from`, an LSN
//! such that every log frame before it belongs to a commit at or below the snapshot, so
//! recovery loads the checkpoint and replays the log from there. Each entry keeps its
//! version's commit timestamp, so replaying a frame the checkpoint already holds changes
//! nothing (replay is idempotent).
//!
//! The manifest names the current checkpoint. It is switched atomically (write a temporary
//! file, fsync, rename, fsync the directory); only then are the older checkpoint and the log
//! segments it covers deleted.
//!
//! Checkpoint file `checkpoint-<snapshot ts, 20 digits>.ckpt`: a 32-byte header (magic
//! `KEELCKP\0`, format version u32, zero u32, snapshot ts u64, replay-from LSN u64), then
//! blocks — length u32, CRC32C u32, payload of entries (key length u32, value length u32,
//! version ts u64, key, value) — and a final block of length 0 whose CRC covers the 8-byte
//! entry count that follows it. All integers little-endian.

use std::path::{Path, PathBuf};

use crate::Ts;
use crate::error::OpenError;
use crate::io::{Disk, FileBytes, write_atomic};

pub(crate) const MANIFEST: &str = "MANIFEST";
const MANIFEST_MAGIC: &[u8; 8] = b"KEELMAN\0";
const CHECKPOINT_MAGIC: &[u8; 8] = b"KEELCKP\0";
pub(crate) const FORMAT_VERSION: u32 = 1;
const HEADER_BYTES: usize = 32;
const BLOCK_BYTES_TARGET: usize = 1 << 20;

/// What the manifest says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Manifest {
    /// File name of the current checkpoint, if any.
    pub(crate) checkpoint: Option<String>,
    pub(crate) snapshot_ts: Ts,
    pub(crate) replay_from_lsn: u64,
}

impl Manifest {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MANIFEST_MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.snapshot_ts.0.to_le_bytes());
        out.extend_from_slice(&self.replay_from_lsn.to_le_bytes());
        let name = self.checkpoint.as_deref().unwrap_or("");
        out.extend_from_slice(
            &u32::try_from(name.len())
                .expect("short file name")
                .to_le_bytes(),
        );
        out.extend_from_slice(name.as_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    pub(crate) fn read(disk: &dyn Disk, dir: &Path) -> Result<Manifest, OpenError> {
        let path = dir.join(MANIFEST);
        let data = disk.read(&path).map_err(|e| OpenError::io(&path, e))?;
        let bad = |offset: usize, reason: &str| OpenError::Damaged {
            file: path.clone(),
            offset: offset as u64,
            reason: reason.to_owned(),
        };
        if data.len() < 36 || &data[..8] != MANIFEST_MAGIC {
            return Err(bad(0, "not a keel manifest (bad magic or too short)"));
        }
        let version = u32_at(&data, 8);
        if version > FORMAT_VERSION {
            return Err(OpenError::NewerFormat {
                file: path,
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let name_len = u32_at(&data, 32) as usize;
        if data.len() != 36 + name_len + 4 {
            return Err(bad(32, "manifest length does not match its name length"));
        }
        let body = &data[..36 + name_len];
        if crc32c::crc32c(body) != u32_at(&data, 36 + name_len) {
            return Err(bad(36 + name_len, "manifest checksum mismatch"));
        }
        let name = std::str::from_utf8(&data[36..36 + name_len])
            .map_err(|_| bad(36, "checkpoint name is not UTF-8"))?;
        Ok(Manifest {
            checkpoint: (!name.is_empty()).then(|| name.to_owned()),
            snapshot_ts: Ts(u64_at(&data, 16)),
            replay_from_lsn: u64_at(&data, 24),
        })
    }

    pub(crate) fn write(&self, disk: &dyn Disk, dir: &Path) -> std::io::Result<()> {
        write_atomic(disk, dir, MANIFEST, &self.encode())
    }
}

fn u32_at(data: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(data: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"))
}

pub(crate) fn checkpoint_name(snapshot_ts: Ts) -> String {
    format!("checkpoint-{:020}.ckpt", snapshot_ts.0)
}

pub(crate) fn is_checkpoint_name(name: &str) -> bool {
    name.starts_with("checkpoint-") && name.ends_with(".ckpt")
}

/// Writes a checkpoint file (fsynced, directory entry durable) from `entries` given in any
/// order: `(key, version ts, value)`. Returns its name and entry count.
pub(crate) fn write<'a>(
    disk: &dyn Disk,
    dir: &Path,
    snapshot_ts: Ts,
    replay_from_lsn: u64,
    entries: impl Iterator<Item = (&'a [u8], Ts, std::borrow::Cow<'a, [u8]>)>,
) -> std::io::Result<(String, u64)> {
    let name = checkpoint_name(snapshot_ts);
    let tmp: PathBuf = dir.join(format!("{name}.tmp"));
    let mut file = disk.create(&tmp)?;
    let mut header = Vec::with_capacity(HEADER_BYTES);
    header.extend_from_slice(CHECKPOINT_MAGIC);
    header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    header.extend_from_slice(&snapshot_ts.0.to_le_bytes());
    header.extend_from_slice(&replay_from_lsn.to_le_bytes());
    file.append(&header)?;
    let mut block = Vec::with_capacity(BLOCK_BYTES_TARGET + 1024);
    let mut count = 0u64;
    let flush =
        |block: &mut Vec<u8>, file: &mut Box<dyn crate::io::AppendFile>| -> std::io::Result<()> {
            if block.is_empty() {
                return Ok(());
            }
            let mut frame = Vec::with_capacity(8);
            frame.extend_from_slice(
                &u32::try_from(block.len())
                    .expect("blocks are small")
                    .to_le_bytes(),
            );
            frame.extend_from_slice(&crc32c::crc32c(block).to_le_bytes());
            file.append(&frame)?;
            file.append(block)?;
            block.clear();
            Ok(())
        };
    for (key, ts, value) in entries {
        block.extend_from_slice(&u32::try_from(key.len()).expect("bounded key").to_le_bytes());
        block.extend_from_slice(
            &u32::try_from(value.len())
                .expect("bounded value")
                .to_le_bytes(),
        );
        block.extend_from_slice(&ts.0.to_le_bytes());
        block.extend_from_slice(key);
        block.extend_from_slice(&value);
        count += 1;
        if block.len() >= BLOCK_BYTES_TARGET {
            flush(&mut block, &mut file)?;
        }
    }
    flush(&mut block, &mut file)?;
    let count_bytes = count.to_le_bytes();
    let mut trailer = Vec::with_capacity(16);
    trailer.extend_from_slice(&0u32.to_le_bytes());
    trailer.extend_from_slice(&crc32c::crc32c(&count_bytes).to_le_bytes());
    trailer.extend_from_slice(&count_bytes);
    file.append(&trailer)?;
    file.sync()?;
    drop(file);
    disk.rename(&tmp, &dir.join(&name))?;
    disk.sync_dir(dir)?;
    Ok((name, count))
}

/// A checkpoint read into memory and verified: its blocks, each a run of encoded entries.
pub(crate) struct Loaded {
    pub(crate) snapshot_ts: Ts,
    pub(crate) replay_from_lsn: u64,
    data: FileBytes,
    /// Where the verified blocks lie in `data`.
    blocks: Vec<std::ops::Range<usize>>,
    pub(crate) count: u64,
}

impl Loaded {
    /// The verified blocks, in key order.
    pub(crate) fn blocks(&self) -> impl ExactSizeIterator<Item = &[u8]> + Clone {
        self.blocks.iter().map(|range| &self.data[range.clone()])
    }
}

/// Reads and verifies a checkpoint file.
pub(crate) fn load(disk: &dyn Disk, path: &Path) -> Result<Loaded, OpenError> {
    let data = disk.read_shared(path).map_err(|e| OpenError::io(path, e))?;
    let bad = |offset: usize, reason: &str| OpenError::Damaged {
        file: path.to_path_buf(),
        offset: offset as u64,
        reason: reason.to_owned(),
    };
    if data.len() < HEADER_BYTES || &data[..8] != CHECKPOINT_MAGIC {
        return Err(bad(0, "not a keel checkpoint (bad magic or too short)"));
    }
    let version = u32_at(&data, 8);
    if version > FORMAT_VERSION {
        return Err(OpenError::NewerFormat {
            file: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let snapshot_ts = Ts(u64_at(&data, 16));
    let replay_from_lsn = u64_at(&data, 24);
    let mut pos = HEADER_BYTES;
    let mut blocks = Vec::new();
    let mut entries = 0u64;
    loop {
        if pos + 8 > data.len() {
            return Err(bad(pos, "checkpoint ends before its trailer"));
        }
        let len = u32_at(&data, pos) as usize;
        let crc = u32_at(&data, pos + 4);
        if len == 0 {
            if data.len() != pos + 16 {
                return Err(bad(pos, "checkpoint trailer has the wrong length"));
            }
            let count_bytes = &data[pos + 8..pos + 16];
            if crc32c::crc32c(count_bytes) != crc {
                return Err(bad(pos, "checkpoint trailer checksum mismatch"));
            }
            let count = u64_at(&data, pos + 8);
            if count != entries {
                return Err(bad(
                    pos,
                    &format!("trailer counts {count} entries, the blocks hold {entries}"),
                ));
            }
            return Ok(Loaded {
                snapshot_ts,
                replay_from_lsn,
                data,
                blocks,
                count,
            });
        }
        let Some(block) = data.get(pos + 8..pos + 8 + len) else {
            return Err(bad(pos, "a block runs past the end of the file"));
        };
        if crc32c::crc32c(block) != crc {
            return Err(bad(pos, "block checksum mismatch"));
        }
        let n = for_each_entry(block, |_, _, _| {})
            .ok_or_else(|| bad(pos, "a block with a valid checksum has an invalid layout"))?;
        entries += n;
        blocks.push(pos + 8..pos + 8 + len);
        pos += 8 + len;
    }
}

/// Calls `f(key, ts, value)` for each entry of a verified block; `None` if the block's
/// structure is invalid. Returns the entry count.
pub(crate) fn for_each_entry<'a>(
    mut block: &'a [u8],
    mut f: impl FnMut(&'a [u8], Ts, &'a [u8]),
) -> Option<u64> {
    let mut n = 0;
    while !block.is_empty() {
        let (head, rest) = block.split_at_checked(16)?;
        let key_len = u32_at(head, 0) as usize;
        let value_len = u32_at(head, 4) as usize;
        let ts = Ts(u64_at(head, 8));
        let (key, rest) = rest.split_at_checked(key_len)?;
        let (value, rest) = rest.split_at_checked(value_len)?;
        f(key, ts, value);
        n += 1;
        block = rest;
    }
    Some(n)
}
