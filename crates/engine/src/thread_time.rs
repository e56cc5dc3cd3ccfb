//! Where a partition thread's time went while it paused, as the kernel counts it: on a core,
//! runnable but not running (in a run queue behind other threads, or held by a CPU quota), blocked, or
//! none of these: the host ran something else on the virtual CPU (steal), or interrupts held it (the
//! process's own among them: TLB shootdowns, its I/O's softirqs). Logged on this project's 2-core VM
//! (BENCHMARKS.md, "Apply pauses split by where their time went"), snapshot steps of 0.1-3.3 ms of CPU
//! took 10-30 ms by the wall without ever blocking: they had been runnable, or off every count.
//!
//! A pause's own share is the pause less those two. It stays whole, nothing taken away, whenever the
//! thread waited for another of spate's threads (a full journal or snapshot queue, see
//! [`note_hand_off_wait`]): crossbeam's blocking send yields before it parks, and a yield's wait looks
//! like a preemption's to the kernel. Limits, said where the metrics are: time runnable behind
//! spate's own threads (such as the snapshot's file thread) is not the pause's own, and interrupts the
//! process caused count as the host's.

use std::cell::Cell;
use std::fs::File;
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// A thread's time as the kernel has counted it so far.
#[derive(Clone, Copy, Debug, PartialEq)]
struct ThreadTimes {
    /// On a core, user and system.
    cpu: Duration,
    /// Runnable but not running, from `/proc/thread-self/schedstat` where the kernel keeps it.
    queued: Option<Duration>,
    /// Times the thread gave up its core to wait for something (voluntary context switches).
    blocked: Option<i64>,
    /// Times the thread waited to hand work to another of spate's threads.
    hand_off_waits: u64,
}

thread_local! {
    /// Opened on a thread's first read: `thread-self` names the thread that opens it.
    static SCHEDSTAT: Option<File> = File::open("/proc/thread-self/schedstat").ok();
    static HAND_OFF_WAITS: Cell<u64> = const { Cell::new(0) };
}

/// Notes that the calling thread is about to wait for room in another thread's queue: a pause that
/// holds such a wait is the pause's own whole.
pub(crate) fn note_hand_off_wait() {
    HAND_OFF_WAITS.with(|waits| waits.set(waits.get() + 1));
}

/// Measures a pause from its start on the partition's thread, and splits it when it ends there (it is
/// not `Send`: the counts are the thread's own).
pub(crate) struct PauseTimer {
    started: Instant,
    start: ThreadTimes,
    _this_thread_only: PhantomData<*const ()>,
}

impl PauseTimer {
    /// The reads nest: the switch count outermost, then the wall clock, then the CPU clock, then the
    /// run-queue time, so that whatever the reads themselves cost (the schedstat file's opening, on a
    /// thread's first pause) falls within the CPU time measured, and any blocking in them is seen.
    pub fn start() -> Self {
        let blocked = voluntary_switches();
        let started = Instant::now();
        let cpu = thread_cpu_time();
        let queued = queued_time();
        Self {
            started,
            start: ThreadTimes {
                cpu,
                queued,
                blocked,
                hand_off_waits: HAND_OFF_WAITS.with(Cell::get),
            },
            _this_thread_only: PhantomData,
        }
    }

    pub fn stop(self) -> PauseSplit {
        let hand_off_waits = HAND_OFF_WAITS.with(Cell::get);
        let queued = queued_time();
        let cpu = thread_cpu_time();
        let wall = self.started.elapsed();
        let blocked = voluntary_switches();
        let end = ThreadTimes {
            cpu,
            queued,
            blocked,
            hand_off_waits,
        };
        PauseSplit::of(wall, self.start, end)
    }
}

fn queued_time() -> Option<Duration> {
    SCHEDSTAT.with(|file| {
        let mut text = [0u8; 96];
        let read = file.as_ref()?.read_at(&mut text, 0).ok()?;
        parse_schedstat(std::str::from_utf8(&text[..read]).ok()?)
    })
}

fn voluntary_switches() -> Option<i64> {
    // SAFETY: a zeroed rusage is valid for the call to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is valid; RUSAGE_THREAD exists since Linux 2.6.26.
    let status = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    (status == 0).then_some(usage.ru_nvcsw)
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
    wall: Duration,
    cpu: Duration,
    queued: Duration,
    stolen: Duration,
}

impl PauseSplit {
    fn of(wall: Duration, start: ThreadTimes, end: ThreadTimes) -> Self {
        let cpu = end.cpu.saturating_sub(start.cpu).min(wall);
        // A wait for another thread's queue is the pause's cause, yields and all: nothing is taken.
        let waited_for_a_hand_off = end.hand_off_waits != start.hand_off_waits;
        let counted_queued = match (start.queued, end.queued) {
            (Some(start), Some(end)) if !waited_for_a_hand_off => {
                Some(end.saturating_sub(start).min(wall - cpu))
            }
            // Without the counts every moment off the core is charged to the pause itself.
            _ => None,
        };
        let never_blocked = start.blocked.is_some() && start.blocked == end.blocked;
        let stolen = match counted_queued {
            Some(queued) if never_blocked => wall - cpu - queued,
            _ => Duration::ZERO,
        };
        Self {
            wall,
            cpu,
            queued: counted_queued.unwrap_or(Duration::ZERO),
            stolen,
        }
    }

    pub fn wall(&self) -> Duration {
        self.wall
    }

    pub fn cpu(&self) -> Duration {
        self.cpu
    }

    /// Runnable but not running.
    pub fn queued(&self) -> Duration {
        self.queued
    }

    /// Neither on a core, nor runnable, nor blocked: the host's (steal) or interrupts'. Only known in a
    /// pause that never blocked, since time blocked cannot be measured apart from it.
    pub fn stolen(&self) -> Duration {
        self.stolen
    }

    /// The pause less the time its thread was runnable but not running, and less the host's: its CPU
    /// time, its time blocked, and any time the host took from a pause that also blocked, which cannot
    /// be told apart from the blocking.
    pub fn own(&self) -> Duration {
        self.wall.saturating_sub(self.queued + self.stolen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: f64) -> Duration {
        Duration::from_secs_f64(ms / 1e3)
    }

    fn times(cpu_ms: f64, queued_ms: f64, blocked: i64) -> ThreadTimes {
        ThreadTimes {
            cpu: ms(cpu_ms),
            queued: Some(ms(queued_ms)),
            blocked: Some(blocked),
            hand_off_waits: 0,
        }
    }

    #[test]
    fn schedstat_is_parsed_and_read_again_at_each_pause() {
        assert_eq!(
            parse_schedstat("182738919 151607 24\n"),
            Some(Duration::from_nanos(151_607))
        );
        assert_eq!(parse_schedstat("182738919 151607\n"), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
        // Linux keeps schedstat and the switch counts wherever this project runs: without them no
        // pause would be split. The file is read again from its start at each pause.
        for _ in 0..2 {
            assert!(queued_time().is_some(), "no /proc/thread-self/schedstat");
        }
        assert!(voluntary_switches().is_some());
    }

    #[test]
    fn a_pause_that_never_blocked_lost_what_it_did_not_run_or_queue_to_the_host() {
        // Logged (fraud, 30 M cards): 30.5 ms by the wall, 3.1 ms of CPU, 16.7 ms queued after one
        // preemption, no voluntary switch.
        let split = PauseSplit::of(ms(30.5), times(100.0, 5.0, 7), times(103.1, 21.7, 7));
        assert_eq!(split.cpu, ms(103.1) - ms(100.0));
        assert_eq!(split.queued, ms(21.7) - ms(5.0));
        assert_eq!(split.stolen, ms(30.5) - split.cpu - split.queued);
        assert_eq!(split.own(), split.cpu);
    }

    #[test]
    fn a_pause_that_blocked_keeps_all_but_its_time_queued() {
        let split = PauseSplit::of(ms(23.0), times(10.0, 1.0, 3), times(13.0, 5.0, 4));
        assert_eq!(split.queued, ms(4.0));
        assert_eq!(split.stolen, Duration::ZERO);
        assert_eq!(split.own(), ms(19.0));
    }

    #[test]
    fn a_pause_that_waited_for_a_hand_off_is_its_own_whole() {
        let mut end = times(13.0, 5.0, 3);
        end.hand_off_waits = 1;
        let split = PauseSplit::of(ms(23.0), times(10.0, 1.0, 3), end);
        assert_eq!(
            (split.queued, split.stolen),
            (Duration::ZERO, Duration::ZERO)
        );
        assert_eq!(split.own(), ms(23.0));
    }

    #[test]
    fn without_the_kernel_s_counts_the_whole_pause_is_its_own() {
        let mut start = times(1.0, 1.0, 3);
        let mut end = times(1.5, 9.0, 3);
        start.queued = None;
        assert_eq!(PauseSplit::of(ms(12.0), start, end).own(), ms(12.0));
        // Switch counts missing: whatever is neither CPU nor queued may have been blocking.
        start = times(1.0, 1.0, 3);
        start.blocked = None;
        end.blocked = None;
        assert_eq!(PauseSplit::of(ms(12.0), start, end).own(), ms(4.0));
    }

    /// Pins the calling thread to one core, and gives back the set it had.
    fn pin_to(cpu: usize) -> libc::cpu_set_t {
        // SAFETY: zeroed cpu_set_t values are empty sets; the calls read or fill them.
        unsafe {
            let mut had: libc::cpu_set_t = std::mem::zeroed();
            let status = libc::sched_getaffinity(0, std::mem::size_of_val(&had), &mut had);
            assert_eq!(status, 0, "{}", std::io::Error::last_os_error());
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            let status = libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
            assert_eq!(status, 0, "{}", std::io::Error::last_os_error());
            had
        }
    }

    #[test]
    fn a_thread_that_shares_its_core_with_a_busy_one_is_counted_queued() {
        // SAFETY: no arguments; -1 only if the kernel cannot say.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).expect("a current core");
        let had = pin_to(cpu);
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
        let pause = PauseTimer::start();
        let cpu_at_start = thread_cpu_time();
        while thread_cpu_time() < cpu_at_start + ms(30.0) {
            std::hint::spin_loop();
        }
        let split = pause.stop();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spinner.join().unwrap();
        // SAFETY: `had` is the set sched_getaffinity filled.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&had), &had) };
        // The scheduler shares the core: 30 ms of CPU cannot pass without the spinner's turns.
        assert!(split.queued >= ms(5.0), "{split:?}");
    }

    #[test]
    fn a_thread_that_sleeps_blocks_and_its_sleep_is_its_own() {
        let pause = PauseTimer::start();
        std::thread::sleep(ms(20.0));
        let split = pause.stop();
        assert_eq!(split.stolen, Duration::ZERO, "{split:?}");
        // Its 20 ms asleep are neither CPU nor queued, yet not the host's: they stay its own.
        assert!(split.own() > split.cpu + ms(15.0), "{split:?}");
    }

    #[test]
    fn a_hand_off_wait_noted_on_the_thread_keeps_the_pause_whole() {
        let pause = PauseTimer::start();
        note_hand_off_wait();
        let split = pause.stop();
        assert_eq!(split.own(), split.wall);
    }
}
