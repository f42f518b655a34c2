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
    teeth_rgb: tuple[int, int, int] = (206, 198, 186)  # drawn only where the source shows no teeth
    cavity_rgb: tuple[int, int, int] = (78, 34, 38)  # at the front; darker towards the throat
    tongue_rgb: tuple[int, int, int] = (98, 44, 48)  # faint: a lip-coloured tongue reads as the lower lip


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
    # Between the new lip edges: the source's own gap (teeth of a parted rest mouth) rides with the upper
    # lip at its own size, as upper teeth do; squeezed when the lips part less than in the source.
    span = np.maximum(lower_dst - upper_dst, 1e-3)
    shown = gap - close
    squeezed = upper + (ys - upper_dst) * shown / span
    riding = upper + np.minimum(ys - upper_dst, shown)
    map_y_mid = np.where(span <= shown, squeezed, riding)
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

    # Mouth interior below the source's own gap: cavity, a tongue at the bottom, and drawn upper teeth
    # only where the source shows none (a closed rest mouth).
    top = upper_dst + shown
    height = lower_dst - top
    strength = np.clip(height / 3.0, 0.0, 1.0)
    inside = np.clip(ys - top + 0.5, 0.0, 1.0) * np.clip(lower_dst - ys + 0.5, 0.0, 1.0)
    alpha = (inside * strength)[..., None]
    if float(alpha.max()) > 0.0:
        depth = np.clip((ys - top) / np.maximum(height, 1.0), 0.0, 1.0)
        side = np.clip(1.0 - 0.35 * u**2, 0.5, 1.0)  # darker towards the corners
        cavity = np.array(cfg.cavity_rgb, dtype=np.float32) * ((1.0 - 0.45 * depth) * side)[..., None]
        tongue = np.clip((depth - 0.55) / 0.3, 0.0, 1.0) * np.clip((height - 4.0) / 6.0, 0.0, 1.0)
        tongue = (tongue * side)[..., None]
        tongue_rgb = np.array(cfg.tongue_rgb, dtype=np.float32) * side[..., None]
        interior = cavity * (1.0 - tongue) + tongue_rgb * tongue
        teeth_h = np.maximum(np.minimum(0.35 * span, 0.18 * w_half) - shown, 0.0)
        teeth = np.clip(top + teeth_h - ys, 0.0, 1.0) * np.clip(1.0 - (np.abs(u) / 0.75) ** 4, 0.0, 1.0)
        teeth = teeth[..., None]
        interior = interior * (1.0 - teeth) + np.array(cfg.teeth_rgb, dtype=np.float32) * teeth
        warped = (warped.astype(np.float32) * (1.0 - alpha) + interior * alpha + 0.5).astype(np.uint8)
    patch[r0:, c0:c1] = warped
    return patch
