"""Property tests of the wire protocol: the parsers are total, and a live session survives malformed input.

Hypothesis runs derandomized (a fixed seed) with bounded example counts, so the file is repeatable and quick.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import (
    BINARY_MESSAGES,
    CONTROL_CHARS,
    FAST,
    JSON_VALUES,
    KNOWN_TYPE_MESSAGES,
    dumps,
    mangled_json,
    media_bytes,
    nested,
)
from pydantic import BaseModel

from lipstream.server.protocol import (
    CLIENT_TYPES,
    HEADER,
    MAX_SAFE_INT,
    PROTOCOL_VERSION,
    ClientStats,
    Hello,
    Ping,
    Position,
    ProtocolError,
    Speak,
    decode_media,
    parse_control,
)

# ---- the parsers alone ----


def parses_or_protocol_error(text: str) -> BaseModel | None:
    """parse_control's result, None for a ProtocolError; any other exception fails the test."""
    try:
        message = parse_control(text)
    except ProtocolError as exc:
        assert exc.code in {"bad_message", "bad_text"}, exc.code
        assert len(str(exc)) < 300, "an error never echoes a big input back"
        return None
    assert isinstance(message, BaseModel) and message.type in CLIENT_TYPES
    return message


def assert_within_documented_bounds(message: BaseModel) -> None:
    """A model that parsed obeys every bound docs/protocol.md states."""
    if isinstance(message, Position):
        assert type(message.pts) is int and 0 <= message.pts <= MAX_SAFE_INT
    elif isinstance(message, Hello):
        assert type(message.version) is int
        assert message.output_width is None or (
            type(message.output_width) is int and 16 <= message.output_width <= 8192
        )
    elif isinstance(message, Speak):
        assert not set(message.text) & CONTROL_CHARS
        assert not any("\ud800" <= c <= "\udfff" for c in message.text)
        assert message.voice is None or (
            len(message.voice) <= 32 and message.voice.replace("-", "").replace("_", "").isalnum()
        )
    elif isinstance(message, Ping):
        assert (
            message.id is None
            or (type(message.id) is int and abs(message.id) <= MAX_SAFE_INT)
            or (isinstance(message.id, str) and len(message.id) <= 64)
        )
    elif isinstance(message, ClientStats):
        stats = message.av_offset_ms
        assert all(math.isfinite(v) for v in (stats.p50, stats.p95, stats.max, stats.mean))
        counts = (
            stats.count,
            message.frames_shown,
            message.frames_dropped,
            message.frames_late,
            message.decode_errors,
        )
        assert all(type(n) is int and 0 <= n <= MAX_SAFE_INT for n in counts)
        assert message.ttff_ms is None or (math.isfinite(message.ttff_ms) and message.ttff_ms >= 0)


@pytest.mark.slow
@FAST
@given(st.text())
def test_any_text_parses_or_is_a_protocol_error(text: str) -> None:
    parses_or_protocol_error(text)


@pytest.mark.slow
@FAST
@given(JSON_VALUES)
def test_any_json_value_parses_or_is_a_protocol_error(value: Any) -> None:
    parses_or_protocol_error(dumps(value))


@pytest.mark.slow
@FAST
@given(KNOWN_TYPE_MESSAGES)
def test_known_types_with_random_fields_parse_within_bounds_or_are_refused(value: dict) -> None:
    message = parses_or_protocol_error(dumps(value))
    if message is not None:
        assert message.type == value["type"]
        assert_within_documented_bounds(message)


@pytest.mark.slow  # hypothesis, 3.6 s
@FAST
@given(mangled_json())
def test_mangled_json_parses_or_is_a_protocol_error(text: str) -> None:
    message = parses_or_protocol_error(text)
    if message is not None:
        assert_within_documented_bounds(message)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(st.integers(1, 200_000), st.sampled_from(["list", "object"]))
def test_any_nesting_depth_parses_or_is_a_protocol_error(depth: int, kind: str) -> None:
    message = parses_or_protocol_error(nested(depth, kind))
    assert (message is not None) == (depth < 16)


@FAST
@given(st.one_of(st.binary(max_size=80), BINARY_MESSAGES))
def test_any_bytes_decode_or_are_a_protocol_error(data: bytes) -> None:
    try:
        media = decode_media(data)
    except ProtocolError as exc:
        assert exc.code == "bad_message"
        return
    version, kind, flags, _reserved, seq, aux, pts = HEADER.unpack_from(data)
    assert version == PROTOCOL_VERSION and media.kind == kind
    assert (media.seq, media.aux, media.pts, media.payload) == (seq, aux, pts, data[HEADER.size :])
    assert int(media.flags) == flags & 15  # bits above 3 are ignored


def test_media_bytes_helper_matches_the_documented_header() -> None:
    data = media_bytes(3, b"\x01\x02", seq=5, aux=16000)
    assert len(data) == 22 and struct.unpack_from("<BBBBIIQ", data) == (1, 3, 0, 0, 5, 16000, 0)
