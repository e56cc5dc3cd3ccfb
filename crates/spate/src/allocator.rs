//! The process's settings of glibc's allocator.
//!
//! **Fastbins.** glibc keeps freed blocks of up to 120 bytes in "fastbins" and merges them only when a
//! large block is asked for next: that request then walks every block freed since. A partition frees
//! hundreds of thousands of small blocks when a batch settles or history moves to the archive, and the
//! next large request (a snapshot step's buffer of 64 KiB, say) paid 8-20 ms of CPU in
//! `malloc_consolidate` inside a pause the partition could not apply in (BENCHMARKS.md, "Apply pauses:
//! the allocator's share"). Fastbins kept for blocks of up to 24 bytes only (`M_MXFAST` 32) took that
//! CPU away as well as no fastbins at all did, without the 5% that no fastbins cost fraud's generation
//! of 30 M cards ("Apply pauses: fastbins for blocks of up to 24 bytes"); no fastbins settled payments
//! about 13% faster, though. Small blocks still come from the per-thread cache first.
//!
//! **Heaps made writable whole.** Threads other than the main one mostly allocate from arenas of
//! 64 MiB heaps that glibc reserves without access and opens page by page as an arena grows: one
//! `mprotect` per 4 KiB, each taking the process's memory map lock for writing. A partition restoring
//! fraud's cards made 400,000 of them per 1.6 GB, and the two partitions restoring side by side waited
//! on each other's (BENCHMARKS.md, "Heaps made writable whole"). A top pad of a whole heap (`M_TOP_PAD`)
//! makes glibc open each new heap at once. The price: with such a pad glibc never shrinks nor unmaps a
//! thread arena's heaps, so what an arena frees stays in it for reuse and a process's RSS stays at its
//! high-water mark (the main arena still hands back what passes the pad).
//!
//! **A fixed mmap threshold.** Setting the pad also stops glibc from raising its mmap threshold as
//! large blocks are freed (it starts at 128 KiB): every buffer of 1 MiB (snapshot chunks, buffered
//! readers) would then be mapped, faulted in and unmapped each time. `M_MMAP_THRESHOLD` is set to the
//! highest value the dynamic threshold could reach, so blocks below 32 MiB come from the arenas as they
//! did once the threshold had risen.
//!
//! jemalloc and mimalloc were measured too, and not adopted.

/// glibc's `M_MXFAST`: fastbins keep freed blocks of up to this many bytes less 8 (glibc's default is
/// 128: blocks of up to 120 bytes).
const FASTBIN_BLOCK_BYTES_MAX: i32 = 32;

/// The size of a thread arena's heap on 64-bit targets (glibc's `HEAP_MAX_SIZE`, without
/// `glibc.malloc.hugetlb=2`).
const THREAD_HEAP_BYTES: i32 = 64 << 20;

/// glibc's `M_TOP_PAD`: a whole thread heap, so that a new heap is opened whole when it is made, not
/// page by page (glibc's default is 128 KiB).
const TOP_PAD_BYTES: i32 = THREAD_HEAP_BYTES;

/// glibc's `M_MMAP_THRESHOLD`: blocks from this size up are mapped on their own. Half a thread heap
/// is the most glibc accepts, and the ceiling of its dynamic threshold.
const MMAP_THRESHOLD_BYTES: i32 = THREAD_HEAP_BYTES / 2;

/// Sets the allocator's parameters above, for the whole process. Call it in `main` before any thread
/// starts. Returns the name of each setting glibc refused (on a 32-bit target, whose heaps are
/// smaller, it refuses the mmap threshold); other C libraries have none of these settings.
pub fn tune() -> Vec<&'static str> {
    #[cfg(target_env = "gnu")]
    {
        let settings = [
            ("M_MXFAST", libc::M_MXFAST, FASTBIN_BLOCK_BYTES_MAX),
            ("M_TOP_PAD", libc::M_TOP_PAD, TOP_PAD_BYTES),
            (
                "M_MMAP_THRESHOLD",
                libc::M_MMAP_THRESHOLD,
                MMAP_THRESHOLD_BYTES,
            ),
        ];
        settings
            .into_iter()
            // SAFETY: mallopt only sets a parameter of the allocator, under glibc's own lock; called
            // while other threads allocate (as the unit tests do), a block already in a fastbin
            // waits there until the next consolidation.
            .filter(|(_, parameter, value)| unsafe { libc::mallopt(*parameter, *value) } != 1)
            .map(|(name, _, _)| name)
            .collect()
    }
    #[cfg(not(target_env = "gnu"))]
    {
        Vec::new()
    }
}

#[cfg(all(test, target_env = "gnu", target_pointer_width = "64"))]
mod tests {
    use super::THREAD_HEAP_BYTES;

    /// Tuned, a thread's arena opens the heap it makes whole: the mapping that holds its newest block
    /// is readable and writable over the heap's 64 MiB. Untuned, only the part grown into so far is.
    #[test]
    fn a_thread_heap_made_after_tuning_is_writable_whole() {
        assert_eq!(super::tune(), Vec::<&str>::new());
        std::thread::spawn(|| {
            const BLOCK_BYTES: usize = 1024;
            // More than a heap's worth, so that the thread's arena makes a heap after the tuning.
            let blocks: Vec<Box<[u8]>> = (0..THREAD_HEAP_BYTES as usize / BLOCK_BYTES * 9 / 8)
                .map(|_| vec![1u8; BLOCK_BYTES].into_boxed_slice())
                .collect();
            let address = blocks.last().expect("blocks").as_ptr() as usize;
            let heap_start = address & !(THREAD_HEAP_BYTES as usize - 1);
            let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
            let (start, end, rest) = maps
                .lines()
                .filter_map(|line| {
                    let (range, rest) = line.split_once(' ')?;
                    let (start, end) = range.split_once('-')?;
                    let start = usize::from_str_radix(start, 16).ok()?;
                    Some((start, usize::from_str_radix(end, 16).ok()?, rest))
                })
                .find(|(start, end, _)| (*start..*end).contains(&address))
                .expect("the block's mapping");
            if rest.ends_with("[heap]") {
                return; // The thread got the main arena, which grows by brk instead.
            }
            assert!(rest.starts_with("rw"), "{start:x}-{end:x} {rest}");
            assert!(
                start <= heap_start && heap_start + THREAD_HEAP_BYTES as usize <= end,
                "the heap at {heap_start:x} is writable only over {start:x}-{end:x}"
            );
        })
        .join()
        .expect("the allocating thread");
    }
}
