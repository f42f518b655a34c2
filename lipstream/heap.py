"""Keep a process's heap from holding on to frame-sized memory it has given back.

glibc's malloc raises its mmap threshold each time a large block is freed, after which frame-sized
buffers come from the heap, where fragmentation keeps them resident; and every worker thread may get an
arena of its own. A server that opens and closes sessions for days then sits on hundreds of MB it does
not use, and a prepare that passes thousands of frames between threads can too. Fixing the threshold,
capping arenas and trimming (after each session) keeps RSS near what is in use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 256 * 1024  # blocks this big (a frame, an encoded AU batch) go straight to mmap
TRIM_THRESHOLD_BYTES = 4 * 1024 * 1024
ARENAS = 2


class HeapTrimmer:
    """glibc malloc tuning and trimming; does nothing where the C library is not glibc."""

    def __init__(self) -> None:
        self._libc = _glibc()

    @property
    def available(self) -> bool:
        """True on glibc."""
        return self._libc is not None

    def tune(self) -> None:
        """Fixed mmap and trim thresholds, few arenas (call once, before threads start: at server start, at
        the start of a prepare)."""
        if self._libc is None:
            return
        for option, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
            (M_ARENA_MAX, ARENAS),
        ):
            if not self._libc.mallopt(option, value):
                log.debug("mallopt(%d, %d) was refused", option, value)

    def trim(self) -> None:
        """Give free heap pages back to the OS (after a session ends)."""
        if self._libc is not None:
            self._libc.malloc_trim(0)


def _glibc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # musl and others have no mallopt/malloc_trim
        return None
