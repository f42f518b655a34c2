"""Frames where the face was lost: interpolate short gaps, refuse long ones with the frame numbers."""

from __future__ import annotations

import numpy as np

from lipstream.errors import FaceNotFoundError


def missing_runs(found: np.ndarray) -> list[tuple[int, int]]:
    """Inclusive (first, last) frame ranges where `found` is False."""
    runs = []
    start = None
    for i, ok in enumerate(found):
        if not ok and start is None:
            start = i
        elif ok and start is not None:
            runs.append((start, i - 1))
            start = None
    if start is not None:
        runs.append((start, len(found) - 1))
    return runs


def _describe(runs: list[tuple[int, int]], limit: int = 4) -> str:
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit]]
    more = f" and {len(runs) - limit} more" if len(runs) > limit else ""
    return ", ".join(parts) + more


def fill_gaps(landmarks: np.ndarray, found: np.ndarray, max_gap: int, source: str, fps: int) -> list[str]:
    """Fill lost frames in place (linear between neighbours, held at the ends); return notes for the user."""
    n = len(found)
    if not found.any():
        raise FaceNotFoundError(
            f"no face found in any of the {n} frames of {source}; use a clip where one face is clearly "
            "visible (at least ~150 px wide in a 1080×1920 frame)"
        )
    runs = missing_runs(found)
    long_runs = [(a, b) for a, b in runs if b - a + 1 > max_gap]
    if long_runs:
        raise FaceNotFoundError(
            f"face lost in frames {_describe(long_runs)} of {source} (more than {max_gap} frames, "
            f"{max_gap / fps:.2f} s, in a row); trim the clip to the part where the face is visible"
        )
    good = np.flatnonzero(found)
    for a, b in runs:
        idx = np.arange(a, b + 1)
        for axis in range(landmarks.shape[2]):
            flat = landmarks[good, :, axis]
            for j in range(landmarks.shape[1]):
                landmarks[idx, j, axis] = np.interp(idx, good, flat[:, j])
    if not runs:
        return []
    return [f"face not found in frames {_describe(runs)}; interpolated from the neighbouring frames"]
