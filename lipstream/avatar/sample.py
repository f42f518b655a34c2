"""The sample avatar, made with no download: skimage's astronaut on a vertical canvas, with a head bob."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import cv2
import numpy as np
from skimage import data as skdata

from lipstream.avatar.bundle import SAMPLE_CLIP, AvatarBundle
from lipstream.avatar.progress import frame_progress

BOB_PX_AT_1920 = 40.0  # largest vertical offset of the head on a 1920-px-high canvas
SWAY_PX_AT_1080 = 8.0  # largest horizontal offset on a 1080-px-wide canvas
FACE_CENTRE_IN_ASTRONAUT = (225.0 / 512, 124.0 / 512)  # where the face sits in the 512×512 picture


@dataclass(frozen=True)
class SampleMotion:
    """The known head motion of a sample clip: per-frame offsets (pixels) from the rest position."""

    dx: np.ndarray  # float32 per frame
    dy: np.ndarray  # float32 per frame
    fps: int
    width: int
    height: int
    face_centre: tuple[float, float]  # rest position of the face centre in the frame


def presenter_frame(width: int, height: int, scale: float = 0.9, dy: float = 0.0) -> np.ndarray:
    """A still test picture: the astronaut, `scale` of the canvas width, a quarter down, shifted by dy."""
    canvas = np.full((height, width, 3), 20, np.uint8)
    side = int(width * scale)
    img = cv2.resize(skdata.astronaut(), (side, side), interpolation=cv2.INTER_AREA)
    top = int(height * 0.25 + dy)
    rows = max(0, min(side, height - top))
    left = (width - side) // 2
    canvas[top : top + rows, left : left + side] = img[:rows]
    return canvas


def head_motion(frames: int, fps: int, width: int, height: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A slow, natural-looking bob (|dy| ≤ 40 px at 1920 high) and a small sway, from two sines each."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames) / fps
    phase = rng.uniform(0, 2 * np.pi, size=4)
    bob = BOB_PX_AT_1920 * height / 1920
    sway = SWAY_PX_AT_1080 * width / 1080
    w = 2 * np.pi * t
    dy = bob * (0.7 * np.sin(0.23 * w + phase[0]) + 0.3 * np.sin(0.61 * w + phase[1]))
    dx = sway * (0.6 * np.sin(0.17 * w + phase[2]) + 0.4 * np.sin(0.43 * w + phase[3]))
    return dx.astype(np.float32), dy.astype(np.float32)


def studio_background(width: int, height: int, seed: int) -> np.ndarray:
    """A dark blue vertical gradient with faint grain (so the encoder has real texture to code)."""
    rows = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    top, bottom = np.array([18, 32, 64], np.float32), np.array([6, 10, 24], np.float32)
    grad = top + (bottom - top) * rows
    grain = np.random.default_rng(seed).normal(0, 2.0, size=(height, width, 1)).astype(np.float32)
    return np.clip(grad + grain, 0, 255).astype(np.uint8)


def encode_clip(
    path: str | Path,
    pictures: Iterable[np.ndarray],
    fps: int = 25,
    crf: int = 18,
    on_frame: Callable[[], None] | None = None,
) -> int:
    """Encode H×W×3 uint8 RGB pictures as an H.264 (yuv420p) MP4 with PyAV; returns the frame count."""
    count = 0
    with av.open(str(path), "w") as container:
        stream = None
        for image in pictures:
            if stream is None:
                stream = container.add_stream("libx264", rate=fps)
                stream.height, stream.width = image.shape[:2]
                stream.pix_fmt = "yuv420p"
                stream.options = {"crf": str(crf), "preset": "veryfast"}
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
            count += 1
            if on_frame:
                on_frame()
        if stream is not None:
            for packet in stream.encode():
                container.mux(packet)
    return count


def write_sample_video(
    path: str | Path,
    width: int = 1080,
    height: int = 1920,
    seconds: float = 8.0,
    fps: int = 25,
    seed: int = 0,
    progress: bool = False,
) -> SampleMotion:
    """Encode the sample presenter clip (H.264 MP4) and return its known head motion."""
    path = Path(path)
    frames = max(1, int(round(seconds * fps)))
    dx, dy = head_motion(frames, fps, width, height, seed)
    astronaut = skdata.astronaut()
    scale = width / astronaut.shape[1]  # the picture spans the canvas width
    face_x = FACE_CENTRE_IN_ASTRONAUT[0] * astronaut.shape[1] * scale
    face_y_in_pic = FACE_CENTRE_IN_ASTRONAUT[1] * astronaut.shape[0] * scale
    top = 0.40 * height - face_y_in_pic  # face centre at 40% of the height, like a news presenter
    background = studio_background(width, height, seed)

    def pictures() -> Iterator[np.ndarray]:
        for i in range(frames):
            warp = np.array([[scale, 0, dx[i]], [0, scale, top + dy[i]]], dtype=np.float32)
            yield cv2.warpAffine(
                astronaut, warp, (width, height), flags=cv2.INTER_LINEAR,
                borderMode=cv2.BORDER_TRANSPARENT, dst=background.copy(),
            )

    with frame_progress("writing sample clip", frames, progress) as advance:
        encode_clip(path, pictures(), fps=fps, on_frame=advance)
    return SampleMotion(dx, dy, fps, width, height, (face_x, top + face_y_in_pic))


def build_sample_avatar(
    name: str = "sample",
    avatars_root: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    **video_kwargs: float,
) -> AvatarBundle:
    """Write the sample clip to a temp folder and prepare it as an avatar."""
    from lipstream.avatar.prepare import prepare_avatar  # prepare imports tracking; keep sample light

    with tempfile.TemporaryDirectory(prefix="lipstream-sample-") as tmp:
        clip = Path(tmp) / SAMPLE_CLIP
        write_sample_video(clip, progress=progress, **video_kwargs)
        return prepare_avatar(clip, name, avatars_root=avatars_root, force=force, progress=progress)
