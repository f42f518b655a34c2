"""A connection's opening: the client's hello, checked (size, version, token), and the `ready` answer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

from fastapi import WebSocket

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.avatar.bundle import CROP_SIZE, AvatarBundle
from lipstream.media.opus import DECODE_RATE, PRE_SKIP, OpusSettings
from lipstream.server.auth import extract_token, token_ok
from lipstream.server.config import ServerConfig
from lipstream.server.protocol import (
    MIC_CODECS,
    PROTOCOL_MINOR,
    PROTOCOL_VERSION,
    Hello,
    ProtocolError,
    parse_control,
)

if TYPE_CHECKING:
    from lipstream.render.session import RenderSession

HELLO_MAX_BYTES = 64 * 1024  # a hello is a few hundred bytes; nothing big is read before the token is checked

# sends a fatal error (code, message) and closes the socket with a close code; never returns
Fail = Callable[[str, str, int], Awaitable[NoReturn]]


class Closed(Exception):
    """The peer went away or the handshake failed; nothing more to send."""


async def read_hello(ws: WebSocket, config: ServerConfig, fail: Fail) -> Hello:
    """The client's first message, a checked `hello` with the server's token; `fail` ends anything else."""
    limits = config.limits
    try:
        msg = await asyncio.wait_for(ws.receive(), limits.hello_timeout_seconds)
    except asyncio.TimeoutError:
        await fail("bad_message", f"no hello within {limits.hello_timeout_seconds:g} s", 4408)
    if msg["type"] == "websocket.disconnect":
        raise Closed("disconnected before hello")
    text = msg.get("text")
    if text is None:
        await fail("bad_message", 'the first message must be a JSON {"type": "hello"} message', 4400)
    if len(text) > HELLO_MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > HELLO_MAX_BYTES:
        await fail("too_large", f"hello is over {HELLO_MAX_BYTES} bytes", 4400)
    try:
        hello = parse_control(text)
    except ProtocolError as exc:
        await fail(exc.code, str(exc), 4400)
    if not isinstance(hello, Hello):
        await fail("bad_message", f'the first message must be "hello", not {hello.type!r}', 4400)
    if hello.version != PROTOCOL_VERSION:
        await fail(
            "version", f"client speaks protocol {hello.version}; this server speaks {PROTOCOL_VERSION}", 4400
        )
    given = hello.token or extract_token(ws.headers, ws.query_params)
    if not token_ok(config.token, given):
        await fail("unauthorized", "missing or wrong token; pass the server's --token", 4401)
    return hello


def opus_description(settings: OpusSettings) -> dict[str, Any]:
    """What an Opus client needs to set up its decoder (protocol 1.3); pts stay in 16 kHz samples."""
    return {
        "codec": "opus", "sample_rate": DECODE_RATE, "channels": 1, "frame_ms": 20,
        "packets_per_message": 2, "pre_skip": PRE_SKIP, "bitrate": settings.bitrate,
    }  # fmt: skip


def patch_description(session: RenderSession, bundle: AvatarBundle) -> dict[str, Any]:
    """What a patch-mode client needs besides the frames: the patch stream and where the base loop is."""
    x0, y0, x1, y1 = session.patch_rect
    base = f"/edge/{bundle.name}/"
    return {
        "codec": session.codec_string, "width": x1 - x0, "height": y1 - y0, "rect": [x0, y0, x1, y1],
        "crop_size": CROP_SIZE, "loop_frames": len(bundle.idle_loop),
        "base_url": base, "manifest": f"{base}export.json",
    }  # fmt: skip


def ready_message(
    config: ServerConfig,
    session: RenderSession,
    bundle: AvatarBundle,
    session_id: str,
    *,
    agent: bool,
    patch_stream: bool,
    patch_pending: bool,
    opus: OpusSettings | None,
) -> dict[str, Any]:
    """The `ready` answer to a hello: the session, its stream and audio, and the server's limits."""
    ready = {
        "type": "ready",
        "version": PROTOCOL_VERSION,
        "minor": PROTOCOL_MINOR,
        "agent": agent,
        "session_id": session_id,
        "avatar": bundle.name,
        "codec": session.codec_string,
        "width": session.width,
        "height": session.height,
        "fps": 25,
        "sample_rate": SAMPLE_RATE,
        "limits": config.limits.model_dump(exclude={"hello_timeout_seconds"}),
        "stream": "patch" if patch_stream else "full",
    }
    ready["audio_codec"] = "opus" if opus is not None else "pcm"
    ready["mic_codecs"] = list(MIC_CODECS)
    if opus is not None:
        ready["audio"] = opus_description(opus)
    if patch_pending:
        ready["patch_pending"] = True
    if patch_stream:
        ready["patch"] = patch_description(session, bundle)
    if config.replica_id:  # behind a Ray Serve proxy: which replica holds this session
        ready["replica"] = config.replica_id
    return ready
