"""The frames of a format-2 bundle, decoded from its two videos on demand (docs/bundle-format.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel

from lipstream.media.gop_video import GopReader, VideoEncoding, even_size, file_codec_string

FOOTAGE = "footage.mp4"  # every frame, in order
LOOP_VIDEO = "loop.mp4"  # the idle loop as shown: frame k is the source frame idle_loop[k]


class BundleVideo(BaseModel):
    """manifest.json `video`: how the two videos were encoded."""

    footage: str = FOOTAGE
    loop: str = LOOP_VIDEO
    codec: str = "avc1.640028"  # RFC 6381 string of both files (what a browser's MediaSource wants)
    pixel_format: str = "yuv420p"
    color: str = "bt601-limited"
    crf: int = 18
    preset: str = "veryfast"
    tune: str = "fastdecode"
    gop: int = 25
    coded_width: int = 0  # the frame size rounded up to even (the last column/row repeated)
    coded_height: int = 0
    loop_frames: int = 0  # frames in loop.mp4 (= len(idle_loop))
    footage_bytes: int = 0
    loop_bytes: int = 0


def loop_positions(idle_loop: np.ndarray, frame_count: int) -> np.ndarray:
    """Per source frame, its first position in the idle loop (-1: never shown)."""
    positions = np.full(frame_count, -1, dtype=np.int64)
    loop = np.asarray(idle_loop, dtype=np.int64)
    order = np.arange(len(loop) - 1, -1, -1)
    positions[loop[::-1]] = order  # later writes win: reversed, so the first occurrence is kept
    return positions


class VideoFrames:
    """Every source frame of a format-2 bundle as H×W×3 RGB by frame id, like format 1's frames.npy.

    Frames the idle loop shows come from loop.mp4 (the very pixels a viewer sees), the others from
    footage.mp4; each file is decoded a GOP at a time and only the GOP in use is kept, so reading the
    frames in order (building an engine's caches) holds one GOP of pictures at most per file."""

    def __init__(self, folder: Path, video: BundleVideo, size: tuple[int, int], frame_count: int,
                 idle_loop: np.ndarray) -> None:  # fmt: skip
        self.frame_count = frame_count
        self.width, self.height = size
        self._positions = loop_positions(idle_loop, frame_count)
        self._loop = GopReader(folder / video.loop, video.loop_frames, size, video.gop)
        self._footage = GopReader(folder / video.footage, frame_count, size, video.gop)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """N×H×W×3, as frames.npy of format 1."""
        return (self.frame_count, self.height, self.width, 3)

    @property
    def dtype(self) -> np.dtype:
        """uint8."""
        return np.dtype(np.uint8)

    def __len__(self) -> int:
        return self.frame_count

    def __getitem__(self, index: int) -> np.ndarray:
        index = int(index)
        if not -self.frame_count <= index < self.frame_count:
            raise IndexError(f"frame {index} is outside 0..{self.frame_count - 1}")
        index %= self.frame_count
        position = int(self._positions[index])
        return self._loop[position] if position >= 0 else self._footage[index]

    def release(self) -> None:
        """Drop the decoded GOPs kept for sequential reading."""
        self._loop.release()
        self._footage.release()


def bundle_video(
    folder: Path, encoding: VideoEncoding, width: int, height: int, loop_frames: int
) -> BundleVideo:
    """manifest.json's `video` entry for the two files written in `folder`."""
    coded_w, coded_h = even_size(width, height)
    return BundleVideo(
        codec=file_codec_string(folder / LOOP_VIDEO),
        crf=encoding.crf,
        preset=encoding.preset,
        tune=encoding.tune,
        gop=encoding.gop,
        coded_width=coded_w,
        coded_height=coded_h,
        loop_frames=loop_frames,
        footage_bytes=(folder / FOOTAGE).stat().st_size,
        loop_bytes=(folder / LOOP_VIDEO).stat().st_size,
    )
