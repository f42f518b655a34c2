"""Mouth blend masks in crop space: lips and jaw below the nostril base, feathered, zero at and above it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

from lipstream.avatar.face_measures import MOUTH_CORNERS

# FaceMesh indices (478-point topology).
NOSTRIL_BASE = (2, 94, 19, 97, 326, 98, 327, 64, 294, 240, 460, 99, 328, 60, 290, 75, 305, 79, 309, 20, 250)
LIPS = (
    61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291, 409, 270, 269, 267, 0, 37, 39, 40, 185,
)
JAW = (58, 172, 136, 150, 149, 176, 148, 152, 377, 400, 378, 379, 365, 397, 288)


@dataclass(frozen=True)
class MaskConfig:
    """Shape of the mouth mask (distances in crop pixels of a CROP_SIZE crop)."""

    side_margin: float = 0.35  # beyond each mouth corner, in mouth widths
    top_margin_px: float = 2.0  # hard-zero rows down to nose base + this
    jaw_drop_px: float = 10.0  # the region reaches this far below the jaw line (an opening jaw)
    feather_sigma_px: float = 4.0  # Gaussian feather of the edges


def nose_base_row(crop_landmarks: np.ndarray) -> float:
    """Crop-space row of the nostril base (lowest point of the nose)."""
    return float(crop_landmarks[list(NOSTRIL_BASE), 1].max())


def mouth_mask(
    crop_landmarks: np.ndarray, size: int, config: MaskConfig | None = None
) -> tuple[np.ndarray, float]:
    """(size×size uint8 mask, nose-base row) for one frame's crop-space landmarks."""
    config = config or MaskConfig()
    nose = nose_base_row(crop_landmarks)
    left = crop_landmarks[MOUTH_CORNERS[0]]
    right = crop_landmarks[MOUTH_CORNERS[1]]
    x_lo, x_hi = sorted((float(left[0]), float(right[0])))
    margin = config.side_margin * max(x_hi - x_lo, 1.0)
    x_lo, x_hi = x_lo - margin, x_hi + margin
    cut = nose + config.top_margin_px
    top = cut
    jaw = crop_landmarks[list(JAW)]
    lips = crop_landmarks[list(LIPS)]
    dropped = jaw + np.array([0.0, config.jaw_drop_px], dtype=np.float32)
    corners = np.array([[x_lo, top], [x_hi, top]], dtype=np.float32)
    points = np.concatenate([jaw, dropped, lips, corners]).astype(np.float32)
    hull = cv2.convexHull(points)
    # Rasterise at 4× sub-pixel precision so small crops still get a smooth outline.
    shift = 2
    solid = np.zeros((size, size), dtype=np.uint8)
    cv2.fillConvexPoly(solid, np.rint(hull * (1 << shift)).astype(np.int32), 255, cv2.LINE_AA, shift)
    cols = np.arange(size)
    solid[:, (cols < x_lo) | (cols > x_hi)] = 0
    solid[: max(0, int(np.ceil(top))), :] = 0
    feathered = cv2.GaussianBlur(solid.astype(np.float32), (0, 0), config.feather_sigma_px)
    # The philtrum can be only a few pixels high (a smile), so the top edge fades in over a ramp that ends
    # before the upper lip instead of a full blur width, and then the hard cut makes the guarantee exact.
    lip_top = float(lips[:, 1].min())
    ramp = max(1.0, min(3.0 * config.feather_sigma_px, 0.8 * (lip_top - cut)))
    rows = np.arange(size, dtype=np.float32)[:, None]
    fade = np.clip((rows - cut) / ramp, 0.0, 1.0)
    feathered *= fade * fade * (3.0 - 2.0 * fade)  # smoothstep
    feathered[: max(0, int(np.ceil(cut)) + 1), :] = 0.0  # the guarantee: nothing at or above the nose base
    return np.clip(np.rint(feathered), 0, 255).astype(np.uint8), nose


def mouth_masks(
    crop_landmarks: np.ndarray, size: int, config: MaskConfig | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Masks (N×size×size uint8) and nose-base rows (N float32) for every frame."""
    masks = np.zeros((len(crop_landmarks), size, size), dtype=np.uint8)
    noses = np.zeros(len(crop_landmarks), dtype=np.float32)
    for i, lm in enumerate(crop_landmarks):
        masks[i], noses[i] = mouth_mask(lm, size, config)
    return masks, noses


class MaskSequence:
    """Every frame's mask, made from its landmarks when first asked for and kept (bundle format 2 stores
    no masks: they are cheap to derive, ~1 ms a frame, and only the frames shown are ever asked for)."""

    def __init__(
        self,
        crop_landmarks: Callable[[int], np.ndarray],
        count: int,
        size: int,
        config: MaskConfig | None = None,
    ) -> None:
        self._crop_landmarks = crop_landmarks
        self._count = count
        self._size = size
        self._config = config or MaskConfig()
        self._made: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()  # sessions sharing the bundle: each mask is made once

    @property
    def shape(self) -> tuple[int, int, int]:
        """N×size×size, as the stored masks.npy of format 1."""
        return (self._count, self._size, self._size)

    @property
    def dtype(self) -> np.dtype:
        """uint8, as masks.npy."""
        return np.dtype(np.uint8)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> np.ndarray:
        index = int(index)
        if not -self._count <= index < self._count:
            raise IndexError(f"mask {index} is outside 0..{self._count - 1}")
        index %= self._count
        mask = self._made.get(index)
        if mask is None:
            with self._lock:
                mask = self._made.get(index)
                if mask is None:
                    mask, _ = mouth_mask(self._crop_landmarks(index), self._size, self._config)
                    mask.flags.writeable = False
                    self._made[index] = mask
        return mask
