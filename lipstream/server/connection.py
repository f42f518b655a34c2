"""One WebSocket connection: handshake, then frames out and control/audio in, until either side ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.avatar.bundle import AvatarBundle, SharedBundles, list_avatars
from lipstream.errors import LipstreamError, QueueFullError
from lipstream.media.opus import FrameAudioEncoder
from lipstream.render.workers import WorkerPools
from lipstream.server.client_audio import ClientAudio
from lipstream.server.config import ServerConfig
from lipstream.server.handshake import Closed, read_hello, ready_message
from lipstream.server.metrics import ServerMetrics
from lipstream.server.protocol import (
    AUDIO_CODECS,
    ClientStats,
    Flush,
    Hello,
    Interrupt,
    KeyframeRequest,
    Ping,
    Position,
    ProtocolError,
    Speak,
    error_message,
    event_message,
    frame_messages,
    parse_control,
)
from lipstream.server.session_registry import SessionRecord, SessionRegistry
from lipstream.talk.seats import SeatsFull, seat_size
from lipstream.talk.voices.speaker import Speaker

if TYPE_CHECKING:  # types only: the server imports these rooms' heavy parts where it builds them
    from lipstream.engines.base import Engine
    from lipstream.render.session import RenderSession
    from lipstream.server.edge_routes import EdgeExports
    from lipstream.talk.agent import AgentServices
    from lipstream.talk.conversation import Conversation

log = logging.getLogger(__name__)

# (bundle, engine, output_width) -> a render session of full frames; called with stream="patch" as well
# when the client asked for the patch stream (a factory of three arguments serves full frames only)
SessionFactory = Callable[..., "RenderSession"]
CLOSE_TIMEOUT_SECONDS = 2.0


class Connection:
    """Runs one client's session over a WebSocket; every failure stays inside this connection."""

    def __init__(
        self,
        ws: WebSocket,
        config: ServerConfig,
        engine: Engine,
        registry: SessionRegistry,
        session_factory: SessionFactory,
        agent: AgentServices | None = None,
        metrics: ServerMetrics | None = None,
        edge_exports: EdgeExports | None = None,
        *,
        speaker: Speaker,
        pools: WorkerPools,
        bundles: SharedBundles,
    ) -> None:
        """`agent`: the server's AgentServices when it runs with --agent (sessions may ask for it);
        `metrics`: the server's Prometheus metrics; `edge_exports`: the avatars' base-loop data (EdgeExports)
        a patch-stream client downloads; `speaker`: turns `speak` text into speech (the server's voices);
        `pools`: where blocking speech work (decoding an upload) runs; `bundles`: the avatars open on this
        server, shared by its sessions."""
        self.ws = ws
        self.config = config
        self.limits = config.limits
        self.engine = engine
        self.registry = registry
        self.session_factory = session_factory
        self.record: SessionRecord | None = None
        self.session: RenderSession | None = None
        self.agent = agent
        self.metrics = metrics
        self.edge_exports = edge_exports
        self.speaker = speaker
        self.pools = pools
        self.bundles = bundles
        self._patch_pending = False  # patch mode was asked, but the avatar's base loop is still being built
        self.conversation: Conversation | None = None  # in an agent session: the microphone goes here
        self._send_lock = asyncio.Lock()
        # speak requests wait here and are spoken one after another by one task, so a flood of them
        # queues (bounded) instead of synthesising all at once
        self._speak_queue: asyncio.Queue[Speak] = asyncio.Queue(maxsize=self.limits.max_queued_speaks)
        self._speaker: asyncio.Task | None = None
        self._patch_stream = False  # hello asked for the patch stream mode (protocol 1.2)
        # hello asked for Opus audio (protocol 1.3): this session's encoder; None sends PCM as before
        self._opus: FrameAudioEncoder | None = None
        self._audio = ClientAudio(self.limits, pools, self._take_client_audio, self._take_upload)

    # ---- sending ----

    async def _send_text(self, text: str) -> None:
        async with self._send_lock:
            await self._timed_send(self.ws.send_text(text))

    async def _timed_send(self, sending) -> None:
        """Send, or end the session when the client has not read for `send_timeout_seconds` (a reader that
        stopped reading must not hold a session slot forever)."""
        try:
            await asyncio.wait_for(sending, self.limits.send_timeout_seconds)
        except asyncio.TimeoutError:
            raise Closed(f"client read nothing for {self.limits.send_timeout_seconds:g} s") from None

    async def _send_error(self, code: str, message: str, fatal: bool = False) -> None:
        if self.record is not None:
            self.record.errors_sent += 1
        with contextlib.suppress(Exception):
            await self._send_text(error_message(code, message, fatal))

    async def _fail(self, code: str, message: str, close_code: int) -> NoReturn:
        """Send a fatal error and close; used before `ready`."""
        if self.metrics is not None:
            self.metrics.session_refused(code)
        await self._send_error(code, message, fatal=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(close_code), CLOSE_TIMEOUT_SECONDS)
        raise Closed(message)

    # ---- handshake ----

    def _open_avatar(self, name: str | None) -> AvatarBundle:
        known = list_avatars(self.config.avatars_dir)
        if not name or name not in known:  # names only: a client never reaches a path on disk
            raise LipstreamError(
                f"unknown avatar {name!r}; known: {', '.join(known) or 'none'} "
                "(create one with `lipstream avatar sample`)"
            )
        return self.bundles.get(name)

    async def run(self) -> None:
        """The whole life of the connection; returns when it is over and everything is freed."""
        await self.ws.accept()
        try:
            hello = await read_hello(self.ws, self.config, self._fail)
            await self._open_session(hello)
            await self._stream()
        except Closed:
            pass
        finally:
            await self._teardown()

    async def _open_session(self, hello: Hello) -> None:
        if hello.stream not in self.config.stream_modes:
            await self._fail(
                "stream",
                f"this server has no {hello.stream!r} stream mode; it offers "
                f"{', '.join(self.config.stream_modes)} (omit `stream` for full frames)",
                4400,
            )
        if hello.audio_codec not in AUDIO_CODECS:
            await self._fail(
                "audio_codec",
                f"this server has no {hello.audio_codec!r} audio codec; it offers "
                f"{', '.join(AUDIO_CODECS)} (omit `audio_codec` for PCM)",
                4400,
            )
        self._patch_stream = hello.stream == "patch"
        if hello.audio_codec == "opus":
            self._opus = FrameAudioEncoder(self.config.opus)
        avatar = hello.avatar or self.ws.query_params.get("avatar")
        try:
            bundle = await asyncio.to_thread(self._open_avatar, avatar)
        except LipstreamError as exc:
            await self._fail("unknown_avatar", str(exc), 4404)
        if self._patch_stream and self.edge_exports is not None and not self.edge_exports.is_built(bundle):
            # the base loop takes ~20 s to build the first time: whole frames now rather than a blank wait
            self.edge_exports.build_in_background(bundle.name)
            self._patch_stream, self._patch_pending = False, True
        self.record = self.registry.reserve(bundle.name)
        if self.record is None:
            await self._fail(
                "busy", f"server is full ({self.limits.max_sessions} sessions); retry later", 1013
            )
        self.record.going_away = self._going_away
        try:
            # full frames call the factory as before (three arguments), so other factories keep working
            extra = {"stream": "patch"} if self._patch_stream else {}
            # built off the event loop: other clients' handshakes and streams never wait for it
            self.session = await asyncio.to_thread(
                self.session_factory, bundle, self.engine, hello.output_width, **extra
            )
            self.record.session = self.session
            await self.session.start()
        except LipstreamError as exc:
            log.warning("session start failed: %s", exc)  # e.g. an avatar's engine cache cannot be built here
            await self._fail("internal", str(exc), 1011)
        except Exception:  # noqa: BLE001 - any failure here is this session's alone
            log.exception("session start failed")
            await self._fail("internal", "session failed to start (the server log has the details)", 1011)
        if hello.agent and self.agent is not None:
            try:
                self.conversation = self.agent.conversation(
                    self.session, self._emit_json, speaker=self.speaker, observer=self.metrics,
                    seat_size=seat_size(self._patch_stream),
                )
            except SeatsFull as exc:  # every seat and the line are taken: refused now, not answered late
                await self._fail("busy", str(exc), 1013)
        ready = ready_message(
            self.config, self.session, bundle, self.record.session_id, agent=self.conversation is not None,
            patch_stream=self._patch_stream, patch_pending=self._patch_pending,
            opus=self._opus.settings if self._opus is not None else None,
        )  # fmt: skip
        await self._send_text(json.dumps(ready))
        if self.metrics is not None:
            self.metrics.session_opened()
        if self.conversation is not None:
            self.conversation.follow_seat()  # a visitor in line is told so at once
        if self.conversation is not None and self.agent is not None and self.agent.greeting:  # says hello
            self._queue_speak(Speak(type="speak", text=self.agent.greeting, voice=self.agent.voice))

    async def _going_away(self) -> None:
        """The server (a Ray replica being removed) is leaving: close with 1001 so the client reconnects."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(1001, "server going away"), CLOSE_TIMEOUT_SECONDS)

    async def _emit_json(self, message: dict[str, Any]) -> None:
        await self._send_text(json.dumps(message))

    # ---- streaming ----

    async def _stream(self) -> None:
        sender = asyncio.create_task(self._send_frames())
        receiver = asyncio.create_task(self._receive_loop())
        done, pending = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(BaseException):
                await task
        for task in done:
            exc = task.exception()
            if isinstance(exc, Closed):
                log.info("session %s closed: %s", self.record.session_id, exc)
            elif exc is not None and not isinstance(exc, WebSocketDisconnect):
                log.warning("session %s ended with %r", self.record.session_id, exc)
                # the client learns that it failed, not server internals (paths, stack details)
                await self._send_error("internal", "session failed (the server log has details)", fatal=True)

    async def _send_frames(self) -> None:
        from lipstream.render.frames import AvatarFrame

        # the Session makes the first frame after an interrupt an IDR, so every frame can go out as it comes
        async for item in self.session:
            if isinstance(item, AvatarFrame):
                video, audio = frame_messages(item, patch=self._patch_stream, opus=self._opus)
                async with self._send_lock:
                    await self._timed_send(self.ws.send_bytes(video))
                    await self._timed_send(self.ws.send_bytes(audio))
                self.record.frames_sent += 1
                if self.metrics is not None:
                    self.metrics.frame_sent(item.speaking)
                if self.conversation is not None:
                    self.conversation.add_reference(item.pts, item.audio)
            else:
                if item.type != "text":  # sentence texts are only for conversation clients (reply_text)
                    await self._send_text(event_message(item))
                if self.conversation is not None:
                    extra = await self.conversation.on_stream_event(item)
                    if extra is not None:
                        await self._emit_json(extra)

    async def _receive_loop(self) -> None:
        while True:
            msg = await self.ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            self.record.messages_in += 1
            try:
                if msg.get("bytes") is not None:
                    await self._audio.on_binary(msg["bytes"])
                elif msg.get("text") is not None:
                    await self._on_text(msg["text"])
            except ProtocolError as exc:
                await self._send_error(exc.code, str(exc))
            except QueueFullError as exc:
                await self._send_error("queue_full", str(exc))
            except LipstreamError as exc:
                await self._send_error("bad_audio", str(exc))

    async def _on_text(self, text: str) -> None:
        if len(text.encode()) > self.limits.max_message_bytes:
            raise ProtocolError(f"message over {self.limits.max_message_bytes} bytes dropped", "too_large")
        message = parse_control(text)
        if isinstance(message, Speak):
            self._queue_speak(message)
        elif isinstance(message, Flush):
            await self.session.flush_async()
        elif isinstance(message, Interrupt):
            self._stop_speaking()  # sentences not yet said are dropped with their requests
            if self.conversation is not None:
                await self.conversation.interrupt()  # also cancels the answer being written
            else:
                self.session.interrupt()
        elif isinstance(message, KeyframeRequest):
            self.session.request_keyframe()
        elif isinstance(message, ClientStats):
            self.record.client_stats = message
            if self.metrics is not None:
                self.metrics.client_av_offset(message.av_offset_ms.model_dump())
        elif isinstance(message, Position):
            self.session.update_playback_position(message.pts)
        elif isinstance(message, Ping):
            await self._send_text(json.dumps({"type": "pong", "id": message.id}))
        elif isinstance(message, Hello):
            raise ProtocolError("hello was already received; this session is open")

    def _queue_speak(self, message: Speak) -> None:
        text = message.text.strip()
        if not text:
            raise ProtocolError("speak needs non-empty text", "bad_text")
        if len(text) > self.limits.max_text_chars:
            raise ProtocolError(
                f"text of {len(text)} characters is over the limit of {self.limits.max_text_chars}; split it",
                "bad_text",
            )
        try:
            self._speak_queue.put_nowait(message.model_copy(update={"text": text}))
        except asyncio.QueueFull:
            raise QueueFullError(
                f"{self._speak_queue.qsize()} speak requests are already waiting (the limit is "
                f"{self.limits.max_queued_speaks}); send more after playback_finished, or interrupt"
            ) from None
        if self._speaker is None or self._speaker.done():
            self._speaker = asyncio.create_task(self._speak_queued())

    def _stop_speaking(self) -> None:
        """Drop queued speak requests and stop the one being synthesised."""
        while not self._speak_queue.empty():
            self._speak_queue.get_nowait()
        if self._speaker is not None:
            self._speaker.cancel()
            self._speaker = None

    async def _speak_queued(self) -> None:
        """Speak queued requests in order, one at a time."""
        while not self._speak_queue.empty():
            message = self._speak_queue.get_nowait()
            try:
                speeches = await self.speaker.speak(message.text, message.voice, quick_start=True)
                await self.session.push_speech_stream(speeches)
            except asyncio.CancelledError:
                raise
            except LipstreamError as exc:
                await self._send_error("bad_text", str(exc))
            except Exception:  # noqa: BLE001 - a TTS failure ends this request, not the session
                log.exception("speak failed")
                await self._send_error("internal", "speak failed (the server log has the details)")

    async def _take_client_audio(self, pcm: np.ndarray, rate: int) -> None:
        """The client's audio: the microphone in a conversation, speech to lip-sync otherwise."""
        if self.conversation is not None:
            await self.conversation.push_microphone(pcm, rate)
        else:
            await self.session.push_audio_async(pcm, rate)

    async def _take_upload(self, pcm: np.ndarray) -> None:
        """A whole uploaded file, decoded: one utterance, played to its end."""
        await self.session.push_audio_async(pcm, SAMPLE_RATE)
        await self.session.flush_async()

    async def _teardown(self) -> None:
        self._stop_speaking()
        if self.conversation is not None:
            await self.conversation.aclose()
            self.conversation = None  # it refers back to this connection: let the session go by refcount
        if self.session is not None:
            with contextlib.suppress(Exception):
                await self.session.aclose()
        if self.record is not None:
            self.registry.release(self.record.session_id)
        self.session = None
        if self.ws.application_state != WebSocketState.DISCONNECTED:
            with contextlib.suppress(Exception):  # a client that reads nothing cannot hold us here
                await asyncio.wait_for(self.ws.close(1000), CLOSE_TIMEOUT_SECONDS)
