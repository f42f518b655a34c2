"""Worker threads at a lower OS priority: background speech work yields the CPU to frame work."""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor


def lower_thread_priority(niceness: int) -> None:
    """Raise this thread's nice value (Linux threads have their own); a no-op where unsupported."""
    if niceness <= 0:
        return
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not permitted
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + niceness)


def background_pool(threads: int, name: str, niceness: int = 5) -> ThreadPoolExecutor:
    """A pool of `threads` threads named `name`-N, each `niceness` steps nicer than the process."""
    return ThreadPoolExecutor(
        max(1, threads), thread_name_prefix=name, initializer=lower_thread_priority, initargs=(niceness,)
    )
