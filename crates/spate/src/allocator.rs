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
//! **Heaps made writable whole.** Every thread but the main one allocates from an arena of 64 MiB heaps
//! that glibc reserves without access and opens page by page as the arena grows: one `mprotect` per
//! 4 KiB, each taking the process's memory map lock for writing. A partition restoring fraud's cards
//! made 400,000 of them per 1.6 GB, and the two partitions restoring side by side waited on each
//! other's (BENCHMARKS.md, "Heaps made writable whole"). A top pad of a whole heap (`M_TOP_PAD`) makes
//! glibc open each new heap at once. The price: an arena keeps up to that pad of freed memory at its top
//! instead of handing it back, so a process's RSS stays near its high-water mark.
//!
//! jemalloc and mimalloc were measured too, and not adopted.

/// glibc's `M_MXFAST`: fastbins keep freed blocks of up to this many bytes less 8 (glibc's default is
/// 128: blocks of up to 120 bytes).
const FASTBIN_BLOCK_BYTES_MAX: i32 = 32;

/// glibc's `M_TOP_PAD`: at least a thread arena's heap (64 MiB on 64-bit targets, `HEAP_MAX_SIZE`), so
/// that a new heap is opened whole when it is made, not page by page (glibc's default is 128 KiB).
const TOP_PAD_BYTES: i32 = 64 << 20;

/// Sets the allocator's parameters above, for the whole process. Call it in `main` before any thread
/// starts. Returns the name of each setting glibc refused; other C libraries have neither setting.
pub fn tune() -> Vec<&'static str> {
    #[cfg(target_env = "gnu")]
    {
        let settings = [
            ("M_MXFAST", libc::M_MXFAST, FASTBIN_BLOCK_BYTES_MAX),
            ("M_TOP_PAD", libc::M_TOP_PAD, TOP_PAD_BYTES),
        ];
        settings
            .into_iter()
            // SAFETY: mallopt only sets a parameter of the allocator; it is called before other
            // threads exist, and glibc takes its own lock for it regardless.
            .filter(|(_, parameter, value)| unsafe { libc::mallopt(*parameter, *value) } != 1)
            .map(|(name, _, _)| name)
            .collect()
    }
    #[cfg(not(target_env = "gnu"))]
    {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn glibc_takes_every_setting() {
        assert_eq!(super::tune(), Vec::<&str>::new());
    }
}
