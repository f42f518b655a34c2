"""`LipstreamVideoGenerator`: livekit-agents' `VideoGenerator` over a lipstream Session.

The avatar worker's `AvatarRunner` pushes the agent's audio into it and publishes what it yields through
LiveKit's A/V synchroniser. For each 40 ms frame of the Session it yields an `rtc.VideoFrame` (I420, or
RGB24 when asked) and, while the avatar speaks, an `rtc.AudioFrame` with exactly that frame's samples of
the pushed audio, at the pushed rate; an `AudioSegmentEnd` when a segment has played (or was cleared).
Between segments it yields video only (the presenter's idle loop): the runner counts every audio frame as
playback, so idle silence would report speech that never was.

The runner tells the agent `lk.playback_started` when it has pushed a segment's first audio frame (ours: the
first speaking frame's) and `lk.playback_finished` at `AudioSegmentEnd` or `clear_buffer`; the agent's
`AgentSession` turns those into its `speaking` state. The generator adds no signal of its own: its
`agent_state` changes at those same points, for the worker's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Literal

import numpy as np

from lipstream.integrations.livekit.segments import SegmentLedger
from lipstream.integrations.playback import (
    AvatarSource,
    EngineSource,
    load_avatar_and_engine,
    mono_int16,
    raw_frames_config,
)
from lipstream.integrations.states import AgentState, AgentStateView, StateCallback

try:
    from livekit import rtc
    from livekit.agents.voice.avatar import AudioSegmentEnd, AvatarOptions, VideoGenerator
except ImportError as exc:  # the adapter is optional; say how to get it
    raise ImportError(
        "lipstream's LiveKit avatar needs livekit-agents: pip install 'lipstream[livekit]'"
    ) from exc

from lipstream.audio.timeline import FPS
from lipstream.errors import LipstreamError
from lipstream.render.frames import AvatarFrame
from lipstream.render.session import RenderSession, SessionConfig, SessionEvent
from lipstream.render.sinks import I420Frames, RawFrames

log = logging.getLogger(__name__)

DEFAULT_SAMPLE_RATE = 24_000  # what the agent side asks its TTS audio to be resampled to


class LipstreamVideoGenerator(VideoGenerator):
    """A lipstream avatar as a LiveKit `VideoGenerator`: speaks the audio pushed into it."""

    def __init__(
        self,
        avatar: AvatarSource,
        *,
        engine: EngineSource = "viseme",
        output_width: int | None = None,
        fps: float = FPS,
        video_format: Literal["i420", "rgb24"] = "i420",
        config: SessionConfig | None = None,
        on_state: StateCallback | None = None,
    ) -> None:
        """`avatar`: a prepared avatar's name (under $LIPSTREAM_HOME), folder or bundle; `engine`: a name or
        an Engine; `output_width`: scale the video down (the largest allowed size not wider); `fps`: 25,
        lipstream's timeline (anything else is refused rather than resampled); `video_format`: I420, what
        WebRTC sends (composited on the render worker, only the mouth converted), or RGB24 pictures;
        `on_state(agent)`: called with `speaking`/`listening` as `agent_state` changes."""
        if fps != FPS:
            raise LipstreamError(f"lipstream avatars run at {FPS} fps (got fps={fps:g}); use fps={FPS}")
        if video_format not in ("i420", "rgb24"):
            raise LipstreamError(f"video_format must be 'i420' or 'rgb24' (got {video_format!r})")
        bundle, engine_obj = load_avatar_and_engine(avatar, engine)
        sink = I420Frames() if video_format == "i420" else RawFrames()
        self.session = RenderSession(bundle, engine_obj, raw_frames_config(config, output_width), sink=sink)
        self._segments = SegmentLedger()
        self._generation = 0  # bumped by clear_buffer: audio taken before it is never yielded after it
        self._end_due = False  # a cleared segment still owes the runner its AudioSegmentEnd
        self._cleared = asyncio.Event()  # wakes the iterator to yield that end at once
        self._pulled = asyncio.Event()  # the runner came back for the next item: done with the last one
        self._start_lock = asyncio.Lock()
        self._started = False
        self._states = AgentStateView(on_state)

    @property
    def width(self) -> int:
        """Width of the yielded video frames."""
        return self.session.width

    @property
    def height(self) -> int:
        """Height of the yielded video frames."""
        return self.session.height

    @property
    def agent_state(self) -> AgentState:
        """`speaking` from a segment's first audio frame taken by the runner to its end or clear, else
        `listening`: when the runner reports playback started and finished."""
        return self._states.agent

    def avatar_options(
        self, audio_sample_rate: int = DEFAULT_SAMPLE_RATE, audio_channels: int = 1
    ) -> AvatarOptions:
        """The `AvatarOptions` an `AvatarRunner` needs for this generator, for audio pushed at this rate."""
        return AvatarOptions(
            video_width=self.width, video_height=self.height, video_fps=FPS,
            audio_sample_rate=audio_sample_rate, audio_channels=audio_channels,
        )  # fmt: skip

    async def start(self) -> None:
        """Warm the Session up (engine caches, base frames) and start its frames; idempotent."""
        async with self._start_lock:
            if not self._started:
                await self.session.start()
                self._started = True

    async def aclose(self) -> None:
        """Stop the Session."""
        await self.session.aclose()
        self._segments.clear()
        self._states.set(False)

    # ----- audio in ---------------------------------------------------------------------------------------

    async def push_audio(self, frame: rtc.AudioFrame | AudioSegmentEnd) -> None:
        """An audio frame of the agent's speech, or the end of the current segment."""
        await self.start()
        if isinstance(frame, AudioSegmentEnd):
            if self._segments.close():
                await self.session.flush_async()
            return
        if frame.samples_per_channel == 0:
            return
        refusal = self._segments.refusal(frame.sample_rate, frame.num_channels)
        if refusal is not None:  # checked before the Session hears it: both keep the same audio
            log.warning("lipstream dropped agent audio: %s", refusal)
            return
        interleaved = np.frombuffer(frame.data, dtype=np.int16).copy()
        generation = self._generation
        try:
            await self.session.push_audio_async(
                mono_int16(interleaved, frame.num_channels), frame.sample_rate
            )
        except LipstreamError as exc:  # too much speech queued: this frame is refused, the worker goes on
            log.warning("lipstream refused agent audio: %s", exc)
            return
        if generation == self._generation:  # not cleared while the Session analysed it
            self._segments.push(interleaved, frame.sample_rate, frame.num_channels)

    def clear_buffer(self) -> Coroutine[Any, Any, None]:
        """Stop speaking now: queued speech and frames are dropped, no audio of it is yielded after this,
        and the segment's `AudioSegmentEnd` follows; the presenter goes on idling. Returns a coroutine that
        ends when the runner has finished with the item it held (AvatarRunner awaits it): the runner zeroes
        its playback position after this, and an audio frame whose push it was still in would otherwise
        count as a new segment's start, a `playback_started` after the interruption."""
        self._generation += 1
        self._end_due = self._end_due or self._segments.pending
        self._segments.clear()
        self.session.interrupt()
        self._pulled.clear()
        self._cleared.set()
        self._states.set(False)  # the runner reports the interrupted playback_finished right after this
        return self._runner_done_with_its_item()

    async def _runner_done_with_its_item(self, timeout: float = 1.0) -> None:
        """Until the runner asks for its next item (at most `timeout`: a stalled runner holds no clear)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._pulled.wait(), timeout)

    # ----- frames out -------------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        await self.start()
        frames = self.session.__aiter__()
        next_item: asyncio.Future | None = None
        try:
            while True:
                self._pulled.set()
                if next_item is None:
                    next_item = asyncio.ensure_future(frames.__anext__())
                cleared = asyncio.ensure_future(self._cleared.wait())
                await asyncio.wait({next_item, cleared}, return_when=asyncio.FIRST_COMPLETED)
                cleared.cancel()
                if self._cleared.is_set():
                    # the segment ends now, not when the Session's producer gets to its interrupt event
                    self._cleared.clear()
                    if self._end_due:
                        self._end_due = False
                        yield AudioSegmentEnd()
                if not next_item.done():
                    continue
                try:
                    item = next_item.result()
                except StopAsyncIteration:
                    return
                next_item = None
                if isinstance(item, SessionEvent):
                    for out in self._on_event(item):
                        yield out
                        if isinstance(out, AudioSegmentEnd):  # taken: the runner said playback_finished
                            self._states.set(False)
                    continue
                generation = self._generation
                audio = self._audio_of(item)
                yield self._video_of(item)
                if audio is not None and generation == self._generation:  # not cleared meanwhile
                    yield audio
                    # taken and pushed: the runner has said playback_started if it was the segment's first
                    if generation == self._generation:
                        self._states.set(True)
        finally:
            if next_item is not None:
                next_item.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                    await next_item

    def _on_event(self, event: SessionEvent) -> list[Any]:
        """What a Session event becomes: the rest of a played segment's audio and its AudioSegmentEnd (an
        interrupted one ended when clear_buffer was called)."""
        if event.type != "playback_finished" or event.interrupted or event.utterance_id is None:
            return []
        segment = self._segments.finish(event.utterance_id)
        if segment is None:
            return []
        rest = segment.take_rest()  # normally empty: the last frame took it
        out: list[Any] = [self._audio_frame(rest, segment.sample_rate)] if len(rest) else []
        return [*out, AudioSegmentEnd()]

    def _audio_of(self, item: AvatarFrame) -> rtc.AudioFrame | None:
        if not item.speaking or item.utterance_id is None:
            return None
        segment = self._segments.for_utterance(item.utterance_id)
        if segment is None:
            return None
        pcm = segment.take_frame(last=item.end_of_speech)
        return self._audio_frame(pcm, segment.sample_rate) if len(pcm) else None

    @staticmethod
    def _audio_frame(pcm: np.ndarray, sample_rate: int) -> rtc.AudioFrame:
        return rtc.AudioFrame(pcm.tobytes(), sample_rate, pcm.shape[1], pcm.shape[0])

    def _video_of(self, item: AvatarFrame) -> rtc.VideoFrame:
        # the pictures are fresh arrays, never written again: handed over as flat views, not copied
        if item.i420 is not None:
            data, kind = item.i420, rtc.VideoBufferType.I420
        else:
            assert item.image is not None  # RawFrames: RGB pictures
            data, kind = item.image, rtc.VideoBufferType.RGB24
        flat = memoryview(np.ascontiguousarray(data).reshape(-1))
        return rtc.VideoFrame(self.width, self.height, kind, flat)
