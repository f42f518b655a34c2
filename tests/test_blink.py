"""Eyes that blink (issue 22): the lid drawing re-tracks as closed, the plans are natural, and a prepared
photo's idle loop shows its blinks while a clip that blinks by itself keeps its own."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data as skdata

from lipstream.avatar.blink import (
    EYES,
    BlinkConfig,
    IdleBlinks,
    blink_curve,
    close_eyes,
    eye_openness,
    find_blinks,
    photo_loop,
    plan_idle_blinks,
    rng_for,
)
from lipstream.avatar.idle import IdleStretch
from lipstream.avatar.tracking import FaceTracker

FPS = 25


def _retracked_openness(pictures: list[np.ndarray]) -> list[float]:
    return [eye_openness(lm) for lm in _retracked_landmarks(pictures)]


def test_a_lowered_lid_reads_as_a_closing_eye_and_touches_nothing_else(astronaut) -> None:
    rgb, landmarks = astronaut
    levels = (0.0, 0.35, 0.7, 1.0)
    pictures = [close_eyes(rgb, landmarks, c) for c in levels]
    assert np.array_equal(pictures[0], rgb)
    openness = _retracked_openness(pictures)
    assert openness[0] > 0.25
    assert all(a > b for a, b in zip(openness, openness[1:], strict=False)), openness  # lower and lower
    assert openness[-1] < 0.4 * openness[0], openness  # shut reads as shut
    # Only the eyes change: nothing below the lower lids' reach, nothing beside the eyes.
    changed = np.any(pictures[-1] != rgb, axis=2)
    rows, cols = np.nonzero(changed)
    eye_points = landmarks[[i for pair in EYES for contour in pair for i in contour]]
    eye_w = np.linalg.norm(landmarks[33] - landmarks[133])
    assert rows.max() <= eye_points[:, 1].max() + 0.4 * eye_w
    assert (
        cols.min() >= eye_points[:, 0].min() - 0.3 * eye_w
        and cols.max() <= eye_points[:, 0].max() + 0.3 * eye_w
    )
    mouth_and_below = int(landmarks[2, 1])  # the nose base and everything under it
    assert np.array_equal(pictures[-1][mouth_and_below:], rgb[mouth_and_below:])


def test_the_shut_lid_is_skin_not_a_dark_hole(astronaut) -> None:
    rgb, landmarks = astronaut
    shut = close_eyes(rgb, landmarks, 1.0).astype(np.float32)
    grey = shut.mean(axis=2)
    for upper, lower in EYES:
        ring = np.concatenate([landmarks[list(upper)], landmarks[list(lower)][::-1]]).astype(np.int32)
        inside = np.zeros(grey.shape, np.uint8)
        cv2.fillPoly(inside, [ring], 1)
        eye_w = float(np.linalg.norm(landmarks[upper[0]] - landmarks[upper[-1]]))
        # the lid's own skin: a band above the open eye's upper edge, below the brow
        lid = np.zeros(grey.shape, np.uint8)
        band = landmarks[list(upper)].copy()
        lid_ring = np.concatenate([band - [0, 0.35 * eye_w], band[::-1] - [0, 0.1 * eye_w]]).astype(np.int32)
        cv2.fillPoly(lid, [lid_ring], 1)
        was = rgb.astype(np.float32).mean(axis=2)[inside > 0].mean()
        now, skin = grey[inside > 0].mean(), rgb.astype(np.float32).mean(axis=2)[lid > 0].mean()
        assert now > was  # the dark iris and lashes are covered
        assert abs(now - skin) < 0.3 * skin, (now, skin)  # ... by something as light as the lid's skin
        # and smoothly: no single column jumps (a smear or tear shows as a large column-to-column step)
        assert np.abs(np.diff(shut[inside > 0].reshape(-1, 3), axis=0)).mean() < 40


def test_found_blinks_are_short_dips_and_long_ones_are_not() -> None:
    openness = np.full(200, 0.3)
    openness[50:54] = [0.2, 0.05, 0.06, 0.2]  # a blink
    openness[120:140] = 0.08  # eyes down for 0.8 s: a look down, not a blink
    assert find_blinks(openness, FPS) == [(51, 53)]
    assert find_blinks(np.full(100, 0.3), FPS) == []


def test_blink_curve_goes_down_fast_stays_shut_and_up_slower() -> None:
    cfg = BlinkConfig()
    for seconds in np.linspace(*cfg.duration_s, 5):
        curve = blink_curve(seconds * FPS, cfg)
        assert len(curve) == int(np.ceil(seconds * FPS - 1e-9)) and 5 <= len(curve) <= 9  # 200-350 ms
        assert np.count_nonzero(curve == 1.0) >= 2  # shut for at least 2 frames
        first, last = np.flatnonzero(curve == 1.0)[[0, -1]]
        assert first <= 2  # down in ~2 frames ...
        assert len(curve) - 1 - last > first  # ... up again slower
        assert curve[-1] < 0.6


@pytest.mark.parametrize("name", ["sample", "anchor", "astro", "x"])
def test_a_photo_loop_blinks_irregularly_at_a_human_rate(name: str) -> None:
    cfg = BlinkConfig()
    loop, count = photo_loop(cfg, FPS, rng_for(name))
    assert len(loop) == 300 and set(loop.tolist()) <= set(range(len(cfg.photo_levels) + 1))
    starts = np.flatnonzero((loop[1:] > 0) & (loop[:-1] == 0)) + 1
    assert loop[0] == 0 and loop[-1] == 0 and len(starts) == count
    assert 60 * count / 12.0 >= 6  # at least 6 a minute
    gaps = np.diff([*starts, starts[0] + len(loop)])  # the loop wraps: the last to the first too
    assert gaps.min() >= cfg.interval_s[0] * FPS - 1
    shut = np.flatnonzero(loop == len(cfg.photo_levels))
    assert len(shut) >= count  # every blink closes the eye fully at least one frame
    assert np.array_equal(photo_loop(cfg, FPS, rng_for(name))[0], loop)  # the same avatar, the same blinks


def _clip_landmarks(openness_per_frame: np.ndarray, face: np.ndarray) -> np.ndarray:
    """Copies of one face with both upper lids moved to give each frame's openness."""
    out = np.repeat(face[None], len(openness_per_frame), axis=0).copy()
    base = eye_openness(face)
    for k, value in enumerate(openness_per_frame):
        for upper, lower in EYES:
            up, low = out[k, list(upper)], out[k, list(lower)]
            out[k, list(upper), 1] = low[:, 1] - (low[:, 1] - up[:, 1]) * value / base
    return out


def test_a_clip_keeps_its_own_blinks_and_one_without_gets_some(astronaut) -> None:
    _, face = astronaut
    cfg = BlinkConfig()
    open_eyes = np.full(150, eye_openness(face))
    blinking = open_eyes.copy()
    blinking[70:73] = 0.05
    stretch = IdleStretch(0, 150, 0.0, 0.0, "test").loop()
    kept = plan_idle_blinks(stretch, _clip_landmarks(blinking, face), 150, False, FPS, cfg, "c")
    assert kept.own == 2 and kept.drawn == 0 and not kept.closure.any()  # forward and back: seen twice
    drawn = plan_idle_blinks(stretch, _clip_landmarks(open_eyes, face), 150, False, FPS, cfg, "c")
    assert drawn.own == 0 and drawn.drawn >= 2 and drawn.closure.max() > 0.9
    margin = int(cfg.edge_margin_s * FPS)
    assert not drawn.closure[:margin].any() and not drawn.closure[-margin:].any()  # not where the loop turns
    assert np.array_equal(drawn.loop, stretch)
    off = plan_idle_blinks(
        stretch, _clip_landmarks(open_eyes, face), 150, False, FPS, BlinkConfig(enabled=False), "c"
    )
    assert off.drawn == 0 and not off.closure.any()


@pytest.mark.slow
@pytest.mark.parametrize("breathing", [True, False], ids=["breathing", "still"])
def test_a_prepared_photo_shows_its_blinks_in_what_viewers_see(tmp_path: Path, breathing: bool) -> None:
    from lipstream.avatar.breathing import BreathingConfig
    from lipstream.avatar.prepare import PrepareConfig, prepare_avatar

    photo = tmp_path / "astronaut.png"
    cv2.imwrite(str(photo), cv2.cvtColor(skdata.astronaut(), cv2.COLOR_RGB2BGR))
    config = PrepareConfig(breathing=BreathingConfig(enabled=breathing))
    bundle = prepare_avatar(photo, "astro", avatars_root=tmp_path / "avatars", progress=False, config=config)
    entry = bundle.manifest.idle["blinks"]
    assert entry["drawn"] >= 2 and entry["per_minute"] >= 6 and "a photo" in bundle.manifest.idle["reason"]
    # the photo's own frame, then a breathing clip (a frame each loop position) or its lid heights
    assert bundle.frame_count == (300 if breathing else 1 + len(BlinkConfig().photo_levels))
    # the loop as the page and the server show it: every picture of loop.mp4 tracked, its blinks counted
    import av

    with av.open(str(bundle.loop_video)) as container:
        pictures = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(pictures) == len(bundle.idle_loop) == 300
    tracked = _retracked_landmarks(pictures)
    found = find_blinks(np.array([eye_openness(lm) for lm in tracked]), FPS)
    assert len(found) == entry["drawn"], (found, entry)
    shown = np.asarray(bundle.idle_loop)
    # the stored landmarks are where the face is in each picture (the engine draws the mouth there)
    stored = np.asarray(bundle.landmarks)[shown]
    mouth = [61, 291, 0, 17, 13, 14, 152, 1]
    error = np.array([np.abs(t[mouth] - s[mouth]).mean() for t, s in zip(tracked, stored, strict=True)])
    assert error.mean() < 1.0 and error.max() < 2.5, (error.mean(), error.max())
    if not breathing:  # the mouth and everything under the nose is the photo's own in every picture
        nose = int(stored[0, 2, 1])
        # (up to the encoder's noise: the pictures are inter-coded against each other)
        assert max(np.abs(p[nose:].astype(int) - pictures[0][nose:]).mean() for p in pictures) < 1.0


def _retracked_landmarks(pictures: list[np.ndarray]) -> list[np.ndarray]:
    out = []
    with FaceTracker() as tracker:
        for picture in pictures:
            tracker.reset()
            landmarks = tracker.track(picture)
            assert landmarks is not None
            out.append(landmarks)
    return out


def test_idle_blinks_entry_counts_per_minute() -> None:
    blinks = IdleBlinks(np.zeros(300, np.int32), np.zeros(1, np.float32), 0, 3, 12.0)
    assert blinks.entry() == {"own": 0, "drawn": 3, "per_minute": 15.0, "starts": []}


def test_a_sample_prepared_before_blinks_is_told_to_rebuild_with_the_sample_command() -> None:
    from lipstream.avatar.bundle import SAMPLE_CLIP, Manifest

    fields = {"name": "s", "frame_count": 200, "width": 1080, "height": 1920, "source_file": SAMPLE_CLIP}
    old = Manifest(**fields, idle={"reason": "a stretch"})
    assert not old.blinks_planned
    assert "`lipstream avatar sample --name s --force` adds them" in old.blink_note()
    new = Manifest(**fields, idle={"blinks": {"own": 0, "drawn": 4, "per_minute": 10.0}})
    assert new.blinks_planned and new.blink_note() is None
