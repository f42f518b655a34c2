"""Speech in: the queue of utterances a live session has received and not yet turned into frames.

Audio arrives in chunks (`push_audio`, any rate, resampled here) or as whole sentences with their phoneme
timings (`push_speech_stream`, what a voice makes). Features are made on the speech pool as it arrives; the
producer takes ready frames from the front utterance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterable, Callable

import numpy as np

from lipstream.audio.decode import StreamResampler, to_float32
from lipstream.audio.levels import SilenceDetector
from lipstream.audio.speech import Speech
from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.engines.base import Engine
from lipstream.errors import LipstreamError, QueueFullError
from lipstream.render.session_types import SessionConfig, SessionStats
from lipstream.render.timing import StageTimer
from lipstream.render.utterance import Utterance
from lipstream.render.workers import WorkerPools

log = logging.getLogger(__name__)


class SpeechFeed:
    """Utterances received and not yet produced, with the input checks (queue room, utterance length)."""

    def __init__(
        self,
        engine: Engine,
        config: SessionConfig,
        pools: WorkerPools,
        timer: StageTimer,
        stats: SessionStats,
        generation: Callable[[], int],
        poke: Callable[[], None],
        silence: SilenceDetector | None = None,
    ) -> None:
        """`generation()`: the session's interrupt count (input made before an interrupt is dropped);
        `poke()`: wakes the producer when input arrives."""
        self.engine = engine
        self.config = config
        self.pools = pools
        self.timer = timer
        self.stats = stats
        self.generation = generation
        self.poke = poke
        self.silence = silence or SilenceDetector()
        self.utterances: deque[Utterance] = deque()
        # one resampler for pushed audio at a time: a new input rate replaces it (a table per rate would let
        # a client allocate one per rate, 8000 to 48000)
        self._resampler_now: StreamResampler | None = None
        self._next_uid = 1
        self._input_lock = asyncio.Lock()  # one input operation at a time (a chunk's features, a flush)
        self.produced = asyncio.Event()  # set whenever frames go out (pending speech shrinks)
        self.producing = False  # the session's producer runs (before it does, nothing makes room)
        self.closed = False

    # ----- chunks ----------------------------------------------------------------------------------------

    def push_audio(self, pcm: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
        """Add a chunk to the current utterance, features made here (QueueFullError keeps nothing)."""
        utt, pcm = self._accept_chunk(pcm, sample_rate)
        resampler = self._resampler(sample_rate)
        pcm = pcm if resampler is None else resampler.push(pcm)
        with self.timer.stage("features"):
            utt.append_pcm(pcm)
        self.poke()

    async def push_audio_async(self, pcm: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
        """`push_audio` with resampling and feature extraction on the speech pool, off the event loop."""
        async with self._input_lock:
            utt, pcm = self._accept_chunk(pcm, sample_rate)
            generation = self.generation()
            # the resampler is picked here, on the event loop: an interrupt meanwhile clears it, and the
            # worker must not put a resampler holding the cut speech's tail back
            resampler = self._resampler(sample_rate)
            pcm, feats = await self.pools.run_speech(self._chunk_features, utt, pcm, resampler)
            if generation != self.generation() or utt.flushed:
                return  # interrupted while the features were made: the chunk belongs to dropped speech
            utt.append_segment(pcm, feats)
            self.poke()

    def _accept_chunk(self, pcm: np.ndarray, sample_rate: int) -> tuple[Utterance, np.ndarray]:
        """The chunk as float32 and the utterance it extends, after the queue and length checks."""
        pcm = to_float32(np.asarray(pcm).reshape(-1))
        seconds = len(pcm) / max(1, sample_rate)
        self._check_room(seconds)
        utt = self._open_stream_utterance()
        if utt.samples / SAMPLE_RATE + seconds > self.config.max_utterance_seconds:
            raise LipstreamError(
                f"utterance longer than {self.config.max_utterance_seconds:.0f} s; flush() more often"
            )
        return utt, pcm

    def _check_room(self, seconds: float) -> None:
        """Refuse input that would make the pending speech exceed `max_pending_seconds`."""
        pending = self.pending_seconds
        if pending + seconds > self.config.max_pending_seconds:
            raise QueueFullError(
                f"{pending:.1f} s of speech is still waiting to be played and the limit is "
                f"{self.config.max_pending_seconds:g} s; send more once playback catches up, or interrupt"
            )

    @property
    def pending_seconds(self) -> float:
        """Speech received but not yet produced as frames, over all queued utterances."""
        return sum(utt.pending_samples for utt in self.utterances) / SAMPLE_RATE

    def _resampler(self, sample_rate: int) -> StreamResampler | None:
        """The stream's resampler for this input rate, kept across chunks (no clicks). A rate change inside
        an utterance replaces it; the old one's last few milliseconds are dropped."""
        if sample_rate == SAMPLE_RATE:
            return None
        current = self._resampler_now
        if current is None or current.rate_in != sample_rate:
            if current is not None:
                log.info("pushed audio changed rate %d -> %d Hz mid-utterance", current.rate_in, sample_rate)
            self._resampler_now = StreamResampler(sample_rate, SAMPLE_RATE)
        return self._resampler_now

    def _chunk_features(self, utt: Utterance, pcm: np.ndarray, resampler: StreamResampler | None):
        """Worker: the chunk at 16 kHz and the feature rows it makes final."""
        with self.timer.stage("features"):
            pcm = pcm if resampler is None else resampler.push(pcm)
            return pcm, utt.stream_features(pcm)

    def flush(self) -> None:
        """End of the current utterance's input: it plays to the end, then the presenter idles."""
        resampler, self._resampler_now = self._resampler_now, None
        if resampler is not None:
            tail = resampler.flush()
            if tail.size and self.utterances and not self.utterances[-1].flushed:
                self.utterances[-1].append_pcm(tail)
        for utt in self.utterances:
            if not utt.flushed:
                with self.timer.stage("features"):
                    utt.flush()
        self.poke()

    async def flush_async(self) -> None:
        """`flush`, after any chunk still being analysed (the same resampler and feature stream)."""
        async with self._input_lock:
            self.flush()

    # ----- sentences ---------------------------------------------------------------------------------------

    async def push_speech_stream(
        self, speeches: AsyncIterable[Speech], on_utterance: Callable[[int], None] | None = None
    ) -> int:
        """Speak sentences that arrive in order as one utterance; the next one is pulled only while less
        than `tts_lookahead_seconds` waits to be played. Returns the utterance id."""
        async with self._input_lock:
            self.flush()  # a sentence stream is its own utterance
            utt = self._new_utterance("text")
        if on_utterance is not None:
            on_utterance(utt.id)
        generation = self.generation()
        lookahead = min(self.config.tts_lookahead_seconds, self.config.max_pending_seconds)
        stream = aiter(speeches)
        try:
            while generation == self.generation():
                await self._wait_for_room(generation, lookahead)
                if generation != self.generation():
                    break
                speech = await anext(stream, None)
                if speech is None or generation != self.generation():
                    break
                with self.timer.stage("features"):
                    pcm, feats = await self.pools.run_speech(utt.segment, speech)
                if generation != self.generation():
                    break
                utt.append_segment(pcm, feats, text=speech.text, text_samples=speech.text_samples)
                self.poke()
        finally:
            closing = getattr(stream, "aclose", None)
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing()
            utt.flush()
            self.poke()
        return utt.id

    async def _wait_for_room(self, generation: int, limit_seconds: float) -> None:
        """Wait until pending speech is under `limit_seconds` (frames going out make room) or an interrupt."""
        while self.pending_seconds >= limit_seconds and generation == self.generation():
            if self.closed or not self.producing:
                return
            self.produced.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.produced.wait(), timeout=1.0)

    # ----- the queue -------------------------------------------------------------------------------------

    def _new_utterance(self, kind: str) -> Utterance:
        utt = Utterance(self._next_uid, self.engine, self.silence, kind)
        self._next_uid += 1
        self.utterances.append(utt)
        self.stats.utterances += 1
        return utt

    def _open_stream_utterance(self) -> Utterance:
        last = self.utterances[-1] if self.utterances else None
        if last is not None and not last.flushed and last.kind == "stream":
            return last
        return self._new_utterance("stream")

    def clear(self) -> None:
        """Drop every queued utterance and the resampler's state (an interrupt)."""
        self.utterances.clear()
        self._resampler_now = None
