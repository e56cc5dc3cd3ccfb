//! `spate.meta`: the partition count a data directory was created with, and the format version of what
//! it holds.
//!
//! Keys were placed by the partition count, so it can never change: a server started with another count
//! would look for every key in the wrong partition and answer 404 for acknowledged data. The partitions'
//! directories (`partitions/pNNN`) say the same thing a second way, so a missing or edited `spate.meta`
//! is caught too.
//!
//! The format version covers everything in the directory whose encoding a binary must know: journal
//! records and the events in them, snapshots and read-model checkpoints. A change to any of them that an
//! older binary would misread raises [`DATA_FORMAT_VERSION`]; a binary refuses a directory of a newer
//! version, naming both, rather than misread it (snapshots and checkpoints also carry a version of their
//! container, see `snapshot.rs`). A directory from before versions were recorded is version 1.
//!
//! Versions:
//! 1. everything written until 2026-11-26;
//! 2. fraud generates a history in parts (a command an older binary cannot decode).
//!
//! Nothing is written unless the start goes on.

use crate::StartError;
use crate::journal::JournalError;
use std::path::Path;

const META_FILE: &str = "spate.meta";

/// The format version of the data this binary writes, and the newest it reads.
pub const DATA_FORMAT_VERSION: u32 = 2;

/// What `spate.meta` records.
#[derive(Debug, PartialEq, Eq)]
struct Recorded {
    partitions: u16,
    format_version: u32,
}

impl Recorded {
    fn to_text(&self) -> String {
        format!(
            "partitions = {}\nformat_version = {}\n",
            self.partitions, self.format_version
        )
    }

    /// Reads `text`; a file without `format_version` was written before versions were recorded (1).
    fn parse(text: &str) -> Result<Self, String> {
        let mut partitions = None;
        let mut format_version = None;
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            let (key, value) = (line.split_once('='))
                .map(|(key, value)| (key.trim(), value.trim()))
                .ok_or_else(|| format!("the line {line:?} is not `key = value`"))?;
            let bad_value = || format!("{key} = {value:?} is not a number");
            match key {
                "partitions" => partitions = Some(value.parse().map_err(|_| bad_value())?),
                "format_version" => format_version = Some(value.parse().map_err(|_| bad_value())?),
                _ => return Err(format!("unknown key {key:?}")),
            }
        }
        Ok(Self {
            partitions: partitions.ok_or("no `partitions` line")?,
            format_version: format_version.unwrap_or(1),
        })
    }
}

/// Checks `partitions` against what `data_dir` was created with, and records it in a new data
/// directory. `every_partition_here` is true when every partition keeps a directory on this disk
/// (an embedded journal); a cluster node keeps the directories of the partitions it has run only.
pub(crate) fn check(
    data_dir: &Path,
    partitions: u16,
    every_partition_here: bool,
) -> Result<(), StartError> {
    let path = data_dir.join(META_FILE);
    let io = |source| JournalError::Io {
        path: path.clone(),
        source,
    };
    let expected = Recorded {
        partitions,
        format_version: DATA_FORMAT_VERSION,
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(io(source).into()),
    };
    let found = (text.as_deref().map(Recorded::parse).transpose())
        .map_err(|e| StartError::Config(format!("{} cannot be read: {e}", path.display())))?;
    if let Some(found) = &found {
        if found.format_version > DATA_FORMAT_VERSION {
            return Err(StartError::Config(format!(
                "{} holds data of format version {}, written by a newer spate; this binary \
                 (spate {}) reads format versions 1 to {DATA_FORMAT_VERSION}; run a binary at least \
                 as new as the one that wrote it",
                data_dir.display(),
                found.format_version,
                env!("CARGO_PKG_VERSION"),
            )));
        }
        if found.partitions != partitions {
            return Err(StartError::Config(format!(
                "{} was created with `partitions = {}`, but {partitions} partitions were requested; \
                 the partition count of a data directory cannot change",
                data_dir.display(),
                found.partitions
            )));
        }
    }
    let recorded = found.is_some();
    let on_disk = partition_dirs(data_dir)?;
    if let Some(&highest) = on_disk.last() {
        let fewer = highest >= partitions;
        // A recorded count may have more partitions than directories: each is made when its journal
        // is first opened, after this file is written.
        let more = every_partition_here && !recorded && on_disk.len() != usize::from(partitions);
        if fewer || more {
            return Err(StartError::Config(format!(
                "{partitions} partitions were requested, but {} holds the directories of {} \
                 partitions (p000 to p{highest:03}){}; the partition count of a data directory \
                 cannot change",
                data_dir.join("partitions").display(),
                on_disk.len(),
                if recorded {
                    String::new()
                } else {
                    format!(" and no {META_FILE}")
                }
            )));
        }
    }
    if !recorded && !on_disk.is_empty() {
        tracing::warn!(
            partitions,
            "{META_FILE} was missing in {}; its partitions' directories agree with the count \
             requested, so it is written again",
            data_dir.display()
        );
    }
    let expected = expected.to_text();
    // New, missing, or from before versions were recorded.
    if text.as_deref() != Some(expected.as_str()) {
        std::fs::write(&path, expected).map_err(io)?;
        crate::journal::sync_dir(data_dir)?;
    }
    Ok(())
}

/// The partition numbers that have a directory under `data_dir`, in order.
fn partition_dirs(data_dir: &Path) -> Result<Vec<u16>, StartError> {
    let root = data_dir.join("partitions");
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(JournalError::Io { path: root, source }.into()),
    };
    let mut partitions = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| JournalError::Io {
            path: root.clone(),
            source,
        })?;
        let name = entry.file_name();
        let number = (name.to_str())
            .and_then(|name| name.strip_prefix('p'))
            .filter(|digits| digits.len() == 3)
            .and_then(|digits| digits.parse::<u16>().ok());
        if let Some(number) = number {
            partitions.push(number);
        }
    }
    partitions.sort_unstable();
    Ok(partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_partition_dirs(count: u16) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for partition in 0..count {
            std::fs::create_dir_all(crate::partition_dir(dir.path(), partition)).unwrap();
        }
        dir
    }

    fn meta(dir: &Path) -> Option<String> {
        std::fs::read_to_string(dir.join(META_FILE)).ok()
    }

    #[test]
    fn a_new_data_directory_records_its_count() {
        let dir = tempfile::tempdir().unwrap();
        check(dir.path(), 3, true).unwrap();
        assert_eq!(
            meta(dir.path()).as_deref(),
            Some(format!("partitions = 3\nformat_version = {DATA_FORMAT_VERSION}\n").as_str())
        );
        check(dir.path(), 3, true).unwrap();
        assert!(check(dir.path(), 2, true).is_err());
    }

    #[test]
    fn without_its_meta_file_the_partition_directories_decide() {
        let dir = with_partition_dirs(2);
        for wrong in [1, 3] {
            let error = check(dir.path(), wrong, true).unwrap_err().to_string();
            assert!(error.contains("holds the directories of 2"), "{error}");
            assert!(error.contains("no spate.meta"), "{error}");
            assert_eq!(meta(dir.path()), None, "a refused start wrote the file");
        }
        check(dir.path(), 2, true).unwrap();
        assert_eq!(
            meta(dir.path()).as_deref(),
            Some(format!("partitions = 2\nformat_version = {DATA_FORMAT_VERSION}\n").as_str())
        );
    }

    #[test]
    fn a_meta_file_that_disagrees_with_the_directories_is_refused() {
        let dir = with_partition_dirs(4);
        std::fs::write(dir.path().join(META_FILE), "partitions = 2\n").unwrap();
        assert!(check(dir.path(), 2, true).is_err());
        assert_eq!(meta(dir.path()).as_deref(), Some("partitions = 2\n"));
    }

    #[test]
    fn a_cluster_node_may_hold_fewer_partitions_than_the_count() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(crate::partition_dir(dir.path(), 1)).unwrap();
        check(dir.path(), 4, false).unwrap();
        let other = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(crate::partition_dir(other.path(), 5)).unwrap();
        assert!(check(other.path(), 4, false).is_err());
        assert_eq!(meta(other.path()), None);
    }

    #[test]
    fn a_directory_of_a_newer_format_is_refused_and_an_older_one_is_read() {
        let dir = with_partition_dirs(2);
        let newer = "partitions = 2\nformat_version = 7\n";
        std::fs::write(dir.path().join(META_FILE), newer).unwrap();
        let error = check(dir.path(), 2, true).unwrap_err().to_string();
        assert!(error.contains("format version 7"), "{error}");
        let readable = format!("reads format versions 1 to {DATA_FORMAT_VERSION}");
        assert!(error.contains(&readable), "{error}");
        assert_eq!(meta(dir.path()).as_deref(), Some(newer), "left as it was");
        // Written before versions were recorded: version 1, read, and recorded as this binary's, since
        // it may now write what an older binary cannot read.
        std::fs::write(dir.path().join(META_FILE), "partitions = 2\n").unwrap();
        check(dir.path(), 2, true).unwrap();
        assert_eq!(
            meta(dir.path()).as_deref(),
            Some(format!("partitions = 2\nformat_version = {DATA_FORMAT_VERSION}\n").as_str())
        );
    }

    #[test]
    fn a_meta_file_that_cannot_be_read_is_refused() {
        let dir = with_partition_dirs(2);
        for text in [
            "partitions = two\n",
            "partitions 2\n",
            "format_version = 1\n",
            "shards = 2\n",
        ] {
            std::fs::write(dir.path().join(META_FILE), text).unwrap();
            let error = check(dir.path(), 2, true).unwrap_err().to_string();
            assert!(error.contains("cannot be read"), "{text:?}: {error}");
        }
    }
}
