//! Reading the log back: recovery and `keel check`.
//!
//! A frame that fails its checksum, or does not fit in its file, is a torn tail when nothing
//! but zeros follows it in the last segment: the crash interrupted its write, it was never
//! acknowledged, and it is cut. Anywhere else it is damage: the scan stops with the file and
//! offset, and opening the database is refused.

use std::ops::Range;
use std::path::{Path, PathBuf};

use super::format::{
    self, FORMAT_VERSION, FRAME_HEADER_BYTES, Frame, SEGMENT_HEADER_BYTES, SEGMENT_MAGIC,
};
use crate::error::OpenError;
use crate::io::{Disk, FileBytes};

/// A log segment file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) first_lsn: u64,
    pub(crate) path: PathBuf,
}

/// What a scan of the log found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Scanned {
    /// LSN just past the last whole frame.
    pub(crate) end_lsn: u64,
    /// Frames read (at or after `from_lsn`).
    pub(crate) frames: u64,
    /// Bytes of frames read.
    pub(crate) bytes: u64,
    /// A torn tail: the last segment, the file length to cut it to, and the bytes beyond.
    pub(crate) torn: Option<(PathBuf, u64, u64)>,
}

pub(crate) fn list_segments(disk: &dyn Disk, dir: &Path) -> Result<Vec<Segment>, OpenError> {
    let names = disk.list(dir).map_err(|e| OpenError::io(dir, e))?;
    let mut segments: Vec<Segment> = names
        .iter()
        .filter_map(|name| {
            let first_lsn = format::parse_segment_name(name)?;
            Some(Segment {
                first_lsn,
                path: dir.join(name),
            })
        })
        .collect();
    segments.sort_by_key(|s| s.first_lsn);
    Ok(segments)
}

fn damage(path: &Path, offset: u64, reason: impl Into<String>) -> OpenError {
    OpenError::Damaged {
        file: path.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

/// One segment's bytes and where the payloads of its checked frames lie in them.
pub(crate) struct SegmentFrames {
    data: FileBytes,
    payloads: Vec<Range<usize>>,
}

impl SegmentFrames {
    /// The frames, in log order.
    pub(crate) fn frames(&self) -> impl Iterator<Item = Frame<'_>> {
        self.payloads
            .iter()
            .map(|range| Frame::parsed(&self.data[range.clone()]))
    }
}

/// Reads and checks every whole frame of every segment in order, handing each segment's
/// frames at or after `from_lsn` to `keep` (its bytes are not copied again).
pub(crate) fn scan(
    disk: &dyn Disk,
    segments: &[Segment],
    from_lsn: u64,
    mut keep: impl FnMut(SegmentFrames),
) -> Result<Scanned, OpenError> {
    let mut scanned = Scanned {
        end_lsn: from_lsn,
        ..Scanned::default()
    };
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        let path = &segment.path;
        let data = disk.read_shared(path).map_err(|e| OpenError::io(path, e))?;
        check_header(path, &data, segment.first_lsn)?;
        if i > 0 && segment.first_lsn != scanned.end_lsn {
            return Err(damage(
                path,
                0,
                format!(
                    "log gap: the previous segment ends at LSN {}, this one starts at {}",
                    scanned.end_lsn, segment.first_lsn
                ),
            ));
        }
        let mut pos = SEGMENT_HEADER_BYTES;
        let mut payloads = Vec::new();
        let torn_or_damage =
            |pos: usize, reason: &str| -> Result<Option<(PathBuf, u64, u64)>, OpenError> {
                let rest_zero = data[pos..].iter().all(|&b| b == 0);
                let frame_reaches_end = {
                    let word = data
                        .get(pos..pos + 8)
                        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
                    word.is_none_or(|w| {
                        pos + format::frame_bytes((w & 0xffff_ffff) as usize) >= data.len()
                    })
                };
                if last && (rest_zero || frame_reaches_end) {
                    Ok(Some((path.clone(), pos as u64, (data.len() - pos) as u64)))
                } else {
                    Err(damage(path, pos as u64, reason))
                }
            };
        loop {
            if pos == data.len() {
                break;
            }
            if pos + FRAME_HEADER_BYTES > data.len() {
                scanned.torn = torn_or_damage(pos, "a frame header is cut short")?;
                break;
            }
            let word = u64::from_le_bytes(data[pos..pos + 8].try_into().expect("8 bytes"));
            if word == 0 {
                if data[pos..].iter().all(|&b| b == 0) {
                    if pos < data.len() && last {
                        scanned.torn = Some((path.clone(), pos as u64, (data.len() - pos) as u64));
                    } else if pos < data.len() {
                        return Err(damage(
                            path,
                            pos as u64,
                            "zeros inside a segment that is not the last",
                        ));
                    }
                    break;
                }
                return Err(damage(
                    path,
                    pos as u64,
                    "a zero frame header followed by data",
                ));
            }
            let len = (word & 0xffff_ffff) as usize;
            let crc = (word >> 32) as u32;
            let end = pos + format::frame_bytes(len);
            if len > format::PAYLOAD_BYTES_MAX || end > data.len() {
                scanned.torn = torn_or_damage(pos, "a frame runs past the end of its file")?;
                break;
            }
            let payload = &data[pos + FRAME_HEADER_BYTES..pos + FRAME_HEADER_BYTES + len];
            if crc32c::crc32c(payload) != crc {
                scanned.torn = torn_or_damage(pos, "frame checksum mismatch")?;
                break;
            }
            if Frame::parse(payload).is_none() {
                return Err(damage(
                    path,
                    pos as u64,
                    "a frame with a valid checksum has an invalid layout",
                ));
            }
            let lsn = segment.first_lsn + (pos - SEGMENT_HEADER_BYTES) as u64;
            if lsn >= from_lsn {
                scanned.frames += 1;
                scanned.bytes += (end - pos) as u64;
                let start = pos + FRAME_HEADER_BYTES;
                payloads.push(start..start + len);
            }
            pos = end;
        }
        scanned.end_lsn = segment.first_lsn + (pos - SEGMENT_HEADER_BYTES) as u64;
        keep(SegmentFrames { data, payloads });
    }
    Ok(scanned)
}

fn check_header(path: &Path, data: &[u8], first_lsn: u64) -> Result<(), OpenError> {
    if data.len() < SEGMENT_HEADER_BYTES || &data[..8] != SEGMENT_MAGIC {
        return Err(damage(path, 0, "not a keel log segment (bad magic)"));
    }
    let version = u32::from_le_bytes(data[8..12].try_into().expect("4 bytes"));
    if version > FORMAT_VERSION {
        return Err(OpenError::NewerFormat {
            file: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let lsn = u64::from_le_bytes(data[16..24].try_into().expect("8 bytes"));
    if lsn != first_lsn {
        return Err(damage(
            path,
            16,
            format!("header says first LSN {lsn}, the file name says {first_lsn}"),
        ));
    }
    Ok(())
}
