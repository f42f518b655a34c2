"""Articulation -> mouth patch: a smooth backward warp of the avatar's own lips and jaw, plus a drawn
mouth interior where the lips part wider than in the source (interior.py). Rows at and above the nose base
never change. The settings are warp_config.WarpConfig; the presenter's teeth colour is sampled in teeth.py."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import cv2
import numpy as np

from lipstream.engines.viseme.articulation import CLOSURE, LABIODENTAL, OPEN, WIDTH
from lipstream.engines.viseme.geometry import MouthGeometry
from lipstream.engines.viseme.interior import draw_interior
from lipstream.engines.viseme.teeth import avatar_teeth_rgb, sample_teeth_rgb
from lipstream.engines.viseme.warp_config import WarpConfig, interp_contour

__all__ = [
    "WarpConfig", "WarpRegion", "avatar_teeth_rgb", "below_chin_fade", "chin_drop", "render_patch",
    "sample_teeth_rgb", "warp_region",
]  # fmt: skip

_interp_contour = interp_contour  # the name tests and the JS parity check use


@dataclass(frozen=True)
class WarpRegion:
    """What one frame's warp needs that no articulation changes: the region that may move (rows under the nose
    base, columns about the mouth) and its row and column profiles; the engine keeps one per shown frame."""

    r0: int  # the region's first row (just under the nose base) and its columns c0:c1
    c0: int
    c1: int
    ys: np.ndarray  # [h, 1] the rows, [1, w] the columns, as float32 pixel positions
    xs: np.ndarray
    u: np.ndarray  # [1, w] columns in mouth half-widths from the centre
    vert: np.ndarray  # [h, 1] how much of the corners' sideways shift each row takes
    phi: np.ndarray  # [1, w] the corners' sideways shift across the columns
    jaw: np.ndarray  # [1, w] the jaw's drop across the columns
    fade: np.ndarray  # [h, 1] below_chin_fade of each row
    upper: tuple[np.ndarray, np.ndarray]  # inner-lip contours as (columns ascending, rows) for np.interp
    lower: tuple[np.ndarray, np.ndarray]
    inner_l: float  # the inner lips' leftmost and rightmost column
    inner_r: float


def warp_region(geo: MouthGeometry, size: int, cfg: WarpConfig) -> WarpRegion | None:
    """The articulation-free part of a frame's warp (None: nothing of the crop can move)."""
    w_half = geo.half_width
    r0 = int(np.floor(geo.nose_y)) + 1
    c0 = max(int(geo.center_x - cfg.roi_half_width * w_half), 0)
    c1 = min(int(geo.center_x + cfg.roi_half_width * w_half) + 1, size)
    if r0 >= size or c1 <= c0:
        return None
    ys = np.arange(r0, size, dtype=np.float32)[:, None]
    xs = np.arange(c0, c1, dtype=np.float32)[None, :]
    u = (xs - geo.center_x) / w_half
    # Horizontal: corners out (spread) or in (rounded), fading above the lip line towards the nose
    # and below it towards the chin.
    above = np.clip((ys - geo.nose_y) / max(geo.lip_y - geo.nose_y, 1.0), 0.0, 1.0) ** 1.5
    below = np.exp(-(((ys - geo.lip_y) / (0.9 * w_half)) ** 2))
    return WarpRegion(
        r0=r0, c0=c0, c1=c1, ys=ys, xs=xs, u=u,
        vert=np.where(ys < geo.lip_y, above, below),
        phi=np.clip(u, -1.0, 1.0) * np.exp(-(np.maximum(np.abs(u) - 1.0, 0.0) ** 2) / 0.6),
        jaw=np.exp(-((u / 1.3) ** 4)),
        fade=below_chin_fade(ys, geo.chin_y, w_half, size),
        upper=_sorted_contour(geo.upper), lower=_sorted_contour(geo.lower),
        inner_l=min(float(geo.upper[:, 0].min()), float(geo.lower[:, 0].min())),
        inner_r=max(float(geo.upper[:, 0].max()), float(geo.lower[:, 0].max())),
    )  # fmt: skip


def _sorted_contour(contour: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A contour's columns ascending and its rows in that order (what np.interp takes)."""
    order = np.argsort(contour[:, 0])
    return contour[order, 0], contour[order, 1]


@functools.lru_cache(maxsize=16)
def _column_map(c0: int, c1: int, rows: int) -> np.ndarray:
    """[rows, c1 - c0] float32: each pixel's own column (the second pass moves rows only); one per region
    shape, shared by the frames (read-only), not made anew for every patch."""
    cols = np.ascontiguousarray(np.broadcast_to(np.arange(c0, c1, dtype=np.float32), (rows, c1 - c0)))
    cols.flags.writeable = False
    return cols


def _unit(value: float) -> float:
    """value clipped to [0, 1] (np.clip costs ~10 µs on a scalar)."""
    return min(max(float(value), 0.0), 1.0)


def render_patch(
    crop: np.ndarray, mask: np.ndarray, geo: MouthGeometry, feature: np.ndarray, cfg: WarpConfig,
    region: WarpRegion | None = None,
) -> np.ndarray:  # fmt: skip
    """One 256² RGB patch for one articulation row (all FEATURE_NAMES); a zero row returns the crop unchanged.

    Displacements are scaled by the frame's mouth mask, so the warp fades out exactly where the
    compositor's blend does and no seam appears at the mask edge. `region`: warp_region(geo, size, cfg),
    when the caller keeps it (computed here otherwise).
    """
    closure = _unit(feature[CLOSURE])
    opening = float(feature[OPEN]) * (1.0 - closure)
    width = float(feature[WIDTH])
    labio = _unit(feature[LABIODENTAL])
    if opening <= 1e-4 and abs(width) <= 1e-4 and closure <= 1e-4 and labio <= 1e-4:
        return crop.copy()
    size = crop.shape[0]
    w_half = geo.half_width
    patch = crop.copy()
    region = region or warp_region(geo, size, cfg)
    if region is None:
        return patch
    r0, c0, c1, ys, xs, u = region.r0, region.c0, region.c1, region.ys, region.xs, region.u
    dx = (cfg.spread if width > 0.0 else cfg.round_in) * w_half * width * region.phi * region.vert
    # Rounding narrows the opening too, and makes it rounder.
    rounding = max(-width, 0.0)
    narrow = 1.0 - cfg.round_narrow * rounding
    taper = cfg.corner_taper * (1.0 - cfg.round_taper * rounding)

    x_src_line = (xs - dx[min(max(int(geo.lip_y) - r0, 0), dx.shape[0] - 1)][None, :])[0]
    upper = np.interp(x_src_line, *region.upper).astype(np.float32)[None, :]
    lower = np.interp(x_src_line, *region.lower).astype(np.float32)[None, :]
    gap = lower - upper
    # Source gap closes for a bilabial; opening parts the lips along a profile that closes at the inner-lip
    # corners (parting out to the outer corners opened a blunt hole in the skin beside the lips).
    close = closure * gap
    inner_l, inner_r = region.inner_l, region.inner_r
    u_inner = (x_src_line[None, :] - 0.5 * (inner_l + inner_r)) / max(0.5 * (inner_r - inner_l), 1.0)
    profile = np.clip(1.0 - (u_inner / narrow) ** 2, 0.0, 1.0) ** taper
    jaw_drop = cfg.jaw_drop * w_half * opening
    lip_part = cfg.lip_part * w_half * opening
    # f/v: the lower lip rises in front of the upper teeth (it covers them, it does not squeeze them).
    tuck = labio * cfg.labiodental_tuck * gap
    close_up = cfg.close_upper_share * close
    d_up = (cfg.upper_share * lip_part + labio * cfg.labiodental_lift * w_half) * profile - close_up
    lower_part = cfg.jaw_lip * jaw_drop + (1.0 - cfg.upper_share) * lip_part
    d_low_lip = lower_part * profile - (close - close_up) - tuck
    d_low_jaw = chin_drop(jaw_drop, geo.chin_y, size, cfg.chin_room) * region.jaw
    upper_dst = upper - d_up
    lower_dst = lower + d_low_lip

    # Which map a pixel takes (upper lip, between the lips, lower lip and jaw) is decided per column by rows,
    # so each map is computed only over the rows where some column can take it (the same values, far fewer).
    span = np.maximum(lower_dst - upper_dst, 1e-3)
    shown = np.minimum(gap - close, cfg.teeth_ride_max * w_half)
    rows = _RowMaps(
        ys, geo, upper, upper_dst, lower_dst, d_up, d_low_lip, d_low_jaw, shown, span + tuck, region
    )
    weight = np.asarray(mask[r0:, c0:c1], dtype=np.float32) / 255.0
    map_x = np.ascontiguousarray(xs - dx * weight, dtype=np.float32)
    warped = cv2.remap(
        crop,
        map_x,
        np.ascontiguousarray(ys + (rows.map_y - ys) * weight, dtype=np.float32),
        cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REPLICATE,
    )
    _antialias_lower_lip(crop, warped, rows, ys, map_x, weight)

    # Mouth interior below the source's own gap, shaded rather than filled (docs/engines.md "drawn mouth").
    top = upper_dst + shown
    draw_interior(warped, ys, u, top, lower_dst, span, shown, w_half, cfg, labio, r0)
    patch[r0:, c0:c1] = warped
    if abs(width) > 1e-4:
        shape_y = _lip_shape_map(ys, u, geo, float(d_up.max()), float(d_low_lip.max()), width, w_half, cfg)
        patch[r0:, c0:c1] = cv2.remap(
            patch,
            _column_map(c0, c1, shape_y.shape[0]),
            np.ascontiguousarray(ys + (shape_y - ys) * weight, dtype=np.float32),
            cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_REPLICATE,
        )
    return patch


class _RowMaps:
    """The warp's source row for every pixel of the region: the upper lip's map at and above its new edge,
    the lower lip's and jaw's once the lower lip covers the pixel, the source's own gap riding in between.
    Each map is computed only over the rows where some column can take it (per pixel the same values as over
    the whole region: far fewer of them, and the upper lip's power only over its few rows)."""

    def __init__(
        self, ys: np.ndarray, geo: MouthGeometry, upper: np.ndarray, upper_dst: np.ndarray,
        lower_dst: np.ndarray, d_up: np.ndarray, d_low_lip: np.ndarray, d_low_jaw: np.ndarray,
        shown: np.ndarray, span_untucked: np.ndarray, region: WarpRegion,
    ) -> None:  # fmt: skip
        h = ys.shape[0]
        first = float(ys[0, 0])
        lo, hi = float(lower_dst.min()), float(lower_dst.max())

        def rows_upto(v: float) -> int:
            """How many rows lie at or above row v."""
            return min(max(math.floor(v - first) + 1, 0), h)

        self.ys, self.upper_dst = ys, upper_dst
        # rows from n_up lie under every column's new upper lip edge, rows before m0 over every one's (a row
        # of margin each way: a map is then computed on a row that does not need it, never missing one)
        self.n_up = min(rows_upto(float(upper_dst.max())) + 1, h)
        self.m0 = max(rows_upto(float(upper_dst.min())) - 1, 0)
        # the lower lip covers no pixel of the rows before k0 and every pixel of the rows from k1 (2 px from
        # its edge either way, so float rounding of the cover cannot put a pixel on the other side)
        self.k0 = rows_upto(lo - 2.0)
        self.k1 = max(rows_upto(hi + 2.0), self.k0)
        # Upper region: sample from below (lip moves up), fading to zero at the nose base; the full shift is
        # reached at the new lip edge itself, so the map has no step there (a step drew a jagged line).
        y_up = ys[: self.n_up]
        above_lip = np.clip((y_up - geo.nose_y) / np.maximum(upper_dst - geo.nose_y, 1.0), 0.0, 1.0) ** 1.5
        self.up = y_up + d_up * above_lip
        # Lower region: lower lip follows the lip profile, chin follows the jaw; fades below the chin.
        y_low = ys[self.k0 :]
        t = np.clip((y_low - lower_dst) / max(geo.chin_y - geo.lip_y, 1.0), 0.0, 1.0)
        d_low = d_low_lip * (1.0 - t) + d_low_jaw * t
        low = y_low - d_low * region.fade[self.k0 :]
        # Between the new lip edges: the source's own gap (teeth of a parted rest mouth) rides with the upper
        # lip at its own size, as upper teeth do; squeezed when the lips part less than in the source.
        y_mid = ys[self.m0 : self.k1]
        squeezed = upper + (y_mid - upper_dst) * shown / span_untucked
        riding = upper + np.minimum(y_mid - upper_dst, shown)
        self.mid = np.where(span_untucked <= shown, squeezed, riding)
        # The lower lip's edge is anti-aliased: rows within half a pixel of it mix the lip with what lies
        # above it (a tucked lip cuts across the teeth, and a hard cut there showed stair steps).
        self.cover = np.clip(ys[self.k0 : self.k1] - lower_dst + 0.5, 0.0, 1.0)  # 0 above k0, 1 from k1
        self.map_y = self._assemble(low)

    def _assemble(self, low: np.ndarray) -> np.ndarray:
        """Upper lip's map where the row is at or above its new edge, else the lower lip's where it covers the
        pixel, else the gap's."""
        n_up, m0, k0, k1 = self.n_up, self.m0, self.k0, self.k1
        map_y = np.empty((self.ys.shape[0], self.upper_dst.shape[1]), dtype=np.float32)
        map_y[k0:] = low
        if m0 < k0:
            map_y[m0:k0] = self.mid[: k0 - m0]
        s = max(m0, k0)
        if s < k1:
            np.copyto(map_y[s:k1], self.mid[s - m0 :], where=self.cover[s - k0 :] <= 0.0)
        np.copyto(map_y[:n_up], self.up, where=self.ys[:n_up] <= self.upper_dst)
        return map_y

    def band(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows and columns of the pixels on the lower lip's anti-aliased edge (0 < cover < 1)."""
        ri, cj = np.nonzero((self.cover > 0.0) & (self.cover < 1.0))
        return ri + self.k0, cj

    def cover_at(self, ri: np.ndarray, cj: np.ndarray) -> np.ndarray:
        """The lower lip's cover of band pixels."""
        return self.cover[ri - self.k0, cj]

    def above_at(self, ri: np.ndarray, cj: np.ndarray) -> np.ndarray:
        """The map without the lower lip (what lies above its edge) at band pixels: upper lip's or gap's."""
        out = np.empty(ri.shape, dtype=np.float32)
        up = self.ys[ri, 0] <= self.upper_dst[0, cj]
        out[up] = self.up[ri[up], cj[up]]
        out[~up] = self.mid[ri[~up] - self.m0, cj[~up]]
        return out


def _antialias_lower_lip(
    crop: np.ndarray, warped: np.ndarray, rows: _RowMaps, ys: np.ndarray, map_x: np.ndarray,
    weight: np.ndarray,
) -> None:  # fmt: skip
    """Mix, on the pixels of the lower lip's edge (one a column), the lip with what the map shows above it."""
    ri, cj = rows.band()
    if not ri.size:
        return
    y = ys[ri, 0]
    w = weight[ri, cj]
    above_px = cv2.remap(
        crop,
        np.ascontiguousarray(map_x[ri, cj][None, :]),
        np.ascontiguousarray((y + (rows.above_at(ri, cj) - y) * w)[None, :], dtype=np.float32),
        cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REPLICATE,
    )[0]
    c = rows.cover_at(ri, cj)
    # channels first, so numpy's inner loops run over the pixels, not over 3 channels
    mixed = warped[ri, cj].T.astype(np.float32) * c + above_px.T.astype(np.float32) * (1.0 - c) + 0.5
    warped[ri, cj] = mixed.T.astype(np.uint8)


def _lip_shape_map(
    ys: np.ndarray, u: np.ndarray, geo: MouthGeometry, up: float, down: float, width: float, w_half: float,
    cfg: WarpConfig,
) -> np.ndarray:
    """Source row per output pixel of the drawn mouth's second pass: spread raises the corners and thins
    the lips, rounding makes them fuller (a vertical scale about the mouth's centre, fading off the lips)."""
    spread, rounding = max(width, 0.0), max(-width, 0.0)
    top, bottom = geo.upper_outer_y - up, geo.lower_outer_y + down  # the lips' outer edges, opened
    cy = 0.5 * (top + bottom)
    sy = max(0.5 * (bottom - top), 2.0) * 1.25
    env = np.exp(-(((ys - cy) / sy) ** 2)) * np.exp(-((u / 1.15) ** 4))
    scale = cfg.spread_thin * spread - cfg.round_full * rounding  # > 0 samples farther out: thinner
    # the corners rise along a smile's curve: nothing at the centre, most at the corners, fading past them
    corner = np.minimum(u * u, 1.0) * np.exp(-(np.maximum(np.abs(u) - 1.0, 0.0) ** 2) / 0.6)
    lift = cfg.spread_lift * w_half * spread * corner * np.exp(-(((ys - cy) / (1.5 * sy)) ** 2))
    return ys + scale * (ys - cy) * env + lift


def chin_drop(drop: float, chin_y: float, size: int, room: float) -> float:
    """The chin's drop in pixels: `drop` eased so it stays within `room` of the rows under the chin (a tanh
    knee: a drop up to about half the room is nearly kept, 1 - exp gave only 0.63 of it at the room)."""
    limit = room * (size - 1 - chin_y)
    if limit <= 0.0:
        return 0.0
    return float(limit * np.tanh(drop / limit))


def below_chin_fade(ys: np.ndarray, chin_y: float, w_half: float, size: int) -> np.ndarray:
    """Share of the jaw's drop kept on each row: 1 down to the chin, then fading to 0 at the crop's last row
    (rows under the chin are compressed there, so the patch meets the frame without a step)."""
    sigma = 0.5 * w_half
    under = np.maximum(ys - chin_y, 0.0)
    ramp = np.clip((size - 1 - ys) / max(size - 1 - chin_y, 1.0), 0.0, 1.0)
    return np.exp(-(under**2) / (2 * sigma * sigma)) * np.where(ys > chin_y, ramp, 1.0)
