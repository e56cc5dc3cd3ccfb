//! Start-up: rebuild each partition from its newest usable snapshot plus the journal after it.

use crate::app::AppSpec;
use crate::archive::{Archive, ArchiveStore};
use crate::core::Core;
use crate::idempotency::IdempotencyTable;
use crate::journal::{JournalError, Log};
use crate::partition::SinceSnapshot;
use crate::record::RecordRef;
use crate::snapshot::{self, SectionReader};
use crate::wire::{ReadLe, WriteLe};
use crate::{AppId, PartitionId, StartError};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The sections of a partition snapshot before the apps'; then come each app's, as its id and its state,
/// the idempotency table's (written in steps by the partition thread, see
/// `PartitionThread::step_snapshot`) and the archive's records not yet in its store.
pub(crate) fn write_partition_header(
    core: &Core,
    out: &mut snapshot::SectionWriter<impl Write>,
) -> io::Result<()> {
    out.write_all(&core.partition.to_le_bytes())?;
    out.write_all(&core.partition_count.to_le_bytes())?;
    out.write_u32_le(core.apps.len() as u32)?;
    out.end_section()?;
    core.write_bookkeeping(out)?;
    out.end_section()
}

fn read_partition_snapshot(
    input: &mut SectionReader<impl Read>,
    core: &mut Core,
    specs: &[AppSpec],
) -> io::Result<()> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let partition = u16::from_le_bytes(input.read_le_array()?);
    let partition_count = u16::from_le_bytes(input.read_le_array()?);
    let app_count = input.read_u32_le()?;
    input.end_section("header")?;
    if partition != core.partition || partition_count != core.partition_count {
        return Err(invalid(format!(
            "snapshot is of partition {partition}/{partition_count}, expected {}/{}",
            core.partition, core.partition_count
        )));
    }
    let format_version = input.format_version();
    core.restore_bookkeeping(input, format_version)?;
    input.end_section("bookkeeping")?;
    for _ in 0..app_count {
        let app = input.read_u8_le()?;
        let spec = specs.iter().find(|s| s.id == app).ok_or_else(|| {
            invalid(format!(
                "snapshot holds state of app {app}, which is not enabled"
            ))
        })?;
        let state = (spec.restore)(core.partition, input)?;
        input.end_section(spec.name)?;
        let slot = core
            .apps
            .iter_mut()
            .find(|(id, _)| *id == app)
            .expect("every enabled app has a slot");
        slot.1 = state;
    }
    if format_version >= 2 {
        core.idempotency().restore(input)?;
        input.end_section("idempotency")?;
    }
    if format_version >= 4 {
        core.archive.restore_snapshot(input, format_version)?;
        input.end_section("archive")?;
    }
    Ok(())
}

fn fresh_core(
    partition: PartitionId,
    partition_count: u16,
    specs: &[AppSpec],
    idempotency: &IdempotencyTable,
    archive: &Option<ArchiveStore>,
) -> Core {
    let apps = specs
        .iter()
        .map(|s| (s.id, (s.new_state)(partition)))
        .collect();
    Core::new(
        partition,
        partition_count,
        apps,
        idempotency.clone(),
        Archive::new(archive.clone()),
    )
}

/// Renames a snapshot that cannot be used to `<name>.damaged`, where the operator finds it and
/// `snapshot::list` does not: counted among the two snapshots kept, it would let the journal be
/// released behind it, and the next damaged snapshot would then have no fallback (found by the
/// simulation, `sim.rs`).
fn set_aside(path: &Path) {
    let mut aside = path.as_os_str().to_owned();
    aside.push(".damaged");
    if let Err(error) = std::fs::rename(path, &aside) {
        tracing::warn!(snapshot = %path.display(), %error, "cannot set the snapshot aside");
    }
}

/// The partition as the snapshot file at `path` holds it, and whether it could be read whole.
pub(crate) fn load_snapshot(
    path: &Path,
    partition: PartitionId,
    partition_count: u16,
    specs: &[AppSpec],
    empty_idempotency: &IdempotencyTable,
    archive: &Option<ArchiveStore>,
) -> (Core, io::Result<()>) {
    let mut core = fresh_core(
        partition,
        partition_count,
        specs,
        empty_idempotency,
        archive,
    );
    let loaded = snapshot::open(path).and_then(|mut input| {
        read_partition_snapshot(&mut input, &mut core, specs)?;
        input.finish()
    });
    (core, loaded)
}

/// Restores the newest snapshot the journal can continue from, then replays the journal after it, and
/// stores what replay archived. Returns the state and what was replayed: the partition's next snapshot
/// falls due counting from there. A snapshot whose last record is not the journal's record at that LSN
/// (one a node fenced off a shared log wrote of records the log never got) is set aside and an older one
/// tried: restored, it would skip the journal's own records up to its LSN.
pub(crate) fn recover_partition(
    partition: PartitionId,
    partition_count: u16,
    specs: &[AppSpec],
    empty_idempotency: &IdempotencyTable,
    archive: &Option<ArchiveStore>,
    log: &dyn Log,
    snapshot_dir: &Path,
) -> Result<(Core, SinceSnapshot), StartError> {
    if let Some(store) = archive {
        store
            .check_within_journal(log.next_lsn())
            .map_err(|error| {
                StartError::Unrecoverable(format!("partition {partition}: {error}"))
            })?;
    }
    // The partition as the newest usable snapshot holds it (but those in `skipped`), with that
    // snapshot's path and size; a fresh partition if the journal starts at its first record and no
    // snapshot is usable.
    let restore_newest =
        |skipped: &[PathBuf]| -> Result<(Core, Option<(PathBuf, u64)>), StartError> {
            for (lsn, path) in snapshot::list(snapshot_dir)? {
                if skipped.contains(&path) {
                    continue;
                }
                if lsn < log.first_lsn() {
                    tracing::warn!(partition, snapshot = %path.display(), "snapshot older than the journal's first record; skipped");
                    continue;
                }
                let (core, loaded) = load_snapshot(
                    &path,
                    partition,
                    partition_count,
                    specs,
                    empty_idempotency,
                    archive,
                );
                // A snapshot is published under its LSN only after the records it covers are durable in
                // the journal: one past the journal's end proves the journal lost acknowledged records
                // (a truncated or damaged segment), whether or not the snapshot itself still reads.
                // Starting from the journal alone, or from an older snapshot, would drop them silently.
                let newer_format =
                    matches!(&loaded, Err(error) if snapshot::is_newer_format(error));
                if lsn > log.next_lsn() && !newer_format {
                    let damaged = match &loaded {
                        Ok(()) if core.next_lsn == lsn => String::new(),
                        Ok(()) => " (and that snapshot disagrees with its name)".to_string(),
                        Err(error) => format!(" (and that snapshot is damaged too: {error})"),
                    };
                    return Err(StartError::Unrecoverable(format!(
                        "partition {partition}: the journal ends at LSN {}, but snapshot {} holds the state \
                 at LSN {lsn}{damaged}: the journal lost {} records that were written (a truncated or \
                 damaged segment). Restore the journal; or, to start from the journal as it is and \
                 lose them, move that snapshot out of {}",
                        log.next_lsn(),
                        path.display(),
                        lsn - log.next_lsn(),
                        snapshot_dir.display()
                    )));
                }
                match loaded {
                    Ok(()) if core.next_lsn == lsn => {
                        let snapshot_bytes = std::fs::metadata(&path).map_or(0, |file| file.len());
                        // An older snapshot would not help: it relies on the store for older records.
                        core.archive.check_store().map_err(|error| {
                            StartError::Unrecoverable(format!(
                                "partition {partition}, snapshot {}: {error}",
                                path.display()
                            ))
                        })?;
                        return Ok((core, Some((path, snapshot_bytes))));
                    }
                    Ok(()) => {
                        tracing::warn!(partition, snapshot = %path.display(), "snapshot LSN disagrees with its name; set aside");
                        set_aside(&path);
                    }
                    // Not damaged: an older snapshot or a replay would start from less than it holds.
                    Err(error) if snapshot::is_newer_format(&error) => {
                        return Err(StartError::Unrecoverable(format!(
                            "partition {partition}: snapshot {} is of {error}",
                            path.display()
                        )));
                    }
                    Err(error) => {
                        tracing::warn!(partition, snapshot = %path.display(), %error, "unreadable snapshot, set aside; trying an older one");
                        set_aside(&path);
                    }
                }
            }
            if log.first_lsn() == 0 {
                let core = fresh_core(
                    partition,
                    partition_count,
                    specs,
                    empty_idempotency,
                    archive,
                );
                return Ok((core, None));
            }
            Err(StartError::Unrecoverable(format!(
                "partition {partition}: no usable snapshot, and the journal starts at LSN {} (earlier records were released)",
                log.first_lsn()
            )))
        };
    let mut not_of_this_log = Vec::new();
    loop {
        let restore_started = Instant::now();
        let (core, restored) = restore_newest(&not_of_this_log)?;
        let restore_ms = restore_started.elapsed().as_millis() as u64;
        let snapshot_bytes = restored.as_ref().map_or(0, |(_, bytes)| *bytes);
        match replay_onto(core, log, snapshot_bytes, restore_ms) {
            Ok(recovered) => return Ok(recovered),
            Err(Replay::NotOfThisLog(reason)) => {
                let (path, _) = restored.expect("only a snapshot's last record is checked");
                tracing::warn!(partition, snapshot = %path.display(), %reason, "snapshot is not of this journal, set aside; trying an older one");
                set_aside(&path);
                not_of_this_log.push(path);
            }
            Err(Replay::Failed(error)) => return Err(error),
        }
    }
}

/// Why a replay onto a restored state ended early.
enum Replay {
    /// The journal's record before the snapshot's LSN is not the one the snapshot was taken after.
    NotOfThisLog(String),
    Failed(StartError),
}

/// Replays the journal after `core`'s LSN onto it. When the snapshot `core` came from names the record
/// it ends at and the journal still holds that record, the replay starts there and checks it first.
fn replay_onto(
    mut core: Core,
    log: &dyn Log,
    snapshot_bytes: u64,
    restore_ms: u64,
) -> Result<(Core, SinceSnapshot), Replay> {
    let partition = core.partition;
    let replay_started = Instant::now();
    let mut events = Vec::new();
    let mut sent = Vec::new();
    let mut archived = Vec::new();
    let from = core.next_lsn;
    let check = core.last_record_random.filter(|_| from > log.first_lsn());
    let mut mismatch = None;
    let mut replayed = SinceSnapshot {
        snapshot_bytes,
        ..SinceSnapshot::default()
    };
    let start = if check.is_some() { from - 1 } else { from };
    let result = log.replay(start, &mut |lsn, kind, body| {
        let corrupt = |reason: String| JournalError::Corrupt {
            path: "journal".into(),
            offset: lsn,
            reason,
        };
        let record =
            RecordRef::decode(kind, body).map_err(|e| corrupt(format!("record {lsn}: {e}")))?;
        if lsn < from {
            let expected = check.expect("only the checked record is before the snapshot's LSN");
            if record.envelope.random != expected {
                mismatch = Some(format!(
                    "its record {lsn} is not the journal's (random {expected:#x}, the journal's {:#x})",
                    record.envelope.random
                ));
                return Err(corrupt("the snapshot is not of this journal".into()));
            }
            return Ok(());
        }
        let app: AppId = record.envelope.app;
        if !core.has_app(app) {
            return Err(corrupt(format!(
                "record {lsn} belongs to app {app}, which is not enabled"
            )));
        }
        debug_assert_eq!(core.next_lsn, lsn);
        events.clear();
        let apply_started = Instant::now();
        // What replay archives is stored at the end, from the archive's memory.
        core.apply(
            &record.envelope,
            record.payload,
            &mut events,
            &mut sent,
            &mut archived,
        );
        // The body only: each frame's few header bytes are left out of the count.
        replayed.add(body.len(), apply_started.elapsed());
        archived.clear();
        debug_assert_eq!(
            events.as_slice(),
            record.raw_events(),
            "apply is not deterministic: replay produced other events"
        );
        sent.clear();
        Ok(())
    });
    if let Some(reason) = mismatch {
        return Err(Replay::NotOfThisLog(reason));
    }
    result.map_err(|error| Replay::Failed(error.into()))?;
    debug_assert_eq!(replayed.records, core.next_lsn - from);
    let replay_ms = replay_started.elapsed().as_millis() as u64;
    let store_started = Instant::now();
    core.archive
        .store_recovered()
        .map_err(|error| Replay::Failed(error.into()))?;
    tracing::info!(
        partition,
        snapshot_lsn = from,
        restore_ms,
        replayed = replayed.records,
        replay_ms,
        replay_apply_ms = replayed.apply_time.as_millis() as u64,
        store_ms = store_started.elapsed().as_millis() as u64,
        "partition recovered"
    );
    Ok((core, replayed))
}
