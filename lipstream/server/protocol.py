"""Wire protocol v1 (docs/protocol.md): the 20-byte media header and the JSON control messages."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from lipstream.errors import LipstreamError

PROTOCOL_VERSION = 1
HEADER = struct.Struct("<BBBBIIQ")  # version, kind, flags, reserved, seq, aux, pts
HEADER_SIZE = HEADER.size  # 20


class ProtocolError(LipstreamError):
    """A message that does not follow docs/protocol.md; `code` is the error code sent back."""

    def __init__(self, message: str, code: str = "bad_message") -> None:
        super().__init__(message)
        self.code = code


class Kind(IntEnum):
    """What a binary message carries."""

    VIDEO = 1
    AUDIO = 2
    PCM = 3
    UPLOAD = 4


class Flags(IntFlag):
    """Per-frame flags of media messages."""

    NONE = 0
    KEYFRAME = 1
    SPEAKING = 2
    END_OF_SPEECH = 4


@dataclass(frozen=True)
class MediaMessage:
    """One binary message: header fields plus payload bytes."""

    kind: Kind
    payload: bytes
    seq: int = 0
    aux: int = 0
    pts: int = 0
    flags: Flags = Flags.NONE

    @property
    def utterance_id(self) -> int | None:
        """Utterance of a video/audio frame (None when idle)."""
        return self.aux - 1 if self.aux else None

    def encode(self) -> bytes:
        """Header + payload, ready to send."""
        return HEADER.pack(
            PROTOCOL_VERSION, int(self.kind), int(self.flags), 0, self.seq, self.aux, self.pts
        ) + (self.payload)


def decode_media(data: bytes) -> MediaMessage:
    """Parse a binary message; raise ProtocolError naming what is wrong."""
    if len(data) < HEADER_SIZE:
        raise ProtocolError(
            f"binary message of {len(data)} bytes is shorter than the {HEADER_SIZE}-byte header"
        )
    version, kind, flags, _reserved, seq, aux, pts = HEADER.unpack_from(data)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"binary message has protocol version {version}; this server speaks {PROTOCOL_VERSION}"
        )
    try:
        kind_enum = Kind(kind)
    except ValueError:
        raise ProtocolError(
            f"unknown binary message kind {kind}; expected 1-4 (see docs/protocol.md)"
        ) from None
    return MediaMessage(
        kind_enum, bytes(data[HEADER_SIZE:]), seq=seq, aux=aux, pts=pts, flags=Flags(flags & 7)
    )


def frame_messages(frame: Any) -> tuple[bytes, bytes]:
    """The video and audio messages of one AvatarFrame (encoded session frames only)."""
    if frame.access_unit is None:
        raise ValueError("frame has no access unit; the session must run with encode=True")
    flags = Flags.NONE
    if frame.keyframe:
        flags |= Flags.KEYFRAME
    if frame.speaking:
        flags |= Flags.SPEAKING
    if frame.end_of_speech:
        flags |= Flags.END_OF_SPEECH
    aux = 0 if frame.utterance_id is None else frame.utterance_id + 1
    video = MediaMessage(Kind.VIDEO, bytes(frame.access_unit), frame.index, aux, frame.pts, flags)
    audio_flags = flags & ~Flags.KEYFRAME
    audio = MediaMessage(
        Kind.AUDIO, frame.audio.astype("<i2").tobytes(), frame.index, aux, frame.pts, audio_flags
    )
    return video.encode(), audio.encode()


# ---- control messages, client -> server ----


class Hello(BaseModel):
    """Opens a session."""

    type: Literal["hello"]
    version: int = PROTOCOL_VERSION
    avatar: str | None = None
    output_width: int | None = Field(default=None, ge=64, le=4096)
    token: str | None = None


class Speak(BaseModel):
    """Speak text through TTS."""

    type: Literal["speak"]
    text: str
    voice: str | None = None


class Flush(BaseModel):
    """End of the pushed-PCM utterance."""

    type: Literal["flush"]


class Interrupt(BaseModel):
    """Drop pending speech now."""

    type: Literal["interrupt"]


class KeyframeRequest(BaseModel):
    """Ask for an IDR."""

    type: Literal["keyframe"]


class OffsetStats(BaseModel):
    """A/V offset summary measured by the player, in ms (positive: video late)."""

    p50: float = 0.0
    p95: float = 0.0
    max: float = 0.0
    mean: float = 0.0
    count: int = 0


class ClientStats(BaseModel):
    """What the player measured; kept per session for /api/sessions."""

    type: Literal["client_stats"]
    av_offset_ms: OffsetStats = Field(default_factory=OffsetStats)
    frames_shown: int = 0
    frames_dropped: int = 0
    frames_late: int = 0
    decode_errors: int = 0
    ttff_ms: float | None = None


class Position(BaseModel):
    """The pts the player is playing now; the server paces production from it (audio is the master clock)."""

    type: Literal["position"]
    pts: int = Field(ge=0)


class Ping(BaseModel):
    """Liveness check."""

    type: Literal["ping"]
    id: int | str | None = None


ClientControl = Annotated[
    Hello | Speak | Flush | Interrupt | KeyframeRequest | ClientStats | Position | Ping,
    Field(discriminator="type"),
]
_CLIENT_CONTROL = TypeAdapter(ClientControl)
CLIENT_TYPES = ("hello", "speak", "flush", "interrupt", "keyframe", "client_stats", "position", "ping")


def parse_control(text: str) -> BaseModel:
    """Parse a client JSON control message; raise ProtocolError naming what is wrong."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"control message is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(raw, dict) or "type" not in raw:
        raise ProtocolError('control message must be a JSON object with a "type" field')
    if raw["type"] not in CLIENT_TYPES:
        raise ProtocolError(
            f"unknown message type {raw['type']!r}; expected one of: {', '.join(CLIENT_TYPES)}"
        )
    try:
        return _CLIENT_CONTROL.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "message"
        raise ProtocolError(f"bad {raw['type']!r} message: {where}: {first['msg']}") from None


# ---- control messages, server -> client ----


def error_message(code: str, message: str, fatal: bool = False) -> str:
    """JSON of an error event."""
    return json.dumps({"type": "error", "code": code, "message": message, "fatal": fatal})


def event_message(event: Any) -> str:
    """JSON of a SessionEvent (speech_started, playback_finished, error)."""
    if event.type == "error":
        return error_message("internal", event.message or "session error", fatal=False)
    body: dict[str, Any] = {
        "type": event.type,
        "utterance_id": event.utterance_id,
        "position_samples": event.position_samples,
    }
    if event.type == "playback_finished":
        body["interrupted"] = bool(event.interrupted)
    return json.dumps(body)
