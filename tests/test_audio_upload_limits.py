"""decode_upload: uploads are refused from their header, or as soon as decoding passes a limit."""

from __future__ import annotations

import io
import struct
import time
import tracemalloc

import av
import numpy as np
import pytest

from lipstream.audio.decode import decode_upload
from lipstream.errors import MediaError

LIMIT_S = 120.0  # the server's default upload limit


def wav_bytes(rate: int, pcm16: bytes, channels: int = 1, data_size: int | None = None) -> bytes:
    """A PCM WAV written by hand, so the header can say anything (rate, data size)."""
    block = channels * 2
    size = len(pcm16) if data_size is None else data_size
    riff = 0xFFFFFFFF if size == 0xFFFFFFFF else 36 + len(pcm16)
    fmt = struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * block, block, 16)
    return b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + fmt + b"data" + struct.pack("<I", size) + pcm16


def sine16(rate: int, seconds: float, channels: int = 1) -> bytes:
    """Interleaved int16 PCM of a 440 Hz tone at half scale."""
    t = np.arange(int(rate * seconds)) / rate
    mono = np.rint(16384 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    return np.repeat(mono[:, None], channels, axis=1).tobytes()


def encode(fmt: str, codec: str, rate: int, seconds: float, sample_format: str = "s16") -> bytes:
    """Silence encoded in memory with PyAV (10 s frames keep long files quick to make)."""
    dtype = np.int16 if sample_format.startswith("s16") else np.float32
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        total, done = int(rate * seconds), 0
        while done < total:
            n = min(rate * 10, total - done)
            frame = av.AudioFrame.from_ndarray(np.zeros((1, n), dtype), format=sample_format, layout="mono")
            frame.sample_rate, frame.pts = rate, done
            done += n
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def flac_declaring(data: bytes, total_samples: int) -> bytes:
    """The FLAC with its STREAMINFO total-sample count replaced (0 = unknown length)."""
    out = bytearray(data)
    assert out[:4] == b"fLaC" and out[4] & 0x7F == 0  # STREAMINFO is the first block
    field = 8 + 13  # the 36-bit count: low 4 bits of STREAMINFO byte 13, then 4 bytes
    out[field] = (out[field] & 0xF0) | (total_samples >> 32)
    out[field + 1 : field + 5] = (total_samples & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes(out)


@pytest.fixture(scope="module")
def two_hour_flac() -> bytes:
    """Two hours of 8 kHz silence as FLAC: about 1.3 MB, as in the report."""
    return encode("flac", "flac", 8000, 7200)


def refused(data: bytes, fragment: str, max_seconds: float = LIMIT_S) -> str:
    """decode_upload's MediaError message; it matches `fragment` and names no file or folder."""
    with pytest.raises(MediaError, match=fragment) as info:
        decode_upload(data, max_seconds)
    message = str(info.value)
    assert "/" not in message and "\\" not in message and "tmp" not in message, message
    return message


def test_ok_wav_decodes_to_the_right_length() -> None:
    pcm = decode_upload(wav_bytes(44100, sine16(44100, 2.0, channels=2), channels=2), LIMIT_S)
    assert pcm.dtype == np.float32 and pcm.ndim == 1
    assert abs(len(pcm) - 32000) <= 16
    ref = np.sin(2 * np.pi * 440 * np.arange(len(pcm)) / 16000)
    core = slice(1000, -1000)  # away from the resampler's edges
    corr = np.dot(pcm[core], ref[core]) / (np.linalg.norm(pcm[core]) * np.linalg.norm(ref[core]))
    assert corr > 0.99  # stereo of one tone mixes down to that tone, in time


def test_one_hertz_header_is_refused_before_decoding() -> None:
    data = wav_bytes(1, b"\0" * 32000)  # 32 KB that would resample to 16,000× as many samples
    started = time.perf_counter()
    message = refused(data, "declares a sample rate of 1 Hz")
    assert time.perf_counter() - started < 0.5
    assert "8000–48000 Hz" in message


def test_96_khz_is_refused() -> None:
    assert "96000 Hz" in refused(wav_bytes(96000, sine16(96000, 0.2)), "outside the allowed")


def test_rate_range_is_a_parameter() -> None:
    pcm = decode_upload(wav_bytes(96000, sine16(96000, 0.5)), LIMIT_S, max_rate=96000)
    assert abs(len(pcm) - 8000) <= 16


@pytest.mark.slow
def test_declared_length_over_the_limit_is_refused_before_decoding(two_hour_flac: bytes) -> None:
    started = time.perf_counter()
    refused(two_hour_flac, "longer than 120 s")
    assert time.perf_counter() - started < 0.5


def test_header_lying_about_length_stops_decoding_at_the_limit(two_hour_flac: bytes) -> None:
    """No length in the header (or a false one): decoding stops at 120 s, not after two hours."""
    for declared in (0, 8000):  # unknown, and "1 s"
        data = flac_declaring(two_hour_flac, declared)
        tracemalloc.start()
        started = time.perf_counter()
        try:
            refused(data, "longer than 120 s")
            elapsed = time.perf_counter() - started
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # all 2 h at 16 kHz would be 460 MB of float32; 120 s of it is 7.7 MB
        assert peak < 16 * 2**20, peak
        assert elapsed < 1.5, elapsed


def test_wav_of_unknown_size_is_counted_while_decoding() -> None:
    data = wav_bytes(8000, b"\0" * (8000 * 2 * 5), data_size=0xFFFFFFFF)  # 5 s, "size unknown"
    refused(data, "longer than 4 s", max_seconds=4.0)
    assert abs(len(decode_upload(data, 6.0)) - 80000) <= 16


def test_small_excess_is_caught_by_counting() -> None:
    """Just over the limit passes the header check (slack for padding) and is refused while decoding."""
    data = wav_bytes(16000, sine16(16000, 2.0))
    refused(data, "longer than 1.9 s", max_seconds=1.9)
    assert len(decode_upload(data, 2.0)) == 32000


def test_rate_switching_mid_stream_is_checked_per_frame() -> None:
    """Two ADTS (raw AAC) streams back to back: the header says 16 kHz, later frames are 96 kHz."""
    head = encode("adts", "aac", 16000, 1.0, "fltp")
    tail = encode("adts", "aac", 96000, 1.0, "fltp")
    refused(head + tail, "switches mid-stream to a sample rate of 96000 Hz")


def test_allowed_rate_switch_decodes_through() -> None:
    head = encode("adts", "aac", 16000, 1.0, "fltp")
    tail = encode("adts", "aac", 44100, 1.0, "fltp")
    pcm = decode_upload(head + tail, LIMIT_S)
    assert 30000 < len(pcm) < 36000  # 2 s, give or take AAC's priming and padding


def test_too_many_channels_is_refused() -> None:
    refused(wav_bytes(16000, b"\0" * 16 * 2 * 100, channels=16), "declares 16 channels")


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"", "the upload is empty"),
        (bytes(range(256)) * 40, "cannot read the upload as audio or video"),
        (wav_bytes(16000, b""), "decodes to no audio samples"),
    ],
    ids=["empty", "garbage", "no-samples"],
)
def test_unusable_bytes(data: bytes, fragment: str) -> None:
    refused(data, fragment)


def test_video_without_sound(tmp_path) -> None:
    from lipstream.avatar.sample import encode_clip

    clip = tmp_path / "silent.mp4"
    encode_clip(clip, [np.zeros((64, 64, 3), np.uint8)] * 3)
    refused(clip.read_bytes(), "the upload has no audio stream")
