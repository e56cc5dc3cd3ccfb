//! Snapshot files written past the page cache (`O_DIRECT`), in blocks of [`BLOCK_BYTES`].
//!
//! A snapshot is written while the load goes on and can be as large as the state (15 GB at fraud's
//! 30 M cards): through the page cache every page of it is allocated, copied and written back, which
//! here cost more CPU than the state's own encoding (`dd` of 5 GB on the project's VM: 8.7 s of system
//! time buffered, 0.7 s with `O_DIRECT`), on the same cores as the partitions. It is read back through
//! the page cache: reading it past the cache made restarts slower (BENCHMARKS.md). Where a file
//! system refuses `O_DIRECT`, the writer falls back to plain writes of the same blocks.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// What `O_DIRECT` asks of a buffer's address, a file offset and a length: a multiple of the logical
/// block size, which a page covers on every device in use.
const ALIGNMENT: usize = 4096;

/// Bytes per write.
const BLOCK_BYTES: usize = 1 << 20;

/// A buffer of [`BLOCK_BYTES`] at an address aligned to [`ALIGNMENT`], cut out of a larger one.
struct AlignedBlock {
    storage: Box<[u8]>,
    start: usize,
}

impl AlignedBlock {
    fn new() -> Self {
        let storage = vec![0; BLOCK_BYTES + ALIGNMENT].into_boxed_slice();
        let start = storage.as_ptr().align_offset(ALIGNMENT);
        assert!(start < ALIGNMENT, "a byte buffer can always be aligned");
        Self { storage, start }
    }

    fn bytes(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + BLOCK_BYTES]
    }
}

/// Whether `error` is a refusal of `O_DIRECT` itself (the flag, or an alignment the device does not
/// take), after which plain writes of the same bytes still work.
fn refuses_direct(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP))
}

/// Opens `path` with `O_DIRECT` added to `options`; `None` where the file system refuses it.
fn open_direct(options: &mut OpenOptions, path: &Path) -> io::Result<Option<File>> {
    match options.custom_flags(libc::O_DIRECT).open(path) {
        Ok(file) => Ok(Some(file)),
        Err(error) if refuses_direct(&error) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Turns `O_DIRECT` off on an open file, for what a direct write cannot do.
fn stop_direct(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this File owns, with flags it read itself.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes a new file in whole blocks; [`DirectWriter::finish`] writes the last, padded to the
/// alignment, and cuts the file back to the bytes written.
pub struct DirectWriter {
    file: File,
    block: AlignedBlock,
    filled: usize,
    length: u64,
}

impl DirectWriter {
    /// Creates `path`, or empties it.
    pub fn create(path: &Path) -> io::Result<Self> {
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        let file = match open_direct(&mut options, path)? {
            Some(file) => file,
            None => File::create(path)?,
        };
        Ok(Self {
            file,
            block: AlignedBlock::new(),
            filled: 0,
            length: 0,
        })
    }

    /// Writes the block's first `bytes`, a multiple of the alignment (the file's last block is padded).
    fn write_block(&mut self, bytes: usize) -> io::Result<()> {
        debug_assert!(bytes <= BLOCK_BYTES && bytes.is_multiple_of(ALIGNMENT));
        let block = &self.block.storage[self.block.start..self.block.start + bytes];
        // A regular file takes a direct write whole or fails; a short one would leave the next
        // offset unaligned, so the rest goes without O_DIRECT, as does all of a write refused for its
        // alignment (a device whose blocks are larger than a page).
        let written = match self.file.write(block) {
            Ok(written) => written,
            Err(error) if refuses_direct(&error) => 0,
            Err(error) => return Err(error),
        };
        if written < bytes {
            stop_direct(&self.file)?;
            self.file.write_all(&block[written..])?;
        }
        Ok(())
    }

    /// Writes what is left and returns the file, `length` bytes long, for the caller to sync.
    pub fn finish(mut self) -> io::Result<File> {
        if self.filled > 0 {
            let padded = self.filled.next_multiple_of(ALIGNMENT);
            let filled = self.filled;
            self.block.bytes()[filled..padded].fill(0);
            self.write_block(padded)?;
        }
        self.file.set_len(self.length)?;
        Ok(self.file)
    }
}

impl Write for DirectWriter {
    /// A full block goes out before new bytes are taken, so that a write that fails (interrupted, say)
    /// has taken nothing and can be tried again.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.filled == BLOCK_BYTES {
            self.write_block(BLOCK_BYTES)?;
            self.filled = 0;
        }
        let taken = buf.len().min(BLOCK_BYTES - self.filled);
        let filled = self.filled;
        self.block.bytes()[filled..filled + taken].copy_from_slice(&buf[..taken]);
        self.filled += taken;
        self.length += taken as u64;
        Ok(taken)
    }

    /// Whole blocks only go when the next bytes come: the rest waits for [`DirectWriter::finish`].
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lengths around the alignment and the block, written in pieces of odd sizes: the file holds
    /// exactly the bytes written.
    #[test]
    fn a_file_written_in_blocks_reads_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let lengths = [
            0,
            1,
            ALIGNMENT - 1,
            ALIGNMENT,
            ALIGNMENT + 1,
            BLOCK_BYTES - 1,
            BLOCK_BYTES,
            2 * BLOCK_BYTES + 12_345,
        ];
        for length in lengths {
            let path = dir.path().join(format!("file-{length}"));
            let bytes: Vec<u8> = (0..length).map(|i| (i * 7 + i / 4093) as u8).collect();
            let mut writer = DirectWriter::create(&path).unwrap();
            for piece in bytes.chunks(65_521) {
                writer.write_all(piece).unwrap();
            }
            writer.finish().unwrap().sync_all().unwrap();
            assert_eq!(
                std::fs::read(&path).unwrap(),
                bytes,
                "{length} bytes on disk"
            );
        }
    }

    /// A file whose `O_DIRECT` was turned off part way (what a refused or short direct write does)
    /// holds the same bytes.
    #[test]
    fn a_file_written_on_without_direct_io_holds_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        let bytes: Vec<u8> = (0..3 * BLOCK_BYTES + 777)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut writer = DirectWriter::create(&path).unwrap();
        writer.write_all(&bytes[..BLOCK_BYTES + 5]).unwrap();
        stop_direct(&writer.file).unwrap();
        writer.write_all(&bytes[BLOCK_BYTES + 5..]).unwrap();
        writer.finish().unwrap().sync_all().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }

    /// An existing longer file is emptied first: nothing of it is left past the new end.
    #[test]
    fn a_file_written_again_keeps_nothing_of_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        std::fs::write(&path, vec![9; 3 * BLOCK_BYTES]).unwrap();
        let mut writer = DirectWriter::create(&path).unwrap();
        writer.write_all(b"short").unwrap();
        writer.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"short");
    }
}
