"""A real Pipecat output transport that plays into nothing, at the pace of a sound card, and a watcher of
the bot-speaking frames it sends back upstream (tests/pipecat/test_pipecat_processor.py uses both).

`PacedOutput` is `BaseOutputTransport` itself (its media sender, audio chunking and resampling, audio
queue, interruption handling and bot-speaking logic) with the two writes a real transport implements: a
chunk of audio takes its own duration to write, as a blocking device write does, so the transport's
queue fills and drains as in a call; pictures are accepted and dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    Frame,
    OutputAudioRawFrame,
    OutputImageRawFrame,
    StartFrame,
    TTSAudioRawFrame,
)
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.workers.runner import WorkerRunner


class PacedOutput(BaseOutputTransport):
    """Writes audio chunks in real time to nowhere, recording each as (start time, TTS audio?, peak)."""

    def __init__(self, size: tuple[int, int]) -> None:
        """`size`: the pictures' size (the transport would resize others, costing CPU for nothing)."""
        params = TransportParams(
            audio_out_enabled=True, video_out_enabled=True, video_out_width=size[0],
            video_out_height=size[1], video_out_framerate=25, audio_out_end_silence_secs=0,
        )  # fmt: skip
        super().__init__(params)
        self.written: list[tuple[float, bool, int]] = []
        self.arrived: list[tuple[float, dict]] = []  # (arrival, metadata["lipstream"]) of avatar audio
        self._clock = 0.0

    async def start(self, frame: StartFrame) -> None:
        """Ready at once (no connection to make)."""
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Note which avatar frame each arriving audio frame is, then do what the base class does."""
        if isinstance(frame, OutputAudioRawFrame) and "lipstream" in frame.metadata:
            self.arrived.append((time.perf_counter(), frame.metadata["lipstream"]))
        await super().process_frame(frame, direction)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        """Play the chunk: it starts when the previous one ends (or now, after a gap) and lasts its length."""
        now = time.perf_counter()
        if now > self._clock + 0.01:  # nothing was left to play (timer jitter aside): playing restarts now
            self._clock = now
        peak = int(np.abs(np.frombuffer(frame.audio, np.int16)).max(initial=0))
        self.written.append((self._clock, isinstance(frame, TTSAudioRawFrame), peak))
        self._clock += len(frame.audio) / (2 * frame.sample_rate * frame.num_channels)
        await asyncio.sleep(max(0.0, self._clock - time.perf_counter()))
        return True

    def speech_chunks(self) -> int:
        """How many chunks of TTS audio (the face's speech) were written so far."""
        return sum(is_tts for _, is_tts, _ in self.written)

    async def write_video_frame(self, frame: OutputImageRawFrame) -> bool:
        """Shown (nowhere)."""
        return True


class Watcher(FrameProcessor):
    """Records the bot-speaking frames going upstream past it: (time, 'started'/'stopped', chunks written)."""

    def __init__(self, output: PacedOutput) -> None:
        """`output`: the transport whose written chunks are counted at each event."""
        super().__init__()
        self.output = output
        self.events: list[tuple[float, str, int]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Record, pass everything on."""
        await super().process_frame(frame, direction)
        if direction == FrameDirection.UPSTREAM and isinstance(
            frame, (BotStartedSpeakingFrame, BotStoppedSpeakingFrame)
        ):
            kind = "started" if isinstance(frame, BotStartedSpeakingFrame) else "stopped"
            self.events.append((time.perf_counter(), kind, len(self.output.written)))
        await self.push_frame(frame, direction)


async def until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    """Wait until `condition()` holds, checking every 5 ms."""
    deadline = time.perf_counter() + timeout
    while not condition():
        assert time.perf_counter() < deadline, "timed out waiting for the pipeline"
        await asyncio.sleep(0.005)


async def play(worker: PipelineWorker, script: Awaitable[None], timeout: float = 60.0) -> None:
    """Run `worker` while `script` drives it; a failing script cancels the worker, so the test fails now."""
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.ensure_future(runner.run())
    try:
        await asyncio.wait_for(script, timeout)
    except BaseException:
        await worker.cancel()
        await asyncio.wait_for(running, 10)
        raise
    await asyncio.wait_for(running, timeout)
