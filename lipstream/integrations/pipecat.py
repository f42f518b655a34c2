"""Pipecat frame processor: TTS audio in, the avatar's video frames and the same audio, in sync, out.

Put it between the TTS service and the output transport:

    Pipeline([transport.input(), stt, user_agg, llm, tts, LipstreamAvatar("anchor"), transport.output(), ...])

One `Session` (raw RGB, no H.264) runs from StartFrame to EndFrame/CancelFrame. Every video frame goes out
as an `OutputImageRawFrame` followed by an audio frame holding exactly that frame's 40 ms of 16 kHz audio,
so a transport that plays audio in order shows each picture with its own sound. Frames flow at the
session's pace (audio is the master clock), and idle frames with silent audio keep the face alive between
utterances. Only speaking frames' audio is TTS audio and TTSStoppedFrame is held until the utterance's last
frame, so the output transport's BotStarted/BotStoppedSpeakingFrame follow the face as it is played; the
processor pushes no such frame itself, and its `agent_state` follows the ones coming back upstream.

Needs `pip install 'lipstream[pipecat]'`; the avatar is prepared beforehand (`lipstream avatar prepare`,
whose face tracker runs in its own environment: docs/integrations.md says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from typing import Any

try:
    from pipecat.frames import frames as pf
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
except ImportError as exc:  # the adapter is optional; say how to get it
    raise ImportError(
        "lipstream's Pipecat processor needs pipecat-ai: pip install 'lipstream[pipecat]'"
    ) from exc

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.avatar.bundle import AvatarBundle
from lipstream.engines.base import Engine
from lipstream.errors import LipstreamError
from lipstream.integrations.playback import load_avatar_and_engine, mono_int16, raw_frames_config
from lipstream.integrations.states import AgentState, AgentStateView, StateCallback
from lipstream.render.frames import AvatarFrame
from lipstream.render.session import RenderSession, SessionConfig, SessionEvent

NS_PER_SAMPLE = 1_000_000_000 // SAMPLE_RATE  # Pipecat's pts are nanoseconds; ours are 16 kHz samples
DRAIN_SLACK_SECONDS = 2.0  # EndFrame waits this much beyond the speech still to be produced

# Pipecat renamed StartInterruptionFrame to InterruptionFrame; honour whichever the installed one has.
INTERRUPTION_FRAMES: tuple[type, ...] = tuple(
    cls for name in ("InterruptionFrame", "StartInterruptionFrame") if (cls := getattr(pf, name, None))
)


class LipstreamAvatar(FrameProcessor):
    """A lipstream avatar as a Pipecat processor: speaks the TTS audio that flows through it."""

    def __init__(
        self,
        avatar: str | os.PathLike | AvatarBundle,
        *,
        engine: str | Engine = "viseme",
        config: SessionConfig | None = None,
        output_width: int | None = None,
        sync_with_audio: bool = True,
        on_state: StateCallback | None = None,
        **kwargs: Any,
    ) -> None:
        """`avatar`: a prepared avatar's name (under $LIPSTREAM_HOME), folder or bundle; `engine`: a name or
        an Engine instance; `output_width`: scale the video down (the largest allowed size not wider);
        `sync_with_audio`: mark images so the transport shows each one when its audio starts playing;
        `on_state(agent)`: called with `speaking`/`listening` as `agent_state` changes."""
        super().__init__(**kwargs)
        self._avatar_source = avatar
        self._engine_source = engine
        self._config = raw_frames_config(config, output_width)  # Pipecat transports take raw pictures
        self._sync_with_audio = sync_with_audio
        self._session: RenderSession | None = None
        self._output_task: asyncio.Task | None = None
        self._generation = 0  # bumped by every interruption: output made before it is not pushed
        self._open = False  # audio pushed since the last flush
        # one entry per flushed utterance still playing: the TTSStoppedFrame to forward after its last frame
        self._awaiting: deque[pf.TTSStoppedFrame | None] = deque()
        self._drained = asyncio.Event()
        self._drained.set()
        self._states = AgentStateView(on_state)

    @property
    def session(self) -> RenderSession | None:
        """The running Session (None before StartFrame and after EndFrame/CancelFrame)."""
        return self._session

    @property
    def agent_state(self) -> AgentState:
        """`speaking` while the output transport plays the face's speech, else `listening`."""
        return self._states.agent

    # ----- frames in --------------------------------------------------------------------------------------

    async def process_frame(self, frame: pf.Frame, direction: FrameDirection) -> None:
        """Route a frame: lifecycle, interruptions and TTS audio are ours; everything else passes."""
        interruption = bool(INTERRUPTION_FRAMES) and isinstance(frame, INTERRUPTION_FRAMES)
        if direction == FrameDirection.UPSTREAM:
            self._follow_transport(frame)
        if interruption:
            # before the base class cancels our frame task (an await): no speech frame may slip out meanwhile
            self._interrupt()
        await super().process_frame(frame, direction)
        if isinstance(frame, pf.StartFrame):
            await self._start()
            await self.push_frame(frame, direction)
            if self._session is not None:  # after StartFrame went down, so downstream accepts our frames
                self._output_task = self.create_task(self._run_output(self._session), "lipstream-output")
        elif interruption:
            await self.push_frame(frame, direction)
        elif isinstance(frame, pf.EndFrame):
            await self._finish()
            await self.push_frame(frame, direction)
        elif isinstance(frame, pf.CancelFrame):
            await self._stop()
            await self.push_frame(frame, direction)
        elif self._session is None or direction != FrameDirection.DOWNSTREAM:
            await self.push_frame(frame, direction)
        elif isinstance(frame, pf.TTSAudioRawFrame):
            await self._push_audio(self._session, frame)  # consumed: it comes back out frame by frame
        elif isinstance(frame, pf.TTSStoppedFrame) and self._open:
            self._end_utterance(frame)  # forwarded after the utterance's last frame (_on_event)
        else:
            await self.push_frame(frame, direction)

    def _follow_transport(self, frame: pf.Frame) -> None:
        # The transport says the bot speaks when it plays the first speaking frame's audio (the only TTS
        # audio it gets from us) and stops at our held TTSStoppedFrame or an interruption: the face's own
        # start and end, on the transport's clock, which this processor (ahead by its lead) does not see.
        # Our frames go to the default destination; another destination's speech is not this face's.
        if getattr(frame, "transport_destination", None) is not None:
            return
        if isinstance(frame, pf.BotStartedSpeakingFrame):
            self._states.set(True)
        elif isinstance(frame, pf.BotStoppedSpeakingFrame):
            self._states.set(False)

    async def _start(self) -> None:
        if self._session is not None:
            return
        try:
            avatar, engine = await asyncio.to_thread(
                load_avatar_and_engine, self._avatar_source, self._engine_source
            )
            session = RenderSession(avatar, engine, self._config)
            await session.start()  # warms up (engine caches, base frames) before the first frame
        except LipstreamError as exc:  # unknown avatar, missing caches: the voice still plays, faceless
            await self.push_error(error_msg=f"lipstream avatar unavailable: {exc}", exception=exc)
            return
        self._session = session

    async def _push_audio(self, session: RenderSession, frame: pf.TTSAudioRawFrame) -> None:
        pcm = mono_int16(frame.audio, frame.num_channels)
        if pcm.size == 0:
            return
        try:
            await session.push_audio_async(pcm, frame.sample_rate)
        except LipstreamError as exc:  # too much speech queued: this chunk is refused, the session goes on
            await self.push_error(error_msg=f"lipstream refused TTS audio: {exc}", exception=exc)
            return
        self._open = True
        self._drained.clear()

    def _end_utterance(self, stop: pf.TTSStoppedFrame | None) -> None:
        assert self._session is not None
        self._session.flush()
        self._open = False
        self._awaiting.append(stop)

    def _interrupt(self) -> None:
        self._generation += 1
        self._open = False
        self._awaiting.clear()  # their TTSStoppedFrames belong to speech that will not be heard
        self._drained.set()
        self._states.set(False)  # the transport's BotStoppedSpeakingFrame follows; nothing of ours plays on
        if self._session is not None:
            self._session.interrupt()  # drops queued speech and frames; the stream goes on idle

    async def _finish(self) -> None:
        """EndFrame: let the speech already received play out (bounded), then stop."""
        session = self._session
        if session is None:
            return
        if self._open:
            self._end_utterance(None)
        if self._awaiting:
            timeout = session.pending_seconds + session.config.max_lead_seconds + DRAIN_SLACK_SECONDS
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout)
        await self._stop()

    async def _stop(self) -> None:
        task, self._output_task = self._output_task, None
        if task is not None:
            await self.cancel_task(task)
        session, self._session = self._session, None
        if session is not None:
            await session.aclose()
        self._awaiting.clear()
        self._open = False
        self._drained.set()
        self._states.set(False)  # no face any more (a transport stopping sends no BotStoppedSpeakingFrame)

    async def cleanup(self) -> None:
        """Release the session if the pipeline ends without EndFrame/CancelFrame reaching us."""
        await super().cleanup()
        await self._stop()

    # ----- frames out -------------------------------------------------------------------------------------

    async def _run_output(self, session: RenderSession) -> None:
        try:
            async for item in session:
                if isinstance(item, SessionEvent):
                    await self._on_event(item)
                else:
                    await self._push_avatar_frame(item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - report to the pipeline rather than die silently
            await self.push_error(error_msg=f"lipstream session failed: {exc}", exception=exc)

    async def _on_event(self, event: SessionEvent) -> None:
        if event.type == "playback_finished" and not event.interrupted and self._awaiting:
            stop = self._awaiting.popleft()
            if stop is not None:
                await self.push_frame(stop)
            if not self._awaiting and not self._open:
                self._drained.set()

    async def _push_avatar_frame(self, item: AvatarFrame) -> None:
        generation = self._generation
        assert item.image is not None  # encode=False: raw RGB
        height, width = item.image.shape[:2]
        image = pf.OutputImageRawFrame(image=item.image.tobytes(), size=(width, height), format="RGB")
        image.sync_with_audio = self._sync_with_audio
        # speech as TTS audio, so the transport reports the bot speaking exactly while the face speaks
        audio_cls = pf.TTSAudioRawFrame if item.speaking else pf.OutputAudioRawFrame
        audio = audio_cls(audio=item.audio.tobytes(), sample_rate=SAMPLE_RATE, num_channels=1)
        info = {
            "pts": item.pts, "index": item.index, "base_index": item.base_index,
            "speaking": item.speaking, "end_of_speech": item.end_of_speech, "utterance_id": item.utterance_id,
        }
        for out in (image, audio):
            out.pts = item.pts * NS_PER_SAMPLE
            out.metadata["lipstream"] = info
        await self.push_frame(image)
        if generation == self._generation:  # an interruption between the two: its audio is not wanted
            await self.push_frame(audio)
