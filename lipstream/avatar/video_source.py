"""Read an avatar source (video or still image) with PyAV, resampled to 25 fps by timestamps."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from lipstream.audio.timeline import FPS
from lipstream.errors import MediaError


@dataclass(frozen=True)
class VideoInfo:
    """What a demux pass learned about the source, and how it maps onto 25 fps output frames."""

    path: Path
    width: int
    height: int
    codec: str
    source_fps: float | None  # None for a still image
    source_frames: int  # decodable frames in the source
    source_index: np.ndarray  # int32 per output frame: which source frame (in pts order) it shows
    source_pts: np.ndarray | None = None  # int64 per source frame, in order: where a decoder can seek to

    @property
    def frame_count(self) -> int:
        """Number of frames at the output rate."""
        return len(self.source_index)

    @property
    def is_still(self) -> bool:
        """A single picture (photo) rather than a clip."""
        return self.source_frames == 1


def _open(path: Path) -> av.container.InputContainer:
    if not path.is_file():
        raise MediaError(f"avatar source {path} does not exist; give the path of a video or image file")
    try:
        return av.open(str(path))
    except (av.FFmpegError, UnicodeDecodeError, ValueError) as exc:
        raise MediaError(f"cannot read {path} as video or image ({exc}); give a file FFmpeg decodes") from exc


def _video_stream(container: av.container.InputContainer, path: Path) -> av.video.stream.VideoStream:
    if not container.streams.video:
        raise MediaError(f"{path} has no video stream; give a video or image of the presenter")
    return container.streams.video[0]


def resample_map(times: np.ndarray, frame_duration: float, fps: int = FPS) -> np.ndarray:
    """Per output frame at k/fps, the index of the nearest source frame (times sorted, from 0)."""
    duration = float(times[-1]) + frame_duration
    count = max(1, int(round(duration * fps)))
    targets = np.arange(count) / fps
    right = np.clip(np.searchsorted(times, targets), 1, len(times) - 1) if len(times) > 1 else None
    if right is None:
        return np.zeros(count, dtype=np.int32)
    left = right - 1
    nearer_left = (targets - times[left]) <= (times[right] - targets)
    return np.where(nearer_left, left, right).astype(np.int32)


def probe_video(path: str | Path, fps: int = FPS) -> VideoInfo:
    """Demux the source once (no decoding) to learn its size, frame times and the 25 fps mapping."""
    path = Path(path)
    with _open(path) as container:
        stream = _video_stream(container, path)
        width, height = stream.codec_context.width, stream.codec_context.height
        tb = stream.time_base
        pts: list[int] = []
        try:
            for packet in container.demux(stream):
                if packet.size and packet.pts is not None:
                    pts.append(packet.pts)
        except av.FFmpegError as exc:
            raise MediaError(f"{path} is damaged ({exc}); re-export it or give another file") from exc
        rate = stream.average_rate or stream.guessed_rate
        codec = stream.codec_context.name
    if not pts or not width or not height:
        raise MediaError(f"{path} has a video stream with no frames; give a video or image of the presenter")
    unique_pts = np.unique(np.asarray(pts, dtype=np.int64))
    times = unique_pts.astype(np.float64) * float(tb or 1)
    times -= times[0]
    if len(times) == 1:
        return VideoInfo(path, width, height, codec, None, 1, np.zeros(1, dtype=np.int32))
    steps = np.diff(times)
    frame_duration = float(np.median(steps)) if len(steps) else 1.0 / fps
    source_fps = float(rate) if rate else 1.0 / frame_duration
    mapping = resample_map(times, frame_duration, fps)
    return VideoInfo(path, width, height, codec, source_fps, len(times), mapping, unique_pts)


def iter_frames(info: VideoInfo, start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (output index, H×W×3 uint8 RGB) for every 25 fps output frame from `start` on, decoding the
    source once (frames before `start` are decoded, as H.264 needs, but not converted)."""
    wanted = info.source_index
    out = 0
    with _open(info.path) as container:
        stream = _video_stream(container, info.path)
        stream.thread_type = "AUTO"  # frame + slice threads: decode is the largest cost at 1080×1920
        src = -1
        last: np.ndarray | None = None
        skipped: av.VideoFrame | None = None  # the last frame passed over unconverted
        frames = container.decode(stream)
        if start > 0 and info.source_pts is not None:
            src, out, frames = _seek(container, stream, info, start)
        try:
            for frame in frames:
                src += 1
                if out >= len(wanted):
                    break
                if wanted[out] > src:
                    continue  # a source frame no output frame shows (source faster than 25 fps)
                shown = int(np.searchsorted(wanted, src, side="right"))  # output frames up to this one
                if shown <= start:  # RGB conversion is a third of a frame's decode cost: only when used
                    out, skipped = shown, frame
                    continue
                last = frame.to_ndarray(format="rgb24")
                while out < len(wanted) and wanted[out] <= src:
                    if out >= start:
                        yield out, last
                    out += 1
        except av.FFmpegError as exc:
            raise MediaError(f"{info.path} cannot be decoded at frame {src} ({exc}); re-export it") from exc
        # A decoder that returns fewer frames than the demuxer promised: hold the last picture.
        if last is None and skipped is not None:
            last = skipped.to_ndarray(format="rgb24")
        if last is None:
            raise MediaError(f"{info.path} has no decodable video frames; re-export it or give another file")
        while out < len(wanted):
            if out >= start:
                yield out, last
            out += 1


def _seek(container: av.container.InputContainer, stream: av.video.stream.VideoStream, info: VideoInfo,
          start: int) -> tuple[int, int, Iterator[av.VideoFrame]]:  # fmt: skip
    """Decode from the key frame at or before output frame `start`'s source frame instead of from the first
    (a long clip's idle stretch may lie minutes in): (source index before the first frame it gives, output
    frames passed, the frames). Falls back to the start when the decoder lands anywhere unexpected."""
    pts = info.source_pts
    assert pts is not None
    target = int(info.source_index[start])
    try:
        container.seek(int(pts[target]), stream=stream, backward=True, any_frame=False)
        frames = container.decode(stream)
        first = next(frames)
    except (av.FFmpegError, StopIteration):
        first = None
    landed = -1 if first is None or first.pts is None else int(np.searchsorted(pts, first.pts))
    if not (0 <= landed <= target and landed < len(pts) and pts[landed] == first.pts):
        container.seek(int(pts[0]), stream=stream, backward=True, any_frame=False)
        return -1, 0, container.decode(stream)
    passed = int(np.searchsorted(info.source_index, landed, side="left"))  # output frames before it
    return landed - 1, passed, itertools.chain([first], frames)
