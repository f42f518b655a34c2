"""Wire protocol parity: the page's protocol.js (and patch-view.js's patch prefix) against
lipstream/server/protocol.py, on messages generated here, run in Node (pure ES modules, no DOM)."""

from __future__ import annotations

import itertools
import shutil
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from js_parity import run_node

from lipstream.media.opus import FrameAudioEncoder
from lipstream.server.protocol import (
    AUDIO_CODECS,
    HEADER,
    HEADER_SIZE,
    PROTOCOL_VERSION,
    Flags,
    Kind,
    MediaMessage,
    ProtocolError,
    decode_media,
    frame_messages,
    pack_packets,
    unpack_packets,
)

WEB = Path(__file__).resolve().parent.parent / "lipstream" / "web"
U32 = 2**32 - 1
MAX_SAFE_INT = 2**53 - 1


def _frame(rng: np.random.Generator, index: int, pts: int, flags: int, utterance: int | None, au: bytes):
    """A duck-typed encoded AvatarFrame, as frame_messages reads it."""
    return SimpleNamespace(
        access_unit=au, keyframe=bool(flags & 1), speaking=bool(flags & 2), end_of_speech=bool(flags & 4),
        blink_starts=bool(flags & 8), utterance_id=utterance, index=index, pts=pts,
        loop_index=int(rng.integers(0, 500)),
        base_index=int(rng.integers(0, 500)),
        audio=rng.integers(-32768, 32768, 640).astype(np.int16),
    )  # fmt: skip


def _server_frames() -> list[SimpleNamespace]:
    """Every flag combination, idle and speaking utterances, and extreme header values."""
    rng = np.random.default_rng(5)
    frames = []
    values = [(0, 0, None), (1, 640, 0), (77, 77 * 640, 2), (U32, MAX_SAFE_INT, U32 - 1), (12, 2**40, 41)]
    for (index, pts, utt), flags in itertools.product(values, range(8)):
        au = bytes(rng.integers(0, 256, int(rng.integers(1, 300)), dtype=np.uint8))
        frames.append(_frame(rng, index, pts, flags, utt, au))
    frames[-1].audio[:4] = [-32768, 32767, -1, 0]
    return frames


def _decoded(data: bytes) -> dict:
    """Python's decode of one message in the JSON shape the Node helper gives."""
    msg = decode_media(data)
    return {
        "ok": True, "kind": int(msg.kind), "flags": int(msg.flags), "seq": msg.seq, "aux": msg.aux,
        "pts": msg.pts, "payload": msg.payload.hex(),
    }  # fmt: skip


def test_server_video_audio_and_patch_messages_decode_the_same() -> None:
    frames = _server_frames()
    messages = []
    for frame in frames:
        messages.extend(frame_messages(frame))
        messages.extend(frame_messages(frame, patch=True))
    js = run_node("protocol_parity.mjs", {"decode": [m.hex() for m in messages]})["decoded"]
    assert len(js) == len(messages)
    kinds = set()
    for data, got in zip(messages, js, strict=True):
        want = _decoded(data)
        kinds.add(want["kind"])
        if want["kind"] == Kind.AUDIO:  # the samples player.js schedules are the int16 Python sent
            want["audio"] = np.frombuffer(bytes.fromhex(want["payload"]), "<i2").tolist()
        assert got == want
    assert kinds == {Kind.VIDEO, Kind.AUDIO, Kind.PATCH}


def test_every_kind_and_flag_byte_decodes_the_same() -> None:
    """All six kinds (client ones too) with every flag byte: bits above 2 are ignored on both sides."""
    rng = np.random.default_rng(9)
    messages = []
    for kind, flags in itertools.product(Kind, range(256)):
        payload = bytes(rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8))
        seq, aux = int(rng.integers(0, 2**32)), int(rng.integers(0, 2**32))
        pts = int(rng.integers(0, MAX_SAFE_INT))
        reserved = flags ^ 0x5A  # the reserved byte is ignored as well
        messages.append(HEADER.pack(PROTOCOL_VERSION, kind, flags, reserved, seq, aux, pts) + payload)
    js = run_node("protocol_parity.mjs", {"decode": [m.hex() for m in messages]})["decoded"]
    for data, got in zip(messages, js, strict=True):
        want = _decoded(data)
        got.pop("audio", None)
        assert got == want, data[:HEADER_SIZE].hex()


def test_pts_beyond_2_53_is_the_nearest_double_in_js() -> None:
    """The one stated difference: JS numbers hold pts exactly up to 2^53 (17,800 years of audio)."""
    pts_values = [MAX_SAFE_INT, 2**53, 2**53 + 1, 2**63 + 12345, 2**64 - 1]
    messages = [MediaMessage(Kind.AUDIO, b"\0\0", 1, 1, pts).encode() for pts in pts_values]
    js = run_node("protocol_parity.mjs", {"decode": [m.hex() for m in messages]})["decoded"]
    for pts, got in zip(pts_values, js, strict=True):
        assert decode_media(MediaMessage(Kind.AUDIO, b"\0\0", 1, 1, pts).encode()).pts == pts
        assert float(got["pts"]) == float(pts)
    assert js[0]["pts"] == MAX_SAFE_INT


def _reason(text: str) -> str:
    """What a rejection names: the short header, the version or the kind."""
    lowered = text.lower()
    for reason in ("header", "version", "kind"):
        if reason in lowered:
            return reason
    return f"unclassified: {text}"


def _malformed() -> list[bytes]:
    good = MediaMessage(Kind.VIDEO, b"\x00\x00\x00\x01", 3, 1, 1920, Flags.KEYFRAME).encode()
    out = [b"", b"\x01", good[: HEADER_SIZE - 1]]
    for version in (0, 2, 255):
        out.append(bytes([version]) + good[1:])
        out.append(bytes([version]) + good[1:HEADER_SIZE - 1])  # short wins over version
    for kind in (0, 6, 7, 128, 255):
        out.append(good[:1] + bytes([kind]) + good[2:])
        out.append(bytes([2, kind]) + good[2:])  # version wins over kind
    out.append(good[:HEADER_SIZE])  # a header alone is a valid (empty) message
    return out


def test_malformed_messages_are_rejected_the_same_way() -> None:
    messages = _malformed()
    js = run_node("protocol_parity.mjs", {"decode": [m.hex() for m in messages]})["decoded"]
    for data, got in zip(messages, js, strict=True):
        try:
            want = _decoded(data)
        except ProtocolError as exc:
            assert not got["ok"], (data.hex(), got)
            assert _reason(got["error"]) == _reason(str(exc)), (data.hex(), got["error"], str(exc))
        else:
            got.pop("audio", None)
            assert got == want, data.hex()


@pytest.mark.parametrize("payload_type", ["int16", "int16-view", "uint8", "arraybuffer"])
def test_client_messages_built_in_js_decode_in_python(payload_type: str) -> None:
    rng = np.random.default_rng(len(payload_type))
    cases = []
    for kind in (Kind.PCM, Kind.UPLOAD):
        for seq, aux in ((None, None), (0, 16000), (5, 48000), (U32, U32)):
            if payload_type.startswith("int16"):
                values = rng.integers(-32768, 32768, int(rng.integers(0, 700))).tolist()
                raw = np.asarray(values, "<i2").tobytes()
            else:
                values = rng.integers(0, 256, int(rng.integers(0, 700))).tolist()
                raw = bytes(values)
            case = {"kind": int(kind), "payload": {"type": payload_type, "values": values}}
            if seq is not None:
                case.update(seq=seq, aux=aux)
            cases.append((case, kind, raw, seq or 0, aux or 0))
    built = run_node("protocol_parity.mjs", {"build": [c[0] for c in cases]})["built"]
    for (_case, kind, raw, seq, aux), hex_message in zip(cases, built, strict=True):
        data = bytes.fromhex(hex_message)
        assert data == MediaMessage(kind, raw, seq, aux).encode()  # byte for byte what Python would send
        msg = decode_media(data)
        assert (msg.kind, msg.payload, msg.seq, msg.aux, msg.pts, msg.flags) == (kind, raw, seq, aux, 0, 0)


def test_patch_prefix_and_rest_patches_read_as_python_wrote_them(tmp_path: Path) -> None:
    """patch-view.js's push() on kind-5 messages: source frame, AU (or rest), keyframe and blink flags."""
    static = tmp_path / "static"
    (static / "edge").mkdir(parents=True)  # the server's /static/ layout: shared edge modules under edge/
    for name in ("protocol.js", "patch-view.js"):
        shutil.copy(WEB / "static" / name, static / name)
    for name in ("compositor.js", "files.js", "lids.js"):
        shutil.copy(WEB / "edge" / name, static / "edge" / name)
    rng = np.random.default_rng(3)
    aus = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in (0, 1, 17, 0, 900, 4)]
    frames = [_frame(rng, i, i * 640, int(rng.integers(0, 16)), i % 3, au) for i, au in enumerate(aus)]
    frames[0].blink_starts, frames[1].blink_starts = True, True  # a blink starting at rest and on a patch
    frames.append(_frame(rng, 9, 9 * 640, 1, None, b""))
    frames[2].base_index = U32
    messages = [frame_messages(f, patch=True)[0] for f in frames]
    seen = run_node("protocol_parity.mjs", {"patches": [m.hex() for m in messages], "patchView": str(static)})
    for frame, data, got in zip(frames, messages, seen["patches"], strict=True):
        msg = decode_media(data)
        loop_index, source = struct.unpack_from("<II", msg.payload)
        assert (loop_index, source) == (frame.loop_index, frame.base_index)
        au = msg.payload[8:]
        assert au == frame.access_unit
        if au:  # an AU goes to the decoder; an empty one is a mouth at rest, straight to the compositor
            key = bool(msg.flags & Flags.KEYFRAME)
            blink = frame.blink_starts
            want = {"to": "decoder", "sourceFrame": source, "key": key, "au": au.hex(), "blink": blink}
        else:
            flags = int(msg.flags)
            want = {"to": "compositor", "sourceFrame": source, "pts": msg.pts, "flags": flags,
                    "blink": frame.blink_starts, "au": ""}  # fmt: skip
        assert got == [want]


def test_opus_audio_messages_unpack_the_same() -> None:
    """Protocol 1.3: real libopus packets framed by frame_messages, and hand-made payloads (empty packets,
    lengths that run past the end, a length cut in half), read by protocol.js's unpackOpus as by Python."""
    rng = np.random.default_rng(13)
    encoder = FrameAudioEncoder()
    messages = []
    for index in range(12):
        pts = (index if index < 8 else index - 4) * 640  # frame 8 steps back: the encoder restarts there
        frame = _frame(rng, index, pts, int(rng.integers(0, 8)), 1, b"\x00\x00\x00\x01")
        frame.audio = (np.sin(np.arange(640) * (0.05 + index / 100)) * 9000).astype(np.int16)
        messages.append(frame_messages(frame, opus=encoder)[1])
    payloads = [decode_media(m).payload for m in messages]
    big = bytes(rng.integers(0, 256, 65535, dtype=np.uint8))
    payloads += [b"", pack_packets([big, b"\x01"]), b"\x03\x00abc\x02", b"\x00\x00", b"\x04\x00abc", b"\x01"]
    request = {"decode": [m.hex() for m in messages], "opus": [p.hex() for p in payloads]}
    js = run_node("protocol_parity.mjs", request)
    decoded = js["decoded"]
    for data, got in zip(messages, decoded, strict=True):
        want = _decoded(data)
        got.pop("audio", None)  # Opus payloads are not int16 samples
        assert got == want
    # the keyframe flag on an audio message marks the encoder's restarts: the first message and the step back
    assert [bool(d["flags"] & Flags.KEYFRAME) for d in decoded] == [i in (0, 8) for i in range(12)]
    for payload, got in zip(payloads, js["opus"], strict=True):
        try:
            want = [p.hex() for p in unpack_packets(payload)]
        except ProtocolError as exc:
            assert not got["ok"], (payload.hex(), got)
            assert ("length" in got["error"]) == ("length" in str(exc)), (got["error"], str(exc))
        else:
            assert got == {"ok": True, "packets": want}
    assert AUDIO_CODECS == ("pcm", "opus")
    js_codecs = (WEB / "static" / "protocol.js").read_text()
    assert "export const AUDIO_CODECS = Object.freeze(['pcm', 'opus']);" in js_codecs


def test_mic_opus_messages_built_in_js_decode_in_python() -> None:
    """Protocol 1.4: kind-6 messages the page builds (packOpus framing, the keyframe flag of a new encoder,
    the capture rate in aux) are byte for byte what Python would send and unpack to the same packets."""
    rng = np.random.default_rng(6)
    cases = []
    for count, flags, aux in ((1, 1, 48000), (1, 0, 48000), (3, 0, 44100), (2, 1, 16000)):
        sizes = rng.integers(1, 300, count)
        packets = [bytes(rng.integers(0, 256, int(size), dtype=np.uint8)) for size in sizes]
        cases.append((packets, flags, aux))
    request = [{"kind": int(Kind.MIC_OPUS), "packets": [p.hex() for p in packets], "flags": flags, "aux": aux}
               for packets, flags, aux in cases]  # fmt: skip
    built = run_node("protocol_parity.mjs", {"build": request})["built"]
    for (packets, flags, aux), hex_message in zip(cases, built, strict=True):
        data = bytes.fromhex(hex_message)
        want = MediaMessage(Kind.MIC_OPUS, pack_packets(packets), aux=aux, flags=Flags(flags))
        assert data == want.encode()
        msg = decode_media(data)
        assert (msg.kind, msg.aux, msg.flags) == (Kind.MIC_OPUS, aux, Flags(flags))
        assert unpack_packets(msg.payload) == packets
