"""The weight-free mouth warp's settings (motion ranges, drawn interior colours) and a contour helper shared
by its modules."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WarpConfig:
    """Motion ranges relative to the mouth half-width W (corner to corner / 2)."""

    # The opening is mostly the jaw rotating down (chin, lower lip and lower teeth together), plus a smaller
    # parting of the lips themselves; the calibration maps commands onto the speech range of this motion.
    # (issue 37: 0.5/0.85, then 0.6/0.71, now 0.75/0.568: the lower lip's drop is the same, the chin's
    # larger, which the crop's room under the chin, 10 % of the box since, lets a face mesh see)
    jaw_drop: float = 0.75  # the chin's drop at open=1, in W
    jaw_lip: float = 0.568  # the lower lip rides this share of it (it is nearer the jaw's hinge)
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


def interp_contour(contour: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Contour row at columns xs (clamped at the corners)."""
    order = np.argsort(contour[:, 0])
    return np.interp(xs, contour[order, 0], contour[order, 1]).astype(np.float32)
