"""The presenter's own teeth colour, sampled from the footage where its mouth shows teeth (drawn teeth then
match them instead of a fixed white)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from lipstream.engines.viseme.geometry import MouthGeometry
from lipstream.engines.viseme.warp_config import WarpConfig, interp_contour

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
    upper = interp_contour(geo.upper, xs)[None, :]
    lower = interp_contour(geo.lower, xs)[None, :]
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
