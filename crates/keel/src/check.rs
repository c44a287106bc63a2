//! `keel check`: verifies every file of a data directory without opening the database, and
//! optionally repairs a damaged log tail.

use std::path::{Path, PathBuf};

use crate::checkpoint::{self, Manifest};
use crate::error::OpenError;
use crate::io::{Disk, OsDisk};
use crate::wal::reader;

/// What [`check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckReport {
    /// The current checkpoint and its key count.
    pub checkpoint: Option<(String, u64)>,
    /// Log segments verified.
    pub segments: usize,
    /// Whole log frames (commits) found.
    pub frames: u64,
    /// A torn tail (an interrupted last write, harmless): file, offset, bytes.
    pub torn_tail: Option<(PathBuf, u64, u64)>,
    /// Damage found (with `repair`, what was cut): file, offset, what is wrong.
    pub damage: Option<(PathBuf, u64, String)>,
    /// What `repair` changed, one line per action.
    pub repaired: Vec<String>,
}

/// Verifies the manifest, the current checkpoint and every log segment in `dir`. Damage in
/// the log is reported with its file and offset; with `repair`, the log is cut at the first
/// damage (that file is truncated there and later segments are removed) and a torn tail is
/// cut — never anything before the damage. Damage to the manifest or checkpoint cannot be
/// repaired and is returned as an error.
pub fn check(dir: &Path, repair: bool) -> Result<CheckReport, OpenError> {
    check_on(&OsDisk, dir, repair)
}

pub(crate) fn check_on(
    disk: &dyn Disk,
    dir: &Path,
    repair: bool,
) -> Result<CheckReport, OpenError> {
    let manifest = Manifest::read(disk, dir)?;
    let mut report = CheckReport::default();
    if let Some(name) = &manifest.checkpoint {
        let loaded = checkpoint::load(disk, &dir.join(name))?;
        report.checkpoint = Some((name.clone(), loaded.count));
    }
    let mut segments = reader::list_segments(disk, dir)?;
    report.segments = segments.len();
    loop {
        match reader::scan(disk, &segments, 0, |_| {}) {
            Ok(scanned) => {
                report.frames = scanned.frames;
                if let Some((path, len, cut)) = scanned.torn {
                    if repair {
                        disk.truncate(&path, len)
                            .map_err(|e| OpenError::io(&path, e))?;
                        report.repaired.push(format!(
                            "cut a torn tail of {cut} bytes from {} at offset {len}",
                            path.display()
                        ));
                    }
                    report.torn_tail = Some((path, len, cut));
                }
                return Ok(report);
            }
            Err(OpenError::Damaged {
                file,
                offset,
                reason,
            }) if repair && report.damage.is_none() => {
                let Some(i) = segments.iter().position(|s| s.path == file) else {
                    return Err(OpenError::Damaged {
                        file,
                        offset,
                        reason,
                    });
                };
                disk.truncate(&file, offset)
                    .map_err(|e| OpenError::io(&file, e))?;
                report.repaired.push(format!(
                    "cut {} at offset {offset} ({reason})",
                    file.display()
                ));
                for later in segments.drain(i + 1..) {
                    disk.remove(&later.path)
                        .map_err(|e| OpenError::io(&later.path, e))?;
                    report.repaired.push(format!(
                        "removed {}, which followed the damage",
                        later.path.display()
                    ));
                }
                disk.sync_dir(dir).map_err(|e| OpenError::io(dir, e))?;
                report.damage = Some((file, offset, reason));
            }
            Err(e) => return Err(e),
        }
    }
}
