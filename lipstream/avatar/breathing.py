"""A photo that breathes: the person, cut out with mediapipe's selfie segmentation, leans and rises a little
over a still background, so a one-photo avatar does not look frozen while it waits or speaks.

Each frame's motion is one small affine map (a lean about a pivot under the person and a breath that lifts
the chest and head), so the person never tears, the face landmarks move exactly with it, and only a sliver
of background at the silhouette is uncovered: it is filled from a clean plate (the photo with the person
inpainted away). Every motion makes whole cycles over the loop, so the loop never jumps when it wraps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import cv2
import numpy as np

if TYPE_CHECKING:  # the face models are loaded only when a matte is made (preparing a photo avatar)
    from lipstream.avatar.face_client import FaceModels


@dataclass(frozen=True)
class BreathingConfig:
    """How much a photo's person moves (small: a viewer should feel it, not see it)."""

    enabled: bool = True
    lean_deg: float = 0.3  # side-to-side lean about the pivot, at its widest
    rise: float = 0.0012  # a breath lifts the upper body by this share of the pivot's distance
    breaths: int = 3  # breaths per loop (4 s each in a 12 s loop)
    leans: int = 1  # slow leans per loop
    refine_width: int = 540  # the matte's edge is decided at most this wide ...
    band: float = 0.03  # ... in a band this share of the width either side of the model's edge
    matte_feather_px: float = 1.5  # the matte's edge is softened by this much (at 1080 wide)
    plate_scale: float = 0.25  # the clean plate is inpainted at this scale (only its edge is ever seen)


def person_matte(rgb: np.ndarray, config: BreathingConfig, models: FaceModels | None = None) -> np.ndarray:
    """0..1 float32 of the person: mediapipe's selfie segmentation (the model inside the package; run in the
    face environment unless `models` is given), its uncertain edge decided by colour (GrabCut), feathered."""
    owned = models is None  # opened here for this one call, and closed after it
    if owned:
        from lipstream.avatar.face_client import open_face_models

        models = open_face_models()
    try:
        confidence = models.segment(np.ascontiguousarray(rgb))
    finally:
        if owned:
            models.close()
    if confidence is None or float(confidence.max()) < 0.5:
        return np.zeros(rgb.shape[:2], np.float32)
    matte = _refine_edge(rgb, np.clip(confidence.astype(np.float32), 0.0, 1.0), config)
    sigma = config.matte_feather_px * rgb.shape[1] / 1080
    return cv2.GaussianBlur(matte, (0, 0), sigma) if sigma > 0.3 else matte


def _refine_edge(rgb: np.ndarray, confidence: np.ndarray, config: BreathingConfig) -> np.ndarray:
    """The person as 0/1: the model's 256² mask spills into the background as a haze (above the hair, most),
    and moving that haze drags background edges along; GrabCut on the uncertain band keeps what looks like
    the person. Run at most refine_width wide (the band is wide, the answer is feathered anyway)."""
    height, width = rgb.shape[:2]
    scale = min(1.0, config.refine_width / width)
    size = (max(int(width * scale), 8), max(int(height * scale), 8))
    small = cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)
    sure = cv2.resize(confidence, size, interpolation=cv2.INTER_LINEAR)
    radius = max(3, int(config.band * size[0]))
    disk = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))
    seeds = np.full(sure.shape, cv2.GC_BGD, np.uint8)
    seeds[cv2.dilate((sure > 0.1).astype(np.uint8), disk) > 0] = cv2.GC_PR_BGD
    seeds[sure > 0.5] = cv2.GC_PR_FGD
    seeds[cv2.erode((sure > 0.9).astype(np.uint8), disk) > 0] = cv2.GC_FGD
    if not np.any(seeds == cv2.GC_FGD) or not np.any(seeds == cv2.GC_BGD):
        return (confidence > 0.5).astype(np.float32)  # nothing certain to learn colours from
    models = (np.zeros((1, 65)), np.zeros((1, 65)))
    cv2.grabCut(cv2.cvtColor(small, cv2.COLOR_RGB2BGR), seeds, None, *models, 3, cv2.GC_INIT_WITH_MASK)
    person = np.isin(seeds, (cv2.GC_FGD, cv2.GC_PR_FGD)).astype(np.float32)
    return cv2.resize(person, (width, height), interpolation=cv2.INTER_LINEAR)


def clean_plate(rgb: np.ndarray, matte: np.ndarray, config: BreathingConfig) -> np.ndarray:
    """The picture with the person painted out (at a low scale: the motion uncovers only an edge)."""
    height, width = rgb.shape[:2]
    small = (max(int(width * config.plate_scale), 8), max(int(height * config.plate_scale), 8))
    hole = (cv2.resize(matte, small, interpolation=cv2.INTER_AREA) > 0.05).astype(np.uint8)
    hole = cv2.dilate(hole, np.ones((5, 5), np.uint8))
    filled = cv2.inpaint(cv2.resize(rgb, small, interpolation=cv2.INTER_AREA), hole, 5, cv2.INPAINT_TELEA)
    fill = cv2.resize(filled, (width, height), interpolation=cv2.INTER_LINEAR)
    # the fill is used only under the person (and a couple of pixels round it, where the edge's colour
    # bleeds); everywhere else the plate is the photo itself, so no blurred halo forms round the person
    reach = max(2, int(round(2 * width / 1080)))
    under = cv2.dilate((matte > 0.02).astype(np.uint8), np.ones((2 * reach + 1, 2 * reach + 1), np.uint8))
    cover = cv2.GaussianBlur(under.astype(np.float32), (0, 0), reach / 2)
    return cv2.blendLinear(fill, rgb, cover, np.float32(1.0) - cover)


def pivot(matte: np.ndarray) -> tuple[float, float]:
    """Where the person leans about: the middle of their lowest rows (the picture's bottom, often)."""
    rows = np.flatnonzero((matte > 0.5).any(axis=1))
    if not len(rows):
        return matte.shape[1] / 2.0, float(matte.shape[0])
    bottom = int(rows.max())
    cols = np.flatnonzero(matte[bottom] > 0.5)
    return float(cols.mean()), float(bottom + 1)


def poses(frames: int, centre: tuple[float, float], config: BreathingConfig) -> np.ndarray:
    """[frames, 2, 3] affine maps (photo -> frame): a lean and a breath, whole cycles over `frames`."""
    t = np.arange(frames) / max(frames, 1)
    lean = np.deg2rad(config.lean_deg) * np.sin(2 * np.pi * config.leans * t)
    # a breath: quick in, slower out (the second harmonic skews the sine)
    breath = 0.5 - 0.5 * np.cos(2 * np.pi * config.breaths * t)
    lift = config.rise * (breath + 0.15 * np.sin(4 * np.pi * config.breaths * t))
    cx, cy = centre
    out = np.zeros((frames, 2, 3), np.float64)
    for k in range(frames):
        c, s = np.cos(lean[k]), np.sin(lean[k])
        scale_y = 1.0 + lift[k]  # the body stretches up from the pivot (the chest rises, the head with it)
        linear = np.array([[c, -s * scale_y], [s, c * scale_y]])
        out[k, :, :2] = linear
        out[k, :, 2] = np.array([cx, cy]) - linear @ np.array([cx, cy])
    return out


def move_points(points: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Points (…, 2) through one affine map."""
    return (points @ affine[:, :2].T + affine[:, 2]).astype(np.float32)


def moved_picture(rgb: np.ndarray, matte: np.ndarray, plate: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """The person moved by `affine`, over the clean plate."""
    height, width = rgb.shape[:2]
    if np.allclose(affine, [[1, 0, 0], [0, 1, 0]], atol=1e-9):
        return np.array(rgb, copy=True)
    person = cv2.warpAffine(
        rgb, affine, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )
    alpha = cv2.warpAffine(
        matte, affine, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )
    # outside the person's reach the plate is the photo itself, so the blend leaves those pixels as they were
    return cv2.blendLinear(person, plate, alpha, np.float32(1.0) - alpha)
