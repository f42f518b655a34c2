"""Jaw opening that follows loudness: louder vowels are spoken with a wider mouth.

The phoneme (or acoustic-model) target says *which* shape the mouth takes; the frame's own level says
*how far* it opens. The level is measured against the loudest frame nearby (a local reference, so the
result does not depend on the recording's gain) and against the silence threshold (no opening there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lipstream.audio.levels import DEFAULT_SILENCE_DBFS
from lipstream.engines.viseme.articulation import CLOSURE, LABIODENTAL, OPEN, WIDTH


@dataclass(frozen=True)
class LoudnessConfig:
    """How a frame's level scales its opening."""

    floor_dbfs: float = DEFAULT_SILENCE_DBFS  # at or below: loudness 0
    back_frames: int = 50  # reference = loudest frame within 2 s before ...
    ahead_frames: int = 4  # ... and 160 ms after (must not exceed the extractor's look-ahead)
    min_range_db: float = 15.0  # the reference sits at least this far above the floor
    shape_share: float = 0.3  # part of the opening set by the phoneme target alone (vowel height)
    open_gain: float = 0.8  # opening (before the power) of the loudest frame of a fully open vowel (0.8: the
    # median speaking frame 0.21 of the mouth's width on the sample, p95 0.29-0.31; docs/benchmarks.md)
    open_power: float = 1.5  # opening = (gain · shaped) ** power: above 1, speech is mostly nearly closed and
    # only loud open vowels open wide (the calibration puts command 1 at an emphasised vowel's aperture)
    pause_closure: float = 1.0  # silent rows: lips closed (1), or the footage's own rest mouth (0)
    ease_frames: int = 2  # lips take this many frames to settle into (and leave) the rest pose

    @property
    def context_frames(self) -> int:
        """Frames of level history one output row needs."""
        return self.back_frames


@dataclass(frozen=True)
class ClosureGate:
    """Closures are kept only when confident (model output; TTS timings give 1.0) and the sound dips.

    A false closure (lips pressed while the voice is loud) is the worst error a viewer can see, and
    a bilabial stop is quiet (lips shut, little sound) or nasal (/m/, softer than the vowels around it).
    """

    min_confidence: float = 0.45  # smoothed model closure output at or above this ...
    max_loudness: float = 0.75  # ... on a frame at most this loud (0..1, see `loudness`)
    sure: float = 0.7  # a closure this confident ...
    max_loudness_sure: float = 0.85  # ... is kept on a frame up to this loud
    full_at: float = 0.6  # a kept closure at or above this confidence shuts the lips fully (scaled below it)

    def apply(self, feats: np.ndarray, loud: np.ndarray) -> np.ndarray:
        """Rows with CLOSURE zeroed where the gate rejects it, and a kept one shut fully from `full_at`."""
        out = np.array(feats, dtype=np.float32, copy=True)
        confidence = out[:, CLOSURE]
        keep = (confidence >= self.min_confidence) & (loud <= self.max_loudness)
        # /m/ is voiced through the nose, as loud as a soft vowel: a sure closure may be louder
        keep |= (confidence >= self.sure) & (loud <= self.max_loudness_sure)
        out[:, CLOSURE] = np.where(keep, np.minimum(out[:, CLOSURE] / self.full_at, 1.0), 0.0)
        return out


def loudness(levels_dbfs: np.ndarray, cfg: LoudnessConfig) -> np.ndarray:
    """Per-frame loudness 0..1: level above the floor, relative to the loudest frame in [k-back, k+ahead]."""
    levels = np.asarray(levels_dbfs, dtype=np.float64).reshape(-1)
    if levels.size == 0:
        return np.zeros(0, dtype=np.float32)
    # Frames beyond the known audio do not count towards the reference.
    padded = np.concatenate([np.full(cfg.back_frames, -np.inf), levels, np.full(cfg.ahead_frames, -np.inf)])
    ref = np.lib.stride_tricks.sliding_window_view(padded, cfg.back_frames + cfg.ahead_frames + 1).max(axis=1)
    span = np.maximum(ref - cfg.floor_dbfs, cfg.min_range_db)
    return np.clip((levels - cfg.floor_dbfs) / span, 0.0, 1.0).astype(np.float32)


def scale_opening(feats: np.ndarray, loud: np.ndarray, cfg: LoudnessConfig) -> np.ndarray:
    """Articulation rows with OPEN scaled by loudness (closure and width unchanged)."""
    out = np.array(feats, dtype=np.float32, copy=True)
    target = out[:, OPEN]
    # Normalised by the widest table target (0.85), so an open vowel at full loudness reaches open_gain.
    shaped = cfg.shape_share * target / 0.85 + (1.0 - cfg.shape_share) * loud * np.minimum(target / 0.2, 1.0)
    out[:, OPEN] = np.clip(cfg.open_gain * shaped, 0.0, 1.0) ** cfg.open_power * (1.0 - out[:, CLOSURE])
    return out


def ease_to_rest(feats: np.ndarray, silent: np.ndarray, cfg: LoudnessConfig) -> np.ndarray:
    """Silent rows get closed lips and nothing else (`pause_closure`); the opening, spread and f/v tuck taper
    over the frames next to them.

    Lips need ~80 ms to close; snapping from wide open to rest in one 40 ms frame also leaves a ghost of
    the open mouth in the next H.264 picture. `silent` may extend past the rows on both sides by
    `ease_frames` (rows are silent[ease_frames:-ease_frames] when it does)."""
    e = cfg.ease_frames
    n = len(feats)
    out = np.array(feats, dtype=np.float32, copy=True)
    mask = np.asarray(silent, dtype=bool)
    if mask.size != n + 2 * e:
        raise ValueError(f"silent mask has {mask.size} rows, expected {n + 2 * e}")
    cap = np.ones(n, dtype=np.float32)
    for d in range(1, e + 1):
        near = mask[e - d : e - d + n] | mask[e + d : e + d + n]
        cap = np.where(near, np.minimum(cap, d / (e + 1.0)), cap)
    out[:, OPEN] *= cap
    out[:, WIDTH] *= cap
    out[:, LABIODENTAL] *= cap
    pause = mask[e : e + n]
    out[pause] = 0.0
    out[pause, CLOSURE] = cfg.pause_closure
    return out
