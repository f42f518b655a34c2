"""The wire protocol's fuzzing strategies, shared by the parser tests and the live-server tests."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from lipstream.server.protocol import CLIENT_TYPES, HEADER, MAX_SAFE_INT, pack_packets

FAST = settings(derandomize=True, max_examples=400, deadline=None)
# queue_full: a valid speak while max_queued_speaks (4) already wait is dropped with it (docs/protocol.md);
# the derandomized examples change whenever the protocol's models do, and some runs send five speaks in a row
DOCUMENTED_CODES = {"bad_message", "bad_text", "bad_audio", "too_large", "queue_full"}
CONTROL_CHARS = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]} - {"\t", "\n", "\r"}

# ---- strategies ----

# numbers a careless or hostile client sends: edges of every bound the parser has, and far beyond
EDGE_INTS = st.sampled_from(
    [0, 1, -1, 15, 16, 8192, 8193, 2**31, 2**32, 2**40, MAX_SAFE_INT, 2**53, -(2**53), 2**64, 10**400]
)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    EDGE_INTS,
    st.floats(),  # includes NaN and +-inf: json.dumps writes them as NaN/Infinity literals
    st.text(max_size=20),
    st.sampled_from(["", "1", "540", "piper", "\u0000", "\ud800", "x" * 70, "1e400"]),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELD_NAMES = st.sampled_from(
    [
        "version", "avatar", "output_width", "token", "text", "voice", "pts", "id", "av_offset_ms",
        "frames_shown", "frames_dropped", "frames_late", "decode_errors", "ttff_ms", "type", "extra",
    ]
)  # fmt: skip
OFFSET_STATS = st.dictionaries(st.sampled_from(["p50", "p95", "max", "mean", "count", "x"]), JSON_SCALARS)
KNOWN_TYPE_MESSAGES = st.builds(
    lambda kind, fields, stats: {**fields, "type": kind, **({"av_offset_ms": stats} if stats else {})},
    st.sampled_from(CLIENT_TYPES),
    st.dictionaries(FIELD_NAMES, JSON_VALUES, max_size=4),
    st.none() | OFFSET_STATS,
)


def dumps(value: Any) -> str:
    """JSON text; ensure_ascii keeps lone surrogates as escapes, so the text can travel as UTF-8."""
    return json.dumps(value, ensure_ascii=True)


@st.composite
def mangled_json(draw: st.DrawFn) -> str:
    """A known-type message's JSON, cut short or with a few characters replaced or inserted."""
    text = dumps(draw(KNOWN_TYPE_MESSAGES))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        junk = draw(
            st.sampled_from(["", "{", "[", "}", '"', ",", ":", "\\", "\\u", "NaN", "\u0000", "9" * 30])
        )
        cut = draw(st.integers(0, 2))
        text = text[:at] + junk + text[at + cut :]
    return text


def nested(depth: int, kind: str) -> str:
    """JSON text nesting `depth` lists or objects inside a ping."""
    if kind == "list":
        inner = "[" * depth + "]" * depth
    else:
        inner = '{"a": ' * depth + "0" + "}" * depth
    return '{"type": "ping", "x": ' + inner + "}"


ANY_CONTROL_TEXT = st.one_of(
    st.text(max_size=60),
    JSON_VALUES.map(dumps),
    KNOWN_TYPE_MESSAGES.map(dumps),
    KNOWN_TYPE_MESSAGES.map(dumps),
    mangled_json(),
    st.builds(nested, st.integers(1, 3000), st.sampled_from(["list", "object"])),
)


def media_bytes(kind: int, payload: bytes, *, version: int = 1, flags: int = 0, seq: int = 0,
                aux: int = 0, pts: int = 0, reserved: int = 0) -> bytes:  # fmt: skip
    """A binary message with any header values (MediaMessage only builds valid ones)."""
    return HEADER.pack(version, kind, flags, reserved, seq, aux, pts) + payload


U32, U64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
PCM_RATES = st.one_of(st.sampled_from([8000, 16000, 22050, 44100, 48000]), st.integers(8000, 48000))
EVEN_PAYLOADS = st.binary(max_size=64).map(lambda b: b[: len(b) // 2 * 2])
# junk Opus packets, well framed
OPUS_PAYLOADS = st.lists(st.binary(min_size=1, max_size=40), max_size=3).map(pack_packets)
BINARY_MESSAGES = st.one_of(
    st.binary(max_size=40),  # mostly shorter than the header
    st.builds(  # any header at all
        media_bytes,
        kind=st.integers(0, 255),
        payload=st.binary(max_size=64),
        version=st.integers(0, 255),
        flags=st.integers(0, 255),
        seq=U32,
        aux=U32,
        pts=U64,
        reserved=st.integers(0, 255),
    ),
    # right version, each kind with random fields: pcm at good and bad rates, uploads of junk
    st.builds(media_bytes, st.just(3), EVEN_PAYLOADS, flags=st.integers(0, 255), seq=U32, aux=PCM_RATES),
    st.builds(media_bytes, st.just(3), st.binary(max_size=64), aux=st.one_of(U32, PCM_RATES)),
    st.builds(media_bytes, st.just(4), st.binary(max_size=64), aux=U32, pts=U64),
    # Opus from the client: packets behind u16 lengths (or not), at Opus rates and others
    st.builds(
        media_bytes,
        st.just(6),
        st.one_of(st.binary(max_size=64), OPUS_PAYLOADS),
        flags=st.integers(0, 255),
        aux=st.one_of(PCM_RATES, U32),
    ),
    st.builds(media_bytes, st.sampled_from([0, 1, 2, 5, 255]), st.binary(max_size=16), aux=U32, pts=U64),
)
