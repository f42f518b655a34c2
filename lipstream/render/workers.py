"""The thread pools sessions run their blocking work on: frames on one pool, speech on another.

A server shares one `WorkerPools` between all its sessions. Keeping speech (TTS, feature extraction) off
the frame pool is what stops one session's flood of text from delaying another session's frames: each
session has at most one job in flight on each pool, so the pools' FIFO queues serve sessions in turn, and
the speech threads run at a lower OS priority, so frame work wins the CPU when both want it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def _lower_thread_priority(niceness: int) -> None:
    """Raise this thread's nice value (Linux threads have their own); a no-op where unsupported."""
    if niceness <= 0:
        return
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not permitted
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + niceness)


@dataclass
class WorkerPools:
    """Where a Session runs blocking work; None means asyncio's default executor."""

    render: Executor | None = None  # engine, compositor and encoder work of the frame producer
    speech: Executor | None = None  # TTS synthesis and audio feature extraction

    @classmethod
    def create(cls, render_threads: int, speech_threads: int = 2, speech_niceness: int = 5) -> WorkerPools:
        """Dedicated pools: `render_threads` for frames, `speech_threads` lower-priority ones for speech."""
        render = ThreadPoolExecutor(max(1, render_threads), thread_name_prefix="lipstream-render")
        speech = ThreadPoolExecutor(
            max(1, speech_threads),
            thread_name_prefix="lipstream-speech",
            initializer=_lower_thread_priority,
            initargs=(speech_niceness,),
        )
        return cls(render=render, speech=speech)

    async def run_render(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the frame pool."""
        return await asyncio.get_running_loop().run_in_executor(self.render, functools.partial(fn, *args))

    async def run_speech(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the speech pool."""
        return await asyncio.get_running_loop().run_in_executor(self.speech, functools.partial(fn, *args))

    def shutdown(self) -> None:
        """Stop the dedicated pools (queued jobs are dropped)."""
        for pool in (self.render, self.speech):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
