"""Pre-seed an avatar's viseme codebook from sample speech, so the first live utterance already hits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lipstream.audio.levels import SilenceDetector
from lipstream.avatar.bundle import AvatarBundle
from lipstream.engines.base import Engine, Speech
from lipstream.render.accel import AccelConfig, PatchScheduler, load_codebook, save_codebook, speaking_mask


@dataclass
class SeedResult:
    """What seeding did."""

    utterances: int
    frames: int
    keyframes: int
    neural_frames: int
    entries: int
    path: str


def seed_codebook(
    bundle: AvatarBundle, engine: Engine, speeches: Sequence[Speech], config: AccelConfig | None = None
) -> SeedResult:
    """Run the keyframe planner and codebook over `speeches` (no compositing, no encoding) and save."""
    # seeding is asked for explicitly, so it runs even for engines that do not accelerate by default
    config = (config or AccelConfig()).model_copy(update={"enabled": True})
    codebook = load_codebook(bundle, engine, config)
    scheduler = PatchScheduler(bundle, engine, config, codebook)
    silence = SilenceDetector()
    frames = 0
    for speech in speeches:
        n = speech.frame_count
        if n == 0:
            continue
        features = np.asarray(engine.features(speech), dtype=np.float32)[:n]
        silent = ~speaking_mask(silence.silent_mask(speech.pcm)[:n])
        base_ids = np.array([bundle.base_frame_index(k) for k in range(n)], dtype=np.int64)
        scheduler.push(features, silent, base_ids)
        scheduler.finish()
        frames += n
    path = save_codebook(codebook, bundle, engine)
    stats = scheduler.stats
    return SeedResult(len(speeches), frames, stats.keyframes, stats.neural_frames, codebook.size, str(path))
