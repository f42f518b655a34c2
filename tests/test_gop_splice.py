"""loop.mp4 assembled GOP by GOP (issue 37): GOPs copied from footage.mp4 and GOPs encoded on worker threads
make one stream that decodes like a straight encode; decoding runs ahead on its own thread."""

from __future__ import annotations

import threading
from pathlib import Path

import av
import numpy as np
import pytest

from lipstream.avatar.prepare import shared_gops
from lipstream.errors import MediaError
from lipstream.media.gop_splice import GopAssembler, GopSource, annexb_units
from lipstream.media.gop_video import GopReader, Mp4FrameWriter, VideoEncoding, coded_i420
from lipstream.threads import read_ahead

W, H, GOP = 96, 64, 5


def pictures(count: int) -> list[np.ndarray]:
    """Moving bars and a gradient: every picture differs, and all of them compress."""
    ys, xs = np.mgrid[0:H, 0:W]
    out = []
    for k in range(count):
        blocks = (xs + ys + 11 * k) // 8 * 16
        rgb = np.stack([(xs * 2 + k * 7) % 256, (ys * 3) % 256, blocks % 256], axis=-1)
        out.append(coded_i420(rgb.astype(np.uint8), W, H))
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(255.0**2 / max(np.mean((a.astype(float) - b.astype(float)) ** 2), 1e-9)))


@pytest.fixture(scope="module")
def footage(tmp_path_factory) -> tuple[Path, list[np.ndarray]]:
    path = tmp_path_factory.mktemp("splice") / "footage.mp4"
    source = pictures(4 * GOP)
    with Mp4FrameWriter(path, W, H, 25, VideoEncoding(gop=GOP)) as writer:
        for picture in source:
            writer.append_i420(picture)
    return path, source


def test_copied_and_encoded_gops_make_one_stream_in_order(footage, tmp_path: Path) -> None:
    path, source = footage
    out = tmp_path / "loop.mp4"
    reverse = source[::-1]
    with GopAssembler(out, path, VideoEncoding(gop=GOP), 25, workers=2) as assembler:
        assembler.copy(0)
        assembler.encode(reverse[:GOP])
        assembler.copy(2)
        assembler.encode(source[GOP : GOP + 3])  # the file's last GOP may be short
    backwards = range(4 * GOP - 1, 3 * GOP - 1, -1)
    order = [*range(GOP), *backwards, *range(2 * GOP, 3 * GOP), *range(GOP, GOP + 3)]
    assert (assembler.copied_gops, assembler.encoded_gops, assembler.frames) == (2, 2, len(order))
    with av.open(str(out)) as container:
        stream = container.streams.video[0]
        keys = [k for k, packet in enumerate(container.demux(stream)) if packet.size and packet.is_keyframe]
    assert keys == [0, GOP, 2 * GOP, 3 * GOP]  # an IDR at each GOP: a reader may start at any of them
    reader = GopReader(out, len(order), (W, H), GOP, pixel_format="yuv420p")
    footage_reader = GopReader(path, len(source), (W, H), GOP, pixel_format="yuv420p")
    for position, frame in enumerate(order):
        decoded = reader.i420(position)
        assert psnr(decoded, source[frame]) > 35, position
        if position < GOP or 2 * GOP <= position < 3 * GOP:  # copied: the footage's very pixels
            assert np.array_equal(decoded, footage_reader.i420(frame))
    source = GopSource(out, GOP)
    gops = [source.read(1), source.read(3)]  # forward only, skipping some: only the GOPs asked for are kept
    source.close()
    assert [len(g) for g in gops] == [GOP, 3] and all(g[0].is_keyframe for g in gops)
    assert not any(p.is_keyframe for g in gops for p in g[1:])


def test_an_encoded_gop_of_other_settings_is_refused(footage, tmp_path: Path) -> None:
    path, source = footage
    other = VideoEncoding(gop=GOP, tune="")  # CABAC on: another PPS, which the copied GOPs do not share
    with pytest.raises(MediaError, match="SPS/PPS"):
        with GopAssembler(tmp_path / "loop.mp4", path, other, 25) as assembler:
            assembler.copy(0)
            assembler.encode(source[:GOP])
    with pytest.raises(ValueError, match="GOP holds"):
        with GopAssembler(tmp_path / "loop2.mp4", path, VideoEncoding(gop=GOP), 25) as assembler:
            assembler.encode(source[: GOP + 1])


def test_annexb_units_split_on_both_start_codes() -> None:
    stream = b"\x00\x00\x00\x01\x67\xaa\xbb" + b"\x00\x00\x01\x68\xcc"
    stream += b"\x00\x00\x00\x01\x65\x00\x00\x03\x01"
    assert annexb_units(stream) == [b"\x67\xaa\xbb", b"\x68\xcc", b"\x65\x00\x00\x03\x01"]


def test_shared_gops_are_the_loops_unchanged_footage_gops() -> None:
    loop = np.array([*range(12), *range(11, -1, -1)])  # a 12-frame clip forward, then back
    closure = np.zeros(12)
    assert shared_gops(loop, closure, 12, 4) == {0: 0, 1: 1, 2: 2}
    closure[5] = 0.5  # a blink drawn on frame 5: its GOP is encoded again
    assert shared_gops(loop, closure, 12, 4) == {0: 0, 2: 2}
    stretch = np.array([*range(8, 16), *range(15, 7, -1)])  # a stretch from frame 8 of a 20-frame clip
    assert shared_gops(stretch, np.zeros(20), 20, 4) == {0: 2, 1: 3}
    assert shared_gops(stretch + 1, np.zeros(20), 20, 4) == {}  # off the footage's GOP boundaries: none


def test_read_ahead_keeps_order_raises_and_stops_early() -> None:
    assert list(read_ahead(iter(range(50)), depth=3)) == list(range(50))

    def failing():
        yield 1
        raise MediaError("unreadable frame 2")

    got = []
    with pytest.raises(MediaError, match="frame 2"):
        for item in read_ahead(failing()):
            got.append(item)
    assert got == [1]

    closed = threading.Event()

    def endless():
        try:
            k = 0
            while True:
                yield k
                k += 1
        finally:
            closed.set()

    ahead = read_ahead(endless(), depth=2)
    assert [next(ahead) for _ in range(5)] == [0, 1, 2, 3, 4]
    ahead.close()  # the consumer stops: the producer's generator is closed on its own thread
    assert closed.wait(2.0)
