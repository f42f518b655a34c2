"""Worker threads: the cores a process may use, pools at a lower OS priority (background speech work yields
the CPU to frame work), and iterating on a thread of its own a few items ahead of the consumer (decoding
while the caller tracks)."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity)."""
    return len(os.sched_getaffinity(0))


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

_DONE = object()


class _Failed:
    """An exception raised by the producer, handed to the consumer in order."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def read_ahead(items: Iterable[T], depth: int = 4, name: str = "read-ahead") -> Iterator[T]:
    """Yield `items` in order while a thread produces up to `depth` of them ahead; the producer's errors are
    raised here, and closing this generator early stops the producer (and closes its iterator)."""
    ahead: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        iterator = iter(items)
        try:
            for item in iterator:
                if not put(item):
                    break
            else:
                put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the consumer's side
            put(_Failed(exc))
        finally:
            close = getattr(iterator, "close", None)  # a generator's cleanup (its open file), on this thread
            if close is not None:
                close()

    worker = threading.Thread(target=produce, name=name, daemon=True)
    worker.start()
    try:
        while True:
            item = ahead.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        worker.join()
