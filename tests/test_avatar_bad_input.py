"""Bad avatar sources: each gives one clear error and leaves nothing behind; soft problems become notes."""

from __future__ import annotations

import wave
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data as skdata

from lipstream.avatar.bundle import list_avatars, load_avatar
from lipstream.avatar.prepare import prepare_avatar
from lipstream.avatar.sample import encode_clip, presenter_frame
from lipstream.errors import AvatarError, FaceNotFoundError, MediaError

pytestmark = pytest.mark.slow  # each test prepares an avatar through the face tracker process

W, H = 288, 512


def presenter(scale: float = 0.9, dy: float = 0.0) -> np.ndarray:
    """The astronaut on a dark W×H canvas, shifted down by dy pixels."""
    return presenter_frame(W, H, scale, dy)


def write_clip(path: Path, frames: int, make: Callable[[int], np.ndarray], fps: int = 25) -> Path:
    """Encode frames make(0..frames-1) as H.264 with PyAV."""
    encode_clip(path, (make(i) for i in range(frames)), fps=fps, crf=20)
    return path


def assert_nothing_left(root: Path) -> None:
    """No bundle and no temp folder remain under the avatars folder."""
    assert not root.exists() or list(root.iterdir()) == []


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An avatars folder of this test's own."""
    return tmp_path / "avatars"


def test_missing_file(tmp_path: Path, root: Path):
    with pytest.raises(MediaError, match="does not exist"):
        prepare_avatar(tmp_path / "nope.mp4", "a", avatars_root=root, progress=False)
    assert_nothing_left(root)


def test_unreadable_file(tmp_path: Path, root: Path):
    bad = tmp_path / "garbage.mp4"
    bad.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(MediaError, match="cannot read"):
        prepare_avatar(bad, "a", avatars_root=root, progress=False)
    assert_nothing_left(root)


def test_audio_only_file(tmp_path: Path, root: Path):
    wav = tmp_path / "speech.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.zeros(16000, np.int16).tobytes())
    with pytest.raises(MediaError, match="no video stream"):
        prepare_avatar(wav, "a", avatars_root=root, progress=False)
    assert_nothing_left(root)


def test_no_face_anywhere(tmp_path: Path, root: Path):
    clip = write_clip(tmp_path / "empty.mp4", 15, lambda i: np.full((H, W, 3), 90 + i, np.uint8))
    with pytest.raises(FaceNotFoundError, match="no face found in any of the 15 frames"):
        prepare_avatar(clip, "a", avatars_root=root, progress=False)
    assert_nothing_left(root)


def test_too_short_clip(tmp_path: Path, root: Path):
    clip = write_clip(tmp_path / "short.mp4", 5, lambda i: presenter())
    with pytest.raises(MediaError, match="too short"):
        prepare_avatar(clip, "a", avatars_root=root, progress=False)
    assert_nothing_left(root)


def test_long_face_loss_fails_and_names_frames(tmp_path: Path, root: Path):
    blank = np.full((H, W, 3), 60, np.uint8)
    clip = write_clip(tmp_path / "lost.mp4", 40, lambda i: blank if 10 <= i < 30 else presenter(dy=i / 4))
    with pytest.raises(FaceNotFoundError, match=r"face lost in frames 10-29"):
        prepare_avatar(clip, "a", avatars_root=root, progress=False)
    assert_nothing_left(root)


def test_short_face_loss_is_interpolated(tmp_path: Path, root: Path):
    blank = np.full((H, W, 3), 60, np.uint8)
    clip = write_clip(tmp_path / "blink.mp4", 20, lambda i: blank if 8 <= i < 11 else presenter(dy=i))
    bundle = prepare_avatar(clip, "a", avatars_root=root, progress=False)
    assert any("frames 8-10" in note and "interpolated" in note for note in bundle.manifest.notes)
    nose = bundle.landmarks[:, 1, 1]
    # Linear between the neighbours: the head moves 1 px/frame, so the filled frames continue the line.
    assert np.allclose(np.diff(nose[7:12]), np.diff(nose[7:12]).mean(), atol=0.5)
    assert abs(nose[11] - nose[7] - 4 * 1.0) < 2.0


def test_several_faces_takes_largest(tmp_path: Path, root: Path):
    def two(i: int) -> np.ndarray:
        canvas = np.full((H, W, 3), 20, np.uint8)
        big = cv2.resize(skdata.astronaut(), (250, 250), interpolation=cv2.INTER_AREA)
        small = cv2.resize(skdata.astronaut(), (180, 180), interpolation=cv2.INTER_AREA)
        canvas[300:480, 0:180] = small
        canvas[20:270, 30:280] = big
        return canvas

    clip = write_clip(tmp_path / "two.mp4", 15, two)
    bundle = prepare_avatar(clip, "a", avatars_root=root, progress=False)
    assert any("several faces" in note and "largest" in note for note in bundle.manifest.notes)
    assert (bundle.landmarks[:, :, 1] < 300).all()  # every landmark on the big face at the top
    assert bundle.manifest.face_width_px > 40


def test_existing_name_refused_unless_force(tmp_path: Path, root: Path):
    clip = write_clip(tmp_path / "ok.mp4", 15, lambda i: presenter())
    first = prepare_avatar(clip, "dup", avatars_root=root, progress=False)
    with pytest.raises(AvatarError, match="already exists.*--force"):
        prepare_avatar(clip, "dup", avatars_root=root, progress=False)
    second = prepare_avatar(clip, "dup", avatars_root=root, progress=False, force=True)
    assert second.manifest.created_at >= first.manifest.created_at
    assert list_avatars(root) == ["dup"]
    assert sorted(p.name for p in root.iterdir()) == ["dup"]  # no temp or old folders left


def test_failed_force_keeps_the_old_bundle(tmp_path: Path, root: Path):
    good = write_clip(tmp_path / "ok.mp4", 15, lambda i: presenter())
    prepare_avatar(good, "keep", avatars_root=root, progress=False)
    empty = write_clip(tmp_path / "empty.mp4", 15, lambda i: np.full((H, W, 3), 90, np.uint8))
    with pytest.raises(FaceNotFoundError):
        prepare_avatar(empty, "keep", avatars_root=root, progress=False, force=True)
    assert load_avatar("keep", root).frame_count == 15
    assert sorted(p.name for p in root.iterdir()) == ["keep"]


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "x" * 65])
def test_bad_names(tmp_path: Path, root: Path, name: str):
    with pytest.raises(AvatarError, match="invalid avatar name"):
        prepare_avatar(tmp_path / "whatever.mp4", name, avatars_root=root, progress=False)
    assert_nothing_left(root)
