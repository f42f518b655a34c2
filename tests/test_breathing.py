"""A photo that breathes (issue 22): the person moves a little over a still background, nothing tears, the
motion wraps without a jump, and the landmarks move exactly with the face."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from lipstream.avatar.blink import BlinkConfig
from lipstream.avatar.breathing import (
    BreathingConfig,
    clean_plate,
    move_points,
    moved_picture,
    person_matte,
    pivot,
    poses,
)
from lipstream.avatar.sample import presenter_frame
from lipstream.avatar.still import StillClip
from lipstream.avatar.tracking import FaceTracker

# prepares photo clips that breathe (2-3 s a test): the full tier
pytestmark = pytest.mark.slow

FPS = 25


@pytest.fixture(scope="module")
def photo() -> tuple[np.ndarray, np.ndarray]:
    """The astronaut on a 540×960 canvas (a hard picture edge above and below her) and its landmarks."""
    rgb = presenter_frame(540, 960)
    with FaceTracker() as tracker:
        landmarks = tracker.track(rgb)
    assert landmarks is not None
    return rgb, landmarks


def test_the_matte_holds_the_person_and_not_the_background(photo) -> None:
    rgb, landmarks = photo
    matte = person_matte(rgb, BreathingConfig())
    face = landmarks.astype(int)
    assert matte[face[:, 1], face[:, 0]].mean() > 0.95  # the whole face is person
    assert matte[:200].max() < 0.05  # the empty canvas above the picture is not
    # the grey studio wall above her hair (between the picture's top edge and the hair) is not either
    top = int(np.flatnonzero((rgb[:, :, 0] > 30).any(axis=1))[0])
    hair_top = int(landmarks[10, 1] - 0.45 * (landmarks[152, 1] - landmarks[10, 1]))
    assert matte[top : max(top + 4, hair_top - 12), 200:340].mean() < 0.1


def test_the_motion_is_small_wraps_and_moves_the_landmarks_with_the_face(photo) -> None:
    rgb, landmarks = photo
    cfg = BreathingConfig()
    matte = person_matte(rgb, cfg)
    affines = poses(300, pivot(matte), cfg)
    assert np.allclose(affines[0], [[1, 0, 0], [0, 1, 0]])  # frame 0 is the photo itself
    moved = np.stack([move_points(landmarks, a) for a in affines])
    shift = np.abs(moved - landmarks[None]).max(axis=(1, 2))
    height = rgb.shape[0]
    assert 0.5 < shift.max() < 0.006 * height, shift.max()  # felt, not seen: a few pixels at 960 high
    step = np.abs(np.diff(moved, axis=0)).max()
    assert step < 0.25, step  # smooth: no jump between frames, nor across the wrap
    wrap = np.abs(moved[0] - moved[-1]).max()  # whole cycles: from the last frame back to the first
    assert wrap < 0.25, wrap
    # re-tracked, the face is where its moved landmarks say (the engine draws the mouth there)
    plate = clean_plate(rgb, matte, cfg)
    widest = int(np.argmax(shift))
    picture = moved_picture(rgb, matte, plate, affines[widest])
    with FaceTracker() as tracker:
        tracked = tracker.track(picture)
    mouth = [61, 291, 0, 17, 13, 14, 152, 1]
    expected, still = moved[widest][mouth], landmarks[mouth]
    assert np.abs(tracked[mouth] - expected).mean() < 0.5 * np.abs(tracked[mouth] - still).mean() + 0.3


def test_the_background_stays_and_nothing_tears(photo) -> None:
    rgb, _ = photo
    cfg = BreathingConfig()
    matte = person_matte(rgb, cfg)
    plate = clean_plate(rgb, matte, cfg)
    affines = poses(300, pivot(matte), cfg)
    # beyond the person's reach (its edge, plus the most it moves, plus the plate's margin) nothing changes
    reach = cv2.dilate((matte > 1e-3).astype(np.uint8), np.ones((25, 25), np.uint8)) > 0
    uncovered_total = 0
    for k in (37, 75, 150, 225):
        picture = moved_picture(rgb, matte, plate, affines[k])
        assert np.array_equal(picture[~reach], rgb[~reach])  # the background is the photo's, exactly
        # what the person uncovers is filled with background, not a hole: as light as the wall round it
        moved = cv2.warpAffine(matte, affines[k], matte.shape[::-1])
        uncovered = (matte > 0.5) & (moved < 0.05)
        uncovered_total += int(uncovered.sum())
        if uncovered.any():
            assert picture[uncovered].mean() > 0.5 * rgb[reach & (matte < 0.05)].mean()
        # no tear: the picture differs from the photo only by the small motion (edges shifted, not smeared)
        assert np.abs(picture.astype(int) - rgb).mean() < 4.0
    assert uncovered_total > 0  # the motion does uncover something (so the fill above was exercised)


def test_a_still_clip_blinks_and_starts_on_the_photo(photo) -> None:
    rgb, landmarks = photo
    clip = StillClip.make(rgb, landmarks, BlinkConfig(), BreathingConfig(), FPS, "anchor")
    assert clip.frames == 300 and np.array_equal(clip.picture(0), rgb)
    blinks = clip.blinks()
    assert blinks.drawn >= 2 and np.array_equal(blinks.loop, np.arange(300))
    shut = int(np.argmax(clip.closure))
    assert clip.closure[shut] == 1.0
    eyes_open = moved_picture(rgb, clip.matte, clip.plate, clip.affines[shut])
    assert not np.array_equal(clip.picture(shut), eyes_open)  # the lid is drawn on the moved picture
