"""Source reading: 25 fps resampling by timestamps, photos, and the mapping itself."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data as skdata

from lipstream.avatar.blink import BlinkConfig
from lipstream.avatar.breathing import BreathingConfig
from lipstream.avatar.prepare import PrepareConfig, idle_loop, prepare_avatar
from lipstream.avatar.sample import encode_clip, presenter_frame
from lipstream.avatar.video_source import iter_frames, probe_video, resample_map
from lipstream.edge.onnx_gate import psnr_db


def presenter() -> np.ndarray:
    """A 288×512 frame with the astronaut's face."""
    return presenter_frame(288, 512)


def test_resample_map_nearest_in_time():
    """50 fps → every other frame; 20 fps → some frames shown twice; total duration kept."""
    fifty = resample_map(np.arange(100) / 50, 1 / 50)
    assert len(fifty) == 50 and list(fifty[:4]) == [0, 2, 4, 6]
    twenty = resample_map(np.arange(40) / 20, 1 / 20)
    assert len(twenty) == 50 and twenty[-1] == 39
    assert np.all(np.diff(twenty) >= 0) and set(twenty) == set(range(40))


def test_idle_loop_small_counts():
    assert list(idle_loop(1)) == [0]
    assert list(idle_loop(2)) == [0, 1]
    assert list(idle_loop(4)) == [0, 1, 2, 3, 2, 1]


def test_fifty_fps_clip_is_resampled_by_timestamps(tmp_path: Path):
    """Frame k of the 50 fps source carries its index in brightness; the 25 fps output shows 0, 2, 4, ..."""

    def numbered(i: int) -> np.ndarray:
        frame = presenter()
        frame[:40, :40] = 4 * i  # a patch whose level names the source frame
        return frame

    clip = tmp_path / "fifty.mp4"
    encode_clip(clip, (numbered(i) for i in range(40)), fps=50, crf=12)
    info = probe_video(clip)
    assert info.source_fps == 50 and info.source_frames == 40 and info.frame_count == 20
    levels = [int(np.median(rgb[5:35, 5:35])) for _, rgb in iter_frames(info)]
    assert np.allclose(levels, [8 * k for k in range(20)], atol=3)


@pytest.mark.slow
def test_photo_becomes_one_picture_and_its_blinks(tmp_path: Path):
    photo = tmp_path / "anchor.png"
    cv2.imwrite(str(photo), cv2.cvtColor(presenter(), cv2.COLOR_RGB2BGR))
    bundle = prepare_avatar(photo, "still", avatars_root=tmp_path / "avatars", progress=False)
    # the photo, then its breathing, blinking clip (tests/test_blink.py and test_breathing.py check them)
    assert bundle.frame_count == 300 and bundle.manifest.source_fps is None
    # visually lossless next to what any H.264 stream of it shows (4:2:0 chroma costs sharp colour edges)
    streamed = cv2.cvtColor(cv2.cvtColor(presenter(), cv2.COLOR_RGB2YUV_I420), cv2.COLOR_YUV2RGB_I420)
    assert psnr_db(np.asarray(bundle.frames[0]), streamed) >= 40.0
    assert list(bundle.idle_loop) == list(range(300))  # played forward: the motion makes whole cycles
    assert bundle.masks[0].max() == 255
    without = prepare_avatar(
        photo, "still-eyes-open", avatars_root=tmp_path / "avatars", progress=False,
        config=PrepareConfig(blink=BlinkConfig(enabled=False), breathing=BreathingConfig(enabled=False)),
    )  # fmt: skip
    assert without.frame_count == 1 and list(without.idle_loop) == [0]


@pytest.mark.slow
def test_jpeg_photo_of_original_astronaut(tmp_path: Path):
    photo = tmp_path / "astronaut.jpg"
    cv2.imwrite(str(photo), cv2.cvtColor(skdata.astronaut(), cv2.COLOR_RGB2BGR))
    bundle = prepare_avatar(photo, "astro", avatars_root=tmp_path / "avatars", progress=False)
    x1, y1, x2, y2 = bundle.boxes[0]
    # The face sits at about x 179-271, chin y 177 in the 512×512 picture (mediapipe's own numbers).
    assert abs(x1 - 179) < 6 and abs(x2 - 271) < 6 and abs(y2 - (177 + 10)) < 6
