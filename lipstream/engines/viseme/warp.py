"""Articulation -> mouth patch: a smooth backward warp of the avatar's own lips and jaw, plus a drawn
mouth interior where the lips part wider than in the source. Rows at and above the nose base never change."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from lipstream.engines.viseme.articulation import CLOSURE, OPEN, WIDTH
from lipstream.engines.viseme.geometry import MouthGeometry


@dataclass(frozen=True)
class WarpConfig:
    """Motion ranges relative to the mouth half-width W (corner to corner / 2)."""

    jaw_drop: float = 0.55  # lip parting at open=1, in W
    upper_share: float = 0.22  # part of the parting taken by the upper lip
    spread: float = 0.13  # corner shift at width=±1, in W
    roi_half_width: float = 2.6  # warped region half-width, in W
    teeth_rgb: tuple[int, int, int] = (214, 208, 196)
    cavity_rgb: tuple[int, int, int] = (48, 16, 18)


def _interp_contour(contour: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Contour row at columns xs (clamped at the corners)."""
    order = np.argsort(contour[:, 0])
    return np.interp(xs, contour[order, 0], contour[order, 1]).astype(np.float32)


def render_patch(
    crop: np.ndarray, mask: np.ndarray, geo: MouthGeometry, feature: np.ndarray, cfg: WarpConfig
) -> np.ndarray:
    """One 256² RGB patch for one articulation row; an all-zero row returns the crop unchanged.

    Displacements are scaled by the frame's mouth mask, so the warp fades out exactly where the
    compositor's blend does and no seam appears at the mask edge.
    """
    opening = float(feature[OPEN]) * (1.0 - float(np.clip(feature[CLOSURE], 0.0, 1.0)))
    width = float(feature[WIDTH])
    closure = float(np.clip(feature[CLOSURE], 0.0, 1.0))
    if opening <= 1e-4 and abs(width) <= 1e-4 and closure <= 1e-4:
        return crop.copy()
    size = crop.shape[0]
    w_half = geo.half_width
    r0 = int(np.floor(geo.nose_y)) + 1
    c0 = max(int(geo.center_x - cfg.roi_half_width * w_half), 0)
    c1 = min(int(geo.center_x + cfg.roi_half_width * w_half) + 1, size)
    patch = crop.copy()
    if r0 >= size or c1 <= c0:
        return patch
    ys = np.arange(r0, size, dtype=np.float32)[:, None]
    xs = np.arange(c0, c1, dtype=np.float32)[None, :]
    u = (xs - geo.center_x) / w_half

    # Horizontal: corners out (spread) or in (rounded), fading above the lip line towards the nose
    # and below it towards the chin.
    above = np.clip((ys - geo.nose_y) / max(geo.lip_y - geo.nose_y, 1.0), 0.0, 1.0) ** 1.5
    below = np.exp(-(((ys - geo.lip_y) / (0.9 * w_half)) ** 2))
    vert = np.where(ys < geo.lip_y, above, below)
    phi = np.clip(u, -1.0, 1.0) * np.exp(-(np.maximum(np.abs(u) - 1.0, 0.0) ** 2) / 0.6)
    dx = cfg.spread * w_half * width * phi * vert
    # Rounding narrows the opening too.
    narrow = 1.0 - 0.25 * max(-width, 0.0)

    x_src_line = (xs - dx[min(max(int(geo.lip_y) - r0, 0), dx.shape[0] - 1)][None, :])[0]
    upper = _interp_contour(geo.upper, x_src_line)[None, :]
    lower = _interp_contour(geo.lower, x_src_line)[None, :]
    gap = lower - upper
    # Source gap closes for a bilabial; opening parts the lips along an elliptic profile.
    close = closure * gap
    profile = np.sqrt(np.clip(1.0 - (u / narrow) ** 2, 0.0, 1.0))
    jaw = np.exp(-((u / 1.3) ** 4))
    drop = cfg.jaw_drop * w_half * opening
    d_up = cfg.upper_share * drop * profile - 0.5 * close
    d_low_lip = (1.0 - cfg.upper_share) * drop * profile - 0.5 * close
    d_low_jaw = (1.0 - cfg.upper_share) * drop * jaw
    upper_dst = upper - d_up
    lower_dst = lower + d_low_lip

    # Upper region: sample from below (lip moves up), fading to zero at the nose base.
    map_y_up = ys + d_up * above
    # Lower region: lower lip follows the lip profile, chin follows the jaw; fades below the chin.
    t = np.clip((ys - lower_dst) / max(geo.chin_y - geo.lip_y, 1.0), 0.0, 1.0)
    d_low = d_low_lip * (1.0 - t) + d_low_jaw * t
    sigma = 0.5 * w_half
    fade = np.exp(-(np.maximum(ys - geo.chin_y, 0.0) ** 2) / (2 * sigma * sigma))
    map_y_low = ys - d_low * fade
    # Between the new lip edges: stretch the source's own gap (zero for a closed mouth).
    span = np.maximum(lower_dst - upper_dst, 1e-3)
    map_y_mid = upper + (ys - upper_dst) * (gap - close) / span
    map_y = np.where(ys <= upper_dst, map_y_up, np.where(ys >= lower_dst, map_y_low, map_y_mid))
    weight = np.asarray(mask[r0:, c0:c1], dtype=np.float32) / 255.0
    map_y = ys + (map_y - ys) * weight
    map_x = xs - dx * weight
    warped = cv2.remap(
        crop,
        np.ascontiguousarray(map_x, dtype=np.float32),
        np.ascontiguousarray(map_y, dtype=np.float32),
        cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REPLICATE,
    )

    # Mouth interior where the parting is wider than the source's own: dark cavity, upper teeth.
    extra = (lower_dst - upper_dst) - (gap - close)
    strength = np.clip(extra / 3.0, 0.0, 1.0)
    inside = np.clip(ys - upper_dst + 0.5, 0.0, 1.0) * np.clip(lower_dst - ys + 0.5, 0.0, 1.0)
    alpha = (inside * strength)[..., None]
    if float(alpha.max()) > 0.0:
        depth = np.clip((ys - upper_dst) / np.maximum(lower_dst - upper_dst, 1.0), 0.0, 1.0)
        cavity = np.array(cfg.cavity_rgb, dtype=np.float32) * (1.0 - 0.5 * depth)[..., None]
        teeth_h = np.minimum(0.4 * (lower_dst - upper_dst), 0.2 * w_half)
        teeth = np.clip(upper_dst + teeth_h - ys, 0.0, 1.0) * np.clip(1.0 - (np.abs(u) / 0.75) ** 4, 0.0, 1.0)
        teeth = teeth[..., None]
        interior = cavity * (1.0 - teeth) + np.array(cfg.teeth_rgb, dtype=np.float32) * 0.85 * teeth
        warped = (warped.astype(np.float32) * (1.0 - alpha) + interior * alpha + 0.5).astype(np.uint8)
    patch[r0:, c0:c1] = warped
    return patch
