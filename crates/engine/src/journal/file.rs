//! The embedded journal: one directory of segment files per partition.
//!
//! A segment is named after the LSN of its first record (`00000000000000000042.seg`) and holds whole frames
//! back to back. Group commits never span segments, so a torn write can only damage the tail of the newest
//! segment; anything else that fails its checksum is corruption and stops start-up.
//!
//! A new segment is preallocated to `segment_bytes` (`fallocate`), and appends write in place: then
//! `fdatasync` need not also commit a new file size through the filesystem's journal (on ext4 a 1-record
//! commit went from 156 to 127 us in `cargo bench -p spate-engine --bench journal`, BENCHMARKS.md). The unused
//! rest of a segment reads as zeros; a frame never starts with a zero length, so the first all-zero byte
//! after the last record ends the segment.

use super::{Durability, JournalError, Log, LogStore, Lsn, Visit};
use crate::PartitionId;
use crate::record::{Frame, read_frame};
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const SEGMENT_SUFFIX: &str = ".seg";

#[derive(Debug, Clone)]
pub struct JournalConfig {
    pub durability: Durability,
    /// A segment is closed and a new one started once it holds at least this many bytes.
    pub segment_bytes: u64,
    /// Keep every record forever (an event store whose read models can be rebuilt from the first event)
    /// instead of releasing what snapshots and projection checkpoints cover.
    pub keep_all: bool,
}

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            durability: Durability::Fsync,
            segment_bytes: 64 * 1024 * 1024,
            keep_all: false,
        }
    }
}

/// What recovery found and did when the journal was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments: usize,
    /// Bytes cut from the end of the newest segment (up to the last one ever written).
    pub torn_tail_bytes: u64,
    /// The records those bytes began, the first at LSN [`Self::cut_from_lsn`]. Records a cut file
    /// lost entirely are not counted: nothing of them is left (a snapshot past the journal's end
    /// catches that, see `recovery.rs`).
    pub cut_records: u64,
    pub cut_from_lsn: Lsn,
    /// Why, as far as can be told: [`TORN_WRITE`] or [`DAMAGED_RECORD`]; empty when nothing was cut.
    pub cut_cause: &'static str,
}

/// The first record cut is not one byte away from whole: most likely a write a crash cut short.
pub const TORN_WRITE: &str = "a torn write: a group commit interrupted by a crash";
/// The first record cut is whole but for one byte: something changed it after it was written.
pub const DAMAGED_RECORD: &str = "a damaged record: one byte of it differs from what was written";

/// The longest record [`one_byte_from_whole`] judges. Not for speed: a record's one-byte variants
/// reach about 255 x its length of the 2^32 checksums, so a longer torn record would too often look
/// one byte from whole by chance (1 in 16,000 at this length; 1 in 16 at 1 MiB). A longer one is
/// reported as torn, the likelier cause.
const DAMAGE_SEARCH_BYTES_MAX: usize = 1024;

/// True if changing one byte after the length field of the record at the start of `bytes` makes it
/// whole: a changed byte, not a write cut short (which leaves the record's end unwritten: zeros, in a
/// preallocated segment). Records over [`DAMAGE_SEARCH_BYTES_MAX`] are not judged.
fn one_byte_from_whole(bytes: &[u8]) -> bool {
    let Some(length_bytes) = bytes.get(..4) else {
        return false;
    };
    let length = u32::from_le_bytes(length_bytes.try_into().expect("4 bytes")) as usize;
    let total = crate::record::FRAME_HEADER_BYTES + length;
    length != 0
        && total <= DAMAGE_SEARCH_BYTES_MAX
        && total <= bytes.len()
        && crate::record::one_byte_from_valid(&bytes[..total])
}

/// Counts the records the cut bytes `written` began (each from its declared length, until one does
/// not parse or runs past them), and tells damage from a torn write (see [`one_byte_from_whole`];
/// `rest` is the segment from the first cut byte on, its never-written end included).
fn describe_cut(written: &[u8], rest: &[u8]) -> (u64, &'static str) {
    let cause = if one_byte_from_whole(rest) {
        DAMAGED_RECORD
    } else {
        TORN_WRITE
    };
    let mut records = 0;
    let mut offset = 0;
    while offset < written.len() {
        records += 1;
        let Some(length_bytes) = written.get(offset..offset + 4) else {
            break;
        };
        let length = u32::from_le_bytes(length_bytes.try_into().expect("4 bytes")) as usize;
        if length == 0 || length > crate::record::RECORD_BYTES_MAX {
            break;
        }
        offset += crate::record::FRAME_HEADER_BYTES + length;
    }
    (records, cause)
}

#[derive(Debug)]
struct Segment {
    first_lsn: Lsn,
    path: PathBuf,
}

pub struct FileJournal {
    dir: PathBuf,
    config: JournalConfig,
    segments: Vec<Segment>,
    current: File,
    current_bytes: u64,
    next_lsn: Lsn,
    failed: bool,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn segment_path(dir: &Path, first_lsn: Lsn) -> PathBuf {
    dir.join(format!("{first_lsn:020}{SEGMENT_SUFFIX}"))
}

/// Makes a directory entry (a new or deleted file) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))
}

/// Reserves `bytes` for a segment. Best effort: where the filesystem cannot, appends grow the file as
/// they would without it.
fn preallocate(file: &File, bytes: u64) {
    let len = libc::off_t::try_from(bytes).unwrap_or(libc::off_t::MAX);
    // SAFETY: fallocate on a descriptor this `File` owns; mode 0 allocates and extends the size.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "journal segment not preallocated");
    }
}

/// True if nothing was ever written from here on: the preallocated rest of a segment.
fn unused(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// Walks the frames of a segment's bytes, up to the unused rest. Returns the number of whole valid records and the offset where
/// they end; `Err` with the offset and reason of the first bad frame, if any.
fn scan_frames(
    bytes: &[u8],
    mut visit: impl FnMut(u8, &[u8]) -> Result<(), JournalError>,
) -> Result<(u64, usize), (usize, &'static str, Option<JournalError>)> {
    let mut offset = 0;
    let mut count = 0;
    while offset < bytes.len() {
        // Zeros to the end are the unused rest of a preallocated segment, however few: records can end
        // one to three bytes before it, where a zero length field would not fit (found by the
        // simulation, `sim.rs`: such a journal could not be replayed). Anything else that starts
        // with a zero is a record or damage.
        if bytes[offset] == 0 && unused(&bytes[offset..]) {
            break;
        }
        match read_frame(&bytes[offset..]) {
            Frame::Valid {
                kind,
                body,
                total_bytes,
            } => {
                visit(kind, body).map_err(|e| (offset, "visit failed", Some(e)))?;
                offset += total_bytes;
                count += 1;
            }
            Frame::Incomplete => return Err((offset, "incomplete record", None)),
            Frame::Corrupt => return Err((offset, "checksum mismatch or impossible length", None)),
        }
    }
    Ok((count, offset))
}

/// Bytes read at a time by [`read_range`].
const READ_CHUNK_BYTES: u64 = 1 << 20;

/// The segment files of the journal in `dir`, oldest first.
fn list_segments(dir: &Path) -> Result<Vec<Segment>, JournalError> {
    let mut segments = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let path = entry.map_err(io_error(dir))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) else {
            continue;
        };
        let first_lsn = stem.parse::<Lsn>().map_err(|_| JournalError::Corrupt {
            path: path.clone(),
            offset: 0,
            reason: "segment file name is not an LSN".into(),
        })?;
        segments.push(Segment { first_lsn, path });
    }
    segments.sort_by_key(|s| s.first_lsn);
    Ok(segments)
}

/// The embedded journals: one [`FileJournal`] per partition under `<data-dir>/partitions/pNNN/journal`.
pub struct FileLogStore {
    data_dir: PathBuf,
    config: JournalConfig,
}

impl FileLogStore {
    pub fn new(data_dir: impl Into<PathBuf>, config: JournalConfig) -> Self {
        Self {
            data_dir: data_dir.into(),
            config,
        }
    }

    fn dir(&self, partition: PartitionId) -> PathBuf {
        crate::partition_dir(&self.data_dir, partition).join("journal")
    }
}

impl LogStore for FileLogStore {
    /// The snapshots are already in the data directory, beside the journal.
    fn open(&self, partition: PartitionId, _: &Path) -> Result<Box<dyn Log>, JournalError> {
        let (journal, report) = FileJournal::open(&self.dir(partition), self.config.clone())?;
        if report.torn_tail_bytes > 0 {
            tracing::warn!(
                partition,
                cut_bytes = report.torn_tail_bytes,
                cut_records = report.cut_records,
                cut_from_lsn = report.cut_from_lsn,
                cause = report.cut_cause,
                "recovered the journal by cutting its tail; the records cut were never acknowledged \
                 if the cause is a torn write"
            );
        }
        Ok(Box::new(journal))
    }

    fn read_range(
        &self,
        partition: PartitionId,
        from: Lsn,
        until: Lsn,
        visit: &mut Visit<'_>,
    ) -> Result<(), JournalError> {
        read_range(&self.dir(partition), from, until, visit)
    }
}

/// Calls `visit` with the records `from..until` of the journal in `dir`, while its writer may be
/// appending: for a projection reading durable records its feed did not bring. Records below `until` must
/// be durable (so whole on disk), and the segments holding them kept (the projection's checkpoint floor).
fn read_range(
    dir: &Path,
    from: Lsn,
    until: Lsn,
    visit: &mut Visit<'_>,
) -> Result<(), JournalError> {
    let segments = list_segments(dir)?;
    let mut lsn = from;
    for (index, segment) in segments.iter().enumerate() {
        let end_lsn = segments
            .get(index + 1)
            .map_or(Lsn::MAX, |next| next.first_lsn);
        if lsn >= until {
            break;
        }
        if end_lsn <= lsn || segment.first_lsn > lsn {
            continue;
        }
        let mut file = File::open(&segment.path).map_err(io_error(&segment.path))?;
        let (mut bytes, mut offset) = (Vec::new(), 0);
        let mut at = segment.first_lsn;
        while at < until.min(end_lsn) {
            match read_frame(&bytes[offset..]) {
                Frame::Valid {
                    kind,
                    body,
                    total_bytes,
                } => {
                    if at >= lsn {
                        visit(at, kind, body)?;
                    }
                    offset += total_bytes;
                    at += 1;
                }
                Frame::Incomplete => {
                    // Read on only as far as the records asked for: the segment may be 64 MiB of mostly
                    // unused space.
                    bytes.drain(..offset);
                    offset = 0;
                    let read = (&mut file)
                        .take(READ_CHUNK_BYTES)
                        .read_to_end(&mut bytes)
                        .map_err(io_error(&segment.path))?;
                    if read == 0 {
                        return Err(JournalError::Gap(format!(
                            "{} ends at record {at}, below the durable LSN {until}",
                            segment.path.display()
                        )));
                    }
                }
                Frame::Corrupt => {
                    return Err(JournalError::Corrupt {
                        path: segment.path.clone(),
                        offset: offset as u64,
                        reason: format!("record {at} below the durable LSN {until} is damaged"),
                    });
                }
            }
        }
        lsn = at;
    }
    if lsn < until {
        return Err(JournalError::Gap(format!(
            "{} holds no records {lsn}..{until}",
            dir.display()
        )));
    }
    Ok(())
}

/// True if a valid frame starts anywhere after `from`: then a bad frame at `from` is damage in the middle of
/// the log, not a torn tail.
fn valid_frame_after(bytes: &[u8], from: usize) -> Option<usize> {
    (from + 1..bytes.len()).find(|&at| matches!(read_frame(&bytes[at..]), Frame::Valid { .. }))
}

/// A new, empty, preallocated segment whose size is durable (the caller syncs the directory).
fn create_segment(path: &Path, segment_bytes: u64) -> Result<File, JournalError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io_error(path))?;
    preallocate(&file, segment_bytes);
    file.sync_all().map_err(io_error(path))?;
    Ok(file)
}

impl FileJournal {
    /// Opens (or creates) the journal in `dir`, truncating a torn tail of the newest segment.
    pub fn open(dir: &Path, config: JournalConfig) -> Result<(Self, RecoveryReport), JournalError> {
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let mut segments = list_segments(dir)?;
        let mut report = RecoveryReport {
            segments: segments.len(),
            ..RecoveryReport::default()
        };

        if segments.is_empty() {
            let path = segment_path(dir, 0);
            let current = create_segment(&path, config.segment_bytes)?;
            sync_dir(dir)?;
            segments.push(Segment { first_lsn: 0, path });
            report.segments = 1;
            let journal = Self {
                dir: dir.to_path_buf(),
                config,
                segments,
                current,
                current_bytes: 0,
                next_lsn: 0,
                failed: false,
            };
            return Ok((journal, report));
        }

        let last = segments.last().expect("at least one segment");
        let bytes = fs::read(&last.path).map_err(io_error(&last.path))?;
        let (count, valid_bytes) = match scan_frames(&bytes, |_, _| Ok(())) {
            Ok(done) => done,
            Err((offset, reason, _)) => {
                if let Some(next) = valid_frame_after(&bytes, offset) {
                    return Err(JournalError::Corrupt {
                        path: last.path.clone(),
                        offset: offset as u64,
                        reason: format!("{reason}, followed by a valid record at byte {next}"),
                    });
                }
                let (count, _) =
                    scan_frames(&bytes[..offset], |_, _| Ok(())).expect("prefix was valid");
                (count, offset)
            }
        };
        let current = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&last.path)
            .map_err(io_error(&last.path))?;
        // Bytes written after the last whole record: a group commit the crash interrupted.
        let torn_bytes = bytes[valid_bytes..]
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |last_written| last_written + 1);
        if torn_bytes > 0 {
            let (records, cause) = describe_cut(
                &bytes[valid_bytes..valid_bytes + torn_bytes],
                &bytes[valid_bytes..],
            );
            report.torn_tail_bytes = torn_bytes as u64;
            report.cut_records = records;
            report.cut_from_lsn = last.first_lsn + count;
            report.cut_cause = cause;
            tracing::warn!(
                segment = %last.path.display(),
                offset = valid_bytes,
                cut_bytes = report.torn_tail_bytes,
                cut_records = records,
                cut_from_lsn = report.cut_from_lsn,
                "cutting the end of the journal: {cause}"
            );
            current
                .set_len(valid_bytes as u64)
                .map_err(io_error(&last.path))?;
        }
        preallocate(&current, config.segment_bytes);
        current.sync_all().map_err(io_error(&last.path))?;
        let next_lsn = last.first_lsn + count;
        let journal = Self {
            dir: dir.to_path_buf(),
            config,
            segments,
            current,
            current_bytes: valid_bytes as u64,
            next_lsn,
            failed: false,
        };
        Ok((journal, report))
    }

    fn roll_segment(&mut self) -> Result<(), JournalError> {
        // The old segment's data is already durable: every append synced it (or durability is none).
        let path = segment_path(&self.dir, self.next_lsn);
        self.current = create_segment(&path, self.config.segment_bytes)?;
        sync_dir(&self.dir)?;
        self.segments.push(Segment {
            first_lsn: self.next_lsn,
            path,
        });
        self.current_bytes = 0;
        Ok(())
    }

    fn append_inner(&mut self, frames: &[u8], record_count: u64) -> Result<(), JournalError> {
        if self.current_bytes >= self.config.segment_bytes {
            if self.config.durability == Durability::None {
                self.current
                    .sync_data()
                    .map_err(io_error(&self.segments.last().expect("segment").path))?;
            }
            self.roll_segment()?;
        }
        let path = &self.segments.last().expect("at least one segment").path;
        self.current
            .write_all_at(frames, self.current_bytes)
            .map_err(io_error(path))?;
        if self.config.durability == Durability::Fsync {
            self.current.sync_data().map_err(io_error(path))?;
        }
        self.current_bytes += frames.len() as u64;
        self.next_lsn += record_count;
        Ok(())
    }
}

impl Log for FileJournal {
    fn next_lsn(&self) -> Lsn {
        self.next_lsn
    }

    fn first_lsn(&self) -> Lsn {
        self.segments.first().map_or(self.next_lsn, |s| s.first_lsn)
    }

    fn append(&mut self, frames: &[u8], record_count: u64) -> Result<(), JournalError> {
        if self.failed {
            return Err(JournalError::Failed);
        }
        debug_assert!(
            record_count > 0 && !frames.is_empty(),
            "empty appends are the caller's to skip"
        );
        let result = self.append_inner(frames, record_count);
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    fn replay(&self, from: Lsn, visit: &mut Visit<'_>) -> Result<(), JournalError> {
        if from < self.first_lsn() || from > self.next_lsn {
            return Err(JournalError::Gap(format!(
                "replay from LSN {from} but the journal holds {}..{}",
                self.first_lsn(),
                self.next_lsn
            )));
        }
        for (index, segment) in self.segments.iter().enumerate() {
            let end_lsn = self
                .segments
                .get(index + 1)
                .map_or(self.next_lsn, |next| next.first_lsn);
            if end_lsn <= from {
                continue;
            }
            let bytes = fs::read(&segment.path).map_err(io_error(&segment.path))?;
            let mut lsn = segment.first_lsn;
            let scanned = scan_frames(&bytes, |kind, body| {
                let at = lsn;
                lsn += 1;
                if at >= from && at < end_lsn {
                    visit(at, kind, body)
                } else {
                    Ok(())
                }
            });
            match scanned {
                Ok(_) => {}
                Err((_, _, Some(visit_error))) => return Err(visit_error),
                Err((offset, reason, None)) => {
                    return Err(JournalError::Corrupt {
                        path: segment.path.clone(),
                        offset: offset as u64,
                        reason: reason.into(),
                    });
                }
            }
            if lsn != end_lsn {
                return Err(JournalError::Gap(format!(
                    "{} holds records {}..{lsn} but the next segment starts at {end_lsn}",
                    segment.path.display(),
                    segment.first_lsn
                )));
            }
        }
        Ok(())
    }

    fn release_before(&mut self, lsn: Lsn) -> Result<(), JournalError> {
        if self.config.keep_all {
            return Ok(());
        }
        let mut removed = false;
        // A segment can go when the next one starts at or below `lsn`; the newest segment always stays.
        while self.segments.len() > 1 && self.segments[1].first_lsn <= lsn {
            let segment = self.segments.remove(0);
            fs::remove_file(&segment.path).map_err(io_error(&segment.path))?;
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<(), JournalError> {
        if self.failed {
            return Err(JournalError::Failed);
        }
        let path = &self.segments.last().expect("at least one segment").path;
        self.current.sync_all().map_err(io_error(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Envelope, Origin, begin_record, finish_record};

    fn frames(range: std::ops::Range<u64>) -> Vec<u8> {
        let mut buf = Vec::new();
        for id in range {
            let envelope = Envelope {
                app: 1,
                origin: Origin::Client {
                    command_id: Some(id as u128),
                },
                timestamp_ms: id,
                random: 0,
            };
            let start = begin_record(&mut buf, &envelope, &id.to_le_bytes());
            finish_record(&mut buf, start);
        }
        buf
    }

    fn collect(journal: &FileJournal, from: Lsn) -> Vec<Lsn> {
        let mut seen = Vec::new();
        journal
            .replay(from, &mut |lsn, _, _| {
                seen.push(lsn);
                Ok(())
            })
            .unwrap();
        seen
    }

    /// A journal in `dir` with records 0..30, appended in groups of 3.
    fn thirty_records(dir: &Path, config: JournalConfig) -> FileJournal {
        let (mut journal, _) = FileJournal::open(dir, config).unwrap();
        for batch in 0..10 {
            journal
                .append(&frames(batch * 3..batch * 3 + 3), 3)
                .unwrap();
        }
        journal
    }

    fn small_segments() -> JournalConfig {
        JournalConfig {
            durability: Durability::Fsync,
            segment_bytes: 200,
            keep_all: false,
        }
    }

    #[test]
    fn appends_roll_segments_and_replay_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let journal = thirty_records(dir.path(), small_segments());
        assert!(journal.segments.len() > 3, "small segments should roll");
        assert_eq!(collect(&journal, 0), (0..30).collect::<Vec<_>>());
        assert_eq!(collect(&journal, 17), (17..30).collect::<Vec<_>>());
        drop(journal);
        let (journal, report) = FileJournal::open(dir.path(), small_segments()).unwrap();
        assert_eq!(report.torn_tail_bytes, 0);
        assert_eq!(journal.next_lsn(), 30);
    }

    #[test]
    fn records_that_end_a_few_bytes_before_the_preallocated_end_are_read() {
        let record_bytes = frames(0..1).len() as u64;
        for spare in 1..=4 {
            let dir = tempfile::tempdir().unwrap();
            let config = JournalConfig {
                segment_bytes: 2 * record_bytes + spare,
                ..small_segments()
            };
            let (mut journal, _) = FileJournal::open(dir.path(), config.clone()).unwrap();
            journal.append(&frames(0..2), 2).unwrap();
            drop(journal);
            let (journal, report) = FileJournal::open(dir.path(), config).unwrap();
            assert_eq!(report.torn_tail_bytes, 0, "{spare} bytes to spare");
            assert_eq!(collect(&journal, 0), vec![0, 1], "{spare} bytes to spare");
        }
    }

    #[test]
    fn release_before_keeps_every_record_at_or_after_the_lsn() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = thirty_records(dir.path(), small_segments());
        journal.release_before(20).unwrap();
        assert!(journal.first_lsn() > 0 && journal.first_lsn() <= 20);
        assert_eq!(collect(&journal, 20), (20..30).collect::<Vec<_>>());
        assert!(
            journal.replay(0, &mut |_, _, _| Ok(())).is_err(),
            "released records cannot be replayed"
        );
    }

    #[test]
    fn a_journal_that_keeps_all_releases_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let config = JournalConfig {
            keep_all: true,
            ..small_segments()
        };
        let mut journal = thirty_records(dir.path(), config);
        journal.release_before(20).unwrap();
        assert_eq!(journal.first_lsn(), 0);
        assert_eq!(collect(&journal, 0), (0..30).collect::<Vec<_>>());
    }

    #[test]
    fn read_range_reads_durable_records_of_any_segment() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = thirty_records(dir.path(), small_segments());
        let mut seen = Vec::new();
        read_range(dir.path(), 7, 23, &mut |lsn, _, _| {
            seen.push(lsn);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, (7..23).collect::<Vec<_>>());
        assert!(
            read_range(dir.path(), 25, 31, &mut |_, _, _| Ok(())).is_err(),
            "31 is not written"
        );
        journal.release_before(20).unwrap();
        assert!(
            read_range(dir.path(), 0, 5, &mut |_, _, _| Ok(())).is_err(),
            "0..5 were released"
        );
    }

    /// A journal of 18 records in groups of 3, spread over several small segments.
    fn eighteen_records_in_small_segments(dir: &Path) -> FileJournal {
        let (mut journal, _) = FileJournal::open(dir, small_segments()).unwrap();
        for batch in 0..6 {
            journal
                .append(&frames(batch * 3..batch * 3 + 3), 3)
                .unwrap();
        }
        journal
    }

    #[test]
    fn a_gap_between_segments_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let journal = eighteen_records_in_small_segments(dir.path());
        let middle = journal.segments[1].path.clone();
        drop(journal);
        fs::remove_file(middle).unwrap();
        let (journal, _) = FileJournal::open(dir.path(), small_segments()).unwrap();
        assert!(matches!(
            journal.replay(0, &mut |_, _, _| Ok(())),
            Err(JournalError::Gap(_))
        ));
    }

    fn one_segment_journal(records: u64) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) = FileJournal::open(dir.path(), JournalConfig::default()).unwrap();
        let bytes = frames(0..records);
        journal.append(&bytes, records).unwrap();
        let path = journal.segments[0].path.clone();
        (dir, path, bytes)
    }

    #[test]
    fn a_torn_tail_is_truncated_and_every_complete_record_recovered() {
        let (dir, path, bytes) = one_segment_journal(10);
        let record_bytes = bytes.len() / 10;
        for cut in [1, record_bytes / 2, record_bytes - 1] {
            fs::write(&path, &bytes[..bytes.len() - cut]).unwrap();
            let (journal, report) =
                FileJournal::open(dir.path(), JournalConfig::default()).unwrap();
            // Counted up to the last non-zero byte: zeros the torn record ends with look unused.
            let torn = report.torn_tail_bytes;
            assert!(torn > 0 && torn <= (record_bytes - cut) as u64, "{torn}");
            let cut_report = (report.cut_records, report.cut_from_lsn, report.cut_cause);
            assert_eq!(cut_report, (1, 9, TORN_WRITE), "cut {cut}");
            assert_eq!(collect(&journal, 0), (0..9).collect::<Vec<_>>());
            let on_disk = fs::read(&path).unwrap();
            assert_eq!(&on_disk[..record_bytes * 9], &bytes[..record_bytes * 9]);
            assert!(unused(&on_disk[record_bytes * 9..]), "tail cut on disk too");
        }
    }

    #[test]
    fn a_flipped_byte_in_the_last_record_is_cut_and_reported_as_damage() {
        let (dir, path, mut bytes) = one_segment_journal(10);
        let record_bytes = bytes.len() / 10;
        bytes[record_bytes * 9 + record_bytes / 2] ^= 0x40;
        fs::write(&path, &bytes).unwrap();
        let (journal, report) = FileJournal::open(dir.path(), JournalConfig::default()).unwrap();
        let cut_report = (report.cut_records, report.cut_from_lsn, report.cut_cause);
        assert_eq!(cut_report, (1, 9, DAMAGED_RECORD));
        assert_eq!(collect(&journal, 0), (0..9).collect::<Vec<_>>());
    }

    #[test]
    fn zeros_after_the_last_record_are_unused_space_and_appends_go_there() {
        let (dir, path, mut bytes) = one_segment_journal(3);
        bytes.extend_from_slice(&[0; 4096]);
        fs::write(&path, &bytes).unwrap();
        let (mut journal, report) =
            FileJournal::open(dir.path(), JournalConfig::default()).unwrap();
        assert_eq!(report.torn_tail_bytes, 0);
        assert_eq!(journal.next_lsn(), 3);
        journal.append(&frames(3..5), 2).unwrap();
        drop(journal);
        let (journal, report) = FileJournal::open(dir.path(), JournalConfig::default()).unwrap();
        assert_eq!(report.torn_tail_bytes, 0);
        assert_eq!(collect(&journal, 0), (0..5).collect::<Vec<_>>());
    }

    #[test]
    fn garbage_after_the_last_record_is_cut_even_within_unused_space() {
        let (dir, path, bytes) = one_segment_journal(3);
        let mut on_disk = bytes.clone();
        on_disk.extend_from_slice(&[7; 10]);
        on_disk.extend_from_slice(&[0; 1000]);
        fs::write(&path, &on_disk).unwrap();
        let (mut journal, report) =
            FileJournal::open(dir.path(), JournalConfig::default()).unwrap();
        assert_eq!(report.torn_tail_bytes, 10);
        journal.append(&frames(3..4), 1).unwrap();
        drop(journal);
        let (journal, report) = FileJournal::open(dir.path(), JournalConfig::default()).unwrap();
        assert_eq!(report.torn_tail_bytes, 0);
        assert_eq!(collect(&journal, 0), (0..4).collect::<Vec<_>>());
    }

    #[test]
    fn a_flipped_bit_in_the_middle_stops_start_up() {
        let (dir, path, mut bytes) = one_segment_journal(10);
        let record_bytes = bytes.len() / 10;
        bytes[record_bytes * 4 + 20] ^= 0x04;
        fs::write(&path, &bytes).unwrap();
        let error = FileJournal::open(dir.path(), JournalConfig::default())
            .err()
            .expect("must refuse");
        assert!(
            matches!(error, JournalError::Corrupt { offset, .. } if offset == (record_bytes * 4) as u64),
            "{error}"
        );
    }

    #[test]
    fn a_flipped_bit_in_an_older_segment_stops_replay() {
        let dir = tempfile::tempdir().unwrap();
        let journal = eighteen_records_in_small_segments(dir.path());
        let first = journal.segments[0].path.clone();
        drop(journal);
        let mut bytes = fs::read(&first).unwrap();
        bytes[30] ^= 0x80;
        fs::write(&first, bytes).unwrap();
        let (journal, _) = FileJournal::open(dir.path(), small_segments()).unwrap();
        assert!(matches!(
            journal.replay(0, &mut |_, _, _| Ok(())),
            Err(JournalError::Corrupt { .. })
        ));
    }
}
