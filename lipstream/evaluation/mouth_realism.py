"""Mouth realism measured on output frames alone (issue 13): the inner-lip interior and the lower lip,
from face landmarks tracked on the decoded video, plus a tracker that keeps what it saw for them."""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np

from lipstream.avatar.face_measures import INNER_LIP_RING, MOUTH_CORNERS, eye_width
from lipstream.avatar.tracking import FaceTracker

LOWER_LIP_INNER, LOWER_LIP_OUTER = 14, 17
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def lower_lip_thickness(landmarks: np.ndarray) -> float:
    """Lower lip from its inner to its outer edge at the centre, in eye-corner widths."""
    return float(np.linalg.norm(landmarks[LOWER_LIP_INNER] - landmarks[LOWER_LIP_OUTER])) / eye_width(
        landmarks
    )


def inner_lip_luma(frame_rgb: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """Luminance (0-255) of every pixel inside the tracked inner-lip ring; empty when the lips touch."""
    ring = np.rint(landmarks[list(INNER_LIP_RING)]).astype(np.int32)
    x0, y0 = np.maximum(ring.min(axis=0) - 1, 0)
    x1, y1 = ring.max(axis=0) + 2
    region = np.asarray(frame_rgb[y0:y1, x0:x1], dtype=np.float32)
    inside = np.zeros(region.shape[:2], np.uint8)
    cv2.fillPoly(inside, [ring - [x0, y0]], 1)
    return (region @ _LUMA)[inside > 0]


def darker_half_spread(luma: np.ndarray) -> float:
    """Standard deviation of the darker half (at or below the median) of the pixels: ~4 for a flat fill."""
    if luma.size < 8:
        return float("nan")
    dark = luma[luma <= np.median(luma)]
    return float(dark.std())


@dataclass
class RecordingTracker:
    """A FaceTracker that keeps every frame's landmarks and a crop around the mouth, for the measures above.

    Passed to `measure_lipsync` so one tracking pass serves the lip-sync figures and the realism ones.
    """

    tracker: FaceTracker = field(default_factory=FaceTracker)
    landmarks: list[np.ndarray | None] = field(default_factory=list)
    mouth_luma: list[np.ndarray] = field(default_factory=list)  # inner-lip luminance per frame
    keep_frames: set[int] = field(default_factory=set)  # frame indices whose mouth crop is kept
    crops: dict[int, tuple[np.ndarray, tuple[int, int]]] = field(default_factory=dict)
    crop_half: int = 110

    def track(self, frame_rgb: np.ndarray) -> np.ndarray | None:
        """Track like FaceTracker.track, and remember what the realism measures need."""
        index = len(self.landmarks)
        lm = self.tracker.track(frame_rgb)
        self.landmarks.append(None if lm is None else np.asarray(lm, np.float32))
        self.mouth_luma.append(np.zeros(0, np.float32) if lm is None else inner_lip_luma(frame_rgb, lm))
        if index in self.keep_frames:
            centre = (
                np.asarray(lm)[list(MOUTH_CORNERS)].mean(axis=0)
                if lm is not None
                else np.array(frame_rgb.shape[1::-1]) / 2
            )
            h = self.crop_half
            cx, cy = int(centre[0]), int(centre[1] + 0.3 * h)  # the jaw opens downwards
            y0, x0 = max(cy - h, 0), max(cx - h, 0)
            self.crops[index] = (np.array(frame_rgb[y0 : cy + h, x0 : cx + h]), (x0, y0))
        return lm

    def close(self) -> None:
        """Close the wrapped tracker."""
        self.tracker.close()
