"""Features -> engine patches -> composited frames, in fixed-size batches and time order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from lipstream.avatar.bundle import AvatarBundle
from lipstream.engines.base import Engine
from lipstream.render.compositor import Compositor
from lipstream.render.timing import StageTimer


@dataclass
class FrameJob:
    """What to draw for a run of frames: features, which are speech, and which base frames to use."""

    features: np.ndarray  # [n, D] float32
    speaking: np.ndarray  # [n] bool: False = silent, the base frame is shown untouched
    base_ids: np.ndarray  # [n] int: avatar source frame under each output frame


class FrameRenderer:
    """Renders mouth patches with an engine and composites them onto the base frames."""

    def __init__(
        self,
        bundle: AvatarBundle,
        engine: Engine,
        timer: StageTimer | None = None,
        output_size: tuple[int, int] | None = None,
        i420: bool = False,
    ) -> None:
        self.bundle = bundle
        self.engine = engine
        self.timer = timer or StageTimer()
        self.compositor = Compositor(bundle, engine.patch_size, output_size)
        self.i420 = i420  # emit I420 pictures for the encoder instead of RGB
        self.neural_frames = 0

    def patches(self, job: FrameJob) -> list[np.ndarray | None]:
        """Engine patches for the speaking frames of `job` (None for silent ones), batched."""
        out: list[np.ndarray | None] = [None] * len(job.base_ids)
        todo = np.flatnonzero(job.speaking)
        step = max(1, int(self.engine.batch_size))
        for start in range(0, len(todo), step):
            idx = todo[start : start + step]
            with self.timer.stage("engine"):
                rendered = self.engine.render(self.bundle, job.features[idx], job.base_ids[idx])
            self.neural_frames += len(idx)
            for i, patch in zip(idx, rendered, strict=True):
                out[i] = patch
        return out

    def frames(self, job: FrameJob) -> Iterator[np.ndarray]:
        """Composited full frames for `job`, in order (fresh arrays: RGB, or I420 when asked)."""
        compose = self.compositor.compose_i420 if self.i420 else self.compositor.compose
        for base_id, patch in zip(job.base_ids, self.patches(job), strict=True):
            with self.timer.stage("compositor"):
                frame = compose(int(base_id), patch)
            yield frame


def speaking_mask(silent: np.ndarray, margin_frames: int = 2) -> np.ndarray:
    """Frames that get an engine patch: not silent, widened by a margin so onsets and releases animate."""
    speaking = ~np.asarray(silent, dtype=bool)
    if margin_frames <= 0 or speaking.size == 0:
        return speaking
    idx = np.flatnonzero(speaking)
    widened = np.zeros_like(speaking)
    for d in range(-margin_frames, margin_frames + 1):
        shifted = idx + d
        widened[shifted[(shifted >= 0) & (shifted < speaking.size)]] = True
    return widened
