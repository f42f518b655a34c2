"""Articulation -> mouth patch: a smooth backward warp of the avatar's own lips and jaw, plus a drawn
mouth interior where the lips part wider than in the source. Rows at and above the nose base never change."""

from __future__ import annotations

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


def _interp_contour(contour: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Contour row at columns xs (clamped at the corners)."""
    order = np.argsort(contour[:, 0])
    return np.interp(xs, contour[order, 0], contour[order, 1]).astype(np.float32)


def render_patch(
    crop: np.ndarray, mask: np.ndarray, geo: MouthGeometry, feature: np.ndarray, cfg: WarpConfig
) -> np.ndarray:
    """One 256² RGB patch for one articulation row (all FEATURE_NAMES); a zero row returns the crop unchanged.

    Displacements are scaled by the frame's mouth mask, so the warp fades out exactly where the
    compositor's blend does and no seam appears at the mask edge.
    """
    opening = float(feature[OPEN]) * (1.0 - float(np.clip(feature[CLOSURE], 0.0, 1.0)))
    width = float(feature[WIDTH])
    closure = float(np.clip(feature[CLOSURE], 0.0, 1.0))
    labio = float(np.clip(feature[LABIODENTAL], 0.0, 1.0))
    if opening <= 1e-4 and abs(width) <= 1e-4 and closure <= 1e-4 and labio <= 1e-4:
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
    dx = (cfg.spread if width > 0.0 else cfg.round_in) * w_half * width * phi * vert
    # Rounding narrows the opening too, and makes it rounder.
    rounding = max(-width, 0.0)
    narrow = 1.0 - cfg.round_narrow * rounding
    taper = cfg.corner_taper * (1.0 - cfg.round_taper * rounding)

    x_src_line = (xs - dx[min(max(int(geo.lip_y) - r0, 0), dx.shape[0] - 1)][None, :])[0]
    upper = _interp_contour(geo.upper, x_src_line)[None, :]
    lower = _interp_contour(geo.lower, x_src_line)[None, :]
    gap = lower - upper
    # Source gap closes for a bilabial; opening parts the lips along a profile that closes at the inner-lip
    # corners (parting out to the outer corners opened a blunt hole in the skin beside the lips).
    close = closure * gap
    inner_l = min(float(geo.upper[:, 0].min()), float(geo.lower[:, 0].min()))
    inner_r = max(float(geo.upper[:, 0].max()), float(geo.lower[:, 0].max()))
    u_inner = (x_src_line[None, :] - 0.5 * (inner_l + inner_r)) / max(0.5 * (inner_r - inner_l), 1.0)
    profile = np.clip(1.0 - (u_inner / narrow) ** 2, 0.0, 1.0) ** taper
    jaw = np.exp(-((u / 1.3) ** 4))
    jaw_drop = cfg.jaw_drop * w_half * opening
    lip_part = cfg.lip_part * w_half * opening
    # f/v: the lower lip rises in front of the upper teeth (it covers them, it does not squeeze them).
    tuck = labio * cfg.labiodental_tuck * gap
    d_up = (cfg.upper_share * lip_part + labio * cfg.labiodental_lift * w_half) * profile - 0.5 * close
    d_low_lip = (cfg.jaw_lip * jaw_drop + (1.0 - cfg.upper_share) * lip_part) * profile - 0.5 * close - tuck
    d_low_jaw = chin_drop(jaw_drop, geo.chin_y, size, cfg.chin_room) * jaw
    upper_dst = upper - d_up
    lower_dst = lower + d_low_lip

    # Upper region: sample from below (lip moves up), fading to zero at the nose base; the full shift is
    # reached at the new lip edge itself, so the map has no step there (a step drew a jagged line).
    above_lip = np.clip((ys - geo.nose_y) / np.maximum(upper_dst - geo.nose_y, 1.0), 0.0, 1.0) ** 1.5
    map_y_up = ys + d_up * above_lip
    # Lower region: lower lip follows the lip profile, chin follows the jaw; fades below the chin.
    t = np.clip((ys - lower_dst) / max(geo.chin_y - geo.lip_y, 1.0), 0.0, 1.0)
    d_low = d_low_lip * (1.0 - t) + d_low_jaw * t
    fade = below_chin_fade(ys, geo.chin_y, w_half, size)
    map_y_low = ys - d_low * fade
    # Between the new lip edges: the source's own gap (teeth of a parted rest mouth) rides with the upper
    # lip at its own size, as upper teeth do; squeezed when the lips part less than in the source.
    span = np.maximum(lower_dst - upper_dst, 1e-3)
    shown = np.minimum(gap - close, cfg.teeth_ride_max * w_half)
    span_untucked = span + tuck
    squeezed = upper + (ys - upper_dst) * shown / span_untucked
    riding = upper + np.minimum(ys - upper_dst, shown)
    map_y_mid = np.where(span_untucked <= shown, squeezed, riding)
    # The lower lip's edge is anti-aliased: rows within half a pixel of it mix the lip with what lies above
    # it (a tucked lip cuts across the teeth, and a hard cut there showed stair steps).
    lip_cover = np.clip(ys - lower_dst + 0.5, 0.0, 1.0)
    map_y_above = np.where(ys <= upper_dst, map_y_up, map_y_mid)
    map_y = np.where(lip_cover > 0.0, np.where(ys <= upper_dst, map_y_up, map_y_low), map_y_above)
    weight = np.asarray(mask[r0:, c0:c1], dtype=np.float32) / 255.0
    map_x = np.ascontiguousarray(xs - dx * weight, dtype=np.float32)
    warped = cv2.remap(
        crop,
        map_x,
        np.ascontiguousarray(ys + (map_y - ys) * weight, dtype=np.float32),
        cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REPLICATE,
    )
    band = (lip_cover > 0.0) & (lip_cover < 1.0)
    band_rows = np.flatnonzero(band.any(axis=1))
    if band_rows.size:
        ra, rb = band_rows[0], band_rows[-1] + 1
        above_px = cv2.remap(
            crop,
            map_x[ra:rb],
            np.ascontiguousarray((ys + (map_y_above - ys) * weight)[ra:rb], dtype=np.float32),
            cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_REPLICATE,
        )
        c = lip_cover[ra:rb, :, None]
        mixed = (warped[ra:rb].astype(np.float32) * c + above_px.astype(np.float32) * (1.0 - c) + 0.5)
        warped[ra:rb] = np.where(band[ra:rb, :, None], mixed.astype(np.uint8), warped[ra:rb])

    # Mouth interior below the source's own gap, shaded rather than filled (docs/engines.md "drawn mouth").
    top = upper_dst + shown
    alpha = _interior_alpha(ys, top, lower_dst, cfg.edge_px)
    covered = alpha[..., 0] > 0.0
    rows, cols = np.flatnonzero(covered.any(axis=1)), np.flatnonzero(covered.any(axis=0))
    if rows.size:
        # shaded only over the opening's bounding box (a fifth of the region at most): elsewhere alpha is 0
        # and the blend would give the warped pixel back unchanged
        ra, rb, ca, cb = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
        sub = (slice(ra, rb), slice(ca, cb))
        cut = slice(ca, cb)  # top, lower_dst, span, shown and u are one row over the columns
        # the lower lip's own colour just under the opening, per column: its inner side rolls into the mouth
        lip_rows = np.clip((lower_dst + 2.5).astype(np.int32) - r0, 0, warped.shape[0] - 1)
        lip = np.take_along_axis(warped[:, cut], lip_rows[:, cut, None], axis=0).astype(np.float32)
        interior = _shade_interior(
            ys[ra:rb], u[:, cut], top[:, cut], lower_dst[:, cut], span[:, cut], shown[:, cut], lip,
            w_half, cfg, full=float((lower_dst - top).max()), floor=float(lower_dst.max()), labio=labio,
        )
        a = alpha[sub]
        warped[sub] = (warped[sub].astype(np.float32) * (1.0 - a) + interior * a + 0.5).astype(np.uint8)
    patch[r0:, c0:c1] = warped
    if abs(width) > 1e-4:
        shape_y = _lip_shape_map(ys, u, geo, float(d_up.max()), float(d_low_lip.max()), width, w_half, cfg)
        patch[r0:, c0:c1] = cv2.remap(
            patch,
            np.ascontiguousarray(np.broadcast_to(xs, shape_y.shape), dtype=np.float32),
            np.ascontiguousarray(ys + (shape_y - ys) * weight, dtype=np.float32),
            cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_REPLICATE,
        )
    return patch


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
    """RGB of the opened mouth: walls lit from the front, dark throat and corners, tongue, the lower lip's
    inner rim, lower teeth. `lip`: [1, cols, 3] the lower lip's colour under each column; `full`: the
    opening at its tallest (tongue and lower teeth grow with it); `floor`: its lowest row; `labio`: the f/v
    cue (the lower lip then hides the lower teeth)."""
    height = bottom - top
    side = np.clip(1.0 - 0.6 * u * u, 0.25, 1.0)  # the corners are in the cheeks' shadow
    # Light enters over the lower lip: the lower part of the opening is lit, under the upper teeth it is dark.
    lit = np.exp(-(bottom - ys) / (0.5 * np.maximum(height, 1.0) + 1.5)) * side
    # The throat too is darkest towards the corners (a smooth falloff seen in filmed mouths, not a flat fill).
    depth = (0.55 + 0.45 * side)[..., None]
    throat = np.array(cfg.throat_rgb, dtype=np.float32) * depth
    front = np.array(cfg.cavity_rgb, dtype=np.float32)
    rgb = throat + (front - throat) * lit[..., None]
    # The tongue: a low dome on the floor of the mouth, centred, once the opening is a few pixels tall; its
    # top is level (it does not follow the lip's curve), so the corners show only cavity. A rounded surface:
    # its top edge fades in over a few pixels, darker at its back and where it curves down at its sides.
    grow = float(np.clip((full - 5.0) / 8.0, 0.0, 1.0))
    if grow > 0.0:
        dome = np.clip(1.0 - (u / 0.7) ** 2, 0.0, 1.0)
        t_top = floor - 0.5 * full * grow * dome
        soft = 0.12 * full + 1.5
        cover = np.clip((ys - t_top) / soft, 0.0, 1.0) * np.clip(bottom - t_top, 0.0, 1.0)
        # its back, at the top, recedes into the throat; its front, towards the lower teeth, is lit
        sheen = 0.6 + 0.4 * np.clip((ys - t_top) / np.maximum(bottom - t_top, 1.0), 0.0, 1.0)
        shade = sheen * (0.55 + 0.45 * np.sqrt(dome))
        tongue = np.array(cfg.tongue_rgb, dtype=np.float32) * shade[..., None]
        rgb = rgb * (1.0 - cover[..., None]) + tongue * cover[..., None]
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
        seen = float(np.clip((lt_height - 1.5) / 2.0, 0.0, 1.0))
        lt_cover = np.clip((ys - tip) / 1.8, 0.0, 1.0) * lt_cols * seen
        down = np.clip((ys - lt_top) / (lt_height + cfg.rim_px), 0, 1)
        shade = cfg.lower_teeth_shade * (1.0 - 0.2 * down) * (0.85 + 0.15 * side)
        lt_rgb = np.array(cfg.lower_teeth_rgb, dtype=np.float32) * shade[..., None]
        rgb = rgb * (1.0 - lt_cover[..., None]) + lt_rgb * lt_cover[..., None]
    # The lower lip's inner side, in its own colour and darker, between the opening and the lip's edge.
    rim = (np.exp(-np.maximum(bottom - ys, 0.0) / cfg.rim_px) * np.clip(height / 4.0, 0.0, 1.0))[..., None]
    rgb = rgb * (1.0 - rim) + lip * cfg.rim_shade * rim
    # Upper teeth drawn only where the source shows none (a closed rest mouth): one per pitch with rounded
    # biting corners and soft seams, in the upper lip's shadow at the top and darker towards the corners.
    # On f/v they reach down to the lower lip, which rests against them.
    teeth_h = np.maximum(np.maximum(np.minimum(0.35 * span, 0.18 * w_half), labio * span) - shown, 0.0)
    d = _tooth_phase(u, cfg.upper_teeth_pitch)
    edge = top + teeth_h * (1.0 - 0.3 * (2.0 * d) ** 4)
    teeth = np.clip(edge - ys, 0.0, 1.0) * np.clip(1.0 - (np.abs(u) / 0.75) ** 4, 0.0, 1.0)
    shade = (
        (0.7 + 0.3 * side)
        * _seam_shade(d)
        * (0.82 + 0.18 * np.clip((ys - top) / np.maximum(teeth_h, 1.0), 0.0, 1.0))
    )
    teeth = teeth[..., None]
    return rgb * (1.0 - teeth) + np.array(cfg.teeth_rgb, dtype=np.float32) * shade[..., None] * teeth


def _tooth_phase(u: np.ndarray, pitch: float) -> np.ndarray:
    """0 in the middle of a tooth, 0.5 at the seam between two (the central pair meets at the midline)."""
    return np.abs(np.mod(u / pitch, 1.0) - 0.5)


def _seam_shade(phase: np.ndarray, depth: float = 0.3) -> np.ndarray:
    """Brightness across a tooth row: 1 on a tooth, a soft dark seam between two (phase from _tooth_phase)."""
    return 1.0 - depth * np.exp(-(((0.5 - phase) / 0.07) ** 2))
