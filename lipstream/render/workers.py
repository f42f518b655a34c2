"""The thread pools sessions run their blocking work on: frames on one pool, speech on another.

A server shares one `WorkerPools` between all its sessions. Keeping speech (TTS, feature extraction) off
the frame pool is what stops one session's flood of text from delaying another session's frames: each
session has at most one job in flight on each pool, so the pools' FIFO queues serve sessions in turn, and
the speech threads run at a lower OS priority, so frame work wins the CPU when both want it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from lipstream.threads import background_pool

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class WorkerPools:
    """Where a Session runs blocking work; None means asyncio's default executor."""

    render: Executor | None = None  # engine, compositor and encoder work of the frame producer
    speech: Executor | None = None  # TTS synthesis and audio feature extraction

    @classmethod
    def create(cls, render_threads: int, speech_threads: int = 2, speech_niceness: int = 5) -> WorkerPools:
        """Dedicated pools: `render_threads` for frames, `speech_threads` lower-priority ones for speech."""
        render = ThreadPoolExecutor(max(1, render_threads), thread_name_prefix="lipstream-render")
        speech = background_pool(speech_threads, "lipstream-speech", speech_niceness)
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
