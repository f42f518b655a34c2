"""Paste a crop-space mouth patch into the base frame, touching only the mouth mask's pixels."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from lipstream.avatar.bundle import AvatarBundle
from lipstream.media.yuv import cut_i420, unmasked_i420, write_i420_rect
from lipstream.render.base_frames import BaseFrameStore
from lipstream.render.eyelids import EyeLids


@dataclass(frozen=True)
class FrameGeometry:
    """Where a base frame's mouth goes at the output size: its box and the mask's non-zero rectangle,
    widened to even coordinates so the I420 chroma planes can be updated in place."""

    box: tuple[int, int, int, int]  # x1, y1, x2, y2 of the face box at the output size
    rect: tuple[int, int, int, int]  # x0, y0, x1, y1 of the (even-aligned) region that can change
    alpha: np.ndarray  # rect-sized h×w×1 uint16 mask, 0..255
    unmasked: np.ndarray  # the rectangle's I420 samples (flat, Y then U then V) the mask leaves alone


class Compositor:
    """Blends patches into base frames; pixels outside the mouth mask stay bit-identical.

    Works at the output size (the avatar's own, or scaled for a smaller stream) and only inside the
    mask's rectangle: no full-frame pass per frame beyond the one copy of the base picture.
    """

    def __init__(
        self,
        bundle: AvatarBundle,
        patch_size: int = 256,
        output_size: tuple[int, int] | None = None,
        base: BaseFrameStore | None = None,
    ) -> None:
        """`base`: a store shared with other sessions of the same avatar and size (else a private one)."""
        self.bundle = bundle
        self.patch_size = patch_size
        self.base = base or BaseFrameStore(bundle, output_size)
        self.width, self.height = self.base.width, self.base.height
        self._geometry: dict[int, FrameGeometry | None] = {}
        self.lids = EyeLids(bundle, self.base.scale, (self.width, self.height))

    def geometry(self, frame_index: int) -> FrameGeometry | None:
        """Per-frame blend geometry, computed once and cached (it depends only on the avatar)."""
        if frame_index not in self._geometry:
            self._geometry[frame_index] = self._build_geometry(frame_index)
        return self._geometry[frame_index]

    def _build_geometry(self, frame_index: int) -> FrameGeometry | None:
        s = self.base.scale
        bx1, by1, bx2, by2 = (int(round(float(v) * s)) for v in self.bundle.boxes[frame_index])
        bx1, by1 = max(bx1, 0), max(by1, 0)
        bx2, by2 = min(bx2, self.width), min(by2, self.height)
        w, h = bx2 - bx1, by2 - by1
        if w <= 1 or h <= 1:
            return None
        mask = cv2.resize(np.asarray(self.bundle.masks[frame_index]), (w, h), interpolation=cv2.INTER_LINEAR)
        rows = np.flatnonzero(mask.any(axis=1))
        cols = np.flatnonzero(mask.any(axis=0))
        if rows.size == 0:
            return None
        # the rectangle in frame coordinates, widened to even edges (yuv420p chroma is 2×2)
        x0, y0 = (bx1 + cols[0]) // 2 * 2, (by1 + rows[0]) // 2 * 2
        x1 = min(self.width, (bx1 + cols[-1] + 2) // 2 * 2)
        y1 = min(self.height, (by1 + rows[-1] + 2) // 2 * 2)
        full = np.zeros((y1 - y0, x1 - x0), dtype=np.uint16)
        # place the mask (box coordinates) into the rectangle
        sy0, sx0 = max(y0, by1), max(x0, bx1)
        sy1, sx1 = min(y1, by2), min(x1, bx2)
        full[sy0 - y0 : sy1 - y0, sx0 - x0 : sx1 - x0] = mask[sy0 - by1 : sy1 - by1, sx0 - bx1 : sx1 - bx1]
        return FrameGeometry(
            box=(bx1, by1, bx2, by2), rect=(x0, y0, x1, y1), alpha=full[..., None],
            unmasked=unmasked_i420(full),
        )  # fmt: skip

    def _blend_region(self, frame_index: int, patch: np.ndarray, base_region: np.ndarray) -> np.ndarray:
        """The blended RGB of the geometry's rectangle (base pixels where the mask is 0)."""
        geo = self.geometry(frame_index)
        assert geo is not None
        bx1, by1, bx2, by2 = geo.box
        x0, y0, x1, y1 = geo.rect
        resized = cv2.resize(patch, (bx2 - bx1, by2 - by1), interpolation=cv2.INTER_LINEAR)
        src = np.array(base_region, dtype=np.uint16)  # outside the box the base shows through
        sy0, sx0 = max(y0, by1), max(x0, bx1)
        sy1, sx1 = min(y1, by2), min(x1, bx2)
        src[sy0 - y0 : sy1 - y0, sx0 - x0 : sx1 - x0] = resized[sy0 - by1 : sy1 - by1, sx0 - bx1 : sx1 - bx1]
        # integer alpha blend: alpha 0 keeps the base pixel exactly, 255 takes the patch exactly
        blended = (src * geo.alpha + base_region.astype(np.uint16) * (255 - geo.alpha) + 127) // 255
        return blended.astype(np.uint8)

    def compose(
        self, frame_index: int, patch: np.ndarray | None, out: np.ndarray | None = None, lids: float = 0.0
    ) -> np.ndarray:
        """Base frame `frame_index` (RGB, output size) with `patch` blended in (None: the base frame) and its
        lids lowered by `lids` (0: as the loop shows them)."""
        base = self.base.rgb(frame_index)
        if out is None:
            out = np.empty(base.shape, dtype=np.uint8)
        np.copyto(out, base)
        geo = self.geometry(frame_index) if patch is not None else None
        if geo is not None:
            x0, y0, x1, y1 = geo.rect
            out[y0:y1, x0:x1] = self._blend_region(frame_index, patch, base[y0:y1, x0:x1])
        self.lids.draw_rgb(out, frame_index, lids)
        return out

    def compose_i420(
        self, frame_index: int, patch: np.ndarray | None, out: np.ndarray | None = None, lids: float = 0.0
    ) -> np.ndarray:
        """The same picture as `compose`, as I420 [(H*3/2), W] ready for the H.264 encoder; only the
        mask's rectangle (and the eyes' while a lid is lowered) is colour-converted, the rest is a copy of the
        cached base picture."""
        base = self.base.i420(frame_index)
        if out is None:
            out = np.empty(base.shape, dtype=np.uint8)
        np.copyto(out, base)
        geo = self.geometry(frame_index) if patch is not None else None
        if geo is not None:
            self._blend_i420(out, frame_index, patch, geo)
        self.lids.draw_i420(out, frame_index, lids)
        return out

    def _blend_i420(self, out: np.ndarray, frame_index: int, patch: np.ndarray, geo: FrameGeometry) -> None:
        base = self.base.i420(frame_index)
        x0, y0, x1, y1 = geo.rect
        region = self._blend_region(frame_index, patch, self.base.rgb_region(frame_index, geo.rect))
        yuv = cv2.cvtColor(region, cv2.COLOR_RGB2YUV_I420).reshape(-1)
        if not self.base.rgb_matches_i420:  # keep the mask's zero pixels exactly as decoded
            decoded = cut_i420(base, self.width, self.height, geo.rect).reshape(-1)
            yuv = np.where(geo.unmasked, decoded, yuv)
        write_i420_rect(out, self.width, self.height, (x0, y0, x1, y1), yuv)
