#!/usr/bin/env python3
"""What an append + fdatasync costs in a segment made three ways, on the disk under DIR: preallocated
with fallocate (the journal's way), filled with zeros, or grown by each append; and what one write
with O_DIRECT | O_DSYNC costs instead (the record's 4 KiB blocks rewritten from an aligned buffer, as a
journal past the page cache would) in a segment preallocated either way. Prints wall microseconds per
commit, the process's CPU and the whole machine's busy time per commit (/proc/stat: the disk's
interrupts and the kernel's writeback land outside the process); the modes alternate twice.
Usage: scripts/bench-fsync-prealloc.py [DIR=.]"""
import mmap
import os
import sys
import time

SEGMENT_BYTES = 64 << 20
COMMITS = 10000
RECORD_BYTES = 800
BLOCK_BYTES = 4096


def machine_busy_s():
    """Every CPU's busy time so far (user, nice, system, irq, softirq, steal)."""
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]) / os.sysconf("SC_CLK_TCK")


def run(directory, mode):
    path = os.path.join(directory, "fsync-prealloc.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    direct = mode.startswith("direct")
    try:
        if mode in ("fallocate", "direct-fallocate"):
            os.posix_fallocate(fd, 0, SEGMENT_BYTES)
        elif mode in ("zeros", "direct-zeros"):
            for _ in range(SEGMENT_BYTES >> 20):
                os.write(fd, b"\0" * (1 << 20))
        os.fsync(fd)
        if direct:
            os.close(fd)
            fd = os.open(path, os.O_RDWR | os.O_DIRECT | os.O_DSYNC)
            # Anonymous memory is page-aligned, as O_DIRECT needs; it holds the tail block onwards.
            buffer = mmap.mmap(-1, 1 << 20)
        record = b"x" * RECORD_BYTES
        wall, cpu, busy = time.perf_counter(), time.process_time(), machine_busy_s()
        end = 0
        for i in range(COMMITS):
            if direct:
                tail = end - end % BLOCK_BYTES
                buffer[end - tail:end - tail + RECORD_BYTES] = record
                end += RECORD_BYTES
                length = -(-(end - tail) // BLOCK_BYTES) * BLOCK_BYTES
                os.pwritev(fd, [memoryview(buffer)[:length]], tail)
                # The block the next record starts in moves to the buffer's front.
                new_tail = end - end % BLOCK_BYTES
                if new_tail > tail:
                    buffer[0:end - new_tail] = buffer[new_tail - tail:end - tail]
            else:
                os.pwrite(fd, record, i * RECORD_BYTES)
                os.fdatasync(fd)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        busy = machine_busy_s() - busy
    finally:
        os.close(fd)
        os.unlink(path)
    print(
        f"{mode:16s} {wall / COMMITS * 1e6:7.1f} us per commit wall, {cpu / COMMITS * 1e6:6.1f} us CPU, "
        f"machine busy {busy / COMMITS * 1e6:6.1f} us"
    )


if __name__ == "__main__":
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    for mode in ["fallocate", "zeros", "append", "direct-zeros", "direct-fallocate"] * 2:
        run(directory, mode)
