"""Wire protocol v1 (docs/protocol.md): the 20-byte media header and the JSON control messages."""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from lipstream.errors import LipstreamError

PROTOCOL_VERSION = 1
# 1.1 added conversation sessions (hello.agent), 1.2 the patch stream mode (hello.stream), 1.3 Opus audio
# (hello.audio_codec), 1.4 Opus from the client (mic_opus messages, ready.mic_codecs), 1.5 the `blink` flag
# (a patch-stream client draws blinks decided at phrase ends); older clients see no change
PROTOCOL_MINOR = 5
STREAM_MODES = ("full", "patch")  # what hello.stream may ask for; "full" is the default
AUDIO_CODECS = ("pcm", "opus")  # what hello.audio_codec may ask for; "pcm" is the default
MIC_CODECS = ("pcm", "opus")  # what a client may send its audio as (ready.mic_codecs, protocol 1.4)
PATCH_PREFIX = struct.Struct("<II")  # a patch message's payload starts with: loop index, source frame
HEADER = struct.Struct("<BBBBIIQ")  # version, kind, flags, reserved, seq, aux, pts
HEADER_SIZE = HEADER.size  # 20
OPUS_LENGTH = struct.Struct("<H")  # an Opus audio payload: each packet behind its length (protocol 1.3)


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
    PATCH = 5
    MIC_OPUS = 6  # client -> server: Opus packets of the client's audio (protocol 1.4)


class Flags(IntFlag):
    """Per-frame flags of media messages."""

    NONE = 0
    KEYFRAME = 1
    SPEAKING = 2
    END_OF_SPEECH = 4
    BLINK = 8  # video and patch messages: a blink decided at a phrase end starts on this frame (protocol 1.5)


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
    """Parse a binary message; raise ProtocolError (and nothing else) naming what is wrong.

    Flag bits above bit 3 and the reserved byte are ignored, so that they can gain a meaning later.
    Kind-specific checks (pcm sample rate, sizes) belong to the connection.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"binary message must be bytes, not {type(data).__name__}")
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
            f"unknown binary message kind {kind}; expected 1-6 (see docs/protocol.md)"
        ) from None
    return MediaMessage(
        kind_enum, bytes(data[HEADER_SIZE:]), seq=seq, aux=aux, pts=pts, flags=Flags(flags & 15)
    )


def pack_packets(packets: list[bytes]) -> bytes:
    """An Opus audio message's payload: each packet behind its u16 little-endian length."""
    return b"".join(OPUS_LENGTH.pack(len(p)) + p for p in packets)


def unpack_packets(payload: bytes) -> list[bytes]:
    """The Opus packets of an audio message's payload; ProtocolError when the lengths do not add up."""
    packets, at = [], 0
    while at < len(payload):
        if at + OPUS_LENGTH.size > len(payload):
            raise ProtocolError(f"opus payload ends inside a packet length at byte {at} of {len(payload)}")
        (size,) = OPUS_LENGTH.unpack_from(payload, at)
        end = at + OPUS_LENGTH.size + size
        if size == 0 or end > len(payload):
            raise ProtocolError(
                f"opus packet of {size} bytes at byte {at} does not fit the {len(payload)}-byte payload"
            )
        packets.append(bytes(payload[at + OPUS_LENGTH.size : end]))
        at = end
    return packets


def frame_messages(frame: Any, patch: bool = False, opus: Any = None) -> tuple[bytes, bytes]:
    """The video (or, with `patch`, the patch) and audio messages of one AvatarFrame (encoded session
    frames only). A patch message carries the loop index and source frame it was made for, then the
    patch AU: empty while the mouth rests. With `opus` (the session's FrameAudioEncoder, protocol 1.3)
    the audio message carries the frame's Opus packets, flagged `keyframe` where the encoder restarted."""
    if frame.access_unit is None:
        raise ValueError("frame has no access unit; the session must run with encode=True")
    flags = Flags.NONE
    if frame.keyframe:
        flags |= Flags.KEYFRAME
    if frame.speaking:
        flags |= Flags.SPEAKING
    if frame.end_of_speech:
        flags |= Flags.END_OF_SPEECH
    if getattr(frame, "blink_starts", False):
        flags |= Flags.BLINK
    aux = 0 if frame.utterance_id is None else frame.utterance_id + 1
    if patch:
        payload = PATCH_PREFIX.pack(frame.loop_index, frame.base_index) + bytes(frame.access_unit)
        video = MediaMessage(Kind.PATCH, payload, frame.index, aux, frame.pts, flags)
    else:
        video = MediaMessage(Kind.VIDEO, bytes(frame.access_unit), frame.index, aux, frame.pts, flags)
    audio_flags = flags & ~Flags.KEYFRAME & ~Flags.BLINK
    if opus is None:
        audio_payload = frame.audio.astype("<i2").tobytes()
    else:
        packets, restarted = opus.encode(frame.pts, frame.audio)
        audio_payload = pack_packets(packets)
        if restarted:  # the decoder must restart too, and drop the new stream's pre-skip
            audio_flags |= Flags.KEYFRAME
    audio = MediaMessage(Kind.AUDIO, audio_payload, frame.index, aux, frame.pts, audio_flags)
    return video.encode(), audio.encode()


# ---- control messages, client -> server ----

# JSON numbers above 2^53 lose precision in JavaScript clients and overflow the u64/u32 fields downstream;
# no legitimate pts, id or count gets near it (2^53 samples at 16 kHz is ~17,800 years)
MAX_SAFE_INT = 2**53 - 1
# No client message nests deeper than 2 (client_stats.av_offset_ms); 16 leaves room for ignored future
# fields while keeping any later walk over the value (pydantic's included) far from the recursion limit
MAX_NESTING = 16
# Control characters (C0 except tab/newline/carriage return, DEL, C1) and UTF-16 surrogates: a lone
# surrogate cannot be encoded as UTF-8, so it would crash TTS or the sender later instead of failing here
_BAD_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_VOICE = r"^[A-Za-z0-9_-]{1,32}$"


def _bad_char(text: str) -> str | None:
    """A description of the first forbidden character in `text`, or None when it is clean."""
    match = _BAD_CHARS.search(text)
    if match is None:
        return None
    char = match.group()
    kind = "a lone UTF-16 surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
    return f"{kind} U+{ord(char):04X} at index {match.start()}"


# The character checks run before pydantic's own str check, which refuses some surrogates with a vaguer
# message of its own; a non-str value passes through to be refused by the strict str type.


def _clean_text(value: Any) -> Any:
    """Speak text: reject control characters and surrogates with the `bad_text` error type."""
    problem = _bad_char(value) if isinstance(value, str) else None
    if problem is not None:
        raise PydanticCustomError("bad_text", "text contains {problem}", {"problem": problem})
    return value


def _clean_name(value: Any) -> Any:
    """Names and tokens: the same character rule as text, but a plain bad_message."""
    problem = _bad_char(value) if isinstance(value, str) else None
    if problem is not None:
        raise ValueError(f"contains {problem}")
    return value


def _ping_id(value: Any) -> int | str | None:
    """Ping ids are echoed back: a JSON-safe integer, a short string, or null."""
    if value is None or (isinstance(value, str) and len(value) <= 64):
        return value
    if type(value) is int and -MAX_SAFE_INT <= value <= MAX_SAFE_INT:  # type(): a bool is not an id
        return value
    raise ValueError("id must be an integer with |id| < 2^53, a string of at most 64 characters, or null")


Count = Annotated[int, Field(ge=0, le=MAX_SAFE_INT)]
FiniteMs = Annotated[float, Field(allow_inf_nan=False)]
Name = Annotated[str, Field(max_length=128), BeforeValidator(_clean_name)]


class ClientModel(BaseModel):
    """Base of the client messages: strict types, unknown fields ignored.

    Strict: a JSON string is never a number ("5" is not 5), a bool is never an int, a float is never an
    int (an int is accepted where a float is expected). Unknown fields are ignored so that a newer client
    can add optional fields without breaking an older server.
    """

    model_config = ConfigDict(strict=True, extra="ignore")


class Hello(ClientModel):
    """Opens a session."""

    type: Literal["hello"]
    version: Annotated[int, Field(ge=0, le=2**31 - 1)] = PROTOCOL_VERSION
    avatar: Name | None = None
    # a parser-level sanity range only; the server snaps it to the sizes it can produce
    output_width: Annotated[int, Field(ge=16, le=8192)] | None = None
    token: Annotated[str, Field(max_length=1024), BeforeValidator(_clean_name)] | None = None
    agent: bool = False  # protocol 1.1: a conversation session (the server listens and answers)
    # protocol 1.2: "full" (whole frames) or "patch" (the mouth only; the client composites). Any name is
    # parsed; the connection refuses one the server lacks with the `stream` error code
    stream: Annotated[str, Field(min_length=1, max_length=32), BeforeValidator(_clean_name)] = "full"
    # protocol 1.3: "pcm" (s16 16 kHz, as before) or "opus" (20 ms Opus packets). Any name is parsed; the
    # connection refuses one the server lacks with the `audio_codec` error code
    audio_codec: Annotated[str, Field(min_length=1, max_length=32), BeforeValidator(_clean_name)] = "pcm"


class Speak(ClientModel):
    """Speak text through TTS."""

    type: Literal["speak"]
    # length and emptiness are checked by the connection against its configured max_text_chars
    text: Annotated[str, BeforeValidator(_clean_text)]
    voice: Annotated[str, Field(pattern=_VOICE)] | None = None


class Flush(ClientModel):
    """End of the pushed-PCM utterance."""

    type: Literal["flush"]


class Interrupt(ClientModel):
    """Drop pending speech now."""

    type: Literal["interrupt"]


class KeyframeRequest(ClientModel):
    """Ask for an IDR."""

    type: Literal["keyframe"]


class OffsetStats(ClientModel):
    """A/V offset summary measured by the player, in ms (positive: video late)."""

    p50: FiniteMs = 0.0
    p95: FiniteMs = 0.0
    max: FiniteMs = 0.0
    mean: FiniteMs = 0.0
    count: Count = 0


class ClientStats(ClientModel):
    """What the player measured; kept per session for /api/sessions."""

    type: Literal["client_stats"]
    av_offset_ms: OffsetStats = Field(default_factory=OffsetStats)
    frames_shown: Count = 0
    frames_dropped: Count = 0
    frames_late: Count = 0
    decode_errors: Count = 0
    ttff_ms: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None


class Position(ClientModel):
    """The pts the player is playing now; the server paces production from it (audio is the master clock)."""

    type: Literal["position"]
    pts: Annotated[int, Field(ge=0, le=MAX_SAFE_INT)]


class Ping(ClientModel):
    """Liveness check."""

    type: Literal["ping"]
    id: Annotated[int | str | None, PlainValidator(_ping_id)] = None


ClientControl = Annotated[
    Hello | Speak | Flush | Interrupt | KeyframeRequest | ClientStats | Position | Ping,
    Field(discriminator="type"),
]
_CLIENT_CONTROL = TypeAdapter(ClientControl)
CLIENT_TYPES = ("hello", "speak", "flush", "interrupt", "keyframe", "client_stats", "position", "ping")


class _NonFiniteLiteral(ValueError):
    """Python's json accepts NaN/Infinity/-Infinity; JSON (RFC 8259) does not, and neither do we."""


def _reject_constant(name: str) -> Any:
    raise _NonFiniteLiteral(name)


def _too_deep(value: Any, limit: int) -> bool:
    """True when lists/objects nest deeper than `limit` (iterative: deep input cannot recurse here)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _short(value: Any, limit: int = 40) -> str:
    """repr() cut to `limit` characters, so an error never echoes a huge input back."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_json(text: str) -> Any:
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"control message is not valid JSON ({exc.msg} at char {exc.pos})") from None
    except _NonFiniteLiteral as exc:
        raise ProtocolError(f"control message uses {exc}, which is not a JSON number") from None
    except RecursionError:
        raise ProtocolError(f"control message nests lists/objects deeper than {MAX_NESTING}") from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's 4300-digit limit
        raise ProtocolError(f"control message has an unreadable value ({_short(str(exc), 80)})") from None
    # only a text with many brackets can nest deeply; skip the walk for the usual small message
    if text.count("[") + text.count("{") > MAX_NESTING and _too_deep(raw, MAX_NESTING):
        raise ProtocolError(f"control message nests lists/objects deeper than {MAX_NESTING}")
    return raw


def _validate(raw: Any) -> BaseModel:
    if not isinstance(raw, dict) or "type" not in raw:
        raise ProtocolError('control message must be a JSON object with a "type" field')
    kind = raw["type"]
    if not isinstance(kind, str) or kind not in CLIENT_TYPES:
        raise ProtocolError(
            f"unknown message type {_short(kind)}; expected one of: {', '.join(CLIENT_TYPES)}"
        )
    try:
        return _CLIENT_CONTROL.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "message"
        code = "bad_text" if first["type"] == "bad_text" else "bad_message"
        raise ProtocolError(f"bad {kind!r} message: {where}: {first['msg']}", code) from None


def parse_control(text: str) -> BaseModel:
    """Parse a client JSON control message; raise ProtocolError (and nothing else) naming what is wrong."""
    try:
        if not isinstance(text, str):
            raise ProtocolError(f"control message must be text, not {type(text).__name__}")
        return _validate(_parse_json(text))
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError(f"control message nests lists/objects deeper than {MAX_NESTING}") from None
    except Exception as exc:  # noqa: BLE001 - the parser is total: bad input never escapes as another error
        raise ProtocolError(f"control message could not be parsed ({type(exc).__name__})") from None


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
