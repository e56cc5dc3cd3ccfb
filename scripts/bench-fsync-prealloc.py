#!/usr/bin/env python3
"""What an append + fdatasync costs in a segment made three ways, on the disk under DIR: preallocated
with fallocate (the journal's way), filled with zeros, or grown by each append. Prints wall and CPU
microseconds per commit; the three alternate twice. Usage: scripts/bench-fsync-prealloc.py [DIR=.]"""
import os
import sys
import time

SEGMENT_BYTES = 64 << 20
COMMITS = 3000
RECORD_BYTES = 800


def run(directory, mode):
    path = os.path.join(directory, "fsync-prealloc.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if mode == "fallocate":
            os.posix_fallocate(fd, 0, SEGMENT_BYTES)
        elif mode == "zeros":
            for _ in range(SEGMENT_BYTES >> 20):
                os.write(fd, b"\0" * (1 << 20))
        os.fsync(fd)
        record = b"x" * RECORD_BYTES
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(COMMITS):
            os.pwrite(fd, record, i * RECORD_BYTES)
            os.fdatasync(fd)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        os.close(fd)
        os.unlink(path)
    print(f"{mode:10s} {wall / COMMITS * 1e6:7.1f} us per commit wall, {cpu / COMMITS * 1e6:6.1f} us CPU")


if __name__ == "__main__":
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    for mode in ["fallocate", "zeros", "append"] * 2:
        run(directory, mode)
