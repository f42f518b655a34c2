"""Wire protocol v1: header layout, round trips and the errors bad messages get."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from lipstream.render.frames import AvatarFrame
from lipstream.server.protocol import (
    HEADER_SIZE,
    ClientStats,
    Flags,
    Kind,
    MediaMessage,
    Position,
    ProtocolError,
    Speak,
    decode_media,
    event_message,
    frame_messages,
    parse_control,
)


def test_header_is_20_bytes_little_endian_as_documented() -> None:
    msg = MediaMessage(Kind.VIDEO, b"\x00\x00\x00\x01e", seq=7, aux=3, pts=7 * 640, flags=Flags.KEYFRAME)
    data = msg.encode()
    assert HEADER_SIZE == 20
    assert data[:4] == bytes([1, 1, 1, 0])
    assert struct.unpack_from("<IIQ", data, 4) == (7, 3, 4480)
    assert data[20:] == b"\x00\x00\x00\x01e"
    back = decode_media(data)
    assert back == msg
    assert back.utterance_id == 2


def test_frame_messages_pair_video_and_its_audio_slice() -> None:
    audio = (np.arange(640) - 320).astype(np.int16)
    frame = AvatarFrame(
        index=5,
        pts=3200,
        base_index=1,
        audio=audio,
        access_unit=b"\x00\x00\x00\x01\x65abc",
        keyframe=True,
        speaking=True,
        end_of_speech=True,
        utterance_id=4,
    )
    video, sound = (decode_media(m) for m in frame_messages(frame))
    assert (video.kind, video.seq, video.pts, video.utterance_id) == (Kind.VIDEO, 5, 3200, 4)
    assert video.flags == Flags.KEYFRAME | Flags.SPEAKING | Flags.END_OF_SPEECH
    assert (sound.kind, sound.seq, sound.pts) == (Kind.AUDIO, 5, 3200)
    assert not sound.flags & Flags.KEYFRAME
    assert np.array_equal(np.frombuffer(sound.payload, "<i2"), audio)
    idle = AvatarFrame(index=0, pts=0, base_index=0, audio=np.zeros(640, np.int16), access_unit=b"x")
    assert decode_media(frame_messages(idle)[0]).utterance_id is None


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"\x01\x01", "shorter than the 20-byte header"),
        (bytes([2, 1, 0, 0]) + bytes(16), "protocol version 2"),
        (bytes([1, 9, 0, 0]) + bytes(16), "unknown binary message kind 9"),
    ],
)
def test_bad_binary_messages_name_the_problem(data: bytes, fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment):
        decode_media(data)


def test_control_messages_parse_to_typed_models() -> None:
    assert isinstance(parse_control('{"type": "speak", "text": "hi"}'), Speak)
    assert parse_control('{"type": "position", "pts": 640}') == Position(type="position", pts=640)
    stats = parse_control(
        json.dumps({"type": "client_stats", "av_offset_ms": {"p50": 4, "p95": 9, "count": 3}})
    )
    assert isinstance(stats, ClientStats) and stats.av_offset_ms.p95 == 9


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", 'must be a JSON object with a "type"'),
        ('{"type": "dance"}', "unknown message type 'dance'"),
        ('{"type": "speak"}', "bad 'speak' message: text"),
        ('{"type": "position", "pts": -5}', "bad 'position' message: pts"),
    ],
)
def test_bad_control_messages_name_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment) as info:
        parse_control(text)
    assert info.value.code == "bad_message"


def test_events_serialise_with_position_and_interrupted_flag() -> None:
    from lipstream.render.session import SessionEvent

    done = json.loads(event_message(SessionEvent("playback_finished", 3, 6400, interrupted=True)))
    assert done == {
        "type": "playback_finished",
        "utterance_id": 3,
        "position_samples": 6400,
        "interrupted": True,
    }
    started = json.loads(event_message(SessionEvent("speech_started", 3, 640)))
    assert "interrupted" not in started
    err = json.loads(event_message(SessionEvent("error", message="boom")))
    assert err["type"] == "error" and err["message"] == "boom"
