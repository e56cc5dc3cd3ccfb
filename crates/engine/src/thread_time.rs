//! Where a thread's time went while it paused, as the kernel counts it: on a core, waiting in a run
//! queue behind other threads, blocked, or none of these: the host ran something else on the virtual
//! CPU (steal) or interrupts held it. Measured on this project's 2-core VM (BENCHMARKS.md, "Apply
//! pauses split by where their time went"), snapshot steps of 0.2-3 ms of CPU took 10-30 ms by the
//! wall, and none of them blocked: they had waited in the run queue, or lost their core to the host.
//! A pause's own share is what is left without those two.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// A thread's time as the kernel has counted it so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ThreadTimes {
    /// On a core, user and system.
    pub cpu: Duration,
    /// Runnable in a run queue while other threads held the cores, from `/proc/thread-self/schedstat`
    /// where the kernel keeps it.
    pub queued: Option<Duration>,
    /// Times the thread gave up its core to wait for something (voluntary context switches).
    pub waits: i64,
}

thread_local! {
    /// Opened once per thread: `thread-self` names the thread that opens it.
    static SCHEDSTAT: Option<File> = File::open("/proc/thread-self/schedstat").ok();
}

impl ThreadTimes {
    /// The calling thread's times now. The CPU clock is read first, so that at a pause's start the
    /// reads of the counts (and the file's opening, on a thread's first pause) fall within the CPU
    /// time measured, not in what is left for the host.
    pub fn now() -> Self {
        let cpu = thread_cpu_time();
        let queued = SCHEDSTAT.with(|file| {
            let mut text = [0u8; 96];
            let read = file.as_ref()?.read_at(&mut text, 0).ok()?;
            parse_schedstat(std::str::from_utf8(&text[..read]).ok()?)
        });
        // SAFETY: a zeroed rusage is valid for the call to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `usage` is valid; RUSAGE_THREAD exists since Linux 2.6.26.
        let status = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        debug_assert_eq!(status, 0, "RUSAGE_THREAD is always there");
        Self {
            cpu,
            queued,
            waits: usage.ru_nvcsw,
        }
    }
}

/// The time queued of `<ns on a core> <ns queued> <times on a core>`. The first is not taken: for a
/// thread on a core it stands as of the last tick or switch, up to a tick behind the CPU clock.
fn parse_schedstat(text: &str) -> Option<Duration> {
    let mut fields = text.split_ascii_whitespace().map(str::parse::<u64>);
    let _cpu_ns = fields.next()?.ok()?;
    let queued_ns = fields.next()?.ok()?;
    let _times_on_core = fields.next()?.ok()?;
    Some(Duration::from_nanos(queued_ns))
}

/// The CPU time the calling thread has used, user and system, to the nanosecond.
fn thread_cpu_time() -> Duration {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a valid timespec for the call to fill; the clock exists on every Linux.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
    debug_assert_eq!(status, 0, "CLOCK_THREAD_CPUTIME_ID is always there");
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

/// A pause split by where its time went.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct PauseSplit {
    pub wall: Duration,
    pub cpu: Duration,
    /// Waiting in a run queue for a core other threads held.
    pub queued: Duration,
    /// Neither on a core, nor queued, nor blocked: the host's (steal) or interrupts'. Only known when
    /// the thread never blocked, since time blocked cannot be measured apart from it.
    pub stolen: Duration,
}

impl PauseSplit {
    pub fn of(wall: Duration, start: ThreadTimes, end: ThreadTimes) -> Self {
        let cpu = end.cpu.saturating_sub(start.cpu).min(wall);
        let (queued, stolen) = match (start.queued, end.queued) {
            (Some(start_queued), Some(end_queued)) => {
                let queued = end_queued.saturating_sub(start_queued).min(wall - cpu);
                let stolen = if end.waits == start.waits {
                    wall - cpu - queued
                } else {
                    Duration::ZERO
                };
                (queued, stolen)
            }
            // Without the counts every moment off the core is charged to the pause itself.
            _ => (Duration::ZERO, Duration::ZERO),
        };
        Self {
            wall,
            cpu,
            queued,
            stolen,
        }
    }

    /// The pause less the time its thread waited for a core: its CPU time, and its time blocked
    /// (with any time the host took from a pause that also blocked, which cannot be told apart).
    pub fn own(&self) -> Duration {
        self.wall - self.queued - self.stolen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: f64) -> Duration {
        Duration::from_secs_f64(ms / 1e3)
    }

    fn times(cpu_ms: f64, queued_ms: f64, waits: i64) -> ThreadTimes {
        ThreadTimes {
            cpu: ms(cpu_ms),
            queued: Some(ms(queued_ms)),
            waits,
        }
    }

    #[test]
    fn schedstat_is_parsed_and_the_calling_thread_has_one() {
        assert_eq!(
            parse_schedstat("182738919 151607 24\n"),
            Some(Duration::from_nanos(151_607))
        );
        assert_eq!(parse_schedstat("182738919 151607\n"), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
        // Linux keeps schedstat wherever this project runs: a missing one would hide every split.
        let before = ThreadTimes::now();
        let mut spin = 0u64;
        while ThreadTimes::now().cpu < before.cpu + ms(2.0) {
            spin = std::hint::black_box(spin + 1);
        }
        let after = ThreadTimes::now();
        assert!(before.queued.is_some(), "no /proc/thread-self/schedstat");
        assert!(after.cpu >= before.cpu + ms(2.0));
    }

    #[test]
    fn a_pause_that_never_blocked_lost_what_it_did_not_run_or_queue_to_the_host() {
        // Measured (fraud, 30 M cards): 30.5 ms by the wall, 3.1 ms of CPU, 16.7 ms queued after one
        // preemption, no voluntary switch.
        let split = PauseSplit::of(ms(30.5), times(100.0, 5.0, 7), times(103.1, 21.7, 7));
        assert_eq!(split.cpu, ms(103.1) - ms(100.0));
        assert_eq!(split.queued, ms(21.7) - ms(5.0));
        assert_eq!(split.stolen, ms(30.5) - split.cpu - split.queued);
        assert_eq!(split.own(), split.cpu);
        // Never off its core at all: 12.8 ms by the wall, 0.2 ms of CPU.
        let split = PauseSplit::of(ms(12.8), times(100.0, 5.0, 7), times(100.2, 5.0, 7));
        assert_eq!(split.own(), split.cpu);
        assert_eq!(split.stolen, ms(12.8) - split.cpu);
    }

    #[test]
    fn a_pause_that_blocked_keeps_all_but_its_time_queued() {
        let split = PauseSplit::of(ms(23.0), times(10.0, 1.0, 3), times(13.0, 5.0, 4));
        assert_eq!(split.queued, ms(5.0) - ms(1.0));
        assert_eq!(split.stolen, Duration::ZERO);
        assert_eq!(split.own(), ms(23.0) - split.queued);
    }

    #[test]
    fn without_schedstat_the_whole_pause_is_its_own() {
        let cpu_only = |cpu_ms| ThreadTimes {
            cpu: ms(cpu_ms),
            queued: None,
            waits: 0,
        };
        let split = PauseSplit::of(ms(12.0), cpu_only(1.0), cpu_only(1.5));
        assert_eq!(split.own(), ms(12.0));
        assert_eq!(split.cpu, ms(0.5));
    }

    /// Pins the calling thread to one core.
    fn pin_to(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t is an empty set; the calls only read it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            let status = libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
            assert_eq!(status, 0, "{}", std::io::Error::last_os_error());
        }
    }

    #[test]
    fn a_thread_that_shares_its_core_with_a_busy_one_waits_in_the_run_queue() {
        // SAFETY: no arguments; -1 only if the kernel cannot say.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).expect("a current core");
        pin_to(cpu);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinner = std::thread::spawn({
            let stop = stop.clone();
            move || {
                pin_to(cpu);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            }
        });
        let started = std::time::Instant::now();
        let start = ThreadTimes::now();
        while ThreadTimes::now().cpu < start.cpu + ms(30.0) {
            std::hint::spin_loop();
        }
        let split = PauseSplit::of(started.elapsed(), start, ThreadTimes::now());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spinner.join().unwrap();
        // The scheduler shares the core: 30 ms of CPU cannot pass without the spinner's turns.
        assert!(split.queued >= ms(5.0), "{split:?}");
        assert!(split.own() + ms(1.0) < split.wall, "{split:?}");
        assert!(split.own() >= split.cpu, "{split:?}");
    }

    #[test]
    fn a_thread_that_sleeps_blocks_and_its_sleep_is_its_own() {
        let started = std::time::Instant::now();
        let start = ThreadTimes::now();
        std::thread::sleep(ms(20.0));
        let end = ThreadTimes::now();
        let split = PauseSplit::of(started.elapsed(), start, end);
        assert!(end.waits > start.waits, "{start:?} {end:?}");
        assert_eq!(split.stolen, Duration::ZERO);
        // Its 20 ms asleep are neither CPU nor queued, yet not the host's: they stay its own.
        assert!(split.own() > split.cpu + ms(1.0), "{split:?}");
    }
}
