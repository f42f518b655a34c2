"""FrameStore: frames.npy written on a thread is a normal .npy, complete or refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lipstream.avatar.frame_store import FrameStore
from lipstream.errors import AvatarError


def test_roundtrip(tmp_path: Path):
    frames = np.random.default_rng(1).integers(0, 256, (9, 6, 5, 3), dtype=np.uint8)
    store = FrameStore(tmp_path / "f.npy", 9, 6, 5, queue_frames=2)
    for f in frames:
        store.append(f)
    store.close()
    back = np.load(tmp_path / "f.npy", mmap_mode="r")
    assert back.shape == frames.shape and np.array_equal(back, frames)


def test_missing_frames_and_wrong_shape_are_refused(tmp_path: Path):
    store = FrameStore(tmp_path / "f.npy", 3, 4, 4)
    with pytest.raises(AvatarError, match="does not fit"):
        store.append(np.zeros((4, 5, 3), np.uint8))
    store.append(np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(AvatarError, match="got 1 of 3 frames"):
        store.close()
