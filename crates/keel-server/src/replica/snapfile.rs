//! A snapshot's bytes: the file format, written and read a bounded frame at a time, and
//! [`SnapData`], the handle openraft moves them by (a file, or with no data directory a
//! buffer).
//!
//! ```text
//! "KEELSNAP"  u32 LE version (2)
//! frame 'M'   the snapshot's meta (postcard SnapshotMeta)
//! frame 'D'…  a batch of pairs (postcard Vec<(key, value)>), at most FRAME_KEYS keys and
//!             about FRAME_BYTES bytes (one pair larger than that goes alone)
//! frame 'E'   (data frames, pairs) (postcard), then the file ends
//! frame:      u32 LE body length, u32 LE crc32c of the body, body = kind byte + payload
//! ```
//!
//! Every frame is checked (its checksum, its length against what is left of the file) and the
//! end frame counts what came before it, so a truncated or damaged file is refused, with the
//! reason, by [`verify`] before an install replaces anything. Version 1 (one postcard
//! `(meta, Vec<u8> of postcard Vec<(key, value)>)`, written whole, without checksums) is
//! read only to convert a file an older keel left ([`convert_legacy`]).

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use openraft::{BasicNode, SnapshotMeta};
use serde::{Deserialize, Serialize};

/// A snapshot's metadata.
pub type Meta = SnapshotMeta<u64, BasicNode>;

const MAGIC: &[u8; 8] = b"KEELSNAP";
/// The format this keel writes.
pub const VERSION: u32 = 2;
/// Most keys in one data frame (one install transaction).
pub const FRAME_KEYS: usize = 4096;
/// Data frames close once they reach this many bytes of keys and values.
pub const FRAME_BYTES: usize = 1 << 20;
/// The largest frame body a writer makes: a full frame and one more pair of the largest key
/// and value the engine holds, with their length prefixes. A reader refuses a longer one
/// (a damaged length) before it allocates. A frame is one install transaction, within the
/// engine's limit on a transaction's writes.
const FRAME_MAX: u64 = (FRAME_BYTES
    + keel::limits::KEY_BYTES_MAX
    + keel::limits::VALUE_BYTES_MAX
    + 10 * (FRAME_KEYS + 1)
    + 16) as u64;
const _: () = assert!(FRAME_MAX < keel::limits::TXN_WRITE_BYTES_MAX as u64);
const _: () = assert!(FRAME_KEYS < keel::limits::TXN_WRITE_KEYS_MAX);

const META: u8 = b'M';
const DATA: u8 = b'D';
const END: u8 = b'E';

/// A key and its value.
pub type Pair = (Vec<u8>, Vec<u8>);

/// What a writer or reader went through: frames and pairs, and the largest frame body it
/// held in memory at once (the bound on its buffering).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub frames: u64,
    pub pairs: u64,
    pub bytes: u64,
    pub peak_frame: usize,
}

/// Writes a snapshot file to `out`: the header and meta at once, then pairs a frame at a
/// time, then the end frame.
pub struct Writer<W: Write> {
    out: W,
    pairs: Vec<Pair>,
    held: usize,
    stats: Stats,
}

impl<W: Write> Writer<W> {
    pub fn new(mut out: W, meta: &Meta) -> io::Result<Writer<W>> {
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        let mut stats = Stats::default();
        let body = postcard::to_stdvec(meta).map_err(io::Error::other)?;
        frame(&mut out, META, &body, &mut stats)?;
        Ok(Writer {
            out,
            pairs: Vec::new(),
            held: 0,
            stats,
        })
    }

    /// Adds a pair; a full frame goes out.
    pub fn push(&mut self, key: Vec<u8>, value: Vec<u8>) -> io::Result<()> {
        self.held += key.len() + value.len();
        self.pairs.push((key, value));
        if self.pairs.len() >= FRAME_KEYS || self.held >= FRAME_BYTES {
            self.flush_pairs()?;
        }
        Ok(())
    }

    fn flush_pairs(&mut self) -> io::Result<()> {
        if self.pairs.is_empty() {
            return Ok(());
        }
        // Sized once: the pairs and their length prefixes.
        let body = Vec::with_capacity(self.held + 10 * self.pairs.len() + 10);
        let body = postcard::to_extend(&self.pairs, body).map_err(io::Error::other)?;
        self.stats.pairs += self.pairs.len() as u64;
        self.stats.bytes += self.held as u64;
        frame(&mut self.out, DATA, &body, &mut self.stats)?;
        self.pairs.clear();
        self.held = 0;
        Ok(())
    }

    /// Writes the last pairs and the end frame; the output (not synced) and what went in.
    pub fn finish(mut self) -> io::Result<(W, Stats)> {
        self.flush_pairs()?;
        let data_frames = self.stats.frames - 1;
        let body =
            postcard::to_stdvec(&(data_frames, self.stats.pairs)).map_err(io::Error::other)?;
        let mut stats = self.stats;
        frame(&mut self.out, END, &body, &mut stats)?;
        self.out.flush()?;
        Ok((self.out, stats))
    }
}

fn frame(out: &mut impl Write, kind: u8, payload: &[u8], stats: &mut Stats) -> io::Result<()> {
    let len = payload.len() + 1;
    let len32 = u32::try_from(len)
        .map_err(|_| io::Error::other(format!("a snapshot frame of {len} bytes is too long")))?;
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, payload);
    out.write_all(&len32.to_le_bytes())?;
    out.write_all(&crc.to_le_bytes())?;
    out.write_all(&[kind])?;
    out.write_all(payload)?;
    stats.frames += 1;
    stats.peak_frame = stats.peak_frame.max(len);
    Ok(())
}

/// Why a snapshot file was refused.
#[derive(Debug)]
pub struct Damaged(pub String);

impl std::fmt::Display for Damaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reads a snapshot file of `len` bytes from `inp`, a frame at a time.
pub struct Reader<R: Read> {
    inp: R,
    len: u64,
    at: u64,
    meta: Meta,
    ended: bool,
    stats: Stats,
}

/// The first bytes of a file: this format, or the version 1 one, or neither.
pub enum Kind {
    Current,
    Legacy,
}

/// Which format a file starting with `head` (its first bytes, at most 8) is in.
pub fn kind_of(head: &[u8]) -> Kind {
    if head.starts_with(MAGIC) {
        Kind::Current
    } else {
        Kind::Legacy
    }
}

impl<R: Read> Reader<R> {
    /// Reads the header and the meta.
    pub fn open(mut inp: R, len: u64) -> Result<Reader<R>, Damaged> {
        let mut head = [0; 12];
        if len < head.len() as u64 {
            return Err(Damaged(format!(
                "the snapshot file is truncated: {len} bytes, shorter than its header"
            )));
        }
        inp.read_exact(&mut head).map_err(io_damage)?;
        if &head[..8] != MAGIC {
            return Err(Damaged(
                "not a keel snapshot file (it does not start with KEELSNAP)".into(),
            ));
        }
        let version = u32::from_le_bytes(head[8..].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(Damaged(format!(
                "the snapshot file is of format version {version}; this keel reads version \
                 {VERSION}"
            )));
        }
        let mut reader = Reader {
            inp,
            len,
            at: head.len() as u64,
            meta: Meta::default(),
            ended: false,
            stats: Stats::default(),
        };
        let (kind, body) = reader.frame()?;
        if kind != META {
            return Err(reader.damaged("its first frame is not the meta"));
        }
        reader.meta = postcard::from_bytes(&body[1..])
            .map_err(|e| reader.damaged(&format!("its meta does not decode ({e})")))?;
        Ok(reader)
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    fn damaged(&self, what: &str) -> Damaged {
        Damaged(format!(
            "the snapshot file is damaged: {what} (frame {} at byte {} of {})",
            self.stats.frames, self.at, self.len
        ))
    }

    /// The next frame: its kind and body (kind byte first), checked.
    fn frame(&mut self) -> Result<(u8, Vec<u8>), Damaged> {
        let left = self.len - self.at;
        if left < 8 {
            return Err(Damaged(format!(
                "the snapshot file is truncated: it ends {} frames in, at byte {} of a frame's \
                 8-byte head, before its end frame",
                self.stats.frames, left
            )));
        }
        let mut head = [0; 8];
        self.inp.read_exact(&mut head).map_err(io_damage)?;
        let body_len = u64::from(u32::from_le_bytes(head[..4].try_into().expect("4")));
        let crc = u32::from_le_bytes(head[4..].try_into().expect("4"));
        if body_len == 0 || body_len > FRAME_MAX {
            return Err(self.damaged(&format!("a frame length of {body_len}")));
        }
        if body_len > left - 8 {
            return Err(Damaged(format!(
                "the snapshot file is truncated: frame {} needs {body_len} bytes, {} are left \
                 (at byte {} of {})",
                self.stats.frames,
                left - 8,
                self.at,
                self.len
            )));
        }
        let mut body = vec![0; body_len as usize];
        self.inp.read_exact(&mut body).map_err(io_damage)?;
        if crc32c::crc32c(&body) != crc {
            return Err(self.damaged("a checksum does not match"));
        }
        self.at += 8 + body_len;
        self.stats.frames += 1;
        self.stats.peak_frame = self.stats.peak_frame.max(body.len());
        Ok((body[0], body))
    }

    /// The next batch of pairs; `None` once the end frame was read, checked against what
    /// came before it, and the file ended there.
    pub fn next_batch(&mut self) -> Result<Option<Vec<Pair>>, Damaged> {
        if self.ended {
            return Ok(None);
        }
        let (kind, body) = self.frame()?;
        match kind {
            DATA => {
                let pairs: Vec<Pair> = postcard::from_bytes(&body[1..])
                    .map_err(|e| self.damaged(&format!("a batch does not decode ({e})")))?;
                self.stats.pairs += pairs.len() as u64;
                self.stats.bytes += pairs
                    .iter()
                    .map(|(k, v)| (k.len() + v.len()) as u64)
                    .sum::<u64>();
                Ok(Some(pairs))
            }
            END => {
                let (frames, pairs): (u64, u64) = postcard::from_bytes(&body[1..])
                    .map_err(|e| self.damaged(&format!("its end frame does not decode ({e})")))?;
                let data_frames = self.stats.frames - 2;
                if (frames, pairs) != (data_frames, self.stats.pairs) {
                    return Err(self.damaged(&format!(
                        "its end frame counts {frames} batches of {pairs} keys, {data_frames} \
                         of {} came",
                        self.stats.pairs
                    )));
                }
                if self.at != self.len {
                    return Err(Damaged(format!(
                        "the snapshot file has {} bytes after its end frame",
                        self.len - self.at
                    )));
                }
                self.ended = true;
                Ok(None)
            }
            other => Err(self.damaged(&format!("a frame of unknown kind {other:#04x}"))),
        }
    }
}

fn io_damage(e: io::Error) -> Damaged {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        Damaged("the snapshot file is truncated: it ended while being read".into())
    } else {
        Damaged(format!("reading the snapshot file: {e}"))
    }
}

/// Reads the whole file (`len` bytes from `inp`), a frame at a time, and returns its meta if
/// every frame checks; holds one frame at a time.
pub fn verify(inp: impl Read, len: u64) -> Result<(Meta, Stats), Damaged> {
    let mut reader = Reader::open(inp, len)?;
    while reader.next_batch()?.is_some() {}
    Ok((reader.meta.clone(), reader.stats))
}

/// A version 1 snapshot file (written by keel before snapshots were streamed).
#[derive(Serialize, Deserialize)]
struct Legacy {
    meta: Meta,
    data: Vec<u8>,
}

/// Rewrites the version 1 file at `path` in this format (through a temporary file, synced,
/// renamed over it). A version 1 file was written whole in memory, so reading it whole does
/// not hold more than the keel that wrote it did.
pub fn convert_legacy(path: &Path) -> Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let legacy: Legacy = postcard::from_bytes(&bytes).map_err(|e| {
        format!(
            "{}: neither a keel snapshot file nor one of format version 1 ({e})",
            path.display()
        )
    })?;
    drop(bytes);
    let pairs: Vec<Pair> = postcard::from_bytes(&legacy.data).map_err(|e| {
        format!(
            "{}: a version 1 snapshot whose data does not decode ({e})",
            path.display()
        )
    })?;
    let tmp = Temp::beside(path);
    let write = || -> io::Result<()> {
        let file = std::fs::File::create(tmp.path())?;
        let mut writer = Writer::new(io::BufWriter::new(file), &legacy.meta)?;
        for (k, v) in pairs {
            writer.push(k, v)?;
        }
        let (out, _) = writer.finish()?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(tmp.path(), path)?;
        sync_dir(path)
    };
    write().map_err(|e| {
        format!(
            "converting {} to format version {VERSION}: {e}",
            path.display()
        )
    })
}

/// A temporary file's name, removed (if it is still there) when this drops: a file being
/// built or received beside the current snapshot, until it is renamed to it.
pub struct Temp(PathBuf);

impl Temp {
    /// A new name beside `path`: every build and every received snapshot has its own, so
    /// none writes over another still in use.
    pub fn beside(path: &Path) -> Temp {
        Temp(temp_path(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("removing {}: {e}", self.0.display()),
        }
    }
}

/// A new temporary name beside `path` (`<path>.new-<n>`).
fn temp_path(path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".new-{n}"));
    path.with_file_name(name)
}

/// Removes the temporary files beside `path` (left by a process that stopped while it built
/// or received a snapshot), and the one version 1 used.
pub fn remove_temps(path: &Path) -> io::Result<()> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(());
    };
    let (mut prefix, mut old) = (name.to_os_string(), name.to_os_string());
    prefix.push(".new-");
    old.push(".tmp");
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let file = entry.file_name();
        let temp = file
            .as_encoded_bytes()
            .starts_with(prefix.as_encoded_bytes())
            || file == old;
        if temp {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Makes a rename in `path`'s directory durable.
pub fn sync_dir(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// A snapshot's bytes as openraft holds them (`Tc::SnapshotData`): read from to send it,
/// written to as it arrives.
pub enum SnapData {
    /// A file: a received snapshot arriving at `temp` (a temporary name in the partition's
    /// directory, which the install renames), or (`temp` `None`) an open snapshot file read
    /// to be sent.
    File {
        file: tokio::fs::File,
        temp: Option<Temp>,
    },
    /// With no data directory: the bytes themselves.
    Memory(io::Cursor<Vec<u8>>),
}

impl std::fmt::Debug for SnapData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapData::File { temp, .. } => {
                write!(f, "SnapData::File({:?})", temp.as_ref().map(Temp::path))
            }
            SnapData::Memory(c) => write!(f, "SnapData::Memory({} bytes)", c.get_ref().len()),
        }
    }
}

impl tokio::io::AsyncRead for SnapData {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapData::File { file, .. } => Pin::new(file).poll_read(cx, buf),
            SnapData::Memory(c) => Pin::new(c).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for SnapData {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            SnapData::File { file, .. } => Pin::new(file).poll_write(cx, buf),
            SnapData::Memory(c) => Pin::new(c).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapData::File { file, .. } => Pin::new(file).poll_flush(cx),
            SnapData::Memory(c) => Pin::new(c).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapData::File { file, .. } => Pin::new(file).poll_shutdown(cx),
            SnapData::Memory(c) => Pin::new(c).poll_shutdown(cx),
        }
    }
}

impl tokio::io::AsyncSeek for SnapData {
    fn start_seek(self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        match self.get_mut() {
            SnapData::File { file, .. } => Pin::new(file).start_seek(position),
            SnapData::Memory(c) => Pin::new(c).start_seek(position),
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        match self.get_mut() {
            SnapData::File { file, .. } => Pin::new(file).poll_complete(cx),
            SnapData::Memory(c) => Pin::new(c).poll_complete(cx),
        }
    }
}

/// Counts, per thread, the bytes allocated and not yet freed (the library's tests run with
/// this allocator, over mimalloc as the binary), to show what building or installing a
/// snapshot holds.
#[cfg(test)]
pub(crate) mod counting {
    use std::alloc::{GlobalAlloc, Layout};

    /// What the `keel` binary allocates with (keel-cli's `main.rs`), so that the tests' costs
    /// (`cost::`) are the server's.
    use mimalloc::MiMalloc;
    use std::cell::Cell;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }

    fn add(n: isize) {
        let _ = LIVE.try_with(|live| {
            let now = live.get() + n;
            live.set(now);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
        });
    }

    struct Counting;

    // SAFETY: every call goes to `MiMalloc` as it came; the counting touches no allocation.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let p = unsafe { MiMalloc.alloc(layout) };
            if !p.is_null() {
                add(layout.size() as isize);
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let p = unsafe { MiMalloc.alloc_zeroed(layout) };
            if !p.is_null() {
                add(layout.size() as isize);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { MiMalloc.dealloc(ptr, layout) };
            add(-(layout.size() as isize));
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let p = unsafe { MiMalloc.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                add(new_size as isize - layout.size() as isize);
            }
            p
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// Runs `f` on this thread: its result, the most bytes this thread held at once above
    /// what it held before, and what it holds more after (memory freed by other threads is
    /// counted on theirs, so these are upper bounds of what `f` kept).
    pub fn measure<T>(f: impl FnOnce() -> T) -> (T, isize, isize) {
        let start = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(start));
        let result = f();
        let (peak, end) = (PEAK.with(Cell::get), LIVE.with(Cell::get));
        (result, peak - start, end - start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            snapshot_id: "t-1".into(),
            ..Meta::default()
        }
    }

    fn file(pairs: usize, value: usize) -> (Vec<u8>, Stats) {
        let mut w = Writer::new(Vec::new(), &meta()).expect("header");
        for i in 0..pairs {
            w.push(format!("k{i:06}").into_bytes(), vec![i as u8; value])
                .expect("push");
        }
        w.finish().expect("finish")
    }

    #[test]
    fn a_file_reads_back_frame_by_frame() {
        let (bytes, written) = file(10_000, 300);
        assert!(written.frames > 4, "{written:?}");
        assert!(
            written.peak_frame <= FRAME_BYTES + 400 + 10 * FRAME_KEYS,
            "{written:?}"
        );
        let mut r = Reader::open(&bytes[..], bytes.len() as u64).expect("open");
        assert_eq!(r.meta(), &meta());
        let mut n = 0;
        while let Some(batch) = r.next_batch().expect("batch") {
            assert!(batch.len() <= FRAME_KEYS);
            for (k, v) in batch {
                assert_eq!(k, format!("k{n:06}").into_bytes());
                assert_eq!(v, vec![n as u8; 300]);
                n += 1;
            }
        }
        assert_eq!(n, 10_000);
        assert_eq!(r.stats().pairs, written.pairs);
        let (empty, _) = file(0, 0);
        let (m, stats) = verify(&empty[..], empty.len() as u64).expect("an empty snapshot");
        assert_eq!((m, stats.pairs), (meta(), 0));
    }

    /// A file of format version 1 (one postcard `(meta, data)`) is rewritten in this one.
    #[test]
    fn a_version_1_file_is_converted() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("snapshot");
        let pairs: Vec<Pair> = (0..5000u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![7; 100]))
            .collect();
        let legacy = Legacy {
            meta: meta(),
            data: postcard::to_stdvec(&pairs).expect("encode"),
        };
        std::fs::write(&path, postcard::to_stdvec(&legacy).expect("encode")).expect("write");
        assert!(matches!(
            kind_of(&std::fs::read(&path).expect("read")[..8]),
            Kind::Legacy
        ));
        convert_legacy(&path).expect("convert");
        let bytes = std::fs::read(&path).expect("read");
        let mut r = Reader::open(&bytes[..], bytes.len() as u64).expect("open");
        assert_eq!(r.meta(), &meta());
        let mut back = Vec::new();
        while let Some(batch) = r.next_batch().expect("batch") {
            back.extend(batch);
        }
        assert_eq!(back, pairs);
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            1,
            "no temporary file left"
        );
        std::fs::write(&path, b"junk that is no snapshot").expect("write");
        let err = convert_legacy(&path).expect_err("junk");
        assert!(err.contains("neither a keel snapshot file"), "{err}");
    }

    /// Every truncation, and a flipped bit anywhere, is refused, saying why.
    #[test]
    fn a_truncated_or_damaged_file_is_refused() {
        let (bytes, _) = file(3000, 200);
        let step = bytes.len() / 40;
        for len in (0..bytes.len())
            .step_by(step)
            .chain([bytes.len() - 1, 12, 20])
        {
            let err = verify(&bytes[..len], len as u64).expect_err("truncated");
            assert!(err.0.contains("truncated"), "{len}: {err}");
        }
        for at in (0..bytes.len())
            .step_by(step + 7)
            .chain([8, 9, bytes.len() - 1])
        {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            let err = verify(&bad[..], bad.len() as u64).expect_err("damaged");
            assert!(
                ["damaged", "truncated", "KEELSNAP", "version"]
                    .iter()
                    .any(|w| err.0.contains(w)),
                "{at}: {err}"
            );
        }
        let mut longer = bytes.clone();
        longer.extend_from_slice(b"more");
        let err = verify(&longer[..], longer.len() as u64).expect_err("trailing bytes");
        assert!(err.0.contains("after its end frame"), "{err}");
        // A whole data frame cut out (its neighbours intact): the end frame's count.
        let mut r = Reader::open(&bytes[..], bytes.len() as u64).expect("open");
        let start = r.at as usize;
        r.next_batch().expect("a batch");
        let cut = [&bytes[..start], &bytes[r.at as usize..]].concat();
        let err = verify(&cut[..], cut.len() as u64).expect_err("a frame missing");
        assert!(err.0.contains("end frame counts"), "{err}");
    }
}
