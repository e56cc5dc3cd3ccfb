//! Where a thread's time went while it paused, as the kernel counts it: on a core, waiting in a run
//! queue behind other threads, or neither. Measured on this project's 2-core VM, a snapshot step of
//! 0.2-0.6 ms of CPU could take 10-14 ms by the wall: some had waited 10-12 ms in the run queue, and
//! some had never left their core at all (no context switch, no wait counted) while the host ran
//! something else on the virtual CPU (steal time). A pause's own share is what is left without those.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// A thread's time as the kernel has counted it so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ThreadTimes {
    /// On a core, user and system.
    pub cpu: Duration,
    /// What `/proc/thread-self/schedstat` adds, where the kernel keeps it.
    pub scheduler: Option<Scheduled>,
}

/// A thread's scheduling counts from `/proc/thread-self/schedstat`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Scheduled {
    /// Runnable but waiting in a run queue for a core that other threads held.
    pub queued: Duration,
    /// How many times the thread was put on a core: unchanged over an interval means that it never
    /// left its core, neither preempted nor blocked.
    pub times_on_core: u64,
}

thread_local! {
    /// Opened once per thread: `thread-self` names the thread that opens it.
    static SCHEDSTAT: Option<File> = File::open("/proc/thread-self/schedstat").ok();
}

impl ThreadTimes {
    /// The calling thread's times now. The CPU clock is read first, so that at a pause's start the
    /// read of the counts (and the file's opening, on a thread's first pause) falls within the CPU
    /// time measured, not in what is left for the host.
    pub fn now() -> Self {
        let cpu = thread_cpu_time();
        let scheduler = SCHEDSTAT.with(|file| {
            let mut text = [0u8; 96];
            let read = file.as_ref()?.read_at(&mut text, 0).ok()?;
            parse_schedstat(std::str::from_utf8(&text[..read]).ok()?)
        });
        Self { cpu, scheduler }
    }
}

/// `<ns on a core> <ns queued> <times on a core>`. The first is not taken: for a thread on a core it
/// stands as of the last tick or switch, up to a tick behind the CPU clock.
fn parse_schedstat(text: &str) -> Option<Scheduled> {
    let mut fields = text.split_ascii_whitespace().map(str::parse::<u64>);
    let _cpu_ns = fields.next()?.ok()?;
    let queued_ns = fields.next()?.ok()?;
    let times_on_core = fields.next()?.ok()?;
    Some(Scheduled {
        queued: Duration::from_nanos(queued_ns),
        times_on_core,
    })
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
    /// On its core but not run: only known when the thread never left the core, so that nothing
    /// else (blocking, waiting) can explain the time. Then it is the host's (steal) or interrupts'.
    pub stolen: Duration,
}

impl PauseSplit {
    pub fn of(wall: Duration, start: ThreadTimes, end: ThreadTimes) -> Self {
        let cpu = end.cpu.saturating_sub(start.cpu).min(wall);
        let (queued, stolen) = match (start.scheduler, end.scheduler) {
            (Some(start), Some(end)) if end.times_on_core == start.times_on_core => {
                (Duration::ZERO, wall - cpu)
            }
            (Some(start), Some(end)) => (end.queued.saturating_sub(start.queued), Duration::ZERO),
            // Without the counts every moment off the core is charged to the pause itself.
            _ => (Duration::ZERO, Duration::ZERO),
        };
        Self {
            wall,
            cpu,
            queued: queued.min(wall - cpu),
            stolen,
        }
    }

    /// The pause less the time its thread waited for a core: its CPU time, and its time blocked
    /// (with any time the host took while the thread also blocked or queued, which cannot be told
    /// apart from it).
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

    fn times(cpu_ms: f64, queued_ms: f64, times_on_core: u64) -> ThreadTimes {
        ThreadTimes {
            cpu: ms(cpu_ms),
            scheduler: Some(Scheduled {
                queued: ms(queued_ms),
                times_on_core,
            }),
        }
    }

    #[test]
    fn schedstat_is_parsed_and_the_calling_thread_has_one() {
        assert_eq!(
            parse_schedstat("182738919 151607 24\n"),
            Some(Scheduled {
                queued: Duration::from_nanos(151_607),
                times_on_core: 24
            })
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
        assert!(before.scheduler.is_some(), "no /proc/thread-self/schedstat");
        assert!(after.cpu >= before.cpu + ms(2.0));
    }

    #[test]
    fn a_thread_that_never_left_its_core_lost_the_rest_to_the_host() {
        // Measured: 12.8 ms by the wall, 0.2 ms of CPU, no context switch.
        let split = PauseSplit::of(ms(12.8), times(100.0, 5.0, 7), times(100.2, 5.0, 7));
        assert_eq!(split.stolen, ms(12.8) - (ms(100.2) - ms(100.0)));
        assert_eq!(split.queued, Duration::ZERO);
        assert_eq!(split.own(), split.cpu);
    }

    #[test]
    fn time_in_the_run_queue_is_not_the_pause_s_own_but_time_blocked_is() {
        // Preempted once, 11.9 ms queued.
        let split = PauseSplit::of(ms(12.43), times(10.0, 1.0, 3), times(10.54, 12.89, 4));
        assert_eq!(split.queued, ms(12.89) - ms(1.0));
        assert_eq!(split.stolen, Duration::ZERO);
        assert_eq!(split.own(), ms(12.43) - split.queued);
        // Blocked 10 ms and never queued: all its own.
        let split = PauseSplit::of(ms(23.0), times(10.0, 1.0, 3), times(23.0, 1.0, 4));
        assert_eq!(split.own(), ms(23.0));
    }

    #[test]
    fn without_schedstat_the_whole_pause_is_its_own() {
        let cpu_only = |cpu_ms| ThreadTimes {
            cpu: ms(cpu_ms),
            scheduler: None,
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
}
