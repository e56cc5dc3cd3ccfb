//! The disk-space guard: while the data directory's file system has less free space than a reserve, new
//! client commands are refused with [`EngineError::DiskFull`], and reads go on. A disk that fills up
//! then ends in refused writes, which clear by themselves once space is freed, instead of a failed
//! journal write, which stops the partition (reads too) until a restart. Commands already queued, the
//! follow-ups of two-phase flows and timers still go to the journal: the reserve is their room.
//!
//! Free space is read with `statvfs` at most every [`SAMPLE_INTERVAL_MS`], by whichever request comes
//! first after the interval, so the check on the hot path is a clock read and two atomic loads.

use crate::EngineError;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// How stale the free-space figure may be. Between two readings a partition can write at most what
/// its journal takes in 100 ms (tens of MB at the fastest measured rates), well within a reserve.
pub const SAMPLE_INTERVAL_MS: u64 = 100;

/// What `/health` shows of the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskStatus {
    pub free_bytes: u64,
    pub reserve_bytes: u64,
    /// New client commands are refused: `free_bytes < reserve_bytes`.
    pub writes_refused: bool,
}

pub(crate) struct DiskGuard {
    data_dir: PathBuf,
    /// 0 turns the guard off.
    reserve_bytes: u64,
    started: Instant,
    /// When free space was last read: milliseconds since `started`.
    sampled_at_ms: AtomicU64,
    free_bytes: AtomicU64,
    free_bytes_gauge: Gauge,
    refusals: Counter,
}

impl DiskGuard {
    /// Reads the free space of `data_dir`'s file system once, so that the first command is checked
    /// against a real figure; fails if it cannot be read.
    pub fn new(
        data_dir: &Path,
        reserve_bytes: u64,
        free_bytes_gauge: Gauge,
        refusals: Counter,
    ) -> io::Result<Self> {
        let free = free_bytes(data_dir)?;
        free_bytes_gauge.set(i64::try_from(free).unwrap_or(i64::MAX));
        Ok(Self {
            data_dir: data_dir.to_path_buf(),
            reserve_bytes,
            started: Instant::now(),
            sampled_at_ms: AtomicU64::new(0),
            free_bytes: AtomicU64::new(free),
            free_bytes_gauge,
            refusals,
        })
    }

    /// Whether a new client command may be queued.
    pub fn admit(&self) -> Result<(), EngineError> {
        if self.reserve_bytes == 0 {
            return Ok(());
        }
        let status = self.status();
        if !status.writes_refused {
            return Ok(());
        }
        self.refusals.inc();
        Err(EngineError::DiskFull {
            free_bytes: status.free_bytes,
            reserve_bytes: self.reserve_bytes,
        })
    }

    pub fn status(&self) -> DiskStatus {
        self.sample_if_due();
        let free_bytes = self.free_bytes.load(Ordering::Relaxed);
        DiskStatus {
            free_bytes,
            reserve_bytes: self.reserve_bytes,
            writes_refused: free_bytes < self.reserve_bytes,
        }
    }

    fn sample_if_due(&self) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        let sampled_at_ms = self.sampled_at_ms.load(Ordering::Relaxed);
        let due = now_ms.saturating_sub(sampled_at_ms) >= SAMPLE_INTERVAL_MS;
        // One caller reads; the others go on with the figure they have.
        if !due
            || (self.sampled_at_ms)
                .compare_exchange(sampled_at_ms, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        match free_bytes(&self.data_dir) {
            Ok(free) => {
                self.free_bytes.store(free, Ordering::Relaxed);
                (self.free_bytes_gauge).set(i64::try_from(free).unwrap_or(i64::MAX));
            }
            // Keeps the last figure: a guard that cannot read is no reason to refuse or to admit more.
            Err(error) => {
                tracing::warn!(%error, dir = %self.data_dir.display(), "reading free disk space")
            }
        }
    }
}

/// Bytes an unprivileged process may still write on `path`'s file system.
fn free_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs only writes the struct it is given; zeroes are a valid value of it.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a valid place to write.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(reserve_bytes: u64) -> DiskGuard {
        let dir = std::env::temp_dir();
        DiskGuard::new(&dir, reserve_bytes, Gauge::default(), Counter::default()).unwrap()
    }

    #[test]
    fn a_reserve_larger_than_the_disk_refuses_and_names_both_figures() {
        let refusing = guard(u64::MAX);
        match refusing.admit() {
            Err(EngineError::DiskFull {
                free_bytes,
                reserve_bytes,
            }) => {
                assert_eq!(reserve_bytes, u64::MAX);
                assert!(free_bytes < u64::MAX);
            }
            other => panic!("expected DiskFull, got {other:?}"),
        }
        assert_eq!(refusing.refusals.get(), 1);
        assert!(refusing.status().writes_refused);
    }

    #[test]
    fn a_reserve_the_disk_has_admits_and_zero_turns_the_guard_off() {
        assert_eq!(guard(1).admit(), Ok(()));
        let off = guard(0);
        assert_eq!(off.admit(), Ok(()));
        assert!(!off.status().writes_refused);
        assert!(off.free_bytes_gauge.get() > 0);
    }

    #[test]
    fn a_directory_that_does_not_exist_is_an_error_at_start() {
        let missing = std::env::temp_dir().join("spate-no-such-dir/below");
        assert!(DiskGuard::new(&missing, 1, Gauge::default(), Counter::default()).is_err());
    }
}
