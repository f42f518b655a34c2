"""Pre-seed an avatar's viseme codebook from sample speech, so the first live utterance already hits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lipstream.audio.levels import SilenceDetector
from lipstream.avatar.bundle import AvatarBundle
from lipstream.engines.base import Engine, Speech
from lipstream.render.accel import AccelConfig, PatchScheduler, load_codebook, save_codebook, utterance_frames


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
        if speech.frame_count == 0:
            continue
        utterance = utterance_frames(bundle, engine, speech, config, silence)
        scheduler.push(utterance.features, utterance.skip, utterance.base_ids)
        scheduler.finish()
        frames += speech.frame_count
    path = save_codebook(codebook, bundle, engine)
    stats = scheduler.stats
    return SeedResult(len(speeches), frames, stats.keyframes, stats.neural_frames, codebook.size, str(path))
