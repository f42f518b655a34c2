"""Scale-free measures of a face from its MediaPipe face-mesh landmarks, in eye-corner distances: the one
definition of the mouth's opening that `lipstream eval lipsync`, the viseme engine's opening calibration,
its mouth atlas and the realism measures all share."""

from __future__ import annotations

import numpy as np

EYE_CORNERS = (33, 263)  # outer eye corners: the scale every measure is divided by
MOUTH_CORNERS = (61, 291)  # outer lip corners, left and right
INNER_LIP_PAIRS = ((82, 87), (13, 14), (312, 317))  # across the inner lips (upper, lower)
# the inner lip edge as a closed ring: left corner, upper inner edge, right corner, lower inner edge
INNER_LIP_RING = (78, 191, 80, 81, 82, 13, 312, 311, 310, 415, 308, 324, 318, 402, 317, 14, 87, 178, 88, 95)


def eye_width(landmarks: np.ndarray) -> float:
    """Outer eye-corner distance (never zero)."""
    return max(float(np.linalg.norm(landmarks[EYE_CORNERS[0]] - landmarks[EYE_CORNERS[1]])), 1e-6)


def lip_aperture(landmarks: np.ndarray) -> float:
    """Inner-lip opening of one face, in eye-corner distances (size and position free)."""
    gaps = [np.linalg.norm(landmarks[a] - landmarks[b]) for a, b in INNER_LIP_PAIRS]
    return float(np.mean(gaps) / eye_width(landmarks))


def gap_over_width(landmarks: np.ndarray) -> float:
    """Inner-lip gap at the middle over the corner-to-corner mouth width (scale free; the speech-range
    measure of the viseme engine's calibration and the realism bench)."""
    upper, lower = INNER_LIP_PAIRS[1]
    gap = np.linalg.norm(landmarks[upper] - landmarks[lower])
    width = np.linalg.norm(landmarks[MOUTH_CORNERS[0]] - landmarks[MOUTH_CORNERS[1]])
    return float(gap / max(width, 1e-6))
