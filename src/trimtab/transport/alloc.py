"""A process's allocator, tuned for receiving large frames (glibc's ``mallopt``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["keep_freed_memory"]

# glibc's mallopt() parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_kept_freed_memory = False


def keep_freed_memory() -> bool:
    """Make this process's allocator reuse the memory of freed receive buffers.

    ZeroMQ allocates a fresh buffer for every large frame it receives and frees it when
    the frame is dropped. With glibc's defaults, buffers of a few MiB are mapped and
    unmapped (or trimmed off the heap) each time, so every received byte first costs a
    page fault: 15.6k faults a step per worker in ``trimtab bench datapath``, a third of
    the ZeroMQ I/O thread's CPU (BENCHMARKS.md). Keeping freed memory on the heap lets
    the next frame land in pages already mapped. The price: the process keeps its peak
    of in-flight frames mapped (about one model's worth for a worker). Process-wide and
    idempotent; returns whether it applied (glibc only). Never raises.
    """
    global _kept_freed_memory
    if _kept_freed_memory:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt): nothing to tune
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = (
        mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # frames up to 32 MiB come from the heap
        and mallopt(_M_TRIM_THRESHOLD, 1 << 30)  # and freed ones stay there
        and mallopt(_M_TOP_PAD, 64 << 20)  # grow heaps in large steps
    )
    _kept_freed_memory = bool(ok)
    return _kept_freed_memory
