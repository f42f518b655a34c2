"""The streaming Session: push audio or text, iterate frames on the audio clock.

Shape (like the SDKs users like): `push_audio`, `push_text`, `flush`, `interrupt`, and `async for item in
session`, where each item is an `AvatarFrame` or a `SessionEvent`, in order. The stream never stops while the
session is open: when nobody speaks, idle frames (the presenter's own closed mouth, silent audio) keep the
timeline going, so the client's audio clock is always fed.

Timeline rules (see docs/protocol.md):
- frame k of the session has pts = k * 640 samples (16 kHz) and carries exactly that slice of audio;
- production runs ahead of the playback position by at most `max_lead_seconds` while speech is pending,
  and `idle_lead_seconds` while idle, so a new utterance reaches the screen quickly;
- the playback position is the client's own report (`update_playback_position`) when it sends one, else a
  wall-clock estimate;
- `interrupt()` emits `playback_finished(interrupted=True, position_samples=P)` and the stream continues from
  pts P (slightly ahead of the playback position): clients drop anything buffered with pts >= P.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

import cv2
import numpy as np
from pydantic import BaseModel, Field

from lipstream.audio.decode import StreamResampler, to_float32, to_int16
from lipstream.audio.levels import SilenceDetector, frame_rms
from lipstream.audio.timeline import FPS, SAMPLE_RATE, SAMPLES_PER_FRAME
from lipstream.avatar.bundle import CROP_SIZE, AvatarBundle
from lipstream.engines.base import Engine, FeatureStream, Speech
from lipstream.errors import LipstreamError, QueueFullError
from lipstream.render.accel import AccelConfig, PatchScheduler, load_codebook, resolve_accel
from lipstream.render.base_frames import SharedBaseFrames, stream_size
from lipstream.render.compositor import Compositor
from lipstream.render.frames import AvatarFrame
from lipstream.render.patch_stream import patch_rect
from lipstream.render.timing import RenderObserver, StageTimer
from lipstream.render.workers import WorkerPools

log = logging.getLogger(__name__)

FRAME_SECONDS = 1.0 / FPS
FIRST_BATCH_FRAMES = 2
LATE_WARNING_SECONDS = 0.1
CLOCK_SLACK_SECONDS = 0.5


class SessionConfig(BaseModel):
    """Options of one live session."""

    encode: bool = True  # emit H.264 access units (else raw RGB images)
    # scale the stream down to the largest allowed size not wider than this (base_frames.stream_sizes);
    # None = the avatar's own size
    output_width: int | None = None
    bitrate: int = 2_500_000
    voice: str = "piper"
    max_lead_seconds: float = Field(1.0, gt=0)  # how far production may run ahead of playback during speech
    idle_lead_seconds: float = Field(0.12, ge=0)  # ... and while idle (small: a new utterance starts soon)
    interrupt_margin_frames: int = Field(2, ge=1)  # the stream resumes this far ahead of playback
    max_utterance_seconds: float = 600.0
    # unproduced speech a session may hold across utterances: pushed PCM over it is refused, TTS waits
    max_pending_seconds: float = Field(180.0, gt=0)
    tts_lookahead_seconds: float = Field(15.0, gt=0)  # TTS runs at most this far ahead of playback
    queue_frames: int = Field(8, ge=1)  # produced frames waiting for the consumer
    accel: AccelConfig = Field(default_factory=AccelConfig)
    # "full": composite and encode whole frames (what recorders and `lipstream client --out` need);
    # "patch": encode only the crop-space mouth rectangle, the client composites it (docs/protocol.md)
    stream: Literal["full", "patch"] = "full"
    patch_bitrate: int = Field(300_000, gt=0)  # cap of the patch stream (a 256×96 picture at 25 fps)


@dataclass
class SessionEvent:
    """An event on the frame stream."""

    type: Literal["speech_started", "playback_finished", "text", "error"]
    utterance_id: int | None = None
    position_samples: int = 0
    interrupted: bool = False
    message: str = ""  # the error's message, or a `text` event's text (what is said from position_samples on)


@dataclass
class SessionStats:
    """Running figures of a session (also what the server's admin endpoint shows)."""

    frames: int = 0
    speech_frames: int = 0
    idle_frames: int = 0
    utterances: int = 0
    interrupts: int = 0
    underruns: int = 0  # frames where speech input was late, filled with an idle frame
    late_frames: int = 0  # frames produced after their due time on the playback clock
    max_late_ms: float = 0.0
    ttff_ms: list[float] = field(default_factory=list)  # first push -> first speech frame, per utterance
    stage_ms: dict[str, float] = field(default_factory=dict)
    neural_frames: int = 0
    accel: dict[str, int] = field(default_factory=dict)  # keyframes, codebook_hits, infill_frames, ...

    def as_dict(self) -> dict:
        """JSON-friendly view."""
        return {
            "frames": self.frames,
            "speech_frames": self.speech_frames,
            "idle_frames": self.idle_frames,
            "utterances": self.utterances,
            "interrupts": self.interrupts,
            "underruns": self.underruns,
            "late_frames": self.late_frames,
            "max_late_ms": round(self.max_late_ms, 1),
            "ttff_ms": [round(v, 1) for v in self.ttff_ms],
            "stage_ms": self.stage_ms,
            "neural_frames": self.neural_frames,
            **{k: v for k, v in self.accel.items() if k not in ("frames", "neural_frames")},
        }


class _Utterance:
    """One utterance's input and its progress through the renderer.

    Only what is not yet produced is kept (audio from frame `emitted` on, feature rows not yet taken), so
    a long live utterance costs the same per push as a short one."""

    def __init__(self, uid: int, engine: Engine, silence: SilenceDetector, kind: str) -> None:
        self.id = uid
        self.kind = kind  # "stream" (push_audio chunks) or "text" (TTS sentences)
        self._pcm = np.zeros(0, dtype=np.float32)  # audio of frames emitted.. onwards
        self._samples = 0  # samples received in all
        self._features: list[np.ndarray] = []  # final feature rows not yet taken, in chunks
        self.feature_rows = 0  # final feature rows in all
        self.stream: FeatureStream | None = None
        self.engine = engine
        self.silence = silence
        self.flushed = False
        self.emitted = 0  # frames of this utterance already produced
        self.first_push = time.perf_counter()
        self.started = False
        # (sample offset in the utterance, samples it lasts, the text said there)
        self.marks: deque[tuple[int, int, str]] = deque()

    def _append_audio(self, pcm: np.ndarray) -> None:
        self._pcm = np.concatenate([self._pcm, pcm])
        self._samples += len(pcm)

    def append_pcm(self, pcm: np.ndarray) -> None:
        """Streaming input: add audio and pull any features that became final."""
        self.append_segment(pcm, self.stream_features(pcm))

    def stream_features(self, pcm: np.ndarray) -> np.ndarray:
        """Feature rows that `pcm`, the next chunk of streamed audio, makes final (may run on a worker;
        `append_segment` then adds chunk and rows on the event loop)."""
        if self.stream is None:
            self.stream = self.engine.stream_features()
        return np.asarray(self.stream.push(pcm), dtype=np.float32)

    def segment(self, speech: Speech) -> tuple[np.ndarray, np.ndarray]:
        """Audio padded to whole frames and its features, for a whole segment (a TTS sentence with
        phoneme timings). Pure, so it can run on a worker thread; `append_segment` then adds it."""
        pad = (-len(speech.pcm)) % SAMPLES_PER_FRAME
        pcm = np.concatenate([speech.pcm, np.zeros(pad, dtype=np.float32)])
        seg = Speech(pcm=pcm, phonemes=speech.phonemes, text=speech.text, source=speech.source)
        feats = np.asarray(self.engine.features(seg), dtype=np.float32)[: seg.frame_count]
        if len(feats) < seg.frame_count:
            feats = _pad_rows(feats, seg.frame_count, self.engine.feature_dim)
        return pcm, feats

    def append_segment(self, pcm: np.ndarray, feats: np.ndarray, text: str | None = None) -> None:
        """Add a segment made by `segment` (on the event loop, where the producer reads the utterance);
        `text`, when given, is what the segment says: it becomes a `text` event at its first frame."""
        if text:
            self.marks.append((self._samples, len(pcm), text))
        self._append_audio(pcm)
        self._add_features(feats)

    def take_marks(self, first_tick: int, count: int) -> list[tuple[int, int, str]]:
        """(tick, samples, text) of the marks starting in the `count` frames just taken, which play from
        `first_tick`."""
        start = self.emitted - count  # utterance frame of first_tick
        due = []
        while self.marks and self.marks[0][0] < self.emitted * SAMPLES_PER_FRAME:
            offset, samples, text = self.marks.popleft()
            due.append((first_tick + max(0, offset // SAMPLES_PER_FRAME - start), samples, text))
        return due

    def flush(self) -> None:
        """No more input: pad the audio to a whole frame and finish the feature stream."""
        if self.flushed:
            return
        self.flushed = True
        pad = (-self._samples) % SAMPLES_PER_FRAME
        if pad:
            tail = np.zeros(pad, dtype=np.float32)
            self._append_audio(tail)
            if self.stream is not None:
                self._add_features(self.stream.push(tail))
        if self.stream is not None:
            self._add_features(self.stream.finish())
        total = self.total_frames
        if self.feature_rows < total:
            self._add_features(np.zeros((total - self.feature_rows, self.engine.feature_dim), np.float32))

    def _add_features(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.float32)
        if rows.size:
            self._features.append(rows.reshape(len(rows), -1))
            self.feature_rows += len(rows)

    @property
    def samples(self) -> int:
        """Samples of audio received so far."""
        return self._samples

    @property
    def pending_samples(self) -> int:
        """Samples received but not yet produced as frames."""
        return max(0, self._samples - self.emitted * SAMPLES_PER_FRAME)

    @property
    def total_frames(self) -> int:
        """Frames of audio received so far (whole frames)."""
        return self._samples // SAMPLES_PER_FRAME

    def ready_frames(self) -> int:
        """Frames that have both audio and final features and are not yet produced."""
        return max(0, min(self.total_frames, self.feature_rows) - self.emitted)

    @property
    def done(self) -> bool:
        """Everything received has been produced and no more is coming."""
        return self.flushed and self.emitted >= self.total_frames

    def take(self, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Features, audio and speaking mask of the next `count` ready frames (dropped from the buffers)."""
        pending = np.concatenate(self._features) if len(self._features) > 1 else self._features[0]
        feats, rest = pending[:count], pending[count:]
        self._features = [rest] if len(rest) else []
        split = count * SAMPLES_PER_FRAME
        audio, self._pcm = self._pcm[:split], self._pcm[split:]
        speaking = ~self.silence.mask_from_levels(frame_rms(audio))
        self.emitted += count
        return feats, audio, speaking


async def _one(text: str) -> AsyncIterator[str]:
    yield text


def _pad_rows(rows: np.ndarray, n: int, dim: int) -> np.ndarray:
    out = np.zeros((n, dim), dtype=np.float32)
    out[: len(rows)] = rows.reshape(len(rows), -1)[:, :dim]
    return out


class PlaybackClock:
    """Where playback is now, in frames: the client's report when there is one, else wall time."""

    def __init__(self) -> None:
        self._origin: float | None = None  # wall time of tick 0
        self._report: tuple[int, float] | None = None  # (pts samples, wall time received)

    def start(self, now: float) -> None:
        """Tick 0 is being shown at `now` (set at the first frame)."""
        if self._origin is None:
            self._origin = now

    def report(self, pts_samples: int, now: float) -> None:
        """The client says it is playing `pts_samples` now."""
        self._report = (int(pts_samples), now)

    def max_position(self, now: float) -> int:
        """The furthest pts a real player can have reached by `now`: real time since the first frame,
        plus 0.5 s and 0.1 % for a sound card clock running fast."""
        if self._origin is None:
            return 0
        elapsed = max(0.0, now - self._origin)
        return int((elapsed * 1.001 + CLOCK_SLACK_SECONDS) * SAMPLE_RATE)

    def position_frames(self, now: float) -> float:
        """Estimated frame being played at `now` (fractional)."""
        if self._report is not None:
            pts, at = self._report
            return pts / SAMPLES_PER_FRAME + (now - at) * FPS
        if self._origin is None:
            return 0.0
        return (now - self._origin) * FPS


class Session:
    """A live avatar session: audio/text in, frames on the audio clock out."""

    def __init__(
        self,
        avatar: AvatarBundle,
        engine: Engine,
        config: SessionConfig | None = None,
        *,
        tts_factory=None,
        silence: SilenceDetector | None = None,
        pools: WorkerPools | None = None,
        base_frames: SharedBaseFrames | None = None,
        observer: RenderObserver | None = None,
    ) -> None:
        self.avatar = avatar
        self._observer = observer  # the server's metrics, when it keeps any
        self._pools = pools or WorkerPools()  # a server shares its pools between sessions
        self.engine = engine
        self.config = config or SessionConfig()
        self._stats = SessionStats()
        self._timer = StageTimer(listener=observer.stage if observer is not None else None)
        self._silence = silence or SilenceDetector()
        self._tts_factory = tts_factory
        self._tts: dict[str, object] = {}
        self._clock = PlaybackClock()
        self._utterances: deque[_Utterance] = deque()
        # one resampler for pushed audio at a time: a new input rate replaces it (a table per rate would let
        # a client allocate one per rate, 8000 to 48000)
        self._resampler_now: StreamResampler | None = None
        self._next_uid = 1
        self._tick = 0
        self._out: asyncio.Queue | None = None
        self._wake: asyncio.Event | None = None
        self._produced: asyncio.Event | None = None  # set whenever frames go out (pending speech shrinks)
        self._input_lock = asyncio.Lock()  # one input operation at a time (a chunk's features, a flush)
        self._task: asyncio.Task | None = None
        self._closed = False
        self._force_idr = True
        self._pending_events: list[SessionEvent] = []
        self._said: deque[tuple[int, int, int, str]] = deque(maxlen=256)  # (utterance, pts, samples, text)
        self._speech_until = 0  # pts where the last speech frame produced ends
        self._speech_uid: int | None = None  # the utterance that frame belongs to
        self._encoder = None
        self._patch_stream = self.config.stream == "patch"
        # patch mode: the client composites onto the avatar's own-size base loop, so no scaled sizes
        width = None if self._patch_stream else self.config.output_width
        self.width, self.height = stream_size(avatar.size, width)
        self.patch_rect = patch_rect(avatar) if self._patch_stream else None
        self._patch_resting = True  # the previous frame had no patch: the next patch is an IDR
        shared = base_frames.get(avatar, (self.width, self.height)) if base_frames is not None else None
        self._compositor = Compositor(avatar, engine.patch_size, (self.width, self.height), base=shared)
        self._generation = 0  # bumped by interrupt(): work started before it is discarded
        self._encoded_generation = 0
        self._scheduled_generation = 0
        accel = resolve_accel(self.config.accel, engine)
        codebook = None
        if accel.enabled and accel.codebook:
            codebook = load_codebook(avatar, engine, accel)  # read-only: sessions never save it
        self._scheduler = PatchScheduler(avatar, engine, accel, codebook, self._timer)

    # ----- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the producer; frames begin to flow at once (idle until speech arrives)."""
        if self._task is not None:
            return
        # everything that depends only on the avatar is made (or read from its cache) before the
        # first frame, so the first utterance does not pay for it
        await self._pools.run_render(self._warm_up)
        if self.config.encode:
            from lipstream.media.h264 import H264StreamEncoder

            if self._patch_stream:
                x0, y0, x1, y1 = self.patch_rect
                self._encoder = H264StreamEncoder(
                    x1 - x0, y1 - y0, fps=FPS, bitrate=self.config.patch_bitrate, threads=1
                )
            else:
                # the compositor already works at the stream size and hands over I420 pictures
                self._encoder = H264StreamEncoder(
                    self.width, self.height, fps=FPS, bitrate=self.config.bitrate
                )
        self._out = asyncio.Queue(maxsize=self.config.queue_frames)
        self._wake = asyncio.Event()
        self._produced = asyncio.Event()
        self._task = asyncio.create_task(self._produce(), name=f"session-{self.avatar.name}")

    async def aclose(self) -> None:
        """Stop producing and free the encoder."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._task = None
        self._utterances.clear()
        self._encoder = None

    async def __aenter__(self) -> Session:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _warm_up(self) -> None:
        self.engine.prepare(self.avatar)
        if self._patch_stream:
            return  # no composite on the server: neither base pictures nor blend geometry are needed
        if self.config.encode:
            self._compositor.base.i420(0)  # builds the avatar's I420 cache at this size once
        for index in self.avatar.idle_loop[: len(self.avatar.idle_loop) // 2 + 1]:
            self._compositor.geometry(int(index))

    @property
    def stats(self) -> SessionStats:
        """Running figures; stage times and acceleration counts are read from their sources when asked."""
        self._stats.stage_ms = self._timer.mean_ms(self._stats.frames)
        self._stats.accel = self._scheduler.stats.as_dict()
        self._stats.neural_frames = self._scheduler.stats.neural_frames
        return self._stats

    @property
    def codec_string(self) -> str:
        """WebCodecs codec string of the H.264 stream (empty when not encoding)."""
        return self._encoder.codec_string if self._encoder is not None else ""

    # ----- input ---------------------------------------------------------------------------------------

    def push_audio(self, pcm: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
        """Add a chunk of speech (int16 or float32 mono, any rate) to the current utterance.

        Raises QueueFullError (and keeps nothing of the chunk) when the session already holds
        `max_pending_seconds` of speech not yet produced."""
        utt, pcm = self._accept_chunk(pcm, sample_rate)
        pcm = self._resample_chunk(pcm, sample_rate)
        with self._timer.stage("features"):
            utt.append_pcm(pcm)
        self._poke()

    async def push_audio_async(self, pcm: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
        """`push_audio` with resampling and feature extraction on the speech pool, off the event loop."""
        async with self._input_lock:
            utt, pcm = self._accept_chunk(pcm, sample_rate)
            generation = self._generation
            # the resampler is picked here, on the event loop: an interrupt meanwhile clears the table, and
            # the worker must not put a resampler holding the cut speech's tail back into it
            resampler = self._resampler(sample_rate)
            pcm, feats = await self._pools.run_speech(self._chunk_features, utt, pcm, resampler)
            if generation != self._generation or utt.flushed:
                return  # interrupted while the features were made: the chunk belongs to dropped speech
            utt.append_segment(pcm, feats)
            self._poke()

    def _accept_chunk(self, pcm: np.ndarray, sample_rate: int) -> tuple[_Utterance, np.ndarray]:
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
        return sum(utt.pending_samples for utt in self._utterances) / SAMPLE_RATE

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

    def _resample_chunk(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        resampler = self._resampler(sample_rate)
        return pcm if resampler is None else resampler.push(pcm)

    def _chunk_features(self, utt: _Utterance, pcm: np.ndarray, resampler: StreamResampler | None):
        """Worker: the chunk at 16 kHz and the feature rows it makes final."""
        with self._timer.stage("features"):
            pcm = pcm if resampler is None else resampler.push(pcm)
            return pcm, utt.stream_features(pcm)

    def flush(self) -> None:
        """End of the current utterance's input: it plays to the end, then the presenter idles."""
        resampler, self._resampler_now = self._resampler_now, None
        if resampler is not None:
            tail = resampler.flush()
            if tail.size and self._utterances and not self._utterances[-1].flushed:
                self._utterances[-1].append_pcm(tail)
        for utt in self._utterances:
            if not utt.flushed:
                with self._timer.stage("features"):
                    utt.flush()
        self._poke()

    async def flush_async(self) -> None:
        """`flush`, after any chunk still being analysed (the same resampler and feature stream)."""
        async with self._input_lock:
            self.flush()

    async def push_text(self, text: str, voice: str | None = None) -> None:
        """Speak `text` via offline TTS, one sentence at a time (the first plays while the rest renders).

        Synthesis runs at most `tts_lookahead_seconds` ahead of playback, so a long text costs memory and
        CPU only as fast as it is spoken."""
        await self.push_text_stream(_one(text), voice=voice)

    async def push_text_stream(
        self,
        texts: AsyncIterable[str],
        voice: str | None = None,
        on_utterance: Callable[[int], None] | None = None,
        on_audio: Callable[[Speech], None] | None = None,
    ) -> int:
        """Speak text that arrives in pieces (a language model's sentences) as one utterance, each piece
        synthesised as soon as it arrives; returns the utterance id (`on_utterance` gets it at once, and
        `on_audio` each synthesised sentence). Each sentence becomes a `text` event at its first frame."""
        # loading a voice the server has not used yet takes a second: not on the event loop
        tts = await self._pools.run_speech(self._get_tts, voice or self.config.voice)
        async with self._input_lock:
            self.flush()  # text is its own utterance
            utt = self._new_utterance("text")
        if on_utterance is not None:
            on_utterance(utt.id)
        generation = self._generation
        lookahead = min(self.config.tts_lookahead_seconds, self.config.max_pending_seconds)
        try:
            async for text in texts:
                if generation != self._generation:
                    break
                sentences = await self._pools.run_speech(lambda t=text: iter(tts.synthesize_sentences(t)))
                while generation == self._generation:
                    await self._wait_for_room(generation, lookahead)
                    speech = None if generation != self._generation else (
                        await self._pools.run_speech(next, sentences, None)
                    )
                    if speech is None or generation != self._generation:
                        break
                    with self._timer.stage("features"):
                        pcm, feats = await self._pools.run_speech(utt.segment, speech)
                    if generation != self._generation:
                        break
                    utt.append_segment(pcm, feats, text=speech.text)
                    if on_audio is not None:
                        on_audio(speech)
                    self._poke()
        finally:
            utt.flush()
            self._poke()
        return utt.id

    async def run_speech_work(self, fn, *args):
        """Run blocking speech-side work (decoding an upload, say) on the session's speech pool."""
        return await self._pools.run_speech(fn, *args)

    async def _wait_for_room(self, generation: int, limit_seconds: float) -> None:
        """Wait until pending speech is under `limit_seconds` (frames going out make room) or an interrupt."""
        while self.pending_seconds >= limit_seconds and generation == self._generation:
            if self._produced is None or self._closed:
                return
            self._produced.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._produced.wait(), timeout=1.0)

    def interrupt(self) -> int:
        """Stop speaking now: drop pending input and frames; the stream resumes just ahead of playback, at
        the pts this returns (where the speech was cut)."""
        self._generation += 1
        drained = self._drain_out()
        had_speech = bool(self._utterances) or any(
            isinstance(item, AvatarFrame) and item.speaking for _, item in drained
        )
        # the utterance being heard: the last one that produced speech while it still plays (it may be
        # produced to its end and gone from the queue), else the first queued one
        if self._speech_uid is not None and self.playback_position() < self._speech_until:
            active = self._speech_uid
        else:
            active = self._utterances[0].id if self._utterances else None
        self._utterances.clear()
        self._resampler_now = None
        now = time.perf_counter()
        resume = int(np.ceil(self._clock.position_frames(now))) + self.config.interrupt_margin_frames
        self._tick = min(self._tick, max(resume, 0))
        self._speech_until = min(self._speech_until, self._tick * SAMPLES_PER_FRAME)
        self._force_idr = True
        self._stats.interrupts += 1
        self._pending_events.append(
            SessionEvent(
                "playback_finished", utterance_id=active, position_samples=self._tick * SAMPLES_PER_FRAME,
                interrupted=True, message="" if had_speech else "nothing was playing",
            )
        )
        self._poke()
        return self._tick * SAMPLES_PER_FRAME

    def heard_text(self, utterance_id: int, until_pts: int) -> str:
        """What an utterance said before pts `until_pts` (its sentences, the last one cut in proportion to
        the part played): after an interrupt, what the listener actually heard."""
        words: list[str] = []
        for uid, pts, samples, text in self._said:
            if uid != utterance_id or pts >= until_pts:
                continue
            sentence = text.split()
            played = 1.0 if samples <= 0 else min(1.0, (until_pts - pts) / samples)
            words += sentence[: int(round(len(sentence) * played))]
        return " ".join(words)

    def playback_position(self) -> int:
        """The pts being played now, in samples (the client's report extrapolated, else wall time)."""
        return int(self._clock.position_frames(time.perf_counter()) * SAMPLES_PER_FRAME)

    def is_speaking(self) -> bool:
        """True while speech is pending or produced speech has not finished playing."""
        return bool(self._utterances) or self.playback_position() < self._speech_until

    def request_keyframe(self) -> None:
        """Make the next frame an IDR (a client that lost its decoder state asks for this)."""
        self._force_idr = True

    def update_playback_position(self, pts_samples: int) -> None:
        """The client's audio clock position: production is paced from it (audio is the master clock).

        Clamped to what can be true: a client cannot be playing a frame it was never sent, nor play faster
        than real time since the first frame (with slack for clock drift); a larger report would turn
        pacing off."""
        now = time.perf_counter()
        pts = min(max(0, int(pts_samples)), self._tick * SAMPLES_PER_FRAME, self._clock.max_position(now))
        self._clock.report(pts, now)

    # ----- output --------------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[AvatarFrame | SessionEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[AvatarFrame | SessionEvent]:
        if self._task is None:
            await self.start()
        assert self._out is not None
        while not self._closed:
            generation, item = await self._out.get()
            if isinstance(item, BaseException):
                raise item
            if generation != self._generation:
                continue  # produced before an interrupt: never shown
            yield item

    # ----- internals -----------------------------------------------------------------------------------

    def _get_tts(self, voice: str):
        if voice not in self._tts:
            if self._tts_factory is not None:
                self._tts[voice] = self._tts_factory(voice)
            else:
                from lipstream.talk.tts import create_tts

                self._tts[voice] = create_tts(voice)
        return self._tts[voice]

    def _new_utterance(self, kind: str) -> _Utterance:
        utt = _Utterance(self._next_uid, self.engine, self._silence, kind)
        self._next_uid += 1
        self._utterances.append(utt)
        self._stats.utterances += 1
        return utt

    def _open_stream_utterance(self) -> _Utterance:
        last = self._utterances[-1] if self._utterances else None
        if last is not None and not last.flushed and last.kind == "stream":
            return last
        return self._new_utterance("stream")

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _drain_out(self) -> list:
        drained = []
        if self._out is not None:
            while not self._out.empty():
                drained.append(self._out.get_nowait())
        return drained

    async def _produce(self) -> None:
        assert self._out is not None and self._wake is not None
        try:
            while not self._closed:
                if self._scheduled_generation != self._generation:
                    # reset here, not in interrupt(): a worker thread may still be using the scheduler
                    self._scheduler.reset()
                    self._scheduled_generation = self._generation
                for event in self._pending_events:
                    await self._out.put((self._generation, event))
                self._pending_events.clear()
                utt = self._utterances[0] if self._utterances else None
                if utt is not None and utt.done:
                    self._finish_utterance(utt)
                    continue
                ready = utt.ready_frames() if utt is not None else 0
                now = time.perf_counter()
                position = self._clock.position_frames(now)
                # the long lead applies once speech plays; before its first frame the stream keeps the idle
                # lead, so idle frames stay on time while the first audio is synthesised and speech starts
                # right after the few idle frames already sent
                speaking = utt is not None and utt.started
                lead = self.config.max_lead_seconds if speaking else self.config.idle_lead_seconds
                ahead_frames = self._tick - position
                if ahead_frames > lead * FPS and not (ready > 0 and not utt.started):
                    await self._wait((ahead_frames - lead * FPS) / FPS)
                    continue
                if ready > 0:
                    # the utterance's first batch is small so its first frame reaches the client soon
                    batch = max(1, int(self.engine.batch_size)) if utt.started else FIRST_BATCH_FRAMES
                    await self._emit_speech(utt, min(ready, batch))
                elif speaking and ahead_frames > 1:
                    # speech is playing but its next input is not here yet: wait for it rather than fill
                    # the middle of the utterance with idle frames
                    await self._wait(min(FRAME_SECONDS, (ahead_frames - 1) / FPS))
                elif self._scheduler.pending and utt is not None:
                    await self._release_held(utt)
                else:
                    if utt is not None and utt.started:
                        self._stats.underruns += 1
                    await self._emit_idle()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a session's failure ends only that session
            log.exception("session producer failed")
            # the client learns that it failed; the details (paths, library messages) stay in the log
            await self._out.put((self._generation, SessionEvent("error", message="session failed")))
            await self._out.put((self._generation, exc))

    async def _wait(self, seconds: float) -> None:
        assert self._wake is not None
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=max(0.001, seconds))

    def _finish_utterance(self, utt: _Utterance) -> None:
        self._utterances.popleft()
        if utt.started:
            self._pending_events.append(
                SessionEvent(
                    "playback_finished", utterance_id=utt.id, position_samples=self._tick * SAMPLES_PER_FRAME
                )
            )

    async def _emit_idle(self) -> None:
        tick, generation = self._tick, self._generation
        self._tick += 1
        base_id = self.avatar.base_frame_index(tick)
        frame = await self._pools.run_render(self._finish_frame, base_id, None, generation)
        silence = np.zeros(SAMPLES_PER_FRAME, dtype=np.int16)
        await self._put_frame(
            tick, base_id, frame, silence, speaking=False, end=False, uid=None, generation=generation
        )
        self._stats.idle_frames += 1

    async def _emit_speech(self, utt: _Utterance, count: int) -> None:
        """Take `count` ready frames of the utterance through the scheduler and emit what it releases."""
        generation = self._generation
        feats, audio, speaking = utt.take(count)
        first = self._tick
        marks = utt.take_marks(first, count)
        self._tick += count  # these ticks are reserved; the scheduler releases frames in order
        base_ids = self.avatar.base_frame_indices(first, count)
        pcm16 = to_int16(audio)
        payloads = [
            (first + i, int(base_ids[i]), pcm16[i * SAMPLES_PER_FRAME : (i + 1) * SAMPLES_PER_FRAME])
            for i in range(count)
        ]
        final = utt.done
        released = await self._pools.run_render(
            self._schedule, feats, ~speaking, base_ids, payloads, final, generation
        )
        await self._emit_released(utt, released, generation, final, marks)

    async def _release_held(self, utt: _Utterance) -> None:
        """Input stalled mid-utterance: release the frames waiting for their next keyframe."""
        generation = self._generation
        empty = np.zeros((0, self.engine.feature_dim), np.float32)
        released = await self._pools.run_render(
            self._schedule, empty, np.zeros(0, bool), np.zeros(0, np.int64), [], True, generation
        )
        await self._emit_released(utt, released, generation, final=False)

    def _schedule(self, feats, silent, base_ids, payloads, final: bool, generation: int) -> list:
        """Worker thread: patches from the scheduler, then composite and encode each released frame."""
        released = self._scheduler.push(feats, silent, base_ids, payloads) if payloads else []
        if final:
            released += self._scheduler.finish()
        return [(payload, self._finish_frame(payload[1], patch, generation)) for payload, patch in released]

    async def _emit_released(
        self, utt: _Utterance, released: list, generation: int, final: bool, marks: list | None = None
    ) -> None:
        if generation != self._generation:
            return  # interrupted while rendering: drop the batch
        if not utt.started and released:
            utt.started = True
            ttff = time.perf_counter() - utt.first_push
            self._stats.ttff_ms.append(ttff * 1000.0)
            if self._observer is not None:
                self._observer.first_frame(ttff)
            position = released[0][0][0] * SAMPLES_PER_FRAME
            event = SessionEvent("speech_started", utterance_id=utt.id, position_samples=position)
            await self._out.put((generation, event))
        for tick, samples, text in marks or ():  # before the frames: shown when the clock gets there
            event = SessionEvent("text", utterance_id=utt.id, position_samples=tick * SAMPLES_PER_FRAME)
            event.message = text
            self._said.append((utt.id, tick * SAMPLES_PER_FRAME, samples, text))
            await self._out.put((generation, event))
        for i, ((tick, base_id, chunk), frame) in enumerate(released):
            last = final and i == len(released) - 1
            sent = await self._put_frame(
                tick, base_id, frame, chunk, speaking=True, end=last, uid=utt.id, generation=generation
            )
            if not sent:
                return  # an interrupt came while the queue was full: the rest of the batch is stale
            self._stats.speech_frames += 1
            self._speech_until = (tick + 1) * SAMPLES_PER_FRAME
            self._speech_uid = utt.id

    def _finish_frame(self, base_id: int, patch: np.ndarray | None, generation: int):
        if self._patch_stream and self._encoder is not None:
            return self._encode_patch(patch, generation)
        with self._timer.stage("compositor"):
            if self._encoder is None:
                return self._compositor.compose(base_id, patch)
            image = self._compositor.compose_i420(base_id, patch)
        with self._timer.stage("encode"):
            # frames made before an interrupt are never sent, so the first frame after one must be an IDR
            force = self._force_idr or generation != self._encoded_generation
            self._encoded_generation = generation
            self._force_idr = False
            return self._encoder.encode(image, force_idr=force)

    def _encode_patch(self, patch: np.ndarray | None, generation: int):
        """Patch mode: the mouth rectangle of the crop-space patch as one H.264 AU; None while the mouth
        rests (the base loop alone is the right picture, so nothing is encoded or sent)."""
        if patch is None:
            self._patch_resting = True
            return None
        with self._timer.stage("encode"):
            if patch.shape[0] != CROP_SIZE:
                patch = cv2.resize(patch, (CROP_SIZE, CROP_SIZE), interpolation=cv2.INTER_LINEAR)
            x0, y0, x1, y1 = self.patch_rect
            # the first patch after rest or an interrupt is an IDR: every utterance decodes on its own
            force = self._force_idr or self._patch_resting or generation != self._encoded_generation
            self._encoded_generation = generation
            self._force_idr = self._patch_resting = False
            return self._encoder.encode(np.ascontiguousarray(patch[y0:y1, x0:x1]), force_idr=force)

    async def _put_frame(self, tick, base_id, frame, audio, *, speaking, end, uid, generation) -> bool:
        """Queue a made frame for the consumer; False when an interrupt has made it stale."""
        if generation != self._generation:
            return False  # an interrupt came while this frame was being made
        now = time.perf_counter()
        self._clock.start(now)
        due_late = (self._clock.position_frames(now) - tick) / FPS
        if due_late > 0:
            self._stats.late_frames += 1
            self._stats.max_late_ms = max(self._stats.max_late_ms, due_late * 1000.0)
            if self._observer is not None:
                self._observer.late_frame(due_late)
            if self._stats.late_frames in (1, 25, 250) or self._stats.late_frames % 1000 == 0:
                # a player's jitter buffer (150 ms in ours) absorbs small lateness; more is worth a warning
                level = logging.WARNING if due_late > LATE_WARNING_SECONDS else logging.INFO
                log.log(
                    level, "session %s: production behind the audio clock by %.0f ms (%d late frames so far)",
                    self.avatar.name, due_late * 1000.0, self._stats.late_frames,
                )
        item = AvatarFrame(
            index=tick, pts=tick * SAMPLES_PER_FRAME, base_index=base_id, audio=audio,
            speaking=speaking, end_of_speech=end, utterance_id=uid,
            loop_index=tick % len(self.avatar.idle_loop),
        )
        if self._encoder is None:
            item.image = frame
        elif frame is None:  # patch mode, mouth at rest
            item.access_unit = b""
        else:
            item.access_unit = frame.data
            item.keyframe = bool(frame.keyframe)
        self._stats.frames += 1
        assert self._out is not None and self._produced is not None
        await self._out.put((generation, item))
        self._produced.set()
        return generation == self._generation
