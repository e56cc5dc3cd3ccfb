//! Snapshot files: a partition's (or a projection's) whole state at a journal position.
//!
//! Layout: `magic | version: u32 | sections...`, where every section is the bytes its writer streamed
//! followed by the CRC32C of those bytes. The reader checks each section's CRC right after parsing it, so
//! both disk corruption and a writer/reader mismatch are caught. Files are written to a temporary name,
//! fsynced, renamed into place and the directory fsynced: a crash leaves either the old or the new file.

use crate::direct_io::DirectWriter;
use crate::journal::{JournalError, Lsn};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"SPATESNP";
/// 2: a partition snapshot's idempotency table is a section of its own after the apps' (it was inside
/// the bookkeeping section), so that it can be written in steps. 3: the bookkeeping ends with the
/// archive's records not yet in its store. 4: those records are the last section instead, written
/// when the rest is, so that most of them are in the store by then. 5: the bookkeeping names the
/// record a partition snapshot ends at (its envelope's random), which recovery checks against the
/// journal. Files of versions 1 to 4 are still read.
const VERSION: u32 = 5;
const SUFFIX: &str = ".snap";

/// A snapshot (or a read model's checkpoint) falls due once the journal since the last one is this
/// many times the last one's size, from [`JOURNAL_BYTES_BETWEEN_MIN`] up to the configured interval
/// (`--snapshot-interval-bytes`, `--projection-checkpoint-interval-bytes`): snapshots then add at most a
/// quarter to what the disk writes for the journal, and a small state is written often, so that a
/// restart replays little. With the interval alone (256 MiB) the ledger's snapshot, its transfers in
/// flight (a few MB), fell due about every 450 batches of 8,000 operations, and their replay was most
/// of a restart: 3.7-4.6 s of 6.8 s at 3 M transfers (BENCHMARKS.md). Redis rewrites its append-only
/// file by the same kind of rule (once it has grown by a set share since the last rewrite, from a
/// minimum size).
const JOURNAL_BYTES_PER_SNAPSHOT_BYTE: u64 = 4;

/// The fewest journal bytes between two snapshots that [`JOURNAL_BYTES_PER_SNAPSHOT_BYTE`] allows,
/// unless the configured interval is less (Redis's minimum for a rewrite of its append-only file is the
/// same). Restart against pauses: with 16 MiB the ledger's restart after kill -9 at 3 M transfers took
/// 2.1-3.2 s (4.2-5.4 s with 64 MiB), but its partitions paused 5 times as often for snapshot steps, and
/// more of those pauses took over 10 ms waiting for a core (21 of 7,528 in one run against 1 of 1,580,
/// BENCHMARKS.md). The ledger's batch throughput was the same with snapshots every 16 MiB as every
/// 256 MiB.
const JOURNAL_BYTES_BETWEEN_MIN: u64 = 64 << 20;

/// The journal bytes after which the next snapshot or checkpoint falls due, when the newest one is
/// `newest_bytes` long (0 if none is known) and at most `interval_bytes` are allowed.
pub(crate) fn journal_bytes_between(newest_bytes: u64, interval_bytes: u64) -> u64 {
    (newest_bytes.saturating_mul(JOURNAL_BYTES_PER_SNAPSHOT_BYTE)).clamp(
        JOURNAL_BYTES_BETWEEN_MIN.min(interval_bytes),
        interval_bytes,
    )
}

/// A writer that checksums what passes through it.
pub struct SectionWriter<W: Write> {
    inner: W,
    crc: u32,
}

impl<W: Write> SectionWriter<W> {
    pub fn new(inner: W) -> Self {
        Self { inner, crc: 0 }
    }

    /// Writes the CRC of this section and starts the next one.
    pub fn end_section(&mut self) -> io::Result<()> {
        self.inner.write_all(&self.crc.to_le_bytes())?;
        self.crc = 0;
        Ok(())
    }
}

impl<W: Write> Write for SectionWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..written]);
        Ok(written)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The reading side of [`SectionWriter`].
pub struct SectionReader<R: Read> {
    inner: R,
    crc: u32,
    format_version: u32,
}

impl<R: Read> SectionReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            crc: 0,
            format_version: VERSION,
        }
    }

    /// The format version in the file's header.
    pub fn format_version(&self) -> u32 {
        self.format_version
    }

    /// Reads the stored CRC of the section just parsed and compares it with what was read.
    pub fn end_section(&mut self, what: &str) -> io::Result<()> {
        let mut stored = [0; 4];
        self.inner.read_exact(&mut stored)?;
        if u32::from_le_bytes(stored) != self.crc {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("checksum mismatch in section {what}"),
            ));
        }
        self.crc = 0;
        Ok(())
    }

    /// Fails if anything follows the last section.
    pub fn finish(mut self) -> io::Result<()> {
        let mut probe = [0; 1];
        match self.inner.read(&mut probe)? {
            0 => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bytes after the last section",
            )),
        }
    }
}

impl<R: Read> Read for SectionReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..read]);
        Ok(read)
    }
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `name` in `dir` atomically: `write` streams the sections after the header.
pub fn write_atomically(
    dir: &Path,
    name: &str,
    write: impl FnOnce(&mut SectionWriter<&mut Unpublished>) -> io::Result<()>,
) -> Result<PathBuf, JournalError> {
    write_file_atomically(dir, name, |file| {
        let mut out = SectionWriter::new(file);
        write_header(&mut out)?;
        write(&mut out)
    })
}

fn write_header(out: &mut SectionWriter<impl Write>) -> io::Result<()> {
    out.write_all(MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.end_section()
}

/// Installs in `dir` a copy of the snapshot file of LSN `lsn` made elsewhere (a replicated store's):
/// `write` streams its bytes, as they were written. Its sections are checked when it is loaded, like
/// any snapshot's; a copy that fails half-way leaves only a temporary file, which [`list`] removes.
pub fn install_copy(
    dir: &Path,
    lsn: Lsn,
    write: impl FnOnce(&mut Unpublished) -> io::Result<()>,
) -> Result<PathBuf, JournalError> {
    write_file_atomically(dir, &file_name(lsn), write)
}

/// A temporary file, fsynced, renamed into place and the directory fsynced: a crash leaves either the
/// old file or the new one.
fn write_file_atomically(
    dir: &Path,
    name: &str,
    write: impl FnOnce(&mut Unpublished) -> io::Result<()>,
) -> Result<PathBuf, JournalError> {
    let mut pending = Unpublished::create(dir, name)?;
    write(&mut pending).map_err(io_error(&pending.temporary))?;
    pending.publish()
}

/// A file being written under a temporary name, invisible to [`list`] (which removes it after a crash)
/// until [`Unpublished::publish`] renames it into place.
pub struct Unpublished {
    out: Out,
    temporary: PathBuf,
    dir: PathBuf,
    path: PathBuf,
}

/// How an unpublished file's bytes reach it.
enum Out {
    Buffered(BufWriter<File>),
    /// Past the page cache, for partition snapshots (see `direct_io.rs`).
    Direct(DirectWriter),
}

impl Unpublished {
    fn create(dir: &Path, name: &str) -> Result<Self, JournalError> {
        Self::create_with(dir, name, |temporary| {
            Ok(Out::Buffered(BufWriter::with_capacity(
                1 << 20,
                File::create(temporary)?,
            )))
        })
    }

    /// A file written past the page cache where the file system allows it.
    fn create_direct(dir: &Path, name: &str) -> Result<Self, JournalError> {
        Self::create_with(dir, name, |temporary| {
            Ok(Out::Direct(DirectWriter::create(temporary)?))
        })
    }

    fn create_with(
        dir: &Path,
        name: &str,
        open: impl FnOnce(&Path) -> io::Result<Out>,
    ) -> Result<Self, JournalError> {
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let temporary = dir.join(format!("{name}.tmp"));
        let out = open(&temporary).map_err(io_error(&temporary))?;
        Ok(Self {
            out,
            temporary,
            path: dir.join(name),
            dir: dir.to_path_buf(),
        })
    }

    /// Flushes and fsyncs the file, renames it into place and fsyncs the directory.
    pub fn publish(self) -> Result<PathBuf, JournalError> {
        let Self {
            out,
            temporary,
            path,
            dir,
        } = self;
        let file = match out {
            Out::Buffered(buffered) => buffered.into_inner().map_err(|e| e.into_error()),
            Out::Direct(direct) => direct.finish(),
        };
        let synced = file.and_then(|file| file.sync_all());
        synced.map_err(io_error(&temporary))?;
        fs::rename(&temporary, &path).map_err(io_error(&path))?;
        crate::journal::sync_dir(&dir)?;
        Ok(path)
    }
}

/// A partition snapshot's bytes on their way to the thread that writes its file.
enum SnapshotChunk {
    Bytes(Vec<u8>),
    /// The snapshot is whole: the file may be published.
    Finished,
    /// The partition could not write the snapshot: the file is discarded.
    Failed(String),
}

/// Bytes a chunk holds before it is sent: few sends, and little memory per chunk queued.
const CHUNK_BYTES: usize = 1 << 20;

/// Written chunks' buffers kept to be filled again: a fresh megabyte is paged in as it is written,
/// on the partition thread (measured at fraud's 30 M cards: about 300 page faults, 4-19 ms of system
/// time, in each snapshot step), while one sent back is already in memory.
const SPARE_CHUNKS: usize = 4;

/// The two ends of a partition snapshot's way to its file: [`ChunkSender`] on the partition's
/// thread, [`ChunkReceiver`] on the file's ([`write_streamed`]). With `chunks_queued`, the sender
/// waits while that many chunks are queued; without, never (for a caller that drives both ends).
pub fn chunk_pipe(
    chunks_queued: Option<usize>,
) -> io::Result<(SectionWriter<ChunkSender>, ChunkReceiver)> {
    let (chunks, file_chunks) = match chunks_queued {
        Some(queued) => crossbeam_channel::bounded(queued),
        None => crossbeam_channel::unbounded(),
    };
    let (spares_back, spares) = crossbeam_channel::bounded(SPARE_CHUNKS);
    let out = ChunkSender::start(chunks, spares)?;
    let receiver = ChunkReceiver {
        chunks: file_chunks,
        spares: spares_back,
    };
    Ok((out, receiver))
}

/// Buffers a partition snapshot and sends it in chunks to the thread that writes its file
/// ([`write_streamed`]), so that the partition thread never waits on the file system, only on a full
/// queue of chunks.
pub struct ChunkSender {
    buffer: Vec<u8>,
    chunks: Sender<SnapshotChunk>,
    spares: Receiver<Vec<u8>>,
    /// Bytes of the snapshot so far.
    bytes: u64,
}

impl ChunkSender {
    /// Starts the snapshot with its header section.
    fn start(
        chunks: Sender<SnapshotChunk>,
        spares: Receiver<Vec<u8>>,
    ) -> io::Result<SectionWriter<Self>> {
        let mut out = SectionWriter::new(Self {
            buffer: Vec::with_capacity(CHUNK_BYTES),
            chunks,
            spares,
            bytes: 0,
        });
        write_header(&mut out)?;
        Ok(out)
    }

    fn send(&self, chunk: SnapshotChunk) -> io::Result<()> {
        let stopped = || io::Error::other("the thread writing the snapshot's file stopped");
        match self.chunks.try_send(chunk) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(chunk)) => {
                // A pause that waits here waits for the disk: its time stays its own.
                crate::thread_time::note_hand_off_wait();
                self.chunks.send(chunk).map_err(|_| stopped())
            }
            Err(TrySendError::Disconnected(_)) => Err(stopped()),
        }
    }

    /// True while at most half of the chunk queue is taken, so that a step of the snapshot (its budget
    /// plus what apply forced out since the last one: a few MB) finds room and does not wait for the
    /// file system. Always true for an unbounded queue.
    pub fn file_keeps_up(&self) -> bool {
        self.chunks
            .capacity()
            .is_none_or(|capacity| self.chunks.len() * 2 <= capacity)
    }

    /// Bytes of the snapshot so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Sends what is buffered and says that the snapshot is whole.
    pub fn finish(mut self) -> io::Result<()> {
        let last = std::mem::take(&mut self.buffer);
        self.send(SnapshotChunk::Bytes(last))?;
        self.send(SnapshotChunk::Finished)
    }

    /// Says that the snapshot failed; its file is discarded.
    pub fn fail(self, error: String) {
        // A file thread that stopped has nothing to discard.
        let _ = self.send(SnapshotChunk::Failed(error));
    }
}

impl Write for ChunkSender {
    /// Takes what fits in the chunk, so that its buffer never grows past the capacity it was made
    /// with (a sealed chunk of fraud's is itself a megabyte, written at once).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let taken = buf.len().min(CHUNK_BYTES - self.buffer.len());
        self.buffer.extend_from_slice(&buf[..taken]);
        self.bytes += taken as u64;
        if self.buffer.len() == CHUNK_BYTES {
            let empty = match self.spares.try_recv() {
                Ok(mut spare) => {
                    spare.clear();
                    spare
                }
                Err(_) => Vec::with_capacity(CHUNK_BYTES),
            };
            let full = std::mem::replace(&mut self.buffer, empty);
            self.send(SnapshotChunk::Bytes(full))?;
        }
        Ok(taken)
    }
    /// Chunks go when full or at the end: the file is synced once, when it is published.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The file's end of [`chunk_pipe`]: the chunks, and the way back for their emptied buffers.
pub struct ChunkReceiver {
    chunks: Receiver<SnapshotChunk>,
    spares: Sender<Vec<u8>>,
}

/// Writes the chunks of the snapshot of LSN `lsn` to a temporary file in `dir` as they come; returns
/// the file, to publish, once the snapshot is whole.
pub fn write_streamed(dir: &Path, lsn: Lsn, chunks: ChunkReceiver) -> Result<Unpublished, String> {
    let mut file = Unpublished::create_direct(dir, &file_name(lsn)).map_err(|e| e.to_string())?;
    let error = loop {
        match chunks.chunks.recv() {
            Ok(SnapshotChunk::Bytes(bytes)) => {
                if let Err(error) = file.write_all(&bytes) {
                    break format!("writing {}: {error}", file.temporary.display());
                }
                // Full when the partition has enough: this one is then freed.
                let _ = chunks.spares.try_send(bytes);
            }
            Ok(SnapshotChunk::Finished) => return Ok(file),
            Ok(SnapshotChunk::Failed(error)) => break error,
            Err(_) => break "the partition stopped before its snapshot was whole".to_string(),
        }
    };
    let _ = fs::remove_file(&file.temporary);
    Err(error)
}

impl Write for Unpublished {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.out {
            Out::Buffered(out) => out.write(buf),
            Out::Direct(out) => out.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.out {
            Out::Buffered(out) => out.flush(),
            Out::Direct(out) => out.flush(),
        }
    }
}

impl<W: Write> SectionWriter<W> {
    pub fn into_inner(self) -> W {
        self.inner
    }

    pub fn get_ref(&self) -> &W {
        &self.inner
    }
}

/// A snapshot or checkpoint written by a newer binary: not damaged, so it is neither set aside nor
/// replaced; the start is refused instead (see [`is_newer_format`]).
#[derive(Debug)]
pub struct NewerFormat {
    found: u32,
}

impl std::fmt::Display for NewerFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "format version {} of a newer spate; this binary (spate {}) reads versions 1 to {VERSION}; \
             run a binary at least as new as the one that wrote it",
            self.found,
            env!("CARGO_PKG_VERSION")
        )
    }
}

impl std::error::Error for NewerFormat {}

/// Whether `error` (from [`open`]) says the file is of a newer format.
pub fn is_newer_format(error: &io::Error) -> bool {
    (error.get_ref()).is_some_and(|inner| inner.is::<NewerFormat>())
}

/// Opens a snapshot file and checks its header; the caller parses the sections.
pub fn open(path: &Path) -> io::Result<SectionReader<BufReader<File>>> {
    let mut input = SectionReader::new(BufReader::with_capacity(1 << 20, File::open(path)?));
    let mut magic = [0; 8];
    input.read_exact(&mut magic)?;
    let mut version = [0; 4];
    input.read_exact(&mut version)?;
    let version = u32::from_le_bytes(version);
    if &magic == MAGIC && version > VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            NewerFormat { found: version },
        ));
    }
    if &magic != MAGIC || version == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a spate snapshot",
        ));
    }
    input.end_section("header")?;
    input.format_version = version;
    Ok(input)
}

pub fn file_name(lsn: Lsn) -> String {
    format!("{lsn:020}{SUFFIX}")
}

/// Snapshot files in `dir`, newest (highest LSN) first. Leftover temporary files are removed.
pub fn list(dir: &Path) -> Result<Vec<(Lsn, PathBuf)>, JournalError> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(found);
    };
    for entry in entries {
        let path = entry.map_err(io_error(dir))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.ends_with(".tmp") {
            fs::remove_file(&path).map_err(io_error(&path))?;
        } else if let Some(lsn) = name
            .strip_suffix(SUFFIX)
            .and_then(|s| s.parse::<Lsn>().ok())
        {
            found.push((lsn, path));
        }
    }
    found.sort_by_key(|(lsn, _)| std::cmp::Reverse(*lsn));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_between_snapshots_follows_their_size_within_its_bounds() {
        let interval = 256 << 20;
        // None known yet, or a small one: the minimum.
        assert_eq!(journal_bytes_between(0, interval), 64 << 20);
        assert_eq!(journal_bytes_between(3 << 20, interval), 64 << 20);
        // Four journal bytes per snapshot byte in between.
        assert_eq!(journal_bytes_between(30 << 20, interval), 120 << 20);
        // A large state: the configured interval.
        assert_eq!(journal_bytes_between(1 << 30, interval), interval);
        assert_eq!(journal_bytes_between(u64::MAX, interval), interval);
        // An interval below the minimum is kept whatever the size.
        assert_eq!(journal_bytes_between(0, 4096), 4096);
        assert_eq!(journal_bytes_between(1 << 30, 4096), 4096);
    }
    use crate::wire::{ReadLe, WriteLe};

    #[test]
    fn a_written_chunk_is_filled_again_and_the_file_holds_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let (mut out, file_end) = chunk_pipe(Some(4)).unwrap();
        let returned = file_end.spares.clone();
        let file_dir = dir.path().to_path_buf();
        let file_thread = std::thread::spawn(move || write_streamed(&file_dir, 3, file_end));

        let first_chunk = out.inner.buffer.as_ptr();
        let bytes: Vec<u8> = (0..3 * CHUNK_BYTES).map(|i| (i % 251) as u8).collect();
        out.inner.write_all(&bytes[..CHUNK_BYTES]).unwrap();
        while returned.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        out.inner
            .write_all(&bytes[CHUNK_BYTES..2 * CHUNK_BYTES])
            .unwrap();
        assert_eq!(
            out.inner.buffer.as_ptr(),
            first_chunk,
            "the chunk written first is the one filled next"
        );
        out.inner.write_all(&bytes[2 * CHUNK_BYTES..]).unwrap();
        out.into_inner().finish().unwrap();

        let path = file_thread.join().unwrap().unwrap().publish().unwrap();
        let written = fs::read(path).unwrap();
        assert!(
            written.ends_with(&bytes),
            "every byte, in order, after the header"
        );
    }

    #[test]
    fn the_file_keeps_up_while_at_most_half_of_the_queue_is_taken() {
        let (mut out, file_end) = chunk_pipe(Some(4)).unwrap();
        assert!(out.get_ref().file_keeps_up());
        out.inner.write_all(&vec![7; 2 * CHUNK_BYTES]).unwrap();
        assert!(out.get_ref().file_keeps_up(), "2 of 4 chunks queued");
        out.inner.write_all(&vec![7; CHUNK_BYTES]).unwrap();
        assert!(!out.get_ref().file_keeps_up(), "3 of 4 chunks queued");
        file_end.chunks.recv().unwrap();
        assert!(out.get_ref().file_keeps_up(), "the file thread took one");
        let (out, _file_end) = chunk_pipe(None).unwrap();
        assert!(
            out.get_ref().file_keeps_up(),
            "an unbounded queue never fills"
        );
    }

    #[test]
    fn sections_round_trip_and_corruption_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_atomically(dir.path(), &file_name(7), |out| {
            out.write_u64_le(42)?;
            out.end_section()?;
            out.write_bytes_le(b"state")?;
            out.end_section()
        })
        .unwrap();
        let mut input = open(&path).unwrap();
        assert_eq!(input.read_u64_le().unwrap(), 42);
        input.end_section("a").unwrap();
        assert_eq!(input.read_bytes_le(100).unwrap(), b"state");
        input.end_section("b").unwrap();
        input.finish().unwrap();
        assert_eq!(list(dir.path()).unwrap(), vec![(7, path.clone())]);

        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 6;
        bytes[last] ^= 0x10;
        fs::write(&path, bytes).unwrap();
        let mut input = open(&path).unwrap();
        input.read_u64_le().unwrap();
        input.end_section("a").unwrap();
        input.read_bytes_le(100).unwrap();
        assert!(input.end_section("b").is_err());
    }
}
