"""Per-frame mouth geometry in crop space, measured once from the avatar's landmarks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lipstream.avatar.face_measures import MOUTH_CORNERS

# MediaPipe face-mesh indices, left corner to right corner.
UPPER_INNER = (78, 191, 80, 81, 82, 13, 312, 311, 310, 415, 308)
LOWER_INNER = (78, 95, 88, 178, 87, 14, 317, 402, 318, 324, 308)
UPPER_OUTER_MID = 0
LOWER_OUTER_MID = 17
CHIN = 152

# Packed layout of one frame's geometry row (float32), so the cache is one small array.
_N = len(UPPER_INNER)
GEOMETRY_DIM = 2 * _N * 2 + 7


@dataclass(frozen=True)
class MouthGeometry:
    """Inner-lip contours, mouth centre and size, chin and nose-base rows of one frame (crop pixels)."""

    upper: np.ndarray  # [11, 2] upper inner-lip contour, left to right
    lower: np.ndarray  # [11, 2] lower inner-lip contour
    center_x: float
    half_width: float  # half the corner-to-corner distance
    upper_outer_y: float
    lower_outer_y: float
    chin_y: float
    nose_y: float
    lip_y: float  # mean row of the lip line

    def pack(self) -> np.ndarray:
        """One float32 row for the per-avatar cache."""
        head = np.array(
            [
                self.center_x,
                self.half_width,
                self.upper_outer_y,
                self.lower_outer_y,
                self.chin_y,
                self.nose_y,
                self.lip_y,
            ],
            dtype=np.float32,
        )
        return np.concatenate([self.upper.reshape(-1), self.lower.reshape(-1), head]).astype(np.float32)

    @classmethod
    def unpack(cls, row: np.ndarray) -> MouthGeometry:
        """Inverse of pack()."""
        upper = row[: 2 * _N].reshape(_N, 2)
        lower = row[2 * _N : 4 * _N].reshape(_N, 2)
        cx, hw, uo, lo, chin, nose, lip = (float(v) for v in row[4 * _N :])
        return cls(upper, lower, cx, hw, uo, lo, chin, nose, lip)


def measure(crop_landmarks: np.ndarray, nose_row: float) -> MouthGeometry:
    """Mouth geometry from one frame's crop-space landmarks (478 or 468 points)."""
    upper = crop_landmarks[list(UPPER_INNER)].astype(np.float32)
    lower = crop_landmarks[list(LOWER_INNER)].astype(np.float32)
    # The lower contour may cross above the upper one by a pixel on a closed mouth; never negative gap.
    lower[:, 1] = np.maximum(lower[:, 1], upper[:, 1])
    left, right = crop_landmarks[MOUTH_CORNERS[0]], crop_landmarks[MOUTH_CORNERS[1]]
    half_width = float(max(np.hypot(*(right - left)) / 2.0, 4.0))
    lip_y = float((upper[:, 1].mean() + lower[:, 1].mean()) / 2.0)
    return MouthGeometry(
        upper=upper,
        lower=lower,
        center_x=float((left[0] + right[0]) / 2.0),
        half_width=half_width,
        upper_outer_y=float(crop_landmarks[UPPER_OUTER_MID, 1]),
        lower_outer_y=float(crop_landmarks[LOWER_OUTER_MID, 1]),
        chin_y=float(crop_landmarks[CHIN, 1]),
        nose_y=float(nose_row),
        lip_y=lip_y,
    )
