"""H264StreamEncoder: real libx264 access units decoded back with PyAV's h264 decoder."""

from __future__ import annotations

import re

import av
import cv2
import numpy as np
import pytest
from skimage.data import astronaut

from lipstream.errors import MediaError
from lipstream.media.h264 import H264StreamEncoder, codec_string_from_sps, nal_types, split_nal_units

W, H = 192, 128


def _frames(n: int, width: int = W, height: int = H) -> list[np.ndarray]:
    face = np.ascontiguousarray(astronaut()[:height, :width])
    return [np.roll(face, 2 * i, axis=0) for i in range(n)]


def decode_units(units: list[bytes], fmt: str = "rgb24") -> list[np.ndarray]:
    """Every access unit through FFmpeg's H.264 decoder, as one stream; each picture in `fmt`."""
    decoder = av.CodecContext.create("h264", "r")
    images = []
    for data in units:
        for frame in decoder.decode(av.Packet(data)):
            images.append(frame.to_ndarray(format=fmt))
    for frame in decoder.decode(None):
        images.append(frame.to_ndarray(format=fmt))
    return images


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return 10 * np.log10(255**2 / mse)


def test_one_unit_per_frame_with_idr_on_request() -> None:
    encoder = H264StreamEncoder(W, H, bitrate=1_500_000, gop_seconds=100)
    frames = _frames(30)
    units = [encoder.encode(f, force_idr=i in (11, 23)) for i, f in enumerate(frames)]
    assert [i for i, u in enumerate(units) if u.keyframe] == [0, 11, 23]
    assert [u.pts for u in units] == [640 * i for i in range(30)]
    for unit in units:
        assert unit.data.startswith(b"\x00\x00\x00\x01")  # Annex-B
        types = nal_types(unit.data)
        if unit.keyframe:
            assert {5, 7, 8} <= set(types)  # IDR carries SPS/PPS: a player can join there
        else:
            assert 5 not in types and 7 not in types and 1 in types
    decoded = decode_units([u.data for u in units])
    assert len(decoded) == 30
    assert min(_psnr(d, f) for d, f in zip(decoded, frames, strict=True)) > 30
    # A player joining at the second IDR decodes everything from there on.
    assert len(decode_units([u.data for u in units[11:]])) == 19


def test_codec_string_matches_sps() -> None:
    encoder = H264StreamEncoder(W, H)
    probed = encoder.codec_string  # before any frame: from a probe encoder
    assert re.fullmatch(r"avc1\.42C0[0-9A-F]{2}", probed)  # Constrained Baseline
    first = encoder.encode(_frames(1)[0])
    sps = next(u for u in split_nal_units(first.data) if u[0] & 0x1F == 7)
    assert codec_string_from_sps(sps) == probed == encoder.codec_string
    with pytest.raises(MediaError, match="not an H.264 SPS"):
        codec_string_from_sps(b"\x68\x00\x00\x00")


def test_level_grows_with_size() -> None:
    small = int(H264StreamEncoder(W, H).codec_string[-2:], 16)
    large = int(H264StreamEncoder(1080, 1920, bitrate=3_000_000).codec_string[-2:], 16)
    assert large > small and large >= 0x28


def test_output_scaling_half_size() -> None:
    frames = _frames(6, 384, 256)
    encoder = H264StreamEncoder(384, 256, output_size=(192, 128))
    decoded = decode_units([encoder.encode(f).data for f in frames])
    assert len(decoded) == 6 and decoded[0].shape == (128, 192, 3)
    expected = cv2.resize(frames[-1], (192, 128), interpolation=cv2.INTER_AREA)
    assert _psnr(decoded[-1], expected) > 28


def test_bad_input() -> None:
    encoder = H264StreamEncoder(W, H)
    with pytest.raises(MediaError, match="uint8 RGB"):
        encoder.encode(np.zeros((H, W), np.uint8))
    with pytest.raises(MediaError, match="even"):
        H264StreamEncoder(W, H, output_size=(191, 128))
    with pytest.raises(MediaError, match="positive"):
        H264StreamEncoder(0, H)
