"""The streaming RenderSession: push speech, iterate frames on the audio clock.

Shape (like the SDKs users like): `push_audio`, `push_speech_stream`, `flush`, `interrupt`, and
`async for item in session`, where each item is an `AvatarFrame` or a `SessionEvent`, in order. The stream
never stops while the session is open: when nobody speaks, idle frames (the presenter's own closed mouth,
silent audio) keep the timeline going, so the client's audio clock is always fed. Text goes through a voice
first (lipstream.Session, a RenderSession with a voice, adds `push_text`; a server or a conversation uses
talk.speaker.Speaker).

The house: speech in (speech_feed.SpeechFeed, utterance.Utterance), frames paced (the producer below, on
the event loop), frames made (frame_maker.FrameMaker on the render worker, with accel.PatchScheduler and the
engine), the clock (clock.PlaybackClock), streams out (sinks.FrameSink).

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
from collections.abc import AsyncIterable, AsyncIterator, Callable

import numpy as np

from lipstream.audio.decode import to_int16
from lipstream.audio.levels import SilenceDetector
from lipstream.audio.speech import Speech
from lipstream.audio.timeline import FPS, SAMPLE_RATE, SAMPLES_PER_FRAME
from lipstream.avatar.bundle import AvatarBundle
from lipstream.avatar.phrase_blinks import PhraseEndBlinks
from lipstream.engines.base import Engine
from lipstream.render.accel import PatchScheduler, load_codebook, resolve_accel
from lipstream.render.base_frames import SharedBaseFrames, stream_size
from lipstream.render.clock import PlaybackClock
from lipstream.render.compositor import Compositor
from lipstream.render.frame_maker import FrameMaker
from lipstream.render.frames import AvatarFrame
from lipstream.render.idle_gops import SharedIdleGops
from lipstream.render.patch_stream import patch_rect
from lipstream.render.session_types import SessionConfig, SessionEvent, SessionStats
from lipstream.render.sinks import FrameSink, MouthPatchH264, RawFrames, WholeFrameH264
from lipstream.render.speech_batches import speech_batch
from lipstream.render.speech_feed import SpeechFeed
from lipstream.render.spoken_text import SpokenText
from lipstream.render.timing import RenderObserver, StageTimer
from lipstream.render.utterance import Utterance
from lipstream.render.utterance_easing import UtteranceEasing
from lipstream.render.workers import WorkerPools

__all__ = ["RenderSession", "Session", "SessionConfig", "SessionEvent", "SessionStats"]

log = logging.getLogger(__name__)

FRAME_SECONDS = 1.0 / FPS
LATE_WARNING_SECONDS = 0.1


class RenderSession:
    """A live avatar session: speech in, frames on the audio clock out."""

    def __init__(
        self,
        avatar: AvatarBundle,
        engine: Engine,
        config: SessionConfig | None = None,
        *,
        silence: SilenceDetector | None = None,
        pools: WorkerPools | None = None,
        base_frames: SharedBaseFrames | None = None,
        idle_gops: SharedIdleGops | None = None,
        observer: RenderObserver | None = None,
        sink: FrameSink | None = None,
    ) -> None:
        """`pools`, `base_frames`, `idle_gops`: what a server shares between its sessions; `observer`: its
        metrics; `sink`: what frames become (by default per `config`: H.264 whole frames or mouth patches,
        or RGB)."""
        self.avatar = avatar
        self._observer = observer
        self._pools = pools or WorkerPools()
        # an engine batched across sessions gives this session's view, due on its clock; others: themselves
        engine = engine.for_session(self._frame_due)
        self.engine = engine
        self._easing = UtteranceEasing(engine)  # utterances leave and rejoin the footage's mouth gradually
        self.config = config or SessionConfig()
        self._stats = SessionStats()
        self._timer = StageTimer(listener=observer.stage if observer is not None else None)
        self._clock = PlaybackClock()
        self._generation = 0  # bumped by interrupt(): work started before it is discarded
        self._feed = SpeechFeed(
            engine, self.config, self._pools, self._timer, self._stats,
            generation=lambda: self._generation, poke=self._poke, silence=silence,
        )  # fmt: skip
        self._tick = 0
        self._due_tick = 0  # the first frame of the batch being rendered (its deadline is the engine's)
        self._out: asyncio.Queue | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closed = False
        self._pending_events: list[SessionEvent] = []
        self._said = SpokenText()
        self._speech_until = 0  # pts where the last speech frame produced ends
        self._speech_uid: int | None = None  # the utterance that frame belongs to
        patch_mode = self.config.stream == "patch"
        # patch mode: the client composites onto the avatar's own-size base loop, so no scaled sizes
        width = None if patch_mode else self.config.output_width
        self.width, self.height = stream_size(avatar.size, width)
        self.patch_rect = patch_rect(avatar) if patch_mode else None
        shared = base_frames.get(avatar, (self.width, self.height)) if base_frames is not None else None
        self._compositor = Compositor(avatar, engine.patch_size, (self.width, self.height), base=shared)
        self._sink = sink or self._default_sink(idle_gops)
        self._sink.bind(self._compositor, self._timer)
        self._scheduled_generation = 0
        accel = resolve_accel(self.config.accel, engine)
        codebook = None
        if accel.enabled and accel.codebook:
            codebook = load_codebook(avatar, engine, accel)  # read-only: sessions never save it
        self._scheduler = PatchScheduler(avatar, engine, accel, codebook, self._timer)
        loop_length, phrase_blinks = len(avatar.idle_loop), self.config.phrase_blinks
        blinks = PhraseEndBlinks.for_manifest(avatar.manifest, loop_length, phrase_blinks)
        self._maker = FrameMaker(avatar, engine, self._scheduler, self._sink, self._easing, blinks)

    def _default_sink(self, idle_gops: SharedIdleGops | None) -> FrameSink:
        if not self.config.encode:
            return RawFrames()  # no encoded consumer: nothing is encoded
        if self.patch_rect is not None:
            return MouthPatchH264(self.patch_rect, self.config.patch_bitrate)
        return WholeFrameH264(self.config.bitrate, idle_gops)

    # ----- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the producer; frames begin to flow at once (idle until speech arrives)."""
        if self._task is not None:
            return
        # everything that depends only on the avatar is made (or read from its cache) before the
        # first frame, so the first utterance does not pay for it
        await self._pools.run_render(self._warm_up)
        self._sink.open()
        self._out = asyncio.Queue(maxsize=self.config.queue_frames)
        self._wake = asyncio.Event()
        self._feed.producing = True
        self._task = asyncio.create_task(self._produce(), name=f"session-{self.avatar.name}")

    async def aclose(self) -> None:
        """Stop producing and free the encoder."""
        self._closed = self._feed.closed = True
        self._withdraw()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._task = None
        self._feed.clear()
        self._sink.close()

    async def __aenter__(self) -> RenderSession:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _warm_up(self) -> None:
        self.engine.prepare(self.avatar)
        self._sink.warm_up(self.avatar.idle_loop)

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
        return self._sink.codec_string

    # ----- input ---------------------------------------------------------------------------------------

    def push_audio(self, pcm: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
        """Add a chunk of speech (int16 or float32 mono, any rate) to the current utterance.

        Raises QueueFullError (and keeps nothing of the chunk) when the session already holds
        `max_pending_seconds` of speech not yet produced."""
        self._feed.push_audio(pcm, sample_rate)

    async def push_audio_async(self, pcm: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
        """`push_audio` with resampling and feature extraction on the speech pool, off the event loop."""
        await self._feed.push_audio_async(pcm, sample_rate)

    def flush(self) -> None:
        """End of the current utterance's input: it plays to the end, then the presenter idles."""
        self._feed.flush()

    async def flush_async(self) -> None:
        """`flush`, after any chunk still being analysed (the same resampler and feature stream)."""
        await self._feed.flush_async()

    async def push_speech_stream(
        self, speeches: AsyncIterable[Speech], on_utterance: Callable[[int], None] | None = None
    ) -> int:
        """Speak sentences (Speech with phoneme timings and text, e.g. a voice's) as one utterance; returns
        its id (`on_utterance` gets it at once). Each sentence's text becomes a `text` event at its first
        frame. The next sentence is pulled only while less than `tts_lookahead_seconds` waits to be
        played, so synthesis runs as fast as speech is spoken."""
        return await self._feed.push_speech_stream(speeches, on_utterance)

    @property
    def pending_seconds(self) -> float:
        """Speech received but not yet produced as frames, over all queued utterances."""
        return self._feed.pending_seconds

    def interrupt(self) -> int:
        """Stop speaking now: drop pending input and frames; the stream resumes just ahead of playback, at
        the pts this returns (where the speech was cut)."""
        self._generation += 1
        self._withdraw()
        drained = self._drain_out()
        had_speech = bool(self._feed.utterances) or any(
            isinstance(item, AvatarFrame) and item.speaking for _, item in drained
        )
        # the utterance being heard: the last one that produced speech while it still plays (it may be
        # produced to its end and gone from the queue), else the first queued one
        if self._speech_uid is not None and self.playback_position() < self._speech_until:
            active = self._speech_uid
        else:
            active = self._feed.utterances[0].id if self._feed.utterances else None
        self._feed.clear()
        self._maker.forget_voiced()
        now = time.perf_counter()
        resume = int(np.ceil(self._clock.position_frames(now))) + self.config.interrupt_margin_frames
        self._tick = min(self._tick, max(resume, 0))
        self._easing.interrupted(self._tick)
        self._speech_until = min(self._speech_until, self._tick * SAMPLES_PER_FRAME)
        self._sink.request_keyframe()
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
        return self._said.heard(utterance_id, until_pts)

    def playback_position(self) -> int:
        """The pts being played now, in samples (the client's report extrapolated, else wall time)."""
        return int(self._clock.position_frames(time.perf_counter()) * SAMPLES_PER_FRAME)

    def is_speaking(self) -> bool:
        """True while speech is pending or produced speech has not finished playing."""
        return bool(self._feed.utterances) or self.playback_position() < self._speech_until

    def request_keyframe(self) -> None:
        """Make the next frame an IDR (a client that lost its decoder state asks for this)."""
        self._sink.request_keyframe()

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

    def _withdraw(self) -> None:
        """A batched engine drops this session's queued passes (their frames would be discarded)."""
        self.engine.withdraw()

    def _frame_due(self) -> float:
        """When playback reaches the frame being rendered (perf_counter s): a batched engine's deadline."""
        now = time.perf_counter()
        return now + (self._due_tick - self._clock.position_frames(now)) / FPS

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
                utt = self._feed.utterances[0] if self._feed.utterances else None
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
                    batch = speech_batch(self.engine.batch_size, ahead_frames, utt.emitted)
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

    def _finish_utterance(self, utt: Utterance) -> None:
        self._feed.utterances.popleft()
        if utt.started:
            self._easing.finished(self._tick - 1)
            self._pending_events.append(
                SessionEvent(
                    "playback_finished", utterance_id=utt.id, position_samples=self._tick * SAMPLES_PER_FRAME
                )
            )

    async def _emit_idle(self) -> None:
        tick, generation = self._tick, self._generation
        self._tick += 1
        base_id = self.avatar.base_frame_index(tick)
        row = self._easing.idle_row()
        frame = await self._pools.run_render(self._maker.make_idle, tick, base_id, row, generation)
        silence = np.zeros(SAMPLES_PER_FRAME, dtype=np.int16)
        await self._put_frame(
            tick, base_id, frame, silence, speaking=False, end=False, uid=None, generation=generation
        )
        self._stats.idle_frames += 1

    async def _emit_speech(self, utt: Utterance, count: int) -> None:
        """Take `count` ready frames of the utterance through the scheduler and emit what it releases."""
        generation = self._generation
        feats, audio, speaking = utt.take(count)
        first = self._due_tick = self._tick
        feats = self._easing.speech(utt.id, feats, utt.emitted - count, first)
        marks = utt.take_marks(first, count)
        self._tick += count  # these ticks are reserved; the scheduler releases frames in order
        base_ids = self.avatar.base_frame_indices(first, count)
        self._maker.voiced(first, speaking)
        pcm16 = to_int16(audio)
        payloads = [
            (first + i, int(base_ids[i]), pcm16[i * SAMPLES_PER_FRAME : (i + 1) * SAMPLES_PER_FRAME])
            for i in range(count)
        ]
        final = utt.done
        released = await self._pools.run_render(
            self._maker.schedule, feats, ~speaking, base_ids, payloads, final, generation
        )
        await self._emit_released(utt, released, generation, final, marks)

    async def _release_held(self, utt: Utterance) -> None:
        """Input stalled mid-utterance: release the frames waiting for their next keyframe."""
        generation = self._generation
        empty = np.zeros((0, self.engine.feature_dim), np.float32)
        released = await self._pools.run_render(
            self._maker.schedule, empty, np.zeros(0, bool), np.zeros(0, np.int64), [], True, generation
        )
        await self._emit_released(utt, released, generation, final=False)

    async def _emit_released(
        self, utt: Utterance, released: list, generation: int, final: bool, marks: list | None = None
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
            self._said.said(utt.id, tick * SAMPLES_PER_FRAME, samples, text)
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
        made, lids, blink_starts = frame
        item = AvatarFrame(
            index=tick, pts=tick * SAMPLES_PER_FRAME, base_index=base_id, audio=audio,
            speaking=speaking, end_of_speech=end, utterance_id=uid,
            loop_index=tick % len(self.avatar.idle_loop), lids=lids, blink_starts=blink_starts,
        )
        self._sink.fill(item, made)
        self._stats.frames += 1
        assert self._out is not None
        await self._out.put((generation, item))
        self._feed.produced.set()
        return generation == self._generation


# Deprecated: the render session's name before lipstream.Session (the one with text) took `Session` alone.
# README and docs/integrations.md named it lipstream.render.session.Session; old imports keep working.
Session = RenderSession
