"""Face crop boxes from landmarks (MuseTalk's convention), smoothed over the whole clip without lag."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.ndimage import gaussian_filter1d

NOSE_BRIDGE = 195  # FaceMesh point on the lower nose bridge, the counterpart of iBUG-68 point 29


@dataclass(frozen=True)
class BoxConfig:
    """How the crop box is made from landmarks."""

    # MuseTalk v1.5: the crop goes this far below the chin to hold the jaw (10 px by default at inference, a
    # user setting up to 40 in its demo; its training drew 0-20 px). The larger of the two: a share of the
    # box's height, so a large face keeps room for its chin to drop (issue 37: with 10 px of a 274 px box
    # the drawn chin could drop at most ~8 px, and a face mesh over the output read 0.41 of the lip's drop)
    extra_margin_px: int = 10
    extra_margin_share: float = 0.1
    centre_sigma_frames: float = 1.0  # light zero-phase smoothing of the box centre (keeps the head motion)
    size_sigma_frames: float = 4.0  # stronger smoothing of the box size (a face does not breathe)


def raw_boxes(landmarks: np.ndarray) -> np.ndarray:
    """N×4 float boxes: landmark x-extent; y2 = chin; y1 = nose bridge minus the nose-to-chin distance."""
    nose_y = landmarks[:, NOSE_BRIDGE, 1]
    chin_y = landmarks[:, :, 1].max(axis=1)
    x1 = landmarks[:, :, 0].min(axis=1)
    x2 = landmarks[:, :, 0].max(axis=1)
    y1 = nose_y - (chin_y - nose_y)
    return np.stack([x1, y1, x2, chin_y], axis=1).astype(np.float64)


def smooth_boxes(boxes: np.ndarray, config: BoxConfig) -> np.ndarray:
    """Centred (zero-phase) Gaussian smoothing of box centre and size over the clip: no lag."""
    if len(boxes) < 2:
        return boxes.copy()
    centre = (boxes[:, :2] + boxes[:, 2:]) / 2
    size = boxes[:, 2:] - boxes[:, :2]
    centre = gaussian_filter1d(centre, config.centre_sigma_frames, axis=0, mode="nearest")
    size = gaussian_filter1d(size, config.size_sigma_frames, axis=0, mode="nearest")
    return np.concatenate([centre - size / 2, centre + size / 2], axis=1)


def extra_margin(boxes: np.ndarray, config: BoxConfig) -> np.ndarray:
    """Per box, the rows added under the chin: extra_margin_px, or extra_margin_share of its height."""
    return np.maximum(config.extra_margin_px, config.extra_margin_share * (boxes[:, 3] - boxes[:, 1]))


def chin_margins(boxes: np.ndarray, entry: dict | None) -> np.ndarray:
    """Per bundle box (margin included), the rows it holds under the chin, from the manifest's `box` entry
    (BoxConfig as prepared; empty for bundles prepared before it was recorded: a fixed 10 px)."""
    entry = entry or {}
    px = float(entry.get("extra_margin_px", 10))
    share = float(entry.get("extra_margin_share", 0.0))
    heights = np.asarray(boxes, np.float64)[:, 3] - np.asarray(boxes, np.float64)[:, 1]
    return np.maximum(px, share * heights / (1.0 + share))  # h = h0 + share·h0 when the share wins


def crop_boxes(landmarks: np.ndarray, width: int, height: int, config: BoxConfig | None = None) -> np.ndarray:
    """N×4 int32 (x1, y1, x2, y2) crop boxes in source pixels, exclusive x2/y2, clipped to the frame."""
    config = config or BoxConfig()
    boxes = smooth_boxes(raw_boxes(landmarks), config)
    boxes[:, 3] += extra_margin(boxes, config)
    out = np.rint(boxes).astype(np.int64)
    out[:, [0, 2]] = np.clip(out[:, [0, 2]], 0, width)
    out[:, [1, 3]] = np.clip(out[:, [1, 3]], 0, height)
    # Never an empty box, even for a face at the frame's edge.
    out[:, 2] = np.maximum(out[:, 2], np.minimum(out[:, 0] + 2, width))
    out[:, 0] = np.minimum(out[:, 0], out[:, 2] - 2)
    out[:, 3] = np.maximum(out[:, 3], np.minimum(out[:, 1] + 2, height))
    out[:, 1] = np.minimum(out[:, 1], out[:, 3] - 2)
    return out.astype(np.int32)
