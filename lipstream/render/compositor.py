"""Paste a crop-space mouth patch into the base frame, touching only the mouth mask's pixels."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from lipstream.avatar.bundle import AvatarBundle


@dataclass(frozen=True)
class _FrameGeometry:
    """A base frame's mask resized to its box, cut to the mask's non-zero rectangle."""

    y0: int  # full-frame row/col of the rectangle's top-left
    x0: int
    alpha: np.ndarray  # h×w×1 uint16 in 0..255
    # the rectangle inside the resized patch
    py0: int
    px0: int


class Compositor:
    """Blends patches into base frames; pixels outside the mouth mask stay bit-identical."""

    def __init__(self, bundle: AvatarBundle, patch_size: int = 256) -> None:
        self.bundle = bundle
        self.patch_size = patch_size
        self._geometry: dict[int, _FrameGeometry | None] = {}

    def geometry(self, frame_index: int) -> _FrameGeometry | None:
        """Per-frame blend geometry, computed once and cached (it depends only on the avatar)."""
        if frame_index not in self._geometry:
            self._geometry[frame_index] = self._build_geometry(frame_index)
        return self._geometry[frame_index]

    def _build_geometry(self, frame_index: int) -> _FrameGeometry | None:
        x1, y1, x2, y2 = (int(v) for v in self.bundle.boxes[frame_index])
        w, h = x2 - x1, y2 - y1
        if w <= 1 or h <= 1:
            return None
        mask = cv2.resize(np.asarray(self.bundle.masks[frame_index]), (w, h), interpolation=cv2.INTER_LINEAR)
        rows = np.flatnonzero(mask.any(axis=1))
        cols = np.flatnonzero(mask.any(axis=0))
        if rows.size == 0:
            return None
        r0, r1, c0, c1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
        alpha = mask[r0:r1, c0:c1].astype(np.uint16)[..., None]
        return _FrameGeometry(y0=y1 + r0, x0=x1 + c0, alpha=alpha, py0=int(r0), px0=int(c0))

    def compose(
        self, frame_index: int, patch: np.ndarray | None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Return base frame `frame_index` with `patch` blended in (None: the base frame unchanged)."""
        base = self.bundle.frames[frame_index]
        if out is None:
            out = np.empty(base.shape, dtype=np.uint8)
        np.copyto(out, base)
        if patch is not None:
            self.blend_into(out, frame_index, patch)
        return out

    def blend_into(self, frame: np.ndarray, frame_index: int, patch: np.ndarray) -> None:
        """Blend `patch` (patch_size² RGB, crop space) into `frame` in place, inside the mask only."""
        geo = self.geometry(frame_index)
        if geo is None:
            return
        x1, y1, x2, y2 = (int(v) for v in self.bundle.boxes[frame_index])
        resized = cv2.resize(patch, (x2 - x1, y2 - y1), interpolation=cv2.INTER_LINEAR)
        h, w = geo.alpha.shape[:2]
        src = resized[geo.py0 : geo.py0 + h, geo.px0 : geo.px0 + w].astype(np.uint16)
        region = frame[geo.y0 : geo.y0 + h, geo.x0 : geo.x0 + w]
        # integer alpha blend: alpha 0 keeps the base pixel exactly, 255 takes the patch exactly
        blended = (src * geo.alpha + region.astype(np.uint16) * (255 - geo.alpha) + 127) // 255
        region[...] = blended.astype(np.uint8)
