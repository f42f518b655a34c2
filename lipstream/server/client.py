"""The reference client: speaks protocol v1, records what it receives, and reports timing and continuity."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import websockets
from pydantic import BaseModel, Field

from lipstream.audio.timeline import SAMPLES_PER_FRAME
from lipstream.errors import LipstreamError
from lipstream.server.protocol import (
    AUDIO_CODECS,
    PROTOCOL_VERSION,
    Flags,
    Kind,
    MediaMessage,
    decode_media,
    unpack_packets,
)

OPUS_PACKETS_PER_FRAME = 2  # 20 ms Opus packets in one 40 ms frame's audio message


class ClientError(LipstreamError):
    """The server refused or broke the session."""


class ReceivedEvent(BaseModel):
    """A control message as it arrived, with its arrival time since the request."""

    at_ms: float
    message: dict[str, Any]


class ClientReport(BaseModel):
    """What the reference client measured."""

    url: str
    avatar: str
    codec: str = ""
    width: int = 0
    height: int = 0
    connect_ms: float = 0.0
    ready_ms: float = 0.0
    ttff_ms: float | None = None  # request sent -> first speaking video frame received
    frames_received: int = 0
    speech_frames: int = 0
    keyframes: int = 0
    first_pts: int | None = None
    last_pts: int | None = None
    pts_gaps: int = 0  # places where pts did not advance by exactly one frame
    pts_continuous: bool = True
    audio_matches_video: bool = True  # every video frame got exactly its 640-sample audio slice
    audio_samples: int = 0
    audio_codec: str = "pcm"  # what the server sends (protocol 1.3: "opus" when asked and offered)
    audio_bytes: int = 0  # audio message payloads received (PCM or Opus packets)
    video_bytes: int = 0  # video access units received
    duration_seconds: float = 0.0
    interrupted: bool | None = None
    events: list[ReceivedEvent] = Field(default_factory=list)
    errors: list[dict[str, Any]] = Field(default_factory=list)
    out: str | None = None


@dataclass
class _Recorder:
    """Frames from the first keyframe on: access units and their audio, with continuity checks."""

    access_units: list[bytes] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)
    pending_video: MediaMessage | None = None
    last_seq: int | None = None
    opus: Any = None  # a FrameAudioDecoder when the session's audio is Opus

    def add(self, msg: MediaMessage, report: ClientReport, t_ms: float) -> None:
        if msg.kind == Kind.VIDEO:
            if not self.access_units and not (msg.flags & Flags.KEYFRAME):
                return  # a decoder can only start on an IDR
            if self.pending_video is not None:
                report.audio_matches_video = False  # the previous frame never got its audio
            self.pending_video = msg
            self.access_units.append(msg.payload)
            report.video_bytes += len(msg.payload)
            report.frames_received += 1
            report.keyframes += bool(msg.flags & Flags.KEYFRAME)
            if msg.flags & Flags.SPEAKING:
                report.speech_frames += 1
                if report.ttff_ms is None:
                    report.ttff_ms = round(t_ms, 2)
            if report.last_pts is not None and msg.pts != report.last_pts + SAMPLES_PER_FRAME:
                report.pts_gaps += 1
                report.pts_continuous = False
            report.first_pts = msg.pts if report.first_pts is None else report.first_pts
            report.last_pts = msg.pts
        elif msg.kind == Kind.AUDIO and self.pending_video is not None:
            video = self.pending_video
            self.pending_video = None
            report.audio_bytes += len(msg.payload)
            if self.opus is not None:
                # decoded audio stays on the pts grid (see FrameAudioDecoder); a frame is two 20 ms packets
                packets = unpack_packets(msg.payload)
                pcm = self.opus.decode(packets, restart=bool(msg.flags & Flags.KEYFRAME))
                whole = len(packets) == OPUS_PACKETS_PER_FRAME
            else:
                pcm = np.frombuffer(msg.payload, dtype="<i2").astype(np.int16)
                whole = len(pcm) == SAMPLES_PER_FRAME
            if msg.seq != video.seq or msg.pts != video.pts or not whole:
                report.audio_matches_video = False
            self.audio.append(pcm)
            report.audio_samples += len(pcm)


async def run_client(
    url: str,
    avatar: str,
    text: str | None = None,
    audio: Path | None = None,
    out: Path | None = None,
    token: str | None = None,
    output_width: int | None = None,
    timeout: float = 120.0,
    audio_codec: str = "pcm",
) -> ClientReport:
    """Open a session, speak text or upload a file, record until playback_finished; return the report.

    `audio_codec`: "opus" asks for Opus audio (protocol 1.3), decoded here to the same 16 kHz PCM."""
    if (text is None) == (audio is None):
        raise ClientError("give exactly one of --text or --audio")
    upload = None
    if audio is not None:
        if not Path(audio).is_file():
            raise ClientError(f"audio file {audio} does not exist")
        upload = MediaMessage(Kind.UPLOAD, Path(audio).read_bytes()).encode()
    report = ClientReport(url=url, avatar=avatar)
    recorder = _Recorder()
    try:
        async with open_session(
            url, avatar, report, token, output_width, ready_timeout=timeout, audio_codec=audio_codec
        ) as (ws, ready):
            report.audio_codec = ready.get("audio_codec", "pcm")  # a pre-1.3 server sends PCM
            if report.audio_codec == "opus":
                from lipstream.media.opus import FrameAudioDecoder

                recorder.opus = FrameAudioDecoder()
            t_req = time.perf_counter()
            if upload is not None:
                await ws.send(upload)
            else:
                await ws.send(json.dumps({"type": "speak", "text": text}))
            await asyncio.wait_for(_receive_until_finished(ws, report, recorder, t_req), timeout)
    except (OSError, websockets.exceptions.InvalidHandshake) as exc:
        raise ClientError(f"cannot connect to {url}: {exc}") from None
    except asyncio.TimeoutError:
        raise ClientError(
            f"no playback_finished within {timeout:g} s; the server is too slow or stuck"
        ) from None
    except websockets.exceptions.ConnectionClosed as exc:
        raise ClientError(f"server closed the session: {exc}") from None
    report.duration_seconds = round(report.frames_received / 25.0, 3)
    if out is not None:
        save_recording(Path(out), recorder)
        report.out = str(out)
    return report


@contextlib.asynccontextmanager
async def open_session(
    url: str,
    avatar: str,
    report: Any,
    token: str | None = None,
    output_width: int | None = None,
    agent: bool = False,
    ready_timeout: float = 60.0,
    audio_codec: str = "pcm",
    stream: str = "full",
) -> AsyncIterator[tuple[Any, dict[str, Any]]]:
    """Connect, say hello and wait for `ready`: yields (socket, ready). Fills the report's connect and ready
    times and stream format; a refused session is a ClientError. `audio_codec`: "opus" asks for Opus audio
    (protocol 1.3); `ready["audio_codec"]` says what the server agreed to send (absent: PCM); `stream`:
    "patch" asks for the mouth-patch stream the page plays (protocol 1.2)."""
    if audio_codec not in AUDIO_CODECS:
        raise ClientError(f"unknown audio codec {audio_codec!r}; choose one of {', '.join(AUDIO_CODECS)}")
    headers = {"Authorization": f"Bearer {token}"} if token else None
    t0 = time.perf_counter()
    async with websockets.connect(url, additional_headers=headers, max_size=None, compression=None) as ws:
        report.connect_ms = round((time.perf_counter() - t0) * 1000, 2)
        hello: dict[str, Any] = {
            "type": "hello", "version": PROTOCOL_VERSION, "avatar": avatar, "output_width": output_width,
        }  # fmt: skip
        if agent:
            hello["agent"] = True
        if stream != "full":
            hello["stream"] = stream
        if audio_codec != "pcm":  # only when asked: a plain hello stays what v1 clients send
            hello["audio_codec"] = audio_codec
        await ws.send(json.dumps(hello))
        ready = json.loads(await asyncio.wait_for(ws.recv(), ready_timeout))
        if ready.get("type") != "ready":
            raise ClientError(f"server refused the session: {ready.get('message', ready)}")
        report.ready_ms = round((time.perf_counter() - t0) * 1000, 2)
        report.codec, report.width, report.height = ready["codec"], ready["width"], ready["height"]
        yield ws, ready


def save_recording(out: Path, recorder: _Recorder) -> None:
    """Write what a recorder received (H.264 access units and their audio) to an MP4."""
    from lipstream.server.recording import write_received_mp4

    pcm = np.concatenate(recorder.audio) if recorder.audio else np.zeros(0, np.int16)
    write_received_mp4(out, recorder.access_units, pcm)


async def _receive_until_finished(ws: Any, report: ClientReport, recorder: _Recorder, t_req: float) -> None:
    while True:
        data = await ws.recv()
        t_ms = (time.perf_counter() - t_req) * 1000
        if isinstance(data, bytes):
            recorder.add(decode_media(data), report, t_ms)
            continue
        message = json.loads(data)
        report.events.append(ReceivedEvent(at_ms=round(t_ms, 2), message=message))
        if message.get("type") == "error":
            report.errors.append(message)
            if message.get("fatal") or message.get("code") in ("bad_audio", "bad_text", "too_large"):
                raise ClientError(f"server error ({message.get('code')}): {message.get('message')}")
        if message.get("type") == "playback_finished":
            report.interrupted = bool(message.get("interrupted"))
            return
