"""Articulation -> mouth patch: a smooth backward warp of the avatar's own lips and jaw, plus a drawn
mouth interior where the lips part wider than in the source. Rows at and above the nose base never change."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

from lipstream.engines.viseme.articulation import CLOSURE, LABIODENTAL, OPEN, WIDTH
from lipstream.engines.viseme.geometry import MouthGeometry


@dataclass(frozen=True)
class WarpConfig:
    """Motion ranges relative to the mouth half-width W (corner to corner / 2)."""

    # The opening is mostly the jaw rotating down (chin, lower lip and lower teeth together), plus a smaller
    # parting of the lips themselves; the calibration maps commands onto the speech range of this motion.
    jaw_drop: float = 0.5  # the chin's drop at open=1, in W
    jaw_lip: float = 0.85  # the lower lip rides this share of it (it is nearer the jaw's hinge)
    lip_part: float = 0.16  # the lips' own parting on top of the jaw at open=1, in W
    upper_share: float = 0.4  # part of the lips' own parting taken by the upper lip
    close_upper_share: float = 0.8  # part of a closure taken by the upper lip: it comes down over the teeth
    # it bared and meets the lower lip near its own edge (halfway, the lower lip rose as far, the jaw still)
    chin_room: float = 0.85  # the chin drops at most this share of the rows left under it in the crop (the
    # skin there is compressed, and the crop's bottom edge never moves: a larger drop would fold it)
    spread: float = 0.28  # corner shift outwards at width=+1 (ee/i), in W
    round_in: float = 0.25  # corner shift inwards at width=-1 (oo/w), in W: the mouth ~20 % narrower
    spread_lift: float = 0.07  # spread also raises the corners this much (in W) ...
    spread_thin: float = 0.12  # ... and stretches the lips thinner: vertical scale 1 - this about the mouth
    round_full: float = 0.12  # rounding protrudes the lips: vertical scale 1 + this about the mouth centre
    roi_half_width: float = 2.6  # warped region half-width, in W
    corner_taper: float = 0.7  # parting profile (1 - u²)^taper: 0.5 is an ellipse with blunt corners
    round_narrow: float = 0.35  # rounding (width -1) narrows the opening by this share ...
    round_taper: float = 0.1  # ... and makes it this much rounder (a lower taper; more gives vertical sides)
    labiodental_tuck: float = 0.6  # f/v: the lower lip rises over this share of the source's gap ...
    labiodental_lift: float = 0.04  # ... and the upper lip lifts this much (in W), baring the upper teeth
    teeth_ride_max: float = 0.32  # in W: the most of the source's lip gap that rides with the upper lip (its
    # upper teeth); below that, an open source mouth's own interior is drawn over (it showed two mouths)
    edge_px: float = 1.5  # anti-aliased ramp of the inner-lip edges, in crop pixels
    teeth_rgb: tuple[int, int, int] = (224, 214, 198)  # drawn only where the source shows no teeth
    # drawn teeth (upper and lower) take the colour of the presenter's own where the footage shows them
    # (`with_own_teeth`): a fixed white glows on a dim or warm-lit face; these two are for footage that shows
    # none
    sample_teeth: bool = True
    teeth_min_px: int = 24  # fewer bright, unsaturated pixels than this between the lips: no teeth shown
    upper_teeth_pitch: float = 0.2  # one drawn upper incisor's width, in W
    cavity_rgb: tuple[int, int, int] = (104, 40, 44)  # the lit front of the mouth walls
    throat_rgb: tuple[int, int, int] = (24, 8, 10)  # deep inside, under the upper teeth and at the corners
    tongue_rgb: tuple[int, int, int] = (134, 62, 66)  # lit top of the tongue; shaded darker at its sides
    lower_teeth_rgb: tuple[int, int, int] = (240, 220, 196)  # warm: grey beside red reads teal (4:2:0)
    lower_teeth_height: float = 0.1  # in W over the rim, at full growth (at most lower_teeth_share of the
    lower_teeth_share: float = 0.3  # opening's height: the lower lip hides the rest of them)
    lower_teeth_pitch: float = 0.2  # one lower incisor's width, in W
    lower_teeth_shade: float = 1.0  # their brightness at the tips (darker ones read grey-teal beside red)
    lower_teeth_seam: float = 0.08  # depth of the seam between two (deeper, a short row reads as dots)
    rim_px: float = 1.2  # the lower lip's inner, wet side rolls into the opening over this many pixels
    rim_shade: float = 0.5  # ... darker than the lip's outer face, in its own colour

    def with_own_teeth(self, rgb: np.ndarray | None) -> WarpConfig:
        """This config drawing teeth (upper and lower) in `rgb`, the presenter's own; unchanged for None."""
        if rgb is None:
            return self
        own = tuple(int(round(float(v))) for v in rgb)
        return dataclasses.replace(self, teeth_rgb=own, lower_teeth_rgb=own)


def _interp_contour(contour: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Contour row at columns xs (clamped at the corners)."""
    return np.interp(xs, *_sorted_contour(contour)).astype(np.float32)


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
    _draw_interior(warped, ys, u, top, lower_dst, span, shown, w_half, cfg, labio, r0)
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


def _draw_interior(
    warped: np.ndarray, ys: np.ndarray, u: np.ndarray, top: np.ndarray, bottom: np.ndarray, span: np.ndarray,
    shown: np.ndarray, w_half: float, cfg: WarpConfig, labio: float, r0: int,
) -> None:  # fmt: skip
    """Shade the mouth opening into `warped`, only on the pixels it covers (elsewhere alpha is 0 and the blend
    would give the warped pixel back unchanged): ~750 of the region's ~25 000 on the sample avatar."""
    h = ys.shape[0]
    first = float(ys[0, 0])
    # alpha is 0 in the columns where the lips do not part, and more than edge_px / 2 outside the opening's
    # rows (one more row of margin against rounding)
    parted = np.flatnonzero(bottom[0] > top[0])
    if not parted.size:
        return
    ca, cb = int(parted[0]), int(parted[-1]) + 1
    top_in, bottom_in = top[:, ca:cb], bottom[:, ca:cb]
    a = min(max(math.floor(float(top_in.min()) - 0.5 * cfg.edge_px - 1.0 - first), 0), h)
    b = min(max(math.ceil(float(bottom_in.max()) + 0.5 * cfg.edge_px + 1.0 - first) + 1, a), h)
    alpha = _interior_alpha(ys[a:b], top_in, bottom_in, cfg.edge_px)[..., 0]
    ri, cj = np.nonzero(alpha > 0.0)
    if not ri.size:
        return
    a_px = alpha[ri, cj]
    cols = slice(ca, cb)
    # the lower lip's own colour just under the opening, per column: its inner side rolls into the mouth
    lip_rows = np.minimum(np.maximum((bottom[0, cols] + 2.5).astype(np.int32) - r0, 0), h - 1)
    lip = warped[lip_rows, np.arange(ca, cb)].T.astype(np.float32)
    interior = _shade_interior(
        ys[ri + a, 0], cj, u[0, cols], top[0, cols], bottom[0, cols], span[0, cols], shown[0, cols], lip,
        w_half, cfg, full=float((bottom - top).max()), floor=float(bottom.max()), labio=labio,
    )  # fmt: skip
    ri, cj = ri + a, cj + ca
    blend = warped[ri, cj].T.astype(np.float32) * (1.0 - a_px) + interior * a_px + 0.5
    warped[ri, cj] = blend.T.astype(np.uint8)


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
    """The chin's drop in pixels: `drop` eased so it stays within `room` of the rows under the chin."""
    limit = room * (size - 1 - chin_y)
    if limit <= 0.0:
        return 0.0
    return float(limit * (1.0 - np.exp(-drop / limit)))


def below_chin_fade(ys: np.ndarray, chin_y: float, w_half: float, size: int) -> np.ndarray:
    """Share of the jaw's drop kept on each row: 1 down to the chin, then fading to 0 at the crop's last row
    (rows under the chin are compressed there, so the patch meets the frame without a step)."""
    sigma = 0.5 * w_half
    under = np.maximum(ys - chin_y, 0.0)
    ramp = np.clip((size - 1 - ys) / max(size - 1 - chin_y, 1.0), 0.0, 1.0)
    return np.exp(-(under**2) / (2 * sigma * sigma)) * np.where(ys > chin_y, ramp, 1.0)


def _interior_alpha(ys: np.ndarray, top: np.ndarray, bottom: np.ndarray, edge_px: float) -> np.ndarray:
    """Coverage of the mouth opening with anti-aliased inner-lip edges; faint while it is a sliver."""
    height = bottom - top
    strength = np.clip(height / 3.0, 0.0, 1.0)
    inside = np.clip((ys - top) / edge_px + 0.5, 0.0, 1.0) * np.clip((bottom - ys) / edge_px + 0.5, 0.0, 1.0)
    return (inside * strength)[..., None]


def _shade_interior(
    ys: np.ndarray,
    col: np.ndarray,
    u: np.ndarray,
    top: np.ndarray,
    bottom: np.ndarray,
    span: np.ndarray,
    shown: np.ndarray,
    lip: np.ndarray,
    w_half: float,
    cfg: WarpConfig,
    full: float,
    floor: float,
    labio: float = 0.0,
) -> np.ndarray:
    """RGB [3, n] of the opened mouth at n pixels (channels first: numpy's inner loops then run over the
    pixels, not over 3 channels): walls lit from the front, dark throat and corners, tongue, the lower lip's
    inner rim, lower teeth. `ys`: each pixel's row, `col`: its index into the per-column arrays (u, top,
    bottom, span, shown; `lip` [3, cols]: the lower lip's colour under the column), so what
    depends on the column alone is computed once a column; `full`: the opening at its tallest (tongue and
    lower teeth grow with it); `floor`: its lowest row; `labio`: the f/v cue (the lower lip then hides the
    lower teeth)."""
    height = bottom - top
    side = np.clip(1.0 - 0.6 * u * u, 0.25, 1.0)  # the corners are in the cheeks' shadow
    top_px, bottom_px = top[col], bottom[col]
    # Light enters over the lower lip: the lower part of the opening is lit, under the upper teeth it is dark.
    lit = np.exp(-(bottom_px - ys) / (0.5 * np.maximum(height, 1.0) + 1.5)[col]) * side[col]
    # The throat too is darkest towards the corners (a smooth falloff seen in filmed mouths, not a flat fill).
    depth = 0.55 + 0.45 * side
    throat = (_channels(cfg.throat_rgb) * depth)[:, col]
    front = _channels(cfg.cavity_rgb)
    rgb = throat + (front - throat) * lit
    # The tongue: a low dome on the floor of the mouth, centred, once the opening is a few pixels tall; its
    # top is level (it does not follow the lip's curve), so the corners show only cavity. A rounded surface:
    # its top edge fades in over a few pixels, darker at its back and where it curves down at its sides.
    grow = _unit((full - 5.0) / 8.0)
    if grow > 0.0:
        dome = np.clip(1.0 - (u / 0.7) ** 2, 0.0, 1.0)
        t_top = floor - 0.5 * full * grow * dome
        t_top_px = t_top[col]
        soft = 0.12 * full + 1.5
        cover = np.clip((ys - t_top_px) / soft, 0.0, 1.0) * np.clip(bottom - t_top, 0.0, 1.0)[col]
        # its back, at the top, recedes into the throat; its front, towards the lower teeth, is lit
        sheen = 0.6 + 0.4 * np.clip((ys - t_top_px) / np.maximum(bottom - t_top, 1.0)[col], 0.0, 1.0)
        shade = sheen * (0.55 + 0.45 * np.sqrt(dome))[col]
        tongue = _channels(cfg.tongue_rgb) * shade
        rgb = rgb * (1.0 - cover) + tongue * cover
        # Lower incisors stand behind the lower lip's rim, in the upper lip's shadow; only the front ones
        # show, lighter at their tips.
        lt_height = min(cfg.lower_teeth_height * w_half, cfg.lower_teeth_share * full) * grow * (1.0 - labio)
        lt_top = bottom - cfg.rim_px - lt_height
        lt_cols = np.exp(-((u / 0.42) ** 4))  # the front four show; the rest fade behind the lip's curve
        # One tooth per pitch, the central pair meeting at the midline: rounded tips (a tooth's top drops
        # towards its sides), a shallow seam between neighbours, a soft top edge; darker towards the corners
        # and deeper down (in the lower lip's shadow), so they read as teeth, not as a dotted line.
        d = _tooth_phase(u, cfg.lower_teeth_pitch)
        tip = lt_top + 0.2 * lt_height * (2.0 * d) ** 4
        lt_cols = lt_cols * _seam_shade(d, cfg.lower_teeth_seam)
        # a row under ~2 px tall reads as a line along the lip, not as teeth: the lip hides it instead
        seen = _unit((lt_height - 1.5) / 2.0)
        lt_cover = np.clip((ys - tip[col]) / 1.8, 0.0, 1.0) * lt_cols[col] * seen
        down = np.clip((ys - lt_top[col]) / (lt_height + cfg.rim_px), 0, 1)
        shade = cfg.lower_teeth_shade * (1.0 - 0.2 * down) * (0.85 + 0.15 * side)[col]
        lt_rgb = _channels(cfg.lower_teeth_rgb) * shade
        rgb = rgb * (1.0 - lt_cover) + lt_rgb * lt_cover
    # The lower lip's inner side, in its own colour and darker, between the opening and the lip's edge.
    rim = np.exp(-np.maximum(bottom_px - ys, 0.0) / cfg.rim_px) * np.clip(height / 4.0, 0.0, 1.0)[col]
    rgb = rgb * (1.0 - rim) + lip[:, col] * cfg.rim_shade * rim
    # Upper teeth drawn only where the source shows none (a closed rest mouth): one per pitch with rounded
    # biting corners and soft seams, in the upper lip's shadow at the top and darker towards the corners.
    # On f/v they reach down to the lower lip, which rests against them.
    teeth_h = np.maximum(np.maximum(np.minimum(0.35 * span, 0.18 * w_half), labio * span) - shown, 0.0)
    d = _tooth_phase(u, cfg.upper_teeth_pitch)
    edge = top + teeth_h * (1.0 - 0.3 * (2.0 * d) ** 4)
    teeth = np.clip(edge[col] - ys, 0.0, 1.0) * np.clip(1.0 - (np.abs(u) / 0.75) ** 4, 0.0, 1.0)[col]
    shade = ((0.7 + 0.3 * side) * _seam_shade(d))[col] * (
        0.82 + 0.18 * np.clip((ys - top_px) / np.maximum(teeth_h, 1.0)[col], 0.0, 1.0)
    )
    return rgb * (1.0 - teeth) + _channels(cfg.teeth_rgb) * shade * teeth


def _channels(rgb: tuple[int, int, int]) -> np.ndarray:
    """A colour as a float32 column [3, 1], to scale rows of pixels channel by channel."""
    return np.array(rgb, dtype=np.float32)[:, None]


LUMA = np.array([0.299, 0.587, 0.114])


def sample_teeth_rgb(crop: np.ndarray, geo: MouthGeometry, cfg: WarpConfig) -> np.ndarray | None:
    """The presenter's teeth colour on one frame: median RGB of the bright, unsaturated pixels between the
    source's inner lips over the mouth's central half; None where it shows too few, or none brighter than
    the face (a closed mouth, or an open one showing only its dark inside)."""
    x0 = max(int(geo.center_x - 0.5 * geo.half_width), 0)
    x1 = min(int(geo.center_x + 0.5 * geo.half_width), crop.shape[1] - 1)
    if x1 <= x0:
        return None
    xs = np.arange(x0, x1 + 1, dtype=np.float32)
    upper = _interp_contour(geo.upper, xs)[None, :]
    lower = _interp_contour(geo.lower, xs)[None, :]
    r0 = max(int(np.ceil(upper.min() + 1.0)), 0)
    r1 = min(int(np.floor(lower.max() - 1.0)), crop.shape[0] - 1)
    if r1 < r0:
        return None
    ys = np.arange(r0, r1 + 1, dtype=np.float32)[:, None]
    inside = (ys >= upper + 1.0) & (ys <= lower - 1.0)  # a pixel off the inner-lip line: not the lip itself
    px = crop[r0 : r1 + 1, x0 : x1 + 1][inside].astype(np.float32)
    if len(px) < cfg.teeth_min_px:
        return None
    lum = px @ LUMA
    brightest = px.max(axis=1)
    saturation = (brightest - px.min(axis=1)) / np.maximum(brightest, 1.0)
    keep = (saturation < 0.5) & (lum >= np.percentile(lum, 50))  # loose: warm light tints teeth too
    if int(keep.sum()) < cfg.teeth_min_px:
        return None
    teeth = np.median(px[keep], axis=0)
    face = float(np.median(crop[::8, ::8].reshape(-1, 3).astype(np.float32) @ LUMA))  # a sparse grid: cheap
    return teeth if float(teeth @ LUMA) >= face else None


def avatar_teeth_rgb(
    crop_at: Callable[[int], np.ndarray], geometry: np.ndarray, candidates: np.ndarray, cfg: WarpConfig,
    frames: int = 16,
) -> np.ndarray | None:
    """The presenter's teeth colour: the median of `sample_teeth_rgb` over up to `frames` of the `candidates`
    frame ids, spread over them (one colour per avatar, so drawn teeth do not change colour with the source
    frame); None unless at least 3 of them (or all, when fewer) show teeth."""
    candidates = np.asarray(candidates).reshape(-1)
    if candidates.size == 0:
        return None
    picks = np.unique(np.linspace(0, candidates.size - 1, min(frames, candidates.size)).round().astype(int))
    ids = candidates[picks]
    found = [
        rgb for fid in ids
        if (rgb := sample_teeth_rgb(crop_at(int(fid)), MouthGeometry.unpack(geometry[fid]), cfg)) is not None
    ]  # fmt: skip
    return np.median(np.stack(found), axis=0) if len(found) >= min(3, len(ids)) else None


def _tooth_phase(u: np.ndarray, pitch: float) -> np.ndarray:
    """0 in the middle of a tooth, 0.5 at the seam between two (the central pair meets at the midline)."""
    return np.abs(np.mod(u / pitch, 1.0) - 0.5)


def _seam_shade(phase: np.ndarray, depth: float = 0.3) -> np.ndarray:
    """Brightness across a tooth row: 1 on a tooth, a soft dark seam between two (phase from _tooth_phase)."""
    return 1.0 - depth * np.exp(-(((0.5 - phase) / 0.07) ** 2))
