//! What every fjall store on disk shares (the archive, and the stores apps keep their read models in):
//! opening one, and the background threads that look after one (`scrub.rs`, `release.rs`).

use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Opens a fjall database with `open`, turning a panic in its recovery into an error: fjall asserts
/// on some damaged journal entries (in debug builds), and a damaged store must be refused with a
/// message naming it, not crash the server.
pub fn open(
    open: impl FnOnce() -> fjall::Result<fjall::Database>,
) -> fjall::Result<fjall::Database> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(open)).unwrap_or_else(|panic| {
        let message = (panic.downcast_ref::<String>().map(String::as_str))
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        Err(fjall::Error::from(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("recovering it panicked, so it is damaged: {message}"),
        )))
    })
}

/// Set once to stop a store's background thread; the thread sleeps on it between steps.
#[derive(Default)]
pub(crate) struct StopSignal {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl StopSignal {
    fn stop(&self) {
        *self.stopped.lock().expect("no thread panics holding it") = true;
        self.wake.notify_all();
    }

    /// Sleeps for `duration` unless stopped first; true if stopped.
    pub fn sleep(&self, duration: Duration) -> bool {
        let stopped = self.stopped.lock().expect("no thread panics holding it");
        let (stopped, _) = self
            .wake
            .wait_timeout_while(stopped, duration, |stopped| !*stopped)
            .expect("no thread panics holding it");
        *stopped
    }
}

/// Background threads that run until [`Self::stop_all`], or until dropped.
#[derive(Default)]
pub(crate) struct BackgroundThreads {
    running: Mutex<Vec<(Arc<StopSignal>, JoinHandle<()>)>>,
}

impl BackgroundThreads {
    /// Runs `body` on a thread named `name`; it must return soon after its signal stops.
    pub fn spawn(
        &self,
        name: String,
        body: impl FnOnce(Arc<StopSignal>) + Send + 'static,
    ) -> io::Result<()> {
        let stop = Arc::new(StopSignal::default());
        let signal = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || body(signal))?;
        self.running
            .lock()
            .expect("no thread panics holding it")
            .push((stop, thread));
        Ok(())
    }

    pub fn stop_all(&self) {
        let running =
            std::mem::take(&mut *self.running.lock().expect("no thread panics holding it"));
        for (stop, _) in &running {
            stop.stop();
        }
        for (_, thread) in running {
            // A thread that panicked has nothing left to release.
            let _ = thread.join();
        }
    }
}

impl Drop for BackgroundThreads {
    fn drop(&mut self) {
        self.stop_all();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_panic_while_opening_is_an_error() {
        let opened = super::open(|| panic!("journal entry length mismatch"));
        let error = opened.err().expect("an error").to_string();
        assert!(error.contains("journal entry length mismatch"), "{error}");
    }

    #[test]
    fn a_flipped_byte_anywhere_in_the_journal_never_panics() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = fjall::Database::builder(dir.path()).open().unwrap();
            let keyspace = db.keyspace("rides", Default::default).unwrap();
            for n in 0u32..3 {
                keyspace.insert(n.to_be_bytes(), [n as u8; 24]).unwrap();
            }
            db.persist(fjall::PersistMode::SyncAll).unwrap();
        }
        let journal = dir.path().join("0.jnl");
        let bytes = std::fs::read(&journal).unwrap();
        let used = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
        let mut refused = 0;
        // Every third byte: each open starts fjall's threads, and debug builds take 0.1 s for one.
        for at in (0..used).step_by(3) {
            let copy = tempfile::tempdir().unwrap();
            for entry in std::fs::read_dir(dir.path()).unwrap() {
                copy_tree(&entry.unwrap().path(), copy.path());
            }
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x20;
            std::fs::write(copy.path().join("0.jnl"), &damaged).unwrap();
            // Ok (fjall's recovery stopped early, which spate's own checks catch) or Err; never a
            // panic (fjall's debug builds assert on some of these bytes).
            let opened = super::open(|| fjall::Database::builder(copy.path()).open());
            refused += usize::from(opened.is_err());
        }
        assert!(refused > 0, "no flipped byte of {used} was refused");
    }

    fn copy_tree(from: &std::path::Path, into: &std::path::Path) {
        let to = into.join(from.file_name().unwrap());
        if from.is_dir() {
            std::fs::create_dir(&to).unwrap();
            for entry in std::fs::read_dir(from).unwrap() {
                copy_tree(&entry.unwrap().path(), &to);
            }
        } else {
            std::fs::copy(from, &to).unwrap();
        }
    }

    #[test]
    fn a_stopped_signal_ends_a_sleep_at_once() {
        use std::time::{Duration, Instant};
        let signal = super::StopSignal::default();
        assert!(!signal.sleep(Duration::from_millis(1)));
        signal.stop();
        let started = Instant::now();
        assert!(signal.sleep(Duration::from_secs(60)));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn stopping_the_threads_joins_them() {
        let threads = super::BackgroundThreads::default();
        let (ran, seen) = std::sync::mpsc::channel();
        threads
            .spawn("test".into(), move |stop| {
                while !stop.sleep(std::time::Duration::from_secs(60)) {}
                ran.send(()).unwrap();
            })
            .unwrap();
        threads.stop_all();
        seen.try_recv()
            .expect("the thread ended before stop_all returned");
    }

    #[test]
    fn a_store_that_opens_is_handed_back() {
        let dir = tempfile::tempdir().unwrap();
        let db = super::open(|| fjall::Database::builder(dir.path()).open()).unwrap();
        assert_eq!(db.keyspace_count(), 0);
    }
}
