"""Patch stream mode: the crop-space rectangle that holds every frame's mouth mask (what is encoded)."""

from __future__ import annotations

import numpy as np

from lipstream.avatar.bundle import CROP_SIZE, AvatarBundle

MACROBLOCK = 16  # H.264 codes 16×16 blocks: a rectangle on their grid wastes no padded pixels


def patch_rect(bundle: AvatarBundle) -> tuple[int, int, int, int]:
    """x0, y0, x1, y1 in crop space (CROP_SIZE²) covering the mouth mask of every frame the idle loop shows,
    widened to the macroblock grid; the whole crop when no mask has any pixel. Kept on the bundle (sessions
    of a server share it)."""
    known = bundle.derived.get("patch_rect")
    if known is not None:
        return known
    union = np.zeros((CROP_SIZE, CROP_SIZE), bool)
    for index in bundle.display_frames:
        union |= np.asarray(bundle.masks[int(index)]) > 0
    rows, cols = np.flatnonzero(union.any(axis=1)), np.flatnonzero(union.any(axis=0))
    rect = (0, 0, CROP_SIZE, CROP_SIZE)
    if rows.size:
        x0, y0 = cols[0] // MACROBLOCK * MACROBLOCK, rows[0] // MACROBLOCK * MACROBLOCK
        x1 = min(CROP_SIZE, -(-(cols[-1] + 1) // MACROBLOCK) * MACROBLOCK)
        y1 = min(CROP_SIZE, -(-(rows[-1] + 1) // MACROBLOCK) * MACROBLOCK)
        rect = (int(x0), int(y0), int(x1), int(y1))
    bundle.derived["patch_rect"] = rect
    return rect
