"""The drawn mouth interior where the lips part wider than the source's: walls, throat, tongue, lower and
upper teeth, the lower lip's wet rim, shaded per pixel (docs/engines.md "drawn mouth")."""

from __future__ import annotations

import math

import numpy as np

from lipstream.engines.viseme.warp_config import WarpConfig


def _unit(value: float) -> float:
    """value clipped to [0, 1] (np.clip costs ~10 µs on a scalar)."""
    return min(max(float(value), 0.0), 1.0)


def draw_interior(
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


def _tooth_phase(u: np.ndarray, pitch: float) -> np.ndarray:
    """0 in the middle of a tooth, 0.5 at the seam between two (the central pair meets at the midline)."""
    return np.abs(np.mod(u / pitch, 1.0) - 0.5)


def _seam_shade(phase: np.ndarray, depth: float = 0.3) -> np.ndarray:
    """Brightness across a tooth row: 1 on a tooth, a soft dark seam between two (phase from _tooth_phase)."""
    return 1.0 - depth * np.exp(-(((0.5 - phase) / 0.07) ** 2))
