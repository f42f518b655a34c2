"""The microphone side of a conversation: resampling, echo cancellation, voice activity, the recent audio.

Everything here runs on one thread of its own: the microphone must keep up with real time even while the
speech pools are busy transcribing or synthesising. The turn logic never touches the VAD directly: it gets
the VAD's events back from `hear`, and ends a turn the detector judged finished with an explicit `end_turn`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from lipstream.audio.decode import StreamResampler, to_float32
from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.talk.hearing.echo import EchoCanceller
from lipstream.talk.hearing.echo_gate import EchoGate
from lipstream.talk.hearing.mic_buffer import MicBuffer
from lipstream.talk.hearing.vad import VadEvent, VoiceActivityDetector

MAX_REFERENCES = 500  # frames of the avatar's audio kept for the canceller with no microphone coming in: 20 s
# a player stall: the last chunks' playback offsets agree with each other (within STALL_SPREAD_MS) and sit
# behind the 2 s median by the canceller's own resync threshold or more. Followed at once: the median alone
# took a second to move, and meanwhile the misplaced echo read as the user over it and the avatar
# interrupted itself
STALL_CHUNKS = 8
STALL_SPREAD_MS = 30.0


@dataclass(frozen=True)
class Heard:
    """What one microphone chunk caused: the VAD's events, and the open turn's silence after it (0 while the
    user speaks), both read on the listener's thread (the VAD is not thread-safe)."""

    events: list[VadEvent]
    silence_ms: float


class MicListener:
    """One user's microphone: 16 kHz audio with the avatar's echo removed, and the VAD's events."""

    def __init__(
        self, vad: VoiceActivityDetector, echo: EchoCanceller | None, start_ms: float, end_silence_ms: float
    ) -> None:
        """`vad`: this stream's detector; `echo`: a canceller fed with what the avatar plays (None: the
        microphone is used as it comes); `start_ms`/`end_silence_ms`: the VAD's start and end durations,
        for the echo gate's settling time."""
        self.vad = vad
        self.echo = echo
        self.mic = MicBuffer()
        self._resamplers: dict[int, StreamResampler] = {}
        self._references: deque[tuple[int, np.ndarray]] = deque()
        self._mic_clock = 0.0  # microphone samples (16 kHz) received so far
        self._mic_offsets: deque[float] | None = deque(maxlen=100) if echo is not None else None
        self._gate = EchoGate(echo, vad, start_ms, end_silence_ms)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="lipstream-listen")

    async def hear(self, pcm: np.ndarray, sample_rate: int, playback_position: int) -> Heard:
        """Analyse one microphone chunk (int16 or float, mono, 8-48 kHz) that arrived now; `playback_position`
        is the pts the player reports playing. Returns the VAD events it caused; its audio joins `mic`."""
        now = time.perf_counter()
        playback = self._playback_at_capture(len(pcm) * SAMPLE_RATE / max(1, sample_rate), playback_position)
        loop = asyncio.get_running_loop()
        clean, heard = await loop.run_in_executor(self._thread, self._analyse, pcm, sample_rate, playback)
        self.mic.append(clean, now)
        return heard

    async def end_turn(self) -> VadEvent | None:
        """End the open turn in its silence now (a detector judged it finished): the `speech_end` event,
        or None when the user is speaking again. Runs on the listener's thread, between two chunks."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, self.vad.end_turn)

    def add_reference(self, pts: int, pcm: np.ndarray) -> None:
        """The audio of a frame the avatar plays at `pts` (what the echo canceller removes)."""
        if self.echo is None:
            return
        self._references.append((pts, pcm))
        while len(self._references) > MAX_REFERENCES:
            self._references.popleft()

    def _playback_at_capture(self, samples: float, position: int) -> int | None:
        """The pts the player was playing when the chunk's last sample was captured. Microphone and
        loudspeaker share the player's clock, so (playback - microphone samples) is constant but for
        jitter: chunks arriving late, position reports arriving late. The median of the last 2 s ignores
        both, and keeps the echo canceller from re-synchronising on every hiccup."""
        self._mic_clock += samples
        if self.echo is None or self._mic_offsets is None:
            return None
        offsets, jump = self._mic_offsets, self.echo.resync  # a smaller step the canceller ignores anyway
        offsets.append(position - self._mic_clock)
        median = float(np.median(offsets))
        if len(offsets) > STALL_CHUNKS:
            recent = list(offsets)[-STALL_CHUNKS:]
            spread, step = max(recent) - min(recent), median - max(recent)
            if spread <= STALL_SPREAD_MS * SAMPLE_RATE / 1000 and step >= jump:
                offsets.clear()  # the player stalled: its new timeline from now on
                offsets.extend(recent)
                median = float(np.median(recent))
        return int(self._mic_clock + median)

    def _analyse(self, pcm: np.ndarray, rate: int, playback: int | None) -> tuple[np.ndarray, Heard]:
        """Worker: 16 kHz float audio with the avatar's echo removed, and the VAD's events."""
        audio = to_float32(np.asarray(pcm).reshape(-1))
        if rate != SAMPLE_RATE:
            if rate not in self._resamplers:
                self._resamplers[rate] = StreamResampler(rate, SAMPLE_RATE)
            audio = self._resamplers[rate].push(audio)
        heard = audio
        if self.echo is not None:
            while self._references:  # fed here, on the same worker thread that runs the canceller
                self.echo.add_reference(*self._references.popleft())
            if audio.size:
                cleaned, echo_only = self.echo.process_gated(audio, playback)
                audio = np.asarray(cleaned, dtype=np.float32)
                # the VAD hears silence where only residual echo is left (STT still gets all of it)
                heard = np.where(echo_only, np.float32(0.0), audio)
        events = self._gate.gate(self.vad.push(heard), len(heard))
        return audio, Heard(events, self.vad.silence_ms)

    def close(self) -> None:
        """Stop the listener's thread."""
        self._thread.shutdown(wait=False, cancel_futures=True)
