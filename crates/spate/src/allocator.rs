//! The process's one setting of glibc's allocator.
//!
//! glibc keeps freed blocks of up to 120 bytes in "fastbins" and merges them only when a large block
//! is asked for next: that request then walks every block freed since. A partition frees hundreds of
//! thousands of small blocks when a batch settles or history moves to the archive, and the next large
//! request (a snapshot step's buffer of 64 KiB, say) paid 8-20 ms of CPU in `malloc_consolidate` inside
//! a pause the partition could not apply in (BENCHMARKS.md, "Apply pauses: the allocator's share").
//! Fastbins kept for blocks of up to 24 bytes only (`M_MXFAST` 32) took that CPU away as well as no
//! fastbins at all did, without the 5% that no fastbins cost fraud's generation of 30 M cards ("Apply
//! pauses: fastbins for blocks of up to 24 bytes"); no fastbins settled payments about 13% faster,
//! though. Small blocks still come from the per-thread cache first. jemalloc and mimalloc were measured
//! too, and not adopted.

/// glibc's `M_MXFAST`: fastbins keep freed blocks of up to this many bytes less 8 (glibc's default is
/// 128: blocks of up to 120 bytes).
const FASTBIN_BLOCK_BYTES_MAX: i32 = 32;

/// Keeps only the smallest freed blocks in glibc's fastbins, for the whole process. Call it in `main`
/// before any thread starts. Returns false if glibc refused; other C libraries have no fastbins.
pub fn keep_only_tiny_blocks_in_fastbins() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only sets a parameter of the allocator; it is called before other threads
        // exist, and glibc takes its own lock for it regardless.
        unsafe { libc::mallopt(libc::M_MXFAST, FASTBIN_BLOCK_BYTES_MAX) == 1 }
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
        assert!(super::keep_only_tiny_blocks_in_fastbins());
    }
}
