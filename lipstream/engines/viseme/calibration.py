"""Per-avatar opening calibration: make the *seen* lip aperture proportional to the commanded opening, over
the range of human speech.

The warp's parting is linear in pixels, but what a viewer (or a face tracker) reads as mouth opening is
not: the first few pixels reveal the dark interior and read as a large change, very wide partings make
the lips thin out. At prepare time the warp is driven at fixed openings on a few of the avatar's own
frames, the inner-lip gap over the mouth's width is measured with the face tracker, and the inverse of that
curve maps a command c in 0..1 to the warp opening that lands c of the way from the rest aperture to
SPEECH_MAX (emphasis; speech is mostly nearly closed, ~0.1-0.2 of the width on vowels), not to the widest
the warp can do (a puppet's gape).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

from lipstream.avatar.bundle import AvatarBundle
from lipstream.avatar.face_measures import gap_over_width

LEVELS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0)
SPEECH_MAX = 0.4  # inner-lip gap / mouth width at command 1: the loudest open vowel (speech rarely goes past)
MIN_SPAN = 0.1  # a rest mouth already that open still gets this much range above it


@dataclass(frozen=True)
class OpeningCurve:
    """Measured aperture (inner-lip gap / mouth width) at each warp opening level."""

    levels: np.ndarray
    aperture: np.ndarray

    @classmethod
    def identity(cls) -> OpeningCurve:
        """No calibration: commands pass through unchanged."""
        levels = np.asarray(LEVELS, dtype=np.float32)
        return cls(levels, levels.copy())

    def pack(self) -> np.ndarray:
        """[2, L] float32 for the avatar cache."""
        return np.stack([self.levels, self.aperture]).astype(np.float32)

    @classmethod
    def unpack(cls, arr: np.ndarray) -> OpeningCurve:
        """Inverse of pack()."""
        return cls(np.asarray(arr[0], np.float32), np.asarray(arr[1], np.float32))

    def capped(self, most: float) -> OpeningCurve:
        """The curve cut where its aperture reaches `most` (interpolated there), so command 1 lands on it."""
        mono = np.maximum.accumulate(self.aperture)
        if mono[-1] <= most:
            return self
        k = int(np.argmax(mono >= most))  # first level at or past it (k >= 1: the rest lies below `most`)
        if k == 0:
            return OpeningCurve(self.levels[:1].copy(), self.aperture[:1].copy())
        t = (most - mono[k - 1]) / max(float(mono[k] - mono[k - 1]), 1e-9)
        level = self.levels[k - 1] + t * (self.levels[k] - self.levels[k - 1])
        levels = np.append(self.levels[:k], level).astype(np.float32)
        return OpeningCurve(levels, np.append(mono[:k], most).astype(np.float32))

    def warp_opening(self, command: np.ndarray) -> np.ndarray:
        """Warp opening whose aperture lies `command` of the way from rest to the curve's last one."""
        command = np.clip(np.asarray(command, dtype=np.float32), 0.0, 1.0)
        mono = np.maximum.accumulate(self.aperture)
        if mono[-1] - mono[0] <= 1e-6:
            return command
        target = mono[0] + command * (mono[-1] - mono[0])
        # Flat stretches (noise) would make the inverse ambiguous: nudge them to strictly increasing.
        mono = mono + np.arange(mono.size, dtype=np.float32) * 1e-6
        return np.interp(target, mono, self.levels).astype(np.float32)


def paste_patch(bundle: AvatarBundle, frame_index: int, patch: np.ndarray) -> np.ndarray:
    """The frame with a crop-space patch blended into its face box through the mouth mask."""
    frame = np.array(bundle.frames[frame_index], copy=True)
    x1, y1, x2, y2 = (int(v) for v in bundle.boxes[frame_index])
    x1, y1 = max(x1, 0), max(y1, 0)
    x2, y2 = min(x2, frame.shape[1]), min(y2, frame.shape[0])
    size = (x2 - x1, y2 - y1)
    resized = cv2.resize(patch, size, interpolation=cv2.INTER_LINEAR).astype(np.float32)
    alpha = cv2.resize(np.asarray(bundle.masks[frame_index]), size).astype(np.float32)[..., None] / 255.0
    region = frame[y1:y2, x1:x2].astype(np.float32)
    frame[y1:y2, x1:x2] = (resized * alpha + region * (1.0 - alpha) + 0.5).astype(np.uint8)
    return frame


def measure_opening_curve(
    bundle: AvatarBundle, render_open: Callable[[float, int], np.ndarray], n_frames: int = 4
) -> OpeningCurve:
    """Track the aperture produced by `render_open(opening, frame_index)` on a few avatar frames."""
    from lipstream.avatar.tracking import FaceTracker

    frames = np.unique(np.linspace(0, bundle.frame_count - 1, n_frames).round().astype(int))
    measured = np.zeros(len(LEVELS), dtype=np.float32)
    with FaceTracker() as tracker:
        for i, level in enumerate(LEVELS):
            values = []
            for fid in frames:
                # Each picture on its own: video-mode tracking state misleads the mesh across jumps.
                tracker.reset()
                landmarks = tracker.track(paste_patch(bundle, int(fid), render_open(level, int(fid))))
                if landmarks is not None:
                    # the same measure as the realism bench's speech range: what is evaluated is targeted
                    values.append(gap_over_width(landmarks))
            if not values:
                return OpeningCurve.identity()
            measured[i] = float(np.median(values))
    curve = OpeningCurve(np.asarray(LEVELS, dtype=np.float32), measured)
    return curve.capped(max(SPEECH_MAX, float(measured[0]) + MIN_SPAN))
