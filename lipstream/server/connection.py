"""One WebSocket connection: handshake, then frames out and control/audio in, until either side ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from lipstream.audio.decode import decode_upload
from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.avatar.bundle import CROP_SIZE, AvatarBundle, SharedBundles, list_avatars
from lipstream.errors import LipstreamError, MediaError, QueueFullError
from lipstream.media.opus import DECODE_RATE, PRE_SKIP, FrameAudioEncoder, OpusSettings, StreamAudioDecoder
from lipstream.render.workers import WorkerPools
from lipstream.server.auth import extract_token, token_ok
from lipstream.server.config import ServerConfig
from lipstream.server.metrics import ServerMetrics
from lipstream.server.protocol import (
    AUDIO_CODECS,
    MIC_CODECS,
    PROTOCOL_MINOR,
    PROTOCOL_VERSION,
    ClientStats,
    Flags,
    Flush,
    Hello,
    Interrupt,
    KeyframeRequest,
    Kind,
    MediaMessage,
    Ping,
    Position,
    ProtocolError,
    Speak,
    decode_media,
    error_message,
    event_message,
    frame_messages,
    parse_control,
    unpack_packets,
)
from lipstream.server.registry import SessionRecord, SessionRegistry
from lipstream.talk.speaker import Speaker

log = logging.getLogger(__name__)

SessionFactory = Callable[[AvatarBundle, Any, "int | None"], Any]
MIN_PCM_RATE, MAX_PCM_RATE = 8000, 48000
CLOSE_TIMEOUT_SECONDS = 2.0
HELLO_MAX_BYTES = 64 * 1024  # a hello is a few hundred bytes; nothing big is read before the token is checked


def opus_description(settings: OpusSettings) -> dict[str, Any]:
    """What an Opus client needs to set up its decoder (protocol 1.3); pts stay in 16 kHz samples."""
    return {
        "codec": "opus", "sample_rate": DECODE_RATE, "channels": 1, "frame_ms": 20,
        "packets_per_message": 2, "pre_skip": PRE_SKIP, "bitrate": settings.bitrate,
    }  # fmt: skip


def patch_description(session: Any, bundle: AvatarBundle) -> dict[str, Any]:
    """What a patch-mode client needs besides the frames: the patch stream and where the base loop is."""
    x0, y0, x1, y1 = session.patch_rect
    base = f"/edge/{bundle.name}/"
    return {
        "codec": session.codec_string, "width": x1 - x0, "height": y1 - y0, "rect": [x0, y0, x1, y1],
        "crop_size": CROP_SIZE, "loop_frames": len(bundle.idle_loop),
        "base_url": base, "manifest": f"{base}export.json",
    }  # fmt: skip


class _Closed(Exception):
    """The peer went away or the handshake failed; nothing more to send."""


class Connection:
    """Runs one client's session over a WebSocket; every failure stays inside this connection."""

    def __init__(
        self,
        ws: WebSocket,
        config: ServerConfig,
        engine: Any,
        registry: SessionRegistry,
        session_factory: SessionFactory,
        agent: Any = None,
        metrics: ServerMetrics | None = None,
        edge_exports: Any = None,
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
        self.session: Any = None
        self.agent = agent
        self.metrics = metrics
        self.edge_exports = edge_exports
        self.speaker = speaker
        self.pools = pools
        self.bundles = bundles
        self._patch_pending = False  # patch mode was asked, but the avatar's base loop is still being built
        self.conversation: Any = None  # in an agent session: the microphone goes here
        self._send_lock = asyncio.Lock()
        # speak requests wait here and are spoken one after another by one task, so a flood of them
        # queues (bounded) instead of synthesising all at once
        self._speak_queue: asyncio.Queue[Speak] = asyncio.Queue(maxsize=self.limits.max_queued_speaks)
        self._speaker: asyncio.Task | None = None
        self._patch_stream = False  # hello asked for the patch stream mode (protocol 1.2)
        # hello asked for Opus audio (protocol 1.3): this session's encoder; None sends PCM as before
        self._opus: FrameAudioEncoder | None = None
        self._mic_decoder: StreamAudioDecoder | None = None  # made on the client's first mic_opus message

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
            raise _Closed(f"client read nothing for {self.limits.send_timeout_seconds:g} s") from None

    async def _send_error(self, code: str, message: str, fatal: bool = False) -> None:
        if self.record is not None:
            self.record.errors_sent += 1
        with contextlib.suppress(Exception):
            await self._send_text(error_message(code, message, fatal))

    async def _fail(self, code: str, message: str, close_code: int) -> None:
        """Send a fatal error and close; used before `ready`."""
        if self.metrics is not None:
            self.metrics.session_refused(code)
        await self._send_error(code, message, fatal=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(close_code), CLOSE_TIMEOUT_SECONDS)
        raise _Closed(message)

    # ---- handshake ----

    async def _handshake(self) -> Hello:
        try:
            msg = await asyncio.wait_for(self.ws.receive(), self.limits.hello_timeout_seconds)
        except asyncio.TimeoutError:
            await self._fail("bad_message", f"no hello within {self.limits.hello_timeout_seconds:g} s", 4408)
        if msg["type"] == "websocket.disconnect":
            raise _Closed("disconnected before hello")
        text = msg.get("text")
        if text is None:
            await self._fail(
                "bad_message", 'the first message must be a JSON {"type": "hello"} message', 4400
            )
        if len(text) > HELLO_MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > HELLO_MAX_BYTES:
            await self._fail("too_large", f"hello is over {HELLO_MAX_BYTES} bytes", 4400)
        try:
            hello = parse_control(text)
        except ProtocolError as exc:
            await self._fail(exc.code, str(exc), 4400)
        if not isinstance(hello, Hello):
            await self._fail("bad_message", f'the first message must be "hello", not {hello.type!r}', 4400)
        if hello.version != PROTOCOL_VERSION:
            await self._fail(
                "version",
                f"client speaks protocol {hello.version}; this server speaks {PROTOCOL_VERSION}",
                4400,
            )
        given = hello.token or extract_token(self.ws.headers, self.ws.query_params)
        if not token_ok(self.config.token, given):
            await self._fail("unauthorized", "missing or wrong token; pass the server's --token", 4401)
        return hello

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
            hello = await self._handshake()
            await self._open_session(hello)
            await self._stream()
        except _Closed:
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
            self.conversation = self.agent.conversation(self.session, self._emit_json, speaker=self.speaker)
        ready = {
            "type": "ready",
            "version": PROTOCOL_VERSION,
            "minor": PROTOCOL_MINOR,
            "agent": self.conversation is not None,
            "session_id": self.record.session_id,
            "avatar": bundle.name,
            "codec": self.session.codec_string,
            "width": self.session.width,
            "height": self.session.height,
            "fps": 25,
            "sample_rate": SAMPLE_RATE,
            "limits": self.limits.model_dump(exclude={"hello_timeout_seconds"}),
            "stream": "patch" if self._patch_stream else "full",
        }
        ready["audio_codec"] = "opus" if self._opus is not None else "pcm"
        ready["mic_codecs"] = list(MIC_CODECS)
        if self._opus is not None:
            ready["audio"] = opus_description(self._opus.settings)
        if self._patch_pending:
            ready["patch_pending"] = True
        if self._patch_stream:
            ready["patch"] = patch_description(self.session, bundle)
        if self.config.replica_id:  # behind a Ray Serve proxy: which replica holds this session
            ready["replica"] = self.config.replica_id
        await self._send_text(json.dumps(ready))
        if self.metrics is not None:
            self.metrics.session_opened()
        if self.conversation is not None and getattr(self.agent, "greeting", None):  # the persona says hello
            self._queue_speak(Speak(type="speak", text=self.agent.greeting, voice=self.agent.voice))

    async def _going_away(self) -> None:
        """The server (a Ray replica being removed) is leaving: close with 1001 so the client reconnects."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(1001, "server going away"), CLOSE_TIMEOUT_SECONDS)

    async def _emit_json(self, message: dict[str, Any]) -> None:
        if self.metrics is not None and message.get("type") == "turn_metrics":
            self.metrics.turn_finished(message.get("ms") or {})
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
            if isinstance(exc, _Closed):
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
                    await self._on_binary(msg["bytes"])
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
                speeches = await self.speaker.speak(message.text, message.voice)
                await self.session.push_speech_stream(speeches)
            except asyncio.CancelledError:
                raise
            except LipstreamError as exc:
                await self._send_error("bad_text", str(exc))
            except Exception:  # noqa: BLE001 - a TTS failure ends this request, not the session
                log.exception("speak failed")
                await self._send_error("internal", "speak failed (the server log has the details)")

    async def _on_binary(self, data: bytes) -> None:
        if len(data) > self.limits.max_message_bytes + 20:
            raise ProtocolError(
                f"binary message of {len(data)} bytes is over the limit of {self.limits.max_message_bytes}",
                "too_large",
            )
        media = decode_media(data)
        if media.kind == Kind.PCM:
            await self._on_pcm(media)
        elif media.kind == Kind.MIC_OPUS:
            await self._on_mic_opus(media)
        elif media.kind == Kind.UPLOAD:
            await self._on_upload(media.payload)
        else:
            raise ProtocolError(
                f"binary kind {media.kind.name.lower()} is sent by the server, not the client"
            )

    async def _on_pcm(self, media: MediaMessage) -> None:
        _check_rate(media.aux, "pcm chunk declares sample rate")
        if len(media.payload) % 2:
            raise ProtocolError("pcm chunk has an odd byte count; it must be whole s16le samples")
        if media.payload:
            pcm = np.frombuffer(media.payload, dtype="<i2").astype(np.int16)
            await self._take_client_audio(pcm, media.aux)

    async def _on_mic_opus(self, media: MediaMessage) -> None:
        # aux is the capture rate (a browser may encode 44.1 kHz); Opus decodes at 48 kHz whatever it was
        _check_rate(media.aux, "mic_opus message declares capture rate")
        packets = unpack_packets(media.payload)
        if self._mic_decoder is None:
            self._mic_decoder = StreamAudioDecoder()
        try:
            pcm = self._mic_decoder.decode(packets, restart=bool(media.flags & Flags.KEYFRAME))
        except MediaError as exc:
            raise ProtocolError(f"{exc}; send whole Opus packets, one encoder's stream", "bad_audio") from exc
        if len(pcm):
            await self._take_client_audio(pcm, DECODE_RATE)

    async def _take_client_audio(self, pcm: np.ndarray, rate: int) -> None:
        """The client's audio: the microphone in a conversation, speech to lip-sync otherwise."""
        if self.conversation is not None:
            await self.conversation.push_microphone(pcm, rate)
        else:
            await self.session.push_audio_async(pcm, rate)

    async def _on_upload(self, payload: bytes) -> None:
        if len(payload) > self.limits.max_upload_bytes:
            raise ProtocolError(
                f"upload of {len(payload)} bytes is over the limit of {self.limits.max_upload_bytes}",
                "too_large",
            )
        if not payload:
            raise ProtocolError("upload is empty; send the bytes of an audio file", "bad_audio")
        # rate and length are checked before and while decoding (never a whole lying file decoded)
        pcm = await self.pools.run_speech(decode_upload, payload, self.limits.max_upload_seconds)
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


def _check_rate(rate: int, says: str) -> None:
    """A client audio message's aux rate, within what the server resamples; bad_audio otherwise."""
    if not MIN_PCM_RATE <= rate <= MAX_PCM_RATE:
        message = f"{says} {rate} Hz; put {MIN_PCM_RATE}-{MAX_PCM_RATE} in the aux field"
        raise ProtocolError(message, "bad_audio")
