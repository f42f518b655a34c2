"""Lids lowered on a composed picture at render time (the blinks decided while the avatar speaks), touching
only the pixels a lid moves: the eyes' rectangle is all that is colour-converted, and what the lid leaves
alone keeps its exact samples."""

from __future__ import annotations

import cv2
import numpy as np

from lipstream.avatar.blink import EYES, BlinkConfig, close_eyes
from lipstream.avatar.bundle import AvatarBundle
from lipstream.media.yuv import cut_i420, unmasked_i420, write_i420_rect


class EyeLids:
    """Draws lids on an avatar's pictures at an output size (`scale` of the avatar's own)."""

    def __init__(
        self, bundle: AvatarBundle, scale: float, size: tuple[int, int], config: BlinkConfig | None = None
    ) -> None:
        self.bundle = bundle
        self.scale = scale
        self.width, self.height = size
        self.config = config or BlinkConfig()
        self._rects: dict[int, tuple[int, int, int, int] | None] = {}

    def landmarks(self, frame_index: int) -> np.ndarray:
        """The frame's landmarks at the output size."""
        return np.asarray(self.bundle.landmarks[frame_index], np.float32) * self.scale

    def rect(self, frame_index: int) -> tuple[int, int, int, int] | None:
        """x0, y0, x1, y1 (even) holding everything a lid on this frame can move; None: no eyes to close."""
        if frame_index not in self._rects:
            self._rects[frame_index] = self._build_rect(frame_index)
        return self._rects[frame_index]

    def _build_rect(self, frame_index: int) -> tuple[int, int, int, int] | None:
        points = self.landmarks(frame_index)
        boxes = []
        for upper, lower in EYES:
            eye = points[list(upper) + list(lower)]
            eye_w = float(np.linalg.norm(points[upper[0]] - points[upper[-1]]))
            if eye_w < 4.0:
                continue
            reach = self.config.lid_reach * eye_w
            # as close_eyes reaches: a quarter eye width past the corners, the lid's reach above, half below
            boxes.append((eye[:, 0].min() - 0.3 * eye_w, eye[:, 1].min() - reach - 2,
                          eye[:, 0].max() + 0.3 * eye_w, eye[:, 1].max() + 0.5 * reach + 2))  # fmt: skip
        if not boxes:
            return None
        x0 = max(int(np.floor(min(b[0] for b in boxes))) // 2 * 2, 0)
        y0 = max(int(np.floor(min(b[1] for b in boxes))) // 2 * 2, 0)
        x1 = min(-(-int(np.ceil(max(b[2] for b in boxes))) // 2) * 2, self.width // 2 * 2)
        y1 = min(-(-int(np.ceil(max(b[3] for b in boxes))) // 2) * 2, self.height // 2 * 2)
        return (x0, y0, x1, y1) if x1 - x0 >= 4 and y1 - y0 >= 4 else None

    def _lowered(self, region: np.ndarray, frame_index: int, rect: tuple[int, int, int, int], closure: float
                 ) -> np.ndarray:  # fmt: skip
        shifted = self.landmarks(frame_index) - np.array(rect[:2], np.float32)
        return close_eyes(region, shifted, closure, self.config)

    def draw_rgb(self, picture: np.ndarray, frame_index: int, closure: float) -> None:
        """Lower the lids of an RGB picture (output size) in place."""
        rect = self.rect(frame_index)
        if rect is None or closure <= 1e-3:
            return
        x0, y0, x1, y1 = rect
        picture[y0:y1, x0:x1] = self._lowered(picture[y0:y1, x0:x1], frame_index, rect, closure)

    def draw_i420(self, picture: np.ndarray, frame_index: int, closure: float) -> None:
        """Lower the lids of an I420 picture [(H*3/2), W] in place; samples no lid moves stay as they were."""
        rect = self.rect(frame_index)
        if rect is None or closure <= 1e-3:
            return
        before = cut_i420(picture, self.width, self.height, rect)
        rgb = cv2.cvtColor(before, cv2.COLOR_YUV2RGB_I420)
        lowered = self._lowered(rgb, frame_index, rect, closure)
        moved = (lowered != rgb).any(axis=2)
        yuv = cv2.cvtColor(lowered, cv2.COLOR_RGB2YUV_I420).reshape(-1)
        yuv = np.where(unmasked_i420(moved), before.reshape(-1), yuv)
        write_i420_rect(picture, self.width, self.height, rect, yuv)

