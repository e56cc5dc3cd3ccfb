//! The process's one setting of glibc's allocator.
//!
//! glibc keeps small freed blocks in "fastbins" and merges them only when a large block is asked for
//! next: that request then walks every block freed since. A partition frees hundreds of thousands
//! of small blocks when a batch settles or history moves to the archive, and the next large request
//! (a snapshot step's buffer of 64 KiB, say) paid 8-20 ms of CPU in `malloc_consolidate` inside a
//! pause the partition could not apply in (BENCHMARKS.md, "Apply pauses: the allocator's share").
//! Without fastbins a freed block is merged at once, its cost spread over the frees; small blocks
//! still come from the per-thread cache first. jemalloc and mimalloc were measured too (same section).
//! The price: at fraud's 30 M cards (a 16 GB heap) generation and stream were 7-8% slower and the
//! longest pause longer, in two pairs of runs; every benchmark at the default scales was level or better.

/// Turns glibc's fastbins off for the whole process. Call it in `main` before any
/// thread starts. Returns false if glibc refused; other C libraries have no fastbins to turn off.
pub fn merge_freed_blocks_at_once() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only sets a parameter of the allocator; it is called before other threads
        // exist, and glibc takes its own lock for it regardless.
        unsafe { libc::mallopt(libc::M_MXFAST, 0) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        true
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn glibc_takes_the_setting() {
        assert!(super::merge_freed_blocks_at_once());
    }
}
